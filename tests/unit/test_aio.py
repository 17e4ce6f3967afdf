"""The shared run-until-signal helper: handlers live exactly as long as the block."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from drahealth._aio import cancel_and_wait, on_stop_signals, wait_for_stop_signal

pytestmark = pytest.mark.timeout(10)


async def test_wait_for_stop_signal_returns_on_sigterm() -> None:
    waiter = asyncio.create_task(wait_for_stop_signal())
    await asyncio.sleep(0)  # let it install its handlers
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(waiter, 5)


async def test_on_stop_signals_calls_back_and_removes_handlers() -> None:
    loop = asyncio.get_running_loop()
    calls: list[str] = []
    got = asyncio.Event()
    with on_stop_signals(lambda: (calls.append("stop"), got.set()), (signal.SIGUSR1,)):
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.wait_for(got.wait(), 5)
    assert calls == ["stop"]
    assert not loop.remove_signal_handler(signal.SIGUSR1)  # already removed on exit


async def test_cancel_and_wait_swallows_the_tasks_own_endings() -> None:
    async def fails() -> None:
        raise ValueError("logged elsewhere")

    failing = asyncio.create_task(fails())
    sleeping = asyncio.create_task(asyncio.sleep(60))
    await asyncio.sleep(0)
    await cancel_and_wait([failing, None, sleeping])
    assert sleeping.cancelled()
    assert failing.done()


async def test_timeout_keeps_a_cancellation_that_meets_a_result() -> None:
    """Why src/ never uses asyncio.wait_for: on 3.11 it drops a cancellation that
    arrives in the step its awaitable finishes; asyncio.timeout keeps it."""
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def waits() -> int:
        async with asyncio.timeout(10):
            value = await fut
        await asyncio.sleep(0)
        return value

    task = asyncio.create_task(waits())
    await asyncio.sleep(0)
    fut.set_result(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
