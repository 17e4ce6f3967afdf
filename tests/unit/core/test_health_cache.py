"""HealthCache: update phases, leases pushed at expiry, restore with recorded timing,
validated and bounded input, forgetting devices, and a model-based property test
against a naive reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drahealth.core import DeviceKey, Health
from drahealth.core._health_cache import DEFAULT_TIMEOUT_SECONDS, HealthCache
from drahealth.core._records import ChangeReason, DeviceEntry, HealthChange, ReportedDevice

D = "gpu.example.com"
H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN


class FakeClock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def make(**kwargs: object) -> tuple[HealthCache, FakeClock, FakeClock]:
    clock, wall = FakeClock(100.0), FakeClock(1_700_000_000.0)
    cache = HealthCache(clock=clock, wall_clock=wall, **kwargs)  # type: ignore[arg-type]
    return cache, clock, wall


def rep(device: str, health: Health = H, message: str = "", timeout: int = 0) -> ReportedDevice:
    return ReportedDevice("pool", device, health, message, timeout)


def key(device: str, driver: str = D) -> DeviceKey:
    return DeviceKey(driver, "pool", device)


def change(
    device: str,
    old: Health,
    new: Health,
    message: str = "",
    reason: ChangeReason = ChangeReason.REPORT,
) -> HealthChange:
    return HealthChange(key(device), old, new, message, reason)


def advance(clock: FakeClock, wall: FakeClock, seconds: float) -> None:
    clock.now += seconds
    wall.now += seconds


# -- update -----------------------------------------------------------------------


def test_new_device_is_a_change_even_when_reported_unknown() -> None:
    cache, _, _ = make()
    assert cache.update(D, [rep("a", X, "warming up"), rep("b")]) == [
        change("a", X, X, "warming up"),
        change("b", X, H),
    ]
    assert cache.get(D, "pool", "a") == (X, "warming up")
    assert cache.get(D, "pool", "b") == (H, "")


def test_heartbeat_refreshes_without_change() -> None:
    cache, clock, wall = make()
    cache.update(D, [rep("a")])
    advance(clock, wall, 20)
    assert cache.update(D, [rep("a")]) == []
    entry = cache.entry(D, "pool", "a")
    assert entry is not None
    assert entry.last_seen == 120.0
    assert entry.last_seen_wall == 1_700_000_020.0
    assert entry.changed_wall == 1_700_000_000.0
    advance(clock, wall, 29)  # 49 s after the first report, 29 s after the heartbeat
    assert cache.get(D, "pool", "a") == (H, "")


@pytest.mark.parametrize(
    ("second", "expected_new", "expected_message"),
    [(rep("a", U), U, ""), (rep("a", H, "fan slow"), H, "fan slow"), (rep("a", H, "", 10), H, "")],
)
def test_health_message_or_timeout_difference_is_a_change(
    second: ReportedDevice, expected_new: Health, expected_message: str
) -> None:
    cache, clock, wall = make()
    cache.update(D, [rep("a")])
    advance(clock, wall, 1)
    assert cache.update(D, [second]) == [change("a", H, expected_new, expected_message)]
    entry = cache.entry(D, "pool", "a")
    assert entry is not None and entry.changed_wall == 1_700_000_001.0


@pytest.mark.parametrize(("wire", "resolved"), [(0, 30.0), (-5, 30.0), (7, 7.0), (3600, 3600.0)])
def test_timeout_resolution(wire: int, resolved: float) -> None:
    cache, _, _ = make()
    cache.update(D, [rep("a", timeout=wire)])
    entry = cache.entry(D, "pool", "a")
    assert entry is not None and entry.timeout == resolved
    assert cache.min_timeout(D) == resolved


def test_zero_and_negative_timeout_are_the_same_lease() -> None:
    cache, _, _ = make()
    cache.update(D, [rep("a", timeout=0)])
    assert cache.update(D, [rep("a", timeout=-1)]) == []
    assert cache.update(D, [rep("a", timeout=30)]) == []


def test_duplicates_in_one_report_worst_health_wins_one_change() -> None:
    cache, _, _ = make()
    # A later Healthy must not hide an earlier Unhealthy of the same device.
    assert cache.update(D, [rep("a", U, "xid"), rep("a", H, "ok")]) == [change("a", X, U, "xid")]
    assert cache.update(D, [rep("a", H), rep("a", X, "?"), rep("a", H)]) == [change("a", U, X, "?")]
    # Among equals the later entry wins; ending on the cached value is no change.
    assert cache.update(D, [rep("a", X, "first"), rep("a", X, "?")]) == []
    assert cache.get(D, "pool", "a") == (X, "?")


def test_omitted_device_keeps_health_until_its_lease_ends() -> None:
    cache, clock, wall = make()
    cache.update(D, [rep("a", U, "ecc"), rep("b")])
    advance(clock, wall, 30)  # exactly the lease: not strictly past
    assert cache.update(D, [rep("b")]) == []
    assert cache.get(D, "pool", "a") == (U, "ecc")
    advance(clock, wall, 0.5)
    # the driver no longer lists it and its lease ended: forgotten
    assert cache.update(D, [rep("b")]) == [change("a", U, X, "", ChangeReason.DROPPED)]
    assert cache.entry(D, "pool", "a") is None
    assert cache.get(D, "pool", "a") == (X, "")
    assert len(cache) == 1


def test_expired_device_stays_stored_unknown_until_its_driver_reports_without_it() -> None:
    cache, clock, wall = make()
    cache.update(D, [rep("a", U, "ecc"), rep("b", timeout=100)])
    advance(clock, wall, 30.5)
    assert cache.expire() == [change("a", U, X, "", ChangeReason.EXPIRED)]
    entry = cache.entry(D, "pool", "a")
    assert entry is not None and (entry.health, entry.message) == (X, "")
    assert entry.last_seen == 100.0  # last seen in a report, not the expiry time
    assert entry.changed_wall == 1_700_000_030.5
    assert cache.update(D, [rep("b", timeout=100)]) == [change("a", X, X, "", ChangeReason.DROPPED)]
    assert cache.entries() == [e for e in cache.entries() if e.device == "b"]


def test_omitted_stored_unknown_device_is_forgotten_after_its_lease() -> None:
    cache, clock, wall = make()
    cache.update(D, [rep("a", X, "booting"), rep("b")])
    advance(clock, wall, 10)
    assert cache.update(D, [rep("b")]) == []  # lease still runs: kept
    entry = cache.entry(D, "pool", "a")
    assert entry is not None and (entry.health, entry.message) == (X, "booting")
    advance(clock, wall, 21)
    assert cache.update(D, [rep("b")]) == [change("a", X, X, "", ChangeReason.DROPPED)]
    assert cache.entry(D, "pool", "a") is None


def test_phase2_only_touches_the_reporting_driver() -> None:
    cache, clock, wall = make()
    cache.update("other.example.com", [rep("z")])
    cache.update(D, [rep("a")])
    advance(clock, wall, 31)
    assert cache.update(D, [rep("a")]) == []
    stored = cache.entry("other.example.com", "pool", "z")
    assert stored is not None and stored.health is H  # stored untouched (no expire() call)
    assert cache.get("other.example.com", "pool", "z") == (X, "")  # but reads stale


def test_phase2_changes_sorted_after_reported_changes() -> None:
    cache, clock, wall = make()
    cache.update(D, [rep("c"), rep("a"), rep("b")])
    advance(clock, wall, 31)
    changes = cache.update(D, [rep("new")])
    assert [c.key.device for c in changes] == ["new", "a", "b", "c"]
    assert [c.reason for c in changes] == [ChangeReason.REPORT] + [ChangeReason.DROPPED] * 3


def test_empty_report_creates_no_driver_entry() -> None:
    cache, _, _ = make()
    assert cache.update(D, []) == []
    assert cache.drivers() == []
    assert cache.entries() == []
    assert cache.min_timeout(D) == DEFAULT_TIMEOUT_SECONDS


def test_message_is_truncated_defensively() -> None:
    cache, _, _ = make()
    cache.update(D, [rep("a", U, "é" * 1000)])
    health, message = cache.get(D, "pool", "a")
    assert health is U
    assert len(message.encode()) <= 1024 and message.endswith("...")


# -- get ---------------------------------------------------------------------------


def test_get_absent_and_stale_read_unknown_without_modifying() -> None:
    cache, clock, wall = make()
    assert cache.get(D, "pool", "nope") == (X, "")
    cache.update(D, [rep("a", U, "ecc", timeout=10)])
    advance(clock, wall, 10)
    assert cache.get(D, "pool", "a") == (U, "ecc")
    advance(clock, wall, 0.001)
    assert cache.get(D, "pool", "a") == (X, "")
    entry = cache.entry(D, "pool", "a")
    assert entry is not None and entry.health is U and entry.message == "ecc"
    assert cache.get(D, "other-pool", "a") == (X, "")
    assert cache.get("other.example.com", "pool", "a") == (X, "")


# -- deadlines pushed at expiry ----------------------------------------------------


def test_next_deadline_tracks_earliest_lease() -> None:
    cache, clock, wall = make()
    assert cache.next_deadline() is None
    cache.update(D, [rep("a", timeout=10), rep("b", timeout=5), rep("c", X, timeout=1)])
    assert cache.next_deadline() == 105.0  # c is stored Unknown: no lease to run
    advance(clock, wall, 3)
    cache.update(D, [rep("a", timeout=10), rep("b", timeout=5)])  # heartbeat
    assert cache.next_deadline() == 108.0
    cache.update(D, [rep("a", timeout=1)])  # lease shortened: deadline moves earlier
    assert cache.next_deadline() == 104.0
    cache.update(D, [rep("a", X, timeout=1), rep("b", X, timeout=5)])
    assert cache.next_deadline() is None


def test_expire_fires_strictly_after_the_deadline() -> None:
    cache, clock, _ = make()
    cache.update(D, [rep("a", U, "ecc", timeout=10), rep("b", timeout=20)])
    clock.now = 110.0
    assert cache.expire() == []
    clock.now = 110.5
    assert cache.expire() == [change("a", U, X, "", ChangeReason.EXPIRED)]
    assert cache.expire() == []
    assert cache.next_deadline() == 120.0
    entry = cache.entry(D, "pool", "a")
    assert entry is not None and (entry.health, entry.message) == (X, "")
    clock.now = 500.0
    assert cache.expire() == [change("b", H, X, "", ChangeReason.EXPIRED)]
    assert cache.next_deadline() is None


def test_expire_returns_changes_in_deadline_order_across_drivers() -> None:
    cache, clock, _ = make()
    cache.update("z.example.com", [rep("a", timeout=1)])
    cache.update(D, [rep("b", timeout=3), rep("c", timeout=2)])
    clock.now = 1000.0
    assert [str(c.key) for c in cache.expire()] == [
        "z.example.com/pool/a",
        f"{D}/pool/c",
        f"{D}/pool/b",
    ]


def test_heartbeat_after_deadline_queued_keeps_device_alive() -> None:
    cache, clock, wall = make()
    cache.update(D, [rep("a", timeout=10)])
    assert cache.next_deadline() == 110.0
    for _ in range(5):
        advance(clock, wall, 9)
        cache.update(D, [rep("a", timeout=10)])
        assert cache.expire() == []
    assert cache.next_deadline() == clock.now + 10


def test_report_after_expiry_revives_device() -> None:
    cache, clock, wall = make()
    cache.update(D, [rep("a")])
    advance(clock, wall, 31)
    cache.expire()
    assert cache.update(D, [rep("a")]) == [change("a", X, H)]
    assert cache.next_deadline() == clock.now + 30


def test_heap_garbage_stays_bounded() -> None:
    cache, clock, wall = make()
    cache.update(D, [rep(f"d{i}", timeout=5 + i) for i in range(10)])
    for n in range(2000):
        advance(clock, wall, 0.01)
        # Shrinking leases push new heap items; flips to Unknown orphan them.
        cache.update(D, [rep(f"d{n % 10}", X if n % 2 else H, timeout=5 + (n % 7))])
        assert len(cache._heap) <= 2 * len(cache) + 64
    assert cache.next_deadline() == min(
        e.last_seen + e.timeout for e in cache.entries() if e.health is not X
    )


# -- clear_driver ----------------------------------------------------------------


def test_clear_driver_drops_everything_and_reports_known_devices() -> None:
    cache, clock, _ = make()
    cache.update(D, [rep("b", U, "ecc"), rep("a"), rep("c", X)])
    cache.update("other.example.com", [rep("z")])
    assert cache.clear_driver(D) == [
        change("a", H, X, "", ChangeReason.CLEARED),
        change("b", U, X, "", ChangeReason.CLEARED),
    ]
    assert cache.drivers() == ["other.example.com"]
    assert len(cache) == 1
    assert cache.get(D, "pool", "a") == (X, "")
    assert cache.clear_driver(D) == []
    # The cleared devices' leases are gone from the deadline queue.
    assert cache.next_deadline() == 130.0
    cache.clear_driver("other.example.com")
    assert cache.next_deadline() is None
    clock.now = 1000.0
    assert cache.expire() == []


def test_clear_then_report_again_is_new() -> None:
    cache, _, _ = make()
    cache.update(D, [rep("a", timeout=5)])
    cache.clear_driver(D)
    assert cache.update(D, [rep("a", timeout=50)]) == [change("a", X, H)]
    assert cache.next_deadline() == 150.0


# -- restore -----------------------------------------------------------------------


def stored(
    device: str, health: Health, message: str = "", timeout: float = 30.0, seen: float = 0.0
) -> DeviceEntry:
    """A log entry last seen ``seen`` seconds before the test's wall clock starts."""
    return DeviceEntry(
        D, "pool", device, health, message, timeout, 0.0, 1_700_000_000.0 - seen, 1.0
    )


