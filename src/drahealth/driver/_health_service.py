"""The dra-health gRPC services (``v1`` and ``v1alpha1`` ``DRAResourceHealth``) over a
device-health model.

Owns: the wire encoding of a model snapshot (``WireSnapshot``), the fan-out registry of
open streams with its silence/close switches (``StreamFanout``), the per-stream
one-slot mailbox and send loop (``Mailbox``), and the one handler that serves both
versions. It holds no health state: the model (``DeviceHealthModel``, wrapped by the
``HealthHub``) decides what devices look like; this module decides when a stream sends.

Streaming semantics, per ``NodeWatchResources`` stream:

* the full snapshot is sent at once, then again after every aggregate change, and
  re-sent unchanged every ``heartbeat_interval`` (a third of the smallest
  per-device timeout, at least 0.05 s) so the consumer's lease never lapses;
* fan-out never blocks the hub: a change only stores the newest version in each
  stream's one-slot mailbox and wakes it. A slow stream skips intermediate snapshots
  and always sends the newest one, so versions on a stream only increase, and a
  stalled stream (gRPC flow control) delays nothing but itself;
* while the fan-out is silenced nothing is sent (fault injection: a wedged driver);
* a client cancel drops the mailbox; ``close()`` ends the streams with OK;
* a fan-out with ``supported=False`` answers ``UNIMPLEMENTED`` "health not supported".

Every call runs on the owning hub's asyncio loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from drahealth import api
from drahealth.core import DeviceHealthModel, DeviceState, truncate_message

if TYPE_CHECKING:
    from typing import TypeAlias

    _V1Context: TypeAlias = grpc.aio.ServicerContext[
        api.health_v1.NodeWatchResourcesRequest, api.health_v1.NodeWatchResourcesResponse
    ]
    _V1Alpha1Context: TypeAlias = grpc.aio.ServicerContext[
        api.health_v1alpha1.NodeWatchResourcesRequest,
        api.health_v1alpha1.NodeWatchResourcesResponse,
    ]

__all__ = [
    "MIN_HEARTBEAT_SECONDS",
    "Mailbox",
    "SnapshotEncoder",
    "StreamFanout",
    "WireSnapshot",
    "add_health_servicers",
    "encode_v1",
]

#: Smallest heartbeat interval on the streams (seconds).
MIN_HEARTBEAT_SECONDS = 0.05

log = logging.getLogger(__name__)


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
    """One model version, encoded lazily and at most once.

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


class StreamFanout:
    """The open dra-health streams over one :class:`DeviceHealthModel`.

    The owner calls :meth:`post` after every model change (it never blocks: each
    stream's mailbox keeps only the newest version). The wire snapshot of a model
    version is encoded at most once, however many streams send it.
    """

    __slots__ = (
        "_closed", "_encoder", "_model", "_silenced", "_wire", "mailboxes", "opened", "supported",
    )  # fmt: skip

    def __init__(self, model: DeviceHealthModel, *, supported: bool = True) -> None:
        self._model = model
        #: False in "health not supported" mode: streams answer UNIMPLEMENTED.
        self.supported = supported
        self._encoder = SnapshotEncoder()
        self._wire: WireSnapshot | None = None
        self._silenced = False
        self._closed = False
        #: The open streams' mailboxes (both versions).
        self.mailboxes: set[Mailbox] = set()
        #: Streams opened so far per dra-health version ("v1", "v1alpha1").
        self.opened: Counter[str] = Counter()

    @property
    def version(self) -> int:
        return self._model.version

    @property
    def silenced(self) -> bool:
        return self._silenced

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between re-sends without changes: a third of the smallest timeout."""
        return max(MIN_HEARTBEAT_SECONDS, self._model.smallest_timeout / 3)

    def wire_snapshot(self) -> WireSnapshot:
        """The model's current version, encoded lazily and cached until it changes."""
        version = self._model.version
        if self._wire is None or self._wire.version != version:
            self._wire = WireSnapshot(version, self._model.snapshot(), self._encoder)
        return self._wire

    def post(self) -> None:
        """Wake every stream with the model's current version."""
        version = self._model.version
        for mailbox in self.mailboxes:
            mailbox.post(version)

    def silence(self, silenced: bool) -> None:
        """While silenced, streams send nothing; resuming sends the latest snapshot."""
        if silenced != self._silenced:
            self._silenced = silenced
            self.post()

    def close(self) -> None:
        """End every open stream (status OK); new streams are refused (UNAVAILABLE)."""
        self._closed = True
        self.post()

    def open_stream(self) -> Mailbox:
        mailbox = Mailbox(self)
        self.mailboxes.add(mailbox)
        return mailbox

    def close_stream(self, mailbox: Mailbox) -> None:
        self.mailboxes.discard(mailbox)


