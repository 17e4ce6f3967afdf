"""Reflector wire behaviour against a scripted HTTP peer (aiohttp on 127.0.0.1:0):
what it sends (bookmarks, timeout, resume RV, selectors) and how it handles HTTP-level
410s, 5xx on LIST, ERROR events and watches the server ends at its timeout."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from drahealth.controlplane import APIServer
from drahealth.kube import Reflector, make_client, status_code

from .conftest import eventually

PATH = "/api/v1/namespaces/default/configmaps"
Handler = Callable[[web.Request], Any]


def cm(name: str, rv: int, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "data": data,
        "metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv)},
    }


def listing(rv: int, *items: dict[str, Any]) -> web.Response:
    return web.json_response(
        {
            "apiVersion": "v1",
            "kind": "ConfigMapList",
            "metadata": {"resourceVersion": str(rv)},
            "items": list(items),
        }
    )


def status(code: int, reason: str) -> web.Response:
    return web.json_response(
        {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": reason,
        },
        status=code,
    )


async def stream(
    request: web.Request, *events: tuple[str, dict[str, Any]], hold: bool = True
) -> web.StreamResponse:
    resp = web.StreamResponse()
    resp.content_type = "application/json"
    await resp.prepare(request)
    for etype, obj in events:
        await resp.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
    if hold:
        await asyncio.sleep(3600)
    await resp.write_eof()
    return resp


class Peer:
    """Serves LIST and WATCH from per-call scripts and records the query strings."""

    def __init__(self, lists: list[Handler], watches: list[Handler]) -> None:
        self.lists, self.watches = lists, watches
        self.list_queries: list[dict[str, str]] = []
        self.watch_queries: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        q = dict(request.query)
        if q.get("watch") == "true":
            self.watch_queries.append(q)
            script = self.watches[min(len(self.watch_queries), len(self.watches)) - 1]
        else:
            self.list_queries.append(q)
            script = self.lists[min(len(self.list_queries), len(self.lists)) - 1]
        result: web.StreamResponse = await script(request)
        return result


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Peer], Any]]:
    runners: list[web.AppRunner] = []

    async def start(peer: Peer) -> str:
        app = web.Application()
        app.router.add_get(PATH, peer.handle)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for r in runners:
        await r.cleanup()


def summary(seen: list[tuple[str, str]]) -> Callable[[str, ConfigMap, ConfigMap | None], None]:
    def handler(t: str, obj: ConfigMap, old: ConfigMap | None) -> None:
        assert obj.metadata is not None
        seen.append((t, f"{obj.metadata.name}@{obj.metadata.resourceVersion}"))

    return handler


async def test_http_410_on_watch_relists(serve: Callable[[Peer], Any]) -> None:
    async def list1(r: web.Request) -> web.Response:
        return listing(5, cm("a", 4), cm("b", 5))

    async def list2(r: web.Request) -> web.Response:
        return listing(9, cm("b", 5), cm("c", 9))

    async def gone(r: web.Request) -> web.Response:
        return status(410, "Expired")

    async def quiet(r: web.Request) -> web.StreamResponse:
        return await stream(r)

    peer = Peer([list1, list2], [gone, quiet])
    url = await serve(peer)
    client = make_client(server_url=url)
    seen: list[tuple[str, str]] = []
    r = Reflector(
        client, ConfigMap, namespace="default", labels={"app": "x"}, fields={"metadata.name": "b"}
    )
    r.add_handler(summary(seen))
    try:
        async with r:
            await eventually(lambda: len(peer.watch_queries) == 2)
            assert seen == [
                ("ADDED", "a@4"),
                ("ADDED", "b@5"),
                ("DELETED", "a@4"),
                ("ADDED", "c@9"),
            ]
            assert r.relists == 1 and r.lists == 2
            assert r.last_resource_version == "9"
            first, second = peer.watch_queries
            assert first["resourceVersion"] == "5" and second["resourceVersion"] == "9"
            assert first["allowWatchBookmarks"] == "true"
            assert int(first["timeoutSeconds"]) >= 300
            assert first["labelSelector"] == "app=x"
            assert first["fieldSelector"] == "metadata.name=b"
            assert peer.list_queries[0]["labelSelector"] == "app=x"
    finally:
        await client.close()


async def test_list_errors_back_off_then_sync(serve: Callable[[Peer], Any]) -> None:
    async def fail(r: web.Request) -> web.Response:
        return status(500, "InternalError")

    async def ok(r: web.Request) -> web.Response:
        return listing(3, cm("a", 3))

    async def quiet(r: web.Request) -> web.StreamResponse:
        return await stream(r)

    peer = Peer([fail, fail, ok], [quiet])
    client = make_client(server_url=await serve(peer))
    r = Reflector(client, ConfigMap, namespace="default", backoff_initial=0.02)
    try:
        async with r:
            await r.wait_synced(5)
            assert len(peer.list_queries) == 3
            assert r.lists == 1 and r.reconnects == 0
            # aiohttp adds "; charset=utf-8", so lightkube raises a plain HTTPStatusError
            assert r.last_error is not None and status_code(r.last_error) == 500
            assert r._backoff.attempts == 2  # not yet reset: no healthy watch so far
            await eventually(lambda: len(peer.watch_queries) == 1)
    finally:
        await client.close()


async def test_error_event_reconnects_from_last_rv(serve: Callable[[Peer], Any]) -> None:
    async def ok(r: web.Request) -> web.Response:
        return listing(10)

    async def then_error(r: web.Request) -> web.StreamResponse:
        err = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": 500,
            "reason": "InternalError",
            "message": "boom",
        }
        return await stream(
            r,
            ("ADDED", cm("a", 11)),
            (
                "BOOKMARK",
                {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": "15"}},
            ),
            ("ERROR", err),
            hold=False,
        )

    async def more(r: web.Request) -> web.StreamResponse:
        return await stream(r, ("MODIFIED", cm("a", 16, k="v")))

    peer = Peer([ok], [then_error, more])
    client = make_client(server_url=await serve(peer))
    seen: list[tuple[str, str]] = []
    r = Reflector(client, ConfigMap, namespace="default", backoff_initial=0.02)
    r.add_handler(summary(seen))
    try:
        async with r:
            await eventually(lambda: len(seen) == 2)
            assert seen == [("ADDED", "a@11"), ("MODIFIED", "a@16")]
            assert [q["resourceVersion"] for q in peer.watch_queries] == ["10", "15"]
            assert r.reconnects == 1 and r.relists == 0 and r.lists == 1
    finally:
        await client.close()


async def test_server_watch_timeout_is_not_an_error() -> None:
    """The embedded server ends a watch at timeoutSeconds; the reflector re-watches
    from its last RV at once and misses nothing."""
    server = APIServer(data_file=None, bookmark_interval=0.2)
    await server.start(host="127.0.0.1", port=0)
    client = make_client(server_url=server.url)
    r = Reflector(client, ConfigMap, namespace="default", watch_timeout=1.0, rng=lambda: 0.0)
    try:
        async with r:
            await r.wait_synced(5)
            await eventually(lambda: r.watches >= 2, within=5)
            await client.create(ConfigMap(metadata=ObjectMeta(name="late", namespace="default")))
            await eventually(lambda: r.store.get("default", "late") is not None)
            assert r.reconnects == 0 and r.relists == 0 and r.last_error is None
    finally:
        await client.close()
        await server.stop()


def too_large(requested: int, current: int) -> web.Response:
    """kube-apiserver's answer to a resourceVersion newer than its own."""
    return web.json_response(
        {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "code": 504,
            "reason": "Timeout",
            "message": f"Too large resource version: {requested}, current: {current}",
            "details": {
                "causes": [
                    {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
                ],
                "retryAfterSeconds": 1,
            },
        },
        status=504,
    )


async def test_too_large_on_list_and_watch_relists_as_the_whole_truth(
    serve: Callable[[Peer], Any],
) -> None:
    async def list1(r: web.Request) -> web.Response:
        return listing(50, cm("a", 40), cm("b", 50))

    async def list_too_large(r: web.Request) -> web.Response:
        return too_large(50, 3)

    async def list2(r: web.Request) -> web.Response:  # the server went back in time
        return listing(3, cm("a", 2, v="new"), cm("c", 3))

    async def watch_too_large(r: web.Request) -> web.Response:
        return too_large(50, 3)

    async def quiet(r: web.Request) -> web.StreamResponse:
        return await stream(r)

    peer = Peer([list1, list_too_large, list2], [watch_too_large, quiet])
    url = await serve(peer)
    client = make_client(server_url=url)
    seen: list[tuple[str, str]] = []
    r = Reflector(client, ConfigMap, namespace="default", backoff_initial=0.01, backoff_max=0.02)
    r.add_handler(summary(seen))
    try:
        async with r:
            await eventually(lambda: len(peer.watch_queries) >= 2, within=5)
            assert peer.watch_queries[0]["resourceVersion"] == "50"
            assert "resourceVersion" not in peer.list_queries[-1]  # a consistent read
            assert r.relists >= 2  # once for the watch, once for the list
            assert sorted(seen) == [
                ("ADDED", "a@40"),
                ("ADDED", "b@50"),
                ("ADDED", "c@3"),
                ("DELETED", "b@50"),
                ("MODIFIED", "a@2"),
            ]
            assert peer.watch_queries[1]["resourceVersion"] == "3"
    finally:
        await client.close()


async def test_too_large_as_a_watch_error_event_relists(serve: Callable[[Peer], Any]) -> None:
    async def list1(r: web.Request) -> web.Response:
        return listing(50, cm("a", 50))

    async def list2(r: web.Request) -> web.Response:
        return listing(2, cm("a", 2, v="new"))

    body = json.loads(too_large(50, 2).body)  # type: ignore[arg-type]

    async def error_event(r: web.Request) -> web.StreamResponse:
        return await stream(r, ("ERROR", body), hold=False)

    async def quiet(r: web.Request) -> web.StreamResponse:
        return await stream(r)

    peer = Peer([list1, list2], [error_event, quiet])
    client = make_client(server_url=await serve(peer))
    r = Reflector(client, ConfigMap, namespace="default", backoff_initial=0.01, backoff_max=0.02)
    try:
        async with r:
            await eventually(lambda: len(peer.watch_queries) >= 2, within=5)
            a = r.store.get("default", "a")
            assert a is not None and a.data == {"v": "new"} and r.relists == 1
    finally:
        await client.close()
