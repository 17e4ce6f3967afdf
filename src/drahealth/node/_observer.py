"""Observer mode: the agent beside a real kubelet.

Owns the device -> pods map read from the kubelet's PodResources API (``List``,
polled), and what the observer publishes for health changes: Pod Events, metrics
(through the pipeline listeners) and post-mortem records, a ConfigMap per node
(``drahealth-health-<node>``) whose data key ``<namespace>.<pod>`` holds that pod's
recent device-health transitions as JSON. It never writes ``allocatedResourcesStatus``
(the kubelet owns it).

Pods that leave the PodResources list (they ended) are kept in a bounded tombstone
map, so a device report that arrives after a pod terminated is still recorded in its
post-mortem record (upstream loses it). PodResources names pods but carries no UID, so
the UID of each pod that uses a device is looked up in the API once: Events without
it do not show in ``kubectl describe pod``. The post-mortem ConfigMap is read back at
start (an agent restart keeps each pod's history) and bounded in pods and bytes; keys
of pods evicted from it are deleted. An unreachable PodResources socket is logged
once per distinct error, and again when ``List`` works again; it never stops the agent.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Pod
from lightkube.types import PatchType

from drahealth import api
from drahealth._aio import cancel_and_wait
from drahealth._time import now_rfc3339
from drahealth.core import ChangeReason, DeviceKey, Health, HealthChange
from drahealth.kube import is_not_found, write_configmap_data
from drahealth.node._events import (
    EventRecorder,
)
from drahealth.node._pipeline import HealthPipeline

if TYPE_CHECKING:
    from drahealth.node._config import AgentConfig

__all__ = ["ObserverMode", "PodDeviceMap", "PodRef", "configmap_name"]

log = logging.getLogger(__name__)

#: Transitions kept per pod, pods kept per node, and the bytes all pods' records may
#: take, in the post-mortem ConfigMap (a ConfigMap holds at most 1 MiB).
RECORDS_PER_POD = 20
PODS_PER_NODE = 500
RECORD_BYTES = 768 * 1024

#: Seconds one PodResources ``List`` or one pod UID lookup may take.
CALL_TIMEOUT = 5.0


def configmap_name(node: str) -> str:
    return f"drahealth-health-{node}"


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    namespace: str
    name: str


class PodDeviceMap:
    """Device -> pods, rebuilt from each PodResources ``List`` answer, with tombstones.

    Entries that name no pod, or a claim device without driver, pool or device name,
    are skipped: they cannot be matched to a health report.
    """

    def __init__(self, max_tombstones: int = 1024) -> None:
        if max_tombstones < 0:
            raise ValueError(f"max_tombstones must be >= 0, not {max_tombstones}")
        self.max_tombstones = max_tombstones
        self.live: dict[PodRef, dict[DeviceKey, str]] = {}  # pod -> device -> claim
        self.tombstones: OrderedDict[PodRef, dict[DeviceKey, str]] = OrderedDict()

    def replace(self, response: Any) -> None:
        """Apply a ``ListPodResourcesResponse``."""
        live: dict[PodRef, dict[DeviceKey, str]] = {}
        for pod in response.pod_resources:
            if not pod.name:
                continue
            ref = PodRef(pod.namespace or "default", pod.name)
            devices = live.setdefault(ref, {})
            for container in pod.containers:
                for dyn in container.dynamic_resources:
                    for res in dyn.claim_resources:
                        if not (res.driver_name and res.pool_name and res.device_name):
                            continue  # an incomplete entry names no device
                        key = DeviceKey(res.driver_name, res.pool_name, res.device_name)
                        devices[key] = dyn.claim_name
        for ref in self.live.keys() - live.keys():
            self.tombstones[ref] = self.live[ref]
            self.tombstones.move_to_end(ref)
        for ref in live:
            self.tombstones.pop(ref, None)
        while len(self.tombstones) > self.max_tombstones:
            self.tombstones.popitem(last=False)
        self.live = live

    def pods_for(self, key: DeviceKey) -> list[tuple[PodRef, str, bool]]:
        """(pod, claim name, ended) for every pod using ``key``."""
        out = [(ref, devs[key], False) for ref, devs in self.live.items() if key in devs]
        out += [(ref, devs[key], True) for ref, devs in self.tombstones.items() if key in devs]
        return sorted(out)


class ObserverMode:
    """See the module docstring."""

    def __init__(
        self,
        config: AgentConfig,
        client: AsyncClient | None,
        pipeline: HealthPipeline,
        events: EventRecorder,
    ) -> None:
        self.config = config
        self.client = client
        self.pipeline = pipeline
        self.events = events
        self.map = PodDeviceMap()
        #: pod key -> its transitions, least recently changed pod first
        self.records: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        #: UIDs of pods that use devices (live or ended), from the API
        self.uids: dict[PodRef, str] = {}
        self._evicted: set[str] = set()
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._channel: grpc.aio.Channel | None = None
        self.lists = 0
        self.list_errors = 0
        self.last_error: str | None = None

    async def start(self) -> None:
        await self._load_records()
        self._channel = grpc.aio.insecure_channel(f"unix:{self.config.podresources_socket}")
        self.pipeline.add_listener(self._on_changes)
        await self.refresh()
        self._tasks = [
            asyncio.create_task(self._poll_loop(), name="podresources-poll"),
            asyncio.create_task(self._flush_loop(), name="postmortem-flush"),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
        if self._dirty.is_set():
            try:
                await self._flush()
            except Exception as exc:
                log.warning("writing post-mortem records at exit failed: %s", exc)
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        await self.events.drain()

    async def refresh(self) -> None:
        """One PodResources ``List``; errors are kept in :attr:`last_error`."""
        assert self._channel is not None
        stub = api.podresources_v1_grpc.PodResourcesListerStub(self._channel)
        try:
            resp = await stub.List(
                api.podresources_v1.ListPodResourcesRequest(), timeout=CALL_TIMEOUT
            )
        except grpc.aio.AioRpcError as exc:
            self.list_errors += 1
            error = (
                f"PodResources List failed: {exc.code().name}: {exc.details()} "
                f"(socket {self.config.podresources_socket})"
            )
            if error != self.last_error:
                log.warning("%s; retrying every %gs", error, self.config.podresources_interval)
            self.last_error = error
            return
        if self.last_error is not None:
            log.info("PodResources List works again after %d failures", self.list_errors)
        self.lists += 1
        self.list_errors = 0
        self.last_error = None
        known = self.map.live.keys() | self.map.tombstones.keys()
        self.map.replace(resp)
        await self._resolve_uids()
        self._record_arrivals([ref for ref in self.map.live if ref not in known])

    def _record_arrivals(self, arrivals: list[PodRef]) -> None:
        """Record pods that first show up on a device that is already Unhealthy.

        A health report reaches the observer at once, the pod list only at the next
        ``List``: a pod that starts on a failed device, or whose device failed between
        two polls, would otherwise get no Event and no record. Such a pod gets the
        transition from Unknown (it had no device health before), unless its record
        already ends with the same health and message for that device (an agent
        restart reads the records back).
        """
        stamp = now_rfc3339()
        for ref in sorted(arrivals):
            for key, claim in sorted(self.map.live[ref].items()):
                health, message = self.pipeline.cache.get(key.driver, key.pool, key.device)
                if health is not Health.UNHEALTHY:
                    continue
                rows = self.records.get(f"{ref.namespace}.{ref.name}", [])
                last = next((r for r in reversed(rows) if r.get("device") == str(key)), None)
                if last and last.get("health") == health.value and last.get("message") == message:
                    continue
                change = HealthChange(key, Health.UNKNOWN, health, message, ChangeReason.REPORT)
                self._record(ref, claim, False, change, stamp)

    async def _resolve_uids(self) -> None:
        """Look up the UID of each live pod that uses a device and has none known yet."""
        users = {ref for ref, devs in self.map.live.items() if devs}
        for ref in list(self.uids):
            if ref not in users and ref not in self.map.tombstones:
                del self.uids[ref]
        if self.client is None:
            return
        for ref in sorted(users - self.uids.keys()):
            try:
                async with asyncio.timeout(CALL_TIMEOUT):
                    obj = await self.client.get(Pod, ref.name, namespace=ref.namespace)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # retried at the next List
                log.debug("looking up pod %s/%s failed: %s", ref.namespace, ref.name, exc)
                continue
            uid = obj.metadata.uid if obj.metadata is not None else None
            if uid:
                self.uids[ref] = uid

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.podresources_interval)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("PodResources refresh failed")

    def _on_changes(self, changes: list[HealthChange]) -> None:
        stamp = now_rfc3339()
        for change in changes:
            if change.old is change.new and change.reason != "report":
                continue
            for ref, claim, ended in self.map.pods_for(change.key):
                self._record(ref, claim, ended, change, stamp)

    def _record(
        self, ref: PodRef, claim: str, ended: bool, change: HealthChange, stamp: str
    ) -> None:
        """Append ``change`` to the pod's record; a transition also gets an Event."""
        record = {
            "time": stamp,
            "device": str(change.key),
            "claim": claim,
            "from": change.old.value,
            "health": change.new.value,
            "message": change.message,
            "podEnded": ended,
        }
        key = f"{ref.namespace}.{ref.name}"
        rows = self.records.pop(key, [])
        self.records[key] = rows  # now the most recently changed
        rows.append(record)
        del rows[:-RECORDS_PER_POD]
        self._evicted.discard(key)
        self._dirty.set()
        if change.old is not change.new:
            meta = {"name": ref.name, "namespace": ref.namespace}
            if ref in self.uids:
                meta["uid"] = self.uids[ref]
            self.events.device_health({"metadata": meta}, change)

    def _encoded(self) -> dict[str, str]:
        """The ConfigMap data, after evicting the least recently changed pods past the bounds."""
        data = {k: json.dumps(v, ensure_ascii=False) for k, v in self.records.items()}
        size = sum(len(k) + len(v.encode()) for k, v in data.items())
        for key in list(self.records):
            if len(data) <= PODS_PER_NODE and size <= RECORD_BYTES:
                break
            del self.records[key]
            size -= len(key) + len(data.pop(key).encode())
            self._evicted.add(key)
        return dict(sorted(data.items()))

    async def _load_records(self) -> None:
        """Seed :attr:`records` from the ConfigMap a previous run wrote."""
        if self.client is None:
            return
        name = configmap_name(self.config.node_name)
        ns = self.config.postmortem_namespace
        try:
            cm = await self.client.get(ConfigMap, name, namespace=ns)
        except Exception as exc:
            if not is_not_found(exc):
                log.warning("reading post-mortem records %s/%s failed: %s", ns, name, exc)
            return
        loaded: list[tuple[str, list[dict[str, Any]]]] = []
        for key, text in (cm.data or {}).items():
            try:
                rows = json.loads(text)
            except ValueError:
                rows = None
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                log.warning(
                    "post-mortem record %r in %s/%s is not a JSON list of objects; "
                    "it is replaced at the pod's next transition",
                    key,
                    ns,
                    name,
                )
                continue
            loaded.append((key, rows[-RECORDS_PER_POD:]))
        loaded.sort(key=lambda kv: str(kv[1][-1].get("time", "")) if kv[1] else "")
        for key, rows in loaded:
            self.records[key] = rows

    async def _flush_loop(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(0.2)  # coalesce bursts into one write
            try:
                await self._flush()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("writing post-mortem records failed: %s", exc)
                self._dirty.set()  # keep them for the next try
                await asyncio.sleep(1.0)

    async def _flush(self) -> None:
        self._dirty.clear()
        if self.client is None:
            return
        name = configmap_name(self.config.node_name)
        ns = self.config.postmortem_namespace
        data = self._encoded()
        evicted = sorted(self._evicted)
        labels = {"app.kubernetes.io/managed-by": "drahealth-agent"}
        await write_configmap_data(self.client, name, ns, data, labels)
        if evicted:
            gone: dict[str, Any] = {"data": dict.fromkeys(evicted)}  # null deletes the key
            await self.client.patch(ConfigMap, name, gone, namespace=ns, patch_type=PatchType.MERGE)
            self._evicted.difference_update(evicted)
