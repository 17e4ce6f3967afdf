"""The allocator stand-in: classes and CEL selectors, counts, All, firstAvailable, taints."""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.standins._allocate import (
    AllocationError,
    Device,
    Taint,
    allocate,
    devices_from_slices,
)

D = "gpu.example.com"


def slice_(node: str, *devices: tuple[str, str], taint: str | None = None) -> dict[str, Any]:
    """A slice of (name, model) devices; ``taint`` names a device with a NoExecute taint."""
    return {
        "spec": {
            "driver": D,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": name,
                    "attributes": {"model": {"string": model}, f"{D}/index": {"int": i}},
                    "capacity": {"memory": {"value": "80Gi"}},
                    **(
                        {"taints": [{"key": "k", "value": "v", "effect": "NoExecute"}]}
                        if name == taint
                        else {}
                    ),
                }
                for i, (name, model) in enumerate(devices)
            ],
        }
    }


CLASSES = {
    "gpu": {"spec": {"selectors": [{"cel": {"expression": f'device.driver == "{D}"'}}]}},
    "a100": {
        "spec": {
            "selectors": [
                {"cel": {"expression": f'device.driver == "{D}"'}},
                {"cel": {"expression": f'device.attributes["{D}"].model == "a100"'}},
            ]
        }
    },
}


def claim(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"devices": {"requests": list(requests)}}}


def exactly(name: str = "gpu", cls: str = "gpu", **kw: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, **kw}}


DEVICES = devices_from_slices(
    [
        slice_("node-1", ("gpu-0", "a100"), ("gpu-1", "h100"), taint="gpu-1"),
        slice_("node-2", ("gpu-0", "a100"), ("gpu-1", "a100")),
    ]
)


def test_devices_carry_node_qualified_attributes_capacity_and_taints() -> None:
    d = DEVICES[1]
    assert (d.driver, d.pool, d.name, d.node) == (D, "node-1", "gpu-1", "node-1")
    assert d.attributes == {D: {"model": "h100", "index": 1}}
    assert d.capacity == {D: {"memory": "80Gi"}}
    assert d.taints == (Taint("k", "v", "NoExecute"),)


def test_one_device_by_class_on_the_first_node_that_fits() -> None:
    node, results = allocate(claim(exactly()), DEVICES, CLASSES, in_use=set())
    assert node == "node-1"
    assert results == [{"request": "gpu", "driver": D, "pool": "node-1", "device": "gpu-0"}]


def test_in_use_and_tainted_devices_are_skipped() -> None:
    node, results = allocate(claim(exactly()), DEVICES, CLASSES, in_use={(D, "node-1", "gpu-0")})
    assert (node, results[0]["device"]) == ("node-2", "gpu-0")  # node-1's gpu-1 is tainted


def test_a_toleration_admits_a_tainted_device() -> None:
    tol = [{"key": "k", "operator": "Exists", "effect": "NoExecute"}]
    _, results = allocate(
        claim(exactly(tolerations=tol)), DEVICES, CLASSES, in_use={(D, "node-1", "gpu-0")},
        nodes=["node-1"],
    )  # fmt: skip
    assert results[0]["device"] == "gpu-1"


def test_rule_taints_count_like_slice_taints() -> None:
    def rules(d: Device) -> list[Taint]:
        return [Taint("drahealth.io/unhealthy", "xid", "NoSchedule")] if d.name == "gpu-0" else []

    node, results = allocate(claim(exactly()), DEVICES, CLASSES, in_use=set(), rule_taints=rules)
    assert (node, results[0]["device"]) == ("node-2", "gpu-1")


def test_count_all_and_selectors() -> None:
    node, results = allocate(claim(exactly(count=2)), DEVICES, CLASSES, in_use=set())
    assert node == "node-2" and len(results) == 2
    node, results = allocate(claim(exactly(allocationMode="All")), DEVICES, CLASSES, in_use=set())
    assert node == "node-2"  # node-1 has a tainted device: All needs every one usable
    sel = [{"cel": {"expression": f'device.attributes["{D}"].index == 1'}}]
    _, results = allocate(claim(exactly(selectors=sel)), DEVICES, CLASSES, in_use=set())
    assert results[0]["device"] == "gpu-1" and results[0]["pool"] == "node-2"


def test_first_available_takes_the_first_subrequest_that_fits() -> None:
    req = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "big", "deviceClassName": "a100", "count": 3},
            {"name": "small", "deviceClassName": "a100", "count": 1},
        ],
    }
    node, results = allocate(claim(req), DEVICES, CLASSES, in_use=set())
    assert node == "node-1" and results[0]["request"] == "gpu/small"


def test_errors_say_which_request_and_why() -> None:
    with pytest.raises(AllocationError, match="DeviceClass 'tpu' not found"):
        allocate(claim(exactly(cls="tpu")), DEVICES, CLASSES, in_use=set())
    with pytest.raises(AllocationError, match=r"node-2: request gpu: 2 of 5 devices available"):
        allocate(claim(exactly(count=5)), DEVICES, CLASSES, in_use=set())
    with pytest.raises(AllocationError, match="selector #0: CEL compile error"):
        allocate(
            claim(exactly(selectors=[{"cel": {"expression": "device.("}}])),
            DEVICES,
            CLASSES,
            in_use=set(),
        )
    with pytest.raises(AllocationError, match="no device requests"):
        allocate(claim(), DEVICES, CLASSES, in_use=set())
    with pytest.raises(AllocationError, match="no node has devices"):
        allocate(claim(exactly()), [], CLASSES, in_use=set())


def test_admin_access_may_share_an_in_use_device() -> None:
    _, results = allocate(
        claim(exactly(adminAccess=True)), DEVICES, CLASSES, in_use={(D, "node-1", "gpu-0")}
    )
    assert results[0]["device"] == "gpu-0" and results[0]["adminAccess"] is True
