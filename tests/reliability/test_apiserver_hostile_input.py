"""Hostile request bodies and clients against the embedded API server, over real HTTP.

Every test talks to a real ``APIServer`` on 127.0.0.1 (port 0) and afterwards checks the
server is still healthy: a LIST of the kind it attacked answers 200 and encodes. Covered:
text that cannot be encoded (lone surrogates, invalid UTF-8, non-finite numbers), JSON
patch amplification, oversized bodies and objects, merge and strategic merge growth, the
YAML alias bomb, ``fieldValidation`` Ignore/Warn/Strict, deep nesting, malformed protobuf
bodies, watchers that never read, and cross-site (browser-sendable) media types.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drahealth.controlplane import APIServer
from drahealth.controlplane import _server as server_module
from drahealth.controlplane._decode import (
    MAX_BODY_BYTES,
    MAX_DEPTH,
    MAX_OBJECT_BYTES,
)
from drahealth.controlplane._engine import WriteOptions
from drahealth.controlplane._protobuf import MAGIC
from drahealth.controlplane._resources import lookup
from tests._support import eventually
from tests.rawproto import field_bytes as _ld
from tests.rawproto import field_varint

pytestmark = pytest.mark.timeout(60)

CMS = "/api/v1/namespaces/default/configmaps"
DTRS = "/apis/resource.k8s.io/v1/devicetaintrules"
JSON_CT = "application/json"
PATCH_CT = "application/json-patch+json"
MERGE_CT = "application/merge-patch+json"
SMP_CT = "application/strategic-merge-patch+json"
APPLY_CT = "application/apply-patch+yaml"
CONFIGMAPS = lookup("", "v1", "configmaps")


@pytest.fixture
def api_server_options() -> dict[str, Any]:
    return {"bookmark_interval": 60.0}


@pytest.fixture
async def http(server: APIServer) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=server.url) as session:
        yield session


async def call(
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    body: Any = None,
    ctype: str | None = JSON_CT,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, aiohttp.ClientResponse]:
    data = body if isinstance(body, bytes) else (None if body is None else json.dumps(body))
    hdrs = dict(headers or {})
    if ctype is not None:
        hdrs["Content-Type"] = ctype
    skip = () if ctype is not None else ("Content-Type",)
    async with http.request(method, path, data=data, headers=hdrs, skip_auto_headers=skip) as r:
        text = await r.text()
        parsed = json.loads(text) if text and text[0] in "[{" else text
        return r.status, parsed, r


async def healthy(http: aiohttp.ClientSession, path: str = CMS) -> list[Any]:
    """A LIST of the attacked kind answers 200 with a JSON list; returns its items."""
    code, body, _ = await call(http, "GET", path)
    assert code == 200, (code, body)
    assert isinstance(body["items"], list)
    return list(body["items"])


def cm(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # pragma: no cover


# --------------------------------------------------------------------------- text


async def test_lone_surrogate_is_replaced_and_never_poisons_the_kind(
    server: APIServer, http: aiohttp.ClientSession
) -> None:
    # A lone surrogate escape and invalid UTF-8 bytes: replaced with U+FFFD at decode
    # time, as Go's encoding/json (and so the real API server) does.
    raw = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"s"},"data":{"k":"\\ud800"}}'
    code, body, _ = await call(http, "POST", CMS, raw)
    assert code == 201, body
    assert body["data"] == {"k": "\ufffd"}
    raw = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"u"},"data":{"k":"a\xffb"}}'
    code, body, _ = await call(http, "POST", CMS, raw)
    assert code == 201, body
    assert body["data"] == {"k": "a\ufffdb"}
    # Updates and patches decode the same way.
    patch = b'{"data":{"k2":"\\udc00"}}'
    code, body, _ = await call(http, "PATCH", f"{CMS}/s", patch, MERGE_CT)
    assert code == 200 and body["data"] == {"k": "\ufffd", "k2": "\ufffd"}, body
    names = {o["metadata"]["name"] for o in await healthy(http)}
    assert {"s", "u"} <= names
    # And a watch from the beginning still encodes every object.
    async with http.get(f"{CMS}?watch=true&timeoutSeconds=1") as r:
        assert r.status == 200
        lines = [json.loads(line) async for line in r.content if line.strip()]
    assert {ev["object"]["metadata"]["name"] for ev in lines} >= {"s", "u"}


async def test_yaml_lone_surrogate_and_non_json_values_are_400(
    http: aiohttp.ClientSession,
) -> None:
    cases = [
        (b'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: y}\ndata: {k: "\\ud800"}\n', "escape"),
        (b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: y}\ndata: {k: .nan}\n", "nan"),
        (b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: y}\ndata: !!set {a}\n", "set"),
    ]
    for raw, what in cases:
        code, body, _ = await call(http, "POST", CMS, raw, "application/yaml")
        assert code == 400, (what, code, body)
        assert body["reason"] == "BadRequest" and body["message"], body
    for raw in (b'{"a": NaN}', b'{"a": 1e999}', b'{"a": Infinity}'):
        code, body, _ = await call(http, "POST", CMS, raw)
        assert code == 400 and "number" in body["message"], (raw, body)
    assert await healthy(http) == []


# --------------------------------------------------------------------------- sizes


async def test_json_patch_copy_bomb_is_413_fast(
    server: APIServer, http: aiohttp.ClientSession
) -> None:
    code, _, _ = await call(http, "POST", CMS, cm("bomb", a="x" * 4096))
    assert code == 201
    ops = [{"op": "copy", "from": "/data", "path": f"/data/a{i}"} for i in range(16)]
    rss0 = rss_mib()
    t0 = time.monotonic()
    code, body, _ = await call(http, "PATCH", f"{CMS}/bomb", ops, PATCH_CT)
    took = time.monotonic() - t0
    assert code == 413, body
    assert body["reason"] == "RequestEntityTooLarge" and str(3 * 1024 * 1024) in body["message"]
    assert took < 1.0, f"the patch bomb took {took:.2f} s to refuse"
    assert rss_mib() - rss0 < 100, "the refused patch left the server much bigger"
    stored = server.engine.get(CONFIGMAPS, "default", "bomb")
    assert list(stored["data"]) == ["a"]
    await healthy(http)


async def test_json_patch_operation_count_is_bounded(http: aiohttp.ClientSession) -> None:
    await call(http, "POST", CMS, cm("ops"))
    ops = [{"op": "test", "path": "/kind", "value": "ConfigMap"}] * 10_001
    code, body, _ = await call(http, "PATCH", f"{CMS}/ops", ops, PATCH_CT)
    assert code == 413 and "10000" in body["message"], body
    code, _, _ = await call(http, "PATCH", f"{CMS}/ops", ops[:10_000], PATCH_CT)
    assert code == 200
    await healthy(http)


async def test_oversized_bodies_and_objects_are_413(
    server: APIServer, http: aiohttp.ClientSession
) -> None:
    code, body, _ = await call(http, "POST", CMS, cm("huge", a="x" * (MAX_BODY_BYTES + 10)))
    assert code == 413 and f"limit is {MAX_BODY_BYTES}" in body["message"], body
    # Under the request limit but over the object limit.
    code, body, _ = await call(http, "POST", CMS, cm("big", a="x" * (MAX_OBJECT_BYTES + 10)))
    assert code == 413 and f"limit is {MAX_OBJECT_BYTES}" in body["message"], body
    assert body["reason"] == "RequestEntityTooLarge"
    # Growing an object past the limit with merge, strategic merge and apply patches.
    code, _, _ = await call(http, "POST", CMS, cm("grow", a="x" * (MAX_OBJECT_BYTES // 2)))
    assert code == 201
    half = "y" * (MAX_OBJECT_BYTES // 2 + 10)
    for ctype, patch in (
        (MERGE_CT, {"data": {"b": half, "c": half}}),
        (SMP_CT, {"data": {"b": half, "c": half}}),
        (APPLY_CT, {"apiVersion": "v1", "kind": "ConfigMap", "data": {"b": half, "c": half}}),
    ):
        t0 = time.monotonic()
        code, body, _ = await call(
            http, "PATCH", f"{CMS}/grow?fieldManager=t", json.dumps(patch).encode(), ctype
        )
        assert code == 413, (ctype, code, body)
        assert time.monotonic() - t0 < 2.0
    stored = server.engine.get(CONFIGMAPS, "default", "grow")
    assert set(stored["data"]) == {"a"}
    assert {o["metadata"]["name"] for o in await healthy(http)} == {"grow"}


async def test_strategic_merge_of_long_lists_stays_linear(http: aiohttp.ClientSession) -> None:
    n = 4000
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            # no token volume mounted in each of them: the defaulted pod stays under 1.5 MiB
            "automountServiceAccountToken": False,
            "containers": [{"name": f"c{i}", "image": "i"} for i in range(n)],
        },
    }
    pods = "/api/v1/namespaces/default/pods"
    code, body, _ = await call(http, "POST", pods, pod)
    assert code == 201, body
    patch = {"spec": {"containers": [{"name": f"c{i}", "image": "j"} for i in range(n)]}}
    t0 = time.monotonic()
    code, body, _ = await call(http, "PATCH", f"{pods}/p", patch, SMP_CT)
    took = time.monotonic() - t0
    assert code == 200, body
    assert {c["image"] for c in body["spec"]["containers"]} == {"j"}
    assert took < 5.0, f"a {n}x{n} strategic merge took {took:.2f} s"
    await healthy(http, pods)


# --------------------------------------------------------------------------- YAML


def _alias_bomb(levels: int) -> bytes:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return ("\n".join(lines) + "\n").encode()


async def test_yaml_alias_bomb_is_refused_fast(http: aiohttp.ClientSession) -> None:
    await call(http, "POST", CMS, cm("target"))
    bomb = _alias_bomb(8)  # 9^8 expansions
    doc = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: target}\n" + bomb.replace(
        b"a0:", b"data:\n  a0:"
    ).replace(b"\na", b"\n  a")
    for method, path, ctype in (
        ("POST", CMS, "application/yaml"),
        ("PUT", f"{CMS}/target", "application/yaml"),
        ("PATCH", f"{CMS}/target?fieldManager=t", APPLY_CT),
    ):
        t0 = time.monotonic()
        code, body, _ = await call(http, method, path, doc, ctype)
        took = time.monotonic() - t0
        assert code == 400, (method, code, body)
        assert "excessive aliasing" in body["message"], body
        assert took < 1.0, f"{method}: the alias bomb took {took:.2f} s to refuse"
    # Modest aliasing is fine.
    ok = (
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: aliased}\n"
        b"data: &d {a: b}\n"
        b"binaryData: {}\n"
    )
    code, body, _ = await call(http, "POST", CMS, ok, "application/yaml")
    assert code == 201, body
    cyclic = b"apiVersion: v1\nkind: ConfigMap\nmetadata: &m {name: c, labels: *m}\n"
    code, body, _ = await call(http, "POST", CMS, cyclic, "application/yaml")
    assert code == 400 and "cycle" in body["message"], body
    await healthy(http)


# --------------------------------------------------------------------------- fieldValidation


async def test_unknown_fields_dropped_under_ignore_and_warn(
    server: APIServer, http: aiohttp.ClientSession
) -> None:
    obj = cm("fv-ignore", a="b")
    obj["spec"] = {"foo": 1}
    obj["metadata"]["bogus"] = "x"
    code, body, _ = await call(http, "POST", f"{CMS}?fieldValidation=Ignore", obj)
    assert code == 201, body
    assert "spec" not in body and "bogus" not in body["metadata"]
    stored = server.engine.get(CONFIGMAPS, "default", "fv-ignore")
    assert "spec" not in stored and "bogus" not in stored["metadata"]

    obj["metadata"]["name"] = "fv-warn"
    code, body, resp = await call(http, "POST", f"{CMS}?fieldValidation=Warn", obj)
    assert code == 201, body
    assert "spec" not in body
    warnings = resp.headers.getall("Warning", [])
    assert any('unknown field \\"spec\\"' in w for w in warnings), warnings
    assert any('unknown field \\"metadata.bogus\\"' in w for w in warnings), warnings

    # Patches too: a merge patch adding an unknown field under Ignore stores nothing new.
    code, body, _ = await call(
        http, "PATCH", f"{CMS}/fv-warn?fieldValidation=Ignore", {"spec": {"x": 1}}, MERGE_CT
    )
    assert code == 200 and "spec" not in body, body

    obj["metadata"]["name"] = "fv-strict"
    code, body, _ = await call(http, "POST", f"{CMS}?fieldValidation=Strict", obj)
    # as kube-apiserver: 400 BadRequest, "... strict decoding error: unknown field ..."
    assert code == 400 and body["reason"] == "BadRequest", body
    assert "strict decoding error: " in body["message"], body
    assert 'unknown field "spec"' in body["message"], body
    assert {o["metadata"]["name"] for o in await healthy(http)} == {"fv-ignore", "fv-warn"}


# --------------------------------------------------------------------------- nesting, protobuf


async def test_deep_nesting_is_400_not_500(http: aiohttp.ClientSession) -> None:
    for depth in (MAX_DEPTH + 1, 500, 100_000):
        raw = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"d"},"x":'
        raw += b"[" * depth + b"]" * depth + b"}"
        code, body, _ = await call(http, "POST", CMS, raw)
        assert code == 400 and "nested" in body["message"], (depth, code, body)
        code, body, _ = await call(http, "PATCH", f"{CMS}/d", raw, MERGE_CT)
        assert code == 400, (depth, code, body)
    yaml_deep = b"data:\n  x: " + b"[" * 5000 + b"]" * 5000 + b"\n"
    code, body, _ = await call(http, "POST", CMS, yaml_deep, "application/yaml")
    assert code == 400, body
    # JSON patch that builds nesting past the stored-object limit op by op.
    await call(http, "POST", CMS, cm("nest"))
    deep: Any = "x"
    for _ in range(MAX_DEPTH - 5):
        deep = [deep]
    ops = [{"op": "replace", "path": "/data", "value": {"k": deep}}]
    path = "/data/k" + "/0" * (MAX_DEPTH - 5)
    ops += [{"op": "replace", "path": path, "value": deep}]
    code, body, _ = await call(http, "PATCH", f"{CMS}/nest", ops, PATCH_CT)
    assert code == 400 and "nested" in body["message"], (code, body)
    await healthy(http)


def _pb_configmap(meta: bytes) -> bytes:
    envelope = _ld(1, _ld(1, b"v1") + _ld(2, b"ConfigMap")) + _ld(2, _ld(1, meta))
    return MAGIC + envelope


async def test_malformed_protobuf_is_400_and_unsupported_kinds_415(
    http: aiohttp.ClientSession,
) -> None:
    pb = "application/vnd.kubernetes.protobuf"
    good = _pb_configmap(_ld(1, b"pb-ok"))
    code, body, _ = await call(http, "POST", CMS, good, pb)
    assert code == 201, body
    bad_utf8 = _pb_configmap(_ld(1, b"pb-\xff\xfe"))
    code, body, _ = await call(http, "POST", CMS, bad_utf8, pb)
    assert code == 400 and "name" in body["message"] and "UTF-8" in body["message"], body
    bad_label = _pb_configmap(_ld(1, b"pb-l") + _ld(11, _ld(1, b"k") + _ld(2, b"\xc3")))
    code, body, _ = await call(http, "POST", CMS, bad_label, pb)
    assert code == 400 and "labels" in body["message"], body
    for seconds in (1 << 62, (1 << 64) - (1 << 62)):
        time_msg = field_varint(1, seconds)
        far = _pb_configmap(_ld(1, b"pb-t") + _ld(8, time_msg))
        code, body, _ = await call(http, "POST", CMS, far, pb)
        assert code == 400 and "out of range" in body["message"], body
    code, body, _ = await call(http, "POST", CMS, MAGIC + b"\x0a\xff", pb)
    assert code == 400, body
    pod = MAGIC + _ld(1, _ld(1, b"v1") + _ld(2, b"Pod")) + _ld(2, b"")
    code, body, _ = await call(http, "POST", "/api/v1/namespaces/default/pods", pod, pb)
    assert code == 415, body
    assert [o["metadata"]["name"] for o in await healthy(http)] == ["pb-ok"]


# --------------------------------------------------------------------------- watchers


async def _raw_watch(server: APIServer, path: str, rcvbuf: int | None = None) -> socket.socket:
    """Open a watch over a plain socket and never read from it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", server.port))
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: stuck/1\r\n\r\n"
    await loop.sock_sendall(sock, request.encode())
    return sock


