"""The remediation controller when talking to the API server fails at the worst moment.

``run()`` restarts its round on a transport error (``kube.TRANSPORT_ERRORS``). These hold
what that does not cover by itself: an eviction whose request is reset (the evictor runs
as a task of its own), Events that time out (a separate events etcd that is down, a slow
webhook on Events), a rule created whose answer was lost, and a validation hook still
running from the round that was abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import DeviceTaintRule

import drahealth.kube._reflector as reflector_module
import drahealth.remedy._controller as controller_module
from drahealth.core import DeviceKey, Validate
from drahealth.core._policy import Policy
from drahealth.remedy._controller import HISTORY_CONFIGMAP, RemediationController
from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client
from tests.integration.remedy.test_controller import make_pod, policy, rules, set_health
from tests.integration.remedy.test_ownership import history

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(30)

XID = """- name: xid
  match: {driver: gpu.example.com, message: XID}
  action: {effect: NoExecute, taintValue: xid}
  recovery: {healthyFor: 0.2s}
"""
EVICT = "eviction: {mode: evict, perSecond: 50}\n"


@asynccontextmanager
async def running(client: AsyncClient, p: Policy) -> AsyncIterator[RemediationController]:
    controller = RemediationController(client, p, identity="r28")
    task = asyncio.create_task(controller.run())
    controller.task = task  # type: ignore[attr-defined]
    try:
        yield controller
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _events(client: AsyncClient, reason: str) -> list[Event]:
    return [e async for e in client.list(Event, namespace="default") if e.reason == reason]


async def _pod_gone(client: AsyncClient, name: str) -> bool:
    return not [
        p async for p in client.list(Pod, namespace="default")
        if p.metadata and p.metadata.name == name and not p.metadata.deletionTimestamp
    ]  # fmt: skip


async def test_a_reset_eviction_request_is_retried_not_the_end_of_evictions(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The evictor is a task of the round: a transport error on one eviction POST ended
    that task, nobody awaited it, and no pod was evicted again until the round ended for
    another reason (in eviction mode the rule is NoSchedule: nothing else moves them)."""
    await set_health(client, gpu_2="Healthy")
    await make_pod(client, "web", "gpu-2", {"app": "web"})
    create = client.create
    resets: list[str] = []

    async def reset_first_eviction(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, Pod.Eviction) and not resets:
            resets.append("web")
            raise httpx2.ReadError("connection reset by peer")
        return await create(obj, *args, **kwargs)

    monkeypatch.setattr(client, "create", reset_first_eviction)
    async with running(client, policy(XID, EVICT)) as controller:
        await set_health(client, gpu_2=("Unhealthy", "XID 79"))
        await eventually(lambda: resets, 5.0, "the reset eviction")
        await eventually(lambda: _pod_gone(client, "web"), 5.0, "the pod evicted after a reset")
        assert not controller.task.done()  # type: ignore[attr-defined]


