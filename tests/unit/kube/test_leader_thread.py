"""Renewals on their own thread stop when the caller is cancelled, even where the work
drops a cancellation (on 3.11 ``asyncio.wait_for`` did, when its call finished in the
same step), so a stopped replica never goes on renewing its Lease."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from drahealth.kube._leader import _on_own_thread

pytestmark = pytest.mark.timeout(20)


async def test_work_that_drops_a_cancellation_is_asked_again_until_it_ends() -> None:
    rounds: list[float] = []
    dropped = threading.Event()

    give_up = time.monotonic() + 8  # a regression fails the test below, not hangs it

    async def stubborn(step: float) -> None:
        while time.monotonic() < give_up:
            try:
                await asyncio.sleep(step)
                rounds.append(step)
            except asyncio.CancelledError:
                if dropped.is_set():
                    raise
                dropped.set()  # the first request is lost, as the 3.11 race lost it

    caller = asyncio.create_task(_on_own_thread(stubborn, 0.01, "renew-test", repeat=0.5))
    await asyncio.sleep(0.2)
    assert rounds
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(3):
            await asyncio.shield(caller)
    assert dropped.is_set()
    before = len(rounds)
    await asyncio.sleep(0.1)
    assert len(rounds) == before  # no renewal after the caller ended
    assert not any(t.name == "renew-test" for t in threading.enumerate())
