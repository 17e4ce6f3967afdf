"""The data file: a checksummed snapshot of the whole store, written off the event loop.

Owns the snapshot format, its durable streaming write and its loading (with a shape
check of every object), plus the small line codec and write helpers the journal's log
(``_wal``) shares. Version 2 (written now), UTF-8, one line each::

    <crc32> {"format": "drahealth-apiserver-data", "version": 2, "resourceVersion": N,
             "objects": COUNT}
    <crc32> {"key": "<storage key>", "object": {...}}        # COUNT lines

``<crc32>`` is 8 lowercase hex digits over the JSON bytes of the line. Objects are
encoded one at a time, so a writer thread gives the event loop the interpreter lock
between objects. Version 1 (one JSON document ``{"version": 1, "checksum":
"sha256:…", "resourceVersion": N, "objects": {key: [objects]}}``) is still read.

Writes go to ``.<name>.tmp``, are fsynced, renamed over the file and the directory is
fsynced: a failed or interrupted save never replaces the last good file. A short
write is continued; a write that makes no progress is an error. A file that cannot be
read, verified or that holds a wrongly shaped object raises ``DataFileError`` naming
the file; nothing is dropped silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import IO, Any

import msgspec

from drahealth._durable import atomic_write, checksummed_line, read_checksummed_line
from drahealth._files import file_kind, open_nonblocking

JSON = dict[str, Any]
State = dict[str, dict[tuple[str, str], JSON]]
FORMAT = "drahealth-apiserver-data"
FORMAT_VERSION = 2
_BUFFER = 1 << 20


class DataFileError(RuntimeError):
    """The data file exists but is unreadable, corrupt or of an unknown version."""


# --------------------------------------------------------------------------- line codec


def encode_line(record: JSON) -> bytes:
    """One checksummed log line (the format of :mod:`drahealth._durable`)."""
    return checksummed_line(msgspec.json.encode(record))


def decode_line(line: bytes) -> JSON:
    """The JSON object of one line (without its newline); ``LineChecksumError`` when it
    does not verify (torn), ``ValueError`` when it is not a JSON object or is nested
    deeper than the decoder can follow."""
    try:
        return read_checksummed_line(line)
    except RecursionError:
        raise ValueError("record is nested too deeply to decode") from None


# --------------------------------------------------------------------------- writing


def _snapshot_chunks(rv: int, objects: Mapping[str, Collection[JSON]]) -> Any:
    count = sum(len(objs) for objs in objects.values())
    header = {"format": FORMAT, "version": FORMAT_VERSION, "resourceVersion": rv}
    buf = bytearray(encode_line({**header, "objects": count}))
    for key in sorted(objects):
        for obj in objects[key]:
            buf += encode_line({"key": key, "object": obj})
            if len(buf) >= _BUFFER:
                yield bytes(buf)
                buf.clear()
    yield bytes(buf)


def save(path: Path, rv: int, objects: Mapping[str, Collection[JSON]]) -> int:
    """Write a version-2 snapshot durably; the bytes written.

    ``objects`` maps storage keys to objects that must not change while this runs
    (stored objects never do), so it may run in a worker thread.
    """
    return atomic_write(str(path), _snapshot_chunks(rv, objects))


# --------------------------------------------------------------------------- reading


def open_regular(path: Path, what: str) -> tuple[IO[bytes], int] | None:
    """``path`` opened for reading and its size, or None when nothing is there.

    Only a regular file (a symlink to one included) is opened: a directory, FIFO or
    device (``/dev/zero``) in its place raises DataFileError at once, without blocking
    or reading; so does a symlink whose target is missing (the data may be on a volume
    that is not mounted: starting empty would lose it).
    """
    try:
        fd, info = open_nonblocking(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise DataFileError(
                f"{path}: {what} is a symlink to a missing file ({os.readlink(path)})"
            ) from None
        return None
    except OSError as e:
        raise DataFileError(f"{path}: cannot read {what}: {e}") from e
    try:
        if not stat.S_ISREG(info.st_mode):
            raise DataFileError(f"{path}: {what} is {file_kind(info.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), info.st_size
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path, what: str) -> bytes | None:
    """The bytes of the regular file ``path`` (at most its size at open), or None."""
    opened = open_regular(path, what)
    if opened is None:
        return None
    f, size = opened
    try:
        with f:
            return f.read(size)
    except OSError as e:
        raise DataFileError(f"{path}: cannot read {what}: {e}") from e


def object_problem(obj: Any, max_rv: int) -> str | None:
    """What is wrong with the shape of a stored object, or None."""
    if not isinstance(obj, dict):
        return f"an object is a JSON {type(obj).__name__}, not an object"
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return f"metadata is a {type(meta).__name__}, not an object"
    name, ns = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        return f"metadata.name must be a non-empty string, got {name!r}"
    if ns is not None and not isinstance(ns, str):
        return f"{name}: metadata.namespace must be a string, got {ns!r}"
    rv = meta.get("resourceVersion")
    if not isinstance(rv, str) or not rv.isascii() or not rv.isdigit():
        return f"{name}: metadata.resourceVersion must be a decimal string, got {rv!r}"
    if not 0 < int(rv) <= max_rv:
        return f"{name}: metadata.resourceVersion {rv} is outside 1..{max_rv}"
    return None


def ident(obj: JSON) -> tuple[str, str]:
    meta = obj["metadata"]
    return str(meta.get("namespace") or ""), str(meta["name"])


def check_rv(value: Any) -> int | None:
    """``value`` as a resourceVersion counter (a non-negative int, not a bool), or None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _add(path: Path, where: str, out: State, key: Any, obj: Any, rv: int) -> None:
    if not isinstance(key, str) or not key:
        raise DataFileError(f"{path}: corrupt data file ({where}: bad storage key {key!r})")
    problem = object_problem(obj, rv)
    if problem is not None:
        raise DataFileError(f"{path}: corrupt data file ({where}, {key}: {problem})")
    bucket = out.setdefault(key, {})
    ident_ = ident(obj)
    if ident_ in bucket:
        raise DataFileError(f"{path}: corrupt data file ({where}: {key} {ident_} twice)")
    bucket[ident_] = obj


