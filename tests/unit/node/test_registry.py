"""PluginRegistry rules without plugins: negotiation, instances, generations and fencing.

Health streams are test doubles (``FakeStream``) that never touch the network; the
registry's channels point at sockets that do not exist, so no call is ever answered.
Reports are injected through the callback the registry handed to each stream.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import pytest

from drahealth import api
from drahealth.core import Health
from drahealth.core._records import ReportedDevice
from drahealth.kube import Backoff
from drahealth.node._registry import (
    DRAClient,
    DriverNotRegisteredError,
    PluginRegistry,
    PrepareReply,
    _error_type,
    negotiate_dra_service,
)
from drahealth.node._stream import HealthStream, pick_health_service
from drahealth.node._types import PluginInfo, RegistrationError

D = "gpu.example.com"
DRA = (api.DRA_PLUGIN_V1, api.DRA_PLUGIN_V1BETA1)
WITH_HEALTH = (*DRA, api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1)
R = ReportedDevice("pool", "gpu-0", Health.UNHEALTHY, "XID 79")


class FakeStream(HealthStream):
    """A HealthStream that records start/stop; ``report`` is the registry's callback."""

    made: list[FakeStream]

    def __init__(
        self,
        channel: grpc.aio.Channel,
        service: str,
        *,
        driver: str,
        on_report: Callable[[list[ReportedDevice]], None],
        default_timeout: float,
        backoff: Backoff | None,
    ) -> None:
        super().__init__(
            channel,
            service,
            driver=driver,
            on_report=on_report,
            default_timeout=default_timeout,
            backoff=backoff,
        )
        self.report = on_report
        self.channel = channel
        self.backoff = backoff
        self.started = False
        self.stopped = False
        self.release: asyncio.Event | None = None  # set: stop() waits for it
        FakeStream.made.append(self)

    def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        if self.release is not None:
            await self.release.wait()
        self.stopped = True
        self.state = "stopped"


class Harness:
    def __init__(self, sockdir: str) -> None:
        self.sockdir = sockdir
        self.reports: list[tuple[str, list[ReportedDevice]]] = []
        self.events: list[tuple[str, str, int]] = []
        FakeStream.made = []

    def registry(self, **kw: Any) -> PluginRegistry:
        kw.setdefault("stream_factory", FakeStream)
        return PluginRegistry(
            on_report=lambda d, r: self.reports.append((d, r)),
            on_event=lambda d, k, g: self.events.append((d, k, g)),
            **kw,
        )

    def info(
        self, name: str, versions: tuple[str, ...] = WITH_HEALTH, driver: str = D
    ) -> PluginInfo:
        endpoint = f"{self.sockdir}/{name}.sock"
        return PluginInfo(driver, endpoint, versions, f"{self.sockdir}/{name}-reg.sock")


@pytest.fixture
def sockdir() -> Iterator[str]:
    d = tempfile.mkdtemp(dir="/tmp", prefix="dhr-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def h(sockdir: str) -> AsyncIterator[Harness]:
    yield Harness(sockdir)


@pytest.fixture
async def reg(h: Harness) -> AsyncIterator[PluginRegistry]:
    registry = h.registry()
    yield registry
    await registry.close()


def streams() -> list[FakeStream]:
    return FakeStream.made


# -- negotiation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ((api.DRA_PLUGIN_V1,), api.DRA_PLUGIN_V1),
        ((api.DRA_PLUGIN_V1BETA1, api.DRA_PLUGIN_V1), api.DRA_PLUGIN_V1BETA1),  # plugin order
        ((api.DRA_HEALTH_V1, "v9.DRAPlugin", api.DRA_PLUGIN_V1BETA1), api.DRA_PLUGIN_V1BETA1),
    ],
)
def test_dra_service_is_the_first_supported_in_plugin_order(
    versions: tuple[str, ...], expected: str
) -> None:
    assert negotiate_dra_service(versions) == expected


