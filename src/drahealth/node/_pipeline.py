"""The agent's health pipeline: stream reports in, durable cache, changes out.

Owns the :class:`~drahealth.core._health_cache.HealthCache` and its
:class:`~drahealth.node._health_store.HealthStore`, the expiry timer that turns a
device Unknown at the end of its lease (not at the next resync, as upstream), and
the fan-out of :class:`HealthChange` lists to listeners (status writer, events,
metrics). Every change is on disk (fsync) before any listener hears of it, so a
change the agent acted on survives a crash.

At start the store is replayed into the cache with a restart grace period (stable
devices do not flash Unknown while drivers reconnect). A corrupt store is
quarantined by the store and reported through :attr:`problem`.

Runs on one asyncio loop; no locks. Knows nothing of pods, gRPC or the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence

from drahealth.core._health_cache import HealthCache
from drahealth.core._records import HealthChange, ReportedDevice
from drahealth.node._health_store import HealthStore

__all__ = ["HEALTH_LOG", "HealthPipeline"]

log = logging.getLogger(__name__)

HEALTH_LOG = "health.log"

Listener = Callable[[list[HealthChange]], None]


class HealthPipeline:
    """Reports -> cache -> store -> listeners, plus the lease-expiry timer."""

    def __init__(
        self,
        state_dir: str | None,
        *,
        default_timeout: float = 30.0,
        restart_grace: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache = HealthCache(
            default_timeout=default_timeout, clock=clock, wall_clock=wall_clock
        )
        self.state_dir = state_dir
        self.restart_grace = restart_grace
        self.store: HealthStore | None = None
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
            self.restored = self.cache.restore(entries, grace=self.restart_grace)
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
        self._commit(changes)
        self._wake.set()  # new leases: the next deadline may have moved
        return changes

    def expire(self) -> list[HealthChange]:
        """Apply every lease that has ended (the timer calls this)."""
        changes = self.cache.expire()
        self._commit(changes)
        return changes

    # -- internals ---------------------------------------------------------------

    def _commit(self, changes: list[HealthChange]) -> None:
        if not changes:
            return
        if self.store is not None:
            entries = []
            for change in changes:
                k = change.key
                entry = self.cache.entry(k.driver, k.pool, k.device)
                if entry is not None:
                    entries.append(entry)
            try:
                self.store.append(entries)
                if self.store.needs_compaction(len(self.cache)):
                    self.store.compact(self.cache.entries())
            except OSError:
                log.exception("persisting %d health changes failed", len(entries))
        for listener in list(self._listeners):
            try:
                listener(changes)
            except Exception:
                log.exception("health change listener %r failed", listener)

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
