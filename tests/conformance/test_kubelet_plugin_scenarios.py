"""Conformance: stream-handler, plugin-manager, helper and end-to-end scenarios of reference
section 8 (numbers 12-16, 20-23, 25-27, 29 and 34).

Replayed against the agent's real pieces over real unix sockets: :class:`PluginRegistry`
(instances, DRA clients, one fenced stream per driver), :class:`HealthStream`,
:class:`HealthPipeline` (cache + durable store + listeners) and :class:`ClaimTracker`
(device -> claims -> pods), with the raw scripted plugins of the node integration tests and
the driver toolkit's ``HealthHub`` as peers. One test (or parametrized test) per scenario;
where the agent deliberately replaces upstream behaviour with a fix of section 9, the test
name ends with ``_fixN`` and its docstring names the fix.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from drahealth import api
from drahealth.core import DeviceKey, Health
from drahealth.core._records import ClaimInfo, HealthChange, PreparedDeviceInfo, ReportedDevice
from drahealth.driver._hub import DeviceReport, HealthHub
from drahealth.node._claims import ClaimTracker
from drahealth.node._pipeline import HealthPipeline
from drahealth.node._registry import DriverNotRegisteredError, PluginRegistry, PrepareReply
from drahealth.node._stream import pick_health_service
from drahealth.node._types import PluginInfo, RegistrationError
from tests.integration.node.test_registry_plugins import (
    WITH_HEALTH,
    CountingProxy,
    Sink,
    base,
    open_registry,
    raw_info,
    toolkit_plugin,
)
from tests.integration.node.test_stream import (
    STALL,
    PrepareScript,
    RawPlugin,
    Step,
    dev,
    eventually,
    hub_plugin,
    response,
    running,
    streaming,
)

D = "gpu.example.com"
H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN
POD = "pod-uid-p"
NO_HEALTH = (api.DRA_PLUGIN_V1,)
STREAM_LOG = "drahealth.node._stream"

# The ``base`` fixture (a short per-test socket directory) is imported from the registry
# tests; naming it here marks the import as used.
__all__ = ["base"]


class Node:
    """Registry -> pipeline -> affected pods, wired as the kubelet mode wires them."""

    def __init__(self, state_dir: str) -> None:
        self.pipeline = HealthPipeline(state_dir)
        self.tracker = ClaimTracker(state_dir)
        self.updates: list[set[str]] = []  # one entry per pod notification: the pods told
        self.pipeline.add_listener(self._on_changes)
        self.registry = PluginRegistry(on_report=self.pipeline.report)

    def _on_changes(self, changes: list[HealthChange]) -> None:
        pods = self.tracker.pods_for(c.key for c in changes)
        if pods:
            self.updates.append(pods)

    def claim(self, device: str, pod: str = POD) -> None:
        """Track a claim on ``device`` as the upstream test builds it (no plugin call)."""
        info = ClaimInfo("ns", "claim", "claim-uid", (_prepared(device),))
        self.tracker.add(info, pod)

    async def prepare(self, uid: str, pod: str = POD) -> ClaimInfo:
        """Prepare claim ``uid`` through the plugin and track the devices it answered."""
        replies = await self.registry.dra_client(D).prepare([("ns", f"claim-{uid}", uid)])
        info = ClaimInfo("ns", f"claim-{uid}", uid, replies[uid].devices)
        self.tracker.add(info, pod)
        return info

    def get(self, device: str) -> tuple[Health, str]:
        return self.pipeline.cache.get(D, "pool", device)


def _prepared(device: str) -> PreparedDeviceInfo:
    return PreparedDeviceInfo(D, "pool", device)


@asynccontextmanager
async def node(base: str) -> AsyncIterator[Node]:
    n = Node(f"{base}/state")
    await n.pipeline.start()
    try:
        yield n
    finally:
        await n.registry.close()
        await n.pipeline.stop()


# -- stream handler (12-16) ----------------------------------------------------------------


async def test_s12_unhealthy_report_notifies_the_claims_pod_and_eof_keeps_the_cache_fix6(
    base: str,
) -> None:
    """12; fix 6: after the plugin ends the stream (EOF) the agent reconnects and keeps the
    device's health (upstream returns nil and clears the driver)."""
    path = f"{base}/p.sock"
    snapshot, bad = response(dev("gpu-0", H)), response(dev("gpu-0", U, "XID 79", 60))
    prepare = PrepareScript(devices={"claim-uid": [("pool", "gpu-0", ["gpus"], [])]})
    plugin = RawPlugin(path, scripts=[[snapshot, 0.5, bad], [STALL]], prepare=prepare)
    async with running(plugin), node(base) as n:
        await n.registry.register(raw_info(path))
        await eventually(lambda: n.get("gpu-0") == (H, ""), what="the snapshot")
        info = await n.prepare("claim-uid")
        assert info.devices == (PreparedDeviceInfo(D, "pool", "gpu-0", ("gpus",)),)
        assert n.pipeline.updates == 1 and n.updates == []  # Unhealthy not sent yet
        await eventually(lambda: n.updates == [{POD}], within=2.0, what="pod update")
        assert n.get("gpu-0") == (U, "XID 79")
        await eventually(lambda: plugin.watch_calls == 2, what="reconnect after EOF")
        await asyncio.sleep(0.1)
        assert n.get("gpu-0") == (U, "XID 79")
        assert n.updates == [{POD}] and n.pipeline.updates == 2


