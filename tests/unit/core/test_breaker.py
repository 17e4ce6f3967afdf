"""The blast-radius circuit breaker (sans-I/O): counts, percentages, the sliding window,
scopes, profiles, manual and automatic resume, and a restart from its state value."""

from __future__ import annotations

import json
from typing import Any

import pytest

from drahealth.core import (
    CircuitBreaker,
    DeviceFacts,
    DeviceKey,
    Limit,
    LimitError,
    Limits,
    Match,
    Policy,
    Profile,
    Rule,
    Want,
    explain,
    explain_limits,
    parse_limit,
)
from drahealth.core._health import Health

DRIVER = "gpu.example.com"
RULE = Rule("any", Match(driver=DRIVER))
T0 = 1_800_000_000.0


def devices(nodes: int, per_node: int = 8, driver: str = DRIVER) -> dict[DeviceKey, DeviceFacts]:
    out = {}
    for n in range(nodes):
        for i in range(per_node):
            key = DeviceKey(driver, f"node-{n}", f"gpu-{i}")
            out[key] = DeviceFacts(driver, f"node-{n}", f"gpu-{i}", f"node-{n}")
    return out


def breaker(limits: Limits | None, facts: dict[DeviceKey, DeviceFacts], **kw: Any) -> Any:
    b = CircuitBreaker(Policy((RULE,), limits=limits, **kw))
    for key, f in facts.items():
        b.track(key, f)
    return b


def want(effect: str = "NoSchedule", rule: str = "any") -> Want:
    return Want(effect, "drahealth.io/unhealthy", "unhealthy", rule, "Unhealthy: XID 79")


def run(
    b: Any, keys: list[DeviceKey], facts: dict[DeviceKey, DeviceFacts], now: float
) -> tuple[dict[DeviceKey, Want], list[Any]]:
    wants = {k: want() for k in keys}
    return b.admit(wants, lambda _k, w: w.effect != "None", facts.__getitem__, now)  # type: ignore[no-any-return]


def test_parse_limit_counts_and_percentages() -> None:
    assert parse_limit(4) == Limit("4", count=4)
    assert parse_limit("4").count == 4
    assert parse_limit("10%").max_for(80) == 8
    assert parse_limit("10%").max_for(5) == 1  # never below one
    assert parse_limit("2.5%").max_for(80) == 2
    assert parse_limit("33%").max_for(3) == 1  # rounded down (0.99)
    assert parse_limit("100%").max_for(7) == 7
    for bad in (0, -1, "0%", "101%", "x", "10 percent", True, 1.5, None):
        with pytest.raises(LimitError):
            parse_limit(bad)


def test_mass_failure_is_held_at_the_cluster_percentage() -> None:
    facts = devices(10)  # 80 devices
    b = breaker(Limits(cluster=parse_limit("10%")), facts)
    bad = sorted(facts)[:50]
    out, events = run(b, bad, facts, T0)
    assert len(out) == 8 and set(out) == set(bad[:8])
    assert len(b.held) == 42
    [event] = events
    assert (event.kind, event.group.scope, event.max, event.count, event.held) == (
        "tripped", "cluster", 8, 8, 42,
    )  # fmt: skip
    assert "drahealth resume" in event.message() and "42 new taint(s) held" in event.message()
    # the next pass: the 8 written stay, the 42 stay held, nothing trips again
    out, events = run(b, bad, facts, T0 + 1)
    assert set(out) == set(bad[:8]) and not events and len(b.held) == 42


def test_count_limit_per_node_trips_only_that_node() -> None:
    facts = devices(2)
    b = breaker(Limits(per_node=parse_limit(3)), facts)
    node0 = [k for k in sorted(facts) if k.pool == "node-0"][:5]
    node1 = [k for k in sorted(facts) if k.pool == "node-1"][:2]
    out, events = run(b, node0 + node1, facts, T0)
    assert set(out) == set(node0[:3] + node1)
    assert [(e.group.scope, e.group.name) for e in events] == [("node", "node-0")]
    state = b.state()
    assert [(t["scope"], t["group"], t["limit"], t["max"]) for t in state["tripped"]] == [
        ("node", "node-0", "3", 3)
    ]
    assert sorted(h["device"] for h in state["held"]) == [str(k) for k in node0[3:]]


