"""Repeated-fault escalation: when a device "needs a human".

Owns :class:`Escalation` (the policy: ``episodes`` bad episodes or ``failed_repairs``
failed repairs of one device within ``window`` seconds), :class:`NeedsHuman` (the mark)
and :class:`EscalationTracker`, which counts, per device, the episodes (a bad period that
led to a controller taint) and the failed repairs within the window, and marks a device
that reaches either limit. A marked device keeps its taint whatever its health (the
engine asks :meth:`EscalationTracker.needs_human` before an untaint) until an operator
clears it (:meth:`EscalationTracker.clear`), which also restarts its counts.

Sans-I/O: times are the caller's clock (the engine's), passed in. :meth:`export` and
:meth:`restore` turn the state into plain data on the caller's wall clock, so the
controller can keep it in the cluster and a restart resumes it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from drahealth.core._health import DeviceKey

__all__ = [
    "MAX_COUNTED",
    "MAX_NOTICES",
    "Escalation",
    "EscalationTracker",
    "NeedsHuman",
    "duration_text",
]

#: Episodes (and failed repairs) remembered per device: more never matter for a limit.
MAX_COUNTED: Final = 64
#: Marks waiting to be reported (the controller takes them every pass).
MAX_NOTICES: Final = 10_000


def duration_text(seconds: float) -> str:
    """``86400`` -> ``24h``, ``90`` -> ``90s``, ``300`` -> ``5m``: how a policy writes it."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


@dataclass(frozen=True, slots=True)
class Escalation:
    """``episodes`` bad episodes, or ``failed_repairs`` failed repairs, of one device
    within ``window`` seconds mark it "needs a human" (0 turns that limit off)."""

    episodes: int = 3
    window: float = 86400.0
    failed_repairs: int = 2

    @property
    def enabled(self) -> bool:
        return self.episodes > 0 or self.failed_repairs > 0


@dataclass(frozen=True, slots=True)
class NeedsHuman:
    """A device's mark: since when (caller's clock), why, under which rule, on which node."""

    since: float
    why: str
    rule: str
    node: str


