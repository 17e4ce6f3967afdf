"""Remediation of batch Jobs and of extended-resource pods on the embedded control plane.

One node with two simulated GPUs: the embedded API server with its stand-ins (scheduler,
resourceclaim, Job controller), the sample driver and the node agent in kubelet mode as
real processes, and the remediation controller in ``eviction.mode: evict`` (its
NoExecute becomes PodDisruptionBudget-aware evictions through the Eviction API).

* A Job with ``backoffLimit: 0`` whose ``podFailurePolicy`` ignores ``DisruptionTarget``:
  its pod's GPU fails, the controller evicts the pod, the API server marks it
  ``DisruptionTarget``/``EvictionByEvictionAPI`` before deleting it (upstream's
  eviction subresource), the pod fails, and the Job replaces it on the healthy GPU and
  completes without counting a failure (pkg/controller/job/pod_failure_policy.go).
* A pod that asked for ``example.com/gpu: 1`` (an extended resource backed by DRA,
  KEP-5004): the agent reports its device's health under ``example.com/gpu``, and a
  NoExecute fault evicts it like a claim user (upstream does neither yet: k/k #139939,
  #141290).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceClaimTemplate

from drahealth.cli._cluster import DRIVER, LocalCluster
from drahealth.cli._inventory import pod_rows
from drahealth.kube import as_dict
from drahealth.remedy import parse_policy

pytestmark = pytest.mark.timeout(90)
T = TypeVar("T")

POLICY = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
eviction: {mode: evict, perSecond: 20}
rules:
  - name: fatal-xid
    match: {driver: gpu.example.com, message: "XID"}
    action: {effect: NoExecute, taintValue: xid}
    recovery: {healthyFor: 1s}
"""
NS = "default"
# Runs until stopped on gpu-0, which the test breaks (SIGTERM exits 1, so the pod
# fails); finishes at once on gpu-1, the replacement's device.
TRAINER = "trap 'exit 1' TERM; printenv DRA_DEVICE_GPU_1 && exit 0; sleep infinity & wait"


async def until(check: Callable[[], Awaitable[T | None]], within: float, what: str) -> T:
    """Poll ``check`` until it returns something true; fail naming ``what``."""
    deadline = time.monotonic() + within
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(0.1)


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[LocalCluster, AsyncClient]]:
    with tempfile.TemporaryDirectory(prefix="dh-wl-") as workdir:
        c = LocalCluster(Path(workdir), parse_policy(POLICY, "test"), nodes=1, devices=2)
        try:
            await c.start()
            assert c.client is not None
            await c.client.create(
                DeviceClass.from_dict({
                    "metadata": {"name": DRIVER},
                    "spec": {
                        "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                        "extendedResourceName": "example.com/gpu",
                    },
                })
            )  # fmt: skip
            yield c, c.client
        finally:
            await c.stop()


