"""run_source: reports reach the hub; a failing poll makes devices Unknown, never Healthy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from drahealth.core import Health
from drahealth.driver import DeviceReport, HealthHub
from drahealth.sources import run_source

DEVS = [("node-1", "gpu-0"), ("node-1", "gpu-1")]


class Flaky:
    name = "flaky"
    interval = 0.01

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False

    def devices(self) -> Sequence[tuple[str, str]]:
        return DEVS

    def poll(self) -> list[DeviceReport]:
        self.calls += 1
        if self.fail:
            raise OSError("device node vanished")
        return [DeviceReport(p, d, Health.HEALTHY) for p, d in DEVS]


async def until(check: object, within: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


async def test_reports_and_failures_reach_the_hub() -> None:
    hub = HealthHub(DEVS)
    src = Flaky()
    task = asyncio.create_task(run_source(hub, src))
    try:
        await until(lambda: hub.state("node-1", "gpu-0").health is Health.HEALTHY)
        src.fail = True
        await until(lambda: hub.state("node-1", "gpu-1").health is Health.UNKNOWN)
        assert hub.state("node-1", "gpu-1").message == (
            "flaky health source failed: device node vanished"
        )
        src.fail = False
        await until(lambda: hub.state("node-1", "gpu-1").health is Health.HEALTHY)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
