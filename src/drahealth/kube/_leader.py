"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Owns :class:`LeaderElector`. A candidate takes the Lease when it does not exist, when
its holder released it (empty ``holderIdentity``), or when the record has not changed
for ``lease_duration`` as measured on the candidate's own monotonic clock from the
moment it last saw the record change (server timestamps are written, never trusted,
so clock skew between replicas does not matter). Every write is an update with the
read ``resourceVersion``: of two racing candidates the API server accepts one and
answers 409 to the other, so there are never two leaders. A leader renews every
``retry_period`` and steps down when it could not renew for ``renew_deadline``
(a renewal that hangs is abandoned when the deadline passes, and a renewal counts
from when it was sent, so a leader never outlives the lease others see); stepping
down cancels the leader's work before anything else happens. Given a
``client_factory``, renewals run on a dedicated thread with its own event loop and
its own client (as client-go renews from its own goroutine), so a leader whose work
keeps the event loop busy for longer than the lease still renews on time; without
one they share the caller's loop and client. On a clean stop the
leader releases the Lease so a standby takes over within one retry period. Errors
talking to the API server (refused connections, timeouts, undecodable answers) are
logged and retried, never raised; a Lease with missing or nonsensical fields is
treated as expired and overwritten, with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from lightkube import ApiError, AsyncClient
from lightkube.resources.coordination_v1 import Lease

from drahealth._aio import cancel_and_wait
from drahealth._time import now_rfc3339_micro, rfc3339_micro
from drahealth.core import positive_seconds

__all__ = ["FencedClient", "LeaderElector", "LeaseLost"]

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """A write was refused because this replica no longer holds the Lease."""


#: The client calls that change the cluster; each is refused once the Lease is lost.
_WRITES = frozenset({"create", "replace", "patch", "delete", "deletecollection", "apply"})


