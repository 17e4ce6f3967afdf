"""PluginRegistry against real plugins on real unix sockets.

Peers: the driver toolkit (``drahealth.driver.start`` with a ``HealthHub``), the
raw plugins of ``test_stream`` (scripted dra-health and DRA services that count every
call), and a unix-socket proxy that counts accepted connections. Reports go to a
recorder and, where a test says so, into a real ``HealthCache``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from drahealth import api
from drahealth.core import Health
from drahealth.core._health_cache import HealthCache
from drahealth.core._records import PreparedDeviceInfo, ReportedDevice
from drahealth.driver._hub import DeviceReport, HealthHub
from drahealth.driver._plugin import PluginHandle
from drahealth.driver._plugin import start as start_plugin
from drahealth.driver._prepare import error_type_field
from drahealth.driver._types import (
    ClaimError,
    ClaimRef,
    ErrorKind,
    PluginOptions,
    PreparedClaimRequest,
    PrepareResult,
)
from drahealth.kube import Backoff
from drahealth.node._registry import PluginRegistry, PrepareReply
from drahealth.node._types import PluginInfo
from drahealth.node._watcher import PluginWatcher
from tests.integration.node.test_stream import (
    STALL,
    PrepareScript,
    RawPlugin,
    dev,
    eventually,
    response,
    running,
)

D = "gpu.example.com"
H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN
WITH_HEALTH = (api.DRA_PLUGIN_V1, api.DRA_PLUGIN_V1BETA1, api.DRA_HEALTH_V1)
POD_A = "0b7a7c4e-0000-4000-8000-00000000000a"
POD_B = "0b7a7c4e-0000-4000-8000-00000000000b"

# -- helpers (also used by the conformance tests) -----------------------------------------


class Sink:
    """Records the registry's reports and events; feeds reports into a HealthCache."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, list[ReportedDevice]]] = []
        self.events: list[tuple[str, str, int]] = []
        self.cache = HealthCache()

    def on_report(self, driver: str, devices: list[ReportedDevice]) -> None:
        self.reports.append((driver, devices))
        self.cache.update(driver, devices)

    def on_event(self, driver: str, kind: str, generation: int) -> None:
        self.events.append((driver, kind, generation))

    def registry(self, **kw: Any) -> PluginRegistry:
        kw.setdefault("backoff_factory", lambda: Backoff(0.01, 0.05, jitter=0.0))
        return PluginRegistry(on_report=self.on_report, on_event=self.on_event, **kw)

    def messages(self) -> list[str]:
        return [d.message for _, devices in self.reports for d in devices]


@asynccontextmanager
async def open_registry(sink: Sink, **kw: Any) -> AsyncIterator[PluginRegistry]:
    registry = sink.registry(**kw)
    try:
        yield registry
    finally:
        await registry.close()


def raw_info(path: str, versions: Sequence[str] = WITH_HEALTH, driver: str = D) -> PluginInfo:
    return PluginInfo(driver, path, tuple(versions), path)


class TinyDriver:
    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        return {c.uid: PrepareResult.ok([]) for c in claims}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        return {c.uid: None for c in claims}


@asynccontextmanager
async def toolkit_plugin(
    base: str, hub: HealthHub | None, pod_uid: str | None = None, **kw: Any
) -> AsyncIterator[tuple[PluginHandle, PluginInfo]]:
    """A toolkit plugin (rolling-update names when ``pod_uid`` is set) and its PluginInfo."""
    options = PluginOptions(
        D,
        registry_dir=f"{base}/plugins_registry",
        plugins_dir=f"{base}/plugins",
        cdi_dir=f"{base}/cdi",
        pod_uid=pod_uid,
        **kw,
    )
    handle = await start_plugin(TinyDriver(), options, health=hub)
    info = PluginInfo(D, handle.endpoint, tuple(handle.supported_versions), handle.registrar_socket)
    try:
        yield handle, info
    finally:
        await handle.stop(0)


