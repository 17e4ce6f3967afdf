"""HealthPipeline across an agent restart: the recorded lease end decides, with fake
clocks (no sleeps). Saved last-seen times lag the real ones by at most a quarter lease
(10 s at most), so a restart never keeps a device past its lease and never cuts it
short by more than that."""

from __future__ import annotations

from pathlib import Path

from drahealth.core import Health
from drahealth.core._records import ReportedDevice
from drahealth.node._pipeline import HealthPipeline

D = "gpu.example.com"
H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN


class Clocks:
    """A monotonic clock and a wall clock that move together; a restart resets the
    monotonic one (a new process)."""

    def __init__(self) -> None:
        self.mono = 50.0
        self.wall = 1_700_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds

    def pipeline(self, state_dir: Path) -> HealthPipeline:
        return HealthPipeline(str(state_dir), clock=lambda: self.mono, wall_clock=lambda: self.wall)


def rep(device: str, health: Health = H, timeout: int = 30) -> ReportedDevice:
    return ReportedDevice("pool", device, health, "", timeout)


async def test_stable_device_survives_a_short_restart_and_ends_with_its_lease(
    tmp_path: Path,
) -> None:
    clocks = Clocks()
    first = clocks.pipeline(tmp_path)
    await first.start()
    for _ in range(50):  # stable for 100 s, a report every 2 s
        first.report(D, [rep("gpu-0")])
        clocks.advance(2)
    last_report = clocks.wall - 2
    await first.stop()

    clocks.advance(1)
    clocks.mono = 7.0  # new process
    second = clocks.pipeline(tmp_path)
    await second.start()
    try:
        assert second.cache.get(D, "pool", "gpu-0") == (H, "")
        deadline = second.cache.next_deadline()
        assert deadline is not None
        end = clocks.wall + (deadline - clocks.mono)  # the lease end, as wall time
        assert last_report + 30 - 7.5 <= end <= last_report + 30
    finally:
        await second.stop()


async def test_a_lease_that_ended_while_down_is_unknown_at_once_and_forgotten(
    tmp_path: Path,
) -> None:
    clocks = Clocks()
    first = clocks.pipeline(tmp_path)
    await first.start()
    first.report(D, [rep("gpu-0", U), rep("gpu-1", H, 3600)])
    await first.stop()

    clocks.advance(40)  # gpu-0's 30 s lease ended while the agent was down
    second = clocks.pipeline(tmp_path)
    await second.start()
    try:
        assert second.cache.get(D, "pool", "gpu-0") == (X, "")
        assert [c.key.device for c in second.restored] == ["gpu-1"]
        # a long remaining lease is kept, not cut to a grace period
        clocks.advance(3000)
        assert second.cache.get(D, "pool", "gpu-1") == (H, "")
        assert second.expire() == []
    finally:
        await second.stop()
    log = (tmp_path / "health.log").read_text()
    assert "gpu-0" not in log  # the log was rewritten without it
