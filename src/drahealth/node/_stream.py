"""Client side of one plugin instance's dra-health ``NodeWatchResources`` stream.

Owns :func:`pick_health_service` (which dra-health version to speak, from the
plugin's registration strings) and :class:`HealthStream`, which keeps one stream
open on a plugin's gRPC channel and hands every message, converted to
:class:`~drahealth.core._records.ReportedDevice` values, to a callback. It does
not own the channel (the plugin registry does), never touches the health cache,
and knows nothing of other instances or generations (the registry fences those).

Behaviour (reference section 3, with the fixes of section 9):

* ``UNIMPLEMENTED`` is terminal: no retry until the plugin registers again, logged
  at info level (upstream master; 1.34-1.36 retried every 5 s with error logs).
* A clean end of stream or any other error reconnects after a capped, jittered
  backoff that restarts from its initial delay once a message arrives.
* A message that cannot be decoded (not protobuf, invalid UTF-8 in a string field)
  is a stream error: counted (:attr:`HealthStream.bad_messages`), logged once per run
  of failures, the stream is reconnected with backoff; nothing of it is used. Any
  other unexpected exception in the stream task is counted
  (:attr:`HealthStream.unexpected_errors`) and also ends in a reconnect with backoff:
  the task only ends when stopped or on ``UNIMPLEMENTED``.
* Nothing is cleared when a stream ends (upstream wipes the driver's health on
  every exit); the cache's leases decide when silent devices turn Unknown.
* A watchdog reconnects a stream that stays silent for longer than the smallest
  lease it has announced, so a half-open connection is not mistaken for a live one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import grpc
from google.protobuf.message import DecodeError

from drahealth import api
from drahealth.core import Health, ReportedDevice, positive_seconds, truncate_message
from drahealth.kube import Backoff

__all__ = ["STREAM_STATES", "HealthStream", "StreamState", "pick_health_service"]

log = logging.getLogger(__name__)

StreamState = Literal["connecting", "streaming", "backoff", "unimplemented", "stopped"]

#: Every value :attr:`HealthStream.state` can take.
STREAM_STATES: Final[tuple[StreamState, ...]] = (
    "connecting",
    "streaming",
    "backoff",
    "unimplemented",
    "stopped",
)

#: Registration string -> (request class, response class) of that dra-health version.
_MESSAGES: Final[dict[str, tuple[Any, Any]]] = {
    api.DRA_HEALTH_V1: (
        api.health_v1.NodeWatchResourcesRequest,
        api.health_v1.NodeWatchResourcesResponse,
    ),
    api.DRA_HEALTH_V1ALPHA1: (
        api.health_v1alpha1.NodeWatchResourcesRequest,
        api.health_v1alpha1.NodeWatchResourcesResponse,
    ),
}


def pick_health_service(
    versions: Sequence[str], speaks: Sequence[str] = api.DRA_HEALTH_SERVICES
) -> str | None:
    """The dra-health service to open for a plugin advertising ``versions``.

    ``v1.DRAResourceHealth`` if advertised, else ``v1alpha1.DRAResourceHealth`` if
    advertised, else ``None`` (no stream), among the services this node ``speaks`` (a
    kubelet before 1.37 speaks only v1alpha1). The order of ``versions`` is irrelevant.
    """
    if isinstance(versions, str) or isinstance(speaks, str):
        raise TypeError("versions must be a sequence of registration strings, not one string")
    for service in (api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1):
        if service in versions and service in speaks:
            return service
    return None


def _convert(message: Any) -> list[ReportedDevice]:
    return [
        ReportedDevice(
            pool=d.device.pool_name,
            device=d.device.device_name,
            health=Health.from_wire(d.health),
            message=truncate_message(d.message),
            timeout_seconds=d.health_check_timeout_seconds,
        )
        for d in message.devices
    ]


class HealthStream:
    """One ``NodeWatchResources`` stream of one plugin instance, kept open.

    ``service`` is a registration string (``v1.DRAResourceHealth`` or
    ``v1alpha1.DRAResourceHealth``); the method opened is ``/<service>/NodeWatchResources``
    with an empty request. Every response becomes one ``on_report(devices)`` call,
    made synchronously on the event loop (it must not block; an exception it raises
    is logged and the stream goes on). ``on_state(state)`` is called on every change
    of :attr:`state`.

    ``default_timeout`` is the lease of a device reported with a timeout ``<= 0``
    and the watchdog's limit before the first message. ``backoff`` paces reconnects
    (default ``Backoff(0.1, 5.0)``). ``watchdog=False`` waits for messages forever.

    Counters: :attr:`messages` (responses received and decoded), :attr:`reconnects`
    (streams opened after the first, whatever ended the previous one: end of stream,
    error, undecodable message or watchdog), :attr:`watchdog_expiries`,
    :attr:`bad_messages` (responses that did not decode), :attr:`unexpected_errors`
    (exceptions other than gRPC errors, recovered by reconnecting),
    :attr:`last_message_at` (event-loop clock of the latest response, ``None``
    before the first).
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        service: str,
        *,
        driver: str,
        on_report: Callable[[list[ReportedDevice]], None],
        on_state: Callable[[str], None] | None = None,
        default_timeout: float = 30.0,
        backoff: Backoff | None = None,
        watchdog: bool = True,
    ) -> None:
        messages = _MESSAGES.get(service)
        if messages is None:
            raise ValueError(
                f"unknown dra-health service {service!r}: expected one of {sorted(_MESSAGES)}"
            )
        default_timeout = positive_seconds("default_timeout", default_timeout)
        request_type, response_type = messages
        self.driver = driver
        self.service = service
        self.method = f"/{service}/NodeWatchResources"
        self._request = request_type()
        self._response_type = response_type
        # Responses arrive as bytes and are decoded here: a message that does not
        # decode is a stream error we handle, not a None from gRPC's deserializer.
        self._open: grpc.aio.UnaryStreamMultiCallable[Any, Any] = channel.unary_stream(
            self.method,
            request_serializer=request_type.SerializeToString,
            response_deserializer=None,
        )
        self._on_report = on_report
        self._on_state = on_state
        self.default_timeout = float(default_timeout)
        self._backoff = backoff if backoff is not None else Backoff(0.1, 5.0)
        self.watchdog = watchdog
        self.state: StreamState = "connecting"
        self.messages = 0
        self.reconnects = 0
        self.watchdog_expiries = 0
        self.bad_messages = 0
        self.unexpected_errors = 0
        self.last_message_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._failures = 0  # consecutive failed streams, for log throttling

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start streaming in a background task (must run on the event loop)."""
        if self._task is not None:
            raise RuntimeError(f"health stream of DRA driver {self.driver} was already started")
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"dra-health-{self.driver}"
        )
        self._task.add_done_callback(self._finished)

    async def stop(self) -> None:
        """Cancel the stream and wait for its task; idempotent, also before :meth:`start`."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
        self._set_state("stopped")

    @property
    def running(self) -> bool:
        """True while the background task is alive (not stopped, not unimplemented)."""
        return self._task is not None and not self._task.done()

    def _finished(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error(
                "health stream of DRA driver %s failed unexpectedly",
                self.driver,
                exc_info=exc,
            )

    def _set_state(self, state: StreamState) -> None:
        if state == self.state:
            return
        self.state = state
        if self._on_state is not None:
            try:
                self._on_state(state)
            except Exception:
                log.exception("health stream state callback failed for %s", self.driver)

    # -- the loop ----------------------------------------------------------------------

    async def _run(self) -> None:
        first = True
        while True:
            if not first:
                self.reconnects += 1
            first = False
            self._set_state("connecting")
            try:
                outcome = await self._attempt()
            except Exception as exc:  # a bug or a surprise must not end health for good
                self.unexpected_errors += 1
                self._failed(
                    "stream failed unexpectedly: %s: %s; reconnecting",
                    type(exc).__name__,
                    exc,
                    exc_info=exc,
                )
                outcome = "error"
            if outcome == "unimplemented":
                self._set_state("unimplemented")
                return
            self._set_state("backoff")
            await asyncio.sleep(self._backoff.next())

    async def _attempt(self) -> str:
        """Run one stream until it ends; returns why: eof, error, watchdog, unimplemented."""
        call = self._open(self._request)
        lease: float | None = None  # smallest lease announced on this stream so far
        try:
            while True:
                limit = self.default_timeout if lease is None else lease
                try:
                    if self.watchdog:
                        async with asyncio.timeout(limit):
                            message = await call.read()
                    else:
                        message = await call.read()
                except TimeoutError:
                    self.watchdog_expiries += 1
                    self._failed(
                        "no message within the %.3g s lease (stalled stream); reconnecting",
                        limit,
                    )
                    return "watchdog"
                if message is grpc.aio.EOF:
                    self._failed("the plugin ended the stream; reconnecting", level=logging.INFO)
                    return "eof"
                try:
                    decoded = self._response_type.FromString(message)
                except (DecodeError, TypeError, ValueError) as exc:
                    self.bad_messages += 1
                    self._failed(
                        "undecodable message (%d bytes): %s; reconnecting",
                        len(message) if isinstance(message, bytes) else -1,
                        exc,
                    )
                    return "bad-message"
                lease = self._received(decoded, lease)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info(
                    "DRA driver %s does not implement %s (%s); not retrying until it "
                    "registers again",
                    self.driver,
                    self.method,
                    exc.details(),
                )
                return "unimplemented"
            self._failed("stream failed: %s: %s; reconnecting", exc.code().name, exc.details())
            return "error"
        finally:
            call.cancel()

    def _received(self, message: Any, lease: float | None) -> float:
        devices = _convert(message)
        self.messages += 1
        self.last_message_at = asyncio.get_running_loop().time()
        self._backoff.reset()
        if self._failures:
            log.info("health stream of DRA driver %s is streaming again", self.driver)
        self._failures = 0
        self._set_state("streaming")
        announced = min(
            (
                float(d.timeout_seconds) if d.timeout_seconds > 0 else self.default_timeout
                for d in devices
            ),
            default=self.default_timeout,
        )
        try:
            self._on_report(devices)
        except Exception:
            log.exception("health report callback failed for DRA driver %s", self.driver)
        return announced if lease is None else min(lease, announced)

    def _failed(
        self,
        fmt: str,
        *args: object,
        level: int = logging.WARNING,
        exc_info: BaseException | None = None,
    ) -> None:
        """Log why a stream ended: the first of a run at ``level``, repeats at debug."""
        self._failures += 1
        if self._failures > 1:
            level = logging.DEBUG
        log.log(
            level,
            "health stream %s of DRA driver %s: " + fmt,
            self.method,
            self.driver,
            *args,
            exc_info=exc_info,
        )
