"""What every stand-in controller shares: the loop, batched creates, live pods.

Owns :func:`reconcile_loop` (start the reflectors, wait for their first LIST, then run
``step`` after every change, at least once a second, logging API errors and going on),
:func:`slow_start` (how a stand-in creates many objects for one owner: batches of
1, 2, 4, ... as upstream's ``slowStartBatch``, the owner re-checked before each batch and
each create, stopping at the first failure) and :func:`pod_active` (upstream's
``IsPodActive``: a pod that has not ended and is not being deleted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from lightkube import ApiError

from drahealth.kube import Reflector

__all__ = ["BURST", "pod_active", "reconcile_loop", "slow_start"]

#: Most objects one pass creates for one owner (upstream's ``BurstReplicas``).
BURST = 500

log = logging.getLogger(__name__)

_ENDED = ("Succeeded", "Failed")


def pod_active(pod: dict[str, Any]) -> bool:
    """Not ``Succeeded`` or ``Failed`` and not being deleted (upstream's ``IsPodActive``)."""
    return (
        not pod["metadata"].get("deletionTimestamp")
        and (pod.get("status") or {}).get("phase") not in _ENDED
    )


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


async def slow_start(
    count: int, create: Callable[[], Awaitable[None]], still_wanted: Callable[[], bool]
) -> int:
    """Run ``create`` up to ``count`` times in growing batches; how many succeeded.

    Before each batch and each create, ``still_wanted()`` (the owner still exists and is
    not being deleted, read from the caller's cache) must hold, so a deleted owner stops
    the work at once. A failed create ends the run: its error propagates after the
    batch it was in has finished.
    """
    done = 0
    batch = min(count, 1)
    while batch > 0 and still_wanted():

        async def one() -> bool:
            if not still_wanted():
                return False
            await create()
            return True

        results = await asyncio.gather(*(one() for _ in range(batch)), return_exceptions=True)
        done += sum(1 for r in results if r is True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        count -= batch
        batch = min(count, 2 * batch)
    return done
