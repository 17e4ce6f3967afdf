"""The remediation controller's state in the views: reading it, and its text for a terminal.

Owns :func:`read_remediation_state` (one ``get`` of the ConfigMap
``drahealth-remediation-state`` in the controller's namespace, decoded by
:func:`drahealth.core.parse_state_data`), :func:`remediation_lines` (the "Remediation"
block of ``drahealth status``: the circuit breaker, devices that need a human, operator
holds, degraded devices, burn-in and repairs, each list cut to ``limit`` lines) and
:func:`history_line` (what the controller holds of one device now, for ``history``).

No ConfigMap means nothing to show (no controller, or one that predates it); a reader
without access to it gets one note and the rest of the view.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any, Final

from lightkube import ApiError, Client
from lightkube.resources.core_v1 import ConfigMap

from drahealth.cli._output import human_age
from drahealth.core import RemediationState, parse_rfc3339, parse_state_data
from drahealth.remedy import STATE_CONFIGMAP

__all__ = [
    "history_line",
    "read_remediation_state",
    "remediation_lines",
]

#: Lines shown per list of the block (the rest are counted).
DEFAULT_LIMIT: Final = 20


def read_remediation_state(
    client: Client, namespace: str, note: Callable[[str], None]
) -> RemediationState:
    """The controller's state in ``namespace``; empty when there is none or no access."""
    try:
        cm = client.get(ConfigMap, STATE_CONFIGMAP, namespace=namespace)
    except ApiError as exc:
        if exc.status.code == 404:
            return RemediationState()
        if exc.status.code != 403:
            raise
        note(
            f"no access to configmap {namespace}/{STATE_CONFIGMAP} ({exc.status.message}): "
            "remediation state not shown"
        )
        return RemediationState()
    return parse_state_data(cm.data)


