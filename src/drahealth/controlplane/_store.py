"""Object storage, the global resourceVersion and the watch event buffer.

Owns every stored object (plain JSON dicts, treated as immutable once stored), the
single monotonically increasing resourceVersion stamped on every write, a bounded
buffer of recent events (at most ``window`` events and ``window_bytes`` of encoded
objects, :data:`WINDOW_BYTES` by default; older resourceVersions are answered with
``Expired``), and the per-watcher ``asyncio.Queue``s (each bounded in events and in
bytes the same way; a watcher over either bound is closed and re-watches). Knows nothing of HTTP,
validation or kinds beyond a storage key string.

Durability hand-off: with ``journaled`` set (a data file is in use), every write is
applied at once (later operations read it) but kept as a pending :class:`Change`
until the journal reports it durable: :meth:`Store.commit` then publishes its event to
the watch buffer and the watchers, :meth:`Store.rollback` undoes every pending change
(and gives their resourceVersions back: nobody has seen them). ``committed_rv`` is the
newest durable resourceVersion; watchers never see a change that could still vanish.
Without a journal every write is committed immediately.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

JSON = dict[str, Any]
ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"


class TooOld(Exception):
    """The requested resourceVersion is older than the oldest buffered event."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")


@dataclass(frozen=True, slots=True)
class Event:
    rv: int
    type: str
    key: str
    obj: JSON
    old: JSON | None = None


def _ns_name(obj: JSON) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _with_rv(obj: JSON, rv: int) -> JSON:
    out = dict(obj)
    out["metadata"] = {**(obj.get("metadata") or {}), "resourceVersion": str(rv)}
    return out


@dataclass(frozen=True, slots=True)
class Change:
    """One applied but not yet durable write: what the journal stores and what undoes it."""

    rv: int
    key: str
    ident: tuple[str, str]
    old: JSON | None  # the stored object before the write (None: there was none)
    new: JSON | None  # the stored object after the write (None: deleted)
    event: Event


#: Most events queued for one watcher; a watcher that falls this far behind is closed.
WATCH_QUEUE_LIMIT = 1000
#: Most bytes (encoded objects) the event window, and one watcher's queue, hold.
WINDOW_BYTES = 64 << 20


def event_size(ev: Event) -> int:
    """What buffering ``ev`` costs: its object and the object it replaced, encoded."""
    size = len(msgspec.json.encode(ev.obj))
    if ev.old is not None:
        size += len(msgspec.json.encode(ev.old))
    return size


@dataclass(eq=False)
class Watcher:
    """One open watch: its queue receives ``(type, object)`` pairs, ``None`` closes it.

    The queue holds at most ``limit`` events (plus the closing ``None``). When an event
    finds it full, ``offer`` answers False and the store closes the watcher: what was
    queued is dropped and the stream ends, so the client re-watches from the last
    resourceVersion it saw (as the real API server does with a slow watcher).
    """

    key: str
    namespace: str | None
    match: Callable[[JSON], bool]
    limit: int = WATCH_QUEUE_LIMIT
    limit_bytes: int = WINDOW_BYTES
    queue: asyncio.Queue[tuple[str, JSON] | None] = field(default_factory=asyncio.Queue)
    closed: bool = False
    #: Bytes of the queued events (see :func:`event_size`), and each one's share.
    queued_bytes: int = 0
    _sizes: deque[int] = field(default_factory=deque)
    #: Events at or below this resourceVersion are not sent (a watch from a future one).
    after: int = 0

    def offer(self, ev: Event, size: int = 0) -> bool:
        """Queue what this watcher sees of ``ev`` (``size``: its :func:`event_size`);
        False when its queue is full (in events or in bytes)."""
        if self.closed:
            return True
        out = self.translate(ev)
        if out is None:
            return True
        if self.queue.qsize() >= self.limit or (
            self.queued_bytes and self.queued_bytes + size > self.limit_bytes
        ):
            return False
        self.queue.put_nowait(out)
        self._sizes.append(size)
        self.queued_bytes += size
        return True

    async def take(self) -> tuple[str, JSON] | None:
        """The next queued event (``None``: the stream ends)."""
        item = await self.queue.get()
        if item is not None and self._sizes:
            self.queued_bytes -= self._sizes.popleft()
        return item

    def close(self, *, drop_queued: bool = True) -> None:
        """End the stream with ``None``; a slow watcher's queued events are dropped."""
        if self.closed:
            return
        self.closed = True
        while drop_queued and not self.queue.empty():
            self.queue.get_nowait()
        if drop_queued:
            self._sizes.clear()
            self.queued_bytes = 0
        self.queue.put_nowait(None)

    def translate(self, ev: Event) -> tuple[str, JSON] | None:
        """Map a store event to what this watcher sees (selector transitions included)."""
        if ev.key != self.key or ev.rv <= self.after:
            return None
        if self.namespace is not None and _ns_name(ev.obj)[0] != self.namespace:
            return None
        now_ok = self.match(ev.obj)
        if ev.type != MODIFIED or ev.old is None:
            return (ev.type, ev.obj) if now_ok else None
        was_ok = self.match(ev.old)
        if now_ok:
            return (MODIFIED if was_ok else ADDED), ev.obj
        if was_ok:
            return DELETED, _with_rv(ev.old, ev.rv)
        return None


