"""The allocator stand-in against upstream's structured allocator and DRA CEL environment.

Each test names the upstream source its expectations come from (kubernetes/kubernetes,
``staging/src/k8s.io/dynamic-resource-allocation``): ``structured/internal/stable/
allocator_stable.go`` and ``structured/internal/experimental/constraint.go`` for the
search, constraints and config; ``cel/compile.go`` with
``k8s.io/apiserver/pkg/cel/environment/base.go`` and ``.../cel/library`` for the CEL
environment; ``pkg/features/kube_features.go`` for the gates per release.
"""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.core import kube_profile
from drahealth.standins import _allocate as alloc

D = "gpu.example.com"


def device(name: str, **attrs: Any) -> dict[str, Any]:
    typed = {
        k: {"version": v[1:]} if isinstance(v, str) and v.startswith("=") else
        {"bool": v} if isinstance(v, bool) else {"int": v} if isinstance(v, int) else {"string": v}
        for k, v in attrs.items()
    }  # fmt: skip
    return {"name": name, "attributes": typed, "capacity": {"memory": {"value": "40Gi"}}}


def slices(*devices: dict[str, Any], node: str = "node-1") -> list[alloc.Device]:
    return alloc.devices_from_slices(
        [
            {
                "spec": {
                    "driver": D,
                    "nodeName": node,
                    "pool": {"name": node},
                    "devices": list(devices),
                }
            }
        ]
    )


CLASSES: dict[str, Any] = {
    "gpu": {
        "metadata": {"name": "gpu"},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "{D}"'}}],
            "config": [{"opaque": {"driver": D, "parameters": {"kind": "GpuConfig", "x": 1}}}],
        },
    }
}


def claim(*requests: dict[str, Any], **devices: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": list(requests), **devices}},
    }


def exactly(name: str, count: int = 1, *selectors: str, **kw: Any) -> dict[str, Any]:
    sel = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": {"deviceClassName": "gpu", "count": count,
                                      "selectors": sel, **kw}}  # fmt: skip


def test_match_attribute_backtracks_to_devices_sharing_the_value() -> None:
    """allocator_stable.go matchAttributeConstraint: every device of the listed requests
    has the attribute with one value; the search backtracks over earlier choices."""
    devs = slices(device("gpu-0", numa=0), device("gpu-1", numa=1), device("gpu-2", numa=1))
    c = claim(
        exactly("a"), exactly("b"),
        constraints=[{"requests": ["a", "b"], "matchAttribute": f"{D}/numa"}],
    )  # fmt: skip
    _, results = alloc.allocate(c, devs, CLASSES, in_use=set())
    assert sorted(r["device"] for r in results) == ["gpu-1", "gpu-2"]


def test_match_attribute_fails_for_a_device_without_it() -> None:
    """allocator_stable.go: lookupAttribute nil -> constraint not satisfied."""
    devs = slices(device("gpu-0", numa=0), device("gpu-1"))
    c = claim(exactly("a", 2), constraints=[{"matchAttribute": f"{D}/numa"}])
    with pytest.raises(alloc.AllocationError):
        alloc.allocate(c, devs, CLASSES, in_use=set())


def test_distinct_attribute_follows_the_consumable_capacity_gate() -> None:
    """experimental/constraint.go distinctAttributeConstraint (pairwise different values),
    served with DRAConsumableCapacity: alpha 1.34 (off), beta 1.36 (on)."""
    devs = slices(device("gpu-0", pci="a"), device("gpu-1", pci="a"), device("gpu-2", pci="b"))
    c = claim(exactly("a", 2), constraints=[{"distinctAttribute": f"{D}/pci"}])
    _, results = alloc.allocate(c, devs, CLASSES, in_use=set(), profile=kube_profile("1.36"))
    assert [r["device"] for r in results] == ["gpu-0", "gpu-2"]
    with pytest.raises(alloc.AllocationAborted, match="unsupported constraint type"):
        alloc.allocate(c, devs, CLASSES, in_use=set(), profile=kube_profile("1.35"))


