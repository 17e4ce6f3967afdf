"""The API server goes away for a while and comes back: agent and controller catch up.

The embedded API server (with its data file) serves a real sample driver, a real
kubelet-mode agent and the remediation controller. While it is down for ``OUTAGE``
seconds a device fails; when it is back on the same port with the same data, the pod
status shows the fault, the node's device-health record has it, and the controller
creates the device's taint rule exactly once. Nothing acknowledged before the outage
is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node
from lightkube.resources.resource_v1 import DeviceTaintRule

from drahealth.controlplane import APIServer
from drahealth.kube import make_client
from drahealth.remedy._controller import HISTORY_CONFIGMAP, RemediationController
from drahealth.remedy._policy_load import parse_policy
from tests.e2e.test_agent_e2e import AgentProcess, make_pod, pod_health
from tests.integration.driver.test_sample_driver import (
    NODE,
    DriverProcess,
    base,
    inject,
    launch,
    processes,
)
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "base", "client", "launch", "processes"]

pytestmark = pytest.mark.timeout(120)
OUTAGE = 30.0  # seconds the API server is down
POLICY = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
rules:
  - name: xid
    match: {driver: gpu.example.com, message: XID}
    action: {effect: NoSchedule}
"""


async def until(check: Callable[[], Any], within: float, what: str) -> float:
    t0 = time.monotonic()
    while True:
        with contextlib.suppress(Exception):
            if await check():
                return time.monotonic() - t0
        assert time.monotonic() - t0 < within, f"timed out after {within}s waiting for {what}"
        await asyncio.sleep(0.1)


@pytest.mark.slow  # about 40 s on 2 cores: CI runs it in its slow step
async def test_agent_and_controller_catch_up_after_an_api_outage(
    launch: Callable[..., Any], base: str
) -> None:
    data = f"{base}/apiserver.json"
    server = APIServer(data_file=data)
    await server.start(port=0)
    port = int(server.url.rsplit(":", 1)[1])
    kubeconfig = str(server.write_kubeconfig(f"{base}/kubeconfig"))
    client: AsyncClient = make_client(server_url=server.url)
    driver: DriverProcess = await launch(kubeconfig=kubeconfig, health_timeout=2)
    agent = await AgentProcess(base, kubeconfig).start()
    controller = RemediationController(client, parse_policy(POLICY, "p"), identity="c")
    ctl = asyncio.create_task(controller.run())
    try:
        with contextlib.suppress(ApiError):  # the kubelet-mode agent may have registered it
            await client.create(Node(metadata=ObjectMeta(name=NODE)))
        await make_pod(client, "trainer", ["gpu-0"])
        await until(lambda: _health_is(client, "Healthy"), 20, "Healthy in the pod status before")

        await server.stop()  # the outage
        t_down = time.monotonic()
        assert (await inject(driver.state, "gpu-0", "unhealthy", "--message", "XID 79"))[0] == 0
        await asyncio.sleep(max(0.0, OUTAGE - (time.monotonic() - t_down)))
        server = APIServer(data_file=data)
        await server.start(port=port)  # back, same port, same data

        took = await until(lambda: _health_is(client, "Unhealthy"), 60, "the pod status")
        print(f"\nAPI back -> pod status caught up in {took:.1f} s")
        await until(lambda: _record_is(client, "Unhealthy"), 30, "the device-health record")
        await until(lambda: _rules(client, 1), 30, "the taint rule")
        await asyncio.sleep(2.0)  # more passes: still exactly one rule, created once
        assert await _rules(client, 1)
        cm = await client.get(ConfigMap, HISTORY_CONFIGMAP, namespace="default")
        creates = [h for h in json.loads((cm.data or {})["history"]) if h["action"] == "create"]
        assert len(creates) == 1, creates
        assert agent.proc is not None and agent.proc.returncode is None
    finally:
        ctl.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ctl
        await agent.stop()
        await client.close()
        await server.stop()


async def _health_is(client: AsyncClient, health: str) -> bool:
    return (await pod_health(client, "trainer")).get("gpu-0", ("", ""))[0] == health


async def _record_is(client: AsyncClient, health: str) -> bool:
    cm = await client.get(ConfigMap, f"drahealth-devices-{NODE}", namespace="default")
    rows = {r["device"]: r for r in json.loads((cm.data or {})["devices"])}
    return bool(rows["gpu-0"]["health"] == health)


async def _rules(client: AsyncClient, count: int) -> bool:
    rules = [r async for r in client.list(DeviceTaintRule)]
    return len(rules) == count


async def test_a_connection_reset_mid_round_restarts_the_round_and_loses_nothing(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transport error escaping a write (the server reset the connection as the rule
    was created) once ended ``run()``: the controller stopped for good. It now starts
    the round again from the API and the fault is still acted on, once."""
    from tests.integration.remedy.test_controller import policy, rules, set_health

    create = client.create
    resets: list[str] = []

    async def reset_once(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, DeviceTaintRule) and not resets:
            resets.append(str(obj.metadata.name if obj.metadata else ""))
            raise httpx2.ReadError("connection reset by peer")
        return await create(obj, *args, **kwargs)

    monkeypatch.setattr(client, "create", reset_once)
    await set_health(client, gpu_0="Healthy")
    controller = RemediationController(client, policy(RULES), identity="c")
    task = asyncio.create_task(controller.run())
    try:
        await set_health(client, gpu_0=("Unhealthy", "XID 79"))
        await until(lambda: _rules(client, 1), 20, "the taint rule after the reset")
        assert resets, "the reset was never injected"
        assert not task.done(), task
        await asyncio.sleep(1.0)
        assert len(await rules(client)) == 1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


RULES = """- name: xid
  match: {driver: gpu.example.com, message: XID}
  action: {effect: NoSchedule}
"""
