"""The node agent's device health cache: a sans-I/O state machine.

Owns :class:`HealthCache`: what each driver last reported for each of its devices,
the lease (health-check timeout) of every device, and the rules that turn a device
Unknown when its lease ends and forget it when its driver no longer lists it. It
performs no I/O and never sleeps; time comes from two injected clocks (a monotonic
``clock`` for every decision, a ``wall_clock`` for display and persistence). Also owns
the name rules for agent input (:func:`device_name_problem`, :func:`pool_name_problem`,
:func:`driver_name_problem`). Persistence lives in ``drahealth.node._health_store``;
timers live in the agent, which asks :meth:`HealthCache.next_deadline` when to call
:meth:`HealthCache.expire`.

Semantics follow the kubelet's ``healthInfoCache`` (reference section 4) with these
deliberate improvements (reference section 9):

* leases are pushed at expiry (:meth:`~HealthCache.next_deadline` /
  :meth:`~HealthCache.expire`), not only discovered lazily at the next read or report;
* time in memory is monotonic; the plugin's ``last_updated_time`` is not used;
* input is validated and bounded (reference item 18): pool and device names must be
  what the API accepts in a ResourceSlice (device: DNS label, at most 63 characters;
  pool: DNS subdomains joined by ``/``, at most 253), leases are clamped to
  ``max_lease`` (1 hour by default), each driver may store at most
  ``max_devices_per_driver`` devices and the node ``max_devices``; refused entries are
  counted per driver and reason (:attr:`HealthCache.rejections`), never stored;
* a device its driver stops listing is forgotten (reason ``DROPPED``) once its lease
  has ended, so junk does not accumulate; an empty report creates no driver entry;
* duplicates in one report collapse to one entry: the worst health wins (Unhealthy >
  Unknown > Healthy; among equals the later entry);
* a driver that goes away (:meth:`~HealthCache.retire_driver`) keeps its devices' health
  for at most a capped time, then they are forgotten (upstream clears at once, without
  notifying anyone);
* :meth:`~HealthCache.restore` keeps the recorded timing: a device whose lease ended
  while the agent was down is not restored (reads Unknown at once); one with lease left
  keeps its health until ``seen + timeout`` (wall clock);
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
from drahealth.core._names import matches_dns_label, matches_dns_subdomain
from drahealth.core._records import ChangeReason, DeviceEntry, HealthChange, ReportedDevice

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "DEVICE_NAME_MAX",
    "DRIVER_NAME_MAX",
    "MAX_DEVICES",
    "MAX_DEVICES_PER_DRIVER",
    "MAX_LEASE_SECONDS",
    "POOL_NAME_MAX",
    "SAVE_LAG_MAX_SECONDS",
    "HealthCache",
    "device_name_problem",
    "driver_name_problem",
    "pool_name_problem",
]

#: The kubelet's default lease for a device whose report carries no timeout.
DEFAULT_TIMEOUT_SECONDS = 30.0
#: Longest lease a driver may declare; longer ones (up to 2^63-1 s on the wire) are cut.
MAX_LEASE_SECONDS = 3600.0
#: Devices stored for all drivers together.
MAX_DEVICES = 65_536
#: Devices stored for one driver.
MAX_DEVICES_PER_DRIVER = 4_096
#: A refreshed device's last-seen time is handed out for saving when the saved one is
#: older than a quarter of its lease, and never more than this many seconds old.
SAVE_LAG_MAX_SECONDS = 10.0

#: Name limits of the resource.k8s.io API (ResourceSlice validation).
DEVICE_NAME_MAX = 63
POOL_NAME_MAX = 253
DRIVER_NAME_MAX = 63

#: Rejection reasons (the ``reason`` of :attr:`HealthCache.rejections`).
INVALID, DRIVER_FULL, NODE_FULL = "invalid", "driver_full", "node_full"


def _shown(value: str) -> str:
    """``value`` for a log line: repr (control characters escaped), at most 80 characters."""
    return repr(value[:77] + "..." if len(value) > 80 else value)


def device_name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid device name (a DNS label of at most 63 characters)."""
    if not isinstance(name, str):
        return f"device name must be a string, got {type(name).__name__}"
    if not name:
        return "device name is empty"
    if len(name) > DEVICE_NAME_MAX:
        return f"device name is {len(name)} characters long (limit {DEVICE_NAME_MAX})"
    if not matches_dns_label(name):
        return (
            f"device name {_shown(name)} is not a DNS label (lowercase letters, digits and "
            "'-', starting and ending with a letter or digit)"
        )
    return None


