"""The node agent in kubelet mode, with a third-party driver, in one script.

Starts the embedded API server (in this process), the FPGA driver of
``examples/custom_driver.py`` and ``drahealth agent --mode kubelet`` (subprocesses),
creates an allocated ResourceClaim and a pod that uses it, then breaks and repairs
the card and prints what the pod status says at each step:

    python examples/node_agent_quickstart.py            # exits 0 when all steps were seen

Everything lives in a temporary directory that is removed at the end.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.kube import make_client

NODE = "node-1"
DRIVER = "fpga.example.com"
HERE = os.path.dirname(os.path.abspath(__file__))


async def create_pod(client: AsyncClient, card: str) -> None:
    """A claim allocated to ``card`` (an agent does not allocate) and a pod on NODE."""
    await client.create(Node(metadata=ObjectMeta(name=NODE)))
    claim = {
        "metadata": {"name": "accel", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {"deviceClassName": "f"}}]}},
    }
    await client.create(ResourceClaim.from_dict(claim))
    result = {"request": "fpga", "driver": DRIVER, "pool": NODE, "device": card}
    await client.patch(
        ResourceClaim.Status,
        "accel",
        {"status": {"allocation": {"devices": {"results": [result]}}}},
        namespace="default",
        patch_type=PatchType.MERGE,
    )
    pod = {
        "metadata": {"name": "trainer", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "fpga", "resourceClaimName": "accel"}],
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "fpga"}]}}
            ],
        },
    }
    await client.create(Pod.from_dict(pod))


async def wait_for(client: AsyncClient, health: str, timeout: float = 20.0) -> str:  # noqa: ASYNC109
    """Poll the pod until its device reads ``health``; returns the status line printed."""
    deadline = time.monotonic() + timeout
    seen = "no status yet"
    while time.monotonic() < deadline:
        pod = await client.get(Pod, "trainer", namespace="default")
        statuses = (pod.status.containerStatuses or []) if pod.status else []
        for entry in statuses[0].allocatedResourcesStatus or [] if statuses else []:
            for res in entry.resources or []:
                seen = f"{entry.name} {res.resourceID}: {res.health} {res.message or ''}".strip()
                if res.health == health:
                    return seen
        await asyncio.sleep(0.1)
    raise SystemExit(f"the pod never showed {health} within {timeout} s (last: {seen})")


async def main(base: str) -> None:
    server = APIServer()
    await server.start(port=0)
    kubeconfig = str(server.write_kubeconfig(f"{base}/kubeconfig"))
    client = make_client(kubeconfig)
    logs = open(f"{base}/processes.log", "wb")  # noqa: SIM115, ASYNC230 - closed below
    driver = await asyncio.create_subprocess_exec(
        sys.executable, f"{HERE}/custom_driver.py", "--base", f"{base}/fpga",
        "--node", NODE, "--kubeconfig", kubeconfig, stdout=logs, stderr=logs,
    )  # fmt: skip
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "drahealth", "agent", "--mode", "kubelet", "--node-name", NODE,
        "--registry-dir", f"{base}/fpga/registry", "--state-dir", f"{base}/agent",
        "--kubeconfig", kubeconfig, "--allowed-root", f"{base}/fpga", stdout=logs, stderr=logs,
    )  # fmt: skip
    try:
        await create_pod(client, "fpga-2")
        print("1. prepared and running:", await wait_for(client, "Healthy"))
        open(f"{base}/fpga/faults/fpga-2", "w").close()  # noqa: ASYNC230 - the fault
        print("2. card broken:        ", await wait_for(client, "Unhealthy"))
        os.unlink(f"{base}/fpga/faults/fpga-2")
        print("3. card repaired:      ", await wait_for(client, "Healthy"))
    finally:
        for proc in (agent, driver):
            if proc.returncode is None:
                proc.terminate()
            await proc.wait()
        logs.close()
        await client.close()
        await server.stop()


if __name__ == "__main__":
    workdir = tempfile.mkdtemp(prefix="dh-quick-", dir="/tmp")  # short: unix socket paths
    try:
        asyncio.run(main(workdir))
    except BaseException:
        log = f"{workdir}/processes.log"
        if os.path.exists(log):
            with open(log) as f:
                print("--- driver and agent output ---\n" + f.read(), file=sys.stderr)
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
