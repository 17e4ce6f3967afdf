"""Crash-safe files shared by the driver and the node agent.

Owns three things and nothing else: :func:`atomic_write` (temp file, fsync, rename,
directory fsync: after a crash at any instant the file holds the old or the new
content; short writes are continued and a write that makes no progress is an error,
so a full disk never replaces a good file with a cut-off one) with its primitives
:func:`write_all` and :func:`fsync_dir`, :func:`quarantine` (move a corrupt file
aside so nothing is lost and the next start begins clean), a small versioned,
checksummed JSON envelope (:func:`dump_envelope`, or
:func:`envelope_from_canonical` on one line / :func:`load_envelope`) for state files
that are rewritten whole, and the checksummed line of append-only logs
(:func:`checksummed_line` / :func:`read_checksummed_line`).

Line format (one record per line)::

    <crc32 of the JSON bytes, 8 lowercase hex digits> <compact JSON object>

Envelope format::

    {"version": N, "checksum": "sha256:<hex over the canonical JSON of body>", "<key>": body}

Canonical JSON = ``json.dumps(body, sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` as UTF-8.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import os
import zlib
from collections.abc import Iterable
from typing import Any

__all__ = [
    "LineChecksumError",
    "atomic_write",
    "canonical_json",
    "checksum",
    "checksummed_line",
    "dump_envelope",
    "envelope_from_canonical",
    "fsync_dir",
    "load_envelope",
    "quarantine",
    "read_checksummed_line",
    "write_all",
]


# I/O primitives, looked up at call time so tests can inject ENOSPC, EIO or short writes.
def _write(fd: int, data: bytes | memoryview) -> int:
    return os.write(fd, data)


def _fsync(fd: int) -> None:
    os.fsync(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte (continuing after short writes); OSError when no progress."""
    view = memoryview(data)
    while view:
        n = _write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, f"short write: {len(view)} bytes could not be written")
        view = view[n:]


def fsync_dir(directory: str) -> None:
    """fsync a directory, so a rename or a new file in it survives a crash."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _fsync(dfd)
    finally:
        os.close(dfd)


def atomic_write(path: str, data: bytes | Iterable[bytes], mode: int = 0o600) -> int:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new file.

    ``data`` is the content or an iterable of chunks (streamed, for large files).
    Writes ``.<name>.tmp`` next to it, fsyncs, renames over ``path`` and fsyncs the
    directory; returns the byte count. On any error the temp file is removed and
    ``path`` is untouched. Concurrent writers of the same path must be serialized by
    the caller.
    """
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.tmp")
    chunks = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    size = 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        try:
            for chunk in chunks:
                write_all(fd, chunk)
                size += len(chunk)
            os.fchmod(fd, mode)
            _fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)
    return size


def quarantine(path: str) -> str | None:
    """Move ``path`` to ``<path>.corrupt-<UTC timestamp>``; the new path, or None."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = f"{path}.corrupt-{stamp}"
    try:
        os.replace(path, aside)
    except OSError:
        return None
    return aside


def canonical_json(body: Any) -> bytes:
    """The canonical JSON of ``body`` (see the module docstring) as UTF-8."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def checksum(body: Any) -> str:
    """``sha256:<hex>`` over the canonical JSON of ``body``."""
    return "sha256:" + hashlib.sha256(canonical_json(body)).hexdigest()


def dump_envelope(version: int, key: str, body: Any) -> bytes:
    """The envelope bytes for ``body`` (indented JSON, trailing newline)."""
    doc = {"version": version, "checksum": checksum(body), key: body}
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False).encode() + b"\n"


def envelope_from_canonical(version: int, key: str, canonical: bytes) -> bytes:
    """The envelope bytes, on one line, around a body given as its canonical JSON (the
    bytes the checksum covers), for writers that build those bytes from cached parts:
    no JSON encoding of the body here (indented JSON uses Python's pure-Python encoder,
    about five times slower). :func:`load_envelope` reads both forms."""
    head = {"checksum": "sha256:" + hashlib.sha256(canonical).hexdigest(), "version": version}
    fields = {name: json.dumps(value).encode() for name, value in head.items()}
    fields[key] = canonical
    items = b",".join(json.dumps(name).encode() + b":" + fields[name] for name in sorted(fields))
    return b"{" + items + b"}\n"


def load_envelope(raw: bytes, version: int, key: str) -> Any:
    """Parse and verify an envelope; the body. ValueError says what is wrong."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ValueError("top level is not an object")
    found = doc.get("version")
    if found != version:
        raise ValueError(f"unknown version {found!r} (this build reads version {version})")
    if key not in doc:
        raise ValueError(f"{key} is missing")
    body = doc[key]
    expected = checksum(body)
    if doc.get("checksum") != expected:
        raise ValueError(
            f"checksum mismatch (file says {doc.get('checksum')!r}, content is {expected})"
        )
    return body


class LineChecksumError(ValueError):
    """A log line whose frame or checksum does not verify (a torn append when it is the
    last line of a log)."""


def checksummed_line(body: bytes) -> bytes:
    """``<crc32> <body>\\n`` for the compact JSON bytes ``body`` of one record."""
    return b"%08x %s\n" % (zlib.crc32(body), body)


def read_checksummed_line(line: bytes) -> dict[str, Any]:
    """The JSON object of one checksummed line (without its newline).

    :class:`LineChecksumError` when the frame or the checksum does not verify;
    ``ValueError`` when the verified body is not a JSON object.
    """
    if len(line) < 10 or line[8:9] != b" ":
        raise LineChecksumError("not a '<crc32> <json>' record line")
    crc_text, body = line[:8], line[9:]
    if crc_text.strip(b"0123456789abcdef"):
        raise LineChecksumError(f"checksum {crc_text!r} is not 8 lowercase hex digits")
    stored, computed = int(crc_text, 16), zlib.crc32(body)
    if stored != computed:
        raise LineChecksumError(f"checksum mismatch (stored {stored:08x}, computed {computed:08x})")
    try:
        record = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"record is not valid JSON ({exc})") from None
    if not isinstance(record, dict):
        raise ValueError(f"record is a JSON {type(record).__name__}, not an object")
    return record