def test_cel_quantity_and_semver_libraries() -> None:
    """cel/compile.go: capacity values are quantities, version attributes semvers; the
    base environment (environment/base.go) has the Quantity and Semver libraries."""
    devs = slices(device("gpu-0", driverVersion="=0.9.0"), device("gpu-1", driverVersion="=1.2.0"))
    sel = (
        f'device.capacity["{D}"].memory.compareTo(quantity("4Gi")) >= 0 && '
        f'device.attributes["{D}"].driverVersion.isGreaterThan(semver("1.0.0"))'
    )
    _, results = alloc.allocate(claim(exactly("a", 1, sel)), devs, CLASSES, in_use=set())
    assert results[0]["device"] == "gpu-1"
    bind = f'cel.bind(a, device.attributes["{D}"], a.driverVersion.major() == 0)'
    _, results = alloc.allocate(claim(exactly("a", 1, bind)), devs, CLASSES, in_use=set())
    assert results[0]["device"] == "gpu-0"


def test_cel_runtime_error_aborts_instead_of_falling_through() -> None:
    """allocator_stable.go isSelectable: a CEL runtime error returns
    "claim <ns/name>: selector #i on device <id>: CEL runtime error: ..." and stops the
    allocation; it is never "no match" (so firstAvailable does not fall through)."""
    devs = slices(device("gpu-0"))
    req = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu",
             "selectors": [{"cel": {"expression": f'device.attributes["{D}"].model == "x"'}}]},
            {"name": "any", "deviceClassName": "gpu"},
        ],
    }  # fmt: skip
    with pytest.raises(alloc.AllocationAborted) as err:
        alloc.allocate(claim(req), devs, CLASSES, in_use=set())
    assert str(err.value) == (
        f"claim default/c: selector #0 on device {D}/node-1/gpu-0: "
        "CEL runtime error: no such key: model"
    )


def test_opaque_config_is_copied_from_class_and_claim() -> None:
    """allocator_stable.go: for each allocated request its class's configs (FromClass,
    requests [<request>]), then the claim's configs (FromClaim) with their requests as
    written, once per request they name; a config naming none applies to all."""
    devs = slices(device("gpu-0"), device("gpu-1"))
    claim_cfg = {"opaque": {"driver": D, "parameters": {"kind": "GpuConfig", "y": 2}}}
    c = claim(
        exactly("a"), exactly("b"),
        config=[{"requests": ["b"], **claim_cfg}, claim_cfg],
    )  # fmt: skip
    found = alloc.allocate_claim(c, devs, CLASSES, in_use=set())
    class_opaque = CLASSES["gpu"]["spec"]["config"][0]["opaque"]
    assert found.config == [
        {"source": "FromClass", "requests": ["a"], "opaque": class_opaque},
        {"source": "FromClass", "requests": ["b"], "opaque": class_opaque},
        {"source": "FromClaim", "requests": ["b"], **claim_cfg},
        {"source": "FromClaim", **claim_cfg},
    ]
    status = found.status()
    assert status["devices"]["config"] == found.config
    assert status["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-1"]


def test_binding_conditions_follow_the_gate() -> None:
    """allocator (binding conditions, DRADeviceBindingConditions beta on from 1.36): the
    device's conditions are copied into the result; without the gate it is unusable."""
    dev = {**device("gpu-0"), "bindingConditions": ["Attached"],
           "bindingFailureConditions": ["AttachFailed"]}  # fmt: skip
    devs = slices(dev)
    _, results = alloc.allocate(
        claim(exactly("a")), devs, CLASSES, in_use=set(), profile=kube_profile("1.36")
    )
    assert results[0]["bindingConditions"] == ["Attached"]
    assert results[0]["bindingFailureConditions"] == ["AttachFailed"]
    with pytest.raises(alloc.AllocationError, match="0 of 1 devices available"):
        alloc.allocate(claim(exactly("a")), devs, CLASSES, in_use=set(),
                       profile=kube_profile("1.35"))  # fmt: skip


def test_extended_resource_requests() -> None:
    """scheduler dynamicresources extended resources (DRAExtendedResource, GA 1.37):
    one request per container and resource named container-<i>-request-<j>, j the index
    among the container's sorted requests; the class by extendedResourceName."""
    classes = {"gpu": {"spec": {"extendedResourceName": "example.com/gpu"}}}
    pod = {"spec": {"containers": [{"name": "c", "resources": {
        "requests": {"cpu": "1", "example.com/gpu": "2"}}}]}}  # fmt: skip
    requests, mappings = alloc.extended_resource_requests(pod, classes, kube_profile("1.37"))
    assert requests == [{"name": "container-0-request-1", "exactly": {
        "deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 2}}]  # fmt: skip
    assert mappings == [{"containerName": "c", "resourceName": "example.com/gpu",
                         "requestName": "container-0-request-1"}]  # fmt: skip
    assert alloc.extended_resource_requests(pod, classes, kube_profile("1.35")) == ([], [])
