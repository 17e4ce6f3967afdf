"""The remediation decision engine: device health over time -> the taint each device wants.

Owns :class:`RemedyEngine` and :class:`Want`. Sans-I/O: time is passed in, nothing is
read or written; the controller feeds observations and applies the answers.

Per device (first matching rule wins, see :meth:`Policy.rule_for`):

* **grace**: bad health must last ``action.grace`` seconds before a taint is wanted;
* **escalation**: the effect rises along ``action.escalate`` while the device stays
  tainted (measured from when the taint was first wanted);
* **hysteresis**: ``transitions`` health changes within ``window`` seconds mark the
  device *flapping*: it is tainted (as its last rule says) and stays tainted while that
  many changes remain within the window, so a flapping device causes no
  taint/untaint churn; after that the recovery rule below applies;
* **recovery**: a tainted device is untainted once it has been Healthy without a break
  for ``recovery.healthy_for`` seconds and, if a validation hook is configured, the
  hook passed after that (a failed hook restarts the window);
* ``Policy.dry_run`` turns every wanted effect into ``None`` (informational).

Restart safety: :meth:`seed` resumes a device from the controller's own rule found in
the API, so a restart neither drops a taint nor restarts its escalation clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from drahealth.core._health import DeviceKey, Health
from drahealth.core._policy import EFFECT_ORDER, DeviceFacts, Policy, Rule

__all__ = ["RemedyEngine", "Want", "explain"]

Validation = Literal["none", "pending", "passed"]


@dataclass(frozen=True, slots=True)
class Want:
    """The controller taint a device should carry now."""

    effect: str
    key: str
    value: str
    rule: str
    reason: str


@dataclass(slots=True)
class _Device:
    facts: DeviceFacts
    health: Health = Health.UNKNOWN
    message: str = ""
    observed: bool = False
    rule: Rule | None = None  # the rule of the current or last bad period
    bad_since: float | None = None  # start of the current matching bad period
    healthy_since: float | None = None
    tainted_since: float | None = None  # when a taint was first wanted (None: untainted)
    value: str = ""
    reason: str = ""
    changes: deque[float] = field(default_factory=deque)
    validation: Validation = "none"
    reported: float = float("-inf")  # the last wants() that covered this device


class RemedyEngine:
    """See the module docstring."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._devices: dict[DeviceKey, _Device] = {}
        #: devices that may want a taint, or change without input (a bad period, a taint,
        #: recent health changes): the outputs walk these, not every device seen
        self._active: set[DeviceKey] = set()
        #: health changes older than this count for no rule's hysteresis
        self._horizon = max(
            (r.hysteresis.window for r in policy.rules if r.hysteresis), default=0.0
        )

    # -- input -------------------------------------------------------------------

    def observe(self, facts: DeviceFacts, health: Health, message: str, now: float) -> None:
        """The device's current health; repeats of the same health are no transition."""
        key = DeviceKey(facts.driver, facts.pool, facts.device)
        d = self._devices.get(key)
        if d is None:
            d = self._devices[key] = _Device(facts)
        else:
            self._advance(d, now)  # what the old state led to by now
        d.facts = facts
        changed = d.observed and health is not d.health
        if changed:
            d.changes.append(now)
        while d.changes and d.changes[0] <= now - self._horizon:
            d.changes.popleft()
        d.observed = True
        d.health, d.message = health, message
        rule = self.policy.rule_for(facts, health, message)
        if rule is not None:
            if d.bad_since is None:
                d.bad_since = now
            d.rule = rule
            self._active.add(key)
            d.value = _value(rule, health)
            d.reason = f"{health.value}" + (f": {message}" if message else "")
        else:
            d.bad_since = None
        if health is Health.HEALTHY:
            if d.healthy_since is None:
                d.healthy_since = now
                d.validation = "none"
        else:
            d.healthy_since = None
            d.validation = "none"

    def seed(self, facts: DeviceFacts, want: Want, since: float) -> None:
        """Resume a device that carries the controller's taint ``want`` since ``since``."""
        key = DeviceKey(facts.driver, facts.pool, facts.device)
        d = self._devices.setdefault(key, _Device(facts))
        rule = next((r for r in self.policy.rules if r.name == want.rule), None)
        if rule is None:  # the rule left the policy: keep the taint under the first rule
            rule = next((r for r in self.policy.rules if r.match.device_matches(facts)), None)
        if rule is None:
            return  # nothing in the policy covers it any more: recovery removes it
        # ``since`` is the taint's timeAdded, which moves when the effect changes: an
        # escalated taint was first wanted that step's ``after`` earlier
        since -= _escalated_for(rule, want.effect)
        d.rule, d.tainted_since, d.value, d.reason = rule, since, want.value, want.reason
        self._active.add(key)

    def rule_of(self, key: DeviceKey) -> Rule | None:
        """The rule of the device's current or last bad period."""
        d = self._devices.get(key)
        return None if d is None else d.rule

    def forget(self, key: DeviceKey) -> None:
        self._devices.pop(key, None)
        self._active.discard(key)

    def validated(self, key: DeviceKey, ok: bool, now: float) -> None:
        """The validation hook's answer for a recovered device."""
        d = self._devices.get(key)
        if d is None or d.validation != "pending":
            return
        if ok:
            d.validation = "passed"
        else:
            d.validation = "none"
            d.healthy_since = now  # a failed check restarts the recovery window

    # -- output ------------------------------------------------------------------

    def wants(self, now: float) -> dict[DeviceKey, Want]:
        """Every device that should carry a controller taint now (others: none)."""
        out: dict[DeviceKey, Want] = {}
        for key in sorted(self._active):
            d = self._devices[key]
            self._advance(d, now)
            d.reported = max(d.reported, now)
            if d.tainted_since is None and d.bad_since is None and not d.changes:
                self._active.discard(key)  # nothing can change for it without new input
                continue
            if d.tainted_since is not None and d.rule is not None:
                effect = d.rule.action.effect_at(now - d.tainted_since)
                if self.policy.dry_run:
                    effect = "None"
                out[key] = Want(effect, d.rule.action.taint_key, d.value, d.rule.name, d.reason)
        return out

    def pending_validations(self, now: float) -> list[DeviceKey]:
        """Recovered devices whose validation hook should run now (marked pending)."""
        out = []
        for key in self._active:
            d = self._devices[key]
            self._advance(d, now)
            if self._recovered(d, now) and d.validation == "none" and self._hook(d):
                d.validation = "pending"
                out.append(key)
        return sorted(out)

    def explain(self, key: DeviceKey, now: float) -> str:
        d = self._devices.get(key)
        if d is None:
            return "never observed"
        self._advance(d, now)
        if d.tainted_since is None:
            if d.bad_since is not None and d.rule is not None:
                until = d.bad_since + d.rule.action.grace
                return f"{d.reason}; rule {d.rule.name}: grace period until t={until:.1f}"
            return f"{d.health.value}: no rule wants a taint"
        assert d.rule is not None
        if self._flapping(d, now):
            h = d.rule.hysteresis
            assert h is not None
            return f"held: {len(d.changes)} health changes within {h.window:g} s (flapping)"
        if d.bad_since is not None or d.healthy_since is None:
            effect = d.rule.action.effect_at(now - d.tainted_since)
            return f"tainted {effect} by rule {d.rule.name}: {d.reason}"
        until = d.healthy_since + d.rule.recovery.healthy_for
        if now < until:
            return f"recovering: Healthy since t={d.healthy_since:.1f}, untaint at t={until:.1f}"
        return f"recovered: validation {d.validation}"

    def next_wakeup(self, now: float) -> float | None:
        """The next time at which :meth:`wants` may answer differently without input.

        A time at or before ``now`` means a change fell due after the last :meth:`wants`:
        ask again at once.
        """
        due: list[float] = []
        for key in self._active:
            d = self._devices[key]
            rule = d.rule
            if rule is None:
                continue
            times: list[float] = []
            if d.tainted_since is None and d.bad_since is not None:
                times.append(d.bad_since + rule.action.grace)
            if d.tainted_since is not None:
                times += [d.tainted_since + s.after for s in rule.action.escalate]
                if d.healthy_since is not None:
                    times.append(d.healthy_since + rule.recovery.healthy_for)
                if rule.hysteresis is not None and d.changes:
                    times.append(d.changes[0] + rule.hysteresis.window)
            due += [t for t in times if t > d.reported]
        return min(due) if due else None

    # -- internals ---------------------------------------------------------------

    def _advance(self, d: _Device, now: float) -> None:
        rule = d.rule
        if rule is None:
            return
        h = rule.hysteresis
        if h is not None:
            while d.changes and d.changes[0] <= now - h.window:
                d.changes.popleft()
        if d.tainted_since is None:
            due = d.bad_since is not None and now - d.bad_since >= rule.action.grace
            if due or self._flapping(d, now):
                start = now if d.bad_since is None else d.bad_since + rule.action.grace
                d.tainted_since = min(now, start)
            return
        if self._recovered(d, now) and (not self._hook(d) or d.validation == "passed"):
            d.tainted_since = None
            d.validation = "none"

    def _flapping(self, d: _Device, now: float) -> bool:
        h = d.rule.hysteresis if d.rule is not None else None
        if h is None:
            return False
        return sum(1 for t in d.changes if t > now - h.window) >= h.transitions

    def _recovered(self, d: _Device, now: float) -> bool:
        return (
            d.tainted_since is not None
            and d.rule is not None
            and d.bad_since is None
            and d.healthy_since is not None
            and now - d.healthy_since >= d.rule.recovery.healthy_for
            and not self._flapping(d, now)
        )

    @staticmethod
    def _hook(d: _Device) -> bool:
        v = d.rule.recovery.validate if d.rule is not None else None
        return v is not None and bool(v.exec or v.http)


