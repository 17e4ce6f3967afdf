"""Node-level rollup on the embedded API server: the controller keeps a ``DRADevicesHealthy``
condition on each Node with DRA devices (False while a device is bad, True after recovery)
next to the kubelet's conditions, which it never changes, and taints the whole node once
the policy's threshold of its devices is tainted (never in dry run, never past maxNodes).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Node

from drahealth.core import OPT_OUT_LABEL, OPT_OUT_VALUE
from drahealth.kube import patch_status
from drahealth.node._nodestatus import NodeRegistrar
from drahealth.remedy._rollup import ANNOTATION_ROLLUP_TAINT
from tests._support import eventually
from tests.integration.remedy.test_controller import DRIVER, NODE, set_health
from tests.integration.remedy.test_modes import (
    FOREIGN,
    cluster,
    events,
    make_node,
    node_dict,
    running,
)

pytestmark = pytest.mark.timeout(60)

RULES = """- name: xid
  match: {driver: gpu.example.com, message: "XID"}
  action: {effect: NoSchedule, taintValue: xid}
  recovery: {healthyFor: 0.3s}
  hysteresis: null
"""
KUBELET_CONDITIONS = [
    {"type": kind, "status": status, "reason": reason, "message": "kubelet says so",
     "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    for kind, status, reason in (
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("Ready", "True", "KubeletReady"),
    )
]  # fmt: skip


def conditions(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``kubectl describe node``'s Conditions table: the node's conditions by type."""
    return {c["type"]: c for c in (node.get("status") or {}).get("conditions") or []}


async def condition_is(client: AsyncClient, status: str, node: str = NODE) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        c = conditions(await node_dict(client, node)).get("DRADevicesHealthy")
        return c if c is not None and c["status"] == status else None

    found: dict[str, Any] = await eventually(check, 10.0, f"DRADevicesHealthy={status} on {node}")
    return found


async def kubelet_node(client: AsyncClient, name: str = NODE, **spec: Any) -> None:
    await make_node(client, name, **spec)
    await patch_status(client, Node, name, {"status": {"conditions": KUBELET_CONDITIONS}})


async def set_node_health(client: AsyncClient, node: str, **devices: str) -> None:
    """The record of another node (set_health writes node-1's)."""
    rows = [
        {"driver": DRIVER, "pool": node, "device": name.replace("_", "-"), "health": health,
         "message": "XID 79" if health == "Unhealthy" else "", "since": time.time()}
        for name, health in sorted(devices.items())
    ]  # fmt: skip
    body = {
        "metadata": {
            "name": f"drahealth-devices-{node}", "namespace": "default",
            "labels": {"app.kubernetes.io/component": "device-health",
                       "app.kubernetes.io/managed-by": "drahealth-agent",
                       "drahealth.io/node": node},
        },
        "data": {"devices": json.dumps(rows)},
    }  # fmt: skip
    try:
        await client.replace(ConfigMap.from_dict(body))  # type: ignore[call-overload]
    except Exception:
        await client.create(ConfigMap.from_dict(body))


async def test_condition_follows_device_health_and_keeps_the_kubelets() -> None:
    async with cluster("1.36") as (client, _):
        await kubelet_node(client)
        await make_node(client, "cpu-only")  # no DRA devices: gets nothing
        await set_health(client, gpu_0="Healthy", gpu_1="Healthy")
        async with running(client, RULES) as controller:
            healthy = await condition_is(client, "True")
            assert healthy["reason"] == "AllDevicesHealthy"
            assert healthy["message"] == "all 2 devices healthy"
            assert not await events(client, "NodeDevicesHealthy")  # first seen healthy

            await set_health(client, gpu_0=("Unhealthy", "XID 79"), gpu_1="Healthy")
            bad = await condition_is(client, "False")
            assert bad["reason"] == "DevicesUnhealthy"
            assert bad["message"] == f"1 of 2 devices unhealthy: {DRIVER}/{NODE}/gpu-0 (XID 79)"
            assert bad["lastTransitionTime"] >= healthy["lastTransitionTime"]
            node = await node_dict(client)
            kubelet = {k: v for k, v in conditions(node).items() if k != "DRADevicesHealthy"}
            assert kubelet == {c["type"]: c for c in KUBELET_CONDITIONS}  # untouched
            (event,) = await eventually(
                lambda: events(client, "NodeDevicesUnhealthy"), 5.0, "the Warning Event"
            )
            assert event.type == "Warning" and event.involvedObject.kind == "Node"
            assert event.involvedObject.name == NODE and "XID 79" in event.message

            # the kubelet's heartbeat (a strategic merge of its own conditions) keeps ours
            registrar = NodeRegistrar(
                client, NODE, kubelet_port=10250, kube_version="1.36", storage_dir="/"
            )
            await registrar.register()
            await registrar.report()
            after = conditions(await node_dict(client))
            assert after["DRADevicesHealthy"] == bad
            assert after["Ready"]["reason"] == "KubeletReady"

            # recovery: True again, with a Normal Event
            writes = controller.rollup.writes
            await set_health(client, gpu_0="Healthy", gpu_1="Healthy")
            again = await condition_is(client, "True")
            assert again["reason"] == "AllDevicesHealthy"
            assert again["lastTransitionTime"] >= bad["lastTransitionTime"]
            await eventually(
                lambda: events(client, "NodeDevicesHealthy"), 5.0, "the recovery Event"
            )
            assert controller.rollup.writes == writes + 1  # only the recovery was written
            assert "DRADevicesHealthy" not in conditions(await node_dict(client, "cpu-only"))


