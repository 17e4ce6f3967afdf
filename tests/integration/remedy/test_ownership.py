"""Provenance and ownership on the embedded API server: operator holds (``drahealth
untaint --hold``, ``--release``), a deletion of the controller's rule taken as an untaint,
the opt-out node label, and rules the controller did not create."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod
from lightkube.resources.resource_v1 import DeviceTaintRule
from lightkube.types import PatchType

from drahealth.cli.taint import untaint_command
from drahealth.controlplane import APIServer
from drahealth.core import parse_time
from drahealth.remedy._control import STATE_CONFIGMAP
from drahealth.remedy._controller import HISTORY_CONFIGMAP, RemediationController
from drahealth.remedy._rules import (
    ANNOTATION_CREATED_BY,
    ANNOTATION_FIRST_SEEN,
    ANNOTATION_HEALTH,
    ANNOTATION_REASON,
    ANNOTATION_RULE,
    DeviceRef,
    rule_body,
)
from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client
from tests.integration.remedy.test_controller import (
    DRIVER,
    NODE,
    make_pod,
    policy,
    rules,
    running,
    set_health,
)

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(60)

DEVICE = f"{DRIVER}/{NODE}/gpu-0"
RULE = """- name: xid
  match: {driver: gpu.example.com}
  action: {effect: NoSchedule}
  recovery: {healthyFor: 0.5s}