def test_restore_keeps_the_recorded_lease_end() -> None:
    cache, clock, wall = make()
    changes = cache.restore(
        [
            stored("b", U, "ecc", timeout=3600, seen=600),  # 3000 s of lease left
            stored("a", H, seen=5),  # 25 s left
            stored("c", X, "booting", seen=1),  # reported Unknown: kept with its message
            stored("gone", H, seen=31),  # lease ended while the agent was down
            stored("s", H, "", 4, seen=1),  # 3 s left
        ]
    )
    assert changes == [
        change("a", X, H, "", ChangeReason.RESTORED),
        change("b", X, U, "ecc", ChangeReason.RESTORED),
        change("s", X, H, "", ChangeReason.RESTORED),
    ]
    assert cache.get(D, "pool", "gone") == (X, "")  # Unknown at once, not 5 s later
    assert cache.entry(D, "pool", "gone") is None
    assert cache.get(D, "pool", "c") == (X, "booting")
    assert cache.get(D, "pool", "a") == (H, "")
    assert cache.next_deadline() == 103.0
    entry = cache.entry(D, "pool", "a")
    assert entry is not None and entry.last_seen == 100.0 - 5
    assert (entry.last_seen_wall, entry.changed_wall) == (1_700_000_000.0 - 5, 1.0)
    # the driver has not reported since the restart: a lease end forgets the device
    advance(clock, wall, 3.5)
    assert cache.expire() == [change("s", H, X, "", ChangeReason.DROPPED)]
    advance(clock, wall, 21)
    assert cache.get(D, "pool", "a") == (H, "")  # 24.5 s of its 25 s: still Healthy
    advance(clock, wall, 1)
    assert [c.key.device for c in cache.expire()] == ["a"]
    advance(clock, wall, 2900)
    assert cache.get(D, "pool", "b") == (U, "ecc")  # a long lease is not cut short
    advance(clock, wall, 101)
    assert [c.key.device for c in cache.expire()] == ["c", "b"]  # all forgotten
    assert len(cache) == 0 and cache.drivers() == []


