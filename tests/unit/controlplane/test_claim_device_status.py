"""ResourceClaim ``status.devices`` in the embedded plane: validated as upstream's
``validateDeviceStatus`` does, dropped without ``DRAResourceClaimDeviceStatus``, cleared
on deallocation (``dropDeallocatedStatusDevices``)."""

from __future__ import annotations

import copy
from typing import Any

from drahealth.controlplane._resources import lookup
from drahealth.controlplane._strategy import drop_disabled_fields
from drahealth.controlplane._validate import device_status_causes, object_causes
from drahealth.core import kube_profile

CLAIMS = lookup("resource.k8s.io", "v1", "resourceclaims")
DRV = "gpu.example.com"
T0 = "2026-11-24T10:00:00Z"


def cond(**kw: Any) -> dict[str, Any]:
    return {"type": "DeviceHealthy", "status": "False", "reason": "Unhealthy",
            "lastTransitionTime": T0, "message": "XID 79", **kw}  # fmt: skip


def claim(devices: list[dict[str, Any]] | None, *, share: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": DRV, "pool": "node-1", "device": "gpu-0"}
    if share:
        result["shareID"] = share
    status: dict[str, Any] = {"allocation": {"devices": {"results": [result]}}}
    if devices is not None:
        status["devices"] = devices
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default", "uid": "u", "resourceVersion": "1"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
        "status": status,
    }


def entry(**kw: Any) -> dict[str, Any]:
    return {"driver": DRV, "pool": "node-1", "device": "gpu-0", "conditions": [cond()], **kw}


def messages(causes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(c.get("field", ""), c["message"]) for c in causes]


def test_a_valid_entry_passes_through_the_whole_validation() -> None:
    assert CLAIMS is not None
    new = claim([entry(data={"uuid": "GPU-1"}, networkData={"ips": ["10.0.0.1/24"]})])
    assert object_causes(CLAIMS, new, old=claim(None)) == []


def test_only_allocated_devices_with_their_share_id() -> None:
    got = messages(device_status_causes(claim([entry(device="gpu-7")])["status"]))
    assert got == [
        (
            "status.devices[0]",
            'Invalid value: "gpu.example.com/node-1/gpu-7": '
            "must be an allocated device in the claim",
        )
    ]
    shared = claim([entry(shareID="3f0e1c52-0c9d-4c1e-9d0c-0e8a2c2b6d11")])
    assert device_status_causes(shared["status"])  # allocated without a share
    ok = claim(
        [entry(shareID="3f0e1c52-0c9d-4c1e-9d0c-0e8a2c2b6d11")],
        share="3f0e1c52-0c9d-4c1e-9d0c-0e8a2c2b6d11",
    )
    assert device_status_causes(ok["status"]) == []
    dup = claim([entry(), entry()])
    assert ("status.devices[1]", 'Duplicate value: "gpu.example.com/node-1/gpu-0"') in messages(
        device_status_causes(dup["status"])
    )


def test_condition_rules_and_limits() -> None:
    many = [cond(type=f"T{i}") for i in range(9)]
    got = messages(device_status_causes(claim([entry(conditions=many)])["status"]))
    assert ("status.devices[0].conditions", "Too many: 9: must have at most 8 items") in got
    bad = cond(status="Bad", reason="no spaces", lastTransitionTime="", observedGeneration=-1)
    got = messages(device_status_causes(claim([entry(conditions=[bad, cond(), cond()])])["status"]))
    fields = [f for f, _ in got]
    assert "status.devices[0].conditions[0].status" in fields
    assert "status.devices[0].conditions[0].observedGeneration" in fields
    assert (
        "status.devices[0].conditions[0].lastTransitionTime",
        "Required value: must be set",
    ) in got
    assert any(
        f == "status.devices[0].conditions[0].reason" and "a condition reason must start" in m
        for f, m in got
    )
    assert ("status.devices[0].conditions[2]", 'Duplicate value: "DeviceHealthy"') in got
    long = cond(message="x" * (32 * 1024 + 1))
    assert (
        "status.devices[0].conditions[0].message",
        "Too long: must have at most 32768 bytes",
    ) in (messages(device_status_causes(claim([entry(conditions=[long])])["status"])))


def test_data_and_network_data_limits() -> None:
    big = entry(data={"x": "y" * 10240})
    assert ("status.devices[0].data", "Too long: must have at most 10240 bytes") in messages(
        device_status_causes(claim([big])["status"])
    )
    ips = entry(networkData={"ips": [f"10.0.0.{i}/24" for i in range(17)]})
    assert ("status.devices[0].networkData.ips", "Too many: 17: must have at most 16 items") in (
        messages(device_status_causes(claim([ips])["status"]))
    )
    no_cidr = entry(networkData={"ips": ["10.0.0.1"], "interfaceName": "e" * 257})
    fields = [f for f, _ in messages(device_status_causes(claim([no_cidr])["status"]))]
    assert fields == [
        "status.devices[0].networkData.interfaceName",
        "status.devices[0].networkData.ips[0]",
    ]


def test_dropped_without_the_gate_unless_in_use() -> None:
    assert CLAIMS is not None
    off = kube_profile("1.36", {"DRAResourceClaimDeviceStatus": False})
    new = claim([entry()])
    drop_disabled_fields(CLAIMS, new, claim(None), off)
    assert "devices" not in new["status"]
    new = claim([entry()])
    drop_disabled_fields(CLAIMS, new, claim([entry()]), off)  # in use: kept
    assert new["status"]["devices"]
    for version in ("1.34", "1.36", "1.37"):  # beta on by default, GA locked on
        new = claim([entry()])
        drop_disabled_fields(CLAIMS, new, claim(None), kube_profile(version))
        assert new["status"]["devices"], version


def test_deallocation_clears_the_entries_of_the_deallocated_devices() -> None:
    assert CLAIMS is not None
    old = claim([entry()])
    new = copy.deepcopy(old)
    del new["status"]["allocation"]
    drop_disabled_fields(CLAIMS, new, old, kube_profile("1.37"))
    assert "devices" not in new["status"]
    assert object_causes(CLAIMS, new, old=old) == []
