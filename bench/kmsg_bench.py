"""Benchmarks of the kernel-log source: a line appended to the log -> a signal out of poll,
and the cost of following the log at rest.

Owns nothing but measurements. The source is :class:`drahealth.sources.KmsgSource`
following a file on the local disk, driven as the agent drives an attached source (a
thread of its own polls every ``interval`` and wakes the event loop only when the answer
changed). ``bench/attached_bench.py`` measures the same through a whole node agent:

* ``latency``: a writer appends an XID line at a random phase of the poll cycle, and the
  time until a poll returns the signal it causes is measured (each sample changes what the
  source says: the XID alternates between 79 and 48 on one of 8 GPUs), p50/p99/max;
* ``at_rest``: the source knows 8 GPUs (4 with a latched fault) and nothing is written
  for ``seconds``: the process's CPU time over the wall time (the thread's polls and
  waits; the loop sleeps), and the cost of one poll;
* ``flood``: lines parsed per second when a poll reads a full batch of mixed lines;
* ``real_kmsg``: the cost of one poll of the real ``/dev/kmsg`` at rest, where readable.

Run: ``python bench/kmsg_bench.py [--quick]``; ``bench/run.py`` runs it with targets.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from waits import within

from drahealth.core import Signal
from drahealth.sources import KmsgSource

GPUS = [f"0000:{bus:02x}:00" for bus in (0x1B, 0x3B, 0x4C, 0x5D, 0x9B, 0xBB, 0xCB, 0xDB)]


def _write(path: str, data: bytes = b"") -> None:
    """Create ``path`` if missing and append ``data`` (a few bytes: no need for a thread)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def xid_line(address: str, xid: int) -> bytes:
    return f"NVRM: Xid (PCI:{address}): {xid}, pid=4242, name=python, bench fault.\n".encode()


