"""Ownership filter of the remediation controller: operator holds, opt-out nodes, exclusions.

Owns, sans-I/O (time is passed in as unix seconds):

* :class:`Exclude` and :class:`OwnershipPolicy`, the policy's ``exclude`` and
  ``ownership`` sections;
* :class:`Hold` and :class:`HoldBook`: the devices the controller must not taint now.
  A hold comes from the operator (the control key ``holds``, written by
  ``drahealth untaint --hold``) or from a deletion of one of the controller's
  DeviceTaintRules that the controller did not make (``kubectl delete``): that is an
  operator's untaint too, held for ``ownership.manualUntaintHold``. Of a device's
  holds, the one the controller learned of last decides, so ``--hold 0`` (or
  ``--release``) ends a hold early and a later deletion starts a new one;
* :func:`frozen_reason` and :func:`filter_wants`: the pass's hook between the engine's
  wants and the writes. A *frozen* device (its node has the label
  ``drahealth.io/remediation=disabled``, or the policy excludes its driver, pool or
  node) gets no automatic action at all: what it carries stays as it is. A *held*
  device gets no controller taint until its hold ends.

Entries that cannot be read (bad device, bad time) are skipped with a warning naming
them; a bad edit by hand never stops remediation. At most :data:`MAX_HOLDS` holds are
kept.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

from drahealth.core._health import DeviceKey

__all__ = [
    "DEFAULT_MANUAL_UNTAINT_HOLD",
    "MAX_HOLDS",
    "OPT_OUT_LABEL",
    "OPT_OUT_VALUE",
    "Exclude",
    "Hold",
    "HoldBook",
    "OwnershipPolicy",
    "Verdict",
    "filter_wants",
    "format_time",
    "frozen_reason",
    "parse_device_key",
    "parse_time",
]

#: A node with this label and value gets no automatic remediation.
OPT_OUT_LABEL: Final = "drahealth.io/remediation"
OPT_OUT_VALUE: Final = "disabled"
#: How long a deleted controller rule is not re-created (seconds), unless the policy says.
DEFAULT_MANUAL_UNTAINT_HOLD: Final = 1800.0
#: Most holds kept (operator and deletion holds together).
MAX_HOLDS: Final = 10_000
#: A deletion within this many seconds of a control entry for the same device is that
#: command's own untaint (``drahealth untaint --hold`` writes its hold, then deletes).
ATTRIBUTE_WINDOW: Final = 60.0
MAX_BY: Final = 256
MAX_REASON: Final = 1024
SOURCE_OPERATOR: Final = "operator"
SOURCE_DELETED: Final = "rule-deleted"


class _Facts(Protocol):
    @property
    def driver(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def node(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Exclude:
    """Devices the controller never acts on, by driver, pool or node name.

    Each entry is a name or a glob (``gpu-*``, ``node-1?``), matched case-sensitively.
    A device class is named here by its driver.
    """

    drivers: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()

    def reason(self, facts: _Facts) -> str | None:
        """Why the policy excludes the device, or None."""
        for field, value, patterns in (
            ("drivers", facts.driver, self.drivers),
            ("pools", facts.pool, self.pools),
            ("nodes", facts.node, self.nodes),
        ):
            if not value:
                continue
            for p in patterns:
                if fnmatch.fnmatchcase(value, p):
                    return f"the policy's exclude.{field} names {p!r}"
        return None

    def __bool__(self) -> bool:
        return bool(self.drivers or self.pools or self.nodes)


@dataclass(frozen=True, slots=True)
class OwnershipPolicy:
    """``manual_untaint_hold``: seconds a controller rule deleted by someone else is not
    re-created (0: re-created at once)."""

    manual_untaint_hold: float = DEFAULT_MANUAL_UNTAINT_HOLD


def format_time(when: float) -> str:
    """Unix seconds -> RFC 3339 in UTC (milliseconds when not a whole second)."""
    stamp = dt.datetime.fromtimestamp(when, dt.UTC)
    if stamp.microsecond:
        return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: object) -> float | None:
    """RFC 3339 -> unix seconds; None if ``text`` is not one (a naive time is UTC)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.timestamp()


def parse_device_key(text: object) -> DeviceKey | None:
    """``DRIVER/POOL/DEVICE`` (the pool may contain ``/``) -> key, or None."""
    if not isinstance(text, str):
        return None
    parts = text.split("/")
    if len(parts) < 3 or not all(parts):
        return None
    return DeviceKey(parts[0], "/".join(parts[1:-1]), parts[-1])


