"""HealthStream against real plugins on real unix sockets.

Peers are small raw gRPC servers defined here (``RawPlugin``: a scripted
``NodeWatchResources`` for the dra-health versions a test chooses, an optional DRA
node service, and a count of every call) and the driver toolkit's ``HealthHub``.
The raw plugin and helpers are also used by the registry and conformance tests.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from drahealth import api
from drahealth.core import Health
from drahealth.core._records import ReportedDevice
from drahealth.driver._hub import DeviceReport, HealthHub
from drahealth.kube import Backoff
from drahealth.node._stream import HealthStream
from tests._support import eventually

_Context = grpc.aio.ServicerContext[Any, Any]
H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN

# -- peers and helpers (also used by the registry and conformance tests) ------------


class Stall:
    """Script step: keep the stream open and send nothing more, forever."""


STALL = Stall()

#: A script step: a response to send, seconds to sleep, a status to abort with, or STALL.
Step = bytes | float | grpc.StatusCode | Stall


def response(*devices: tuple[str, str, int, str, int]) -> bytes:
    """A serialized ``NodeWatchResourcesResponse`` of (pool, device, health, message, timeout)."""
    msg = api.health_v1.NodeWatchResourcesResponse()
    for pool, device, health, message, timeout in devices:
        msg.devices.add(
            device=api.health_v1.DeviceIdentifier(pool_name=pool, device_name=device),
            health=health,
            message=message,
            health_check_timeout_seconds=timeout,
            last_updated_time=1_700_000_000,
        )
    return msg.SerializeToString()


def dev(
    device: str, health: Health, message: str = "", timeout: int = 0, pool: str = "pool"
) -> tuple[str, str, int, str, int]:
    return (pool, device, health.to_wire(), message, timeout)


@dataclass
class PrepareScript:
    """What the raw DRA service answers: per-claim devices or error (+ raw extra bytes)."""

    devices: dict[str, list[tuple[str, str, list[str], list[str]]]] = field(default_factory=dict)
    errors: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    unprepare_errors: dict[str, str] = field(default_factory=dict)
    abort: grpc.StatusCode | None = None
    delay: float = 0.0


class RawPlugin:
    """A raw plugin on one unix socket.

    ``health``: the dra-health services to serve (registration strings);
    ``scripts``: the steps of each ``NodeWatchResources`` call (call i uses
    ``scripts[min(i, len - 1)]``; after the last step the stream ends with OK);
    ``dra``: also serve ``v1.DRAPlugin`` / ``v1beta1.DRAPlugin`` answering
    ``prepare``. Every call's method path is appended to :attr:`calls`; open
    streams are counted in :attr:`open_streams`.
    """

    def __init__(
        self,
        path: str,
        *,
        health: Sequence[str] = (api.DRA_HEALTH_V1,),
        scripts: Sequence[Sequence[Step]] = ((STALL,),),
        dra: bool = True,
        prepare: PrepareScript | None = None,
    ) -> None:
        self.path = path
        self.health = tuple(health)
        self.scripts = [list(s) for s in scripts]
        self.dra = dra
        self.prepare = prepare or PrepareScript()
        self.calls: list[str] = []
        self.requests: list[Any] = []
        self.open_streams = 0
        self.cancelled_streams = 0
        self.server: grpc.aio.Server | None = None

    def count(self, method: str) -> int:
        return self.calls.count(method)

    @property
    def watch_calls(self) -> int:
        return sum(1 for c in self.calls if c.endswith("/NodeWatchResources"))

    async def start(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        server = grpc.aio.server()
        for service in self.health:
            server.add_generic_rpc_handlers((self._health_handler(service),))
        if self.dra:
            for service, pb in ((api.DRA_V1_SERVICE, api.dra_v1), (api.DRA_V1BETA1_SERVICE,
                                                                   api.dra_v1beta1)):  # fmt: skip
                server.add_generic_rpc_handlers((self._dra_handler(service, pb),))
        server.add_insecure_port(f"unix://{self.path}")
        await server.start()
        self.server = server

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
            self.server = None

    def _health_handler(self, service: str) -> grpc.GenericRpcHandler:
        method = f"/{service}/NodeWatchResources"

        async def watch(request: bytes, context: _Context) -> AsyncIterator[bytes]:
            index = self.count(method)
            self.calls.append(method)
            script = self.scripts[min(index, len(self.scripts) - 1)]
            self.open_streams += 1
            try:
                for step in script:
                    if isinstance(step, bytes):
                        yield step
                    elif isinstance(step, float | int):
                        await asyncio.sleep(step)
                    elif isinstance(step, grpc.StatusCode):
                        await context.abort(step, f"scripted {step.name}")
                    else:
                        await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled_streams += 1
                raise
            finally:
                self.open_streams -= 1

        handler = grpc.unary_stream_rpc_method_handler(
            watch, request_deserializer=None, response_serializer=None
        )
        return grpc.method_handlers_generic_handler(service, {"NodeWatchResources": handler})

    def _dra_handler(self, service: str, pb: Any) -> grpc.GenericRpcHandler:
        async def prepare(request: Any, context: _Context) -> Any:
            self.calls.append(f"/{service}/NodePrepareResources")
            self.requests.append(request)
            script = self.prepare
            if script.delay:
                await asyncio.sleep(script.delay)
            if script.abort is not None:
                await context.abort(script.abort, "scripted failure")
            out = pb.NodePrepareResourcesResponse()
            for claim in request.claims:
                reply = out.claims[claim.uid]
                if claim.uid in script.errors:
                    text, extra = script.errors[claim.uid]
                    reply.error = text
                    if extra:
                        reply.MergeFromString(extra)
                    continue
                for pool, device, requests, cdi in script.devices.get(claim.uid, []):
                    reply.devices.add(
                        pool_name=pool,
                        device_name=device,
                        request_names=requests,
                        cdi_device_ids=cdi,
                    )
            return out

        async def unprepare(request: Any, context: _Context) -> Any:
            self.calls.append(f"/{service}/NodeUnprepareResources")
            self.requests.append(request)
            if self.prepare.abort is not None:
                await context.abort(self.prepare.abort, "scripted failure")
            out = pb.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                out.claims[claim.uid].error = self.prepare.unprepare_errors.get(claim.uid, "")
            return out

        return grpc.method_handlers_generic_handler(
            service,
            {
                "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
                    prepare,
                    request_deserializer=pb.NodePrepareResourcesRequest.FromString,
                    response_serializer=pb.NodePrepareResourcesResponse.SerializeToString,
                ),
                "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
                    unprepare,
                    request_deserializer=pb.NodeUnprepareResourcesRequest.FromString,
                    response_serializer=pb.NodeUnprepareResourcesResponse.SerializeToString,
                ),
            },
        )


@asynccontextmanager
async def running(plugin: RawPlugin) -> AsyncIterator[RawPlugin]:
    await plugin.start()
    try:
        yield plugin
    finally:
        await plugin.stop()


def fast_backoff() -> Backoff:
    return Backoff(0.01, 0.05, jitter=0.0)


class Recorder:
    """Collects what a stream reports and every state it passes through."""

    def __init__(self) -> None:
        self.reports: list[list[ReportedDevice]] = []
        self.states: list[str] = []

    def on_report(self, devices: list[ReportedDevice]) -> None:
        self.reports.append(devices)

    def on_state(self, state: str) -> None:
        self.states.append(state)


@asynccontextmanager
async def streaming(
    path: str, service: str = api.DRA_HEALTH_V1, **kw: Any
) -> AsyncIterator[tuple[HealthStream, Recorder]]:
    rec = Recorder()
    kw.setdefault("backoff", fast_backoff())
    async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
        stream = HealthStream(
            channel, service, driver="gpu.example.com", on_report=rec.on_report,
            on_state=rec.on_state, **kw,
        )  # fmt: skip
        stream.start()
        try:
            yield stream, rec
        finally:
            await stream.stop()


# -- conversion and versions ------------------------------------------------------------


@pytest.mark.parametrize("service", [api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1])
async def test_messages_are_converted_and_forwarded_one_to_one(sockdir: str, service: str) -> None:
    long = "é" * 600  # 1200 bytes: cut on a character boundary, ends "..."
    first = response(dev("gpu-0", U, "XID 79", 7), dev("gpu-1", H), ("p", "d", 9, long, -5))
    second = response(dev("gpu-0", H))
    path = f"{sockdir}/dra.sock"
    async with (
        running(RawPlugin(path, health=[service], scripts=[[first, second, STALL]])) as p,
        streaming(path, service) as (stream, rec),
    ):
        await eventually(lambda: len(rec.reports) == 2)
        assert p.calls == [f"/{service}/NodeWatchResources"]
    cut = rec.reports[0][2].message
    assert rec.reports[0][:2] == [
        ReportedDevice("pool", "gpu-0", U, "XID 79", 7),
        ReportedDevice("pool", "gpu-1", H, "", 0),
    ]
    assert rec.reports[0][2].health is X  # unknown wire number 9 reads Unknown
    assert rec.reports[0][2].timeout_seconds == -5  # raw: the cache resolves it
    assert len(cut.encode()) <= api.HEALTH_MESSAGE_MAX_BYTES and cut.endswith("...")
    assert rec.reports[1] == [ReportedDevice("pool", "gpu-0", H, "", 0)]
    assert stream.messages == 2 and stream.reconnects == 0
    assert stream.last_message_at is not None
    assert rec.states == ["streaming", "stopped"]


async def test_bad_arguments_are_refused(sockdir: str) -> None:
    async with grpc.aio.insecure_channel(f"unix:{sockdir}/x.sock") as ch:
        with pytest.raises(ValueError, match=r"unknown dra-health service 'v2.DRAResourceHealth'"):
            HealthStream(ch, "v2.DRAResourceHealth", driver="d", on_report=print)
        with pytest.raises(ValueError, match="default_timeout must be"):
            HealthStream(ch, api.DRA_HEALTH_V1, driver="d", on_report=print, default_timeout=0)
        with pytest.raises(ValueError, match="default_timeout must be"):
            HealthStream(
                ch, api.DRA_HEALTH_V1, driver="d", on_report=print, default_timeout=float("nan")
            )
        stream = HealthStream(ch, api.DRA_HEALTH_V1, driver="d", on_report=print)
        await stream.stop()  # before start: fine
        assert stream.state == "stopped"
        stream.start()
        with pytest.raises(RuntimeError, match="already started"):
            stream.start()
        await stream.stop()
        await stream.stop()  # idempotent


# -- ends, errors and reconnects -----------------------------------------------------


async def test_clean_end_of_stream_reconnects_with_backoff(sockdir: str) -> None:
    path = f"{sockdir}/dra.sock"
    msg = response(dev("gpu-0", H))
    async with (
        running(RawPlugin(path, scripts=[[msg]])) as plugin,
        streaming(path) as (stream, rec),
    ):
        await eventually(lambda: plugin.watch_calls >= 3)
        await eventually(lambda: len(rec.reports) >= 3)
    assert stream.reconnects >= 2
    assert rec.states[:4] == ["streaming", "backoff", "connecting", "streaming"]


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN]
)
async def test_error_reconnects_and_keeps_going(sockdir: str, code: grpc.StatusCode) -> None:
    path = f"{sockdir}/dra.sock"
    msg = response(dev("gpu-0", U, "bad"))
    async with (
        running(RawPlugin(path, scripts=[[msg, code], [msg, STALL]])) as plugin,
        streaming(path) as (stream, rec),
    ):
        await eventually(lambda: len(rec.reports) == 2)
        assert plugin.watch_calls == 2
        assert stream.state == "streaming" and stream.reconnects == 1


async def test_backoff_grows_while_failing_and_resets_after_a_message(sockdir: str) -> None:
    path = f"{sockdir}/dra.sock"
    backoff = Backoff(0.01, 0.04, jitter=0.0)
    scripts: list[list[Step]] = [[grpc.StatusCode.UNAVAILABLE]] * 3
    scripts.append([response(dev("gpu-0", H)), grpc.StatusCode.UNAVAILABLE])
    scripts.append([STALL])
    async with (
        running(RawPlugin(path, scripts=scripts)) as plugin,
        streaming(path, backoff=backoff) as (stream, rec),
    ):
        await eventually(lambda: plugin.watch_calls == 5)
        assert len(rec.reports) == 1
        # 3 failures grew it to 0.04 (capped); the message reset it, the next
        # failure used the initial delay again.
        assert backoff.peek_base() == 0.02
        assert stream.reconnects == 4


async def test_plugin_restart_on_same_socket_recovers_without_clearing(sockdir: str) -> None:
    path = f"{sockdir}/dra.sock"
    msg = response(dev("gpu-0", U, "ECC"))
    async with streaming(path) as (stream, rec):
        await eventually(lambda: stream.reconnects >= 2, what="retries while plugin is absent")
        assert stream.state in ("backoff", "connecting") and rec.reports == []
        plugin = RawPlugin(path, scripts=[[msg, STALL]])
        async with running(plugin):
            await eventually(lambda: len(rec.reports) == 1)
        # stopped: the stream fails and retries; nothing is reported on its behalf
        await eventually(lambda: stream.state in ("backoff", "connecting"))
        assert len(rec.reports) == 1
        async with running(RawPlugin(path, scripts=[[msg, STALL]])):
            await eventually(lambda: len(rec.reports) == 2)
            assert stream.state == "streaming"


async def test_unimplemented_is_terminal_and_logged_at_info(
    sockdir: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = f"{sockdir}/dra.sock"
    caplog.set_level(logging.INFO, logger="drahealth.node._stream")
    async with (
        running(RawPlugin(path, scripts=[[grpc.StatusCode.UNIMPLEMENTED]])) as plugin,
        streaming(path) as (stream, rec),
    ):
        await eventually(lambda: stream.state == "unimplemented")
        await asyncio.sleep(0.5)
        assert plugin.watch_calls == 1
        assert not stream.running and stream.reconnects == 0
    assert rec.states == ["unimplemented", "stopped"]
    records = [r for r in caplog.records if "does not implement" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    ours = [r for r in caplog.records if r.name.startswith("drahealth")]
    assert not [r for r in ours if r.levelno >= logging.WARNING]


async def test_service_not_served_at_all_is_unimplemented(sockdir: str) -> None:
    path = f"{sockdir}/dra.sock"
    async with running(RawPlugin(path, health=[])) as plugin, streaming(path) as (stream, _rec):
        await eventually(lambda: stream.state == "unimplemented")
        assert plugin.calls == []  # gRPC itself answered: no such method


async def test_on_report_exception_is_logged_and_stream_continues(
    sockdir: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = f"{sockdir}/dra.sock"
    seen: list[int] = []

    def explode(devices: list[ReportedDevice]) -> None:
        seen.append(len(devices))
        raise RuntimeError("consumer broke")

    msg = response(dev("gpu-0", H))
    async with (
        running(RawPlugin(path, scripts=[[msg, 0.01, msg, STALL]])),
        grpc.aio.insecure_channel(f"unix:{path}") as ch,
    ):
        stream = HealthStream(ch, api.DRA_HEALTH_V1, driver="d", on_report=explode)
        stream.start()
        await eventually(lambda: len(seen) == 2)
        assert stream.state == "streaming" and stream.reconnects == 0
        await stream.stop()
    assert "health report callback failed" in caplog.text


async def test_stop_cancels_the_call_on_the_plugin(sockdir: str) -> None:
    path = f"{sockdir}/dra.sock"
    async with running(RawPlugin(path, scripts=[[response(dev("gpu-0", H)), STALL]])) as plugin:
        async with streaming(path) as (stream, rec):
            await eventually(lambda: plugin.open_streams == 1 and len(rec.reports) == 1)
        assert stream.state == "stopped" and not stream.running
        await eventually(lambda: plugin.open_streams == 0, what="server saw the cancellation")
        assert plugin.cancelled_streams == 1 and plugin.watch_calls == 1


# -- watchdog ----------------------------------------------------------------------------


async def test_watchdog_reconnects_a_stalled_stream_after_the_lease(sockdir: str) -> None:
    path = f"{sockdir}/dra.sock"
    one_second = response(dev("gpu-0", H, timeout=1))
    async with (
        running(RawPlugin(path, scripts=[[one_second, STALL]])) as plugin,
        streaming(path) as (stream, rec),
    ):
        await eventually(lambda: len(rec.reports) == 1)
        t0 = time.monotonic()
        await eventually(lambda: plugin.watch_calls == 2, within=3.0)
        waited = time.monotonic() - t0
        assert 0.8 < waited < 1.8
        assert stream.watchdog_expiries == 1 and stream.reconnects == 1
        await eventually(lambda: plugin.open_streams == 1)  # the stalled call was cancelled


async def test_watchdog_uses_the_smallest_lease_seen_on_the_stream(sockdir: str) -> None:
    path = f"{sockdir}/dra.sock"
    short = response(dev("gpu-0", H, timeout=1), dev("gpu-1", H, timeout=60))
    long = response(dev("gpu-0", H, timeout=60))  # does not lengthen the watchdog
    async with (
        running(RawPlugin(path, scripts=[[short, 0.2, long, STALL]])) as plugin,
        streaming(path, default_timeout=60) as (stream, rec),
    ):
        await eventually(lambda: len(rec.reports) == 2)
        t0 = time.monotonic()
        await eventually(lambda: plugin.watch_calls == 2, within=3.0)
        assert time.monotonic() - t0 < 1.5
        assert stream.watchdog_expiries == 1


async def test_watchdog_uses_default_before_first_message_and_for_empty_reports(
    sockdir: str,
) -> None:
    path = f"{sockdir}/dra.sock"
    scripts: list[list[Step]] = [[STALL], [response(), STALL], [STALL]]
    async with (
        running(RawPlugin(path, scripts=scripts)) as plugin,
        streaming(path, default_timeout=0.3) as (stream, rec),
    ):
        await eventually(lambda: plugin.watch_calls == 3, within=3.0)
        assert rec.reports == [[]]
        assert stream.watchdog_expiries == 2


async def test_watchdog_off_waits_forever(sockdir: str) -> None:
    path = f"{sockdir}/dra.sock"
    async with (
        running(RawPlugin(path, scripts=[[STALL]])) as plugin,
        streaming(path, default_timeout=0.1, watchdog=False) as (stream, _rec),
    ):
        await eventually(lambda: plugin.open_streams == 1)
        await asyncio.sleep(0.4)
        assert plugin.watch_calls == 1 and stream.watchdog_expiries == 0


# -- against the driver toolkit's HealthHub ----------------------------------------------


@asynccontextmanager
async def hub_plugin(path: str, hub: HealthHub) -> AsyncIterator[None]:
    server = grpc.aio.server()
    hub.add_to_server(server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield
    finally:
        await server.stop(0)


@pytest.mark.parametrize("service", [api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1])
async def test_health_hub_snapshots_and_changes_arrive(sockdir: str, service: str) -> None:
    path = f"{sockdir}/dra.sock"
    hub = HealthHub([("node-1", "gpu-0"), ("node-1", "gpu-1")], default_timeout_seconds=20)
    async with hub_plugin(path, hub), streaming(path, service) as (stream, rec):
        await eventually(lambda: len(rec.reports) == 1)
        assert [(d.device, d.health, d.timeout_seconds) for d in rec.reports[0]] == [
            ("gpu-0", X, 20),
            ("gpu-1", X, 20),
        ]
        hub.submit("nvml", [DeviceReport("node-1", "gpu-1", U, "XID 79")])
        await eventually(lambda: any(d.health is U for d in rec.reports[-1]))
        assert rec.reports[-1][1] == ReportedDevice("node-1", "gpu-1", U, "XID 79", 20)
        assert stream.reconnects == 0


async def test_health_hub_without_health_support_is_unimplemented(sockdir: str) -> None:
    path = f"{sockdir}/dra.sock"
    hub = HealthHub([("node-1", "gpu-0")], supported=False)
    async with hub_plugin(path, hub), streaming(path) as (stream, rec):
        await eventually(lambda: stream.state == "unimplemented")
        assert rec.reports == [] and hub.stream_count == 0
