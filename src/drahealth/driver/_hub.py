"""HealthHub: the driver's one device-health model, fed by sources, read by everything else.

Owns the hub: a :class:`~drahealth.core.DeviceHealthModel` (per-source reports,
worst-of aggregation, sticky severity with explicit recovery, device list and
timeouts; its module states the aggregation rules) plus what a running driver adds to
it: change notifications to subscribers, ``submit_threadsafe`` for worker threads,
and the fan-out of open dra-health streams (``_health_service``: wire encoding,
mailboxes, the gRPC handler). No I/O here apart from waking stream mailboxes.

Threading: a hub belongs to one asyncio loop. ``submit`` and every other method are
plain synchronous calls that must be made on that loop's thread (they never block and
never await). From another thread use ``submit_threadsafe``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Iterable, Mapping

import grpc

from drahealth import api
from drahealth.core import (
    OPERATOR_SOURCE,
    DeviceHealthModel,
    DeviceReport,
    DeviceState,
    RecoveryPolicy,
)
from drahealth.driver._health_service import (
    MIN_HEARTBEAT_SECONDS,
    StreamFanout,
    add_health_servicers,
)

__all__ = [
    "MIN_HEARTBEAT_SECONDS",
    "OPERATOR_SOURCE",
    "DeviceReport",
    "DeviceState",
    "HealthHub",
    "RecoveryPolicy",
]

_log = logging.getLogger(__name__)

#: The default recovery policy: the first Healthy report of the latching source clears.
_DEFAULT_RECOVERY = RecoveryPolicy()


class HealthHub:
    """Aggregates per-source device reports and serves them as dra-health streams.

    The aggregation and recovery rules are those of ``DeviceHealthModel``; see
    ``_health_service`` for the streaming behaviour.
    """

    def __init__(
        self,
        devices: Iterable[tuple[str, str]] = (),
        *,
        default_timeout_seconds: int = api.DEFAULT_HEALTH_TIMEOUT_SECONDS,
        recovery: RecoveryPolicy = _DEFAULT_RECOVERY,
        supported: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._model = DeviceHealthModel(
            devices,
            default_timeout_seconds=default_timeout_seconds,
            recovery=recovery,
            clock=clock,
            wall_clock=wall_clock,
        )
        self._streams = StreamFanout(self._model, supported=supported)
        self._subscribers: list[Callable[[list[DeviceState]], None]] = []

    # -- properties ------------------------------------------------------------------

    @property
    def model(self) -> DeviceHealthModel:
        """The sans-I/O model behind the hub (read it; change it through the hub)."""
        return self._model

    @property
    def supported(self) -> bool:
        """False in "health not supported" mode: nothing advertised, streams UNIMPLEMENTED."""
        return self._streams.supported

    @property
    def version(self) -> int:
        """Increases by one on every aggregate change."""
        return self._model.version

    @property
    def silenced(self) -> bool:
        return self._streams.silenced

    @property
    def closed(self) -> bool:
        return self._streams.closed

    @property
    def stream_count(self) -> int:
        """Number of open dra-health streams (both versions)."""
        return len(self._streams.mailboxes)

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between re-sends without changes: a third of the smallest timeout."""
        return self._streams.heartbeat_interval

    # -- device list -----------------------------------------------------------------

    def set_devices(
        self,
        devices: Iterable[tuple[str, str]],
        timeouts: Mapping[tuple[str, str], int] | None = None,
    ) -> list[DeviceState]:
        """Replace the device list; returns the states of added or re-timed devices.

        New devices start Unknown (no source covers them yet). Existing devices keep
        their state and timeout unless ``timeouts`` names them; removed devices are
        dropped with their contributions and latches.
        """
        before = self._model.version
        return self._notify(before, self._model.set_devices(devices, timeouts))

    def set_timeout(self, pool: str, device: str, seconds: int) -> DeviceState:
        """Set one device's ``health_check_timeout_seconds``."""
        before = self._model.version
        state = self._model.set_timeout(pool, device, seconds)
        self._notify(before, [state])
        return state

    # -- reports ---------------------------------------------------------------------

    def submit(self, source: str, reports: Iterable[DeviceReport]) -> list[DeviceState]:
        """Apply one source's reports (all or nothing); returns the states that changed.

        Raises ValueError naming every device not in the device list, and for
        malformed reports; nothing is applied then.
        """
        before = self._model.version
        return self._notify(before, self._model.submit(source, reports))

    def submit_threadsafe(
        self,
        loop: asyncio.AbstractEventLoop,
        source: str,
        reports: Iterable[DeviceReport],
    ) -> concurrent.futures.Future[list[DeviceState]]:
        """``submit`` from any thread: runs it on ``loop`` (the hub's) and returns a future."""
        batch = list(reports)
        fut: concurrent.futures.Future[list[DeviceState]] = concurrent.futures.Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(self.submit(source, batch))
            except BaseException as exc:
                fut.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return fut

    def recover(self, pool: str, device: str, source: str | None = None) -> DeviceState:
        """Explicit operator recovery: clear the latched fault of ``source`` (or all).

        A cleared source whose latest report was the fault itself now contributes
        Healthy; other contributions are untouched. Returns the device's new state.
        """
        before = self._model.version
        state = self._model.recover(pool, device, source)
        self._notify(before, [state])
        return state

    def forget_source(self, source: str, *, keep_faults: bool = True) -> list[DeviceState]:
        """A source went away: drop its contributions; returns the states that changed.

        Devices no remaining source covers become Unknown. With ``keep_faults`` (the
        default) the source's latched faults stay until recovered (by ``recover``, the
        operator, or the same source coming back and reporting Healthy).
        """
        before = self._model.version
        return self._notify(before, self._model.forget_source(source, keep_faults=keep_faults))

    # -- reading ---------------------------------------------------------------------

    def state(self, pool: str, device: str) -> DeviceState:
        """The device's current state; ValueError if the hub does not know it."""
        return self._model.state(pool, device)

    def snapshot(self) -> list[DeviceState]:
        """Every device's state, ordered by (pool, device)."""
        return self._model.snapshot()

    def subscribe(self, callback: Callable[[list[DeviceState]], None]) -> Callable[[], None]:
        """Call ``callback(changed_states)`` on the hub's loop after every change.

        The list may be empty when the only change was removing devices. Exceptions
        raised by a callback are logged and do not affect the hub. Returns a function
        that unsubscribes.
        """
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    # -- serving ---------------------------------------------------------------------

    def advertised_services(self) -> list[str]:
        """Registration strings to append after the DRAPlugin services."""
        return [api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1] if self.supported else []

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        """Register the v1 and v1alpha1 servicers; returns ``advertised_services()``."""
        add_health_servicers(self._streams, server)
        return self.advertised_services()

    def encode_snapshot_v1(self) -> bytes:
        """The serialized v1 ``NodeWatchResourcesResponse`` of the current snapshot."""
        return self._streams.wire_snapshot().encoded()

    def silence(self, silenced: bool) -> None:
        """Fault injection: while silenced, streams send nothing (no snapshots, no
        heartbeats), as from a wedged driver. Resuming sends the latest snapshot at once."""
        self._streams.silence(silenced)

    def close(self) -> None:
        """End every open stream (status OK); new streams are refused (UNAVAILABLE)."""
        self._streams.close()

    # -- internals -------------------------------------------------------------------

    def _notify(self, before: int, changed: list[DeviceState]) -> list[DeviceState]:
        """After a model call: if its version moved, wake the streams and subscribers."""
        if self._model.version == before:
            return changed
        self._streams.post()
        for callback in list(self._subscribers):
            try:
                callback(list(changed))
            except Exception:
                _log.exception("HealthHub subscriber %r failed", callback)
        return changed