def pool_name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid pool name (DNS subdomains joined by ``/``, <= 253)."""
    if not isinstance(name, str):
        return f"pool name must be a string, got {type(name).__name__}"
    if not name:
        return "pool name is empty"
    if len(name) > POOL_NAME_MAX:
        return f"pool name is {len(name)} characters long (limit {POOL_NAME_MAX})"
    if not all(matches_dns_subdomain(part) for part in name.split("/")):
        return (
            f"pool name {_shown(name)} is not DNS subdomains separated by '/' (lowercase "
            "letters, digits, '-' and '.')"
        )
    return None


def driver_name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid DRA driver name (a DNS subdomain, <= 63 characters)."""
    if not isinstance(name, str):
        return f"driver name must be a string, got {type(name).__name__}"
    if not name:
        return "driver name is empty"
    if len(name) > DRIVER_NAME_MAX:
        return f"driver name is {len(name)} characters long (limit {DRIVER_NAME_MAX})"
    if not matches_dns_subdomain(name):
        return f"driver name {_shown(name)} is not a DNS subdomain"
    return None


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
        "saved_wall",
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
        #: ``last_seen_wall`` as last handed out for saving.
        self.saved_wall = last_seen_wall

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

    ``default_timeout`` is the lease of devices reported with a timeout ``<= 0``;
    ``max_lease`` caps every lease. ``max_devices_per_driver`` bounds the devices
    stored for one driver and ``max_devices`` those of all drivers together. Entries
    breaking a rule are skipped and counted in :attr:`rejected_total` and
    :attr:`rejections`; :attr:`last_rejection` says why the latest one was refused.
    """

    def __init__(
        self,
        *,
        default_timeout: float = DEFAULT_TIMEOUT_SECONDS,
        clock: _Clock = time.monotonic,
        wall_clock: _Clock = time.time,
        max_devices: int = MAX_DEVICES,
        max_devices_per_driver: int = MAX_DEVICES_PER_DRIVER,
        max_lease: float = MAX_LEASE_SECONDS,
    ) -> None:
        for what, value in (("default_timeout", default_timeout), ("max_lease", max_lease)):
            if not (isinstance(value, int | float) and math.isfinite(value)) or value <= 0:
                raise ValueError(f"{what} must be a finite number > 0 seconds, got {value!r}")
        if default_timeout > max_lease:
            raise ValueError(
                f"default_timeout ({default_timeout!r} s) must not exceed max_lease "
                f"({max_lease!r} s)"
            )
        if max_devices < 0:
            raise ValueError(f"max_devices must be >= 0, got {max_devices!r}")
        if max_devices_per_driver < 0:
            raise ValueError(f"max_devices_per_driver must be >= 0, got {max_devices_per_driver!r}")
        self.default_timeout = float(default_timeout)
        self.max_lease = float(max_lease)
        self.max_devices = max_devices
        self.max_devices_per_driver = max_devices_per_driver
        self._clock = clock
        self._wall = wall_clock
        self._drivers: dict[str, dict[tuple[str, str], _Slot]] = {}
        self._count = 0
        # Drivers without a live source (gone, or restored and not reported since): a
        # device of theirs is forgotten, not kept as Unknown, when its lease ends.
        self._retired: set[str] = set()
        # Min-heap of (deadline, tiebreak, slot). An item is live only while
        # ``slot.alive and slot.queued == deadline``; every other item is garbage
        # dropped when it reaches the top. Heartbeats move a deadline later without
        # touching the heap: the top is re-queued lazily (see ``_settle``).
        self._heap: list[tuple[float, int, _Slot]] = []
        self._seq = itertools.count()
        self._heartbeats: list[_Slot] = []
        #: Report or restore entries refused (bad names or fields, over a bound).
        self.rejected_total = 0
        #: Refused entries per (driver, reason); reasons: ``invalid``, ``driver_full``,
        #: ``node_full``. Keys are drivers that reported (or were restored).
        self.rejections: dict[tuple[str, str], int] = {}
        #: Why the most recent entry was refused (None until one is).
        self.last_rejection: str | None = None

    # -- writes --------------------------------------------------------------------

    def update(self, driver: str, reports: Sequence[ReportedDevice]) -> list[HealthChange]:
        """Apply one stream message of ``driver`` (a full list of its devices).

        Entries with bad names or fields are refused. Duplicates collapse to the
        worst health (among equals the later entry). Every listed device is then
        refreshed (last seen now) and stored; it is a change when new (even if
        reported Unknown), or when health, message or the resolved lease differ. New
        devices beyond the driver's or the node's bound are refused, keeping the most
        severe (Unhealthy first, then report order). Every other device of this
        driver whose lease has ended (strictly) is forgotten (reason ``DROPPED``); an
        omitted device whose lease still runs keeps its health. Returns the changes:
        reported ones in report order, then dropped ones sorted by key.
        """
        self._check_driver(driver)
        now = self._clock()
        wall = self._wall()
        self._heartbeats = []
        self._retired.discard(driver)
        devices = self._drivers.get(driver)
        final: dict[tuple[str, str], ReportedDevice] = {}
        for report in reports:
            # names already in the cache were checked when they were added
            known = (
                devices is not None
                and type(report.pool) is str
                and type(report.device) is str
                and (report.pool, report.device) in devices
            )
            if not self._accept(driver, report, known=known):
                continue
            name = (report.pool, report.device)
            previous = final.get(name)
            if previous is None or report.health.severity >= previous.health.severity:
                final[name] = report

        dropped: list[HealthChange] = []
        if devices:
            stale = [
                slot for name, slot in devices.items() if name not in final and slot.stale(now)
            ]
            stale.sort(key=lambda s: (s.pool, s.device))
            dropped = [self._drop(slot) for slot in stale]
            devices = self._drivers.get(driver)

        admitted = self._admit(driver, devices, final)
        changes: list[HealthChange] = []
        for name, report in final.items():
            timeout = self._resolve_timeout(report.timeout_seconds)
            slot = None if devices is None else devices.get(name)
            message = report.message
            if message and (slot is None or message != slot.message):
                message = truncate_message(message)  # a stored message is already cut
            if slot is None:
                if name not in admitted:
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
                    slot.saved_wall = wall  # its change record carries the new time
                    changes.append(
                        HealthChange(slot.key, old, report.health, message, ChangeReason.REPORT)
                    )
                elif wall - slot.saved_wall >= min(slot.timeout / 4, SAVE_LAG_MAX_SECONDS):
                    slot.saved_wall = wall
                    self._heartbeats.append(slot)
            self._queue(slot)
        changes.extend(dropped)
        return changes

    def take_heartbeats(self) -> list[DeviceEntry]:
        """Devices the last :meth:`update` refreshed without a change whose saved
        last-seen time had fallen behind (see ``SAVE_LAG_MAX_SECONDS``); the caller
        saves them so a restart knows how much of each lease is left. Taking them
        marks them saved."""
        slots, self._heartbeats = self._heartbeats, []
        return [slot.entry() for slot in slots if slot.alive]

    def expire(self) -> list[HealthChange]:
        """Apply every lease that has ended (strictly).

        The agent calls this when a timer set at :meth:`next_deadline` fires, so an
        expiry is noticed at the deadline, not at the next report or read. A device
        of a live driver becomes stored Unknown (reason ``EXPIRED``); one of a retired
        driver is forgotten (reason ``DROPPED``). Changes come in deadline order.
        """
        now = self._clock()
        wall = self._wall()
        changes: list[HealthChange] = []
        while (top := self._settle()) is not None and top.stale(now):
            heapq.heappop(self._heap)
            if top.driver in self._retired:
                changes.append(self._drop(top))
            elif top.health is Health.UNKNOWN:
                top.queued = None  # queued while its driver was retired: nothing to do
            else:
                changes.append(self._expire_slot(top, wall))
        return changes

    def retire_driver(self, driver: str, grace: float) -> list[HealthChange]:
        """``driver`` has no source of health any more (its last instance went away).

        Its devices keep their health for at most ``grace`` more seconds (a lease
        that ends sooner still ends sooner); then they are forgotten (reason
        ``DROPPED``), as are at once its devices that are stored Unknown or whose
        lease has ended. A capped device's stored lease is shortened so that
        ``last seen + lease`` is the capped deadline (callers persist
        :meth:`entries` of the driver). A later report of the driver ends the
        retirement. Returns the dropped devices' changes, sorted by key.
        """
        if not (isinstance(grace, int | float) and math.isfinite(grace)) or grace < 0:
            raise ValueError(f"grace must be a finite number >= 0 seconds, got {grace!r}")
        devices = self._drivers.get(driver)
        if not devices:
            return []
        self._retired.add(driver)
        now = self._clock()
        changes: list[HealthChange] = []
        for slot in sorted(devices.values(), key=lambda s: (s.pool, s.device)):
            if slot.health is Health.UNKNOWN or slot.stale(now):
                changes.append(self._drop(slot))
            elif slot.last_seen + slot.timeout > now + grace:
                slot.timeout = now + grace - slot.last_seen
                self._push(slot, now + grace)
        return changes

    def clear_driver(self, driver: str) -> list[HealthChange]:
        """Drop every device of ``driver`` (upstream ``clearDriver``).

        Unlike upstream, the devices whose stored health was not Unknown are
        returned as changes (reason ``CLEARED``), sorted by key, so callers can notify.
        """
        self._retired.discard(driver)
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

    def restore(self, entries: Iterable[DeviceEntry]) -> list[HealthChange]:
        """Load entries read from disk at agent start, keeping their recorded timing.

        An entry's lease ends at ``last_seen_wall + timeout`` (unix seconds, the
        lease clamped to ``max_lease``): an entry whose lease ended while the agent
        was down is not restored (the device reads Unknown at once); any other keeps
        its health and message (an explicitly reported Unknown too) until that moment
        (mapped onto the monotonic clock; a last-seen time in the future counts as
        now). Restored drivers are retired (:meth:`retire_driver`) until they report:
        a device whose lease ends before its driver reports again is forgotten.

        Entries whose device is already in the cache (a live report beat the
        restore) are skipped, as are malformed entries and entries beyond the
        bounds (counted in :attr:`rejected_total`). Duplicates: last wins. Returns
        one ``RESTORED`` change per restored entry whose health is not Unknown, sorted
        by key.
        """
        now = self._clock()
        wall = self._wall()
        final: dict[DeviceKey, DeviceEntry] = {}
        for entry in entries:
            problem = self._entry_problem(entry)
            if problem is not None:
                driver = entry.driver if isinstance(entry.driver, str) else ""
                self._reject(driver, INVALID, problem)
                continue
            final[entry.key] = entry
        changes: list[HealthChange] = []
        for key in sorted(final):
            entry = final[key]
            timeout = min(float(entry.timeout), self.max_lease)
            remaining = min(entry.last_seen_wall + timeout - wall, timeout)
            if remaining < 0:
                continue
            devices = self._drivers.get(key.driver)
            if devices is not None and (key.pool, key.device) in devices:
                continue
            full = self._full(key.driver, len(devices) if devices else 0)
            if full is not None:
                self._reject(key.driver, full, f"restored entry {key}: {self._full_text(full)}")
                continue
            if key.driver not in self._drivers:
                self._retired.add(key.driver)
            slot = _Slot(
                key.driver,
                key.pool,
                key.device,
                entry.health,
                truncate_message(entry.message),
                timeout,
                now - (timeout - remaining),
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

    def device_count(self, driver: str) -> int:
        """Number of stored devices of ``driver``."""
        return len(self._drivers.get(driver, ()))

    def retired(self, driver: str) -> bool:
        """Whether ``driver`` is retired (gone, or restored and silent since)."""
        return driver in self._retired

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
        Unknown or whose driver is retired (cache clock), or None when no lease is
        running."""
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

    def _full(self, driver: str, stored: int) -> str | None:
        """The bound a new device of ``driver`` (holding ``stored``) would break."""
        if stored >= self.max_devices_per_driver:
            return DRIVER_FULL
        if self._count >= self.max_devices:
            return NODE_FULL
        return None

    def _full_text(self, reason: str) -> str:
        if reason == DRIVER_FULL:
            return f"the driver already has {self.max_devices_per_driver} devices (its limit)"
        return f"the node already has {self.max_devices} devices (its limit)"

    def _admit(
        self,
        driver: str,
        devices: dict[tuple[str, str], _Slot] | None,
        final: dict[tuple[str, str], ReportedDevice],
    ) -> set[tuple[str, str]]:
        """The new names of ``final`` that fit the bounds (most severe first)."""
        new = [name for name in final if devices is None or name not in devices]
        stored = len(devices) if devices else 0
        room_driver = max(self.max_devices_per_driver - stored, 0)
        room_node = max(self.max_devices - self._count, 0)
        room = min(room_driver, room_node)
        if len(new) <= room:
            return set(new)
        order = sorted(range(len(new)), key=lambda i: (-final[new[i]].health.severity, i))
        admitted = {new[i] for i in order[:room]}
        refused = [new[i] for i in sorted(order[room:])]
        reason = DRIVER_FULL if room_driver <= room_node else NODE_FULL
        first = refused[0]
        self._reject(
            driver,
            reason,
            f"{driver}: refused {len(refused)} new devices (first {first[0]}/{first[1]}): "
            f"{self._full_text(reason)}",
            count=len(refused),
        )
        return admitted

    def _accept(self, driver: str, report: ReportedDevice, *, known: bool = False) -> bool:
        problem = None
        if not known:
            problem = pool_name_problem(report.pool) or device_name_problem(report.device)
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
        self._reject(driver, INVALID, f"{driver}: report entry refused: {problem}")
        return False

    def _entry_problem(self, entry: DeviceEntry) -> str | None:
        problem = (
            driver_name_problem(entry.driver)
            or pool_name_problem(entry.pool)
            or device_name_problem(entry.device)
        )
        if problem is None and not isinstance(entry.health, Health):
            problem = f"health {entry.health!r} is not a Health value"
        if problem is None and not isinstance(entry.message, str):
            problem = f"message must be a string, got {type(entry.message).__name__}"
        for what, value in (("timeout", entry.timeout), ("last-seen time", entry.last_seen_wall)):
            if problem is None and not (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and (value > 0 or what != "timeout")
            ):
                problem = f"{what} {value!r} is not a usable number of seconds"
        if problem is None:
            return None
        return f"restored entry refused: {problem}"

    def _reject(self, driver: str, reason: str, why: str, *, count: int = 1) -> None:
        self.rejected_total += count
        key = (driver, reason)
        self.rejections[key] = self.rejections.get(key, 0) + count
        self.last_rejection = why

    def _resolve_timeout(self, seconds: float) -> float:
        if seconds > 0 and math.isfinite(seconds):
            return min(float(seconds), self.max_lease)
        return self.default_timeout

    def _expire_slot(self, slot: _Slot, wall: float) -> HealthChange:
        old = slot.health
        slot.health = Health.UNKNOWN
        slot.message = ""
        slot.changed_wall = wall
        slot.queued = None
        return HealthChange(slot.key, old, Health.UNKNOWN, "", ChangeReason.EXPIRED)

    def _drop(self, slot: _Slot) -> HealthChange:
        """Forget ``slot``; its change (old health -> Unknown, reason DROPPED)."""
        devices = self._drivers[slot.driver]
        del devices[(slot.pool, slot.device)]
        if not devices:
            del self._drivers[slot.driver]
            self._retired.discard(slot.driver)
        self._count -= 1
        slot.alive = False
        slot.queued = None
        return HealthChange(slot.key, slot.health, Health.UNKNOWN, "", ChangeReason.DROPPED)

    def _queue(self, slot: _Slot) -> None:
        """Keep the invariant: a live slot that is not Unknown, or whose driver is
        retired, has a live heap item whose deadline is <= its real deadline."""
        if slot.health is Health.UNKNOWN and slot.driver not in self._retired:
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