async def test_s13_unallocated_device_updates_the_cache_but_no_pod(base: str) -> None:
    path = f"{base}/p.sock"
    plugin = RawPlugin(path, scripts=[[response(dev("gpu-9", U, "bad", 60)), STALL]])
    async with running(plugin), node(base) as n:
        n.claim("gpu-0")
        await n.registry.register(raw_info(path))
        await eventually(lambda: n.pipeline.updates == 1, what="the report")
        await asyncio.sleep(0.2)
        assert n.get("gpu-9") == (U, "bad")
        assert n.updates == []


async def test_s14_same_report_again_is_no_update(base: str) -> None:
    path = f"{base}/p.sock"
    same = response(dev("gpu-0", U, "XID 79", 60))
    plugin = RawPlugin(path, scripts=[[same, 0.05, same, 0.05, same, STALL]])
    async with running(plugin), node(base) as n:
        n.claim("gpu-0")
        await n.registry.register(raw_info(path))
        await eventually(lambda: n.pipeline.updates == 3, what="three messages")
        assert n.updates == [{POD}]
        assert n.get("gpu-0") == (U, "XID 79")


async def test_s15_stream_error_reconnects_and_keeps_the_cache_fix6(
    base: str, caplog: pytest.LogCaptureFixture
) -> None:
    """15; fix 6: upstream returns the wrapped error and clears the driver; the agent logs
    the error, reconnects with backoff and keeps the health until the lease ends."""
    caplog.set_level(logging.INFO, logger=STREAM_LOG)
    path = f"{base}/p.sock"
    scripts: list[list[Step]] = [
        [response(dev("gpu-0", U, "XID 79", 60)), grpc.StatusCode.INTERNAL],
        [STALL],
    ]
    plugin = RawPlugin(path, scripts=scripts)
    async with running(plugin), node(base) as n:
        n.claim("gpu-0")
        await n.registry.register(raw_info(path))
        await eventually(lambda: plugin.watch_calls == 2, what="reconnect after the error")
        stream = n.registry.stream(D)
        assert stream is not None and stream.reconnects == 1 and stream.messages == 1
        assert n.get("gpu-0") == (U, "XID 79") and n.updates == [{POD}]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"health stream {api.WATCH_V1_METHOD} of DRA driver {D}: "
        "stream failed: INTERNAL: scripted INTERNAL; reconnecting"
    ]


async def test_s16_stopping_the_stream_cancels_the_call_on_the_plugin(base: str) -> None:
    """16: the agent's context cancellation is ``HealthStream.stop()``."""
    path = f"{base}/p.sock"
    plugin = RawPlugin(path, scripts=[[response(dev("gpu-0", H)), STALL]])
    async with running(plugin):
        async with streaming(path) as (stream, rec):
            await eventually(lambda: plugin.open_streams == 1 and len(rec.reports) == 1)
        assert stream.state == "stopped" and not stream.running
        assert rec.states[-1] == "stopped"
        await eventually(lambda: plugin.cancelled_streams == 1, what="server-side cancel")
        assert plugin.open_streams == 0 and plugin.watch_calls == 1 and stream.reconnects == 0


