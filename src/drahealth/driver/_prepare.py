"""Prepare/unprepare orchestration between the kubelet's requests and the driver.

Owns: fetching claims (concurrently, before the serialization lock), turning a
``ResourceClaim`` into this driver's :class:`AllocationResult` list with resolved
opaque configs, serialization (``asyncio.Lock``, plus an ``flock`` on
``serialize.lock`` in rolling-update mode), idempotency and the "device already in
use" guard against the checkpoint, CDI spec writing, and per-claim outcomes. Knows
nothing of gRPC: the plugin (``_plugin``) converts requests and replies.

Rules, in order, for ``prepare``:

1. Every claim is fetched with a GET, concurrently, outside the lock (with
   ``claim_cache`` on, a watch-cache entry with the same UID, an allocation and a
   reservation is used instead; the kubelet prepares only reserved claims, and an
   allocation cannot change while the claim is reserved). A failure
   fails only that claim (transient): no API access, GET error, not found, UID
   mismatch ("got replaced"), ``status.allocation`` missing ("is not allocated").
   A claim with no results for this driver is answered with zero devices and never
   reaches the driver.
2. Under the lock, in one checkpoint transaction: a claim already
   ``PrepareCompleted`` is answered from the checkpoint without calling the driver
   (its CDI spec is rewritten if it vanished); a claim whose device is recorded for
   another claim UID fails (transient, since that claim may be unprepared soon)
   unless either side has admin access or both carry different share IDs; the rest
   are recorded ``PrepareStarted`` with their allocated devices.
3. The driver prepares those claims in one call; then CDI specs are written and the
   claims recorded ``PrepareCompleted`` with their devices.

Concurrent calls are batched: one task at a time takes every call queued for the lock
as one batch (one driver call). Checkpoint changes go through a group commit
(``_commit``): a batch's ``PrepareCompleted`` write is waited for after the lock is
released, so the next batch's ``PrepareStarted`` shares that write; no claim is
answered before a write holding its state has been fsynced.
4. Every claim of the request is answered; request names are stripped of
   subrequests (``main/sub`` -> ``main``). ``PERMANENT_DEVICE`` errors call
   ``on_device_fault(pool, device, message)``.

``unprepare`` never GETs (the claim may be gone): under the lock it calls the driver
for every claim (known or not), removes CDI specs and checkpoint entries of the
claims the driver unprepared, and answers every claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lightkube import ApiError
from lightkube.resources.resource_v1 import ResourceClaim

from drahealth import api
from drahealth.driver._cdi import CDISpecs
from drahealth.driver._checkpoint import Checkpoint, CheckpointDevice, ClaimEntry, ClaimState
from drahealth.driver._commit import Change, GroupCommit
from drahealth.driver._types import (
    AllocationResult,
    CheckpointError,
    ClaimError,
    ClaimRef,
    ConfigSource,
    Driver,
    ErrorKind,
    OpaqueConfig,
    PluginOptions,
    PreparedClaimRequest,
    PreparedDevice,
    PrepareResult,
    base_request,
)
from drahealth.kube import Reflector

if TYPE_CHECKING:
    from prometheus_client import Counter

__all__ = [
    "ClaimPreparer",
    "FileLock",
    "find_conflict",
    "format_error",
    "resolve_results",
    "strip_subrequests",
]

log = logging.getLogger("drahealth.driver.prepare")

#: CDI spec files a prepare batch writes at the same time, each in a worker thread.
_CDI_WRITES_AT_ONCE = 8

#: Claim versions whose resolved results are remembered (see ``ClaimPreparer._resolve``).
_RESOLVED_CACHE_SIZE = 4096

#: Values of a result's ``skipNodeOperations`` that mean "do not prepare".
_SKIP_PREPARE = frozenset({"NodePrepareResources", "*"})


# ---------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------


def resolve_results(claim: ResourceClaim, driver_name: str) -> list[AllocationResult]:
    """This driver's allocation results of ``claim`` with their opaque configs.

    A config applies to a result when it is an opaque config of this driver and its
    ``requests`` list is empty or names the result's request in full (``main/sub``)
    or by its main name. Configs come class-first, then claim, each in API order;
    later entries win. Results whose ``skipNodeOperations`` covers
    ``NodePrepareResources`` are left out.
    """
    allocation = claim.status.allocation if claim.status else None
    devices = allocation.devices if allocation else None
    if devices is None:
        return []
    configs: list[OpaqueConfig] = []
    for cfg in devices.config or []:
        if cfg.opaque is None or cfg.opaque.driver != driver_name:
            continue
        try:
            source = ConfigSource(cfg.source)
        except ValueError:
            source = ConfigSource.FROM_CLAIM
        configs.append(
            OpaqueConfig(
                driver=cfg.opaque.driver,
                parameters=cfg.opaque.parameters,
                source=source,
                requests=tuple(cfg.requests or ()),
            )
        )
    configs.sort(key=lambda c: c.source is not ConfigSource.FROM_CLASS)  # stable
    out: list[AllocationResult] = []
    for res in devices.results or []:
        if res.driver != driver_name:
            continue
        if _SKIP_PREPARE.intersection(res.skipNodeOperations or ()):
            continue
        main = base_request(res.request)
        matching = tuple(
            c for c in configs if not c.requests or res.request in c.requests or main in c.requests
        )
        out.append(
            AllocationResult(
                request=res.request,
                driver=res.driver,
                pool=res.pool,
                device=res.device,
                admin_access=bool(res.adminAccess),
                share_id=res.shareID or None,
                consumed_capacity={k: str(v) for k, v in (res.consumedCapacity or {}).items()},
                tolerations=tuple(res.tolerations or ()),
                configs=matching,
            )
        )
    return out


def strip_subrequests(requests: Iterable[str]) -> list[str]:
    """Main request names, in order, without duplicates: ``["a/x", "b"]`` -> ``["a", "b"]``."""
    return list(dict.fromkeys(base_request(r) for r in requests))


def _compatible(a_admin: bool, a_share: str | None, b_admin: bool, b_share: str | None) -> bool:
    if a_admin or b_admin:
        return True
    return bool(a_share and b_share and a_share != b_share)


#: (pool, device) -> every (claim UID, entry, recorded device) that records it.
_DeviceUsers = dict[tuple[str, str], list[tuple[str, ClaimEntry, CheckpointDevice]]]


def _device_users(claims: Mapping[str, ClaimEntry]) -> _DeviceUsers:
    """Who records which device in ``claims``, in ``claims`` order (see
    :func:`find_conflict`)."""
    users: _DeviceUsers = {}
    for uid, entry in claims.items():
        _add_device_users(users, uid, entry)
    return users


def _add_device_users(users: _DeviceUsers, uid: str, entry: ClaimEntry) -> None:
    for dev in entry.devices:
        users.setdefault((dev.pool, dev.device), []).append((uid, entry, dev))


def _remove_device_users(users: _DeviceUsers, uid: str, entry: ClaimEntry) -> None:
    for dev in entry.devices:
        key = (dev.pool, dev.device)
        left = [u for u in users.get(key, ()) if u[0] != uid]
        if left:
            users[key] = left
        else:
            users.pop(key, None)


def find_conflict(
    uid: str,
    results: Sequence[AllocationResult],
    claims: Mapping[str, ClaimEntry],
    users: _DeviceUsers | None = None,
) -> ClaimError | None:
    """The error for the first result of claim ``uid`` whose device is recorded for
    another claim in ``claims`` (the in-use guard), or ``None``. ``users`` is the
    device index of ``claims`` when the caller keeps one (a batch checks many claims
    against the same records: one lookup per result instead of a scan of them all)."""
    if users is None:
        users = _device_users(claims)
    for res in results:
        for other_uid, entry, dev in users.get((res.pool, res.device), ()):
            if other_uid == uid:
                continue
            if _compatible(res.admin_access, res.share_id, dev.admin_access, dev.share_id):
                continue
            return ClaimError(
                f"device {res.pool}/{res.device} is already in use by claim "
                f"{entry.namespace}/{entry.name} ({other_uid})",
                ErrorKind.TRANSIENT,
            )
    return None


def format_error(error: ClaimError) -> str:
    """The per-claim error string on the wire."""
    return error.message


def error_type_field(error: ClaimError) -> bytes:
    """The encoded KEP-5322 ``error_type`` field for ``error`` (see ``_types``): the
    varint field 3 = Permanent for permanent errors, nothing (Unknown, the default) for
    the others."""
    if not error.kind.permanent:
        return b""
    tag = (api.PREPARE_ERROR_TYPE_FIELD << 3) | 0  # wire type 0: varint
    return bytes((tag, api.PREPARE_ERROR_TYPE_PERMANENT))


def _as_claim_error(exc: BaseException, what: str) -> ClaimError:
    if isinstance(exc, ClaimError):
        return exc
    return ClaimError(f"{what}: {type(exc).__name__}: {exc}", ErrorKind.TRANSIENT)


# ---------------------------------------------------------------------------
# File lock
# ---------------------------------------------------------------------------


class FileLock:
    """An exclusive ``flock`` on ``path``, acquired in a worker thread so the event
    loop never blocks. Not re-entrant. A cancelled acquire releases the lock as soon
    as the thread gets it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    async def __aenter__(self) -> FileLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fut = asyncio.get_running_loop().run_in_executor(None, fcntl.flock, fd, fcntl.LOCK_EX)
        try:
            await asyncio.shield(fut)
        except BaseException:
            fut.add_done_callback(lambda _: os.close(fd))
            raise
        self._fd = fd
        return self

    async def __aexit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing drops the flock


