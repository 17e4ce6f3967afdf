"""Round three against the embedded API server: the log proxy, the log's last record,
the ReplicaSet stand-in, watch and connection limits, managedFields, the watch window
in bytes, ``timeoutSeconds``, long query strings and dot path segments.

Every test talks to a real ``APIServer`` on 127.0.0.1 (port 0), or to its journal or
store directly, and checks the server answers with the upstream status (never a 500
or a traceback) and stays serviceable afterwards.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from drahealth._http_guard import HTTPLimits
from drahealth.controlplane import APIServer, ControlPlane
from drahealth.controlplane._persist import DataFileError
from drahealth.controlplane._resources import lookup
from drahealth.controlplane._store import Store
from drahealth.controlplane._wal import Journal, log_path
from tests._support import eventually

pytestmark = pytest.mark.timeout(90)

JSON = dict[str, Any]
CMS = "/api/v1/namespaces/default/configmaps"
PODS = "/api/v1/namespaces/default/pods"
SETS = "/apis/apps/v1/namespaces/default/replicasets"
POD_KEY = lookup("", "v1", "pods").key  # type: ignore[union-attr]


@pytest.fixture
def api_server_options() -> dict[str, Any]:
    return {"bookmark_interval": 60.0}


@pytest.fixture
async def http(server: APIServer) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=server.url) as session:
        yield session


async def call(
    http: aiohttp.ClientSession, method: str, path: str, body: Any = None, **headers: str
) -> tuple[int, Any]:
    hdrs = {"Content-Type": "application/json", **headers}
    data = None if body is None else json.dumps(body)
    async with http.request(method, path, data=data, headers=hdrs) as r:
        text = await r.text()
        return r.status, (json.loads(text) if text[:1] in ("{", "[") else text)


async def raw_status(port: int, request: bytes) -> tuple[int, bytes]:
    """Send one raw request; the status code and the first bytes of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(10):
            head = await reader.read(4096)
    finally:
        writer.close()
    if not head:
        return 0, b""
    return int(head.split(b" ", 2)[1]), head


def get(path: str, **headers: str) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n".encode()


# --------------------------------------------------------------------------- bug 10


@pytest.fixture
async def kubelet() -> AsyncIterator[tuple[int, int, list[str]]]:
    """A fake kubelet and a second loopback service; (kubelet port, other port, paths)."""
    seen: list[str] = []

    async def any_path(request: web.Request) -> web.StreamResponse:
        seen.append(request.raw_path)
        if request.path.startswith("/containerLogs/default/p/redir"):
            raise web.HTTPFound(f"http://127.0.0.1:{other_port}/stolen")
        if request.path.startswith("/containerLogs/"):
            return web.Response(text="hello from the container\n")
        return web.Response(text="SECRET")

    runners = []
    ports = []
    for _ in range(2):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", any_path)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        ports.append(int(runner.addresses[0][1]))
    other_port = ports[1]
    try:
        yield ports[0], ports[1], seen
    finally:
        for r in runners:
            await r.cleanup()


