"""``drahealth pods`` rows: where the pod status says nothing of a device, the driver's
``DeviceHealthy`` condition in the claim shows, with its source named."""

from __future__ import annotations

from typing import Any

from drahealth.cli._inventory import device_rows, pod_rows

DRV, NODE = "gpu.example.com", "node-1"


def claim() -> dict[str, Any]:
    cond = {"type": "DeviceHealthy", "status": "False", "reason": "Unhealthy",
            "message": "XID 79", "lastTransitionTime": "2026-11-24T10:00:00Z"}  # fmt: skip
    result = {"request": "gpu", "driver": DRV, "pool": NODE, "device": "gpu-0"}
    return {
        "metadata": {"name": "c", "namespace": "ml"},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "devices": [{"driver": DRV, "pool": NODE, "device": "gpu-0", "conditions": [cond]}],
        },
    }


def pod(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": "ml", "uid": "p1"},
        "spec": {"nodeName": NODE, "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]},
        "status": {"phase": "Running", **(status or {})},
    }


def test_pod_rows_fall_back_to_the_claim_condition() -> None:
    [row] = pod_rows([pod()], [claim()])
    assert (row["health"], row["message"], row["source"]) == ("Unhealthy", "XID 79", "claim ml/c")


def test_the_pod_status_wins_in_the_pods_view() -> None:
    entry = {"name": "claim:gpu/gpu",
             "resources": [{"resourceID": f"{DRV}/{NODE}/gpu-0", "health": "Healthy"}]}  # fmt: skip
    status = {"containerStatuses": [{"name": "main", "allocatedResourcesStatus": [entry]}]}
    [row] = pod_rows([pod(status)], [claim()])
    assert (row["health"], row["source"]) == ("Healthy", "pod")


def test_status_rows_name_the_claim_as_source() -> None:
    [row] = device_rows([], [pod()], [claim()], [], [], 1.8e9)
    assert (row["health"], row["source"], row["node"]) == ("Unhealthy", "claim ml/c", "")
    assert row["consumers"][0]["pod"] == "train"
