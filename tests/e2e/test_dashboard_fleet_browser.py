"""The dashboard at fleet size in headless Chromium: 1,000 nodes x 8 devices.

The fleet of :mod:`tests.e2e._dashboard_fleet` in the embedded API server, the dashboard
on it, Playwright driving Debian's Chromium. Checked: one row per node with its counts and
no device drawn until a node is opened; a fault written through the API shows in its
node's row; the filters (not healthy, tainted, driver, search) and the opened nodes are in
the URL, and a reload (or the link in a new page) shows the same view; pod names,
evicting and PDB-blocked pods, taints and labels in words on the devices; the per-device
timeline and the counts over time stay within their caps, and updates change no more of
the page than they must. Timings are measured by ``bench/dashboard_bench.py``, not here.
Skipped when Debian's chromium is not installed.
"""

from __future__ import annotations

import os
from itertools import pairwise
from typing import Any

import aiohttp
import pytest
from lightkube import AsyncClient

from drahealth.controlplane import APIServer
from drahealth.web import Dashboard
from drahealth.web._timeline import Timeline
from tests.e2e._dashboard_fleet import (
    CHROMIUM,
    FPGA,
    dom_nodes,
    heap_mb,
    key,
    launch,
    seed_fleet,
    set_health,
)
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.slow,  # 8,000 devices in Chromium, 15-20 s: CI runs it in its slow step
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed"),
]
ROWS = "tr.node-row:not([hidden])"


async def shown(page: Any) -> list[str]:
    """The nodes whose rows are visible, in order."""
    names = await page.locator(ROWS).evaluate_all("rows => rows.map(r => r.dataset.node)")
    return [str(n) for n in names]


async def until_shown(page: Any, count: int) -> None:
    await page.wait_for_function(
        f"document.querySelectorAll('{ROWS}').length === {count}", timeout=20_000
    )


