"""Repeated-fault escalation and repair actions: the controller on the embedded plane.

A device that goes bad three times within the window needs a human (its rule keeps the
taint, annotated, with an Event and the state key) until ``drahealth clear``; an exec
repair waits for the device's pods to leave and holds the untaint until it succeeds; a
Job repair runs on the device's node through the Job stand-in (the test plays the
kubelet and finishes the pod); a repair that keeps failing marks the device.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from lightkube import AsyncClient
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, Event, Pod
from lightkube.types import PatchType

from drahealth.cli import main
from drahealth.controlplane import APIServer
from drahealth.remedy._controller import HISTORY_CONFIGMAP
from drahealth.standins._jobs import JobStandIn
from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client
from tests.integration.remedy.test_controller import (
    DRIVER,
    NODE,
    make_pod,
    policy,
    rules,
    running,
    set_health,
)

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(60)

KEY = f"{DRIVER}/{NODE}/gpu-0"
NEEDS_HUMAN = "drahealth.io/needs-human"


async def our_rule(client: AsyncClient) -> Any:
    found = [r for n, r in (await rules(client)).items() if n.startswith("dh-")]
    return found[0] if found else None


async def no_rule(client: AsyncClient) -> bool:
    return await our_rule(client) is None


async def state(client: AsyncClient) -> dict[str, Any]:
    cm = await client.get(ConfigMap, "drahealth-remediation-state", namespace="default")
    return {k: json.loads(v) for k, v in (cm.data or {}).items()}


async def history(client: AsyncClient) -> list[dict[str, Any]]:
    cm = await client.get(ConfigMap, HISTORY_CONFIGMAP, namespace="default")
    rows: list[dict[str, Any]] = json.loads((cm.data or {}).get("history", "[]"))
    return rows


async def actions_until(client: AsyncClient, action: str) -> list[str] | None:
    """The history's actions once it holds ``action`` (it is written at a pass's end)."""
    actions = [h["action"] for h in await history(client)]
    return actions if action in actions else None


async def events(client: AsyncClient, reason: str) -> list[Any]:
    return [e async for e in client.list(Event, namespace="default") if e.reason == reason]


async def episode(client: AsyncClient, *, recovers: bool) -> Any:
    await set_health(client, gpu_0=("Unhealthy", "XID 79"))
    rule = await eventually(lambda: our_rule(client), 5, "the device's rule")
    await set_health(client, gpu_0="Healthy")
    if recovers:
        await eventually(lambda: no_rule(client), 5, "recovery to remove the rule")
    return rule


async def test_three_episodes_need_a_human_until_cleared(
    client: AsyncClient, server: APIServer, tmp_path: Path
) -> None:
    p = policy(
        "- name: xid\n  match: {driver: gpu.example.com}\n  hysteresis: null\n"
        "  recovery: {healthyFor: 0.3s}\n",
        extra="escalation: {episodes: 3, window: 24h}\n",
    )
    await set_health(client, gpu_0="Healthy")
    async with running(client, p) as controller:
        await eventually(lambda: controller.passes >= 1, 5, "a first pass")
        await episode(client, recovers=True)
        await episode(client, recovers=True)
        await episode(client, recovers=False)

        async def annotated() -> str | None:
            rule = await our_rule(client)
            return None if rule is None else (rule.metadata.annotations or {}).get(NEEDS_HUMAN)

        why = await eventually(annotated, 5, "the needs-human annotation")
        assert why == "3 bad episodes within 24h"
        await eventually(lambda: events(client, "DeviceNeedsHuman"), 5, "a DeviceNeedsHuman Event")

        async def needs_human() -> Any:
            # the state is written at the end of the pass that marked the device
            return ((await state(client)) or {}).get("needsHuman", {}).get(KEY)

        marked = await eventually(needs_human, 5, "the needsHuman state key")
        assert (marked["why"], marked["rule"]) == (why, "xid")
        assert len((await state(client))["episodes"][KEY]["episodes"]) == 3
        assert controller.metrics.needs_human._value.get() == 1  # type: ignore[attr-defined]
        await asyncio.sleep(1.0)  # Healthy for 3x healthyFor: still tainted
        assert await our_rule(client) is not None

        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        result = await asyncio.to_thread(
            CliRunner().invoke,
            main,
            ["clear", "--kubeconfig", str(kubeconfig), KEY, "--reason", "reseated", "--by", "me"],
        )
        assert result.exit_code == 0, result.output
        assert "needs a human since" in result.output and "3 bad episodes" in result.output
        await eventually(lambda: no_rule(client), 5, "the untaint after the clear")

        async def cleared() -> bool:
            return (await state(client))["needsHuman"] == {}

        await eventually(cleared, 5, "the needsHuman state key to empty")
        lines = [h for h in await history(client) if h["action"] == "clear"]
        assert lines and "cleared by me: reseated" in lines[0]["message"]
        # the count started again: one more episode recovers
        await episode(client, recovers=True)


async def test_exec_repair_waits_for_the_drain_and_gates_the_untaint(
    client: AsyncClient, tmp_path: Path
) -> None:
    out = tmp_path / "repaired"
    script = f'echo "$DRAHEALTH_DEVICE $DRAHEALTH_NODE" >> {out}'
    p = policy(
        "- name: xid\n  match: {driver: gpu.example.com}\n  hysteresis: null\n"
        "  recovery: {healthyFor: 0.3s}\n"
        f"  repair: {{exec: [sh, -c, {json.dumps(script)}], backoff: 0.1s}}\n"
    )
    await set_health(client, gpu_0="Healthy")
    await make_pod(client, "trainer", "gpu-0", {"app": "t"})
    async with running(client, p) as controller:
        await eventually(lambda: controller.passes >= 1, 5, "a first pass")
        await set_health(client, gpu_0=("Unhealthy", "XID 79"))
        await eventually(lambda: our_rule(client), 5, "the device's rule")
        await set_health(client, gpu_0="Healthy")
        await asyncio.sleep(0.8)  # past healthyFor, but the pod still uses the device
        assert await our_rule(client) is not None and not out.exists()
        assert (await state(client))["repairs"][KEY]["phase"] == "waiting-drain"
        await client.delete(Pod, "trainer", namespace="default")
        await eventually(lambda: no_rule(client), 10, "the untaint after the repair")
        assert out.read_text() == f"{KEY} {NODE}\n"
        actions = await eventually(lambda: actions_until(client, "delete"), 5, "history")
        assert actions.index("repair-start") < actions.index("repair-succeeded")
        assert actions.index("repair-succeeded") < actions.index("delete")


async def test_failing_repair_needs_a_human(client: AsyncClient) -> None:
    p = policy(
        "- name: xid\n  match: {driver: gpu.example.com}\n  hysteresis: null\n"
        "  recovery: {healthyFor: 0.3s}\n"
        f"  repair: {{exec: [{json.dumps(sys.executable)}, -c, 'raise SystemExit(3)'], "
        "attempts: 2, backoff: 0.1s}\n"
        "  escalation: {episodes: 0, failedRepairs: 1}\n"
    )
    await set_health(client, gpu_0="Healthy")
    async with running(client, p) as controller:
        await eventually(lambda: controller.passes >= 1, 5, "a first pass")
        await set_health(client, gpu_0=("Unhealthy", "XID 79"))
        await eventually(lambda: our_rule(client), 5, "the device's rule")
        await set_health(client, gpu_0="Healthy")

        async def marked() -> Any:
            return (await state(client)).get("needsHuman", {}).get(KEY)

        mark = await eventually(marked, 10, "the needs-human mark")
        assert mark["why"] == "1 failed repairs within 24h"
        repair = (await state(client))["repairs"][KEY]
        assert (repair["phase"], repair["attempt"]) == ("failed", 2)
        assert "exit 3" in repair["detail"]
        actions = await eventually(lambda: actions_until(client, "needs-human"), 5, "history")
        assert actions.count("repair-failed") == 2 and actions.count("repair-exhausted") == 1
        assert actions.index("repair-exhausted") < actions.index("needs-human")
        assert await our_rule(client) is not None


@pytest.fixture
async def jobs(server: APIServer) -> AsyncIterator[JobStandIn]:
    from drahealth.kube import make_client

    job_client = make_client(server_url=server.url)
    stand_in = JobStandIn(job_client, backoff=0.05, max_backoff=0.2)
    task = asyncio.create_task(stand_in.run())
    try:
        yield stand_in
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await job_client.close()


async def test_job_repair_runs_on_the_node_then_recovery_untaints(
    client: AsyncClient, jobs: JobStandIn
) -> None:
    template = {
        "spec": {
            "containers": [
                {
                    "name": "reset",
                    "image": "busybox",
                    "command": ["sh", "-c"],
                    "args": ["echo reset $(DRAHEALTH_DEVICE) on $(DRAHEALTH_NODE)"],
                }
            ]
        }
    }
    p = policy(
        "- name: xid\n  match: {driver: gpu.example.com}\n  hysteresis: null\n"
        "  action: {effect: NoExecute}\n  recovery: {healthyFor: 0.3s}\n"
        f"  repair: {{job: {{template: {json.dumps(template)}}}}}\n"
    )
    await set_health(client, gpu_0="Healthy")
    async with running(client, p) as controller:
        await eventually(lambda: controller.passes >= 1, 5, "a first pass")
        await set_health(client, gpu_0=("Unhealthy", "XID 79"))
        await eventually(lambda: our_rule(client), 5, "the device's rule")

        async def job_pod() -> Any:
            pods = [
                p async for p in client.list(Pod, namespace="default")
                if (p.metadata.labels or {}).get("batch.kubernetes.io/job-name", "")
                .startswith("dh-repair-gpu-0-")
            ]  # fmt: skip
            return pods[0] if pods else None

        pod = await eventually(job_pod, 10, "the repair Job's pod")
        spec = pod.spec
        assert spec.nodeName == NODE
        assert spec.containers[0].args == [f"echo reset {KEY} on {NODE}"]
        assert {(t.key, t.operator) for t in spec.tolerations} >= {
            ("drahealth.io/unhealthy", "Exists"),
            ("node.kubernetes.io/unschedulable", "Exists"),
        }
        job_name = pod.metadata.labels["batch.kubernetes.io/job-name"]
        job = await client.get(Job, job_name, namespace="default")
        assert job.metadata.labels["app.kubernetes.io/managed-by"] == "drahealth-controller"
        await set_health(client, gpu_0="Healthy")
        assert await our_rule(client) is not None
        # the kubelet's part: the container ran and exited 0
        await client.patch(
            Pod.Status, pod.metadata.name, {"status": {"phase": "Succeeded"}},
            namespace="default", patch_type=PatchType.MERGE,
        )  # fmt: skip
        await eventually(lambda: no_rule(client), 10, "the untaint after the Job's success")

        async def job_gone() -> bool:
            return not [j async for j in client.list(Job, namespace="default")]

        await eventually(job_gone, 10, "the finished Job deleted")
        await eventually(lambda: actions_until(client, "delete"), 5, "the history written")
        done = [h for h in await history(client) if h["action"] == "repair-succeeded"]
        assert done and job_name in done[0]["message"]
