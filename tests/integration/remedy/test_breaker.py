"""The blast-radius circuit breaker end to end: the controller in process against the
embedded API server, ``drahealth resume`` as a real subprocess.

80 devices on 10 nodes (ResourceSlices), 50 of them Unhealthy at once, a cluster limit
of 10%: at most 8 DeviceTaintRules are written, 42 taints are held and the hold is
reported (state key, Event, metrics, history); a restarted controller keeps holding;
``drahealth resume`` makes the held ones tainted. A second test resumes by itself once
the held devices recover, and an observe-only profile writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceSlice
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.core import Policy
from drahealth.remedy import STATE_CONFIGMAP
from drahealth.remedy._controller import HISTORY_CONFIGMAP, RemediationController
from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client
from tests.integration.remedy.test_controller import policy

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(90)

DRIVER = "gpu.example.com"
CLI_TIMEOUT = 30.0  # seconds a drahealth command may take
RULES = """- name: any
  match: {driver: gpu.example.com}
  action: {effect: NoSchedule}
  recovery: {healthyFor: 0.2s}
"""


async def make_slices(client: AsyncClient, nodes: int) -> None:
    for n in range(nodes):
        body = {
            "metadata": {"name": f"node-{n}-gpus"},
            "spec": {
                "driver": DRIVER,
                "nodeName": f"node-{n}",
                "pool": {"name": f"node-{n}", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": f"gpu-{i}"} for i in range(8)],
            },
        }
        await client.create(ResourceSlice.from_dict(body))


async def set_node_health(client: AsyncClient, node: str, health: dict[str, str]) -> None:
    """The node agent's device-health record: device name -> health."""
    rows = [
        {"driver": DRIVER, "pool": node, "device": d, "health": h,
         "message": "XID 79" if h == "Unhealthy" else "", "since": time.time()}
        for d, h in sorted(health.items())
    ]  # fmt: skip
    name = f"drahealth-devices-{node}"
    data = {"devices": json.dumps(rows)}
    try:
        await client.patch(
            ConfigMap, name, {"data": data}, namespace="default", patch_type=PatchType.MERGE
        )
    except Exception:
        meta = {
            "name": name,
            "namespace": "default",
            "labels": {
                "app.kubernetes.io/component": "device-health",
                "app.kubernetes.io/managed-by": "drahealth-agent",
                "drahealth.io/node": node,
            },
        }
        await client.create(ConfigMap.from_dict({"metadata": meta, "data": data}))


def health(bad: int, total: int = 8, first: int = 0) -> dict[str, str]:
    """gpu-0..gpu-7: ``bad`` of them from ``first`` on Unhealthy, the rest Healthy."""
    return {
        f"gpu-{i}": "Unhealthy" if first <= i < first + bad else "Healthy" for i in range(total)
    }


@asynccontextmanager
async def running(client: AsyncClient, p: Policy) -> AsyncIterator[RemediationController]:
    controller = RemediationController(client, p, identity="c1")
    task = asyncio.create_task(controller.run())
    try:
        await eventually(lambda: controller.synced, 10.0, "the controller to sync")
        yield controller
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def our_rules(client: AsyncClient) -> list[Any]:
    return [r async for r in client.list(DeviceTaintRule)]


async def breaker_state(client: AsyncClient) -> dict[str, Any]:
    try:
        cm = await client.get(ConfigMap, STATE_CONFIGMAP, namespace="default")
    except Exception:
        return {}
    value = json.loads((cm.data or {}).get("breaker", "{}"))
    assert isinstance(value, dict)
    return value


async def events(client: AsyncClient, reason: str) -> list[Any]:
    return [e async for e in client.list(Event, namespace="default") if e.reason == reason]


async def drahealth(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "drahealth", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT)
    except TimeoutError:
        proc.kill()
        what = f"drahealth {' '.join(args)}"
        raise AssertionError(f"{what} did not finish in {CLI_TIMEOUT} s") from None
    text = out.decode()
    assert proc.returncode == 0, text
    return text


def gauge(metric: Any, *labels: str) -> float:
    m = metric.labels(*labels) if labels else metric
    return float(m._value.get())


