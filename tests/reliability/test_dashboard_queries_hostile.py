"""The dashboard's query parameter against hostile input: ``device`` of ``/api/timeline``
and ``/api/history``.

Raw HTTP requests (no client library to clean them up): a missing, repeated, oversized,
non-UTF-8 or control-character ``device`` gets 400 with a JSON error naming what is
wrong; a request line past the server's limit is refused without harm; a flood of
lookups of devices nobody has seen is answered and leaves the timelines as they were
(a lookup never creates one); the page's filters are in the URL's fragment, which never
reaches the server. The state and the page keep being served throughout.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from lightkube import AsyncClient

from drahealth.web import Dashboard
from drahealth.web._server import MAX_DEVICE_PARAM
from tests.integration.cli.test_views import NODE, D, scenario
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]


async def raw_get(url: str, target: bytes) -> tuple[int, bytes]:
    """One GET with ``target`` sent byte for byte; the status and the body."""
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"GET " + target + f" HTTP/1.1\r\nHost: {host}:{port}\r\n".encode())
        writer.write(b"Connection: close\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(10):
            data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize("path", [b"/api/timeline", b"/api/history"])
@pytest.mark.parametrize(
    ("query", "problem"),
    [
        (b"", "given once"),
        (b"?device=a/b/c&device=a/b/d", "given once"),
        (b"?device=" + b"x/" * 600 + b"x", f"longer than {MAX_DEVICE_PARAM}"),
        (b"?device=gpu/%ff%fe/x", "printable UTF-8"),
        (b"?device=gpu/\xff\xfe/x", ""),  # raw bytes: the HTTP parser refuses the line
        (b"?device=gpu/a%00b/x", "printable UTF-8"),
        (b"?device=gpu/a%1b%5b2J/x", "printable UTF-8"),
        (b"?device=gpu-0", "DRIVER/POOL/DEVICE"),
    ],
)
async def test_a_bad_device_parameter_gets_400_naming_it(
    client: AsyncClient, path: bytes, query: bytes, problem: str
) -> None:
    await scenario(client)
    dashboard = Dashboard(client)
    url = await dashboard.start()
    try:
        status, body = await raw_get(url, path + query)
        assert status == 400, body
        if problem:
            assert problem in json.loads(body)["error"]
        ok, _ = await raw_get(url, b"/api/state")
        assert ok == 200
    finally:
        await dashboard.stop()


async def test_oversized_requests_and_a_lookup_flood_leave_the_dashboard_as_it_was(
    client: AsyncClient,
) -> None:
    await scenario(client)
    dashboard = Dashboard(client)
    url = await dashboard.start()
    try:
        known = f"{D}/{NODE}/gpu-1"
        tracked = len(dashboard.timeline)
        assert tracked == 4 and dashboard.timeline.device(known)
        # a request line far past any sane length: refused, nothing read into memory
        status, _ = await raw_get(url, b"/api/timeline?device=" + b"a" * 200_000)
        assert status in (400, 414, 431)
        # the fragment is the browser's: a URL with filters asks the server for "/" only
        status, body = await raw_get(url, b"/")
        assert status == 200 and b"EventSource" in body

        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, force_close=True)
        ) as http:

            async def lookup(i: int) -> int:
                params = {"device": f"evil.example.com/pool-{i}/dev-{'x' * (i % 500)}"}
                async with http.get(url + "api/timeline", params=params) as resp:
                    if resp.status == 200:
                        assert (await resp.json())["entries"] == []
                    return resp.status

            statuses = await asyncio.gather(*(lookup(i) for i in range(1500)))
            assert set(statuses) <= {200, 503} and statuses.count(200) > 0
            assert len(dashboard.timeline) == tracked  # lookups create nothing
            async with http.get(url + "api/timeline", params={"device": known}) as resp:
                body = await resp.json()
                assert body["device"] == known and body["entries"][-1][1] == "Unhealthy"
                assert body["max"] == dashboard.timeline.per_device
            async with http.get(url + "api/state") as resp:
                assert resp.status == 200 and (await resp.json())["nodes"][0]["name"] == NODE
    finally:
        await dashboard.stop()