@dataclass(frozen=True, slots=True)
class Hold:
    """No controller taint on a device until ``until`` (unix seconds)."""

    until: float
    by: str
    reason: str
    since: float  # when the controller learned of it
    source: str = SOURCE_OPERATOR  # or SOURCE_DELETED

    def as_json(self) -> dict[str, str]:
        """The entry of the state key ``holds``."""
        return {
            "until": format_time(self.until),
            "by": self.by,
            "reason": self.reason,
            "since": format_time(self.since),
            "source": self.source,
        }


def _entries(value: Any, where: str) -> tuple[dict[DeviceKey, dict[str, Any]], list[str]]:
    """A ``holds`` value -> device -> its entry, and warnings for what was skipped."""
    if value is None:
        return {}, []
    if not isinstance(value, Mapping):
        return {}, [f"{where}: expected an object of DRIVER/POOL/DEVICE keys: ignored"]
    out: dict[DeviceKey, dict[str, Any]] = {}
    warnings: list[str] = []
    for text, entry in value.items():
        key = parse_device_key(text)
        if key is None:
            warnings.append(f"{where}: {text!r} is not DRIVER/POOL/DEVICE: ignored")
            continue
        if not isinstance(entry, Mapping) or parse_time(entry.get("until")) is None:
            warnings.append(f"{where}.{text}: 'until' must be an RFC 3339 time: ignored")
            continue
        out[key] = dict(entry)
    return out, warnings


