"""Observer mode: the agent beside a real kubelet.

Owns the device -> pods map read from the kubelet's PodResources API (``List``,
polled), and what the observer publishes for health changes: Pod Events, metrics
(through the pipeline listeners) and post-mortem records, a ConfigMap per node
(``drahealth-health-<node>``) whose data key ``<namespace>.<pod>`` holds that pod's
recent device-health transitions as JSON. It never writes ``allocatedResourcesStatus``
(the kubelet owns it).

Pods that leave the PodResources list (they ended) are kept in a bounded tombstone
map, so a device report that arrives after a pod terminated is still recorded in its
post-mortem record (upstream loses it).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from lightkube import AsyncClient

from drahealth import api
from drahealth._aio import cancel_and_wait
from drahealth.core import DeviceKey
from drahealth.core._records import HealthChange
from drahealth.kube import write_configmap_data
from drahealth.node._events import (
    EventRecorder,
)
from drahealth.node._pipeline import HealthPipeline

if TYPE_CHECKING:
    from drahealth.node._agent import AgentConfig

__all__ = ["ObserverMode", "PodDeviceMap", "PodRef", "configmap_name"]

log = logging.getLogger(__name__)

#: Transitions kept per pod, and pods kept per node, in the post-mortem ConfigMap.
RECORDS_PER_POD = 20
PODS_PER_NODE = 500


def configmap_name(node: str) -> str:
    return f"drahealth-health-{node}"


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    namespace: str
    name: str


class PodDeviceMap:
    """Device -> pods, rebuilt from each PodResources ``List`` answer, with tombstones."""

    def __init__(self, max_tombstones: int = 1024) -> None:
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
        self.records: dict[str, list[dict[str, Any]]] = {}
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._channel: grpc.aio.Channel | None = None
        self.lists = 0
        self.list_errors = 0
        self.last_error: str | None = None

    async def start(self) -> None:
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
            with contextlib.suppress(Exception):
                await self._flush()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        await self.events.drain()

    async def refresh(self) -> None:
        """One PodResources ``List``; errors are kept in :attr:`last_error`."""
        assert self._channel is not None
        stub = api.podresources_v1_grpc.PodResourcesListerStub(self._channel)
        try:
            resp = await stub.List(api.podresources_v1.ListPodResourcesRequest(), timeout=5)
        except grpc.aio.AioRpcError as exc:
            self.list_errors += 1
            self.last_error = f"PodResources List failed: {exc.code().name}: {exc.details()}"
            log.warning("%s", self.last_error)
            return
        self.lists += 1
        self.last_error = None
        self.map.replace(resp)

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.podresources_interval)
            await self.refresh()

    def _on_changes(self, changes: list[HealthChange]) -> None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for change in changes:
            if change.old is change.new and change.reason != "report":
                continue
            for ref, claim, ended in self.map.pods_for(change.key):
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
                rows = self.records.setdefault(key, [])
                rows.append(record)
                del rows[:-RECORDS_PER_POD]
                self._dirty.set()
                if change.old is not change.new:
                    pod = {"metadata": {"name": ref.name, "namespace": ref.namespace}}
                    self.events.device_health(pod, change)
        while len(self.records) > PODS_PER_NODE:
            self.records.pop(next(iter(self.records)))

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
                await asyncio.sleep(1.0)

    async def _flush(self) -> None:
        self._dirty.clear()
        if self.client is None:
            return
        name = configmap_name(self.config.node_name)
        ns = self.config.postmortem_namespace
        data = {k: json.dumps(v, ensure_ascii=False) for k, v in sorted(self.records.items())}
        labels = {"app.kubernetes.io/managed-by": "drahealth-agent"}
        await write_configmap_data(self.client, name, ns, data, labels)