def _inject_pod(server: APIServer, containers: list[str]) -> None:
    """A bound pod stored as is (names the validator may refuse included)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "uid": "u-p"},
        "spec": {"nodeName": "n1", "containers": [{"name": c} for c in containers]},
        "status": {"phase": "Running"},
    }
    server.store.create(POD_KEY, pod)


async def test_pod_log_refuses_invalid_container_names_and_redirects(
    server: APIServer, http: aiohttp.ClientSession, kubelet: tuple[int, int, list[str]]
) -> None:
    port, _other, seen = kubelet
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        },
    }
    code, body = await call(http, "POST", "/api/v1/nodes", node)
    assert code == 201, body
    evil = "../../../admin/secret?x="
    _inject_pod(server, ["c", evil, "redir"])
    code, body = await call(http, "GET", f"{PODS}/p/log?container=c")
    assert code == 200 and body == "hello from the container\n", body
    for name in (evil, "../x", "C", "a b", "a%2Fb", "x" * 64):
        async with http.get(f"{PODS}/p/log", params={"container": name}) as r:
            text = await r.text()
            assert r.status == 400, (name, r.status, text)
            assert "SECRET" not in text
    # A name the pod does not have: upstream's message.
    code, body = await call(http, "GET", f"{PODS}/p/log?container=other")
    assert code == 400 and body["message"] == "container other is not valid for pod p", body
    # The kubelet answers a redirect: never followed.
    code, body = await call(http, "GET", f"{PODS}/p/log?container=redir")
    assert code >= 500 and "SECRET" not in json.dumps(body), body
    assert all(p.startswith("/containerLogs/default/p/") for p in seen), seen
    assert not any("admin" in p or "stolen" in p for p in seen), seen


# --------------------------------------------------------------------------- bug 11


async def test_bad_checksum_on_a_complete_last_record_is_corruption(tmp_path: Path) -> None:
    store = Store()
    journal = Journal(store, tmp_path / "d.json")
    assert not journal.load()
    journal.start()
    for name in ("a", "b"):
        store.create(
            "/configmaps", {"metadata": {"name": name, "namespace": "ns"}, "data": {"k": name}}
        )
    await journal.wait(store.rv)  # acknowledged: both records are in the log
    wal = log_path(tmp_path / "d.json")
    good = wal.read_bytes()
    lines = good.splitlines(keepends=True)
    # Flip one byte inside the last, newline-terminated record: acknowledged, damaged.
    last = bytearray(lines[-1])
    last[-5] ^= 0x01
    offset = len(good) - len(lines[-1])
    wal.write_bytes(b"".join(lines[:-1]) + bytes(last))
    with pytest.raises(DataFileError) as info:
        Journal(Store(), tmp_path / "d.json").load()
    message = str(info.value)
    assert str(wal) in message and f"offset {offset}" in message, message
    assert wal.read_bytes() == b"".join(lines[:-1]) + bytes(last), "never cut"
    # A torn tail (no line end) is still cut off, and replay keeps every complete record.
    wal.write_bytes(good + b'0badc0de {"rv": 9, "key"')
    copy = Store()
    reader = Journal(copy, tmp_path / "d.json")
    assert reader.load() and reader.torn_bytes > 0
    assert copy.rv == 2
    journal._log.close()  # type: ignore[union-attr]


# --------------------------------------------------------------------------- bug 12


@pytest.fixture
async def plane() -> AsyncIterator[tuple[ControlPlane, aiohttp.ClientSession]]:
    cp = ControlPlane(APIServer())
    await cp.start()
    try:
        async with aiohttp.ClientSession(base_url=cp.server.url) as session:
            yield cp, session
    finally:
        await cp.stop()


def _replicaset(replicas: Any, name: str = "big") -> JSON:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
            },
        },
    }


async def test_replicaset_replicas_must_be_an_int32_not_negative(
    http: aiohttp.ClientSession,
) -> None:
    for value in (2**31, 10**12):
        code, body = await call(http, "POST", SETS, _replicaset(value))
        assert code in (400, 422), (value, code, body)
        assert "spec.replicas" in body["message"], body
    code, body = await call(http, "POST", SETS, _replicaset(-5))
    assert code == 422, body
    assert (
        "spec.replicas: Invalid value: -5: must be greater than or equal to 0" in (body["message"])
    ), body
    code, body = await call(http, "POST", SETS, _replicaset(2**31 - 1))
    assert code == 201, body
    # The scale subresource keeps the same bound.
    code, body = await call(
        http,
        "PUT",
        f"{SETS}/big/scale",
        {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "big"},
         "spec": {"replicas": 2**31}},
    )  # fmt: skip
    assert code in (400, 422), body


async def _pod_count(session: aiohttp.ClientSession) -> int:
    async with session.get(PODS) as r:
        assert r.status == 200
        return len((await r.json())["items"])


async def test_replicaset_stand_in_stops_at_once_for_a_deleted_owner(
    plane: tuple[ControlPlane, aiohttp.ClientSession],
) -> None:
    _cp, session = plane
    code, body = await call(session, "POST", SETS, _replicaset(100_000))
    assert code == 201, body
    await eventually(lambda: _at_least(session, 10), within=30, what="the first pods")
    code, body = await call(session, "DELETE", f"{SETS}/big")
    assert code == 200, body
    # The batch in flight when the delete came may land; then the count stops moving.
    counts = [await _pod_count(session)]

    async def settled_count() -> bool:
        await asyncio.sleep(0.5)
        counts.append(await _pod_count(session))
        return counts[-1] == counts[-2]

    await eventually(settled_count, within=20, what="pod creation to stop")
    settled = counts[-1]
    await asyncio.sleep(2.0)
    assert await _pod_count(session) <= settled, "pods created for a deleted ReplicaSet"
    assert settled < 2_000, settled


async def _at_least(session: aiohttp.ClientSession, n: int) -> bool:
    return await _pod_count(session) >= n


# --------------------------------------------------------------------------- watch limits


def _limited() -> APIServer:
    return APIServer(bookmark_interval=60.0, limits=HTTPLimits(max_connections=40))


async def _open_watch(port: int, token: str) -> tuple[int, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(get(f"{CMS}?watch=1", Authorization=f"Bearer {token}").replace(
        b"Connection: close\r\n", b""))  # fmt: skip
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
    return int(head.split(b" ", 2)[1]), writer


async def test_idle_watches_never_lock_out_health_or_other_clients() -> None:
    server = _limited()
    await server.start()
    writers: list[asyncio.StreamWriter] = []
    try:
        codes = []
        for _ in range(40):  # one client opens as many watches as it can
            code, w = await _open_watch(server.port, "greedy")
            writers.append(w)
            codes.append(code)
        assert 200 in codes and set(codes) <= {200, 429}, codes
        greedy = codes.count(200)
        assert greedy < 40
        # Another client still gets a watch, a list and the health endpoints.
        code, w = await _open_watch(server.port, "other")
        writers.append(w)
        assert code == 200
        for path in ("/healthz", "/readyz", "/livez", CMS):
            assert (await raw_status(server.port, get(path)))[0] == 200, path
        # Many clients together: watches are capped below the connection cap.
        for i in range(40):
            code, w = await _open_watch(server.port, f"t{i}")
            writers.append(w)
            assert code in (200, 429), code
        for path in ("/healthz", "/readyz", "/livez", CMS):
            assert (await raw_status(server.port, get(path)))[0] == 200, path
    finally:
        for w in writers:
            w.close()
        await server.stop()


async def test_health_answers_when_every_connection_is_busy() -> None:
    server = _limited()
    await server.start()
    writers: list[asyncio.StreamWriter] = []
    try:
        # Requests whose bodies never come: every connection is serving a request.
        for i in range(40):
            _r, w = await asyncio.open_connection("127.0.0.1", server.port)
            w.write(
                f"POST {CMS} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                f"User-Agent: slow/{i}\r\nContent-Length: 1000\r\n\r\n{{".encode()
            )
            await w.drain()
            writers.append(w)
        await asyncio.sleep(0.3)
        for path in ("/healthz", "/readyz", "/livez"):
            code, head = await raw_status(server.port, get(path))
            assert code == 200, (path, head)
        code, head = await raw_status(server.port, get(CMS))
        assert code in (200, 429, 503), head
    finally:
        for w in writers:
            w.close()
        await server.stop()


# --------------------------------------------------------------------------- managedFields


async def test_managed_fields_keep_at_most_ten_update_managers(
    http: aiohttp.ClientSession,
) -> None:
    code, body = await call(http, "POST", f"{CMS}?fieldManager=creator",
                            {"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": "m"}, "data": {}})  # fmt: skip
    assert code == 201, body
    for i in range(30):
        code, body = await call(
            http,
            "PATCH",
            f"{CMS}/m?fieldManager=mgr-{i:02d}",
            {"data": {f"k{i}": "v"}},
            **{"Content-Type": "application/merge-patch+json"},
        )
        assert code == 200, body
    entries = body["metadata"]["managedFields"]
    updates = [e for e in entries if e["operation"] == "Update"]
    assert len(updates) <= 10, [e["manager"] for e in updates]
    managers = {e["manager"] for e in updates}
    assert "ancient-changes" in managers and "mgr-29" in managers
    ancient = next(e for e in updates if e["manager"] == "ancient-changes")
    assert "f:k0" in ancient["fieldsV1"]["f:data"], "old fields are kept, merged"


# --------------------------------------------------------------------------- window bytes


def test_watch_window_is_bounded_in_bytes() -> None:
    store = Store(window=1000, window_bytes=4 << 20)
    big = "x" * (512 << 10)
    obj = {"metadata": {"name": "a", "namespace": "ns"}, "data": {"k": big}}
    store.create("/configmaps", obj)
    for i in range(100):
        cur = store.get("/configmaps", "ns", "a")
        assert cur is not None
        store.update("/configmaps", {**cur, "data": {"k": big + str(i)}})
    assert store.window_bytes_used <= 4 << 20
    assert store.buffered_events < 101
    # A watcher behind the floor is told to re-list, never served a hole.
    from drahealth.controlplane._store import TooOld

    with pytest.raises(TooOld):
        store.watch("/configmaps", None, lambda o: True, 1)


# --------------------------------------------------------------------------- query parsing


async def test_timeout_seconds_must_be_an_integer(
    server: APIServer, http: aiohttp.ClientSession
) -> None:
    for bad in ("nan", "inf", "-inf", "1e308", "1.5", "abc", "9" * 30):
        async with http.get(CMS, params={"watch": "1", "timeoutSeconds": bad}) as r:
            assert r.status == 400, (bad, r.status)
            body = await r.json()
            assert "timeoutSeconds" in body["message"], body
    async with http.get(CMS, params={"watch": "1", "timeoutSeconds": "1"}) as r:
        assert r.status == 200
        async with asyncio.timeout(10):
            await r.read()  # ends by itself


async def test_an_overlong_query_is_refused_without_a_traceback(
    server: APIServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    code, _ = await raw_status(server.port, get(CMS + "?x=" + "a" * 9000))
    assert code in (400, 414)
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert (await raw_status(server.port, get(CMS)))[0] == 200


async def test_dot_and_empty_path_segments_are_refused(server: APIServer) -> None:
    for path in (
        "/api/v1/namespaces/../pods",
        "/api/v1/namespaces/./configmaps",
        "/api/v1/namespaces/%2E%2E/configmaps",
        "/api/v1/namespaces/default/configmaps/..",
        "/api/v1/namespaces/default/configmaps/%2e",
        "/api//v1/namespaces/default/configmaps",
        "/api/v1/namespaces//configmaps",
        "/apis/apps/v1/namespaces/default/../../../../api/v1/pods",
    ):
        code, head = await raw_status(server.port, get(path))
        assert code in (400, 404), (path, head)
        assert re.search(rb"\r\n\r\n\{", head), head
    assert (await raw_status(server.port, get(CMS)))[0] == 200