def _text(value: object, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


class HoldBook:
    """The holds of every device: the operator's (control key) and deletions'.

    Feed it the control key (:meth:`apply_control`, every pass: unchanged entries are
    kept as they were), deletions of the controller's rules it did not make
    (:meth:`rule_deleted`) and, at start, the state key it last wrote
    (:meth:`restore`). :meth:`active` says whether a device is held now.
    """

    def __init__(self, manual_untaint_hold: float = DEFAULT_MANUAL_UNTAINT_HOLD) -> None:
        self.manual_untaint_hold = manual_untaint_hold
        self._control: dict[DeviceKey, Hold] = {}
        self._deleted: dict[DeviceKey, Hold] = {}
        self._said: dict[DeviceKey, Hold] = {}  # the active holds last reported
        self._control_value: Any = None
        # a pass costs O(1) while nothing changed: _said is exact until an input changes
        # (_dirty) or the first active hold ends (_due)
        self._dirty = False
        self._due: float | None = None
        self._state: dict[str, dict[str, str]] | None = None

    def __bool__(self) -> bool:
        """Whether any hold, active or not, is known."""
        return bool(self._control or self._deleted)

    def _fresh(self, now: float) -> bool:
        return not self._dirty and (self._due is None or now < self._due)

    def apply_control(self, value: Any, now: float) -> list[str]:
        """The control key ``holds`` as it is now; returns warnings for bad entries."""
        if value == self._control_value and value is not None:
            return []
        self._control_value = value
        entries, warnings = _entries(value, "holds")
        control: dict[DeviceKey, Hold] = {}
        for key, entry in list(entries.items())[:MAX_HOLDS]:
            until = parse_time(entry.get("until"))
            assert until is not None
            by, reason = _text(entry.get("by"), MAX_BY), _text(entry.get("reason"), MAX_REASON)
            old = self._control.get(key)
            if old is not None and (old.until, old.by, old.reason) == (until, by, reason):
                control[key] = old
            else:
                control[key] = Hold(until, by, reason, now)
        self._control = control
        self._dirty = True
        return warnings

    def restore(self, state: Any, control: Any, now: float) -> list[str]:
        """At start: the holds the last leader reported (state key ``holds``) and the
        control key. A deletion's hold comes back; an operator entry keeps when it was
        learned of if unchanged; one that already ended can end nothing else."""
        entries, warnings = _entries(state, "state holds")
        self._control_value = None
        warnings += self.apply_control(control, now)
        for key, hold in list(self._control.items()):
            entry = entries.get(key)
            since = parse_time(entry.get("since")) if entry else None
            if (
                entry is not None
                and entry.get("source") == SOURCE_OPERATOR
                and since is not None
                and parse_time(entry.get("until")) == hold.until
            ):
                hold = Hold(hold.until, hold.by, hold.reason, since)
            elif hold.until <= now:
                hold = Hold(hold.until, hold.by, hold.reason, float("-inf"))
            self._control[key] = hold
        for key, entry in entries.items():
            until = parse_time(entry.get("until"))
            since = parse_time(entry.get("since"))
            if entry.get("source") != SOURCE_DELETED or until is None or until <= now:
                continue
            self._deleted[key] = Hold(
                until,
                _text(entry.get("by"), MAX_BY),
                _text(entry.get("reason"), MAX_REASON),
                now if since is None else since,
                SOURCE_DELETED,
            )
        self._said = {
            k: h for k in self._deleted.keys() | self._control.keys() if (h := self.active(k, now))
        }
        self._dirty = True
        return warnings

    def rule_deleted(self, key: DeviceKey, rule: str, now: float) -> Hold | None:
        """Someone other than the controller deleted its rule ``rule`` of ``key``: the
        new hold, or None (no hold configured, already held, or the deletion was a
        ``drahealth untaint`` whose own control entry decides)."""
        if self.manual_untaint_hold <= 0 or self.active(key, now) is not None:
            return None
        control = self._control.get(key)
        if control is not None and now - control.since <= ATTRIBUTE_WINDOW:
            return None
        hold = Hold(
            now + self.manual_untaint_hold,
            "unknown: deleted outside the controller",
            f"DeviceTaintRule {rule} was deleted by someone else: not re-created until "
            "the hold ends (end it early with drahealth untaint --release)",
            now,
            SOURCE_DELETED,
        )
        self._deleted[key] = hold
        self._dirty = True
        if len(self._deleted) > MAX_HOLDS:
            oldest = min(self._deleted, key=lambda k: self._deleted[k].until)
            del self._deleted[oldest]
        return hold

    def active(self, key: DeviceKey, now: float) -> Hold | None:
        """The hold on ``key`` now: of its holds the one learned of last, if not ended."""
        control, deleted = self._control.get(key), self._deleted.get(key)
        if control is None and deleted is None:
            return None
        if control is None or (deleted is not None and deleted.since > control.since):
            hold = deleted
        else:
            hold = control
        assert hold is not None
        return hold if hold.until > now else None

    def changes(self, now: float) -> tuple[list[tuple[DeviceKey, Hold]], ...]:
        """(holds that began, holds that ended) since the last call."""
        if self._fresh(now):
            return [], []
        for key in [k for k, h in self._deleted.items() if h.until <= now]:
            del self._deleted[key]
        began: list[tuple[DeviceKey, Hold]] = []
        ended: list[tuple[DeviceKey, Hold]] = []
        for key in sorted(self._control.keys() | self._deleted.keys() | self._said.keys()):
            hold, said = self.active(key, now), self._said.get(key)
            if hold == said:
                continue
            if said is not None:
                ended.append((key, said))
                del self._said[key]
            if hold is not None:
                began.append((key, hold))
                self._said[key] = hold
        self._dirty, self._state = False, None
        self._due = min((h.until for h in self._said.values()), default=None)
        return began, ended

    def state(self, now: float) -> dict[str, dict[str, str]]:
        """The state key ``holds``: every active hold, by device."""
        if self._state is not None and self._fresh(now):
            return self._state
        out = {}
        for key in sorted(self._control.keys() | self._deleted.keys()):
            hold = self.active(key, now)
            if hold is not None:
                out[str(key)] = hold.as_json()
        if self._fresh(now):
            self._state = out
        return out

    def next_end(self, now: float) -> float | None:
        """When the next active hold ends (unix seconds), or None."""
        if self._fresh(now):
            return self._due
        ends = [
            h.until
            for k in self._control.keys() | self._deleted.keys()
            if (h := self.active(k, now)) is not None
        ]
        return min(ends) if ends else None


def frozen_reason(facts: _Facts, opted_out: Collection[str], exclude: Exclude) -> str | None:
    """Why the controller must not act on the device at all, or None."""
    if facts.node and facts.node in opted_out:
        return f"node {facts.node} has the label {OPT_OUT_LABEL}={OPT_OUT_VALUE}"
    return exclude.reason(facts)


W = TypeVar("W")


@dataclass(frozen=True, slots=True)
class Verdict(Generic[W]):
    """What the ownership filter made of one pass's wants."""

    act: dict[DeviceKey, W]  # carried out as usual
    held: dict[DeviceKey, Hold]  # wanted a taint, held by an operator
    frozen: dict[DeviceKey, str]  # wanted a taint, no automatic action (why)


def filter_wants(
    wants: Mapping[DeviceKey, W],
    facts: Callable[[DeviceKey], _Facts],
    holds: HoldBook,
    opted_out: Collection[str],
    exclude: Exclude,
    now: float,
) -> Verdict[W]:
    """Split ``wants`` into those to carry out, held ones and frozen ones (frozen first:
    a frozen device is left exactly as it is, held or not)."""
    act: dict[DeviceKey, W] = {}
    held: dict[DeviceKey, Hold] = {}
    frozen: dict[DeviceKey, str] = {}
    check = bool(opted_out) or bool(exclude)
    if not check and not holds:
        return Verdict(dict(wants), held, frozen)  # the usual pass: nothing to filter
    for key, want in wants.items():
        why = frozen_reason(facts(key), opted_out, exclude) if check else None
        if why is not None:
            frozen[key] = why
            continue
        hold = holds.active(key, now)
        if hold is not None:
            held[key] = hold
            continue
        act[key] = want
    return Verdict(act, held, frozen)
