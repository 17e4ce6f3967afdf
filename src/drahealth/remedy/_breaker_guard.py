"""The controller's side of the blast-radius circuit breaker: one call per pass.

Owns :class:`BreakerGuard`: it wraps the core's :class:`CircuitBreaker` (the decisions)
with what the controller does about them: the ``breaker`` key of the state ConfigMap
(read back when a leader starts, written when it changes), the operator's ``resume``
request from the control ConfigMap, the metrics
(``drahealth_controller_breaker_tripped{scope}``, ``drahealth_controller_held_taints``,
``drahealth_controller_breaker_trips_total{scope}``), a ``RemediationPaused`` /
``RemediationResumed`` Warning/Normal Event per trip and resume (on the Node for a node's
group, else on the history ConfigMap) and a history line for each.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from drahealth.core import (
    BREAKER_SCOPES,
    BreakerEvent,
    CircuitBreaker,
    DeviceFacts,
    DeviceKey,
    Policy,
    Want,
)
from drahealth.remedy._metrics import ControllerMetrics

__all__ = ["STATE_KEY", "BreakerGuard"]

log = logging.getLogger(__name__)

#: The state ConfigMap's key and the control ConfigMap's key this module owns.
STATE_KEY: Final = "breaker"
RESUME_KEY: Final = "resume"
#: Seconds the window's bookkeeping may wait to be written (a restart within them may
#: count a few recent taints less); trips, resumes and held devices never wait.
STATE_LAG: Final = 10.0

Record = Callable[[str, str, str], None]  # (action, subject, message)
Notify = Callable[[str, str, str, str], None]  # (node or '', type, reason, message)


class BreakerGuard:
    """See the module docstring. ``record`` writes a history line, ``notify`` an Event."""

    def __init__(
        self, policy: Policy, metrics: ControllerMetrics, record: Record, notify: Notify
    ) -> None:
        self.breaker = CircuitBreaker(policy)
        self.metrics = metrics
        self._record = record
        self._notify = notify
        self._started = False
        self._written = -1  # the breaker version last put in the state
        self._urgent = -1
        self._written_at = float("-inf")

    @property
    def enabled(self) -> bool:
        return self.breaker.enabled

    def track(self, key: DeviceKey, facts: DeviceFacts | None) -> None:
        """A device whose slice changed (None: no slice lists it any more)."""
        self.breaker.track(key, facts)

    def apply(
        self,
        wants: dict[DeviceKey, Want],
        *,
        writes: Callable[[DeviceKey, Want], bool],
        facts: Callable[[DeviceKey], DeviceFacts],
        carrying: Callable[[], Iterable[DeviceKey]],
        control: Mapping[str, Any],
        written: Callable[[], Iterable[tuple[DeviceKey, float]]] = tuple,
        state: Any,
        now: float,
        cost: Callable[[DeviceKey, Want], int] | None = None,
    ) -> dict[DeviceKey, Want]:
        """One pass: the wants to carry out (held new taints left out).

        ``control``: the operator's requests by key; ``state``: the controller's state
        keys (``get``/``set``); ``carrying()``: devices carrying the controller's taint,
        and ``written()``: taints written earlier with their unix times (the API's
        record of the window), both asked on the first pass only, before anything is
        written; ``now``: unix seconds; ``cost(key, want)``: the devices a taint makes
        unusable (a node taint: its node's), what the limits count.
        """
        b = self.breaker
        if self._started and not b.enabled:
            return wants
        if not self._started:
            self._started = True
            saved = state.get(STATE_KEY)
            if b.enabled:
                b.restore(saved, now)
                b.recall(written(), now)  # what the state may not have had time to say
                b.carrying(carrying())
            elif isinstance(saved, Mapping) and (saved.get("tripped") or saved.get("held")):
                # the policy has no limits any more: nothing is held
                state.set(STATE_KEY, {"tripped": [], "held": [], "heldCount": 0, "admitted": []})
        if not b.enabled:
            return wants
        events = b.resume(control.get(RESUME_KEY), now)
        out, more = b.admit(wants, writes, facts, now, cost)
        for event in [*events, *more]:
            self._report(event)
        # trips, resumes and held devices are written at once; the window's bookkeeping
        # alone (a new taint under every limit) at most every STATE_LAG seconds, so a
        # pass that taints costs no extra API write
        if b.urgent != self._urgent or (
            b.version != self._written and now - self._written_at >= STATE_LAG
        ):
            self._written, self._urgent, self._written_at = b.version, b.urgent, now
            state.set(STATE_KEY, b.state())
            self._gauges()
        return out

    def _gauges(self) -> None:
        b = self.breaker
        per = dict.fromkeys(BREAKER_SCOPES, 0)
        for group in b.tripped:
            per[group.scope] = per.get(group.scope, 0) + 1
        for scope, n in per.items():
            self.metrics.breaker_tripped.labels(scope).set(n)
        self.metrics.held_taints.set(len(b.held))

    def _report(self, event: BreakerEvent) -> None:
        message = event.message()
        tripped = event.kind == "tripped"
        if tripped:
            self.metrics.breaker_trips.labels(event.group.scope).inc()
            log.warning("%s", message)
        else:
            log.info("%s", message)
        self._record(
            "breaker-tripped" if tripped else "breaker-resumed", event.group.describe(), message
        )
        node = event.group.name if event.group.scope == "node" else ""
        self._notify(
            node,
            "Warning" if tripped else "Normal",
            "RemediationPaused" if tripped else "RemediationResumed",
            message,
        )