def test_dra_service_errors_have_kubelet_texts() -> None:
    with pytest.raises(RegistrationError) as empty:
        negotiate_dra_service([])
    assert str(empty.value) == "empty list of supported gRPC services (aka supported versions)"
    with pytest.raises(RegistrationError) as none:
        negotiate_dra_service(["v1.DRAResourceHealth", "v1alpha3.DRAPlugin"])
    assert str(none.value) == (
        'none of services supported by the plugin (["v1.DRAResourceHealth" '
        '"v1alpha3.DRAPlugin"]) are supported by the kubelet (["v1.DRAPlugin" '
        '"v1beta1.DRAPlugin"])'
    )
    with pytest.raises(TypeError, match="not one string"):
        negotiate_dra_service("v1.DRAPlugin")
    with pytest.raises(TypeError, match="not one string"):
        pick_health_service("v1.DRAResourceHealth")


# -- instances ------------------------------------------------------------------------------


async def test_register_refuses_bad_versions_and_keeps_no_state(
    h: Harness, reg: PluginRegistry
) -> None:
    with pytest.raises(RegistrationError, match="empty list of supported gRPC services"):
        await reg.register(h.info("a", ()))
    with pytest.raises(RegistrationError, match="none of services supported by the plugin"):
        await reg.register(h.info("a", (api.DRA_HEALTH_V1,)))
    assert reg.drivers() == [] and reg.instances(D) == [] and streams() == []


async def test_same_endpoint_twice_is_refused_other_endpoints_coexist(
    h: Harness, reg: PluginRegistry
) -> None:
    a, b = h.info("a"), h.info("b")
    await reg.register(a)
    with pytest.raises(RegistrationError) as exc:
        await reg.register(h.info("a"))
    assert str(exc.value) == f"endpoint {a.endpoint} already registered for DRA driver plugin {D}"
    await reg.register(b)
    await reg.register(h.info("c", driver="nic.example.com"))
    assert reg.instances(D) == [a, b]
    assert reg.drivers() == [D, "nic.example.com"]
    assert reg.dra_client(D).endpoint == b.endpoint  # none connected: the newest


async def test_dra_client_uses_the_negotiated_version_and_unknown_driver_fails(
    h: Harness, reg: PluginRegistry
) -> None:
    with pytest.raises(DriverNotRegisteredError) as exc:
        reg.dra_client(D)
    assert isinstance(exc.value, LookupError)
    assert str(exc.value) == f"DRA driver {D} is not registered"
    await reg.register(h.info("a", (api.DRA_PLUGIN_V1BETA1, api.DRA_PLUGIN_V1)))
    client = reg.dra_client(D)
    assert client.service == api.DRA_PLUGIN_V1BETA1 and client.timeout == 45.0
    assert client.driver == D


async def test_deregister_unknown_is_a_no_op(h: Harness, reg: PluginRegistry) -> None:
    await reg.deregister(h.info("ghost"))
    await reg.register(h.info("a"))
    await reg.deregister(h.info("ghost"))
    assert len(reg.instances(D)) == 1 and h.events == [(D, "activate", 1)]


async def test_deregistered_client_fails_calls_without_sending(
    h: Harness, reg: PluginRegistry
) -> None:
    await reg.register(h.info("a"))
    client = reg.dra_client(D)
    await reg.deregister(h.info("a"))
    replies = await client.prepare([("ns", "claim", "uid-1")])
    assert replies["uid-1"].error.endswith("is no longer registered")
    assert not replies["uid-1"].permanent
    assert (await client.unprepare([("ns", "claim", "uid-1")]))["uid-1"].startswith(
        "NodeUnprepareResources failed"
    )


async def test_close_stops_streams_and_refuses_new_plugins(h: Harness, reg: PluginRegistry) -> None:
    await reg.register(h.info("a"))
    await reg.register(h.info("b", driver="nic.example.com"))
    await reg.close()
    assert all(s.stopped for s in streams())
    assert reg.drivers() == [] and reg.stream(D) is None
    assert h.events == [(D, "activate", 1), ("nic.example.com", "activate", 1)]  # no events
    with pytest.raises(RegistrationError, match="shut down"):
        await reg.register(h.info("c"))


def test_constructor_validates_timeouts() -> None:
    with pytest.raises(ValueError, match="default_timeout must be"):
        PluginRegistry(on_report=lambda d, r: None, default_timeout=0)
    with pytest.raises(ValueError, match="call_timeout must be"):
        PluginRegistry(on_report=lambda d, r: None, call_timeout=float("inf"))


