"""Fixtures for every suite: the embedded API server and a short socket directory.

``server`` is an embedded API server on 127.0.0.1 (a free port) for one test; a test
module that needs other server options overrides ``api_server_options``. ``sockdir``
is a directory for unix sockets (see ``tests._support.short_dir``), removed afterwards.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from drahealth.controlplane import APIServer
from tests._support import short_dir


@pytest.fixture
def api_server_options() -> dict[str, Any]:
    """Keyword arguments of :class:`APIServer` for ``server`` (override per module)."""
    return {}


@pytest.fixture
async def server(api_server_options: dict[str, Any]) -> AsyncIterator[APIServer]:
    srv = APIServer(**api_server_options)
    await srv.start(host="127.0.0.1", port=0)
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
def sockdir() -> Iterator[str]:
    path = short_dir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
