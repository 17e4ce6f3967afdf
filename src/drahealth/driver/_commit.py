"""Group commit of the prepared-claims checkpoint within one plugin process.

Owns the in-memory claim map of a process that is the checkpoint's only writer, and
when it is durable. A change is applied to the map at once (so the next planner sees
it: the in-use guard never misses a claim whose write is still in flight) and its
caller gets a future that resolves once a checkpoint write containing the change has
been fsynced. One write runs at a time, in a worker thread (the event loop stays free
during the fsyncs); every change made while it runs goes into the next write, so N
concurrent callers cost one or two writes instead of N, and nobody is answered before
their state is on disk.

A failed write puts the map back to the last durable content and fails every caller
whose change is not on disk (their changes are gone from memory too), so memory never
claims more than the file holds once the failure is reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from drahealth.driver._checkpoint import Checkpoint, ClaimEntry

__all__ = ["GroupCommit"]

#: Applies a change to a copy of the claims; returns True if it changed anything.
Change = Callable[[dict[str, ClaimEntry]], bool]


class GroupCommit:
    """The claims of ``checkpoint`` in memory, written in coalesced, ordered saves."""

    def __init__(self, checkpoint: Checkpoint, claims: Mapping[str, ClaimEntry]) -> None:
        self._checkpoint = checkpoint
        self._claims: dict[str, ClaimEntry] = dict(claims)  # replaced, never edited in place
        self._durable: dict[str, ClaimEntry] = self._claims
        self._inflight: dict[str, ClaimEntry] | None = None  # the snapshot being written
        self._inflight_waiters: list[asyncio.Future[None]] = []  # ... and who waits for it
        self._waiters: list[asyncio.Future[None]] = []  # changes for the next write
        self._writer: asyncio.Task[None] | None = None
        #: checkpoint writes done (for tests and benchmarks)
        self.writes = 0

    @property
    def claims(self) -> dict[str, ClaimEntry]:
        """The current claims, including changes whose write is still in flight."""
        return self._claims

    @property
    def durable(self) -> dict[str, ClaimEntry]:
        """The claims as last written to the checkpoint (or loaded from it)."""
        return self._durable

    def reset(self, claims: Mapping[str, ClaimEntry]) -> None:
        """Take ``claims`` (just loaded from the file) as both current and durable."""
        self._claims = self._durable = dict(claims)

    def apply(self, change: Change) -> asyncio.Future[None]:
        """Apply ``change`` now; the future resolves when the claims as they stand
        after it are durable (at once if they already are), or fails with the write's
        error. Synchronous: nothing else runs between the change and the registration
        of its write."""
        state = dict(self._claims)
        if change(state):
            self._claims = state
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._claims is self._durable:
            done.set_result(None)
        elif self._claims is self._inflight:
            self._inflight_waiters.append(done)
        else:
            self._waiters.append(done)
            if self._writer is None:
                self._writer = asyncio.create_task(self._write_all(), name="checkpoint-commit")
        return done

    async def flush(self) -> None:
        """Wait until no write is running or pending (errors are the callers')."""
        while self._writer is not None:
            await asyncio.shield(self._writer)

    async def _write_all(self) -> None:
        try:
            # One loop turn first: changes from tasks that are ready now (callers
            # woken meanwhile, the other kind of batch) share this write.
            await asyncio.sleep(0)
            while self._waiters:
                self._inflight_waiters, self._waiters = self._waiters, []
                self._inflight = snapshot = self._claims
                try:
                    data = self._checkpoint.encode(snapshot)  # cheap, on the loop
                    await asyncio.to_thread(self._checkpoint.write, data)
                except Exception as exc:
                    self._claims = self._durable
                    self._fail(exc)
                    continue
                finally:
                    self._inflight = None
                self.writes += 1
                self._durable = snapshot
                batch, self._inflight_waiters = self._inflight_waiters, []
                for fut in batch:
                    if not fut.done():
                        fut.set_result(None)
        except BaseException as exc:  # cancelled with the loop: nobody may hang
            self._claims = self._durable
            self._fail(exc)
            raise
        finally:
            self._writer = None

    def _fail(self, exc: BaseException) -> None:
        failed = self._inflight_waiters + self._waiters
        self._inflight_waiters, self._waiters = [], []
        for fut in failed:
            if fut.done():
                continue
            if isinstance(exc, Exception):
                fut.set_exception(exc)
                fut.exception()  # a caller cancelled meanwhile must not log it as lost
            else:
                fut.cancel()
