"""Withdrawing unhealthy devices: the pure rules and the controller's callback."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

import pytest
from lightkube import AsyncClient
from lightkube.models.resource_v1 import CounterSet, Device, DeviceTaint

from drahealth.core import Health
from drahealth.driver._hub import DeviceReport, DeviceState, HealthHub
from drahealth.driver._publisher import ResourceSlicePublisher
from drahealth.driver._slices import DriverResources, Pool, strip_taints, without_devices
from drahealth.driver._taints import (
    TaintController,
    TaintPolicy,
    TaintStore,
    desired_taints,
    stamp_time_added,
    withdrawn_devices,
)

DRIVER = "gpu.example.com"
KEY = f"{DRIVER}/unhealthy"
T0 = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)


def state(device: str, health: Health, *, sticky: bool = False) -> DeviceState:
    return DeviceState("pool", device, health, "", 0.0, sticky, MappingProxyType({}), 30)


def taint() -> DeviceTaint:
    return DeviceTaint(key=KEY, value="true", effect="NoSchedule")


def test_strip_taints_removes_every_taint_and_the_64_device_split() -> None:
    pool = Pool(
        [Device(name="a", taints=[taint()]), Device(name="b")],
        [CounterSet(name="c", counters={})],
        expect_taints=True,
    )
    out = strip_taints(DriverResources({"p": pool}))
    assert [d.taints for d in out.pools["p"].devices] == [None, None]
    assert out.pools["p"].shared_counters == pool.shared_counters
    assert out.pools["p"].expect_taints is False
    assert pool.devices[0].taints == [taint()]  # input untouched


def test_without_devices_leaves_out_only_known_pairs() -> None:
    res = DriverResources({"p": Pool([Device(name="a"), Device(name="b")]), "q": Pool([])})
    out, gone = without_devices(res, {("p", "a"), ("p", "zzz"), ("q", "a")})
    assert gone == {("p", "a")}
    assert [d.name for d in out.pools["p"].devices] == ["b"]
    assert [d.name for d in res.pools["p"].devices] == ["a", "b"]
    assert without_devices(res, ()) == (res, frozenset())


def test_withdrawn_devices_follow_the_unhealthy_taint_and_optionally_unknown() -> None:
    policy = TaintPolicy(DRIVER)
    states = [
        state("a", Health.UNHEALTHY, sticky=True),
        state("b", Health.UNHEALTHY),  # transient: no taint, not withdrawn
        state("c", Health.UNKNOWN),
        state("d", Health.HEALTHY),
    ]
    taints = desired_taints(states, policy)
    assert withdrawn_devices(taints, states, policy) == {("pool", "a")}
    unknown_too = TaintPolicy(DRIVER, withdraw_unknown=True)
    assert withdrawn_devices(taints, states, unknown_too) == {("pool", "a"), ("pool", "c")}
    # Unknown after Unhealthy keeps the taint, so the device stays out; Healthy brings it back
    later = [state("a", Health.UNKNOWN)]
    assert withdrawn_devices(desired_taints(later, policy, taints), later, policy) == {
        ("pool", "a")
    }
    healed = [state("a", Health.HEALTHY)]
    assert withdrawn_devices(desired_taints(healed, policy, taints), healed, policy) == set()
    # the informational unmonitored taint does not withdraw
    info = TaintPolicy(DRIVER, unmonitored=True)
    assert withdrawn_devices(desired_taints([states[2]], info), [states[2]], info) == set()


async def test_controller_hands_over_the_withdrawn_set_on_change_only(tmp_path: Path) -> None:
    hub = HealthHub([("pool", "a"), ("pool", "b")])
    hub.submit("sim", [DeviceReport("pool", d, Health.HEALTHY) for d in ("a", "b")])
    calls: list[frozenset[tuple[str, str]]] = []
    store = TaintStore(tmp_path / "taints.json")
    ctl = TaintController(
        hub, TaintPolicy(DRIVER), lambda _t: None, withdraw=calls.append, store=store
    )
    await ctl.start()
    try:
        await ctl.wait_idle(5)
        assert calls == []  # nothing to withdraw, nothing said
        hub.submit("sim", [DeviceReport("pool", "a", Health.UNHEALTHY, "x", True)])
        await asyncio.sleep(0)
        await ctl.wait_idle(5)
        hub.submit("sim", [DeviceReport("pool", "b", Health.UNKNOWN)])  # no change
        await ctl.wait_idle(5)
        assert calls == [{("pool", "a")}] and ctl.withdrawn == {("pool", "a")}
    finally:
        await ctl.stop()
    # a restart withdraws the stored unhealthy devices at once, before the hub is read
    again: list[frozenset[tuple[str, str]]] = []
    ctl = TaintController(hub, TaintPolicy(DRIVER), lambda _t: None, withdraw=again.append)
    ctl.store = store
    await ctl.start()
    await ctl.stop()
    assert again[:1] == [{("pool", "a")}]


def test_stamped_taints_keep_the_withdrawn_set() -> None:
    policy = TaintPolicy(DRIVER)
    states = [state("a", Health.UNHEALTHY, sticky=True)]
    stamped = stamp_time_added(desired_taints(states, policy), {}, T0)
    assert withdrawn_devices(stamped, states, policy) == {("pool", "a")}


@pytest.mark.parametrize("mode", ["sometimes", "", "Auto"])
def test_publisher_refuses_an_unknown_withdraw_mode(mode: Any) -> None:
    client = cast(AsyncClient, object())
    with pytest.raises(ValueError, match=r"withdraw_unhealthy .*: choose one of never, auto"):
        ResourceSlicePublisher(client, DRIVER, "n", withdraw_unhealthy=mode)


def test_publisher_refuses_a_bad_recheck_interval() -> None:
    client: Any = object()
    with pytest.raises(ValueError, match="taints_recheck_interval must be > 0"):
        ResourceSlicePublisher(client, DRIVER, "n", taints_recheck_interval=0)
