"""RemedyEngine with a fake time: grace, escalation, hysteresis, recovery, validation."""

from __future__ import annotations

import itertools
import re

from drahealth.core import DeviceKey, Health
from drahealth.core._policy import (
    Action,
    DeviceFacts,
    Hysteresis,
    Match,
    Policy,
    Recovery,
    Rule,
    Step,
    Validate,
)
from drahealth.core._remedy_engine import RemedyEngine, Want

H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN
GPU = DeviceFacts("gpu.example.com", "node-1", "gpu-0", "node-1", {"model": "a100"})
KEY = DeviceKey("gpu.example.com", "node-1", "gpu-0")


def engine(*rules: Rule, dry_run: bool = False) -> RemedyEngine:
    return RemedyEngine(Policy(rules=rules, dry_run=dry_run))


def rule(
    name: str = "bad",
    *,
    grace: float = 0.0,
    effect: str = "NoSchedule",
    escalate: tuple[Step, ...] = (),
    healthy_for: float = 10.0,
    hysteresis: Hysteresis | None = None,
    validate: Validate | None = None,
    **match: object,
) -> Rule:
    return Rule(
        name,
        Match(**match),  # type: ignore[arg-type]
        Action(effect=effect, grace=grace, escalate=escalate),  # type: ignore[arg-type]
        hysteresis,
        Recovery(healthy_for, validate),
    )


def effect(e: RemedyEngine, now: float) -> str | None:
    want = e.wants(now).get(KEY)
    return None if want is None else want.effect


def test_grace_period_then_taint_with_the_rules_key_and_value() -> None:
    e = engine(rule(grace=5))
    e.observe(GPU, U, "XID 79", 0.0)
    assert e.wants(4.9) == {}
    assert "grace period until t=5.0" in e.explain(KEY, 4.9)
    assert e.next_wakeup(4.9) == 5.0
    assert e.wants(5.0) == {
        KEY: Want("NoSchedule", "drahealth.io/unhealthy", "unhealthy", "bad", "Unhealthy: XID 79")
    }


def test_bad_health_shorter_than_grace_never_taints() -> None:
    e = engine(rule(grace=5))
    e.observe(GPU, U, "blip", 0.0)
    e.observe(GPU, H, "", 2.0)
    assert e.wants(10.0) == {}


def test_escalation_raises_the_effect_while_tainted() -> None:
    steps = (Step(10, "NoSchedule"), Step(20, "NoExecute"))
    e = engine(rule(grace=1, effect="None", escalate=steps))
    e.observe(GPU, U, "", 0.0)
    assert effect(e, 1.0) == "None"
    assert e.next_wakeup(1.0) == 11.0
    assert effect(e, 10.9) == "None" and effect(e, 11.0) == "NoSchedule"
    assert effect(e, 21.0) == "NoExecute"


def test_recovery_needs_continuous_health() -> None:
    e = engine(rule(healthy_for=10))
    e.observe(GPU, U, "", 0.0)
    assert effect(e, 0.0) == "NoSchedule"
    e.observe(GPU, H, "", 30.0)
    assert effect(e, 39.9) == "NoSchedule"
    assert "untaint at t=40.0" in e.explain(KEY, 39.9)
    e.observe(GPU, X, "", 35.0)  # a break restarts the window
    e.observe(GPU, H, "", 36.0)
    assert effect(e, 40.0) == "NoSchedule" and effect(e, 45.9) == "NoSchedule"
    assert effect(e, 46.0) is None


def test_flapping_device_is_held_tainted_without_churn() -> None:
    e = engine(rule(grace=3, healthy_for=5, hysteresis=Hysteresis(transitions=5, window=30)))
    history = []
    t = 0.0
    for _ in range(5):  # 1 s bad, 2 s good: shorter than the grace period every time
        e.observe(GPU, U, "flap", t)
        history.append(effect(e, t + 0.5))
        e.observe(GPU, H, "", t + 1)
        history.append(effect(e, t + 1.5))
        t += 3
    # the 5th change (t=6.0) marks it flapping: tainted from then on, never untainted
    assert history[:4] == [None] * 4
    assert all(h == "NoSchedule" for h in history[5:])
    assert "held" in e.explain(KEY, t)
    # it stays healthy: the hold ends when fewer than 5 changes remain in the window
    # (changes at 1, 3, 4, 6, 7, 9, 10, 12, 13: the 5th-newest is at 7 -> t = 37)
    assert effect(e, 36.9) == "NoSchedule"
    assert effect(e, 37.0) is None  # Healthy since 13 >= healthy_for: untainted at once
    changes = [a != b for a, b in itertools.pairwise(history)]
    assert sum(changes) == 1  # one taint, no untaint/retaint churn


