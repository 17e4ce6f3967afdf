"""The embedded API server's resourceVersion handling against hostile values.

What kube-apiserver 1.37.2 answers was measured with curl against the real server
(scripts/realk8s): a LIST whose ``resourceVersion`` is not a canonical unsigned 64-bit
integer (``-5``, ``abc``, `` 12``, ``+12``, ``1_0``, ``١٢``, one past 2**64 - 1) is 400
``invalid resource version: ... strconv.ParseUint ...`` at once; a WATCH with one is a
500 Status; a LIST at a future (valid) resourceVersion waits 3 s and answers 504; a WATCH
there stays silent and delivers what comes after that resourceVersion once it arrives.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from drahealth.controlplane import APIServer

pytestmark = pytest.mark.timeout(30)

CMS = "/api/v1/namespaces/default/configmaps"


async def _rv(http: aiohttp.ClientSession) -> int:
    async with http.get(CMS) as resp:
        return int((await resp.json())["metadata"]["resourceVersion"])


async def _create(http: aiohttp.ClientSession, name: str) -> int:
    async with http.post(CMS, json={"metadata": {"name": name}, "data": {"k": "v"}}) as resp:
        assert resp.status == 201, await resp.text()
        return int((await resp.json())["metadata"]["resourceVersion"])


@pytest.mark.parametrize("rv", ["-5", "abc"])
async def test_a_list_at_an_invalid_resource_version_is_a_bad_request(
    http: aiohttp.ClientSession, rv: str
) -> None:
    async with http.get(CMS, params={"resourceVersion": rv}) as resp:
        body = await resp.json()
    assert resp.status == 400, body
    assert body["reason"] == "BadRequest" and "invalid resource version" in body["message"]
    assert f'strconv.ParseUint: parsing "{rv}": invalid syntax' in body["message"]


@pytest.mark.parametrize(
    "rv",
    ["+12", " 12", "1_0", "\u0661\u0662", str(2**64)],
    ids=["plus", "space", "underscore", "arabic-digits", "past-uint64"],
)
async def test_a_list_at_a_non_canonical_resource_version_is_refused_at_once(
    http: aiohttp.ClientSession, rv: str
) -> None:
    t0 = time.monotonic()
    try:
        async with http.get(
            CMS, params={"resourceVersion": rv}, timeout=aiohttp.ClientTimeout(total=1.0)
        ) as resp:
            status = resp.status
    except TimeoutError:
        status = 0  # held like a future resourceVersion
    assert status == 400, f"answered {status} after {time.monotonic() - t0:.1f} s"


async def test_a_watch_at_a_negative_resource_version_is_refused(
    http: aiohttp.ClientSession,
) -> None:
    async with http.get(
        CMS, params={"watch": "1", "resourceVersion": "-5", "timeoutSeconds": "1"}
    ) as resp:
        assert resp.status == 500, await resp.text()


async def test_a_watch_from_the_future_delivers_what_comes_after_it(
    http: aiohttp.ClientSession,
) -> None:
    """Held: silent while the store is behind, then the events after the resourceVersion
    asked for, none before it."""
    future = await _rv(http) + 2
    async with http.get(
        CMS, params={"watch": "1", "resourceVersion": str(future), "timeoutSeconds": "5",
                     "allowWatchBookmarks": "true"},
    ) as resp:  # fmt: skip
        assert resp.status == 200
        first = await _create(http, "before-1")
        second = await _create(http, "before-2")
        assert second == future and first == future - 1
        after = await _create(http, "after")
        line = await asyncio.wait_for(resp.content.readline(), 3.0)
        event = json.loads(line)
        assert event["type"] == "ADDED", event
        assert event["object"]["metadata"]["name"] == "after"
        assert int(event["object"]["metadata"]["resourceVersion"]) == after


async def test_many_future_watches_are_bounded_by_the_watch_slots(
    http: aiohttp.ClientSession, server: APIServer
) -> None:
    """Held: silent watches at a future resourceVersion take watch slots like any watch,
    so a flood of them is answered 429 beyond the server's limit, not held for ever."""
    future = str(await _rv(http) + 1_000_000)
    params = {"watch": "1", "resourceVersion": future, "timeoutSeconds": "5"}
    limit = aiohttp.TCPConnector(limit=0)
    statuses: list[int] = []
    async with aiohttp.ClientSession(
        base_url=server.url, headers={"Authorization": "Bearer t"}, connector=limit
    ) as flood:
        streams = []
        try:
            for _ in range(400):
                resp = await flood.get(CMS, params=params)
                statuses.append(resp.status)
                streams.append(resp)
                if resp.status == 429:
                    break
        finally:
            for resp in streams:
                resp.close()
    assert statuses[-1] == 429, f"{len(statuses)} silent watches accepted without a bound"
    async with http.get(CMS) as resp:
        assert resp.status == 200
