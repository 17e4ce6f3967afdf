"""Kubelet mode: the agent plays the node's kubelet for pods bound to its node.

Owns the pod lifecycle a kubelet runs for DRA on the embedded control plane:

* watch Pods with ``spec.nodeName = <node>`` (a reflector);
* for a pending pod whose claims are allocated: NodePrepareResources through the
  driver's newest connected plugin instance, record the devices in the claim
  tracker, then set the pod Running with container statuses and
  ``allocatedResourcesStatus``; the scheduler's special claim for extended resources
  backed by DRA (``status.extendedResourceClaimStatus``, KEP-5004) is prepared like
  the others and its devices go to the containers its request mappings name;
* a failed prepare records a ``FailedPrepareDynamicResources`` Event (saying whether
  the driver classified the error as permanent); a permanent one sets the pod
  ``Failed`` with reason ``DRAPrepareFailedPermanently`` (KEP-5322 design), any
  other is retried with capped jittered backoff;
* a pod that ended (Succeeded/Failed) or was deleted releases its claims; a claim no
  pod needs is unprepared and kept as a tombstone so the ended pod's status still
  receives its devices' health (post-mortem);
* the status writer: health changes and pod events mark pods dirty (a coalescing set,
  never dropped); the writer recomputes each dirty pod's status with the
  :class:`~drahealth.core._status.StatusBuilder` and sends a merge patch only when it
  differs, up to ``STATUS_WRITERS`` pods at once.

* the node: registration, conditions and Lease heartbeats
  (:class:`~drahealth.node._nodestatus.NodeRegistrar`), with the ``/containerLogs``
  endpoint (:class:`~drahealth.node._logserver.ContainerLogServer`) whose port the Node
  records;
* the containers: once its claims are prepared a pod's containers run in the simulated
  runtime (:class:`~drahealth.node._pods.PodRun`: init containers, restarts, phase
  Succeeded/Failed), with the environment the driver's CDI specs inject; a pod with a
  ``deletionTimestamp`` gets SIGTERM and ``deletionGracePeriodSeconds`` before it is
  killed, its final status written and the pod deleted.

It does not allocate (claims must already carry ``status.allocation``) and does not
check ``status.reservedFor``. Knows nothing of plugin sockets (the registry does).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from drahealth._aio import cancel_and_wait
from drahealth.core import (
    CLAIM_PREFIX,
    ClaimInfo,
    HealthChange,
    PreparedDeviceInfo,
    StatusBuilder,
    extended_resource_claim,
    resolve_claim_name,
)
from drahealth.kube import Backoff, Reflector, patch_status
from drahealth.node._claims import ClaimTracker
from drahealth.node._events import (
    REASON_PREPARE_FAILED,
    REASON_PREPARE_FAILED_PERMANENT,
    EventRecorder,
)
from drahealth.node._logserver import ContainerLogServer
from drahealth.node._nodestatus import NodeRegistrar
from drahealth.node._pipeline import HealthPipeline
from drahealth.node._pods import BACKOFF, CDI_DIRS, PodRun, cdi_env, pod_env
from drahealth.node._registry import PluginRegistry

__all__ = ["POD_STATUS_PATCH", "KubeletMode"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
#: How pod status is written: a strategic merge patch, as the kubelet's status manager
#: sends it. ``status.conditions`` merge by ``type`` there, so a condition set by someone
#: else between the agent's last read and its write (the device-taint eviction
#: controller's ``DisruptionTarget``) stays; a JSON merge patch would replace the list
#: and drop it, and a Job's podFailurePolicy would then count the eviction as a failure.
POD_STATUS_PATCH = PatchType.STRATEGIC
_ENDED = ("Succeeded", "Failed")
#: Pod status patches in flight at once.
STATUS_WRITERS = 16


class _Retry(Exception):
    """Prepare cannot finish yet; try again later (message says why)."""


class _Permanent(Exception):
    """The driver classified a prepare error as permanent."""


class KubeletMode:
    """Pod lifecycle and status writing for one node (see the module docstring)."""

    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        registry: PluginRegistry,
        tracker: ClaimTracker,
        pipeline: HealthPipeline,
        builder: StatusBuilder,
        events: EventRecorder,
        *,
        resync_interval: float = 60.0,
        retry_initial: float = 0.2,
        retry_max: float = 10.0,
        on_status_written: Callable[[float], None] | None = None,
        cdi_dirs: Sequence[str] = CDI_DIRS,
        kube_version: str = "",
        storage_dir: str = ".",
        restart_backoff: tuple[float, float] = BACKOFF,
        heartbeat: tuple[float, float] = (10.0, 300.0),
    ) -> None:
        self.client = client
        self.node = node_name
        self.registry = registry
        self.tracker = tracker
        self.pipeline = pipeline
        self.builder = builder
        self.events = events
        self.resync_interval = resync_interval
        self._retry = (retry_initial, retry_max)
        self._on_status_written = on_status_written
        self.pods: Reflector[Pod] = Reflector(
            client, Pod, fields={"spec.nodeName": node_name}, name=f"pods-on-{node_name}"
        )
        self._by_uid: dict[str, tuple[str, str]] = {}
        self._sync_dirty: set[str] = set()
        self._status_dirty: dict[str, float] = {}  # pod uid -> clock of the oldest change
        self._sync_wake = asyncio.Event()
        self._status_wake = asyncio.Event()
        self._backoff: dict[str, Backoff] = {}
        self._not_before: dict[str, float] = {}
        self._inflight: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._pod_tasks: set[asyncio.Task[None]] = set()
        self.status_patches = 0
        self.prepare_failures = 0
        self.cdi_dirs = tuple(cdi_dirs)
        self.restart_backoff = restart_backoff
        self.runs: dict[str, PodRun] = {}
        self._terminating: set[str] = set()
        self.log_server = ContainerLogServer(self.container_log)
        self._heartbeat = heartbeat
        self._kube_version = kube_version or "1.0"
        self._storage_dir = storage_dir
        self.registrar: NodeRegistrar | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        await self.log_server.start()
        self.registrar = NodeRegistrar(
            self.client,
            self.node,
            kubelet_port=self.log_server.port,
            kube_version=self._kube_version,
            storage_dir=self._storage_dir,
            lease_renew=self._heartbeat[0],
            status_report=self._heartbeat[1],
        )
        await self.registrar.start()
        self.pods.add_handler(self._on_pod_event)
        self.pipeline.add_listener(self._on_health_changes)
        await self.pods.start()
        await self.pods.wait_synced(timeout=30)
        # Pods that disappeared while the agent was down: release their claims.
        live = {self._uid(p) for p in self.pods.store.list()}
        for tracked in self.tracker.claims():
            for pod_uid in list(tracked.live - live):
                self._sync_dirty.add(pod_uid)
        self._tasks = [
            asyncio.create_task(self._sync_loop(), name="kubelet-sync"),
            asyncio.create_task(self._status_loop(), name="kubelet-status"),
            asyncio.create_task(self._resync_loop(), name="kubelet-resync"),
        ]
        self._mark_all()

    async def stop(self) -> None:
        await cancel_and_wait([*self._tasks, *self._pod_tasks])
        self._tasks = []
        for run in list(self.runs.values()):
            await run.kill()
        if self.registrar is not None:
            await self.registrar.stop()
        await self.log_server.stop()
        await self.pods.stop()
        await self.events.drain()

    def container_log(self, namespace: str, pod: str, container: str, previous: bool) -> bytes:
        """A container's output (the ``/containerLogs`` source)."""
        found = self.pods.store.get(namespace, pod)
        run = self.runs.get(self._uid(found)) if found is not None else None
        if run is None:
            raise LookupError(f'pod "{pod}" in namespace "{namespace}" has no containers '
                              "running on this node")  # fmt: skip
        return run.logs(container, previous)

    # -- inputs ------------------------------------------------------------------

    @staticmethod
    def _uid(pod: Pod) -> str:
        return str(pod.metadata.uid) if pod.metadata and pod.metadata.uid else ""

    def _on_pod_event(self, event_type: str, pod: Pod, old: Pod | None) -> None:
        uid = self._uid(pod)
        if not uid or pod.metadata is None:
            return
        self._by_uid[uid] = (pod.metadata.namespace or "default", pod.metadata.name or "")
        self._sync_dirty.add(uid)
        self._sync_wake.set()

    def _on_health_changes(self, changes: list[HealthChange]) -> None:
        pods = self.tracker.pods_for(c.key for c in changes)
        now = time.monotonic()
        for uid in pods:
            self._status_dirty.setdefault(uid, now)
        if pods:
            self._status_wake.set()
        for change in changes:
            if change.old is change.new:
                continue
            for uid in self.tracker.pods_for([change.key]):
                pod = self._pod_dict(uid)
                if pod is not None:
                    self.events.device_health(pod, change)

    def _mark_all(self) -> None:
        now = time.monotonic()
        for pod in self.pods.store.list():
            uid = self._uid(pod)
            if not uid or pod.metadata is None:
                continue
            self._by_uid.setdefault(
                uid, (pod.metadata.namespace or "default", pod.metadata.name or "")
            )
            self._sync_dirty.add(uid)
            self._status_dirty.setdefault(uid, now)
        self._sync_wake.set()
        self._status_wake.set()

    def _pod_dict(self, uid: str) -> JSON | None:
        ref = self._by_uid.get(uid)
        if ref is None:
            return None
        pod = self.pods.store.get(*ref)
        if pod is None or self._uid(pod) != uid:
            return None
        data: JSON = pod.to_dict()
        return data

    # -- pod sync ----------------------------------------------------------------

    async def _sync_loop(self) -> None:
        while True:
            await self._sync_wake.wait()
            self._sync_wake.clear()
            now = time.monotonic()
            for uid in list(self._sync_dirty):
                if uid in self._inflight:
                    continue  # picked up again when that sync ends
                if self._not_before.get(uid, 0.0) > now:
                    continue
                self._sync_dirty.discard(uid)
                self._inflight.add(uid)
                task = asyncio.create_task(self._sync_pod(uid), name=f"sync-pod-{uid}")
                self._pod_tasks.add(task)
                task.add_done_callback(self._pod_tasks.discard)

    async def _sync_pod(self, uid: str) -> None:
        try:
            pod = self._pod_dict(uid)
            if pod is None:
                await self._release_pod(uid, deleted=True)
            elif (pod.get("status") or {}).get("phase") in _ENDED:
                await self._release_pod(uid, deleted=False)
                self._mark_status(uid)
                if (pod.get("metadata") or {}).get("deletionTimestamp"):
                    await self._delete_pod(pod)
            elif (pod.get("metadata") or {}).get("deletionTimestamp"):
                self._start_termination(uid, pod)
            else:
                await self._run_pod(pod)
            self._backoff.pop(uid, None)
            self._not_before.pop(uid, None)
        except _Retry as exc:
            self._schedule_retry(uid, str(exc))
        except _Permanent:
            self._backoff.pop(uid, None)  # the pod is Failed now: no retry
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("syncing pod %s failed", uid)
            self._schedule_retry(uid, f"{type(exc).__name__}: {exc}")
        finally:
            self._inflight.discard(uid)
            if uid in self._sync_dirty:
                self._sync_wake.set()

    def _schedule_retry(self, uid: str, why: str) -> None:
        backoff = self._backoff.setdefault(uid, Backoff(*self._retry))
        delay = backoff.next()
        log.info("pod %s: %s; retrying in %.2fs", uid, why, delay)
        self._not_before[uid] = time.monotonic() + delay
        self._sync_dirty.add(uid)
        loop = asyncio.get_running_loop()
        loop.call_later(delay, self._sync_wake.set)

    async def _release_pod(self, uid: str, *, deleted: bool) -> None:
        for tracked in self.tracker.claims_of_pod(uid):
            if self.tracker.release(tracked.info.uid, uid):
                await self._unprepare(tracked.info)
                self.tracker.unprepared(tracked.info.uid)
        if deleted:
            run = self.runs.pop(uid, None)
            if run is not None:
                await run.kill()
            self.tracker.forget_pod(uid)
            self._by_uid.pop(uid, None)
            self._status_dirty.pop(uid, None)

    async def _unprepare(self, info: ClaimInfo) -> None:
        ref = (info.namespace, info.name, info.uid)
        for driver in sorted({d.driver for d in info.devices}):
            try:
                errors = await self.registry.dra_client(driver).unprepare([ref])
            except LookupError as exc:
                raise _Retry(f"unprepare {info.namespace}/{info.name}: {exc}") from exc
            error = errors.get(info.uid, "")
            if error:
                raise _Retry(f"unprepare {info.namespace}/{info.name} by {driver}: {error}")

    async def _run_pod(self, pod: JSON) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        namespace = str(meta.get("namespace") or "default")
        prepared = {c.info.uid for c in self.tracker.claims_of_pod(uid)}
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = resolve_claim_name(pod, ref.get("name", ""))
            if name is None:
                raise _Retry(f"claim {ref.get('name')!r} has no ResourceClaim name yet")
            await self._prepare_claim(pod, namespace, name, prepared)
        special = extended_resource_claim(pod)
        if special is not None:  # the scheduler's claim for extended resources (KEP-5004)
            await self._prepare_claim(pod, namespace, special.name, prepared)
        if uid not in self.runs:
            run = PodRun(
                pod,
                lambda c: self._container_env(pod, c),
                lambda: self._mark_status(uid),
                backoff=self.restart_backoff,
            )
            self.runs[uid] = run
            run.start()
        self._mark_status(uid)

    def _container_env(self, pod: JSON, container: JSON) -> dict[str, str]:
        """The container's environment: its own, then what the CDI specs of its claims'
        devices inject (only the requests it names, when it names one)."""
        env = pod_env(pod, container)
        namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
        ids: list[str] = []
        for ref in (container.get("resources") or {}).get("claims") or []:
            name = resolve_claim_name(pod, str(ref.get("name", "")))
            info = self.tracker.lookup(namespace, name) if name else None
            if info is None:
                continue
            request = ref.get("request")
            for device in info.devices:
                if (
                    request
                    and request not in device.request_names
                    and not any(r.split("/", 1)[0] == request for r in device.request_names)
                ):
                    continue
                ids.extend(device.cdi_device_ids)
        special = extended_resource_claim(pod)
        info = self.tracker.lookup(namespace, special.name) if special is not None else None
        if special is not None and info is not None:
            cname = str(container.get("name") or "")
            wanted = {r for res in special.resources(cname) for r in special.requests[(cname, res)]}
            for device in info.devices:
                if wanted & set(device.request_names):
                    ids.extend(device.cdi_device_ids)
        env.update(cdi_env(self.cdi_dirs, ids))
        return env

    def _start_termination(self, uid: str, pod: JSON) -> None:
        """A pod marked for deletion: SIGTERM, the grace period, the final status, then
        the pod is deleted (as the kubelet does once its containers are gone)."""
        if uid in self._terminating:
            return
        self._terminating.add(uid)
        meta = pod.get("metadata") or {}
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)

        async def terminate() -> None:
            run = self.runs.get(uid)
            if run is not None:
                await run.terminate(float(grace or 0))
                await self._write_status(uid, time.monotonic())
            else:
                await self._delete_pod(pod)

        task = asyncio.create_task(terminate(), name=f"terminate-{uid}")
        self._pod_tasks.add(task)
        task.add_done_callback(self._pod_tasks.discard)

    async def _delete_pod(self, pod: JSON) -> None:
        meta = pod.get("metadata") or {}
        try:
            await self.client.delete(
                Pod, str(meta.get("name")), namespace=meta.get("namespace"), grace_period=0
            )
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    async def _prepare_claim(
        self, pod: JSON, namespace: str, name: str, prepared: set[str]
    ) -> None:
        uid = str((pod.get("metadata") or {}).get("uid"))
        try:
            claim = await self.client.get(ResourceClaim, name, namespace=namespace)
        except ApiError as exc:
            raise _Retry(f"ResourceClaim {namespace}/{name}: {exc.status.message}") from exc
        claim_uid = str(claim.metadata.uid) if claim.metadata else ""
        if claim_uid in prepared:
            return
        allocation = claim.status.allocation if claim.status else None
        if allocation is None or allocation.devices is None:
            raise _Retry(f"ResourceClaim {namespace}/{name} is not allocated")
        drivers = sorted({r.driver for r in allocation.devices.results or []})
        devices: list[PreparedDeviceInfo] = []
        for driver in drivers:
            try:
                client = self.registry.dra_client(driver)
            except LookupError as exc:
                self._prepare_failed(pod, name, str(exc), permanent=False)
                raise _Retry(str(exc)) from exc
            replies = await client.prepare([(namespace, name, claim_uid)])
            reply = replies.get(claim_uid)
            if reply is None:
                msg = f"driver {driver} did not answer for claim {namespace}/{name}"
                self._prepare_failed(pod, name, msg, permanent=False)
                raise _Retry(msg)
            if reply.error:
                self._prepare_failed(pod, name, reply.error, permanent=reply.permanent)
                if reply.permanent:
                    await self._set_failed(pod, name, driver, reply.error)
                    raise _Permanent(reply.error)
                raise _Retry(f"prepare {namespace}/{name} by {driver}: {reply.error}")
            devices.extend(reply.devices)
        info = ClaimInfo(namespace, name, claim_uid, tuple(devices))
        self.tracker.add(info, uid)
        prepared.add(claim_uid)

    def _prepare_failed(self, pod: JSON, claim: str, error: str, *, permanent: bool) -> None:
        self.prepare_failures += 1
        kind = "permanent" if permanent else "transient, will retry"
        message = f"prepare of claim {claim} failed ({kind}): {error}"
        self.events.pod_event(pod, "Warning", REASON_PREPARE_FAILED, message)

    async def _set_failed(self, pod: JSON, claim: str, driver: str, error: str) -> None:
        meta = pod.get("metadata") or {}
        message = f"driver {driver} reported a permanent error preparing claim {claim}: {error}"
        await patch_status(
            self.client,
            Pod,
            str(meta.get("name")),
            {**_uid_precondition(pod),
             "status": {"phase": "Failed", "reason": REASON_PREPARE_FAILED_PERMANENT,
                        "message": message}},
            namespace=meta.get("namespace"),
        )  # fmt: skip

    # -- status writer -----------------------------------------------------------

    def _mark_status(self, uid: str) -> None:
        self._status_dirty.setdefault(uid, time.monotonic())
        self._status_wake.set()

    async def _status_loop(self) -> None:
        while True:
            await self._status_wake.wait()
            self._status_wake.clear()
            batch, self._status_dirty = self._status_dirty, {}
            # pods are independent: write up to STATUS_WRITERS of them at once, so the
            # last of a burst (a lease ending for many devices) is not a queue behind
            limit = asyncio.Semaphore(STATUS_WRITERS)
            await asyncio.gather(
                *(self._write_one(uid, since, limit) for uid, since in batch.items())
            )

    async def _write_one(self, uid: str, since: float, limit: asyncio.Semaphore) -> None:
        async with limit:
            try:
                await self._write_status(uid, since)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("writing status of pod %s failed: %s", uid, exc)
                self._status_dirty.setdefault(uid, since)
                asyncio.get_running_loop().call_later(0.5, self._status_wake.set)

    async def _write_status(self, uid: str, since: float) -> None:
        pod = self._pod_dict(uid)
        if pod is None:
            return
        status = pod.get("status") or {}
        run = self.runs.get(uid)
        if run is None:
            if not status.get("containerStatuses") and not status.get("initContainerStatuses"):
                return  # not started yet: the pod's run writes the first status
            desired = dict(status)
        else:
            own = run.status()
            # conditions the kubelet does not own (DisruptionTarget set by an eviction,
            # a scheduler's or a controller's) stay, as upstream's status manager keeps them
            mine = {c.get("type") for c in own.get("conditions") or []}
            others = [
                c for c in status.get("conditions") or []
                if isinstance(c, dict) and c.get("type") not in mine
            ]  # fmt: skip
            if others:
                own["conditions"] = [*(own.get("conditions") or []), *others]
            _keep_other_entries(own, status)
            desired = {**status, **own}
        draft = {**pod, "status": desired}
        desired.update(self.builder.apply(draft, self.tracker.lookup, self.pipeline.cache.get))
        patch = {k: v for k, v in desired.items() if v != status.get(k)}
        if not patch:
            return
        meta = pod.get("metadata") or {}
        await patch_status(
            self.client, Pod, str(meta.get("name")), {**_uid_precondition(pod), "status": patch},
            namespace=meta.get("namespace"), patch_type=POD_STATUS_PATCH,
        )  # fmt: skip
        self.status_patches += 1
        if self._on_status_written is not None:
            self._on_status_written(time.monotonic() - since)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.resync_interval)
            self._mark_all()


