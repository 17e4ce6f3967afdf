"""Pods that got a device through an extended resource backed by DRA (KEP-5004).

The scheduler's special claim (``status.extendedResourceClaimStatus``) makes them
consumers of its devices like claim users: listed, evicted from NoExecute devices
(its requests carry no tolerations), and their status entries named by the resource
(``example.com/gpu``) speak for the devices of the requests mapped to that container.
"""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.core import Health
from drahealth.core._cluster import ClusterModel, Consumer, build
from drahealth.core._cluster_pods import (
    EXTENDED_RESOURCES_REF,
    StatusInputError,
    extended_resource_claim,
    pod_claim_names,
)
from drahealth.core._health import DeviceKey
from drahealth.core._taints import Taint

D, NODE = "gpu.example.com", "node-1"
GPU0, GPU1, GPU2 = (DeviceKey(D, NODE, f"gpu-{i}") for i in range(3))
SPECIAL = "trainer-extended-resources-x7k2p"


def special_claim(results: list[tuple[str, str]], tolerations: Any = None) -> dict[str, Any]:
    requests = sorted({r for r, _ in results})
    spec_requests = []
    for r in requests:
        exactly: dict[str, Any] = {"deviceClassName": "gpu", "allocationMode": "ExactCount"}
        if tolerations:
            exactly["tolerations"] = tolerations
        spec_requests.append({"name": r, "exactly": exactly})
    return {
        "metadata": {"name": SPECIAL, "namespace": "default",
                     "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}},
        "spec": {"devices": {"requests": spec_requests}},
        "status": {"allocation": {"devices": {"results": [
            {"request": r, "driver": D, "pool": NODE, "device": d} for r, d in results
        ]}}},
    }  # fmt: skip


def pod(
    mappings: list[tuple[str, str, str]],
    entries: dict[str, list[dict[str, Any]]] | None = None,
    **status: Any,
) -> dict[str, Any]:
    """``trainer`` with containers ``main`` and ``side``; ``mappings`` are
    (container, resource, request); ``entries`` are allocatedResourcesStatus per container."""
    statuses = [
        {"name": c, "allocatedResourcesStatus": e} for c, e in sorted((entries or {}).items())
    ]
    return {
        "metadata": {"name": "trainer", "namespace": "default", "uid": "u1"},
        "spec": {"nodeName": NODE, "containers": [
            {"name": "main", "resources": {"requests": {"example.com/gpu": "1"}}},
            {"name": "side", "resources": {"requests": {"example.com/gpu": "2"}}},
        ]},
        "status": {
            "phase": "Running",
            "containerStatuses": statuses,
            "extendedResourceClaimStatus": {
                "resourceClaimName": SPECIAL,
                "requestMappings": [
                    {"containerName": c, "resourceName": r, "requestName": q}
                    for c, r, q in mappings
                ],
            },
            **status,
        },
    }  # fmt: skip


def entry(name: str, *resources: tuple[str, str]) -> dict[str, Any]:
    return {"name": name, "resources": [{"resourceID": i, "health": h} for i, h in resources]}


MAIN = [("main", "example.com/gpu", "container-0-request-0")]


def test_the_special_claim_is_one_of_the_pods_claims() -> None:
    p = pod(MAIN)
    assert pod_claim_names(p) == {EXTENDED_RESOURCES_REF: SPECIAL}
    assert pod_claim_names(p, extended=False) == {}
    special = extended_resource_claim(p)
    assert special is not None and special.name == SPECIAL
    assert special.resources("main") == ["example.com/gpu"] and special.resources("x") == []
    assert special.entry_request("main", "example.com/gpu") == "container-0-request-0"
    assert special.entry_request("side", "example.com/gpu") is None
    assert special.entry_request("main", "nvidia.com/gpu") is None


def test_malformed_status_is_skipped_or_named() -> None:
    bad = pod(MAIN)
    bad["status"]["extendedResourceClaimStatus"]["requestMappings"] = [{"containerName": 3}]
    assert extended_resource_claim(bad) is not None  # lenient: the bad mapping is skipped
    with pytest.raises(StatusInputError, match=r"requestMappings\[0\]\.containerName"):
        extended_resource_claim(bad, strict=True)
    no_name = pod(MAIN)
    del no_name["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    assert extended_resource_claim(no_name) is None
    assert extended_resource_claim({"status": {"extendedResourceClaimStatus": "x"}}) is None


def test_extended_resource_pods_are_consumers_and_evicted() -> None:
    model = build([("ResourceClaim", special_claim([("container-0-request-0", "gpu-0")])),
                   ("Pod", pod(MAIN))])  # fmt: skip
    expected = Consumer("default", "trainer", "u1", NODE, SPECIAL, "container-0-request-0", True)
    assert model.consumers(GPU0) == [expected]
    assert model.all_consumers() == {GPU0: [expected]}
    # the special claim's requests have no tolerations: a NoExecute taint evicts at once
    leaving, later = model.evictions(GPU0, Taint("drahealth.io/unhealthy", "xid", "NoExecute"),
                                     None, 0.0)  # fmt: skip
    assert leaving == [expected] and later is None


def test_tolerations_in_the_special_claim_are_honoured() -> None:
    """Upstream's scheduler writes none, but a claim that has them is read like any."""
    tol = [{"key": "drahealth.io/unhealthy", "operator": "Exists", "effect": "NoExecute",
            "tolerationSeconds": 30}]  # fmt: skip
    model = build([("ResourceClaim", special_claim([("container-0-request-0", "gpu-0")], tol)),
                   ("Pod", pod(MAIN))])  # fmt: skip
    taint = Taint("drahealth.io/unhealthy", "xid", "NoExecute")
    leaving, later = model.evictions(GPU0, taint, 100.0, 110.0)
    assert leaving == [] and later == 130.0


def test_ended_pods_and_other_claims_are_not_consumers() -> None:
    model = ClusterModel()
    model.apply("ResourceClaim", "ADDED", special_claim([("container-0-request-0", "gpu-0")]))
    model.apply("Pod", "ADDED", pod(MAIN, phase="Succeeded"))
    assert model.consumers(GPU0) == []
    # a pod whose special claim is another claim does not use these devices
    other = pod(MAIN)
    other["status"]["extendedResourceClaimStatus"]["resourceClaimName"] = "someone-else"
    model.apply("Pod", "MODIFIED", other)
    assert model.consumers(GPU0) == []


def test_status_entries_named_by_the_resource_report_health() -> None:
    """Pod before claim (any order): the entry ``example.com/gpu`` of container ``main``
    speaks for its request's device; the same name in an unmapped container, and device
    plugin entries, are not read."""
    claim = special_claim([("container-0-request-0", "gpu-0"), ("container-1-request-0", "gpu-1")])
    mappings = [*MAIN, ("side", "example.com/gpu", "container-1-request-0")]
    entries = {
        "main": [entry("example.com/gpu", (f"{D}/{NODE}/gpu-0", "Unhealthy"))],
        "side": [entry("example.com/gpu", ("k8s.gpu.example.com/claim=abc-gpu-1", "Healthy")),
                 entry("nvidia.com/gpu", ("GPU-1234", "Unhealthy"))],
    }  # fmt: skip
    model = ClusterModel()
    model.apply("Pod", "ADDED", pod(mappings, entries))
    assert model.observation(GPU0) is None
    model.apply("ResourceClaim", "ADDED", claim)
    obs0, obs1 = model.observation(GPU0), model.observation(GPU1)
    assert obs0 is not None and obs0.health is Health.UNHEALTHY and obs0.source == "pod"
    assert obs1 is not None and obs1.health is Health.HEALTHY
    assert model.pod_observations("default", "trainer").keys() == {GPU0, GPU1}
    assert model.take_changed() >= {GPU0, GPU1}


def test_a_resource_served_by_several_requests_is_matched_by_resource_id() -> None:
    """Two requests serve ``side``'s resource: each resourceID names its device; an ID
    that names neither is skipped, not guessed."""
    claim = special_claim([("container-1-request-0", "gpu-1"), ("container-1-request-1", "gpu-2")])
    mappings = [("side", "example.com/gpu", "container-1-request-0"),
                ("side", "example.com/gpu", "container-1-request-1")]  # fmt: skip
    entries = {"side": [entry("example.com/gpu", (f"{D}/{NODE}/gpu-2", "Unhealthy"),
                              ("k8s.gpu.example.com/claim=abc-gpu-1", "Healthy"),
                              ("mystery", "Unhealthy"))]}  # fmt: skip
    model = build([("ResourceClaim", claim), ("Pod", pod(mappings, entries))])
    seen = model.pod_observations("default", "trainer")
    assert {k: o.health for k, o in seen.items()} == {
        GPU1: Health.HEALTHY, GPU2: Health.UNHEALTHY,
    }  # fmt: skip
