"""The shared run-until-signal helper: handlers live exactly as long as the block."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from drahealth._aio import on_stop_signals, wait_for_stop_signal

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