def test_per_pool_and_per_driver_group_by_their_names() -> None:
    facts = {**devices(1), **devices(1, driver="nic.example.com")}
    b = breaker(Limits(per_driver=parse_limit("50%"), per_pool=parse_limit(6)), facts)
    gpus = [k for k in sorted(facts) if k.driver == DRIVER]
    nics = [k for k in sorted(facts) if k.driver != DRIVER]
    out, events = run(b, gpus[:6] + nics[:2], facts, T0)
    # gpu driver: 4 of 8 (50%) then it trips; the nic driver is under its own limit
    assert set(out) == set(gpus[:4] + nics[:2])
    assert {(e.group.scope, e.group.name) for e in events} == {("driver", DRIVER)}


def test_devices_already_tainted_do_not_count_again() -> None:
    facts = devices(1)
    b = breaker(Limits(cluster=parse_limit(2)), facts)
    keys = sorted(facts)
    b.carrying(keys[:4])  # found tainted at start
    out, events = run(b, keys[:5], facts, T0)
    assert set(out) == set(keys[:5]) and not events
    # an escalation of a device already tainted is no new taint either
    wants = {k: want("NoExecute") for k in keys[:5]}
    out, events = b.admit(wants, lambda _k, _w: True, facts.__getitem__, T0 + 1)
    assert len(out) == 5 and not events


def test_effect_none_and_report_only_are_never_held_or_counted() -> None:
    facts = devices(1)
    b = breaker(Limits(cluster=parse_limit(1)), facts)
    keys = sorted(facts)
    wants = {k: want("None") for k in keys}
    out, events = b.admit(wants, lambda _k, w: w.effect != "None", facts.__getitem__, T0)
    assert len(out) == 8 and not events and not b.held


def test_window_slides_and_auto_resume_when_the_held_fit() -> None:
    facts = devices(1)
    b = breaker(Limits(window=60, resume="auto", cluster=parse_limit(2)), facts)
    keys = sorted(facts)
    out, _ = run(b, keys[:2], facts, T0)
    assert len(out) == 2
    out, events = run(b, keys[:3], facts, T0 + 10)  # a third within the window: trips
    assert keys[2] not in out and [e.kind for e in events] == ["tripped"]
    # window not over: held + counted (1 + 2) > 2, still tripped
    out, events = run(b, keys[:3], facts, T0 + 59)
    assert keys[2] not in out and not events
    # the first two slid out of the window: 1 held + 0 counted <= 2 -> resumes, admits
    out, events = run(b, keys[:3], facts, T0 + 61)
    assert keys[2] in out and [(e.kind, e.by) for e in events] == [("resumed", "auto")]
    assert not b.tripped and not b.held


def test_auto_resume_when_devices_recover() -> None:
    facts = devices(1)
    b = breaker(Limits(window=600, resume="auto", cluster=parse_limit(2)), facts)
    keys = sorted(facts)
    run(b, keys[:6], facts, T0)
    assert len(b.held) == 4 and b.tripped
    # the mass condition clears: the held devices recover, the two tainted stay bad
    out, events = run(b, keys[:2], facts, T0 + 5)
    assert not b.held and len(out) == 2
    # 0 held + 2 counted <= 2: it resumes on the pass that sees it
    assert [(e.kind, e.by, e.held) for e in events] == [("resumed", "auto", 0)]
    assert not b.tripped
    # a new bad device now: 2 counted + 1 > 2 trips again (the window still holds two)
    out, events = run(b, keys[:3], facts, T0 + 6)
    assert keys[2] not in out and [e.kind for e in events] == ["tripped"]


