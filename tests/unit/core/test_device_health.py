"""DeviceHealthModel: worst-of aggregation, latching, hysteresis, recovery, the device
list and versioning, on fake clocks; plus a property test of its invariants over
random report sequences."""

from __future__ import annotations

import ast
import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drahealth.core import Health, _device_health
from drahealth.core._device_health import (
    OPERATOR_SOURCE,
    DeviceHealthModel,
    DeviceReport,
    DeviceState,
    HealthReportSink,
    RecoveryPolicy,
)

H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN
DEVS = [("node-1", "gpu-0"), ("node-1", "gpu-1")]
TIMEOUT = 30


class FakeClock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def make(
    recovery: RecoveryPolicy | None = None, devices: list[tuple[str, str]] | None = None
) -> tuple[DeviceHealthModel, FakeClock, FakeClock]:
    clock, wall = FakeClock(100.0), FakeClock(1_700_000_000.0)
    model = DeviceHealthModel(
        DEVS if devices is None else devices,
        default_timeout_seconds=TIMEOUT,
        recovery=recovery or RecoveryPolicy(),
        clock=clock,
        wall_clock=wall,
    )
    return model, clock, wall


def rep(
    health: Health, msg: str = "", dev: str = "gpu-0", fatal: bool | None = None
) -> DeviceReport:
    return DeviceReport("node-1", dev, health, msg, fatal)


def gpu0(model: DeviceHealthModel) -> tuple[Health, bool, str]:
    s = model.state("node-1", "gpu-0")
    return s.health, s.sticky, s.message


def test_module_imports_no_io_library() -> None:
    tree = ast.parse(inspect.getsource(_device_health))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert imported <= {"__future__", "collections", "dataclasses", "types", "typing", "drahealth"}
    from_drahealth = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("drahealth")
    }
    assert all(m is not None and m.startswith("drahealth.core.") for m in from_drahealth)


def test_new_devices_start_unknown_with_the_default_timeout() -> None:
    model, _, wall = make()
    for s in model.snapshot():
        assert (s.health, s.message, s.sticky, dict(s.sources)) == (X, "", False, {})
        assert (s.timeout_seconds, s.since, s.updated_at) == (TIMEOUT, 100.0, wall.now)
    assert model.version == 1
    assert model.smallest_timeout == TIMEOUT


def test_worst_of_across_sources_and_informational_unhealthy_is_not_sticky() -> None:
    model, _, _ = make()
    model.submit("a", [rep(H, "ok")])
    assert gpu0(model) == (H, False, "ok")
    model.submit("b", [rep(X, "probe timed out")])
    assert gpu0(model) == (X, False, "probe timed out")
    assert dict(model.state("node-1", "gpu-0").sources) == {"a": H, "b": X}
    model.submit("b", [rep(H)])
    model.submit("c", [rep(U, "ECC corrected count high", fatal=False)])
    assert gpu0(model) == (U, False, "ECC corrected count high")
    model.submit("c", [rep(H)])
    assert gpu0(model)[0] is H


def test_worst_messages_joined_latched_first_then_by_source() -> None:
    model, _, _ = make()
    model.submit("a", [rep(U, "link degraded", fatal=False)])
    model.submit("z", [rep(U, "XID 79")])
    model.submit("m", [rep(U, "XID 79", fatal=False)])  # duplicate text shown once
    assert gpu0(model)[2] == "XID 79; link degraded"


def test_latched_fault_is_not_downgraded_and_keeps_its_message() -> None:
    model, _, _ = make()
    model.submit("nvml", [rep(U, "XID 79: fallen off the bus")])
    for later in (rep(U, "ECC corrected", fatal=False), rep(X, "nvml timeout")):
        model.submit("nvml", [later])
        assert gpu0(model) == (U, True, "XID 79: fallen off the bus")
        assert model.state("node-1", "gpu-0").sources == {"nvml": U}


def test_another_sources_healthy_does_not_clear_a_latch() -> None:
    model, _, _ = make()
    model.submit("nvml", [rep(U, "XID 79")])
    model.submit("probe", [rep(H)])
    assert gpu0(model) == (U, True, "XID 79")