# -- one authoritative health stream per driver ---------------------------------------------


async def test_streams_get_the_service_default_timeout_and_a_fresh_backoff(
    h: Harness,
) -> None:
    made: list[Backoff] = []

    def backoff() -> Backoff:
        made.append(Backoff(0.01, 0.1))
        return made[-1]

    reg = h.registry(default_timeout=12.0, backoff_factory=backoff)
    try:
        await reg.register(h.info("a", (*DRA, api.DRA_HEALTH_V1ALPHA1)))
        await reg.register(h.info("b", (api.DRA_HEALTH_V1ALPHA1, api.DRA_HEALTH_V1, *DRA)))
        a, b = streams()
        assert (a.service, b.service) == (api.DRA_HEALTH_V1ALPHA1, api.DRA_HEALTH_V1)
        assert a.default_timeout == b.default_timeout == 12.0
        assert [a.backoff, b.backoff] == made and made[0] is not made[1]
        assert a.started and a.stopped and b.started and not b.stopped
        assert reg.stream(D) is b
    finally:
        await reg.close()


async def test_handover_to_newer_instance_activates_without_deactivate(
    h: Harness, reg: PluginRegistry
) -> None:
    old, new = h.info("old"), h.info("new")
    await reg.register(old)
    assert reg.active_health(D) == (old, 1, api.DRA_HEALTH_V1)
    await reg.register(new)
    assert reg.active_health(D) == (new, 2, api.DRA_HEALTH_V1)
    assert h.events == [(D, "activate", 1), (D, "activate", 2)]
    assert streams()[0].stopped and not streams()[1].stopped
    await reg.deregister(old)  # not the active one: nothing changes
    assert h.events == [(D, "activate", 1), (D, "activate", 2)]
    assert reg.active_health(D) == (new, 2, api.DRA_HEALTH_V1)
    await reg.deregister(new)
    assert h.events[-1] == (D, "deactivate", 2)
    assert reg.active_health(D) is None and reg.stream(D) is None and streams()[1].stopped


async def test_removing_the_active_instance_falls_back_to_the_newest_remaining(
    h: Harness, reg: PluginRegistry
) -> None:
    a, b, c = h.info("a"), h.info("b"), h.info("c")
    for info in (a, b, c):
        await reg.register(info)
    await reg.deregister(c)
    assert reg.active_health(D) == (b, 4, api.DRA_HEALTH_V1)
    assert h.events[-1] == (D, "activate", 4)
    assert len(streams()) == 4 and streams()[3].channel is not streams()[2].channel


async def test_newest_without_health_deactivates_without_fallback(
    h: Harness, reg: PluginRegistry
) -> None:
    await reg.register(h.info("old"))
    await reg.register(h.info("new", DRA))
    assert h.events == [(D, "activate", 1), (D, "deactivate", 1)]
    assert reg.active_health(D) is None and len(streams()) == 1 and streams()[0].stopped
    await reg.deregister(h.info("old"))  # not authoritative: nothing happens
    assert h.events == [(D, "activate", 1), (D, "deactivate", 1)]


async def test_generations_are_never_reused_after_the_last_instance_left(
    h: Harness, reg: PluginRegistry
) -> None:
    await reg.register(h.info("a"))
    stale = streams()[0]
    await reg.deregister(h.info("a"))
    await reg.register(h.info("a"))
    assert reg.active_health(D) is not None and reg.active_health(D)[1] == 2  # type: ignore[index]
    assert reg.generation(D) == 2
    stale.report([R])  # a straggler from generation 1
    assert h.reports == [] and reg.fenced_reports == 1


async def test_reports_of_a_retired_generation_are_dropped(h: Harness, reg: PluginRegistry) -> None:
    await reg.register(h.info("old"))
    old = streams()[0]
    old.report([R])
    old.release = asyncio.Event()  # the old stream is slow to stop
    task = asyncio.create_task(reg.register(h.info("new")))
    await asyncio.sleep(0)
    new = streams()[1]
    assert not old.stopped and reg.active_health(D)[1] == 2  # type: ignore[index]
    healthy = ReportedDevice("pool", "gpu-0", Health.HEALTHY)
    new.report([healthy])
    old.report([R])  # in flight while the old stream is being stopped: fenced
    old.release.set()
    await task
    old.report([R])
    assert h.reports == [(D, [R]), (D, [healthy])]
    assert reg.fenced_reports == 2


