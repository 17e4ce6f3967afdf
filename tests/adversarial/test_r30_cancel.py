"""Attacks on the cancellation helpers: ``cancel_and_wait`` (cancels the tasks and awaits
each; a cancellation of the caller during the wait is passed on to the task it waits for
and does not cut the caller's clean-up short) and ``_on_own_thread`` (asks work on its own
thread to stop again until the thread ends).

Each test bounds its own waits, so a regression fails it rather than hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest

from drahealth._aio import cancel_and_wait
from drahealth.core import StatusBuilder
from drahealth.kube import make_client
from drahealth.kube._leader import _on_own_thread
from drahealth.node._kubelet import KubeletMode

pytestmark = pytest.mark.timeout(20)


async def _slow_to_end(seconds: float, ended: list[str], name: str) -> None:
    try:
        await asyncio.sleep(60)
    finally:
        await asyncio.sleep(seconds)  # a clean-up that takes a while
        ended.append(name)


async def _ends_within(task: asyncio.Task[Any], seconds: float) -> bool:
    done, _ = await asyncio.wait([task], timeout=seconds)
    return task in done


# -- cancel_and_wait: what holds -----------------------------------------------------------


async def test_duplicate_entries_are_cancelled_and_awaited_once() -> None:
    ended: list[str] = []
    task = asyncio.create_task(_slow_to_end(0.05, ended, "dup"))
    await asyncio.sleep(0)
    await cancel_and_wait([task, None, task, task])
    assert task.done() and ended == ["dup"]


async def test_a_caller_under_timeout_stops_waiting_for_a_stubborn_task() -> None:
    """The timeout's cancellation is passed on to the task waited for: a bounded stop of
    a task whose clean-up outlasts the bound ends at the bound."""
    ended: list[str] = []
    task = asyncio.create_task(_slow_to_end(5.0, ended, "slow"))
    await asyncio.sleep(0)
    t0 = time.monotonic()
    async with asyncio.timeout(0.1):
        await cancel_and_wait([task])
    assert time.monotonic() - t0 < 2.0
    assert task.done() and ended == []  # its clean-up was cut at the bound


async def test_a_caller_cancelled_during_the_wait_goes_on_with_its_clean_up() -> None:
    """A stop() cancelled again while its tasks wind down runs its later steps; its
    ``cancelling()`` count still shows the request."""
    ended: list[str] = []
    task = asyncio.create_task(_slow_to_end(0.3, ended, "slow"))
    await asyncio.sleep(0)
    steps: list[str] = []

    async def stop() -> int:
        await cancel_and_wait([task])
        steps.append("after")
        current = asyncio.current_task()
        return current.cancelling() if current is not None else -1

    caller = asyncio.create_task(stop())
    await asyncio.sleep(0.02)
    caller.cancel()
    assert await _ends_within(caller, 3)
    assert steps == ["after"] and caller.result() == 1


async def test_a_task_failing_while_cancelled_does_not_leak_its_exception() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise RuntimeError("logged elsewhere") from None

    task = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    await cancel_and_wait([task])
    assert isinstance(task.exception(), RuntimeError)


# -- cancel_and_wait: what breaks --------------------------------------------------------


async def test_cancel_and_wait_given_the_callers_own_task_returns() -> None:
    async def stops_itself() -> None:
        await cancel_and_wait([asyncio.current_task()])

    task = asyncio.create_task(stops_itself())
    try:
        ended = await _ends_within(task, 0.5)
        if not ended:
            task.cancel()  # what a supervisor would do next: it does not help either
            ended = await _ends_within(task, 0.5)
        assert ended
    finally:
        _abandon(task)
        await asyncio.wait([task], timeout=1)
        if task.done() and not task.cancelled():
            task.exception()


async def test_a_task_that_dropped_the_cancel_gets_the_callers_next_one() -> None:
    """A task that drops one cancellation (the 3.11 ``wait_for`` race in a library, a
    ``suppress(CancelledError)`` around an ``await task`` in a clean-up) ended, with the
    old ``await task``, on the next cancellation of the caller, which was passed on to
    it. Now the caller's cancellation (here its ``asyncio.timeout``) is held back until
    the task ends, and the task is never asked again: nothing can stop the caller."""
    dropped = asyncio.Event()

    async def drops_one() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            dropped.set()  # lost, as the race loses it
        await asyncio.sleep(60)  # a second request would end it here

    task = asyncio.create_task(drops_one())
    await asyncio.sleep(0)

    async def bounded_stop() -> str:
        try:
            async with asyncio.timeout(0.2):
                await cancel_and_wait([task])
        except TimeoutError:
            return "timed out"
        return "stopped"

    caller = asyncio.create_task(bounded_stop())
    try:
        assert await _ends_within(caller, 1.5), "the bounded stop did not end"
        assert dropped.is_set()
    finally:
        task.cancel()
        await asyncio.wait([task, caller], timeout=1)


def _abandon(task: asyncio.Task[Any]) -> None:
    """End a task stuck in ``asyncio.wait`` on itself: its wait fails (a cancellation
    would be taken and waited out again), so the loop can close after the test."""
    waiter = getattr(task, "_fut_waiter", None)
    if not task.done() and waiter is not None and not waiter.done():
        waiter.set_exception(RuntimeError("abandoned by the test"))


async def test_a_cancelled_kubelet_stop_still_stops_what_comes_after_its_tasks() -> None:
    """A stop() cancelled while its tasks wind down goes on to its next steps (a
    CancelledError out of ``cancel_and_wait`` would skip them all). The remedy
    controller's round clean-up has the same shape (outcomes, aftercare's repair
    attempts and the reflectors are stopped after ``cancel_and_wait``)."""
    client = make_client(server_url="http://127.0.0.1:9")  # never contacted
    try:
        events = MagicMock()
        events.drain = AsyncMock()
        mode = KubeletMode(
            client, "n1", MagicMock(), MagicMock(), MagicMock(), StatusBuilder(), events
        )
        ended: list[str] = []
        mode._tasks = [asyncio.create_task(_slow_to_end(0.3, ended, "sync"))]
        run = MagicMock()
        run.kill = AsyncMock()
        mode.runs["uid-1"] = run
        await asyncio.sleep(0)
        stopper = asyncio.create_task(mode.stop())
        await asyncio.sleep(0.05)
        stopper.cancel()  # e.g. the process's main task cancelled on a second signal
        assert await _ends_within(stopper, 3)
        # the second cancellation reached the sync task (its own clean-up is cut): the
        # stop goes on with everything after it
        assert run.kill.await_count == 1, "the pod's containers were left running"
        assert events.drain.await_count == 1
    finally:
        await client.close()


# -- _on_own_thread ------------------------------------------------------------------------


class _Inner:
    """The work's loop and task, to end it from the test whatever happens."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.started = threading.Event()

    def enter(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.started.set()

    def stop(self) -> None:
        if self.loop is not None and self.task is not None:
            with contextlib.suppress(RuntimeError):  # already finished and closed
                self.loop.call_soon_threadsafe(self.task.cancel)


def _thread(name: str) -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.name == name), None)


