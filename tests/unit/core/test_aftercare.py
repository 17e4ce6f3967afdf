"""Repeated-fault escalation and repair phases in the engine, with a fake clock.

Episodes within the window mark a device "needs a human", which keeps its taint until
an operator clears it; a repair runs only once the device is drained, holds the untaint
until it succeeds, backs off between failed attempts and escalates when it fails; all of
it survives a restart through the exported state.
"""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.core import DeviceKey, Health
from drahealth.core._aftercare import RepairRun, repair_env
from drahealth.core._escalation import Escalation, EscalationTracker, duration_text
from drahealth.core._policy import Action, DeviceFacts, Match, Policy, Recovery, Rule
from drahealth.core._remedy_engine import RemedyEngine, Want
from drahealth.core._repair import (
    JobPlacement,
    Repair,
    RepairError,
    RepairJob,
    job_manifest,
    normalize_job_template,
)

H, U = Health.HEALTHY, Health.UNHEALTHY
GPU = DeviceFacts("gpu.example.com", "node-1", "gpu-0", "node-1", {"uuid": "GPU-1234"})
KEY = DeviceKey("gpu.example.com", "node-1", "gpu-0")
DAY = 86400.0


def engine(
    *,
    escalation: Escalation | None = None,
    repair: Repair | None = None,
    default: Escalation | None = None,
    healthy_for: float = 10.0,
) -> RemedyEngine:
    rule = Rule(
        "xid", Match(), Action(), None, Recovery(healthy_for), escalation=escalation, repair=repair
    )
    policy = Policy(rules=(rule,))
    if default is not None:
        policy = Policy(rules=(rule,), escalation=default)
    return RemedyEngine(policy)


def tainted(e: RemedyEngine, now: float) -> bool:
    return KEY in e.wants(now)


def episode(e: RemedyEngine, start: float, healthy_for: float = 10.0) -> float:
    """One bad period (tainted) and its recovery; returns the time after it."""
    e.observe(GPU, U, "XID 79", start)
    assert tainted(e, start)
    e.observe(GPU, H, "", start + 1)
    end = start + 1 + healthy_for
    e.wants(end)
    return end


# -- escalation ----------------------------------------------------------------------


def test_episodes_within_the_window_need_a_human_and_keep_the_taint() -> None:
    e = engine(escalation=Escalation(episodes=3, window=100.0))
    t = episode(e, 0.0)
    assert not tainted(e, t)
    t = episode(e, t + 1)
    assert not tainted(e, t)
    e.observe(GPU, U, "XID 79", t + 1)
    assert tainted(e, t + 1)
    mark = e.care.escalation.needs_human(KEY)
    assert mark is not None and mark.why == "3 bad episodes within 100s" and mark.rule == "xid"
    e.observe(GPU, H, "", t + 2)
    assert tainted(e, t + 2 + 10_000), "a device that needs a human is never untainted"
    assert "needs a human" in e.explain(KEY, t + 3)
    notices = e.care.take_notices()
    assert [n.kind for n in notices] == ["needs-human"]
    assert "drahealth clear gpu.example.com/node-1/gpu-0" in notices[0].message


def test_episodes_older_than_the_window_do_not_count() -> None:
    e = engine(escalation=Escalation(episodes=3, window=30.0))
    t = 0.0
    for _ in range(5):  # each episode 11 s, 20 s apart: never 3 within 30 s
        t = episode(e, t) + 9
    assert e.care.escalation.needs_human(KEY) is None
    assert e.care.escalation.counts(KEY)[0] == 2


def test_without_an_escalation_section_episodes_are_not_counted() -> None:
    e = engine()
    t = 0.0
    for _ in range(5):
        t = episode(e, t)
    assert e.care.escalation.needs_human(KEY) is None and not tainted(e, t)


def test_clear_restarts_recovery_and_the_count() -> None:
    e = engine(escalation=Escalation(episodes=2, window=DAY))
    t = episode(e, 0.0)
    e.observe(GPU, U, "XID 79", t)
    e.observe(GPU, H, "", t + 1)
    assert e.care.escalation.needs_human(KEY) is not None
    assert tainted(e, t + 100)
    assert e.clear(KEY, at=t + 100, now=t + 100)
    assert tainted(e, t + 105), "healthyFor starts again at the clear"
    assert not tainted(e, t + 110.5)
    assert e.care.escalation.counts(KEY) == (0, 0)
    t = episode(e, t + 200)  # one new episode: below the limit again
    assert e.care.escalation.needs_human(KEY) is None and not tainted(e, t)


