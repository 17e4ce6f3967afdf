"""The blast-radius circuit breaker: new taints over a policy limit are held, not written.

Owns :class:`CircuitBreaker`, its groups (:class:`BreakerGroup`), trips (:class:`BreakerTrip`), held
devices (:class:`HeldTaint`), what it reports (:class:`BreakerEvent`), its state value (the
``breaker`` key of the controller's state ConfigMap) and :func:`explain_limits`.
Sans-I/O: the controller passes the engine's wants, the device facts and the time (unix
seconds) in, and writes what comes out.

Counting. A device is *newly tainted* when the controller is about to write a taint
(any effect but ``None``) for a device that does not carry one already; a device that
keeps its taint (an effect change, an escalation) is not counted again. Each limit caps
the devices newly tainted within the limits' sliding ``window`` in one group: the
whole cluster, each driver, each pool, each node, and, for a profile with limits of its
own, the profile's devices (and its drivers, pools and nodes). A percentage is of the
devices the ResourceSlices list in that group, rounded down, never less than 1. A
device counts against the policy's limits and, if its profile has limits, against
those too: a profile can tighten the policy's limits, never loosen them.

Tripping. Devices are considered in a fixed order (by name). When admitting one more
would take any of its groups over its limit, that group *trips*; while a group is
tripped every new taint of a device in it is *held*: not written, listed, reported.
Taints already written stay, and recovery (untaint) is never held.

Resuming. ``resume: auto``: a tripped group resumes by itself once the taints it
holds plus those counted in its window fit under its limit (the mass condition
cleared: devices recovered, or the window slid past). ``resume: manual`` (the default):
it stays tripped until an operator resume (:meth:`CircuitBreaker.resume`), which admits
every taint held at that moment (the operator looked at them) and resumes every group;
taints after that are counted as usual.

Restart. :meth:`CircuitBreaker.state` is plain JSON; :meth:`CircuitBreaker.restore`
takes it back, so a new leader resumes the tripped groups, the held devices and the
window, and :meth:`CircuitBreaker.carrying` tells it which devices already carry the
controller's taint.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from drahealth.core._health import DeviceKey
from drahealth.core._limits import Limit, Limits
from drahealth.core._policy import DeviceFacts, Policy, Want

__all__ = [
    "BREAKER_SCOPES",
    "BreakerEvent",
    "BreakerGroup",
    "BreakerTrip",
    "CircuitBreaker",
    "HeldTaint",
    "explain_limits",
]

#: The scopes a group may have, as the state and the metrics name them.
BREAKER_SCOPES: Final = ("cluster", "profile", "driver", "pool", "node")
#: HeldTaint devices listed in the state value (all are counted in ``heldCount``).
MAX_HELD_LISTED: Final = 300
#: Characters of a held device's reason kept in the state value.
MAX_REASON: Final = 160
#: Admissions kept in the state value (the newest), for the window after a restart.
MAX_ADMITTED_KEPT: Final = 1500
#: The most devices one admission counts for (a node has a few dozen at most).
MAX_WEIGHT: Final = 4096
#: Seconds a remembered time may lie ahead of this controller's clock (the last leader's
#: wall clock, or the API server's, may run a little ahead): such a time counts as now;
#: a time further ahead was not written by a controller and is left out.
MAX_CLOCK_SKEW: Final = 300.0


@dataclass(frozen=True, slots=True, order=True)
class BreakerGroup:
    """Devices one limit caps: ``scope`` and ``name`` ('' for the cluster; a driver;
    ``driver/pool``; a node; a profile's name), under ``profile``'s limits ('' for the
    policy's own)."""

    scope: str
    name: str
    profile: str = ""

    def describe(self) -> str:
        where = "cluster" if self.scope == "cluster" else f"{self.scope} {self.name}"
        return where + (f" (profile {self.profile})" if self.profile else "")


@dataclass(slots=True)
class BreakerTrip:
    """A tripped group: its limit as written, the max it means now, the count in the
    window when it was last looked at, and when it tripped (unix seconds)."""

    group: BreakerGroup
    limit: Limit
    window: float
    resume: str
    since: float
    max: int = 0
    count: int = 0


@dataclass(slots=True)
class HeldTaint:
    """A device whose new taint is held: what it wants and since when."""

    rule: str
    effect: str
    reason: str
    since: float
    groups: tuple[BreakerGroup, ...] = ()


@dataclass(frozen=True, slots=True)
class BreakerEvent:
    """A group tripped or resumed, for an Event, a history line and the metrics."""

    kind: Literal["tripped", "resumed"]
    group: BreakerGroup
    limit: str
    max: int
    count: int
    window: float
    resume: str
    held: int
    by: str = ""  # resumed: "auto" or who asked

    def message(self) -> str:
        window = _duration(self.window)
        if self.kind == "tripped":
            how = (
                "run `drahealth resume` to write the held taints"
                if self.resume == "manual"
                else "it resumes by itself once the held taints fit under the limit "
                "(or run `drahealth resume`)"
            )
            return (
                f"circuit breaker tripped: {self.group.describe()} limit {self.limit} "
                f"(at most {self.max} new taints within {window}) reached with {self.count}; "
                f"{self.held} new taint(s) held, not written; taints already written stay "
                f"and untaints go on; {how}"
            )
        who = (
            "automatically (the held taints fit under the limit)"
            if self.by == "auto"
            else (f"by {self.by}")
        )
        return (
            f"circuit breaker resumed {who}: {self.group.describe()} limit {self.limit} "
            f"(at most {self.max} within {window}); {self.held} held taint(s) released"
        )


@dataclass(slots=True, eq=False)
class _Admission:
    at: float
    groups: tuple[BreakerGroup, ...] = field(default_factory=tuple)
    live: set[BreakerGroup] = field(default_factory=set)  # groups whose window holds it
    #: devices the taint made unusable: 1 for a device's own taint, every device of the
    #: node for a node taint or cordon
    weight: int = 1


class CircuitBreaker:
    """See the module docstring. Disabled (everything passes) without any limits."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._limits: dict[str, Limits] = {}
        if policy.limits is not None and policy.limits.by_scope():
            self._limits[""] = policy.limits
        for p in policy.profiles:
            if p.limits is not None and p.limits.by_scope():
                self._limits[p.name] = p.limits
        self.enabled = bool(self._limits)
        self._horizon = max((lim.window for lim in self._limits.values()), default=0.0)
        self._groups: dict[DeviceKey, tuple[BreakerGroup, ...]] = {}  # tracked devices
        self._sizes: Counter[BreakerGroup] = Counter()
        self._admitted: dict[DeviceKey, _Admission] = {}
        self._passed: set[DeviceKey] = set()  # carrying the controller's taint
        self._prune_at = float("inf")  # when the oldest admission leaves every window
        self._live: Counter[BreakerGroup] = Counter()  # admissions within each window
        self._queues: dict[str, deque[tuple[float, _Admission]]] = {
            o: deque() for o in self._limits
        }
        self.tripped: dict[BreakerGroup, BreakerTrip] = {}
        self.held: dict[DeviceKey, HeldTaint] = {}
        self.last_resume: dict[str, str] | None = None
        #: counts changes of what :meth:`state` answers; ``urgent`` only those an operator
        #: must see at once (trips, resumes, held devices), not the window's bookkeeping
        self.version = 0
        self.urgent = 0

    def _bump(self) -> None:
        self.version += 1
        self.urgent += 1

    # -- groups ----------------------------------------------------------------------

    def groups_for(self, facts: DeviceFacts) -> tuple[BreakerGroup, ...]:
        """The groups whose limits count the device."""
        if not self.enabled:
            return ()
        out: list[BreakerGroup] = []
        top = self._limits.get("")
        if top is not None:
            out += self._scoped(top, facts, "")
        if len(self._limits) > (top is not None):
            profile = self.policy.profile_for(facts)
            if profile is not None and profile.name in self._limits:
                out += self._scoped(self._limits[profile.name], facts, profile.name)
        return tuple(out)

    @staticmethod
    def _scoped(limits: Limits, facts: DeviceFacts, profile: str) -> list[BreakerGroup]:
        out = []
        for scope, _ in limits.by_scope():
            if scope == "cluster":
                out.append(
                    BreakerGroup("profile", profile, profile)
                    if profile
                    else BreakerGroup("cluster", "")
                )
            elif scope == "driver":
                out.append(BreakerGroup("driver", facts.driver, profile))
            elif scope == "pool":
                out.append(BreakerGroup("pool", f"{facts.driver}/{facts.pool}", profile))
            elif facts.node:  # a device on no node is in no node's group
                out.append(BreakerGroup("node", facts.node, profile))
        return out

    def _limit(self, group: BreakerGroup) -> tuple[Limit, Limits]:
        limits = self._limits[group.profile]
        scope = "cluster" if group.scope == "profile" else group.scope
        limit = dict(limits.by_scope())[scope]
        return limit, limits

    def _valid(self, group: BreakerGroup) -> bool:
        limits = self._limits.get(group.profile)
        if limits is None or group.scope not in BREAKER_SCOPES:
            return False
        scope = "cluster" if group.scope == "profile" else group.scope
        if (group.scope == "profile") != bool(group.profile):
            return False
        return scope in dict(limits.by_scope())

    def max_for(self, group: BreakerGroup) -> int:
        """The most new taints the group allows within its window, with its size now."""
        return self._limit(group)[0].max_for(self._sizes[group])

    def size(self, group: BreakerGroup) -> int:
        """Devices the ResourceSlices list in the group."""
        return self._sizes[group]

    # -- input -----------------------------------------------------------------------

    def track(self, key: DeviceKey, facts: DeviceFacts | None) -> None:
        """A device a ResourceSlice lists (``facts``) or no longer lists (None): the
        group sizes percentages are taken of."""
        if not self.enabled:
            return
        new = () if facts is None else self.groups_for(facts)
        old = self._groups.get(key, ())
        if new == old:
            return
        for g in old:
            self._sizes[g] -= 1
            if self._sizes[g] <= 0:
                del self._sizes[g]
        for g in new:
            self._sizes[g] += 1
        if new:
            self._groups[key] = new
        else:
            self._groups.pop(key, None)

    def carrying(self, keys: Iterable[DeviceKey]) -> None:
        """Devices that carry the controller's taint already (found at start)."""
        self._passed.update(keys)

    def recall(self, written: Iterable[tuple[DeviceKey, float]], now: float) -> None:
        """Taints written earlier (device, unix time), as the API shows them to a new
        leader: the controller's rules and node rows with their creation times, the
        history's taint lines. Each one inside the window counts in it (a device once,
        at its latest time), so a leader change never resets the window, whatever the
        last leader had time to write to the state."""
        if not self.enabled:
            return
        latest: dict[DeviceKey, float] = {}
        for key, raw in written:
            at = self._window_time(raw, now)
            if at is not None and at > latest.get(key, float("-inf")):
                latest[key] = at
        for key, at in sorted(latest.items(), key=lambda kv: kv[1]):
            known = self._admitted.get(key)
            if known is None or known.at < at:
                # a later time moves the admission, it keeps what it counted
                weight = known.weight if known is not None else 1
                self._admit(key, at, self._restored_groups(key), weight)
        for owner, queue in self._queues.items():  # the window's queues stay in time order
            self._queues[owner] = deque(sorted(queue, key=lambda entry: entry[0]))
        self._bump()

    def resume(self, request: object, now: float) -> list[BreakerEvent]:
        """An operator's resume request (the control key ``resume``: ``{"at", "by"}``).

        A request not seen before admits every held taint and resumes every tripped
        group; one already handled (same ``at``) does nothing, and one made while
        nothing is tripped only is remembered (it approves no later trip).
        """
        if not self.enabled or not isinstance(request, Mapping):
            return []
        at, by = str(request.get("at") or ""), str(request.get("by") or "an operator")
        if not at or (self.last_resume or {}).get("at") == at:
            return []
        self.last_resume = {"at": at, "by": by}
        self._bump()
        events = [
            self._event("resumed", trip, len(self.held), by, trip.count)
            for _, trip in sorted(self.tripped.items())
        ]
        for key, held in self.held.items():
            self._admit(key, now, held.groups)
        self.held.clear()
        self.tripped.clear()
        return events

    # -- one pass --------------------------------------------------------------------

    def admit(
        self,
        wants: Mapping[DeviceKey, Want],
        writes: Callable[[DeviceKey, Want], bool],
        facts: Callable[[DeviceKey], DeviceFacts],
        now: float,
        cost: Callable[[DeviceKey, Want], int] | None = None,
    ) -> tuple[dict[DeviceKey, Want], list[BreakerEvent]]:
        """The wants to carry out now (the held ones left out), and what tripped or
        resumed. ``writes(key, want)``: whether carrying ``want`` out writes a taint
        (report-only and effect ``None`` count for nothing and are never held);
        ``cost(key, want)``: how many devices that taint makes unusable (default 1; a
        node taint: the node's devices not fenced yet), which is what the limits count."""
        if not self.enabled:
            return dict(wants), []
        candidates: dict[DeviceKey, Want] = {}
        passed: set[DeviceKey] = set()
        for key, want in wants.items():
            if not writes(key, want):
                continue
            if key in self._passed:
                passed.add(key)
            else:
                candidates[key] = want
        self._passed = passed  # a device whose taint went (or will go) is new again
        for key in [k for k in self.held if k not in candidates]:
            del self.held[key]  # it recovered: nothing to hold
            self._bump()
        if not candidates and not self.tripped:
            self._prune(now)
            return dict(wants), []
        self._prune(now)
        counts = self._counts(now)
        groups = {k: self._device_groups(k, facts) for k in candidates}
        events: list[BreakerEvent] = []
        held_in: Counter[BreakerGroup] = Counter(
            g for k in candidates for g in groups[k] if g in self.tripped
        )
        for group, trip in sorted(self.tripped.items()):
            if trip.resume == "auto" and held_in[group] + counts[group] <= self.max_for(group):
                del self.tripped[group]
                self._bump()
                events.append(self._event("resumed", trip, held_in[group], "auto", counts[group]))
        out = dict(wants)
        tripped_now: list[BreakerGroup] = []
        for key in sorted(candidates):
            want, gs = candidates[key], groups[key]
            weight = min(MAX_WEIGHT, max(1, cost(key, want))) if cost is not None else 1
            hold = any(g in self.tripped for g in gs)
            if not hold:
                over = [g for g in gs if counts[g] + weight > self.max_for(g)]
                for g in over:
                    limit, limits = self._limit(g)
                    self.tripped[g] = BreakerTrip(g, limit, limits.window, limits.resume, now)
                    tripped_now.append(g)
                hold = bool(over)
            if hold:
                self._hold(key, want, gs, now)
                del out[key]
                continue
            if self.held.pop(key, None) is not None:
                self._bump()
            self._admit(key, now, gs, weight)  # counts (the live counter) goes up with it
        for group, trip in self.tripped.items():
            mx, count = self.max_for(group), counts[group]
            if (trip.max, trip.count) != (mx, count):
                trip.max, trip.count = mx, count
                self.version += 1
        if tripped_now:
            self._bump()
            held_per: Counter[BreakerGroup] = Counter(
                g for h in self.held.values() for g in h.groups
            )
            for g in tripped_now:
                trip = self.tripped[g]
                events.append(self._event("tripped", trip, held_per[g], "", trip.count))
        return out, events

    def _hold(
        self, key: DeviceKey, want: Want, groups: tuple[BreakerGroup, ...], now: float
    ) -> None:
        old = self.held.get(key)
        if old is not None and (old.rule, old.effect, old.reason, old.groups) == (
            want.rule, want.effect, want.reason, groups,
        ):  # fmt: skip
            return
        since = now if old is None else old.since
        self.held[key] = HeldTaint(want.rule, want.effect, want.reason, since, groups)
        self._bump()

    def _event(
        self, kind: Literal["tripped", "resumed"], trip: BreakerTrip, held: int, by: str, count: int
    ) -> BreakerEvent:
        mx = self.max_for(trip.group) if self._valid(trip.group) else trip.max
        return BreakerEvent(
            kind, trip.group, trip.limit.text, mx, count, trip.window, trip.resume, held, by
        )

    def _device_groups(
        self, key: DeviceKey, facts: Callable[[DeviceKey], DeviceFacts]
    ) -> tuple[BreakerGroup, ...]:
        known = self._groups.get(key)
        return known if known is not None else self.groups_for(facts(key))

    def _window(self, group: BreakerGroup) -> float:
        return self._limits[group.profile].window

    def _counts(self, now: float) -> Counter[BreakerGroup]:
        """Admissions within each group's window (kept up to date, not recounted: a
        pass costs O(admissions that left a window since the last one))."""
        for owner, queue in self._queues.items():
            window = self._limits[owner].window
            while queue and now - queue[0][0] >= window:
                _, a = queue.popleft()
                for g in [g for g in a.live if g.profile == owner]:
                    a.live.discard(g)
                    self._live[g] -= a.weight
                    if self._live[g] <= 0:
                        del self._live[g]
        return self._live

    def _prune(self, now: float) -> None:
        """Forget admissions older than every window (only when one fell due)."""
        if now < self._prune_at:
            return
        old = [k for k, a in self._admitted.items() if now - a.at >= self._horizon]
        for k in old:
            del self._admitted[k]
        if old:
            self.version += 1
        oldest = min((a.at for a in self._admitted.values()), default=None)
        self._prune_at = float("inf") if oldest is None else oldest + self._horizon

    def _admit(
        self, key: DeviceKey, at: float, groups: tuple[BreakerGroup, ...], weight: int = 1
    ) -> None:
        old = self._admitted.get(key)
        if old is not None:  # a device counts once: its earlier admission no longer does
            for g in old.live:
                self._live[g] -= old.weight
                if self._live[g] <= 0:
                    del self._live[g]
            old.live.clear()
        a = self._admitted[key] = _Admission(at, groups, set(groups), weight)
        for g in groups:
            self._live[g] += weight
        for owner in {g.profile for g in groups}:
            self._queues[owner].append((at, a))
        self._passed.add(key)
        self._prune_at = min(self._prune_at, at + self._horizon)
        self.version += 1

    # -- state -----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The ``breaker`` state value (plain JSON)."""
        held = sorted(self.held.items())
        admitted = sorted(self._admitted.items(), key=lambda kv: kv[1].at)[-MAX_ADMITTED_KEPT:]
        return {
            "tripped": [
                {
                    "scope": t.group.scope,
                    "group": t.group.name,
                    **({"profile": t.group.profile} if t.group.profile else {}),
                    "limit": t.limit.text,
                    "max": t.max,
                    "count": t.count,
                    "window": t.window,
                    "since": _rfc3339(t.since),
                    "resume": t.resume,
                }
                for _, t in sorted(self.tripped.items())
            ],
            "held": [
                {
                    "device": str(k),
                    "rule": h.rule,
                    "effect": h.effect,
                    "since": _rfc3339(h.since),
                    "reason": h.reason[:MAX_REASON],
                }
                for k, h in held[:MAX_HELD_LISTED]
            ],
            "heldCount": len(held),
            "admitted": [
                [str(k), round(a.at, 3), *([a.weight] if a.weight != 1 else [])]
                for k, a in admitted
            ],
            "lastResume": self.last_resume,
        }

    def restore(self, value: object, now: float) -> None:
        """Take back a :meth:`state` value (a new leader, a restart). Entries that do
        not parse, or whose group the policy no longer limits, are left out."""
        if not self.enabled or not isinstance(value, Mapping):
            return
        for row in _rows(value.get("tripped")):
            group = BreakerGroup(
                str(row.get("scope", "")), str(row.get("group", "")), str(row.get("profile", ""))
            )
            if not self._valid(group):
                continue
            limit, limits = self._limit(group)
            since = _parse_time(row.get("since"), now)
            count = row.get("count")
            self.tripped[group] = BreakerTrip(
                group, limit, limits.window, limits.resume, since, self.max_for(group),
                count if isinstance(count, int) else 0,
            )  # fmt: skip
        for row in _rows(value.get("held")):
            try:
                key = DeviceKey.parse(str(row.get("device", "")))
            except ValueError:
                continue
            self.held[key] = HeldTaint(
                str(row.get("rule", "")),
                str(row.get("effect", "")),
                str(row.get("reason", "")),
                _parse_time(row.get("since"), now),
                self._restored_groups(key),
            )
        admitted = value.get("admitted")
        rows = [i for i in admitted if isinstance(i, list)] if isinstance(admitted, list) else []
        rows.sort(key=lambda i: i[1] if len(i) in (2, 3) and isinstance(i[1], int | float) else 0)
        for item in rows:
            if not (isinstance(item, list) and len(item) in (2, 3)):
                continue
            text, raw = item[0], item[1]
            weight = item[2] if len(item) == 3 else 1
            if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
                weight = 1  # not a count a controller wrote: the device alone
            at = self._window_time(raw, now)
            if at is None:
                continue
            try:
                key = DeviceKey.parse(str(text))
            except ValueError:
                continue
            self._admit(key, at, self._restored_groups(key), min(weight, MAX_WEIGHT))
        last = value.get("lastResume")
        if isinstance(last, Mapping) and isinstance(last.get("at"), str):
            self.last_resume = {"at": last["at"], "by": str(last.get("by", ""))}
        self._bump()

    def _window_time(self, at: object, now: float) -> float | None:
        """A remembered taint's unix time as the window counts it, or None when it is
        outside the window or no time a controller wrote: not a finite number, or more
        than :data:`MAX_CLOCK_SKEW` ahead of ``now`` (a nearer future time counts as
        ``now``). So an edited "year 9999" never holds the window for good, and a time
        in the future never makes every new leader count it again."""
        if not isinstance(at, int | float) or isinstance(at, bool):
            return None
        try:
            t = float(at)
        except OverflowError:  # an integer no float holds: no time a controller wrote
            return None
        if not math.isfinite(t) or t > now + MAX_CLOCK_SKEW:
            return None
        t = min(t, now)
        return t if now - t < self._horizon else None

    def _restored_groups(self, key: DeviceKey) -> tuple[BreakerGroup, ...]:
        known = self._groups.get(key)
        if known is not None:
            return known
        return self.groups_for(DeviceFacts(key.driver, key.pool, key.device))


def explain_limits(policy: Policy, facts: DeviceFacts) -> list[dict[str, Any]]:
    """The limits that cap new taints of the device (for ``drahealth policy check``):
    scope, group, limit as written, window and resume mode, the profile's first."""
    breaker = CircuitBreaker(policy)
    if not facts.node:  # a policy check names no node: show the node's limit anyway
        facts = DeviceFacts(facts.driver, facts.pool, facts.device, "(its node)", facts.attributes)
    out = []
    for g in breaker.groups_for(facts):
        limit, limits = breaker._limit(g)
        out.append(
            {
                "scope": g.scope,
                "group": g.name,
                "profile": g.profile or None,
                "limit": limit.text,
                "windowSeconds": limits.window,
                "resume": limits.resume,
            }
        )
    return out


def _rows(value: object) -> list[Mapping[str, Any]]:
    return [r for r in value if isinstance(r, Mapping)] if isinstance(value, list) else []


def _rfc3339(when: float) -> str:
    return dt.datetime.fromtimestamp(when, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: object, default: float) -> float:
    if not isinstance(value, str):
        return default
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return default
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"
