"""An operator upgrades the cluster from 1.35 to 1.37 while a device is bad.

On 1.35 (no DeviceTaintRule API) the controller taints the node; the cluster is then
upgraded (the same stored data served as 1.37, which serves DeviceTaintRule v1), the
controller restarts, finds the v1 API, covers the device with a DeviceTaintRule and
removes the node taint it wrote itself, keeping everyone else's.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import DeviceTaintRule

from drahealth.controlplane import APIServer
from drahealth.core import kube_profile
from drahealth.kube import make_client
from drahealth.remedy import RemediationController
from drahealth.remedy._nodes import ANNOTATION_DEVICES
from tests._support import eventually
from tests.integration.remedy.test_controller import NODE, make_pod, policy, set_health

pytestmark = pytest.mark.timeout(60)

RULES = """- name: xid
  match: {driver: gpu.example.com, message: "XID"}
  action: {effect: NoSchedule, taintValue: xid}
  recovery: {healthyFor: 60s}
"""
FOREIGN = {"key": "ops/maintenance", "value": "planned", "effect": "NoSchedule"}


async def _run_controller(server: APIServer, until: Any, what: str) -> Any:
    client = make_client(server_url=server.url, timeout=5.0)
    fallback = "remediation: {fallback: node-taint}\n"  # the mode before quarantine existed
    controller = RemediationController(client, policy(RULES, fallback), identity="c1")
    task = asyncio.create_task(controller.run())
    try:
        return await eventually(lambda: until(client), 10.0, what)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()


async def test_upgrade_from_node_taints_to_device_taint_rules(tmp_path: Path) -> None:
    data = tmp_path / "cluster.json"
    old = APIServer(data_file=data, profile=kube_profile("1.35"))
    await old.start(host="127.0.0.1", port=0)
    try:
        client = make_client(server_url=old.url, timeout=5.0)
        await client.create(
            Node.from_dict({"metadata": {"name": NODE}, "spec": {"taints": [FOREIGN]}})
        )
        await set_health(client, gpu_0=("Unhealthy", "XID 79"), gpu_1="Healthy")
        await make_pod(client, "victim", "gpu-0", {"app": "victim"})
        await client.close()

        async def node_tainted(c: Any) -> Any:
            node = await c.get(Node, NODE)
            keys = [t.key for t in node.spec.taints or []]
            return node if "drahealth.io/unhealthy" in keys else None

        node = await _run_controller(old, node_tainted, "the node taint on 1.35")
        assert ANNOTATION_DEVICES in (node.metadata.annotations or {})
    finally:
        await old.stop()

    new = APIServer(data_file=data, profile=kube_profile("1.37"))
    await new.start(host="127.0.0.1", port=0)
    try:

        async def moved_to_rules(c: Any) -> Any:
            rules = [r async for r in c.list(DeviceTaintRule)]
            node = await c.get(Node, NODE)
            taints = [t.to_dict() for t in node.spec.taints or []]
            annotations = node.metadata.annotations or {}
            if rules and taints == [FOREIGN] and ANNOTATION_DEVICES not in annotations:
                return rules
            return None

        rules = await _run_controller(new, moved_to_rules, "the rule instead of the node taint")
        (rule,) = rules
        assert rule.spec.deviceSelector.device == "gpu-0"
        assert (rule.spec.taint.key, rule.spec.taint.effect) == (
            "drahealth.io/unhealthy",
            "NoSchedule",
        )
    finally:
        await new.stop()
