"""Reflector: keep an in-memory, event-emitting copy of one kind of Kubernetes object.

Owns: the LIST → WATCH loop over one lightkube resource type (optionally one
namespace, label and field selector), the typed object cache keyed by
``(namespace, name)``, resourceVersion bookkeeping (bookmarks included), recovery
from ``410 Gone`` (fresh LIST, differences emitted as synthetic events) and from a
504 "Too large resource version" (the server went back in time, e.g. restarted from
older data: a fresh LIST taken as the whole truth, like client-go), a check that the
server has not gone back in time before resuming a watch after a broken, cut short or
silent one (kube-apiserver answers a watch at a future resourceVersion with a stream that
stays silent, not an error), reconnects with capped, jittered exponential backoff, and
delivery of ordered, de-duplicated events to handlers and async iterators.

The decision logic is sans-I/O and unit-testable on its own: :class:`Backoff` (delay
arithmetic), :func:`rv_newer` (resourceVersion ordering) and :class:`ObjectCache`
(apply one event / replace with a LIST, returning the events to emit). The
:class:`Reflector` only moves bytes through the lightkube client.

May not touch: anything above ``kube``; it never writes to the API server.

Lightkube's own ``AsyncClient.watch`` cannot ask for bookmarks and hides 410s, so the
watch request is built with the client's request builder (``prepare_request``) and
sent on the client's own httpx2 connection pool; bodies are decoded with
lightkube's decoders into lightkube model instances.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

import httpx2
import msgspec
from lightkube import ALL_NS, AsyncClient
from lightkube.core import decoders
from lightkube.core import resource as lkr
from lightkube.core.selector import build_selector

__all__ = [
    "Backoff",
    "EventStream",
    "ObjectCache",
    "Reflector",
    "ReflectorEvent",
    "Store",
    "WatchErrorEvent",
    "as_dict",
    "object_key",
    "resource_version",
    "rv_newer",
    "strip_managed_fields",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
Key = tuple[str, str]
#: ``handler(event_type, obj, old_obj)``; may be sync or ``async``.
Handler = Callable[[str, T, "T | None"], "Awaitable[None] | None"]

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"


# --------------------------------------------------------------------------- sans-I/O


def object_key(obj: Any) -> Key:
    """``(namespace, name)`` of a lightkube object; namespace is ``""`` for cluster scope."""
    md = obj.metadata
    if md is None or not md.name:
        raise ValueError(f"{type(obj).__name__} object has no metadata.name")
    return (md.namespace or "", md.name)


def resource_version(obj: Any) -> str | None:
    """``metadata.resourceVersion`` of a lightkube object, or ``None``."""
    md = obj.metadata
    return None if md is None else md.resourceVersion


def _as_int(rv: str) -> int | None:
    try:
        return int(rv)
    except ValueError:
        return None


def rv_newer(new: str | None, old: str | None) -> bool:
    """Is resourceVersion ``new`` newer than ``old``?

    Compared as integers when both parse as integers (true for etcd-backed servers
    and the embedded server). Otherwise resourceVersions are opaque: a different
    value counts as newer. A missing version cannot be compared and counts as newer.
    """
    if new is None or old is None:
        return True
    a, b = _as_int(new), _as_int(old)
    if a is not None and b is not None:
        return a > b
    return new != old


def _max_rv(a: str | None, b: str | None) -> str | None:
    """The later of two resourceVersions (``b`` wins when they cannot be ordered)."""
    if a is None:
        return b
    if b is None:
        return a
    x, y = _as_int(a), _as_int(b)
    if x is not None and y is not None:
        return a if x > y else b
    return b


@dataclass(frozen=True, slots=True)
class ReflectorEvent(Generic[T]):
    """One change as seen by handlers: ``type`` is ADDED, MODIFIED or DELETED.

    ``old`` is the cached object this event replaces (``None`` for ADDED). For
    DELETED, ``obj`` is the object's final state as reported by the server (or, for
    a deletion discovered by a relist, the last cached state).
    """

    type: str
    obj: T
    old: T | None


class Backoff:
    """Capped exponential backoff with jitter.

    The n-th delay (n from 0) is ``min(maximum, initial * factor**n)`` scaled by a
    random factor in ``[1 - jitter, 1]``, so it never exceeds ``maximum`` and
    clients that failed together spread out. :meth:`reset` after a success.
    """

    def __init__(
        self,
        initial: float = 0.1,
        maximum: float = 10.0,
        *,
        factor: float = 2.0,
        jitter: float = 0.5,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError("backoff needs 0 < initial <= maximum")
        if factor < 1:
            raise ValueError("backoff factor must be >= 1")
        if not 0 <= jitter <= 1:
            raise ValueError("backoff jitter must be within [0, 1]")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self._rng = rng
        self._base = initial
        self.attempts = 0

    def peek_base(self) -> float:
        """The un-jittered delay the next :meth:`next` call will scale."""
        return self._base

    def next(self) -> float:
        """Return the next delay in seconds and advance."""
        base = self._base
        self.attempts += 1
        self._base = min(self.maximum, base * self.factor)
        return base * (1.0 - self.jitter * self._rng())

    def reset(self) -> None:
        """Start again from ``initial``."""
        self._base = self.initial
        self.attempts = 0


class ObjectCache(Generic[T]):
    """The reflector's object map and its event rules (no I/O).

    * ADDED/MODIFIED: stored and emitted (as ADDED when the key is new, else as
      MODIFIED) unless the cached copy has the same or a newer resourceVersion.
    * DELETED: removed and emitted unless the key is unknown or the cached copy is
      strictly newer than the deletion.
    * :meth:`replace` (a LIST result) emits synthetic DELETED events for cached
      objects missing from the list, then ADDED/MODIFIED for new or newer ones.
    * A deleted key remembers its deletion resourceVersion (a bounded "tombstone",
      integer RVs only), so a late or replayed event cannot resurrect it.

    Hence handlers never see an older version of an object after a newer one.
    """

    #: Most tombstones kept between LISTs (oldest dropped first).
    MAX_TOMBSTONES = 10_000

    def __init__(self) -> None:
        self.objects: dict[Key, T] = {}
        self._tombstones: dict[Key, int] = {}

    def _buried(self, key: Key, rv: str | None) -> bool:
        tomb = self._tombstones.get(key)
        n = _as_int(rv) if rv is not None else None
        return tomb is not None and n is not None and n <= tomb

    def _bury(self, key: Key, rv: str | None) -> None:
        n = _as_int(rv) if rv is not None else None
        if n is None:
            return
        self._tombstones.pop(key, None)
        self._tombstones[key] = n
        while len(self._tombstones) > self.MAX_TOMBSTONES:
            del self._tombstones[next(iter(self._tombstones))]

    def apply(self, event_type: str, obj: T) -> ReflectorEvent[T] | None:
        """Apply one watch event; return the event to emit, or ``None`` if stale."""
        key = object_key(obj)
        old = self.objects.get(key)
        if event_type == DELETED:
            if old is None:
                return None
            cached, deleted = resource_version(old), resource_version(obj)
            if cached is not None and deleted is not None:
                a, b = _as_int(cached), _as_int(deleted)
                if a is not None and b is not None and a > b:
                    return None  # a stale deletion of an older incarnation
            del self.objects[key]
            self._bury(key, _max_rv(cached, deleted))
            return ReflectorEvent(DELETED, obj, old)
        if event_type not in (ADDED, MODIFIED):
            raise ValueError(f"unknown event type {event_type!r}")
        if old is not None and not rv_newer(resource_version(obj), resource_version(old)):
            return None
        if old is None and self._buried(key, resource_version(obj)):
            return None
        self._tombstones.pop(key, None)
        self.objects[key] = obj
        return ReflectorEvent(ADDED if old is None else MODIFIED, obj, old)

    def replace(
        self, items: Iterable[T], list_rv: str | None = None, *, reset: bool = False
    ) -> list[ReflectorEvent[T]]:
        """Replace the contents with a LIST result (taken at ``list_rv``); return the
        difference as events.

        ``reset=True`` (the server's resourceVersions went back in time): the list is
        the whole truth. Tombstones are forgotten and every listed object whose
        resourceVersion differs from the cached one replaces it, older or not.
        """
        fresh: dict[Key, T] = {object_key(o): o for o in items}
        events: list[ReflectorEvent[T]] = []
        if reset:
            self._tombstones.clear()
        for key in sorted(self.objects.keys() - fresh.keys()):
            old = self.objects.pop(key)
            self._bury(key, list_rv if reset else _max_rv(resource_version(old), list_rv))
            events.append(ReflectorEvent(DELETED, old, old))
        for key in sorted(fresh):
            obj, old_obj = fresh[key], self.objects.get(key)
            if reset and old_obj is not None:
                if resource_version(obj) != resource_version(old_obj):
                    self.objects[key] = obj
                    events.append(ReflectorEvent(MODIFIED, obj, old_obj))
                continue
            ev = self.apply(ADDED, obj)
            if ev is not None:
                events.append(ev)
        return events


class Store(Generic[T]):
    """Read-only view of a reflector's cache, keyed by ``(namespace, name)``.

    Cluster-scoped objects use namespace ``""``. The objects are the cached
    instances themselves: treat them as immutable.
    """

    __slots__ = ("_objects",)

    def __init__(self, objects: Mapping[Key, T]) -> None:
        self._objects = objects

    def get(self, namespace: str | None, name: str) -> T | None:
        """The cached object, or ``None``."""
        return self._objects.get((namespace or "", name))

    def keys(self) -> list[Key]:
        return sorted(self._objects)

    def items(self) -> list[tuple[Key, T]]:
        return [(k, self._objects[k]) for k in sorted(self._objects)]

    def __getitem__(self, key: Key) -> T:
        return self._objects[key]

    def __contains__(self, key: object) -> bool:
        return key in self._objects

    def __iter__(self) -> Iterator[Key]:
        return iter(sorted(self._objects))

    def __len__(self) -> int:
        return len(self._objects)

    def __repr__(self) -> str:
        return f"Store({len(self._objects)} objects)"

    def dicts(self) -> list[dict[str, Any]]:
        """All cached objects as plain dicts (``to_dict()``), sorted like :meth:`list`."""
        return [as_dict(o) for o in self.list()]

    def list(self) -> list[T]:
        """All cached objects, sorted by ``(namespace, name)``."""
        return [self._objects[k] for k in sorted(self._objects)]


def as_dict(obj: Any) -> dict[str, Any]:
    """A lightkube object as the plain dict its ``to_dict()`` gives."""
    out = obj.to_dict()
    assert isinstance(out, dict)
    return out


# --------------------------------------------------------------------------- I/O shell


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): a fresh LIST is needed."""


class _TooLarge(_Gone):
    """The server is behind our resourceVersion (504 ResourceVersionTooLarge): relist
    and take the list as the whole truth."""


def _too_large(code: Any, reason: Any, message: Any, details: Any) -> bool:
    """Is this Status kube's "Too large resource version" (client-go's
    ``IsTooLargeResourceVersion``: reason Timeout with a ResourceVersionTooLarge cause,
    or that message)?"""
    if isinstance(message, str) and message.startswith("Too large resource version"):
        return True
    if reason != "Timeout" or code not in (None, 504):
        return False
    causes = details.get("causes") if isinstance(details, dict) else None
    return any(
        isinstance(c, dict) and c.get("reason") == "ResourceVersionTooLarge" for c in causes or []
    )


def _status_too_large(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    return _too_large(
        body.get("code"), body.get("reason"), body.get("message"), body.get("details")
    )


def _exc_too_large(exc: BaseException) -> bool:
    status = getattr(exc, "status", None)
    if status is not None and hasattr(status, "to_dict"):
        return _status_too_large(status.to_dict())
    if isinstance(exc, httpx2.HTTPStatusError):
        try:
            return _status_too_large(exc.response.json())
        except ValueError:
            return False
    return False


class _Dropped(Exception):
    """The watch was dropped on purpose (test hook)."""


class WatchErrorEvent(Exception):
    """The server sent a watch ``ERROR`` event other than 410."""

    def __init__(self, code: int | None, reason: str | None, message: str | None) -> None:
        super().__init__(f"watch error {code} {reason}: {message}")
        self.code = code
        self.reason = reason


class _BookmarkMeta(msgspec.Struct):
    resourceVersion: str | None = None


class _Bookmark(msgspec.Struct):
    metadata: _BookmarkMeta | None = None


_STOP: Any = object()


class EventStream(Generic[T]):
    """An async iterator over a reflector's events, subscribed when created.

    Ends when the reflector stops or :meth:`close` is called. Use as
    ``async with reflector.events() as stream: async for ev in stream: ...``.
    """

    def __init__(self, owner: Reflector[T]) -> None:
        self._owner = owner
        self._queue: asyncio.Queue[ReflectorEvent[T]] = asyncio.Queue()
        self._closed = False
        owner._streams.add(self)

    def _put(self, event: ReflectorEvent[T]) -> None:
        if not self._closed:
            self._queue.put_nowait(event)

    def close(self) -> None:
        """Unsubscribe; iteration ends after the already-queued events."""
        if not self._closed:
            self._closed = True
            self._owner._streams.discard(self)
            self._queue.put_nowait(_STOP)

    def __aiter__(self) -> EventStream[T]:
        return self

    async def __anext__(self) -> ReflectorEvent[T]:
        item = await self._queue.get()
        if item is _STOP:
            self._queue.put_nowait(_STOP)
            raise StopAsyncIteration
        return item

    async def __aenter__(self) -> EventStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def _selector(value: Mapping[str, Any] | str | None, *, fields: bool) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    return build_selector(dict(value), for_fields=fields)


def strip_managed_fields(obj: T) -> T:
    """``obj`` without ``metadata.managedFields`` (a :class:`Reflector` ``transform``, as
    client-go's informers strip them): field ownership is the biggest part of most
    objects a server that tracks it returns, and a cache that never writes it back has no
    use for it (at 50,000 pods it is hundreds of MB)."""
    meta = getattr(obj, "metadata", None)
    if meta is not None and getattr(meta, "managedFields", None) is not None:
        meta.managedFields = None
    return obj


def _status_code(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    code = getattr(status, "code", None)
    if isinstance(code, int):
        return code
    if isinstance(exc, httpx2.HTTPStatusError):
        return exc.response.status_code
    return None


class Reflector(Generic[T]):
    """LIST+WATCH one resource type into a typed cache and emit its changes.

    ``namespace=None`` watches all namespaces of a namespaced type. ``labels`` and
    ``fields`` take lightkube selector dicts (``{"app": "x"}``, operators) or raw
    selector strings. Handlers run in the reflector's task, in order; exceptions in
    handlers are logged and swallowed. A slow async handler delays later events.
    ``transform`` is applied to each object as it arrives, before it is stored or handed
    on (:func:`strip_managed_fields` keeps a large cache small); an object it raises on is
    logged, counted and kept as it arrived, so one object cannot stop the cache (the
    watch would resume before it and meet it again for ever).

    Counters for tests and metrics: ``lists`` (LIST calls that succeeded),
    ``relists`` (LISTs forced by 410 Gone or a too large resourceVersion),
    ``watches`` (watch requests sent), ``reconnects`` (watch re-establishments after
    an error or disconnect; a server closing a watch at its timeout is not one),
    ``rv_checks`` (one-item LISTs that checked the server is not behind our
    resourceVersion before a watch was resumed), ``transform_errors`` (objects
    ``transform`` raised on), ``last_error``.

    That check runs before re-watching after a transport error or dropped connection,
    after a watch the server ended well before its ``timeoutSeconds`` (a restarting
    server, a watch cache re-initialising) and after a watch that stayed silent until its
    timeout. A server restored from older data answers the resumed watch with a stream
    that never delivers (real kube-apiserver waits for the resourceVersion to arrive), so
    without it the cache would go stale; with it, a LIST whose resourceVersion is lower
    than ours relists and takes that list as the whole truth.
    """

    def __init__(
        self,
        client: AsyncClient,
        resource_type: type[T],
        *,
        namespace: str | None = None,
        labels: Mapping[str, Any] | str | None = None,
        fields: Mapping[str, Any] | str | None = None,
        name: str | None = None,
        backoff_initial: float = 0.1,
        backoff_max: float = 10.0,
        watch_timeout: float = 300.0,
        request_timeout: float = 10.0,
        chunk_size: int | None = None,
        rng: Callable[[], float] = random.random,
        transform: Callable[[T], T] | None = None,
    ) -> None:
        if not isinstance(resource_type, type) or not issubclass(resource_type, lkr.Resource):
            raise TypeError(f"{resource_type!r} is not a lightkube resource class")
        namespaced = issubclass(resource_type, lkr.NamespacedResource)
        if namespace is not None and not namespaced:
            raise ValueError(f"{resource_type.__name__} is cluster-scoped; namespace not allowed")
        self.resource_type = resource_type
        self.namespace = namespace
        self.name = name or f"{resource_type.__name__.lower()}-reflector"
        self._ns_arg = (namespace or ALL_NS) if namespaced else None
        self._labels = _selector(labels, fields=False)
        self._fields = _selector(fields, fields=True)
        self._client = client
        # lightkube's GenericAsyncClient: request building and the httpx2 pool.
        self._gc: Any = client._client
        self._backoff = Backoff(backoff_initial, backoff_max, rng=rng)
        self._rng = rng
        self._watch_timeout = watch_timeout
        self._request_timeout = request_timeout
        self._chunk_size = chunk_size
        self._transform = transform
        self._cache: ObjectCache[T] = ObjectCache()
        self.store: Store[T] = Store(self._cache.objects)
        self._handlers: list[Handler[T]] = []
        self._streams: set[EventStream[T]] = set()
        self._synced = asyncio.Event()
        self._online = asyncio.Event()  # cleared only by the test hook
        self._online.set()
        self._task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[bool] | None = None
        self._io_waiting = False
        self._drop_requested = False
        self._stopping = False
        self._verify_rv = False  # check the server is not behind us before re-watching
        self.last_resource_version: str | None = None
        self.lists = 0
        self.relists = 0
        self.watches = 0
        self.reconnects = 0
        self.rv_checks = 0
        self.transform_errors = 0
        self.last_error: BaseException | None = None

    # ------------------------------------------------------------------ public API

    @property
    def has_synced(self) -> bool:
        """True once the first LIST has been applied."""
        return self._synced.is_set()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def add_handler(self, handler: Handler[T]) -> None:
        """Call ``handler(event_type, obj, old_obj)`` for every future event."""
        self._handlers.append(handler)

    def remove_handler(self, handler: Handler[T]) -> None:
        self._handlers.remove(handler)

    def events(self) -> EventStream[T]:
        """Subscribe now; iterate the returned stream for every later event."""
        return EventStream(self)

    async def start(self) -> None:
        """Start the LIST/WATCH loop in a background task (returns at once)."""
        if self._task is not None:
            raise RuntimeError(f"reflector {self.name} already started")
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name=f"reflector:{self.name}")

    async def stop(self) -> None:
        """Stop the loop and end all event streams. Idempotent."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for stream in list(self._streams):
            stream.close()

    async def wait_synced(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until the first LIST has been applied; raise ``TimeoutError`` on timeout."""
        async with asyncio.timeout(timeout):
            await self._synced.wait()

    async def __aenter__(self) -> Reflector[T]:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _drop_connection(self, *, hold: bool = False) -> None:
        """Test hook: drop the current watch connection as if the network failed.

        Takes effect while the watch waits for data; if an event is being handled,
        right after it (events are never half-delivered). With ``hold=True`` the
        reflector stays disconnected until :meth:`_resume` (a network outage).
        """
        if hold:
            self._online.clear()
        self._drop_requested = True
        if self._io_waiting and self._watch_task is not None and not self._watch_task.done():
            self._watch_task.cancel()

    def _resume(self) -> None:
        """Test hook: end an outage started with ``_drop_connection(hold=True)``."""
        self._online.set()

    # ------------------------------------------------------------------ loop

    async def _run(self) -> None:
        need_list = True
        reset = False
        gone_streak = 0
        while True:
            delay = 0.0
            try:
                if need_list:
                    await self._list(reset=reset)
                    need_list = reset = False
                await self._online.wait()
                if self._verify_rv:
                    await self._check_rv()
                self._drop_requested = False
                self._watch_task = asyncio.create_task(
                    self._watch(), name=f"reflector-watch:{self.name}"
                )
                healthy = await self._watch_task
                if healthy:
                    self._backoff.reset()
                    gone_streak = 0
                else:
                    delay = self._backoff.next()
            except _Gone as exc:
                self.relists += 1
                need_list = True
                reset = reset or isinstance(exc, _TooLarge)
                gone_streak += 1
                log.info(
                    "%s: resourceVersion %s %s, relisting",
                    self.name,
                    self.last_resource_version,
                    "is newer than the server's" if reset else "expired",
                )
                # relist at once the first time; back off if 410s keep coming
                delay = 0.0 if gone_streak == 1 else self._backoff.next()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._stopping or (task is not None and task.cancelling()):
                    raise
                self.reconnects += 1  # the watch sub-task was dropped (test hook)
                self._verify_rv = True
                delay = self._backoff.next()
            except _Dropped:
                self.reconnects += 1
                self._verify_rv = True
                delay = self._backoff.next()
            except Exception as exc:
                self.last_error = exc
                if not need_list:
                    self.reconnects += 1
                    # an ERROR event comes from a server that is up and consistent
                    self._verify_rv = self._verify_rv or not isinstance(exc, WatchErrorEvent)
                delay = self._backoff.next()
                log.warning(
                    "%s: %s failed (%s: %s); retrying in %.2fs",
                    self.name,
                    "list" if need_list else "watch",
                    type(exc).__name__,
                    exc,
                    delay,
                )
            finally:
                self._watch_task = None
            if delay > 0:
                await asyncio.sleep(delay)

    async def _list(self, *, reset: bool = False) -> None:
        gc = self._gc
        params: dict[str, Any] = {
            "labelSelector": self._labels,
            "fieldSelector": self._fields,
            "limit": self._chunk_size,
        }
        br = gc.prepare_request(
            "list", res=self.resource_type, namespace=self._ns_arg, params=params
        )
        items: list[T] = []
        list_rv: str | None = None
        more = True
        while more:
            resp = await gc.send(gc.build_adapter_request(br))
            try:
                more, list_rv, chunk = gc.handle_response("list", resp, br)
            except httpx2.HTTPStatusError as exc:
                if _status_code(exc) == 410 and "continue" in br.params:
                    # continue token expired mid-pagination: start over
                    br.params.pop("continue", None)
                    items.clear()
                    more = True
                    continue
                if _exc_too_large(exc):
                    raise _TooLarge() from exc
                raise
            except Exception as exc:
                if _exc_too_large(exc):
                    raise _TooLarge() from exc
                raise
            items.extend(chunk if self._transform is None else map(self._transformed, chunk))
        if not list_rv:
            for o in items:
                list_rv = _max_rv(list_rv, resource_version(o))
        events = self._cache.replace(items, list_rv, reset=reset)
        self.last_resource_version = list_rv
        self._verify_rv = False
        self.lists += 1
        self._synced.set()
        log.debug("%s: listed %d objects at rv %s", self.name, len(items), list_rv)
        for ev in events:
            await self._dispatch(ev)

    async def _watch(self) -> bool:
        """One watch connection. Returns whether it was healthy (got data / lived long)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        got_event = False
        server_timeout = int(self._watch_timeout * (1.0 + self._rng()))
        params: dict[str, Any] = {
            "labelSelector": self._labels,
            "fieldSelector": self._fields,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": server_timeout,
        }
        if self.last_resource_version:
            params["resourceVersion"] = self.last_resource_version
        gc = self._gc
        br = gc.prepare_request(
            "list", res=self.resource_type, namespace=self._ns_arg, watch=True, params=params
        )
        timeout = httpx2.Timeout(self._request_timeout, read=server_timeout + 30.0)
        br.timeout = timeout
        req = gc.build_adapter_request(br)
        self.watches += 1
        self._io_waiting = True
        try:
            resp = await gc.send(req, stream=True)
        finally:
            self._io_waiting = False
        try:
            if resp.status_code >= 400:
                await resp.aread()
                if resp.status_code == 410:
                    raise _Gone()
                if resp.status_code == 504:
                    with contextlib.suppress(ValueError):
                        if _status_too_large(resp.json()):
                            raise _TooLarge()
                gc.raise_for_status(resp)
            async with contextlib.aclosing(resp.aiter_lines()) as lines:
                while True:
                    if self._drop_requested:
                        raise _Dropped()
                    self._io_waiting = True
                    try:
                        line = await anext(lines)
                    except StopAsyncIteration:
                        break
                    finally:
                        self._io_waiting = False
                    if line.strip():
                        got_event = True
                        await self._handle_line(line)
        finally:
            self._io_waiting = False
            await resp.aclose()
        lived = loop.time() - started
        if not got_event or lived + 1.0 < server_timeout:
            self._verify_rv = True  # silent until its timeout, or ended early by the server
        return got_event or lived >= 1.0

    async def _check_rv(self) -> None:
        """Raise :class:`_TooLarge` when the server's current resourceVersion (a one-item
        consistent LIST) is lower than ours: it went back in time."""
        ours = self.last_resource_version
        gc = self._gc
        params: dict[str, Any] = {
            "labelSelector": self._labels,
            "fieldSelector": self._fields,
            "limit": 1,
        }
        br = gc.prepare_request(
            "list", res=self.resource_type, namespace=self._ns_arg, params=params
        )
        resp = await gc.send(gc.build_adapter_request(br))
        _more, server_rv, _items = gc.handle_response("list", resp, br)
        self.rv_checks += 1
        self._verify_rv = False
        a = _as_int(ours) if ours else None
        b = _as_int(server_rv) if server_rv else None
        if a is not None and b is not None and a > b:
            log.warning(
                "%s: the server is at resourceVersion %s, behind ours (%s)", self.name, b, a
            )
            raise _TooLarge()

    async def _handle_line(self, line: str) -> None:
        ev = decoders.decode_watch_event(line.encode())
        etype = ev.type
        if etype == "ERROR":
            status = decoders.decode_status(ev.object)
            if status.code == 410 or status.reason in ("Expired", "Gone"):
                raise _Gone()
            if _status_too_large(status.to_dict()):
                raise _TooLarge()
            raise WatchErrorEvent(status.code, status.reason, status.message)
        if etype == "BOOKMARK":
            bm = msgspec.json.decode(ev.object, type=_Bookmark)
            if bm.metadata is not None and bm.metadata.resourceVersion:
                self.last_resource_version = _max_rv(
                    self.last_resource_version, bm.metadata.resourceVersion
                )
            return
        if etype not in (ADDED, MODIFIED, DELETED):
            log.warning("%s: ignoring watch event of unknown type %r", self.name, etype)
            return
        obj: T = decoders.decode_object(ev.object, self.resource_type)
        if self._transform is not None:
            obj = self._transformed(obj)
        self.last_resource_version = _max_rv(self.last_resource_version, resource_version(obj))
        out = self._cache.apply(etype, obj)
        if out is not None:
            await self._dispatch(out)

    def _transformed(self, obj: T) -> T:
        assert self._transform is not None
        try:
            return self._transform(obj)
        except Exception:
            self.transform_errors += 1
            if self.transform_errors == 1 or self.transform_errors % 1000 == 0:
                log.exception(
                    "%s: transform failed on an object (%d so far); kept as it arrived",
                    self.name, self.transform_errors,
                )  # fmt: skip
            return obj

    async def _dispatch(self, event: ReflectorEvent[T]) -> None:
        for handler in list(self._handlers):
            try:
                result = handler(event.type, event.obj, event.old)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("%s: handler %r failed on %s", self.name, handler, event.type)
        for stream in list(self._streams):
            stream._put(event)