# ---------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------


class ClaimPreparer:
    """Runs NodePrepare/NodeUnprepare for one driver (see the module docstring).

    ``load()`` must be awaited once before serving: it reads the checkpoint (raising
    :class:`CheckpointError` for a corrupt one) and regenerates missing CDI specs.
    """

    def __init__(self, driver: Driver, options: PluginOptions) -> None:
        self._driver = driver
        self._options = options
        self._client = options.kube_client
        self._checkpoint = Checkpoint(options.checkpoint_path)
        self._cdi = (
            CDISpecs(options.cdi_dir, options.driver_name, options.cdi_class)
            if options.cdi_dir is not None
            else None
        )
        self._shared = options.pod_uid is not None
        self._lock = asyncio.Lock()
        self._state_lock = asyncio.Lock()
        self._serialize_flock = FileLock(options.lock_path) if self._shared else None
        self._state_flock = FileLock(options.checkpoint_path + ".lock") if self._shared else None
        self._commit = GroupCommit(self._checkpoint, {})
        self._counter = _make_counter(options)
        self._counted: dict[tuple[str, str], Any] = {}  # (operation, outcome) -> child
        # (claim UID, resourceVersion) -> its resolved results (see _resolve)
        self._resolved: dict[tuple[str, str], list[AllocationResult]] = {}
        self._claim_watch: Reflector[ResourceClaim] | None = None
        #: prepares answered from the claim cache / by a GET (``claim_cache`` on)
        self.cache_hits = 0
        self.cache_misses = 0
        # calls waiting for the serialization lock, run in batches
        self._prepare_batches = _Batches(self._prepare_locked, self._serialized, options.serialize)
        self._unprepare_batches = _Batches(
            self._unprepare_locked, self._serialized, options.serialize
        )

    @property
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    @property
    def cdi(self) -> CDISpecs | None:
        return self._cdi

    @property
    def checkpoint_writes(self) -> int:
        """Checkpoint writes done by this process since start (one per group commit)."""
        return self._commit.writes

    def prepared_claims(self) -> dict[str, ClaimEntry]:
        """A copy of the checkpointed claims as last read or written."""
        return dict(self._commit.durable)

    async def load(self) -> None:
        os.makedirs(self._options.effective_state_dir, exist_ok=True)
        self._commit.reset(await asyncio.to_thread(self._checkpoint.load))
        if self._cdi is not None:
            await asyncio.to_thread(self._cdi.regenerate, self._commit.durable)
        if self._options.claim_cache and self._client is not None and self._claim_watch is None:
            self._claim_watch = Reflector(self._client, ResourceClaim, name="claim-cache")
            await self._claim_watch.start()

    async def close(self) -> None:
        """Stop the claim cache's watch (if any) and wait for checkpoint writes in
        flight. Idempotent."""
        watch, self._claim_watch = self._claim_watch, None
        if watch is not None:
            await watch.stop()
        await self._commit.flush()

    # -- prepare -----------------------------------------------------------

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare ``refs``; one result per distinct claim UID, never raises for a claim."""
        unique = list({r.uid: r for r in refs}.values())
        fetched: list[PreparedClaimRequest | ClaimError | None]
        fetched = [self._from_cache(r) for r in unique]
        if misses := [i for i, got in enumerate(fetched) if got is None]:
            gets = await asyncio.gather(*(self._fetch(unique[i]) for i in misses))
            for i, answer in zip(misses, gets, strict=True):
                fetched[i] = answer
        out: dict[str, PrepareResult] = {}
        todo: list[PreparedClaimRequest] = []
        for ref, got in zip(unique, fetched, strict=True):
            if isinstance(got, ClaimError):
                out[ref.uid] = PrepareResult(error=got)
            elif got is not None and not got.results:
                out[ref.uid] = PrepareResult.ok([])
            elif got is not None:
                todo.append(got)
        if todo:
            out.update(await self._prepare_batches.run(todo))
        for ref in unique:
            result = out[ref.uid]
            self._count("prepare", result.error)
            if result.error is not None:
                log.warning("prepare of claim %s failed: %s", ref, result.error.message)
                await self._maybe_device_fault(result.error)
        return out

    def _from_cache(self, ref: ClaimRef) -> PreparedClaimRequest | None:
        """The claim from the watch cache, without a suspension (``None``: GET it)."""
        claim = self._cached(ref)
        if claim is None:
            return None
        return PreparedClaimRequest(claim, self._resolve(claim))

    def _resolve(self, claim: ResourceClaim) -> list[AllocationResult]:
        """:func:`resolve_results` for this driver, remembered per claim UID and
        resourceVersion (the same version has the same content), so a claim the
        kubelet prepares again, or that sits in the watch cache, is resolved once."""
        meta = claim.metadata
        key = (meta.uid or "", meta.resourceVersion or "") if meta is not None else ("", "")
        if not key[1]:
            return resolve_results(claim, self._options.driver_name)
        known = self._resolved.get(key)
        if known is None:
            if len(self._resolved) >= _RESOLVED_CACHE_SIZE:
                self._resolved.clear()  # bounded; refilled by the claims in use
            known = self._resolved[key] = resolve_results(claim, self._options.driver_name)
        return list(known)

    async def _fetch(self, ref: ClaimRef) -> PreparedClaimRequest | ClaimError:
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        if self._client is None:
            return ClaimError(f"no Kubernetes API access configured; cannot fetch {where}")
        try:
            claim = await self._client.get(ResourceClaim, ref.name, namespace=ref.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return ClaimError(f"{where} not found (uid {ref.uid})")
            return ClaimError(f"fetching {where}: {exc.status.message or exc}")
        except Exception as exc:
            return _as_claim_error(exc, f"fetching {where}")
        got_uid = claim.metadata.uid if claim.metadata else None
        if got_uid != ref.uid:
            return ClaimError(f"claim {ref} got replaced: the API server has uid {got_uid}")
        if claim.status is None or claim.status.allocation is None:
            return ClaimError(f"claim {ref} is not allocated")
        return PreparedClaimRequest(claim, self._resolve(claim))

    def _cached(self, ref: ClaimRef) -> ResourceClaim | None:
        if self._claim_watch is None:
            return None
        claim = self._claim_watch.store.get(ref.namespace, ref.name)
        if (
            claim is not None
            and claim.metadata is not None
            and claim.metadata.uid == ref.uid
            and claim.status is not None
            and claim.status.allocation is not None
            and claim.status.reservedFor
        ):
            self.cache_hits += 1
            return claim
        self.cache_misses += 1
        return None

    async def _prepare_locked(
        self, claims: Sequence[PreparedClaimRequest]
    ) -> tuple[dict[str, PrepareResult], Settle | None]:
        out: dict[str, PrepareResult] = {}
        replay: dict[str, ClaimEntry] = {}
        call: list[PreparedClaimRequest] = []

        def plan(state: dict[str, ClaimEntry]) -> bool:
            users = _device_users(state)
            for c in claims:
                entry = state.get(c.uid)
                if entry is not None and entry.state is ClaimState.PREPARE_COMPLETED:
                    replay[c.uid] = entry
                    continue
                conflict = find_conflict(c.uid, c.results, state, users)
                if conflict is not None:
                    out[c.uid] = PrepareResult(error=conflict)
                    continue
                if entry is not None:  # started before: its record is replaced
                    _remove_device_users(users, c.uid, entry)
                state[c.uid] = started = ClaimEntry(
                    c.namespace,
                    c.name,
                    ClaimState.PREPARE_STARTED,
                    tuple(
                        CheckpointDevice(
                            pool=r.pool,
                            device=r.device,
                            requests=(r.request,),
                            share_id=r.share_id,
                            admin_access=r.admin_access,
                        )
                        for r in c.results
                    ),
                )
                _add_device_users(users, c.uid, started)
                call.append(c)
            return bool(call)

        try:
            await (await self._mutate(plan))
        except (OSError, CheckpointError) as exc:
            err = _as_claim_error(exc, "recording prepare in the checkpoint")
            return {c.uid: PrepareResult(error=err) for c in claims}, None

        for uid, entry in replay.items():
            out[uid] = await self._replay(uid, entry)
        if not call:
            return out, None

        answers = await self._call_driver_prepare(call)
        prepared: list[tuple[PreparedClaimRequest, Sequence[PreparedDevice]]] = []
        for c in call:
            result = answers.get(c.uid)
            if result is None:
                out[c.uid] = PrepareResult.failed(f"driver returned no result for claim {c.ref}")
            elif result.error is not None:
                out[c.uid] = PrepareResult(error=result.error)
            elif result.devices is None:
                out[c.uid] = PrepareResult.failed(
                    f"driver returned neither devices nor an error for claim {c.ref}"
                )
            else:
                prepared.append((c, result.devices))
        completed: dict[str, ClaimEntry] = {}
        for (c, _), done in zip(prepared, await self._complete_all(prepared), strict=True):
            if isinstance(done, ClaimError):
                out[c.uid] = PrepareResult(error=done)
            else:
                completed[c.uid] = done
                out[c.uid] = PrepareResult.ok(_reply_devices(done))
        if not completed:
            return out, None

        def finish(state: dict[str, ClaimEntry]) -> bool:
            state.update(completed)
            return True

        def failed(exc: Exception) -> None:
            err = _as_claim_error(exc, "recording prepared devices in the checkpoint")
            for uid in completed:
                out[uid] = PrepareResult(error=err)

        return out, await self._settle_after(finish, failed)

    async def _call_driver_prepare(
        self, claims: Sequence[PreparedClaimRequest]
    ) -> Mapping[str, PrepareResult]:
        try:
            return await self._driver.prepare(claims)
        except Exception as exc:
            log.exception("driver prepare failed for %d claim(s)", len(claims))
            err = _as_claim_error(exc, "driver prepare failed")
            return {c.uid: PrepareResult(error=err) for c in claims}

    async def _complete_all(
        self, prepared: Sequence[tuple[PreparedClaimRequest, Sequence[PreparedDevice]]]
    ) -> list[ClaimEntry | ClaimError]:
        """:meth:`_complete` for each claim, in order. With CDI, up to
        ``_CDI_WRITES_AT_ONCE`` specs are written at a time (each is its own file with two
        fsyncs: in a row, a batch of 50 claims waited for 100 fsyncs one after the other);
        without, nothing suspends and the claims are done in a row."""
        if self._cdi is None or len(prepared) < 2:
            return [await self._complete(c, devices) for c, devices in prepared]
        slots = asyncio.Semaphore(_CDI_WRITES_AT_ONCE)

        async def one(c: PreparedClaimRequest, devices: Sequence[PreparedDevice]) -> Any:
            async with slots:
                return await self._complete(c, devices)

        return list(await asyncio.gather(*(one(c, devices) for c, devices in prepared)))

    async def _complete(
        self, claim: PreparedClaimRequest, devices: Sequence[PreparedDevice]
    ) -> ClaimEntry | ClaimError:
        recorded = tuple(
            CheckpointDevice(
                pool=d.pool,
                device=d.device,
                requests=tuple(d.requests),
                cdi_device_ids=tuple(d.cdi_device_ids),
                share_id=d.share_id,
                admin_access=_admin_access(claim.results, d),
            )
            for d in devices
        )
        if self._cdi is not None:
            try:
                ids = await asyncio.to_thread(self._cdi.write, claim.uid, recorded)
            except OSError as exc:
                return _as_claim_error(exc, f"writing CDI spec for claim {claim.ref}")
            recorded = tuple(
                CheckpointDevice(
                    pool=d.pool,
                    device=d.device,
                    requests=d.requests,
                    cdi_device_ids=(*d.cdi_device_ids, cdi_id),
                    share_id=d.share_id,
                    admin_access=d.admin_access,
                )
                for d, cdi_id in zip(recorded, ids, strict=True)
            )
        return ClaimEntry(claim.namespace, claim.name, ClaimState.PREPARE_COMPLETED, recorded)

    async def _replay(self, uid: str, entry: ClaimEntry) -> PrepareResult:
        if self._cdi is not None and entry.devices and not self._cdi.exists(uid):
            try:
                await asyncio.to_thread(self._cdi.write, uid, entry.devices)
            except OSError as exc:
                return PrepareResult(error=_as_claim_error(exc, f"rewriting CDI spec of {uid}"))
        return PrepareResult.ok(_reply_devices(entry))

    # -- unprepare ---------------------------------------------------------

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimError | None]:
        """Unprepare ``refs``; one entry per distinct claim UID (``None`` = success)."""
        unique = list({r.uid: r for r in refs}.values())
        out: dict[str, ClaimError | None] = {}
        if unique:
            out = await self._unprepare_batches.run(unique)
        for ref in unique:
            self._count("unprepare", out[ref.uid])
            err = out[ref.uid]
            if err is not None:
                log.warning("unprepare of claim %s failed: %s", ref, err.message)
        return out

    async def _unprepare_locked(
        self, refs: Sequence[ClaimRef]
    ) -> tuple[dict[str, ClaimError | None], Settle | None]:
        out: dict[str, ClaimError | None] = {}
        try:
            answers: Mapping[str, Exception | None] = await self._driver.unprepare(refs)
        except Exception as exc:
            log.exception("driver unprepare failed for %d claim(s)", len(refs))
            answers = {r.uid: exc for r in refs}
        done: list[str] = []
        for ref in refs:
            if ref.uid not in answers:
                out[ref.uid] = ClaimError(f"driver returned no result for claim {ref}")
                continue
            answer = answers[ref.uid]
            if answer is not None:
                out[ref.uid] = _as_claim_error(answer, "driver unprepare failed")
                continue
            if self._cdi is not None:
                try:
                    await asyncio.to_thread(self._cdi.remove, ref.uid)
                except OSError as exc:
                    out[ref.uid] = _as_claim_error(exc, f"removing CDI spec of claim {ref}")
                    continue
            out[ref.uid] = None
            done.append(ref.uid)

        def forget(state: dict[str, ClaimEntry]) -> bool:
            changed = False
            for uid in done:
                changed = state.pop(uid, None) is not None or changed
            return changed

        if not done:
            return out, None

        def failed(exc: Exception) -> None:
            err = _as_claim_error(exc, "removing claims from the checkpoint")
            out.update(dict.fromkeys(done, err))

        return out, await self._settle_after(forget, failed)

    # -- plumbing ----------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _serialized(self) -> AsyncIterator[None]:
        if not self._options.serialize:
            yield
            return
        async with self._lock:
            if self._serialize_flock is None:
                yield
                return
            async with self._serialize_flock:
                yield

    async def _mutate(self, change: Change) -> asyncio.Future[None]:
        """Apply ``change`` to the checkpointed claims (a save follows if it returns
        True); returns the future that resolves once the claims as changed are
        durable, or fails with the write's error.

        Alone on the file, the change is applied at once and its write is shared with
        every change made meanwhile (group commit, see ``_commit``). When
        rolling-update instances share the file, the whole transaction runs before
        this returns: in-process lock, flock, re-read of the file, change, write.
        """
        if self._state_flock is None:
            return self._commit.apply(change)
        async with self._state_lock, self._state_flock:
            self._commit.reset(await asyncio.to_thread(self._checkpoint.load))
            durable = self._commit.apply(change)
            await asyncio.wait([durable])
            return durable

    async def _settle_after(
        self, change: Change, failed: Callable[[Exception], None]
    ) -> Settle | None:
        """Apply ``change`` now; the returned ``Settle`` holds the future of its write
        and ``failed``, to be called with the error if the write (or, shared, the
        re-read) failed. ``None`` when it failed at once (``failed`` was called)."""
        try:
            durable = await self._mutate(change)
        except (OSError, CheckpointError) as exc:
            failed(exc)
            return None
        return Settle(durable, failed)

    async def _maybe_device_fault(self, error: ClaimError) -> None:
        callback = self._options.on_device_fault
        if callback is None or error.kind is not ErrorKind.PERMANENT_DEVICE:
            return
        if error.device is None:
            log.warning("permanent device error without a device; nothing to report: %s", error)
            return
        pool, device = error.device
        try:
            ret = callback(pool, device, error.message)
            if inspect.isawaitable(ret):
                await ret
        except Exception:
            log.exception("on_device_fault(%s, %s) failed", pool, device)

    def _count(self, operation: str, error: ClaimError | None) -> None:
        if self._counter is None:
            return
        outcome = "ok" if error is None else error.kind.value
        child = self._counted.get((operation, outcome))
        if child is None:  # a handful of label sets: each resolved once
            child = self._counter.labels(self._options.driver_name, operation, outcome)
            self._counted[(operation, outcome)] = child
        child.inc()


@dataclass(frozen=True, slots=True)
class Settle:
    """A batch's last checkpoint write, waited for after the serialization lock is
    released: ``durable`` resolves once it is on disk (or fails with the write's
    error); ``failed`` turns such an error into the batch's per-claim results."""

    durable: asyncio.Future[None]
    failed: Callable[[Exception], None]


