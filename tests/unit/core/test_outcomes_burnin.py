"""RemedyEngine with a fake time: the ``ignore`` and ``degraded`` outcomes, the burn-in gate."""

from __future__ import annotations

from drahealth.core import (
    BURN_IN_NEW,
    BURN_IN_REPAIRED,
    BURN_IN_TAINT_KEY,
    DeviceKey,
    Health,
    explain,
)
from drahealth.core._policy import (
    Action,
    BurnIn,
    DeviceFacts,
    Hysteresis,
    Match,
    Policy,
    Recovery,
    Rule,
    Validate,
)
from drahealth.core._remedy_engine import RemedyEngine, Want

H, U = Health.HEALTHY, Health.UNHEALTHY
GPU = DeviceFacts("gpu.example.com", "node-1", "gpu-0", "node-1")
KEY = DeviceKey("gpu.example.com", "node-1", "gpu-0")
CHECK = Validate(exec=("true",))

IGNORE = Rule("app-xid", Match(message="XID (13|31|43)\\b"), Action(outcome="ignore"))
DEGRADED = Rule("ecc", Match(message="corrected ECC"), Action(outcome="degraded"))
BAD = Rule("bad", Match(), Action("NoExecute"), Hysteresis(3, 30), Recovery(5.0))


def engine(*rules: Rule, burn_in: BurnIn | None = None, dry_run: bool = False) -> RemedyEngine:
    return RemedyEngine(Policy(rules=rules, burn_in=burn_in, dry_run=dry_run))


# -- ignore ---------------------------------------------------------------------------


def test_ignore_ends_the_search_nothing_is_wanted() -> None:
    e = engine(IGNORE, BAD)
    e.observe(GPU, U, "XID 13: graphics engine exception", 0.0)
    assert e.wants(100.0) == {} and e.degraded == {}
    assert e.next_wakeup(100.0) is None
    # the same device with a fatal XID is still the later rule's
    e.observe(GPU, U, "XID 79", 101.0)
    assert e.wants(101.0)[KEY].rule == "bad"


def test_ignored_health_changes_do_not_make_a_device_flap() -> None:
    e = engine(IGNORE, BAD)
    e.observe(GPU, U, "XID 79", 0.0)  # a real episode first: the device has a rule
    e.observe(GPU, H, "", 1.0)
    assert e.wants(10.0) == {}
    for i in range(10):  # then an application crashing in a loop: XID 13, Healthy, ...
        e.observe(GPU, U if i % 2 == 0 else H, "XID 13" if i % 2 == 0 else "", 11.0 + i)
    assert e.wants(21.0) == {}


def test_an_ignored_message_leaves_an_existing_taint_to_recovery() -> None:
    e = engine(IGNORE, BAD)
    e.observe(GPU, U, "XID 79", 0.0)
    assert e.wants(0.0)[KEY].effect == "NoExecute"
    e.observe(GPU, U, "XID 13", 1.0)  # still Unhealthy: recovery needs Healthy
    assert e.wants(100.0)[KEY].rule == "bad"
    e.observe(GPU, H, "", 101.0)
    assert e.wants(106.0) == {}


def test_explain_says_ignored_by_rule() -> None:
    out = explain(Policy(rules=(IGNORE, BAD)), GPU, U, "XID 43")
    assert out["rule"] == "app-xid" and out["outcome"] == "ignore" and "taint" not in out


# -- degraded -------------------------------------------------------------------------


def test_degraded_is_shown_never_tainted_and_clears_when_health_changes() -> None:
    e = engine(DEGRADED, BAD)
    e.observe(GPU, U, "corrected ECC rate high", 0.0)
    assert e.wants(100.0) == {}
    d = e.degraded[KEY]
    assert (d.rule, d.reason, d.since, d.node) == ("ecc", "corrected ECC rate high", 0.0, "node-1")
    v = e.degraded_version
    e.observe(GPU, U, "corrected ECC rate high", 5.0)  # the same: no change to show
    assert e.degraded_version == v
    e.observe(GPU, U, "corrected ECC rate higher", 6.0)  # a new message: a change, same start
    assert e.degraded_version == v + 1 and e.degraded[KEY].since == 0.0
    e.observe(GPU, H, "", 7.0)
    assert KEY not in e.degraded and e.degraded_version == v + 2
    assert e.wants(100.0) == {}


def test_degraded_then_a_tainting_rule_takes_over() -> None:
    e = engine(DEGRADED, BAD)
    e.observe(GPU, U, "corrected ECC", 0.0)
    e.observe(GPU, U, "XID 79", 1.0)
    assert KEY not in e.degraded and e.wants(1.0)[KEY].rule == "bad"


def test_forget_drops_degraded_and_burn_in() -> None:
    e = engine(DEGRADED, burn_in=BurnIn(CHECK))
    e.observe(GPU, U, "corrected ECC", 0.0)
    e.burn_in(KEY, BURN_IN_NEW, 0.0)
    e.forget(KEY)
    assert e.degraded == {} and e.wants(1.0) == {}