async def test_health_gate_off_opens_no_stream(h: Harness) -> None:
    reg = h.registry(health_enabled=False)
    try:
        await reg.register(h.info("a"))
        await reg.register(h.info("b"))
        await reg.deregister(h.info("b"))
        assert streams() == [] and h.events == []
        assert reg.active_health(D) is None and reg.stream(D) is None
        assert reg.dra_client(D).endpoint == h.info("a").endpoint
    finally:
        await reg.close()


async def test_event_callback_errors_are_logged_not_raised(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(driver: str, kind: str, generation: int) -> None:
        raise RuntimeError("listener broke")

    reg = PluginRegistry(on_report=lambda d, r: None, on_event=broken, stream_factory=FakeStream)
    FakeStream.made = []
    try:
        with caplog.at_level(logging.ERROR):
            await reg.register(h.info("a"))
        assert reg.active_health(D) is not None
        assert "health event callback failed" in caplog.text
    finally:
        await reg.close()


# -- DRA client: input and KEP-5322 field --------------------------------------------------


async def test_dra_client_rejects_malformed_claims(sockdir: str) -> None:
    async with grpc.aio.insecure_channel(f"unix:{sockdir}/none.sock") as ch:
        client = DRAClient(ch, driver=D, endpoint="/x", service=api.DRA_PLUGIN_V1)
        assert await client.prepare([]) == {} and await client.unprepare([]) == {}
        with pytest.raises(ValueError, match=r"claims\[0\] must be a \(namespace, name, uid\)"):
            await client.prepare([("ns", "name")])  # type: ignore[list-item]
        with pytest.raises(ValueError, match=r"claims\[1\]: uid must not be empty"):
            await client.prepare([("ns", "a", "u"), ("ns", "b", "")])
        with pytest.raises(ValueError, match=r"claims\[0\]: namespace must not be empty"):
            await client.unprepare([("", "b", "u")])
        with pytest.raises(TypeError, match="sequence of"):
            await client.unprepare("ns/name/uid")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"unknown DRA service 'v1.DRAResourceHealth'"):
            DRAClient(ch, driver=D, endpoint="/x", service=api.DRA_HEALTH_V1)
        with pytest.raises(ValueError, match="timeout must be"):
            DRAClient(ch, driver=D, endpoint="/x", service=api.DRA_PLUGIN_V1, timeout=-1)


@pytest.mark.parametrize("pb", [api.dra_v1, api.dra_v1beta1], ids=["v1", "v1beta1"])
def test_error_type_is_read_from_unknown_fields(pb: Any) -> None:
    def claim(extra: bytes) -> Any:
        resp = pb.NodePrepareResourcesResponse()
        resp.claims["u"].error = "boom"
        resp.claims["u"].MergeFromString(extra)
        parsed = pb.NodePrepareResourcesResponse.FromString(resp.SerializeToString())
        return parsed.claims["u"]

    assert _error_type(claim(b"")) == api.PREPARE_ERROR_TYPE_UNKNOWN
    assert _error_type(claim(bytes([3 << 3, 1]))) == api.PREPARE_ERROR_TYPE_PERMANENT
    assert _error_type(claim(bytes([3 << 3, 0]))) == 0
    assert _error_type(claim(bytes([3 << 3, 1, 3 << 3, 0]))) == 0  # last one wins
    assert _error_type(claim(bytes([(3 << 3) | 2, 1, 1]))) == 0  # wrong wire type: ignored
    assert _error_type(claim(bytes([4 << 3, 1]))) == 0  # another unknown field


def test_prepare_reply_is_a_frozen_value() -> None:
    reply = PrepareReply()
    assert (reply.devices, reply.error, reply.permanent) == ((), "", False)
    with pytest.raises(AttributeError):
        reply.error = "x"  # type: ignore[misc]
