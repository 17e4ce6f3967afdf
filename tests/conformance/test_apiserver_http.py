"""HTTP-level conformance of the embedded API server: Status bodies, watch, semantics."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from drahealth.controlplane import APIServer, DataFileError
from drahealth.core import NEWEST_KUBE_VERSION

PODS = "/api/v1/namespaces/default/pods"
JSON_CT = {"Content-Type": "application/json"}


@pytest.fixture
def api_server_options() -> dict[str, Any]:
    return {"bookmark_interval": 0.1}


@pytest.fixture
async def http(server: APIServer) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=server.url) as session:
        yield session


def pod(name: str = "p", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    body.update(extra)
    return body


async def call(
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    body: Any = None,
    ctype: str = "application/json",
    **kw: Any,
) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else (None if body is None else json.dumps(body))
    async with http.request(method, path, data=data, headers={"Content-Type": ctype}, **kw) as r:
        text = await r.text()
        if r.status >= 400:
            assert r.headers["Content-Type"] == "application/json"
        return r.status, json.loads(text) if text and text[0] in "[{" else text


def assert_status(body: dict[str, Any], code: int, reason: str) -> None:
    assert body["kind"] == "Status" and body["apiVersion"] == "v1"
    assert body["status"] == "Failure" and body["code"] == code and body["reason"] == reason


async def test_not_found_and_missing_namespace(http: aiohttp.ClientSession) -> None:
    code, body = await call(http, "GET", f"{PODS}/nope")
    assert code == 404
    assert_status(body, 404, "NotFound")
    assert body["message"] == 'pods "nope" not found'
    assert body["details"] == {"name": "nope", "kind": "pods"}
    code, body = await call(http, "POST", "/api/v1/namespaces/missing/pods", pod())
    assert code == 404 and body["message"] == 'namespaces "missing" not found'
    code, body = await call(http, "GET", "/apis/nope.example.com/v1/things")
    assert code == 404


async def test_create_conflicts_and_stale_resource_version(http: aiohttp.ClientSession) -> None:
    code, created = await call(http, "POST", PODS, pod())
    assert code == 201
    meta = created["metadata"]
    assert meta["generation"] == 1 and meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert created["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    code, body = await call(http, "POST", PODS, pod())
    assert code == 409 and body["reason"] == "AlreadyExists"
    assert body["message"] == 'pods "p" already exists'
    stale = dict(created, metadata={**meta, "resourceVersion": "1"})
    code, body = await call(http, "PUT", f"{PODS}/p", stale)
    assert code == 409
    assert_status(body, 409, "Conflict")
    assert "the object has been modified" in body["message"]
    code, body = await call(
        http,
        "PATCH",
        f"{PODS}/p",
        {"metadata": {"resourceVersion": "1"}},
        "application/merge-patch+json",
    )
    assert code == 409


async def test_invalid_name_unknown_field_and_field_validation(http: aiohttp.ClientSession) -> None:
    code, body = await call(http, "POST", PODS, pod("Not_Valid"))
    assert code == 422
    assert_status(body, 422, "Invalid")
    assert body["message"].startswith('Pod "Not_Valid" is invalid: metadata.name: Invalid value')
    (cause,) = body["details"]["causes"]
    assert cause["field"] == "metadata.name" and cause["reason"] == "FieldValueInvalid"
    bad = pod("q", spec={"containers": [{"name": "c", "imagee": "x"}]})
    code, body = await call(http, "POST", f"{PODS}?fieldValidation=Strict", bad)
    assert code == 400 and body["reason"] == "BadRequest"
    assert body["message"] == (
        'Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
        'unknown field "spec.containers[0].imagee"'
    )
    async with http.post(PODS, json=bad) as r:  # Warn: the real server's default
        assert r.status == 201
        assert "unknown field" in r.headers["Warning"]
    code, body = await call(http, "POST", PODS, {"kind": "Node", "metadata": {"name": "n"}})
    assert code == 400 and body["reason"] == "BadRequest" and "kind" in body["message"]
    body_ns = pod("r")
    body_ns["metadata"]["namespace"] = "kube-system"
    code, body = await call(http, "POST", PODS, body_ns)
    assert code == 400 and "does not match the namespace" in body["message"]
    code, body = await call(
        http,
        "POST",
        PODS,
        {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {"containers": []}},
    )
    assert code == 422 and "name or generateName is required" in body["message"]


async def test_bad_requests(http: aiohttp.ClientSession) -> None:
    code, body = await call(http, "POST", PODS, b"{not json")
    assert code == 400 and body["reason"] == "BadRequest"
    code, body = await call(http, "GET", f"{PODS}?labelSelector=a+in+(b")
    assert code == 400 and "unable to parse requirement" in body["message"]
    code, body = await call(http, "GET", f"{PODS}?fieldSelector=spec.foo%3Dx")
    assert code == 400 and "spec.foo" in body["message"]
    code, body = await call(http, "PATCH", f"{PODS}/p", {}, "application/xml")
    assert code == 415 and body["reason"] == "UnsupportedMediaType"
    code, body = await call(http, "PUT", PODS, pod())
    assert code == 405 and body["reason"] == "MethodNotAllowed"
    await call(http, "POST", PODS, pod())
    code, body = await call(http, "PATCH", f"{PODS}/p", pod(), "application/apply-patch+yaml")
    assert code == 422 and body["details"]["causes"][0]["field"] == "fieldManager"


async def test_generate_name_generation_and_status_isolation(http: aiohttp.ClientSession) -> None:
    body = pod()
    body["metadata"] = {"generateName": "web-"}
    code, created = await call(http, "POST", PODS, body)
    name = created["metadata"]["name"]
    assert code == 201 and name.startswith("web-") and len(name) == 9
    path = f"{PODS}/{name}"
    # status through the main endpoint is ignored, labels are not
    created["status"] = {"phase": "Running"}
    created["metadata"]["labels"] = {"x": "y"}
    code, upd = await call(http, "PUT", path, created)
    assert upd["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    assert upd["metadata"]["labels"] == {"x": "y"}
    assert upd["metadata"]["generation"] == 1
    # /status only changes status
    upd["status"] = {"phase": "Running"}
    upd["metadata"]["labels"] = {"ignored": "yes"}
    upd["spec"]["containers"][0]["image"] = "ignored"
    code, st = await call(http, "PUT", f"{path}/status", upd)
    assert st["status"] == {"phase": "Running"} and st["metadata"]["labels"] == {"x": "y"}
    assert st["spec"]["containers"][0]["image"] == "i" and st["metadata"]["generation"] == 1
    code, sp = await call(
        http,
        "PATCH",
        path,
        {"spec": {"containers": [{"name": "c", "image": "new"}]}},
        "application/strategic-merge-patch+json",
    )
    assert sp["metadata"]["generation"] == 2
    # a no-op update keeps the resourceVersion
    code, same = await call(
        http, "PATCH", path, {"metadata": {"labels": {"x": "y"}}}, "application/merge-patch+json"
    )
    assert same["metadata"]["resourceVersion"] == sp["metadata"]["resourceVersion"]
    code, jp = await call(
        http,
        "PATCH",
        path,
        [{"op": "replace", "path": "/metadata/labels/x", "value": "z"}],
        "application/json-patch+json",
    )
    assert jp["metadata"]["labels"] == {"x": "z"}


async def test_finalizers_and_delete_preconditions(http: aiohttp.ClientSession) -> None:
    body = pod()
    body["metadata"]["finalizers"] = ["example.com/hold"]
    _, created = await call(http, "POST", PODS, body)
    code, resp = await call(http, "DELETE", f"{PODS}/p", {"preconditions": {"uid": "wrong"}})
    assert code == 409 and "Precondition failed: UID in precondition" in resp["message"]
    code, resp = await call(
        http, "DELETE", f"{PODS}/p", {"preconditions": {"uid": created["metadata"]["uid"]}}
    )
    assert code == 200 and resp["metadata"]["deletionTimestamp"]
    code, _ = await call(http, "GET", f"{PODS}/p")
    assert code == 200
    code, _ = await call(
        http,
        "PATCH",
        f"{PODS}/p",
        {"metadata": {"finalizers": None}},
        "application/merge-patch+json",
    )
    assert code == 200
    code, _ = await call(http, "GET", f"{PODS}/p")
    assert code == 404
    code, _ = await call(http, "DELETE", "/api/v1/namespaces/default")
    assert code == 403


async def _events(resp: aiohttp.ClientResponse, n: int) -> list[dict[str, Any]]:
    out = []
    while len(out) < n:
        line = await asyncio.wait_for(resp.content.readline(), 2)
        assert line, "watch ended early"
        out.append(json.loads(line))
    return out


async def test_watch_stream(server: APIServer, http: aiohttp.ClientSession) -> None:
    await call(http, "POST", PODS, pod("a"))
    _, lst = await call(http, "GET", PODS)
    assert lst["kind"] == "PodList" and lst["apiVersion"] == "v1"
    # as upstream's, a built-in kind's list items carry no apiVersion or kind
    item = lst["items"][0]
    assert "kind" not in item and "apiVersion" not in item and lst["metadata"]["resourceVersion"]
    async with http.get(
        PODS, params={"watch": "1", "labelSelector": "app=web", "resourceVersion": "0"}
    ) as r:
        assert r.headers["Content-Type"].startswith("application/json")
        (first,) = await _events(r, 1)
        assert first["type"] == "ADDED" and first["object"]["metadata"]["name"] == "a"
        await call(
            http,
            "PATCH",
            f"{PODS}/a",
            {"metadata": {"labels": {"app": "db"}}},
            "application/merge-patch+json",
        )
        (gone,) = await _events(r, 1)
        assert gone["type"] == "DELETED"  # no longer matches the selector
        await call(
            http,
            "PATCH",
            f"{PODS}/a",
            {"metadata": {"labels": {"app": "web"}}},
            "application/merge-patch+json",
        )
        (back,) = await _events(r, 1)
        assert back["type"] == "ADDED"
    rv = lst["metadata"]["resourceVersion"]
    async with http.get(
        PODS, params={"watch": "true", "resourceVersion": rv, "timeoutSeconds": "1"}
    ) as r:
        replay = await _events(r, 2)
        assert [e["type"] for e in replay] == ["MODIFIED", "MODIFIED"]
        assert await asyncio.wait_for(r.content.readline(), 2) == b""  # timeoutSeconds


async def test_watch_bookmarks_and_initial_events(http: aiohttp.ClientSession) -> None:
    await call(http, "POST", PODS, pod("a"))
    async with http.get(
        PODS,
        params={
            "watch": "true",
            "allowWatchBookmarks": "true",
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
        },
    ) as r:
        added, end, idle = await _events(r, 3)
        assert added["type"] == "ADDED"
        assert end["type"] == "BOOKMARK"
        assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
        assert idle["type"] == "BOOKMARK" and set(idle["object"]) == {
            "kind",
            "apiVersion",
            "metadata",
        }


async def test_watch_too_old_is_410(server: APIServer, http: aiohttp.ClientSession) -> None:
    await call(http, "POST", PODS, pod("a"))
    server.compact()
    async with http.get(PODS, params={"watch": "true", "resourceVersion": "1"}) as r:
        assert r.status == 200
        (event,) = await _events(r, 1)
    assert event["type"] == "ERROR"
    assert_status(event["object"], 410, "Expired")
    assert "too old resource version" in event["object"]["message"]
    code, lst = await call(
        http, "GET", PODS, params={"resourceVersion": "1", "resourceVersionMatch": "NotOlderThan"}
    )
    assert code == 200 and len(lst["items"]) == 1


async def test_discovery_plain_and_aggregated(http: aiohttp.ClientSession) -> None:
    async with http.get("/api/v1", headers={"Accept": "application/json"}) as r:
        body = await r.json()
    pods = next(x for x in body["resources"] if x["name"] == "pods")
    assert body["kind"] == "APIResourceList" and pods["shortNames"] == ["po"]
    assert pods["namespaced"] and "watch" in pods["verbs"] and pods["singularName"] == "pod"
    names = {x["name"] for x in body["resources"]}
    assert {"pods/status", "pods/eviction", "nodes/status", "namespaces"} <= names
    async with http.get("/apis") as r:
        groups = {g["name"] for g in (await r.json())["groups"]}
    assert {"resource.k8s.io", "policy", "coordination.k8s.io"} <= groups
    async with http.get("/apis/resource.k8s.io/v1") as r:
        kinds = {x["kind"] for x in (await r.json())["resources"]}
    assert {"ResourceSlice", "ResourceClaim", "DeviceClass", "DeviceTaintRule"} <= kinds
    accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    async with http.get("/apis", headers={"Accept": accept + ",application/json"}) as r:
        assert r.headers["Content-Type"] == accept
        agg = await r.json()
    assert agg["kind"] == "APIGroupDiscoveryList"
    async with http.get("/version") as r:
        assert (await r.json())["minor"] == NEWEST_KUBE_VERSION.split(".")[1]  # the default
    async with http.get("/readyz") as r:
        assert await r.text() == "ok"


async def test_table_output(http: aiohttp.ClientSession) -> None:
    await call(http, "POST", PODS, pod("a", spec={"nodeName": "n1", "containers": [{"name": "c"}]}))
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    async with http.get(PODS, headers={"Accept": accept}) as r:
        tbl = await r.json()
    assert tbl["kind"] == "Table"
    cols = [c["name"] for c in tbl["columnDefinitions"]]
    assert cols[0] == "Name" and "Age" in cols and "Node" in cols
    (row,) = tbl["rows"]
    assert row["cells"][0] == "a" and row["object"]["kind"] == "PartialObjectMetadata"


async def test_protobuf_namespace_create(http: aiohttp.ClientSession) -> None:
    def ld(n: int, b: bytes) -> bytes:
        return bytes([n << 3 | 2, len(b)]) + b

    ns = ld(1, ld(1, b"proto-ns"))
    body = b"k8s\x00" + ld(1, ld(1, b"v1") + ld(2, b"Namespace")) + ld(2, ns)
    code, created = await call(
        http, "POST", "/api/v1/namespaces", body, "application/vnd.kubernetes.protobuf"
    )
    assert code == 201 and created["metadata"]["name"] == "proto-ns"
    assert created["status"] == {"phase": "Active"}


async def test_persistence_round_trip(tmp_path: Path) -> None:
    data = tmp_path / "store.json"
    srv = APIServer(data_file=data)
    await srv.start()
    async with aiohttp.ClientSession(base_url=srv.url) as http:
        _, created = await call(http, "POST", PODS, pod())
    await srv.stop()
    again = APIServer(data_file=data)
    await again.start()
    try:
        async with aiohttp.ClientSession(base_url=again.url) as http:
            code, got = await call(http, "GET", f"{PODS}/p")
            assert code == 200 and got == created
            _, second = await call(http, "POST", PODS, pod("q"))
        assert int(second["metadata"]["resourceVersion"]) > int(
            created["metadata"]["resourceVersion"]
        )
    finally:
        await again.stop()
    data.write_text("{corrupt")
    with pytest.raises(DataFileError, match=re.escape(str(data))):
        await APIServer(data_file=data).start()


async def test_write_is_on_disk_before_the_answer(tmp_path: Path) -> None:
    from drahealth.controlplane._store import Store
    from drahealth.controlplane._wal import Journal

    data = tmp_path / "store.json"
    srv = APIServer(data_file=data)
    await srv.start()
    try:
        async with aiohttp.ClientSession(base_url=srv.url) as http:
            _, created = await call(http, "POST", PODS, pod())
        copy = Store()
        assert Journal(copy, data).load()  # what a crash right now would leave
        assert copy.get("/pods", "default", "p") == created
    finally:
        await srv.stop()


async def test_kubeconfig_is_accepted_by_lightkube(server: APIServer, tmp_path: Path) -> None:
    from lightkube import KubeConfig

    cfg = KubeConfig.from_file(server.write_kubeconfig(tmp_path / "kubeconfig")).get()
    assert cfg.cluster.server == server.url
    assert cfg.user is not None and cfg.user.token == "drahealth"
    assert cfg.namespace == "default"


async def test_stop_ends_open_watches_cleanly() -> None:
    srv = APIServer()
    await srv.start()
    async with (
        aiohttp.ClientSession(base_url=srv.url) as http,
        http.get(PODS, params={"watch": "true"}) as r,
    ):
        assert r.status == 200
        await asyncio.sleep(0.05)
        await asyncio.wait_for(srv.stop(), 3)
        assert await asyncio.wait_for(r.content.read(), 2) == b""


async def test_disconnected_watchers_are_dropped(
    server: APIServer, http: aiohttp.ClientSession
) -> None:
    async with http.get(PODS, params={"watch": "true"}) as r:
        assert r.status == 200
        await asyncio.sleep(0.05)
        assert len(server.store._watchers) == 1
    for _ in range(40):
        if not server.store._watchers:
            break
        await asyncio.sleep(0.025)
    assert not server.store._watchers
