"""What the round-three review of the embedded API server left: the pod-log proxy holds
no answer whole, honours ``limitBytes`` and bounds concurrent requests and where it
connects; ``timeoutSeconds`` is parsed as Go's ``strconv.ParseInt``; and every kind of
damage to the write-ahead log or the data file stops the server with one error naming
the file (and the offset, for records), never a traceback, a hang or an endless read,
while only a torn last append is cut off.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from drahealth.controlplane import APIServer, _podlog, _wal
from drahealth.controlplane._persist import DataFileError
from drahealth.controlplane._resources import lookup
from drahealth.controlplane._store import Store
from drahealth.controlplane._wal import Journal, log_path

pytestmark = pytest.mark.timeout(90)

JSON = dict[str, Any]
PODS = "/api/v1/namespaces/default/pods"
POD_KEY = lookup("", "v1", "pods").key  # type: ignore[union-attr]
ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- the log proxy


class Kubelet:
    """A fake kubelet whose ``/containerLogs`` answer the test scripts."""

    def __init__(self) -> None:
        self.first = b"a" * (200 * 1024)
        self.rest = b"b" * (100 * 1024)
        self.release = asyncio.Event()
        self.entered = 0
        self.port = 0
        self.hold = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.entered += 1
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(self.first)  # limitBytes is ignored on purpose
        if self.hold:
            async with asyncio.timeout(20):
                await self.release.wait()
        await resp.write(self.rest)
        await resp.write_eof()
        return resp


@pytest.fixture
async def kubelet() -> AsyncIterator[Kubelet]:
    k = Kubelet()
    app = web.Application()
    app.router.add_get("/containerLogs/{ns}/{pod}/{c}", k.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    k.port = int(runner.addresses[0][1])
    try:
        yield k
    finally:
        k.release.set()
        await runner.cleanup()


async def _bind(server: APIServer, http: aiohttp.ClientSession, port: int) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        },
    }
    async with http.post("/api/v1/nodes", json=node) as r:
        assert r.status == 201, await r.text()
    server.store.create(
        POD_KEY,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "u-p"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
            "status": {"phase": "Running"},
        },
    )


async def test_pod_log_is_streamed_not_held_whole(server: APIServer, kubelet: Kubelet) -> None:
    """The client gets the first bytes while the kubelet is still writing."""
    kubelet.hold = True
    async with aiohttp.ClientSession(base_url=server.url) as http:
        await _bind(server, http, kubelet.port)
        async with http.get(f"{PODS}/p/log") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain")
            async with asyncio.timeout(8):
                first = await r.content.readexactly(len(kubelet.first))
            assert first == kubelet.first
            kubelet.release.set()
            rest = await r.content.read()
        assert rest == kubelet.rest


async def test_pod_log_honours_limit_bytes_when_the_kubelet_does_not(
    server: APIServer, kubelet: Kubelet
) -> None:
    async with aiohttp.ClientSession(base_url=server.url) as http:
        await _bind(server, http, kubelet.port)
        async with http.get(f"{PODS}/p/log?limitBytes=1000") as r:
            body = await r.read()
        assert r.status == 200 and body == b"a" * 1000
        async with http.get(f"{PODS}/p/log") as r:
            body = await r.read()
        assert len(body) == len(kubelet.first) + len(kubelet.rest)


async def test_pod_log_requests_are_bounded(
    server: APIServer, kubelet: Kubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_podlog, "MAX_CONCURRENT_LOGS", 2, raising=False)
    kubelet.hold = True
    async with aiohttp.ClientSession(base_url=server.url) as http:
        await _bind(server, http, kubelet.port)
        held = [await http.get(f"{PODS}/p/log") for _ in range(2)]
        try:
            assert [r.status for r in held] == [200, 200]
            async with http.get(f"{PODS}/p/log") as r:
                body = await r.json()
                assert r.status == 429, body
                assert r.headers["Retry-After"] == "1"
            assert kubelet.entered == 2
        finally:
            kubelet.release.set()
            for r in held:
                await r.read()
                r.release()
        async with http.get(f"{PODS}/p/log") as r:  # the slots are free again
            assert r.status == 200
            await r.read()


@pytest.mark.parametrize("which", ["own", "privileged"])
async def test_pod_log_never_proxies_to_itself_or_a_privileged_port(
    server: APIServer, which: str
) -> None:
    port = server.port if which == "own" else 22
    async with aiohttp.ClientSession(base_url=server.url) as http:
        await _bind(server, http, port)
        async with http.get(f"{PODS}/p/log") as r:
            body = await r.json()
    assert r.status == 500 and f"kubelet port {port} is refused" in body["message"], body


# --------------------------------------------------------------------------- timeoutSeconds


@pytest.mark.parametrize("raw", ["%205", "5%20", "%2B%205", "1_0", "%2B", "-", "0x10"])
async def test_timeout_seconds_takes_no_spaces(server: APIServer, raw: str) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{server.url}/api/v1/configmaps?watch=1&timeoutSeconds={raw}") as r,
    ):
        body = await r.json()
    assert r.status == 400 and "timeoutSeconds" in body["message"], (raw, body)


@pytest.mark.parametrize("raw", ["-1", "%2B1", "0001", "-9223372036854775808"])
async def test_timeout_seconds_as_strconv_parses_it(server: APIServer, raw: str) -> None:
    """Upstream accepts a sign and leading zeros; a negative value ends the watch at once."""
    async with aiohttp.ClientSession() as http:
        async with asyncio.timeout(10):
            async with http.get(
                f"{server.url}/api/v1/configmaps?watch=1&timeoutSeconds={raw}"
            ) as r:
                assert r.status == 200, await r.text()
                await r.read()  # the watch ends by itself


# --------------------------------------------------------------------------- the data files


def _line(body: bytes) -> bytes:
    return b"%08x " % zlib.crc32(body) + body + b"\n"


async def _journal_with_three(data: Path) -> list[bytes]:
    store = Store()
    journal = Journal(store, data)
    assert not journal.load()
    journal.start()
    for name in "abc":
        store.create("/configmaps", {"metadata": {"name": name, "namespace": "ns"}})
    await journal.wait(store.rv)
    journal._log.close()  # type: ignore[union-attr]
    return log_path(data).read_bytes().splitlines(keepends=True)


def _deep(lines: list[bytes], wal: Path) -> None:
    wal.write_bytes(b"".join(lines) + _line(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"))


def _gap(lines: list[bytes], wal: Path) -> None:
    wal.write_bytes(b"".join([lines[0], lines[1], lines[3]]))


def _gap_at_start(lines: list[bytes], wal: Path) -> None:
    wal.write_bytes(b"".join([lines[0], lines[3]]))


def _repeat(lines: list[bytes], wal: Path) -> None:
    wal.write_bytes(b"".join([*lines, lines[-1]]))


def _not_an_object(lines: list[bytes], wal: Path) -> None:
    wal.write_bytes(b"".join(lines) + _line(b"[1, 2]"))


def _garbage_json(lines: list[bytes], wal: Path) -> None:
    wal.write_bytes(b"".join(lines) + _line(b"{not json"))


def _overlong(lines: list[bytes], wal: Path) -> None:
    wal.write_bytes(b"".join(lines) + b"x" * 10_000 + b"\n")


def _overlong_torn(lines: list[bytes], wal: Path) -> None:
    wal.write_bytes(b"".join(lines) + b"x" * 10_000)


END = -1  # the damage is a record appended after the good ones
DAMAGE: dict[str, tuple[Callable[[list[bytes], Path], None], int, str]] = {
    # case: (damage, good lines before the bad one, what the error says)
    "deep-nesting": (_deep, END, "record is nested too deeply"),
    "gap": (_gap, 2, "resourceVersion 3 does not follow 1"),
    "gap-at-start": (_gap_at_start, 1, "the first record is resourceVersion 3"),
    "repeat": (_repeat, END, "resourceVersion 3 does not follow 3"),
    "not-an-object": (_not_an_object, END, "record is a JSON list"),
    "garbage-json": (_garbage_json, END, "record is not valid JSON"),
    "overlong": (_overlong, END, "a record longer than 4096 bytes"),
    "overlong-torn": (_overlong_torn, END, "a record longer than 4096 bytes"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
async def test_log_damage_is_one_error_naming_file_and_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    if case.startswith("overlong"):
        monkeypatch.setattr(_wal, "MAX_RECORD_BYTES", 4096, raising=False)
    data = tmp_path / "d.json"
    lines = await _journal_with_three(data)
    damage, good, text = DAMAGE[case]
    wal = log_path(data)
    damage(lines, wal)
    offset = sum(len(x) for x in (lines if good == END else lines[:good]))
    number = (len(lines) if good == END else good) + 1
    expected = f"line {number} at offset {offset}: {text}"
    before = wal.read_bytes()
    with pytest.raises(DataFileError) as info:
        Journal(Store(), data).load()
    message = str(info.value)
    assert str(wal) in message and expected in message, message
    assert wal.read_bytes() == before, "damage is never cut"


def _as_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _as_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _as_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def _as_dangling(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.with_name("unmounted") / "d")


REPLACED = {
    "directory": (_as_dir, "is a directory, not a regular file"),
    "fifo": (_as_fifo, "is a FIFO, not a regular file"),
    "dev-zero": (_as_zero, "is a character device, not a regular file"),
    "dangling-symlink": (_as_dangling, "is a symlink to a missing file"),
}


@pytest.mark.parametrize("which", ["log", "data"])
@pytest.mark.parametrize("case", sorted(REPLACED))
async def test_a_file_replaced_by_a_non_file_fails_at_once(
    tmp_path: Path, case: str, which: str
) -> None:
    data = tmp_path / "d.json"
    await _journal_with_three(data)
    target = log_path(data) if which == "log" else data
    replace, expected = REPLACED[case]
    replace(target)
    with pytest.raises(DataFileError) as info:
        async with asyncio.timeout(10):  # a FIFO must not block, /dev/zero not be read
            await asyncio.to_thread(Journal(Store(), data).load)
    assert str(target) in str(info.value) and expected in str(info.value), str(info.value)


async def test_a_crash_inside_a_batch_keeps_the_complete_records_and_cuts_the_rest(
    tmp_path: Path,
) -> None:
    data = tmp_path / "d.json"
    lines = await _journal_with_three(data)
    wal = log_path(data)
    wal.write_bytes(b"".join(lines[:2]) + lines[2][:-10])  # record 1 durable, 2 torn, 3 lost
    store = Store()
    journal = Journal(store, data)
    assert journal.load() and journal.torn_bytes == len(lines[2]) - 10
    assert store.rv == 1 and [o["metadata"]["name"] for o in store.objects("/configmaps")] == ["a"]
    journal.start()
    assert wal.read_bytes() == b"".join(lines[:2])
    journal._log.close()  # type: ignore[union-attr]


async def test_a_torn_snapshot_names_file_and_offset(tmp_path: Path) -> None:
    data = tmp_path / "d.json"
    store = Store()
    for name in "abc":
        store.create("/configmaps", {"metadata": {"name": name, "namespace": "ns"}})
    journal = Journal(store, data)
    journal.start()  # the snapshot holds a, b, c
    journal._log.close()  # type: ignore[union-attr]
    raw = data.read_bytes()
    data.write_bytes(raw[:-7])
    last_start = raw.rstrip(b"\n").rfind(b"\n") + 1
    with pytest.raises(DataFileError) as info:
        Journal(Store(), data).load()
    assert f"truncated at offset {last_start}" in str(info.value), str(info.value)
    lines = raw.splitlines(keepends=True)
    nested = _line(b'{"key": "/configmaps", "object": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    data.write_bytes(b"".join([lines[0], lines[1], nested, lines[3]]))
    with pytest.raises(DataFileError) as info:
        Journal(Store(), data).load()
    offset = len(lines[0]) + len(lines[1])
    assert f"line 3 at offset {offset}: record is nested too deeply" in str(info.value)
    data.write_bytes(b"[" * 100_000 + b"]" * 100_000)  # the version-1 reader too
    with pytest.raises(DataFileError, match="nested too deeply"):
        Journal(Store(), data).load()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only files")
async def test_a_read_only_log_stops_the_start_with_its_name(tmp_path: Path) -> None:
    data = tmp_path / "d.json"
    await _journal_with_three(data)
    log_path(data).chmod(0o400)
    journal = Journal(Store(), data)
    assert journal.load()
    with pytest.raises(DataFileError) as info:
        journal.start()
    assert str(log_path(data)) in str(info.value), str(info.value)


async def test_the_command_stops_with_one_line_for_a_fifo_log(tmp_path: Path) -> None:
    data = tmp_path / "d.json"
    await _journal_with_three(data)
    _as_fifo(log_path(data))
    command = [sys.executable, "-c", "from drahealth.cli import main; main()", "apiserver"]
    proc = await asyncio.to_thread(
        subprocess.run,
        [*command, "--port", "0", "--data", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert f"{log_path(data)}: the log is a FIFO, not a regular file" in proc.stderr
