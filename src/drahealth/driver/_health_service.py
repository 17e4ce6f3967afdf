"""The dra-health gRPC services (``v1`` and ``v1alpha1`` ``DRAResourceHealth``) over a HealthHub.

Owns: the wire encoding of a hub snapshot (``WireSnapshot``), the per-stream one-slot
mailbox and send loop (``Mailbox``), and the two generated-servicer subclasses that
serve both versions from that one implementation. It holds no health state: the hub
decides what devices look like; this module decides when a stream sends.

Streaming semantics, per ``NodeWatchResources`` stream:

* the full snapshot is sent at once, then again after every aggregate change, and
  re-sent unchanged every ``hub.heartbeat_interval`` (a third of the smallest
  per-device timeout, at least 0.05 s) so the consumer's lease never lapses;
* fan-out never blocks the hub: a change only stores the newest version in each
  stream's one-slot mailbox and wakes it. A slow stream skips intermediate snapshots
  and always sends the newest one, so versions on a stream only increase, and a
  stalled stream (gRPC flow control) delays nothing but itself;
* while the hub is silenced nothing is sent (fault injection: a wedged driver);
* a client cancel drops the mailbox; ``hub.close()`` ends the streams with OK;
* a hub with ``supported=False`` answers ``UNIMPLEMENTED`` "health not supported".

Every call runs on the hub's asyncio loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from drahealth import api
from drahealth.core import truncate_message

if TYPE_CHECKING:
    from typing import TypeAlias

    from drahealth.driver._hub import DeviceState, HealthHub

    _V1Context: TypeAlias = grpc.aio.ServicerContext[
        api.health_v1.NodeWatchResourcesRequest, api.health_v1.NodeWatchResourcesResponse
    ]
    _V1Alpha1Context: TypeAlias = grpc.aio.ServicerContext[
        api.health_v1alpha1.NodeWatchResourcesRequest,
        api.health_v1alpha1.NodeWatchResourcesResponse,
    ]

__all__ = ["Mailbox", "WireSnapshot", "add_health_servicers", "encode_v1"]


def encode_v1(states: Sequence[DeviceState]) -> api.health_v1.NodeWatchResourcesResponse:
    """A v1 response listing every state: wire health, unix-second timestamps, the
    per-device timeout and the UTF-8-safe truncated message."""
    resp = api.health_v1.NodeWatchResourcesResponse()
    for s in states:
        resp.devices.add(
            device=api.health_v1.DeviceIdentifier(pool_name=s.pool, device_name=s.device),
            health=api.health_v1.HealthStatus.ValueType(s.health.to_wire()),
            last_updated_time=int(s.updated_at),
            health_check_timeout_seconds=s.timeout_seconds,
            message=truncate_message(s.message),
        )
    return resp


class WireSnapshot:
    """One hub version, encoded lazily and at most once per API version.

    v1 and v1alpha1 messages are byte-identical on the wire, so v1alpha1 is parsed
    from the v1 encoding rather than built twice.
    """

    __slots__ = ("_bytes", "_v1", "_v1alpha1", "states", "version")

    def __init__(self, version: int, states: Sequence[DeviceState]) -> None:
        self.version = version
        self.states = tuple(states)
        self._v1: api.health_v1.NodeWatchResourcesResponse | None = None
        self._v1alpha1: api.health_v1alpha1.NodeWatchResourcesResponse | None = None
        self._bytes: bytes | None = None

    def v1(self) -> api.health_v1.NodeWatchResourcesResponse:
        if self._v1 is None:
            self._v1 = encode_v1(self.states)
        return self._v1

    def encoded(self) -> bytes:
        if self._bytes is None:
            self._bytes = self.v1().SerializeToString()
        return self._bytes

    def v1alpha1(self) -> api.health_v1alpha1.NodeWatchResourcesResponse:
        if self._v1alpha1 is None:
            self._v1alpha1 = api.health_v1alpha1.NodeWatchResourcesResponse.FromString(
                self.encoded()
            )
        return self._v1alpha1


class Mailbox:
    """One stream's one-slot mailbox: the newest hub version posted, plus a wake-up."""

    __slots__ = ("_hub", "_started", "_wake", "latest", "sent")

    def __init__(self, hub: HealthHub) -> None:
        self._hub = hub
        self._wake = asyncio.Event()
        self._started = False
        #: Newest version posted by the hub, and the version this stream last sent.
        self.latest = hub.version
        self.sent = -1

    def post(self, version: int) -> None:
        """Called by the hub (never blocks): overwrite the slot and wake the stream."""
        self.latest = version
        self._wake.set()

    async def next(self) -> WireSnapshot | None:
        """Wait until something is due, then return the snapshot to send; None to end.

        Due means: the first send, a posted change, a resume after silence, or the
        heartbeat interval elapsing since the previous send.
        """
        hub = self._hub
        if self._started:
            try:
                async with asyncio.timeout(hub.heartbeat_interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
        self._started = True
        while True:
            self._wake.clear()
            if hub.closed:
                return None
            if not hub.silenced:
                break
            await self._wake.wait()
        snap = hub._wire_snapshot()
        self.sent = snap.version
        return snap

    def close(self) -> None:
        """Drop the mailbox from the hub (idempotent)."""
        self._hub._close_stream(self)


async def _open(hub: HealthHub, context: grpc.aio.ServicerContext[Any, Any]) -> Mailbox:
    if not hub.supported:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "health not supported")
    if hub.closed:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "health hub closed")
    mailbox = hub._open_stream()
    # types-grpcio wants its private ``_DoneCallback`` class; any callable works.
    context.add_done_callback(lambda _ctx: mailbox.close())  # type: ignore[arg-type]
    return mailbox


class _HealthV1(api.health_v1_grpc.DRAResourceHealthServicer):
    def __init__(self, hub: HealthHub) -> None:
        self._hub = hub

    async def NodeWatchResources(
        self, request: api.health_v1.NodeWatchResourcesRequest, context: _V1Context
    ) -> AsyncIterator[api.health_v1.NodeWatchResourcesResponse]:
        mailbox = await _open(self._hub, context)
        try:
            while (snap := await mailbox.next()) is not None:
                yield snap.v1()
        finally:
            mailbox.close()


class _HealthV1Alpha1(api.health_v1alpha1_grpc.DRAResourceHealthServicer):
    def __init__(self, hub: HealthHub) -> None:
        self._hub = hub

    async def NodeWatchResources(
        self, request: api.health_v1alpha1.NodeWatchResourcesRequest, context: _V1Alpha1Context
    ) -> AsyncIterator[api.health_v1alpha1.NodeWatchResourcesResponse]:
        mailbox = await _open(self._hub, context)
        try:
            while (snap := await mailbox.next()) is not None:
                yield snap.v1alpha1()
        finally:
            mailbox.close()


def add_health_servicers(hub: HealthHub, server: grpc.aio.Server) -> None:
    """Register ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth`` on ``server``."""
    api.health_v1_grpc.add_DRAResourceHealthServicer_to_server(_HealthV1(hub), server)
    api.health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(_HealthV1Alpha1(hub), server)