def test_same_source_healthy_clears_at_once_with_the_default_policy() -> None:
    model, _, _ = make()
    model.submit("nvml", [rep(U, "XID 79")])
    changed = model.submit("nvml", [rep(H)])
    assert [(c.health, c.sticky, c.message) for c in changed] == [(H, False, "")]


def test_recovery_needs_n_consecutive_healthy_over_t_seconds() -> None:
    model, clock, _ = make(RecoveryPolicy(consecutive_healthy=3, healthy_for_seconds=10.0))
    model.submit("nvml", [rep(U, "XID 79")])
    model.submit("nvml", [rep(H)])  # t=100, streak 1
    clock.now += 5
    model.submit("nvml", [rep(H)])  # t=105, streak 2
    clock.now += 1
    model.submit("nvml", [rep(X)])  # breaks the streak
    clock.now += 1
    for _ in range(3):
        model.submit("nvml", [rep(H)])  # t=107: count met, time not
    assert gpu0(model)[:2] == (U, True)
    clock.now += 9.9
    model.submit("nvml", [rep(H)])
    assert gpu0(model)[:2] == (U, True)
    clock.now += 0.1
    model.submit("nvml", [rep(H)])  # 10 s since the streak began
    assert gpu0(model)[:2] == (H, False)


def test_recovery_needs_the_count_even_when_the_time_is_met() -> None:
    model, clock, _ = make(RecoveryPolicy(consecutive_healthy=2, healthy_for_seconds=1.0))
    model.submit("nvml", [rep(U, "XID 79")])
    model.submit("nvml", [rep(H)])
    clock.now += 60
    model.submit("nvml", [rep(U, "ECC", fatal=False)])  # informational breaks the streak
    model.submit("nvml", [rep(H)])
    clock.now += 60
    assert gpu0(model)[1]
    model.submit("nvml", [rep(H)])
    assert gpu0(model)[0] is H


def test_explicit_recover_of_one_source_and_of_all() -> None:
    model, _, _ = make(RecoveryPolicy(consecutive_healthy=5))
    model.submit("nvml", [rep(U, "XID 79")])
    model.submit("sysfs", [rep(U, "AER fatal")])
    s = model.recover("node-1", "gpu-0", "sysfs")
    assert (s.health, s.sticky, s.message) == (U, True, "XID 79")
    assert s.sources == {"nvml": U, "sysfs": H}
    s = model.recover("node-1", "gpu-0")
    assert (s.health, s.sticky, s.message) == (H, False, "")
    # recovery keeps a newer informational observation
    model.submit("nvml", [rep(U, "XID 79")])
    model.submit("nvml", [rep(U, "ECC corrected", fatal=False)])
    s = model.recover("node-1", "gpu-0")
    assert (s.health, s.sticky, s.message) == (U, False, "ECC corrected")


def test_operator_healthy_clears_every_latch_and_is_not_kept() -> None:
    model, _, _ = make(RecoveryPolicy(consecutive_healthy=5, healthy_for_seconds=60))
    model.submit("nvml", [rep(U, "XID 79")])
    model.submit("sysfs", [rep(U, "AER fatal")])
    model.submit(OPERATOR_SOURCE, [rep(H)])
    s = model.state("node-1", "gpu-0")
    assert (s.health, s.sticky, dict(s.sources)) == (H, False, {"nvml": H, "sysfs": H})


def test_operator_non_healthy_report_is_an_ordinary_contribution() -> None:
    model, _, _ = make()
    model.submit(OPERATOR_SOURCE, [rep(U, "drained for repair")])
    assert gpu0(model) == (U, True, "drained for repair")
    model.submit(OPERATOR_SOURCE, [rep(H)])
    assert gpu0(model) == (X, False, "")  # no other source covers it


def test_unknown_devices_rejected_all_named_and_nothing_applied() -> None:
    model, _, _ = make()
    with pytest.raises(ValueError, match=r"node-1/gpu-9, node-2/gpu-0"):
        model.submit(
            "a",
            [rep(U, "x"), DeviceReport("node-1", "gpu-9", H), DeviceReport("node-2", "gpu-0", H)],
        )
    assert gpu0(model)[0] is X
    assert model.version == 1
    with pytest.raises(ValueError, match="node-1/nope"):
        model.state("node-1", "nope")
    with pytest.raises(ValueError, match="node-1/nope"):
        model.recover("node-1", "nope")


