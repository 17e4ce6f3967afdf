"""Benchmark of the dashboard at fleet size in headless Chromium.

Owns nothing but measurements. Seeds the embedded API server (in this process) with the
fleet of ``tests/e2e/_dashboard_fleet.py`` (default 1,000 nodes x 8 devices), runs
``drahealth dashboard`` against it as a subprocess, and drives Debian's Chromium with
Playwright:

* first paint: from navigation start to the page's ``drahealth-first-paint`` mark (the
  first render of every node's row), over ``--loads`` loads; the same page on a one-node
  fleet (a second API server and dashboard, in this run) is the baseline;
* fault visible: ``--faults`` times, a device's health is set Unhealthy through the API
  and the clock runs from the API's answer until its node's row shows it (then it
  recovers, unmeasured);
* memory: ``--minutes`` of updates (``--rate`` device changes per second, three nodes
  open and a device selected, as an operator would have it) while the page's JavaScript
  heap after a full garbage collection, its element count and the dashboard's RSS are
  sampled every ``--every`` seconds.

Every wait has a timeout that fails naming what it waited for.
Run: ``uv run python bench/dashboard_bench.py [--nodes N] [--minutes M]`` (default
1,000 nodes, 1 minute; ``--minutes 10`` for the documented run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the fleet of the test

from pipeline_bench import pct, rss_mb
from waits import Output, stop_process, within

from drahealth.controlplane import APIServer
from drahealth.kube import make_client
from tests.e2e._dashboard_fleet import (
    CHROMIUM,
    PER_NODE,
    Fleet,
    dom_nodes,
    heap_mb,
    launch,
    node_name,
    seed_fleet,
    set_health,
)

#: Seconds the dashboard may take to print its URL (its first LIST of the fleet included).
START_TIMEOUT = 120.0
#: Seconds a page may take to paint, and a fault to show.
PAINT_TIMEOUT = 60.0
FAULT_TIMEOUT = 30.0


class Site:
    """An embedded API server with a fleet, and ``drahealth dashboard`` on it."""

    def __init__(self, nodes: int, workdir: Path) -> None:
        self.nodes = nodes
        self.workdir = workdir
        self.server = APIServer(data_file=None, watch_window=10_000)
        self.proc: asyncio.subprocess.Process | None = None
        self.out: Output | None = None
        self.url = ""
        self.fleet: Fleet | None = None
        self.client: Any = None

    async def start(self) -> None:
        await self.server.start(host="127.0.0.1", port=0)
        self.fleet = seed_fleet(self.server, self.nodes)
        self.client = make_client(server_url=self.server.url, timeout=10.0)
        kubeconfig = self.server.write_kubeconfig(self.workdir / f"kubeconfig-{self.nodes}")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "drahealth", "dashboard", "--kubeconfig", str(kubeconfig),
            "--port", "0", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.out = Output(self.proc.stdout)
        line = await self.out.line_with("dashboard: http", START_TIMEOUT, "the dashboard's URL")
        self.url = line.split("dashboard: ", 1)[1].strip()

    async def stop(self) -> None:
        if self.proc is not None:
            await stop_process(self.proc, "the dashboard")
        if self.out is not None:
            await self.out.close()
        if self.client is not None:
            await self.client.close()
        await self.server.stop()


async def first_paint(page: Any, url: str) -> float:
    """Milliseconds from navigation start to the first render of every node's row."""
    await page.goto(url)
    await within(
        page.wait_for_function(
            "performance.getEntriesByName('drahealth-first-paint').length > 0", timeout=0
        ),
        PAINT_TIMEOUT, f"the first paint of {url}",
    )  # fmt: skip
    return float(
        await page.evaluate("performance.getEntriesByName('drahealth-first-paint')[0].startTime")
    )


async def fault_visible(page: Any, site: Site, i: int, device: int) -> float:
    """Seconds from the API's answer to a fault until its node's row shows it."""
    assert site.fleet is not None
    row = f'tr.node-row[data-node="{node_name(i)}"]'
    before = int(await page.get_attribute(row, "data-unhealthy") or 0)
    await set_health(site.client, site.fleet, i, device, "Unhealthy", "bench fault")
    shown = time.monotonic()
    await within(
        page.wait_for_function(
            f"document.querySelector('{row}').dataset.unhealthy === '{before + 1}'",
            polling="raf", timeout=0,
        ),
        FAULT_TIMEOUT, f"the fault on {node_name(i)} to show",
    )  # fmt: skip
    took = time.monotonic() - shown
    await set_health(site.client, site.fleet, i, device, "Healthy")
    await within(
        page.wait_for_function(
            f"document.querySelector('{row}').dataset.unhealthy === '{before}'", timeout=0
        ),
        FAULT_TIMEOUT, f"the recovery on {node_name(i)} to show",
    )  # fmt: skip
    return took


