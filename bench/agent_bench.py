"""Benchmark of the node agent's health path: ingest + durable write, and pod lookup.

Owns nothing but measurements. Prints two tables:

1. One stream message (a full list of N devices, one of them changed) through the
   agent's :class:`HealthPipeline`: cache update, then the change appended to the
   health log and fsynced. The baseline, run in the same process on the same disk,
   is the upstream design made durable: the same cache update, then the whole cache
   rewritten as one JSON document (temporary file, fsync, rename, fsync of the
   directory). Reports time per message (p50 / p99) and bytes written per change.
2. Finding the pods affected by a change: the agent's reverse index
   (``ClaimTracker.pods_for``) against the upstream full scan over every prepared
   claim and its devices, for 5,000 claims of 2 devices each.

Run: ``python bench/agent_bench.py`` (about 20 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

from drahealth._durable import atomic_write
from drahealth.core import DeviceKey, Health
from drahealth.core._health_cache import HealthCache
from drahealth.core._records import ClaimInfo, PreparedDeviceInfo, ReportedDevice
from drahealth.node._claims import ClaimTracker
from drahealth.node._pipeline import HealthPipeline

DRIVER = "gpu.example.com"
POOL = "node-1"
SIZES = (1_000, 10_000)
MESSAGES = 200
CLAIMS = 5_000
LOOKUPS = 2_000


def full_list(n: int, bad: int) -> list[ReportedDevice]:
    """All ``n`` devices Healthy except device ``bad`` (a different one each message)."""
    return [
        ReportedDevice(POOL, f"gpu-{i}", Health.UNHEALTHY if i == bad else Health.HEALTHY, "", 30)
        for i in range(n)
    ]


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1]


def rewrite_all(cache: HealthCache, path: str) -> int:
    """Upstream's checkpoint, made durable: the whole cache as JSON, atomically."""
    doc = {
        "drivers": {
            driver: {
                f"{e.pool}/{e.device}": {
                    "health": str(e.health),
                    "message": e.message,
                    "timeout": e.timeout,
                    "lastUpdated": e.last_seen_wall,
                }
                for e in cache.entries(driver)
            }
            for driver in cache.drivers()
        }
    }
    data = json.dumps(doc).encode()
    atomic_write(path, data)  # temporary file, fsync, rename, directory fsync
    return len(data)


async def ingest(n: int, base: str) -> tuple[list[float], list[float], float, float]:
    """(agent samples, baseline samples, agent bytes/change, baseline bytes/change)."""
    pipeline = HealthPipeline(f"{base}/agent-{n}")
    await pipeline.start()
    messages = [full_list(n, bad=i % n) for i in range(MESSAGES + 1)]
    pipeline.report(DRIVER, messages[-1])  # warm: every device known
    assert pipeline.store is not None
    before = pipeline.store.bytes_written
    ours = []
    for message in messages[:MESSAGES]:
        t0 = time.perf_counter()
        pipeline.report(DRIVER, message)
        ours.append(time.perf_counter() - t0)
    ours_bytes = (pipeline.store.bytes_written - before) / MESSAGES
    await pipeline.stop()

    cache = HealthCache()
    os.makedirs(f"{base}/upstream-{n}")
    path = f"{base}/upstream-{n}/checkpoint.json"
    cache.update(DRIVER, messages[-1])
    rewrite_all(cache, path)
    theirs = []
    written = 0
    for message in messages[:MESSAGES]:
        t0 = time.perf_counter()
        if cache.update(DRIVER, message):
            written += rewrite_all(cache, path)
        theirs.append(time.perf_counter() - t0)
    return ours, theirs, ours_bytes, written / MESSAGES