def _escalated_for(rule: Rule, effect: str) -> float:
    """How long ``rule``'s taint has been wanted when it first has ``effect`` (0: at once)."""
    if EFFECT_ORDER.get(effect, 0) <= EFFECT_ORDER[rule.action.effect]:
        return 0.0
    steps = (
        s.after for s in rule.action.escalate if EFFECT_ORDER[s.effect] >= EFFECT_ORDER[effect]
    )
    return next(steps, 0.0)


def _value(rule: Rule, health: Health) -> str:
    if rule.action.taint_value:
        return rule.action.taint_value
    return health.value.lower()


def explain(policy: Policy, facts: DeviceFacts, health: Health, message: str) -> dict[str, Any]:
    """What the policy does with ``facts`` in ``health`` with ``message``, as plain data
    (``drahealth policy check`` prints it): the matching rule, the taint (key, value,
    effect), the grace period, the escalation steps, recovery, hysteresis, the rule's
    fallback mode, and what dry run and the eviction mode mean for it. ``rule`` is None
    when no rule matches (nothing is done)."""
    rule = policy.rule_for(facts, health, message)
    out: dict[str, Any] = {
        "device": f"{facts.driver}/{facts.pool}/{facts.device}",
        "health": health.value,
        "message": message,
        "rule": None,
        "remediationMode": policy.remediation_mode,
        "dryRun": policy.dry_run,
    }
    if rule is None:
        return out
    action = rule.action
    effects = {action.effect, *(s.effect for s in action.escalate)}
    out.update(
        {
            "rule": rule.name,
            "taint": {
                "key": action.taint_key,
                "value": _value(rule, health),
                "effect": "None" if policy.dry_run else action.effect,
            },
            "gracePeriodSeconds": action.grace,
            "escalate": [{"afterSeconds": s.after, "effect": s.effect} for s in action.escalate],
            "recovery": {
                "healthyForSeconds": rule.recovery.healthy_for,
                "validate": rule.recovery.validate is not None,
            },
            "hysteresis": None
            if rule.hysteresis is None
            else {
                "transitions": rule.hysteresis.transitions,
                "windowSeconds": rule.hysteresis.window,
            },
            "fallback": action.fallback or policy.remediation_fallback,
            "evicts": not policy.dry_run and "NoExecute" in effects,
            "evictionMode": policy.eviction.mode,
        }
    )
    return out
