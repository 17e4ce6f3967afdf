"""Fixtures: a real embedded API server on 127.0.0.1:0 and a lightkube client for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from lightkube import AsyncClient

from drahealth.controlplane import APIServer
from drahealth.kube import make_client


@pytest.fixture
async def server() -> AsyncIterator[APIServer]:
    srv = APIServer(data_file=None, watch_window=1000)
    await srv.start(host="127.0.0.1", port=0)
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
async def client(server: APIServer) -> AsyncIterator[AsyncClient]:
    c = make_client(server_url=server.url, timeout=5.0)
    try:
        yield c
    finally:
        await c.close()


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], within: float = 5.0, interval: float = 0.01
) -> None:
    """Poll ``check`` until it is true; fail with AssertionError after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(interval)