async def test_unchanged_condition_is_not_rewritten_after_a_restart() -> None:
    async with cluster("1.36") as (client, _):
        await kubelet_node(client)
        await set_health(client, gpu_0=("Unhealthy", "XID 79"), gpu_1="Unknown")
        async with running(client, RULES):
            first = await condition_is(client, "False")
            assert first["message"] == (
                f"1 of 2 devices unhealthy, 1 unknown: {DRIVER}/{NODE}/gpu-0 (XID 79), "
                f"{DRIVER}/{NODE}/gpu-1 (Unknown)"
            )
        version = (await node_dict(client))["metadata"]["resourceVersion"]
        async with running(client, RULES) as controller:
            passes = controller.passes  # passes run; the node is never written again
            await eventually(lambda: controller.passes > passes + 1, 5.0, "two more passes")
            assert controller.rollup.writes == 0
            assert (await node_dict(client))["metadata"]["resourceVersion"] == version


async def test_threshold_taints_the_node_and_recovery_removes_only_that() -> None:
    extra = "nodeRollup: {taintNode: {threshold: 50%, effect: NoSchedule}}\n"
    async with cluster("1.37") as (client, _):  # DeviceTaintRules for the devices
        await kubelet_node(client, taints=[FOREIGN])
        await set_health(client, gpu_0="Healthy", gpu_1="Healthy", gpu_2="Healthy")
        async with running(client, RULES, extra):
            await condition_is(client, "True")
            # 1 of 3 is under 50% (2 needed): the condition says False, no node taint
            await set_health(client, gpu_0=("Unhealthy", "XID 79"), gpu_1="Healthy",
                             gpu_2="Healthy")  # fmt: skip
            await condition_is(client, "False")
            assert (await node_dict(client))["spec"]["taints"] == [FOREIGN]

            await set_health(client, gpu_0=("Unhealthy", "XID 79"),
                             gpu_1=("Unhealthy", "XID 48"), gpu_2="Healthy")  # fmt: skip
            ours = {"key": "drahealth.io/devices-unhealthy", "effect": "NoSchedule"}

            async def tainted() -> dict[str, Any] | None:
                n = await node_dict(client)
                return n if ours in (n["spec"].get("taints") or []) else None

            n = await eventually(tainted, 10.0, "the node taint at 2 of 3 devices")
            assert n["spec"]["taints"] == [FOREIGN, ours]
            record = json.loads(n["metadata"]["annotations"][ANNOTATION_ROLLUP_TAINT])
            assert record["key"] == ours["key"] and "2 of 3" in record["reason"]
            await eventually(lambda: events(client, "NodeDevicesTainted"), 5.0, "the Event")

            await set_health(client, gpu_0="Healthy", gpu_1="Healthy", gpu_2="Healthy")

            async def clean() -> dict[str, Any] | None:
                n = await node_dict(client)
                return n if n["spec"].get("taints") == [FOREIGN] else None

            n = await eventually(clean, 10.0, "the node taint to go after recovery")
            assert ANNOTATION_ROLLUP_TAINT not in (n["metadata"].get("annotations") or {})
            await condition_is(client, "True")
            await eventually(lambda: events(client, "NodeDevicesUntainted"), 5.0, "the Event")


async def test_dry_run_writes_the_condition_but_never_the_node_taint() -> None:
    extra = "dryRun: true\nnodeRollup: {taintNode: {threshold: 1}}\n"
    async with cluster("1.36") as (client, _):
        await kubelet_node(client)
        await set_health(client, gpu_0=("Unhealthy", "XID 79"))
        async with running(client, RULES, extra) as controller:
            await condition_is(client, "False")
            passes = controller.passes
            await eventually(lambda: controller.passes > passes + 1, 5.0, "two more passes")
            assert not (await node_dict(client)).get("spec", {}).get("taints")


async def test_max_nodes_holds_the_second_node() -> None:
    extra = "nodeRollup: {taintNode: {threshold: 1, maxNodes: 1}}\n"
    async with cluster("1.36") as (client, _):
        await kubelet_node(client, "node-a")
        await kubelet_node(client, "node-b")
        await set_node_health(client, "node-a", gpu_0="Unhealthy")
        async with running(client, RULES, extra):
            ours = {"key": "drahealth.io/devices-unhealthy", "effect": "NoSchedule"}

            async def tainted(name: str) -> bool:
                return ours in ((await node_dict(client, name))["spec"].get("taints") or [])

            await eventually(lambda: tainted("node-a"), 10.0, "node-a's taint")
            await set_node_health(client, "node-b", gpu_0="Unhealthy")
            await condition_is(client, "False", "node-b")
            (held,) = await eventually(
                lambda: events(client, "NodeTaintHeld"), 10.0, "node-b to be held"
            )
            assert held.involvedObject.name == "node-b" and "maxNodes 1" in held.message
            assert not await tainted("node-b")
            # node-a recovers: the slot goes to node-b
            await set_node_health(client, "node-a", gpu_0="Healthy")
            await eventually(lambda: tainted("node-b"), 10.0, "node-b's taint once a slot frees")
            assert not await tainted("node-a")


async def test_an_opted_out_node_gets_the_condition_but_no_node_taint() -> None:
    extra = "nodeRollup: {taintNode: {threshold: 1}}\n"
    async with cluster("1.37") as (client, _):
        await client.create(
            Node.from_dict({"metadata": {"name": NODE, "labels": {OPT_OUT_LABEL: OPT_OUT_VALUE}}})
        )
        await set_health(client, gpu_0=("Unhealthy", "XID 79"))
        async with running(client, RULES, extra) as controller:
            await condition_is(client, "False")
            passes = controller.passes
            await eventually(lambda: controller.passes > passes + 1, 5.0, "two more passes")
            assert not (await node_dict(client)).get("spec", {}).get("taints")
