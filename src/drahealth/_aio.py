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
    """Cancel ``tasks`` (None entries are skipped) and wait until each has ended.

    A task that ends with an exception other than cancellation has it swallowed: the
    caller is shutting down and the task has logged what it had to say. A cancellation
    of the caller itself that arrives during the wait is not swallowed: the wait for
    the tasks still completes (the clean-up is not cut short), then the caller's
    CancelledError is raised.
    """
    pending = [t for t in tasks if t is not None]
    for task in pending:
        task.cancel()
    interrupted: asyncio.CancelledError | None = None
    while not all(task.done() for task in pending):
        try:
            # wait, unlike await, does not pass a cancellation of the caller on to them
            await asyncio.wait(pending)
        except asyncio.CancelledError as exc:
            interrupted = exc
    for task in pending:
        if not task.cancelled():
            task.exception()  # retrieved: the task has logged what it had to say
    if interrupted is not None:
        raise interrupted
