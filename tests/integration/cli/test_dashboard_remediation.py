"""The dashboard carries the remediation controller's state: banner data, markers, history.

The scenario of :mod:`tests.integration.cli.test_views` on the embedded API server; the
controller's state ConfigMap is written, changed and made hostile while the dashboard runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from drahealth.core import parse_state
from drahealth.web import Dashboard
from drahealth.web._state import snapshot
from tests.integration.cli.test_dashboard_http import Follower
from tests.integration.cli.test_views import NODE, D, scenario
from tests.integration.cli.test_views_remediation import GPU, STATE, write_state
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]


def markers(state: dict[str, Any]) -> dict[str, list[str]]:
    return {
        d["device"]: d["remediation"].get("markers", [])
        for n in state["nodes"]
        for d in n["devices"]
        if d["remediation"]
    }


async def test_state_carries_the_breaker_and_markers_live(client: AsyncClient) -> None:
    await scenario(client)
    dashboard = Dashboard(client)
    url = await dashboard.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "api/state") as resp:
                state = await resp.json()
            assert state["remediation"]["present"] is False  # no ConfigMap: nothing to show
            assert markers(state) == {}

            async with http.get(url + "api/events") as stream:
                follow = Follower(stream)
                await follow.next()
                await write_state(client, {k: json.dumps(v) for k, v in STATE.items()})
                pushed = await asyncio.wait_for(follow.next(), 5)
                remediation = pushed["remediation"]
                assert remediation["paused"] is True and remediation["held"] == 1
                assert remediation["tripped"][0]["limit"] == "10%"
                assert remediation["counts"]["needsHuman"] == 1
                assert markers(pushed) == {
                    "gpu-0": ["HELD"],
                    "gpu-1": ["NEEDS-HUMAN", "REPAIRING"],
                    "gpu-2": ["PAUSED"],
                    "gpu-3": ["DEGRADED", "BURN-IN"],
                }
                gpu1 = next(d for d in pushed["nodes"][0]["devices"] if d["device"] == "gpu-1")
                assert gpu1["remediation"]["needsHuman"]["why"] == "3 bad episodes within 24h"

                # the operator resumes and clears: the controller empties the keys
                await client.patch(
                    ConfigMap, "drahealth-remediation-state",
                    {"data": {"breaker": json.dumps({"tripped": [], "held": []}),
                              "needsHuman": "{}"}},
                    namespace="default", patch_type=PatchType.MERGE,
                )  # fmt: skip
                pushed = await asyncio.wait_for(follow.next(), 5)
                assert pushed["remediation"]["paused"] is False
                assert markers(pushed)["gpu-1"] == ["REPAIRING"]

                # a hand-edited, broken value: skipped, the page keeps working
                await client.patch(
                    ConfigMap, "drahealth-remediation-state",
                    {"data": {"holds": "{broken", "repairs": json.dumps({GPU[1]: "x"})}},
                    namespace="default", patch_type=PatchType.MERGE,
                )  # fmt: skip
                pushed = await asyncio.wait_for(follow.next(), 5)
                notes = pushed["remediation"]["notes"]
                assert notes[0].startswith("holds: not JSON (")
                assert notes[1] == "repairs: 1 entry skipped (not an object)"
                assert markers(pushed) == {"gpu-3": ["DEGRADED", "BURN-IN"]}
            async with http.get(url) as resp:
                page = await resp.text()
            assert 'id="breaker"' in page and 'id="legend"' in page and "NEEDS-HUMAN" in page
    finally:
        await dashboard.stop()


async def test_history_names_devices_whole_and_in_words(client: AsyncClient) -> None:
    await scenario(client)
    history = [
        {"time": "2026-11-22T10:00:00Z", "by": "c", "action": "repair-failed",
         "subject": GPU[1], "message": f"repair of {GPU[1]} failed"},
        {"time": "2026-11-22T10:01:00Z", "by": "c", "action": "needs-human",
         "subject": f"{GPU[1]}0", "message": f"{GPU[1]}0: 2 failed repairs"},
    ]  # fmt: skip
    await client.create(
        ConfigMap.from_dict(
            {
                "metadata": {"name": "drahealth-remediation-history", "namespace": "default"},
                "data": {"history": json.dumps(history)},
            }
        )
    )
    dashboard = Dashboard(client)
    url = await dashboard.start()
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(url + "api/history", params={"device": GPU[1]}) as resp,
        ):
            rows = await resp.json()
        assert [(r["what"], r["action"]) for r in rows] == [("repair (failed)", "repair-failed")]
    finally:
        await dashboard.stop()


def test_snapshot_of_a_large_fleet_stays_fast_and_small_page_wide() -> None:
    """2,000 devices, every one named by the state: one pass, page-wide part small."""
    devices = [{"name": f"gpu-{i}"} for i in range(2000)]
    slices = [{"spec": {"driver": D, "nodeName": NODE, "pool": {"name": NODE}, "devices": devices}}]
    name = [f"{D}/{NODE}/gpu-{i}" for i in range(2000)]
    remediation = parse_state(
        {
            "needsHuman": {n: {"why": "x"} for n in name[:1000]},
            "holds": {n: {"until": "2099-01-01T00:00:00Z"} for n in name[1000:]},
            "breaker": {"tripped": [], "held": [{"device": n} for n in name[:1000]]},
        }
    )
    t0 = time.perf_counter()
    out = snapshot([], [], [], slices, [], remediation=remediation, now=time.time())
    took = time.perf_counter() - t0
    print(f"snapshot of 2,000 marked devices: {took * 1000:.0f} ms")
    assert took < 2.0
    assert len(json.dumps(out["remediation"])) < 2000
    cells = out["nodes"][0]["devices"]
    assert sum(1 for d in cells if d["remediation"].get("markers")) == 2000


async def test_an_expiring_hold_leaves_the_page_without_any_change_in_the_api(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Holds end with time, not with an API event: the periodic full pass shows it."""
    import drahealth.web._server as server_module

    monkeypatch.setattr(server_module, "FULL_EVERY", 0.5)
    await scenario(client)
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3))
    holds = {GPU[0]: {"until": until, "by": "alice", "reason": "short"}}
    await write_state(client, {"holds": json.dumps(holds)})
    dashboard = Dashboard(client)
    url = await dashboard.start()
    try:
        async with aiohttp.ClientSession() as http, http.get(url + "api/events") as stream:
            follow = Follower(stream)
            state = await follow.next()
            assert markers(state).get("gpu-0") == ["HELD"]
            while markers(state).get("gpu-0"):
                state = await asyncio.wait_for(follow.next(), 10)
            gpu0 = next(d for d in state["nodes"][0]["devices"] if d["device"] == "gpu-0")
            assert gpu0["remediation"]["hold"]["expired"] is True
    finally:
        await dashboard.stop()
