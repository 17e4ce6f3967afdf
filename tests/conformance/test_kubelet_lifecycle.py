"""Conformance: the simulated kubelet's node registration, container lifecycle and logs.

Written from upstream's kubelet: ``pkg/kubelet/kubelet_node_status.go`` (initial node
labels ``kubernetes.io/hostname``/``os``/``arch``), ``pkg/kubelet/nodestatus/setters.go``
(the ``Ready`` condition, reason ``KubeletReady``, "kubelet is posting ready status";
pressure conditions False; ``daemonEndpoints.kubeletEndpoint.Port``),
``pkg/kubelet/nodelease`` (the Lease in ``kube-node-lease``, 40 s duration),
``pkg/kubelet/kubelet_pods.go`` (``getPhase``: Succeeded when every container exited 0
and none restarts, Failed otherwise; terminated reason ``Completed``/``Error``) and
kube-apiserver's ``pkg/registry/core/pod/rest/log.go`` with ``LogLocation`` (the
``pods/log`` subresource proxied to the node's kubelet ``/containerLogs``). A real
kubectl reads nodes and logs. The agent runs in kubelet mode in process, with the
sample driver writing CDI specs, against the embedded API server over HTTP.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.core import Health, kube_profile
from drahealth.driver import DeviceReport, HealthHub, PluginOptions, start
from drahealth.kube import make_client
from drahealth.node import AgentConfig, NodeAgent, kubelet_settings
from drahealth.simdriver import SampleDriver
from tests._support import eventually

pytestmark = pytest.mark.timeout(60)

DRIVER = "gpu.example.com"
NODE = "node-1"
DEVICES = [(NODE, f"gpu-{i}") for i in range(3)]
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))


@asynccontextmanager
async def kubelet(
    sockdir: str, hub: HealthHub | None = None
) -> AsyncIterator[tuple[APIServer, AsyncClient, NodeAgent]]:
    """The agent in kubelet mode with the sample driver; ``hub`` feeds the driver's
    health (a fresh one, all healthy, by default)."""
    server = APIServer(profile=kube_profile("1.37"))
    await server.start(host="127.0.0.1", port=0)
    client = make_client(server_url=server.url)
    hub = hub or HealthHub(DEVICES, default_timeout_seconds=30)
    hub.submit("sim", [DeviceReport(p, d, Health.HEALTHY) for p, d in DEVICES])
    cdi = f"{sockdir}/cdi"
    options = PluginOptions(
        DRIVER,
        node_name=NODE,
        registry_dir=f"{sockdir}/reg",
        plugins_dir=f"{sockdir}/plugins",
        cdi_dir=cdi,
        state_dir=f"{sockdir}/driver",
        kube_client=client,
    )
    config = AgentConfig(
        node_name=NODE,
        registry_dir=f"{sockdir}/reg",
        state_dir=f"{sockdir}/agent",
        rescan_interval=0.05,
        cdi_dirs=[cdi],
        **kubelet_settings(kube_profile("1.37")),
    )
    agent = NodeAgent(config, client)
    handle = None
    try:
        handle = await start(SampleDriver(DEVICES, hub), options, health=hub)
        await agent.start()
        await eventually(lambda: agent.registry.drivers() == [DRIVER], 5, "driver registered")
        yield server, client, agent
    finally:
        await agent.stop()
        if handle is not None:
            await handle.stop(0)
        hub.close()
        await client.close()
        await server.stop()


async def make_pod(
    client: AsyncClient, name: str, container: dict[str, Any], device: str = "gpu-0", **spec: Any
) -> None:
    claim = {
        "metadata": {"name": f"{name}-gpu", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
    }
    await client.create(ResourceClaim.from_dict(claim))
    # each pod its own device: the driver refuses a device another prepared claim holds
    results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]
    await client.patch(
        ResourceClaim.Status,
        f"{name}-gpu",
        {"status": {"allocation": {"devices": {"results": results}}}},
        namespace="default",
        patch_type=PatchType.MERGE,
    )
    container = {"image": "ubuntu:22.04", "resources": {"claims": [{"name": "gpu"}]}, **container}
    pod = {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
            "containers": [container],
            **spec,
        },
    }
    await client.create(Pod.from_dict(pod))


async def phase(client: AsyncClient, name: str) -> dict[str, Any]:
    status: dict[str, Any] = (await client.get(Pod, name, namespace="default")).to_dict()["status"]
    return status


async def kubectl(server: APIServer, tmp: Path, *args: str) -> str:
    """Run kubectl without blocking the loop the server runs in."""
    if KUBECTL is None:
        pytest.skip("kubectl not installed next to the interpreter")
    config = tmp / "kubeconfig"
    server.write_kubeconfig(config)
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", str(config), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
    return out.decode()


async def test_node_registers_ready_with_labels_capacity_and_lease(
    sockdir: str, tmp_path: Path
) -> None:
    async with kubelet(sockdir) as (server, client, _agent):
        node = (await client.get(Node, NODE)).to_dict()
        labels = node["metadata"]["labels"]
        assert labels["kubernetes.io/hostname"] == NODE
        assert labels["kubernetes.io/os"] == "linux" and labels["kubernetes.io/arch"]
        ready = {c["type"]: c for c in node["status"]["conditions"]}
        assert ready["Ready"]["status"] == "True" and ready["Ready"]["reason"] == "KubeletReady"
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure"):
            assert ready[kind]["status"] == "False"
        for key in ("cpu", "memory", "pods", "ephemeral-storage"):
            assert node["status"]["allocatable"][key]
        assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] > 0
        lease = await client.get(Lease, NODE, namespace="kube-node-lease")
        assert lease.spec.holderIdentity == NODE and lease.spec.leaseDurationSeconds == 40
        out = await kubectl(server, tmp_path, "get", "nodes", "--no-headers")
        assert out.split()[:2] == [NODE, "Ready"], out
        described = await kubectl(server, tmp_path, "describe", "node", NODE)
        assert "-9223372036854775808" not in described and "Allocated resources" in described


async def test_containers_finish_with_phase_and_logs(sockdir: str, tmp_path: Path) -> None:
    async with kubelet(sockdir) as (server, client, _agent):
        await make_pod(
            client, "ok", {"name": "c", "command": ["true"]}, "gpu-1", restartPolicy="Never"
        )
        await make_pod(
            client, "bad", {"name": "c", "command": ["sh", "-c", "exit 3"]}, "gpu-2",
            restartPolicy="Never",
        )  # fmt: skip
        script = "echo hello; export; trap 'exit 0' TERM; sleep 9999 & wait"
        await make_pod(client, "long", {"name": "ctr0", "command": ["bash", "-c"],
                                        "args": [script]})  # fmt: skip

        async def ended(name: str, want: str) -> bool:
            return (await phase(client, name)).get("phase") == want

        await eventually(lambda: ended("ok", "Succeeded"), 10, "pod ok Succeeded")
        await eventually(lambda: ended("bad", "Failed"), 10, "pod bad Failed")
        bad = (await phase(client, "bad"))["containerStatuses"][0]["state"]["terminated"]
        assert (bad["exitCode"], bad["reason"]) == (3, "Error")
        ok = (await phase(client, "ok"))["containerStatuses"][0]["state"]["terminated"]
        assert (ok["exitCode"], ok["reason"]) == (0, "Completed")
        await eventually(lambda: ended("long", "Running"), 10, "pod long Running")
        logs = await kubectl(server, tmp_path, "logs", "long")
        assert logs.startswith("hello\n")
        # the CDI spec the driver wrote for the prepared device is in the environment
        assert 'declare -x DRA_DEVICE_GPU_0="' in logs, logs
        assert (await kubectl(server, tmp_path, "logs", "long", "-c", "ctr0", "--tail", "1")).count(
            "\n"
        ) == 1


async def test_restart_policy_on_failure_restarts_and_counts(sockdir: str) -> None:
    async with kubelet(sockdir) as (_server, client, agent):
        agent_mode: Any = agent.mode
        agent_mode.restart_backoff = (0.05, 0.1)
        await make_pod(
            client, "crash", {"name": "c", "command": ["false"]}, restartPolicy="OnFailure"
        )

        async def restarted() -> bool:
            statuses = (await phase(client, "crash")).get("containerStatuses") or [{}]
            return int(statuses[0].get("restartCount", 0)) >= 2

        await eventually(restarted, 10, "restartCount of a failing container grows")
        status = await phase(client, "crash")
        assert status["phase"] in ("Running", "Pending")
        last = status["containerStatuses"][0]["lastState"]
        assert last.get("terminated", {}).get("exitCode") == 1