class Poller(threading.Thread):
    """Polls ``source`` as the agent runs an attached source (its own thread; a poll
    every ``interval`` from the start of the previous one) and hands an answer to the
    event loop only when it changed, as the agent does: ``seen(signals, at)`` runs on
    the loop, ``at`` the time the poll returned."""

    def __init__(self, source: KmsgSource, seen: Callable[[list[Signal], float], None]) -> None:
        super().__init__(name="kmsg-bench-poller", daemon=True)
        self.source = source
        self.seen = seen
        self.polls = 0
        self.loop = asyncio.get_running_loop()
        self.halt = threading.Event()
        self.start()

    def run(self) -> None:
        last: list[Signal] | None = None
        while not self.halt.is_set():
            started = time.monotonic()
            signals = self.source.poll()
            at = time.perf_counter()
            self.polls += 1
            if signals != last:
                self.loop.call_soon_threadsafe(self.seen, signals, at)
                last = signals
            self.halt.wait(max(0.0, started + self.source.interval - time.monotonic()))

    async def stop(self) -> None:
        self.halt.set()
        await asyncio.to_thread(self.join, 5)


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(samples: int = 300, interval: float | None = None) -> dict[str, Any]:
    """Line appended -> signal out of poll, in milliseconds."""
    with tempfile.TemporaryDirectory(prefix="dhk-") as tmp:
        path = os.path.join(tmp, "kern.log")
        _write(path)
        kwargs = {} if interval is None else {"interval": interval}
        source = KmsgSource(path, **kwargs)  # type: ignore[arg-type]
        waiting: dict[tuple[str, str], asyncio.Future[float]] = {}

        def seen(signals: list[Signal], at: float) -> None:
            for s in signals:
                future = waiting.pop((s.value, s.message), None)
                if future is not None and not future.done():
                    future.set_result(at)

        poller = Poller(source, seen)
        loop = asyncio.get_running_loop()
        out: list[float] = []
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            for k in range(samples):
                address = GPUS[k % len(GPUS)]
                xid = 79 if (k // len(GPUS)) % 2 == 0 else 48
                message = (
                    "XID 79: GPU has fallen off the bus (reset the GPU)"
                    if xid == 79
                    else "XID 48: double-bit ECC error (reset the GPU)"
                )
                future: asyncio.Future[float] = loop.create_future()
                waiting[(f"{address}.0", message)] = future
                await asyncio.sleep(random.uniform(0, 2 * source.interval))  # any phase
                t0 = time.perf_counter()
                os.write(fd, xid_line(address, xid))
                at = await within(future, 5, f"the signal of sample {k} ({address}, XID {xid})")
                out.append((at - t0) * 1000)
        finally:
            os.close(fd)
            await poller.stop()
            source.close()
    return {
        "interval_ms": source.interval * 1000,
        "samples": len(out),
        "p50_ms": statistics.median(out),
        "p99_ms": _pct(out, 0.99),
        "max_ms": max(out),
        "lines": source.counters.lines,
    }


async def at_rest(seconds: float = 30.0, interval: float | None = None) -> dict[str, Any]:
    """CPU share of a core while following a quiet log with 8 GPUs known."""
    with tempfile.TemporaryDirectory(prefix="dhk-") as tmp:
        path = os.path.join(tmp, "kern.log")
        _write(path)
        kwargs = {} if interval is None else {"interval": interval}
        source = KmsgSource(path, **kwargs)  # type: ignore[arg-type]
        _write(path, b"".join(xid_line(a, 79 if i % 2 else 13) for i, a in enumerate(GPUS)))
        signals = source.poll()
        assert len(signals) == len(GPUS), signals
        poller = Poller(source, lambda signals, at: None)
        await asyncio.sleep(1)  # settle
        polls0, cpu0, wall0 = poller.polls, time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        polls = poller.polls - polls0
        await poller.stop()
        # the poll alone, without the loop and the thread hop
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            source.poll()
        poll_us = (time.perf_counter() - t0) / n * 1e6
        source.close()
    return {
        "interval_ms": source.interval * 1000,
        "cpu_percent": cpu / wall * 100,
        "polls_per_s": polls / wall,
        "poll_us": poll_us,
    }


def flood(lines: int = 200_000) -> dict[str, Any]:
    """Lines per second through poll: 1 in 100 an XID line, the rest kernel chatter."""
    with tempfile.TemporaryDirectory(prefix="dhk-") as tmp:
        path = os.path.join(tmp, "kern.log")
        open(path, "wb").close()
        source = KmsgSource(path, max_lines=5000)
        with open(path, "ab") as f:
            for i in range(lines):
                if i % 100 == 0:
                    f.write(xid_line(GPUS[i % len(GPUS)], 13))
                elif i % 3:
                    f.write(b"[ 1234.567890] usb 1-1: new high-speed USB device number 3\n")
                else:
                    f.write(b"[ 1234.567891] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n")
        t0 = time.perf_counter()
        while source.counters.lines < lines:
            source.poll()
        elapsed = time.perf_counter() - t0
        source.close()
    return {"lines_per_s": lines / elapsed, "parsed": source.counters.parsed}


def real_kmsg(polls: int = 2000) -> dict[str, Any] | None:
    """One poll of the real /dev/kmsg at rest, after the ring buffer was read."""
    try:
        source = KmsgSource("/dev/kmsg", max_lines=100_000)
        source.poll()
    except OSError:
        return None
    t0 = time.perf_counter()
    for _ in range(polls):
        source.poll()
    poll_us = (time.perf_counter() - t0) / polls * 1e6
    source.close()
    return {"poll_us": poll_us, "records": source.counters.lines}


async def main(quick: bool) -> None:
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    lat = await latency(100 if quick else 500)
    print(
        f"line -> signal out of poll (interval {lat['interval_ms']:.0f} ms, "
        f"{lat['samples']} samples): p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, "
        f"max {lat['max_ms']:.1f} ms (target p99 <= 50 ms)"
    )
    rest = await at_rest(10 if quick else 60)
    print(
        f"at rest, 8 GPUs known: {rest['cpu_percent']:.2f} % of a core "
        f"({rest['polls_per_s']:.0f} polls/s, {rest['poll_us']:.1f} us a poll; target <= 2 %)"
    )
    fl = flood(50_000 if quick else 200_000)
    print(f"flood: {fl['lines_per_s']:,.0f} lines/s through poll")
    real = real_kmsg()
    if real is None:
        print("/dev/kmsg: not readable here")
    else:
        print(f"/dev/kmsg at rest: {real['poll_us']:.1f} us a poll ({real['records']} records)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, shorter windows")
    asyncio.run(main(parser.parse_args().quick))
