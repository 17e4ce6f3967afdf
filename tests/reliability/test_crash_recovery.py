"""SIGKILL the agent's health pipeline at random points: no acknowledged change is lost.

A worker process (``_store_worker``) applies a stream of health changes through the real
HealthPipeline and acknowledges each once it is durable. The test kills it with SIGKILL at
a random moment, ``ITERATIONS`` times, reopens the store each time and checks that every
device's stored state is its last acknowledged change or a later one (sent but not yet
acknowledged when the kill came), and that the log never needed quarantining (a torn last
record is cut off cleanly). The counts are printed (pytest -s) and recorded in
docs/reliability.md.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drahealth.node._health_store import HealthStore

ITERATIONS = 200
DEVICES = [f"dev-{i}" for i in range(8)]
HEALTH = ["Healthy", "Unhealthy", "Unknown"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 200 worker processes, 60-120 s on 2 cores: CI runs it in its slow step
@pytest.mark.timeout(600)
def test_sigkill_at_random_points_loses_no_acknowledged_change(tmp_path: Path) -> None:
    rng = random.Random(20261122)
    state = tmp_path / "state"
    sent: dict[int, tuple[str, str, str]] = {}  # seq -> (device, health, message)
    acked: set[int] = set()
    seq = 0
    kills = torn = 0
    for _ in range(ITERATIONS):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability._store_worker", str(state)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        burst = rng.randint(1, 40)
        kill_after = rng.randint(0, burst)  # acks to wait for before the kill
        for _ in range(burst):
            seq += 1
            device, health = rng.choice(DEVICES), rng.choice(HEALTH)
            sent[seq] = (device, health, f"m{seq}")
            proc.stdin.write(f"{seq} {device} {health} m{seq}\n")
        proc.stdin.flush()
        for _ in range(kill_after):
            line = proc.stdout.readline().split()
            acked.add(int(line[1]))
        time.sleep(rng.random() * 0.003)  # land the kill anywhere in the next writes
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        store, entries, problem = HealthStore.open(str(state / "health.log"))
        torn += store.torn_bytes > 0
        store.close()
        assert problem is None, problem
        stored = {e.device: (e.health.value, e.message) for e in entries}
        for device in DEVICES:
            history = [s for s, (d, _, _) in sorted(sent.items()) if d == device]
            last_acked = max((s for s in history if s in acked), default=None)
            if last_acked is None:
                continue
            allowed = {sent[s][1:] for s in history if s >= last_acked}
            assert stored.get(device) in allowed, (device, stored.get(device), last_acked)
    print(f"\n{kills} SIGKILLs, {seq} changes sent, {len(acked)} acknowledged, "
          f"{torn} torn tails cut, 0 acknowledged changes lost")  # fmt: skip
    assert kills == ITERATIONS