def _load_v1(path: Path, raw: bytes) -> tuple[int, State]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise DataFileError(f"{path}: corrupt data file (not JSON: {e})") from e
    except RecursionError:
        raise DataFileError(f"{path}: corrupt data file (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise DataFileError(f"{path}: corrupt data file (not a JSON object)")
    if doc.get("version") != 1:
        raise DataFileError(f"{path}: unsupported data file version {doc.get('version')!r}")
    rv, objects = check_rv(doc.get("resourceVersion")), doc.get("objects")
    if rv is None or not isinstance(objects, dict):
        raise DataFileError(f"{path}: corrupt data file (missing resourceVersion or objects)")
    body = json.dumps(
        {"resourceVersion": rv, "objects": objects}, sort_keys=True, separators=(",", ":")
    ).encode()
    if doc.get("checksum") != "sha256:" + hashlib.sha256(body).hexdigest():
        raise DataFileError(f"{path}: corrupt data file (checksum mismatch)")
    out: State = {}
    for key, items in objects.items():
        if not isinstance(items, list):
            raise DataFileError(f"{path}: corrupt data file (bad object list for {key!r})")
        out.setdefault(key, {})
        for obj in items:
            _add(path, "version 1", out, key, obj, rv)
    return rv, out


def _load_v2(path: Path, raw: bytes) -> tuple[int, State]:
    lines = raw.split(b"\n")
    if lines[-1]:
        raise DataFileError(
            f"{path}: corrupt data file (truncated at offset {len(raw) - len(lines[-1])}:"
            " no final line end)"
        )
    lines.pop()
    try:
        header = decode_line(lines[0])
    except ValueError as e:
        raise DataFileError(f"{path}: corrupt data file (line 1: {e})") from None
    if header.get("format") != FORMAT:
        raise DataFileError(f"{path}: corrupt data file (line 1 is not a {FORMAT} header)")
    if header.get("version") != FORMAT_VERSION:
        raise DataFileError(f"{path}: unsupported data file version {header.get('version')!r}")
    rv, count = check_rv(header.get("resourceVersion")), check_rv(header.get("objects"))
    if rv is None or count is None:
        raise DataFileError(f"{path}: corrupt data file (line 1: bad resourceVersion or count)")
    if len(lines) - 1 != count:
        raise DataFileError(
            f"{path}: corrupt data file (header says {count} objects, found {len(lines) - 1})"
        )
    out: State = {}
    offset = len(lines[0]) + 1
    for number, line in enumerate(lines[1:], start=2):
        where = f"line {number} at offset {offset}"
        try:
            rec = decode_line(line)
        except ValueError as e:
            raise DataFileError(f"{path}: corrupt data file ({where}: {e})") from None
        _add(path, where, out, rec.get("key"), rec.get("object"), rv)
        offset += len(line) + 1
    return rv, out


def load_state(path: Path) -> tuple[int, State] | None:
    """``(resourceVersion, {key: {(namespace, name): object}})``, or None if absent."""
    path = Path(path)
    raw = read_regular(path, "the data file")
    if raw is None:
        return None
    if raw.lstrip()[:1] in (b"{", b"[") or not raw.strip():
        return _load_v1(path, raw)
    return _load_v2(path, raw)


def load(path: Path) -> tuple[int, JSON] | None:
    """``(resourceVersion, {key: [objects]})`` from the file, or None when it does not exist."""
    loaded = load_state(path)
    if loaded is None:
        return None
    rv, state = loaded
    return rv, {k: list(bucket.values()) for k, bucket in state.items()}
