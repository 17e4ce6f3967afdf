"""The node's device-health record in the API: one ConfigMap per node.

Owns :class:`DeviceHealthPublisher`, a pipeline listener that keeps the ConfigMap
``drahealth-devices-<node>`` equal to the agent's health cache, in the record format the
core's codec defines for all readers (names, labels, data key ``devices``: a JSON list of
``{"driver", "pool", "device", "health", "message", "since"}`` sorted by device, with
``since`` the unix time of the last change). Bursts of changes are coalesced into one
write. Pod status only shows devices that a pod uses; this record shows every device,
so the remediation controller can see a tainted device recover after its pods were
evicted, and operators can list a node's bad devices.

Bounded: past :data:`MAX_DEVICES` entries, Healthy devices are left out first (the
``omittedHealthy`` key counts them), keeping the object well under 1 MiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from lightkube import AsyncClient

from drahealth.core import (
    LABELS,
    DeviceKey,
    Health,
    HealthCache,
    HealthChange,
    HealthRow,
    encode_devices,
    record_labels,
    record_name,
)
from drahealth.kube import write_configmap_data

__all__ = ["COMPONENT_LABEL", "DeviceHealthPublisher", "devices_configmap_name"]

log = logging.getLogger(__name__)

COMPONENT_LABEL: Final = ("app.kubernetes.io/component", LABELS["app.kubernetes.io/component"])
MAX_DEVICES: Final = 4000


def devices_configmap_name(node: str) -> str:
    return record_name(node)


class DeviceHealthPublisher:
    """Writes the cache to the node's ConfigMap after changes (coalesced)."""

    def __init__(
        self,
        client: AsyncClient,
        cache: HealthCache,
        node: str,
        *,
        namespace: str = "default",
        coalesce: float = 0.05,
    ) -> None:
        self.client = client
        self.cache = cache
        self.node = node
        self.namespace = namespace
        self.coalesce = coalesce
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.writes = 0
        self.failures = 0

    def on_changes(self, changes: list[HealthChange]) -> None:
        if changes:
            self._dirty.set()

    async def start(self) -> None:
        self._dirty.set()  # publish the restored state once
        self._task = asyncio.create_task(self._loop(), name="device-health-publisher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def snapshot(self) -> dict[str, str]:
        """The ConfigMap data for the cache as it is now."""
        rows: list[HealthRow] = []
        entries = self.cache.entries()
        omitted = 0
        if len(entries) > MAX_DEVICES:
            bad = [e for e in entries if e.health is not Health.HEALTHY]
            omitted = len(entries) - len(bad)
            entries = bad[:MAX_DEVICES]
        for e in entries:
            health, message = self.cache.get(e.driver, e.pool, e.device)  # lease applied
            key = DeviceKey(e.driver, e.pool, e.device)
            rows.append(HealthRow(key, health, message, e.changed_wall))
        return encode_devices(rows, omitted)

    async def _loop(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self.coalesce)
            self._dirty.clear()
            try:
                await self._write(self.snapshot())
                self.writes += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                log.warning("publishing device health of node %s failed: %s", self.node, exc)
                self._dirty.set()
                await asyncio.sleep(1.0)

    async def _write(self, data: dict[str, str]) -> None:
        labels = record_labels(self.node)
        await write_configmap_data(
            self.client, devices_configmap_name(self.node), self.namespace, data, labels
        )