def test_manual_resume_admits_what_was_held_and_later_taints_count() -> None:
    facts = devices(10)
    b = breaker(Limits(window=600, cluster=parse_limit("10%")), facts)
    bad = sorted(facts)[:50]
    run(b, bad, facts, T0)
    # stays tripped without an operator, whatever happens
    out, events = run(b, bad[:10], facts, T0 + 700)
    assert len(out) == 8 and b.tripped and not events
    out, events = run(b, bad, facts, T0 + 701)
    assert len(b.held) == 42
    request = {"at": "2027-01-15T10:00:00Z", "by": "alice"}
    resumed = b.resume(request, T0 + 702)
    assert [(e.kind, e.by, e.held) for e in resumed] == [("resumed", "alice", 42)]
    out, events = run(b, bad, facts, T0 + 702)
    assert len(out) == 50 and not b.held and not b.tripped and not events
    assert b.resume(request, T0 + 703) == []  # the same request is not applied twice
    # a new device after the resume: the window holds 42 + 8, over 8: trips again
    out, events = run(b, sorted(facts)[:51], facts, T0 + 704)
    assert len(out) == 50 and [e.kind for e in events] == ["tripped"]


def test_a_resume_made_while_nothing_is_tripped_approves_no_later_trip() -> None:
    facts = devices(1)
    b = breaker(Limits(cluster=parse_limit(1)), facts)
    assert b.resume({"at": "2027-01-15T10:00:00Z", "by": "bob"}, T0) == []
    run(b, sorted(facts)[:3], facts, T0 + 1)
    assert len(b.held) == 2
    assert b.resume({"at": "2027-01-15T10:00:00Z", "by": "bob"}, T0 + 2) == []
    assert len(b.held) == 2


def test_held_device_that_recovers_is_dropped_and_untaint_is_never_held() -> None:
    facts = devices(1)
    b = breaker(Limits(cluster=parse_limit(1)), facts)
    keys = sorted(facts)
    run(b, keys[:3], facts, T0)
    out, _ = run(b, [keys[0], keys[2]], facts, T0 + 1)
    assert set(b.held) == {keys[2]} and keys[0] in out
    out, _ = run(b, [], facts, T0 + 2)  # all recover: nothing is wanted, nothing held
    assert out == {} and not b.held


def test_restart_resumes_trips_held_devices_and_the_window() -> None:
    facts = devices(10)
    b = breaker(Limits(window=600, cluster=parse_limit("10%")), facts)
    bad = sorted(facts)[:50]
    out, _ = run(b, bad, facts, T0)
    state = json.loads(json.dumps(b.state()))  # as the ConfigMap keeps it
    assert state["heldCount"] == 42 and len(state["admitted"]) == 8
    assert state["tripped"][0]["since"].endswith("Z")

    again = breaker(Limits(window=600, cluster=parse_limit("10%")), facts)
    again.restore(state, T0 + 30)
    again.carrying(out)  # the 8 taints are in the cluster
    out2, events = run(again, bad, facts, T0 + 30)
    assert set(out2) == set(out) and not events and len(again.held) == 42
    assert again.held[bad[20]].since == pytest.approx(T0, abs=1)
    # the window came back too: with the cluster resumed by an operator, the count is 8
    again.resume({"at": "x", "by": "ops"}, T0 + 31)
    assert not again.tripped


def test_restore_ignores_bad_values_and_groups_no_longer_limited() -> None:
    facts = devices(1)
    b = breaker(Limits(per_node=parse_limit(2)), facts)
    b.restore(
        {
            "tripped": [
                {"scope": "cluster", "group": ""},
                "junk",
                {"scope": "node", "group": "node-0"},
            ],
            "held": [{"device": "no-slashes"}, 3],
            "admitted": [["a/b/c", "later"], ["bad"], [str(sorted(facts)[0]), T0]],
            "lastResume": 5,
        },
        T0 + 1,
    )
    assert [g.scope for g in b.tripped] == ["node"]
    assert not b.held and b.last_resume is None
    b.restore("not a mapping", T0)


def test_profiles_limits_add_to_the_policys() -> None:
    facts = devices(2)
    canary = Profile("canary", Match(pool="node-1"), limits=Limits(cluster=parse_limit(1)))
    b = breaker(Limits(cluster=parse_limit("50%")), facts, profiles=(canary,))
    node0 = [k for k in sorted(facts) if k.pool == "node-0"][:3]
    node1 = [k for k in sorted(facts) if k.pool == "node-1"][:3]
    out, events = run(b, node0 + node1, facts, T0)
    # the profile allows 1 of its devices; the cluster cap (8 of 16) is not reached
    assert set(out) == set(node0 + node1[:1])
    assert [(e.group.scope, e.group.name, e.group.profile) for e in events] == [
        ("profile", "canary", "canary")
    ]
    assert b.state()["tripped"][0]["profile"] == "canary"


