"""The optional data file: an atomic, checksummed JSON snapshot of the whole store.

Owns the on-disk format ``{"version": 1, "checksum": "sha256:…", "resourceVersion": N,
"objects": {storage key: [objects]}}`` and its durable write (temporary file, fsync,
rename, directory fsync). A file that cannot be read or verified raises
``DataFileError`` naming the file; nothing is silently dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

JSON = dict[str, Any]
FORMAT_VERSION = 1


class DataFileError(RuntimeError):
    """The data file exists but is unreadable, corrupt or of an unknown version."""


def _checksum(rv: int, objects: JSON) -> str:
    body = json.dumps(
        {"resourceVersion": rv, "objects": objects}, sort_keys=True, separators=(",", ":")
    ).encode()
    return "sha256:" + hashlib.sha256(body).hexdigest()


def save(path: Path, rv: int, objects: JSON) -> None:
    """Write the snapshot durably: tmp + fsync + rename + directory fsync."""
    path = Path(path)
    doc = {
        "version": FORMAT_VERSION,
        "checksum": _checksum(rv, objects),
        "resourceVersion": rv,
        "objects": objects,
    }
    data = json.dumps(doc, separators=(",", ":")).encode()
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load(path: Path) -> tuple[int, JSON] | None:
    """``(resourceVersion, objects)`` from the file, or None when it does not exist."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise DataFileError(f"{path}: cannot read data file: {e}") from e
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise DataFileError(f"{path}: corrupt data file (not JSON: {e})") from e
    if not isinstance(doc, dict):
        raise DataFileError(f"{path}: corrupt data file (not a JSON object)")
    if doc.get("version") != FORMAT_VERSION:
        raise DataFileError(f"{path}: unsupported data file version {doc.get('version')!r}")
    rv, objects = doc.get("resourceVersion"), doc.get("objects")
    if not isinstance(rv, int) or not isinstance(objects, dict):
        raise DataFileError(f"{path}: corrupt data file (missing resourceVersion or objects)")
    if doc.get("checksum") != _checksum(rv, objects):
        raise DataFileError(f"{path}: corrupt data file (checksum mismatch)")
    for key, items in objects.items():
        if not isinstance(items, list) or not all(isinstance(o, dict) for o in items):
            raise DataFileError(f"{path}: corrupt data file (bad object list for {key!r})")
    return rv, objects