async def test_watcher_that_falls_behind_is_closed(
    server: APIServer, http: aiohttp.ClientSession
) -> None:
    server.store.watch_queue_limit = 20
    async with http.get(f"{CMS}?watch=true") as r:
        assert r.status == 200
        await eventually(lambda: len(server.store._watchers) == 1, 5, "the watch to register")
        # Writes with no await in between: the stream cannot drain, the queue overflows.
        opts = WriteOptions(manager="t")
        for i in range(100):
            server.engine.create(CONFIGMAPS, "default", cm(f"w{i}"), opts)
        assert server.store.slow_watchers_closed == 1
        assert not server.store._watchers
        # The client sees the stream end (and would re-watch from its last resourceVersion).
        seen = [line async for line in r.content if line.strip()]
        assert len(seen) <= 20
    # The other watchers and the server are unaffected.
    assert len(await healthy(http)) == 100


async def test_watch_client_that_never_reads_is_closed(
    server: APIServer, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "WATCH_WRITE_TIMEOUT_S", 0.5)
    sock = await _raw_watch(server, f"{CMS}?watch=true", rcvbuf=4096)
    try:
        await eventually(lambda: len(server.store._watchers) == 1, 5, "the watch to register")
        payload = "z" * 400_000
        rss0 = rss_mib()
        for i in range(60):  # 24 MB of events: far beyond the socket buffers
            code, _, _ = await call(http, "POST", CMS, cm(f"big{i}", a=payload))
            assert code == 201
            if server.store.slow_watchers_closed:
                break
        await eventually(
            lambda: server.store.slow_watchers_closed == 1, 10, "the stuck watch to be closed"
        )
        assert not server.store._watchers
        assert rss_mib() - rss0 < 300
    finally:
        sock.close()
    await healthy(http)


