"""API discovery of resource.k8s.io against a real HTTP server: the embedded API server,
and a hostile one answering garbage, errors and oversized bodies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from drahealth.controlplane import APIServer
from drahealth.kube import (
    DiscoveryError,
    ServedAPIs,
    discover,
    discover_sync,
    make_client,
    make_sync_client,
    parse_discovery,
    resource_class,
    to_internal,
)


async def test_discover_the_embedded_server(server: APIServer) -> None:
    served = await discover(make_client(server_url=server.url))
    assert served.server_version.startswith("v1.")
    for kind in ("ResourceClaim", "ResourceSlice", "DeviceClass", "ResourceClaimTemplate"):
        assert served.chosen(kind) == "v1"
    assert served.resource("ResourceSlice") is resource_class("ResourceSlice", "v1")
    assert served.summary()["ResourceClaim"] == "resource.k8s.io/v1"


async def test_discover_sync_agrees(server: APIServer) -> None:
    client = make_sync_client(server_url=server.url)
    # the sync client blocks: run it off the loop that serves the API
    sync = await asyncio.to_thread(discover_sync, client)
    assert sync == await discover(make_client(server_url=server.url))


def test_parse_discovery_picks_the_newest_stable_and_skips_subresources() -> None:
    group = {"versions": [{"version": "v1beta2"}, {"version": "v1alpha3"}]}
    docs = {
        "v1beta2": {
            "resources": [
                {"name": "devicetaintrules", "kind": "DeviceTaintRule"},
                {"name": "devicetaintrules/status", "kind": "DeviceTaintRule"},
                {"name": "widgets", "kind": "Widget"},
            ]
        },
        "v1alpha3": {"resources": [{"name": "devicetaintrules", "kind": "DeviceTaintRule"}]},
    }
    served = parse_discovery(group, docs, {"gitVersion": "v1.36.1"})
    assert served.versions["DeviceTaintRule"] == ("v1beta2", "v1alpha3")
    assert served.chosen("DeviceTaintRule") == "v1beta2"
    assert served.api_version("DeviceTaintRule") == "resource.k8s.io/v1beta2"
    assert not served.served("ResourceClaim")
    assert served.summary()["ResourceClaim"] == "not served"
    assert served.resource("DeviceTaintRule").__module__.endswith("resource_v1beta2")
    assert served.server_version == "v1.36.1"


def test_group_not_served_means_nothing_served() -> None:
    assert parse_discovery(None, {}, None) == ServedAPIs({}, "")


@pytest.mark.parametrize("group", [[], "x", {"versions": "v1"}, 7])
def test_parse_discovery_refuses_a_non_group(group: object) -> None:
    with pytest.raises(DiscoveryError, match="did not return an APIGroup"):
        parse_discovery(group, {})


def test_to_internal_rewrites_only_dra_versions() -> None:
    rule = {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule", "spec": {}}
    assert to_internal(rule)["apiVersion"] == "resource.k8s.io/v1"
    assert rule["apiVersion"] == "resource.k8s.io/v1alpha3"  # the input is not changed
    assert to_internal({"apiVersion": "v1", "kind": "Pod"})["apiVersion"] == "v1"


def test_resource_class_unknown() -> None:
    with pytest.raises(KeyError, match="no client type"):
        resource_class("Pod", "v1")
    with pytest.raises(KeyError, match="no client type"):
        resource_class("DeviceTaintRule", "v9")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


Starter = Callable[[Handler], Awaitable[str]]


@pytest.fixture
async def hostile() -> AsyncIterator[Starter]:
    """Start aiohttp servers answering every GET with ``handler``; their URL."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for r in runners:
        await r.cleanup()


async def _garbage(request: web.Request) -> web.Response:
    return web.Response(body=b"\xff\xfe not json", content_type="application/json")


async def _error(request: web.Request) -> web.Response:
    return web.Response(status=500, text="boom")


async def _huge(request: web.Request) -> web.Response:
    if request.path == "/version":
        return web.json_response({"gitVersion": "v1.36.0"})
    body = json.dumps({"versions": [{"version": "v1"}], "pad": "x" * (5 * 1024 * 1024)})
    return web.Response(body=body.encode(), content_type="application/json")


@pytest.mark.parametrize(
    ("handler", "message"),
    [(_garbage, "not JSON"), (_error, "HTTP 500"), (_huge, "larger than")],
)
async def test_hostile_servers_get_one_clear_error(
    hostile: Starter, handler: Handler, message: str
) -> None:
    url = await hostile(handler)
    with pytest.raises(DiscoveryError, match=message):
        await discover(make_client(server_url=url))


async def test_unreachable_server() -> None:
    with pytest.raises(DiscoveryError, match="API discovery failed"):
        await discover(make_client(server_url="http://127.0.0.1:9"))