def test_restore_clamps_future_seen_and_long_leases() -> None:
    cache, _, _ = make()
    cache.restore([stored("f", H, seen=-50), stored("long", H, timeout=1e9)])
    assert cache.next_deadline() == 130.0  # last seen in the future counts as now
    entry = cache.entry(D, "pool", "long")
    assert entry is not None and entry.timeout == 3600.0


def test_restore_then_report_refreshes_and_omitted_devices_are_forgotten() -> None:
    cache, clock, wall = make()
    cache.restore([stored("a", H), stored("b", H, seen=20)])
    assert cache.retired(D)
    advance(clock, wall, 5)
    assert cache.update(D, [rep("a")]) == []  # same values: the reconnect is a heartbeat
    assert not cache.retired(D)
    advance(clock, wall, 6)  # b's lease (10 s left at restore) is over
    assert cache.update(D, [rep("a")]) == [change("b", H, X, "", ChangeReason.DROPPED)]
    assert cache.get(D, "pool", "a") == (H, "")


def test_restore_skips_live_devices_bad_entries_and_overflow() -> None:
    cache, _, _ = make(max_devices=3)
    cache.update(D, [rep("a", U, "live")])
    bad = [
        DeviceEntry("", "pool", "x", H, "", 30.0, 0.0, 1.7e9, 0.0),
        DeviceEntry(D, "", "x", H, "", 30.0, 0.0, 1.7e9, 0.0),
        DeviceEntry(D, "pool", "x", H, "", 0.0, 0.0, 1.7e9, 0.0),
        DeviceEntry(D, "pool", "x", "Healthy", "", 30.0, 0.0, 1.7e9, 0.0),  # type: ignore[arg-type]
        DeviceEntry(D, "pool", "X\x1b[31m", H, "", 30.0, 0.0, 1.7e9, 0.0),
    ]
    changes = cache.restore([stored("a", H), *bad, stored("b", H), stored("c", H), stored("d", H)])
    assert [c.key.device for c in changes] == ["b", "c"]
    assert cache.get(D, "pool", "a") == (U, "live")
    assert len(cache) == 3
    assert cache.rejected_total == 6
    assert cache.rejections == {("", "invalid"): 1, (D, "invalid"): 4, (D, "node_full"): 1}
    assert cache.last_rejection is not None and "node already has 3" in cache.last_rejection