class Store:
    """All objects by storage key, namespace and name."""

    #: Per-watcher queue bound (see ``Watcher``); tests may lower it on an instance.
    watch_queue_limit: int = WATCH_QUEUE_LIMIT
    #: Watchers closed because they could not keep up (queue full or writes stuck).
    slow_watchers_closed: int = 0

    def __init__(self, window: int = 1000, window_bytes: int = WINDOW_BYTES) -> None:
        self.window = max(1, window)
        self.window_bytes = max(1, window_bytes)
        self.rv = 0
        self._floor = 0
        self._objects: dict[str, dict[tuple[str, str], JSON]] = {}
        self._events: deque[Event] = deque()
        self._event_sizes: deque[int] = deque()
        #: Bytes the buffered events hold (see :func:`event_size`).
        self.window_bytes_used = 0
        self._watchers: set[Watcher] = set()
        self.on_write: Callable[[], None] | None = None
        #: Newest resourceVersion whose write is durable (== ``rv`` without a journal).
        self.committed_rv = 0
        #: Set by the journal: writes stay pending until :meth:`commit`.
        self.journaled = False
        self._pending: list[Change] = []

    # ------------------------------------------------------------------ reads

    def get(self, key: str, namespace: str, name: str) -> JSON | None:
        return self._objects.get(key, {}).get((namespace, name))

    def objects(self, key: str, namespace: str | None = None) -> list[JSON]:
        objs = self._objects.get(key, {})
        return [objs[k] for k in sorted(objs) if namespace is None or k[0] == namespace]

    def keys(self) -> list[str]:
        return sorted(self._objects)

    # ------------------------------------------------------------------ writes

    @property
    def buffered_events(self) -> int:
        return len(self._events)

    def _publish(self, ev: Event) -> None:
        size = event_size(ev)
        self._events.append(ev)
        self._event_sizes.append(size)
        self.window_bytes_used += size
        while len(self._events) > 1 and (
            len(self._events) > self.window or self.window_bytes_used > self.window_bytes
        ):
            self._floor = self._events.popleft().rv
            self.window_bytes_used -= self._event_sizes.popleft()
        for w in list(self._watchers):
            if not w.offer(ev, size):
                self.close_slow(w)

    def _emit(self, ev: Event, ident: tuple[str, str], old: JSON | None, new: JSON | None) -> None:
        if self.journaled:
            self._pending.append(Change(ev.rv, ev.key, ident, old, new, ev))
        else:
            self._publish(ev)
            self.committed_rv = ev.rv
        if self.on_write is not None:
            self.on_write()

    def _stamp(self, obj: JSON) -> JSON:
        self.rv += 1
        return _with_rv(obj, self.rv)

    def create(self, key: str, obj: JSON) -> JSON:
        obj = self._stamp(obj)
        ident = _ns_name(obj)
        bucket = self._objects.setdefault(key, {})
        old = bucket.get(ident)
        bucket[ident] = obj
        self._emit(Event(self.rv, ADDED, key, obj), ident, old, obj)
        return obj

    def update(self, key: str, obj: JSON) -> JSON:
        ident = _ns_name(obj)
        old = self._objects.get(key, {}).get(ident)
        obj = self._stamp(obj)
        self._objects.setdefault(key, {})[ident] = obj
        self._emit(Event(self.rv, MODIFIED, key, obj, old), ident, old, obj)
        return obj

    def delete(self, key: str, obj: JSON) -> JSON:
        ident = _ns_name(obj)
        old = self._objects.get(key, {}).pop(ident, None)
        obj = self._stamp(obj)
        self._emit(Event(self.rv, DELETED, key, obj), ident, old, None)
        return obj

    def compact(self) -> None:
        """Forget all buffered events: any resourceVersion below the current one expires."""
        self._events.clear()
        self._event_sizes.clear()
        self.window_bytes_used = 0
        self._floor = self.committed_rv

    # ------------------------------------------------------------------ durability

    def pending(self) -> list[Change]:
        """The writes not yet durable, oldest first (a copy)."""
        return list(self._pending)

    def pending_rv(self) -> int | None:
        """resourceVersion of the newest pending write, or None when all are durable."""
        return self._pending[-1].rv if self._pending else None

    def commit(self, count: int) -> None:
        """The oldest ``count`` pending writes are durable: publish their events."""
        done, self._pending = self._pending[:count], self._pending[count:]
        for change in done:
            self._publish(change.event)
            self.committed_rv = change.rv

    def rollback(self) -> int:
        """Undo every pending write (newest first); returns how many were undone.

        Their resourceVersions are handed out again: no client has seen them (answers,
        reads and watch events all wait for durability).
        """
        undone, self._pending = self._pending, []
        for change in reversed(undone):
            bucket = self._objects.setdefault(change.key, {})
            if change.old is None:
                bucket.pop(change.ident, None)
            else:
                bucket[change.ident] = change.old
        self.rv = self.committed_rv
        return len(undone)

    def committed_state(self) -> dict[str, dict[tuple[str, str], JSON]]:
        """A shallow copy of the durable state (pending writes undone on the copy).

        Stored objects are never mutated, so the copy may be read from another thread
        while the store goes on changing.
        """
        state = {k: dict(v) for k, v in self._objects.items()}
        for change in reversed(self._pending):
            bucket = state.setdefault(change.key, {})
            if change.old is None:
                bucket.pop(change.ident, None)
            else:
                bucket[change.ident] = change.old
        return state

    def committed_objects(self, key: str, namespace: str | None = None) -> list[JSON]:
        """Like :meth:`objects`, without the writes that are not yet durable."""
        if not any(c.key == key for c in self._pending):
            return self.objects(key, namespace)
        objs = dict(self._objects.get(key, {}))
        for change in reversed(self._pending):
            if change.key == key:
                if change.old is None:
                    objs.pop(change.ident, None)
                else:
                    objs[change.ident] = change.old
        return [objs[k] for k in sorted(objs) if namespace is None or k[0] == namespace]

    # ------------------------------------------------------------------ watch

    def check_rv(self, since: int) -> None:
        if since < self._floor:
            raise TooOld(since, self._floor + 1)

    def watch(
        self,
        key: str,
        namespace: str | None,
        match: Callable[[JSON], bool],
        since: int | None,
    ) -> tuple[Watcher, list[tuple[str, JSON]]]:
        """Register a watcher; returns it and the events it must send first.

        ``since=None`` means "current state": synthetic ADDED events for every
        matching object. Otherwise buffered events after ``since`` are replayed.
        """
        w = Watcher(key, namespace, match, self.watch_queue_limit, self.window_bytes)
        initial: list[tuple[str, JSON]] = []
        if since is None:
            initial = [(ADDED, o) for o in self.committed_objects(key, namespace) if match(o)]
        else:
            self.check_rv(since)
            w.after = since
            for ev in self._events:
                if ev.rv > since:
                    out = w.translate(ev)
                    if out is not None:
                        initial.append(out)
        self._watchers.add(w)
        return w, initial

    def unwatch(self, w: Watcher) -> None:
        self._watchers.discard(w)

    def close_slow(self, w: Watcher) -> None:
        """Close a watcher that cannot keep up (full queue or stuck writer) and count it."""
        if not w.closed:
            self.slow_watchers_closed += 1
        self._watchers.discard(w)
        w.close()

    def close_watchers(self) -> None:
        for w in list(self._watchers):
            w.close(drop_queued=False)
        self._watchers.clear()

    # ------------------------------------------------------------------ persistence

    def snapshot(self) -> JSON:
        return {
            "resourceVersion": self.rv,
            "objects": {k: self.objects(k) for k in self.keys() if self._objects[k]},
        }

    def restore(self, rv: int, objects: dict[str, Iterable[JSON]]) -> None:
        self._objects = {k: {_ns_name(o): o for o in objs} for k, objs in objects.items()}
        self.rv = rv
        self.committed_rv = rv
        self._floor = rv
        self._events.clear()
        self._event_sizes.clear()
        self.window_bytes_used = 0
        self._pending.clear()