def test_malformed_input_rejected() -> None:
    model, _, _ = make()
    with pytest.raises(ValueError, match="only an Unhealthy report can be fatal"):
        model.submit("a", [rep(H, fatal=True)])
    with pytest.raises(ValueError, match="invalid health"):
        model.submit("a", [DeviceReport("node-1", "gpu-0", "Sick")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="message must be a str"):
        model.submit("a", [DeviceReport("node-1", "gpu-0", H, 7)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be DeviceReport"):
        model.submit("a", [("node-1", "gpu-0", H)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="source"):
        model.submit("", [rep(H)])
    with pytest.raises(ValueError, match="consecutive_healthy"):
        RecoveryPolicy(consecutive_healthy=0)
    with pytest.raises(ValueError, match="healthy_for_seconds"):
        RecoveryPolicy(healthy_for_seconds=-1)
    with pytest.raises(ValueError, match="timeout"):
        model.set_timeout("node-1", "gpu-0", 0)
    with pytest.raises(ValueError, match="timeout"):
        model.set_timeout("node-1", "gpu-0", True)
    with pytest.raises(ValueError, match="node-1/gpu-7"):
        model.set_devices(DEVS, timeouts={("node-1", "gpu-7"): 5})
    with pytest.raises(ValueError, match="pair of strings"):
        model.set_devices([("node-1", 3)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="default_timeout_seconds"):
        DeviceHealthModel(default_timeout_seconds=0, clock=FakeClock(0), wall_clock=FakeClock(0))
    assert model.version == 1


def test_set_devices_adds_unknown_keeps_existing_drops_removed() -> None:
    model, _, _ = make()
    model.submit("a", [rep(H), rep(U, "bad", dev="gpu-1")])
    v = model.version
    changed = model.set_devices(
        [("node-1", "gpu-0"), ("node-0", "gpu-5")], {("node-0", "gpu-5"): 7}
    )
    assert [(c.pool, c.device, c.health, c.timeout_seconds) for c in changed] == [
        ("node-0", "gpu-5", X, 7)
    ]
    assert [(s.pool, s.device, s.health) for s in model.snapshot()] == [
        ("node-0", "gpu-5", X),
        ("node-1", "gpu-0", H),
    ]
    assert model.version == v + 1
    assert model.smallest_timeout == 7
    with pytest.raises(ValueError, match="node-1/gpu-1"):
        model.submit("a", [rep(H, dev="gpu-1")])


def test_removing_a_device_alone_bumps_the_version_with_nothing_changed() -> None:
    model, _, _ = make()
    v = model.version
    assert model.set_devices(DEVS[:1]) == []
    assert model.version == v + 1
    assert model.set_devices(DEVS[:1]) == []
    assert model.version == v + 1


def test_snapshot_is_ordered_and_a_copy() -> None:
    devs = [("p2", "d1"), ("p1", "d2"), ("p1", "d10"), ("p1", "d1")]
    model, _, _ = make(devices=devs)
    snap = model.snapshot()
    assert [(s.pool, s.device) for s in snap] == sorted(devs)
    snap.clear()
    assert len(model.snapshot()) == 4


def test_forget_source() -> None:
    model, _, _ = make()
    model.submit("a", [rep(H), rep(H, dev="gpu-1")])
    model.submit("b", [rep(X, "slow", dev="gpu-1")])
    changed = model.forget_source("b")
    assert [(c.device, c.health) for c in changed] == [("gpu-1", H)]
    changed = model.forget_source("a")
    assert [(c.device, c.health, c.message, dict(c.sources)) for c in changed] == [
        ("gpu-0", X, "", {}),
        ("gpu-1", X, "", {}),
    ]
    v = model.version
    assert model.forget_source("nobody") == []
    assert model.version == v


def test_forget_source_keeps_a_latched_fault_until_recovered() -> None:
    model, _, _ = make()
    model.submit("nvml", [rep(U, "XID 79")])
    model.submit("probe", [rep(H)])
    model.forget_source("nvml")
    assert gpu0(model) == (U, True, "XID 79")
    model.submit("nvml", [rep(H)])  # the same source coming back recovers it
    assert gpu0(model)[0] is H
    model.submit("nvml", [rep(U, "XID 79")])
    model.forget_source("nvml", keep_faults=False)
    assert gpu0(model)[0] is H
    model.submit("nvml", [rep(U, "XID 79")])
    model.forget_source("nvml")
    assert model.recover("node-1", "gpu-0").sources == {"probe": H}  # orphan latch gone


def test_since_and_updated_at_move_only_on_aggregate_change() -> None:
    model, clock, wall = make()
    clock.now, wall.now = 200.0, 1_700_000_100.0
    model.submit("a", [rep(U, "x")])
    s = model.state("node-1", "gpu-0")
    assert (s.since, s.updated_at) == (200.0, 1_700_000_100.0)
    clock.now, wall.now = 300.0, 1_700_000_200.0
    changed = model.submit("b", [rep(H)])  # the sources change, the aggregate does not
    s = model.state("node-1", "gpu-0")
    assert changed == [s]
    assert (s.since, s.updated_at) == (200.0, 1_700_000_100.0)
    assert s.sources == {"a": U, "b": H}


def test_set_timeout_changes_the_state_only_when_the_value_changes() -> None:
    model, _, _ = make()
    s = model.set_timeout("node-1", "gpu-1", 1)
    assert s.timeout_seconds == 1
    assert model.smallest_timeout == 1
    v = model.version
    assert model.set_timeout("node-1", "gpu-1", 1) is s
    assert model.version == v


def test_model_is_a_report_sink() -> None:
    model, _, _ = make()
    sink: HealthReportSink = model
    sink.submit("a", [rep(H)])
    assert gpu0(model)[0] is H


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["submit", "recover", "forget", "tick"]),
        st.sampled_from(["a", "b", OPERATOR_SOURCE]),
        st.sampled_from(["gpu-0", "gpu-1"]),
        st.sampled_from([H, U, X]),
        st.sampled_from([None, False, True]),
        st.sampled_from(["", "XID 79", "ECC"]),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_OPS, st.integers(min_value=1, max_value=3), st.sampled_from([0.0, 5.0]))
def test_invariants_hold_over_any_sequence(
    ops: list[tuple[str, str, str, Health, bool | None, str]],
    consecutive: int,
    seconds: float,
) -> None:
    """Whatever happens: health is the worst effective contribution (Unknown when
    none), sticky states read Unhealthy, the returned changes are exactly the states
    that differ, the version moves iff something changed, and only the latching
    source, the operator or recover() ever clear a latch."""
    model, clock, wall = make(RecoveryPolicy(consecutive, seconds))
    for op, source, dev, health, fatal, msg in ops:
        before = {(s.pool, s.device): s for s in model.snapshot()}
        version = model.version
        if op == "submit":
            if fatal and health is not U:
                fatal = None
            changed = model.submit(source, [rep(health, msg, dev, fatal)])
        elif op == "recover":
            changed = [model.recover("node-1", dev, None if source == OPERATOR_SOURCE else source)]
            changed = [s for s in changed if s is not before[(s.pool, s.device)]]
        elif op == "forget":
            changed = model.forget_source(source)
        else:
            clock.now += 3
            wall.now += 3
            changed = []
        after = {(s.pool, s.device): s for s in model.snapshot()}
        differ = [after[k] for k in after if after[k] is not before[k]]
        assert sorted(changed, key=lambda s: s.device) == sorted(differ, key=lambda s: s.device)
        assert model.version == version + (1 if differ else 0)
        for s in after.values():
            assert isinstance(s, DeviceState)
            expected = Health.worst(*s.sources.values()) if s.sources else X
            assert s.health is expected
            if s.sticky:
                assert s.health is U
            was = before[(s.pool, s.device)]
            if was.sticky and not s.sticky and op == "submit":
                assert source == OPERATOR_SOURCE or (health is H and source in was.sources)
