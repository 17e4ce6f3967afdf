"""``allocatedResourcesStatus`` for devices a pod got through an extended resource.

The agent reports the special claim's devices (KEP-5004) in an entry named by the
resource, as the API server's validation requires for a non-``claim:`` name (a key of
the container's ``resources.requests``), with the resourceID format of claim entries;
the entry is recomputed on each pass, device-plugin entries are kept, and what the
builder writes the cluster model reads back for the same device.
"""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.core import ClaimInfo, Health, PreparedDeviceInfo, StatusBuilder, StatusOptions
from drahealth.core._cluster import build
from drahealth.core._cluster_pods import StatusInputError
from drahealth.core._health import DeviceKey

D, NODE, SPECIAL = "gpu.example.com", "node-1", "trainer-extended-resources-x7k2p"
CDI = "k8s.gpu.example.com/claim={uid}-{dev}"
INFO = ClaimInfo(
    "default", SPECIAL, "c-uid",
    (
        PreparedDeviceInfo(D, NODE, "gpu-0", ("container-0-request-1",),
                           (CDI.format(uid="c-uid", dev="gpu-0"),)),
        PreparedDeviceInfo(D, NODE, "gpu-1", ("container-1-request-0",)),
        PreparedDeviceInfo(D, NODE, "gpu-2", ("container-1-request-0",)),
    ),
)  # fmt: skip
HEALTH = {"gpu-0": (Health.UNHEALTHY, "XID 79"), "gpu-1": (Health.HEALTHY, ""),
          "gpu-2": (Health.UNKNOWN, "")}  # fmt: skip


def claims(namespace: str, name: str) -> ClaimInfo | None:
    return INFO if (namespace, name) == ("default", SPECIAL) else None


def health(driver: str, pool: str, device: str) -> tuple[Health, str]:
    return HEALTH[device]


def pod(**main_status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "trainer", "namespace": "default", "uid": "u1"},
        "spec": {"containers": [
            {"name": "main", "resources": {
                "requests": {"cpu": "1", "example.com/gpu": "1", "nvidia.com/gpu": "1"}}},
            {"name": "side", "resources": {"requests": {"example.com/gpu": "2"}}},
            {"name": "plain"},
        ]},
        "status": {
            "containerStatuses": [
                {"name": "main", **main_status}, {"name": "side"}, {"name": "plain"},
            ],
            "extendedResourceClaimStatus": {
                "resourceClaimName": SPECIAL,
                "requestMappings": [
                    {"containerName": "main", "resourceName": "example.com/gpu",
                     "requestName": "container-0-request-1"},
                    {"containerName": "side", "resourceName": "example.com/gpu",
                     "requestName": "container-1-request-0"},
                ],
            },
        },
    }  # fmt: skip


def statuses(p: dict[str, Any], options: StatusOptions | None = None) -> dict[str, Any]:
    out = StatusBuilder(options or StatusOptions()).apply(p, claims, health)["containerStatuses"]
    return {cs["name"]: cs.get("allocatedResourcesStatus") for cs in out}


def test_entries_named_by_the_resource_per_container() -> None:
    got = statuses(pod())
    assert got["main"] == [
        {"name": "example.com/gpu", "resources": [
            {"resourceID": "k8s.gpu.example.com/claim=c-uid-gpu-0", "health": "Unhealthy",
             "message": "XID 79"},
        ]},
    ]  # fmt: skip
    assert got["side"] == [
        {"name": "example.com/gpu", "resources": [
            {"resourceID": f"{D}/{NODE}/gpu-1", "health": "Healthy"},
            {"resourceID": f"{D}/{NODE}/gpu-2", "health": "Unknown"},
        ]},
    ]  # fmt: skip
    assert got["plain"] is None


def test_entries_are_recomputed_and_device_plugin_entries_kept() -> None:
    plugin = {"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-1", "health": "Healthy"}]}
    stale = {"name": "example.com/gpu", "resources": [{"resourceID": "old", "health": "Healthy"}]}
    got = statuses(pod(allocatedResourcesStatus=[plugin, stale]))
    assert got["main"][0] == plugin
    assert [e["name"] for e in got["main"]] == ["nvidia.com/gpu", "example.com/gpu"]
    assert got["main"][1]["resources"][0]["health"] == "Unhealthy"
    # with the gate off our entries go, the device plugin's stay
    off = statuses(
        pod(allocatedResourcesStatus=[plugin, stale]), StatusOptions(health_status=False)
    )
    assert off["main"] == [plugin]


def test_nothing_without_a_prepared_claim_or_a_request_key() -> None:
    p = pod()
    p["status"]["extendedResourceClaimStatus"]["resourceClaimName"] = "not-prepared"
    assert statuses(p)["main"] is None
    # only keys of resources.requests are names the API server accepts
    p = pod()
    p["spec"]["containers"][0]["resources"] = {"limits": {"example.com/gpu": "1"}}
    assert statuses(p)["main"] is None


def test_a_malformed_mapping_is_named() -> None:
    p = pod()
    p["status"]["extendedResourceClaimStatus"]["requestMappings"] = "nope"
    with pytest.raises(StatusInputError, match=r"extendedResourceClaimStatus\.requestMappings"):
        statuses(p)


def test_the_model_reads_back_what_the_builder_wrote() -> None:
    """One meaning, one implementation: the agent's entries resolve to the devices."""
    p = pod()
    p["spec"]["nodeName"] = NODE
    p["status"]["phase"] = "Running"
    p["status"]["containerStatuses"] = StatusBuilder().apply(p, claims, health)["containerStatuses"]
    results = [
        {"request": "container-0-request-1", "driver": D, "pool": NODE, "device": "gpu-0"},
        {"request": "container-1-request-0", "driver": D, "pool": NODE, "device": "gpu-1"},
        {"request": "container-1-request-0", "driver": D, "pool": NODE, "device": "gpu-2"},
    ]
    claim = {
        "metadata": {"name": SPECIAL, "namespace": "default"},
        "status": {"allocation": {"devices": {"results": results}}},
    }
    model = build([("Pod", p), ("ResourceClaim", claim)])
    seen = {k.device: o.health for k, o in model.pod_observations("default", "trainer").items()}
    assert seen == {"gpu-0": Health.UNHEALTHY, "gpu-1": Health.HEALTHY, "gpu-2": Health.UNKNOWN}
    assert {c.name for c in model.consumers(DeviceKey(D, NODE, "gpu-0"))} == {"trainer"}