async def test_a_fleet_of_8000_devices(server: APIServer, client: AsyncClient) -> None:
    from playwright.async_api import async_playwright

    fleet = seed_fleet(server, 1000)
    dashboard = Dashboard(client)
    # small caps, so that a short test reaches them
    dashboard.timeline = Timeline(per_device=4, max_samples=4, sample_gap=0)
    url = await dashboard.start()
    try:
        async with async_playwright() as p:
            browser = await launch(p)
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            cdp = await page.context.new_cdp_session(page)
            await page.goto(url)
            await page.wait_for_selector("#live.on", timeout=30_000)
            await until_shown(page, 1000)
            summary = await page.locator("#summary").inner_text()
            assert summary.startswith("1000 nodes, 8000 devices, 1 unhealthy"), summary
            assert await page.locator(".device").count() == 0  # no node opened yet
            bad = page.locator('tr.node-row[data-node="node-0007"]')
            assert await bad.get_attribute("data-unhealthy") == "1"
            assert "has-bad" in (await bad.get_attribute("class") or "")

            # a fault written through the API shows in its node's row
            await set_health(client, fleet, 500, 5, "Unhealthy", "XID 48")
            await page.wait_for_selector(
                'tr.node-row[data-node="node-0500"][data-unhealthy="1"]', timeout=10_000
            )

            # not healthy only: two nodes; open one: only its bad device is drawn
            await page.check("#f-bad")
            await until_shown(page, 2)
            assert await shown(page) == ["node-0007", "node-0500"]
            await page.click('tr.node-row[data-node="node-0500"] button.toggle')
            cell = page.locator(f'.device[data-key="{key(500, 5)}"]')
            await cell.wait_for(timeout=5_000)
            assert await page.locator(".device").count() == 1
            assert "UNHEALTHY" in await cell.inner_text()  # in words, not only colour
            assert "bad=1" in page.url and "open=node-0500" in page.url

            # the link reproduces the view: reloaded, and in a new page
            link = page.url
            await page.reload()
            await page.wait_for_selector("#live.on", timeout=30_000)
            await until_shown(page, 2)
            assert await page.is_checked("#f-bad")
            await cell.wait_for(timeout=5_000)
            other = await browser.new_page()
            await other.goto(link)
            await other.wait_for_selector(f'.device[data-key="{key(500, 5)}"]', timeout=30_000)
            assert await shown(other) == ["node-0007", "node-0500"]
            await other.close()

            # recovery leaves the filtered view, live
            await set_health(client, fleet, 500, 5, "Healthy")
            await until_shown(page, 1)
            await page.uncheck("#f-bad")
            await until_shown(page, 1000)

            # tainted only; then a driver; then a search
            await page.check("#f-tainted")
            await until_shown(page, 2)
            assert await shown(page) == ["node-0003", "node-0005"]
            await page.uncheck("#f-tainted")
            await page.select_option("#f-driver", FPGA)
            await until_shown(page, 100)
            assert "driver=fpga.example.com" in page.url
            await page.select_option("#f-driver", "")
            await page.fill("#f-q", "node-012")
            await until_shown(page, 10)
            await page.fill("#f-q", "")
            await until_shown(page, 1000)

            # sorted by most unhealthy (kept in the URL); a node with new faults moves up, live
            first = "document.querySelector('tr.node-row').dataset.node"
            await page.select_option("#f-sort", "unhealthy")
            await page.wait_for_function(f"{first} === 'node-0007'", timeout=10_000)
            assert "sort=unhealthy" in page.url
            for device in (2, 3):
                await set_health(client, fleet, 900, device, "Unhealthy")
            await page.wait_for_function(f"{first} === 'node-0900'", timeout=10_000)
            for device in (2, 3):
                await set_health(client, fleet, 900, device, "Healthy")
            await page.wait_for_function(f"{first} === 'node-0007'", timeout=10_000)
            await page.select_option("#f-sort", "")
            await page.wait_for_function(f"{first} === 'node-0000'", timeout=10_000)
            await page.keyboard.press("/")  # jumps to the search, as in k9s
            assert await page.evaluate("document.activeElement.id") == "f-q"
            await page.keyboard.press("Escape")

            # pods on devices, eviction, a PDB that blocks it, the taint: in words
            await page.click("#collapse")
            for i in (1, 2, 3):
                await page.click(f'tr.node-row[data-node="node-{i:04d}"] button.toggle')
            one = page.locator(f'.device[data-key="{key(1, 0)}"]')
            await one.wait_for(timeout=5_000)
            assert "train-0001" in await one.inner_text()
            evicting = page.locator(f'.device[data-key="{key(2, 0)}"] .evict.evicting')
            assert await evicting.inner_text() == "EVICTING"
            blocked = page.locator(f'.device[data-key="{key(3, 0)}"]')
            assert await blocked.locator(".evict.blocked").inner_text() == "PDB-BLOCKED"
            assert await blocked.locator(".badge").inner_text() == "NoSchedule"
            await blocked.click()
            detail = await page.locator("#detail").inner_text()
            assert "disruption budget" in detail and fleet.blocked in detail
            legend = await page.locator("#legend").inner_text()
            for words in ("Healthy", "UNHEALTHY", "Unknown", "EVICTING", "PDB-BLOCKED"):
                assert words in legend
            assert await page.locator(".device").count() == 24  # three open nodes

            # bounded: many updates change neither the number of elements nor grow the
            # timelines and counts over their caps
            before = await dom_nodes(page, "#fleet *")  # the rows and the open nodes' devices
            heap_before = await heap_mb(page, cdp)
            for n in range(7):  # each change seen before the next: no two coalesced into one
                health = "Healthy" if n % 2 else "Unhealthy"
                await set_health(client, fleet, 600 + n, 1, "Unknown" if n % 2 else "Unhealthy")
                await set_health(client, fleet, 3, 0, health, f"change {n}")
                await page.wait_for_function(
                    f"document.querySelector('#detail').innerText.includes('change {n}')",
                    timeout=10_000,
                )
            await page.wait_for_function(
                "document.querySelectorAll('#timeline tr').length === 4", timeout=10_000
            )
            async with (
                aiohttp.ClientSession() as http,
                http.get(url + "api/timeline", params={"device": key(3, 0)}) as resp,
            ):
                entries = (await resp.json())["entries"]
            assert len(entries) == 4 and entries[-1][1] == "Unhealthy"
            assert all(a[1:] != b[1:] for a, b in pairwise(entries))
            assert len(dashboard.timeline.samples) == 4
            assert await page.evaluate("samples.length") == 4
            assert await dom_nodes(page, "#fleet *") == before
            heap_after = await heap_mb(page, cdp)
            assert heap_after < heap_before * 1.5 + 10, (heap_before, heap_after)
            await browser.close()
    finally:
        await dashboard.stop()