def persistence(n: int, changes: int, base: str) -> dict[str, float]:
    """One durable device change with ``n`` devices cached: our log vs the upstream rewrite.

    Ours: one record appended and fsynced. Upstream, re-implemented faithfully: the
    whole map as JSON to a temporary file and renamed over the checkpoint, without
    fsync (as the kubelet does); and the same with the missing fsyncs added.
    """
    from drahealth.core._records import DeviceEntry
    from drahealth.node._health_store import HealthStore

    entries = [
        DeviceEntry(DRIVER, POOL, f"gpu-{i}", Health.HEALTHY, "", 30.0, 0.0, 1e9, 1e9)
        for i in range(n)
    ]
    os.makedirs(f"{base}/p{n}", exist_ok=True)
    store, _, _ = HealthStore.open(f"{base}/p{n}/health.log", min_compact_records=10**9)
    store.compact(entries)
    before_bytes, ours = store.bytes_written, []
    for i in range(changes):
        changed = entries[i % n]
        t0 = time.perf_counter()
        store.append([changed])
        ours.append(time.perf_counter() - t0)
    ours_bytes = (store.bytes_written - before_bytes) / changes
    store.close()

    def doc() -> bytes:
        return json.dumps(
            {f"{e.pool}/{e.device}": {"health": str(e.health), "lastUpdated": e.changed_wall}
             for e in entries}
        ).encode()  # fmt: skip

    path = f"{base}/p{n}/checkpoint.json"
    plain, durable, size = [], [], 0
    for _ in range(changes):
        t0 = time.perf_counter()
        data = doc()
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        atomic_write(path, doc())
        durable.append(time.perf_counter() - t0)
        size = len(data)
    return {
        "ours_ms": statistics.median(ours) * 1e3,
        "ours_bytes": ours_bytes,
        "upstream_ms": statistics.median(plain) * 1e3,
        "upstream_fsync_ms": statistics.median(durable) * 1e3,
        "upstream_bytes": float(size),
    }


def build_tracker() -> tuple[ClaimTracker, list[ClaimInfo], list[DeviceKey]]:
    tracker = ClaimTracker(None)
    claims = []
    for c in range(CLAIMS):
        devices = tuple(
            PreparedDeviceInfo(DRIVER, POOL, f"gpu-{2 * c + d}", ("gpu",)) for d in range(2)
        )
        info = ClaimInfo("default", f"claim-{c}", f"uid-{c}", devices)
        tracker.add(info, f"pod-{c}")
        claims.append(info)
    keys = [DeviceKey(DRIVER, POOL, f"gpu-{(i * 7919) % (2 * CLAIMS)}") for i in range(LOOKUPS)]
    return tracker, claims, keys


def full_scan(claims: list[ClaimInfo], pods: dict[str, str], key: DeviceKey) -> set[str]:
    """Upstream: for each changed device, walk every claim and its devices."""
    out = set()
    for claim in claims:
        for d in claim.devices:
            if d.driver == key.driver and d.pool == key.pool and d.device == key.device:
                out.add(pods[claim.uid])
    return out


def timed(fn: Callable[[], object], repeats: int) -> float:
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


async def main() -> None:
    base = tempfile.mkdtemp(prefix="dh-bench-")
    try:
        print(f"1. one stream message (full list, one device changed), {MESSAGES} messages")
        print(
            f"{'devices':>8} {'agent p50':>10} {'p99':>8} {'bytes':>8}"
            f" {'rewrite p50':>12} {'p99':>8} {'bytes':>9} {'speed-up':>9}"
        )
        for n in SIZES:
            ours, theirs, ob, tb = await ingest(n, base)
            o50, o99 = percentiles(ours)
            t50, t99 = percentiles(theirs)
            print(
                f"{n:>8} {o50 * 1e3:>8.2f}ms {o99 * 1e3:>6.2f}ms {ob:>8.0f}"
                f" {t50 * 1e3:>10.2f}ms {t99 * 1e3:>6.2f}ms {tb:>9.0f} {t50 / o50:>8.1f}x"
            )
        tracker, claims, keys = build_tracker()
        pods = {c.uid: f"pod-{i}" for i, c in enumerate(claims)}
        for key in keys[:50]:  # the two agree
            assert tracker.pods_for([key]) == full_scan(claims, pods, key)
        index = timed(lambda: [tracker.pods_for([k]) for k in keys], 5) / LOOKUPS
        scan = timed(lambda: [full_scan(claims, pods, k) for k in keys[:50]], 3) / 50
        print(f"\n2. affected pods of one changed device, {CLAIMS} claims x 2 devices")
        print(f"   reverse index {index * 1e6:.2f} us, full scan {scan * 1e6:.0f} us")
        print(f"   speed-up {scan / index:.0f}x")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