def test_validation_hook_gates_the_untaint() -> None:
    e = engine(rule(healthy_for=5, validate=Validate(exec=("true",))))
    e.observe(GPU, U, "", 0.0)
    e.observe(GPU, H, "", 1.0)
    assert e.pending_validations(5.9) == []
    assert e.pending_validations(6.0) == [KEY]
    assert e.pending_validations(6.0) == []  # asked once
    assert effect(e, 7.0) == "NoSchedule"
    e.validated(KEY, False, 7.0)  # failed: the window restarts
    assert e.pending_validations(11.9) == [] and effect(e, 12.0) == "NoSchedule"
    assert e.pending_validations(12.0) == [KEY]
    e.validated(KEY, True, 12.5)
    assert effect(e, 12.5) is None


def test_dry_run_turns_every_effect_into_none() -> None:
    e = engine(rule(effect="NoExecute"), dry_run=True)
    e.observe(GPU, U, "", 0.0)
    assert effect(e, 0.0) == "None"


def test_first_matching_rule_wins_and_matches_message_attributes_and_glob() -> None:
    xid = rule("xid", effect="NoExecute", message=re.compile(r"XID (48|79)"), device="gpu-*")
    a100 = rule("a100", effect="NoSchedule", attributes={"model": "a100"})
    other = rule("h100", effect="None", attributes={"model": "h100"})
    e = engine(xid, a100, other)
    e.observe(GPU, U, "XID 79: fell off the bus", 0.0)
    assert e.wants(0.0)[KEY].rule == "xid"
    nic = DeviceFacts("gpu.example.com", "node-1", "nic-0", "node-1", {"model": "a100"})
    e.observe(nic, U, "XID 79", 0.0)
    assert e.wants(0.0)[DeviceKey("gpu.example.com", "node-1", "nic-0")].rule == "a100"
    h100 = DeviceFacts("gpu.example.com", "node-1", "gpu-9", "node-1", {"model": "h100"})
    e.observe(h100, U, "ECC", 0.0)
    assert e.wants(0.0)[DeviceKey("gpu.example.com", "node-1", "gpu-9")].effect == "None"


def test_unknown_is_not_bad_unless_the_rule_says_so() -> None:
    e = engine(rule("u", health=frozenset({U})), rule("x", health=frozenset({X}), effect="None"))
    e.observe(GPU, X, "", 0.0)
    want = e.wants(0.0)[KEY]
    assert (want.rule, want.value, want.effect) == ("x", "unknown", "None")
    e2 = engine(rule("u"))
    e2.observe(GPU, X, "", 0.0)
    assert e2.wants(100.0) == {}


def test_seed_resumes_a_taint_and_its_escalation_clock() -> None:
    steps = (Step(60, "NoExecute"),)
    e = engine(rule(effect="NoSchedule", escalate=steps, healthy_for=10))
    e.seed(GPU, Want("NoSchedule", "drahealth.io/unhealthy", "unhealthy", "bad", "r"), 100.0)
    assert effect(e, 120.0) == "NoSchedule" and effect(e, 160.0) == "NoExecute"
    e.observe(GPU, H, "", 161.0)  # first observation after the restart: healthy
    assert effect(e, 170.9) == "NoExecute" and effect(e, 171.0) is None
    # a rule that left the policy: the taint is kept under the first covering rule
    e2 = engine(rule("new"))
    e2.seed(GPU, Want("NoSchedule", "drahealth.io/unhealthy", "unhealthy", "gone", "r"), 0.0)
    assert e2.wants(1.0)[KEY].rule == "new"
