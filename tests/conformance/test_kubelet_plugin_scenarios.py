"""Conformance: stream-handler, plugin-manager and helper scenarios of reference section 8.

Scenarios 12-16, 20-23, 25-27, 29 and 34, run against the agent's real pieces over real
unix sockets: :class:`PluginRegistry` (instances, DRA clients, one fenced stream per
driver), :class:`HealthPipeline` (cache + durable store + listeners) and
:class:`ClaimTracker` (device -> claims -> pods), with raw scripted plugins and the
driver toolkit's ``HealthHub`` as peers. Where the agent deliberately replaces upstream
behaviour with a fix of section 9, the test name ends with ``_fixN``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from drahealth import api
from drahealth.core import DeviceKey, Health
from drahealth.core._records import ClaimInfo, HealthChange, PreparedDeviceInfo, ReportedDevice
from drahealth.driver._hub import HealthHub
from drahealth.node._claims import ClaimTracker
from drahealth.node._pipeline import HealthPipeline
from drahealth.node._registry import DriverNotRegisteredError, PluginRegistry
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
    RawPlugin,
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

__all__ = ["base"]


class Node:
    """Registry -> pipeline -> affected pods, wired as the kubelet mode wires them."""

    def __init__(self, state_dir: str) -> None:
        self.pipeline = HealthPipeline(state_dir)
        self.tracker = ClaimTracker(state_dir)
        self.updates: list[set[str]] = []  # one entry per notification: the pods told
        self.pipeline.add_listener(self._on_changes)
        self.registry = PluginRegistry(on_report=self.pipeline.report)

    def _on_changes(self, changes: list[HealthChange]) -> None:
        pods = self.tracker.pods_for(c.key for c in changes)
        if pods:
            self.updates.append(pods)

    def claim(self, device: str, pod: str = POD) -> None:
        info = ClaimInfo("ns", "claim", "claim-uid", (PreparedDeviceInfo(D, "pool", device),))
        self.tracker.add(info, pod)

    def get(self, device: str) -> tuple[Health, str]:
        return self.pipeline.cache.get(D, "pool", device)


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
    """12; fix 6: after the stream's EOF the cache keeps the device's health (leases decide)."""
    path = f"{base}/p.sock"
    plugin = RawPlugin(path, scripts=[[response(dev("gpu-0", U, "XID 79", 60))], [STALL]])
    async with running(plugin), node(base) as n:
        n.claim("gpu-0")
        await n.registry.register(raw_info(path))
        await eventually(lambda: n.updates == [{POD}], within=2.0, what="pod update")
        assert n.get("gpu-0") == (U, "XID 79")
        await eventually(lambda: plugin.watch_calls == 2, what="reconnect after EOF")
        assert n.get("gpu-0") == (U, "XID 79") and n.updates == [{POD}]


async def test_s13_unallocated_device_updates_the_cache_but_no_pod(base: str) -> None:
    path = f"{base}/p.sock"
    plugin = RawPlugin(path, scripts=[[response(dev("gpu-9", U, "bad", 60)), STALL]])
    async with running(plugin), node(base) as n:
        n.claim("gpu-0")
        await n.registry.register(raw_info(path))
        await eventually(lambda: n.get("gpu-9")[0] is U, what="cache update")
        await asyncio.sleep(0.2)
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


async def test_s15_stream_error_reconnects_and_keeps_the_cache_fix6(base: str) -> None:
    """15; fix 6: upstream returns the wrapped error and clears the driver; the agent
    reconnects with backoff and keeps the health until the lease ends."""
    path = f"{base}/p.sock"
    scripts = [[response(dev("gpu-0", U, "XID 79", 60)), grpc.StatusCode.INTERNAL], [STALL]]
    plugin = RawPlugin(path, scripts=scripts)
    async with running(plugin), node(base) as n:
        await n.registry.register(raw_info(path))
        await eventually(lambda: plugin.watch_calls == 2, what="reconnect after the error")
        stream = n.registry.stream(D)
        assert stream is not None and stream.reconnects == 1
        assert n.get("gpu-0") == (U, "XID 79")


async def test_s16_cancelling_the_stream_cancels_the_call_on_the_plugin(base: str) -> None:
    path = f"{base}/p.sock"
    plugin = RawPlugin(path, scripts=[[response(dev("gpu-0", H)), STALL]])
    async with running(plugin):
        async with streaming(path) as (stream, rec):
            await eventually(lambda: plugin.open_streams == 1 and len(rec.reports) == 1)
        assert stream.state == "stopped" and rec.states[-1] == "stopped"
        await eventually(lambda: plugin.cancelled_streams == 1, what="server-side cancel")


# -- plugin manager (20-23, 25) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ([api.DRA_PLUGIN_V1BETA1], None),
        ([], None),
        ([api.DRA_PLUGIN_V1, api.DRA_HEALTH_V1ALPHA1], api.DRA_HEALTH_V1ALPHA1),
        ([api.DRA_PLUGIN_V1, api.DRA_HEALTH_V1], api.DRA_HEALTH_V1),
        ([api.DRA_HEALTH_V1ALPHA1, api.DRA_HEALTH_V1], api.DRA_HEALTH_V1),
    ],
)
def test_s20_pick_health_service(versions: list[str], expected: str | None) -> None:
    assert pick_health_service(versions) == expected


async def test_s21_plugin_without_health_gets_no_stream_for_a_second(base: str) -> None:
    sink = Sink()
    path = f"{base}/p.sock"
    plugin = RawPlugin(path, health=[api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1])
    async with running(plugin), open_registry(sink) as reg:
        await reg.register(raw_info(path, NO_HEALTH))
        await asyncio.sleep(1.0)
        assert plugin.watch_calls == 0 and reg.stream(D) is None and sink.reports == []


async def test_s22_unimplemented_is_called_exactly_once(base: str) -> None:
    sink = Sink()
    path = f"{base}/p.sock"
    plugin = RawPlugin(path, scripts=[[grpc.StatusCode.UNIMPLEMENTED]])
    async with running(plugin), open_registry(sink) as reg:
        await reg.register(raw_info(path))
        await eventually(lambda: (s := reg.stream(D)) is not None and s.state == "unimplemented")
        await asyncio.sleep(0.5)
        assert plugin.calls == [api.WATCH_V1_METHOD]


async def test_s23_instances_same_endpoint_refused_newest_preferred_removal(base: str) -> None:
    first, second = f"{base}/a.sock", f"{base}/b.sock"
    async with (
        running(RawPlugin(first, health=[])) as one,
        running(RawPlugin(second, health=[])) as two,
        open_registry(Sink()) as reg,
    ):
        await reg.register(raw_info(first, NO_HEALTH))
        with pytest.raises(RegistrationError, match=f"endpoint {first} already registered"):
            await reg.register(raw_info(first, NO_HEALTH))
        await reg.register(raw_info(second, NO_HEALTH))
        await eventually(lambda: reg.dra_client(D).endpoint == second, what="newest preferred")
        assert await reg.dra_client(D).unprepare([("ns", "c", "uid-c")]) == {"uid-c": ""}
        assert two.calls and not one.calls
        await reg.deregister(raw_info(first, NO_HEALTH))
        assert [i.endpoint for i in reg.instances(D)] == [second]
        await reg.deregister(raw_info(second, NO_HEALTH))
        with pytest.raises(DriverNotRegisteredError, match=f"^DRA driver {D} is not registered$"):
            reg.dra_client(D)


async def test_s25_generations_activate_and_deactivate_as_in_pr_140842(base: str) -> None:
    """25 (PR #140842, unmerged upstream): the agent's fencing follows it, with real plugins."""
    old, new, bare = f"{base}/old.sock", f"{base}/new.sock", f"{base}/bare.sock"
    sink = Sink()
    async with (
        running(RawPlugin(old)),
        running(RawPlugin(new)),
        running(RawPlugin(bare, health=[])),
        open_registry(sink) as reg,
    ):
        await reg.register(raw_info(old))
        await reg.register(raw_info(new))
        assert sink.events == [(D, "activate", 1), (D, "activate", 2)]
        await reg.deregister(raw_info(old))
        assert sink.events[2:] == []
        await reg.deregister(raw_info(new))
        assert sink.events[2:] == [(D, "deactivate", 2)]

    other = "nic.example.com"
    sink = Sink()
    async with (
        running(RawPlugin(old)),
        running(RawPlugin(bare, health=[])),
        open_registry(sink) as reg,
    ):
        await reg.register(raw_info(old, driver=other))
        await reg.register(PluginInfo(other, bare, NO_HEALTH, bare))
        assert sink.events == [(other, "activate", 1), (other, "deactivate", 1)]
        assert reg.stream(other) is None  # no fallback to the older instance's health


# -- helper (26, 27) -------------------------------------------------------------------------


async def test_s26_toolkit_without_health_support_answers_unimplemented(base: str) -> None:
    path = f"{base}/p.sock"
    hub = HealthHub([("pool", "gpu-0")], supported=False)
    async with hub_plugin(path, hub), streaming(path) as (stream, rec):
        await eventually(lambda: stream.state == "unimplemented")
        assert rec.reports == [] and hub.stream_count == 0


async def test_s27_reports_forwarded_one_to_one_and_watchdog_uses_the_smallest_lease(
    base: str,
) -> None:
    path = f"{base}/p.sock"
    first = response(dev("gpu-0", U, "XID 79", 1), dev("gpu-1", H, "", 0))
    plugin = RawPlugin(path, scripts=[[first, STALL]])
    async with running(plugin), streaming(path, default_timeout=30) as (stream, rec):
        await eventually(lambda: len(rec.reports) == 1)
        assert rec.reports[0] == [
            ReportedDevice("pool", "gpu-0", U, "XID 79", 1),
            ReportedDevice("pool", "gpu-1", H, "", 0),  # raw: <= 0 is resolved by the cache
        ]
        # the smallest lease (1 s; 0 means the 30 s default) drives the watchdog
        await eventually(lambda: stream.watchdog_expiries == 1, within=2.5, what="watchdog")
        await eventually(lambda: plugin.watch_calls == 2, what="the reconnect")


# -- end to end (29, 34) ----------------------------------------------------------------------


async def test_s29_prepare_unprepare_and_health_share_one_connection(base: str) -> None:
    real = f"{base}/real.sock"
    proxy = CountingProxy(f"{base}/proxy.sock", real)
    plugin = RawPlugin(real, scripts=[[response(dev("gpu-0", H)), STALL]])
    sink = Sink()
    async with running(plugin), open_registry(sink) as reg:
        await proxy.start()
        try:
            await reg.register(raw_info(proxy.listen))
            await eventually(lambda: len(sink.reports) == 1, what="health over the proxy")
            client = reg.dra_client(D)
            for pod in ("a", "b"):
                await client.prepare([("ns", f"claim-{pod}", f"uid-{pod}")])
                assert await client.unprepare([("ns", f"claim-{pod}", f"uid-{pod}")]) == {
                    f"uid-{pod}": ""
                }
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


async def test_s34_toolkit_driver_serving_both_versions_is_called_over_v1(base: str) -> None:
    hub = HealthHub([("pool", "gpu-0")])
    sink = Sink()
    async with toolkit_plugin(base, hub) as (_handle, info), open_registry(sink) as reg:
        assert api.DRA_HEALTH_V1 in info.versions and api.DRA_HEALTH_V1ALPHA1 in info.versions
        await reg.register(info)
        await eventually(lambda: len(sink.reports) >= 1, what="a report")
        active = reg.active_health(D)
        assert active is not None and active[2] == api.DRA_HEALTH_V1
        assert hub.stream_count == 1
        assert sink.cache.get(D, "pool", "gpu-0") == (X, "")
        assert DeviceKey(D, "pool", "gpu-0") in {e.key for e in sink.cache.entries()}
