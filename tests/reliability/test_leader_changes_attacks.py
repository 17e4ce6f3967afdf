"""The remediation controller's fencing, breaker window and repair deadlines, attacked.

A stale leader must write nothing, whatever path the write takes (a precondition delete
goes around lightkube's ``delete``; a repair command is no API write at all); the state
ConfigMap is written conditionally and a key counts as written only once the API holds
it; rule deletes carry the rule's uid and resourceVersion; the validation hook is
bounded like every other child; and times a controller reads back (the state's repair
deadlines and breaker window, the history's rows, the rules' creation times) are
trusted only as far as a controller could have written them: "year 9999", ``1e999``,
NaN, rows naming devices nobody publishes or another node's, a wall clock set forward
by hours.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceSlice

from drahealth.controlplane import APIServer
from drahealth.core import (
    CircuitBreaker,
    DeviceFacts,
    DeviceKey,
    Limits,
    Match,
    Policy,
    Repair,
    RepairRun,
    Rule,
    Want,
    parse_limit,
)
from drahealth.core._policy import Validate
from drahealth.core._remedy_engine import RemedyEngine
from drahealth.kube import (
    FencedClient,
    LeaseLost,
    as_dict,
    delete_with_preconditions,
    to_internal,
)
from drahealth.remedy._aftercare import parse_time
from drahealth.remedy._control import STATE_CONFIGMAP, ControllerState
from drahealth.remedy._controller import RemediationController, _history_rows
from drahealth.remedy._repair import RepairRunner
from drahealth.remedy._rules import rule_body
from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client
from tests.integration.remedy.test_breaker import (
    RULES,
    health,
    make_slices,
    our_rules,
    set_node_health,
)
from tests.integration.remedy.test_controller import DRIVER, NODE, policy

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(90)

KEY = DeviceKey(DRIVER, NODE, "gpu-0")
FACTS = DeviceFacts(DRIVER, NODE, "gpu-0", NODE)
T0 = 1_800_000_000.0
YEAR_9999 = "9999-12-31T23:59:59Z"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


class Recording:
    """A client that passes everything through and records the writes it was asked."""

    def __init__(self, inner: AsyncClient) -> None:
        self.inner = inner
        self.calls: list[tuple[str, Any]] = []
        self.before_write: Any = None  # async callable run before the first write

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in ("create", "replace", "patch", "delete"):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args[0] if args else None))
            hook, self.before_write = self.before_write, None
            if hook is not None:
                await hook()
            return await attr(*args, **kwargs)

        return call


# -- the state ConfigMap: conditional, and written only when it is -------------------


async def test_the_state_flush_is_conditional_and_keeps_a_concurrent_writers_keys(
    client: AsyncClient,
) -> None:
    first = ControllerState(client, "default")
    first.set("other", {"v": 1})
    await first.flush()
    rec = Recording(client)
    state = ControllerState(rec, "default")  # type: ignore[arg-type]
    await state.load()

    async def someone_writes() -> None:  # between our read and our write
        cm = await client.get(ConfigMap, STATE_CONFIGMAP, namespace="default")
        cm.data = {**(cm.data or {}), "other": json.dumps({"v": 2})}
        await client.replace(cm)

    state.set("repairs", {"x": 1})
    rec.before_write = someone_writes
    await state.flush()
    assert state.written("repairs")
    kinds = [k for k, _ in rec.calls]
    assert "patch" not in kinds, "an unconditional merge patch"
    sent = [obj for k, obj in rec.calls if k == "replace"]
    assert len(sent) == 2 and all(o.metadata.resourceVersion for o in sent), "no precondition"
    cm = await client.get(ConfigMap, STATE_CONFIGMAP, namespace="default")
    data = cm.data or {}
    assert json.loads(data["repairs"]) == {"x": 1}
    assert json.loads(data["other"]) == {"v": 2}, "a concurrent writer's key was lost"


async def test_a_key_set_while_the_state_is_written_is_not_taken_as_written(
    client: AsyncClient,
) -> None:
    rec = Recording(client)
    state = ControllerState(rec, "default")  # type: ignore[arg-type]
    state.set("repairs", {"phase": "waiting-drain"})

    async def set_again() -> None:  # the pass moves on while the write is on its way
        state.set("repairs", {"phase": "running", "deadline": "soon"})

    rec.before_write = set_again
    await state.flush()
    assert not state.written("repairs"), "a value the API does not hold counts as written"
    await state.flush()
    assert state.written("repairs")
    cm = await client.get(ConfigMap, STATE_CONFIGMAP, namespace="default")
    assert json.loads((cm.data or {})["repairs"])["phase"] == "running"


async def test_a_state_that_keeps_conflicting_is_never_taken_as_written(
    client: AsyncClient,
) -> None:
    await client.create(
        ConfigMap(metadata=ObjectMeta(name=STATE_CONFIGMAP, namespace="default"), data={})
    )

    class Conflicts(Recording):
        def __getattr__(self, name: str) -> Any:
            if name != "replace":
                return super().__getattr__(name)

            async def replace(obj: Any, *args: Any, **kwargs: Any) -> Any:
                obj.metadata.resourceVersion = "1"  # always stale
                return await self.inner.replace(obj, *args, **kwargs)

            return replace

    state = ControllerState(Conflicts(client), "default")  # type: ignore[arg-type]
    state.set("repairs", {"x": 1})
    await state.flush()
    assert not state.written("repairs")


# -- deletes with preconditions, and fencing on every path ---------------------------


def _rule(device: str = "gpu-0") -> DeviceTaintRule:
    body = rule_body(
        DeviceKey(DRIVER, NODE, device),
        key="drahealth.io/unhealthy", value="unhealthy", effect="NoSchedule", node=NODE,
    )  # fmt: skip
    return DeviceTaintRule.from_dict(body)


async def test_a_rule_changed_since_it_was_read_is_not_deleted(client: AsyncClient) -> None:
    controller = RemediationController(client, Policy(rules=()), identity="c1")
    controller._rule_cls = DeviceTaintRule
    read = await client.create(_rule())
    newer = await client.get(DeviceTaintRule, read.metadata.name)
    newer.metadata.annotations = {**(newer.metadata.annotations or {}), "x": "y"}
    await client.replace(newer)  # e.g. another leader re-tainted it
    assert not await controller._write_rule("delete", as_dict(read))
    still = await client.get(DeviceTaintRule, read.metadata.name)
    assert still.metadata.uid == read.metadata.uid, "deleted with a stale resourceVersion"
    # re-created under the same name: the uid differs, so the old read deletes nothing
    current = await client.get(DeviceTaintRule, read.metadata.name)
    await client.delete(DeviceTaintRule, read.metadata.name)
    again = await client.create(_rule())
    assert not await controller._write_rule("delete", as_dict(current))
    assert (await client.get(DeviceTaintRule, again.metadata.name)).metadata.uid == (
        again.metadata.uid
    )
    # the rule as read is deleted
    assert await controller._write_rule("delete", as_dict(again))
    assert not [r async for r in client.list(DeviceTaintRule)]


async def test_a_precondition_delete_by_a_replica_that_lost_the_lease_writes_nothing(
    client: AsyncClient,
) -> None:
    rule = await client.create(_rule())
    fenced: Any = FencedClient(client, lambda: False)
    with pytest.raises(LeaseLost):
        await delete_with_preconditions(
            fenced, DeviceTaintRule, rule.metadata.name,
            uid=rule.metadata.uid, resource_version=rule.metadata.resourceVersion,
        )  # fmt: skip
    assert (await client.get(DeviceTaintRule, rule.metadata.name)).metadata.uid == rule.metadata.uid


async def test_the_renew_deadline_passing_mid_pass_stops_the_rest_of_the_pass(
    client: AsyncClient,
) -> None:
    """Holds for the first two writes only (a rule and its Event): the later writes of
    the same pass (another create, a delete) are refused."""
    held = iter([True, True])
    fenced: Any = FencedClient(client, lambda: next(held, False))
    controller = RemediationController(client, Policy(rules=()), identity="c1")
    controller.client = fenced
    controller._rule_cls = DeviceTaintRule
    victim = await client.create(_rule("gpu-7"))
    assert await controller._write_rule("create", as_dict(_rule("gpu-1")))
    with pytest.raises(LeaseLost):
        await controller._write_rule("create", as_dict(_rule("gpu-2")))
    with pytest.raises(LeaseLost):
        await controller._write_rule("delete", as_dict(victim))
    names = sorted([str(r.spec.deviceSelector.device) async for r in client.list(DeviceTaintRule)])
    assert names == ["gpu-1", "gpu-7"]


async def test_a_replica_that_lost_the_lease_starts_no_repair_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    answers: list[tuple[bool, str]] = []
    fenced: Any = FencedClient(None, lambda: False)  # type: ignore[arg-type]
    runner = RepairRunner(
        fenced, "default", lambda _r, ok, d, _j: answers.append((ok, d)), recorded=lambda: True
    )
    repair = Repair(exec=("sh", "-c", f"touch {marker}"), timeout=5.0)
    runner.start(RepairRun(KEY, "xid", repair, 1, 1), FACTS, "XID 79", ())
    await eventually(lambda: not runner._tasks, 10.0, "the attempt to end")
    await asyncio.sleep(0.3)
    assert not marker.exists(), "a stale leader ran a repair command"
    assert not answers, "an attempt that never ran must stay 'running' for the next leader"


# -- the validation hook: the bounded runner -----------------------------------------


async def test_the_validation_hook_kills_its_whole_group_at_the_timeout(
    client: AsyncClient, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    controller = RemediationController(client, Policy(rules=()), identity="c1")
    check = Validate(exec=("sh", "-c", f"sleep 977 & echo $$ $! > {pids}; sleep 60"), timeout=1.0)
    controller._validating.add(KEY)
    try:
        async with asyncio.timeout(20):
            await controller._validate(KEY, NODE, check)
        await eventually(pids.exists, 5.0, "the pid file")
        left = [int(p) for p in pids.read_text().split()]
        await eventually(
            lambda: not [p for p in left if _alive(p)], 10.0, "the check's group to be killed"
        )
    finally:
        for text in pids.read_text().split() if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(text), signal.SIGKILL)
    assert KEY not in controller._validating
    assert controller._history[-1]["message"].startswith(f"validation of {KEY} failed")


async def test_the_validation_hook_follows_no_redirect(client: AsyncClient) -> None:
    hits: list[str] = []

    async def redirect(_r: web.Request) -> web.Response:
        hits.append("redirect")
        raise web.HTTPFound("/ok")

    async def ok(_r: web.Request) -> web.Response:
        hits.append("ok")
        return web.Response(text="fine")

    app = web.Application()
    app.router.add_get("/check", redirect)
    app.router.add_get("/ok", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        controller = RemediationController(client, Policy(rules=()), identity="c1")
        check = Validate(http=f"http://127.0.0.1:{port}/check", timeout=5.0)
        await controller._validate(KEY, NODE, check)
    finally:
        await runner.cleanup()
    assert hits == ["redirect"], hits
    assert "failed" in controller._history[-1]["message"]


# -- repair deadlines a tenant edited -------------------------------------------------

EXEC = Repair(exec=("true",), timeout=60.0)


def _engine() -> RemedyEngine:
    return RemedyEngine(Policy(rules=(Rule("xid", Match(), repair=EXEC),)))


def _repairs(**fields: Any) -> dict[str, Any]:
    row = {"phase": "running", "attempt": 1, "kind": "exec", "rule": "xid", "node": NODE}
    return {"repairs": {str(KEY): {**row, **fields}}}


def _wall(text: Any) -> float | None:
    return parse_time(text)


@pytest.mark.parametrize("deadline", [YEAR_9999, "1e999", 1e308, "nan"])
def test_an_edited_repair_deadline_waits_at_most_the_rules_timeout(deadline: Any) -> None:
    now = T0 + 10
    since = "2027-01-15T08:00:00Z"
    start = _wall(since)
    assert start is not None
    e = _engine()
    e.care.restore(_repairs(since=since, notBefore=since, deadline=deadline), _wall, now)
    st = e.care.repairs[KEY]
    assert st.not_before <= EXEC.attempt_deadline(start), st.not_before


@pytest.mark.parametrize("field", ["since", "notBefore"])
def test_an_edited_repair_start_or_backoff_in_year_9999_does_not_stop_repairs(
    field: str,
) -> None:
    now = _wall("2027-01-15T08:00:00Z")
    assert now is not None
    e = _engine()
    fields = {"since": "2027-01-15T07:59:00Z", "notBefore": "2027-01-15T07:59:00Z"}
    fields[field] = YEAR_9999
    e.care.restore(_repairs(**fields, phase="waiting-drain"), _wall, now)
    st = e.care.repairs[KEY]
    assert st.not_before <= now + 3600 + 60, st.not_before


def test_escalation_episodes_dated_in_the_future_are_not_counted() -> None:
    now = _wall("2027-01-15T08:00:00Z")
    assert now is not None
    e = _engine()
    state = {"episodes": {str(KEY): {"episodes": [YEAR_9999, YEAR_9999, YEAR_9999]}}}
    problems = e.care.restore(state, _wall, now)
    assert problems and e.care.escalation.counts(KEY) == (0, 0)


# -- the breaker's window, read back ---------------------------------------------------


def _breaker() -> tuple[CircuitBreaker, list[DeviceKey], dict[DeviceKey, DeviceFacts]]:
    rule = Rule("any", Match(driver=DRIVER))
    b = CircuitBreaker(Policy((rule,), limits=Limits(window=600, cluster=parse_limit(1))))
    facts = {}
    for i in range(4):
        key = DeviceKey(DRIVER, NODE, f"gpu-{i}")
        facts[key] = DeviceFacts(DRIVER, NODE, f"gpu-{i}", NODE)
        b.track(key, facts[key])
    return b, sorted(facts), facts


def _admits(b: CircuitBreaker, key: DeviceKey, facts: Any, now: float) -> bool:
    want = Want("NoSchedule", "drahealth.io/unhealthy", "unhealthy", "any", "Unhealthy")
    out, _ = b.admit({key: want}, lambda _k, w: True, facts.__getitem__, now)
    return key in out


@pytest.mark.parametrize("at", [T0 + 1e9, float("inf"), float("nan"), 1e308])
def test_a_state_window_time_far_ahead_or_not_finite_never_holds_the_window(at: float) -> None:
    b, keys, facts = _breaker()
    b.restore({"admitted": [[str(keys[0]), at]]}, T0)
    assert _admits(b, keys[1], facts, T0 + 601), "the window never ends"


def test_a_history_row_dated_ahead_is_not_counted_again_by_every_new_leader() -> None:
    b, keys, facts = _breaker()
    b.recall([(keys[0], T0 + 1e9)], T0)
    assert _admits(b, keys[1], facts, T0)


async def test_history_rows_count_only_published_devices_on_the_rows_node(
    client: AsyncClient,
) -> None:
    await make_slices(client, 2)
    controller = RemediationController(client, Policy(rules=()), identity="c1")
    slices = [s async for s in client.list(ResourceSlice)]

    for s in slices:
        controller.model.apply("ResourceSlice", "ADDED", to_internal(as_dict(s)))
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rows: list[Any] = [
        "not a row",
        {"action": "create", "time": when, "subject": f"{DRIVER}/node-0/gpu-0"},  # real
        {"action": "create", "time": when, "subject": f"{DRIVER}/nowhere/gpu-{'9' * 5000}"},
        {"action": "create", "time": "NaN", "subject": f"{DRIVER}/node-0/gpu-1"},
        {"action": "create", "time": 5, "subject": f"{DRIVER}/node-0/gpu-2"},
        {  # a node row for node-0 naming node-1's devices and thousands of made-up ones
            "action": "node",
            "time": when,
            "subject": "node-0",
            "message": "node node-0: tainted (unhealthy devices: "
            + ", ".join(
                [f"{DRIVER}/node-1/gpu-{i}" for i in range(8)]
                + [f"{DRIVER}/node-0/fake-{i}" for i in range(5000)]
            )
            + ")",
        },
        {
            "action": "node",
            "time": when,
            "subject": "node-0",
            "message": f"node node-0: tainted (unhealthy devices: {DRIVER}/node-0/gpu-3)",
        },
    ]
    controller._history.extend(_history_rows(ConfigMap(data={"history": json.dumps(rows)})))
    counted = sorted(str(k) for k, _ in controller._written_taints())
    assert counted == [f"{DRIVER}/node-0/gpu-0", f"{DRIVER}/node-0/gpu-3"], counted


# -- the window across a wall clock set forward ---------------------------------------


async def test_a_wall_clock_set_forward_by_hours_keeps_the_breaker_window(
    client: AsyncClient, server: APIServer
) -> None:
    await make_slices(client, 1)
    await set_node_health(client, "node-0", health(0))
    offset = [0.0]
    p = policy(RULES, "limits: {cluster: 1, window: 1h}\n")
    controller = RemediationController(
        client, p, identity="c1", wall=lambda: time.time() + offset[0]
    )
    task = asyncio.create_task(controller.run())
    try:
        await eventually(lambda: controller.synced, 10.0, "the controller to sync")
        await set_node_health(client, "node-0", health(1))

        async def count(n: int) -> bool:
            return len(await our_rules(client)) == n

        await eventually(lambda: count(1), 10.0, "the first taint")
        offset[0] = 3 * 3600.0  # the wall clock jumps three hours ahead
        await set_node_health(client, "node-0", health(3))
        await eventually(lambda: controller.passes > 3, 10.0, "passes after the jump")
        await asyncio.sleep(1.0)
        assert await count(1), "the wall clock jump emptied the breaker's window"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