# --------------------------------------------------------------------------- media types


DTR = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceTaintRule",
    "metadata": {"name": "csrf"},
    "spec": {
        "deviceSelector": {"driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"},
        "taint": {"key": "example.com/unhealthy", "effect": "NoExecute"},
    },
}
BROWSER = {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36"}


async def test_browser_sendable_media_types_are_415(http: aiohttp.ClientSession) -> None:
    raw = json.dumps(DTR).encode()
    for ctype in (
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/octet-stream",
    ):
        code, body, _ = await call(http, "POST", DTRS, raw, ctype, BROWSER)
        assert code == 415 and body["reason"] == "UnsupportedMediaType", (ctype, code, body)
        assert "application/json" in body["message"]
        code, body, _ = await call(http, "PUT", f"{DTRS}/csrf", raw, ctype, BROWSER)
        assert code == 415, (ctype, code, body)
    # A browser may also send a body with no Content-Type at all.
    code, body, _ = await call(http, "POST", DTRS, raw, None, BROWSER)
    assert code == 415, body
    assert await healthy(http, DTRS) == []
    # What real clients send is accepted: JSON, and kubectl's typeless raw bodies.
    code, body, _ = await call(http, "POST", DTRS, raw, None, {"User-Agent": "kubectl/v1.37.1"})
    assert code == 201, body
    code, body, _ = await call(http, "DELETE", f"{DTRS}/csrf", b"{}", "text/plain", BROWSER)
    assert code == 415, body
    code, body, _ = await call(http, "DELETE", f"{DTRS}/csrf")
    assert code == 200, body
    code, body, _ = await call(http, "POST", DTRS, raw, "application/json; charset=utf-8")
    assert code == 201, body
    assert [o["metadata"]["name"] for o in await healthy(http, DTRS)] == ["csrf"]


async def test_eviction_needs_an_accepted_media_type(http: aiohttp.ClientSession) -> None:
    pods = "/api/v1/namespaces/default/pods"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "victim"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    code, _, _ = await call(http, "POST", pods, pod)
    assert code == 201
    eviction = json.dumps(
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "victim"}}
    ).encode()
    code, body, _ = await call(
        http, "POST", f"{pods}/victim/eviction", eviction, "text/plain", BROWSER
    )
    assert code == 415, body
    assert [o["metadata"]["name"] for o in await healthy(http, pods)] == ["victim"]


