"""Group commit of the checkpoint: changes made while a write runs share the next write,
nobody is told "durable" before a write holding their change returns, and a failed
write restores the last durable claims and fails everyone whose change is not on disk."""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from drahealth.driver._checkpoint import Checkpoint, CheckpointDevice, ClaimEntry, ClaimState
from drahealth.driver._commit import GroupCommit


def entry(device: str, state: ClaimState = ClaimState.PREPARE_STARTED) -> ClaimEntry:
    return ClaimEntry("default", device, state, (CheckpointDevice("node-1", device),))


def put(uid: str, value: ClaimEntry) -> Callable[[dict[str, ClaimEntry]], bool]:
    def change(state: dict[str, ClaimEntry]) -> bool:
        state[uid] = value
        return True

    return change


def nothing(_state: dict[str, ClaimEntry]) -> bool:
    return False


class GatedCheckpoint(Checkpoint):
    """A real checkpoint whose writes wait for ``release()`` and can be made to fail."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.started = threading.Event()
        self.written: list[bytes] = []
        self.fail: OSError | None = None

    def write(self, data: bytes) -> None:
        self.started.set()
        if not self.gate.wait(30):
            raise TimeoutError("the test never released the write")
        self.gate.clear()
        if self.fail is not None:
            raise self.fail
        super().write(data)
        self.written.append(data)

    async def release(self, futures: list[asyncio.Future[None]] | None = None) -> None:
        """Let one write through and wait until it returned."""
        await asyncio.wait_for(asyncio.to_thread(self.started.wait, 10), 15)
        self.started.clear()
        self.gate.set()
        if futures:
            await asyncio.wait_for(asyncio.wait(futures), 10)


async def test_changes_during_a_write_share_the_next_one(tmp_path: Path) -> None:
    cp = GatedCheckpoint(tmp_path / "cp.json")
    commit = GroupCommit(cp, {})
    first = commit.apply(put("u1", entry("gpu-1")))
    await asyncio.wait_for(asyncio.to_thread(cp.started.wait, 10), 15)  # write 1 runs
    later = [commit.apply(put(f"u{i}", entry(f"gpu-{i}"))) for i in (2, 3, 4)]
    # the in-use guard sees every change at once, durable or not
    assert set(commit.claims) == {"u1", "u2", "u3", "u4"}
    assert not first.done() and not any(f.done() for f in later)
    cp.started.set()  # already running: release it
    await cp.release([first])
    assert first.result() is None and not any(f.done() for f in later)
    assert set(commit.durable) == {"u1"}
    await cp.release(later)
    assert all(f.result() is None for f in later)
    assert commit.writes == 2 and len(cp.written) == 2
    assert set(Checkpoint(cp.path).load()) == {"u1", "u2", "u3", "u4"}


async def test_nothing_pending_is_durable_at_once_else_waits_for_the_write(
    tmp_path: Path,
) -> None:
    cp = GatedCheckpoint(tmp_path / "cp.json")
    commit = GroupCommit(cp, {})
    assert commit.apply(nothing).done()  # nothing to write
    changed = commit.apply(put("u1", entry("gpu-1")))
    await asyncio.wait_for(asyncio.to_thread(cp.started.wait, 10), 15)
    # a reader of the claims being written waits for that write, and only that one
    reader = commit.apply(nothing)
    assert not reader.done()
    cp.started.set()
    await cp.release([changed, reader])
    assert reader.result() is None and commit.writes == 1
    await commit.flush()
    assert commit.writes == 1


async def test_a_failed_write_restores_the_durable_claims_and_fails_every_waiter(
    tmp_path: Path,
) -> None:
    cp = GatedCheckpoint(tmp_path / "cp.json")
    start = {"u0": entry("gpu-0", ClaimState.PREPARE_COMPLETED)}
    commit = GroupCommit(cp, start)
    cp.fail = OSError(errno.ENOSPC, "No space left on device")
    first = commit.apply(put("u1", entry("gpu-1")))
    await asyncio.wait_for(asyncio.to_thread(cp.started.wait, 10), 15)
    second = commit.apply(put("u2", entry("gpu-2")))  # waits for the next write
    cp.started.set()
    await cp.release([first, second])
    for fut in (first, second):
        with pytest.raises(OSError, match="No space"):
            fut.result()
    assert commit.claims == start == commit.durable  # memory holds no more than the disk
    assert commit.writes == 0
    cp.fail = None
    again = commit.apply(put("u3", entry("gpu-3")))
    await cp.release([again])
    assert again.result() is None
    assert set(Checkpoint(cp.path).load()) == {"u0", "u3"}


async def test_a_cancelled_caller_does_not_stop_the_write(tmp_path: Path) -> None:
    cp = GatedCheckpoint(tmp_path / "cp.json")
    commit = GroupCommit(cp, {})
    durable = commit.apply(put("u1", entry("gpu-1")))
    waiter = asyncio.ensure_future(asyncio.shield(durable))
    await asyncio.sleep(0)
    waiter.cancel()
    await cp.release()
    await asyncio.wait_for(commit.flush(), 10)
    assert set(Checkpoint(cp.path).load()) == {"u1"}


async def test_reset_takes_loaded_claims_as_durable(tmp_path: Path) -> None:
    commit = GroupCommit(Checkpoint(tmp_path / "cp.json"), {})
    loaded = {"u9": entry("gpu-9", ClaimState.PREPARE_COMPLETED)}
    commit.reset(loaded)
    assert commit.claims == loaded == commit.durable
    assert commit.apply(nothing).done()
