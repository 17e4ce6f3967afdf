"""The write-ahead log of the embedded API server: acknowledged means durable.

Owns ``<data file>.wal`` and the :class:`Journal` that keeps it and the snapshot
(``_persist``) in step with the :class:`~._store.Store`:

* Every write the store applies stays pending until the journal has appended it to the
  log and fsynced it. One flush task does the appending; everything that became pending
  while an fsync was running goes out in the next single write + fsync (group commit).
  The HTTP layer awaits :meth:`Journal.wait` before it answers, and the store publishes
  watch events only on commit, so no client ever sees a change that a crash could take
  back, and a restarted server never hands out a resourceVersion somebody has seen.
* Log format (UTF-8, one line each, ``<crc32>`` as in ``_persist``)::

      <crc32> {"format": "drahealth-apiserver-log", "version": 1}
      <crc32> {"rv": N, "key": "/pods", "ns": "default", "name": "p", "object": {...}}

  ``"object": null`` is a deletion. Replay applies, in order, the records newer than
  the snapshot's resourceVersion. Every write takes the next resourceVersion, so the
  records count up by one and the first one newer than the snapshot directly follows
  it: a repeat, a step back or a gap (a lost record, or a data file older than its log)
  is damage. Records are read one at a time, each at most ``MAX_RECORD_BYTES``, from a
  regular file only (a directory, FIFO or device in the log's place, or a symlink to a
  missing file, is an error at once, never a hang or an endless read). Only an
  unterminated last line is a torn, never acknowledged append and is cut off (an append
  is acknowledged after its newline is fsynced). Any other damage, a complete
  (newline-terminated) last record with a bad checksum included, raises
  ``DataFileError`` naming the log, the line and its byte offset: the server refuses to
  start rather than lose an acknowledged write and hand its resourceVersion out again.
* Compaction: when the log outgrows ``max(compact_bytes, last snapshot size)`` the
  durable state is copied on the loop (a shallow copy: stored objects never change),
  written as a new snapshot by a worker thread, and the log is then rewritten to hold
  only the records appended meanwhile.
* Failures (ENOSPC, EIO, short writes that make no progress): the batch is rolled back
  in memory and every waiting request gets :class:`PersistError` (the server answers
  500). The journal is then unhealthy: it logs once, counts failures, and retries at
  most every ``retry_interval`` seconds (on the next write or a timer) by writing a
  fresh snapshot and a fresh log, since the old log may end in garbage. Until that
  succeeds, writes are refused; reads of durable state go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import IO, Any

from drahealth import _durable

from . import _persist
from ._persist import DataFileError, decode_line, encode_line
from ._store import Change, Store

log = logging.getLogger(__name__)

JSON = dict[str, Any]
LOG_FORMAT = "drahealth-apiserver-log"
LOG_VERSION = 1
_HEADER = encode_line({"format": LOG_FORMAT, "version": LOG_VERSION})
COMPACT_BYTES = 16 << 20
#: The longest log record read back: a stored object is at most 1.5 MiB encoded
#: (``_decode.MAX_OBJECT_BYTES``); anything this long is damage, not a record.
MAX_RECORD_BYTES = 64 << 20
RETRY_INTERVAL_S = 1.0


class PersistError(DataFileError):
    """A write could not be made durable (the message names the file and the OS error)."""


def log_path(data: Path) -> Path:
    return data.with_name(data.name + ".wal")


def encode_changes(changes: Collection[Change]) -> bytes:
    out = bytearray()
    for c in changes:
        rec = {"rv": c.rv, "key": c.key, "ns": c.ident[0], "name": c.ident[1], "object": c.new}
        out += encode_line(rec)
    return bytes(out)


# --------------------------------------------------------------------------- the log file


class Log:
    """An open log file (append only). Methods do blocking I/O: call them in a thread."""

    def __init__(self, path: Path, fd: int, size: int) -> None:
        self.path = path
        self.fd = fd
        self.size = size

    @classmethod
    def create(cls, path: Path, tail: bytes = b"") -> Log:
        """Atomically replace ``path`` with a header (plus ``tail``) and open it."""
        size = _durable.atomic_write(str(path), _HEADER + tail)
        return cls(path, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC), size)

    @classmethod
    def open(cls, path: Path, size: int) -> Log:
        """Open an existing, replayed log, cutting it to its good ``size``."""
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
                _durable._fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, size)

    def append(self, data: bytes) -> None:
        """Write ``data`` and fsync; on error the log must not be appended to again."""
        _durable.write_all(self.fd, data)
        _durable._fsync(self.fd)
        self.size += len(data)

    def rotate(self, offset: int) -> Log:
        """A new log holding what was appended after ``offset``; closes this one."""
        with open(self.path, "rb") as f:
            f.seek(offset)
            tail = f.read(self.size - offset)
        new = Log.create(self.path, tail)
        self.close()
        return new

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def replay(path: Path, base_rv: int, state: _persist.State) -> tuple[int, int, int]:
    """Apply the log at ``path`` to ``state``; ``(resourceVersion, good size, torn bytes)``.

    The log is read one record at a time (at most :data:`MAX_RECORD_BYTES` each), so a
    huge or endless file costs no more memory than one record; only a regular file is
    read (``_persist.open_regular``). Raises DataFileError naming the log, line and byte
    offset for anything but an unterminated (torn) last line.
    """
    opened = _persist.open_regular(path, "the log")
    if opened is None:
        raise DataFileError(f"{path}: cannot read the log: it disappeared")
    f, size = opened
    try:
        with f:
            return _replay(path, f, size, base_rv, state)
    except OSError as e:
        raise DataFileError(f"{path}: cannot read the log: {e}") from e


def _replay(
    path: Path, f: IO[bytes], size: int, base_rv: int, state: _persist.State
) -> tuple[int, int, int]:
    rv = base_rv
    last: int | None = None
    good = 0
    number = 0
    while good < size:
        line = f.readline(min(MAX_RECORD_BYTES + 1, size - good))
        number += 1
        where = f"line {number} at offset {good}"
        if not line.endswith(b"\n"):
            if len(line) > MAX_RECORD_BYTES:
                raise DataFileError(
                    f"{path}: corrupt log ({where}: a record longer than {MAX_RECORD_BYTES} bytes)"
                )
            break  # the unterminated remainder: a torn append, never acknowledged
        body = line[:-1]
        if number == 1:
            _check_header(path, body)
            good += len(line)
            continue
        try:
            rec = decode_line(body)
        except ValueError as e:  # a bad checksum (LineChecksumError) or not JSON
            raise DataFileError(f"{path}: corrupt log ({where}: {e})") from None
        problem = _record_problem(rec, last, base_rv)
        if problem is not None:
            raise DataFileError(f"{path}: corrupt log ({where}: {problem})")
        last = rec["rv"]
        good += len(line)
        if last <= base_rv:
            continue  # already in the snapshot
        rv = last
        bucket = state.setdefault(rec["key"], {})
        if rec["object"] is None:
            bucket.pop((rec["ns"], rec["name"]), None)
        else:
            bucket[(rec["ns"], rec["name"])] = rec["object"]
    if good == 0:
        raise DataFileError(f"{path}: corrupt log (no {LOG_FORMAT} header)")
    return rv, good, size - good


def _check_header(path: Path, line: bytes) -> None:
    try:
        header = decode_line(line)
    except ValueError as e:
        raise DataFileError(f"{path}: corrupt log (line 1 at offset 0: {e})") from None
    if header.get("format") != LOG_FORMAT:
        raise DataFileError(f"{path}: corrupt log (no {LOG_FORMAT} header)")
    if header.get("version") != LOG_VERSION:
        raise DataFileError(f"{path}: unsupported log version {header.get('version')!r}")


def _record_problem(rec: JSON, last: int | None, base_rv: int) -> str | None:
    rv = _persist.check_rv(rec.get("rv"))
    if rv is None or rv == 0:
        return f"bad resourceVersion {rec.get('rv')!r}"
    # Every write takes the next resourceVersion (a rolled-back one is handed out again),
    # so records count up by one, and the first one newer than the snapshot follows it.
    if last is not None and rv != last + 1:
        return f"resourceVersion {rv} does not follow {last}"
    if last is None and rv > base_rv + 1:
        return (
            f"the first record is resourceVersion {rv} but the data file ends at {base_rv}: "
            f"writes {base_rv + 1}..{rv - 1} are missing"
        )
    key, ns, name, obj = rec.get("key"), rec.get("ns"), rec.get("name"), rec.get("object")
    if not isinstance(key, str) or not key:
        return f"bad storage key {key!r}"
    if not isinstance(ns, str) or not isinstance(name, str) or not name:
        return f"bad namespace/name {ns!r}/{name!r}"
    if obj is not None:
        problem = _persist.object_problem(obj, rv)
        if problem is not None:
            return problem
        if _persist.ident(obj) != (ns, name) or obj["metadata"]["resourceVersion"] != str(rv):
            return "object does not match its record"
    return None


# --------------------------------------------------------------------------- the journal


class Journal:
    """Keeps a Store durable in a data file (snapshot) and its log."""

    def __init__(
        self,
        store: Store,
        path: Path,
        *,
        compact_bytes: int = COMPACT_BYTES,
        retry_interval: float = RETRY_INTERVAL_S,
    ) -> None:
        self.store = store
        self.path = Path(path)
        self.log_path = log_path(self.path)
        self.compact_bytes = max(1, compact_bytes)
        self.retry_interval = retry_interval
        self._log: Log | None = None
        self._existing_log_size: int | None = None
        self._snapshot_bytes = 0
        self._task: asyncio.Task[None] | None = None
        self._compact_task: asyncio.Task[None] | None = None
        self._retry_task: asyncio.Task[None] | None = None
        self._snap_lock = asyncio.Lock()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._rotate_at: tuple[Log, int] | None = None
        self._broken = False
        self._next_try = 0.0
        self._compact_after = 0.0
        self._closed = False
        #: Why persistence fails (None while healthy).
        self.problem: str | None = None
        self.failures = 0
        self.fsyncs = 0
        self.records = 0
        self.compactions = 0
        #: Bytes of a torn last append cut off at load.
        self.torn_bytes = 0

    @property
    def healthy(self) -> bool:
        return not self._broken

    # ------------------------------------------------------------------ start / stop

    def load(self) -> bool:
        """Load snapshot and log into the store; False when there is no data file yet."""
        snap = _persist.load_state(self.path)
        has_log = os.path.lexists(self.log_path)
        if snap is None:
            if has_log:
                raise DataFileError(
                    f"{self.path}: the data file is missing but its log {self.log_path} exists"
                )
            return False
        rv, state = snap
        with contextlib.suppress(OSError):
            self._snapshot_bytes = self.path.stat().st_size
        if has_log:
            rv, good, torn = replay(self.log_path, rv, state)
            self._existing_log_size = good
            self.torn_bytes = torn
            if torn:
                log.warning("%s: cut off a torn last record (%d bytes)", self.log_path, torn)
        self.store.restore(rv, {k: list(b.values()) for k, b in state.items()})
        return True

    def start(self) -> None:
        """Open (or create) the files and make the store wait for durability."""
        try:
            if not self.path.exists():
                state = self.store.committed_state()
                self._snapshot_bytes = _persist.save(
                    self.path, self.store.committed_rv, {k: b.values() for k, b in state.items()}
                )
            if self._existing_log_size is None:
                self._log = Log.create(self.log_path)
            else:
                self._log = Log.open(self.log_path, self._existing_log_size)
        except OSError as e:
            raise DataFileError(f"{self.path}: cannot open the data file: {e}") from e
        self.store.journaled = True

    async def close(self) -> None:
        """Flush what is pending, write a final snapshot, close the log.

        Raises PersistError when persistence is failing at the end.
        """
        if self._closed:
            return
        self._closed = True
        if self.store.pending_rv() is not None or self._broken:
            self._next_try = 0.0
            self._kick()
        for task in (self._task, self._compact_task):
            if task is not None:
                with contextlib.suppress(Exception):
                    await task
        if self._retry_task is not None:
            self._retry_task.cancel()
        if not self._broken and self._log is not None and self._log.size > len(_HEADER):
            async with self._snap_lock:
                try:
                    await self._rewrite_all()
                except OSError as e:
                    log.warning("%s: final snapshot failed (the log has all): %s", self.path, e)
        if self._log is not None:
            self._log.close()
        if self._broken:
            raise PersistError(self.problem or f"{self.path}: persistence failed")

    # ------------------------------------------------------------------ waiting

    async def wait(self, rv: int) -> None:
        """Return once the write stamped ``rv`` (and all before it) is durable."""
        if self.store.committed_rv >= rv:
            return
        if self._closed:
            raise PersistError(f"{self.path}: the server is stopping")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((rv, fut))
        self._kick()
        await fut

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="apiserver-journal")

    def _resolve(self) -> None:
        done = self.store.committed_rv
        keep = []
        for rv, fut in self._waiters:
            if rv <= done:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((rv, fut))
        self._waiters = keep

    def _reject(self) -> None:
        undone = self.store.rollback()
        err = PersistError(f"{self.problem}; the write was not stored")
        waiters, self._waiters = self._waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(err)
        if undone:
            log.debug("rolled back %d writes that could not be made durable", undone)

    # ------------------------------------------------------------------ the flush task

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._rotate_at is not None and not self._broken:
                await self._rotate()
            if self._broken and not await self._recover():
                self._reject()
                return
            batch = self.store.pending()
            if not batch:
                self._resolve()
                return
            data = encode_changes(batch)
            assert self._log is not None
            try:
                await loop.run_in_executor(None, self._log.append, data)
            except OSError as e:
                self._fail(f"{self.path}: cannot append to {self._log.path}: {e}")
                self._reject()
                return
            self.fsyncs += 1
            self.records += len(batch)
            self.store.commit(len(batch))
            self._resolve()
            self._maybe_compact()

    def _fail(self, problem: str) -> None:
        self.failures += 1
        self._next_try = time.monotonic() + self.retry_interval
        if not self._broken:
            self._broken = True
            log.error("persistence failed, refusing writes until it works again: %s", problem)
            if self._retry_task is None or self._retry_task.done():
                self._retry_task = asyncio.create_task(self._retry(), name="apiserver-retry")
        else:
            log.debug("persistence still failing: %s", problem)
        self.problem = problem

    async def _retry(self) -> None:
        while self._broken and not self._closed:
            await asyncio.sleep(self.retry_interval)
            self._kick()
            if self._task is not None:
                with contextlib.suppress(Exception):
                    await self._task

    async def _recover(self) -> bool:
        """Start over with a fresh snapshot and log; False while that still fails."""
        if time.monotonic() < self._next_try:
            return False
        async with self._snap_lock:
            try:
                await self._rewrite_all()
            except OSError as e:
                self._fail(f"{self.path}: cannot write a fresh data file: {e}")
                return False
        self._broken = False
        self.problem = None
        log.warning("persistence works again: %s rewritten", self.path)
        return True

    async def _rewrite_all(self) -> None:
        """A snapshot of the durable state plus an empty log, written in a thread."""
        state, rv = self._copy()

        def write() -> tuple[int, Log]:
            size = _persist.save(self.path, rv, state)
            return size, Log.create(self.log_path)

        size, new = await asyncio.get_running_loop().run_in_executor(None, write)
        old, self._log = self._log, new
        self._snapshot_bytes = size
        self._rotate_at = None
        if old is not None:
            old.close()
        self.compactions += 1

    def _copy(self) -> tuple[dict[str, Any], int]:
        state = self.store.committed_state()
        return {k: b.values() for k, b in state.items()}, self.store.committed_rv

    # ------------------------------------------------------------------ compaction

    def _maybe_compact(self) -> None:
        log_ = self._log
        if log_ is None or self._compact_task is not None or self._closed:
            return
        if log_.size < max(self.compact_bytes, self._snapshot_bytes):
            return
        if time.monotonic() < self._compact_after:
            return
        state, rv = self._copy()  # on the loop, between appends: matches log_.size
        self._compact_task = asyncio.create_task(
            self._compact(state, rv, log_, log_.size), name="apiserver-compact"
        )

    async def _compact(self, state: dict[str, Any], rv: int, log_: Log, offset: int) -> None:
        try:
            async with self._snap_lock:
                if log_ is not self._log or self._broken:
                    return
                try:
                    size = await asyncio.get_running_loop().run_in_executor(
                        None, _persist.save, self.path, rv, state
                    )
                except OSError as e:
                    self.failures += 1
                    self._compact_after = time.monotonic() + self.retry_interval
                    log.warning("%s: compaction failed (the log still holds all): %s", self.path, e)
                    return
                self._snapshot_bytes = size
                self.compactions += 1
                self._rotate_at = (log_, offset)
                self._kick()
        finally:
            self._compact_task = None

    async def _rotate(self) -> None:
        assert self._rotate_at is not None
        old, offset = self._rotate_at
        self._rotate_at = None
        if old is not self._log:
            return
        try:
            self._log = await asyncio.get_running_loop().run_in_executor(None, old.rotate, offset)
        except OSError as e:
            # The log may have been replaced while the old descriptor stays open: start over.
            self._fail(f"{self.path}: cannot rewrite the log {old.path}: {e}")

    # ------------------------------------------------------------------ metrics

    def metrics(self) -> dict[str, tuple[str, str, float]]:
        """``name: (type, help, value)`` for the server's ``/metrics``."""
        size = self._log.size if self._log is not None else 0
        return {
            "drahealth_apiserver_persist_healthy": (
                "gauge", "1 while writes are made durable, 0 while persistence fails",
                float(self.healthy),
            ),
            "drahealth_apiserver_persist_failures_total": (
                "counter", "failed log appends, snapshots and recovery attempts",
                float(self.failures),
            ),
            "drahealth_apiserver_persist_fsyncs_total": (
                "counter", "log appends (one fsync each, shared by concurrent writes)",
                float(self.fsyncs),
            ),
            "drahealth_apiserver_persist_records_total": (
                "counter", "writes appended to the log", float(self.records),
            ),
            "drahealth_apiserver_persist_compactions_total": (
                "counter", "snapshots written", float(self.compactions),
            ),
            "drahealth_apiserver_persist_log_bytes": (
                "gauge", "current size of the log", float(size),
            ),
        }  # fmt: skip
