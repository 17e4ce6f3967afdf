"""Fixtures of the embedded API server's attack tests: a server without a data file and
with a 1,000-event watch window, and an authorised HTTP session to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drahealth.controlplane import APIServer


@pytest.fixture
def api_server_options() -> dict[str, Any]:
    return {"data_file": None, "watch_window": 1000}


@pytest.fixture
async def http(server: APIServer) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
        base_url=server.url, headers={"Authorization": "Bearer t"}
    ) as session:
        yield session
