"""DeviceHealthModel: the driver side's device-health decisions, without I/O.

Owns the values a health source hands in (:class:`DeviceReport`), the aggregate it
produces per device (:class:`DeviceState`), the hysteresis for clearing a latched
fault (:class:`RecoveryPolicy`), the :class:`HealthReportSink` protocol every source
reports to, and :class:`DeviceHealthModel`: per-source contributions, worst-of
aggregation, sticky severity with explicit recovery, the device list with per-device
timeouts, and a version that increases on every aggregate change. Time comes only from
the injected clocks; nothing here serves, encodes, schedules or notifies (the driver's
``HealthHub`` wraps the model with the dra-health stream fan-out).

Aggregation rules
-----------------
* Each source's latest report per device is its *contribution*. A device's health is
  the worst contribution (Healthy < Unknown < Unhealthy); a device no source covers is
  Unknown. The message is that of the worst contribution(s): latched faults first, then
  by source name, distinct non-empty messages joined by ``"; "``.
* A fatal report (``fatal=True``, or ``fatal=None`` with Unhealthy) *latches* that
  source's contribution at Unhealthy with the fault's message. While latched, the
  source's Unknown or informational (non-fatal) Unhealthy reports do not change it.
* A latch clears only when
  - the same source reports Healthy ``RecoveryPolicy.consecutive_healthy`` times in a
    row, the first of them at least ``healthy_for_seconds`` (injected clock) before the
    last (checked when a report arrives; the model runs no timers); any non-Healthy
    report from that source restarts the count; or
  - the ``"operator"`` source reports Healthy (immediate; clears every latch of the
    device; the operator's Healthy is a command and is not kept as a contribution); or
  - ``recover()`` is called. A source whose latest report was the fatal fault itself
    then contributes Healthy: explicit recovery means "the fault is fixed".
  Other sources' Healthy reports never clear a latch.
* ``forget_source`` drops a source's contributions but (by default) keeps its latches:
  a source going away must not silently clear a fatal fault.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from drahealth.core._health import Health

__all__ = [
    "OPERATOR_SOURCE",
    "DeviceHealthModel",
    "DeviceReport",
    "DeviceState",
    "HealthReportSink",
    "RecoveryPolicy",
]

#: Source name whose Healthy report is an explicit operator recovery.
OPERATOR_SOURCE = "operator"

_DeviceId = tuple[str, str]


@dataclass(frozen=True, slots=True)
class DeviceReport:
    """One source's observation of one device.

    ``fatal``: ``None`` infers it (Unhealthy is fatal, Unknown/Healthy are not);
    ``False`` on an Unhealthy report makes it informational (never overrides a latched
    fault); ``True`` is only valid with Unhealthy.
    """

    pool: str
    device: str
    health: Health
    message: str = ""
    fatal: bool | None = None


class HealthReportSink(Protocol):
    """What a health source reports to: ``submit(source, reports)``, all or nothing.

    Raises ValueError for reports it rejects (unknown devices, malformed values).
    Implemented by :class:`DeviceHealthModel` and the driver's ``HealthHub``.
    """

    def submit(self, source: str, reports: Iterable[DeviceReport], /) -> object: ...


@dataclass(frozen=True)
class RecoveryPolicy:
    """Hysteresis for clearing a latched fault by the source that raised it."""

    consecutive_healthy: int = 1
    healthy_for_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.consecutive_healthy < 1:
            raise ValueError(
                f"RecoveryPolicy.consecutive_healthy must be >= 1, got {self.consecutive_healthy}"
            )
        if self.healthy_for_seconds < 0:
            raise ValueError(
                f"RecoveryPolicy.healthy_for_seconds must be >= 0, got {self.healthy_for_seconds}"
            )


@dataclass(frozen=True)
class DeviceState:
    """Aggregated health of one device, as served on the wire and to subscribers."""

    pool: str
    device: str
    health: Health
    message: str
    #: ``clock()`` time of the last change of health or message.
    since: float
    #: A fatal fault is latched until explicit recovery.
    sticky: bool
    #: Each source's effective contribution (a latched source reads Unhealthy).
    sources: Mapping[str, Health] = field(hash=False)
    #: ``health_check_timeout_seconds`` sent on the wire.
    timeout_seconds: int
    #: ``wall_clock()`` time (unix seconds) of ``since``; ``last_updated_time`` on the wire.
    updated_at: float = 0.0


@dataclass(slots=True)
class _Contribution:
    """One source's view of one device."""

    health: Health | None  # latest report; None once the source is forgotten (latch only)
    message: str = ""
    fatal: bool = False
    latch: str | None = None  # message of the latched fatal fault
    streak: int = 0  # consecutive Healthy reports while latched
    streak_since: float = 0.0  # clock() of the first of them

    def effective(self) -> tuple[Health, str, bool] | None:
        if self.latch is not None:
            return Health.UNHEALTHY, self.latch, True
        if self.health is None:
            return None
        return self.health, self.message, False

    def clear_latch(self) -> None:
        self.latch = None
        self.streak = 0
        if self.health is Health.UNHEALTHY and self.fatal:
            self.health, self.message, self.fatal = Health.HEALTHY, "", False


