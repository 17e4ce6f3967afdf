"""``status``, ``pods``, the dashboard and ``doctor`` show what drahealth's fences cost.

An embedded API server playing Kubernetes 1.35 (no DeviceTaintRule API). What the
controller would write is written directly: node-1 carries drahealth's node taint for
its bad gpu-0, node-2 drahealth's cordon, node-5's bad gpu-0 is held by a quarantine
claim in the controller's namespace (default). Hostile neighbours: node-3 carries a taint
with drahealth's key that someone else wrote, node-4 garbage annotations, and a claim
with drahealth's label and a garbage annotation holds node-4's gpu-0. Pods in ``ml``:
``bystander`` runs on node-1's Healthy gpu-1; Pending pods wait for the tainted node,
the cordoned node, a device (all free ones quarantined), the foreign taint, memory.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.core import DeviceKey, kube_profile
from drahealth.remedy._nodes import NodeDevice, plan_node
from drahealth.remedy._quarantine import allocation, claim_body
from drahealth.web import Dashboard
from tests._support import eventually
from tests.integration.cli.test_views import run
from tests.integration.kube.conftest import client

__all__ = ["client"]

pytestmark = pytest.mark.timeout(120)

D, KEY, CTL = "gpu.example.com", "drahealth.io/unhealthy", "default"
FOREIGN = {"key": KEY, "value": "manual", "effect": "NoSchedule"}


@pytest.fixture
def api_server_options() -> dict[str, Any]:
    return {"data_file": None, "watch_window": 1000, "profile": kube_profile("1.35")}


def gpu(node: str, i: int) -> DeviceKey:
    return DeviceKey(D, node, f"gpu-{i}")


def bad(key: DeviceKey, mode: str) -> NodeDevice:
    return NodeDevice(key, mode, KEY, "", "NoExecute", "any", "XID 79", time.time() - 60)


async def add_node(client: AsyncClient, name: str, *devices: NodeDevice, **spec: Any) -> None:
    """A Node as the controller leaves it after writing ``devices`` (none: untouched)."""
    body, _ = plan_node({"metadata": {"name": name}, "spec": spec}, devices)
    await client.create(Node.from_dict(body))


async def add_slices(client: AsyncClient, node: str, count: int) -> None:
    names = [f"gpu-{i}" for i in range(count)]
    chunks = [names[i : i + 128] for i in range(0, count, 128)]
    for j, chunk in enumerate(chunks):
        pool = {"name": node, "generation": 1, "resourceSliceCount": len(chunks)}
        spec = {
            "driver": D,
            "nodeName": node,
            "pool": pool,
            "devices": [{"name": n} for n in chunk],
        }
        body = {"metadata": {"name": f"{node}-{j}"}, "spec": spec}
        await client.create(ResourceSlice.from_dict(body))


async def add_record(client: AsyncClient, node: str, count: int, unhealthy: set[int]) -> None:
    """The node agent's device-health record: gpu-<i> Unhealthy for i in ``unhealthy``."""
    rows = [
        {"driver": D, "pool": node, "device": f"gpu-{i}",
         "health": "Unhealthy" if i in unhealthy else "Healthy",
         "message": "XID 79" if i in unhealthy else "", "since": time.time() - 300}
        for i in range(count)
    ]  # fmt: skip
    labels = {
        "app.kubernetes.io/component": "device-health",
        "app.kubernetes.io/managed-by": "drahealth-agent",
        "drahealth.io/node": node,
    }
    meta = {"name": f"drahealth-devices-{node}", "namespace": CTL, "labels": labels}
    await client.create(
        ConfigMap.from_dict({"metadata": meta, "data": {"devices": json.dumps(rows)}})
    )