async def device_of(client: AsyncClient, pod: dict[str, Any]) -> str | None:
    """The device of the pod's (only) claim, once allocated."""
    status = pod.get("status") or {}
    names = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or []]
    special = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    for name in [*names, *([special] if special else [])]:
        claim = as_dict(await client.get(ResourceClaim, name, namespace=NS))
        alloc = (claim.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or []:
            return str(r["device"])
    return None


async def job_pods(client: AsyncClient, job: str) -> list[dict[str, Any]]:
    return [
        as_dict(p)
        async for p in client.list(Pod, namespace=NS, labels={"batch.kubernetes.io/job-name": job})
    ]


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in its slow step
async def test_job_survives_an_eviction_without_spending_its_backoff_limit(
    cluster: tuple[LocalCluster, AsyncClient],
) -> None:
    local, client = cluster
    await client.create(
        ResourceClaimTemplate.from_dict({
            "metadata": {"name": "one-gpu", "namespace": NS},
            "spec": {"spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}},
        })
    )  # fmt: skip
    await client.create(
        Job.from_dict({
            "metadata": {"name": "train", "namespace": NS},
            "spec": {
                "backoffLimit": 0,
                "podFailurePolicy": {"rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                ]},
                "template": {"spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 5,
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                    "containers": [{
                        "name": "trainer", "image": "busybox:1.36",
                        "command": ["sh", "-c", TRAINER],
                        "resources": {"claims": [{"name": "gpu"}]},
                    }],
                }},
            },
        })
    )  # fmt: skip

    async def running() -> dict[str, Any] | None:
        pods = [p for p in await job_pods(client, "train") if p["status"].get("phase") == "Running"]
        return pods[0] if pods else None

    first = await until(running, 30, "the Job's first pod running")
    first_name = first["metadata"]["name"]
    assert await device_of(client, first) == "gpu-0", "the first pod should get gpu-0"

    # every version of the first pod the API shows, to see its condition while it ends
    seen: list[dict[str, Any]] = []

    async def watch_first() -> None:
        async for _, obj in client.watch(Pod, namespace=NS, fields={"metadata.name": first_name}):
            seen.append(as_dict(obj))

    watcher = asyncio.create_task(watch_first())
    t0 = time.monotonic()
    try:
        await local.inject(local.nodes[0], "gpu-0", "unhealthy", "--message", "XID 79")

        async def complete() -> dict[str, Any] | None:
            job = as_dict(await client.get(Job, "train", namespace=NS))
            kinds = {c["type"]: c for c in job["status"].get("conditions") or []}
            assert "Failed" not in kinds, f"the Job failed: {kinds['Failed']}"
            return job if kinds.get("Complete", {}).get("status") == "True" else None

        job = await until(complete, 40, "the Job to complete")
        print(f"gpu-0 Unhealthy -> Job Complete: {(time.monotonic() - t0) * 1000:.0f} ms")
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    # the eviction did not count: no failure, one success, and the evicted pod's
    # DisruptionTarget came from the eviction subresource before it ended
    assert job["status"].get("failed", 0) == 0 and job["status"]["succeeded"] == 1
    marks = [
        c for p in seen for c in p["status"].get("conditions") or []
        if c["type"] == "DisruptionTarget"
    ]  # fmt: skip
    assert marks, f"the evicted pod never showed DisruptionTarget: {seen}"
    assert (marks[0]["status"], marks[0]["reason"], marks[0]["message"]) == (
        "True", "EvictionByEvictionAPI", "Eviction API: evicting",
    )  # fmt: skip
    assert any(p["status"].get("phase") == "Failed" for p in seen), "the evicted pod failed"
    replacement = [
        p for p in await job_pods(client, "train") if p["metadata"]["name"] != first_name
    ]
    # the trainer exits 0 only where DRA_DEVICE_GPU_1 is set: it ran on the healthy GPU
    assert [p["status"]["phase"] for p in replacement] == ["Succeeded"]


async def test_extended_resource_pod_reports_health_and_is_evicted(
    cluster: tuple[LocalCluster, AsyncClient],
) -> None:
    local, client = cluster
    await client.create(
        Pod.from_dict({
            "metadata": {"name": "ext", "namespace": NS},
            "spec": {"containers": [{
                "name": "main", "image": "registry.example/trainer:1",
                "resources": {"requests": {"example.com/gpu": "1"},
                              "limits": {"example.com/gpu": "1"}},
            }]},
        })
    )  # fmt: skip

    async def entry() -> tuple[str, str, str] | None:
        pod = as_dict(await client.get(Pod, "ext", namespace=NS))
        for cs in pod["status"].get("containerStatuses") or []:
            for e in cs.get("allocatedResourcesStatus") or []:
                if e["name"] == "example.com/gpu" and e["resources"]:
                    r = e["resources"][0]
                    return r["resourceID"], r["health"], r.get("message", "")
        return None

    resource_id, health, _ = await until(entry, 30, "the pod's example.com/gpu health entry")
    pod = as_dict(await client.get(Pod, "ext", namespace=NS))
    device = await device_of(client, pod)
    assert device is not None and health == "Healthy"
    assert resource_id.endswith(f"-{device}"), resource_id  # the device's CDI id
    assert pod["status"]["phase"] == "Running"
    # `drahealth pods` lists it on its device, with the special claim and its health
    special = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claims = [as_dict(c) async for c in client.list(ResourceClaim, namespace=NS)]
    rows = [r for r in pod_rows([pod], claims) if r["pod"] == "ext"]
    assert [
        (r["claim"], r["request"], r["device"].rsplit("/", 1)[1], r["health"]) for r in rows
    ] == [(special, "container-0-request-0", device, "Healthy")]

    # a fault no rule acts on: shown in the pod status, the pod stays
    await local.inject(local.nodes[0], device, "unhealthy", "--message", "ECC page retired")

    async def unhealthy() -> tuple[str, str, str] | None:
        got = await entry()
        return got if got is not None and got[1] == "Unhealthy" else None

    _, _, message = await until(unhealthy, 15, "example.com/gpu Unhealthy in the pod status")
    assert message == "ECC page retired"

    # a fatal one: NoExecute, and the controller evicts the pod like a claim's user
    t0 = time.monotonic()
    await local.inject(local.nodes[0], device, "unhealthy", "--message", "XID 79")

    async def gone() -> bool:
        try:
            p = as_dict(await client.get(Pod, "ext", namespace=NS))
        except ApiError as exc:
            return exc.status.code == 404
        return bool(p["metadata"].get("deletionTimestamp"))

    await until(gone, 20, "the extended-resource pod to be evicted")
    print(f"XID on {device} -> extended-resource pod evicted: {time.monotonic() - t0:.2f} s")
    events = [e async for e in client.list(Event, namespace=NS)]
    evicted = [
        e for e in events if e.involvedObject.name == "ext" and e.reason == "DeviceTaintEviction"
    ]
    assert evicted, [(e.involvedObject.name, e.reason) for e in events]