class _Batches:
    """Calls of one kind (prepare or unprepare) run in batches under the serialization
    lock: one drain task at a time takes every call queued so far as one batch, so N
    concurrent calls cost one driver call, not N in a row; the callers only wait for
    their answer. A batch's last checkpoint write (its ``Settle``) is waited for after
    the lock is released: a callback on the write's future answers the batch, so the
    next batch starts at once and its first write shares that one (see ``_commit``);
    nobody is answered before it is durable. Without ``serialize`` every call runs on
    its own, concurrently."""

    def __init__(
        self,
        locked: Callable[[Sequence[Any]], Awaitable[tuple[dict[str, Any], Settle | None]]],
        serialized: Callable[[], contextlib.AbstractAsyncContextManager[None]],
        serialize: bool,
    ) -> None:
        self._locked = locked
        self._serialized = serialized
        self._serialize = serialize
        self._queue: list[tuple[Sequence[Any], asyncio.Future[dict[str, Any]]]] = []
        self._drain: asyncio.Task[None] | None = None

    async def run(self, items: Sequence[Any]) -> dict[str, Any]:
        """The results for ``items`` (keyed by their ``uid``)."""
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if not self._serialize:
            results, settle = await self._locked(items)
            if settle is None:
                return results
            settle.durable.add_done_callback(
                functools.partial(_answer_when_durable, [(items, done)], results, settle)
            )
            return await done
        self._queue.append((items, done))
        if self._drain is None:
            self._drain = asyncio.create_task(self._run_batches(), name="claim-batches")
        return await done

    async def _run_batches(self) -> None:
        batch: list[tuple[Sequence[Any], asyncio.Future[dict[str, Any]]]] = []
        try:
            while self._queue:
                try:
                    async with self._serialized():
                        batch, self._queue = self._queue, []
                        merged = list({i.uid: i for items, _ in batch for i in items}.values())
                        results, settle = await self._locked(merged)
                except Exception as exc:  # the lock (its flock) or a bug: fail, go on
                    if not batch:
                        batch, self._queue = self._queue, []
                    _fail(batch, exc)
                    batch = []
                    continue
                if settle is None:
                    _answer(batch, results)
                else:
                    settle.durable.add_done_callback(
                        functools.partial(_answer_when_durable, batch, results, settle)
                    )
                batch = []
        except BaseException as exc:  # cancelled with the loop: no caller may hang
            _fail([*batch, *self._queue], exc)
            self._queue = []
            raise
        finally:
            self._drain = None


