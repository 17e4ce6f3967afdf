"""A full (or failing) disk under the embedded API server: loud, never destructive.

Failures are injected into the persistence layer's write primitive (ENOSPC, short
writes, writes that make no progress), in-process. The server must answer the write it
could not make durable with a 500 naming the data file and the OS error, keep nothing of
it, report ``/readyz`` 500 and the failure metrics, log the state change once, never
replace the last good data file, and resume by itself once writing works again.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from drahealth import _durable
from drahealth.controlplane import APIServer, _persist
from drahealth.controlplane._store import Store
from drahealth.controlplane._wal import Journal
from tests._support import eventually

PATH = "/api/v1/namespaces/default/configmaps"


def cm(name: str, size: int = 0) -> dict[str, Any]:
    data = {"pad": "x" * size} if size else {}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def on_disk(data: Path) -> set[str]:
    """ConfigMap names a crash right now would leave (snapshot + log)."""
    store = Store()
    assert Journal(store, data).load()
    return {o["metadata"]["name"] for o in store.objects("/configmaps")}


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_enospc_answers_500_rolls_back_reports_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "apiserver.json"
    real = _durable._write
    full = threading.Event()

    def write(fd: int, buf: Any) -> int:
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buf)

    monkeypatch.setattr(_durable, "_write", write)
    srv = APIServer(data_file=data)
    srv.persist_retry_interval = 0.05
    await srv.start()
    try:
        async with aiohttp.ClientSession(base_url=srv.url) as http:
            async with http.post(PATH, json=cm("a")) as r:
                assert r.status == 201
            full.set()
            caplog.set_level(logging.ERROR, logger="drahealth.controlplane._wal")
            for name in ("b", "c"):
                async with http.post(PATH, json=cm(name)) as r:
                    body = await r.json()
                    assert r.status == 500, body
                    assert str(data) in body["message"], body
                    assert "No space left on device" in body["message"], body
                async with http.get(f"{PATH}/{name}") as r:
                    assert r.status == 404  # not kept: nobody sees an object that would vanish
            async with http.get("/readyz") as r:
                assert r.status == 500 and "No space left on device" in await r.text()
            async with http.get("/metrics") as r:
                text = await r.text()
            assert metric(text, "drahealth_apiserver_persist_healthy") == 0
            assert metric(text, "drahealth_apiserver_persist_failures_total") >= 1
            failed = [r for r in caplog.records if "persistence failed" in r.getMessage()]
            assert len(failed) == 1, "the state change is logged once, not per write"
            assert on_disk(data) == {"a"}  # the last good files are intact

            full.clear()  # space comes back: the retry timer resumes service unaided

            async def ready() -> bool:
                async with http.get("/readyz") as r:
                    return r.status == 200

            await eventually(ready, 10, "/readyz to recover")
            async with http.post(PATH, json=cm("d")) as r:
                assert r.status == 201
            async with http.get("/metrics") as r:
                assert metric(await r.text(), "drahealth_apiserver_persist_healthy") == 1
    finally:
        await srv.stop()
    again = APIServer(data_file=data)
    await again.start()
    try:
        names = {o["metadata"]["name"] for o in again.store.objects("/configmaps")}
        assert names == {"a", "d"}
    finally:
        await again.stop()


async def test_short_writes_are_continued_and_no_progress_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "apiserver.json"
    real = _durable._write
    mode = {"limit": 7}

    def write(fd: int, buf: Any) -> int:
        if mode["limit"] == 0:
            return 0
        return real(fd, bytes(buf[: mode["limit"]]))

    monkeypatch.setattr(_durable, "_write", write)
    srv = APIServer(data_file=data)
    await srv.start()
    try:
        async with aiohttp.ClientSession(base_url=srv.url) as http:
            async with http.post(PATH, json=cm("a")) as r:
                assert r.status == 201  # written 7 bytes at a time, completely
            assert on_disk(data) == {"a"}
            mode["limit"] = 0
            async with http.post(PATH, json=cm("b")) as r:
                body = await r.json()
                assert r.status == 500 and "short write" in body["message"], body
            assert on_disk(data) == {"a"}
            mode["limit"] = 1 << 30
    finally:
        await srv.stop()
    assert on_disk(data) == {"a"}


async def test_a_failed_snapshot_never_replaces_the_data_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "apiserver.json"
    real = _durable._write
    snapshot_threads: list[str] = []
    fail_snapshots = threading.Event()

    def write(fd: int, buf: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
            snapshot_threads.append(threading.current_thread().name)
            if fail_snapshots.is_set():
                real(fd, bytes(buf[: len(buf) // 2]))  # half of it, then the disk is full
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buf)

    monkeypatch.setattr(_durable, "_write", write)
    srv = APIServer(data_file=data)
    srv.persist_compact_bytes = 1  # compact whenever the log outgrows the snapshot
    await srv.start()
    snapshot_threads.clear()  # the first snapshot is written at start, before serving
    try:
        async with aiohttp.ClientSession(base_url=srv.url) as http:
            async with http.post(PATH, json=cm("a", 8192)) as r:
                assert r.status == 201

            async def compacted() -> bool:
                loaded = _persist.load(data)
                assert loaded is not None
                return any(o["metadata"]["name"] == "a" for o in loaded[1].get("/configmaps", []))

            await eventually(compacted, 10, "a compaction")
            assert snapshot_threads
            assert threading.main_thread().name not in snapshot_threads  # off the loop
            good = data.read_bytes()
            fail_snapshots.set()
            snapshot_threads.clear()
            async with http.post(PATH, json=cm("b", 16384)) as r:
                assert r.status == 201  # the log took it: acknowledged and durable

            async def tried() -> bool:
                return bool(snapshot_threads)

            await eventually(tried, 10, "a compaction attempt")
            assert data.read_bytes() == good
            assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
            assert on_disk(data) == {"a", "b"}
            async with http.get("/readyz") as r:
                assert r.status == 200  # the log still works: writes stay durable
            fail_snapshots.clear()
    finally:
        await srv.stop()
    assert on_disk(data) == {"a", "b"}
