"""The pieces ``start()`` assembles, without sockets: resources, the health guard, the
report of prepare's device faults to the hub, and option checks."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import Device
from lightkube.resources.resource_v1 import ResourceClaim

from drahealth.core import Health
from drahealth.driver import (
    PREPARE_FAULT_SOURCE,
    AllocationResult,
    ClaimRef,
    DeviceReport,
    DriverResources,
    ErrorKind,
    HealthHub,
    PluginOptions,
    Pool,
    PreparedClaimRequest,
    PreparedDevice,
    PrepareResult,
)
from drahealth.driver._services import DriverServices, HealthGuardedDriver, as_resources

POOL = "node-1"


class Inner:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.unprepared: list[str] = []

    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        self.calls.append([c.uid for c in claims])
        return {
            c.uid: PrepareResult.ok(
                [PreparedDevice([r.request], r.pool, r.device) for r in c.results]
            )
            for c in claims
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        self.unprepared += [c.uid for c in claims]
        return {c.uid: None for c in claims}


def claim(uid: str, *devices: str) -> PreparedClaimRequest:
    return PreparedClaimRequest(
        claim=ResourceClaim(metadata=ObjectMeta(namespace="ns", name=f"c-{uid}", uid=uid)),
        results=[AllocationResult("r", "d.example.com", POOL, d) for d in devices],
    )


def hub() -> HealthHub:
    h = HealthHub([(POOL, "a"), (POOL, "b")])
    h.submit(
        "probe", [DeviceReport(POOL, "a", Health.HEALTHY), DeviceReport(POOL, "b", Health.HEALTHY)]
    )
    return h


async def test_the_guard_refuses_latched_and_unknown_devices_and_passes_the_rest() -> None:
    h = hub()
    h.submit("probe", [DeviceReport(POOL, "b", Health.UNHEALTHY, "ECC")])
    inner = Inner()
    guard = HealthGuardedDriver(inner, h)
    out = await guard.prepare([claim("1", "a"), claim("2", "a", "b"), claim("3", "zz")])
    assert inner.calls == [["1"]]
    assert out["1"].error is None
    err = out["2"].error
    assert err is not None and err.kind is ErrorKind.PERMANENT_DEVICE and err.device == (POOL, "b")
    assert err.message == "device node-1/b is unhealthy (ECC)"
    err = out["3"].error
    assert err is not None and err.kind is ErrorKind.PERMANENT_CONFIG
    assert "device node-1/zz of claim" in err.message
    # nothing passes: the driver is not called at all
    assert (await guard.prepare([claim("4", "b")]))["4"].error is not None
    assert inner.calls == [["1"]]
    # an informational (not latched) Unhealthy report does not refuse
    h.recover(POOL, "b")
    h.submit("probe", [DeviceReport(POOL, "b", Health.UNHEALTHY, "warm", fatal=False)])
    assert (await guard.prepare([claim("5", "b")]))["5"].error is None
    assert await guard.unprepare([ClaimRef("ns", "c-5", "5")]) == {"5": None}
    assert inner.unprepared == ["5"]


async def test_prepare_faults_are_reported_to_the_hub_then_to_the_authors_callback() -> None:
    h = hub()
    seen: list[tuple[str, str, str]] = []

    async def callback(pool: str, device: str, message: str) -> None:
        await asyncio.sleep(0)
        seen.append((pool, device, message))

    services = DriverServices(PluginOptions("d.example.com", on_device_fault=callback), h, None)
    fault = services.options.on_device_fault
    assert fault is not None and fault is not callback
    ret = fault(POOL, "a", "no answer")
    assert ret is not None
    await ret
    state = h.state(POOL, "a")
    assert (state.health, state.sticky) == (Health.UNHEALTHY, True)
    assert dict(state.sources)[PREPARE_FAULT_SOURCE] is Health.UNHEALTHY
    assert seen == [(POOL, "a", "no answer")]
    # a device the hub does not know is logged, not raised, and the callback still runs
    ret = fault(POOL, "ghost", "?")
    assert ret is not None
    await ret
    assert seen[-1] == (POOL, "ghost", "?")


def test_fault_reports_off_or_without_a_hub_keep_the_authors_callback() -> None:
    def callback(pool: str, device: str, message: str) -> None:
        pass

    off = PluginOptions("d.example.com", on_device_fault=callback, report_device_faults=False)
    assert DriverServices(off, hub(), None).options.on_device_fault is callback
    on = PluginOptions("d.example.com", on_device_fault=callback)
    assert DriverServices(on, None, None).options.on_device_fault is callback
    assert (
        DriverServices(PluginOptions("d.example.com"), None, None).options.on_device_fault is None
    )


def test_resources_a_pool_is_named_after_the_node() -> None:
    res = as_resources(Pool([Device(name="a")]), "node-7")
    assert res is not None and list(res.pools) == ["node-7"]
    both = DriverResources({"p1": Pool([Device(name="a")]), "p2": Pool()})
    assert as_resources(both, "") is both
    assert as_resources(None, "") is None


@pytest.mark.parametrize(
    ("resources", "node", "error", "match"),
    [
        (Pool([Device(name="a")]), "", ValueError, "needs PluginOptions.node_name"),
        ({"node-1": Pool()}, "node-1", TypeError, "got dict"),
        ("gpu-0", "node-1", TypeError, "got str"),
        (Pool([Device(name="-bad-")]), "node-1", ValueError, "-bad-"),
    ],
)
def test_bad_resources_are_refused(
    resources: Any, node: str, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        as_resources(resources, node)