# -- burn-in --------------------------------------------------------------------------


def test_burn_in_taints_until_the_validation_passes() -> None:
    e = engine(BAD, burn_in=BurnIn(CHECK))
    assert e.burn_in(KEY, BURN_IN_NEW, 0.0)
    assert e.wants(0.0) == {
        KEY: Want("NoSchedule", BURN_IN_TAINT_KEY, "new", "burn-in", "burn-in: new device")
    }
    assert e.pending_burn_ins(0.0) == [KEY]
    assert e.pending_burn_ins(0.0) == []  # already validating
    assert e.burn_in_result(KEY, True, 1.0) is True
    assert e.wants(1.0) == {} and e.burn_ins.devices == {}
    assert e.burn_in_result(KEY, True, 2.0) is None  # not burning in any more


def test_a_failed_validation_retries_with_backoff_up_to_the_cap() -> None:
    e = engine(burn_in=BurnIn(CHECK, retry_initial=10.0, retry_max=25.0))
    e.burn_in(KEY, BURN_IN_NEW, 0.0)
    now, waits = 0.0, []
    for _ in range(4):
        assert e.pending_burn_ins(now) == [KEY]
        assert e.burn_in_result(KEY, False, now, "exit 1") is False
        due = e.next_wakeup(now)
        assert due is not None
        assert e.pending_burn_ins(due - 0.001) == []
        waits.append(due - now)
        now = due
        assert e.wants(now)[KEY].key == BURN_IN_TAINT_KEY  # still tainted meanwhile
    assert waits == [10.0, 20.0, 25.0, 25.0]
    assert e.burn_ins.devices[KEY].failures == 4 and e.burn_ins.devices[KEY].last == "exit 1"
    e.pending_burn_ins(now)
    e.burn_in_result(KEY, True, now)
    assert e.wants(now) == {}


def test_a_device_a_rule_taints_is_not_validated_and_keeps_the_stronger_taint() -> None:
    e = engine(BAD, burn_in=BurnIn(CHECK))
    e.burn_in(KEY, BURN_IN_REPAIRED, 0.0)
    e.observe(GPU, U, "XID 79", 0.0)
    assert e.wants(0.0)[KEY].rule == "bad"  # NoExecute beats the burn-in's NoSchedule
    assert e.pending_burn_ins(0.0) == []
    e.observe(GPU, H, "", 1.0)
    assert e.pending_burn_ins(2.0) == []  # still tainted by the rule (healthyFor 5 s)
    want = e.wants(6.0)[KEY]  # the rule let go: the burn-in taint is what is left
    assert (want.key, want.value) == (BURN_IN_TAINT_KEY, "repaired")
    assert e.pending_burn_ins(6.0) == [KEY]


def test_applies_to_and_no_policy() -> None:
    assert not engine().burn_in(KEY, BURN_IN_NEW, 0.0)
    e = engine(burn_in=BurnIn(CHECK, applies_to=frozenset({"new"})))
    assert not e.burn_in(KEY, BURN_IN_REPAIRED, 0.0)
    assert not e.burn_in(KEY, "because", 0.0)
    assert e.burn_in(KEY, BURN_IN_NEW, 0.0)


def test_dry_run_burn_in_is_effect_none() -> None:
    e = engine(burn_in=BurnIn(CHECK), dry_run=True)
    e.burn_in(KEY, BURN_IN_NEW, 0.0)
    assert e.wants(0.0)[KEY].effect == "None"


def test_restart_resumes_a_burn_in_from_its_taint() -> None:
    e = engine(BAD, burn_in=BurnIn(CHECK))
    taint = Want("NoSchedule", BURN_IN_TAINT_KEY, "repaired", "burn-in", "burn-in: after repair")
    e.seed(GPU, taint, -50.0)
    d = e.burn_ins.devices[KEY]
    assert (d.why, d.since, d.state) == (BURN_IN_REPAIRED, -50.0, "waiting")
    assert e.wants(0.0) == {KEY: taint}
    assert e.rule_of(KEY) is None  # not mistaken for a rule's taint
    assert e.pending_burn_ins(0.0) == [KEY]


def test_a_repair_during_a_burn_in_restarts_its_retries() -> None:
    e = engine(burn_in=BurnIn(CHECK))
    e.burn_in(KEY, BURN_IN_NEW, 0.0)
    e.pending_burn_ins(0.0)
    e.burn_in_result(KEY, False, 0.0)
    e.burn_in(KEY, BURN_IN_REPAIRED, 1.0)
    d = e.burn_ins.devices[KEY]
    assert (d.why, d.since, d.failures) == (BURN_IN_REPAIRED, 0.0, 0)
    assert e.pending_burn_ins(1.0) == [KEY]
