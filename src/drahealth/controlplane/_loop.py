"""The loop every stand-in controller runs: reflectors in, one pass per change.

Owns :func:`reconcile_loop` (start the reflectors, wait for their first LIST, then run
``step`` after every change, at least once a second, logging API errors and going on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from lightkube import ApiError

from drahealth.kube import Reflector

__all__ = ["reconcile_loop"]

log = logging.getLogger(__name__)


async def reconcile_loop(
    reflectors: list[Reflector[Any]], step: Callable[[], Awaitable[None]], name: str
) -> None:
    wake = asyncio.Event()
    for r in reflectors:
        r.add_handler(lambda *_a: wake.set())
        await r.start()
    try:
        for r in reflectors:
            await r.wait_synced()
        while True:
            wake.clear()
            try:
                await step()
            except ApiError as exc:
                log.warning("%s: pass failed: %s", name, exc.status.message)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await wake.wait()
            await asyncio.sleep(0.01)  # let a burst of events land in one pass
    finally:
        for r in reflectors:
            await r.stop()
