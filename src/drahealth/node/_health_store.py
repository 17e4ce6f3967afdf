"""Durable storage of the node agent's health cache: a checksummed append-only log.

Owns :class:`HealthStore` (open/replay, append, forget, drop, compaction) and the log
format.
It knows nothing of leases or clocks: it stores what the cache hands it and gives it
back at start, where ``HealthCache.restore`` re-bases time.

Format (UTF-8, one record per line)::

    {"format": "drahealth-health-log", "version": 2}
    <crc32 of the JSON bytes, 8 lowercase hex digits> <compact JSON record>
    ...

Records are ``{"op":"set","driver":..,"pool":..,"device":..,"health":..,"message":..,
"timeout":<s>,"seen":<unix s>,"changed":<unix s>}``, ``{"op":"forget","driver":..,
"pool":..,"device":..}`` (version 2) and ``{"op":"drop","driver":..}``; replayed in
order, the last record of a device wins, a forget removes one device and a drop every
device of its driver. Version 1 logs (no forget records) are read and rewritten as
version 2 at open.

Improvements over the kubelet's ``dra_health_state`` (reference section 9, items 1-3):
a change costs one appended record, not a rewrite of every device; every
:meth:`HealthStore.append` is fsynced before it returns, so an acknowledged change
survives SIGKILL or power loss; every line is checksummed and the file is versioned.
A torn last line (an interrupted, unacknowledged append) is cut off silently; any
other damage moves the file aside to ``<path>.corrupt-<unix seconds>`` (nothing is
lost), starts an empty log and reports what was wrong instead of silently starting
empty. The log is compacted (rewritten with one record per live device, atomically)
when it grows past ``compact_factor * live + min_compact_records`` records.

Not thread-safe: one owner (the agent's loop) calls it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from drahealth._durable import (
    LineChecksumError,
    atomic_write,
    checksummed_line,
    read_checksummed_line,
)
from drahealth.core import DeviceEntry, DeviceKey, Health

__all__ = ["FORMAT", "VERSION", "HealthStore", "HealthStoreError"]

FORMAT = "drahealth-health-log"
VERSION = 2
_READABLE_VERSIONS = (1, 2)

_HEADER = json.dumps({"format": FORMAT, "version": VERSION}).encode() + b"\n"
_SET_FIELDS = frozenset(
    {"op", "driver", "pool", "device", "health", "message", "timeout", "seen", "changed"}
)
_DROP_FIELDS = frozenset({"op", "driver"})
_FORGET_FIELDS = frozenset({"op", "driver", "pool", "device"})
_HEALTH_VALUES = {h.value: h for h in Health}


class HealthStoreError(OSError):
    """An I/O failure of the store (unwritable directory, failed write or fsync).

    The message names the file and what failed. A corrupt file is never an error:
    it is quarantined and reported by :meth:`HealthStore.open`.
    """


class _Corrupt(Exception):
    """A line that cannot be read (internal: turned into a problem text)."""


class _BadChecksum(_Corrupt):
    """A record line whose checksum does not verify (torn when it is the last line)."""


class HealthStore:
    """An open health log; build one with :meth:`open`."""

    def __init__(
        self, path: str, fd: int, size: int, records: int, compact_factor: float, min_records: int
    ) -> None:
        self.path = path
        self._fd: int | None = fd
        self._size = size
        self._records = records
        self.compact_factor = compact_factor
        self.min_compact_records = min_records
        #: Records written by this object (appends, drops and compactions).
        self.records_written = 0
        #: Bytes written by this object (appends, drops and compactions).
        self.bytes_written = 0
        #: Completed compactions.
        self.compactions = 0
        #: Bytes of a torn last append cut off at open (0 when the log ended cleanly).
        self.torn_bytes = 0

    # -- opening -------------------------------------------------------------------

    @classmethod
    def open(
        cls, path: str, *, compact_factor: float = 4.0, min_compact_records: int = 1000
    ) -> tuple[HealthStore, list[DeviceEntry], str | None]:
        """Open (or create) the log at ``path`` and replay it.

        Returns the store, the live entries sorted by key (``last_seen`` is 0.0: the
        cache re-bases time) and a problem text, or None. A missing file starts an
        empty log; a torn last line is cut off; any other damage quarantines the file
        (problem text names the file, the line and what was wrong). Raises
        :class:`HealthStoreError` only for I/O failures.
        """
        if not (isinstance(compact_factor, int | float) and math.isfinite(compact_factor)):
            raise ValueError(f"compact_factor must be a finite number, got {compact_factor!r}")
        if compact_factor <= 0:
            raise ValueError(f"compact_factor must be > 0, got {compact_factor!r}")
        if min_compact_records < 0:
            raise ValueError(f"min_compact_records must be >= 0, got {min_compact_records!r}")
        path = os.path.abspath(path)
        problem: str | None = None
        torn = 0
        try:
            with open(path, "rb") as f:
                raw: bytes | None = f.read()
        except FileNotFoundError:
            raw = None
        except OSError as exc:
            raise HealthStoreError(f"health store {path}: cannot read: {exc}") from exc

        live: dict[DeviceKey, DeviceEntry] = {}
        records = 0
        version = VERSION
        if raw is not None:
            try:
                live, records, good, version = _replay(raw)
            except _Corrupt as exc:
                aside = _quarantine(path)
                problem = (
                    f"health store {path}: {exc}; moved it to {aside} and started an empty log"
                )
                raw, live, records = None, {}, 0
            else:
                torn = len(raw) - good
                if torn:
                    _truncate(path, good)
        if raw is None:
            try:
                atomic_write(path, _HEADER)
            except OSError as exc:
                raise HealthStoreError(f"health store {path}: cannot create: {exc}") from exc
            size = len(_HEADER)
        else:
            size = len(raw) - torn
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError as exc:
            raise HealthStoreError(f"health store {path}: cannot open for append: {exc}") from exc
        store = cls(path, fd, size, records, float(compact_factor), min_compact_records)
        store.torn_bytes = torn
        entries = [live[k] for k in sorted(live)]
        if version != VERSION:
            store.compact(entries)  # rewrite an older log in the current version
        return store, entries, problem

    # -- writing -------------------------------------------------------------------

    def append(self, entries: Sequence[DeviceEntry], forget: Sequence[DeviceKey] = ()) -> None:
        """Persist the current state of ``entries`` (one record each) and that the
        devices of ``forget`` are gone (one record each, after the entries).

        All records go out in one write, then fsync: once this returns the change
        survives a crash. Nothing is written when both are empty. A malformed entry
        raises ValueError before anything is written.
        """
        if not entries and not forget:
            return
        data = b"".join(_set_line(e) for e in entries) + b"".join(
            _line({"op": "forget", "driver": k.driver, "pool": k.pool, "device": k.device})
            for k in forget
        )
        self._write(data, len(entries) + len(forget))

    def drop_driver(self, driver: str) -> None:
        """Persist that every device of ``driver`` is forgotten."""
        if not isinstance(driver, str) or not driver:
            raise ValueError(f"driver name must be a non-empty string, got {driver!r}")
        self._write(_line({"op": "drop", "driver": driver}), 1)

    def needs_compaction(self, live_count: int) -> bool:
        """Whether the log holds more than ``compact_factor * live_count +
        min_compact_records`` records."""
        return self._records > self.compact_factor * live_count + self.min_compact_records

    def compact(self, live: Sequence[DeviceEntry]) -> None:
        """Rewrite the log as one record per entry of ``live``, atomically.

        Temp file in the same directory, fsync, rename over the log, fsync the
        directory, reopen for appending. A crash at any instant leaves the old or
        the new log, both describing the same state.
        """
        fd = self._require_open()
        final = {e.key: e for e in live}
        data = _HEADER + b"".join(_set_line(final[k]) for k in sorted(final))
        try:
            atomic_write(self.path, data)
            new_fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError as exc:
            raise HealthStoreError(f"health store {self.path}: compaction failed: {exc}") from exc
        self._fd = new_fd
        with contextlib.suppress(OSError):
            os.close(fd)
        self._size = len(data)
        self._records = len(final)
        self.records_written += len(final)
        self.bytes_written += len(data)
        self.compactions += 1

    @property
    def record_count(self) -> int:
        """Records currently in the log (what :meth:`needs_compaction` compares)."""
        return self._records

    def close(self) -> None:
        """Close the log (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> HealthStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------

    def _require_open(self) -> int:
        if self._fd is None:
            raise HealthStoreError(f"health store {self.path}: already closed")
        return self._fd

    def _write(self, data: bytes, records: int) -> None:
        fd = self._require_open()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError as exc:
            # Cut a partial write off so the next append does not follow garbage.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._size)
            raise HealthStoreError(f"health store {self.path}: append failed: {exc}") from exc
        self._size += len(data)
        self._records += records
        self.records_written += records
        self.bytes_written += len(data)


def _line(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    return checksummed_line(body)


def _set_line(entry: DeviceEntry) -> bytes:
    record: dict[str, Any] = {
        "op": "set",
        "driver": entry.driver,
        "pool": entry.pool,
        "device": entry.device,
        "health": entry.health.value if isinstance(entry.health, Health) else entry.health,
        "message": entry.message,
        "timeout": entry.timeout,
        "seen": entry.last_seen_wall,
        "changed": entry.changed_wall,
    }
    try:
        _check_set(record)
    except _Corrupt as exc:
        raise ValueError(f"cannot store {entry!r}: {exc}") from None
    record["timeout"] = float(record["timeout"])
    record["seen"] = float(record["seen"])
    record["changed"] = float(record["changed"])
    return _line(record)


def _name(record: dict[str, Any], field: str) -> str:
    value = record.get(field)
    if not isinstance(value, str) or not value:
        raise _Corrupt(f"field {field!r} must be a non-empty string, got {value!r}")
    return value


def _number(record: dict[str, Any], field: str, *, positive: bool = False) -> float:
    value = record.get(field)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or (positive and value <= 0)
    ):
        kind = "a positive number" if positive else "a finite number"
        raise _Corrupt(f"field {field!r} must be {kind}, got {value!r}")
    return float(value)


def _check_set(record: dict[str, Any]) -> DeviceEntry:
    extra = sorted(set(record) - _SET_FIELDS)
    missing = sorted(_SET_FIELDS - set(record))
    if extra or missing:
        raise _Corrupt(f"set record has unknown fields {extra} / missing fields {missing}")
    health = _HEALTH_VALUES.get(record["health"]) if isinstance(record["health"], str) else None
    if health is None:
        raise _Corrupt(
            f"field 'health' must be one of {sorted(_HEALTH_VALUES)}, got {record['health']!r}"
        )
    message = record["message"]
    if not isinstance(message, str):
        raise _Corrupt(f"field 'message' must be a string, got {message!r}")
    return DeviceEntry(
        driver=_name(record, "driver"),
        pool=_name(record, "pool"),
        device=_name(record, "device"),
        health=health,
        message=message,
        timeout=_number(record, "timeout", positive=True),
        last_seen=0.0,
        last_seen_wall=_number(record, "seen"),
        changed_wall=_number(record, "changed"),
    )


def _parse_line(line: bytes) -> dict[str, Any]:
    """Check the checksum of one record line (without its newline); its JSON object."""
    try:
        return read_checksummed_line(line)
    except LineChecksumError as exc:
        raise _BadChecksum(str(exc)) from None
    except ValueError as exc:
        raise _Corrupt(str(exc)) from None


def _check_header(line: bytes) -> int:
    try:
        header = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Corrupt(f"line 1: header is not valid JSON ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _Corrupt(f"line 1: not a {FORMAT} header: {line[:80]!r}")
    version = header.get("version")
    if version not in _READABLE_VERSIONS or isinstance(version, bool):
        raise _Corrupt(
            f"line 1: unknown version {version!r} (this build reads versions "
            f"{', '.join(map(str, _READABLE_VERSIONS))})"
        )
    return int(version)


def _replay(raw: bytes) -> tuple[dict[DeviceKey, DeviceEntry], int, int, int]:
    """Live entries, record count, the length of the good prefix of ``raw`` and the
    log's version.

    Raises :class:`_Corrupt` with the line number for damage other than a torn tail.
    """
    if not raw:
        raise _Corrupt("the file is empty (no header)")
    end = raw.find(b"\n")
    if end < 0:
        raise _Corrupt("line 1: header has no line end")
    version = _check_header(raw[:end])
    good = end + 1
    # Complete lines after the header; bytes after the last newline are a torn append.
    lines = raw[good:].split(b"\n")
    lines.pop()  # the unterminated remainder ("" when the file ends with a newline)
    live: dict[DeviceKey, DeviceEntry] = {}
    records = 0
    for index, line in enumerate(lines):
        number = index + 2
        try:
            record = _parse_line(line)
        except _Corrupt as exc:
            if isinstance(exc, _BadChecksum) and index == len(lines) - 1:
                break  # the last line of an interrupted append: cut it off
            raise _Corrupt(f"line {number}: {exc}") from None
        try:
            op = record.get("op")
            if op == "set":
                entry = _check_set(record)
                live[entry.key] = entry
            elif op == "drop":
                extra = sorted(set(record) - _DROP_FIELDS)
                if extra:
                    raise _Corrupt(f"drop record has unknown fields {extra}")
                driver = _name(record, "driver")
                for key in [k for k in live if k.driver == driver]:
                    del live[key]
            elif op == "forget" and version >= 2:
                extra = sorted(set(record) - _FORGET_FIELDS)
                if extra:
                    raise _Corrupt(f"forget record has unknown fields {extra}")
                key = DeviceKey(
                    _name(record, "driver"), _name(record, "pool"), _name(record, "device")
                )
                live.pop(key, None)
            else:
                raise _Corrupt(f"unknown op {op!r} (expected 'set', 'forget' or 'drop')")
        except _Corrupt as exc:
            raise _Corrupt(f"line {number}: {exc}") from None
        records += 1
        good += len(line) + 1
    return live, records, good, version


def _truncate(path: str, size: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise HealthStoreError(f"health store {path}: cannot cut off torn tail: {exc}") from exc


def _quarantine(path: str) -> str:
    """Move ``path`` to ``<path>.corrupt-<unix seconds>`` (a free name); the new path."""
    base = f"{path}.corrupt-{int(time.time())}"
    aside, n = base, 0
    while os.path.lexists(aside):
        n += 1
        aside = f"{base}.{n}"
    try:
        os.rename(path, aside)
        _fsync_dir(os.path.dirname(path))
    except OSError as exc:
        raise HealthStoreError(
            f"health store {path}: cannot move corrupt file aside: {exc}"
        ) from exc
    return aside


def _fsync_dir(directory: str) -> None:
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