class CountingProxy:
    """Listens on ``listen`` and forwards every connection to ``target``, counting them."""

    def __init__(self, listen: str, target: str) -> None:
        self.listen = listen
        self.target = target
        self.accepted = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._handle, path=self.listen)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.target)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            writer.close()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


@pytest.fixture
def base() -> Iterator[str]:
    d = tempfile.mkdtemp(dir="/tmp", prefix="dhp-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def hub(message: str, health: Health = H, **kw: Any) -> HealthHub:
    h = HealthHub([("node-1", "gpu-0")], **kw)
    h.submit("probe", [DeviceReport("node-1", "gpu-0", health, message)])
    return h


# -- health streams from the driver toolkit ---------------------------------------------


async def test_toolkit_reports_reach_on_report_tagged_with_the_driver(base: str) -> None:
    sink = Sink()
    source = hub("XID 79", U)
    async with toolkit_plugin(base, source) as (_, info), open_registry(sink) as reg:
        await reg.register(info)
        await eventually(lambda: len(sink.reports) >= 1)
        assert sink.reports[0] == (D, [ReportedDevice("node-1", "gpu-0", U, "XID 79", 30)])
        assert reg.active_health(D) == (info, 1, api.DRA_HEALTH_V1)
        assert source.stream_count == 1
        source.submit("probe", [DeviceReport("node-1", "gpu-0", H, "recovered")])
        await eventually(lambda: sink.cache.get(D, "node-1", "gpu-0") == (H, "recovered"))


async def test_rolling_update_only_the_newest_instance_reports_and_removal_wipes_nothing(
    base: str,
) -> None:
    sink = Sink()
    old_hub, new_hub = hub("old", U), hub("new", H)
    async with (
        toolkit_plugin(base, old_hub, POD_A) as (old_handle, old),
        toolkit_plugin(base, new_hub, POD_B) as (_, new),
        open_registry(sink) as reg,
    ):
        await reg.register(old)
        await eventually(lambda: sink.messages() == ["old"])
        await reg.register(new)
        await eventually(lambda: "new" in sink.messages())
        cut = len(sink.reports)
        assert sink.messages()[cut - 1] == "new"
        # the old instance keeps changing its mind: none of it reaches on_report
        await eventually(lambda: old_hub.stream_count == 0, what="old stream closed")
        old_hub.submit("probe", [DeviceReport("node-1", "gpu-0", U, "old again")])
        new_hub.submit("probe", [DeviceReport("node-1", "gpu-0", H, "new again")])
        await eventually(lambda: "new again" in sink.messages())
        assert all(m.startswith("new") for m in sink.messages()[cut - 1 :])
        assert sink.events == [(D, "activate", 1), (D, "activate", 2)]
        # the old instance goes away: nothing is cleared, no event, health stays
        await reg.deregister(old)
        await old_handle.stop(0)
        await asyncio.sleep(0.05)
        assert sink.cache.get(D, "node-1", "gpu-0") == (H, "new again")
        assert sink.events == [(D, "activate", 1), (D, "activate", 2)]
        assert reg.active_health(D) == (new, 2, api.DRA_HEALTH_V1)
        assert reg.instances(D) == [new]


async def test_plugin_restart_on_the_same_socket_resumes_without_clearing(base: str) -> None:
    sink = Sink()
    async with open_registry(sink) as reg:
        async with toolkit_plugin(base, hub("ECC", U)) as (_, info):
            await reg.register(info)
            await eventually(lambda: len(sink.reports) == 1)
        # plugin gone: the stream retries, the health stays until its lease ends
        stream = reg.stream(D)
        assert stream is not None
        await eventually(lambda: stream.reconnects >= 1)
        assert sink.cache.get(D, "node-1", "gpu-0") == (U, "ECC")
        async with toolkit_plugin(base, hub("fixed", H)) as (_, again):
            assert again.endpoint == info.endpoint
            await eventually(lambda: sink.cache.get(D, "node-1", "gpu-0") == (H, "fixed"))
            assert reg.stream(D) is stream and reg.generation(D) == 1


async def test_deregistration_cancels_the_stream_on_the_plugin(base: str) -> None:
    sink = Sink()
    source = hub("ok")
    async with toolkit_plugin(base, source) as (_, info), open_registry(sink) as reg:
        await reg.register(info)
        await eventually(lambda: source.stream_count == 1)
        await reg.deregister(info)
        await eventually(lambda: source.stream_count == 0, what="plugin saw the cancel")
        assert reg.drivers() == [] and sink.events[-1] == (D, "deactivate", 1)


async def test_health_gate_off_never_opens_a_stream(base: str) -> None:
    sink = Sink()
    source = hub("ok")
    async with (
        toolkit_plugin(base, source) as (_, info),
        open_registry(sink, health_enabled=False) as reg,
    ):
        await reg.register(info)
        await asyncio.sleep(0.2)
        assert source.stream_count == 0 and sink.reports == [] and sink.events == []
        # the DRA service still works
        replies = await reg.dra_client(D).prepare([("ns", "c", "uid-1")])
        assert "no Kubernetes API access" in replies["uid-1"].error


async def test_watcher_registry_and_toolkit_end_to_end(base: str) -> None:
    sink = Sink()
    source = hub("XID 48", U)
    async with open_registry(sink) as reg:
        watcher = PluginWatcher(
            f"{base}/plugins_registry", reg, allowed_roots=[base], rescan_interval=0.05
        )
        os.makedirs(f"{base}/plugins_registry")
        await watcher.start()
        try:
            async with toolkit_plugin(base, source) as (handle, info):
                await asyncio.wait_for(handle.registered.wait(), 5)
                await eventually(lambda: sink.cache.get(D, "node-1", "gpu-0") == (U, "XID 48"))
                assert reg.instances(D) == [info]
            await eventually(lambda: reg.drivers() == [], what="deregistered by the watcher")
            assert sink.events == [(D, "activate", 1), (D, "deactivate", 1)]
        finally:
            await watcher.stop()


# -- raw plugins: which stream is opened, and how often ----------------------------------


async def test_v1alpha1_only_plugin_is_streamed_over_v1alpha1(base: str) -> None:
    sink = Sink()
    path = f"{base}/alpha.sock"
    msg = response(dev("gpu-0", U, "alpha"))
    plugin = RawPlugin(path, health=[api.DRA_HEALTH_V1ALPHA1], scripts=[[msg, STALL]])
    async with running(plugin), open_registry(sink) as reg:
        await reg.register(raw_info(path, (api.DRA_PLUGIN_V1, api.DRA_HEALTH_V1ALPHA1)))
        await eventually(lambda: sink.messages() == ["alpha"])
        assert plugin.calls == [api.WATCH_V1ALPHA1_METHOD]


async def test_v1_only_plugin_is_streamed_over_v1(base: str) -> None:
    sink = Sink()
    path = f"{base}/v1.sock"
    plugin = RawPlugin(path, health=[api.DRA_HEALTH_V1], scripts=[[response(dev("g", H)), STALL]])
    async with running(plugin), open_registry(sink) as reg:
        await reg.register(raw_info(path, (api.DRA_PLUGIN_V1, api.DRA_HEALTH_V1)))
        await eventually(lambda: len(sink.reports) == 1)
        assert plugin.calls == [api.WATCH_V1_METHOD]


async def test_plugin_advertising_no_health_gets_no_stream(base: str) -> None:
    sink = Sink()
    path = f"{base}/quiet.sock"
    # it serves both health versions, but does not advertise them
    plugin = RawPlugin(path, health=[api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1])
    async with running(plugin), open_registry(sink) as reg:
        await reg.register(raw_info(path, (api.DRA_PLUGIN_V1,)))
        await asyncio.sleep(0.5)
        assert plugin.watch_calls == 0 and reg.stream(D) is None and sink.events == []


async def test_unimplemented_plugin_is_called_exactly_once(base: str) -> None:
    sink = Sink()
    path = f"{base}/unimpl.sock"
    plugin = RawPlugin(path, scripts=[[grpc.StatusCode.UNIMPLEMENTED]])
    async with running(plugin), open_registry(sink) as reg:
        await reg.register(raw_info(path))
        await asyncio.sleep(0.5)
        assert plugin.calls == [api.WATCH_V1_METHOD]
        stream = reg.stream(D)
        assert stream is not None and stream.state == "unimplemented"


async def test_stalled_plugin_is_reconnected_after_its_lease(base: str) -> None:
    sink = Sink()
    path = f"{base}/stall.sock"
    plugin = RawPlugin(path, scripts=[[response(dev("gpu-0", H, "ok", timeout=1)), STALL]])
    async with running(plugin), open_registry(sink) as reg:
        await reg.register(raw_info(path))
        await eventually(lambda: len(sink.reports) == 1)
        t0 = time.monotonic()
        await eventually(lambda: plugin.watch_calls == 2, within=3.0)
        assert 0.8 < time.monotonic() - t0 < 1.8
        stream = reg.stream(D)
        assert stream is not None and stream.reconnects == 1 and stream.watchdog_expiries == 1
        await eventually(lambda: len(sink.reports) == 2)  # the new stream's snapshot


# -- DRA calls ----------------------------------------------------------------------------


def ok_script() -> PrepareScript:
    return PrepareScript(
        devices={
            "uid-a": [("node-1", "gpu-0", ["gpus"], ["k8s.gpu.example.com/claim=uid-a-gpu-0"])],
            "uid-b": [("node-1", "gpu-1", ["a", "b"], []), ("node-1", "gpu-2", [], [])],
        },
        errors={
            "uid-p": (
                "device gpu-3 is broken",
                error_type_field(ClaimError("x", ErrorKind.PERMANENT_DEVICE)),
            ),
            "uid-t": ("try later", error_type_field(ClaimError("x", ErrorKind.TRANSIENT))),
        },
        unprepare_errors={"uid-b": "still in use"},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("versions", "method_prefix"),
    [
        ((api.DRA_PLUGIN_V1, api.DRA_PLUGIN_V1BETA1), f"/{api.DRA_V1_SERVICE}/"),
        ((api.DRA_PLUGIN_V1BETA1, api.DRA_PLUGIN_V1), f"/{api.DRA_V1BETA1_SERVICE}/"),
    ],
    ids=["v1", "v1beta1"],
)
async def test_prepare_and_unprepare_in_the_negotiated_version(
    base: str, versions: tuple[str, ...], method_prefix: str
) -> None:
    path = f"{base}/dra.sock"
    plugin = RawPlugin(path, health=[], prepare=ok_script())
    async with running(plugin), open_registry(Sink()) as reg:
        await reg.register(raw_info(path, versions))
        client = reg.dra_client(D)
        claims = [("ns", n, f"uid-{n}") for n in ("a", "b", "p", "t", "missing")]
        replies = await client.prepare(claims)
        assert replies == {
            "uid-a": PrepareReply(
                devices=(
                    PreparedDeviceInfo(
                        D, "node-1", "gpu-0", ("gpus",), ("k8s.gpu.example.com/claim=uid-a-gpu-0",)
                    ),
                )
            ),
            "uid-b": PrepareReply(
                devices=(
                    PreparedDeviceInfo(D, "node-1", "gpu-1", ("a", "b")),
                    PreparedDeviceInfo(D, "node-1", "gpu-2"),
                )
            ),
            "uid-p": PrepareReply(error="device gpu-3 is broken", permanent=True),
            "uid-t": PrepareReply(error="try later", permanent=False),
            "uid-missing": PrepareReply(),  # the raw plugin answers every claim
        }
        errors = await client.unprepare([("ns", "a", "uid-a"), ("ns", "b", "uid-b")])
        assert errors == {"uid-a": "", "uid-b": "still in use"}
        assert plugin.calls == [
            method_prefix + "NodePrepareResources",
            method_prefix + "NodeUnprepareResources",
        ]
        sent = plugin.requests[0]
        assert [(c.namespace, c.name, c.uid) for c in sent.claims] == claims
        assert client.last_call_ok


async def test_failed_calls_become_transient_per_claim_errors(base: str) -> None:
    path = f"{base}/dra.sock"
    plugin = RawPlugin(path, health=[], prepare=PrepareScript(abort=grpc.StatusCode.INTERNAL))
    async with running(plugin), open_registry(Sink(), call_timeout=0.2) as reg:
        await reg.register(raw_info(path, (api.DRA_PLUGIN_V1,)))
        client = reg.dra_client(D)
        replies = await client.prepare([("ns", "a", "uid-a"), ("ns", "b", "uid-b")])
        assert set(replies) == {"uid-a", "uid-b"}
        assert replies["uid-a"].error == "NodePrepareResources failed: INTERNAL: scripted failure"
        assert not replies["uid-a"].permanent
        errors = await client.unprepare([("ns", "a", "uid-a")])
        assert errors == {"uid-a": "NodeUnprepareResources failed: INTERNAL: scripted failure"}
        plugin.prepare = PrepareScript(delay=1.0)
        slow = await client.prepare([("ns", "a", "uid-a")])
        assert slow["uid-a"].error.startswith("NodePrepareResources failed: DEADLINE_EXCEEDED")
        assert client.timeout == 0.2


async def test_unreachable_plugin_gives_transient_errors(base: str) -> None:
    async with open_registry(Sink()) as reg:
        await reg.register(raw_info(f"{base}/nobody.sock"))
        replies = await reg.dra_client(D).prepare([("ns", "a", "uid-a")])
        assert replies["uid-a"].error.startswith("NodePrepareResources failed: UNAVAILABLE")


@pytest.mark.parametrize("first", [api.DRA_PLUGIN_V1, api.DRA_PLUGIN_V1BETA1])
async def test_toolkit_prepare_errors_and_unprepare(base: str, first: str) -> None:
    async with (
        toolkit_plugin(base, None, enable_error_type_field=True) as (_, info),
        open_registry(Sink()) as reg,
    ):
        versions = (first, *(v for v in info.versions if v != first))
        await reg.register(PluginInfo(D, info.endpoint, versions, info.registration_socket))
        client = reg.dra_client(D)
        assert client.service == first
        replies = await client.prepare([("ns", "claim-1", "uid-1")])
        assert replies["uid-1"].error == (
            "no Kubernetes API access configured; cannot fetch ResourceClaim ns/claim-1"
        )
        assert not replies["uid-1"].permanent and replies["uid-1"].devices == ()
        assert await client.unprepare([("ns", "claim-1", "uid-1")]) == {"uid-1": ""}


async def test_dra_calls_go_to_the_newest_connected_instance(base: str) -> None:
    old_path, new_path = f"{base}/old.sock", f"{base}/new.sock"
    old = RawPlugin(old_path, health=[], dra=True)
    new = RawPlugin(new_path, health=[], dra=True)
    async with running(old), open_registry(Sink()) as reg:
        await reg.register(raw_info(old_path))
        await new.start()
        try:
            await reg.register(raw_info(new_path))
            await eventually(lambda: reg.dra_client(D).endpoint == new_path, what="new ready")
            got = await reg.dra_client(D).unprepare([("ns", "a", "uid-a")])
            assert got == {"uid-a": ""}
            assert new.calls and not old.calls
        finally:
            await new.stop()
        # the newest instance's plugin is gone: calls go to the older, connected one
        await eventually(lambda: reg.dra_client(D).endpoint == old_path, what="fallback")
        await reg.dra_client(D).unprepare([("ns", "a", "uid-a")])
        assert old.calls == [f"/{api.DRA_V1_SERVICE}/NodeUnprepareResources"]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(new_path)
        async with running(RawPlugin(new_path, health=[], dra=True)):
            await eventually(lambda: reg.dra_client(D).endpoint == new_path, what="back")