def _duration(seconds: float) -> str:
    """A policy window (``1h``, ``24h`` as a policy writes it: its largest unit)."""
    seconds = int(abs(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _when(stamp: str, now: float) -> str:
    """``2030-01-01T00:00:00Z (5m ago)``; a stamp that is not RFC 3339 as written."""
    if not stamp:
        return "unknown time"
    at = parse_rfc3339(stamp)
    if at is None:
        return stamp
    shown = datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    delta = now - at
    age = human_age(abs(delta))  # kubectl's spelling, as the tables show ages
    return f"{shown} ({age} ago)" if delta >= 0 else f"{shown} (in {age})"


def _breaker_lines(state: RemediationState, now: float, limit: int) -> list[str]:
    if not state.tripped:
        return ["circuit breaker: closed"]
    held = state.total("breakerHeld") or len(state.held)
    taints = f"{held} taint{'' if held == 1 else 's'} held"
    lines = []
    for trip in state.tripped[:limit]:
        scope = (
            trip.scope
            if trip.scope == "cluster" or not trip.group
            else f"{trip.scope} {trip.group}"
        )
        size = (
            f" = {trip.max} devices" if trip.max is not None and trip.limit != str(trip.max) else ""
        )
        counted = ""
        if trip.count is not None:
            counted = f" ({trip.count}" + (
                f" within {_duration(trip.window)})" if trip.window else ")"
            )
        if trip.resume == "auto":
            resume = "resumes when the count falls under the limit, or run `drahealth resume`"
        else:
            resume = "run `drahealth resume`"
        lines.append(
            f"PAUSED: {scope} limit {trip.limit or '?'}{size} reached{counted} at "
            f"{_when(trip.since, now)}; {taints}; {resume}"
        )
    lines += _more(len(state.tripped), limit, "limits")
    if state.held:
        lines.append(f"held taints ({held}), not written:")
        for h in state.held[:limit]:
            rule = f" (rule {h.rule})" if h.rule else ""
            lines.append(
                f"  {h.device} {h.effect or 'taint'}{rule} since {_when(h.since, now)}: "
                f"{h.reason or '-'}"
            )
        lines += _more(held, limit, "held taints")
    return lines


def _more(total: int, limit: int, what: str) -> list[str]:
    return [f"  ... and {total - limit} more {what} (-o json lists them)"] if total > limit else []


def remediation_lines(state: RemediationState, now: float, limit: int = DEFAULT_LIMIT) -> list[str]:
    """The "Remediation" block of ``drahealth status`` (empty when there is no state)."""
    if not state.present:
        return []
    lines = ["Remediation:"]
    body = _breaker_lines(state, now, limit)

    def section(title: str, records: Sequence[Any], key: str, line: Callable[[Any], str]) -> None:
        if not records:
            return
        total = state.total(key) or len(records)
        name, _, hint = title.partition(": ")
        body.append(f"{name} ({total}):" + (f" {hint}" if hint else ""))
        body.extend(f"  {line(r)}" for r in records[:limit])
        body.extend(_more(total, limit, "devices"))

    def node(r: Any) -> str:
        return f" on {r.node}" if r.node else ""

    def rule(r: Any) -> str:
        return f" (rule {r.rule})" if r.rule else ""

    section(
        "needs a human: fix the device, then run `drahealth clear DEVICE`",
        state.needs_human,
        "needsHuman",
        lambda r: (
            f"NEEDS-HUMAN {r.device}{node(r)} since {_when(r.since, now)}: "
            f"{r.why or 'no reason given'}{rule(r)}; clear: drahealth clear {r.device}"
        ),
    )
    section(
        "operator holds: not tainted again until then",
        state.holds,
        "holds",
        lambda r: (
            f"HELD {r.device} until {_when(r.until, now)}"
            + (" (expired)" if r.expired(now) else "")
            + (f" by {r.by}" if r.by else "")
            + (f": {r.reason}" if r.reason else "")
        ),
    )
    section(
        "degraded: shown, nothing scheduled away",
        state.degraded,
        "degraded",
        lambda r: (
            f"DEGRADED {r.device}{node(r)} since {_when(r.since, now)}: {r.reason or '-'}{rule(r)}"
        ),
    )
    section(
        "burn-in: tainted NoSchedule until a validation passes",
        state.burn_in,
        "burnIn",
        lambda r: f"BURN-IN {r.device}{node(r)} since {_when(r.since, now)}: {r.why or '-'}",
    )
    section(
        "repairs",
        state.repairs,
        "repairs",
        lambda r: (
            f"{_repair_marker(r.phase)} {r.device}: {r.phase or 'unknown phase'}"
            + (f", attempt {r.attempt}" if r.attempt is not None else "")
            + (f", {r.kind}" if r.kind else "")
            + f", since {_when(r.since, now)}"
            + (f": {r.detail}" if r.detail else "")
        ),
    )
    return lines + [f"  {line}" for line in body]


def _repair_marker(phase: str) -> str:
    known = {"failed": "REPAIR-FAILED", "succeeded": "REPAIRED"}
    known.update(dict.fromkeys(("waiting-drain", "running"), "REPAIRING"))
    return known.get(phase, "REPAIR")


def history_line(state: RemediationState, device: str, now: float) -> str | None:
    """One line on what the controller holds of ``device`` now (None: nothing)."""
    markers = state.markers(device, now)
    if not markers:
        return None
    found = state.device_state(device, now)
    parts = []
    if "needsHuman" in found:
        nh = found["needsHuman"]
        parts.append(
            f"needs a human since {_when(nh['since'], now)}: {nh['why'] or '-'}; "
            f"clear with `drahealth clear {device}`"
        )
    if "hold" in found and "HELD" in markers:
        parts.append(
            f"held by {found['hold']['by'] or '?'} until {_when(found['hold']['until'], now)}"
        )
    if "breakerHeld" in found:
        parts.append("its taint is held by the circuit breaker (`drahealth resume`)")
    if "repair" in found:
        parts.append(f"repair {found['repair']['phase'] or '?'}")
    if "degraded" in found:
        parts.append(f"degraded: {found['degraded']['reason'] or '-'}")
    if "burnIn" in found:
        parts.append(f"in burn-in ({found['burnIn']['why'] or '-'})")
    return f"now: {','.join(markers)}: " + "; ".join(parts)
