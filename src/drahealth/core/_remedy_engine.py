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
* ``Policy.dry_run`` turns every wanted effect into ``None`` (informational);
* **outcomes**: a rule with ``action.outcome`` ``ignore`` ends the search and nothing is
  wanted; ``degraded`` puts the device in :attr:`RemedyEngine.degraded` (shown, never
  tainted). Neither counts as a health change for hysteresis;
* **burn-in**: :meth:`RemedyEngine.burn_in` gates a new or repaired device behind the
  ``drahealth.io/burn-in`` taint until its validation passes (``drahealth.core._burnin``).

Restart safety: :meth:`seed` resumes a device from the controller's own rule found in
the API, so a restart neither drops a taint nor restarts its escalation clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from drahealth.core._aftercare import Aftercare, explain_aftercare
from drahealth.core._breaker import explain_limits
from drahealth.core._burnin import BURN_IN_RULE, BURN_IN_TAINT_KEY, BurnInTracker, burn_in_why
from drahealth.core._health import DeviceKey, Health
from drahealth.core._policy import EFFECT_ORDER, DeviceFacts, Policy, Rule, Want
from drahealth.core._rollup import explain_rollup

__all__ = ["Degraded", "RemedyEngine", "Want", "explain"]

Validation = Literal["none", "pending", "passed"]


@dataclass(frozen=True, slots=True)
class Degraded:
    """A device a ``degraded`` rule matches: shown and reported, never tainted."""

    rule: str
    reason: str
    since: float
    node: str


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
    quiet: bool = False  # the last observation matched an ignore or degraded rule


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
            (r.hysteresis.window for r in policy.all_rules() if r.hysteresis), default=0.0
        )
        #: the burn-in gate (new and repaired devices), merged into :meth:`wants`
        self.burn_ins = BurnInTracker(policy.burn_in)
        #: devices a ``degraded`` rule matches now; ``degraded_version`` counts changes
        self.degraded: dict[DeviceKey, Degraded] = {}
        self.degraded_version = 0
        #: episodes, needs-a-human marks and repairs (see ``drahealth.core._repair``)
        self.care = Aftercare(policy)

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
        rule = self.policy.rule_for(facts, health, message)
        outcome = "taint" if rule is None else rule.action.outcome
        self._set_degraded(key, rule if outcome == "degraded" else None, facts, message, now)
        # an ignored or degraded observation is no transition: it cannot make a device flap
        quiet, d.quiet = d.quiet, outcome != "taint"
        if outcome != "taint":
            rule = None
        changed = d.observed and health is not d.health and not (quiet or d.quiet)
        if changed:
            d.changes.append(now)
        while d.changes and d.changes[0] <= now - self._horizon:
            d.changes.popleft()
        d.observed = True
        d.health, d.message = health, message
        if rule is not None:
            if d.bad_since is None:
                d.bad_since = now
                if d.tainted_since is not None:
                    self.care.on_bad_again(key, now)
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
        if want.key == BURN_IN_TAINT_KEY:  # the burn-in gate's taint, not a rule's
            why = burn_in_why(want.value)
            if why is not None:
                self.burn_ins.resume(key, why, since)
            return
        d = self._devices.setdefault(key, _Device(facts))
        rule = next((r for r in self.policy.rules_for(facts) if r.name == want.rule), None)
        if rule is None:  # the rule names are unique across the profiles
            rule = self.policy.rule_named(want.rule)
        if rule is None:  # the rule left the policy: keep the taint under the first rule
            rule = next(
                (r for r in self.policy.rules_for(facts) if r.match.device_matches(facts)), None
            )
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
        self.burn_ins.forget(key)
        if self.degraded.pop(key, None) is not None:
            self.degraded_version += 1

    def burn_in(self, key: DeviceKey, why: str, now: float) -> bool:
        """Start the burn-in gate for ``key`` (``why``: ``BURN_IN_NEW`` or
        ``BURN_IN_REPAIRED``); False when the policy does not burn in for ``why``."""
        return self.burn_ins.start(key, why, now)

    def pending_burn_ins(self, now: float) -> list[DeviceKey]:
        """Burning-in devices whose validation should run now (marked validating):
        those no rule wants a taint for, and not waiting out a retry."""
        ready = set()
        for key in self.burn_ins.devices:
            d = self._devices.get(key)
            if d is not None:
                self._advance(d, now)
            if d is None or (d.tainted_since is None and d.bad_since is None):
                ready.add(key)
        return self.burn_ins.due(now, ready)

    def burn_in_result(self, key: DeviceKey, ok: bool, now: float, detail: str = "") -> bool | None:
        """A burn-in validation's answer; see :meth:`BurnInTracker.result`."""
        return self.burn_ins.result(key, ok, now, detail)

    def _set_degraded(
        self, key: DeviceKey, rule: Rule | None, facts: DeviceFacts, message: str, now: float
    ) -> None:
        old = self.degraded.get(key)
        if rule is None:
            if old is not None:
                del self.degraded[key]
                self.degraded_version += 1
            return
        reason = message[:1024]
        if old is not None and (old.rule, old.reason, old.node) == (rule.name, reason, facts.node):
            return
        since = now if old is None else old.since
        self.degraded[key] = Degraded(rule.name, reason, since, facts.node)
        self.degraded_version += 1

    def clear(self, key: DeviceKey, at: float, now: float) -> bool:
        """An operator cleared ``key`` at ``at`` (``drahealth clear``): its needs-a-human
        mark and counts go, and its recovery starts over (``healthyFor`` from now, then
        ``validate``). True if a mark went."""
        went = self.care.clear(key, at)
        d = self._devices.get(key)
        if d is not None and d.tainted_since is not None and d.healthy_since is not None:
            d.healthy_since, d.validation = max(d.healthy_since, now), "none"
        return went

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
        self._add_burn_ins(out)
        return out

    def _add_burn_ins(self, out: dict[DeviceKey, Want]) -> None:
        """A burning-in device wants the burn-in taint unless a rule wants one as strong."""
        policy = self.policy.burn_in
        if policy is None or not self.burn_ins.devices:
            return
        effect = "None" if self.policy.dry_run else policy.effect
        for key, b in self.burn_ins.devices.items():
            have = out.get(key)
            if have is None or EFFECT_ORDER[have.effect] < EFFECT_ORDER[effect]:
                out[key] = Want(
                    effect, BURN_IN_TAINT_KEY, b.value, BURN_IN_RULE, f"burn-in: {b.why}"
                )

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
        mark = self.care.escalation.needs_human(key)
        if mark is not None:
            return f"needs a human: {mark.why}; tainted until an operator clears it"
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
        retry = self.burn_ins.next_wakeup(now)
        if retry is not None:
            due.append(retry)
        repair = self.care.next_wakeup()
        if repair is not None and repair > now:
            due.append(repair)
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
                self.care.on_taint(_key(d), rule, d.facts.node, d.tainted_since)
            return
        if self._recovered(d, now) and (not self._hook(d) or d.validation == "passed"):
            d.tainted_since = None
            d.validation = "none"
            self.care.on_untaint(_key(d))

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
            and self.care.allows_untaint(_key(d))
        )

    @staticmethod
    def _hook(d: _Device) -> bool:
        v = d.rule.recovery.validate if d.rule is not None else None
        return v is not None and bool(v.exec or v.http)


