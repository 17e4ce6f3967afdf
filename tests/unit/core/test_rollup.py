"""Node-level rollup: the DRADevicesHealthy condition a node's devices add up to, the
message cut, thresholds as counts and percentages, and the per-node bookkeeping."""

from __future__ import annotations

import pytest

from drahealth.core import (
    NODE_MESSAGE_MAX,
    REASON_ALL_DEVICES_HEALTHY,
    REASON_DEVICES_UNHEALTHY,
    REASON_DEVICES_UNKNOWN,
    DeviceFacts,
    DeviceKey,
    Health,
    NodeRollup,
    NodeRollupPolicy,
    NodeTaintPolicy,
    Policy,
    RollupDevice,
    Threshold,
    explain,
    node_condition,
    parse_threshold,
)
from drahealth.core._policy import Action, Match, Rule

H, U, K = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN


def key(i: int, node: str = "node-1") -> DeviceKey:
    return DeviceKey("gpu.example.com", node, f"gpu-{i}")


def devices(*states: RollupDevice) -> dict[DeviceKey, RollupDevice]:
    return {key(i): s for i, s in enumerate(states)}


def test_all_healthy_is_true() -> None:
    c = node_condition(devices(*[RollupDevice(H)] * 8))
    assert (c.type, c.status, c.reason) == ("DRADevicesHealthy", "True", REASON_ALL_DEVICES_HEALTHY)
    assert c.message == "all 8 devices healthy"
    assert (c.total, c.unhealthy, c.unknown, c.blocking) == (8, 0, 0, 0)


def test_unreported_devices_count_as_healthy() -> None:
    # the kubelet reports only allocated devices: silence is not Unknown
    c = node_condition(devices(RollupDevice(None), RollupDevice(H)))
    assert c.status == "True" and c.message == "all 2 devices healthy"


def test_one_unhealthy_is_false_with_counts_and_messages() -> None:
    c = node_condition(
        devices(
            RollupDevice(U, "XID 79", "xid", True),
            RollupDevice(H),
            RollupDevice(K, "no report for 30 s"),
            RollupDevice(U, "ECC"),
            *[RollupDevice(H)] * 4,
        )
    )
    assert (c.status, c.reason) == ("False", REASON_DEVICES_UNHEALTHY)
    assert c.message == (
        "2 of 8 devices unhealthy, 1 unknown: gpu.example.com/node-1/gpu-0 (XID 79), "
        "gpu.example.com/node-1/gpu-3 (ECC), gpu.example.com/node-1/gpu-2 (no report for 30 s)"
    )
    assert (c.unhealthy, c.unknown, c.blocking) == (2, 1, 1)


def test_a_device_still_tainted_after_recovery_keeps_the_node_false() -> None:
    c = node_condition(devices(RollupDevice(H, "", "xid", True), RollupDevice(H)))
    assert c.status == "False"
    assert c.message.endswith("gpu-0 (Healthy, still tainted by rule xid)")
    assert c.blocking == 1


def test_all_unknown_is_unknown() -> None:
    c = node_condition(devices(RollupDevice(K), RollupDevice(K, "plugin gone")))
    assert (c.status, c.reason) == ("Unknown", REASON_DEVICES_UNKNOWN)
    assert c.message == (
        "2 of 2 devices unknown: gpu.example.com/node-1/gpu-0 (Unknown), "
        "gpu.example.com/node-1/gpu-1 (plugin gone)"
    )


def test_unknown_tainted_by_a_rule_counts_as_bad() -> None:
    c = node_condition(devices(RollupDevice(K, "lost", "unknown-rule", True)))
    assert c.status == "False" and c.unhealthy == 1 and c.unknown == 0


def test_an_effect_none_taint_is_bad_but_does_not_block() -> None:
    c = node_condition(devices(RollupDevice(U, "x", "observe", False)))
    assert c.status == "False" and c.blocking == 0


def test_message_is_cut_with_and_n_more() -> None:
    many = {key(i): RollupDevice(U, "XID 79 " + "x" * 200) for i in range(100)}
    c = node_condition(many)
    assert len(c.message) <= NODE_MESSAGE_MAX
    assert c.message.startswith("100 of 100 devices unhealthy: ")
    listed = c.message.count("gpu.example.com/")
    assert c.message.endswith(f" ... and {100 - listed} more")
    assert 0 < listed < 100
    # each device's message is cut, on one line
    assert "x" * 90 not in c.message


@pytest.mark.parametrize("limit", [60, 100, 200, 333, 1024])
def test_message_never_exceeds_the_limit(limit: int) -> None:
    many = {key(i): RollupDevice(U, "m\n" * 50) for i in range(30)}
    c = node_condition(many, limit=limit)
    assert len(c.message) <= limit, c.message
    assert "\n" not in c.message


def test_message_fits_exactly_without_a_tail() -> None:
    two = devices(RollupDevice(U, "a"), RollupDevice(U, "b"))
    full = node_condition(two).message
    assert node_condition(two, limit=len(full)).message == full
    cut = node_condition(two, limit=len(full) - 1).message
    assert cut.endswith(" ... and 1 more") and len(cut) <= len(full) - 1


def test_no_devices_is_an_empty_true() -> None:
    c = node_condition({})
    assert c.status == "True" and c.total == 0


