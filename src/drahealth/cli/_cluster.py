"""A whole DRA device-health cluster on one machine, for ``drahealth demo``.

Owns :class:`LocalCluster`: the embedded API server and the control plane's stand-ins
(one :class:`~drahealth.controlplane.ControlPlane`, as ``drahealth apiserver
--with-controllers`` runs it) and the remediation controller in this process; per
simulated node a sample GPU driver (``drahealth driver``) and a node agent (``drahealth
agent --mode kubelet``) as real subprocesses, each with its own registry, plugin, CDI and
state directories under the
work directory. Which driver runs (name, profile options) and what the agents get on top
(``--attach`` configs) are parameters: ``drahealth demo --profile nvidia`` runs the
simulated NVIDIA driver. ``start()`` returns once every node's ResourceSlice is published;
``stop()`` stops everything (agents first, then drivers, then the control plane).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice

from drahealth._aio import cancel_and_wait
from drahealth.controlplane import APIServer, ControlPlane
from drahealth.core import NEWEST_KUBE_VERSION, KubeProfile, Policy, kube_profile

__all__ = ["DRIVER", "LocalCluster", "NodeProcesses"]

DRIVER = "gpu.example.com"


@dataclass
class NodeProcesses:
    name: str
    base: Path
    driver: asyncio.subprocess.Process | None = None
    agent: asyncio.subprocess.Process | None = None

    @property
    def driver_state(self) -> str:
        return str(self.base / "driver")


def _ready(path: Path) -> bool:
    try:
        return "ready: " in path.read_text(errors="replace")
    except FileNotFoundError:
        return False


class LocalCluster:
    """See the module docstring."""

    def __init__(
        self,
        workdir: Path,
        policy: Policy,
        *,
        nodes: int = 2,
        devices: int = 8,
        lease: int = 5,
        port: int = 0,
        profile: KubeProfile | None = None,
        driver: str = DRIVER,
        driver_args: Callable[[NodeProcesses], Sequence[str]] | None = None,
        agent_args: Callable[[NodeProcesses], Sequence[str]] | None = None,
    ) -> None:
        self.workdir = workdir
        #: the DRA driver's name, and per node the driver's profile options and the
        #: agent's extra options (default: the sample GPU driver, nothing extra)
        self.driver = driver
        self.driver_args = driver_args or (
            # where the release drops slice taints, unhealthy GPUs leave the slice
            lambda _node: ("--profile", "sim-gpu", "--withdraw-unhealthy", "auto")
        )
        self.agent_args = agent_args or (lambda _node: ())
        #: the Kubernetes release (and gates) the API server, stand-ins and agents model
        self.profile = profile or kube_profile(NEWEST_KUBE_VERSION)
        self.policy = policy
        self.port = port
        self.lease = lease
        self.devices = devices
        self.nodes = [
            NodeProcesses(f"node-{i + 1}", workdir / f"node-{i + 1}") for i in range(nodes)
        ]
        #: the API server and the stand-in controllers (as ``drahealth apiserver
        #: --with-controllers`` runs them)
        self.plane = ControlPlane(APIServer(profile=self.profile))
        self.server = self.plane.server
        self.controller: Any = None
        self.kubeconfig = workdir / "kubeconfig"
        self.client: AsyncClient | None = None
        self._logs: list[IO[bytes]] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        from drahealth.remedy import RemediationController

        await self.plane.start(host="127.0.0.1", port=self.port)
        self.server.write_kubeconfig(self.kubeconfig)
        self.client = self.plane.client
        assert self.client is not None
        for node in self.nodes:
            await self.client.create(Node(metadata=ObjectMeta(name=node.name)))
        self.controller = RemediationController(
            self.client, self.policy, identity="demo-controller"
        )
        self._tasks.append(asyncio.create_task(self.controller.run(), name="remediation"))
        # the kubelet's gates, as the release (and the demo's --feature-gates) set them
        gates = ",".join(
            f"{k}={str(v).lower()}"
            for k, v in sorted(self.profile.gates.items())
            if k.startswith("ResourceHealthStatus")
        )
        for node in self.nodes:
            node.base.mkdir(parents=True, exist_ok=True)
            node.driver = await self._spawn(node, "driver", [
                "driver", *self.driver_args(node), "--driver-name", self.driver,
                "--node-name", node.name, "--devices", str(self.devices),
                "--registry-dir", str(node.base / "reg"),
                "--plugins-dir", str(node.base / "plugins"),
                "--cdi-dir", str(node.base / "cdi"), "--state-dir", node.driver_state,
                "--kubeconfig", str(self.kubeconfig), "--health-timeout", str(self.lease),
            ])  # fmt: skip
            node.agent = await self._spawn(node, "agent", [
                "agent", "--mode", "kubelet", "--node-name", node.name,
                "--registry-dir", str(node.base / "reg"), "--state-dir", str(node.base / "agent"),
                "--kubeconfig", str(self.kubeconfig), "--restart-grace", "3",
                "--cdi-dir", str(node.base / "cdi"),
                "--kube-version", self.profile.version, "--feature-gates", gates,
                *self.agent_args(node),
            ])  # fmt: skip
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            for kind, proc in (("driver", node.driver), ("agent", node.agent)):
                log = node.base / f"{kind}.log"
                while not _ready(log):
                    if proc is None or proc.returncode is not None or time.monotonic() > deadline:
                        output = log.read_text(errors="replace")
                        raise RuntimeError(f"{kind} of {node.name} did not start:\n{output}")
                    await asyncio.sleep(0.05)
        while len(await self.slices()) < len(self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the drivers did not publish their ResourceSlices")
            await asyncio.sleep(0.05)

    async def slices(self) -> list[ResourceSlice]:
        assert self.client is not None
        return [s async for s in self.client.list(ResourceSlice)]

    async def _spawn(
        self, node: NodeProcesses, kind: str, args: list[str]
    ) -> asyncio.subprocess.Process:
        log = open(node.base / f"{kind}.log", "wb")  # noqa: SIM115, ASYNC230 - closed in stop()
        self._logs.append(log)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "drahealth", *args, stdout=log, stderr=log, env=env,
            stdin=asyncio.subprocess.DEVNULL,
        )  # fmt: skip

    async def inject(self, node: NodeProcesses, *args: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "drahealth", "inject", "--state-dir", node.driver_state, *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"drahealth inject {' '.join(args)} failed: {out.decode()}")

    def node(self, name: str) -> NodeProcesses:
        return next(n for n in self.nodes if n.name == name)

    async def stop(self) -> None:
        procs = [p for n in self.nodes for p in (n.agent, n.driver) if p is not None]
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await cancel_and_wait(self._tasks)
        await self.plane.stop()
        for log in self._logs:
            log.close()