def _key(d: _Device) -> DeviceKey:
    return DeviceKey(d.facts.driver, d.facts.pool, d.facts.device)


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
        # the node's DRADevicesHealthy condition and node taint (nodeRollup)
        "nodeRollup": explain_rollup(
            policy.node_rollup, health, None if rule is None else rule.action.effect
        ),
    }
    profile = policy.profile_for(facts)
    out["profile"] = (
        None if profile is None else {"name": profile.name, "observeOnly": profile.observe_only}
    )
    out["limits"] = explain_limits(policy, facts)  # the circuit breaker's caps on it
    out["excluded"] = policy.exclude.reason(facts)  # the ownership filter: no action at all
    burn_in = policy.burn_in
    out["burnIn"] = (
        None
        if burn_in is None
        else {
            "appliesTo": sorted(burn_in.applies_to),
            "effect": "None" if policy.dry_run else burn_in.effect,
            "taintKey": BURN_IN_TAINT_KEY,
        }
    )
    if rule is None:
        return out
    action = rule.action
    out["outcome"] = action.outcome
    if action.outcome != "taint":  # ignore: nothing at all; degraded: shown, no taint
        out["rule"] = rule.name
        return out
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
            "evicts": not policy.dry_run
            and not (profile is not None and profile.observe_only)
            and "NoExecute" in effects,
            "evictionMode": policy.eviction.mode,
        }
    )
    out.update(explain_aftercare(policy, rule))  # needsHuman limits and repair
    return out
