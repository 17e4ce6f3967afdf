"""Benchmark of the driver toolkit's health path: snapshot encoding and stream fan-out.

Owns nothing but measurements. Prints two tables:

1. Encoding a HealthHub snapshot of 10,000 devices (mean / p50 / p99 over repeated
   encodes): the hub's cached encoding of an unchanged snapshot, the hub after a
   one-device change (per-device byte cache: one device re-encoded, records joined),
   and the baseline, a naive build of ``NodeWatchResourcesResponse`` from scratch on
   every call. Target: <= 5 ms per encode after a change.
2. Fan-out to 8 ``NodeWatchResources`` streams over real unix-socket gRPC (client in a
   separate process, raw bytes, no parsing): snapshots/s delivered while one device
   changes as fast as the loop allows, for the hub's servicer and for a naive
   servicer that builds each stream's message itself.

Run: ``python bench/driver_bench.py`` (about 30 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from drahealth import api
from drahealth.core import Health, truncate_message
from drahealth.driver import DeviceReport, DeviceState, HealthHub

POOL = "node-1"
ENCODE_DEVICES = 10_000
ENCODE_REPEATS = 200
CHANGE_REPEATS = 40
TARGET_MS = 5.0
STREAMS = 8
FANOUT_SECONDS = 2.0
FANOUT_SIZES = (1_000, 10_000)


# --------------------------------------------------------------------------- helpers


def make_hub(n: int) -> HealthHub:
    devices = [(POOL, f"gpu-{i}") for i in range(n)]
    hub = HealthHub(devices)
    hub.submit("sim", [DeviceReport(p, d, Health.HEALTHY, "ok") for p, d in devices])
    return hub


def naive_message(states: Sequence[DeviceState]) -> api.health_v1.NodeWatchResourcesResponse:
    """The baseline: a fresh protobuf message from the states on every call."""
    resp = api.health_v1.NodeWatchResourcesResponse()
    for s in states:
        resp.devices.append(
            api.health_v1.DeviceHealth(
                device=api.health_v1.DeviceIdentifier(pool_name=s.pool, device_name=s.device),
                health=api.health_v1.HealthStatus.ValueType(s.health.to_wire()),
                last_updated_time=int(s.updated_at),
                health_check_timeout_seconds=s.timeout_seconds,
                message=truncate_message(s.message),
            )
        )
    return resp


def naive_encode(states: Sequence[DeviceState]) -> bytes:
    return naive_message(states).SerializeToString()


def timed(
    fn: Callable[[], object], repeats: int, before: Callable[[], object] | None = None
) -> list[float]:
    samples = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def stats(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.fmean(samples), statistics.median(samples), p99


# --------------------------------------------------------------------------- encoding


def bench_encode() -> None:
    hub = make_hub(ENCODE_DEVICES)
    counter = iter(range(10**9))

    def change() -> None:
        i = next(counter)
        hub.submit("bench", [DeviceReport(POOL, "gpu-7", Health.UNKNOWN, f"change {i}")])

    hub.encode_snapshot_v1()
    cached = timed(hub.encode_snapshot_v1, ENCODE_REPEATS)
    fresh = timed(hub.encode_snapshot_v1, CHANGE_REPEATS, before=change)
    snapshot = hub.snapshot()
    naive = timed(lambda: naive_encode(snapshot), CHANGE_REPEATS)
    assert hub.encode_snapshot_v1() == naive_encode(snapshot)

    base_mean = statistics.fmean(naive)
    print(
        f"\nSnapshot encode, {ENCODE_DEVICES:,} devices ({len(hub.encode_snapshot_v1()):,} bytes)"
    )
    print(f"{'case':44} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'vs naive':>9}  target")
    rows = [
        ("hub.encode_snapshot_v1(), unchanged (cached)", cached, False),
        ("hub.encode_snapshot_v1() after a change", fresh, True),
        ("baseline: naive build per call", naive, False),
    ]
    for name, samples, judged in rows:
        mean, p50, p99 = stats(samples)
        verdict = f"<= {TARGET_MS:g} ms: {'PASS' if p50 <= TARGET_MS else 'MISS'}"
        print(
            f"{name:44} {mean:9.3f} {p50:9.3f} {p99:9.3f} {base_mean / mean:8.1f}x  "
            + (verdict if judged else "-")
        )


# --------------------------------------------------------------------------- fan-out


class NaiveHealthServicer(api.health_v1_grpc.DRAResourceHealthServicer):
    """Baseline servicer: each stream builds its own message from scratch per change."""

    def __init__(self, hub: HealthHub) -> None:
        self.hub = hub
        self.events: set[asyncio.Event] = set()
        hub.subscribe(lambda _changed: [e.set() for e in self.events])

    async def NodeWatchResources(  # type: ignore[override]
        self, request: Any, context: Any
    ) -> AsyncIterator[Any]:
        event = asyncio.Event()
        self.events.add(event)
        try:
            while True:
                event.clear()
                yield naive_message(self.hub.snapshot())
                await event.wait()
        finally:
            self.events.discard(event)


async def client_main(path: str, seconds: float, streams: int) -> None:
    """Child process: read ``streams`` raw streams, print per-stream counts as JSON."""
    async with grpc.aio.insecure_channel(f"unix://{path}") as ch:
        method = ch.unary_stream(
            api.WATCH_V1_METHOD,
            request_serializer=lambda m: m,
            response_deserializer=None,
        )
        calls = [method(b"") for _ in range(streams)]
        counts = [0] * streams
        sizes = [0] * streams
        counting = False

        async def read(i: int) -> None:
            async for msg in calls[i]:
                if counting:
                    counts[i] += 1
                    sizes[i] = len(msg)

        tasks = [asyncio.create_task(read(i)) for i in range(streams)]
        await asyncio.sleep(0.3)  # warm up: every stream open and flowing
        counting = True
        await asyncio.sleep(seconds)
        counting = False
        for c in calls:
            c.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({"counts": counts, "sizes": sizes}))


async def fanout(hub: HealthHub, register: Callable[[grpc.aio.Server], None], path: str) -> float:
    server = grpc.aio.server()
    register(server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    stop = asyncio.Event()

    async def produce() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            health = Health.UNKNOWN if i % 2 else Health.HEALTHY
            hub.submit("bench", [DeviceReport(POOL, "gpu-3", health, f"change {i}")])
            await asyncio.sleep(0)

    producer = asyncio.create_task(produce())
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--client", path, str(FANOUT_SECONDS), str(STREAMS),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await child.communicate()
    finally:
        stop.set()
        await producer
        await server.stop(0)
    result = json.loads(out)
    counts = result["counts"]
    if min(counts) == 0:
        raise RuntimeError(f"a stream received nothing: {counts}")
    return sum(counts) / FANOUT_SECONDS


async def bench_fanout() -> None:
    tmp = tempfile.mkdtemp(dir="/tmp", prefix="dbench-")
    try:
        print(f"\nFan-out to {STREAMS} streams, unix-socket gRPC, {FANOUT_SECONDS:g} s each")
        print(
            f"{'devices':>8} {'hub snapshots/s':>16} {'naive snapshots/s':>18} {'ratio':>7}  target"
        )
        for n in FANOUT_SIZES:
            hub = make_hub(n)
            rate = await fanout(hub, hub.add_to_server, f"{tmp}/hub-{n}.sock")
            hub.close()
            naive_hub = make_hub(n)
            servicer = NaiveHealthServicer(naive_hub)
            base = await fanout(
                naive_hub,
                lambda s, sv=servicer: api.health_v1_grpc.add_DRAResourceHealthServicer_to_server(
                    sv, s
                ),
                f"{tmp}/naive-{n}.sock",
            )
            verdict = "PASS" if rate > base else "MISS"
            print(f"{n:8,} {rate:16,.0f} {base:18,.0f} {rate / base:6.1f}x  > naive: {verdict}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    start = time.perf_counter()
    bench_encode()
    asyncio.run(bench_fanout())
    print(f"\ntotal {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--client":
        asyncio.run(client_main(sys.argv[2], float(sys.argv[3]), int(sys.argv[4])))
    else:
        main()
