"""Fixtures: a real embedded API server on 127.0.0.1:0 and a lightkube client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import AsyncClient

from drahealth.controlplane import APIServer
from drahealth.kube import make_client
from tests._support import eventually

__all__ = ["eventually"]


@pytest.fixture
def api_server_options() -> dict[str, Any]:
    return {"data_file": None, "watch_window": 1000}


@pytest.fixture
async def client(server: APIServer) -> AsyncIterator[AsyncClient]:
    c = make_client(server_url=server.url, timeout=5.0)
    try:
        yield c
    finally:
        await c.close()
