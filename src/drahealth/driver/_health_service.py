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

__all__ = ["Mailbox", "SnapshotEncoder", "WireSnapshot", "add_health_servicers", "encode_v1"]


def _device_health(s: DeviceState) -> api.health_v1.DeviceHealth:
    return api.health_v1.DeviceHealth(
        device=api.health_v1.DeviceIdentifier(pool_name=s.pool, device_name=s.device),
        health=api.health_v1.HealthStatus.ValueType(s.health.to_wire()),
        last_updated_time=int(s.updated_at),
        health_check_timeout_seconds=s.timeout_seconds,
        message=truncate_message(s.message),
    )


def encode_v1(states: Sequence[DeviceState]) -> api.health_v1.NodeWatchResourcesResponse:
    """A v1 response listing every state: wire health, unix-second timestamps, the
    per-device timeout and the UTF-8-safe truncated message."""
    resp = api.health_v1.NodeWatchResourcesResponse()
    resp.devices.extend(_device_health(s) for s in states)
    return resp


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class SnapshotEncoder:
    """Encodes snapshots re-using each unchanged device's bytes.

    A ``NodeWatchResourcesResponse`` is only its repeated field 1 (``devices``), so
    its encoding is the concatenation of one length-delimited record per device. The
    encoder keeps each device's record next to the (immutable) state it came from and
    re-encodes only devices whose state object changed: after a one-device change to
    a 10,000-device hub that is one protobuf encode and a join, not 10,000 encodes.
    The result is byte-identical to ``encode_v1(states).SerializeToString()``.
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], tuple[DeviceState, bytes]] = {}

    def encode(self, states: Sequence[DeviceState]) -> bytes:
        entries = self._entries
        parts: list[bytes] = []
        for s in states:
            key = (s.pool, s.device)
            hit = entries.get(key)
            if hit is None or hit[0] is not s:
                body = _device_health(s).SerializeToString()
                hit = (s, b"\x0a" + _varint(len(body)) + body)  # field 1, wire type 2
                entries[key] = hit
            parts.append(hit[1])
        if len(entries) > len(states):  # devices were removed: forget their records
            keep = {(s.pool, s.device) for s in states}
            self._entries = {k: v for k, v in entries.items() if k in keep}
        return b"".join(parts)


class WireSnapshot:
    """One hub version, encoded lazily and at most once.

    The v1 and v1alpha1 ``NodeWatchResourcesResponse`` are byte-identical on the
    wire, so both services send the same bytes; the message objects are only built
    (parsed back) for callers that ask for them.
    """

    __slots__ = ("_bytes", "_encoder", "states", "version")

    def __init__(
        self,
        version: int,
        states: Sequence[DeviceState],
        encoder: SnapshotEncoder | None = None,
    ) -> None:
        self.version = version
        self.states = tuple(states)
        self._encoder = encoder
        self._bytes: bytes | None = None

    def encoded(self) -> bytes:
        if self._bytes is None:
            if self._encoder is not None:
                self._bytes = self._encoder.encode(self.states)
            else:
                self._bytes = encode_v1(self.states).SerializeToString()
        return self._bytes

    def v1(self) -> api.health_v1.NodeWatchResourcesResponse:
        return api.health_v1.NodeWatchResourcesResponse.FromString(self.encoded())

    def v1alpha1(self) -> api.health_v1alpha1.NodeWatchResourcesResponse:
        return api.health_v1alpha1.NodeWatchResourcesResponse.FromString(self.encoded())


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


def _passthrough(data: bytes) -> bytes:
    return data


def add_health_servicers(hub: HealthHub, server: grpc.aio.Server) -> None:
    """Register ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth`` on ``server``.

    Both are served by one handler that yields the snapshot's cached bytes through an
    identity serializer, so a snapshot is encoded once however many streams (of either
    version) receive it. Requests are parsed with the generated message classes.
    """

    async def watch(
        request: object, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        """One ``NodeWatchResources`` stream (either version)."""
        mailbox = await _open(hub, context)
        try:
            while (snap := await mailbox.next()) is not None:
                yield snap.encoded()
        finally:
            mailbox.close()

    for service, request_type in (
        (api.DRA_HEALTH_V1, api.health_v1.NodeWatchResourcesRequest),
        (api.DRA_HEALTH_V1ALPHA1, api.health_v1alpha1.NodeWatchResourcesRequest),
    ):
        handler = grpc.unary_stream_rpc_method_handler(
            watch,
            request_deserializer=request_type.FromString,
            response_serializer=_passthrough,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {"NodeWatchResources": handler}),)
        )