def test_a_clear_older_than_the_mark_does_not_clear_it() -> None:
    tracker = EscalationTracker()
    esc = Escalation(episodes=1)
    assert tracker.episode(KEY, esc, 50.0, "xid", "node-1") is not None
    assert not tracker.clear(KEY, at=40.0)
    assert tracker.needs_human(KEY) is not None
    assert tracker.clear(KEY, at=60.0) and tracker.needs_human(KEY) is None


def test_duration_text() -> None:
    assert [duration_text(s) for s in (86400, 300, 90, 0.5)] == ["24h", "5m", "90s", "0.5s"]


# -- repairs ---------------------------------------------------------------------------

EXEC = Repair(exec=("reset",), attempts=2, backoff=5.0, timeout=60.0)


def run_one(e: RemedyEngine, now: float, drained: bool = True) -> RepairRun | None:
    runs = e.care.due(now, lambda _k: drained)
    assert len(runs) <= 1
    return runs[0] if runs else None


def test_repair_waits_for_the_drain_and_holds_the_untaint_until_it_succeeds() -> None:
    e = engine(repair=EXEC)
    e.observe(GPU, U, "XID 79", 0.0)
    assert tainted(e, 0.0)
    assert e.care.repairs[KEY].phase == "waiting-drain"
    assert run_one(e, 1.0, drained=False) is None, "pods still use the device"
    e.observe(GPU, H, "", 2.0)
    assert tainted(e, 100.0), "no untaint before a successful repair"
    run = run_one(e, 100.0)
    assert run is not None and run.attempt == 1 and run.repair is EXEC
    assert e.care.repairs[KEY].phase == "running"
    assert run_one(e, 101.0) is None, "one attempt at a time"
    assert e.care.finished(KEY, run, True, "exit 0", 102.0) == "succeeded"
    assert not tainted(e, 102.0)
    assert KEY not in e.care.repairs, "the episode is over"


def test_failed_attempts_back_off_doubling_then_escalate() -> None:
    repair = Repair(exec=("reset",), attempts=3, backoff=5.0)
    e = engine(repair=repair, default=Escalation(episodes=0, failed_repairs=1))
    e.observe(GPU, U, "XID 79", 0.0)
    e.wants(0.0)
    run = run_one(e, 0.0)
    assert run is not None
    assert e.care.finished(KEY, run, False, "exit 1", 1.0) == "waiting-drain"
    assert e.care.repairs[KEY].not_before == 6.0
    assert e.next_wakeup(1.0) == 6.0
    assert run_one(e, 5.9) is None
    run = run_one(e, 6.0)
    assert run is not None and run.attempt == 2
    e.care.finished(KEY, run, False, "exit 1", 7.0)
    assert e.care.repairs[KEY].not_before == 17.0  # 10 s after the 2nd failure
    run = run_one(e, 17.0)
    assert run is not None and run.attempt == 3
    assert e.care.finished(KEY, run, False, "timed out", 18.0) == "failed"
    mark = e.care.escalation.needs_human(KEY)
    assert mark is not None and mark.why == "1 failed repairs within 24h"
    e.observe(GPU, H, "", 19.0)
    assert tainted(e, 1000.0)
    kinds = [n.kind for n in e.care.take_notices()]
    assert kinds == ["repair-retry", "repair-retry", "repair-failed", "needs-human"]


def test_a_failed_repair_below_the_limit_starts_a_new_one() -> None:
    repair = Repair(exec=("reset",), attempts=1, backoff=5.0)
    e = engine(repair=repair)  # failed repairs: 2 within 24h (always counted)
    e.observe(GPU, U, "XID 79", 0.0)
    e.wants(0.0)
    run = run_one(e, 0.0)
    assert run is not None
    assert e.care.finished(KEY, run, False, "exit 1", 1.0) == "waiting-drain"
    st = e.care.repairs[KEY]
    assert (st.round, st.attempt) == (2, 0)
    run = run_one(e, 6.0)
    assert run is not None and (run.round, run.attempt) == (2, 1)
    assert e.care.finished(KEY, run, False, "exit 1", 7.0) == "failed"
    assert e.care.escalation.needs_human(KEY) is not None
    assert run_one(e, 1000.0) is None, "no repair for a device that needs a human"


