"""Node registration and heartbeats, as a kubelet writes them.

Owns :class:`NodeRegistrar`: on start it creates the node's Node object (or, when one
exists, e.g. created by the demo, updates it), sets the labels a kubelet sets
(``kubernetes.io/hostname``, ``kubernetes.io/os``, ``kubernetes.io/arch`` and their
``beta.`` forms), and writes ``status``: the pressure conditions False and ``Ready``
True (reason ``KubeletReady``), ``capacity`` and ``allocatable`` (cpu, memory, pods,
ephemeral-storage, hugepages), ``nodeInfo``, ``addresses`` and
``daemonEndpoints.kubeletEndpoint.Port`` (where the container logs are served). Then it
renews the node's Lease in ``kube-node-lease`` every ``lease_renew`` seconds and reports
the status (``lastHeartbeatTime``) every ``status_report`` seconds, the kubelet's
defaults being 10 s and 5 min.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import shutil
import uuid
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from drahealth._time import now_rfc3339, now_rfc3339_micro
from drahealth.kube import is_already_exists, is_not_found, lease_from_dict, patch_status

__all__ = ["LEASE_NAMESPACE", "NodeRegistrar", "node_status"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
LEASE_NAMESPACE = "kube-node-lease"
#: The kubelet's node lease duration (s); it renews at a quarter of it.
LEASE_DURATION = 40
#: Pods per node (the kubelet's ``maxPods`` default).
MAX_PODS = 110
#: The kubelet's default hard eviction thresholds, kept out of allocatable.
_MEMORY_RESERVE = 100 * 1024 * 1024
_NODEFS_RESERVE = 0.10
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}

_CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory",
     "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)  # fmt: skip


def _memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 16 * 1024**3


def _os_image() -> str:
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


def node_status(node: str, kubelet_port: int, kubelet_version: str, storage_dir: str) -> JSON:
    """The ``status`` a kubelet reports for ``node`` (conditions stamped now)."""
    cpu = os.cpu_count() or 1
    memory = _memory_bytes()
    try:
        disk = shutil.disk_usage(storage_dir).total
    except OSError:
        disk = 100 * 1024**3
    capacity = {
        "cpu": str(cpu),
        "memory": f"{memory // 1024}Ki",
        "ephemeral-storage": f"{disk // 1024}Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "pods": str(MAX_PODS),
    }
    allocatable = {
        **capacity,
        "memory": f"{max(memory - _MEMORY_RESERVE, 0) // 1024}Ki",
        "ephemeral-storage": str(int(disk * (1 - _NODEFS_RESERVE))),
    }
    ids = uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.drahealth")
    return {
        "capacity": capacity,
        "allocatable": allocatable,
        "conditions": [],
        "addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": node},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "machineID": ids.hex,
            "systemUUID": str(ids),
            "bootID": str(uuid.uuid4()),
            "kernelVersion": platform.release(),
            "osImage": _os_image(),
            "containerRuntimeVersion": "drahealth://simulated",
            "kubeletVersion": kubelet_version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": _ARCH.get(platform.machine().lower(), platform.machine().lower()),
        },
    }


class NodeRegistrar:
    """Registers one node and keeps its heartbeats (see the module docstring)."""

    def __init__(
        self,
        client: AsyncClient,
        node: str,
        *,
        kubelet_port: int,
        kube_version: str,
        storage_dir: str,
        lease_renew: float = LEASE_DURATION / 4,
        status_report: float = 300.0,
    ) -> None:
        self.client = client
        self.node = node
        self.kubelet_port = kubelet_port
        self.kubelet_version = f"v{kube_version}.0-drahealth"
        self.storage_dir = storage_dir
        self.lease_renew = lease_renew
        self.status_report = status_report
        self._status: JSON = {}
        self._since: dict[str, str] = {}
        self._uid = ""
        self._tasks: list[asyncio.Task[None]] = []
        self.lease_renewals = 0

    @property
    def labels(self) -> dict[str, str]:
        arch = _ARCH.get(platform.machine().lower(), platform.machine().lower())
        return {
            "beta.kubernetes.io/arch": arch,
            "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": arch,
            "kubernetes.io/hostname": self.node,
            "kubernetes.io/os": "linux",
        }

    async def start(self) -> None:
        await self.register()
        await self.report()
        await self.renew()
        self._tasks = [
            asyncio.create_task(self._every(self.lease_renew, self.renew), name="node-lease"),
            asyncio.create_task(self._every(self.status_report, self.report), name="node-status"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def register(self) -> None:
        """Create the Node, or update the labels of the one there is."""
        self._status = node_status(
            self.node, self.kubelet_port, self.kubelet_version, self.storage_dir
        )
        body = {"metadata": {"name": self.node, "labels": self.labels}}
        try:
            node = await self.client.create(
                Node(metadata=ObjectMeta(name=self.node, labels=self.labels))
            )
        except ApiError as exc:
            if not is_already_exists(exc):
                raise
            node = await self.client.patch(Node, self.node, body, patch_type=PatchType.MERGE)
        self._uid = str(node.metadata.uid) if node.metadata and node.metadata.uid else ""

    async def report(self) -> None:
        """Write the node's status with fresh heartbeat times."""
        now = now_rfc3339()
        conditions = []
        for kind, status, reason, message in _CONDITIONS:
            since = self._since.setdefault(kind, now)
            conditions.append(
                {"type": kind, "status": status, "reason": reason, "message": message,
                 "lastHeartbeatTime": now, "lastTransitionTime": since}
            )  # fmt: skip
        body = {**self._status, "conditions": conditions}
        # strategic merge, as the kubelet patches: conditions merge by type, so others'
        # (node-problem-detector's, drahealth's DRADevicesHealthy) survive a heartbeat
        await patch_status(
            self.client, Node, self.node, {"status": body}, patch_type=PatchType.STRATEGIC
        )

    async def renew(self) -> None:
        """Create or renew the node's Lease (holder: the node, owner: its Node)."""
        now = now_rfc3339_micro()
        spec = {"holderIdentity": self.node, "leaseDurationSeconds": LEASE_DURATION,
                "renewTime": now}  # fmt: skip
        try:
            await self.client.patch(
                Lease, self.node, {"spec": spec}, namespace=LEASE_NAMESPACE,
                patch_type=PatchType.MERGE,
            )  # fmt: skip
        except ApiError as exc:
            if not is_not_found(exc):
                raise
            owner = [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self._uid}]
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.node, "namespace": LEASE_NAMESPACE,
                             "ownerReferences": owner},
                "spec": {**spec, "acquireTime": now},
            }  # fmt: skip
            await self.client.create(lease_from_dict(lease))  # six fraction digits
        self.lease_renewals += 1

    async def _every(self, interval: float, write: Any) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await write()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("node %s: heartbeat failed: %s", self.node, exc)
