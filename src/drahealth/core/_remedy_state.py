"""The remediation controller's state, as the views read it: typed records from raw JSON.

Owns the one reading of the ConfigMap ``drahealth-remediation-state`` that ``drahealth
status``, ``drahealth history`` and the dashboard share. The controller writes one JSON
value per key, each key owned by one guard rail:

* ``breaker``: ``{"tripped": [{scope, group, limit, max, count, window, since, resume}],
  "held": [{device, rule, effect, since, reason}], "heldCount": N, "admitted": [...]}``
  (``heldCount`` counts the held taints where ``held`` lists only some; ``admitted`` is
  the breaker's own bookkeeping and is not read here);
* ``needsHuman``: ``{DEVICE: {since, why, rule, node}}``;
* ``holds``: ``{DEVICE: {until, by, reason}}`` (an operator's ``untaint --hold``);
* ``degraded``: ``{DEVICE: {since, rule, reason, node}}``;
* ``burnIn``: ``{DEVICE: {since, why, node}}``;
* ``repairs``: ``{DEVICE: {phase, attempt, kind, since, detail}}``.

``DEVICE`` is ``DRIVER/POOL/DEVICE``. :func:`parse_state_data` takes the ConfigMap's
``data`` (strings), :func:`parse_state` values already decoded. Both are tolerant and
bounded, since the ConfigMap can be edited by hand: a value that is not JSON, is too
large or has the wrong type is skipped with a note; an entry that is not an object or
names no valid device is skipped (counted in one note per key); a field of the wrong
type, or a number that is not a finite integer, reads as missing; unknown fields are
ignored; text is cut to :data:`MAX_TEXT` characters; at most :data:`MAX_ENTRIES` entries
are kept per list (the note says how many there were) and at most :data:`MAX_NOTES`
notes. Timestamps stay as written (RFC 3339); :func:`parse_rfc3339` reads one.
:func:`history_label` says the controller's history actions in words, :func:`mentions_device`
finds a device named whole in a history line or Event. No I/O.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from drahealth.core._health import DeviceKey

__all__ = [
    "BREAKER_KEY",
    "BURN_IN_KEY",
    "DEGRADED_KEY",
    "HOLDS_KEY",
    "MAX_ENTRIES",
    "MAX_NOTES",
    "MAX_TEXT",
    "MAX_VALUE_BYTES",
    "NEEDS_HUMAN_KEY",
    "REMEDIATION_MARKERS",
    "REPAIRS_KEY",
    "STATE_KEYS",
    "BreakerHeld",
    "BreakerTrip",
    "BurnInEntry",
    "DegradedEntry",
    "HoldEntry",
    "NeedsHumanEntry",
    "RemediationState",
    "RepairEntry",
    "history_label",
    "mentions_device",
    "parse_rfc3339",
    "parse_state",
    "parse_state_data",
]

BREAKER_KEY: Final = "breaker"
NEEDS_HUMAN_KEY: Final = "needsHuman"
HOLDS_KEY: Final = "holds"
DEGRADED_KEY: Final = "degraded"
BURN_IN_KEY: Final = "burnIn"
REPAIRS_KEY: Final = "repairs"
#: The keys read here, in the order the views show them.
STATE_KEYS: Final = (
    BREAKER_KEY,
    NEEDS_HUMAN_KEY,
    HOLDS_KEY,
    DEGRADED_KEY,
    BURN_IN_KEY,
    REPAIRS_KEY,
)

#: Largest value (UTF-8 bytes) read per key, as the controller caps what it writes.
MAX_VALUE_BYTES: Final = 256 * 1024
#: Entries kept per list or map (the rest are counted, not kept).
MAX_ENTRIES: Final = 1000
#: Characters kept of one text field.
MAX_TEXT: Final = 512
#: Notes kept (then one saying how many more there were).
MAX_NOTES: Final = 20
#: Largest integer read (anything larger is not a count a controller writes).
_MAX_INT: Final = 2**53

#: Per-device markers, most urgent first, with what each means.
REMEDIATION_MARKERS: Final = {
    "NEEDS-HUMAN": "repeated faults or failed repairs: no automatic untaint until cleared",
    "PAUSED": "a new taint held back by the circuit breaker",
    "HELD": "an operator's hold: the controller does not taint it again until then",
    "REPAIR-FAILED": "its last repair failed",
    "REPAIRING": "a repair is waiting for the drain or running",
    "DEGRADED": "degraded: shown, nothing scheduled away from it",
    "BURN-IN": "tainted NoSchedule until a validation passes",
}

_REPAIRING_PHASES: Final = frozenset({"waiting-drain", "running"})


def parse_rfc3339(value: str) -> float | None:
    """Unix time of an RFC 3339 timestamp, or None when it is not one."""
    if not value or len(value) > 64:
        return None
    try:
        stamp = datetime.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.UTC)
    return stamp.timestamp()


def mentions_device(text: str, device: str) -> bool:
    """Whether ``text`` names ``device`` (``DRIVER/POOL/DEVICE``) as a whole word.

    ``.../gpu-1`` is not named by a text about ``.../gpu-10``, nor ``a.example.com/...``
    by one about ``xa.example.com/...``.
    """
    if not device:
        return False
    start = text.find(device)
    while start >= 0:
        end = start + len(device)
        before = text[start - 1] if start else " "
        after = text[end] if end < len(text) else " "
        # names are DNS labels and subdomains: "." may end a sentence, never a device name
        if not (before.isalnum() or before in "-_./") and not (after.isalnum() or after in "-_"):
            return True
        start = text.find(device, start + 1)
    return False


#: The controller's history actions -> words (an action ``family-detail`` reads as
#: ``words (detail)``); an action not listed is shown as written.
_ACTIONS: Final[dict[str, str]] = {
    "create": "tainted",
    "update": "taint changed",
    "delete": "untainted",
    "evict": "evicted",
    "validate": "validation",
    "report": "would act (report-only)",
    "over-broad": "over-broad rule",
    "node": "node-level action",
    "hold": "operator hold",
    "opt-out": "automatic action turned off (node label)",
    "opt-in": "automatic action turned on again",
    "frozen": "left alone (opted out or excluded)",
    "foreign-rule": "foreign rule reported",
    "rule-deleted": "its rule deleted by someone else",
    "node-rollup": "node condition",
    "breaker": "circuit breaker",
    "resume": "resumed by an operator",
    "needs-human": "needs a human",
    "clear": "cleared by an operator",
    "repair": "repair",
    "burn-in": "burn-in",
    "degraded": "degraded",
    "escalate": "escalated",
}


def history_label(action: str) -> str:
    """``needs-human`` -> ``needs a human``; ``repair-failed`` -> ``repair (failed)``."""
    if action in _ACTIONS:
        return _ACTIONS[action]
    for family in sorted(_ACTIONS, key=len, reverse=True):
        if action.startswith(family + "-"):
            return f"{_ACTIONS[family]} ({action[len(family) + 1 :]})"
    return action


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class BreakerTrip:
    """One limit the circuit breaker found crossed."""

    scope: str  # cluster, profile, driver, pool or node
    group: str  # the profile/driver/pool/node; "" for the cluster
    limit: str  # as the policy writes it: "10%" or "5"
    max: int | None  # the limit as a count of devices
    count: int | None  # devices counted within the window
    window: int | None  # seconds
    since: str
    resume: str  # manual or auto

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope, "group": self.group, "limit": self.limit, "max": self.max,
            "count": self.count, "window": self.window, "since": self.since,
            "resume": self.resume,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class BreakerHeld:
    """A taint the circuit breaker held back (not written)."""

    device: str
    rule: str
    effect: str
    since: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device, "rule": self.rule, "effect": self.effect,
            "since": self.since, "reason": self.reason,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class NeedsHumanEntry:
    device: str
    since: str
    why: str
    rule: str
    node: str

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "why": self.why, "rule": self.rule, "node": self.node}


@dataclass(frozen=True, slots=True)
class HoldEntry:
    device: str
    until: str
    by: str
    reason: str

    def expired(self, now: float) -> bool:
        until = parse_rfc3339(self.until)
        return until is not None and until <= now

    def to_json(self) -> dict[str, Any]:
        return {"until": self.until, "by": self.by, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class DegradedEntry:
    device: str
    since: str
    rule: str
    reason: str
    node: str

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "rule": self.rule, "reason": self.reason, "node": self.node}


@dataclass(frozen=True, slots=True)
class BurnInEntry:
    device: str
    since: str
    why: str
    node: str

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "why": self.why, "node": self.node}


@dataclass(frozen=True, slots=True)
class RepairEntry:
    device: str
    phase: str  # waiting-drain, running, succeeded or failed
    attempt: int | None
    kind: str  # exec, webhook or job
    since: str
    detail: str

    @property
    def in_progress(self) -> bool:
        return self.phase in _REPAIRING_PHASES

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase, "attempt": self.attempt, "kind": self.kind,
            "since": self.since, "detail": self.detail,
        }  # fmt: skip


@dataclass(frozen=True)
class RemediationState:
    """What the controller keeps in its state ConfigMap, as far as it could be read.

    ``present`` is False when there is no ConfigMap (nothing to show). ``totals`` counts
    the entries of each key before :data:`MAX_ENTRIES` cut them (``breaker.held`` under
    ``"breakerHeld"``); ``notes`` say what was skipped and why.
    """

    present: bool = False
    tripped: tuple[BreakerTrip, ...] = ()
    held: tuple[BreakerHeld, ...] = ()
    needs_human: tuple[NeedsHumanEntry, ...] = ()
    holds: tuple[HoldEntry, ...] = ()
    degraded: tuple[DegradedEntry, ...] = ()
    burn_in: tuple[BurnInEntry, ...] = ()
    repairs: tuple[RepairEntry, ...] = ()
    totals: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def paused(self) -> bool:
        """The circuit breaker is open: new taints are held."""
        return bool(self.tripped)

    def total(self, key: str) -> int:
        return self.totals.get(key, 0)

    @functools.cached_property
    def _by_device(self) -> dict[str, dict[str, Any]]:
        """Device -> its records by kind (built once; a view asks per device)."""
        index: dict[str, dict[str, Any]] = {}
        for name, group in (
            (NEEDS_HUMAN_KEY, self.needs_human),
            ("hold", self.holds),
            (DEGRADED_KEY, self.degraded),
            (BURN_IN_KEY, self.burn_in),
            ("repair", self.repairs),
        ):
            for record in group:
                index.setdefault(record.device, {}).setdefault(name, record)
        for held in self.held:
            index.setdefault(held.device, {}).setdefault("breakerHeld", []).append(held)
        return index

    def devices(self) -> set[str]:
        """Every device some key names."""
        return set(self._by_device)

    def device_state(self, device: str, now: float) -> dict[str, Any]:
        """One device's entries and markers (empty when no key names it)."""
        out: dict[str, Any] = {}
        for name, record in self._by_device.get(device, {}).items():
            if isinstance(record, list):
                out[name] = [r.to_json() for r in record]
            else:
                out[name] = record.to_json()
                if isinstance(record, HoldEntry):
                    out[name]["expired"] = record.expired(now)
        markers = self.markers(device, now)
        if markers:
            out["markers"] = markers
        return out

    def markers(self, device: str, now: float) -> list[str]:
        """The :data:`REMEDIATION_MARKERS` that apply to ``device``, most urgent first."""
        records = self._by_device.get(device)
        if not records:
            return []
        found: set[str] = set()
        if NEEDS_HUMAN_KEY in records:
            found.add("NEEDS-HUMAN")
        if "breakerHeld" in records:
            found.add("PAUSED")
        hold = records.get("hold")
        if hold is not None and not hold.expired(now):
            found.add("HELD")
        repair = records.get("repair")
        if repair is not None and repair.in_progress:
            found.add("REPAIRING")
        elif repair is not None and repair.phase == "failed":
            found.add("REPAIR-FAILED")
        if DEGRADED_KEY in records:
            found.add("DEGRADED")
        if BURN_IN_KEY in records:
            found.add("BURN-IN")
        return [m for m in REMEDIATION_MARKERS if m in found]

    def summary(self) -> dict[str, Any]:
        """The state without per-device entries: the breaker, counts and notes (small,
        whatever the number of devices; the dashboard's page-wide part)."""
        return {
            "present": self.present,
            "paused": self.paused,
            "tripped": [t.to_json() for t in self.tripped],
            "held": self.total("breakerHeld") or len(self.held),
            "counts": {
                NEEDS_HUMAN_KEY: self.total(NEEDS_HUMAN_KEY) or len(self.needs_human),
                HOLDS_KEY: self.total(HOLDS_KEY) or len(self.holds),
                DEGRADED_KEY: self.total(DEGRADED_KEY) or len(self.degraded),
                BURN_IN_KEY: self.total(BURN_IN_KEY) or len(self.burn_in),
                REPAIRS_KEY: self.total(REPAIRS_KEY) or len(self.repairs),
            },
            "notes": list(self.notes),
        }

    def to_json(self) -> dict[str, Any]:
        """The whole state as plain JSON (what the dashboard serves)."""
        return {
            "present": self.present,
            "paused": self.paused,
            BREAKER_KEY: {
                "tripped": [t.to_json() for t in self.tripped],
                "held": [h.to_json() for h in self.held],
            },
            NEEDS_HUMAN_KEY: {r.device: r.to_json() for r in self.needs_human},
            HOLDS_KEY: {r.device: r.to_json() for r in self.holds},
            DEGRADED_KEY: {r.device: r.to_json() for r in self.degraded},
            BURN_IN_KEY: {r.device: r.to_json() for r in self.burn_in},
            REPAIRS_KEY: {r.device: r.to_json() for r in self.repairs},
            "totals": dict(self.totals),
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------- parsing


class _Notes:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.dropped = 0

    def add(self, line: str) -> None:
        if len(self.lines) < MAX_NOTES:
            self.lines.append(line)
        else:
            self.dropped += 1

    def result(self) -> tuple[str, ...]:
        extra = [f"... and {self.dropped} more problems"] if self.dropped else []
        return (*self.lines, *extra)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    return value if len(value) <= MAX_TEXT else value[: MAX_TEXT - 3] + "..."


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    number = int(value)
    return number if abs(number) <= _MAX_INT else None


def _device(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        return None
    try:
        DeviceKey.parse(value)
    except ValueError:
        return None
    return value


_R = TypeVar("_R", NeedsHumanEntry, HoldEntry, DegradedEntry, BurnInEntry, RepairEntry)


def _per_device(
    key: str,
    value: Any,
    build: Callable[[str, Mapping[str, Any]], _R],
    notes: _Notes,
    totals: dict[str, int],
) -> tuple[_R, ...]:
    """A ``{DEVICE: {...}}`` value -> records sorted by device (bounded, bad ones noted)."""
    if not isinstance(value, Mapping):
        notes.add(f"{key}: expected an object of devices, got {_type(value)}: skipped")
        return ()
    totals[key] = len(value)
    bad_device = not_object = 0
    out: list[_R] = []
    for device in sorted(value, key=str)[: MAX_ENTRIES * 2]:
        entry = value[device]
        name = _device(device)
        if name is None:
            bad_device += 1
        elif not isinstance(entry, Mapping):
            not_object += 1
        elif len(out) < MAX_ENTRIES:
            out.append(build(name, entry))
    _skipped(notes, key, bad_device, "not DRIVER/POOL/DEVICE")
    _skipped(notes, key, not_object, "not an object")
    if len(value) > MAX_ENTRIES:
        notes.add(f"{key}: {len(value)} devices; showing the first {len(out)}")
    return tuple(out)


def _skipped(notes: _Notes, key: str, count: int, why: str) -> None:
    if count:
        notes.add(f"{key}: {count} {'entry' if count == 1 else 'entries'} skipped ({why})")


def _type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _breaker(
    value: Any, notes: _Notes, totals: dict[str, int]
) -> tuple[tuple[BreakerTrip, ...], tuple[BreakerHeld, ...]]:
    if not isinstance(value, Mapping):
        notes.add(f"{BREAKER_KEY}: expected an object, got {_type(value)}: skipped")
        return (), ()
    trips: list[BreakerTrip] = []
    held: list[BreakerHeld] = []
    for part in ("tripped", "held"):
        items = value.get(part, [])
        if not isinstance(items, list):
            notes.add(f"{BREAKER_KEY}.{part}: expected a list, got {_type(items)}: skipped")
            continue
        totals["breakerHeld" if part == "held" else "breakerTripped"] = len(items)
        counted = _int(value.get("heldCount"))  # the breaker lists some, counts all
        if part == "held" and counted is not None and counted > len(items):
            totals["breakerHeld"] = counted
        bad = 0
        for item in items[: MAX_ENTRIES * 2]:
            if not isinstance(item, Mapping):
                bad += 1
            elif part == "tripped" and len(trips) < MAX_ENTRIES:
                trips.append(
                    BreakerTrip(
                        scope=_text(item.get("scope")) or "cluster",
                        group=_text(item.get("group")),
                        limit=_text(item.get("limit")) or _limit_text(item.get("limit")),
                        max=_int(item.get("max")),
                        count=_int(item.get("count")),
                        window=_int(item.get("window")),
                        since=_text(item.get("since")),
                        resume=_text(item.get("resume")) or "manual",
                    )
                )
            elif part == "held" and len(held) < MAX_ENTRIES:
                device = _device(item.get("device"))
                if device is None:
                    bad += 1
                    continue
                held.append(
                    BreakerHeld(
                        device=device,
                        rule=_text(item.get("rule")),
                        effect=_text(item.get("effect")),
                        since=_text(item.get("since")),
                        reason=_text(item.get("reason")),
                    )
                )
        _skipped(notes, f"{BREAKER_KEY}.{part}", bad, "not an object naming a device")
        if len(items) > MAX_ENTRIES:
            notes.add(
                f"{BREAKER_KEY}.{part}: {len(items)} entries; showing the first {MAX_ENTRIES}"
            )
    return tuple(trips), tuple(held)


def _limit_text(value: Any) -> str:
    number = _int(value)
    return "" if number is None else str(number)


def parse_state(values: Mapping[str, Any] | None, *, notes: Iterable[str] = ()) -> RemediationState:
    """Decoded values of the state ConfigMap (key -> JSON value) -> :class:`RemediationState`.

    ``None`` means there is no ConfigMap. ``notes`` are carried into the result (the
    problems met while decoding). Keys not read here are ignored.
    """
    if values is None:
        return RemediationState(notes=tuple(notes))
    found = _Notes()
    for line in notes:
        found.add(line)
    totals: dict[str, int] = {}
    tripped: tuple[BreakerTrip, ...] = ()
    held: tuple[BreakerHeld, ...] = ()
    if BREAKER_KEY in values:
        tripped, held = _breaker(values[BREAKER_KEY], found, totals)

    given: Mapping[str, Any] = values

    def each(key: str, cls: type[_R]) -> tuple[_R, ...]:
        if key not in given:
            return ()
        return _per_device(key, given[key], lambda d, e: _record(cls, d, e), found, totals)

    return RemediationState(
        present=True,
        tripped=tripped,
        held=held,
        needs_human=each(NEEDS_HUMAN_KEY, NeedsHumanEntry),
        holds=each(HOLDS_KEY, HoldEntry),
        degraded=each(DEGRADED_KEY, DegradedEntry),
        burn_in=each(BURN_IN_KEY, BurnInEntry),
        repairs=each(REPAIRS_KEY, RepairEntry),
        totals=totals,
        notes=found.result(),
    )


def _record(cls: type[_R], device: str, entry: Mapping[str, Any]) -> _R:
    """``cls`` from one entry: ``attempt`` an integer, every other field text."""
    kw: dict[str, Any] = {
        name: _int(entry.get(name)) if name == "attempt" else _text(entry.get(name))
        for name in _field_names(cls)
    }
    return cls(device=device, **kw)


_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.name != "device")
    return names


def parse_state_data(data: Mapping[str, Any] | None) -> RemediationState:
    """The state ConfigMap's ``data`` (key -> JSON text) -> :class:`RemediationState`.

    The ConfigMap exists (``data`` None: it has no data); where there is none, use
    ``RemediationState()``. Only the keys in :data:`STATE_KEYS` are decoded; one that is
    not a string, is over :data:`MAX_VALUE_BYTES` or is not JSON is skipped with a note.
    """
    notes: list[str] = []
    values: dict[str, Any] = {}
    if data is not None and not isinstance(data, Mapping):
        return parse_state({}, notes=[f"data: expected an object, got {_type(data)}: skipped"])
    for key in STATE_KEYS:
        if data is None or key not in data:
            continue
        text = data[key]
        if not isinstance(text, str):
            notes.append(f"{key}: not a string: skipped")
        elif len(text) > MAX_VALUE_BYTES or len(text.encode("utf-8", "replace")) > MAX_VALUE_BYTES:
            notes.append(f"{key}: over {MAX_VALUE_BYTES} bytes: skipped")
        else:
            try:
                values[key] = json.loads(text)
            except (ValueError, RecursionError) as exc:
                notes.append(f"{key}: not JSON ({_short(exc)}): skipped")
    return parse_state(values, notes=notes)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."