@dataclass(slots=True)
class _Device:
    pool: str
    device: str
    timeout: int
    state: DeviceState
    sources: dict[str, _Contribution] = field(default_factory=dict)


def _check_timeout(seconds: int, what: str) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds <= 0:
        raise ValueError(f"{what} must be a positive int (seconds), got {seconds!r}")
    return seconds


def _name(dev: _DeviceId) -> str:
    return f"{dev[0]}/{dev[1]}"


class DeviceHealthModel:
    """Per-source device reports in, one aggregated :class:`DeviceState` per device out.

    Every mutating call returns the states whose aggregate changed and bumps
    :attr:`version` when anything changed (including devices being removed). See the
    module docstring for the aggregation and recovery rules.
    """

    def __init__(
        self,
        devices: Iterable[tuple[str, str]] = (),
        *,
        default_timeout_seconds: int,
        recovery: RecoveryPolicy = RecoveryPolicy(),  # frozen, so sharing it is safe
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self._default_timeout = _check_timeout(default_timeout_seconds, "default_timeout_seconds")
        self._recovery = recovery
        self._clock = clock
        self._wall = wall_clock
        self._devices: dict[_DeviceId, _Device] = {}
        self._version = 0
        self._snapshot: list[DeviceState] | None = None
        self._order: list[_Device] | None = None  # records by (pool, device); None: re-sort
        self.set_devices(devices)

    # -- properties ------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Increases by one on every aggregate change."""
        return self._version

    @property
    def smallest_timeout(self) -> int:
        """The smallest per-device timeout (the default one when there are no devices)."""
        return min((d.timeout for d in self._devices.values()), default=self._default_timeout)

    # -- device list -----------------------------------------------------------------

    def set_devices(
        self,
        devices: Iterable[tuple[str, str]],
        timeouts: Mapping[tuple[str, str], int] | None = None,
    ) -> list[DeviceState]:
        """Replace the device list; returns the states of added or re-timed devices.

        New devices start Unknown (no source covers them yet). Existing devices keep
        their state and timeout unless ``timeouts`` names them; removed devices are
        dropped with their contributions and latches.
        """
        wanted: dict[_DeviceId, None] = {}
        for dev in devices:
            pool, device = dev
            if not isinstance(pool, str) or not isinstance(device, str):
                raise ValueError(f"device {dev!r} is not a (pool, device) pair of strings")
            wanted[(pool, device)] = None
        timeouts = dict(timeouts or {})
        stray = [d for d in timeouts if d not in wanted]
        if stray:
            raise ValueError(
                "timeouts name devices not in the device list: " + ", ".join(map(_name, stray))
            )
        for dev, seconds in timeouts.items():
            _check_timeout(seconds, f"timeout of {_name(dev)}")
        removed = [d for d in self._devices if d not in wanted]
        for dev in removed:
            del self._devices[dev]
        if removed:
            self._order = None
        changed: list[DeviceState] = []
        now, wall = self._clock(), self._wall()
        for dev in wanted:
            rec = self._devices.get(dev)
            if rec is None:
                timeout = timeouts.get(dev, self._default_timeout)
                state = DeviceState(
                    dev[0], dev[1], Health.UNKNOWN, "", now, False, MappingProxyType({}),
                    timeout, wall,
                )  # fmt: skip
                self._devices[dev] = _Device(dev[0], dev[1], timeout, state)
                self._order = None
                changed.append(state)
            elif dev in timeouts and timeouts[dev] != rec.timeout:
                rec.timeout = timeouts[dev]
                changed.extend(self._refresh([rec]))
        return self._commit(changed, force=bool(removed))

    def set_timeout(self, pool: str, device: str, seconds: int) -> DeviceState:
        """Set one device's ``health_check_timeout_seconds``."""
        rec = self._get(pool, device)
        rec.timeout = _check_timeout(seconds, f"timeout of {pool}/{device}")
        self._commit(self._refresh([rec]))
        return rec.state

    # -- reports ---------------------------------------------------------------------

    def submit(self, source: str, reports: Iterable[DeviceReport]) -> list[DeviceState]:
        """Apply one source's reports (all or nothing); returns the states that changed.

        Raises ValueError naming every device not in the device list, and for
        malformed reports; nothing is applied then.
        """
        if not isinstance(source, str) or not source:
            raise ValueError(f"source must be a non-empty string, got {source!r}")
        batch = list(reports)
        unknown: dict[_DeviceId, None] = {}
        checked: list[tuple[_Device, Health, str, bool]] = []
        for rep in batch:
            if not isinstance(rep, DeviceReport):
                raise ValueError(f"reports must be DeviceReport, got {type(rep).__name__}")
            rec = self._devices.get((rep.pool, rep.device))
            if rec is None:
                unknown[(rep.pool, rep.device)] = None
                continue
            try:
                health = Health(rep.health)
            except ValueError:
                raise ValueError(
                    f"report for {rep.pool}/{rep.device}: invalid health {rep.health!r}"
                ) from None
            if not isinstance(rep.message, str):
                raise ValueError(f"report for {rep.pool}/{rep.device}: message must be a str")
            if rep.fatal and health is not Health.UNHEALTHY:
                raise ValueError(
                    f"report for {rep.pool}/{rep.device}: only an Unhealthy report can be fatal"
                )
            fatal = rep.fatal if rep.fatal is not None else health is Health.UNHEALTHY
            checked.append((rec, health, rep.message, fatal))
        if unknown:
            raise ValueError(
                f"source {source!r} reported devices unknown to the hub: "
                + ", ".join(map(_name, unknown))
            )
        touched: dict[_DeviceId, _Device] = {}
        now = self._clock()
        for rec, health, message, fatal in checked:
            self._apply(rec, source, health, message, fatal, now)
            touched[(rec.pool, rec.device)] = rec
        return self._commit(self._refresh(touched.values()))

    def recover(self, pool: str, device: str, source: str | None = None) -> DeviceState:
        """Explicit operator recovery: clear the latched fault of ``source`` (or all).

        A cleared source whose latest report was the fault itself now contributes
        Healthy; other contributions are untouched. Returns the device's new state.
        """
        rec = self._get(pool, device)
        self._clear_latches(rec, source)
        self._commit(self._refresh([rec]))
        return rec.state

    def forget_source(self, source: str, *, keep_faults: bool = True) -> list[DeviceState]:
        """A source went away: drop its contributions; returns the states that changed.

        Devices no remaining source covers become Unknown. With ``keep_faults`` (the
        default) the source's latched faults stay until recovered (by ``recover``, the
        operator, or the same source coming back and reporting Healthy).
        """
        touched: list[_Device] = []
        for rec in self._devices.values():
            c = rec.sources.get(source)
            if c is None:
                continue
            touched.append(rec)
            if keep_faults and c.latch is not None:
                c.health, c.message, c.fatal, c.streak = None, "", False, 0
            else:
                del rec.sources[source]
        return self._commit(self._refresh(touched))

    # -- reading ---------------------------------------------------------------------

    def state(self, pool: str, device: str) -> DeviceState:
        """The device's current state; ValueError if the model does not know it."""
        return self._get(pool, device).state

    def snapshot(self) -> list[DeviceState]:
        """Every device's state, ordered by (pool, device)."""
        if self._snapshot is None:
            if self._order is None:
                self._order = [self._devices[k] for k in sorted(self._devices)]
            self._snapshot = [rec.state for rec in self._order]
        return list(self._snapshot)

    # -- internals -------------------------------------------------------------------

    def _get(self, pool: str, device: str) -> _Device:
        rec = self._devices.get((pool, device))
        if rec is None:
            raise ValueError(f"device {pool}/{device} is unknown to the hub")
        return rec

    def _apply(
        self, rec: _Device, source: str, health: Health, message: str, fatal: bool, now: float
    ) -> None:
        """Record one report as ``source``'s contribution to ``rec`` (latch, streak)."""
        if source == OPERATOR_SOURCE and health is Health.HEALTHY:
            self._clear_latches(rec, None)
            rec.sources.pop(OPERATOR_SOURCE, None)
            return
        c = rec.sources.get(source)
        if c is None:
            c = rec.sources[source] = _Contribution(None)
        c.health, c.message, c.fatal = health, message, fatal
        if fatal:
            c.latch = message
            c.streak = 0
        elif c.latch is not None:
            if health is not Health.HEALTHY:
                c.streak = 0
                return
            if c.streak == 0:
                c.streak_since = now
            c.streak += 1
            policy = self._recovery
            if (
                c.streak >= policy.consecutive_healthy
                and now - c.streak_since >= policy.healthy_for_seconds
            ):
                c.clear_latch()

    @staticmethod
    def _clear_latches(rec: _Device, source: str | None) -> None:
        for name in [source] if source is not None else list(rec.sources):
            c = rec.sources.get(name)
            if c is None or c.latch is None:
                continue
            c.clear_latch()
            if c.health is None:
                del rec.sources[name]

    def _refresh(self, recs: Iterable[_Device]) -> list[DeviceState]:
        """Recompute the aggregate of ``recs``; return the states that changed."""
        changed: list[DeviceState] = []
        for rec in recs:
            effective: list[tuple[str, Health, str, bool]] = []
            for name in sorted(rec.sources):
                eff = rec.sources[name].effective()
                if eff is not None:
                    effective.append((name, *eff))
            if effective:
                health = Health.worst(*(e[1] for e in effective))
                worst = [e for e in effective if e[1] is health]
                worst.sort(key=lambda e: (not e[3], e[0]))
                message = "; ".join(dict.fromkeys(e[2] for e in worst if e[2]))
            else:
                health, message = Health.UNKNOWN, ""
            sticky = any(c.latch is not None for c in rec.sources.values())
            sources = {e[0]: e[1] for e in effective}
            old = rec.state
            if (
                old.health is health
                and old.message == message
                and old.sticky == sticky
                and old.timeout_seconds == rec.timeout
                and dict(old.sources) == sources
            ):
                continue
            since, updated_at = old.since, old.updated_at
            if old.health is not health or old.message != message:
                since, updated_at = self._clock(), self._wall()
            rec.state = DeviceState(
                rec.pool, rec.device, health, message, since, sticky,
                MappingProxyType(sources), rec.timeout, updated_at,
            )  # fmt: skip
            changed.append(rec.state)
        return changed

    def _commit(self, changed: list[DeviceState], *, force: bool = False) -> list[DeviceState]:
        if changed or force:
            self._version += 1
            self._snapshot = None
        return changed
