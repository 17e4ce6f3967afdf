"""Helpers shared by the test suites: polling for a condition, short socket paths.

``eventually`` is the one way a test waits for something another task or process
does; ``short_dir`` makes a directory whose unix socket paths stay under the 108-byte
``sun_path`` limit (pytest's ``tmp_path`` is often longer).
"""

from __future__ import annotations

import asyncio
import inspect
import tempfile
import time
from collections.abc import Callable
from typing import Any

__all__ = ["eventually", "short_dir"]


async def eventually(
    check: Callable[[], Any],
    within: float = 5.0,
    what: str = "",
    *,
    interval: float = 0.02,
    ignore_errors: bool = False,
) -> Any:
    """Poll ``check`` (plain or async) until it returns something true; return that.

    Fails with :class:`AssertionError` naming ``what`` once ``within`` seconds have
    passed. With ``ignore_errors`` an exception from ``check`` counts as "not yet".
    """
    deadline = time.monotonic() + within
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
        except Exception:
            if not ignore_errors:
                raise
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or check}")
        await asyncio.sleep(interval)


def short_dir(prefix: str = "dh-") -> str:
    """A new directory under /tmp, short enough for unix socket paths inside it."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")
