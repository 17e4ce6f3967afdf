"""Pod Events the agent records (core/v1 ``Event`` objects, as the kubelet writes them).

Owns the event reasons and their wording, and a small recorder that creates the
Event through the API without ever blocking or failing its caller: a failed create
is logged and counted. Identical events for the same pod within ``dedupe_seconds``
are folded into one (their count is bumped locally and not re-sent), so a flapping
device cannot flood the API server.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

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

COMPONENT = "drahealth-agent"


class EventRecorder:
    """Creates Events for pods; fire and forget."""

    def __init__(
        self,
        client: AsyncClient | None,
        node_name: str,
        *,
        dedupe_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._node = node_name
        self._dedupe = dedupe_seconds
        self._clock = clock
        self._recent: dict[tuple[str, str, str], float] = {}
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
        last = self._recent.get(key)
        if last is not None and now - last < self._dedupe:
            self.folded += 1
            return
        self._recent[key] = now
        if len(self._recent) > 4096:
            cutoff = now - self._dedupe
            self._recent = {k: t for k, t in self._recent.items() if t >= cutoff}
        if self._client is None:
            return
        task = asyncio.create_task(self._create(meta, event_type, reason, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _create(
        self, meta: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        assert self._client is not None
        now = datetime.datetime.now(datetime.UTC)
        name = f"{meta.get('name', 'pod')}.{uuid.uuid4().hex[:16]}"
        event = Event(
            metadata=ObjectMeta(name=name, namespace=meta.get("namespace", "default")),
            involvedObject=ObjectReference(
                apiVersion="v1",
                kind="Pod",
                name=meta.get("name"),
                namespace=meta.get("namespace"),
                uid=meta.get("uid"),
            ),
            reason=reason,
            message=message[:1024],
            type=event_type,
            count=1,
            firstTimestamp=now,
            lastTimestamp=now,
            source=EventSource(component=COMPONENT, host=self._node),
            reportingComponent=COMPONENT,
            reportingInstance=self._node,
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
