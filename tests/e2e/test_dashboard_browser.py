"""The dashboard in headless Chromium, driven by Playwright, on a live one-node cluster.

A real sample driver and node agent (processes) feed the embedded API server; the page
must load, show the node x device grid, and turn a device red within 2 s of a fault
injected into the driver. Skipped when Debian's chromium is not installed (``.ci/run``
installs it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from drahealth.cli._cluster import LocalCluster
from drahealth.remedy._policy_load import parse_policy
from drahealth.web import Dashboard

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed"),
]

POLICY = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
rules:
  - name: any
    match: {driver: gpu.example.com}
    action: {effect: NoSchedule}
"""
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture
async def cluster() -> AsyncIterator[LocalCluster]:
    workdir = Path(tempfile.mkdtemp(prefix="dh-web-", dir="/tmp"))
    c = LocalCluster(workdir, parse_policy(POLICY, "test"), nodes=1, devices=4, lease=5)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def test_grid_loads_and_a_fault_turns_the_device_red(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    from playwright.async_api import async_playwright

    assert cluster.client is not None
    dashboard = Dashboard(cluster.client)
    url = await dashboard.start()
    try:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = await browser.new_page()
            await page.goto(url)
            await page.wait_for_selector("#live.on", timeout=10_000)
            cells = page.locator(".device")
            await page.wait_for_function(
                "document.querySelectorAll('.device.healthy').length == 4", timeout=10_000
            )
            assert await cells.count() == 4  # a small fleet opens every node
            row = page.locator('tr.node-row[data-node="node-1"]')
            assert await row.locator("button.toggle").inner_text() == "node-1"
            assert await row.get_attribute("data-healthy") == "4"

            key = "gpu.example.com/node-1/gpu-2"
            t0 = time.monotonic()
            await cluster.inject(cluster.nodes[0], "gpu-2", "unhealthy", "--message", "XID 79")
            await page.wait_for_selector(f'.device.unhealthy[data-key="{key}"]', timeout=2_000)
            # the label says it in words, not only in colour
            assert "UNHEALTHY" in await page.locator(f'.device[data-key="{key}"]').inner_text()
            took = time.monotonic() - t0
            print(f"fault -> red cell in the browser: {took * 1000:.0f} ms")
            assert took < 2.0
            # the controller's taint shows as a badge; clicking shows the detail
            await page.wait_for_selector(f'.device[data-key="{key}"] .badge', timeout=5_000)
            await page.click(f'.device[data-key="{key}"]')
            await page.wait_for_selector("#detail h3")
            text = await page.locator("#detail").inner_text()
            assert key in text and "XID 79" in text and "NoSchedule" in text
            # the health timeline: Healthy, then Unhealthy (newest first)
            await page.wait_for_selector("#timeline tr[data-entry=Unhealthy]", timeout=5_000)
            entries = await page.locator("#timeline tr").evaluate_all(
                "rows => rows.map(r => r.dataset.entry)"
            )
            assert entries[0] == "Unhealthy" and "Healthy" in entries[1:]
            assert "device=" in page.url  # the selection is in the URL
            await page.screenshot(path=str(tmp_path / "dashboard.png"))
            await browser.close()
    finally:
        await dashboard.stop()
