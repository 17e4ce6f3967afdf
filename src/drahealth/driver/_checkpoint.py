"""Durable record of the claims this driver prepared on this node.

Owns the checkpoint file format and its crash-safe write; knows nothing of gRPC,
the API server or locking (callers serialize writers: the plugin holds its state
lock, plus an ``flock`` when rolling-update instances share the file).

File format (JSON, UTF-8; written as one line, any JSON layout is read)::

    {"version": 1,
     "checksum": "sha256:<hex of sha256 over the canonical JSON of 'claims'>",
     "claims": {"<claim uid>": {"namespace": "...", "name": "...",
                                "state": "PrepareStarted" | "PrepareCompleted",
                                "devices": [{"pool", "device", "requests",
                                             "cdi_device_ids", "share_id",
                                             "admin_access"}, ...]}}}

Canonical JSON = ``json.dumps(claims, sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` encoded as UTF-8. A write goes to ``.<name>.tmp`` in the same
directory, is fsynced, renamed over the file with ``os.replace`` and the directory
is fsynced, so after a crash at any instant the file holds either the old or the new
content, never a mix.

Loading a missing file gives an empty checkpoint. A corrupt file (not JSON, wrong
shape, bad checksum, unknown version) is moved aside to
``<name>.corrupt-<UTC timestamp>`` and :class:`CheckpointError` is raised naming
both paths; the caller decides what to do (the plugin refuses to start, and the next
start begins empty because the bad file is out of the way).
"""

from __future__ import annotations

import enum
import json.encoder
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from drahealth._durable import (
    atomic_write,
    envelope_from_canonical,
    load_envelope,
    quarantine,
)
from drahealth.driver._types import CheckpointError

__all__ = [
    "CHECKPOINT_VERSION",
    "Checkpoint",
    "CheckpointDevice",
    "ClaimEntry",
    "ClaimState",
    "atomic_write",
    "canonical_fragment",
]

#: A JSON string literal as ``json.dumps(..., ensure_ascii=False)`` writes it.
_quote: Callable[[str], str] = json.encoder.encode_basestring

#: The only format version this build reads and writes.
CHECKPOINT_VERSION = 1


class ClaimState(enum.StrEnum):
    """Where preparing one claim got to."""

    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True, slots=True)
class CheckpointDevice:
    """One device of a prepared claim as recorded (``requests`` unstripped)."""

    pool: str
    device: str
    requests: tuple[str, ...] = ()
    cdi_device_ids: tuple[str, ...] = ()
    share_id: str | None = None
    admin_access: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "device": self.device,
            "requests": list(self.requests),
            "cdi_device_ids": list(self.cdi_device_ids),
            "share_id": self.share_id,
            "admin_access": self.admin_access,
        }

    @classmethod
    def from_json(cls, data: Any) -> CheckpointDevice:
        if not isinstance(data, dict):
            raise ValueError("device entry is not an object")
        share_id = data.get("share_id")
        admin = data.get("admin_access", False)
        if share_id is not None and not isinstance(share_id, str):
            raise ValueError("share_id is not a string")
        if not isinstance(admin, bool):
            raise ValueError("admin_access is not a boolean")
        return cls(
            pool=_str(data, "pool"),
            device=_str(data, "device"),
            requests=_strs(data, "requests"),
            cdi_device_ids=_strs(data, "cdi_device_ids"),
            share_id=share_id,
            admin_access=admin,
        )


@dataclass(frozen=True, slots=True)
class ClaimEntry:
    """One claim in the checkpoint."""

    namespace: str
    name: str
    state: ClaimState
    devices: tuple[CheckpointDevice, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state.value,
            "devices": [d.to_json() for d in self.devices],
        }

    @classmethod
    def from_json(cls, data: Any) -> ClaimEntry:
        if not isinstance(data, dict):
            raise ValueError("claim entry is not an object")
        devices = data.get("devices", [])
        if not isinstance(devices, list):
            raise ValueError("devices is not a list")
        return cls(
            namespace=_str(data, "namespace"),
            name=_str(data, "name"),
            state=ClaimState(_str(data, "state")),
            devices=tuple(CheckpointDevice.from_json(d) for d in devices),
        )


