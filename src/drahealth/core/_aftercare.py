"""A tainted device's aftercare in the remedy engine: episodes, escalation, repairs.

Owns :class:`Aftercare`, what :class:`~drahealth.core.RemedyEngine` calls: a new taint of
a device is a new *episode* (counted by the
:class:`~drahealth.core._escalation.EscalationTracker`) and, when its rule has a repair
(:class:`~drahealth.core._repair.Repair`), starts one; the per-device repair phases
(:class:`RepairState`), the attempts due (:class:`RepairRun`), what the controller should
say (:class:`Notice`), the environment a repair sees (:func:`repair_env`) and the
``policy check`` data (:func:`explain_aftercare`). The phases are described in
:mod:`drahealth.core._repair`. Sans-I/O: times are the caller's clock;
:meth:`Aftercare.export` and :meth:`Aftercare.restore` carry the state across a restart
on the wall clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from drahealth.core._breaker import MAX_CLOCK_SKEW
from drahealth.core._escalation import Escalation, EscalationTracker, NeedsHuman, duration_text
from drahealth.core._health import DeviceKey
from drahealth.core._policy import DeviceFacts, Policy, Rule
from drahealth.core._repair import (
    ENV_NAME_UNSAFE,
    MAX_BACKOFF,
    Repair,
    command_value_problem,
)

#: Notices waiting to be reported (the controller takes them every pass).
MAX_NOTICES: Final = 10_000
#: Timeout of a repair whose rule the policy no longer has (the largest one allowed).
FALLBACK_TIMEOUT: Final = 3600.0
Phase = Literal["waiting-drain", "running", "succeeded", "failed"]
PHASES: Final = ("waiting-drain", "running", "succeeded", "failed")

__all__ = ["Aftercare", "Notice", "RepairRun", "RepairState", "explain_aftercare", "repair_env"]


@dataclass(slots=True)
class RepairState:
    """One device's repair in the current episode."""

    rule: str
    kind: str
    node: str
    phase: Phase = "waiting-drain"
    attempt: int = 0  # attempts started in this round
    round: int = 1  # repairs (sets of attempts) in this episode
    since: float = 0.0  # when the phase began
    not_before: float = 0.0  # the backoff: no attempt before this
    detail: str = ""
    failed: int = 0  # failed attempts in this round
    deadline: float = 0.0  # when the running attempt has surely ended (exec, webhook)


