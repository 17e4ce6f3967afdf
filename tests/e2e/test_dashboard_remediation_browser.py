"""The dashboard page in headless Chromium shows the remediation controller's state.

The scenario of :mod:`tests.integration.cli.test_views` on the embedded API server and the
controller's state ConfigMap (breaker tripped, a device that needs a human, a hold...): the
page must show the breaker banner, a marker on each such device and the legend, take the
banner down when the breaker closes, and keep hostile text plain. Skipped when Debian's
chromium is not installed.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from drahealth.web import Dashboard
from tests.integration.cli.test_views import scenario
from tests.integration.cli.test_views_remediation import GPU, STATE, write_state
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed"),
]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


async def test_banner_markers_and_legend(client: AsyncClient) -> None:
    from playwright.async_api import async_playwright

    await scenario(client)
    state = {**STATE, "degraded": {GPU[3]: {"reason": "<img src=x onerror=alert(1)>"}}}
    await write_state(client, {k: json.dumps(v) for k, v in state.items()})
    dashboard = Dashboard(client)
    url = await dashboard.start()
    try:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = await browser.new_page()
            dialogs: list[str] = []
            page.on("dialog", lambda d: dialogs.append(d.message))
            await page.goto(url)
            await page.wait_for_selector("#live.on", timeout=10_000)
            banner = page.locator("#breaker p").first
            await banner.wait_for(timeout=5_000)
            text = await banner.inner_text()
            assert text.startswith("PAUSED: cluster limit 10% = 8 devices reached (8 within 1h)")
            assert text.endswith("1 taint held; run `drahealth resume`")
            cell = page.locator(f'.device[data-key="{GPU[1]}"]')
            assert await cell.get_attribute("data-markers") == "NEEDS-HUMAN,REPAIRING"
            assert "m-needs-human" in (await cell.get_attribute("class") or "")
            assert await cell.locator(".marker").inner_text() == "HUMAN +1"
            held = page.locator(f'.device[data-key="{GPU[0]}"]')
            assert await held.get_attribute("data-markers") == "HELD"
            legend = await page.locator("#legend").inner_text()
            assert "needs a human" in legend and "circuit breaker" in legend
            await page.click(f'.device[data-key="{GPU[3]}"]')
            detail = await page.locator("#detail").inner_text()
            assert "<img src=x onerror=alert(1)>" in detail  # shown as text, never markup
            await page.click(f'.device[data-key="{GPU[1]}"]')
            detail = await page.locator("#detail").inner_text()
            assert "3 bad episodes within 24h" in detail and f"drahealth clear {GPU[1]}" in detail

            await client.patch(
                ConfigMap, "drahealth-remediation-state",
                {"data": {"breaker": json.dumps({"tripped": [], "held": []})}},
                namespace="default", patch_type=PatchType.MERGE,
            )  # fmt: skip
            await page.wait_for_function(
                "!document.querySelector('#breaker p:not(.note)')", timeout=5_000
            )
            assert dialogs == []
            await browser.close()
    finally:
        await dashboard.stop()


async def test_a_hostile_link_is_bounded_and_shown_as_text(client: AsyncClient) -> None:
    """The view comes from the URL's fragment, which anyone can write into a link: markup
    stays text, long values are cut, at most 50 nodes open, and the page still works."""
    from playwright.async_api import async_playwright

    await scenario(client)
    dashboard = Dashboard(client)
    url = await dashboard.start()
    evil = "%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E"
    fragment = (
        f"#driver={evil}&q={'q' * 10_000}&open="
        + ",".join(f"n{i}" for i in range(5_000))
        + f"&device={'d' * 5_000}&bad=%ff"
    )
    try:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = await browser.new_page()
            dialogs: list[str] = []
            page.on("dialog", lambda d: dialogs.append(d.message))
            await page.goto(url + fragment)
            await page.wait_for_selector("#live.on", timeout=10_000)
            assert len(await page.input_value("#f-q")) == 200
            assert await page.evaluate("view.open.size") == 50
            assert await page.evaluate("view.device.length") <= 761
            assert not await page.is_checked("#f-bad")
            options = await page.locator("#f-driver option").all_inner_texts()
            assert "<img src=x onerror=alert(1)>" in options  # an option's text, not markup
            assert await page.locator("img").count() == 0
            # nothing matches that driver: the page says so; clearing the filters shows it all
            await page.wait_for_selector("#empty:not([hidden])", timeout=5_000)
            await page.goto(url + "#")
            await page.reload()
            await page.wait_for_selector(f'.device[data-key="{GPU[1]}"]', timeout=10_000)
            assert dialogs == []
            await browser.close()
    finally:
        await dashboard.stop()