def _keep_other_entries(own: JSON, status: Mapping[str, Any]) -> None:
    """Carry the ``allocatedResourcesStatus`` entries this agent does not compute (a
    device plugin's, named by its extended resource) from the pod's current status into
    ``own``'s container statuses, in front, as the kubelet keeps its device manager's
    entries beside the DRA manager's; the status builder then recomputes only the
    ``claim:`` entries."""
    for key in ("containerStatuses", "initContainerStatuses"):
        current = status.get(key)
        if not isinstance(current, list) or not isinstance(own.get(key), list):
            continue
        theirs: dict[str, list[Any]] = {}
        for cs in current:
            if not isinstance(cs, Mapping) or not isinstance(cs.get("name"), str):
                continue
            entries = cs.get("allocatedResourcesStatus")
            kept = [
                e for e in entries if isinstance(e, Mapping) and isinstance(e.get("name"), str)
                and not e["name"].startswith(CLAIM_PREFIX)
            ] if isinstance(entries, list) else []  # fmt: skip
            if kept:
                theirs.setdefault(cs["name"], kept)
        for cs in own[key]:
            carried = theirs.get(str(cs.get("name"))) if isinstance(cs, dict) else None
            if carried:
                mine = cs.get("allocatedResourcesStatus") or []
                cs["allocatedResourcesStatus"] = [*carried, *mine]


def _uid_precondition(pod: Mapping[str, Any]) -> JSON:
    """``metadata.uid`` of the pod a status was computed for, sent with the patch as the
    kubelet's status manager sends it: a pod deleted and created again under the same
    name (a StatefulSet's) between the agent's read and its write has another uid, and
    the API server refuses the patch (uid is immutable) instead of giving the new pod the
    old one's status (its phase Failed, its containers' last states)."""
    uid = (pod.get("metadata") or {}).get("uid")
    return {"metadata": {"uid": uid}} if uid else {}


def claims_by_pod(tracker: ClaimTracker) -> Mapping[str, list[str]]:
    """Pod UID -> names of the live claims prepared for it (for views and tests)."""
    out: dict[str, list[str]] = {}
    for tracked in tracker.claims():
        for pod in tracked.live:
            out.setdefault(pod, []).append(tracked.info.name)
    return out