@dataclass(frozen=True, slots=True)
class RepairRun:
    """An attempt the runner should start now."""

    key: DeviceKey
    rule: str
    repair: Repair
    attempt: int
    round: int


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the controller should say (an Event, a history line)."""

    key: DeviceKey
    kind: Literal["needs-human", "repair-retry", "repair-failed", "repair-regressed"]
    message: str
    rule: str = ""
    node: str = ""


class Aftercare:
    """Episodes, escalation and repairs of tainted devices (see the module docstring)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.escalation = EscalationTracker()
        self.repairs: dict[DeviceKey, RepairState] = {}
        self._notices: deque[Notice] = deque(maxlen=MAX_NOTICES)
        self.changed = False  # the repairs changed since the last export
        #: counts older than this matter for no rule
        self.window = max(
            [policy.escalation.window]
            + [r.escalation.window for r in policy.all_rules() if r.escalation is not None]
        )

    def escalation_of(self, rule: Rule | None) -> Escalation:
        if rule is not None and rule.escalation is not None:
            return rule.escalation
        return self.policy.escalation

    # -- engine hooks ------------------------------------------------------------

    def on_taint(self, key: DeviceKey, rule: Rule, node: str, now: float) -> None:
        """A new episode: the device's taint starts at ``now``."""
        esc = self.escalation_of(rule)
        if esc.episodes > 0:
            mark = self.escalation.episode(key, esc, now, rule.name, node)
            if mark is not None:
                self._needs_human(key, mark)
        if rule.repair is not None and self.escalation.needs_human(key) is None:
            self.repairs[key] = RepairState(
                rule.name, rule.repair.kind, node, since=now, not_before=now,
                detail="waiting for the device's pods to leave",
            )  # fmt: skip
            self.changed = True

    def on_bad_again(self, key: DeviceKey, now: float) -> None:
        """The tainted device went bad again: after a successful repair, it did not hold."""
        st = self.repairs.get(key)
        if st is not None and st.phase == "succeeded":
            self._attempt_failed(key, st, now, "the device went bad again after the repair")

    def allows_untaint(self, key: DeviceKey) -> bool:
        """No mark, and no repair that has yet to succeed."""
        if key in self.escalation.marked:
            return False
        st = self.repairs.get(key)
        return st is None or st.phase == "succeeded"

    def on_untaint(self, key: DeviceKey) -> None:
        """The episode is over."""
        if self.repairs.pop(key, None) is not None:
            self.changed = True

    def next_wakeup(self) -> float | None:
        times = [s.not_before for s in self.repairs.values() if s.phase == "waiting-drain"]
        return min(times) if times else None

    # -- controller side ---------------------------------------------------------

    def waiting(self, now: float) -> list[DeviceKey]:
        """Devices whose repair would start now if they were drained."""
        return sorted(
            k for k, s in self.repairs.items() if s.phase == "waiting-drain" and s.not_before <= now
        )

    def due(self, now: float, drained: Callable[[DeviceKey], bool]) -> list[RepairRun]:
        """The attempts to start now (marked running): drained devices past their backoff."""
        runs: list[RepairRun] = []
        for key in self.waiting(now):
            st = self.repairs[key]
            rule = self.policy.rule_named(st.rule)
            if rule is None or rule.repair is None:
                del self.repairs[key]  # the rule left the policy: nothing to run
                self.changed = True
                continue
            if not drained(key):
                detail = "waiting for the device's pods to leave"
                if st.detail != detail:
                    st.detail = detail
                    self.changed = True
                continue
            st.phase, st.since, st.detail = "running", now, ""
            st.deadline = rule.repair.attempt_deadline(now)
            st.attempt += 1
            self.changed = True
            runs.append(RepairRun(key, st.rule, rule.repair, st.attempt, st.round))
        return runs

    def finished(
        self, key: DeviceKey, run: RepairRun, ok: bool, detail: str, now: float
    ) -> str | None:
        """The runner's answer for ``run``: the phase it led to (None: no longer wanted)."""
        st = self.repairs.get(key)
        if (
            st is None
            or st.phase != "running"
            or (st.attempt, st.round)
            != (
                run.attempt,
                run.round,
            )
        ):
            return None
        self.changed = True
        if ok:
            st.phase, st.since, st.detail = "succeeded", now, detail
            return "succeeded"
        self._attempt_failed(key, st, now, detail)
        return st.phase

    def clear(self, key: DeviceKey, at: float) -> bool:
        """An operator cleared the device at ``at``: its mark and counts before ``at`` go,
        and a repair still owed no longer holds the untaint. True if a mark went."""
        went = self.escalation.clear(key, at)
        st = self.repairs.get(key)
        if st is not None and st.phase != "running" and (went or st.phase == "failed"):
            del self.repairs[key]
            self.changed = True
        return went

    def take_notices(self) -> list[Notice]:
        out = list(self._notices)
        self._notices.clear()
        return out

    def export(self, wall: Callable[[float], Any], now: float) -> dict[str, Any]:
        """The state keys ``needsHuman``, ``episodes`` and ``repairs`` (times via ``wall``)."""
        needs, counted = self.escalation.export(wall, now, self.window)
        repairs = {
            str(k): {
                "phase": s.phase, "attempt": s.attempt, "kind": s.kind, "since": wall(s.since),
                "detail": s.detail, "rule": s.rule, "node": s.node, "round": s.round,
                "failed": s.failed, "notBefore": wall(s.not_before),
                **({"deadline": wall(s.deadline)} if s.phase == "running" else {}),
            }
            for k, s in sorted(self.repairs.items())
        }  # fmt: skip
        self.changed = self.escalation.changed = False
        return {"needsHuman": needs, "episodes": counted, "repairs": repairs}

    def restore(
        self,
        state: Mapping[str, Any],
        clock: Callable[[Any], float | None],
        now: float | None = None,
    ) -> list[str]:
        """Load :meth:`export`'s keys; a repair that was running is run again (its attempt
        is not counted twice), an ``exec`` or ``webhook`` one not before the ``deadline``
        recorded for it, since the last leader's command may still run. Returns one line
        per entry left out.

        With ``now`` (the caller's clock), no restored time is trusted past what a
        controller could have written: an escalation time more than
        :data:`MAX_CLOCK_SKEW` ahead is unreadable, a repair's (which is kept: its
        command may run) and a nearer one count as now; a backoff ends at most
        :data:`~drahealth.core._repair.MAX_BACKOFF` after its failure and a running attempt's
        deadline at most its rule's timeout and kill grace after it started, so a state
        edited to say "year 9999" never stops a device's repair for good."""
        needs, counted = state.get("needsHuman") or {}, state.get("episodes") or {}
        problems = self.escalation.restore(
            needs if isinstance(needs, Mapping) else {},
            counted if isinstance(counted, Mapping) else {},
            clock if now is None else _bounded(clock, now),
        )
        until = clock  # a deadline lies ahead: bounded by the attempt's own, never taken as now
        if now is not None:  # a repair is kept: its command may run, whatever its times say
            clock = _bounded(clock, now, keep=True)
        repairs = state.get("repairs") or {}
        for name, value in (repairs if isinstance(repairs, Mapping) else {}).items():
            try:
                key = DeviceKey.parse(name)
                phase = value["phase"]
                since, not_before = clock(value.get("since")), clock(value.get("notBefore"))
                if phase not in PHASES or since is None:
                    raise ValueError(phase)
                if not_before is not None:  # a backoff is at most MAX_BACKOFF long
                    not_before = min(not_before, since + MAX_BACKOFF)
                st = RepairState(
                    str(value["rule"]), str(value.get("kind", "")), str(value.get("node", "")),
                    phase, int(value.get("attempt", 0)), int(value.get("round", 1)), since,
                    since if not_before is None else not_before, str(value.get("detail", "")),
                    int(value.get("failed", 0)),
                )  # fmt: skip
            except (KeyError, TypeError, ValueError, AttributeError):
                problems.append(f"repairs: {name!r}: unreadable: left out")
                continue
            if st.phase == "running":  # the runner went with the last leader: run it again
                st.phase, st.attempt = "waiting-drain", max(0, st.attempt - 1)
                st.detail = "run again: the controller restarted while it ran"
                if st.kind != "job":  # a Job is adopted; a command may still run: wait it out
                    rule = self.policy.rule_named(st.rule)
                    timeout = rule.repair.timeout if rule and rule.repair else FALLBACK_TIMEOUT
                    latest = Repair(timeout=timeout).attempt_deadline(since)
                    deadline = until(value.get("deadline"))
                    if deadline is None or deadline != deadline:  # unreadable: the latest
                        deadline = latest
                    st.not_before = max(st.not_before, min(deadline, latest))
                    st.detail += "; not before the last attempt's deadline"
            self.repairs[key] = st
        return problems

    # -- internals ---------------------------------------------------------------

    def _attempt_failed(self, key: DeviceKey, st: RepairState, now: float, detail: str) -> None:
        rule = self.policy.rule_named(st.rule)
        repair = rule.repair if rule is not None else None
        self.changed = True
        st.failed += 1
        st.since, st.detail = now, detail
        if repair is None:
            st.phase = "failed"
            return
        wait = repair.backoff_after(st.failed)
        if st.attempt < repair.attempts:
            st.phase, st.not_before = "waiting-drain", now + wait
            self._notices.append(
                Notice(
                    key, "repair-retry",
                    f"repair of {key} attempt {st.attempt} of {repair.attempts} failed: "
                    f"{detail}; next attempt in {duration_text(round(wait, 3))}",
                    st.rule, st.node,
                )
            )  # fmt: skip
            return
        st.phase = "failed"
        esc = self.escalation_of(rule)
        mark = None
        if esc.failed_repairs > 0:
            mark = self.escalation.repair_failed(key, esc, now, st.rule, st.node)
        limit = esc.failed_repairs
        self._notices.append(
            Notice(
                key, "repair-failed",
                f"repair of {key} failed after {st.attempt} attempt(s): {detail}"
                + (f" ({self.escalation.counts(key)[1]} of {limit} failed repairs)"
                   if limit else ""),
                st.rule, st.node,
            )
        )  # fmt: skip
        if mark is not None:
            self._needs_human(key, mark)
        elif self.escalation.needs_human(key) is None:
            # below the limit: a new repair, a fresh set of attempts, after the backoff
            st.phase, st.round, st.attempt, st.failed = "waiting-drain", st.round + 1, 0, 0
            st.not_before = now + wait

    def _needs_human(self, key: DeviceKey, mark: NeedsHuman) -> None:
        st = self.repairs.get(key)
        if st is not None and st.phase == "waiting-drain":
            st.phase, st.detail = "failed", f"not run: the device needs a human ({mark.why})"
            self.changed = True
        self._notices.append(
            Notice(
                key, "needs-human", f"{key} needs a human: {mark.why}; its taint stays until "
                f"an operator runs: drahealth clear {key}", mark.rule, mark.node,
            )
        )  # fmt: skip