async def test_s16_deregistering_the_plugin_cancels_its_stream(base: str) -> None:
    """16: deregistration cancels the call; the cache keeps the health (fix 6)."""
    path = f"{base}/p.sock"
    plugin = RawPlugin(path, scripts=[[response(dev("gpu-0", U, "XID 79", 60)), STALL]])
    async with running(plugin), node(base) as n:
        await n.registry.register(raw_info(path))
        stream = n.registry.stream(D)
        assert stream is not None
        await eventually(lambda: plugin.open_streams == 1 and n.pipeline.updates == 1)
        await n.registry.deregister(raw_info(path))
        assert stream.state == "stopped" and n.registry.stream(D) is None
        await eventually(lambda: plugin.cancelled_streams == 1, what="server-side cancel")
        assert plugin.watch_calls == 1 and n.get("gpu-0") == (U, "XID 79")


async def test_s16_deregister_right_after_register_leaves_no_stream_fix20(base: str) -> None:
    """16; fix 20: a removal racing the stream's start still cancels it (no start race)."""
    path = f"{base}/p.sock"
    plugin = RawPlugin(path, scripts=[[response(dev("gpu-0", H)), STALL]])
    sink = Sink()
    async with running(plugin), open_registry(sink) as reg:
        await reg.register(raw_info(path))
        stream = reg.stream(D)
        assert stream is not None
        await reg.deregister(raw_info(path))
        assert stream.state == "stopped" and not stream.running
        await asyncio.sleep(0.3)
        assert plugin.open_streams == 0 and plugin.watch_calls <= 1
        assert sink.reports == [] and sink.events == [(D, "activate", 1), (D, "deactivate", 1)]


# -- plugin manager (20-23, 25) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ([api.DRA_PLUGIN_V1BETA1], None),
        ([], None),
        ([api.DRA_PLUGIN_V1, api.DRA_HEALTH_V1ALPHA1], api.DRA_HEALTH_V1ALPHA1),
        ([api.DRA_PLUGIN_V1, api.DRA_HEALTH_V1], api.DRA_HEALTH_V1),
        ([api.DRA_PLUGIN_V1, api.DRA_HEALTH_V1ALPHA1, api.DRA_HEALTH_V1], api.DRA_HEALTH_V1),
        ([api.DRA_PLUGIN_V1, api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1], api.DRA_HEALTH_V1),
    ],
    ids=["v1beta1-only", "none", "v1alpha1", "v1", "both", "both-reversed"],
)
def test_s20_pick_health_service(versions: list[str], expected: str | None) -> None:
    assert pick_health_service(versions) == expected


def test_s20_pick_health_service_refuses_a_bare_string() -> None:
    with pytest.raises(
        TypeError,
        match=re.escape("versions must be a sequence of registration strings, not one string"),
    ):
        pick_health_service(api.DRA_HEALTH_V1)


async def test_s21_plugin_without_health_gets_no_stream_for_a_second(base: str) -> None:
    sink = Sink()
    path = f"{base}/p.sock"
    plugin = RawPlugin(path, health=[api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1])
    async with running(plugin), open_registry(sink) as reg:
        await reg.register(raw_info(path, NO_HEALTH))
        await asyncio.sleep(1.0)
        assert plugin.calls == [] and reg.stream(D) is None and reg.active_health(D) is None
        assert sink.reports == [] and sink.events == [] and reg.generation(D) == 0


