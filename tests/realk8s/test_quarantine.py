"""Mode quarantine on the real control plane: chosen by ``auto`` where no DeviceTaintRule
API is served (1.34, 1.35 and 1.36 with default gates), asked for where one is (1.37).

The drahealth agent plays the kubelet of one node with three devices of the sample
driver; everything else is upstream's: the real scheduler allocates, the real
resourceclaim controller deallocates the claim of an evicted pod (and keeps the
quarantine claim, whose consumer is not a pod), the real eviction subresource answers
429 under a PodDisruptionBudget. The story: a bad device's pod is evicted once its
budget allows, only then is the device quarantined; a controller restart rewrites
nothing; the scheduler places replacements on the node's two other devices and keeps a
third pod Pending; after recovery the claim is released and that pod gets the device.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget

from drahealth.core import DeviceKey
from drahealth.kube import resource_class
from drahealth.remedy._controller import HISTORY_CONFIGMAP, RemediationController
from drahealth.remedy._policy_load import parse_policy
from drahealth.remedy._quarantine import claim_name
from tests.e2e.test_agent_e2e import AgentProcess
from tests.integration.driver.test_sample_driver import DriverProcess, inject
from tests.realk8s.harness import Cluster
from tests.realk8s.test_story import (
    DRIVER,
    POLICY,
    PodWatch,
    _allocated,
    _blocked_event,
    _bound,
    _claim_and_pod,
    _delete_claim,
    _device_class,
    _node_ready,
    _pdb_observed,
    _running,
    _synced,
    base,
    expected_rules_version,
    say,
    served,
    until,
)

__all__ = ["base"]

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(420)]

ResourceClaim = resource_class("ResourceClaim", "v1")


async def _claim(client: AsyncClient, name: str) -> dict[str, Any] | None:
    try:
        obj = await client.get(ResourceClaim, name, namespace="default")
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise
    out: dict[str, Any] = obj.to_dict()
    return out


async def _events(client: AsyncClient, reason: str) -> list[Any]:
    return [e async for e in client.list(Event, namespace="default") if e.reason == reason]


async def _history(client: AsyncClient) -> list[dict[str, Any]]:
    cm = await client.get(ConfigMap, HISTORY_CONFIGMAP, namespace="default")
    rows: list[dict[str, Any]] = json.loads((cm.data or {}).get("history", "[]"))
    return rows


async def _unschedulable(client: AsyncClient, name: str) -> str:
    pod = await client.get(Pod, name, namespace="default")
    for cond in (pod.status.conditions or []) if pod.status else []:
        if cond.type == "PodScheduled" and cond.reason == "Unschedulable":
            return str(cond.message)
    return ""


@contextlib.asynccontextmanager
async def _controller(client: AsyncClient, identity: str, *, asked: bool) -> Any:
    """The controller in mode quarantine: ``auto``'s choice where no DeviceTaintRule API
    is served, else ``asked`` for by the policy."""
    text = POLICY.format(mode="evict") + ("remediation: {mode: quarantine}\n" if asked else "")
    controller = RemediationController(client, parse_policy(text, "p"), identity=identity)
    task = asyncio.create_task(controller.run())
    try:
        await until(lambda: _synced(controller), 60, "the controller to start")
        yield controller
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_quarantine_fences_one_device_and_gives_it_back(
    real_cluster: Cluster, real_client: AsyncClient, base: str
) -> None:
    asked = expected_rules_version(real_cluster) is not None  # else auto chooses it
    client = real_client
    served_apis = await served(client)
    node = "quarantine-node"
    agent = AgentProcess(base, real_cluster.kubeconfig, "--node-name", node)
    await agent.start(timeout=30)
    driver = DriverProcess(
        base, node=node, kubeconfig=real_cluster.kubeconfig, health_timeout=5, devices=3
    )
    try:
        await driver.start(timeout=30)
        await until(lambda: _node_ready(client, node), 60, "the Node to be Ready")
        await _device_class(client, served_apis)
        await _claim_and_pod(client, served_apis, "qa", {"app": "qa"}, node)
        bad = await until(lambda: _allocated(client, served_apis, "qa"), 60, "an allocation")
        await until(lambda: _running(client, "qa"), 60, "the pod Running")
        key = DeviceKey(DRIVER, node, bad)
        name = claim_name(key)
        pdb = {
            "metadata": {"name": "qa", "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "qa"}}},
        }
        await client.create(PodDisruptionBudget.from_dict(pdb))
        await until(lambda: _pdb_observed(client, "qa"), 30, "the disruption controller")

        async with _controller(client, "q1", asked=asked) as controller:
            assert controller.choice is not None
            assert controller.choice.mode == "quarantine", controller.choice
            leaving = PodWatch(client, "qa")
            t0 = time.monotonic()
            assert (await inject(driver.state, bad, "unhealthy", "--message", "XID 79"))[0] == 0
            await until(lambda: _blocked_event(client, "qa"), 60, "EvictionBlocked (429)")
            # the pod still holds the device: the quarantine waits, never takes it
            await until(lambda: _events(client, "DeviceQuarantineWaiting"), 30, "the wait")
            assert await _claim(client, name) is None
            say(real_cluster, "quarantine waits while the budget holds the pod",
                time.monotonic() - t0)  # fmt: skip
            await client.delete(PodDisruptionBudget, "qa", namespace="default")
            t0 = time.monotonic()
            try:
                why = await until(leaving.reason, 60, "the pod to leave its bad device")
            finally:
                await leaving.stop()
            assert why == "EvictionByEvictionAPI", why

            async def fenced() -> dict[str, Any] | None:
                c = await _claim(client, name)
                return c if c and (c.get("status") or {}).get("allocation") else None

            claim = await until(fenced, 60, "the quarantine claim allocated")
            say(real_cluster, "budget removed -> evicted -> quarantined", time.monotonic() - t0)
            assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == bad
            assert claim["status"]["reservedFor"][0]["resource"] == "devicequarantines"
        version = claim["metadata"]["resourceVersion"]
        done = [r for r in await _history(client) if r["action"] == "quarantine-quarantined"]

        # a restart in the middle: the new controller resumes it and writes nothing
        async with _controller(client, "q2", asked=asked) as controller:
            await asyncio.sleep(3)
            again = await _claim(client, name)
            assert again is not None and again["metadata"]["resourceVersion"] == version
            assert key in controller.quarantine.written()  # (others' tests may leave more)
            rows = [r for r in await _history(client) if r["action"] == "quarantine-quarantined"]
            assert rows == done, rows  # not quarantined again

            # the real resourceclaim controller kept it (its consumer is not a pod); the
            # real scheduler places two pods on the other two devices, the third waits
            await _delete_claim(client, served_apis, "qa")
            t0 = time.monotonic()
            got = set()
            for pod in ("qb", "qc"):
                await _claim_and_pod(client, served_apis, pod, {"app": pod}, node)
                got.add(
                    await until(lambda p=pod: _allocated(client, served_apis, p), 60, "allocation")
                )
                await until(lambda p=pod: _bound(client, p, node), 30, "bound")
            say(real_cluster, "two replacements placed around the quarantine",
                time.monotonic() - t0)  # fmt: skip
            assert bad not in got and len(got) == 2, got
            await _claim_and_pod(client, served_apis, "qd", {"app": "qd"}, node)
            message = await until(lambda: _unschedulable(client, "qd"), 60, "qd Unschedulable")
            assert "cannot allocate all claims" in message, message

            t0 = time.monotonic()
            assert (await inject(driver.state, bad, "healthy"))[0] == 0

            async def released() -> bool:
                return await _claim(client, name) is None

            await until(released, 60, "the quarantine released after recovery")
            assert await until(lambda: _allocated(client, served_apis, "qd"), 60, "qd") == bad
            say(real_cluster, "recovery -> released -> the waiting pod gets the device",
                time.monotonic() - t0)  # fmt: skip
            actions = [r["action"] for r in await _history(client)]
            assert "quarantine-released" in actions, actions
    finally:
        if driver.proc is not None and driver.proc.returncode is None:
            await driver.stop()
        driver.close()
        await agent.stop()
        for pod in ("qa", "qb", "qc", "qd"):
            with contextlib.suppress(ApiError):
                await client.delete(Pod, pod, namespace="default", grace_period=0)
            with contextlib.suppress(ApiError):
                await _delete_claim(client, served_apis, pod)
        with contextlib.suppress(ApiError):  # no later test's pod lands on it
            await client.delete(Node, node)
