"""The agent's health pipeline: stream reports in, durable cache, changes out.

Owns the :class:`~drahealth.core._health_cache.HealthCache` and its
:class:`~drahealth.node._health_store.HealthStore`, the expiry timer that turns a
device Unknown at the end of its lease (not at the next resync, as upstream), and
the fan-out of :class:`HealthChange` lists to listeners (status writer, events,
metrics). Every change is on disk (fsync) before any listener hears of it, so a
change the agent acted on survives a crash.

At start the store is replayed into the cache with its recorded timing (a device whose
lease ended while the agent was down is Unknown at once; one with lease left keeps its
health until then); to make that exact, refreshed devices' last-seen times are saved
too (at most every quarter lease, at least every 10 s). A corrupt store is quarantined
by the store and reported through :attr:`problem`.

When a driver's last plugin instance goes away (:meth:`HealthPipeline.retire`), its
devices keep their health for at most ``removal_grace`` seconds, then are forgotten.

Failures are logged as state changes, not per event: refused report entries at most
once per ``REJECTION_LOG_INTERVAL`` (with counts); a failing store (disk full) once
when persistence starts failing and once when it recovers, after which the whole cache
is written again (compaction) so nothing changed in between is lost. The agent keeps
working from memory meanwhile.

Runs on one asyncio loop; no locks. Knows nothing of pods, gRPC or the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Sequence

from drahealth.core import ChangeReason, DeviceEntry, HealthCache, HealthChange, ReportedDevice
from drahealth.node._health_store import HealthStore

__all__ = ["HEALTH_LOG", "REJECTION_LOG_INTERVAL", "REMOVAL_GRACE", "HealthPipeline"]

log = logging.getLogger(__name__)

HEALTH_LOG = "health.log"
#: Seconds between two log lines about refused report entries.
REJECTION_LOG_INTERVAL = 10.0
#: Longest time a removed driver's devices keep their health (upstream: none; its e2e
#: expects Unknown within 2 minutes).
REMOVAL_GRACE = 30.0

Listener = Callable[[list[HealthChange]], None]


def positive_or_zero(what: str, value: float) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value)) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0 seconds, got {value!r}")
    return float(value)


class HealthPipeline:
    """Reports -> cache -> store -> listeners, plus the lease-expiry timer."""

    def __init__(
        self,
        state_dir: str | None,
        *,
        default_timeout: float = 30.0,
        removal_grace: float = REMOVAL_GRACE,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        cache: HealthCache | None = None,
    ) -> None:
        self.cache = cache or HealthCache(
            default_timeout=default_timeout, clock=clock, wall_clock=wall_clock
        )
        self.state_dir = state_dir
        self.removal_grace = positive_or_zero("removal_grace", removal_grace)
        self.store: HealthStore | None = None
        #: True while writes to the store fail (the agent runs from memory).
        self.persist_failing = False
        #: Writes to the store that failed.
        self.persist_failures = 0
        self._rejections_logged = 0
        self._rejection_logged_at: float | None = None
        self.problem: str | None = None
        self._clock = clock
        self._listeners: list[Listener] = []
        self._wake = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None
        self.restored: list[HealthChange] = []
        self.updates = 0

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        if self.state_dir is not None:
            os.makedirs(self.state_dir, exist_ok=True)
            path = os.path.join(self.state_dir, HEALTH_LOG)
            self.store, entries, self.problem = HealthStore.open(path)
            if self.problem:
                log.warning("%s", self.problem)
            self.restored = self.cache.restore(entries)
            if len(self.restored) < len(entries):
                # forget what was not restored (lease ended while down, Unknown, refused)
                self._persist(lambda store: store.compact(self.cache.entries()))
            self._log_rejections()
        self._timer = asyncio.create_task(self._expiry_loop(), name="health-expiry")

    async def stop(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        if self.store is not None:
            self.store.close()
            self.store = None

    # -- input -------------------------------------------------------------------

    def report(self, driver: str, reports: Sequence[ReportedDevice]) -> list[HealthChange]:
        """One stream message of ``driver``: update, persist, notify."""
        self.updates += 1
        changes = self.cache.update(driver, reports)
        self._commit(changes, self.cache.take_heartbeats())
        self._log_rejections()
        self._wake.set()  # new leases: the next deadline may have moved
        return changes

    def retire(self, driver: str) -> list[HealthChange]:
        """``driver`` has no plugin instance with health any more: its devices keep
        their health for at most ``removal_grace`` seconds, then are forgotten."""
        changes = self.cache.retire_driver(driver, self.removal_grace)
        capped = self.cache.entries(driver)
        if capped or changes:
            log.info(
                "DRA driver %s is gone: %d devices keep their health for at most %.3g s, "
                "%d forgotten now",
                driver,
                len(capped),
                self.removal_grace,
                len(changes),
            )
        self._commit(changes, capped)
        self._wake.set()
        return changes

    def expire(self) -> list[HealthChange]:
        """Apply every lease that has ended (the timer calls this)."""
        changes = self.cache.expire()
        self._commit(changes)
        return changes

    # -- internals ---------------------------------------------------------------

    def _commit(self, changes: list[HealthChange], extra: Sequence[DeviceEntry] = ()) -> None:
        if not changes and not extra:
            return
        if self.store is not None:
            entries = list(extra)
            forget = []
            for change in changes:
                k = change.key
                entry = self.cache.entry(k.driver, k.pool, k.device)
                if entry is not None:
                    entries.append(entry)
                elif change.reason is ChangeReason.DROPPED:
                    forget.append(k)
            self._persist(lambda store: store.append(entries, forget))
        if not changes:
            return
        for listener in list(self._listeners):
            try:
                listener(changes)
            except Exception:
                log.exception("health change listener %r failed", listener)

    def _persist(self, write: Callable[[HealthStore], None]) -> None:
        """Run ``write`` on the store; failures are logged when they start and end."""
        store = self.store
        if store is None:
            return
        try:
            if self.persist_failing:
                # whatever failed in between: write the whole state again
                store.compact(self.cache.entries())
            else:
                write(store)
                if store.needs_compaction(len(self.cache)):
                    store.compact(self.cache.entries())
        except (OSError, ValueError) as exc:
            self.persist_failures += 1
            if not self.persist_failing:
                self.persist_failing = True
                log.error(
                    "persisting device health failed, running from memory until it works "
                    "again (a restart meanwhile loses the latest health): %s",
                    exc,
                )
            else:
                log.debug("persisting device health still fails: %s", exc)
            return
        if self.persist_failing:
            self.persist_failing = False
            log.warning(
                "persisting device health works again after %d failed writes; "
                "the whole cache was written",
                self.persist_failures,
            )

    def _log_rejections(self) -> None:
        total = self.cache.rejected_total
        if total == self._rejections_logged:
            return
        now = self._clock()
        at = self._rejection_logged_at
        if at is not None and now - at < REJECTION_LOG_INTERVAL:
            return
        log.warning(
            "refused %d health report entries (%d in all); latest: %s",
            total - self._rejections_logged,
            total,
            self.cache.last_rejection,
        )
        self._rejections_logged = total
        self._rejection_logged_at = now

    async def _expiry_loop(self) -> None:
        while True:
            self._wake.clear()
            deadline = self.cache.next_deadline()
            if deadline is None:
                await self._wake.wait()
                continue
            delay = deadline - self._clock()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay + 0.001):
                        await self._wake.wait()
                continue
            self.expire()
            await asyncio.sleep(0)  # a lease ending exactly now expires on the next pass