async def test_s22_unimplemented_is_called_exactly_once(
    base: str, caplog: pytest.LogCaptureFixture
) -> None:
    """22 (master; fix 8 of 1.34-1.36): terminal, logged at info, never as an error."""
    caplog.set_level(logging.INFO, logger=STREAM_LOG)
    sink = Sink()
    path = f"{base}/p.sock"
    plugin = RawPlugin(path, scripts=[[grpc.StatusCode.UNIMPLEMENTED]])
    async with running(plugin), open_registry(sink) as reg:
        await reg.register(raw_info(path))
        stream = reg.stream(D)
        assert stream is not None
        await eventually(lambda: stream.state == "unimplemented")
        assert not stream.running
        await asyncio.sleep(0.5)
        assert plugin.calls == [api.WATCH_V1_METHOD] and stream.reconnects == 0
        assert sink.reports == []
    records = [r for r in caplog.records if r.name == STREAM_LOG]
    assert [r.levelno for r in records] == [logging.INFO]
    assert (
        records[0]
        .getMessage()
        .startswith(
            f"DRA driver {D} does not implement {api.WATCH_V1_METHOD} (scripted UNIMPLEMENTED); "
        )
    )


async def test_s23_instances_same_endpoint_refused_newest_preferred_removal(base: str) -> None:
    first, second = f"{base}/a.sock", f"{base}/b.sock"
    async with (
        running(RawPlugin(first, health=[])) as one,
        running(RawPlugin(second, health=[])) as two,
        open_registry(Sink()) as reg,
    ):
        await reg.register(raw_info(first, NO_HEALTH))
        refused = f"endpoint {first} already registered for DRA driver plugin {D}"
        with pytest.raises(RegistrationError, match=f"^{re.escape(refused)}$"):
            await reg.register(raw_info(first, NO_HEALTH))
        assert reg.instances(D) == [raw_info(first, NO_HEALTH)]
        await reg.register(raw_info(second, NO_HEALTH))
        assert [i.endpoint for i in reg.instances(D)] == [first, second]
        assert reg.dra_client(D).endpoint == second
        assert await reg.dra_client(D).unprepare([("ns", "c", "uid-c")]) == {"uid-c": ""}
        assert two.calls == [api.NODE_UNPREPARE_V1_METHOD] and one.calls == []
        await reg.deregister(raw_info(first, NO_HEALTH))
        assert [i.endpoint for i in reg.instances(D)] == [second]
        assert reg.dra_client(D).endpoint == second
        await reg.deregister(raw_info(second, NO_HEALTH))
        assert reg.instances(D) == [] and reg.drivers() == []
        with pytest.raises(DriverNotRegisteredError, match=f"^DRA driver {D} is not registered$"):
            reg.dra_client(D)


async def test_s25_generations_activate_and_deactivate_fix7(base: str) -> None:
    """25; fix 7: one authoritative, generation-fenced stream per driver (PR #140842) instead
    of upstream's one stream per instance writing a shared cache."""
    old, new, bare = f"{base}/old.sock", f"{base}/new.sock", f"{base}/bare.sock"
    sink = Sink()
    async with (
        running(RawPlugin(old)) as old_plugin,
        running(RawPlugin(new)) as new_plugin,
        open_registry(sink) as reg,
    ):
        await reg.register(raw_info(old))
        await eventually(lambda: old_plugin.open_streams == 1, what="old instance's stream")
        await reg.register(raw_info(new))
        assert sink.events == [(D, "activate", 1), (D, "activate", 2)]  # handover, no deactivate
        await eventually(lambda: old_plugin.cancelled_streams == 1, what="old stream cancelled")
        await eventually(lambda: new_plugin.open_streams == 1, what="new instance's stream")
        await reg.deregister(raw_info(old))
        assert sink.events[2:] == []
        assert reg.active_health(D) == (raw_info(new), 2, api.DRA_HEALTH_V1)
        await reg.deregister(raw_info(new))
        assert sink.events[2:] == [(D, "deactivate", 2)]
        assert reg.active_health(D) is None and reg.generation(D) == 2
        assert old_plugin.watch_calls == 1 and new_plugin.watch_calls == 1

    other = "nic.example.com"
    sink = Sink()
    async with (
        running(RawPlugin(old)) as old_plugin,
        running(RawPlugin(bare, health=[])),
        open_registry(sink) as reg,
    ):
        await reg.register(raw_info(old, driver=other))
        await reg.register(PluginInfo(other, bare, NO_HEALTH, bare))
        assert sink.events == [(other, "activate", 1), (other, "deactivate", 1)]
        assert reg.stream(other) is None  # no fallback to the older instance's health
        await eventually(lambda: old_plugin.open_streams == 0, what="old stream ended")
        assert old_plugin.watch_calls <= 1


