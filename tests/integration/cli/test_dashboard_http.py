"""The dashboard's HTTP API without a browser: state, events (the whole state, then deltas
that rebuild it exactly), history, timeline, bad input, the read-only default and the
token that guards every route and enables taint/untaint."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap
from lightkube.resources.resource_v1 import DeviceTaintRule
from lightkube.types import PatchType

from drahealth.web import Dashboard
from tests.integration.cli.test_views import NODE, D, scenario
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]


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
                follow = Follower(stream)
                first = await follow.next()
                assert first["nodes"][0]["name"] == NODE and follow.kinds == ["state"]
                # a change is pushed: gpu-0 goes Unhealthy in the agent's record
                cm = await client.get(ConfigMap, f"drahealth-devices-{NODE}", namespace="default")
                rows = json.loads((cm.data or {})["devices"])
                rows[0]["health"], rows[0]["message"] = "Unhealthy", "ECC"
                await client.patch(
                    ConfigMap, f"drahealth-devices-{NODE}", {"data": {"devices": json.dumps(rows)}},
                    namespace="default", patch_type=PatchType.MERGE,
                )  # fmt: skip
                pushed = await asyncio.wait_for(follow.next(), 3)
                assert follow.kinds == ["state", "delta"]
                assert [d["device"] for d in follow.last["set"]] == ["gpu-0"]  # only the change
                gpu0 = next(d for d in pushed["nodes"][0]["devices"] if d["device"] == "gpu-0")
                assert (gpu0["health"], gpu0["message"]) == ("Unhealthy", "ECC")
                # the deltas rebuild exactly the state the server serves
                async with http.get(url + "api/state") as resp:
                    assert await resp.json() == pushed
                assert pushed["samples"][-1]["unhealthy"] == 2

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
    return (await _next_message(stream))[1]


async def _next_message(stream: aiohttp.ClientResponse) -> tuple[str, str]:
    """The next server-sent event: its name and its data."""
    kind, data = "message", ""
    async for raw in stream.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
        elif line == "" and data:
            return kind, data
    raise AssertionError("the stream ended")


def apply_delta(state: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    """The whole state after ``delta``, as a viewer rebuilds it (its ``seq`` must follow)."""
    assert delta["seq"] == state["seq"] + 1, (state["seq"], delta["seq"])
    devices = {d["key"]: {**d, "node": n["name"]} for n in state["nodes"] for d in n["devices"]}
    devices.update((d["key"], d) for d in delta["set"])
    for key in delta["del"]:
        devices.pop(key)
    nodes: dict[str, list[dict[str, Any]]] = {}
    for d in devices.values():
        nodes.setdefault(d["node"], []).append({k: v for k, v in d.items() if k != "node"})
    out = {**state, "seq": delta["seq"]}
    out["nodes"] = [
        {"name": name, "devices": sorted(ds, key=lambda d: (d["driver"], d["pool"], d["device"]))}
        for name, ds in sorted(nodes.items())
    ]
    out.update({k: delta[k] for k in ("remediation", "unavailable") if k in delta})
    if "sample" in delta:
        kept = state["samples"][:-1] if delta["sampleReplaces"] else state["samples"]
        out["samples"] = [*kept, delta["sample"]][-state["maxSamples"] :]
    return out


class Follower:
    """Follows ``/api/events``: :meth:`next` gives the whole state after the next event."""

    def __init__(self, stream: aiohttp.ClientResponse) -> None:
        self.stream = stream
        self.state: dict[str, Any] | None = None
        self.kinds: list[str] = []
        self.last: dict[str, Any] = {}

    async def next(self) -> dict[str, Any]:
        kind, data = await _next_message(self.stream)
        self.kinds.append(kind)
        self.last = json.loads(data)
        if kind == "state":
            self.state = self.last
        else:
            assert kind == "delta" and self.state is not None, kind
            self.state = apply_delta(self.state, self.last)
        return self.state


TOKEN = "s3cret-token-0123456789"


async def test_without_a_token_actions_are_refused_and_nothing_is_written(
    client: AsyncClient,
) -> None:
    await scenario(client)
    dashboard = Dashboard(client)
    url = await dashboard.start()
    before = [r.metadata.name async for r in client.list(DeviceTaintRule) if r.metadata]
    try:
        async with aiohttp.ClientSession() as http:
            body = {"device": f"{D}/{NODE}/gpu-0", "key": "example.com/m", "effect": "NoSchedule"}
            for path in ("api/taint", "api/untaint"):
                async with http.post(url + path, json=body) as resp:
                    assert resp.status == 403
                    assert "read-only" in (await resp.json())["error"]
            async with http.get(url + "api/state") as resp:
                assert resp.status == 200
    finally:
        await dashboard.stop()
    after = [r.metadata.name async for r in client.list(DeviceTaintRule) if r.metadata]
    assert after == before


async def test_token_guards_every_route_and_enables_taint_untaint(client: AsyncClient) -> None:
    await scenario(client)
    with pytest.raises(ValueError, match="at least 16"):
        Dashboard(client, token="short")
    dashboard = Dashboard(client, token=TOKEN)
    url = await dashboard.start()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    device = f"{D}/{NODE}/gpu-0"
    try:
        async with aiohttp.ClientSession() as http:
            for path in ("", "api/state", "api/history?device=a/b/c"):
                async with http.get(url + path) as resp:
                    assert resp.status == 401, path
            async with http.get(url + "api/state", headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
            async with http.get(url + "healthz") as resp:
                assert resp.status == 200  # probes need no token
            async with http.get(url + "api/state", headers=auth) as resp:
                assert resp.status == 200
            before = [r.metadata async for r in client.list(DeviceTaintRule)]
            # malformed bodies: 400 naming the problem, nothing written
            bad: list[tuple[object, str]] = [
                ("not json", "JSON object"),
                ([1, 2], "string field(s) required: device, key, value, effect"),
                ({"device": device, "key": "example.com/m"}, "required: effect"),
                ({"device": "gpu-0", "key": "example.com/m", "effect": "NoSchedule"},
                 "DRIVER/POOL/DEVICE"),
                ({"device": device, "key": "bad key!", "effect": "NoSchedule"}, "key"),
                ({"device": device, "key": "example.com/m", "effect": "Sometimes"}, "effect"),
            ]  # fmt: skip
            for payload, message in bad:
                kw = (
                    {"data": payload, "headers": {**auth, "Content-Type": "application/json"}}
                    if isinstance(payload, str)
                    else {"json": payload, "headers": auth}
                )
                async with http.post(url + "api/taint", **kw) as resp:  # type: ignore[arg-type]
                    assert resp.status == 400, payload
                    assert message in (await resp.json())["error"], payload
            assert [r.metadata async for r in client.list(DeviceTaintRule)] == before
            body = {"device": device, "key": "example.com/m", "effect": "NoSchedule"}
            async with http.post(url + "api/taint", headers=auth, json=body) as resp:
                assert resp.status == 200
                made = await resp.json()
                assert made["outcome"] == "created"
            async with http.post(url + "api/taint", headers=auth, json=body) as resp:
                assert (await resp.json())["outcome"] == "unchanged"
            rule = await client.get(DeviceTaintRule, made["rule"])
            assert rule.spec is not None and rule.spec.taint.effect == "NoSchedule"
            # the cookie path: /?token= sets it, later requests carry it
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
                async with browser.get(url, params={"token": TOKEN}) as resp:
                    assert resp.status == 200 and "EventSource" in await resp.text()
                async with browser.post(url + "api/untaint", json={"device": device,
                                        "key": "example.com/m"}) as resp:  # fmt: skip
                    assert resp.status == 200
                    assert (await resp.json())["deleted"] == [made["rule"]]
    finally:
        await dashboard.stop()


def test_token_file_errors_are_named(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from drahealth.cli.dashboard import dashboard_command

    short = tmp_path / "short"
    short.write_text("abc\n")
    for path, message in ((tmp_path / "missing", "No such file"), (short, "at least 16")):
        result = CliRunner().invoke(dashboard_command, ["--token-file", str(path)])
        assert result.exit_code == 2
        assert "--token-file" in result.output and message in result.output


async def test_record_changes_applied_device_by_device_equal_a_full_pass(
    client: AsyncClient,
) -> None:
    """Only an agent's record changed: the dashboard recomputes just those devices. What it
    publishes must be what a full pass over everything gives."""
    await scenario(client)
    dashboard = Dashboard(client)
    url = await dashboard.start()
    name = f"drahealth-devices-{NODE}"
    try:
        async with aiohttp.ClientSession() as http, http.get(url + "api/events") as stream:
            follow = Follower(stream)
            await follow.next()
            cm = await client.get(ConfigMap, name, namespace="default")
            rows = json.loads((cm.data or {})["devices"])
            edits = [
                lambda r: r[3].update(health="Unhealthy", message="ECC"),
                lambda r: r[1].update(health="Healthy", message=""),
                lambda r: r[0].update(health="Unhealthy", message="record says"),
                lambda r: r[2].update(since="@INF@"),  # not finite: shown as unknown
                lambda r: r.pop(0),  # gpu-0 leaves the record: its pod's status speaks
                lambda r: r.append({**r[0], "device": "gpu-9"}),  # in no slice: a full pass
            ]
            for edit in edits:
                edit(rows)
                text = json.dumps(rows).replace('"@INF@"', "1e999")
                await client.patch(
                    ConfigMap, name, {"data": {"devices": text}}, namespace="default",
                    patch_type=PatchType.MERGE,
                )  # fmt: skip
                await asyncio.wait_for(follow.next(), 5)
            seen = follow.state
            assert seen is not None
            devices = {d["device"]: d for d in seen["nodes"][0]["devices"]}
            assert devices["gpu-3"]["health"] == "Unhealthy" and devices["gpu-1"]["health"] == (
                "Healthy"
            )
            assert devices["gpu-2"]["since"] is None and devices["gpu-0"]["health"] == "Healthy"
            assert "gpu-9" in devices
            seq = dashboard.state["seq"]
            dashboard._full = True  # a full pass over everything
            dashboard._refresh()
            assert dashboard.state["seq"] == seq, "the full pass found something to change"
            async with http.get(url + "api/state") as resp:
                assert await resp.json() == seen
    finally:
        await dashboard.stop()
