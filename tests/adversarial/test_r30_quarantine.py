"""Attacks on mode ``quarantine`` (one allocated ResourceClaim per bad device) and what
came with it: hostile quarantine-claim and node annotations read at start, a claim
squatting the deterministic name, stale watch events after the controller's own
writes, a status write refused after the create, a deallocating second writer, the
claim cap, the circuit breaker's weights and window across a leader change, and the
fence views at scale. Each of the ten bugs these found is fixed; the tests keep them so."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import Status
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.types import PatchType

import drahealth.remedy._quarantine as quarantine_module
from drahealth.core import (
    CircuitBreaker,
    DeviceFacts,
    DeviceKey,
    Limits,
    Match,
    Policy,
    Rule,
    Want,
    parse_limit,
)
from drahealth.remedy._controller import RemediationController
from drahealth.remedy._nodes import ANNOTATION_DEVICES, NodeDevice
from drahealth.remedy._quarantine import (
    ANNOTATION_QUARANTINE,
    QuarantineWriter,
    allocation,
    claim_body,
    claim_name,
)
from drahealth.remedy._rules import CONTROLLER_LABEL, MANAGED_BY
from drahealth.remedy._view import blocked_pods, device_taints, read_fences
from tests._support import eventually
from tests.integration.remedy.test_controller import NODE, make_pod, policy, set_health
from tests.integration.remedy.test_modes import (
    RULES,
    ResourceClaim,
    claim_dict,
    cluster,
    events,
    make_node,
    running,
)

pytestmark = pytest.mark.timeout(60)

DRIVER = "gpu.example.com"
GPU0 = DeviceKey(DRIVER, NODE, "gpu-0")
GPU1 = DeviceKey(DRIVER, NODE, "gpu-1")
NS = "default"
#: a JSON integer no float holds (json.loads keeps it an int of 401 digits)
HUGE = "1" + "0" * 400
#: JSON nested deeper than the decoder's recursion limit (4 KB: any annotation holds it)
DEEP = "[" * 5000 + "]" * 5000


def row(key: DeviceKey = GPU0, **over: Any) -> NodeDevice:
    fields: dict[str, Any] = {
        "mode": "quarantine", "key": "drahealth.io/unhealthy", "value": "xid",
        "effect": "NoExecute", "rule": "xid", "reason": "Unhealthy: XID 79",
        "since": round(time.time(), 3), "by": "c1", "health": "Unhealthy",
    }  # fmt: skip
    fields.update(over)
    return NodeDevice(key, **fields)


def hostile_claim(annotation: str, key: DeviceKey = GPU0) -> dict[str, Any]:
    body = claim_body(row(key), NS)
    body["metadata"]["annotations"][ANNOTATION_QUARANTINE] = annotation
    return body


def huge_row(mode: str) -> str:
    return (
        f'{{"device": "{GPU0}", "mode": "{mode}", "key": "drahealth.io/unhealthy", '
        f'"since": {HUGE}}}'
    )


def allocated(claim: dict[str, Any] | None) -> bool:
    return bool(claim and (claim.get("status") or {}).get("allocation"))


async def dealloc(client: AsyncClient, name: str) -> None:
    await client.patch(
        ResourceClaim.Status, name, {"status": {"allocation": None, "reservedFor": None}},
        namespace=NS, patch_type=PatchType.MERGE,
    )  # fmt: skip


def writer(client: AsyncClient, said: list[str] | None = None) -> QuarantineWriter:
    def on_change(device: NodeDevice, what: str, claim: str) -> None:
        if said is not None:
            said.append(what)

    return QuarantineWriter(client, NS, on_change=on_change)


def free(_key: DeviceKey) -> list[str]:
    return []


# -- 1. hostile annotations read at start stop the controller for good -----------------


@pytest.mark.parametrize("where", ["claim", "node"])
@pytest.mark.parametrize("payload", ["huge-number", "deep-nesting"])
async def test_a_hostile_annotation_read_at_start_does_not_stop_the_controller(
    where: str, payload: str
) -> None:
    """One object with the controller's label (a quarantine claim in its namespace) or
    annotation (a Node's unhealthy-devices list) whose JSON holds a number no float holds,
    or nests past the decoder's limit, must be skipped like any unreadable entry. Today
    ``run()`` raises out of the round's start; the leader elector logs it, re-acquires,
    and dies again on the same object: no remediation in any mode, a full relist per
    retry."""
    async with cluster("1.35") as (client, _paths):
        if where == "claim":
            await make_node(client)
            text = huge_row("quarantine") if payload == "huge-number" else DEEP
            await client.create(ResourceClaim.from_dict(hostile_claim(text)))
        else:
            text = f"[{huge_row('node-taint')}]" if payload == "huge-number" else DEEP
            node = {"metadata": {"name": NODE, "annotations": {ANNOTATION_DEVICES: text}}}
            await client.create(Node.from_dict(node))
        await set_health(client, gpu_0="Healthy")
        controller = RemediationController(client, policy(RULES), identity="c1")
        task = asyncio.create_task(controller.run())
        try:
            await eventually(lambda: controller.synced or task.done(), 10.0, "start or death")
            assert not task.done(), f"controller died: {task.exception()!r}"
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OverflowError, RecursionError):
                await task


@pytest.mark.parametrize("where", ["claim", "node"])
def test_the_fence_views_survive_out_of_range_times(where: str) -> None:
    """A quarantine claim whose since is a 401-digit integer, or a Node row whose since is
    1e20, raises nothing: such a time is no time (unknown)."""
    if where == "claim":  # the claim does hold the device: a fence, since unknown
        claim = hostile_claim(huge_row("quarantine"))
        claim["status"] = allocation(GPU0, "uid-1")
        fences = read_fences([], [claim], NS)
        assert list(fences.claims) == [GPU0]
    else:
        text = json.dumps([{"device": str(GPU0), "mode": "node-taint", "key": "k", "since": 1e20}])
        node = {"metadata": {"name": NODE, "annotations": {ANNOTATION_DEVICES: text}}}
        taints = device_taints((), (), [node])
        assert taints[GPU0][0]["since"] == ""


# -- 2. the circuit breaker's state and window -------------------------------------------


def _breaker(limit: str) -> tuple[CircuitBreaker, dict[DeviceKey, DeviceFacts]]:
    facts = {
        DeviceKey(DRIVER, f"node-{n}", f"gpu-{i}"): DeviceFacts(
            DRIVER, f"node-{n}", f"gpu-{i}", f"node-{n}"
        )
        for n in range(10)
        for i in range(8)
    }
    b = CircuitBreaker(
        Policy((Rule("any", Match(driver=DRIVER)),), limits=Limits(cluster=parse_limit(limit)))
    )
    for key, f in facts.items():
        b.track(key, f)
    return b, facts


WANT = Want("NoSchedule", "drahealth.io/unhealthy", "unhealthy", "any", "Unhealthy: XID 79")
T0 = 1_800_000_000.0


def test_breaker_restore_survives_an_admitted_time_no_float_holds() -> None:
    b, _facts = _breaker("10%")
    b.restore({"admitted": [[str(GPU0), int(HUGE)], [str(GPU1), T0, int(HUGE)]]}, T0)
    assert len(b.state()["admitted"]) <= 1


def test_a_restored_weight_survives_recall() -> None:
    """A new leader restores ``[first, T0, 8]`` (a node taint over 8 GPUs: 10 % of 80 is
    spent), then recall() hands it the node row's ``since`` or the history line's time,
    both written just after the admission: the weight falls back to 1 and the next node's
    device goes through although the window is full."""
    b, facts = _breaker("10%")
    first, second = DeviceKey(DRIVER, "node-0", "gpu-0"), DeviceKey(DRIVER, "node-1", "gpu-0")
    b.restore({"admitted": [[str(first), T0, 8]]}, T0 + 1)
    b.recall([(first, T0 + 0.002)], T0 + 1)
    out, _events = b.admit({second: WANT}, lambda _k, _w: True, facts.__getitem__, T0 + 1)
    assert not out, "8 of 8 allowed are fenced already: the next taint must be held"


async def test_a_new_leader_counts_the_quarantines_in_the_breakers_window() -> None:
    """limits {cluster: 1}: leader 1 quarantines gpu-0 and stops within STATE_LAG (the
    window's bookkeeping was not written to the state yet, as documented). Leader 2 must
    find the admission in what the API shows (the claim's annotation says since when) and
    hold gpu-1; today it admits gpu-1: two fences inside a window that allows one."""
    extra = "limits: {cluster: 1}\n"
    async with cluster("1.35") as (client, _paths):
        await make_node(client)
        await set_health(client, gpu_0="Healthy", gpu_1="Healthy")
        async with running(client, RULES, extra) as controller:
            await asyncio.sleep(0.3)  # the first pass writes the (empty) state at once
            await set_health(client, gpu_0=("Unhealthy", "XID 79"), gpu_1="Healthy")
            await eventually(
                lambda: GPU0 in controller.quarantine.written(), 5.0, "gpu-0 quarantined"
            )
        async with running(client, RULES, extra) as controller:
            await set_health(client, gpu_0=("Unhealthy", "XID 79"), gpu_1=("Unhealthy", "XID 79"))

            async def decided() -> bool:
                return GPU1 in controller.breaker.breaker.held or (
                    GPU1 in controller.quarantine.written()
                )

            await eventually(decided, 5.0, "the breaker's decision on gpu-1")
            assert GPU1 not in controller.quarantine.written()


# -- 3. the claim writer against a second writer ------------------------------------------


async def test_a_squatter_with_our_label_but_another_devices_row_is_never_allocated() -> None:
    """Someone made ``claim_name(gpu-0)`` first, with the controller's label and an
    annotation for gpu-1. The controller allocates gpu-0 to it anyway; no later load()
    recognises it (its name is not its row's), so a device that recovers while the
    controller restarts stays fenced by a claim nobody releases."""
    async with cluster("1.35") as (client, _paths):
        squat = claim_body(row(GPU1), NS)
        squat["metadata"]["name"] = claim_name(GPU0)
        await client.create(ResourceClaim.from_dict(squat))
        w = writer(client)
        await w.sync({GPU0: row()}, free)
        # a restarted controller, the device healthy again: nothing of ours is fenced
        again = writer(client)
        await again.load()
        await again.sync({}, free)
        assert not allocated(await claim_dict(client, claim_name(GPU0)))


async def test_a_squatter_without_our_label_is_left_alone_and_retried_later(
    caplog: Any,
) -> None:
    """The same name without the label: never adopted, nothing written to it, the writer
    backs off and says so (correct today)."""
    caplog.set_level(logging.WARNING, logger="drahealth.remedy._quarantine")
    async with cluster("1.35") as (client, _paths):
        squat = claim_body(row(), NS)
        del squat["metadata"]["labels"]
        await client.create(ResourceClaim.from_dict(squat))
        w = writer(client)
        await w.sync({GPU0: row()}, free)
        assert not w.written() and not allocated(await claim_dict(client, claim_name(GPU0)))
        assert claim_name(GPU0) in caplog.text


@pytest.mark.parametrize("stale", ["added-before-our-status-write", "deleted-older-uid"])
async def test_a_stale_watch_event_of_our_own_claim_is_not_someone_elses_deallocation(
    stale: str,
) -> None:
    """The watch and the writes are separate streams: the ADDED of our create may be
    dispatched after the status write returned, and a release followed at once by a
    re-fence may see the old claim's DELETED after the new one is allocated. Either is
    taken for 'deallocated/deleted by someone else': a false warning, one more status
    write, and a second DeviceQuarantined Event and history row."""
    async with cluster("1.35") as (client, _paths):
        said: list[str] = []
        w = writer(client, said)
        await w.sync({GPU0: row()}, free)
        claim = await claim_dict(client, claim_name(GPU0))
        assert allocated(claim) and GPU0 in w.written()
        assert claim is not None
        old = json.loads(json.dumps(claim))
        if stale == "added-before-our-status-write":
            old.pop("status", None)
            old["metadata"]["resourceVersion"] = str(int(claim["metadata"]["resourceVersion"]) - 1)
            event = "ADDED"
        else:
            old["metadata"]["uid"] = "an-older-incarnation"
            event = "DELETED"
        assert w.observe(event, old) is False
        await w.sync({GPU0: row()}, free)
        assert said == ["quarantined: allocated to its quarantine claim"]


async def test_a_status_write_refused_after_the_create_is_finished_later() -> None:
    """The create succeeds, the status write answers 500: the half-made claim is not
    called fenced, a later pass (or a new leader that finds it) allocates it, and a
    device that recovers meanwhile gets it deleted (correct today)."""
    async with cluster("1.35") as (client, _paths):
        failing = {"left": 1}
        real_patch = client.patch

        async def patch(res: Any, *a: Any, **kw: Any) -> Any:
            if res is ResourceClaim.Status and failing["left"]:
                failing["left"] -= 1
                raise ApiError(
                    response=None,  # type: ignore[arg-type]
                    status=Status(code=500, message="etcd timed out", reason="InternalError"),
                )
            return await real_patch(res, *a, **kw)

        client.patch = patch  # type: ignore[method-assign]
        w = writer(client)
        await w.sync({GPU0: row()}, free)
        half = await claim_dict(client, claim_name(GPU0))
        assert half is not None and not allocated(half) and not w.written()
        # a new leader finds the half-made claim and finishes it
        leader = writer(client)
        assert GPU0 in await leader.load()
        await leader.sync({GPU0: row()}, free)
        assert allocated(await claim_dict(client, claim_name(GPU0)))
        await leader.sync({}, free)  # recovered: deallocated, then deleted
        assert await claim_dict(client, claim_name(GPU0)) is None


async def test_a_flapping_deallocator_costs_one_refence_per_flap_and_no_loop() -> None:
    """Another actor deallocates the controller's claim again and again: each time it is
    allocated again (one status write, one DeviceQuarantined Event), and once the flapping
    stops nothing more is written: no hot loop (correct today; the amplification is one
    write and one Event per flap, with no backoff)."""
    async with cluster("1.35") as (client, _paths):
        await make_node(client)
        await set_health(client, gpu_0="Healthy")
        async with running(client, RULES) as controller:
            await set_health(client, gpu_0=("Unhealthy", "XID 79"))
            name = claim_name(GPU0)

            async def fenced() -> bool:
                return allocated(await claim_dict(client, name))

            await eventually(fenced, 5.0, "the first quarantine")
            flaps = 4
            for _ in range(flaps):
                await dealloc(client, name)
                await eventually(fenced, 5.0, "fenced again")
            await asyncio.sleep(0.5)
            writes = controller.quarantine.writes
            await asyncio.sleep(1.0)
            assert controller.quarantine.writes == writes == 1 + flaps
            quarantined = await eventually(
                lambda: _at_least(events(client, "DeviceQuarantined"), 1 + flaps), 5.0, "Events"
            )
            assert len(quarantined) == 1 + flaps


async def _at_least(found: Any, n: int) -> Any:
    out = await found
    return out if len(out) >= n else None


async def test_a_device_over_the_claim_cap_is_said_not_silently_dropped(
    caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the cap at one claim, a second bad device is neither fenced nor reported."""
    caplog.set_level(logging.DEBUG, logger="drahealth")
    monkeypatch.setattr(quarantine_module, "MAX_CLAIMS", 1)
    async with cluster("1.35") as (client, _paths):
        w = writer(client)
        await w.sync({GPU0: row(GPU0), GPU1: row(GPU1)}, free)
        assert set(w.written()) == {GPU0}
        assert str(GPU1) in caplog.text or GPU1 in w.waiting()


async def test_a_pod_claim_named_like_an_operator_quarantine_still_holds_its_device() -> None:
    """A workload's claim in the controller's namespace that merely starts with the
    operator prefix is not an operator quarantine claim (read_claim says so): the
    controller must wait for it, not allocate the device to a second claim."""
    async with cluster("1.35") as (client, _paths):
        await make_node(client)
        await set_health(client, gpu_0="Healthy")
        await make_pod(client, "drahealth-operator-quarantine-job", "gpu-0", {"app": "job"})
        rules = RULES.replace("effect: NoExecute, taintValue: xid", "effect: NoSchedule")
        async with running(client, rules) as controller:
            await set_health(client, gpu_0=("Unhealthy", "XID 79"))
            await eventually(
                lambda: (
                    GPU0 in controller.quarantine.waiting()
                    or GPU0 in controller.quarantine.written()
                ),
                5.0,
                "the controller's decision",
            )
            assert GPU0 not in controller.quarantine.written()


# -- 4. the views at scale ----------------------------------------------------------------


def test_blocked_pods_with_many_quarantines_and_a_queue_of_pending_pods_is_fast() -> None:
    """2,048 quarantined devices and 2,000 pods Pending with 'cannot allocate all claims'
    (a batch queue waiting for GPUs): one sort would do; today the view takes seconds."""
    claims = []
    for i in range(2048):
        key = DeviceKey(DRIVER, f"node-{i // 8}", f"gpu-{i % 8}")
        body = claim_body(row(key), NS)
        body["status"] = allocation(key, f"uid-{i}")
        claims.append(body)
    fences = read_fences([], claims, NS)
    assert len(fences.claims) == 2048
    condition = {
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/256 nodes are available: 256 cannot allocate all claims.",
    }  # fmt: skip
    pods = [
        {"metadata": {"name": f"p{i}", "namespace": "batch"},
         "status": {"phase": "Pending", "conditions": [condition]}}
        for i in range(2000)
    ]  # fmt: skip
    started = time.perf_counter()
    found, total = blocked_pods(pods, fences)
    elapsed = time.perf_counter() - started
    assert total == 2000 and len(found) == 50
    assert elapsed < 0.5, f"{elapsed:.1f} s for one view"


# -- 5. where the label is but the namespace is not ---------------------------------------


async def test_our_label_and_name_in_another_namespace_are_never_ours() -> None:
    """A claim with the controller's label, the deterministic name and a valid row, but in
    another namespace, is neither resumed nor re-fenced when deleted, and the views do not
    call it a fence (correct today)."""
    async with cluster("1.35") as (client, _paths):
        await client.create(Namespace.from_dict({"metadata": {"name": "elsewhere"}}))
        body = claim_body(row(), "elsewhere")
        await client.create(ResourceClaim.from_dict(body))
        await client.patch(
            ResourceClaim.Status, claim_name(GPU0), {"status": allocation(GPU0, "u")},
            namespace="elsewhere", patch_type=PatchType.MERGE,
        )  # fmt: skip
        w = writer(client)
        assert await w.load() == {}
        obj = (await client.get(ResourceClaim, claim_name(GPU0), namespace="elsewhere")).to_dict()
        assert w.observe("DELETED", obj) is False and not w.written()
        assert not read_fences([], [obj], NS).claims
        assert obj["metadata"]["labels"] == {MANAGED_BY: CONTROLLER_LABEL}
