"""What ``start()`` runs beside the kubelet sockets, over real sockets and real HTTP.

A driver that hands ``start`` a hub and a ``Pool`` gets, from options alone: its
ResourceSlice published against the embedded API server, latched faults as NoSchedule
slice taints (NoExecute only when asked), the control socket (``drahealth inject``'s
client), a permanent prepare fault reported to the hub, latched devices refused before
the driver runs, ``/metrics``, signal handling, and everything stopped with the handle.
Bad options fail before any socket is bound, naming the option.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import aiohttp
import grpc
import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import Device
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType
from prometheus_client import CollectorRegistry

from drahealth import api
from drahealth.controlplane import APIServer
from drahealth.core import Health
from drahealth.driver import (
    PREPARE_FAULT_SOURCE,
    TAINT_STORE_NAME,
    ClaimRef,
    ControlError,
    DeviceReport,
    DriverMetrics,
    DriverResources,
    ErrorKind,
    HealthHub,
    PluginOptions,
    Pool,
    PreparedClaimRequest,
    PreparedDevice,
    PrepareResult,
    SliceValidationError,
    TaintPolicy,
    control_request,
    control_socket_path,
    start,
)
from drahealth.kube import make_client

pytestmark = pytest.mark.timeout(60)

DRIVER = "fpga.example.com"
NODE = "node-1"
CARDS = [f"fpga-{i}" for i in range(3)]


class Recorder:
    """Prepares every result; fails ``broken`` cards with PERMANENT_DEVICE."""

    def __init__(self, broken: Sequence[str] = ()) -> None:
        self.broken = set(broken)
        self.seen: list[str] = []

    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        out = {}
        for c in claims:
            self.seen.append(c.uid)
            bad = [r for r in c.results if r.device in self.broken]
            if bad:
                out[c.uid] = PrepareResult.failed(
                    "card does not answer", ErrorKind.PERMANENT_DEVICE, device=(NODE, bad[0].device)
                )
            else:
                out[c.uid] = PrepareResult.ok(
                    [PreparedDevice([r.request], r.pool, r.device) for r in c.results]
                )
        return out

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        return {c.uid: None for c in claims}


@pytest.fixture
def base() -> Iterator[str]:
    d = tempfile.mkdtemp(dir="/tmp", prefix="dhs-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def kube() -> AsyncIterator[AsyncClient]:
    server = APIServer()
    await server.start(port=0)
    client = make_client(server_url=server.url)
    try:
        await client.create(Node(metadata=ObjectMeta(name=NODE)))
        yield client
    finally:
        await client.close()
        await server.stop()


def hub_of() -> HealthHub:
    hub = HealthHub([(NODE, c) for c in CARDS])
    hub.submit("probe", [DeviceReport(NODE, c, Health.HEALTHY) for c in CARDS])
    return hub


def options(base: str, client: AsyncClient | None = None, **kw: Any) -> PluginOptions:
    kw.setdefault("node_name", NODE)
    return PluginOptions(
        DRIVER,
        registry_dir=f"{base}/reg",
        plugins_dir=f"{base}/plugins",
        cdi_dir=f"{base}/cdi",
        state_dir=f"{base}/state",
        kube_client=client,
        **kw,
    )


def exists(path: str) -> bool:
    return os.path.exists(path)


def pool() -> Pool:
    return Pool([Device(name=c) for c in CARDS])


async def eventually(check: Any, timeout: float = 20.0) -> Any:  # noqa: ASYNC109
    async with asyncio.timeout(timeout):
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.05)


async def slice_taints(client: AsyncClient) -> dict[str, list[tuple[str, str]]] | None:
    slices = [s async for s in client.list(ResourceSlice) if s.spec.driver == DRIVER]
    if len(slices) != 1:
        return None
    return {
        d.name: [(t.key, t.effect) for t in d.taints or []] for d in slices[0].spec.devices or []
    }


async def prepare(client: AsyncClient, socket_path: str, card: str, name: str) -> Any:
    created = await client.create(
        ResourceClaim.from_dict(
            {
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "f"}}]}
                },
            }
        )
    )
    await client.patch(
        ResourceClaim.Status,
        name,
        {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "r", "driver": DRIVER, "pool": NODE, "device": card}
                        ]
                    }
                }
            }
        },
        namespace="default",
        patch_type=PatchType.MERGE,
    )
    uid = created.metadata.uid
    async with grpc.aio.insecure_channel(f"unix://{socket_path}") as ch:
        reply = await api.dra_v1_grpc.DRAPluginStub(ch).NodePrepareResources(
            api.dra_v1.NodePrepareResourcesRequest(
                claims=[api.dra_v1.Claim(namespace="default", name=name, uid=uid)]
            ),
            timeout=20,
        )
    return reply.claims[uid]


async def test_slices_noschedule_taints_and_the_control_socket(
    base: str, kube: AsyncClient
) -> None:
    hub = hub_of()
    handle = await start(Recorder(), options(base, kube), health=hub, resources=pool())
    try:
        assert handle.hub is hub and handle.publisher is not None and handle.taints is not None
        assert handle.control is not None
        assert handle.control.path == control_socket_path(f"{base}/state")
        assert await eventually(lambda: slice_taints(kube)) == {c: [] for c in CARDS}

        # drahealth inject's client: a latched fault -> NoSchedule (the safe default)
        reply = await control_request(handle.control.path, "unhealthy", "fpga-1", "ECC")
        assert (reply["health"], reply["sticky"]) == ("Unhealthy", True)
        want = {"fpga-0": [], "fpga-1": [(f"{DRIVER}/unhealthy", "NoSchedule")], "fpga-2": []}

        async def tainted() -> bool:
            return await slice_taints(kube) == want

        await eventually(tainted)
        assert exists(f"{base}/state/{TAINT_STORE_NAME}")
        # ... and an operator's recovery clears it
        await control_request(handle.control.path, "healthy", "fpga-1")

        async def clean() -> bool:
            return await slice_taints(kube) == {c: [] for c in CARDS}

        await eventually(clean)
        with pytest.raises(ControlError, match="unknown device 'fpga-9'"):
            await control_request(handle.control.path, "unhealthy", "fpga-9")
    finally:
        await handle.stop()
        hub.close()
    assert not exists(control_socket_path(f"{base}/state"))
    assert handle.publisher is not None and handle.publisher.creates >= 1  # kept after stop


async def test_noexecute_only_when_the_author_chooses_it(base: str, kube: AsyncClient) -> None:
    hub = hub_of()
    opts = options(base, kube, taint_policy=TaintPolicy(DRIVER, unhealthy_effect="NoExecute"))
    handle = await start(Recorder(), opts, health=hub, resources=pool())
    try:
        hub.submit("probe", [DeviceReport(NODE, "fpga-2", Health.UNHEALTHY, "gone")])

        async def evicting() -> bool:
            return (await slice_taints(kube) or {}).get("fpga-2") == [
                (f"{DRIVER}/unhealthy", "NoExecute")
            ]

        await eventually(evicting)
    finally:
        await handle.stop()
        hub.close()


async def test_prepare_faults_reach_the_hub_and_latched_cards_are_refused(
    base: str, kube: AsyncClient
) -> None:
    hub = hub_of()
    driver = Recorder(broken=["fpga-0"])
    seen: list[tuple[str, str, str]] = []
    opts = options(base, kube, refuse_unhealthy=True, on_device_fault=lambda *a: seen.append(a))
    handle = await start(driver, opts, health=hub, resources=pool())
    try:
        # the driver's PERMANENT_DEVICE error: a fatal report from source "prepare",
        # and the author's own callback still runs
        reply = await prepare(kube, handle.endpoint, "fpga-0", "c0")
        assert "card does not answer" in reply.error
        state = hub.state(NODE, "fpga-0")
        assert (state.health, state.sticky) == (Health.UNHEALTHY, True)
        assert dict(state.sources)[PREPARE_FAULT_SOURCE] is Health.UNHEALTHY
        assert seen == [(NODE, "fpga-0", "card does not answer")]
        # a latched card is refused before the driver is called
        hub.submit("probe", [DeviceReport(NODE, "fpga-2", Health.UNHEALTHY, "over temperature")])
        calls = len(driver.seen)
        reply = await prepare(kube, handle.endpoint, "fpga-2", "c1")
        assert reply.error.endswith("device node-1/fpga-2 is unhealthy (over temperature)")
        assert len(driver.seen) == calls
        # a healthy card still goes to the driver
        reply = await prepare(kube, handle.endpoint, "fpga-1", "c2")
        assert reply.error == "" and [d.device_name for d in reply.devices] == ["fpga-1"]
        assert len(driver.seen) == calls + 1
    finally:
        await handle.stop()
        hub.close()


async def test_metrics_served_and_signals_stop_the_plugin(base: str) -> None:
    hub = hub_of()
    handle = await start(
        Recorder(),
        options(base, metrics_port=0, stop_on_signals=True),
        health=hub,
        resources=pool(),
    )
    try:
        assert handle.publisher is None  # no API access: nothing published
        assert handle.metrics_server is not None
        async with (
            aiohttp.ClientSession() as http,
            http.get(handle.metrics_server.url) as resp,
        ):
            text = await resp.text()
        assert resp.status == 200
        line = (
            'drahealth_driver_device_health{device="fpga-1",driver="fpga.example.com",'
            'pool="node-1",state="Healthy"} 1.0'
        )
        assert line in text
        assert "# TYPE drahealth_driver_prepare_seconds histogram" in text
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(handle.wait(), 20)
    finally:
        await handle.stop()
        hub.close()
    assert not exists(handle.endpoint)
    # the handlers were uninstalled with the stop: SIGTERM is the default again
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.default_int_handler)


async def test_serve_health_off_keeps_the_hub_for_the_control_socket(base: str) -> None:
    hub = hub_of()
    handle = await start(Recorder(), options(base, serve_health=False), health=hub)
    try:
        assert handle.supported_versions == list(api.DRA_PLUGIN_SERVICES)
        assert handle.control is not None
        reply = await control_request(handle.control.path, "status")
        assert len(reply["devices"]) == 3
    finally:
        await handle.stop()
        hub.close()


async def test_control_socket_off_and_no_hub(base: str) -> None:
    hub = hub_of()
    handle = await start(Recorder(), options(base, control_socket=False), health=hub)
    await handle.stop()
    assert handle.control is None
    handle = await start(Recorder(), options(base))
    await handle.stop()
    assert handle.hub is None and handle.control is None and handle.metrics is not None


@pytest.mark.parametrize(
    ("kw", "resources", "error", "match"),
    [
        ({"node_name": ""}, pool(), ValueError, "needs PluginOptions.node_name"),
        ({}, [Device(name="x")], TypeError, "must be a Pool or DriverResources, got list"),
        ({}, Pool([Device(name="Not_A_Name")]), SliceValidationError, "Not_A_Name"),
        (
            {},
            DriverResources({NODE: Pool([Device(name="a"), Device(name="a")])}),
            SliceValidationError,
            "duplicate device name",
        ),
        ({"taint_policy": "NoExecute"}, None, TypeError, "taint_policy must be a TaintPolicy"),
        ({"control_actions": {"healthy": object()}}, None, ValueError, "built-in action"),
        (
            {"control_actions": {"boom": object()}},
            None,
            TypeError,
            "have a frozenset 'fields'",
        ),
        ({"control_actions": {"": object()}}, None, ValueError, "is not a non-empty string"),
    ],
)
async def test_bad_resources_and_options_fail_before_any_socket(
    base: str, kw: dict[str, Any], resources: Any, error: type[Exception], match: str
) -> None:
    hub = hub_of()
    with pytest.raises(error, match=match):
        await start(Recorder(), options(base, **kw), health=hub, resources=resources)
    assert not exists(f"{base}/plugins/{DRIVER}/dra.sock")
    assert not exists(f"{base}/reg/{DRIVER}-reg.sock")


async def test_a_registry_that_already_holds_the_families_is_refused(base: str) -> None:
    registry = CollectorRegistry()
    DriverMetrics(DRIVER, registry)
    with pytest.raises(ValueError, match="already holds the driver's metric families"):
        await start(Recorder(), options(base, metrics_registry=registry), health=hub_of())


async def test_a_metrics_port_in_use_stops_what_was_started(base: str) -> None:
    blocker = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = blocker.sockets[0].getsockname()[1]
    try:
        with pytest.raises(OSError):
            await start(Recorder(), options(base, metrics_port=port), health=hub_of())
    finally:
        blocker.close()
        await blocker.wait_closed()
    for path in (
        f"{base}/plugins/{DRIVER}/dra.sock",
        f"{base}/reg/{DRIVER}-reg.sock",
        control_socket_path(f"{base}/state"),
    ):
        assert not exists(path), path


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"metrics_port": 70000}, "metrics_port must be a port number"),
        ({"metrics_port": -1}, "metrics_port must be a port number"),
        ({"metrics_port": True}, "metrics_port must be a port number"),
        ({"withdraw_unhealthy": "sometimes"}, "withdraw_unhealthy 'sometimes'"),
    ],
)
def test_bad_plugin_options(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PluginOptions(DRIVER, **kw)