# -- helper (26, 27) -------------------------------------------------------------------------


async def test_s26_toolkit_without_health_support_answers_unimplemented(base: str) -> None:
    path = f"{base}/p.sock"
    hub = HealthHub([("pool", "gpu-0")], supported=False)
    assert hub.advertised_services() == []
    async with hub_plugin(path, hub), streaming(path) as (stream, rec):
        await eventually(lambda: stream.state == "unimplemented")
        assert rec.reports == [] and stream.messages == 0 and hub.stream_count == 0


async def test_s27_toolkit_forwards_reports_one_to_one_and_heartbeats_only_the_drivers_state(
    base: str,
) -> None:
    """27: the hub is the driver's own health model, so its heartbeat (the re-send the
    helper contract asks of the driver) repeats the driver's latest state unchanged."""
    path = f"{base}/p.sock"
    hub = HealthHub([("pool", "gpu-0"), ("pool", "gpu-1")], default_timeout_seconds=1)
    initial = [ReportedDevice("pool", "gpu-0", X, "", 1), ReportedDevice("pool", "gpu-1", X, "", 1)]
    after = [
        ReportedDevice("pool", "gpu-0", U, "XID 79", 1),
        ReportedDevice("pool", "gpu-1", H, "", 1),
    ]
    async with hub_plugin(path, hub), streaming(path) as (stream, rec):
        await eventually(lambda: len(rec.reports) == 1, what="the snapshot")
        assert rec.reports == [initial]
        hub.submit(
            "probe",
            [DeviceReport("pool", "gpu-0", U, "XID 79"), DeviceReport("pool", "gpu-1", H)],
        )
        await eventually(lambda: rec.reports[-1] == after, what="the change")
        sent = len(rec.reports)
        await eventually(lambda: len(rec.reports) >= sent + 2, within=2.0, what="heartbeats")
        distinct = [r for i, r in enumerate(rec.reports) if i == 0 or r != rec.reports[i - 1]]
        assert distinct == [initial, after]
        assert stream.watchdog_expiries == 0 and stream.reconnects == 0


@pytest.mark.parametrize(
    ("devices", "default", "lease"),
    [
        ([dev("gpu-0", U, "XID 79", 1), dev("gpu-1", H, "", 0)], 30.0, "1"),
        ([dev("gpu-0", H, "", 0), dev("gpu-1", H, "", -5)], 0.4, "0.4"),
        ([], 0.4, "0.4"),
    ],
    ids=["smallest-lease", "non-positive-is-default", "empty-report-is-default"],
)
async def test_s27_stale_watchdog_uses_the_smallest_lease_fix19(
    base: str,
    caplog: pytest.LogCaptureFixture,
    devices: list[tuple[str, str, int, str, int]],
    default: float,
    lease: str,
) -> None:
    """27; fix 19: the helper only warns about stale reports; the agent's own watchdog
    reconnects a stream silent for the smallest lease (<= 0 or empty report: default)."""
    caplog.set_level(logging.INFO, logger=STREAM_LOG)
    path = f"{base}/p.sock"
    scripts: list[list[Step]] = [[response(*devices), STALL], [STALL]]
    plugin = RawPlugin(path, scripts=scripts)
    async with running(plugin), streaming(path, default_timeout=default) as (stream, rec):
        await eventually(lambda: len(rec.reports) == 1, what="the report")
        started = time.monotonic()
        # forwarded raw, one message -> one report (timeouts <= 0 are resolved by the cache)
        assert rec.reports[0] == [
            ReportedDevice(pool, device, Health.from_wire(health), message, timeout)
            for pool, device, health, message, timeout in devices
        ]
        await eventually(lambda: stream.watchdog_expiries == 1, within=3.0, what="watchdog")
        assert time.monotonic() - started < float(lease) + 0.8
        await eventually(lambda: plugin.watch_calls == 2, what="the reconnect")
    expected = (
        f"health stream {api.WATCH_V1_METHOD} of DRA driver {D}: "
        f"no message within the {lease} s lease (stalled stream); reconnecting"
    )
    assert expected in [r.getMessage() for r in caplog.records if r.name == STREAM_LOG]