class FencedClient:
    """An ``AsyncClient`` whose every write first asks ``holds()``, right before it is
    sent, and raises :class:`LeaseLost` instead of writing when the answer is no.

    Reads (get, list, watch) pass through. Leader election is not fencing by itself:
    a leader paused past its lease (SIGSTOP, a long GC, a stalled VM) runs on from
    where it stopped, and only a check at the moment of each write keeps it quiet.
    """

    def __init__(self, client: AsyncClient, holds: Callable[[], bool]) -> None:
        self.inner = client
        self.holds = holds

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless the Lease is still held."""
        if not self.holds():
            raise LeaseLost("this replica no longer holds the lease: not writing")

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in _WRITES:
            return attr

        async def fenced(*args: Any, **kwargs: Any) -> Any:
            self.check()
            return await attr(*args, **kwargs)

        return fenced


#: The Lease fields that are a ``metav1.MicroTime``.
_MICRO_TIMES = ("acquireTime", "renewTime")


def lease_from_dict(body: Mapping[str, Any]) -> Lease:
    """``body`` as a Lease whose times are sent as the API server reads a
    ``metav1.MicroTime``: six fraction digits, always. (lightkube holds them as datetimes,
    and msgspec writes one that falls on a whole second with no fraction, which
    kube-apiserver refuses: ``cannot parse "Z" as ".000000"``.)"""
    lease = cast(Lease, Lease.from_dict(dict(body)))
    spec = lease.spec
    if spec is not None:
        for key in _MICRO_TIMES:
            value = getattr(spec, key)
            if isinstance(value, dt.datetime):
                setattr(spec, key, rfc3339_micro(value))  # sent as this text
    return lease


def _lease(body: dict[str, Any]) -> Lease:
    return lease_from_dict(body)


class LeaderElector:
    """Campaign for the Lease ``namespace/name`` as ``identity``; see the module docstring.

    :meth:`run` campaigns until cancelled and runs ``lead()`` while leading.
    :attr:`is_leader` and :attr:`leader` (the holder last observed) are for status
    output and tests.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        name: str,
        identity: str,
        namespace: str = "default",
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        client_factory: Callable[[], AsyncClient] | None = None,
    ) -> None:
        if not name:
            raise ValueError("name must be a non-empty Lease name")
        if not identity:
            raise ValueError("identity must be a non-empty string")
        self.lease_duration = positive_seconds("lease_duration", lease_duration)
        self.renew_deadline = positive_seconds("renew_deadline", renew_deadline)
        self.retry_period = positive_seconds("retry_period", retry_period)
        if self.renew_deadline >= self.lease_duration:
            raise ValueError(
                f"renew_deadline ({renew_deadline}) must be shorter than "
                f"lease_duration ({lease_duration})"
            )
        if self.retry_period >= self.renew_deadline:
            raise ValueError(
                f"retry_period ({retry_period}) must be shorter than "
                f"renew_deadline ({renew_deadline})"
            )
        self.client = client
        #: Makes the renewal thread's own client (called on that thread); None: no thread.
        self.client_factory = client_factory
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self._clock = clock
        self.is_leader = False
        self.leader: str | None = None
        self.transitions = 0  # times this candidate became the leader
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        #: when the last successful acquire or renewal was sent (monotonic); None: not held
        self._renewed_at: float | None = None

    def holds(self) -> bool:
        """Whether this replica may write now: it leads and, by its own monotonic clock,
        its last successful renewal was sent less than ``renew_deadline`` ago (so no
        other candidate can have taken the Lease yet: they wait ``lease_duration``).
        Safe to call from any thread; the fencing check of :class:`FencedClient`."""
        renewed = self._renewed_at
        return (
            self.is_leader and renewed is not None and self._clock() - renewed < self.renew_deadline
        )

    # -- the campaign ------------------------------------------------------------------

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Campaign forever; while leading, ``lead()`` runs and is cancelled on loss.

        ``lead()`` starting means this replica leads; its cancellation means it lost
        the Lease and must stop acting. If ``lead()`` returns or raises, leadership is
        released and the campaign goes on. Cancelling ``run`` stops ``lead()`` first
        and then releases the Lease (bounded by ``renew_deadline``).
        """
        tasks: list[asyncio.Task[None]] = []
        try:
            while True:
                since = await self._acquire()
                # renewals first: their thread starts before the work's first step runs
                renew = asyncio.create_task(self._keep(since), name=f"renew-{self.name}")
                work = asyncio.create_task(self._guarded(lead), name=f"leading-{self.name}")
                tasks = [work, renew]
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                self.is_leader, self._renewed_at = False, None
                await cancel_and_wait(tasks)
                if work in done:
                    await self._release()
                    await asyncio.sleep(self.retry_period)
        finally:
            self.is_leader, self._renewed_at = False, None
            await asyncio.shield(cancel_and_wait(tasks))  # the work stops before the lease is freed
            if self.leader == self.identity:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._release_within(self.renew_deadline))

    async def _guarded(self, lead: Callable[[], Awaitable[None]]) -> None:
        try:
            await lead()
        except asyncio.CancelledError:
            raise
        except LeaseLost as exc:
            log.warning("%s: %s; stepping down", self.identity, exc)
        except Exception:
            log.exception("leader work of %s failed; releasing the lease", self.identity)

    async def _acquire(self) -> float:
        """Try until this candidate holds the Lease; return when the winning write was sent."""
        while True:
            sent = self._clock()
            if await self._attempt():
                self._renewed_at = sent
                self.is_leader = True
                self.transitions += 1
                log.info("%s became the leader of lease %s", self.identity, self._ref())
                return sent
            await asyncio.sleep(self.retry_period * (1.0 + 0.2 * random.random()))

    async def _keep(self, since: float) -> None:
        """Renew until the deadline is missed: on a thread of its own when possible."""
        if self.client_factory is None:
            await self._renew(since, self.client)
            return
        # a repeated stop request waits out the work's own bounded clean-up (closing its
        # client takes up to retry_period) before it is sent
        await _on_own_thread(
            self._renew_with_own_client, since, f"renew-{self.name}",
            repeat=self.retry_period + 1.0,
        )  # fmt: skip

    async def _renew_with_own_client(self, since: float) -> None:
        assert self.client_factory is not None
        client = self.client_factory()
        try:
            await self._renew(since, client)
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.retry_period):
                    await client.close()

    async def _renew(self, last_ok: float, client: AsyncClient) -> None:
        """Renew every retry period; return (stepping down) once the deadline is missed."""
        while True:
            await asyncio.sleep(self.retry_period)
            sent = self._clock()
            left = last_ok + self.renew_deadline - sent
            ok = False
            if left > 0:
                try:
                    async with asyncio.timeout(left):
                        ok = await self._attempt(client)
                except TimeoutError:
                    log.warning("renewing lease %s timed out", self._ref())
            if ok:
                last_ok = sent
                if self.is_leader:
                    self._renewed_at = sent
            elif not self.is_leader or self._clock() - last_ok >= self.renew_deadline:
                self._renewed_at = None
                log.warning("%s lost the lease %s", self.identity, self._ref())
                return

    async def _attempt(self, client: AsyncClient | None = None) -> bool:
        """One acquire-or-renew round trip; transport and decoding errors count as failure."""
        try:
            return await self._try_acquire_or_renew(client)
        except Exception as exc:  # connection refused, reset, undecodable body, ...
            log.warning("lease %s: %s: %s", self._ref(), type(exc).__name__, exc)
            return False

    # -- one attempt -------------------------------------------------------------------

    async def _try_acquire_or_renew(self, client: AsyncClient | None = None) -> bool:
        client = client or self.client
        now = now_rfc3339_micro()
        try:
            lease = await client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                log.warning("reading lease %s failed: %s", self._ref(), exc.status.message)
                return False
            return await self._create(now, client)
        spec = lease.spec
        holder = (spec.holderIdentity if spec else None) or ""
        duration = spec.leaseDurationSeconds if spec else None
        record = (
            holder,
            spec.renewTime if spec else None,
            spec.leaseTransitions if spec else None,
            duration,
            spec.acquireTime if spec else None,
        )
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()
            if holder != (self.leader or "") and holder != self.identity:
                log.info("lease %s is held by %r", self._ref(), holder or None)
        self.leader = holder or None
        if holder and holder != self.identity:
            if duration is None or duration <= 0:
                log.warning(
                    "lease %s held by %r has leaseDurationSeconds %r; treating it as expired",
                    self._ref(),
                    holder,
                    duration,
                )
            elif self._observed_at + float(duration) > self._clock():
                self.is_leader = False
                return False
        transitions = (spec.leaseTransitions if spec else None) or 0
        if transitions < 0:
            log.warning("lease %s has leaseTransitions %d; resetting", self._ref(), transitions)
            transitions = 0
        acquire = spec.acquireTime if spec else None
        if holder != self.identity:
            transitions += 1
            acquire = None
        body = lease.to_dict()
        body["spec"] = {
            **(body.get("spec") or {}),
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.lease_duration)),
            "renewTime": now,
            "acquireTime": now if acquire is None else body["spec"].get("acquireTime", now),
            "leaseTransitions": transitions,
        }
        try:
            await client.replace(_lease(body))
        except ApiError as exc:
            if exc.status.code != 409:
                log.warning("updating lease %s failed: %s", self._ref(), exc.status.message)
            return False
        self.leader = self.identity
        return True

    async def _create(self, now: str, client: AsyncClient) -> bool:
        lease = _lease(
            {
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": max(1, math.ceil(self.lease_duration)),
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
        )
        try:
            await client.create(lease)
        except ApiError as exc:
            if exc.status.code != 409:
                log.warning("creating lease %s failed: %s", self._ref(), exc.status.message)
            return False
        self.leader = self.identity
        return True

    async def _release(self) -> None:
        """Hand the Lease back (empty holder) if this candidate still holds it."""
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
            if lease.spec is None or lease.spec.holderIdentity != self.identity:
                return
            body = lease.to_dict()
            body["spec"] = {
                **body["spec"],
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": now_rfc3339_micro(),
            }
            await self.client.replace(_lease(body))
            self.leader = None
            log.info("%s released the lease %s", self.identity, self._ref())
        except ApiError as exc:
            log.warning("releasing lease %s failed: %s", self._ref(), exc.status.message)

    async def _release_within(self, seconds: float) -> None:
        async with asyncio.timeout(seconds):
            await self._release()

    def _ref(self) -> str:
        return f"{self.namespace}/{self.name}"


#: Seconds between repeated cancellations of work on its own thread (default).
_CANCEL_REPEAT = 5.0


async def _on_own_thread(
    work: Callable[[float], Awaitable[None]],
    arg: float,
    name: str,
    *,
    repeat: float = _CANCEL_REPEAT,
) -> None:
    """Run ``work(arg)`` in a fresh event loop on a new thread; await its end here.

    Cancelling the caller cancels the work on its loop and waits for the thread to
    finish (the work's own timeouts bound that), so no renewal outlives the caller.
    """
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    ready = threading.Event()
    inner: dict[str, Any] = {}

    def report(exc: BaseException | None) -> None:
        if finished.done():
            return
        if exc is None:
            finished.set_result(None)
        else:
            finished.set_exception(exc)

    async def main() -> None:
        inner["loop"] = asyncio.get_running_loop()
        inner["task"] = asyncio.current_task()
        ready.set()
        await work(arg)

    def body() -> None:
        error: BaseException | None = None
        try:
            asyncio.run(main())
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # handed to the awaiting side
            error = exc
        finally:
            ready.set()
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed
                loop.call_soon_threadsafe(report, error)

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    try:
        await asyncio.shield(finished)
    except asyncio.CancelledError as exc:
        asked: asyncio.CancelledError = exc
        other, task = None, None
        # the thread ends before this returns, whatever else is asked meanwhile: a second
        # cancellation of the caller is noted, not a reason to leave the work running
        while True:
            try:
                if other is None:
                    await asyncio.to_thread(ready.wait)
                    other, task = inner.get("loop"), inner.get("task")
                if not thread.is_alive():
                    break
                if other is not None and task is not None:
                    with contextlib.suppress(RuntimeError):  # already finished and closed
                        other.call_soon_threadsafe(task.cancel)
                # asked again after ``repeat`` seconds: one request can be lost where the
                # work swallows a cancellation that met a result in the same step
                await asyncio.to_thread(thread.join, repeat)
            except asyncio.CancelledError as again:
                asked = again
        raise asked from None
