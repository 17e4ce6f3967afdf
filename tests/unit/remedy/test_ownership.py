"""Provenance on what the controller writes (rules, node rows, Events), ownership of
node taints, the guard's node freeze and the untaint CLI's hold input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from lightkube.models.core_v1 import ObjectReference

from drahealth.cli.taint import _set_hold, hold_seconds
from drahealth.core import DeviceFacts, DeviceKey, parse_time
from drahealth.kube import make_client, make_event
from drahealth.remedy._metrics import ControllerMetrics
from drahealth.remedy._nodes import ANNOTATION_DEVICES, NodeDevice, plan_node, read_node
from drahealth.remedy._ownership import OwnershipGuard
from drahealth.remedy._policy_load import parse_policy
from drahealth.remedy._rules import (
    ANNOTATION_CREATED_BY,
    ANNOTATION_FIRST_SEEN,
    ANNOTATION_HEALTH,
    DeviceRef,
    health_of,
    rule_body,
)

GPU0 = DeviceKey("gpu.example.com", "node-1", "gpu-0")
GPU1 = DeviceKey("gpu.example.com", "node-1", "gpu-1")


def test_rule_body_carries_provenance() -> None:
    body = rule_body(
        DeviceRef("gpu.example.com", "node-1", "gpu-0"),
        key="drahealth.io/unhealthy",
        value="unhealthy",
        effect="NoSchedule",
        node="node-1",
        policy_rule="xid",
        reason="Unknown: agent gone",
        writer="drahealth-controller-abc",
        first_seen="2026-11-24T22:01:05Z",
    )
    notes = body["metadata"]["annotations"]
    assert notes[ANNOTATION_CREATED_BY] == "drahealth-controller-abc"
    assert notes[ANNOTATION_HEALTH] == "Unknown"
    assert notes[ANNOTATION_FIRST_SEEN] == "2026-11-24T22:01:05Z"
    # an operator rule without them keeps its old shape
    plain = rule_body(DeviceRef("d", "p", "x"), key="k", value="", effect="None", by="operator")
    assert plain["metadata"]["annotations"] == {}


def test_health_of_reads_only_a_health_prefix() -> None:
    assert health_of("Unhealthy: XID 79") == "Unhealthy"
    assert health_of("Unknown") == "Unknown"
    assert health_of("XID: 79") == ""


def test_events_carry_action_and_related() -> None:
    rule = ObjectReference(apiVersion="resource.k8s.io/v1", kind="DeviceTaintRule", name="dh-x")
    event = make_event(
        name="p.1",
        namespace="default",
        involved=ObjectReference(apiVersion="v1", kind="Pod", name="p", namespace="default"),
        event_type="Warning",
        reason="DeviceTaintEviction",
        message="evicted",
        component="drahealth-controller",
        instance="c1",
        action="Evict" + "x" * 200,
        related=rule,
    )
    assert event.action is not None and len(event.action) == 128
    assert event.related == rule and event.reportingInstance == "c1"
    assert make_event(
        name="n", namespace="d", involved=rule, event_type="Normal", reason="R",
        message="m", component="c", instance="i",
    ).action is None  # fmt: skip


def test_node_rows_say_who_why_and_since_when_and_read_back() -> None:
    d = NodeDevice(
        GPU0, "node-taint", "drahealth.io/unhealthy", "gpu-0", "NoSchedule", "xid",
        "Unhealthy: XID 79", 1000.0, "controller-7", "Unhealthy", 990.5,
    )  # fmt: skip
    node, _ = plan_node({"metadata": {"name": "node-1"}}, [d])
    (row,) = json.loads(node["metadata"]["annotations"][ANNOTATION_DEVICES])
    assert (row["by"], row["health"], row["firstSeen"], row["rule"]) == (
        "controller-7",
        "Unhealthy",
        990.5,
        "xid",
    )
    assert read_node(node) == [d]


def test_a_foreign_node_taint_with_the_same_key_is_never_touched() -> None:
    foreign = {"key": "drahealth.io/unhealthy", "value": "ops", "effect": "NoSchedule"}
    node = {"metadata": {"name": "node-1"}, "spec": {"taints": [dict(foreign)]}}
    d = NodeDevice(GPU0, "node-taint", "drahealth.io/unhealthy", "gpu-0", "NoSchedule")
    tainted, _ = plan_node(node, [d])
    assert tainted["spec"]["taints"] == [foreign]  # kept, not adopted, nothing added
    # recovery removes only what drahealth wrote: the foreign taint stays
    cleared, _ = plan_node(tainted, [])
    assert cleared["spec"]["taints"] == [foreign]
    # an operator's cordon is never undone
    cordoned = {"metadata": {"name": "node-1"}, "spec": {"unschedulable": True}}
    c = NodeDevice(GPU0, "cordon", "drahealth.io/unhealthy", "gpu-0", "NoSchedule")
    after, _ = plan_node(plan_node(cordoned, [c])[0], [])
    assert after["spec"]["unschedulable"] is True


def _guard(extra: str = "") -> OwnershipGuard:
    policy = parse_policy(
        "apiVersion: drahealth.io/v1\nkind: RemediationPolicy\nrules: [{name: a}]\n" + extra
    )
    said: list[Any] = []
    return OwnershipGuard(
        client=make_client(server_url="http://127.0.0.1:9"),  # never started here
        policy=policy,
        facts=lambda k: DeviceFacts(k.driver, k.pool, k.device, k.pool),
        record=lambda *a: said.append(a),
        event=lambda *a: said.append(a),
        wake=lambda: None,
        metrics=ControllerMetrics(),
        history_ref=ObjectReference(kind="ConfigMap", name="h"),
    )


class _Obj:
    def __init__(self, name: str, labels: dict[str, str]) -> None:
        self.metadata = type("M", (), {"name": name, "labels": labels})()


def test_freeze_nodes_keeps_what_an_opted_out_node_carries() -> None:
    guard = _guard()
    d0 = NodeDevice(GPU0, "node-taint", "drahealth.io/unhealthy", "gpu-0", "NoSchedule")
    d1 = NodeDevice(GPU1, "node-taint", "drahealth.io/unhealthy", "gpu-1", "NoSchedule")
    assert guard.freeze_nodes({}, {"node-1": [d0]}) == {}  # not frozen: recovery clears it
    guard.on_node("ADDED", _Obj("node-1", {"drahealth.io/remediation": "disabled"}), None)
    assert guard.opted_out == {"node-1"}
    assert guard.freeze_nodes({}, {"node-1": [d0, d1]}) == {"node-1": [d0, d1]}
    guard.on_node("DELETED", _Obj("node-1", {}), None)  # the label went
    assert guard.opted_out == set() and guard.freeze_nodes({}, {"node-1": [d0]}) == {}


def test_a_frozen_device_defers_its_validation_until_it_thaws() -> None:
    guard = _guard("exclude: {pools: [node-1]}\n")
    assert guard.defer_validation(GPU0) and guard.thawed() == []
    assert not _guard().defer_validation(GPU0)


def test_own_deletes_are_not_holds_but_foreign_ones_are() -> None:
    guard = _guard()
    raw = {
        "metadata": {"name": "dh-gpu-0", "annotations": {"drahealth.io/policy-rule": "a"}},
        "spec": {"deviceSelector": {"driver": GPU0.driver, "pool": GPU0.pool,
                                    "device": GPU0.device}},
    }  # fmt: skip
    guard.deleting("dh-gpu-0")
    guard.rule_deleted(raw)
    assert guard.state() == {}
    guard.rule_deleted(raw)
    assert guard.state()[str(GPU0)]["source"] == "rule-deleted"


@pytest.mark.parametrize(
    ("text", "seconds"), [("0", 0.0), ("90", 90.0), ("2s", 2.0), ("30m", 1800.0), ("1d", 86400.0)]
)
def test_hold_durations(text: str, seconds: float) -> None:
    assert hold_seconds(text) == seconds


@pytest.mark.parametrize(
    ("text", "problem"), [("soon", "use seconds"), ("-1s", "use seconds"), ("31d", "at most 30d")]
)
def test_bad_hold_durations_are_named(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        hold_seconds(text)


def test_set_hold_prunes_long_ended_entries_and_keeps_others() -> None:
    update = _set_hold(DeviceRef("d", "p", "x"), 4_000_000_000.0, "alice", "RMA")
    current = {
        "d/p/old": {"until": "2001-01-01T00:00:00Z", "by": "bob", "reason": ""},
        "d/p/other": {"until": "2099-01-01T00:00:00Z", "by": "bob", "reason": ""},
        "d/p/junk": "not an entry",
    }
    holds = update(current)
    assert set(holds) == {"d/p/other", "d/p/x"}
    assert holds["d/p/x"]["by"] == "alice" and parse_time(holds["d/p/x"]["until"]) == 4e9