def test_profile_rules_replace_the_policys_and_policy_check_explains_them() -> None:
    strict = Rule("a100-any", Match(driver=DRIVER))
    a100 = Profile(
        "a100",
        Match(attributes={"model": "A100"}),
        rules=(strict,),
        limits=Limits(per_node=parse_limit(1), resume="auto"),
        observe_only=True,
    )
    policy = Policy((RULE,), limits=Limits(cluster=parse_limit("10%")), profiles=(a100,))
    mine = DeviceFacts(DRIVER, "node-0", "gpu-0", attributes={"model": "A100"})
    other = DeviceFacts(DRIVER, "node-0", "gpu-1", attributes={"model": "H100"})
    assert policy.rule_for(mine, Health.UNHEALTHY, "") is strict
    assert policy.rule_for(other, Health.UNHEALTHY, "") is RULE
    assert policy.rule_named("a100-any") is strict
    limits = explain_limits(policy, mine)
    assert [(x["scope"], x["profile"], x["limit"]) for x in limits] == [
        ("cluster", None, "10%"),
        ("node", "a100", "1"),
    ]
    result = explain(policy, mine, Health.UNHEALTHY, "XID 79")
    assert result["profile"] == {"name": "a100", "observeOnly": True}
    assert result["rule"] == "a100-any" and result["limits"] == limits


def test_without_limits_everything_passes() -> None:
    facts = devices(1)
    b = breaker(None, facts)
    out, events = run(b, sorted(facts), facts, T0)
    assert len(out) == 8 and not events and not b.enabled


def test_state_value_is_bounded() -> None:
    facts = devices(500)  # 4,000 devices
    b = breaker(Limits(cluster=parse_limit(1)), facts)
    run(b, sorted(facts), facts, T0)
    text = json.dumps(b.state())
    assert b.state()["heldCount"] == 3999 and len(b.state()["held"]) == 300
    assert len(text.encode()) < 256 * 1024


def test_a_taint_counts_the_devices_it_makes_unusable() -> None:
    """A node taint fences every device of its node: the limits count all of them, so
    with 10 % of 80 GPUs allowed, the first node taint (8 GPUs) fits and the second trips;
    the weights survive a restart through the state."""
    facts = devices(10)  # 80 devices, 8 per node
    b = breaker(Limits(cluster=parse_limit("10%")), facts)
    first, second = DeviceKey(DRIVER, "node-0", "gpu-0"), DeviceKey(DRIVER, "node-1", "gpu-0")
    wants = {first: want(), second: want()}

    def node_taint(_key: DeviceKey, _want: Want) -> int:
        return 8

    out, events = b.admit(wants, lambda _k, w: True, facts.__getitem__, T0, node_taint)
    assert set(out) == {first} and set(b.held) == {second}
    [event] = events
    assert (event.max, event.count) == (8, 8)
    state = json.loads(json.dumps(b.state()))
    assert state["admitted"] == [[str(first), T0, 8]]
    again = breaker(Limits(cluster=parse_limit("10%")), facts)
    again.restore(state, T0 + 1)
    out, _ = again.admit(
        {second: want()}, lambda _k, w: True, facts.__getitem__, T0 + 1, lambda _k, _w: 1
    )
    assert not out  # 8 counted already (tripped and held); one more does not fit
    # hostile weights from the state: not a count a controller wrote counts as one
    for weight in (0, -5, True, "8", 1.5, None):
        other = breaker(Limits(cluster=parse_limit("10%")), facts)
        other.restore({"admitted": [[str(first), T0, weight]]}, T0 + 1)
        out, _ = other.admit({second: want()}, lambda _k, w: True, facts.__getitem__, T0 + 1)
        assert set(out) == {second}, weight
    huge = breaker(Limits(cluster=parse_limit("100%")), facts)
    huge.restore({"admitted": [[str(first), T0, 10**12]]}, T0 + 1)
    assert huge.state()["admitted"] == [[str(first), T0, 4096]]  # bounded