# -- validated and bounded input ----------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "device", "problem"),
    [
        ("", "x", "pool name is empty"),
        ("pool", "", "device name is empty"),
        ("pool", "gpu/0", "not a DNS label"),
        ("pool", "gpu 0", "not a DNS label"),
        ("pool", "gpu\x000", "not a DNS label"),
        ("pool", "gpu\x1b[31m", "not a DNS label"),
        ("pool", "GPU-0", "not a DNS label"),
        ("pool", "-gpu", "not a DNS label"),
        ("pool", "gpu-0\n", "not a DNS label"),
        ("pool", "d" * 64, "device name is 64 characters long (limit 63)"),
        ("pool", "é", "not a DNS label"),
        ("po ol", "x", "not DNS subdomains separated by '/'"),
        ("a//b", "x", "not DNS subdomains separated by '/'"),
        ("/a", "x", "not DNS subdomains separated by '/'"),
        ("a/", "x", "not DNS subdomains separated by '/'"),
        ("Node-1", "x", "not DNS subdomains separated by '/'"),
        ("p" * 254, "x", "pool name is 254 characters long (limit 253)"),
        (5, "x", "pool name must be a string, got int"),
    ],
)
def test_names_must_be_what_the_api_accepts(pool: object, device: object, problem: str) -> None:
    cache, _, _ = make()
    assert cache.update(D, [ReportedDevice(pool, device, H), rep("ok")]) == [  # type: ignore[arg-type]
        change("ok", X, H)
    ]
    assert cache.rejected_total == 1 and cache.rejections == {(D, "invalid"): 1}
    assert cache.last_rejection is not None and problem in cache.last_rejection
    assert "\x1b" not in cache.last_rejection and "\x00" not in cache.last_rejection