def _bounded(
    clock: Callable[[Any], float | None], now: float, *, keep: bool = False
) -> Callable[[Any], float | None]:
    """``clock`` that refuses times past ``now`` + :data:`MAX_CLOCK_SKEW` (``keep``:
    takes them as ``now``) and takes a nearer future time as ``now``."""

    def bounded(value: Any) -> float | None:
        t = clock(value)
        if t is None or t != t or (t > now + MAX_CLOCK_SKEW and not keep):
            return None
        return min(t, now)

    return bounded


def _env_name(attribute: str) -> str:
    return "ATTR_" + ENV_NAME_UNSAFE.sub("_", attribute.rpartition("/")[2])


def repair_env(facts: DeviceFacts, rule: str) -> dict[str, str]:
    """``DRAHEALTH_<NAME>`` -> value for a device (names without the prefix in errors):
    DEVICE (``driver/pool/device``), NODE, DRIVER, POOL, DEVICE_NAME, RULE and
    ``ATTR_<attribute>`` (the attribute's name without its domain; other characters than
    letters, digits and ``_`` become ``_``). Values that are not safe to hand to a
    command are left out (a reference to one is then an error)."""
    key = f"{facts.driver}/{facts.pool}/{facts.device}"
    values: dict[str, str] = {
        "DEVICE": key, "NODE": facts.node, "DRIVER": facts.driver, "POOL": facts.pool,
        "DEVICE_NAME": facts.device, "RULE": rule,
    }  # fmt: skip
    for name, value in sorted(facts.attributes.items()):
        text = str(value).lower() if isinstance(value, bool) else str(value)
        values.setdefault(_env_name(name), text)
    return {f"DRAHEALTH_{k}": v for k, v in values.items() if not command_value_problem(v)}


def explain_aftercare(policy: Policy, rule: Rule) -> dict[str, Any]:
    """The ``escalation`` (needs-a-human limits) and ``repair`` of ``rule`` as plain data,
    for ``drahealth policy check``."""
    esc = rule.escalation if rule.escalation is not None else policy.escalation
    repair = rule.repair
    out: dict[str, Any] = {
        "needsHuman": {
            "episodes": esc.episodes,
            "failedRepairs": esc.failed_repairs,
            "windowSeconds": esc.window,
        },
        "repair": None,
    }
    if repair is not None:
        out["repair"] = {
            "kind": repair.kind,
            "attempts": repair.attempts,
            "backoffSeconds": repair.backoff,
            "timeoutSeconds": repair.timeout,
        }
    return out
