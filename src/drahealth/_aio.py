"""Small asyncio helpers shared by every long-running component: task cancellation
and the one way a process runs until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["STOP_SIGNALS", "cancel_and_wait", "on_stop_signals", "wait_for_stop_signal"]

#: The signals that ask a long-running process to stop cleanly.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def on_stop_signals(
    callback: Callable[[], object], signals: Iterable[signal.Signals] = STOP_SIGNALS
) -> Iterator[None]:
    """Call ``callback`` on the running loop whenever one of ``signals`` arrives while
    inside the block; the handlers are removed when the block ends (so they also cover
    the clean-up written inside the block)."""
    loop = asyncio.get_running_loop()
    installed = tuple(signals)
    for sig in installed:
        loop.add_signal_handler(sig, callback)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def wait_for_stop_signal(signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
    """Return once one of ``signals`` (default SIGTERM, SIGINT) arrives."""
    stop = asyncio.Event()
    with on_stop_signals(stop.set, signals):
        await stop.wait()


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel ``tasks`` (None entries and the calling task itself are skipped) and wait
    until each has ended.

    A task that ends with an exception other than cancellation has it swallowed: the
    caller is shutting down and the task has logged what it had to say. So is a
    cancellation of the caller that arrives during the wait: a clean-up sequence that
    waits here goes on to its next step (the caller's ``cancelling()`` count still shows
    it), and the cancellation is passed on to the task being waited for, so one that
    dropped its first cancel gets another.
    """
    caller = asyncio.current_task()
    pending = [t for t in dict.fromkeys(tasks) if t is not None and t is not caller]
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