@pytest.mark.parametrize(
    ("pool", "device"),
    [
        ("node-1", "gpu-0"),
        ("gpu.example.com/node-1", "d" * 63),
        ("a.b/c.d/e", "0"),
        ("/".join(["p" * 63] * 4)[:253].rstrip("/"), "x"),
    ],
)
def test_valid_names_are_accepted(pool: str, device: str) -> None:
    cache, _, _ = make()
    assert len(cache.update(D, [ReportedDevice(pool, device, U)])) == 1
    assert cache.rejected_total == 0


def test_bad_fields_are_skipped_and_counted_rest_of_report_applies() -> None:
    cache, _, _ = make()
    reports = [
        ReportedDevice("pool", "ok", "Healthy"),  # type: ignore[arg-type]
        ReportedDevice("pool", "ok2", H, "", "10"),  # type: ignore[arg-type]
        ReportedDevice("pool", "ok3", H, b"m"),  # type: ignore[arg-type]
        rep("good"),
    ]
    changes = cache.update(D, reports)
    assert [c.key.device for c in changes] == ["good"]
    assert cache.rejected_total == 3
    assert cache.last_rejection is not None and "message must be a string" in cache.last_rejection


@pytest.mark.parametrize(
    ("wire", "lease"), [(2**63 - 1, 3600.0), (3601, 3600.0), (3600, 3600.0), (7, 7.0)]
)
def test_leases_are_clamped_to_max_lease(wire: int, lease: float) -> None:
    cache, clock, wall = make()
    cache.update(D, [rep("a", U, timeout=wire)])
    entry = cache.entry(D, "pool", "a")
    assert entry is not None and entry.timeout == lease
    advance(clock, wall, lease + 0.5)
    assert cache.expire() == [change("a", U, X, "", ChangeReason.EXPIRED)]