@pytest.mark.parametrize(
    ("text", "total", "needed"),
    [
        ("50%", 8, 4),
        ("50%", 5, 3),  # rounded up
        ("1%", 8, 1),  # at least one
        ("100%", 8, 8),
        ("12.5%", 8, 1),
        ("30%", 10, 3),
        (2, 8, 2),
        ("3", 8, 3),
    ],
)
def test_thresholds(text: int | str, total: int, needed: int) -> None:
    t = parse_threshold(text)
    assert t.of(total) == needed
    assert t.reached(needed, total) and not t.reached(needed - 1, total)


def test_threshold_is_never_reached_without_devices() -> None:
    assert not Threshold(count=1).reached(0, 0)
    assert not Threshold(percent=50).reached(0, 0)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (0, "at least 1"),
        ("0", "at least 1"),
        ("0%", "above 0%"),
        ("101%", "at most 100%"),
        ("1.5", "whole number"),
        ("half", "count or a percentage"),
        (True, "count or a percentage"),
    ],
)
def test_bad_thresholds_say_why(value: int | str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_threshold(value)


def test_threshold_str() -> None:
    assert str(parse_threshold("50%")) == "50%" and str(parse_threshold(3)) == "3"


def test_rollup_marks_changed_nodes_only() -> None:
    r = NodeRollup()
    r.set(key(0), "node-1", RollupDevice(H))
    r.set(key(0, "node-2"), "node-2", RollupDevice(H))
    assert r.take_dirty() == ["node-1", "node-2"]
    r.set(key(0), "node-1", RollupDevice(H))  # the same: nothing changed
    assert r.take_dirty() == []
    r.set(key(0), "node-1", RollupDevice(U, "XID 79"))
    assert r.take_dirty() == ["node-1"]
    c = r.condition("node-1")
    assert c is not None and c.status == "False"


def test_rollup_device_moving_or_leaving_marks_both_nodes() -> None:
    r = NodeRollup()
    r.set(key(0), "node-1", RollupDevice(U))
    r.take_dirty()
    r.set(key(0), "node-2", RollupDevice(U))
    assert r.take_dirty() == ["node-1", "node-2"]
    assert r.condition("node-1") is None  # no devices: no condition
    assert r.nodes() == ["node-2"]
    r.set(key(0), "node-2", None)
    assert r.take_dirty() == ["node-2"] and r.nodes() == []
    r.set(key(1), "", RollupDevice(U))  # no node known: not rolled up
    assert r.take_dirty() == [] and r.nodes() == []


def test_rollup_mark_hands_nodes_out_again() -> None:
    r = NodeRollup()
    r.mark(["node-3"])
    assert r.take_dirty() == ["node-3"]


def test_taint_wanted_counts_blocking_taints_against_the_threshold() -> None:
    policy = NodeRollupPolicy(taint_node=NodeTaintPolicy(parse_threshold("50%")))
    r = NodeRollup(policy)
    for i in range(4):
        r.set(key(i), "node-1", RollupDevice(H))
    r.set(key(0), "node-1", RollupDevice(U, "XID", "xid", True))
    r.set(key(1), "node-1", RollupDevice(U, "ECC"))  # unhealthy but not (yet) tainted
    assert not r.taint_wanted(r.condition("node-1"))
    r.set(key(1), "node-1", RollupDevice(U, "ECC", "ecc", True))
    assert r.taint_wanted(r.condition("node-1"))
    assert not NodeRollup().taint_wanted(r.condition("node-1"))  # no taintNode
    assert not r.taint_wanted(None)


def test_max_tainted_is_a_share_of_the_nodes_with_devices() -> None:
    policy = NodeRollupPolicy(
        taint_node=NodeTaintPolicy(Threshold(count=1), max_nodes=parse_threshold("10%"))
    )
    r = NodeRollup(policy)
    assert r.max_tainted() == 1  # at least one
    for n in range(25):
        r.set(key(0, f"node-{n}"), f"node-{n}", RollupDevice(H))
    assert r.max_tainted() == 3
    assert NodeRollup().max_tainted() == 0


def test_explain_shows_the_rollup() -> None:
    rule = Rule("xid", Match(driver="gpu.example.com"), Action(effect="NoExecute"))
    taint = NodeTaintPolicy(Threshold(percent=50), "NoExecute")
    policy = Policy((rule,), node_rollup=NodeRollupPolicy(taint_node=taint))
    facts = DeviceFacts("gpu.example.com", "node-1", "gpu-0")
    out = explain(policy, facts, U, "XID 79")["nodeRollup"]
    assert out == {
        "enabled": True,
        "conditionType": "DRADevicesHealthy",
        "conditionStatus": "False",
        "reason": "DevicesUnhealthy",
        "taintNode": {
            "key": "drahealth.io/devices-unhealthy",
            "effect": "NoExecute",
            "threshold": "50%",
            "maxNodes": "10%",
            "deviceCounts": True,
        },
    }
    other = explain(policy, DeviceFacts("x", "p", "d"), K, "")["nodeRollup"]
    assert other["conditionStatus"] == "Unknown" and not other["taintNode"]["deviceCounts"]
    off = Policy((rule,), node_rollup=NodeRollupPolicy(enabled=False))
    assert explain(off, facts, U, "")["nodeRollup"] == {"enabled": False}
