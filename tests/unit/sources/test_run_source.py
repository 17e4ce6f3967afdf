"""run_source: reports reach the hub; a failing poll makes devices Unknown, never Healthy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from drahealth.core import Health
from drahealth.driver import DeviceReport, HealthHub
from drahealth.sources import run_source
from tests._support import eventually

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


async def test_reports_and_failures_reach_the_hub() -> None:
    hub = HealthHub(DEVS)
    src = Flaky()
    task = asyncio.create_task(run_source(hub, src))
    try:
        await eventually(lambda: hub.state("node-1", "gpu-0").health is Health.HEALTHY, 2.0)
        src.fail = True
        await eventually(lambda: hub.state("node-1", "gpu-1").health is Health.UNKNOWN, 2.0)
        assert hub.state("node-1", "gpu-1").message == (
            "flaky health source failed: device node vanished"
        )
        src.fail = False
        await eventually(lambda: hub.state("node-1", "gpu-1").health is Health.HEALTHY, 2.0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