def test_each_driver_has_its_own_bound() -> None:
    cache, _, _ = make(max_devices_per_driver=100, max_devices=1000)
    flood = [rep(f"junk-{i}") for i in range(100_000)]
    changes = cache.update("flood.example.com", flood)
    assert len(changes) == 100 and cache.device_count("flood.example.com") == 100
    assert cache.rejections == {("flood.example.com", "driver_full"): 99_900}
    assert cache.last_rejection is not None and "refused 99900 new devices" in cache.last_rejection
    # another driver's fault still gets in
    assert cache.update(D, [rep("gpu-0", U, "XID 79")]) == [change("gpu-0", X, U, "XID 79")]
    assert cache.get(D, "pool", "gpu-0") == (U, "XID 79")


def test_over_the_bound_the_most_severe_new_devices_are_kept() -> None:
    cache, clock, wall = make(max_devices_per_driver=3)
    cache.update(D, [rep("a")])
    changes = cache.update(D, [rep("a"), rep("b"), rep("c", U), rep("d", X), rep("e", U)])
    assert [c.key.device for c in changes] == ["c", "e"]  # report order, Unhealthy first
    assert cache.rejections == {(D, "driver_full"): 2}
    assert "first pool/b" in (cache.last_rejection or "")
    # a device the driver stops listing frees its place once its lease ends
    advance(clock, wall, 31)
    cache.update(D, [rep("c", U), rep("b")])
    assert [e.device for e in cache.entries(D)] == ["b", "c"]


def test_the_node_bound_still_holds_across_drivers() -> None:
    cache, clock, wall = make(max_devices=2)
    cache.update(D, [rep("a"), rep("b"), rep("c")])
    assert len(cache) == 2
    assert cache.rejections == {(D, "node_full"): 1}
    assert cache.entry(D, "pool", "c") is None
    advance(clock, wall, 1)
    assert cache.update(D, [rep("a", U), rep("b", U), rep("c", U)]) == [
        change("a", H, U),
        change("b", H, U),
    ]
    assert cache.rejected_total == 2
    cache.update("other.example.com", [rep("z")])
    assert cache.drivers() == [D]
    cache.clear_driver(D)
    cache.update("other.example.com", [rep("z")])
    assert cache.drivers() == ["other.example.com"]


# -- a driver that goes away ---------------------------------------------------------