async def test_mass_failure_holds_at_the_limit_until_resumed(
    client: AsyncClient, server: APIServer, tmp_path: Path
) -> None:
    kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
    await make_slices(client, 10)  # 80 devices
    for n in range(10):
        await set_node_health(client, f"node-{n}", health(0))
    p = policy(RULES, 'limits: {cluster: "10%", window: 1h}\n')
    async with running(client, p) as controller:
        # a mass event: 50 of 80 devices Unhealthy at once (6 nodes whole, 2 of the 7th)
        await asyncio.gather(
            *(set_node_health(client, f"node-{n}", health(8)) for n in range(6)),
            set_node_health(client, "node-6", health(2)),
        )

        async def held() -> dict[str, Any] | None:
            s = await breaker_state(client)
            return s if s.get("heldCount") == 42 else None

        state = await eventually(held, 15.0, "42 held taints in the breaker state")
        assert len(await our_rules(client)) == 8
        [trip] = state["tripped"]
        assert (trip["scope"], trip["group"], trip["limit"], trip["max"], trip["count"]) == (
            "cluster", "", "10%", 8, 8,
        )  # fmt: skip
        assert trip["resume"] == "manual" and trip["window"] == 3600
        assert len(state["held"]) == 42 and state["held"][0]["reason"] == "Unhealthy: XID 79"
        assert state["held"][0]["rule"] == "any" and state["held"][0]["effect"] == "NoSchedule"
        paused = await eventually(
            lambda: events(client, "RemediationPaused"), 5.0, "the RemediationPaused Event"
        )
        assert len(paused) == 1 and paused[0].type == "Warning"
        assert paused[0].involvedObject.name == HISTORY_CONFIGMAP
        assert "cluster limit 10%" in paused[0].message and "drahealth resume" in paused[0].message
        assert gauge(controller.metrics.held_taints) == 42
        assert gauge(controller.metrics.breaker_tripped, "cluster") == 1
        assert gauge(controller.metrics.breaker_trips, "cluster") == 1
        history = await client.get(ConfigMap, HISTORY_CONFIGMAP, namespace="default")
        assert "breaker-tripped" in (history.data or {})["history"]

    # a new leader resumes the trip and the hold from the state ConfigMap
    async with running(client, p) as controller:
        await eventually(
            lambda: gauge(controller.metrics.held_taints) == 42, 10.0, "the restored hold"
        )
        assert len(await our_rules(client)) == 8
        assert len(await events(client, "RemediationPaused")) == 1  # no second trip

        dry = await drahealth("resume", "--kubeconfig", kubeconfig, "--dry-run")
        assert "tripped: cluster: limit 10% (max 8" in dry and "held: 42 new taint(s)" in dry
        assert "... and 22 more" in dry and "dry run: nothing asked" in dry
        out = await drahealth("resume", "--kubeconfig", kubeconfig, "--by", "alice")
        assert "held: 42 new taint(s)" in out and "resume requested" in out

        async def all_tainted() -> bool:
            return len(await our_rules(client)) == 50

        await eventually(all_tainted, 15.0, "the 42 held taints written after the resume")
        state = await eventually(
            lambda: _resumed(client), 5.0, "the breaker state to show the resume"
        )
        assert state["lastResume"]["by"] == "alice"
        resumed = await eventually(
            lambda: events(client, "RemediationResumed"), 5.0, "the RemediationResumed Event"
        )
        assert "by alice" in resumed[0].message and "42 held" in resumed[0].message
        assert gauge(controller.metrics.held_taints) == 0
        assert gauge(controller.metrics.breaker_tripped, "cluster") == 0


async def _resumed(client: AsyncClient) -> dict[str, Any] | None:
    s = await breaker_state(client)
    return s if not s.get("tripped") and s.get("heldCount") == 0 and s.get("lastResume") else None


async def test_auto_resume_once_the_held_recover_and_observe_only_writes_nothing(
    client: AsyncClient,
) -> None:
    await make_slices(client, 3)
    for n in range(3):
        await set_node_health(client, f"node-{n}", health(0))
    extra = (
        "limits: {cluster: 2, resume: auto, window: 1h}\n"
        "profiles:\n"
        "  - name: canary\n"
        "    match: {pool: node-2}\n"
        "    observeOnly: true\n"
    )
    p = policy(RULES, extra)
    async with running(client, p) as controller:
        await set_node_health(client, "node-0", health(5))  # 5 bad, 2 allowed
        await set_node_health(client, "node-2", health(8))  # observe-only: reported only

        async def held() -> dict[str, Any] | None:
            s = await breaker_state(client)
            return s if s.get("heldCount") == 3 else None

        state = await eventually(held, 10.0, "3 held taints")
        assert state["tripped"][0]["resume"] == "auto"
        assert len(await our_rules(client)) == 2
        reported = await eventually(
            lambda: events(client, "DeviceWouldBeTainted"), 5.0, "the observe-only reports"
        )
        assert all("node-2" in e.message for e in reported)
        assert all(r.spec.deviceSelector.pool == "node-0" for r in await our_rules(client))

        # the three held devices recover: what is held fits under the limit -> resumes
        await set_node_health(client, "node-0", health(2))
        await eventually(lambda: events(client, "RemediationResumed"), 10.0, "the automatic resume")

        async def resumed() -> dict[str, Any] | None:  # the state is its own, later write
            s = await breaker_state(client)
            return s if not s.get("tripped") else None

        state = await eventually(resumed, 10.0, "the state to say resumed")
        assert state["heldCount"] == 0
        assert gauge(controller.metrics.breaker_tripped, "cluster") == 0
        assert len(await our_rules(client)) == 2
