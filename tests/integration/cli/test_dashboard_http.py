"""The dashboard's HTTP API without a browser: state, events, history, bad input."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from drahealth.web import Dashboard
from tests.integration.cli.test_views import NODE, D, scenario
from tests.integration.kube.conftest import client, server

__all__ = ["client", "server"]


async def test_state_events_history_and_bad_input(client: AsyncClient) -> None:
    await scenario(client)
    dashboard = Dashboard(client)
    url = await dashboard.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "api/state") as resp:
                state = await resp.json()
            (node,) = state["nodes"]
            health = {d["device"]: d["health"] for d in node["devices"]}
            assert node["name"] == NODE
            assert health == {"gpu-0": "Healthy", "gpu-1": "Unhealthy", "gpu-2": "Unknown",
                              "gpu-3": "Healthy"}  # fmt: skip
            gpu1 = next(d for d in node["devices"] if d["device"] == "gpu-1")
            assert gpu1["pods"] == ["ml/train"] and gpu1["message"] == "XID 79"

            async with http.get(url + "api/events") as stream:
                assert stream.headers["Content-Type"] == "text/event-stream"
                first = await _next_event(stream)
                assert json.loads(first)["nodes"][0]["name"] == NODE
                # a change is pushed: gpu-0 goes Unhealthy in the agent's record
                cm = await client.get(ConfigMap, f"drahealth-devices-{NODE}", namespace="default")
                rows = json.loads((cm.data or {})["devices"])
                rows[0]["health"], rows[0]["message"] = "Unhealthy", "ECC"
                await client.patch(
                    ConfigMap, f"drahealth-devices-{NODE}", {"data": {"devices": json.dumps(rows)}},
                    namespace="default", patch_type=PatchType.MERGE,
                )  # fmt: skip
                pushed = json.loads(await asyncio.wait_for(_next_event(stream), 3))
                gpu0 = next(d for d in pushed["nodes"][0]["devices"] if d["device"] == "gpu-0")
                assert (gpu0["health"], gpu0["message"]) == ("Unhealthy", "ECC")

            async with http.get(url + "api/history", params={"device": "gpu-1"}) as resp:
                assert resp.status == 400
                assert "DRIVER/POOL/DEVICE" in (await resp.json())["error"]
            async with http.get(
                url + "api/history", params={"device": f"{D}/{NODE}/gpu-1"}
            ) as resp:
                assert resp.status == 200 and await resp.json() == []
            async with http.get(url) as resp:
                assert resp.status == 200 and "EventSource" in await resp.text()
            async with http.get(url + "healthz") as resp:
                assert await resp.text() == "ok"
    finally:
        await dashboard.stop()


async def _next_event(stream: aiohttp.ClientResponse) -> str:
    data = ""
    async for raw in stream.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            data = line[len("data: ") :]
        elif line == "" and data:
            return data
    raise AssertionError("the stream ended")
