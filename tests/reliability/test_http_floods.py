"""Slowloris, connection floods, log floods and cross-site requests against our HTTP servers.

The flood tests run each server (the API server, the dashboard, a ``/metrics`` endpoint)
in a worker process (``_http_flood_worker``) with the usual soft descriptor limit of
1024, open ``FLOOD`` connections that send part of a request head and never finish it,
and check that a real request still gets through within seconds, that the server closes
every flood connection within the header timeout plus a margin, and that it logs only a
bounded number of lines meanwhile. The other tests run the servers in-process: the Host
and Origin checks (DNS rebinding, cross-site requests; kubectl-like requests pass), the
connection cap with requests in flight, and the log rate limit.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from lightkube import AsyncClient
from prometheus_client import CollectorRegistry

from drahealth._http_guard import HTTPGuard, HTTPLimits, RateLimitFilter
from drahealth._metrics_http import MetricsServer
from drahealth.controlplane import APIServer
from drahealth.kube import make_client
from drahealth.web import Dashboard

ROOT = Path(__file__).resolve().parents[2]
FLOOD = 1100
HEADER_TIMEOUT = 1.0
CLOSE_MARGIN = 4.0
MAX_LOG_LINES = 20
PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
TOKEN = "0123456789abcdef-token"


@pytest.fixture
def many_fds() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if want < 2500:
        pytest.skip(f"the descriptor hard limit {hard} is too low for a {FLOOD}-socket flood")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _start_worker(kind: str, stderr_path: Path) -> tuple[subprocess.Popen[str], int]:
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability._http_flood_worker", kind,
             str(HEADER_TIMEOUT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=30):
            proc.kill()
            raise AssertionError(f"the {kind} worker did not start within 30 s")
    line = proc.stdout.readline().split()
    assert line[:1] == ["ready"], f"the {kind} worker failed: {stderr_path.read_text()[-2000:]}"
    return proc, int(line[1])


def _stop_worker(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _flood(port: int) -> list[socket.socket]:
    """Open ``FLOOD`` connections at once, each sending part of a request head."""
    socks: list[socket.socket] = []
    with selectors.DefaultSelector() as sel:
        for _ in range(FLOOD):
            s = socket.socket()
            socks.append(s)
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            sel.register(s, selectors.EVENT_WRITE)
        pending, deadline = FLOOD, time.monotonic() + 20
        while pending and (wait := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(timeout=wait):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                sel.unregister(ready)
                pending -= 1
                if ready.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    ready.send(PARTIAL)
    if pending:
        for s in socks:
            s.close()
        raise AssertionError(f"{pending} of {FLOOD} flood connections did not connect in 20s")
    return socks


def _still_open(socks: list[socket.socket], deadline: float) -> int:
    """Wait until the server has closed every socket or ``deadline``; return how many not."""
    left = len(socks)
    with selectors.DefaultSelector() as sel:
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        while left and (wait := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(timeout=wait):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                try:
                    data = ready.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(ready)
                    left -= 1
    return left


def _get(port: int, path: str, timeout: float) -> tuple[int, float]:
    began = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        status = conn.getresponse().status
    except OSError as e:
        took = time.monotonic() - began
        raise AssertionError(f"GET {path} failed after {took:.1f}s: {e!r}") from None
    finally:
        conn.close()
    return status, time.monotonic() - began


@pytest.mark.parametrize("kind", ["apiserver", "dashboard", "metrics"])
def test_a_slowloris_flood_neither_locks_out_clients_nor_floods_the_log(
    kind: str, many_fds: None, tmp_path: Path
) -> None:
    log_file = tmp_path / "stderr.log"
    proc, port = _start_worker(kind, log_file)
    socks: list[socket.socket] = []
    try:
        baseline = len(log_file.read_text().splitlines())
        socks = _flood(port)
        flooded = time.monotonic()
        status, took = _get(port, "/healthz", timeout=5.0)
        assert status == 200, f"{kind}: GET /healthz during the flood answered {status}"
        left = _still_open(socks, flooded + HEADER_TIMEOUT + CLOSE_MARGIN)
        lines = log_file.read_text().splitlines()[baseline:]
        problems = []
        if left:
            problems.append(
                f"{left} of {FLOOD} connections that never finished their request head were "
                f"still open {HEADER_TIMEOUT + CLOSE_MARGIN}s after the flood"
            )
        if len(lines) > MAX_LOG_LINES:
            problems.append(f"{len(lines)} log lines during the flood, e.g. {lines[:3]}")
        assert not problems, f"{kind}: " + "; ".join(problems)
        print(f"{kind}: request during a {FLOOD}-connection flood took {took * 1000:.0f} ms; "
              f"{len(lines)} log lines")  # fmt: skip
    finally:
        for s in socks:
            s.close()
        _stop_worker(proc)


# -- in-process: the cap, the timeout --------------------------------------------------


async def _open_partial(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(PARTIAL)
    await writer.drain()
    return reader, writer


async def _closed(reader: asyncio.StreamReader, within: float, what: str) -> bytes:
    """Read until the server closes; fail naming ``what`` after ``within`` seconds."""
    try:
        async with asyncio.timeout(within):
            data = b""
            while chunk := await reader.read(4096):
                data += chunk
            return data
    except ConnectionResetError:
        return b""
    except TimeoutError:
        raise AssertionError(f"{what} still open after {within}s") from None


async def test_over_the_cap_the_oldest_idle_connection_is_shed() -> None:
    metrics = MetricsServer(CollectorRegistry(), limits=HTTPLimits(max_connections=4))
    await metrics.start()
    try:
        idle = [await _open_partial(metrics.port) for _ in range(4)]
        async with aiohttp.ClientSession() as http, http.get(metrics.url) as resp:
            assert resp.status == 200
        await _closed(idle[0][0], 2.0, "the oldest idle connection")
        for _, writer in idle:
            writer.close()
    finally:
        await metrics.stop()


async def test_the_header_timeout_closes_a_connection_that_never_finishes_its_head() -> None:
    metrics = MetricsServer(CollectorRegistry(), limits=HTTPLimits(header_timeout=0.3))
    await metrics.start()
    try:
        reader, writer = await _open_partial(metrics.port)
        began = time.monotonic()
        await _closed(reader, 3.0, "a connection with a partial request head")
        assert time.monotonic() - began >= 0.2
        writer.close()
    finally:
        await metrics.stop()


async def test_when_every_connection_serves_a_request_a_new_one_gets_503() -> None:
    server = APIServer(limits=HTTPLimits(max_connections=3))
    await server.start()
    writers = []
    try:
        # Watches are capped below the connection cap, so requests whose bodies never
        # come fill the connections: every one is serving a request.
        for _ in range(3):
            _r, w = await asyncio.open_connection("127.0.0.1", server.port)
            w.write(
                b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            )
            await w.drain()
            writers.append(w)
        await asyncio.sleep(0.2)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            async with http.get(server.url + "/version") as resp:
                assert resp.status == 503
            async with http.get(server.url + "/healthz") as resp:
                assert resp.status == 200  # health always answers
    finally:
        for w in writers:
            w.close()
        await server.stop()


# -- Host and Origin -------------------------------------------------------------------


@pytest.fixture
async def kube(server: APIServer) -> AsyncIterator[AsyncClient]:
    client = make_client(server_url=server.url, timeout=5.0)
    try:
        yield client
    finally:
        await client.close()


async def _status(
    method: str, url: str, headers: dict[str, str], body: bytes | None = None
) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url, headers=headers, data=body) as resp,
    ):
        return resp.status, await resp.text()


NS = b'{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"%s"}}'


async def test_api_server_refuses_foreign_host_and_cross_origin_writes(
    server: APIServer,
) -> None:
    url = server.url + "/api/v1/namespaces"
    own = f"127.0.0.1:{server.port}"
    json_type = {"Content-Type": "application/json"}
    # DNS rebinding: a name that resolves to 127.0.0.1 but is not ours.
    code, text = await _status("GET", url, {"Host": f"evil.example:{server.port}"})
    assert code == 403 and "evil.example" in text
    code, _ = await _status(
        "POST", url, {**json_type, "Host": own, "Origin": "http://evil.example"}, NS % b"x1"
    )
    assert code == 403
    code, _ = await _status("POST", url, {**json_type, "Host": own, "Origin": "null"}, NS % b"x2")
    assert code == 403
    # kubectl and lightkube: no Origin, Host 127.0.0.1:PORT (or localhost / [::1]).
    code, _ = await _status("POST", url, {**json_type, "Host": own}, NS % b"ok1")
    assert code == 201
    for host in (f"localhost:{server.port}", f"[::1]:{server.port}", "LOCALHOST"):
        code, _ = await _status("GET", url, {"Host": host})
        assert code == 200, host
    # The server's own origin may write (a page it served itself).
    code, _ = await _status(
        "POST", url, {**json_type, "Host": own, "Origin": f"http://{own}"}, NS % b"ok2"
    )
    assert code == 201
    # A cross-origin read is not refused here (the browser's CORS keeps the answer away).
    code, _ = await _status("GET", url, {"Host": own, "Origin": "http://evil.example"})
    assert code == 200


async def test_lightkube_keeps_working(kube: AsyncClient) -> None:
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace

    await kube.create(Namespace(metadata=ObjectMeta(name="lk")))
    assert (await kube.get(Namespace, "lk")).metadata.name == "lk"  # type: ignore[union-attr]


async def test_dashboard_refuses_foreign_host_and_cross_origin_actions(
    kube: AsyncClient,
) -> None:
    dashboard = Dashboard(kube, token=TOKEN)
    url = await dashboard.start()
    try:
        port = url.rstrip("/").rsplit(":", 1)[1]
        auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        code, _ = await _status("GET", url + "healthz", {"Host": f"evil.example:{port}"})
        assert code == 403
        body = b'{"device": "d/p/gpu-0", "key": "k"}'
        code, text = await _status(
            "POST", url + "api/untaint", {**auth, "Origin": "http://evil.example"}, body
        )
        assert code == 403 and "cross-origin" in text
        # Same request without Origin, or from the dashboard's own page, reaches the handler.
        for extra in ({}, {"Origin": f"http://127.0.0.1:{port}"}):
            code, text = await _status("POST", url + "api/untaint", {**auth, **extra}, body)
            assert code != 403, text
    finally:
        await dashboard.stop()


async def test_metrics_refuses_a_foreign_host() -> None:
    metrics = MetricsServer(CollectorRegistry())
    await metrics.start()
    try:
        code, _ = await _status("GET", metrics.url, {"Host": "evil.example"})
        assert code == 403
        code, _ = await _status("GET", metrics.url, {"Host": f"127.0.0.1:{metrics.port}"})
        assert code == 200
    finally:
        await metrics.stop()


def test_host_policy_follows_the_bind_address_and_allowed_hosts() -> None:
    loopback = HTTPGuard("127.0.0.1")
    assert loopback.host_allowed("localhost") and loopback.host_allowed("::1")
    assert not loopback.host_allowed("evil.example")
    assert not loopback.host_allowed("127.0.0.1.evil.example")
    # In-cluster (bound to all addresses or a pod IP): any Host, as Go servers do ...
    assert HTTPGuard("0.0.0.0").host_allowed("drahealth.kube-system.svc")
    assert HTTPGuard("10.1.2.3").host_allowed("10.1.2.3")
    # ... unless the hosts are listed.
    listed = HTTPGuard("0.0.0.0", allowed_hosts=["drahealth.example", "10.1.2.3"])
    assert listed.host_allowed("drahealth.example") and listed.host_allowed("10.1.2.3")
    assert listed.host_allowed("127.0.0.1") and not listed.host_allowed("evil.example")
    assert HTTPGuard("127.0.0.1", allowed_hosts=["dev.local"]).host_allowed("dev.local")
    with pytest.raises(ValueError, match="not a host name"):
        HTTPGuard("127.0.0.1", allowed_hosts=["http://x/"])
    with pytest.raises(ValueError, match="max_connections"):
        HTTPLimits(max_connections=0)


# -- logging ---------------------------------------------------------------------------


def _record(msg: str, *args: object, name: str = "aiohttp.server") -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


def test_the_log_filter_passes_a_burst_then_one_note_then_a_count() -> None:
    now = [0.0]
    f = RateLimitFilter(burst=10, per_seconds=10.0)
    f.clock = lambda: now[0]
    passed = [r for r in (_record("Error handling request from %s", i) for i in range(1000))
              if f.filter(r)]  # fmt: skip
    assert len(passed) == 11
    assert "similar messages suppressed" in passed[-1].getMessage()
    # Another template and another logger have buckets of their own.
    assert f.filter(_record("something else"))
    assert f.filter(_record("Error handling request from %s", 1, name="aiohttp.access"))
    # After the bucket refills, the next record carries the count of those dropped.
    now[0] = 1.0
    record = _record("Error handling request from %s", 5)
    assert f.filter(record)
    assert record.getMessage() == "[989 similar messages suppressed] Error handling request from 5"


def test_the_log_filter_bounds_its_buckets() -> None:
    f = RateLimitFilter(max_keys=8)
    for i in range(100):
        assert f.filter(_record(f"distinct message {i}"))
    assert len(f._buckets) == 8


def test_the_log_filter_is_installed_by_the_servers(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        metrics = MetricsServer(CollectorRegistry())
        await metrics.start()
        await metrics.stop()

    asyncio.run(run())
    logger = logging.getLogger("aiohttp.server")
    with caplog.at_level(logging.ERROR, logger="aiohttp.server"):
        for i in range(500):
            logger.error("Error handling request %d", i)
    assert 1 <= len(caplog.records) <= 12


@pytest.mark.parametrize("command", ["apiserver", "dashboard"])
@pytest.mark.parametrize("bad", ["http://evil.example", "evil.example:8080", "a/b", ""])
def test_a_bad_allowed_host_is_a_usage_error(command: str, bad: str) -> None:
    from click.testing import CliRunner

    from drahealth.cli import main

    result = CliRunner().invoke(main, [command, "--allowed-host", bad])
    assert result.exit_code == 2, result.output
    assert "--allowed-host" in result.output and "not a host name" in result.output