def test_a_stale_answer_is_ignored() -> None:
    e = engine(repair=EXEC)
    e.observe(GPU, U, "", 0.0)
    e.wants(0.0)
    run = run_one(e, 0.0)
    assert run is not None
    stale = RepairRun(KEY, "xid", EXEC, attempt=7, round=1)
    assert e.care.finished(KEY, stale, True, "", 1.0) is None
    assert e.care.repairs[KEY].phase == "running"


def test_bad_again_after_a_successful_repair_is_a_failed_attempt() -> None:
    e = engine(repair=EXEC)
    e.observe(GPU, U, "", 0.0)
    e.wants(0.0)
    run = run_one(e, 0.0)
    assert run is not None
    e.care.finished(KEY, run, True, "", 1.0)
    e.observe(GPU, H, "", 2.0)
    e.observe(GPU, U, "XID 79", 3.0)  # before healthyFor: the repair did not hold
    assert e.care.repairs[KEY].phase == "waiting-drain"
    assert e.care.repairs[KEY].failed == 1
    assert tainted(e, 100.0)


def test_clear_lets_a_failed_repair_recover_normally() -> None:
    repair = Repair(exec=("reset",), attempts=1)
    e = engine(repair=repair, default=Escalation(episodes=0, failed_repairs=1))
    e.observe(GPU, U, "", 0.0)
    e.wants(0.0)
    run = run_one(e, 0.0)
    assert run is not None
    e.care.finished(KEY, run, False, "exit 1", 1.0)
    e.observe(GPU, H, "", 2.0)
    assert tainted(e, 50.0)
    assert e.clear(KEY, at=50.0, now=50.0)
    assert KEY not in e.care.repairs
    assert tainted(e, 59.0) and not tainted(e, 60.0)


def _wall(offset: float) -> Any:
    return lambda t: t + offset


def test_state_survives_a_restart() -> None:
    e = engine(escalation=Escalation(episodes=2, window=DAY), repair=EXEC)
    e.observe(GPU, U, "", 0.0)
    want = e.wants(0.0)[KEY]
    run = run_one(e, 0.0)
    assert run is not None
    e.care.finished(KEY, run, True, "", 1.0)
    e.observe(GPU, H, "", 2.0)
    assert not tainted(e, 12.0)
    e.observe(GPU, U, "", 20.0)  # 2nd episode: needs a human; its repair starts
    want = e.wants(20.0)[KEY]
    assert e.care.escalation.needs_human(KEY) is not None
    state = e.care.export(_wall(1000.0), 21.0)
    assert state["needsHuman"][str(KEY)]["since"] == 1020.0
    assert state["episodes"][str(KEY)]["episodes"] == [1000.0, 1020.0]
    assert state["repairs"] == {}  # no repair for a device that needs a human

    # a new controller, whose clock is 500 s behind the wall instead of 1000 s
    rebuilt = engine(escalation=Escalation(episodes=2, window=DAY), repair=EXEC)
    assert rebuilt.care.restore(state, lambda w: None if w is None else w - 500.0) == []
    rebuilt.seed(GPU, Want(want.effect, want.key, want.value, want.rule, want.reason), 520.0)
    rebuilt.observe(GPU, H, "", 530.0)
    assert tainted(rebuilt, 10_000.0)
    assert rebuilt.care.escalation.counts(KEY) == (2, 0)


def test_a_running_repair_is_run_again_after_a_restart() -> None:
    e = engine(repair=EXEC)
    e.observe(GPU, U, "", 0.0)
    e.wants(0.0)
    assert run_one(e, 0.0) is not None
    state = e.care.export(_wall(0.0), 1.0)
    assert state["repairs"][str(KEY)]["phase"] == "running"
    assert state["repairs"][str(KEY)]["deadline"] == EXEC.attempt_deadline(0.0)
    rebuilt = engine(repair=EXEC)
    rebuilt.care.restore(state, lambda w: w)
    # its command may still run until its recorded deadline: nothing starts before
    assert run_one(rebuilt, 2.0) is None
    run = run_one(rebuilt, EXEC.attempt_deadline(0.0))
    assert run is not None and run.attempt == 1, "the interrupted attempt, not a new one"