"""


async def ours(client: AsyncClient) -> dict[str, Any]:
    return {n: r for n, r in (await rules(client)).items() if n.startswith("dh-")}


async def history(client: AsyncClient) -> list[dict[str, Any]]:
    try:
        cm = await client.get(ConfigMap, HISTORY_CONFIGMAP, namespace="default")
    except Exception:
        return []
    rows: list[dict[str, Any]] = json.loads((cm.data or {}).get("history", "[]"))
    return rows


async def state_holds(client: AsyncClient) -> dict[str, Any]:
    try:
        cm = await client.get(ConfigMap, STATE_CONFIGMAP, namespace="default")
    except Exception:
        return {}
    holds: dict[str, Any] = json.loads((cm.data or {}).get("holds", "{}"))
    return holds


async def events(client: AsyncClient, reason: str) -> list[Event]:
    return [e async for e in client.list(Event, namespace="default") if e.reason == reason]


async def passes(controller: RemediationController, count: int) -> None:
    """Let ``count`` more passes run (each sees every event delivered before it)."""
    target = controller.passes + count
    await eventually(lambda: controller.passes >= target, 10.0, f"{count} more passes")


async def untaint(kubeconfig: Path, *args: str) -> str:
    """``drahealth untaint`` in a thread (it runs its own event loop)."""
    result = await asyncio.to_thread(
        CliRunner().invoke,
        untaint_command,
        ["--kubeconfig", str(kubeconfig), DEVICE, "--by", "alice", *args],
    )
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture
def kubeconfig(server: APIServer, tmp_path: Path) -> Path:
    return server.write_kubeconfig(tmp_path / "kubeconfig")


async def bad_and_tainted(client: AsyncClient) -> Any:
    await set_health(client, gpu_0=("Unhealthy", "XID 79"))
    found = await eventually(lambda: ours(client), 5.0, "the controller's rule")
    (rule,) = found.values()
    return rule


async def test_a_rule_says_who_which_rule_why_and_since_when(client: AsyncClient) -> None:
    await set_health(client, gpu_0="Healthy")
    async with running(client, policy(RULE), identity="controller-7") as controller:
        await passes(controller, 1)
        rule = await bad_and_tainted(client)
        notes = rule.metadata.annotations
        assert notes[ANNOTATION_CREATED_BY] == "controller-7"
        assert notes[ANNOTATION_RULE] == "xid"
        assert notes[ANNOTATION_REASON] == "Unhealthy: XID 79"
        assert notes[ANNOTATION_HEALTH] == "Unhealthy"
        first_seen = parse_time(notes[ANNOTATION_FIRST_SEEN])
        assert first_seen is not None and rule.spec.taint.timeAdded is not None
        assert first_seen <= rule.spec.taint.timeAdded.timestamp() + 1.0
        (tainted,) = await eventually(lambda: events(client, "DeviceTainted"), 5.0, "Event")
        assert tainted.action == "Taint" and tainted.reportingInstance == "controller-7"


async def test_untaint_hold_keeps_the_rule_away_until_the_hold_ends(
    client: AsyncClient, kubeconfig: Path
) -> None:
    await set_health(client, gpu_0="Healthy")
    async with running(client, policy(RULE)) as controller:
        await passes(controller, 1)
        await bad_and_tainted(client)
        out = await untaint(
            kubeconfig, "--key", "drahealth.io/unhealthy", "--hold", "3s", "--reason", "RMA"
        )
        assert "held by alice" in out  # the rule: deleted by the command or the controller
        await eventually(lambda: _none(client), 5.0, "the rule gone")
        held = await eventually(lambda: state_holds(client), 5.0, "the state key holds")
        assert held[DEVICE]["by"] == "alice" and held[DEVICE]["reason"] == "RMA"
        until = parse_time(held[DEVICE]["until"])
        assert until is not None
        # still bad, yet not re-tainted while held: a pass held its want
        key = next(iter(controller.engine.wants(controller._clock())))
        await eventually(lambda: key in controller.ownership.last.held, 5.0, "the want held")
        assert not await ours(client)
        assert controller.metrics.held_devices.labels("hold")._value.get() == 1  # type: ignore[attr-defined]
        (said,) = await eventually(lambda: events(client, "DeviceTaintHeld"), 5.0, "Event")
        assert "alice" in said.message and "RMA" in said.message and said.action == "Hold"
        # the hold ends: the policy applies again, the rule comes back
        back = await eventually(lambda: ours(client), 6.0, "the rule after the hold")
        (rule,) = back.values()
        assert rule.spec.taint.timeAdded.timestamp() >= until - 1.0
        await eventually(lambda: _said(client, "hold-ended"), 5.0, "the hold-ended line")
        # a plain deletion (held 30 min by default) is not that command's own
        assert not await state_holds(client)


async def test_a_deleted_controller_rule_is_not_recreated_within_the_hold(
    client: AsyncClient, kubeconfig: Path
) -> None:
    await set_health(client, gpu_0="Healthy")
    async with running(client, policy(RULE)) as controller:
        await passes(controller, 1)
        rule = await bad_and_tainted(client)
        await client.delete(DeviceTaintRule, rule.metadata.name)  # kubectl delete
        held = await eventually(lambda: state_holds(client), 5.0, "a hold for the deletion")
        entry = held[DEVICE]
        assert entry["source"] == "rule-deleted" and rule.metadata.name in entry["reason"]
        until, since = parse_time(entry["until"]), parse_time(entry["since"])
        assert until is not None and since is not None
        assert until - since == pytest.approx(1800, abs=1)  # manualUntaintHold's default
        await passes(controller, 3)
        assert not await ours(client)
        assert controller.metrics.manual_untaints._value.get() == 1  # type: ignore[attr-defined]
        # the operator ends it early: the device, still bad, is tainted again
        assert "hold ended" in await untaint(kubeconfig, "--release")
        await eventually(lambda: ours(client), 5.0, "the rule after --release")
        await eventually(lambda: _no_holds(client), 5.0, "the hold gone from the state")


async def _said(client: AsyncClient, action: str) -> bool:
    return any(h["action"] == action for h in await history(client))


async def _no_holds(client: AsyncClient) -> bool:
    return not await state_holds(client)


async def test_manual_untaint_hold_zero_re_creates_at_once(client: AsyncClient) -> None:
    await set_health(client, gpu_0="Healthy")
    p = policy(RULE, "ownership: {manualUntaintHold: 0}\n")
    async with running(client, p) as controller:
        await passes(controller, 1)
        rule = await bad_and_tainted(client)
        await client.delete(DeviceTaintRule, rule.metadata.name)

        async def recreated() -> bool:
            found = await ours(client)
            return bool(found) and all(r.metadata.uid != rule.metadata.uid for r in found.values())

        await eventually(recreated, 5.0, "the rule re-created")


async def test_opt_out_label_freezes_a_node(client: AsyncClient) -> None:
    node = {"metadata": {"name": NODE, "labels": {"drahealth.io/remediation": "disabled"}}}
    await client.create(Node.from_dict(node))
    await set_health(client, gpu_0="Healthy", gpu_1="Healthy")
    await make_pod(client, "trainer", "gpu-0", {"app": "t"})
    p = policy(RULE.replace("NoSchedule", "NoExecute"), "eviction: {mode: evict, perSecond: 20}\n")
    async with running(client, p) as controller:
        await passes(controller, 1)
        (said,) = await eventually(
            lambda: events(client, "RemediationDisabled"), 5.0, "RemediationDisabled"
        )
        assert said.involvedObject.kind == "Node" and said.involvedObject.name == NODE
        await set_health(client, gpu_0=("Unhealthy", "XID 79"), gpu_1="Healthy")
        await passes(controller, 3)
        assert not await ours(client)  # no taint
        await client.get(Pod, "trainer", namespace="default")  # no eviction
        assert controller.metrics.held_devices.labels("frozen")._value.get() == 1  # type: ignore[attr-defined]
        await eventually(lambda: _said(client, "frozen"), 5.0, "the frozen line")
        # the label goes: the policy applies, the pod is evicted (the Event says why)
        await client.patch(
            Node, NODE, {"metadata": {"labels": {"drahealth.io/remediation": None}}},
            patch_type=PatchType.MERGE,
        )  # fmt: skip
        found = await eventually(lambda: ours(client), 5.0, "the rule once the label is gone")
        (name,) = found

        async def evicted() -> list[Event]:
            return await events(client, "DeviceTaintEviction")

        (ev,) = await eventually(evicted, 10.0, "the eviction Event")
        assert ev.action == "Evict"
        assert ev.related is not None and (ev.related.kind, ev.related.name) == (
            "DeviceTaintRule",
            name,
        )
        assert DEVICE in ev.message and "policy rule xid" in ev.message
        assert "XID 79" in ev.message
        assert await events(client, "RemediationEnabled")


async def test_opt_out_keeps_an_existing_rule_as_it_is(client: AsyncClient) -> None:
    await client.create(Node.from_dict({"metadata": {"name": NODE}}))
    await set_health(client, gpu_0="Healthy")
    async with running(client, policy(RULE)) as controller:
        await passes(controller, 1)
        rule = await bad_and_tainted(client)
        await client.patch(
            Node, NODE, {"metadata": {"labels": {"drahealth.io/remediation": "disabled"}}},
            patch_type=PatchType.MERGE,
        )  # fmt: skip
        await eventually(lambda: NODE in controller.ownership.opted_out, 5.0, "the label seen")
        await set_health(client, gpu_0="Healthy")  # recovered: would be untainted in 0.5 s
        await passes(controller, 3)
        await asyncio.sleep(0.6)  # past healthyFor, so the untaint would be due
        await passes(controller, 2)
        kept = await ours(client)
        assert list(kept) == [rule.metadata.name]  # frozen: no untaint
        assert kept[rule.metadata.name].metadata.resourceVersion == rule.metadata.resourceVersion
        await client.patch(
            Node, NODE, {"metadata": {"labels": {"drahealth.io/remediation": None}}},
            patch_type=PatchType.MERGE,
        )  # fmt: skip
        await eventually(lambda: _none(client), 5.0, "the untaint once the label is gone")


async def _none(client: AsyncClient) -> bool:
    return not await ours(client)


async def test_the_policy_exclude_freezes_pools(client: AsyncClient) -> None:
    await set_health(client, gpu_0="Healthy")
    async with running(client, policy(RULE, f"exclude: {{pools: ['{NODE}']}}\n")) as controller:
        await passes(controller, 1)
        await set_health(client, gpu_0=("Unhealthy", "XID 79"))
        await passes(controller, 3)
        assert not await ours(client)
        (said,) = await eventually(
            lambda: events(client, "RemediationDisabled"), 5.0, "RemediationDisabled"
        )
        assert "exclude.pools" in said.message


async def test_foreign_rules_for_the_same_device_are_never_touched(client: AsyncClient) -> None:
    device = DeviceRef(DRIVER, NODE, "gpu-0")
    # the controller's name, someone else's rule (no managed-by label)
    same_name = rule_body(device, key="drahealth.io/unhealthy", value="unhealthy",
                          effect="NoSchedule", node=NODE)  # fmt: skip
    same_name["metadata"]["labels"] = {"team": "ops"}
    # same device and taint key, another name, someone else's
    same_key = rule_body(device, key="drahealth.io/unhealthy", value="x", effect="NoExecute")
    same_key["metadata"] = {"name": "ops-gpu-0", "labels": {"team": "ops"}}
    for body in (same_name, same_key):
        await client.create(DeviceTaintRule.from_dict(body))  # type: ignore[call-overload]
    before = {n: r.metadata.resourceVersion for n, r in (await rules(client)).items()}
    await set_health(client, gpu_0="Healthy")
    async with running(client, policy(RULE)) as controller:
        await passes(controller, 1)
        await set_health(client, gpu_0=("Unhealthy", "XID 79"))
        await eventually(
            lambda: events(client, "ForeignDeviceTaintRule"), 5.0, "ForeignDeviceTaintRule"
        )
        await set_health(client, gpu_0="Healthy")  # recovery deletes only the controller's
        await asyncio.sleep(0.6)
        await passes(controller, 3)
        after = {n: r.metadata.resourceVersion for n, r in (await rules(client)).items()}
        assert after == before  # neither changed nor deleted, nothing else written
        assert not await state_holds(client)
