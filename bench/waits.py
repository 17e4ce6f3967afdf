"""Bounded waits for the benchmarks: every wait ends, and a timeout says what it waited for.

Owns :func:`within` (await with a deadline, failing with :class:`BenchTimeout` naming
the wait), :class:`Output` (drains a child's stdout continuously, so a chatty child
never blocks on a full pipe, and keeps its last lines for error messages) and
:func:`stop_process` (SIGTERM, then SIGKILL and a failure if the child does not exit).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["BenchTimeout", "Output", "stop_process", "within"]

T = TypeVar("T")


class BenchTimeout(RuntimeError):
    """A benchmark wait ran out of time; the text says what it waited for."""


async def within(awaitable: Awaitable[T], seconds: float, what: str, detail: str = "") -> T:
    """Await ``awaitable`` for at most ``seconds``; on timeout raise :class:`BenchTimeout`."""
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        extra = f"\n{detail}" if detail else ""
        raise BenchTimeout(f"timed out after {seconds:g} s waiting for {what}{extra}") from None


class Output:
    """Reads a child's stdout line by line until it closes, keeping the last ``keep`` lines
    and counting the lines that contain each text of ``count``."""

    def __init__(
        self, stream: asyncio.StreamReader, keep: int = 50, count: tuple[str, ...] = ()
    ) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self.counts = dict.fromkeys(count, 0)
        self._stream = stream
        self._changed = asyncio.Event()
        self.closed = False
        self._task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while line := await self._stream.readline():
                text = line.decode(errors="replace").rstrip()
                self.lines.append(text)
                for wanted in self.counts:
                    self.counts[wanted] += wanted in text
                self._changed.set()
        finally:
            self.closed = True
            self._changed.set()

    def tail(self) -> str:
        return "last output:\n  " + "\n  ".join(self.lines) if self.lines else "no output"

    async def line_with(self, text: str, seconds: float, what: str) -> str:
        """The first kept line containing ``text``; :class:`BenchTimeout` after ``seconds``."""

        async def wait() -> str:
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                if self.closed:
                    raise BenchTimeout(f"{what}: the process ended first; {self.tail()}")
                self._changed.clear()
                await self._changed.wait()

        return await within(wait(), seconds, what, self.tail())

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def stop_process(
    proc: asyncio.subprocess.Process, what: str, grace: float = 10.0, *, fail: bool = True
) -> float:
    """SIGTERM ``proc`` and wait ``grace`` s; if it is still there, SIGKILL it and fail
    (with ``fail=False``: return ``inf`` instead, so a run's figures survive a slow exit).
    Returns the seconds from SIGTERM to its exit (0 when it had already exited)."""
    if proc.returncode is not None:
        return 0.0
    t0 = time.monotonic()
    proc.terminate()
    try:
        await within(proc.wait(), grace, f"{what} to exit after SIGTERM")
    except BenchTimeout:
        proc.kill()
        await within(proc.wait(), grace, f"{what} to exit after SIGKILL")
        if fail:
            raise
        return math.inf
    return time.monotonic() - t0
