"""Worker for the crash test: applies health changes read from stdin, acks each on stdout.

``python -m tests.reliability._store_worker STATE_DIR``. Each input line is
``<seq> <device> <Healthy|Unhealthy|Unknown> <message>``; the change goes through the
agent's real HealthPipeline (cache, append-only store with fsync) and ``ack <seq>`` is
printed only after ``report`` returned, i.e. after the change is durable. The parent kills
this process with SIGKILL at random points.
"""

from __future__ import annotations

import asyncio
import sys

from drahealth.core import Health
from drahealth.core._records import ReportedDevice
from drahealth.node._pipeline import HealthPipeline


async def main(state_dir: str) -> None:
    pipeline = HealthPipeline(state_dir, default_timeout=3600)
    await pipeline.start()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        seq, device, health, message = line.rstrip("\n").split(" ", 3)
        report = ReportedDevice("pool", device, Health(health), message, 3600)
        pipeline.report("crash.example.com", [report])
        print(f"ack {seq}", flush=True)
    await pipeline.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