async def add_claim(client: AsyncClient, name: str, ns: str, cls: str, device: str = "") -> None:
    request = {"name": "gpu", "exactly": {"deviceClassName": cls}}
    body = {"metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [request]}}}  # fmt: skip
    await client.create(ResourceClaim.from_dict(body))
    if device:
        node, _, dev = device.partition("/")
        result = {"request": "gpu", "driver": D, "pool": node, "device": dev}
        status = {"allocation": {"devices": {"results": [result]}}}
        await client.patch(
            ResourceClaim.Status, name, {"status": status}, namespace=ns,
            patch_type=PatchType.MERGE,
        )  # fmt: skip


async def add_pod(
    client: AsyncClient, name: str, *, claim: str = "", node: str = "", message: str = ""
) -> None:
    """A pod in ``ml``: Running on ``node``, or Pending with the scheduler's ``message``."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x"}]}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    if node:
        spec["nodeName"] = node
    await client.create(
        Pod.from_dict({"metadata": {"name": name, "namespace": "ml"}, "spec": spec})
    )
    status: dict[str, Any] = {"phase": "Running"}
    if message:
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": message}  # fmt: skip
        status = {"phase": "Pending", "conditions": [condition]}
    await client.patch(
        Pod.Status, name, {"status": status}, namespace="ml", patch_type=PatchType.MERGE
    )


def fit(*reasons: str) -> str:
    return f"0/5 nodes are available: {', '.join(reasons)}. preemption: not helpful."


async def quarantine(client: AsyncClient, key: DeviceKey, garbage: bool = False) -> str:
    body = claim_body(bad(key, "quarantine"), CTL)
    if garbage:
        body["metadata"]["name"] = "drahealth-quarantine-garbage"
        body["metadata"]["annotations"]["drahealth.io/quarantine"] = "{not json"
    name = body["metadata"]["name"]
    created = await client.create(ResourceClaim.from_dict(body))
    uid = created.metadata.uid if created.metadata else ""
    await client.patch(
        ResourceClaim.Status, name, {"status": allocation(key, str(uid))},
        namespace=CTL, patch_type=PatchType.MERGE,
    )  # fmt: skip
    return str(name)


async def scenario(client: AsyncClient) -> str:
    await client.create(Namespace.from_dict({"metadata": {"name": "ml"}}))
    await add_node(client, "node-1", bad(gpu("node-1", 0), "node-taint"))
    await add_node(client, "node-2", bad(gpu("node-2", 0), "cordon"))
    await add_node(client, "node-3", taints=[FOREIGN])
    await client.create(Node.from_dict({"metadata": {"name": "node-4", "annotations": {
        "drahealth.io/unhealthy-devices": "[{", "drahealth.io/node-taints": "[" * 5000,
        "drahealth.io/cordoned": "",
    }}}))  # fmt: skip
    await add_node(client, "node-5")
    for n in range(1, 6):
        await add_slices(client, f"node-{n}", 4)
        await add_record(client, f"node-{n}", 4, {0} if n in (1, 2, 5) else set())
    gpu_class = {"metadata": {"name": "g"}, "spec": {"selectors": [
        {"cel": {"expression": f'device.driver == "{D}"'}}]}}  # fmt: skip
    await client.create(DeviceClass.from_dict(gpu_class))
    held = await quarantine(client, gpu("node-5", 0))
    await quarantine(client, gpu("node-4", 0), garbage=True)
    await add_claim(client, "bystander-gpu", "ml", "g", "node-1/gpu-1")
    await add_pod(client, "bystander", claim="bystander-gpu", node="node-1")
    await add_claim(client, "wait-device-gpu", "ml", "g")
    await add_pod(client, "wait-device", claim="wait-device-gpu",
                  message=fit("cannot allocate all claims"))  # fmt: skip
    await add_pod(client, "wait-taint", message=fit(
        f"1 node(s) had untolerated taint {{{KEY}: gpu-0}}", "4 Insufficient memory"))  # fmt: skip
    await add_pod(client, "wait-cordon", message=fit("1 node(s) were unschedulable"))
    await add_pod(client, "wait-foreign", message=fit(
        f"1 node(s) had untolerated taint {{{KEY}: manual}}"))  # fmt: skip
    await add_pod(client, "wait-memory", message=fit("5 Insufficient memory"))
    return held


@pytest.fixture
async def kubeconfig(server: APIServer, client: AsyncClient, tmp_path: Path) -> str:
    return str(server.write_kubeconfig(tmp_path / "kubeconfig"))


def fenced_rows(rows: list[dict[str, Any]]) -> dict[str, tuple[str, str | None]]:
    return {
        r["device"].removeprefix(f"{D}/"): (
            r["health"], None if r["fencedBy"] is None else
            f"{r['fencedBy']['kind']}/{r['fencedBy']['name']} {r['fencedBy']['mode']}"
        )
        for r in rows
    }  # fmt: skip


async def test_status_lists_every_device_a_fence_covers(
    client: AsyncClient, kubeconfig: str
) -> None:
    held = await scenario(client)
    out = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig, "-o", "json")
    assert out.returncode == 0, out.stderr  # the bystander's device is Healthy
    assert "Traceback" not in out.stderr
    rows = json.loads(out.stdout)
    taint, cordon = "Node/node-1 node-taint", "Node/node-2 cordon"
    quarantined = f"ResourceClaim/{held} quarantine"
    assert fenced_rows(rows) == {
        **{f"node-1/gpu-{i}": ("Unhealthy" if i == 0 else "Healthy", taint) for i in range(4)},
        **{f"node-2/gpu-{i}": ("Unhealthy" if i == 0 else "Healthy", cordon) for i in range(4)},
        "node-5/gpu-0": ("Unhealthy", quarantined),
    }  # node-3's foreign taint, node-4's garbage and the garbage claim fence nothing
    gpu1 = next(r for r in rows if r["device"] == f"{D}/node-1/gpu-1")
    assert gpu1["fencedBy"] == {
        "kind": "Node", "name": "node-1", "mode": "node-taint",
        "for": [f"{D}/node-1/gpu-0"], "forCount": 1,
        "taints": [{"key": KEY, "value": "gpu-0", "effect": "NoSchedule"}],
    }  # fmt: skip
    assert gpu1["taints"] == [] and [c["pod"] for c in gpu1["consumers"]] == ["bystander"]
    q = next(r for r in rows if r["device"] == f"{D}/node-5/gpu-0")["fencedBy"]
    assert (q["namespace"], q["by"], q["for"]) == (CTL, "controller", [f"{D}/node-5/gpu-0"])
    assert "fenced by drahealth: node/node-1" in out.stderr  # machine output: lines on stderr

    table = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig)
    assert table.returncode == 0, table.stderr
    header = next(line for line in table.stdout.splitlines() if line.startswith("NODE "))
    assert header.split()[-1] == "FENCED"
    line = next(x for x in table.stdout.splitlines() if x.startswith("node-1 ") and "gpu-2" in x)
    assert line.endswith(f"node/node-1 (node-taint for {D}/node-1/gpu-0)")
    assert f"claim {CTL}/{held} (quarantine)" in table.stdout
    assert (
        f"fenced by drahealth: node/node-1 (node-taint for {D}/node-1/gpu-0): no new pod gets "
        "any of the node's 4 devices" in table.stdout
    )
    assert f"fenced by drahealth: node/node-2 (cordon for {D}/node-2/gpu-0)" in table.stdout
    assert "node/node-3" not in table.stdout and "node/node-4" not in table.stdout
    assert "fenced by drahealth: 1 device held by quarantine claims" in table.stdout

    # pods of ml only: the quarantine claims are still read in the controller's namespace
    ns = await asyncio.to_thread(
        run, "status", "-n", "ml", "--kubeconfig", kubeconfig, "-o", "json"
    )
    assert ns.returncode == 0, ns.stderr
    assert fenced_rows(json.loads(ns.stdout))["node-5/gpu-0"] == ("Unhealthy", quarantined)


async def test_pods_lists_the_pending_pods_the_fences_block(
    client: AsyncClient, kubeconfig: str
) -> None:
    held = await scenario(client)
    out = await asyncio.to_thread(run, "pods", "-n", "ml", "--kubeconfig", kubeconfig, "-o", "json")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    rows = json.loads(out.stdout)
    assert [(r["pod"], r["device"], r["message"]) for r in rows] == [
        ("bystander", f"{D}/node-1/gpu-1", ""),
        ("wait-cordon", "", "Pending: blocked by node/node-2 cordon"),
        ("wait-device", "", "Pending: no free device (1 quarantined)"),
        ("wait-taint", "", f"Pending: blocked by node/node-1 taint {KEY}"),
    ]  # not the pod waiting for someone else's taint with our key, nor for memory
    assert rows[0]["blockedBy"] is None
    assert rows[2]["blockedBy"] == [
        {"kind": "ResourceClaim", "mode": "quarantine", "count": 1, "claims": [f"{CTL}/{held}"]}
    ]
    assert rows[3]["blockedBy"][0]["taint"] == {
        "key": KEY,
        "value": "gpu-0",
        "effect": "NoSchedule",
    }
    assert rows[3]["phase"] == "Pending" and "untolerated taint" in rows[3]["scheduler"]
    table = await asyncio.to_thread(run, "pods", "-A", "-o", "wide", "--kubeconfig", kubeconfig)
    assert table.returncode == 0, table.stderr
    line = next(x for x in table.stdout.splitlines() if x.startswith("ml ") and "wait-taint" in x)
    assert f"Pending: blocked by node/node-1 taint {KEY}" in line and "<none>" in line
    # a pod of another driver's class does not count the GPUs quarantined
    other = {"metadata": {"name": "n"}, "spec": {"selectors": [
        {"cel": {"expression": 'device.driver == "nic.example.com"'}}]}}  # fmt: skip
    await client.create(DeviceClass.from_dict(other))
    await add_claim(client, "wait-nic-net", "ml", "n")
    await add_pod(
        client, "wait-nic", claim="wait-nic-net", message=fit("cannot allocate all claims")
    )
    again = await asyncio.to_thread(
        run, "pods", "-n", "ml", "--kubeconfig", kubeconfig, "-o", "json"
    )
    assert "wait-nic" not in [r["pod"] for r in json.loads(again.stdout)]


async def test_thousands_of_fenced_devices_and_blocked_pods_stay_bounded(
    client: AsyncClient, kubeconfig: str
) -> None:
    await client.create(Namespace.from_dict({"metadata": {"name": "ml"}}))
    await add_node(client, "big", bad(gpu("big", 0), "node-taint"))
    await add_slices(client, "big", 3000)
    await add_record(client, "big", 3000, {0})
    for i in range(53):
        await add_pod(client, f"w-{i:02d}", message=fit(
            f"1 node(s) had untolerated taint {{{KEY}: gpu-0}}"))  # fmt: skip
    out = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig, "-o", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) == 101  # the bad device and 100 of the Healthy ones it fences
    assert all(r["fencedBy"]["name"] == "big" for r in rows)
    assert "2899 more fenced devices not listed" in out.stderr
    assert "no new pod gets any of the node's 3000 devices" in out.stderr
    assert len(out.stdout) < 200_000
    pods = await asyncio.to_thread(run, "pods", "-A", "--kubeconfig", kubeconfig, "-o", "json")
    assert pods.returncode == 0, pods.stderr
    assert [r["pod"] for r in json.loads(pods.stdout)] == [f"w-{i:02d}" for i in range(50)]
    assert "3 more Pending pods blocked by drahealth's fences not listed" in pods.stderr


async def _state(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "api/state") as resp:
        state: dict[str, Any] = await resp.json()
        return state


async def test_the_dashboard_shows_fences_and_blocked_pods_live(client: AsyncClient) -> None:
    held = await scenario(client)
    dashboard = Dashboard(client, history_namespace=CTL)
    url = await dashboard.start()
    try:
        async with aiohttp.ClientSession() as http:

            async def fenced() -> dict[str, Any] | None:
                state = await _state(http, url)
                found = {
                    d["key"].removeprefix(f"{D}/"): d["fencedBy"]
                    for n in state["nodes"] for d in n["devices"] if "fencedBy" in d
                }  # fmt: skip
                return state if len(found) == 9 and len(state["pending"]["pods"]) == 3 else None

            state = await eventually(fenced, 10.0, "the fences and the pods they block")
            devices = {d["key"]: d for n in state["nodes"] for d in n["devices"]}
            assert devices[f"{D}/node-1/gpu-3"]["fencedBy"]["mode"] == "node-taint"
            assert devices[f"{D}/node-5/gpu-0"]["fencedBy"]["name"] == held
            assert "fencedBy" not in devices[f"{D}/node-3/gpu-0"]
            assert "fencedBy" not in devices[f"{D}/node-4/gpu-0"]
            assert {p["pod"]: p["message"] for p in state["pending"]["pods"]} == {
                "wait-cordon": "Pending: blocked by node/node-2 cordon",
                "wait-device": "Pending: no free device (1 quarantined)",
                "wait-taint": f"Pending: blocked by node/node-1 taint {KEY}",
            }
            # the controller uncordons node-2: its devices and its pod are free again
            node = (await client.get(Node, "node-2")).to_dict()
            node["metadata"]["annotations"].pop("drahealth.io/cordoned")
            node["spec"].pop("unschedulable")
            await client.replace(Node.from_dict(node))  # type: ignore[call-overload]

            async def freed() -> bool:
                state = await _state(http, url)
                two = [d for n in state["nodes"] if n["name"] == "node-2" for d in n["devices"]]
                pods = [p["pod"] for p in state["pending"]["pods"]]
                return not any("fencedBy" in d for d in two) and "wait-cordon" not in pods

            await eventually(freed, 10.0, "node-2 free again")
    finally:
        await dashboard.stop()


async def test_doctor_says_what_the_mode_costs(client: AsyncClient, kubeconfig: str) -> None:
    for n in range(1, 4):
        await add_slices(client, f"node-{n}", 4 if n < 3 else 1)

    def cost(mode: str) -> str:
        out = run("doctor", "--kubeconfig", kubeconfig, "--component", "controller",
                  "--remediation-mode", mode, "-o", "json")  # fmt: skip
        assert "Traceback" not in out.stderr, out.stderr
        checks = {c["check"]: c for c in json.loads(out.stdout)["checks"]}
        assert checks["mode-cost"]["status"] == "ok"
        return str(checks["mode-cost"]["message"])

    assert await asyncio.to_thread(cost, "node-taint") == (
        "remediation mode node-taint: a bad device fences every device of its node "
        "(3 devices per node on average here)"
    )
    assert await asyncio.to_thread(cost, "quarantine") == (
        "remediation mode quarantine: a bad device fences only itself"
    )
    text = await asyncio.to_thread(run, "doctor", "--kubeconfig", kubeconfig, "--component",
                                   "controller", "--remediation-mode", "cordon")  # fmt: skip
    assert "a bad device fences every device of its node (3 devices" in text.stdout
