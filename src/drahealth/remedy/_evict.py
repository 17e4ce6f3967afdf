"""PDB-aware eviction of pods that use NoExecute-tainted devices.

Owns :class:`Evictor`: the controller tells it, on every pass, which pods should leave
(:meth:`Evictor.want`) and which pods are gone (:meth:`Evictor.gone`, or all that
still exist with :meth:`Evictor.present`); it posts
``pods/eviction`` requests so PodDisruptionBudgets decide, never deleting a pod itself.

Limits: at most ``per_second`` evictions started per second (token bucket), at most
``max_concurrent`` pods disrupted at once cluster-wide and ``max_concurrent_per_node``
per node, where a pod counts from its eviction request until it is gone. A 429 (the
budget allows no disruption now) is retried per pod with capped, jittered backoff and
reported once per distinct message; the pod stays wanted. A pod that is gone, or no
longer wanted (its device recovered), is dropped. A request that got no answer (reset,
timed out) may have evicted the pod: the pod keeps its place under the limits, is read
first the next time whatever the limits (gone or terminating: recorded as evicted, once;
still running: asked again if still wanted, else its place is freed), and the worker goes
on with the other pods meanwhile. Each request names the uid of the pod the controller saw
(``deleteOptions.preconditions``): a pod deleted and created again under the same name is
not evicted in its place (the API server answers 409 Conflict; the entry is dropped, and
the next pass asks again if the pod seen is still there and wanted). kube-apiserver retries
a conflicting eviction for about 10 s before that 409, so the request may time out first:
the pod is then read as after any lost answer (another uid: gone).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import DeleteOptions, ObjectMeta, Preconditions
from lightkube.resources.core_v1 import Pod

from drahealth.core import Consumer, Eviction
from drahealth.kube import TRANSPORT_ERRORS, Backoff

__all__ = ["Evictor"]

log = logging.getLogger(__name__)

#: ``on_event(pod, kind, message)`` with kind "evicted", "blocked" or "failed".
EventSink = Callable[[Consumer, str, str], None]


@dataclass(slots=True)
class _Pending:
    pod: Consumer
    reason: str
    not_before: float = 0.0
    backoff: Backoff = field(default_factory=lambda: Backoff(0.5, 10.0))
    last_block: str = ""
    #: a request was sent whose answer never came (reset, timed out): it may have evicted
    #: the pod; the pod is read before anything else is done for it
    answer_lost: bool = False
    #: False once the controller no longer wants it gone (kept only to settle a lost answer)
    wanted: bool = True


class Evictor:
    """See the module docstring."""

    def __init__(
        self,
        client: AsyncClient,
        limits: Eviction,
        *,
        on_event: EventSink,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.limits = limits
        self._on_event = on_event
        self._clock = clock
        self._pending: dict[str, _Pending] = {}
        self._disrupting: dict[str, str] = {}  # pod uid -> node, from request to gone
        self._tokens = float(limits.per_second)
        self._refilled = clock()
        self._wake = asyncio.Event()
        self.evicted = 0
        self.blocked = 0

    # -- input from the controller -------------------------------------------------------

    def want(self, pods: Iterable[tuple[Consumer, str]]) -> None:
        """The pods that should leave now, each with the reason (replaces the last set)."""
        wanted = {pod.uid: (pod, reason) for pod, reason in pods}
        for uid, p in list(self._pending.items()):
            if uid in wanted:
                p.wanted = True
            elif p.answer_lost:
                p.wanted = False  # (a pod being evicted is no longer wanted): settle it first
            else:
                del self._pending[uid]
        for uid, (pod, reason) in wanted.items():
            if uid not in self._pending and uid not in self._disrupting:
                self._pending[uid] = _Pending(pod, reason)
        self._wake.set()

    def present(self, uids: Iterable[str]) -> None:
        """The pod UIDs that still exist: evicted pods not among them are done."""
        alive = set(uids)
        for uid in list(self._disrupting):
            if uid not in alive:
                del self._disrupting[uid]
        self._wake.set()

    def gone(self, uids: Iterable[str]) -> None:
        """These pods no longer exist: those being evicted are done."""
        for uid in uids:
            self._disrupting.pop(uid, None)
        self._wake.set()

    @property
    def pending(self) -> int:
        return sum(1 for p in self._pending.values() if p.wanted)

    def blocked_pods(self) -> dict[str, str]:
        """namespace/name -> the last refusal message, for pods held by a budget."""
        return {
            f"{p.pod.namespace}/{p.pod.name}": p.last_block
            for p in self._pending.values()
            if p.last_block and p.wanted
        }

    # -- the worker ----------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            delay = await self._start_due()
            self._wake.clear()
            try:
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _start_due(self) -> float:
        """Start every eviction the limits allow; seconds until the next may be due."""
        now = self._clock()
        self._tokens = min(
            float(self.limits.per_second),
            self._tokens + (now - self._refilled) * self.limits.per_second,
        )
        self._refilled = now
        next_due = 1.0
        for uid, p in sorted(self._pending.items(), key=lambda kv: kv[1].not_before):
            if p.not_before > now:
                next_due = min(next_due, p.not_before - now)
                continue
            if not p.answer_lost:  # (one whose answer was lost holds its place already)
                if len(self._disrupting) >= self.limits.max_concurrent:
                    continue
                on_node = sum(1 for n in self._disrupting.values() if n == p.pod.node)
                if on_node >= self.limits.max_concurrent_per_node:
                    continue
            if self._tokens < 1.0:
                next_due = min(next_due, (1.0 - self._tokens) / self.limits.per_second)
                break
            self._tokens -= 1.0
            await self._evict(uid, p)
        return max(0.01, next_due)

    async def _after_lost_answer(self, pod: Consumer) -> str | None:
        """After a lost answer, what became of ``pod``: "gone" (or replaced),
        "terminating" (that request evicted it), "running" (it did not, or cannot be
        told: the next request's answer will), None when the server does not answer."""
        try:
            found = await self.client.get(Pod, pod.name, namespace=pod.namespace)
        except TRANSPORT_ERRORS:
            return None
        except ApiError as exc:
            return "gone" if exc.status.code == 404 else "running"
        meta = found.metadata
        if meta is None or meta.uid != pod.uid:
            return "gone"
        return "terminating" if meta.deletionTimestamp is not None else "running"

    async def _evict(self, uid: str, p: _Pending) -> None:
        pod = p.pod
        if p.answer_lost:
            now = await self._after_lost_answer(pod)
            if now is None:
                p.not_before = self._clock() + p.backoff.next()
                return
            p.answer_lost = False
            if now != "running":  # the request whose answer was lost evicted it
                del self._pending[uid]
                if now == "terminating":  # counts until it is gone, as an answered one
                    self._disrupting[uid] = pod.node
                else:
                    self._disrupting.pop(uid, None)
                self.evicted += 1
                self._on_event(pod, "evicted", f"{p.reason} (the eviction's answer was lost)")
                return
            if not p.wanted:  # not evicted, and not to be: its place is free again
                del self._pending[uid]
                self._disrupting.pop(uid, None)
                return
            # still running and wanted: asked again in the place it holds
        body = Pod.Eviction(
            metadata=ObjectMeta(name=pod.name, namespace=pod.namespace),
            # this pod, not one created since under its name
            deleteOptions=DeleteOptions(preconditions=Preconditions(uid=pod.uid)),
        )
        try:
            await self.client.create(body, name=pod.name, namespace=pod.namespace)
        except TRANSPORT_ERRORS as exc:
            # no answer: the pod may or may not be evicted; it stays wanted and is asked
            # again (an eviction is idempotent), holding its place under the limits as
            # one being evicted does, and the worker goes on with the others
            p.answer_lost = True
            self._disrupting[uid] = pod.node
            p.not_before = self._clock() + p.backoff.next()
            log.warning(
                "evicting %s/%s: no answer from the API server (%s: %s); asking again",
                pod.namespace, pod.name, type(exc).__name__, exc,
            )  # fmt: skip
            return
        except ApiError as exc:
            self._disrupting.pop(uid, None)  # answered: this request evicted nothing
            code, message = exc.status.code, exc.status.message or ""
            if code == 404:
                del self._pending[uid]
                return
            if code == 409:
                # the uid named is not the pod's now (deleted and created again), or the
                # pod changed under the request: dropped; the next pass asks again if the
                # pod seen is still there and still wanted
                del self._pending[uid]
                log.info("evicting %s/%s: %s", pod.namespace, pod.name, message)
                return
            p.not_before = self._clock() + p.backoff.next()
            if code == 429:
                self.blocked += 1
                if message != p.last_block:
                    p.last_block = message
                    self._on_event(pod, "blocked", message)
                return
            log.warning("evicting %s/%s failed: %s", pod.namespace, pod.name, message)
            self._on_event(pod, "failed", f"{code}: {message}")
            return
        del self._pending[uid]
        self._disrupting[uid] = pod.node
        self.evicted += 1
        self._on_event(pod, "evicted", p.reason)