async def test_overlong_field_manager_is_refused(http: aiohttp.ClientSession) -> None:
    code, body, _ = await call(http, "POST", f"{CMS}?fieldManager={'m' * 129}", cm("fm"))
    assert code == 422 and "128" in body["message"], body
    code, body, _ = await call(http, "POST", f"{CMS}?fieldManager={'m' * 128}", cm("fm"))
    assert code == 201, body
    assert [o["metadata"]["name"] for o in await healthy(http)] == ["fm"]


async def test_a_body_sent_too_slowly_is_answered_408_and_nothing_is_stored(
    server: APIServer, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Complete headers, then a body that trickles: the connection is not held forever."""
    monkeypatch.setattr(server_module, "BODY_READ_TIMEOUT_S", 0.5)
    body = json.dumps({"metadata": {"name": "slow"}, "data": {"k": "v"}}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    head = (
        f"POST {CMS} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body[:5])
    await writer.drain()
    t0 = time.monotonic()
    status_line = await asyncio.wait_for(reader.readline(), 5.0)
    took = time.monotonic() - t0
    writer.close()
    assert status_line.split()[1] == b"408", status_line
    assert took < 3.0, f"answered after {took:.1f}s"
    async with http.get(f"{CMS}/slow") as resp:
        assert resp.status == 404
    async with http.get(CMS) as resp:
        assert resp.status == 200