async def _join(name: str, seconds: float) -> bool:
    thread = _thread(name)
    if thread is None:
        return True
    await asyncio.to_thread(thread.join, seconds)
    return not thread.is_alive()


async def test_own_thread_work_finishing_as_the_cancel_arrives_ends_cleanly() -> None:
    """The work returns (after blocking its loop) while the caller's cancellation is
    being passed on; the loop is closed under the repeated request: no error, the
    caller raises its CancelledError, the thread is gone."""
    inner = _Inner()

    async def blocks_then_returns(seconds: float) -> None:
        inner.enter()
        time.sleep(seconds)  # noqa: ASYNC251 - the request waits for the loop: meets the result

    caller = asyncio.create_task(_on_own_thread(blocks_then_returns, 0.3, "r30-finish"))
    await asyncio.to_thread(inner.started.wait, 2)
    caller.cancel()
    assert await _ends_within(caller, 3)
    assert caller.cancelled()
    assert await _join("r30-finish", 1)


async def test_own_thread_work_is_stopped_even_when_the_caller_is_cancelled_twice() -> None:
    inner = _Inner()
    dropped = threading.Event()

    async def drops_one(step: float) -> None:
        inner.enter()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            dropped.set()  # the first request lost
        await asyncio.sleep(5)  # renewing on; the next request ends it

    caller = asyncio.create_task(_on_own_thread(drops_one, 0.0, "r30-twice", repeat=0.5))
    try:
        await asyncio.to_thread(inner.started.wait, 2)
        caller.cancel()
        await asyncio.to_thread(dropped.wait, 2)
        caller.cancel()  # a second stop request while it waits for the thread
        assert await _ends_within(caller, 2)
        assert await _join("r30-twice", 1.5), "the work outlived its caller"
    finally:
        inner.stop()
        await _join("r30-twice", 3)


async def test_own_thread_work_gets_to_finish_its_bounded_clean_up() -> None:
    """The renew work closes its client in a ``finally`` bounded by ``retry_period``
    (seconds); a repeated request must wait that clean-up out, not cut it."""
    inner = _Inner()
    closed = threading.Event()

    async def with_clean_up(seconds: float) -> None:
        inner.enter()
        try:
            await asyncio.sleep(60)
        finally:
            async with asyncio.timeout(seconds):  # the work's own bound
                await asyncio.sleep(0.8)  # closing connections, flushing
            closed.set()

    caller = asyncio.create_task(_on_own_thread(with_clean_up, 2.0, "r30-cleanup"))
    try:
        await asyncio.to_thread(inner.started.wait, 2)
        caller.cancel()
        assert await _ends_within(caller, 3)
        assert closed.is_set(), "the clean-up was cut"
    finally:
        inner.stop()
        await _join("r30-cleanup", 3)
