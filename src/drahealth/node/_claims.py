"""The agent's claim cache: which claims are prepared on this node, for which pods.

Owns the prepared-claim records (:class:`~drahealth.core._records.ClaimInfo` plus
the pods using each claim), the reverse index device -> claims -> pods that turns a
health change into the pods to update without scanning (upstream scans every claim
for every change), bounded tombstones, and the checkpoint file
``<state-dir>/claims.json`` (versioned, checksummed, written atomically).

Tombstones: when a claim is unprepared (its last pod ended or went away) its record
is kept, read-only, in a bounded FIFO (default 1,024 claims) together with the pods
that used it, so a health report arriving after a pod terminated still reaches that
pod's status (post-mortem health; upstream loses it). A tombstone is dropped when
the FIFO overflows, when the claim is prepared again, or when every pod that used it
was deleted from the API (:meth:`forget_pod`).

No I/O besides the checkpoint; no gRPC, no API calls (the agent does those).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from drahealth._durable import atomic_write, dump_envelope, load_envelope, quarantine
from drahealth.core import ClaimInfo, DeviceKey, PreparedDeviceInfo

__all__ = ["CLAIMS_FILE", "ClaimTracker", "TrackedClaim"]

log = logging.getLogger(__name__)

CLAIMS_FILE = "claims.json"
_VERSION = 1


@dataclass(slots=True)
class TrackedClaim:
    """One claim the agent prepared (or a tombstone of one)."""

    info: ClaimInfo
    #: Pods that still need the claim.
    live: set[str] = field(default_factory=set)
    #: Pods that used it and ended (kept for post-mortem health).
    ended: set[str] = field(default_factory=set)
    tombstone: bool = False

    @property
    def pods(self) -> set[str]:
        return self.live | self.ended

    def to_json(self) -> dict[str, Any]:
        i = self.info
        return {
            "namespace": i.namespace,
            "name": i.name,
            "uid": i.uid,
            "pods": sorted(self.live),
            "ended": sorted(self.ended),
            "tombstone": self.tombstone,
            "devices": [
                {
                    "driver": d.driver,
                    "pool": d.pool,
                    "device": d.device,
                    "requests": list(d.request_names),
                    "cdi": list(d.cdi_device_ids),
                }
                for d in i.devices
            ],
        }

    @classmethod
    def from_json(cls, data: Any) -> TrackedClaim:
        if not isinstance(data, dict):
            raise ValueError("entry is not an object")
        devices = []
        for d in _list(data, "devices"):
            if not isinstance(d, dict):
                raise ValueError("a device is not an object")
            devices.append(
                PreparedDeviceInfo(
                    _str(d, "driver"),
                    _str(d, "pool"),
                    _str(d, "device"),
                    tuple(_strs(d, "requests")),
                    tuple(_strs(d, "cdi")),
                )
            )
        info = ClaimInfo(_str(data, "namespace"), _str(data, "name"), _str(data, "uid"))
        info = ClaimInfo(info.namespace, info.name, info.uid, tuple(devices))
        tomb = data.get("tombstone", False)
        if not isinstance(tomb, bool):
            raise ValueError("tombstone is not a boolean")
        return cls(info, set(_strs(data, "pods")), set(_strs(data, "ended")), tomb)


def _str(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} is missing or not a non-empty string")
    return value


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"{key} is not a list")
    return value


def _strs(data: dict[str, Any], key: str) -> list[str]:
    values = _list(data, key)
    if not all(isinstance(v, str) for v in values):
        raise ValueError(f"{key} holds a non-string")
    return values


class ClaimTracker:
    """Prepared claims by UID, their pods, tombstones and the device index."""

    def __init__(self, state_dir: str | None, *, max_tombstones: int = 1024) -> None:
        if max_tombstones < 0:
            raise ValueError("max_tombstones must be >= 0")
        self.path = os.path.join(state_dir, CLAIMS_FILE) if state_dir else None
        self.max_tombstones = max_tombstones
        self._claims: dict[str, TrackedClaim] = {}
        self._by_name: dict[tuple[str, str], str] = {}
        self._tombstones: OrderedDict[str, None] = OrderedDict()
        self._by_device: dict[DeviceKey, set[str]] = {}

    # -- persistence -------------------------------------------------------------

    def load(self) -> str | None:
        """Read the checkpoint; a problem text when it was corrupt (quarantined)."""
        if self.path is None:
            return None
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        try:
            body = load_envelope(raw, _VERSION, "claims")
            if not isinstance(body, list):
                raise ValueError("claims is not a list")
            loaded = []
            for i, entry in enumerate(body):
                try:
                    loaded.append(TrackedClaim.from_json(entry))
                except ValueError as exc:
                    raise ValueError(f"claims[{i}]: {exc}") from exc
        except ValueError as exc:
            aside = quarantine(self.path)
            where = f"; moved it to {aside}" if aside else ""
            return f"claim checkpoint {self.path} is corrupt: {exc}{where}; starting empty"
        for tracked in loaded:
            self._insert(tracked)
            if tracked.tombstone:
                self._tombstones[tracked.info.uid] = None
        self._trim()
        return None

    def save(self) -> None:
        if self.path is None:
            return
        body = [self._claims[uid].to_json() for uid in sorted(self._claims)]
        atomic_write(self.path, dump_envelope(_VERSION, "claims", body))

    # -- reading -----------------------------------------------------------------

    def get(self, uid: str) -> TrackedClaim | None:
        return self._claims.get(uid)

    def lookup(self, namespace: str, name: str) -> ClaimInfo | None:
        """The prepared (or tombstoned) claim named ``namespace/name``; the status
        builder's claim lookup."""
        uid = self._by_name.get((namespace, name))
        return None if uid is None else self._claims[uid].info

    def claims(self, *, tombstones: bool = False) -> list[TrackedClaim]:
        return [c for c in self._claims.values() if tombstones or not c.tombstone]

    def claims_of_pod(self, pod_uid: str) -> list[TrackedClaim]:
        """Live (not tombstoned) claims that ``pod_uid`` still needs."""
        return [c for c in self._claims.values() if pod_uid in c.live and not c.tombstone]

    def pods_for(self, keys: Iterable[DeviceKey]) -> set[str]:
        """Every pod (live or post-mortem) using any of ``keys``: O(matches)."""
        out: set[str] = set()
        for key in keys:
            for uid in self._by_device.get(key, ()):
                out |= self._claims[uid].pods
        return out

    def devices(self) -> set[DeviceKey]:
        return set(self._by_device)

    # -- writing -----------------------------------------------------------------

    def add(self, info: ClaimInfo, pod_uid: str) -> None:
        """Record ``info`` as prepared for ``pod_uid`` (idempotent); persisted."""
        current = self._claims.get(info.uid)
        if current is not None and not current.tombstone and current.info == info:
            if pod_uid in current.live:
                return
            current.live.add(pod_uid)
            current.ended.discard(pod_uid)
        else:
            keep = current is not None and not current.tombstone
            live = set(current.live) if current is not None and keep else set()
            ended = set(current.ended) if current is not None else set()
            if current is not None:
                self._remove(info.uid)
            self._insert(TrackedClaim(info, live | {pod_uid}, ended - {pod_uid}))
        self.save()

    def release(self, claim_uid: str, pod_uid: str) -> bool:
        """``pod_uid`` no longer needs the claim (it ended or went away); True when no
        live pod does any more, so the caller unprepares it and then calls
        :meth:`unprepared`. The pod stays recorded for post-mortem health."""
        tracked = self._claims.get(claim_uid)
        if tracked is None or tracked.tombstone:
            return False
        if pod_uid in tracked.live:
            tracked.live.discard(pod_uid)
            tracked.ended.add(pod_uid)
            self.save()
        return not tracked.live

    def unprepared(self, claim_uid: str) -> None:
        """The claim was unprepared: keep it as a tombstone (bounded); persisted."""
        tracked = self._claims.get(claim_uid)
        if tracked is None or tracked.tombstone:
            return
        tracked.tombstone = True
        tracked.ended |= tracked.live
        tracked.live.clear()
        self._tombstones[claim_uid] = None
        self._trim()
        self.save()

    def forget_pod(self, pod_uid: str) -> None:
        """The pod is gone from the API: drop it from ended pods; a tombstone left
        without pods goes. (Call :meth:`release` first for a pod that was live.)"""
        changed = False
        for uid in list(self._claims):
            tracked = self._claims[uid]
            if pod_uid in tracked.ended:
                tracked.ended.discard(pod_uid)
                changed = True
                if tracked.tombstone and not tracked.pods:
                    self._remove(uid)
        if changed:
            self.save()

    # -- internals ---------------------------------------------------------------

    def _insert(self, tracked: TrackedClaim) -> None:
        uid = tracked.info.uid
        self._claims[uid] = tracked
        self._by_name[(tracked.info.namespace, tracked.info.name)] = uid
        for d in tracked.info.devices:
            self._by_device.setdefault(d.key, set()).add(uid)

    def _remove(self, uid: str) -> None:
        tracked = self._claims.pop(uid)
        self._tombstones.pop(uid, None)
        name = (tracked.info.namespace, tracked.info.name)
        if self._by_name.get(name) == uid:
            del self._by_name[name]
        for d in tracked.info.devices:
            uids = self._by_device.get(d.key)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self._by_device[d.key]

    def _trim(self) -> None:
        while len(self._tombstones) > self.max_tombstones:
            uid, _ = self._tombstones.popitem(last=False)
            if uid in self._claims:
                self._remove(uid)