class EscalationTracker:
    """See the module docstring."""

    def __init__(self) -> None:
        self._episodes: dict[DeviceKey, deque[float]] = {}
        self._failed: dict[DeviceKey, deque[float]] = {}
        self.marked: dict[DeviceKey, NeedsHuman] = {}
        self._notices: deque[tuple[DeviceKey, NeedsHuman]] = deque(maxlen=MAX_NOTICES)
        #: set on every change; the controller writes its state key when set
        self.changed = False

    # -- input -------------------------------------------------------------------

    def episode(
        self, key: DeviceKey, policy: Escalation, now: float, rule: str, node: str
    ) -> NeedsHuman | None:
        """A new bad episode of ``key`` (its taint starts now); the mark if it is one too many."""
        count = self._count(self._episodes, key, policy.window, now)
        self.changed = True
        if policy.episodes and count >= policy.episodes:
            why = f"{count} bad episodes within {duration_text(policy.window)}"
            return self._mark(key, NeedsHuman(now, why, rule, node))
        return None

    def repair_failed(
        self, key: DeviceKey, policy: Escalation, now: float, rule: str, node: str
    ) -> NeedsHuman | None:
        """A repair of ``key`` failed (all its attempts); the mark if that is the limit."""
        count = self._count(self._failed, key, policy.window, now)
        self.changed = True
        if policy.failed_repairs and count >= policy.failed_repairs:
            why = f"{count} failed repairs within {duration_text(policy.window)}"
            return self._mark(key, NeedsHuman(now, why, rule, node))
        return None

    def clear(self, key: DeviceKey, at: float) -> bool:
        """An operator cleared ``key`` at ``at``: its mark (if set before ``at``) and the
        episodes and failed repairs counted before ``at`` go. True if a mark went."""
        for table in (self._episodes, self._failed):
            q = table.get(key)
            if q is not None:
                while q and q[0] <= at:
                    q.popleft()
                    self.changed = True
                if not q:
                    del table[key]
        mark = self.marked.get(key)
        if mark is None or mark.since > at:
            return False
        del self.marked[key]
        self.changed = True
        return True

    # -- output ------------------------------------------------------------------

    def needs_human(self, key: DeviceKey) -> NeedsHuman | None:
        return self.marked.get(key)

    def counts(self, key: DeviceKey) -> tuple[int, int]:
        """(episodes, failed repairs) of ``key`` remembered now."""
        return len(self._episodes.get(key, ())), len(self._failed.get(key, ()))

    def take_notices(self) -> list[tuple[DeviceKey, NeedsHuman]]:
        """Marks set since the last call (for Events and history), oldest first."""
        out = list(self._notices)
        self._notices.clear()
        return out

    def export(
        self, wall: Callable[[float], float], now: float, window: float
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(``needsHuman``, ``episodes``) as plain data, times through ``wall``; counts
        older than ``window`` (the longest window of any rule) are dropped first."""
        for table in (self._episodes, self._failed):
            for key in list(table):
                q = table[key]
                while q and q[0] <= now - window:
                    q.popleft()
                if not q:
                    del table[key]
        needs = {
            str(k): {"since": wall(m.since), "why": m.why, "rule": m.rule, "node": m.node}
            for k, m in sorted(self.marked.items())
        }
        counted: dict[str, Any] = {}
        for name, table in (("episodes", self._episodes), ("failedRepairs", self._failed)):
            for k, q in sorted(table.items()):
                counted.setdefault(str(k), {})[name] = [wall(t) for t in q]
        return needs, counted

    def restore(
        self,
        needs: Mapping[str, Any],
        counted: Mapping[str, Any],
        clock: Callable[[Any], float | None],
    ) -> list[str]:
        """Load what :meth:`export` gave (times through ``clock``, None: unreadable).
        Returns one problem per entry left out, naming it."""
        problems: list[str] = []
        for name, value in needs.items():
            key = _key(name)
            since = clock(value.get("since")) if isinstance(value, Mapping) else None
            if key is None or since is None or not isinstance(value, Mapping):
                problems.append(f"needsHuman: {name!r}: not a device with a time: left out")
                continue
            self.marked[key] = NeedsHuman(
                since, str(value.get("why", "")), str(value.get("rule", "")),
                str(value.get("node", "")),
            )  # fmt: skip
        for name, value in counted.items():
            key = _key(name)
            if key is None or not isinstance(value, Mapping):
                problems.append(f"episodes: {name!r}: not a device: left out")
                continue
            for field, table in (("episodes", self._episodes), ("failedRepairs", self._failed)):
                times = value.get(field) or []
                parsed = [clock(t) for t in times] if isinstance(times, list) else [None]
                good = sorted(t for t in parsed if t is not None)
                if len(good) != len(parsed):
                    problems.append(f"episodes: {name}.{field}: unreadable times left out")
                if good:
                    table[key] = deque(good[-MAX_COUNTED:], maxlen=MAX_COUNTED)
        return problems

    # -- internals ---------------------------------------------------------------

    @staticmethod
    def _count(
        table: dict[DeviceKey, deque[float]], key: DeviceKey, window: float, now: float
    ) -> int:
        q = table.get(key)
        if q is None:
            q = table[key] = deque(maxlen=MAX_COUNTED)
        q.append(now)
        while q and q[0] <= now - window:
            q.popleft()
        return len(q)

    def _mark(self, key: DeviceKey, mark: NeedsHuman) -> NeedsHuman | None:
        if key in self.marked:
            return None  # already marked: the first reason stays
        self.marked[key] = mark
        self._notices.append((key, mark))
        return mark


def _key(name: str) -> DeviceKey | None:
    try:
        return DeviceKey.parse(name)
    except ValueError:
        return None
