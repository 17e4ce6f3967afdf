"""Health-driven taints: policy transitions, timeAdded stamping, the store, the controller."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path
from types import MappingProxyType

import pytest
from lightkube.models.resource_v1 import DeviceTaint

from drahealth.core import Health
from drahealth.driver._hub import DeviceReport, DeviceState, HealthHub
from drahealth.driver._taints import (
    TaintController,
    TaintMap,
    TaintPolicy,
    TaintStore,
    TaintStoreError,
    desired_taints,
    reason_code,
    stamp_time_added,
)

DRIVER = "gpu.example.com"
KEY = "gpu.example.com/unhealthy"
T0 = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)


def state(device: str, health: Health, *, sticky: bool = False, msg: str = "") -> DeviceState:
    return DeviceState("pool", device, health, msg, 0.0, sticky, MappingProxyType({}), 30)


def keys(taints: TaintMap) -> dict[str, list[tuple[str, str | None, str]]]:
    return {d: [(t.key, t.value, t.effect) for t in ts] for (_, d), ts in taints.items()}


# --------------------------------------------------------------------------- policy


def test_sticky_unhealthy_taints_and_only_recovery_clears() -> None:
    policy = TaintPolicy(DRIVER)
    tainted = desired_taints([state("a", Health.UNHEALTHY, sticky=True)], policy)
    assert keys(tainted) == {"a": [(KEY, "true", "NoSchedule")]}
    # Unknown (e.g. source wedged) and absence keep it; Healthy removes it
    assert desired_taints([state("a", Health.UNKNOWN)], policy, tainted) == tainted
    assert desired_taints([], policy, tainted) == tainted
    assert desired_taints([state("a", Health.HEALTHY)], policy, tainted) == {}


def test_transient_unhealthy_only_taints_when_asked() -> None:
    s = [state("a", Health.UNHEALTHY)]
    assert desired_taints(s, TaintPolicy(DRIVER)) == {}
    assert keys(desired_taints(s, TaintPolicy(DRIVER, taint_transient=True))) == {
        "a": [(KEY, "true", "NoSchedule")]
    }


def test_effect_and_unmonitored_policy() -> None:
    policy = TaintPolicy(DRIVER, unhealthy_effect="NoExecute", unmonitored=True)
    out = desired_taints(
        [
            state("b", Health.UNKNOWN),
            state("a", Health.UNHEALTHY, sticky=True),
            state("c", Health.HEALTHY),
        ],
        policy,
    )
    assert keys(out) == {
        "a": [(KEY, "true", "NoExecute")],
        "b": [("gpu.example.com/unmonitored", "true", "None")],
    }
    assert list(out) == [("pool", "a"), ("pool", "b")]  # deterministic order
    assert desired_taints([state("b", Health.UNKNOWN)], TaintPolicy(DRIVER)) == {}


def test_unknown_after_fault_keeps_unhealthy_and_adds_unmonitored_sorted() -> None:
    policy = TaintPolicy(DRIVER, unmonitored=True)
    before = desired_taints([state("a", Health.UNHEALTHY, sticky=True)], policy)
    after = desired_taints([state("a", Health.UNKNOWN)], policy, before)
    assert keys(after) == {
        "a": [(KEY, "true", "NoSchedule"), ("gpu.example.com/unmonitored", "true", "None")]
    }


def test_reason_codes_are_sanitized_label_values() -> None:
    assert reason_code("Xid 79") == "xid-79"
    assert reason_code("  --GPU fell off the bus!!  ") == "gpu-fell-off-the-bus"
    assert reason_code("ü" * 3) is None
    assert len(reason_code("x" * 200) or "") == 63
    policy = TaintPolicy(DRIVER, value=lambda s: s.message.split(":")[0])
    out = desired_taints(
        [state("a", Health.UNHEALTHY, sticky=True, msg="Xid 79: GPU has fallen off the bus")],
        policy,
    )
    assert keys(out) == {"a": [(KEY, "xid-79", "NoSchedule")]}

    def broken(_: DeviceState) -> str:
        raise RuntimeError("boom")

    out = desired_taints(
        [state("a", Health.UNHEALTHY, sticky=True)], TaintPolicy(DRIVER, value=broken)
    )
    assert keys(out) == {"a": [(KEY, "true", "NoSchedule")]}


def test_policy_rejects_bad_effects_and_drivers() -> None:
    with pytest.raises(ValueError, match="unhealthy_effect"):
        TaintPolicy(DRIVER, unhealthy_effect="PreferNoSchedule")
    with pytest.raises(ValueError, match="driver"):
        TaintPolicy("Not A Driver")


def test_stamp_keeps_first_time_and_truncates_new_ones() -> None:
    desired = {("pool", "a"): [DeviceTaint(key=KEY, value="true", effect="NoSchedule")]}
    first = stamp_time_added(desired, {}, T0.replace(microsecond=900_000))
    assert first[("pool", "a")][0].timeAdded == T0
    again = stamp_time_added(desired, first, T0 + dt.timedelta(hours=1))
    assert again == first
    changed = {("pool", "a"): [DeviceTaint(key=KEY, value="true", effect="NoExecute")]}
    later = T0 + dt.timedelta(hours=2)
    assert stamp_time_added(changed, first, later)[("pool", "a")][0].timeAdded == later


# --------------------------------------------------------------------------- store


def sample() -> TaintMap:
    return {
        ("pool", "a"): [DeviceTaint(key=KEY, value="xid-79", effect="NoSchedule", timeAdded=T0)],
        ("pool-2", "b"): [
            DeviceTaint(key=KEY, value="true", effect="NoExecute", timeAdded=T0),
            DeviceTaint(key="gpu.example.com/unmonitored", effect="None", timeAdded=T0),
        ],
    }


def test_store_round_trip(tmp_path: Path) -> None:
    store = TaintStore(tmp_path / "sub" / "taints.json")
    assert store.load() == {}
    store.save(sample())
    loaded = store.load()
    assert keys(loaded) == keys(sample())
    assert all(t.timeAdded == T0 for ts in loaded.values() for t in ts)
    assert [p.name for p in store.path.parent.iterdir()] == ["taints.json"]  # no temp left
    store.save({})
    assert store.load() == {}


def test_store_refuses_taints_without_time(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timeAdded"):
        TaintStore(tmp_path / "t.json").save({("p", "d"): [DeviceTaint(key=KEY, effect="None")]})


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda text: text[: len(text) // 2], "Expecting|Unterminated|delimiter"),
        (lambda text: text.replace("xid-79", "xid-80"), "checksum"),
        (lambda text: text.replace('"version": 1', '"version": 9'), "version"),
        (lambda text: "\xff\xfe", "codec|Expecting"),
    ],
)
def test_corrupt_store_raises_and_keeps_a_copy(tmp_path: Path, mutate, problem: str) -> None:  # type: ignore[no-untyped-def]
    store = TaintStore(tmp_path / "taints.json")
    store.save(sample())
    bad = mutate(store.path.read_text())
    store.path.write_bytes(bad.encode("latin-1"))
    with pytest.raises(TaintStoreError, match=problem) as err:
        store.load()
    assert err.value.quarantine is not None and err.value.quarantine.exists()
    assert err.value.quarantine.read_bytes() == bad.encode("latin-1")
    assert str(store.path) in str(err.value)


def test_store_file_is_versioned_and_checksummed(tmp_path: Path) -> None:
    store = TaintStore(tmp_path / "taints.json")
    store.save(sample())
    doc = json.loads(store.path.read_text())
    assert doc["version"] == 1 and doc["checksum"].startswith("sha256:")
    assert doc["taints"][0]["timeAdded"] == "2026-11-22T12:00:00Z"


# --------------------------------------------------------------------------- controller


class Recorder:
    def __init__(self) -> None:
        self.calls: list[TaintMap] = []

    def __call__(self, taints: TaintMap) -> None:
        self.calls.append(taints)


def fatal(device: str) -> DeviceReport:
    return DeviceReport("pool", device, Health.UNHEALTHY, "Xid 79")


async def test_controller_batches_a_burst_into_one_republish(tmp_path: Path) -> None:
    hub = HealthHub([("pool", f"d{i}") for i in range(10)])
    rec = Recorder()
    ctl = TaintController(hub, TaintPolicy(DRIVER), rec, store=TaintStore(tmp_path / "t.json"))
    await ctl.start()
    await ctl.wait_idle(2)
    assert rec.calls == []  # all Unknown: nothing to taint
    for i in range(10):
        hub.submit("nvml", [fatal(f"d{i}")])
    await ctl.wait_idle(2)
    assert len(rec.calls) == 1
    assert sorted(d for _, d in rec.calls[0]) == [f"d{i}" for i in range(10)]
    assert keys(TaintStore(tmp_path / "t.json").load()) == keys(rec.calls[0])
    hub.recover("pool", "d3")
    await ctl.wait_idle(2)
    assert len(rec.calls) == 2 and ("pool", "d3") not in rec.calls[1]
    await ctl.stop()


async def test_restart_reapplies_stored_taints_with_their_time(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    hub = HealthHub([("pool", "a"), ("pool", "b")])
    ctl = TaintController(
        hub, TaintPolicy(DRIVER), Recorder(), store=TaintStore(path), clock=lambda: T0
    )
    await ctl.start()
    hub.submit("nvml", [fatal("a")])
    await ctl.wait_idle(2)
    await ctl.stop()

    # restart: the new hub has no faults yet (all Unknown); the taint must survive
    hub2 = HealthHub([("pool", "a"), ("pool", "b")])
    rec = Recorder()
    later = T0 + dt.timedelta(hours=1)
    ctl2 = TaintController(
        hub2, TaintPolicy(DRIVER), rec, store=TaintStore(path), clock=lambda: later
    )
    await ctl2.start()
    assert len(rec.calls) == 1  # applied from the store before the hub is consulted
    await ctl2.wait_idle(2)
    assert len(rec.calls) == 1
    [t] = ctl2.taints[("pool", "a")]
    assert t.timeAdded == T0
    hub2.submit("nvml", [DeviceReport("pool", "a", Health.HEALTHY)])
    await ctl2.wait_idle(2)
    assert rec.calls[-1] == {} and TaintStore(path).load() == {}
    await ctl2.stop()


async def test_corrupt_store_is_reported_and_replaced(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text("{not json")
    hub = HealthHub([("pool", "a")])
    rec = Recorder()
    ctl = TaintController(hub, TaintPolicy(DRIVER), rec, store=TaintStore(path))
    await ctl.start()
    assert ctl.load_error is not None and ctl.load_error.quarantine is not None
    hub.submit("nvml", [fatal("a")])
    await ctl.wait_idle(2)
    assert keys(TaintStore(path).load()) == {"a": [(KEY, "true", "NoSchedule")]}
    await ctl.stop()


async def test_apply_errors_are_counted_not_fatal() -> None:
    hub = HealthHub([("pool", "a")])
    seen: list[TaintMap] = []

    async def failing(taints: TaintMap) -> None:
        seen.append(taints)
        await asyncio.sleep(0)
        raise RuntimeError("publisher refused")

    ctl = TaintController(hub, TaintPolicy(DRIVER), failing, batch_delay=0.001)
    await ctl.start()
    hub.submit("nvml", [fatal("a")])
    await ctl.wait_idle(2)
    assert ctl.apply_errors == 1 and isinstance(ctl.last_error, RuntimeError) and seen
    await ctl.stop()