async def churn(site: Site, rate: float, seconds: float, rng: random.Random) -> int:
    """``rate`` device health changes per second for ``seconds``, through the API."""
    assert site.fleet is not None
    sent, start = 0, time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        while sent < int(elapsed * rate) + 1:
            i, device = rng.randrange(8, site.nodes), rng.randrange(PER_NODE)
            health = rng.choice(["Healthy", "Healthy", "Unhealthy", "Unknown"])
            await within(
                set_health(site.client, site.fleet, i, device, health, f"churn {sent}"),
                FAULT_TIMEOUT, "a churn write",
            )  # fmt: skip
            sent += 1
        await asyncio.sleep(max(0.0, sent / rate - (time.monotonic() - start)))
    return sent


async def run(args: argparse.Namespace) -> None:
    from playwright.async_api import async_playwright

    rng = random.Random(7)
    workdir = Path(tempfile.mkdtemp(prefix="dh-dash-bench-"))
    big, small = Site(args.nodes, workdir), Site(1, workdir)
    try:
        t0 = time.monotonic()
        await big.start()
        await small.start()
        print(f"fleet: {args.nodes} nodes x {PER_NODE} devices; dashboards up in "
              f"{time.monotonic() - t0:.1f} s")  # fmt: skip
        async with async_playwright() as p:
            browser = await launch(p)
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            cdp = await page.context.new_cdp_session(page)
            base = [await first_paint(page, small.url) for _ in range(args.loads)]
            paint = [await first_paint(page, big.url) for _ in range(args.loads)]
            print(f"first paint, 1 node x 8 (baseline): median {statistics.median(base):.0f} ms")
            ratio = statistics.median(paint) / statistics.median(base)
            print(f"first paint, {args.nodes * PER_NODE} devices: median "
                  f"{statistics.median(paint):.0f} ms, max {max(paint):.0f} ms "
                  f"({ratio:.1f}x the baseline)")  # fmt: skip

            faults = []
            for k in range(args.faults):
                faults.append(await fault_visible(page, big, 10 + k * 37 % (args.nodes - 10), 4))
            print(f"fault visible after the API shows it ({args.faults} faults): p50 "
                  f"{pct(faults, 0.5) * 1000:.0f} ms, max {max(faults) * 1000:.0f} ms")  # fmt: skip

            # an operator's view: three nodes open, a device selected
            await page.goto(big.url + "#open=node-0001,node-0002,node-0003&device="
                            f"gpu.example.com/{node_name(1)}/dev-0")  # fmt: skip
            await within(page.wait_for_selector(".device", timeout=0), PAINT_TIMEOUT, "devices")
            assert big.proc is not None
            samples: list[tuple[float, float, int, float]] = []

            async def sample(at: float) -> None:
                heap, pid = await heap_mb(page, cdp), big.proc.pid if big.proc else 0
                samples.append((at, heap, await dom_nodes(page), rss_mb(pid)))
                print(f"  t={at:5.0f} s  page heap {heap:6.1f} MB  elements "
                      f"{samples[-1][2]:6d}  dashboard RSS {samples[-1][3]:6.1f} MB")  # fmt: skip

            await sample(0.0)
            seconds, sent, start = args.minutes * 60, 0, time.monotonic()
            while (elapsed := time.monotonic() - start) < seconds:
                sent += await churn(big, args.rate, min(args.every, seconds - elapsed), rng)
                await sample(time.monotonic() - start)
            heaps = [s[1] for s in samples]
            print(f"memory over {args.minutes:g} min of updates ({sent} changes, "
                  f"{args.rate:g}/s): page heap {heaps[0]:.1f} -> {heaps[-1]:.1f} MB "
                  f"(max {max(heaps):.1f}, {heaps[-1] / heaps[0]:.2f}x); elements "
                  f"{samples[0][2]} -> {samples[-1][2]}; dashboard RSS {samples[0][3]:.0f} -> "
                  f"{samples[-1][3]:.0f} MB")  # fmt: skip
            await browser.close()
    finally:
        await big.stop()
        await small.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--loads", type=int, default=3, help="page loads timed")
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=1.0, help="of updates for memory")
    parser.add_argument("--rate", type=float, default=5.0, help="device changes per second")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between samples")
    args = parser.parse_args()
    if args.nodes < 20:
        parser.error("--nodes must be at least 20")
    if not os.path.exists(CHROMIUM):
        sys.exit(f"error: {CHROMIUM} not found (Debian: apt-get install chromium)")
    print(f"machine: {os.cpu_count()} CPUs; {CHROMIUM}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
