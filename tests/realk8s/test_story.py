"""The whole story on the real control plane: real etcd, kube-apiserver,
kube-controller-manager and kube-scheduler at one release (``DRAHEALTH_K8S_VERSION``).

No kubelet runs here: the drahealth agent in kubelet mode plays it (it registers the Node,
renews its Lease, prepares claims through the driver's gRPC and writes pod status). Everything
else is upstream's: the real scheduler allocates the claims and binds the pods, the real
validation judges every object drahealth writes, the real device-taint eviction
controller deletes pods of NoExecute devices (where the release has it), the real
eviction subresource answers 429 under a PodDisruptionBudget.

Each step's latency is printed (``story <release> <gates>: <step> <seconds>``) for the
table in docs/real-kubernetes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget

from drahealth.kube import ServedAPIs, discover, make_client, resource_class
from drahealth.remedy._controller import HISTORY_CONFIGMAP, RemediationController
from drahealth.remedy._policy_load import parse_policy
from drahealth.web import Dashboard
from tests.e2e.test_agent_e2e import AgentProcess
from tests.integration.driver.test_sample_driver import DRAHEALTH, ENV, DriverProcess, inject
from tests.realk8s.harness import Cluster, minor_of

pytestmark = [pytest.mark.timeout(300), pytest.mark.realk8s]

DRIVER = "gpu.example.com"
#: DeviceTaintRule's served version per (minor, gates); None: not served.
RULES_VERSION = {
    ("1.34", "default"): None, ("1.35", "default"): None, ("1.36", "default"): None,
    ("1.37", "default"): "v1",
    ("1.34", "taints"): "v1alpha3", ("1.35", "taints"): "v1alpha3",
    ("1.36", "taints"): "v1beta2", ("1.37", "taints"): "v1",
}  # fmt: skip


async def until(check: Callable[[], Awaitable[Any]], within: float, what: str) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    t0 = time.monotonic()
    last: Any = None  # the last error, or the last answer that was not yet it
    while True:
        try:
            value = await check()
            if value:
                return value
            last = value
        except (ApiError, KeyError, AttributeError, TypeError) as exc:
            last = exc
        if time.monotonic() - t0 > within:
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what} ({last!r})")
        await asyncio.sleep(0.1)


def say(cluster: Cluster, step: str, seconds: float) -> None:
    print(f"\nstory {cluster.version} {cluster.gates}: {step} {seconds:.2f} s")


@pytest.fixture
def base() -> Any:
    d = tempfile.mkdtemp(dir="/tmp", prefix="rk-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.asynccontextmanager
async def node_with_driver(
    base: str, cluster: Cluster, node: str
) -> AsyncIterator[tuple[AgentProcess, DriverProcess]]:
    """The agent (kubelet mode, as ``node``) and the sample driver on that node."""
    agent = AgentProcess(base, cluster.kubeconfig, "--node-name", node)
    await agent.start(timeout=30)
    driver = DriverProcess(base, node=node, kubeconfig=cluster.kubeconfig, health_timeout=5)
    try:
        await driver.start(timeout=30)
        yield agent, driver
    finally:
        if driver.proc is not None and driver.proc.returncode is None:
            await driver.stop()
        driver.close()
        await agent.stop()
        client = make_client(kubeconfig=cluster.kubeconfig)
        try:  # the node goes, so no later test's pod is scheduled onto it
            with contextlib.suppress(ApiError):
                await client.delete(Node, node)
        finally:
            await client.close()


async def served(client: AsyncClient) -> ServedAPIs:
    return await discover(client)


def expected_rules_version(cluster: Cluster) -> str | None:
    return RULES_VERSION[(minor_of(cluster.version), cluster.gates)]


async def test_discovery_on_the_real_server_finds_the_release_and_its_rule_version(
    real_cluster: Cluster, real_client: AsyncClient
) -> None:
    found = await served(real_client)
    assert found.server_version == real_cluster.version
    assert found.api_version("DeviceTaintRule") == (
        None
        if expected_rules_version(real_cluster) is None
        else f"resource.k8s.io/{expected_rules_version(real_cluster)}"
    )
    assert found.served("ResourceSlice") and found.served("ResourceClaim")


async def _device_class(client: AsyncClient, served_apis: ServedAPIs) -> None:
    cls = served_apis.resource("DeviceClass") or resource_class("DeviceClass", "v1")
    body = {
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    with contextlib.suppress(ApiError):
        await client.create(cls.from_dict(body))


async def _claim_and_pod(
    client: AsyncClient, served_apis: ServedAPIs, name: str, labels: dict[str, str], node: str
) -> None:
    """A claim for one device of the driver's class and a pod using it, kept to ``node``
    by a node selector (other tests' nodes stay registered)."""
    claim_cls = served_apis.resource("ResourceClaim") or resource_class("ResourceClaim", "v1")
    await client.create(
        claim_cls.from_dict(
            {
                "metadata": {"name": f"{name}-gpu", "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
                    }
                },
            }
        )
    )
    await client.create(
        Pod.from_dict(
            {
                "metadata": {"name": name, "namespace": "default", "labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 1,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                },
            }
        )
    )


async def _allocated(client: AsyncClient, served_apis: ServedAPIs, name: str) -> str:
    """The device the real scheduler allocated to ``name``'s claim, or '' while none."""
    claim_cls = served_apis.resource("ResourceClaim") or resource_class("ResourceClaim", "v1")
    claim = await client.get(claim_cls, f"{name}-gpu", namespace="default")
    alloc = (claim.status.allocation if claim.status else None) if claim else None
    if alloc is None or alloc.devices is None or not alloc.devices.results:
        return ""
    return str(alloc.devices.results[0].device)


async def _pod_device_health(client: AsyncClient, name: str) -> dict[str, str]:
    pod = await client.get(Pod, name, namespace="default")
    out: dict[str, str] = {}
    for cs in (pod.status.containerStatuses or []) if pod.status else []:
        for entry in cs.allocatedResourcesStatus or []:
            for res in entry.resources or []:
                out[str(res.resourceID)] = str(res.health)
    return out


class PodWatch:
    """Watches one pod from now on: the reason of the ``DisruptionTarget`` condition it
    carried while being deleted (a poll can miss it: the pod may be gone in 0.1 s)."""

    def __init__(self, client: AsyncClient, name: str) -> None:
        self.seen = ""
        self._task = asyncio.create_task(self._run(client, name))

    async def _run(self, client: AsyncClient, name: str) -> None:
        fields = {"metadata.name": name}
        async for _op, pod in client.watch(Pod, namespace="default", fields=fields):
            conds = (pod.status.conditions or []) if pod.status else []
            target = [str(c.reason) for c in conds if c.type == "DisruptionTarget"]
            deleting = bool(pod.metadata and pod.metadata.deletionTimestamp)
            if target and (deleting or _op == "DELETED"):
                self.seen = target[0]
            elif (deleting or _op == "DELETED") and not self.seen:
                self.seen = "no condition"

    async def reason(self) -> str:
        return self.seen

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def _gone(client: AsyncClient, name: str) -> bool:
    try:
        pod = await client.get(Pod, name, namespace="default")
    except ApiError as exc:
        return exc.status.code == 404
    return bool(pod.metadata and pod.metadata.deletionTimestamp)


POLICY = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
eviction: {{mode: {mode}}}
rules:
  - name: xid
    match: {{driver: gpu.example.com, message: XID}}
    action: {{effect: NoExecute}}
    recovery: {{healthyFor: 2s}}
"""


async def test_fault_taint_eviction_replacement_and_recovery(
    real_cluster: Cluster, real_client: AsyncClient, base: str
) -> None:
    """Health -> DeviceTaintRule at the served version -> the pod leaves -> the real
    scheduler places the replacement on a healthy device -> recovery removes the rule."""
    client = real_client
    served_apis = await served(client)
    rules_version = expected_rules_version(real_cluster)
    node = "story-node"
    async with node_with_driver(base, real_cluster, node) as (_agent, driver):
        t0 = time.monotonic()
        await until(lambda: _node_ready(client, node), 60, "the Node to be Ready")
        say(real_cluster, "node registered and Ready", time.monotonic() - t0)
        slice_cls = served_apis.resource("ResourceSlice") or resource_class("ResourceSlice", "v1")

        async def slices() -> list[Any]:
            return [
                s
                async for s in client.list(slice_cls)
                if s.spec and s.spec.driver == DRIVER and s.spec.nodeName == node
            ]

        published = await until(slices, 30, "the driver's ResourceSlice")
        devices = sorted(d.name for s in published for d in (s.spec.devices or []))
        assert devices, published
        await _device_class(client, served_apis)

        t0 = time.monotonic()
        await _claim_and_pod(client, served_apis, "trainer", {"app": "trainer"}, node)
        bad = await until(
            lambda: _allocated(client, served_apis, "trainer"), 60, "the scheduler's allocation"
        )
        await until(lambda: _bound(client, "trainer", node), 30, "the pod bound to the node")
        say(real_cluster, "claim allocated and pod bound by kube-scheduler", time.monotonic() - t0)
        await until(lambda: _running(client, "trainer"), 60, "the pod Running")

        mode = "delete" if rules_version is not None else "evict"
        controller = RemediationController(
            client, parse_policy(POLICY.format(mode=mode), "p"), identity="story"
        )
        ctl = asyncio.create_task(controller.run())
        try:
            await until(lambda: _synced(controller), 60, "the controller to start")
            assert controller.choice is not None
            print(f"\nmode {real_cluster.version} {real_cluster.gates}: "
                  f"{controller.choice.mode} ({controller.choice.why})")  # fmt: skip
            if rules_version is not None:
                assert controller.choice.mode == "taint-rules", controller.choice
            leaving = PodWatch(client, "trainer")
            t0 = time.monotonic()
            rc = await inject(driver.state, bad, "unhealthy", "--message", "XID 79")
            assert rc[0] == 0, rc
            if await _health_field_kept(client):
                await until(
                    lambda: _unhealthy_in_pod(client, "trainer"), 60, "Unhealthy in pod status"
                )
                say(real_cluster, "fault -> pod allocatedResourcesStatus", time.monotonic() - t0)
            if rules_version is not None:
                rule_cls = resource_class("DeviceTaintRule", rules_version)
                rule = await until(
                    lambda: _rule_for(client, rule_cls, node, bad), 30, "the DeviceTaintRule"
                )
                say(real_cluster, f"fault -> DeviceTaintRule {rules_version}",
                    time.monotonic() - t0)  # fmt: skip
                assert rule.spec.taint.effect == "NoExecute"
            try:
                why = await until(leaving.reason, 60, "the pod to leave its bad device")
            finally:
                await leaving.stop()
            say(real_cluster, "fault -> pod evicted", time.monotonic() - t0)
            if rules_version is not None:  # mode delete: upstream's controller did it
                assert why == "DeletionByDeviceTaintManager", why
            else:  # no rules: drahealth's own eviction, through the Eviction API
                assert why == "EvictionByEvictionAPI", why

            if rules_version is not None:
                # the real scheduler refuses the tainted device: the replacement goes elsewhere
                await until(lambda: _deleted(client, "trainer"), 60, "the old pod deleted")
                await _delete_claim(client, served_apis, "trainer")
                t0 = time.monotonic()
                await _claim_and_pod(client, served_apis, "trainer-2", {"app": "trainer"}, node)
                again = await until(
                    lambda: _allocated(client, served_apis, "trainer-2"), 60, "a new allocation"
                )
                say(real_cluster, "replacement placed by kube-scheduler", time.monotonic() - t0)
                assert again != bad, f"the scheduler placed the replacement on tainted {bad}"

                t0 = time.monotonic()
                rc = await inject(driver.state, bad, "healthy")
                assert rc[0] == 0, rc
                await until(lambda: _no_rule(client, rule_cls, node, bad), 60, "the rule removed")
                say(real_cluster, "recovery -> DeviceTaintRule removed", time.monotonic() - t0)
            cm = await client.get(ConfigMap, HISTORY_CONFIGMAP, namespace="default")
            actions = [h["action"] for h in json.loads((cm.data or {}).get("history", "[]"))]
            assert "create" in actions or rules_version is None, actions
        finally:
            ctl.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ctl


async def test_evictions_go_through_the_real_eviction_api_and_a_budget_refuses_them(
    real_cluster: Cluster, real_client: AsyncClient, base: str
) -> None:
    """PDB-aware eviction: the real API server answers 429 while the budget allows no
    disruption; the controller reports EvictionBlocked and evicts once it allows."""
    client = real_client
    served_apis = await served(client)
    node = "pdb-node"
    async with node_with_driver(base, real_cluster, node) as (_agent, driver):
        await until(lambda: _node_ready(client, node), 60, "the Node to be Ready")
        await _device_class(client, served_apis)
        await _claim_and_pod(client, served_apis, "guarded", {"app": "guarded"}, node)
        bad = await until(
            lambda: _allocated(client, served_apis, "guarded"), 60, "the scheduler's allocation"
        )
        await until(lambda: _running(client, "guarded"), 60, "the pod Running")
        pdb = PodDisruptionBudget.from_dict(
            {
                "metadata": {"name": "guarded", "namespace": "default"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
            }
        )
        await client.create(pdb)
        await until(lambda: _pdb_observed(client, "guarded"), 30, "the disruption controller")
        controller = RemediationController(
            client, parse_policy(POLICY.format(mode="evict"), "p"), identity="pdb"
        )
        ctl = asyncio.create_task(controller.run())
        try:
            t0 = time.monotonic()
            rc = await inject(driver.state, bad, "unhealthy", "--message", "XID 79")
            assert rc[0] == 0, rc
            blocked = await until(
                lambda: _blocked_event(client, "guarded"), 60, "an EvictionBlocked Event"
            )
            say(real_cluster, "fault -> eviction refused by the budget (429)",
                time.monotonic() - t0)  # fmt: skip
            assert "disruption budget" in blocked, blocked
            assert not await _gone(client, "guarded")
            await _views_show_the_blocked_pod(real_cluster, client, node, bad)
            await client.delete(PodDisruptionBudget, "guarded", namespace="default")
            t0 = time.monotonic()
            await until(lambda: _gone(client, "guarded"), 60, "the eviction once allowed")
            say(real_cluster, "budget removed -> evicted", time.monotonic() - t0)
        finally:
            ctl.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ctl


async def _views_show_the_blocked_pod(
    cluster: Cluster, client: AsyncClient, node: str, bad: str
) -> None:
    """The CLI's views and the dashboard, against the real server: the pod on the bad
    device, the device, and the blocked eviction, in words."""
    key = f"{DRIVER}/{node}/{bad}"
    rc, out = await drahealth("pods", "-o", "wide", kubeconfig=cluster.kubeconfig)
    line = next((ln for ln in out.splitlines() if " guarded " in ln), "")
    assert bad in line, out
    if await _health_field_kept(client):
        assert rc == 3, out  # a listed pod has an Unhealthy device
        assert "Unhealthy" in line, out
    else:  # 1.34/1.35 default gates: the server drops allocatedResourcesStatus
        assert rc == 0 and line.split()[4] == "-", out
    rc, out = await drahealth("status", kubeconfig=cluster.kubeconfig)
    assert f"Kubernetes {cluster.version}" in out and bad in out and node in out, out
    dashboard = Dashboard(client)
    url = await dashboard.start()
    try:
        async with aiohttp.ClientSession() as http:

            async def state() -> dict[str, Any]:
                async with http.get(f"{url.rstrip('/')}/api/state") as resp:
                    body: dict[str, Any] = await resp.json()
                    return body

            async def shows_blocked() -> list[dict[str, Any]]:
                return [d for d in _devices(await state()) if d["key"] == key and d["blocked"]]

            entry = await until(shows_blocked, 30, "the dashboard to show the blocked eviction")
            assert entry[0]["blocked"][0]["pod"] == "default/guarded", entry
            assert entry[0]["health"] == "Unhealthy", entry
    finally:
        await dashboard.stop()


def _devices(state: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for node in state.get("nodes") or []:
        out.extend(node.get("devices") or [])
    return out


async def drahealth(*args: str, kubeconfig: str) -> tuple[int, str]:
    """Run the drahealth CLI against the real server; (exit code, stdout + stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *DRAHEALTH, *args, "--kubeconfig", kubeconfig, env=ENV,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


# -- reads ----------------------------------------------------------------------------------


async def _synced(controller: RemediationController) -> bool:
    return controller.synced


async def _node_ready(client: AsyncClient, node: str) -> bool:
    obj = await client.get(Node, node)
    conds = (obj.status.conditions or []) if obj.status else []
    return any(c.type == "Ready" and c.status == "True" for c in conds)


async def _bound(client: AsyncClient, name: str, node: str) -> bool:
    pod = await client.get(Pod, name, namespace="default")
    return bool(pod.spec and pod.spec.nodeName == node)


async def _running(client: AsyncClient, name: str) -> bool:
    pod = await client.get(Pod, name, namespace="default")
    return bool(pod.status and pod.status.phase == "Running")


async def _unhealthy_in_pod(client: AsyncClient, name: str) -> bool:
    return "Unhealthy" in (await _pod_device_health(client, name)).values()


async def _health_field_kept(client: AsyncClient) -> bool:
    """Whether this server keeps allocatedResourcesStatus (ResourceHealthStatus on)."""
    async for pod in client.list(Pod, namespace="default"):
        for cs in (pod.status.containerStatuses or []) if pod.status else []:
            if cs.allocatedResourcesStatus:
                return True
    return False


async def _rule_for(client: AsyncClient, cls: Any, pool: str, device: str) -> Any:
    async for rule in client.list(cls):
        sel = rule.spec.deviceSelector if rule.spec else None
        if sel is not None and sel.pool == pool and sel.device == device:
            return rule
    return None


async def _no_rule(client: AsyncClient, cls: Any, pool: str, device: str) -> bool:
    return await _rule_for(client, cls, pool, device) is None


async def _deleted(client: AsyncClient, name: str) -> bool:
    try:
        await client.get(Pod, name, namespace="default")
    except ApiError as exc:
        return exc.status.code == 404
    return False


async def _delete_claim(client: AsyncClient, served_apis: ServedAPIs, name: str) -> None:
    claim_cls = served_apis.resource("ResourceClaim") or resource_class("ResourceClaim", "v1")
    with contextlib.suppress(ApiError):
        await client.delete(claim_cls, f"{name}-gpu", namespace="default")


async def _pdb_observed(client: AsyncClient, name: str) -> bool:
    pdb = await client.get(PodDisruptionBudget, name, namespace="default")
    return bool(pdb.status and pdb.status.observedGeneration)


async def _blocked_event(client: AsyncClient, pod: str) -> str:
    async for e in client.list(Event, namespace="default"):
        obj = e.involvedObject
        if e.reason == "EvictionBlocked" and obj is not None and obj.name == pod:
            return str(e.message)
    return ""