# -- end to end (29, 34) ----------------------------------------------------------------------


async def test_s29_prepare_unprepare_and_health_share_one_connection(base: str) -> None:
    real = f"{base}/real.sock"
    proxy = CountingProxy(f"{base}/proxy.sock", real)
    prepare = PrepareScript(devices={f"uid-{p}": [("pool", f"gpu-{p}", [], [])] for p in "ab"})
    plugin = RawPlugin(real, scripts=[[response(dev("gpu-a", H)), STALL]], prepare=prepare)
    sink = Sink()
    async with running(plugin), open_registry(sink) as reg:
        await proxy.start()
        try:
            await reg.register(raw_info(proxy.listen))
            await eventually(lambda: len(sink.reports) == 1, what="health over the proxy")
            client = reg.dra_client(D)
            for pod in "ab":
                claim = ("ns", f"claim-{pod}", f"uid-{pod}")
                assert await client.prepare([claim]) == {
                    f"uid-{pod}": PrepareReply(
                        devices=(PreparedDeviceInfo(D, "pool", f"gpu-{pod}"),)
                    )
                }
                assert await client.unprepare([claim]) == {f"uid-{pod}": ""}
            assert plugin.calls == [api.WATCH_V1_METHOD] + 2 * [
                api.NODE_PREPARE_V1_METHOD,
                api.NODE_UNPREPARE_V1_METHOD,
            ]
            assert proxy.accepted == 1
        finally:
            await reg.close()
            await proxy.stop()


@pytest.mark.parametrize(
    ("served", "advertised", "expected"),
    [
        (
            [api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1],
            (*WITH_HEALTH, api.DRA_HEALTH_V1ALPHA1),
            api.WATCH_V1_METHOD,
        ),
        (
            [api.DRA_HEALTH_V1ALPHA1],
            (api.DRA_PLUGIN_V1, api.DRA_HEALTH_V1ALPHA1),
            api.WATCH_V1ALPHA1_METHOD,
        ),
        ([api.DRA_HEALTH_V1], (api.DRA_PLUGIN_V1, api.DRA_HEALTH_V1), api.WATCH_V1_METHOD),
    ],
    ids=["both-versions-v1-only-called", "v1alpha1-only", "v1-only"],
)
async def test_s34_negotiation_calls_exactly_one_health_method(
    base: str, served: list[str], advertised: tuple[str, ...], expected: str
) -> None:
    path = f"{base}/p.sock"
    plugin = RawPlugin(path, health=served, scripts=[[response(dev("gpu-0", H)), STALL]])
    sink = Sink()
    async with running(plugin), open_registry(sink) as reg:
        await reg.register(raw_info(path, advertised))
        await eventually(lambda: len(sink.reports) == 1, what="a report")
        await asyncio.sleep(0.2)
        assert plugin.calls == [expected]
        assert sink.reports == [(D, [ReportedDevice("pool", "gpu-0", H)])]


async def test_s34_toolkit_driver_serving_both_versions_is_called_over_v1(base: str) -> None:
    hub = HealthHub([("pool", "gpu-0")])
    sink = Sink()
    async with toolkit_plugin(base, hub) as (_handle, info), open_registry(sink) as reg:
        assert api.DRA_HEALTH_V1 in info.versions and api.DRA_HEALTH_V1ALPHA1 in info.versions
        await reg.register(info)
        await eventually(lambda: len(sink.reports) >= 1, what="a report")
        assert reg.active_health(D) == (info, 1, api.DRA_HEALTH_V1)
        assert hub.stream_count == 1
        assert sink.cache.get(D, "pool", "gpu-0") == (X, "")
        assert DeviceKey(D, "pool", "gpu-0") in {e.key for e in sink.cache.entries()}
