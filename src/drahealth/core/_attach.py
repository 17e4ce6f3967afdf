"""Attached health: signals keyed by a device attribute, mapped onto another driver's devices.

Owns the rules by which the node agent attaches health sources to the devices a driver
drahealth does not own publishes (NVIDIA's, Intel's, any DRA driver):

* :class:`AttachIndex`: the watched driver's devices on this node, read from its
  ResourceSlices (the newest generation of each pool), and the lookup
  ``(attribute, value) -> devices``, values compared in :func:`normalize_key`'s
  spelling (a kernel log's ``PCI:0000:3b:00`` finds the device whose ``pcieBusID`` is
  ``0000:3b:00.0``). A value two devices share is ambiguous: the signal is refused and
  reported, never applied to a guess (unless the key says ``match_all``);
* :class:`AttachedHealth`: per source, its opinion of each device with a lease (the
  source's ``timeout``): a device the source stops answering for reads Unknown from it
  once the lease ends, and every device does once the source gives no answer at all for
  that long; several sources on one device: the worst health wins and the message
  names each source at that health (``kmsg: XID 79 ...``). Signals that match no device
  (or several) are counted per source and each distinct one is reported once;
* :func:`pod_condition`: the pod condition of drahealth's own type
  (:data:`POD_CONDITION_TYPE`) that shows the health of a pod's attached devices
  where the kubelet writes none.

Which attribute a signal is matched on (first that applies): the source's configured
``match``; the signal's own ``by`` when the driver's devices publish that attribute (with or
without a domain; ``name`` is the device's name); the driver's configured key; for a
signal keyed by a PCI address, the one PCI-address attribute the devices publish.

Sans-I/O: plain data in, plain data out, time from an injected clock. Bounded: at most
``max_devices`` devices per driver, :data:`MAX_SIGNALS_PER_POLL` signals per poll and
:data:`MAX_REMEMBERED_PROBLEMS` reported problems per source.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from drahealth.core._health import DeviceKey, Health, truncate_message
from drahealth.core._health_cache import MAX_DEVICES_PER_DRIVER
from drahealth.core._records import ReportedDevice
from drahealth.core._rollup import (
    REASON_ALL_DEVICES_HEALTHY,
    REASON_DEVICES_UNHEALTHY,
    REASON_DEVICES_UNKNOWN,
)
from drahealth.core._signals import PCI_ATTRIBUTES, Signal, normalize_key, normalize_pci_address

__all__ = [
    "DEVICE_NAME_KEY",
    "MAX_REMEMBERED_PROBLEMS",
    "MAX_SIGNALS_PER_POLL",
    "POD_CONDITION_MESSAGE_MAX",
    "POD_CONDITION_TYPE",
    "UNLISTED_CHOICES",
    "AttachIndex",
    "AttachedHealth",
    "KeySpec",
    "SourceSpec",
    "SourceState",
    "pod_condition",
    "pod_condition_differs",
]

#: The pod condition that carries the health of a pod's attached devices. Its own type,
#: so the kubelet (which keeps conditions it does not own) never removes or rewrites it.
POD_CONDITION_TYPE: Final = "drahealth.io/DeviceHealthy"
#: The condition message is at most this many characters.
POD_CONDITION_MESSAGE_MAX: Final = 1024
#: A device's health message is cut to this many characters in the condition message.
_DEVICE_MESSAGE_MAX: Final = 200
#: The key attribute that means the device's name.
DEVICE_NAME_KEY: Final = "name"
#: Signals one poll may carry; more are dropped and counted.
MAX_SIGNALS_PER_POLL: Final = 65_536
#: Distinct unmatched or ambiguous keys remembered (so reported once) per source.
MAX_REMEMBERED_PROBLEMS: Final = 1024
#: Signal keys whose match is remembered (per index; all forgotten when full).
MAX_MATCHES_REMEMBERED: Final = 16_384
#: What a source's silence about a device means: ``ignore`` (nothing: the source only
#: speaks of devices it has news about, like the kernel log) or ``unknown`` (a source
#: that lists every device it sees, like NVML: a device it does not list reads Unknown).
UNLISTED_CHOICES: Final = ("ignore", "unknown")

AttributeValue = str | int | bool


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _short(name: str) -> str:
    return name.rpartition("/")[2]


@dataclass(frozen=True, slots=True)
class KeySpec:
    """How signals find a device: by ``attribute`` (``uuid``, ``pcieBusID``,
    ``gpu.nvidia.com/index``, ``name`` for the device's name). ``match_all``: a value
    several devices share (the partitions of one GPU share its PCI address) applies to
    all of them instead of being refused as ambiguous."""

    attribute: str
    match_all: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.attribute, str) or not self.attribute.strip():
            raise ValueError("key attribute must be a non-empty string")


# --------------------------------------------------------------------------- the index


class AttachIndex:
    """One driver's devices on one node, from its ResourceSlices, and the attribute lookup.

    ``slices`` are ResourceSlice objects as plain dicts (API field names). Slices of
    another driver or node (when ``node`` is given) are skipped; of each pool only the
    slices of its newest generation count (older ones are being replaced). A device
    name seen twice in a pool, and devices beyond ``max_devices``, are left out and
    said in :attr:`problems`.
    """

    def __init__(
        self,
        driver: str,
        slices: Iterable[Mapping[str, Any]] = (),
        *,
        node: str | None = None,
        max_devices: int = MAX_DEVICES_PER_DRIVER,
    ) -> None:
        self.driver = driver
        #: What was left out and why (one line each).
        self.problems: list[str] = []
        self._attrs: dict[DeviceKey, dict[str, AttributeValue]] = {}
        self._names: set[str] = set()  # qualified attribute names some device publishes
        self._maps: dict[str, dict[str, tuple[DeviceKey, ...]]] = {}
        self._resolved: dict[str, str | None] = {}
        pools: dict[str, tuple[int, list[Mapping[str, Any]]]] = {}
        for obj in slices:
            spec = _dict(_dict(obj).get("spec"))
            if spec.get("driver") != driver:
                continue
            if node is not None and spec.get("nodeName") != node:
                continue
            pool = _dict(spec.get("pool"))
            name = pool.get("name")
            if not isinstance(name, str) or not name:
                continue
            gen = pool.get("generation")
            generation = gen if isinstance(gen, int) and not isinstance(gen, bool) else 0
            held = pools.get(name)
            if held is None or generation > held[0]:
                pools[name] = (generation, [spec])
            elif generation == held[0]:
                held[1].append(spec)
        full = False
        for pool_name in sorted(pools):
            for spec in pools[pool_name][1]:
                for raw in _list(spec.get("devices")):
                    device = _dict(raw)
                    name = device.get("name")
                    if not isinstance(name, str) or not name:
                        continue
                    key = DeviceKey(driver, pool_name, name)
                    if key in self._attrs:
                        self.problems.append(f"device {key} is published twice; the first counts")
                        continue
                    if len(self._attrs) >= max_devices:
                        full = True
                        break
                    attrs = self._attributes(device)
                    self._attrs[key] = attrs
                    self._names.update(attrs)
        if full:
            self.problems.append(
                f"driver {driver} publishes more than {max_devices} devices on this node; "
                "the rest are not watched"
            )

    def _attributes(self, device: Mapping[str, Any]) -> dict[str, AttributeValue]:
        out: dict[str, AttributeValue] = {}
        for name, value in _dict(device.get("attributes")).items():
            if not isinstance(name, str) or not name:
                continue
            v = _dict(value)
            found = next((v[k] for k in ("string", "int", "bool", "version") if k in v), None)
            if isinstance(found, str | int | bool):
                out[self._qualified(name)] = found
        return out

    def _qualified(self, name: str) -> str:
        """``name`` with its domain; an attribute without one is in the driver's."""
        return name if "/" in name else f"{self.driver}/{name}"

    # -- reading -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._attrs)

    def __contains__(self, key: object) -> bool:
        return key in self._attrs

    def devices(self) -> list[DeviceKey]:
        """The devices, sorted."""
        return sorted(self._attrs)

    def attributes(self, key: DeviceKey) -> dict[str, AttributeValue]:
        """The device's attributes by qualified name (empty for an unknown device)."""
        return dict(self._attrs.get(key, {}))

    def values(self, attribute: str) -> tuple[str, ...]:
        """The values the devices publish for ``attribute`` as text, sorted, each once
        (device names for ``name``; empty when no device publishes it)."""
        resolved = self.resolve_attribute(attribute)
        if resolved is None:
            return ()
        found: set[str] = set()
        for key, attrs in self._attrs.items():
            value = key.device if resolved == DEVICE_NAME_KEY else attrs.get(resolved)
            if value is not None:
                found.add(str(value).lower() if isinstance(value, bool) else str(value))
        return tuple(sorted(found))

    def resolve_attribute(self, attribute: str) -> str | None:
        """The qualified attribute name ``attribute`` means here, or None when no device
        publishes it. ``name`` is the device's name. Without a domain, the driver's own
        attribute of that name comes first, then another domain's (``resource.kubernetes.io
        /pciBusID``); names are compared exactly first, then ignoring case."""
        if attribute in self._resolved:
            return self._resolved[attribute]
        found = self._resolve(attribute.strip())
        if len(self._resolved) < 256:
            self._resolved[attribute] = found
        return found

    def _resolve(self, attribute: str) -> str | None:
        if attribute == DEVICE_NAME_KEY:
            return DEVICE_NAME_KEY
        wanted = self._qualified(attribute)
        if wanted in self._names:
            return wanted
        if "/" not in attribute:
            by_short = sorted(n for n in self._names if _short(n) == attribute)
            if by_short:
                return by_short[0]
        lowered = attribute.lower()
        for candidate in sorted(self._names):
            if candidate.lower() == wanted.lower() or (
                "/" not in attribute and _short(candidate).lower() == lowered
            ):
                return candidate
        return None

    def pci_attribute(self) -> str | None:
        """The one attribute holding a PCI address the devices publish, if exactly one."""
        found = {n for n in self._names if _short(n).lower() in PCI_ATTRIBUTES}
        return next(iter(found)) if len(found) == 1 else None

    def lookup(
        self, attribute: str, value: object, *, hint: str | None = None
    ) -> tuple[DeviceKey, ...]:
        """The devices whose ``attribute`` has ``value`` (sorted; empty when none or no
        device publishes ``attribute``). ``hint``: the attribute name the value came
        with, whose spelling is tried too (a PCI address keyed ``pciBusID`` looked up
        in an attribute named ``address``)."""
        resolved = self.resolve_attribute(attribute)
        if resolved is None:
            return ()
        table = self._maps.get(resolved)
        if table is None:
            table = self._build(resolved)
        spellings = {normalize_key(resolved, value)}
        if hint is not None:
            spellings.add(normalize_key(hint, value))
        found: set[DeviceKey] = set()
        for spelling in spellings:
            found.update(table.get(spelling, ()))
        return tuple(sorted(found))

    def _build(self, attribute: str) -> dict[str, tuple[DeviceKey, ...]]:
        table: dict[str, list[DeviceKey]] = {}
        for key, attrs in self._attrs.items():
            value: AttributeValue | None = (
                key.device if attribute == DEVICE_NAME_KEY else attrs.get(attribute)
            )
            if value is None:
                continue
            spellings = {normalize_key(attribute, value)}
            if isinstance(value, str) and (pci := normalize_pci_address(value)) is not None:
                spellings.add(pci)
            for spelling in spellings:
                table.setdefault(spelling, []).append(key)
        built = {k: tuple(sorted(v)) for k, v in table.items()}
        self._maps[attribute] = built
        return built


# --------------------------------------------------------------------------- health


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One attached source as the health rules see it.

    ``name`` prefixes its messages; ``timeout`` is its lease (seconds); ``match``
    is the attribute its signals are matched on, whatever they say; ``unlisted``: see
    :data:`UNLISTED_CHOICES`.
    """

    name: str
    timeout: float
    match: KeySpec | None = None
    unlisted: Literal["ignore", "unknown"] = "ignore"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("source name must not be empty")
        if not (isinstance(self.timeout, int | float) and 0 < self.timeout < float("inf")):
            raise ValueError(f"source {self.name}: timeout must be > 0 seconds")
        if self.unlisted not in UNLISTED_CHOICES:
            raise ValueError(
                f"source {self.name}: unlisted must be one of {', '.join(UNLISTED_CHOICES)}"
            )


@dataclass(slots=True)
class _Opinion:
    health: Health
    message: str  # already names the source
    deadline: float | None  # end of its lease; None: holds until the source answers again


@dataclass(slots=True)
class SourceState:
    """What one source said and how it is doing (counters for metrics and views)."""

    spec: SourceSpec
    #: monotonic time of the last successful poll (or of the start, before the first)
    last_answer: float
    answered: bool = False
    opinions: dict[DeviceKey, _Opinion] = field(default_factory=dict)
    polls: int = 0
    failures: int = 0
    last_error: str | None = None
    signals: int = 0
    unmatched: int = 0
    ambiguous: int = 0
    dropped: int = 0
    reported: set[tuple[str, str, str]] = field(default_factory=set)
    #: the last poll's signals and the devices they named (a poll that repeats them, as
    #: a source at rest does, only refreshes the leases)
    last_signals: tuple[Signal, ...] | None = None
    last_named: tuple[DeviceKey, ...] = ()
    last_refused: tuple[int, int] = (0, 0)  # (unmatched, ambiguous) among them
    last_failed: bool = False  # the last poll raised


class AttachedHealth:
    """The health of one watched driver's devices from its attached sources.

    Feed it with :meth:`set_index` (the devices), :meth:`observe` (a source's poll) and
    :meth:`failed` (a poll that raised); read :meth:`reports` (what the agent's health
    pipeline gets, as if the driver had streamed it) and :meth:`device_health`; wake at
    :meth:`next_deadline`, when a lease ends.
    """

    def __init__(
        self,
        driver: str,
        sources: Sequence[SourceSpec],
        *,
        key: KeySpec | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"driver {driver}: source names must be unique, got {names}")
        self.driver = driver
        self.key = key
        self._clock = clock
        now = clock()
        self.sources: dict[str, SourceState] = {s.name: SourceState(s, now) for s in sources}
        self.index = AttachIndex(driver)
        #: Grows whenever an answer may change a device's health (a new opinion, a first
        #: answer, a new index); leases that end do not move it (see next_deadline).
        self.version = 0
        #: (source, by, value) -> the devices and attribute it matched (per index)
        self._matches: dict[tuple[str, str, object], tuple[tuple[DeviceKey, ...], str]] = {}

    # -- input ---------------------------------------------------------------------

    def set_index(self, index: AttachIndex) -> None:
        """The driver's devices changed: opinions of devices gone are forgotten, and
        keys reported as matching nothing may match now (reported again if not)."""
        self.index = index
        self.version += 1
        self._matches.clear()
        for state in self.sources.values():
            state.last_signals = None
            for key in [k for k in state.opinions if k not in index]:
                del state.opinions[key]
            state.reported.clear()

    def observe(self, source: str, signals: Sequence[Signal], *, repeats: int = 0) -> list[str]:
        """Apply one successful poll of ``source``; returns the problems not reported
        before (a key that matches no device, or several). ``repeats``: polls since the
        previous call that gave the previous call's outcome again (counted, not applied:
        a caller may hand over only changes, and a repeat at least every so often)."""
        state = self.sources[source]
        self._count_repeats(state, repeats)
        state.last_failed = False
        now = self._clock()
        if not state.answered or now - state.last_answer > state.spec.timeout:
            self.version += 1  # its first answer, or its first after a silence
        state.polls += 1
        state.answered = True
        state.last_answer = now
        state.last_error = None
        if len(signals) > MAX_SIGNALS_PER_POLL:
            state.dropped += len(signals) - MAX_SIGNALS_PER_POLL
            signals = signals[:MAX_SIGNALS_PER_POLL]
        deadline = now + state.spec.timeout
        repeated = tuple(signals)
        if state.spec.unlisted == "ignore" and repeated == state.last_signals:
            state.signals += len(signals)
            state.unmatched += state.last_refused[0]
            state.ambiguous += state.last_refused[1]
            for key in state.last_named:
                opinion = state.opinions[key]
                if opinion.deadline is not None and now > opinion.deadline:
                    self.version += 1  # it had read Unknown meanwhile
                opinion.deadline = deadline
            return []
        problems: list[str] = []
        refused = (state.unmatched, state.ambiguous)
        best: dict[DeviceKey, Signal] = {}
        match_all = self._match_all(state.spec)
        for signal in signals:
            state.signals += 1
            keys, attribute = self._match(state.spec, signal)
            if not keys:
                state.unmatched += 1
                problem = self._unmatched(state, signal, attribute)
            elif len(keys) > 1 and not match_all:
                state.ambiguous += 1
                problem = self._ambiguous(state, signal, attribute, keys)
            else:
                for key in keys:
                    held = best.get(key)
                    if held is None or signal.health.severity > held.health.severity:
                        best[key] = signal
                continue
            if problem is not None:
                problems.append(problem)
        state.last_signals = repeated
        state.last_named = tuple(best)
        state.last_refused = (state.unmatched - refused[0], state.ambiguous - refused[1])
        for key, signal in best.items():
            text = signal.message.strip()
            if not text and signal.health is not Health.HEALTHY:
                text = signal.health.value
            message = f"{source}: {text}" if text else ""
            self._hold(state, key, _Opinion(signal.health, message, deadline), now)
        if state.spec.unlisted == "unknown":
            for key in self.index.devices():
                held_opinion = state.opinions.get(key)
                if key in best or (held_opinion is not None and self._live(held_opinion, now)):
                    continue
                unlisted = _Opinion(Health.UNKNOWN, f"{source}: does not report this device", None)
                self._hold(state, key, unlisted, now)
        return problems

    def _hold(self, state: SourceState, key: DeviceKey, opinion: _Opinion, now: float) -> None:
        held = state.opinions.get(key)
        if (
            held is None
            or held.health is not opinion.health
            or held.message != opinion.message
            or (held.deadline is not None and now > held.deadline)
        ):
            self.version += 1
        state.opinions[key] = opinion

    def failed(self, source: str, error: str, *, repeats: int = 0) -> None:
        """A poll of ``source`` raised: nothing is refreshed (its leases run down).
        ``repeats``: as for :meth:`observe`."""
        state = self.sources[source]
        self._count_repeats(state, repeats)
        state.last_failed = True
        state.polls += 1
        state.failures += 1
        state.last_error = error.strip()[:256] or "failed"

    @staticmethod
    def _count_repeats(state: SourceState, repeats: int) -> None:
        if repeats <= 0:
            return
        state.polls += repeats
        if state.last_failed:
            state.failures += repeats
        elif state.last_signals is not None:
            state.signals += repeats * len(state.last_signals)
            state.unmatched += repeats * state.last_refused[0]
            state.ambiguous += repeats * state.last_refused[1]

    # -- rules ---------------------------------------------------------------------

    def _match_all(self, spec: SourceSpec) -> bool:
        chosen = spec.match or self.key
        return chosen is not None and chosen.match_all

    def _match(self, spec: SourceSpec, signal: Signal) -> tuple[tuple[DeviceKey, ...], str]:
        """The devices ``signal`` names and the attribute it was looked up in."""
        by = signal.by if isinstance(signal.by, str) else str(signal.by)
        memo = (spec.name, by, signal.value)
        try:
            found = self._matches.get(memo)
        except TypeError:  # an unhashable value: looked up each time
            return self._lookup(spec, by, signal.value)
        if found is None:
            found = self._lookup(spec, by, signal.value)
            if len(self._matches) >= MAX_MATCHES_REMEMBERED:
                self._matches.clear()
            self._matches[memo] = found
        return found

    def _lookup(
        self, spec: SourceSpec, by: str, value: object
    ) -> tuple[tuple[DeviceKey, ...], str]:
        attribute = self._attribute(spec, by)
        return self.index.lookup(attribute, value, hint=by), attribute

    def _attribute(self, spec: SourceSpec, by: str) -> str:
        """The attribute a signal of ``spec`` keyed ``by`` is looked up in (the order in the
        module docstring)."""
        index = self.index
        if spec.match is not None:
            return spec.match.attribute
        if index.resolve_attribute(by) is not None:
            return by
        if self.key is not None:
            return self.key.attribute
        if _short(by).lower() in PCI_ATTRIBUTES and (pci := index.pci_attribute()):
            return pci
        return by

    def keys_for(self, source: str, by: str) -> tuple[str, ...]:
        """The values the watched devices publish for the attribute that signals of
        ``source`` keyed ``by`` are matched on: what a source that probes devices one by
        one (a PCI address, a UUID) has to probe. Empty for an unknown source."""
        state = self.sources.get(source)
        if state is None:
            return ()
        return self.index.values(self._attribute(state.spec, by))

    def _remember(self, state: SourceState, kind: str, attribute: str, value: str) -> bool:
        """True the first time this problem is seen (up to the bound)."""
        mark = (kind, attribute, value)
        if mark in state.reported or len(state.reported) >= MAX_REMEMBERED_PROBLEMS:
            return False
        state.reported.add(mark)
        return True

    def _unmatched(self, state: SourceState, signal: Signal, attribute: str) -> str | None:
        value = normalize_key(attribute, signal.value)
        if not self._remember(state, "unmatched", attribute, value):
            return None
        where = f"driver {self.driver} on this node"
        if self.index.resolve_attribute(attribute) is None:
            return (
                f"{state.spec.name}: no device of {where} publishes attribute {attribute!r} "
                f"({signal.health.value} for {value!r} not applied)"
            )
        return (
            f"{state.spec.name}: no device of {where} has {attribute} {value!r} "
            f"({signal.health.value} not applied)"
        )

    def _ambiguous(
        self, state: SourceState, signal: Signal, attribute: str, keys: tuple[DeviceKey, ...]
    ) -> str | None:
        value = normalize_key(attribute, signal.value)
        if not self._remember(state, "ambiguous", attribute, value):
            return None
        names = ", ".join(str(k) for k in keys[:4]) + (" ..." if len(keys) > 4 else "")
        return (
            f"{state.spec.name}: {attribute} {value!r} names {len(keys)} devices ({names}); "
            f"{signal.health.value} not applied to any (set the key's matchAll to apply "
            "it to all)"
        )

    @staticmethod
    def _live(opinion: _Opinion, now: float) -> bool:
        return opinion.deadline is not None and now <= opinion.deadline

    def _opinion(self, state: SourceState, key: DeviceKey, now: float) -> tuple[Health, str] | None:
        spec = state.spec
        if now - state.last_answer > spec.timeout:
            what = "no answer" if state.answered else "no answer yet"
            why = f": {state.last_error}" if state.last_error else ""
            return Health.UNKNOWN, f"{spec.name}: {what} for {spec.timeout:g} s{why}"
        opinion = state.opinions.get(key)
        if opinion is None:
            return None
        if opinion.deadline is not None and now > opinion.deadline:
            return (
                Health.UNKNOWN,
                f"{spec.name}: no report of this device for {spec.timeout:g} s",
            )
        return opinion.health, opinion.message

    # -- output --------------------------------------------------------------------

    def device_health(self, key: DeviceKey) -> tuple[Health, str] | None:
        """The device's health now: the worst of its sources' opinions, the message
        naming each source at that health; Healthy (no message) when no source has an
        opinion but one has answered; None before any has."""
        return self._health_at(key, self._clock())

    def _health_at(self, key: DeviceKey, now: float) -> tuple[Health, str] | None:
        opinions = [
            found for state in self.sources.values() if (found := self._opinion(state, key, now))
        ]
        if not opinions:
            if any(s.answered for s in self.sources.values()):
                return Health.HEALTHY, ""
            return None
        worst = Health.worst(*(h for h, _ in opinions))
        message = "; ".join(m for h, m in opinions if h is worst and m)
        return worst, truncate_message(message)

    def reports(self, lease_seconds: int = 0) -> list[ReportedDevice]:
        """One entry per device that has a health now (see :meth:`device_health`),
        sorted, each with ``lease_seconds`` as its timeout (0: the cache's default)."""
        out: list[ReportedDevice] = []
        now = self._clock()
        for key in self.index.devices():
            found = self._health_at(key, now)
            if found is not None:
                out.append(ReportedDevice(key.pool, key.device, found[0], found[1], lease_seconds))
        return out

    def next_deadline(self) -> float | None:
        """When the next lease ends (a source's answer or an opinion), or None; a
        lease ends once the clock is past its deadline."""
        now = self._clock()
        deadlines: list[float] = []
        for state in self.sources.values():
            silence = state.last_answer + state.spec.timeout
            if silence > now:
                deadlines.append(silence)
            for opinion in state.opinions.values():
                if opinion.deadline is not None and opinion.deadline > now:
                    deadlines.append(opinion.deadline)
        return min(deadlines, default=None)


# --------------------------------------------------------------------------- pods


def pod_condition(
    devices: Sequence[tuple[DeviceKey, Health, str]],
    previous: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """The :data:`POD_CONDITION_TYPE` condition for a pod using ``devices`` (key, health,
    message): ``False`` (``DevicesUnhealthy``) when one is Unhealthy, ``Unknown``
    (``DevicesUnknown``) when none is but one is Unknown, else ``True``
    (``AllDevicesHealthy``). The message lists the devices that are not Healthy with
    their messages, cut to :data:`POD_CONDITION_MESSAGE_MAX` characters. The
    transition time is ``now`` when the status changes, else ``previous``'s."""
    bad = sorted((k, m) for k, h, m in devices if h is Health.UNHEALTHY)
    unknown = sorted((k, m) for k, h, m in devices if h is Health.UNKNOWN)
    total = len(devices)
    noun = "device" if total == 1 else "devices"
    if bad:
        status, reason = "False", REASON_DEVICES_UNHEALTHY
    elif unknown:
        status, reason = "Unknown", REASON_DEVICES_UNKNOWN
    else:
        status, reason = "True", REASON_ALL_DEVICES_HEALTHY
    if status == "True":
        message = f"{total} {noun} healthy"
    else:
        counts = []
        if bad:
            counts.append(f"{len(bad)} of {total} {noun} unhealthy")
        if unknown:
            counts.append(
                f"{len(unknown)} unknown" if bad else f"{len(unknown)} of {total} {noun} unknown"
            )
        parts = [_device_text(k, m, "Unhealthy") for k, m in bad]
        parts += [_device_text(k, m, "Unknown") for k, m in unknown]
        message = _cut(", ".join(counts) + ": ", parts)
    held = previous if isinstance(previous, Mapping) else None
    since = now
    if held is not None and held.get("status") == status:
        stamp = held.get("lastTransitionTime")
        if isinstance(stamp, str) and stamp:
            since = stamp
    return {
        "type": POD_CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }


def _device_text(key: DeviceKey, message: str, health: str) -> str:
    text = message.strip() or health
    if len(text) > _DEVICE_MESSAGE_MAX:
        text = text[: _DEVICE_MESSAGE_MAX - 3] + "..."
    return f"{key} ({text})"


def _cut(head: str, parts: list[str]) -> str:
    """``head`` + parts joined, as many as fit in the limit, then ``... and N more``."""
    out = head
    for i, part in enumerate(parts):
        sep = "" if i == 0 else ", "
        rest = len(parts) - i - 1
        tail = f", ... and {rest} more" if rest else ""
        if len(out) + len(sep) + len(part) + len(tail) > POD_CONDITION_MESSAGE_MAX:
            return out + f"{sep}... and {len(parts) - i} more"
        out += sep + part
    return out


def pod_condition_differs(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether writing ``desired`` would change the pod's condition (the transition
    time alone does not count)."""
    if not isinstance(current, Mapping):
        return True
    return any(current.get(f) != desired.get(f) for f in ("status", "reason", "message"))