def test_retired_driver_keeps_health_at_most_the_grace_then_is_forgotten() -> None:
    cache, clock, wall = make()
    cache.update(D, [rep("long", U, "xid", timeout=3600), rep("short", H, timeout=5)])
    cache.update(D, [rep("long", U, "xid", timeout=3600), rep("short", H, timeout=5)])
    cache.update("other.example.com", [rep("z", timeout=3600)])
    cache.update(
        D, [rep("x", X, "?"), rep("long", U, "xid", timeout=3600), rep("short", timeout=5)]
    )
    advance(clock, wall, 1)
    # stored Unknown: forgotten at once; long lease: capped to 30 s; short: unchanged
    assert cache.retire_driver(D, 30.0) == [change("x", X, X, "", ChangeReason.DROPPED)]
    long = cache.entry(D, "pool", "long")
    assert long is not None and long.timeout == 31.0  # last seen + lease = now + grace
    advance(clock, wall, 4.5)
    assert cache.expire() == [change("short", H, X, "", ChangeReason.DROPPED)]
    advance(clock, wall, 25)
    assert cache.get(D, "pool", "long") == (U, "xid")
    advance(clock, wall, 1)
    assert cache.expire() == [change("long", U, X, "", ChangeReason.DROPPED)]
    assert cache.drivers() == ["other.example.com"]  # other drivers untouched


def test_a_report_ends_the_retirement() -> None:
    cache, clock, wall = make()
    cache.update(D, [rep("a", timeout=3600)])
    cache.retire_driver(D, 10.0)
    advance(clock, wall, 5)
    cache.update(D, [rep("a", timeout=3600)])
    assert not cache.retired(D)
    advance(clock, wall, 3000)
    assert cache.expire() == [] and cache.get(D, "pool", "a") == (H, "")


def test_heartbeats_are_handed_out_for_saving_at_most_every_quarter_lease() -> None:
    cache, clock, wall = make()
    cache.update(D, [rep("a", timeout=8), rep("b", timeout=3600)])
    assert cache.take_heartbeats() == []  # new: saved with its change
    seen = []
    for _ in range(40):
        advance(clock, wall, 0.5)
        cache.update(D, [rep("a", timeout=8), rep("b", timeout=3600)])
        seen += [(round(wall.now - 1_700_000_000, 1), e.device) for e in cache.take_heartbeats()]
    assert [t for t, d in seen if d == "a"] == [
        2.0,
        4.0,
        6.0,
        8.0,
        10.0,
        12.0,
        14.0,
        16.0,
        18.0,
        20.0,
    ]
    assert [t for t, d in seen if d == "b"] == [10.0, 20.0]


