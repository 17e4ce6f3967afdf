"""The plugin watcher: finds registration sockets and runs the registration handshake.

Owns :class:`PluginWatcher`, the node agent's counterpart of the kubelet's plugin
watcher and plugin-manager reconciler. It keeps the set of registered plugins
equal to the set of live registration sockets under the registry directory and
calls a :class:`~drahealth.node._types.RegistrationHandler` (the plugin registry)
for every change. It does not talk to DRA or health services itself.

Level triggered: every pass lists the unix sockets present now (recursively, names
starting with ``.`` skipped, symlinks never followed) and reconciles against them.
A ``watchfiles`` watch and a periodic timer only make the next pass come sooner.

Per socket (identified by path plus device, inode and mtime, so a recreated socket
is a new one; ctime is left out because ``chmod`` after ``bind`` changes it):

* new: ``GetInfo`` (``getinfo_timeout``); no answer -> retried with backoff;
  answer -> :func:`~drahealth.node._validation.validate_plugin_info`; refused ->
  ``NotifyRegistrationStatus(False, text)`` once, until the socket is recreated;
  valid -> ``handler.register``; a refusal (``RegistrationError`` or any other
  exception) -> notify false and retry with backoff; success -> notify true.
* gone -> ``handler.deregister``; recreated -> deregister, then register anew.
* registered -> probed with ``GetInfo`` every ``probe_interval``; after
  ``probe_failures`` failures in a row it is deregistered although the file is
  still there, and registered again (full handshake) once it answers.

Work for different sockets runs concurrently in its own task, at most one task
per socket, so a hanging plugin delays only itself. Notification failures are
logged, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import stat
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import grpc
import watchfiles

from drahealth import api
from drahealth.core import positive_seconds
from drahealth.kube import Backoff
from drahealth.node._types import PluginInfo, RegistrationError, RegistrationHandler
from drahealth.node._validation import REGISTRATION_FAILED_PREFIX, validate_plugin_info

__all__ = ["PluginWatcher"]

log = logging.getLogger(__name__)

#: Longest delay between two registration attempts of a socket that does not answer
#: (the kubelet's exponential backoff tops out at about two minutes).
MAX_RETRY_DELAY = 120.0

_Ident = tuple[int, int, int]  # st_dev, st_ino, st_mtime_ns


class _State(enum.Enum):
    PENDING = "pending"  # not registered; (re)try at retry_at
    REGISTERED = "registered"
    REJECTED = "rejected"  # refused for good; waits for the socket to be recreated


@dataclass(eq=False)
class _Entry:
    """What the watcher knows about one registration socket."""

    path: str
    ident: _Ident
    backoff: Backoff
    state: _State = _State.PENDING
    info: PluginInfo | None = None
    retry_at: float = 0.0
    next_probe: float = 0.0
    failures: int = 0
    #: Deregistered by the probe: retried every probe interval, not with backoff.
    dropped: bool = False
    task: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()


def _scan_sockets(root: str) -> dict[str, _Ident]:
    """Unix sockets under ``root`` (recursive), path -> identity.

    Names starting with ``.`` are skipped (files and directories); symlinks are
    neither followed nor traversed; entries that vanish while listing, unreadable
    directories and names that are not valid UTF-8 are skipped.
    """
    found: dict[str, _Ident] = {}
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("cannot list %s: %s", directory, exc)
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                entry.path.encode()
            except UnicodeEncodeError:
                log.debug("ignoring %r: name is not valid UTF-8", entry.path)
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
            elif stat.S_ISSOCK(st.st_mode):
                found[entry.path] = (st.st_dev, st.st_ino, st.st_mtime_ns)
    return found


class PluginWatcher:
    """Keeps ``handler``'s registrations equal to the live sockets in ``registry_dir``.

    ``allowed_roots``: endpoints must lie inside one of these (default: the parent
    of ``registry_dir``, the kubelet root that holds ``plugins_registry/`` and
    ``plugins/``). ``allowed_uids``: owners a registration socket and its endpoint
    socket may have (default: root and this process's user); a socket someone else
    created is refused, so an unprivileged user who can write the directory cannot
    pose as a driver. ``rescan_interval``: longest time between two passes.
    ``probe_interval`` / ``probe_failures``: liveness probing of registered
    sockets. ``getinfo_timeout``: every ``GetInfo`` (registration and probes);
    ``notify_timeout``: every ``NotifyRegistrationStatus``. ``notify=False``
    (observer mode, beside a real kubelet that already answers the plugin): never
    call ``NotifyRegistrationStatus``.
    """

    def __init__(
        self,
        registry_dir: str,
        handler: RegistrationHandler,
        *,
        allowed_roots: Sequence[str] | None = None,
        allowed_uids: Sequence[int] | None = None,
        rescan_interval: float = 1.0,
        probe_interval: float = 10.0,
        probe_failures: int = 2,
        getinfo_timeout: float = 1.0,
        notify_timeout: float = 5.0,
        notify: bool = True,
    ) -> None:
        if not registry_dir:
            raise ValueError("registry_dir must not be empty")
        self._dir = os.path.abspath(registry_dir)
        if allowed_roots is None:
            allowed_roots = [os.path.dirname(self._dir)]
        if isinstance(allowed_roots, str):
            raise TypeError("allowed_roots must be a sequence of paths, not a single string")
        if not allowed_roots:
            raise ValueError("allowed_roots must name at least one directory")
        for root in allowed_roots:
            if not os.path.isabs(root):
                raise ValueError(f"allowed root {root!r} must be an absolute path")
        self._roots = tuple(allowed_roots)
        self._uids = frozenset(allowed_uids if allowed_uids is not None else (0, os.geteuid()))
        self._handler = handler
        self._rescan_interval = positive_seconds("rescan_interval", rescan_interval)
        self._probe_interval = positive_seconds("probe_interval", probe_interval)
        if isinstance(probe_failures, bool) or not isinstance(probe_failures, int):
            raise TypeError(f"probe_failures must be an int, got {probe_failures!r}")
        if probe_failures < 1:
            raise ValueError(f"probe_failures must be >= 1, got {probe_failures}")
        self._probe_failures = probe_failures
        self._getinfo_timeout = positive_seconds("getinfo_timeout", getinfo_timeout)
        self._notify_timeout = positive_seconds("notify_timeout", notify_timeout)
        self._notify_enabled = notify

        self._entries: dict[str, _Entry] = {}
        self._registered: dict[str, PluginInfo] = {}
        self._stats = {"registrations": 0, "rejections": 0, "removals": 0, "probe_failures": 0}
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._started = False

    # -- public surface ---------------------------------------------------------

    @property
    def registry_dir(self) -> str:
        return self._dir

    @property
    def registered(self) -> Mapping[str, PluginInfo]:
        """Registration socket path -> registered plugin (read-only live view)."""
        return MappingProxyType(self._registered)

    def stats(self) -> dict[str, int]:
        """Counters: ``registrations`` (successful), ``rejections`` (refusals sent),
        ``removals`` (socket removed or recreated), ``probe_failures`` (sockets
        dropped because they stopped answering)."""
        return dict(self._stats)

    async def start(self) -> None:
        """Create the registry dir if needed, start watching; the first full pass
        (including the handshakes it starts) is done when this returns."""
        if self._started:
            raise RuntimeError("plugin watcher already started")
        self._started = True
        self._stop_event.clear()
        os.makedirs(self._dir, mode=0o755, exist_ok=True)
        self._watch_task = asyncio.create_task(self._watch(), name=f"watch {self._dir}")
        await self.rescan()
        self._loop_task = asyncio.create_task(self._run(), name=f"reconcile {self._dir}")

    async def stop(self) -> None:
        """Stop watching and cancel in-flight handshakes. Deregisters nothing."""
        self._stop_event.set()
        tasks = [t for t in (self._loop_task, self._watch_task) if t is not None]
        tasks += list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._loop_task = self._watch_task = None
        self._tasks.clear()
        for entry in self._entries.values():
            entry.task = None
        self._started = False

    async def rescan(self) -> None:
        """One level-triggered pass; returns when the work it started is done.

        Sockets whose previous work is still running are left for a later pass.
        """
        started = self._reconcile()
        if started:
            await asyncio.wait(started)

    # -- reconciliation ---------------------------------------------------------

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _new_entry(self, path: str, ident: _Ident) -> _Entry:
        initial = min(self._rescan_interval / 2, MAX_RETRY_DELAY)
        return _Entry(path, ident, Backoff(initial, max(initial, MAX_RETRY_DELAY)))

    def _reconcile(self) -> list[asyncio.Task[None]]:
        present = _scan_sockets(self._dir)
        now = self._now()
        started: list[asyncio.Task[None]] = []
        for path, entry in list(self._entries.items()):
            if entry.busy:
                continue
            ident = present.get(path)
            if ident is None:
                if entry.state is _State.REGISTERED:
                    started.append(self._spawn(entry, self._remove(entry)))
                else:
                    del self._entries[path]
            elif ident != entry.ident:
                started.append(self._spawn(entry, self._replace(entry, ident)))
            elif entry.state is _State.REGISTERED and now >= entry.next_probe:
                started.append(self._spawn(entry, self._probe(entry)))
            elif entry.state is _State.PENDING and now >= entry.retry_at:
                started.append(self._spawn(entry, self._register(entry)))
        for path, ident in present.items():
            if path not in self._entries:
                entry = self._entries[path] = self._new_entry(path, ident)
                started.append(self._spawn(entry, self._register(entry)))
        return started

    def _spawn(self, entry: _Entry, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=f"plugin {entry.path}")
        entry.task = task
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if entry.task is t:
                entry.task = None
            if not t.cancelled() and t.exception() is not None:
                log.error("plugin socket %s: unexpected error", entry.path, exc_info=t.exception())
                # Back off instead of retrying on the very next pass.
                later = self._now() + entry.backoff.next()
                entry.retry_at = entry.next_probe = later
            self._wake.set()

        task.add_done_callback(done)
        return task

    def _next_delay(self) -> float:
        delay = self._rescan_interval
        now = self._now()
        for entry in self._entries.values():
            if entry.busy:
                continue
            if entry.state is _State.REGISTERED:
                delay = min(delay, entry.next_probe - now)
            elif entry.state is _State.PENDING:
                delay = min(delay, entry.retry_at - now)
        return max(delay, 0.0)

    async def _run(self) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for may swallow a
        # cancellation that races with the event being set, and stop() sets it.
        while not self._stop_event.is_set():
            self._wake.clear()
            try:
                self._reconcile()
                delay = self._next_delay()
            except Exception:
                log.exception("plugin watcher pass over %s failed", self._dir)
                delay = self._rescan_interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def _watch(self) -> None:
        """Turn filesystem events into early passes; periodic passes cover failures."""
        failing = False
        while not self._stop_event.is_set():
            try:
                async for _changes in watchfiles.awatch(
                    self._dir,
                    watch_filter=None,
                    debounce=500,
                    step=20,
                    stop_event=self._stop_event,
                    recursive=True,
                ):
                    failing = False
                    self._wake.set()
            except Exception as exc:
                log.log(
                    logging.DEBUG if failing else logging.WARNING,
                    "watching %s failed (%s); relying on rescans every %.1f s",
                    self._dir,
                    exc,
                    self._rescan_interval,
                )
                failing = True
                self._wake.set()
                await asyncio.sleep(max(self._rescan_interval, 1.0))

    # -- per-socket work --------------------------------------------------------

    async def _get_info(
        self, stub: api.registration_grpc.RegistrationAsyncStub, path: str
    ) -> api.registration.PluginInfo | None:
        timeout = self._getinfo_timeout
        try:
            async with asyncio.timeout(timeout + 0.5):  # in case the deadline is not kept
                return await stub.GetInfo(api.registration.InfoRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            log.debug("GetInfo on %s failed: %s %s", path, exc.code().name, exc.details())
        except TimeoutError:
            log.debug("GetInfo on %s timed out after %.1f s", path, timeout)
        except Exception as exc:
            log.debug("GetInfo on %s failed: %r", path, exc)
        return None

    async def _notify(
        self, stub: api.registration_grpc.RegistrationAsyncStub, path: str, ok: bool, error: str
    ) -> None:
        if not self._notify_enabled:
            return
        status = api.registration.RegistrationStatus(plugin_registered=ok, error=error)
        timeout = self._notify_timeout
        try:
            async with asyncio.timeout(timeout + 0.5):
                await stub.NotifyRegistrationStatus(status, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "NotifyRegistrationStatus(%s) to %s failed: %s %s",
                ok,
                path,
                exc.code().name,
                exc.details(),
            )
        except Exception as exc:
            log.warning("NotifyRegistrationStatus(%s) to %s failed: %r", ok, path, exc)

    def _retry_later(self, entry: _Entry) -> None:
        delay = self._probe_interval if entry.dropped else entry.backoff.next()
        entry.retry_at = self._now() + delay

    async def _register(self, entry: _Entry) -> None:
        path = entry.path
        if len(path.encode()) >= api.UNIX_PATH_MAX:
            log.warning(
                "ignoring registration socket %s: path is %d bytes, unix sockets need < %d",
                path,
                len(path.encode()),
                api.UNIX_PATH_MAX,
            )
            entry.state = _State.REJECTED
            self._stats["rejections"] += 1
            return
        foreign = self._foreign_owner(path)
        if foreign is not None:
            log.warning("refusing registration socket %s: %s", path, foreign)
            entry.state = _State.REJECTED
            self._stats["rejections"] += 1
            return
        async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
            stub = api.registration_grpc.RegistrationStub(channel)
            answer = await self._get_info(stub, path)
            if answer is None:
                if entry.backoff.attempts == 0 and not entry.dropped:
                    log.info("registration socket %s does not answer GetInfo yet; retrying", path)
                self._retry_later(entry)
                return
            try:
                info = validate_plugin_info(
                    answer, registration_socket=path, allowed_roots=self._roots
                )
            except RegistrationError as exc:
                entry.state = _State.REJECTED
                self._stats["rejections"] += 1
                log.warning("refusing plugin at %s: %s", path, exc)
                await self._notify(stub, path, False, str(exc))
                return
            foreign = self._foreign_owner(info.endpoint)
            if foreign is not None:
                entry.state = _State.REJECTED
                self._stats["rejections"] += 1
                log.warning("refusing plugin %s at %s: endpoint %s", info.driver, path, foreign)
                await self._notify(stub, path, False, f"endpoint {info.endpoint}: {foreign}")
                return
            refusal = await self._call_register(info)
            if refusal is not None:
                self._stats["rejections"] += 1
                self._retry_later(entry)
                log.warning("refusing plugin %s at %s: %s", info.driver, path, refusal)
                await self._notify(stub, path, False, REGISTRATION_FAILED_PREFIX + refusal)
                return
            entry.state = _State.REGISTERED
            entry.info = info
            entry.failures = 0
            entry.dropped = False
            entry.backoff.reset()
            entry.next_probe = self._now() + self._probe_interval
            self._registered[path] = info
            self._stats["registrations"] += 1
            log.info(
                "registered DRA plugin %s (endpoint %s) from %s", info.driver, info.endpoint, path
            )
            await self._notify(stub, path, True, "")

    def _foreign_owner(self, path: str) -> str | None:
        """Why the socket at ``path`` may not be trusted (its owner), or ``None``."""
        try:
            uid = os.lstat(path).st_uid
        except OSError:
            return None  # gone or not there yet: the connection attempt decides
        if uid in self._uids:
            return None
        allowed = ", ".join(str(u) for u in sorted(self._uids))
        return f"owned by uid {uid}, not by an allowed user ({allowed})"

    async def _call_register(self, info: PluginInfo) -> str | None:
        """``handler.register(info)``; the refusal text, or ``None`` on success."""
        try:
            await self._handler.register(info)
        except RegistrationError as exc:
            return str(exc)
        except Exception as exc:
            log.exception("registration handler failed for %s", info.driver)
            return f"internal error: {type(exc).__name__}: {exc}"
        return None

    async def _deregister(self, entry: _Entry, why: str) -> None:
        info = entry.info
        entry.state = _State.PENDING
        entry.info = None
        entry.failures = 0
        self._registered.pop(entry.path, None)
        if info is None:
            return
        log.info("deregistering DRA plugin %s from %s: %s", info.driver, entry.path, why)
        try:
            await self._handler.deregister(info)
        except Exception:
            log.exception("deregistration handler failed for %s", info.driver)

    async def _remove(self, entry: _Entry) -> None:
        self._stats["removals"] += 1
        await self._deregister(entry, "socket removed")
        if self._entries.get(entry.path) is entry:
            del self._entries[entry.path]

    async def _replace(self, entry: _Entry, ident: _Ident) -> None:
        if entry.state is _State.REGISTERED:
            self._stats["removals"] += 1
            await self._deregister(entry, "socket recreated")
        entry.ident = ident
        entry.state = _State.PENDING
        entry.dropped = False
        entry.failures = 0
        entry.backoff.reset()
        await self._register(entry)

    async def _probe(self, entry: _Entry) -> None:
        async with grpc.aio.insecure_channel(f"unix:{entry.path}") as channel:
            answer = await self._get_info(
                api.registration_grpc.RegistrationStub(channel), entry.path
            )
        entry.next_probe = self._now() + self._probe_interval
        if answer is not None:
            entry.failures = 0
            return
        entry.failures += 1
        log.warning(
            "registration socket %s did not answer (%d/%d)",
            entry.path,
            entry.failures,
            self._probe_failures,
        )
        if entry.failures >= self._probe_failures:
            self._stats["probe_failures"] += 1
            await self._deregister(entry, f"no answer to {self._probe_failures} probes")
            entry.dropped = True
            self._retry_later(entry)
