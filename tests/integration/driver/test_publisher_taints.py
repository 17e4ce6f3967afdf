"""ResourceSlicePublisher on servers that keep or drop device taints, and withdrawal.

A server with ``DRADeviceTaints`` off (before Kubernetes 1.36 by default) stores a slice
without ``devices[].taints`` and says nothing. The last test runs the embedded API server
as each release; the others use ``DropsTaints`` in front of it, which can also play a
server upgraded while the publisher runs: every slice written through it loses its
taints, as the real server's field dropping does.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import Device, DeviceTaint
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice

from drahealth.controlplane import APIServer
from drahealth.core import Health, kube_profile
from drahealth.driver import DriverMetrics
from drahealth.driver._hub import DeviceReport, HealthHub
from drahealth.driver._publisher import ResourceSlicePublisher, strip_taints_of
from drahealth.driver._slices import DriverResources, Pool
from drahealth.driver._taints import TaintController, TaintPolicy
from drahealth.kube import make_client
from tests._support import eventually

pytestmark = pytest.mark.timeout(20)

DRIVER = "gpu.example.com"
NODE = "node-1"
POOL = "pool"
KEY = f"{DRIVER}/unhealthy"


class DropsTaints:
    """A client whose slice writes reach the server without device taints (the gate off).

    ``dropping`` can be turned off to play the same server after an upgrade.
    """

    def __init__(self, inner: AsyncClient) -> None:
        self._inner = inner
        self.dropping = True
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _strip(self, obj: Any) -> Any:
        if self.dropping and isinstance(obj, ResourceSlice):
            return strip_taints_of(obj)
        return obj

    async def create(self, obj: Any, **kwargs: Any) -> Any:
        self.writes += isinstance(obj, ResourceSlice)
        return await self._inner.create(self._strip(obj), **kwargs)

    async def replace(self, obj: Any, **kwargs: Any) -> Any:
        self.writes += isinstance(obj, ResourceSlice)
        return await self._inner.replace(self._strip(obj), **kwargs)


@pytest.fixture
async def client(server: APIServer) -> AsyncIterator[AsyncClient]:
    c = make_client(server_url=server.url)
    await c.create(Node(metadata=ObjectMeta(name=NODE)))
    yield c
    await c.close()


@pytest.fixture
def dropping(client: AsyncClient) -> DropsTaints:
    return DropsTaints(client)


def publisher_for(client: Any, **kwargs: Any) -> ResourceSlicePublisher:
    return ResourceSlicePublisher(
        cast(AsyncClient, client),
        DRIVER,
        NODE,
        sync_delay=0.2,
        backoff_initial=0.05,
        backoff_max=0.2,
        **kwargs,
    )


def resources(n: int = 4) -> DriverResources:
    return DriverResources({POOL: Pool([Device(name=f"gpu-{i}") for i in range(n)])})


def taint() -> DeviceTaint:
    return DeviceTaint(key=KEY, value="true", effect="NoSchedule")


async def published(client: AsyncClient) -> dict[str, list[str]]:
    """Device name -> taint keys, over every slice of the driver."""
    out: dict[str, list[str]] = {}
    async for s in client.list(ResourceSlice):
        for d in s.spec.devices or ():
            out[d.name] = [t.key for t in d.taints or ()]
    return out


def gauge(metrics: DriverMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"driver": DRIVER, **labels})


async def test_default_never_withdraws(client: AsyncClient, dropping: DropsTaints) -> None:
    pub = publisher_for(dropping)
    try:
        pub.publish(resources())
        pub.set_withdrawn({(POOL, "gpu-1")})
        pub.set_device_taints({(POOL, "gpu-1"): [taint()]})
        await eventually(lambda: pub.taints_kept is False, 5, "taints seen dropped")
        await pub.wait_synced(5)
        assert pub.withdrawn == frozenset() and "gpu-1" in await published(client)
    finally:
        await pub.stop()


async def test_dropped_taints_are_detected_logged_once_and_not_rewritten(
    client: AsyncClient, dropping: DropsTaints, caplog: pytest.LogCaptureFixture
) -> None:
    # a short recheck interval: many syncs while the taints are dropped, none may write
    pub = publisher_for(dropping, withdraw_unhealthy="never", taints_recheck_interval=0.05)
    metrics = DriverMetrics(DRIVER)
    metrics.watch_publisher(pub)
    try:
        pub.publish(resources())
        await pub.wait_synced(5)
        assert pub.taints_kept is None  # nothing carried taints yet
        assert gauge(metrics, "drahealth_driver_slice_taints", state="unknown") == 1
        assert dropping.writes == 1
        with caplog.at_level(logging.WARNING, logger="drahealth.driver._publisher"):
            pub.set_device_taints({(POOL, "gpu-1"): [taint()]})
            await pub.wait_synced(5)
            assert pub.taints_kept is False
            assert dropping.writes == 2  # the one write that showed it
            # more taints, republishing the same state, watch echoes: no more writes
            pub.set_device_taints({(POOL, "gpu-1"): [taint()], (POOL, "gpu-2"): [taint()]})
            await pub.wait_synced(5)
            pub.publish(resources())
            await pub.wait_synced(5)
            syncs = pub.syncs
            await eventually(lambda: pub.syncs > syncs + 5, 5, "periodic recheck syncs")
        assert dropping.writes == 2
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert "DRADeviceTaints" in warnings[0].getMessage()
        assert await published(client) == {f"gpu-{i}": [] for i in range(4)}
        assert pub.publish_errors_total == 0  # handled, not an error
        assert gauge(metrics, "drahealth_driver_slice_taints", state="dropped") == 1
        assert gauge(metrics, "drahealth_driver_slice_taints", state="kept") == 0
        assert pub.withdrawn == frozenset()  # withdraw_unhealthy="never"
    finally:
        await pub.stop()


async def test_kept_taints_are_published_and_nothing_is_withdrawn_in_auto(
    client: AsyncClient,
) -> None:
    pub = publisher_for(client, withdraw_unhealthy="auto")
    try:
        pub.publish(resources())
        pub.set_withdrawn({(POOL, "gpu-1")})
        pub.set_device_taints({(POOL, "gpu-1"): [taint()]})
        await pub.wait_synced(5)
        assert pub.taints_kept is True and pub.withdrawn == frozenset()
        assert (await published(client))["gpu-1"] == [KEY]
    finally:
        await pub.stop()


async def test_always_withdraws_even_where_taints_are_kept(client: AsyncClient) -> None:
    pub = publisher_for(client, withdraw_unhealthy="always")
    try:
        pub.publish(resources())
        pub.set_withdrawn({(POOL, "gpu-1"), (POOL, "not-a-device")})
        await pub.wait_synced(5)
        assert pub.withdrawn == {(POOL, "gpu-1")}
        assert sorted(await published(client)) == ["gpu-0", "gpu-2", "gpu-3"]
        pub.set_withdrawn(())
        await pub.wait_synced(5)
        assert sorted(await published(client)) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    finally:
        await pub.stop()


async def test_unhealthy_device_is_withdrawn_while_taints_are_dropped_and_returns(
    client: AsyncClient, dropping: DropsTaints
) -> None:
    """Hub -> TaintController -> publisher: Unhealthy (latched) leaves the slice, Healthy
    brings it back; an Unknown report in between keeps it out (only Healthy recovers)."""
    hub = HealthHub([(POOL, f"gpu-{i}") for i in range(4)])
    hub.submit("sim", [DeviceReport(POOL, f"gpu-{i}", Health.HEALTHY) for i in range(4)])
    pub = publisher_for(dropping, withdraw_unhealthy="auto")
    metrics = DriverMetrics(DRIVER)
    metrics.watch_publisher(pub)
    taints = TaintController(
        hub,
        TaintPolicy(DRIVER),
        pub.set_device_taints,
        withdraw=pub.set_withdrawn,
        batch_delay=0.01,
    )
    pub.publish(resources())
    await taints.start()
    try:
        await pub.wait_synced(5)
        hub.submit("sim", [DeviceReport(POOL, "gpu-1", Health.UNHEALTHY, "XID 79", True)])

        async def gone() -> bool:
            return "gpu-1" not in await published(client)

        await eventually(gone, 5, "gpu-1 withdrawn from the slice")
        assert pub.taints_kept is False and pub.withdrawn == {(POOL, "gpu-1")}
        assert gauge(metrics, "drahealth_driver_withdrawn_devices") == 1
        assert all(keys == [] for keys in (await published(client)).values())

        hub.submit("sim", [DeviceReport(POOL, "gpu-1", Health.UNKNOWN)])
        await taints.wait_idle(5)
        await pub.wait_synced(5)
        assert "gpu-1" not in await published(client)

        hub.submit("sim", [DeviceReport(POOL, "gpu-1", Health.HEALTHY)])

        async def back() -> bool:
            return "gpu-1" in await published(client)

        await eventually(back, 5, "gpu-1 published again")
        assert pub.withdrawn == frozenset() and taints.withdrawn == frozenset()
        assert gauge(metrics, "drahealth_driver_withdrawn_devices") == 0
    finally:
        await taints.stop()
        await pub.stop()


async def test_after_a_reconnect_the_publisher_checks_again(
    client: AsyncClient, dropping: DropsTaints, caplog: pytest.LogCaptureFixture
) -> None:
    """The server is upgraded (taints kept from now on) and the watch reconnects: the
    taint is published and the withdrawn device comes back, without a restart."""
    pub = publisher_for(dropping, withdraw_unhealthy="auto", taints_recheck_interval=0.05)
    try:
        pub.publish(resources())
        pub.set_withdrawn({(POOL, "gpu-1")})
        pub.set_device_taints({(POOL, "gpu-1"): [taint()]})
        await eventually(lambda: pub.taints_kept is False, 5, "taints seen dropped")
        await pub.wait_synced(5)
        assert "gpu-1" not in await published(client)

        dropping.dropping = False
        reflector = pub._reflector
        assert reflector is not None
        reflector._drop_connection()  # as if the server restarted
        await eventually(lambda: pub.taints_kept is True, 5, "taints seen kept after reconnect")
        await pub.wait_synced(5)
        assert (await published(client))["gpu-1"] == [KEY]
        assert pub.withdrawn == frozenset()
    finally:
        await pub.stop()


# -- the embedded server playing a release -------------------------------------------


@pytest.mark.parametrize(
    ("version", "kept"), [("1.34", False), ("1.35", False), ("1.36", True), ("1.38", True)]
)
async def test_release_profiles_keep_or_drop_taints(
    version: str, kept: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The real server's field dropping (DRADeviceTaints off before 1.36): one warning,
    one write that shows it, the unhealthy device withdrawn in auto mode and back after."""
    srv = APIServer(profile=kube_profile(version))
    await srv.start(host="127.0.0.1", port=0)
    client = make_client(server_url=srv.url)
    pub = publisher_for(client, withdraw_unhealthy="auto", taints_recheck_interval=0.05)
    try:
        await client.create(Node(metadata=ObjectMeta(name=NODE)))
        pub.publish(resources())
        await pub.wait_synced(5)
        writes = pub.creates + pub.updates
        with caplog.at_level(logging.WARNING, logger="drahealth.driver._publisher"):
            pub.set_withdrawn({(POOL, "gpu-1")})
            pub.set_device_taints({(POOL, "gpu-1"): [taint()]})
            await eventually(lambda: pub.taints_kept is not None, 5, "taints checked")
            await pub.wait_synced(5)
            if not kept:  # rechecks run while taints are dropped: none may write
                syncs = pub.syncs
                await eventually(lambda: pub.syncs > syncs + 5, 5, "recheck syncs")
        assert pub.taints_kept is kept
        after = await published(client)
        if kept:
            assert after["gpu-1"] == [KEY] and pub.withdrawn == frozenset()
            assert pub.creates + pub.updates == writes + 1
            assert not caplog.records
        else:
            assert "gpu-1" not in after and all(t == [] for t in after.values())
            assert pub.creates + pub.updates == writes + 2  # the taint, then the withdrawal
            gate = [r for r in caplog.records if "DRADeviceTaints" in r.getMessage()]
            assert len(gate) == 1, [r.getMessage() for r in caplog.records]
        pub.set_withdrawn(())
        pub.set_device_taints({})
        await pub.wait_synced(5)
        assert sorted(await published(client)) == [f"gpu-{i}" for i in range(4)]
    finally:
        await pub.stop()
        await client.close()
        await srv.stop()
