"""ResourceClaim lifecycle on the embedded control plane, as a real cluster runs it.

Written from upstream kubernetes/kubernetes:

* ``pkg/controller/resourceclaim/controller.go``: ``handleClaim`` (a claim per
  ``resourceClaimTemplateName`` with ``generateName: <pod>-<claim>-``, the pod as
  controlling owner, the ``resource.kubernetes.io/pod-claim-name`` annotation, the
  template's labels; the name recorded in ``pod.status.resourceClaimStatuses``),
  ``syncPod`` (an allocated claim of a pod bound without the scheduler is reserved for
  it), ``syncClaim`` (``reservedFor`` entries of pods that are gone or done are removed;
  the allocation is cleared only when none is left; then the
  ``resource.kubernetes.io/delete-protection`` finalizer is removed; an unreserved
  claim generated for a done pod is deleted), ``isPodDone``;
* ``pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go``: PreBind
  adds the finalizer before writing the allocation, and appends the pod to
  ``reservedFor`` of an allocated (shared) claim;
* ``staging/src/k8s.io/api/resource/v1/types.go``: ``Finalizer``,
  ``ResourceClaimReservedForMaxSize``.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest

from drahealth.controlplane import APIServer
from drahealth.kube import make_client
from drahealth.standins import StandIns
from drahealth.standins._scheduler import SchedulerStandIn
from tests.conformance._dra_world import CLAIMS, NS, Http, World, eventually, world

__all__ = ["world"]

pytestmark = pytest.mark.timeout(60)

FINALIZER = "resource.kubernetes.io/delete-protection"


async def _gpu_world(w: World, gpus: int = 2) -> None:
    await w.node("node-1")
    await w.gpus("node-1", gpus)
    await w.device_class()


async def test_shared_claim_reserved_for_every_pod_and_freed_only_when_unused(
    world: World,
) -> None:
    """Two pods on one claim: both in ``reservedFor``; the claim keeps its device until
    the last one is gone, and another claim never gets that device meanwhile."""
    w = world
    await _gpu_world(w)
    await w.claim("shared")
    a = await w.pod("a", {"gpu": {"resourceClaimName": "shared"}})
    await w.bound("a")
    b = await w.pod("b", {"gpu": {"resourceClaimName": "shared"}})
    await w.bound("b")
    claim = await w.http.ok("GET", f"{CLAIMS}/shared")
    reserved = claim["status"]["reservedFor"]
    assert sorted(r["uid"] for r in reserved) == sorted(
        [a["metadata"]["uid"], b["metadata"]["uid"]]
    ), reserved
    assert all(r["resource"] == "pods" for r in reserved)
    assert FINALIZER in claim["metadata"]["finalizers"]
    device = await w.devices("shared")
    assert len(device) == 1

    await w.http.ok("DELETE", f"{NS}/pods/a")

    async def only_b() -> Any:
        got = await w.http.ok("GET", f"{CLAIMS}/shared")
        return [r["name"] for r in got["status"].get("reservedFor") or []] == ["b"] and got

    claim = await eventually(only_b, 10, "pod a removed from reservedFor")
    assert claim["status"]["allocation"], "deallocated while pod b still uses the device"
    assert await w.devices("shared") == device

    await w.claim("other")
    await w.pod("c", {"gpu": {"resourceClaimName": "other"}})
    await w.bound("c")
    other = await w.devices("other")
    assert other and other != device, "a device still allocated was handed out twice"

    await w.http.ok("DELETE", f"{NS}/pods/b")

    async def freed() -> Any:
        got = await w.http.ok("GET", f"{CLAIMS}/shared")
        return not (got.get("status") or {}).get("allocation") and got

    claim = await eventually(freed, 10, "the claim deallocated once unused")
    assert not claim["status"].get("reservedFor")
    assert FINALIZER not in (claim["metadata"].get("finalizers") or [])


async def test_generated_claim_named_owned_recorded_and_deleted_when_pod_done(
    world: World,
) -> None:
    """A claim from a template: ``<pod>-<claim>-xxxxx``, owned by the pod, recorded in
    its status, protected while allocated, deleted when the pod has succeeded."""
    w = world
    await _gpu_world(w, gpus=1)
    await w.template("one-gpu")
    pod = await w.pod("trainer", {"gpu": {"resourceClaimTemplateName": "one-gpu"}})
    name = await w.claim_of("trainer")
    assert re.fullmatch(r"trainer-gpu-[a-z0-9]{5}", name), name
    claim = await w.http.ok("GET", f"{CLAIMS}/{name}")
    meta = claim["metadata"]
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": pod["metadata"]["uid"],
         "controller": True, "blockOwnerDeletion": True}
    ]  # fmt: skip
    assert meta["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    assert meta["labels"] == {"from": "template"}
    await w.bound("trainer")
    claim = await w.http.ok("GET", f"{CLAIMS}/{name}")
    assert FINALIZER in claim["metadata"]["finalizers"]
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["trainer"]

    await w.finish("trainer", "Succeeded")

    async def gone() -> bool:
        return await w.http.get(f"{CLAIMS}/{name}") is None

    await eventually(gone, 10, "the generated claim deleted after its pod succeeded")
    # the pod stays (a finished pod is kept) and the device is free for the next pod
    assert await w.http.get(f"{NS}/pods/trainer") is not None
    await w.pod("next", {"gpu": {"resourceClaimTemplateName": "one-gpu"}})
    assert await w.bound("next") == "node-1"


async def test_generated_claim_of_a_failed_pod_is_freed_too(world: World) -> None:
    """``isPodDone``: Failed counts as done as well as Succeeded."""
    w = world
    await _gpu_world(w, gpus=1)
    await w.template("one-gpu")
    await w.pod("job-0", {"gpu": {"resourceClaimTemplateName": "one-gpu"}})
    name = await w.claim_of("job-0")
    await w.bound("job-0")
    await w.finish("job-0", "Failed")

    async def gone() -> bool:
        return await w.http.get(f"{CLAIMS}/{name}") is None

    await eventually(gone, 10, "the claim of the failed pod deleted")


async def test_claim_in_use_is_kept_until_its_pod_is_gone(world: World) -> None:
    """The ``delete-protection`` finalizer: deleting an allocated claim in use only marks
    it; it goes once the consumer is gone and the allocation is cleared."""
    w = world
    await _gpu_world(w, gpus=1)
    await w.claim("mine")
    await w.pod("user", {"gpu": {"resourceClaimName": "mine"}})
    await w.bound("user")
    await w.http.ok("DELETE", f"{CLAIMS}/mine")
    claim = await w.http.ok("GET", f"{CLAIMS}/mine")
    assert claim["metadata"].get("deletionTimestamp"), "an in-use claim vanished at once"
    assert claim["status"]["allocation"]
    await w.http.ok("DELETE", f"{NS}/pods/user")

    async def gone() -> bool:
        return await w.http.get(f"{CLAIMS}/mine") is None

    await eventually(gone, 10, "the claim deleted once its pod is gone")


async def test_pod_bound_without_the_scheduler_is_reserved(world: World) -> None:
    """``syncPod``: a pod created with ``spec.nodeName`` on an allocated claim is added to
    ``reservedFor`` by the controller; the scheduler leaves the pod where it is."""
    w = world
    await _gpu_world(w)
    await w.node("node-2")
    await w.claim("shared")
    await w.pod("first", {"gpu": {"resourceClaimName": "shared"}})
    await w.bound("first")
    pinned = await w.pod("pinned", {"gpu": {"resourceClaimName": "shared"}}, nodeName="node-1")

    async def reserved() -> bool:
        got = await w.http.ok("GET", f"{CLAIMS}/shared")
        uids = [r["uid"] for r in got["status"].get("reservedFor") or []]
        return pinned["metadata"]["uid"] in uids and len(uids) == 2

    await eventually(reserved, 10, "the pinned pod reserved on the claim")
    assert not await w.events("pinned", "Scheduled"), "the scheduler touched a bound pod"


async def test_allocations_in_flight_are_not_handed_out_again(server: APIServer) -> None:
    """The scheduler remembers what it allocated until its claim informer shows it
    (upstream's assume cache): with that informer frozen, two pods still get two
    devices and the shared claim's second consumer is appended, not lost."""
    client = make_client(server_url=server.url, timeout=5.0)
    sched = SchedulerStandIn(client)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        w = World(Http(session, server.url), StandIns(client))
        await _gpu_world(w)
        for name in ("c0", "c1"):
            await w.claim(name)
        await w.pod("p0", {"gpu": {"resourceClaimName": "c0"}})
        await w.pod("p1", {"gpu": {"resourceClaimName": "c1"}})
        await w.pod("p2", {"gpu": {"resourceClaimName": "c0"}})
        reflectors = [sched.pods, sched.claims, sched.slices, sched.classes, sched.nodes]
        try:
            for r in reflectors:
                await r.start()
            for r in reflectors:
                await r.wait_synced()
            await sched.claims.stop()  # frozen: it never sees the allocations
            await sched.pass_once()
        finally:
            for r in reflectors:
                await r.stop()
            await client.close()
        assert sorted((await w.devices("c0")) + (await w.devices("c1"))) == [
            "node-1/gpu-0",
            "node-1/gpu-1",
        ]
        claim = await w.http.ok("GET", f"{CLAIMS}/c0")
        assert [r["name"] for r in claim["status"]["reservedFor"]] == ["p0", "p2"]
