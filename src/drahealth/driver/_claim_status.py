"""Device health written into the ResourceClaims a driver prepared (``status.devices``).

Owns :class:`ClaimStatusWriter`, the opt-in that makes a driver built with this toolkit
report each prepared device's health in ``ResourceClaim.status.devices[].conditions``
(KEP-4817; GA in Kubernetes 1.37, beta and on by default from 1.33), so ``kubectl
describe resourceclaim`` shows it and the remediation controller reads it. The
condition and the entry merge are the core's (:mod:`drahealth.core._claim_health`):
type ``DeviceHealthy``, status ``True``/``False``/``Unknown``.

What it writes, and when:

* on every HealthHub change, for the claims the plugin has prepared (``PrepareCompleted``
  in its checkpoint) that hold a changed device, and for every newly prepared claim
  (found on the next change or at the latest after ``resync_seconds``);
* only entries of its own driver name (upstream's granular status authorization lets a
  node-local driver write nothing else), one per allocated device of that driver
  (keyed by driver, pool, device and ``shareID``); other entries, an entry's ``data``
  and ``networkData`` and its other conditions are left exactly as they are: the write
  is a JSON patch of the ``conditions`` of our entries (and ``add`` of missing ones)
  with the claim's ``resourceVersion`` as precondition, retried on 409 Conflict;
* through the status subresource with field manager = the driver name;
* rate-bounded: one claim at most every ``min_interval`` seconds (changes in between
  are coalesced into the next write, the latest state wins) and the writer as a whole
  at most ``max_writes_per_second``; nothing is written when the condition already says
  the same.

Where the server does not keep ``status.devices`` (a release before 1.33, or
``DRAResourceClaimDeviceStatus`` turned off: the server drops the field), the first
write shows it; the writer says so once in the log and stops. A claim that is gone, no
longer allocated or replaced (other UID) is skipped; a write the server refuses (422)
is logged once per claim and not retried until the next change.

May not touch: claims this node did not prepare, the hub's state, the checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
from lightkube import AsyncClient
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from drahealth._aio import cancel_and_wait
from drahealth._time import now_rfc3339
from drahealth.core import CONDITION_TYPE, device_status_entries, merge_device_status
from drahealth.driver._checkpoint import ClaimEntry, ClaimState
from drahealth.driver._hub import DeviceState, HealthHub
from drahealth.kube import as_dict, is_conflict, is_not_found, patch_status, status_code

__all__ = ["ClaimStatusOptions", "ClaimStatusWriter"]

log = logging.getLogger(__name__)

PreparedClaims = Callable[[], Mapping[str, ClaimEntry]]
EntryKey = tuple[str, str, str, str | None]


@dataclass(frozen=True)
class ClaimStatusOptions:
    """Knobs of :class:`ClaimStatusWriter`, with their defaults.

    ``min_interval``: seconds between two writes of one claim (1). ``max_writes_per_second``:
    the writer's overall pace (20). ``resync_seconds``: how often newly prepared claims are
    looked for without a health change (10). ``conflict_attempts``: tries of one write
    against concurrent writers (5). ``retry_seconds``: wait before a failed write is tried
    again (5).
    """

    min_interval: float = 1.0
    max_writes_per_second: float = 20.0
    resync_seconds: float = 10.0
    conflict_attempts: int = 5
    retry_seconds: float = 5.0

    def __post_init__(self) -> None:
        for name in ("min_interval", "resync_seconds", "retry_seconds"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"ClaimStatusOptions.{name} must be >= 0")
        if not self.max_writes_per_second > 0:
            raise ValueError("ClaimStatusOptions.max_writes_per_second must be > 0")
        if self.conflict_attempts < 1:
            raise ValueError("ClaimStatusOptions.conflict_attempts must be >= 1")


class _Unserved(Exception):
    """The server dropped ``status.devices`` from a write."""


class ClaimStatusWriter:
    """Writes the ``DeviceHealthy`` condition of each prepared device (module docstring).

    ``prepared`` returns the plugin's prepared claims (``PluginHandle.preparer.
    prepared_claims``); ``client`` is the driver's API client. ``start()`` subscribes to
    the hub and runs the writer on the running loop; ``stop()`` ends it.
    """

    def __init__(
        self,
        hub: HealthHub,
        client: AsyncClient,
        driver_name: str,
        prepared: PreparedClaims,
        options: ClaimStatusOptions | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], str] = now_rfc3339,
    ) -> None:
        self.hub = hub
        self.client = client
        self.driver_name = driver_name
        self.options = options or ClaimStatusOptions()
        self._prepared = prepared
        self._clock = clock
        self._now = now
        self._known: dict[str, ClaimEntry] = {}
        self._by_device: dict[tuple[str, str], set[str]] = {}
        self._dirty: set[str] = set()
        self._not_before: dict[str, float] = {}
        self._refused: set[str] = set()
        self._next_slot = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        #: False once the server showed it drops ``status.devices`` (the writer stopped).
        self.served: bool | None = None
        #: writes that changed a claim, conflicts retried, writes that failed
        self.writes = 0
        self.conflicts = 0
        self.failures = 0
        #: rounds of the loop so far (each: look for prepared claims, write what is due)
        self.passes = 0

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            return
        self._unsubscribe = self.hub.subscribe(self._on_change)
        self._task = asyncio.create_task(self._run(), name="claim-status")

    async def stop(self) -> None:
        """Stop writing (what is in flight is cancelled). Idempotent."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])

    def poke(self) -> None:
        """Look for newly prepared claims now (e.g. right after a prepare)."""
        self._wake.set()

    # -- bookkeeping --------------------------------------------------------------------

    def _on_change(self, changed: list[DeviceState]) -> None:
        for state in changed:
            self._dirty |= self._by_device.get((state.pool, state.device), set())
        self._wake.set()

    def _scan(self) -> None:
        """Track the prepared claims: new ones become dirty, gone ones are forgotten."""
        current = {
            uid: e for uid, e in self._prepared().items() if e.state is ClaimState.PREPARE_COMPLETED
        }
        for uid in self._known.keys() - current.keys():
            self._forget(uid)
        for uid, entry in current.items():
            if self._known.get(uid) == entry:
                continue
            if uid in self._known:
                self._forget(uid)
            self._known[uid] = entry
            for d in entry.devices:
                self._by_device.setdefault((d.pool, d.device), set()).add(uid)
            self._dirty.add(uid)

    def _forget(self, uid: str) -> None:
        entry = self._known.pop(uid)
        for d in entry.devices:
            uids = self._by_device.get((d.pool, d.device))
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self._by_device[(d.pool, d.device)]
        self._dirty.discard(uid)
        self._not_before.pop(uid, None)
        self._refused.discard(uid)

    # -- the loop -----------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            self._scan()
            try:
                await self._flush()
            except _Unserved:
                return
            self.passes += 1
            timeout = self.options.resync_seconds
            if self._dirty:
                due = min(self._not_before.get(u, 0.0) for u in self._dirty)
                timeout = min(timeout, max(0.0, due - self._clock()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    async def _flush(self) -> None:
        for uid in sorted(self._dirty):
            now = self._clock()
            if self._not_before.get(uid, 0.0) > now:
                continue
            if self._next_slot > now:
                await asyncio.sleep(self._next_slot - now)
            entry = self._known.get(uid)
            if entry is None:  # forgotten while we slept
                continue
            self._dirty.discard(uid)
            self._next_slot = self._clock() + 1.0 / self.options.max_writes_per_second
            self._not_before[uid] = self._clock() + self.options.min_interval
            try:
                await self._write(uid, entry)
            except _Unserved:
                raise
            except (httpx2.HTTPError, OSError) as exc:
                self.failures += 1
                code = status_code(exc)
                if code == 422:
                    if uid not in self._refused:
                        log.warning(
                            "ResourceClaim %s/%s: the server refused its device status: %s",
                            entry.namespace,
                            entry.name,
                            _message(exc),
                        )
                    self._refused.add(uid)
                    continue
                log.warning(
                    "ResourceClaim %s/%s: writing device health failed (%s); retrying in %gs",
                    entry.namespace,
                    entry.name,
                    _message(exc),
                    self.options.retry_seconds,
                )
                self._dirty.add(uid)
                self._not_before[uid] = self._clock() + self.options.retry_seconds

    async def _write(self, uid: str, entry: ClaimEntry) -> None:
        for attempt in range(self.options.conflict_attempts):
            try:
                await self._write_once(uid, entry)
                return
            except httpx2.HTTPStatusError as exc:
                if not is_conflict(exc) or attempt == self.options.conflict_attempts - 1:
                    raise
                self.conflicts += 1

    async def _write_once(self, uid: str, entry: ClaimEntry) -> None:
        try:
            obj = await self.client.get(ResourceClaim, entry.name, namespace=entry.namespace)
        except httpx2.HTTPStatusError as exc:
            if is_not_found(exc):
                return
            raise
        claim = as_dict(obj)
        meta = claim.get("metadata") or {}
        if meta.get("uid") != uid:
            return  # replaced by another claim of the same name
        ops, keys = self.patch_ops(claim)
        if not ops:
            return
        res = await patch_status(
            self.client,
            ResourceClaim,
            entry.name,
            ops,
            namespace=entry.namespace,
            patch_type=PatchType.JSON,
            field_manager=self.driver_name,
        )
        self.writes += 1
        written = {_key(e) for e in device_status_entries(as_dict(res))}
        if not keys & written:
            self.served = False
            log.warning(
                "this API server does not keep ResourceClaim status.devices (Kubernetes "
                "before 1.33, or DRAResourceClaimDeviceStatus turned off): device health "
                "is not written into claims; the writer stops"
            )
            raise _Unserved
        self.served = True

    def patch_ops(self, claim: Mapping[str, Any]) -> tuple[list[dict[str, Any]], set[EntryKey]]:
        """The JSON patch that brings ``claim``'s entries of this driver up to date, and the
        entry keys it writes; no ops when nothing changes."""
        meta = claim.get("metadata") or {}
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        entries = device_status_entries(claim)
        merged = [dict(e) for e in entries]
        added: list[dict[str, Any]] = []
        changed: dict[int, list[Any]] = {}
        keys: set[EntryKey] = set()
        generation = int(meta.get("generation") or 0)
        now = self._now()
        for r in results:
            if not isinstance(r, dict) or r.get("driver") != self.driver_name:
                continue
            key: EntryKey = (
                self.driver_name,
                str(r.get("pool") or ""),
                str(r.get("device") or ""),
                str(r["shareID"]) if r.get("shareID") else None,
            )
            if key in keys:
                continue
            try:
                state = self.hub.state(key[1], key[2])
            except ValueError:
                continue  # a device the hub does not know: nothing to say
            merged, what = merge_device_status(
                merged, key, state.health, state.message, generation=generation, now=now
            )
            if what == "full":
                log.warning(
                    "ResourceClaim %s/%s: the status entry of %s/%s/%s already has 8 "
                    "conditions; %s is not written",
                    meta.get("namespace"),
                    meta.get("name"),
                    *key[:3],
                    CONDITION_TYPE,
                )
                continue
            if what == "unchanged":
                continue
            keys.add(key)
            if what == "added":
                added.append(merged[-1])
            else:
                at = next(i for i, e in enumerate(merged) if _key(e) == key)
                changed[at] = merged[at]["conditions"]
        if not keys:
            return [], keys
        ops: list[dict[str, Any]] = [
            {
                "op": "replace",
                "path": "/metadata/resourceVersion",
                "value": meta.get("resourceVersion"),
            }
        ]
        for at, conditions in sorted(changed.items()):
            ops.append(
                {"op": "replace", "path": f"/status/devices/{at}/conditions", "value": conditions}
            )
        if added and "devices" in status:
            ops += [{"op": "add", "path": "/status/devices/-", "value": e} for e in added]
        elif added:
            ops.append({"op": "add", "path": "/status/devices", "value": added})
        return ops, keys


def _key(entry: Mapping[str, Any]) -> EntryKey:
    share = entry.get("shareID")
    return (
        str(entry.get("driver") or ""),
        str(entry.get("pool") or ""),
        str(entry.get("device") or ""),
        str(share) if share else None,
    )


def _message(exc: BaseException) -> str:
    if isinstance(exc, httpx2.HTTPStatusError):
        with contextlib.suppress(Exception):
            body = exc.response.json()
            if isinstance(body, dict) and body.get("message"):
                return str(body["message"])
    return str(exc) or type(exc).__name__
