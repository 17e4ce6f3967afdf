"""HealthHub aggregation, sticky severity and recovery, on fake clocks (no loop, no sleeps)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drahealth import api
from drahealth.core import Health
from drahealth.driver._hub import (
    OPERATOR_SOURCE,
    DeviceReport,
    DeviceState,
    HealthHub,
    RecoveryPolicy,
)

H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN
DEVS = [("node-1", "gpu-0"), ("node-1", "gpu-1")]


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def make_hub(
    recovery: RecoveryPolicy | None = None, devices: list[tuple[str, str]] | None = None
) -> tuple[HealthHub, FakeClock, FakeClock]:
    clock, wall = FakeClock(100.0), FakeClock(1_700_000_000.0)
    hub = HealthHub(
        DEVS if devices is None else devices,
        recovery=recovery or RecoveryPolicy(),
        clock=clock,
        wall_clock=wall,
    )
    return hub, clock, wall


def rep(
    health: Health, msg: str = "", dev: str = "gpu-0", fatal: bool | None = None
) -> DeviceReport:
    return DeviceReport("node-1", dev, health, msg, fatal)


def test_new_devices_start_unknown() -> None:
    hub, _, _ = make_hub()
    for s in hub.snapshot():
        assert (s.health, s.message, s.sticky, dict(s.sources)) == (X, "", False, {})
        assert s.timeout_seconds == api.DEFAULT_HEALTH_TIMEOUT_SECONDS


def test_worst_of_across_sources() -> None:
    hub, _, _ = make_hub()
    hub.submit("a", [rep(H, "ok")])
    assert hub.state("node-1", "gpu-0").health is H
    hub.submit("b", [rep(X, "probe timed out")])
    s = hub.state("node-1", "gpu-0")
    assert (s.health, s.message) == (X, "probe timed out")
    assert dict(s.sources) == {"a": H, "b": X}
    hub.submit("b", [rep(H)])
    assert hub.state("node-1", "gpu-0").health is H
    # informational Unhealthy is not sticky: it follows worst-of
    hub.submit("c", [rep(U, "ECC corrected count high", fatal=False)])
    s = hub.state("node-1", "gpu-0")
    assert (s.health, s.sticky) == (U, False)
    hub.submit("c", [rep(H)])
    assert hub.state("node-1", "gpu-0").health is H


def test_worst_messages_joined_fatal_first() -> None:
    hub, _, _ = make_hub()
    hub.submit("a", [rep(U, "link degraded", fatal=False)])
    hub.submit("z", [rep(U, "XID 79")])
    assert hub.state("node-1", "gpu-0").message == "XID 79; link degraded"


def test_sticky_fatal_not_downgraded_and_message_kept() -> None:
    hub, _, _ = make_hub()
    hub.submit("nvml", [rep(U, "XID 79: fallen off the bus")])
    for later in (rep(U, "ECC corrected", fatal=False), rep(X, "nvml timeout")):
        hub.submit("nvml", [later])
        s = hub.state("node-1", "gpu-0")
        assert (s.health, s.message, s.sticky) == (U, "XID 79: fallen off the bus", True)
        assert s.sources == {"nvml": U}


def test_other_source_healthy_does_not_clear() -> None:
    hub, _, _ = make_hub()
    hub.submit("nvml", [rep(U, "XID 79")])
    hub.submit("probe", [rep(H), rep(H)])
    s = hub.state("node-1", "gpu-0")
    assert (s.health, s.sticky, s.message) == (U, True, "XID 79")


def test_same_source_recovery_immediate_with_default_policy() -> None:
    hub, _, _ = make_hub()
    hub.submit("nvml", [rep(U, "XID 79")])
    changed = hub.submit("nvml", [rep(H)])
    assert [(c.health, c.sticky, c.message) for c in changed] == [(H, False, "")]


def test_recovery_needs_n_consecutive_and_t_seconds() -> None:
    hub, clock, _ = make_hub(RecoveryPolicy(consecutive_healthy=3, healthy_for_seconds=10.0))
    hub.submit("nvml", [rep(U, "XID 79")])

    def health() -> tuple[Health, bool]:
        s = hub.state("node-1", "gpu-0")
        return s.health, s.sticky

    hub.submit("nvml", [rep(H)])  # t=100, streak 1
    clock.now += 5
    hub.submit("nvml", [rep(H)])  # t=105, streak 2
    clock.now += 1
    hub.submit("nvml", [rep(X)])  # breaks the streak
    clock.now += 1
    for _ in range(3):
        hub.submit("nvml", [rep(H)])  # t=107: count met, time not
    assert health() == (U, True)
    clock.now += 9.9
    hub.submit("nvml", [rep(H)])  # 9.9 s since streak start
    assert health() == (U, True)
    clock.now += 0.1
    hub.submit("nvml", [rep(H)])  # 10 s since streak start
    assert health() == (H, False)


def test_recovery_needs_count_even_when_time_met() -> None:
    hub, clock, _ = make_hub(RecoveryPolicy(consecutive_healthy=2, healthy_for_seconds=1.0))
    hub.submit("nvml", [rep(U, "XID 79")])
    hub.submit("nvml", [rep(H)])
    clock.now += 60
    hub.submit("nvml", [rep(U, "ECC", fatal=False)])  # informational still breaks the streak
    hub.submit("nvml", [rep(H)])
    clock.now += 60
    assert hub.state("node-1", "gpu-0").sticky
    hub.submit("nvml", [rep(H)])
    assert hub.state("node-1", "gpu-0").health is H


def test_explicit_recover_all_and_one_source() -> None:
    hub, _, _ = make_hub(RecoveryPolicy(consecutive_healthy=5))
    hub.submit("nvml", [rep(U, "XID 79")])
    hub.submit("sysfs", [rep(U, "AER fatal")])
    s = hub.recover("node-1", "gpu-0", "sysfs")
    assert (s.health, s.sticky, s.message) == (U, True, "XID 79")
    assert s.sources == {"nvml": U, "sysfs": H}
    s = hub.recover("node-1", "gpu-0")
    assert (s.health, s.sticky, s.message) == (H, False, "")
    # recovery keeps a newer informational observation
    hub.submit("nvml", [rep(U, "XID 79")])
    hub.submit("nvml", [rep(U, "ECC corrected", fatal=False)])
    s = hub.recover("node-1", "gpu-0")
    assert (s.health, s.sticky, s.message) == (U, False, "ECC corrected")


def test_operator_source_healthy_recovers_immediately() -> None:
    hub, _, _ = make_hub(RecoveryPolicy(consecutive_healthy=5, healthy_for_seconds=60))
    hub.submit("nvml", [rep(U, "XID 79")])
    hub.submit(OPERATOR_SOURCE, [rep(H)])
    s = hub.state("node-1", "gpu-0")
    assert (s.health, s.sticky, dict(s.sources)) == (H, False, {"nvml": H})


def test_unknown_device_rejected_naming_it_and_nothing_applied() -> None:
    hub, _, _ = make_hub()
    with pytest.raises(ValueError, match=r"node-1/gpu-9, node-2/gpu-0"):
        hub.submit(
            "a",
            [rep(U, "x"), DeviceReport("node-1", "gpu-9", H), DeviceReport("node-2", "gpu-0", H)],
        )
    assert hub.state("node-1", "gpu-0").health is X
    assert hub.version == 1
    with pytest.raises(ValueError, match="node-1/nope"):
        hub.state("node-1", "nope")
    with pytest.raises(ValueError, match="node-1/nope"):
        hub.recover("node-1", "nope")


def test_bad_reports_rejected() -> None:
    hub, _, _ = make_hub()
    with pytest.raises(ValueError, match="only an Unhealthy report can be fatal"):
        hub.submit("a", [rep(H, fatal=True)])
    with pytest.raises(ValueError, match="invalid health"):
        hub.submit("a", [DeviceReport("node-1", "gpu-0", "Sick")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="source"):
        hub.submit("", [rep(H)])
    with pytest.raises(ValueError, match="consecutive_healthy"):
        RecoveryPolicy(consecutive_healthy=0)
    with pytest.raises(ValueError, match="timeout"):
        hub.set_timeout("node-1", "gpu-0", 0)
    with pytest.raises(ValueError, match="node-1/gpu-7"):
        hub.set_devices(DEVS, timeouts={("node-1", "gpu-7"): 5})


def test_set_devices_adds_unknown_keeps_existing_drops_removed() -> None:
    hub, _, _ = make_hub()
    hub.submit("a", [rep(H), rep(U, "bad", dev="gpu-1")])
    changed = hub.set_devices([("node-1", "gpu-0"), ("node-0", "gpu-5")], {("node-0", "gpu-5"): 7})
    assert [(c.pool, c.device, c.health, c.timeout_seconds) for c in changed] == [
        ("node-0", "gpu-5", X, 7)
    ]
    assert [(s.pool, s.device, s.health) for s in hub.snapshot()] == [
        ("node-0", "gpu-5", X),
        ("node-1", "gpu-0", H),
    ]
    with pytest.raises(ValueError, match="node-1/gpu-1"):
        hub.submit("a", [rep(H, dev="gpu-1")])


def test_snapshot_order_is_deterministic() -> None:
    devs = [("p2", "d1"), ("p1", "d2"), ("p1", "d10"), ("p1", "d1")]
    hub, _, _ = make_hub(devices=devs)
    assert [(s.pool, s.device) for s in hub.snapshot()] == sorted(devs)


def test_subscribe_and_unsubscribe() -> None:
    hub, _, _ = make_hub()
    seen: list[list[DeviceState]] = []
    unsubscribe = hub.subscribe(seen.append)
    hub.submit("a", [rep(H), rep(H, dev="gpu-1")])
    hub.submit("a", [rep(H)])  # no change -> no callback
    hub.submit("a", [rep(U, "x", dev="gpu-1")])
    assert [[(s.device, s.health) for s in batch] for batch in seen] == [
        [("gpu-0", H), ("gpu-1", H)],
        [("gpu-1", U)],
    ]
    unsubscribe()
    hub.recover("node-1", "gpu-1")
    assert len(seen) == 2


def test_failing_subscriber_does_not_break_hub(caplog: pytest.LogCaptureFixture) -> None:
    hub, _, _ = make_hub()
    seen: list[int] = []

    def boom(_: list[DeviceState]) -> None:
        raise RuntimeError("boom")

    hub.subscribe(boom)
    hub.subscribe(lambda states: seen.append(len(states)))
    hub.submit("a", [rep(H)])
    assert seen == [1]
    assert "subscriber" in caplog.text


def test_forget_source() -> None:
    hub, _, _ = make_hub()
    hub.submit("a", [rep(H), rep(H, dev="gpu-1")])
    hub.submit("b", [rep(X, "slow", dev="gpu-1")])
    changed = hub.forget_source("b")
    assert [(c.device, c.health) for c in changed] == [("gpu-1", H)]
    changed = hub.forget_source("a")
    assert [(c.device, c.health, c.message, dict(c.sources)) for c in changed] == [
        ("gpu-0", X, "", {}),
        ("gpu-1", X, "", {}),
    ]
    assert hub.forget_source("nobody") == []


def test_forget_source_keeps_latched_fault_until_recovered() -> None:
    hub, _, _ = make_hub()
    hub.submit("nvml", [rep(U, "XID 79")])
    hub.submit("probe", [rep(H)])
    hub.forget_source("nvml")
    s = hub.state("node-1", "gpu-0")
    assert (s.health, s.sticky, s.message) == (U, True, "XID 79")
    # the same source coming back can recover it
    hub.submit("nvml", [rep(H)])
    assert hub.state("node-1", "gpu-0").health is H
    # or drop the fault too
    hub.submit("nvml", [rep(U, "XID 79")])
    hub.forget_source("nvml", keep_faults=False)
    assert hub.state("node-1", "gpu-0").health is H
    # an orphan latch cleared by recover() disappears
    hub.submit("nvml", [rep(U, "XID 79")])
    hub.forget_source("nvml")
    assert hub.recover("node-1", "gpu-0").sources == {"probe": H}


def test_since_and_updated_at_move_only_on_aggregate_change() -> None:
    hub, clock, wall = make_hub()
    clock.now, wall.now = 200.0, 1_700_000_100.0
    hub.submit("a", [rep(U, "x")])
    s = hub.state("node-1", "gpu-0")
    assert (s.since, s.updated_at) == (200.0, 1_700_000_100.0)
    clock.now, wall.now = 300.0, 1_700_000_200.0
    hub.submit("b", [rep(H)])  # sources change, aggregate does not
    s = hub.state("node-1", "gpu-0")
    assert (s.since, s.updated_at) == (200.0, 1_700_000_100.0)
    assert s.sources == {"a": U, "b": H}


def test_timeouts_and_heartbeat_interval() -> None:
    hub, _, _ = make_hub()
    assert hub.heartbeat_interval == pytest.approx(10.0)
    s = hub.set_timeout("node-1", "gpu-1", 1)
    assert s.timeout_seconds == 1
    assert hub.heartbeat_interval == pytest.approx(1 / 3)
    v = hub.version
    hub.set_timeout("node-1", "gpu-1", 1)  # same value: no change
    assert hub.version == v


def test_advertised_services() -> None:
    hub, _, _ = make_hub()
    assert hub.advertised_services() == [api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1]
    assert HealthHub(supported=False).advertised_services() == []


def test_wire_encoding_truncates_multibyte_message() -> None:
    hub, _, wall = make_hub()
    msg = "é" * 1000  # 2,000 UTF-8 bytes
    wall.now = 1_700_000_123.9
    hub.submit("nvml", [rep(U, msg)])
    hub.set_timeout("node-1", "gpu-0", 45)
    resp = api.health_v1.NodeWatchResourcesResponse.FromString(hub.encode_snapshot_v1())
    d0, d1 = resp.devices
    assert (d0.device.pool_name, d0.device.device_name) == ("node-1", "gpu-0")
    assert d0.health == api.health_v1.UNHEALTHY
    assert d0.health_check_timeout_seconds == 45
    assert d0.last_updated_time == 1_700_000_123
    raw = d0.message.encode("utf-8")
    assert len(raw) <= api.HEALTH_MESSAGE_MAX_BYTES
    assert d0.message.endswith("...") and d0.message[:-3] == "é" * 510
    assert d1.health == api.health_v1.UNKNOWN and d1.message == ""
    # the full message stays in the hub
    assert hub.state("node-1", "gpu-0").message == msg


def test_submit_threadsafe() -> None:
    import asyncio
    import threading

    hub, _, _ = make_hub()

    async def main() -> list[DeviceState]:
        loop = asyncio.get_running_loop()
        main_thread = threading.get_ident()

        def worker() -> list[DeviceState]:
            assert threading.get_ident() != main_thread
            return hub.submit_threadsafe(loop, "a", [rep(H)]).result(5)

        return await asyncio.to_thread(worker)

    changed = asyncio.run(main())
    assert [c.health for c in changed] == [H]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["submit", "timeout", "devices"]),
            st.integers(min_value=0, max_value=5),
            st.sampled_from([H, U, X]),
            st.text(max_size=300),
        ),
        max_size=25,
    )
)
def test_cached_encoding_equals_fresh_encoding(
    ops: list[tuple[str, int, Health, str]],
) -> None:
    """The per-device byte cache must give the same bytes as a from-scratch encode,
    whatever sequence of reports, timeout changes and device-set changes led there."""
    from drahealth.driver._health_service import encode_v1

    all_devs = [("pool-a", f"dev-{i}") for i in range(6)]
    hub, clock, wall = make_hub(devices=all_devs[:3])
    for op, i, health, msg in ops:
        clock.now += 1
        wall.now += 1.5
        devs = [(s.pool, s.device) for s in hub.snapshot()]
        if op == "devices":
            hub.set_devices(all_devs[: i + 1] if i % 2 else all_devs[i:])
        elif devs:
            pool, dev = devs[i % len(devs)]
            if op == "submit":
                hub.submit("src", [DeviceReport(pool, dev, health, msg)])
            else:
                hub.set_timeout(pool, dev, i + 1)
        assert hub.encode_snapshot_v1() == encode_v1(hub.snapshot()).SerializeToString()