def test_unreadable_state_is_left_out_by_name() -> None:
    e = engine(repair=EXEC)
    problems = e.care.restore(
        {"needsHuman": {"nonsense": {}}, "repairs": {str(KEY): {"phase": "dancing"}}},
        lambda w: w,
    )
    assert len(problems) == 2 and "nonsense" in problems[0] and str(KEY) in problems[1]


# -- the Job of a job repair ---------------------------------------------------------

TEMPLATE = {
    "spec": {
        "containers": [
            {
                "name": "reset",
                "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubi8",
                "command": ["nvidia-smi"],
                "args": ["--gpu-reset", "-i", "$(DRAHEALTH_ATTR_uuid)"],
                "env": [{"name": "TARGET", "value": "$(DRAHEALTH_DEVICE) on $(DRAHEALTH_NODE)"}],
            }
        ]
    }
}
PLACE = JobPlacement(
    "dh-repair-gpu-0-abc", "ops", "node-1", {"app.kubernetes.io/managed-by": "x"}, {},
    ("drahealth.io/unhealthy",),
)  # fmt: skip


def repair_of(template: Any) -> Repair:
    return Repair(job=RepairJob(normalize_job_template(template)), timeout=120.0)


def test_job_is_placed_on_the_node_with_the_device_substituted() -> None:
    job = job_manifest(repair_of(TEMPLATE), repair_env(GPU, "xid"), PLACE)
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["args"] == ["--gpu-reset", "-i", "GPU-1234"]
    assert c["env"][0] == {
        "name": "TARGET",
        "value": "gpu.example.com/node-1/gpu-0 on node-1",
    }
    assert {"name": "DRAHEALTH_ATTR_uuid", "value": "GPU-1234"} in c["env"]
    assert pod["nodeName"] == "node-1" and pod["restartPolicy"] == "Never"
    assert {"key": "drahealth.io/unhealthy", "operator": "Exists"} in pod["tolerations"]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 120
    assert job["metadata"]["namespace"] == "ops"
    assert job["spec"]["template"]["metadata"]["labels"] == PLACE.labels
    assert TEMPLATE["spec"]["containers"][0]["args"][2] == "$(DRAHEALTH_ATTR_uuid)"


@pytest.mark.parametrize(
    "value",
    ['x"\n  hostPID: true', "GPU-1; reboot", "$(DRAHEALTH_NODE)", "", "a b"],
)
def test_an_unsafe_or_missing_value_fails_the_attempt(value: str) -> None:
    facts = DeviceFacts("gpu.example.com", "node-1", "gpu-0", "node-1", {"uuid": value})
    with pytest.raises(RepairError, match=r"args\[2\]: \$\(DRAHEALTH_ATTR_uuid\)"):
        job_manifest(repair_of(TEMPLATE), repair_env(facts, "xid"), PLACE)


def test_a_missing_attribute_is_an_error_not_an_empty_string() -> None:
    facts = DeviceFacts("gpu.example.com", "node-1", "gpu-0", "node-1", {})
    with pytest.raises(RepairError, match="no value"):
        job_manifest(repair_of(TEMPLATE), repair_env(facts, "xid"), PLACE)


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ({"spec": {"containers": []}}, "at least one container"),
        ({"foo": 1}, "Job spec"),
        ({"containers": [{"name": "a"}]}, "name and an image"),
        (
            {"containers": [{"name": "a", "image": "i", "args": ["$(DRAHEALTH_UUID)"]}]},
            r"DRAHEALTH_UUID\) is not a known name",
        ),
        (
            {"containers": [{"name": "a", "image": "i"}], "restartPolicy": "Always"},
            "restartPolicy",
        ),
    ],
)
def test_bad_templates_are_refused_by_name(template: Any, problem: str) -> None:
    with pytest.raises(RepairError, match=problem):
        normalize_job_template(template)


def test_template_forms() -> None:
    pod_spec = {"containers": [{"name": "a", "image": "i"}]}
    expected = {"template": {"spec": pod_spec}}
    assert normalize_job_template(pod_spec) == expected
    assert normalize_job_template({"spec": pod_spec}) == expected
    assert normalize_job_template(expected) == expected
    assert normalize_job_template({"kind": "Job", "spec": expected}) == expected