def _answer_when_durable(
    batch: Sequence[tuple[Sequence[Any], asyncio.Future[dict[str, Any]]]],
    results: dict[str, Any],
    settle: Settle,
    durable: asyncio.Future[None],
) -> None:
    """Answer ``batch`` once its last write is done: a write error becomes per-claim
    results (``settle.failed``); a cancelled write (the loop is going away) cancels
    the callers."""
    if durable.cancelled():
        _fail(batch, asyncio.CancelledError())
        return
    exc = durable.exception()
    if isinstance(exc, OSError | CheckpointError):
        settle.failed(exc)
    elif exc is not None:  # settle reports write errors per claim: this is a bug
        _fail(batch, exc)
        return
    _answer(batch, results)


def _answer(
    batch: Sequence[tuple[Sequence[Any], asyncio.Future[dict[str, Any]]]],
    results: Mapping[str, Any],
) -> None:
    for items, fut in batch:
        if not fut.done():
            fut.set_result({i.uid: results[i.uid] for i in items})


def _fail(
    batch: Sequence[tuple[Sequence[Any], asyncio.Future[dict[str, Any]]]], exc: BaseException
) -> None:
    for _, fut in batch:
        if fut.done():
            continue
        if isinstance(exc, Exception):
            fut.set_exception(exc)
        else:
            fut.cancel()


def _admin_access(results: Sequence[AllocationResult], device: PreparedDevice) -> bool:
    return any(
        r.admin_access
        for r in results
        if (r.pool, r.device) == (device.pool, device.device)
        and (device.share_id is None or r.share_id == device.share_id)
    )


def _reply_devices(entry: ClaimEntry) -> list[PreparedDevice]:
    return [
        PreparedDevice(
            requests=strip_subrequests(d.requests),
            pool=d.pool,
            device=d.device,
            cdi_device_ids=list(d.cdi_device_ids),
            share_id=d.share_id,
        )
        for d in entry.devices
    ]


def _make_counter(options: PluginOptions) -> Counter | None:
    if options.metrics_registry is None:
        return None
    from prometheus_client import Counter

    return Counter(
        "drahealth_driver_claim_operations",
        "NodePrepare/NodeUnprepare outcomes per claim (outcome: ok or the error kind).",
        ["driver", "operation", "outcome"],
        registry=options.metrics_registry,
    )