@pytest.mark.parametrize("driver", ["", None, 3])
def test_bad_driver_name_raises(driver: object) -> None:
    cache, _, _ = make()
    with pytest.raises(ValueError, match="driver name"):
        cache.update(driver, [rep("a")])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"default_timeout": 0}, "default_timeout"),
        ({"default_timeout": -1.0}, "default_timeout"),
        ({"default_timeout": float("inf")}, "default_timeout"),
        ({"max_devices": -1}, "max_devices"),
        ({"max_devices_per_driver": -1}, "max_devices_per_driver"),
        ({"max_lease": 0}, "max_lease"),
        ({"default_timeout": 7200}, "must not exceed max_lease"),
    ],
)
def test_constructor_validates(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HealthCache(**kwargs)  # type: ignore[arg-type]


def test_entries_sorted_and_filtered() -> None:
    cache, _, _ = make(default_timeout=12.5)
    cache.update("z.example.com", [rep("b"), rep("a")])
    cache.update(D, [rep("y", timeout=3), rep("x")])
    assert [str(e.key) for e in cache.entries()] == [
        f"{D}/pool/x",
        f"{D}/pool/y",
        "z.example.com/pool/a",
        "z.example.com/pool/b",
    ]
    assert [e.device for e in cache.entries(D)] == ["x", "y"]
    assert cache.entries("nope") == []
    assert cache.drivers() == [D, "z.example.com"]
    assert cache.min_timeout(D) == 3.0
    assert cache.min_timeout("z.example.com") == 12.5


# -- model-based property test ---------------------------------------------------


class Model:
    """A naive reference: full scans, exactly the documented rules."""

    def __init__(self) -> None:
        self.d: dict[DeviceKey, tuple[Health, str, float, float]] = {}

    def update(self, now: float, driver: str, reports: list[ReportedDevice]) -> set[DeviceKey]:
        changed: set[DeviceKey] = set()
        final: dict[tuple[str, str], ReportedDevice] = {}
        for r in reports:  # duplicates: the worst health, among equals the later entry
            prev = final.get((r.pool, r.device))
            if prev is None or r.health.severity >= prev.health.severity:
                final[(r.pool, r.device)] = r
        for (pool, device), r in final.items():
            k = DeviceKey(driver, pool, device)
            t = float(r.timeout_seconds) if r.timeout_seconds > 0 else 30.0
            old = self.d.get(k)
            if old is None or old[:3] != (r.health, r.message, t):
                changed.add(k)
            self.d[k] = (r.health, r.message, t, now)
        for k, (_h, _m, t, seen) in list(self.d.items()):
            omitted = k.driver == driver and (k.pool, k.device) not in final
            if omitted and now - seen > t:
                del self.d[k]  # no longer listed, lease over: forgotten
                changed.add(k)
        return changed

    def expire(self, now: float) -> set[DeviceKey]:
        out = set()
        for k, (h, _m, t, seen) in list(self.d.items()):
            if h is not X and now - seen > t:
                self.d[k] = (X, "", t, seen)
                out.add(k)
        return out

    def deadline(self) -> float | None:
        return min((seen + t for h, _m, t, seen in self.d.values() if h is not X), default=None)


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("update"),
            st.sampled_from(["d1", "d2"]),
            st.lists(
                st.builds(
                    ReportedDevice,
                    st.just("p"),
                    st.sampled_from(["a", "b", "c", "d"]),
                    st.sampled_from(list(Health)),
                    st.sampled_from(["", "m"]),
                    st.sampled_from([0, -1, 1, 2, 5, 30]),
                ),
                max_size=5,
            ),
        ),
        st.tuples(st.just("tick"), st.sampled_from([0.5, 1.0, 2.0, 5.0, 31.0])),
        st.tuples(st.just("expire")),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_cache_matches_naive_model(program: list[tuple[object, ...]]) -> None:
    cache, clock, wall = make()
    model = Model()
    for op in program:
        if op[0] == "update":
            driver, reports = op[1], op[2]
            assert isinstance(driver, str) and isinstance(reports, list)
            got = {c.key for c in cache.update(driver, reports)}
            assert got == model.update(clock.now, driver, reports)
        elif op[0] == "tick":
            assert isinstance(op[1], float)
            advance(clock, wall, op[1])
        else:
            assert {c.key for c in cache.expire()} == model.expire(clock.now)
        assert cache.next_deadline() == model.deadline()
        for k, (h, m, t, seen) in model.d.items():
            expected = (X, "") if clock.now - seen > t else (h, m)
            assert cache.get(k.driver, k.pool, k.device) == expected
            entry = cache.entry(k.driver, k.pool, k.device)
            assert entry is not None and (entry.health, entry.message, entry.timeout) == (h, m, t)
        assert len(cache) == len(model.d)


def test_known_devices_still_reject_malformed_fields_and_unhashable_names() -> None:
    cache = HealthCache(default_timeout=30.0, clock=lambda: 0.0, wall_clock=lambda: 0.0)
    cache.update("d", [ReportedDevice("p", "x", Health.HEALTHY)])
    bad = [
        ReportedDevice("p", "x", "Healthy", "", 0),  # type: ignore[arg-type]
        ReportedDevice("p", "x", Health.UNHEALTHY, 5, 0),  # type: ignore[arg-type]
        ReportedDevice(["p"], "x", Health.UNHEALTHY),  # type: ignore[arg-type]
    ]
    for report in bad:
        assert cache.update("d", [report, ReportedDevice("p", "x", Health.HEALTHY)]) == []
    assert cache.rejected_total == 3
    assert cache.get("d", "p", "x") == (Health.HEALTHY, "")
    long = "é" * 600
    changes = cache.update("d", [ReportedDevice("p", "x", Health.UNHEALTHY, long)])
    assert len(changes[0].message.encode()) <= 1024 and changes[0].message.endswith("...")
    assert cache.update("d", [ReportedDevice("p", "x", Health.UNHEALTHY, long)]) == []
