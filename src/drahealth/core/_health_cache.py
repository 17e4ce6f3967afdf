"""The node agent's device health cache: a sans-I/O state machine.

Owns :class:`HealthCache`: what each driver last reported for each of its devices,
the lease (health-check timeout) of every device, and the rules that turn a device
Unknown when its lease ends. It performs no I/O and never sleeps; time comes from
two injected clocks (a monotonic ``clock`` for every decision, a ``wall_clock`` for
display and persistence only). Persistence lives in ``drahealth.node._health_store``;
timers live in the agent, which asks :meth:`HealthCache.next_deadline` when to call
:meth:`HealthCache.expire`.

Semantics follow the kubelet's ``healthInfoCache`` (reference section 4) with these
deliberate improvements (reference section 9):

* leases are pushed at expiry (:meth:`~HealthCache.next_deadline` /
  :meth:`~HealthCache.expire`), not only discovered lazily at the next read or report;
* time in memory is monotonic; the plugin's ``last_updated_time`` is not used;
* input is bounded: empty or over-long names and devices beyond ``max_devices`` are
  skipped and counted, never stored; an empty report creates no driver entry;
* duplicates in one report collapse to one change (last entry wins);
* a restart grace period (:meth:`~HealthCache.restore`) keeps reloaded devices from
  flashing Unknown while their drivers reconnect;
* :meth:`~HealthCache.clear_driver` reports what it cleared.

Single-threaded by design: the agent owns one cache on one asyncio loop, so every
call runs to completion and a reader never sees a half-applied update.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence

from drahealth.core._health import DeviceKey, Health, truncate_message
from drahealth.core._records import ChangeReason, DeviceEntry, HealthChange, ReportedDevice

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "HealthCache"]

#: The kubelet's default lease for a device whose report carries no timeout.
DEFAULT_TIMEOUT_SECONDS = 30.0

_Clock = Callable[[], float]


class _Slot:
    """Mutable stored state of one device (the cache's private record)."""

    __slots__ = (
        "alive",
        "changed_wall",
        "device",
        "driver",
        "health",
        "last_seen",
        "last_seen_wall",
        "message",
        "pool",
        "queued",
        "timeout",
    )

    def __init__(
        self,
        driver: str,
        pool: str,
        device: str,
        health: Health,
        message: str,
        timeout: float,
        last_seen: float,
        last_seen_wall: float,
        changed_wall: float,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self.device = device
        self.health = health
        self.message = message
        self.timeout = timeout
        self.last_seen = last_seen
        self.last_seen_wall = last_seen_wall
        self.changed_wall = changed_wall
        #: Deadline of this slot's live heap item (None: not queued).
        self.queued: float | None = None
        #: False once the slot was removed from the cache (its heap items are dead).
        self.alive = True

    @property
    def key(self) -> DeviceKey:
        return DeviceKey(self.driver, self.pool, self.device)

    def stale(self, now: float) -> bool:
        """Upstream's staleness test: strictly more than the lease since last seen."""
        return now - self.last_seen > self.timeout

    def entry(self) -> DeviceEntry:
        return DeviceEntry(
            driver=self.driver,
            pool=self.pool,
            device=self.device,
            health=self.health,
            message=self.message,
            timeout=self.timeout,
            last_seen=self.last_seen,
            last_seen_wall=self.last_seen_wall,
            changed_wall=self.changed_wall,
        )


class HealthCache:
    """Per-driver, per-device health with leases; see the module docstring.

    ``default_timeout`` is the lease of devices reported with a timeout ``<= 0``.
    ``max_devices`` bounds the number of stored devices (all drivers together) and
    ``max_name_bytes`` the UTF-8 length of a pool or device name; entries breaking
    either bound are skipped and counted in :attr:`rejected_total`, and
    :attr:`last_rejection` says why the latest one was refused.
    """

    def __init__(
        self,
        *,
        default_timeout: float = DEFAULT_TIMEOUT_SECONDS,
        clock: _Clock = time.monotonic,
        wall_clock: _Clock = time.time,
        max_devices: int = 65_536,
        max_name_bytes: int = 253,
    ) -> None:
        if not (isinstance(default_timeout, int | float) and math.isfinite(default_timeout)):
            raise ValueError(f"default_timeout must be a finite number, got {default_timeout!r}")
        if default_timeout <= 0:
            raise ValueError(f"default_timeout must be > 0 seconds, got {default_timeout!r}")
        if max_devices < 0:
            raise ValueError(f"max_devices must be >= 0, got {max_devices!r}")
        if max_name_bytes < 1:
            raise ValueError(f"max_name_bytes must be >= 1, got {max_name_bytes!r}")
        self.default_timeout = float(default_timeout)
        self.max_devices = max_devices
        self.max_name_bytes = max_name_bytes
        self._clock = clock
        self._wall = wall_clock
        self._drivers: dict[str, dict[tuple[str, str], _Slot]] = {}
        self._count = 0
        # Min-heap of (deadline, tiebreak, slot). An item is live only while
        # ``slot.alive and slot.queued == deadline``; every other item is garbage
        # dropped when it reaches the top. Heartbeats move a deadline later without
        # touching the heap: the top is re-queued lazily (see ``_settle``).
        self._heap: list[tuple[float, int, _Slot]] = []
        self._seq = itertools.count()
        #: Report or restore entries refused (bad names, over ``max_devices``).
        self.rejected_total = 0
        #: Why the most recent entry was refused (None until one is).
        self.last_rejection: str | None = None

    # -- writes --------------------------------------------------------------------

    def update(self, driver: str, reports: Sequence[ReportedDevice]) -> list[HealthChange]:
        """Apply one stream message of ``driver`` (a full list of its devices).

        Phase 1: every listed device is refreshed (last seen now) and stored; it is a
        change when new (even if reported Unknown), or when health, message or the
        resolved lease differ. Phase 2: every other device of this driver whose
        stored health is not Unknown and whose lease has ended (strictly) becomes
        Unknown with an empty message (reason ``EXPIRED``); an omitted device whose
        lease still runs keeps its health. Returns the changes, phase 1 in report
        order, then phase 2 sorted by key.
        """
        self._check_driver(driver)
        now = self._clock()
        wall = self._wall()
        devices = self._drivers.get(driver)
        final: dict[tuple[str, str], ReportedDevice] = {}
        for report in reports:
            name = (report.pool, report.device)
            # names already in the cache were checked when they were added
            known = (
                devices is not None
                and type(report.pool) is str
                and type(report.device) is str
                and name in devices
            )
            if self._accept(driver, report, known=known):
                final[name] = report  # duplicates: last wins

        changes: list[HealthChange] = []
        for name, report in final.items():
            timeout = self._resolve_timeout(report.timeout_seconds)
            slot = None if devices is None else devices.get(name)
            message = report.message
            if message and (slot is None or message != slot.message):
                message = truncate_message(message)  # a stored message is already cut
            if slot is None:
                if self._count >= self.max_devices:
                    self._reject(
                        f"{driver}/{name[0]}/{name[1]}: cache is full ({self.max_devices} devices)"
                    )
                    continue
                if devices is None:
                    devices = self._drivers[driver] = {}
                slot = _Slot(driver, *name, report.health, message, timeout, now, wall, wall)
                devices[name] = slot
                self._count += 1
                changes.append(
                    HealthChange(
                        slot.key, Health.UNKNOWN, report.health, message, ChangeReason.REPORT
                    )
                )
            else:
                old = slot.health
                slot.last_seen = now
                slot.last_seen_wall = wall
                if old is not report.health or slot.message != message or slot.timeout != timeout:
                    slot.health = report.health
                    slot.message = message
                    slot.timeout = timeout
                    slot.changed_wall = wall
                    changes.append(
                        HealthChange(slot.key, old, report.health, message, ChangeReason.REPORT)
                    )
            self._queue(slot)

        if devices:
            expired = [
                slot
                for name, slot in devices.items()
                if name not in final and slot.health is not Health.UNKNOWN and slot.stale(now)
            ]
            expired.sort(key=lambda s: (s.pool, s.device))
            changes.extend(self._expire_slot(slot, wall) for slot in expired)
        return changes

    def expire(self) -> list[HealthChange]:
        """Turn every device whose lease has ended (strictly) into stored Unknown.

        The agent calls this when a timer set at :meth:`next_deadline` fires, so an
        expiry is noticed at the deadline, not at the next report or read. Returns the
        changes (reason ``EXPIRED``) in deadline order.
        """
        now = self._clock()
        wall = self._wall()
        changes: list[HealthChange] = []
        while (top := self._settle()) is not None and top.stale(now):
            heapq.heappop(self._heap)
            changes.append(self._expire_slot(top, wall))
        return changes

    def clear_driver(self, driver: str) -> list[HealthChange]:
        """Drop every device of ``driver`` (upstream ``clearDriver``).

        Unlike upstream, the devices whose stored health was not Unknown are
        returned as changes (reason ``CLEARED``), sorted by key, so callers can notify.
        """
        devices = self._drivers.pop(driver, None)
        if not devices:
            return []
        changes: list[HealthChange] = []
        for slot in sorted(devices.values(), key=lambda s: (s.pool, s.device)):
            slot.alive = False
            slot.queued = None
            if slot.health is not Health.UNKNOWN:
                changes.append(
                    HealthChange(slot.key, slot.health, Health.UNKNOWN, "", ChangeReason.CLEARED)
                )
        self._count -= len(devices)
        return changes

    def restore(self, entries: Iterable[DeviceEntry], *, grace: float) -> list[HealthChange]:
        """Load entries read from disk at agent start, with a restart grace period.

        Each entry keeps its stored health, message, lease and wall times; its
        ``last_seen`` is ignored and its lease restarts now: the device is treated as
        last seen at ``now - timeout + grace``, capped so that its deadline is
        ``now + min(grace, timeout)``. A stable device therefore does not flash
        Unknown after an agent restart (upstream reloads old timestamps, and since
        heartbeats are never persisted every device stable for longer than its lease
        reads Unknown at once); a driver that does not report again within the grace
        period decays to Unknown as usual.

        Entries whose device is already in the cache (a live report beat the
        restore) are skipped, as are malformed entries and entries beyond
        ``max_devices`` (counted in :attr:`rejected_total`). Duplicates: last wins.
        Returns one ``RESTORED`` change per restored entry whose health is not
        Unknown, sorted by key (for logging).
        """
        if not (isinstance(grace, int | float) and math.isfinite(grace)) or grace < 0:
            raise ValueError(f"grace must be a finite number >= 0 seconds, got {grace!r}")
        now = self._clock()
        final: dict[DeviceKey, DeviceEntry] = {}
        for entry in entries:
            problem = self._entry_problem(entry)
            if problem is not None:
                self._reject(problem)
                continue
            final[entry.key] = entry
        changes: list[HealthChange] = []
        for key in sorted(final):
            entry = final[key]
            devices = self._drivers.get(key.driver)
            if devices is not None and (key.pool, key.device) in devices:
                continue
            if self._count >= self.max_devices:
                self._reject(f"{key}: cache is full ({self.max_devices} devices)")
                continue
            timeout = float(entry.timeout)
            last_seen = now - timeout + min(grace, timeout)
            slot = _Slot(
                key.driver,
                key.pool,
                key.device,
                entry.health,
                truncate_message(entry.message),
                timeout,
                last_seen,
                entry.last_seen_wall,
                entry.changed_wall,
            )
            self._drivers.setdefault(key.driver, {})[(key.pool, key.device)] = slot
            self._count += 1
            self._queue(slot)
            if entry.health is not Health.UNKNOWN:
                changes.append(
                    HealthChange(
                        key, Health.UNKNOWN, entry.health, slot.message, ChangeReason.RESTORED
                    )
                )
        return changes

    # -- reads ---------------------------------------------------------------------

    def get(self, driver: str, pool: str, device: str) -> tuple[Health, str]:
        """Health and message as status generation must show them now.

        Absent device, or lease ended (strictly): ``(Unknown, "")`` (the stored
        entry is not modified); otherwise the stored values, which may be an
        explicitly reported Unknown with its message.
        """
        slot = self._slot(driver, pool, device)
        if slot is None or slot.stale(self._clock()):
            return Health.UNKNOWN, ""
        return slot.health, slot.message

    def entry(self, driver: str, pool: str, device: str) -> DeviceEntry | None:
        """The stored state of one device (lease not applied), or None."""
        slot = self._slot(driver, pool, device)
        return None if slot is None else slot.entry()

    def entries(self, driver: str | None = None) -> list[DeviceEntry]:
        """Stored state of every device (of ``driver`` when given), sorted by key."""
        if driver is None:
            slots = [s for devices in self._drivers.values() for s in devices.values()]
        else:
            slots = list(self._drivers.get(driver, {}).values())
        slots.sort(key=lambda s: (s.driver, s.pool, s.device))
        return [s.entry() for s in slots]

    def drivers(self) -> list[str]:
        """Drivers with at least one stored device, sorted."""
        return sorted(self._drivers)

    def __len__(self) -> int:
        """Number of stored devices, all drivers together (O(1))."""
        return self._count

    def min_timeout(self, driver: str) -> float:
        """The smallest lease among ``driver``'s devices (the default if it has none).

        A stream watchdog uses it: no message within this time means the stream is
        not delivering.
        """
        devices = self._drivers.get(driver)
        if not devices:
            return self.default_timeout
        return min(slot.timeout for slot in devices.values())

    def next_deadline(self) -> float | None:
        """Earliest ``last_seen + timeout`` of a device whose stored health is not
        Unknown (cache clock), or None when no lease is running."""
        top = self._settle()
        return None if top is None else top.last_seen + top.timeout

    # -- internals -----------------------------------------------------------------

    def _slot(self, driver: str, pool: str, device: str) -> _Slot | None:
        devices = self._drivers.get(driver)
        return None if devices is None else devices.get((pool, device))

    @staticmethod
    def _check_driver(driver: str) -> None:
        if not isinstance(driver, str) or not driver:
            raise ValueError(f"driver name must be a non-empty string, got {driver!r}")

    def _name_problem(self, what: str, value: object) -> str | None:
        if not isinstance(value, str):
            return f"{what} name must be a string, got {type(value).__name__}"
        if not value:
            return f"{what} name is empty"
        size = len(value.encode("utf-8", errors="surrogatepass"))
        if size > self.max_name_bytes:
            return f"{what} name is {size} bytes long (limit {self.max_name_bytes})"
        return None

    def _accept(self, driver: str, report: ReportedDevice, *, known: bool = False) -> bool:
        problem = None
        if not known:
            problem = self._name_problem("pool", report.pool) or self._name_problem(
                "device", report.device
            )
        if problem is None and not isinstance(report.health, Health):
            problem = f"health {report.health!r} is not a Health value"
        if problem is None and not isinstance(report.message, str):
            problem = f"message must be a string, got {type(report.message).__name__}"
        if problem is None and (
            not isinstance(report.timeout_seconds, int | float)
            or isinstance(report.timeout_seconds, bool)
        ):
            problem = f"timeout_seconds {report.timeout_seconds!r} is not a number"
        if problem is None:
            return True
        self._reject(f"{driver}: report entry {report.pool!r}/{report.device!r}: {problem}")
        return False

    def _entry_problem(self, entry: DeviceEntry) -> str | None:
        if not isinstance(entry.driver, str) or not entry.driver:
            return f"restored entry {entry!r}: driver name is empty"
        problem = self._name_problem("pool", entry.pool) or self._name_problem(
            "device", entry.device
        )
        if problem is None and not isinstance(entry.health, Health):
            problem = f"health {entry.health!r} is not a Health value"
        if problem is None and not isinstance(entry.message, str):
            problem = f"message must be a string, got {type(entry.message).__name__}"
        if problem is None and not (
            isinstance(entry.timeout, int | float)
            and not isinstance(entry.timeout, bool)
            and math.isfinite(entry.timeout)
            and entry.timeout > 0
        ):
            problem = f"timeout {entry.timeout!r} is not a positive number of seconds"
        if problem is None:
            return None
        return f"restored entry {entry.driver}/{entry.pool!r}/{entry.device!r}: {problem}"

    def _reject(self, why: str) -> None:
        self.rejected_total += 1
        self.last_rejection = why

    def _resolve_timeout(self, seconds: float) -> float:
        if seconds > 0 and math.isfinite(seconds):
            return float(seconds)
        return self.default_timeout

    def _expire_slot(self, slot: _Slot, wall: float) -> HealthChange:
        old = slot.health
        slot.health = Health.UNKNOWN
        slot.message = ""
        slot.changed_wall = wall
        slot.queued = None
        return HealthChange(slot.key, old, Health.UNKNOWN, "", ChangeReason.EXPIRED)

    def _queue(self, slot: _Slot) -> None:
        """Keep the invariant: a live non-Unknown slot has a live heap item whose
        deadline is <= its real deadline."""
        if slot.health is Health.UNKNOWN:
            slot.queued = None
            return
        deadline = slot.last_seen + slot.timeout
        if slot.queued is not None and slot.queued <= deadline:
            return  # the queued item fires no later; _settle re-queues it lazily
        self._push(slot, deadline)

    def _push(self, slot: _Slot, deadline: float) -> None:
        slot.queued = deadline
        heapq.heappush(self._heap, (deadline, next(self._seq), slot))
        if len(self._heap) > 2 * self._count + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        """Drop garbage items: one item per queued slot (amortized O(1) per push)."""
        self._heap = [
            (slot.queued, next(self._seq), slot)
            for devices in self._drivers.values()
            for slot in devices.values()
            if slot.queued is not None
        ]
        heapq.heapify(self._heap)

    def _settle(self) -> _Slot | None:
        """Make the heap top a live item whose deadline is exact; that slot or None."""
        while self._heap:
            deadline, _, slot = self._heap[0]
            if not slot.alive or slot.queued != deadline:
                heapq.heappop(self._heap)
                continue
            real = slot.last_seen + slot.timeout
            if real > deadline:  # refreshed since it was queued: move it back
                heapq.heappop(self._heap)
                self._push(slot, real)
                continue
            return slot
        return None
