"""Pod Events the agent records (core/v1 ``Event`` objects, as the kubelet writes them).

Owns the event reasons and their wording, and a small recorder that creates the
Event through the API without ever blocking or failing its caller: a failed create
is logged and counted. Identical events for the same pod within ``dedupe_seconds``
are folded into the first one, as the kubelet's event correlator does: its ``count``
and ``lastTimestamp`` are patched, at most once per ``patch_interval`` seconds per
event, so a flapping device cannot flood the API server but the count stays true.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.resources.core_v1 import Event
from lightkube.types import PatchType

from drahealth._time import now_rfc3339
from drahealth.core import ChangeReason, Health, HealthChange
from drahealth.kube import AGENT_COMPONENT, make_event

__all__ = [
    "REASON_DEVICE_HEALTHY",
    "REASON_DEVICE_UNHEALTHY",
    "REASON_DEVICE_UNKNOWN",
    "REASON_PREPARE_FAILED",
    "REASON_PREPARE_FAILED_PERMANENT",
    "EventRecorder",
]

log = logging.getLogger(__name__)

#: The kubelet's reason for a failed NodePrepareResources (pkg/kubelet/events).
REASON_PREPARE_FAILED = "FailedPrepareDynamicResources"
#: Reason on the Pod (status.reason) when the driver marked the failure permanent.
REASON_PREPARE_FAILED_PERMANENT = "DRAPrepareFailedPermanently"
REASON_DEVICE_UNHEALTHY = "DeviceUnhealthy"
REASON_DEVICE_UNKNOWN = "DeviceHealthUnknown"
REASON_DEVICE_HEALTHY = "DeviceHealthy"

COMPONENT = AGENT_COMPONENT


@dataclass(slots=True)
class _Sent:
    """An event created within the dedupe window, and its folded repeats."""

    name: str
    namespace: str
    created: float
    count: int = 1
    patched: float = 0.0
    patched_count: int = 1


class EventRecorder:
    """Creates Events for pods; fire and forget."""

    def __init__(
        self,
        client: AsyncClient | None,
        node_name: str,
        *,
        dedupe_seconds: float = 10.0,
        patch_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._node = node_name
        self._dedupe = dedupe_seconds
        self._patch_interval = patch_interval
        self._clock = clock
        self._recent: dict[tuple[str, str, str], _Sent] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0
        self.failed = 0
        self.folded = 0

    def pod_event(self, pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        """Record an event on ``pod`` (a Pod as a dict) without waiting."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        key = (uid, reason, message)
        now = self._clock()
        sent = self._recent.get(key)
        if sent is not None and now - sent.created < self._dedupe:
            self.folded += 1
            sent.count += 1
            if now - sent.patched >= self._patch_interval:
                sent.patched = now
                self._spawn(self._bump(sent))
            return
        if len(self._recent) > 4096:
            cutoff = now - self._dedupe
            self._recent = {k: v for k, v in self._recent.items() if v.created >= cutoff}
        name = f"{meta.get('name', 'pod')}.{uuid.uuid4().hex[:16]}"
        self._recent[key] = _Sent(name, str(meta.get("namespace") or "default"), now)
        self._spawn(self._create(name, meta, event_type, reason, message))

    def _spawn(self, work: Any) -> None:
        if self._client is None:
            work.close()
            return
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def device_health(self, pod: Mapping[str, Any], change: HealthChange) -> None:
        """The Event for a device health transition on a pod that uses the device."""
        what = f"device {change.key} is {change.new.value}"
        if change.message:
            what += f": {change.message}"
        if change.new is Health.UNHEALTHY:
            self.pod_event(pod, "Warning", REASON_DEVICE_UNHEALTHY, what)
        elif change.new is Health.UNKNOWN:
            why = " (no report within its lease)" if change.reason == ChangeReason.EXPIRED else ""
            self.pod_event(pod, "Warning", REASON_DEVICE_UNKNOWN, what + why)
        else:
            self.pod_event(pod, "Normal", REASON_DEVICE_HEALTHY, what)

    async def _bump(self, sent: _Sent) -> None:
        """Patch a folded event's count and lastTimestamp (the correlator's update)."""
        assert self._client is not None
        count = sent.count
        if count <= sent.patched_count:
            return
        body = {"count": count, "lastTimestamp": now_rfc3339()}
        try:
            await self._client.patch(
                Event, sent.name, body, namespace=sent.namespace, patch_type=PatchType.MERGE
            )
            sent.patched_count = max(sent.patched_count, count)
        except Exception as exc:  # the event may not exist yet, or was deleted
            log.debug("updating the count of event %s failed: %s", sent.name, exc)

    async def _create(
        self, name: str, meta: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        assert self._client is not None
        event = make_event(
            name=name,
            involved=ObjectReference(
                apiVersion="v1",
                kind="Pod",
                name=meta.get("name"),
                namespace=meta.get("namespace"),
                uid=meta.get("uid"),
            ),
            event_type=event_type,
            reason=reason,
            message=message,
            component=COMPONENT,
            instance=self._node,
            host=self._node,
        )
        try:
            await self._client.create(event)
            self.sent += 1
        except Exception as exc:  # never fail the caller over an event
            self.failed += 1
            log.warning("recording event %s on pod %s failed: %s", reason, meta.get("name"), exc)

    async def drain(self) -> None:
        """Wait for in-flight creates (tests, shutdown)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
