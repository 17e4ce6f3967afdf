"""Object storage, the global resourceVersion and the watch event buffer.

Owns every stored object (plain JSON dicts, treated as immutable once stored), the
single monotonically increasing resourceVersion stamped on every write, a bounded
buffer of recent events (``window`` events; older resourceVersions are answered with
``Expired``), and the per-watcher ``asyncio.Queue``s. Knows nothing of HTTP,
validation or kinds beyond a storage key string.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(eq=False)
class Watcher:
    """One open watch: its queue receives ``(type, object)`` pairs, ``None`` closes it."""

    key: str
    namespace: str | None
    match: Callable[[JSON], bool]
    queue: asyncio.Queue[tuple[str, JSON] | None] = field(default_factory=asyncio.Queue)

    def offer(self, ev: Event) -> None:
        out = self.translate(ev)
        if out is not None:
            self.queue.put_nowait(out)

    def translate(self, ev: Event) -> tuple[str, JSON] | None:
        """Map a store event to what this watcher sees (selector transitions included)."""
        if ev.key != self.key:
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

    def __init__(self, window: int = 1000) -> None:
        self.window = max(1, window)
        self.rv = 0
        self._floor = 0
        self._objects: dict[str, dict[tuple[str, str], JSON]] = {}
        self._events: deque[Event] = deque()
        self._watchers: set[Watcher] = set()
        self.on_write: Callable[[], None] | None = None

    # ------------------------------------------------------------------ reads

    def get(self, key: str, namespace: str, name: str) -> JSON | None:
        return self._objects.get(key, {}).get((namespace, name))

    def objects(self, key: str, namespace: str | None = None) -> list[JSON]:
        objs = self._objects.get(key, {})
        return [objs[k] for k in sorted(objs) if namespace is None or k[0] == namespace]

    def keys(self) -> list[str]:
        return sorted(self._objects)

    # ------------------------------------------------------------------ writes

    def _emit(self, ev: Event) -> None:
        if len(self._events) >= self.window:
            self._floor = self._events.popleft().rv
        self._events.append(ev)
        for w in list(self._watchers):
            w.offer(ev)
        if self.on_write is not None:
            self.on_write()

    def _stamp(self, obj: JSON) -> JSON:
        self.rv += 1
        return _with_rv(obj, self.rv)

    def create(self, key: str, obj: JSON) -> JSON:
        obj = self._stamp(obj)
        self._objects.setdefault(key, {})[_ns_name(obj)] = obj
        self._emit(Event(self.rv, ADDED, key, obj))
        return obj

    def update(self, key: str, obj: JSON) -> JSON:
        ident = _ns_name(obj)
        old = self._objects.get(key, {}).get(ident)
        obj = self._stamp(obj)
        self._objects.setdefault(key, {})[ident] = obj
        self._emit(Event(self.rv, MODIFIED, key, obj, old))
        return obj

    def delete(self, key: str, obj: JSON) -> JSON:
        self._objects.get(key, {}).pop(_ns_name(obj), None)
        obj = self._stamp(obj)
        self._emit(Event(self.rv, DELETED, key, obj))
        return obj

    def compact(self) -> None:
        """Forget all buffered events: any resourceVersion below the current one expires."""
        self._events.clear()
        self._floor = self.rv

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
        w = Watcher(key, namespace, match)
        initial: list[tuple[str, JSON]] = []
        if since is None:
            initial = [(ADDED, o) for o in self.objects(key, namespace) if match(o)]
        else:
            self.check_rv(since)
            for ev in self._events:
                if ev.rv > since:
                    out = w.translate(ev)
                    if out is not None:
                        initial.append(out)
        self._watchers.add(w)
        return w, initial

    def unwatch(self, w: Watcher) -> None:
        self._watchers.discard(w)

    def close_watchers(self) -> None:
        for w in list(self._watchers):
            w.queue.put_nowait(None)
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
        self._floor = rv
        self._events.clear()