async def test_an_eviction_whose_answer_was_lost_is_recorded_once(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server evicted the pod but the answer never came back: the audit trail still
    says the controller evicted it (once), instead of nothing."""
    await set_health(client, gpu_3="Healthy")
    await make_pod(client, "batch", "gpu-3", {"app": "batch"})
    create = client.create
    lost: list[str] = []

    async def lose_first_answer(obj: Any, *args: Any, **kwargs: Any) -> Any:
        result = await create(obj, *args, **kwargs)
        if isinstance(obj, Pod.Eviction) and not lost:
            lost.append("batch")
            raise httpx2.ReadError("connection reset by peer")
        return result

    monkeypatch.setattr(client, "create", lose_first_answer)
    async with running(client, policy(XID, EVICT)) as controller:
        await set_health(client, gpu_3=("Unhealthy", "XID 79"))
        await eventually(lambda: lost, 5.0, "the eviction whose answer was lost")

        async def evicted_rows() -> list[dict[str, Any]]:
            return [
                r for r in await history(client)
                if r["action"] == "evict-evicted" and r["subject"] == "default/batch"
            ]  # fmt: skip

        await eventually(evicted_rows, 5.0, "the eviction in the history")
        passes = controller.passes
        await eventually(lambda: controller.passes >= passes + 2, 5.0)
        assert len(await evicted_rows()) == 1
        assert not controller.task.done()  # type: ignore[attr-defined]


async def test_events_that_time_out_do_not_stop_remediation(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events live in their own etcd on many clusters (--etcd-servers-overrides): when it
    is down an Event create times out. The round announced its mode with an Event, so each
    round died there and restarted, for ever: no device was ever tainted."""
    create = client.create
    timeouts: list[str] = []

    async def events_time_out(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, Event):
            timeouts.append(str(obj.reason))
            raise httpx2.ReadTimeout("timed out")
        return await create(obj, *args, **kwargs)

    monkeypatch.setattr(client, "create", events_time_out)
    await set_health(client, gpu_0="Healthy")
    async with running(client, policy(XID)) as controller:
        await set_health(client, gpu_0=("Unhealthy", "XID 79"))

        async def tainted() -> bool:
            return any(n.startswith("dh-") for n in await rules(client))

        await eventually(tainted, 5.0, "the taint while Events time out")
        await eventually(lambda: "DeviceTainted" in timeouts, 5.0, "the taint's Event tried")
        assert "RemediationMode" in timeouts
        failures = controller.metrics.failures.labels("event")._value.get()  # type: ignore[attr-defined]
        assert failures >= 2
        assert not controller.task.done()  # type: ignore[attr-defined]


async def test_a_rule_created_whose_answer_was_lost_is_in_the_audit_trail(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule was created but the connection was reset before the answer: the round
    restarted, found the rule (its own, seeded) and never said it tainted the device:
    no history row, no DeviceTainted Event."""
    create = client.create
    lost: list[str] = []

    async def lose_rule_answer(obj: Any, *args: Any, **kwargs: Any) -> Any:
        result = await create(obj, *args, **kwargs)
        if isinstance(obj, DeviceTaintRule) and not lost:
            lost.append(str(obj.metadata.name if obj.metadata else ""))
            raise httpx2.ReadError("connection reset by peer")
        return result

    monkeypatch.setattr(client, "create", lose_rule_answer)
    await set_health(client, gpu_1="Healthy")
    async with running(client, policy(XID)) as controller:
        await set_health(client, gpu_1=("Unhealthy", "XID 79"))
        await eventually(lambda: lost, 5.0, "the lost answer")

        async def created_rows() -> list[dict[str, Any]]:
            return [
                r for r in await history(client)
                if r["action"] == "create" and r["subject"] == "gpu.example.com/node-1/gpu-1"
            ]  # fmt: skip

        await eventually(created_rows, 5.0, "the taint in the history after the lost answer")
        await eventually(lambda: _events(client, "DeviceTainted"), 5.0, "its DeviceTainted Event")
        passes = controller.passes
        await eventually(lambda: controller.passes >= passes + 2, 5.0)
        assert len(await created_rows()) == 1
        assert len(await _events(client, "DeviceTainted")) == 1
        assert len([n for n in await rules(client) if n.startswith("dh-")]) == 1


async def test_a_validation_of_an_abandoned_round_does_not_run_beside_the_next(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round restarted after a transport error left its validation hook running (a bare
    task nobody held): the next round started the same hook again beside it, and the old
    one's end cleared the new round's 'validating' mark and fed the new engine."""
    calls: list[asyncio.Future[tuple[bool, str]]] = []
    inflight = [0, 0]  # now, most at once

    async def fake_check(check: Validate, key: DeviceKey, node: str) -> tuple[bool, str]:
        done: asyncio.Future[tuple[bool, str]] = asyncio.get_running_loop().create_future()
        calls.append(done)
        inflight[0] += 1
        inflight[1] = max(inflight[1], inflight[0])
        try:
            return await done
        finally:
            inflight[0] -= 1

    monkeypatch.setattr(controller_module, "run_check", fake_check)
    hooked = """- name: any
  match: {driver: gpu.example.com}
  action: {effect: NoSchedule}
  recovery:
    healthyFor: 0.1s
    validate: {exec: ["true"], timeout: 5s}
"""
    await set_health(client, gpu_7=("Unhealthy", "ECC"))
    async with running(client, policy(hooked)) as controller:
        await eventually(lambda: _has_rule(client), 5.0, "the taint")
        await set_health(client, gpu_7="Healthy")
        await eventually(lambda: calls, 5.0, "the first validation")
        reconcile = controller.reconcile
        broken: list[int] = []

        async def reset_once() -> None:
            if not broken:
                broken.append(1)
                raise httpx2.RemoteProtocolError("peer closed connection")
            await reconcile()

        monkeypatch.setattr(controller, "reconcile", reset_once)
        await eventually(lambda: len(calls) >= 2, 10.0, "the next round's validation")
        assert inflight[1] == 1, "two validations of one device ran at once"
        if not calls[0].done():
            calls[0].set_result((True, "stale"))
        await asyncio.sleep(0)
        assert controller._validating, "the old round's end cleared the new round's mark"
        calls[-1].set_result((True, "ok"))
        await eventually(lambda: _has_no_rule(client), 5.0, "the untaint after validation")


async def _has_rule(client: AsyncClient) -> bool:
    return any(n.startswith("dh-") for n in await rules(client))


async def _has_no_rule(client: AsyncClient) -> bool:
    return not await _has_rule(client)


async def test_a_garbled_answer_restarts_the_round_instead_of_ending_the_leadership(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body whose compression a proxy broke (httpx2.DecodingError) is no ApiError and
    no transport error: it ended run(), and in-process (the demo cluster) for good."""
    create = client.create
    garbled: list[str] = []

    async def garble_rule_answer(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, DeviceTaintRule) and not garbled:
            garbled.append("rule")
            raise httpx2.DecodingError("Error -3 while decompressing data: incorrect header")
        return await create(obj, *args, **kwargs)

    monkeypatch.setattr(client, "create", garble_rule_answer)
    await set_health(client, gpu_5="Healthy")
    async with running(client, policy(XID)) as controller:
        await set_health(client, gpu_5=("Unhealthy", "XID 79"))
        await eventually(lambda: garbled, 5.0, "the garbled answer")
        await eventually(lambda: _has_rule(client), 5.0, "the taint after the restart")
        assert not controller.task.done()  # type: ignore[attr-defined]


async def test_a_round_restarted_after_the_lease_was_lost_writes_nothing(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held: the transport error came as the Lease ran out; the restarted round reads
    the API again but its first write is fenced (LeaseLost ends run()), nothing is sent."""
    holds = [True]
    writes: list[tuple[str, bool]] = []
    for method in ("create", "patch", "replace", "delete"):
        inner = getattr(client, method)

        def recorder(inner: Any = inner, method: str = method) -> Any:
            async def call(*args: Any, **kwargs: Any) -> Any:
                writes.append((method, holds[0]))
                return await inner(*args, **kwargs)

            return call

        monkeypatch.setattr(client, method, recorder())
    await set_health(client, gpu_6="Healthy")
    controller = RemediationController(client, policy(XID), identity="r28", fence=lambda: holds[0])
    task = asyncio.create_task(controller.run())
    try:
        await eventually(lambda: controller.synced, 5.0, "the first round")
        reconcile = controller.reconcile

        async def lose_lease_then_reset() -> None:
            holds[0] = False
            raise httpx2.ReadError("connection reset by peer")

        monkeypatch.setattr(controller, "reconcile", lose_lease_then_reset)
        controller._wake.set()
        with pytest.raises(Exception) as info:
            await asyncio.wait_for(task, 10.0)
        assert type(info.value).__name__ == "LeaseLost", info.value
        assert reconcile is not None
        assert not [w for w in writes if not w[1]], writes
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


async def test_restarts_in_a_tight_loop_back_off(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Held: a round that fails at once every time (the history read resets) waits longer
    each time (0.5 s doubling, jittered down to half), not a busy loop."""
    get = client.get
    resets = [0]

    async def history_resets(kind: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == HISTORY_CONFIGMAP:
            resets[0] += 1
            raise httpx2.ReadError("connection reset by peer")
        return await get(kind, name, *args, **kwargs)

    monkeypatch.setattr(client, "get", history_resets)
    caplog.set_level("WARNING", logger="drahealth.remedy._controller")
    async with running(client, policy(XID)) as controller:
        await eventually(lambda: resets[0] >= 3, 10.0, "three failed rounds")
        delays = [
            float(r.getMessage().rsplit("restarting in ", 1)[1].split()[0])
            for r in caplog.records if "restarting in" in r.getMessage()
        ]  # fmt: skip
        assert not controller.task.done()  # type: ignore[attr-defined]
    assert len(delays) >= 2
    for i, delay in enumerate(delays):
        base = 0.5 * 2**i
        assert base / 2 - 0.05 <= delay <= base + 0.05, delays


async def test_a_cancel_during_a_failed_rounds_clean_up_ends_run(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Lease ran out as the connection reset: the elector cancels run() while the
    failed round stops its reflectors, a wait that swallows the CancelledError. run()
    then took the reset for a blip and started a new round, for ever where nothing
    fences its writes (in-process), until the first fenced write otherwise."""
    get = client.get
    reads = [0]

    async def history_resets(kind: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == HISTORY_CONFIGMAP:
            reads[0] += 1
            raise httpx2.ReadError("connection reset by peer")
        return await get(kind, name, *args, **kwargs)

    stop = reflector_module.Reflector.stop
    cancelled: list[int] = []

    async def stop_while_cancelled(self: Any) -> None:
        if reads[0] and not cancelled:
            cancelled.append(1)
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # the elector's cancel lands in the clean-up
        await stop(self)

    monkeypatch.setattr(client, "get", history_resets)
    monkeypatch.setattr(reflector_module.Reflector, "stop", stop_while_cancelled)
    controller = RemediationController(client, policy(XID), identity="r28")
    task = asyncio.create_task(controller.run())
    try:
        await eventually(lambda: cancelled, 5.0, "the cancel in the clean-up")
        done, _ = await asyncio.wait([task], timeout=2.0)
        assert done, "run() went on after it was cancelled"
        assert task.cancelled()
        assert reads[0] == 1, "a new round started after the cancel"
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