class Mailbox:
    """One stream's one-slot mailbox: the newest model version posted, plus a wake-up."""

    __slots__ = ("_fanout", "_started", "_wake", "latest", "sent")

    def __init__(self, fanout: StreamFanout) -> None:
        self._fanout = fanout
        self._wake = asyncio.Event()
        self._started = False
        #: Newest version posted, and the version this stream last sent.
        self.latest = fanout.version
        self.sent = -1

    def post(self, version: int) -> None:
        """Called by the fan-out (never blocks): overwrite the slot and wake the stream."""
        self.latest = version
        self._wake.set()

    async def next(self) -> WireSnapshot | None:
        """Wait until something is due, then return the snapshot to send; None to end.

        Due means: the first send, a posted change, a resume after silence, or the
        heartbeat interval elapsing since the previous send.
        """
        fanout = self._fanout
        if self._started:
            try:
                async with asyncio.timeout(fanout.heartbeat_interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
        self._started = True
        while True:
            self._wake.clear()
            if fanout.closed:
                return None
            if not fanout.silenced:
                break
            await self._wake.wait()
        snap = fanout.wire_snapshot()
        self.sent = snap.version
        return snap

    def close(self) -> None:
        """Drop the mailbox from the fan-out (idempotent)."""
        self._fanout.close_stream(self)


async def _open(fanout: StreamFanout, context: grpc.aio.ServicerContext[Any, Any]) -> Mailbox:
    if not fanout.supported:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "health not supported")
    if fanout.closed:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "health hub closed")
    mailbox = fanout.open_stream()
    # types-grpcio wants its private ``_DoneCallback`` class; any callable works.
    context.add_done_callback(lambda _ctx: mailbox.close())  # type: ignore[arg-type]
    return mailbox


def _passthrough(data: bytes) -> bytes:
    return data


def add_health_servicers(fanout: StreamFanout, server: grpc.aio.Server) -> None:
    """Register ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth`` on ``server``.

    Both are served by one handler that yields the snapshot's cached bytes through an
    identity serializer, so a snapshot is encoded once however many streams (of either
    version) receive it. Requests are parsed with the generated message classes.
    """

    def watcher(version: str) -> Any:
        async def watch(
            request: object, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[bytes]:
            """One ``NodeWatchResources`` stream of ``version``."""
            mailbox = await _open(fanout, context)
            fanout.opened[version] += 1
            # which version a kubelet subscribed on (1.34-1.36 only know v1alpha1): the
            # first stream of each version at info, the rest (reconnects) at debug, so a
            # client reconnecting in a loop cannot flood the log
            level = logging.INFO if fanout.opened[version] == 1 else logging.DEBUG
            log.log(level, "dra-health %s stream opened (%d open)", version, len(fanout.mailboxes))
            try:
                while (snap := await mailbox.next()) is not None:
                    yield snap.encoded()
            finally:
                mailbox.close()

        return watch

    for service, request_type in (
        (api.DRA_HEALTH_V1, api.health_v1.NodeWatchResourcesRequest),
        (api.DRA_HEALTH_V1ALPHA1, api.health_v1alpha1.NodeWatchResourcesRequest),
    ):
        handler = grpc.unary_stream_rpc_method_handler(
            watcher(service.partition(".")[0]),
            request_deserializer=request_type.FromString,
            response_serializer=_passthrough,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {"NodeWatchResources": handler}),)
        )