def _str(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key} is missing or not a string")
    return value


def _strs(data: dict[str, Any], key: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key} is not a list of strings")
    return tuple(value)


def canonical_fragment(uid: str, entry: ClaimEntry) -> bytes:
    """``"<uid>":{...}``: the bytes of ``canonical_json({uid: entry.to_json()})``
    between its braces, built directly from the fixed shape (keys in sorted order,
    strings by the json module's own C string encoder) at a fraction of the cost of
    encoding the dicts; a test holds it byte-equal to :func:`canonical_json`."""
    q = _quote
    devices = ",".join(
        f'{{"admin_access":{"true" if d.admin_access else "false"},'
        f'"cdi_device_ids":[{",".join(map(q, d.cdi_device_ids))}],'
        f'"device":{q(d.device)},"pool":{q(d.pool)},'
        f'"requests":[{",".join(map(q, d.requests))}],'
        f'"share_id":{"null" if d.share_id is None else q(d.share_id)}}}'
        for d in entry.devices
    )
    return (
        f'{q(uid)}:{{"devices":[{devices}],"name":{q(entry.name)},'
        f'"namespace":{q(entry.namespace)},"state":{q(entry.state.value)}}}'
    ).encode()


class Checkpoint:
    """The prepared-claims checkpoint file at ``path`` (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = os.fspath(path)
        # claim UID -> (entry, its '"uid":{...}' canonical JSON) from the last encode
        self._fragments: dict[str, tuple[ClaimEntry, bytes]] = {}

    @property
    def path(self) -> str:
        return self._path

    def load(self) -> dict[str, ClaimEntry]:
        """Read the file: claim UID -> entry. Missing file -> ``{}``.

        Raises :class:`CheckpointError` for an unreadable or corrupt file; a corrupt
        one is first quarantined (see the module docstring).
        """
        try:
            with open(self._path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CheckpointError(
                f"cannot read checkpoint {self._path}: {exc}", path=self._path
            ) from exc
        try:
            return self._decode(raw)
        except ValueError as exc:
            aside = self._quarantine()
            where = f"; moved it to {aside}" if aside else ""
            raise CheckpointError(
                f"checkpoint {self._path} is corrupt: {exc}{where}",
                path=self._path,
                quarantined_to=aside,
            ) from exc

    def save(self, claims: Mapping[str, ClaimEntry]) -> None:
        """Atomically replace the file with ``claims``."""
        self.write(self.encode(claims))

    def encode(self, claims: Mapping[str, ClaimEntry]) -> bytes:
        """The file's bytes for ``claims``: one line, the body in canonical JSON built
        from each entry's canonical JSON, kept from the last call for entries that did
        not change (the same object), so a write costs the changed claims' encoding
        plus one join and one hash: cheap enough for the event loop."""
        cache = self._fragments
        fresh: dict[str, tuple[ClaimEntry, bytes]] = {}
        parts: list[bytes] = []
        for uid in sorted(claims):
            entry = claims[uid]
            known = cache.get(uid)
            if known is None or known[0] is not entry:
                known = (entry, canonical_fragment(uid, entry))
            fresh[uid] = known
            parts.append(known[1])
        self._fragments = fresh  # only the current claims: bounded by them
        return envelope_from_canonical(CHECKPOINT_VERSION, "claims", b"{" + b",".join(parts) + b"}")

    def write(self, data: bytes) -> None:
        """Atomically replace the file with ``data`` from :meth:`encode` (blocking:
        two fsyncs; run it in a worker thread from async code)."""
        atomic_write(self._path, data)

    def _decode(self, raw: bytes) -> dict[str, ClaimEntry]:
        claims = load_envelope(raw, CHECKPOINT_VERSION, "claims")
        if not isinstance(claims, dict):
            raise ValueError("claims is missing or not an object")
        out: dict[str, ClaimEntry] = {}
        for uid, entry in claims.items():
            try:
                out[uid] = ClaimEntry.from_json(entry)
            except ValueError as exc:
                raise ValueError(f"claim {uid}: {exc}") from exc
        return out

    def _quarantine(self) -> str | None:
        return quarantine(self._path)
