"""The story ``drahealth demo`` tells, and the pieces its profiles share.

Owns the demo's workload and policy, the :class:`Timeline` it prints, the waits on the
API (:func:`until`), the placement of the workload's pods on devices
(:func:`placements`), and :func:`story`, the sample driver's fault → taint → eviction →
replacement → recovery → untaint sequence. The command itself (options, the cluster's
lifecycle, the profiles) is :mod:`drahealth.cli.demo`; the NVIDIA profile's story is
:mod:`drahealth.cli._demo_nvidia`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from lightkube import ApiError, AsyncClient, codecs
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim
from rich.console import Console

from drahealth.cli._cluster import DRIVER, LocalCluster
from drahealth.core import (
    DEFAULT_NAMESPACE,
    DEFAULT_TAINT_KEY,
    LABELS,
    DeviceKey,
    decode_devices,
    is_agent_record,
)
from drahealth.remedy import quarantine_claim_name

console = Console(highlight=False)
T = TypeVar("T")

POLICY = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
rules:
  - name: gpu-fatal-xid
    match: {driver: gpu.example.com, message: "XID (48|79)"}
    action: {effect: NoExecute, taintValue: fatal-xid}
    recovery: {healthyFor: 3s}
  - name: gpu-unhealthy
    match: {driver: gpu.example.com}
    action: {effect: NoSchedule, gracePeriod: 2s}
    recovery: {healthyFor: 3s}
"""

FAULT = "XID 79: GPU has fallen off the bus"
TAINT_KEY = DEFAULT_TAINT_KEY


def _workload() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": "default"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
                    }
                }
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "trainer", "namespace": "default"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "trainer"}},
                "template": {
                    "metadata": {"labels": {"app": "trainer"}},
                    "spec": {
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                        "containers": [
                            {
                                "name": "main",
                                "image": "registry.example/trainer:1",
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                    },
                },
            },
        },
    ]


@dataclass(frozen=True)
class Placement:
    pod: str
    node: str
    device: str  # pool/device
    health: str
    message: str
    phase: str

    def __str__(self) -> str:
        text = f"{self.pod} on {self.device} {self.health}"
        return text + (f' "{self.message}"' if self.message else "")


async def _agent_health(
    client: AsyncClient, driver: str = DRIVER
) -> dict[tuple[str, str], tuple[str, str]]:
    """(node, pool/device) -> (health, message) from the agents' device-health records.

    The records list only devices that are not Healthy (and count the Healthy ones), so a
    device absent from its node's record is Healthy.
    """
    out: dict[tuple[str, str], tuple[str, str]] = {}
    async for cm in client.list(ConfigMap, namespace=DEFAULT_NAMESPACE, labels=dict(LABELS)):
        out.update(_record_health(cm.to_dict(), driver))
    return out


def _record_health(
    record: dict[str, Any], driver: str = DRIVER
) -> dict[tuple[str, str], tuple[str, str]]:
    """(node, pool/device) -> (health, message) of ``driver``'s GPUs in one agent record
    (nothing if the ConfigMap is not an agent's record)."""
    if not is_agent_record(record, DEFAULT_NAMESPACE):
        return {}
    return {
        (obs.node, f"{key.pool}/{key.device}"): (obs.health.value, obs.message)
        for key, obs in decode_devices(record).items()
        if key.driver == driver
    }


async def placements(
    client: AsyncClient, pod_health: bool = True, driver: str = DRIVER
) -> list[Placement]:
    """The live workload pods with their device and its health.

    ``pod_health``: the kubelet writes device health into the pod status (from 1.36 by
    default); without it the health comes from the node agent's device-health record,
    the path a 1.34/1.35 cluster has and the only one beside a driver that streams no
    health (``driver``: whose devices the record is read for).
    """
    records = {} if pod_health else await _agent_health(client, driver)
    out = []
    async for pod in client.list(Pod, namespace="default"):
        if pod.metadata is None or pod.metadata.deletionTimestamp or pod.spec is None:
            continue
        status = pod.status
        device = ""
        for s in (status.resourceClaimStatuses or []) if status else []:
            with contextlib.suppress(Exception):
                claim = await client.get(
                    ResourceClaim, str(s.resourceClaimName), namespace="default"
                )
                results = claim.status.allocation.devices.results  # type: ignore[union-attr]
                device = f"{results[0].pool}/{results[0].device}"  # type: ignore[index]
        health, message = "", ""
        for cs in (status.containerStatuses or []) if status else []:
            for entry in cs.allocatedResourcesStatus or []:
                for res in entry.resources or []:
                    health, message = res.health or "", res.message or ""
        if not pod_health and device:
            node = str(pod.spec.nodeName or "")
            health, message = records.get((node, device), ("Healthy", ""))
        out.append(
            Placement(
                str(pod.metadata.name),
                str(pod.spec.nodeName or ""),
                device,
                health,
                message,
                str(status.phase if status else ""),
            )
        )
    return sorted(out, key=lambda p: p.pod)


class Timeline:
    """Numbered steps: time since start, what happened, and how long it took."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.step = 0
        self.latencies: dict[str, float] = {}

    def print(self, title: str, detail: str, took: float) -> None:
        self.step += 1
        self.latencies[title] = took
        at = time.monotonic() - self.start
        console.print(
            f"[dim]{at:6.2f}s[/] [bold]{self.step:2d}.[/] {title}: {detail} "
            f"[cyan]({took * 1000:.0f} ms)[/]"
        )


async def until(
    check: Callable[[], Awaitable[T | None]], within: float, what: str
) -> tuple[T, float]:
    """Poll ``check`` until it returns a value; (value, seconds it took)."""
    t0 = time.monotonic()
    while True:
        value = await check()
        if value is not None and value is not False:
            return value, time.monotonic() - t0
        if time.monotonic() - t0 > within:
            raise TimeoutError(f"{what} did not happen within {within:g} s")
        await asyncio.sleep(0.02)


async def deploy(
    cluster: LocalCluster,
    timeline: Timeline,
    workload: list[dict[str, Any]] | None = None,
    pod_health: bool | None = None,
) -> list[Placement]:
    """Create ``workload`` (default: the sample GPU's) and wait for its two pods to run
    on Healthy devices (``pod_health``: as the pod status says, default where the
    release writes it; else as the agents' records say)."""
    client = cluster.client
    assert client is not None
    if pod_health is None:
        pod_health = cluster.profile.kubelet_pod_health
    t0 = time.monotonic()
    for obj in workload or _workload():
        await client.create(codecs.from_dict(obj))

    async def running() -> list[Placement] | None:
        now = await placements(client, pod_health, cluster.driver)
        ok = [p for p in now if p.phase == "Running" and p.health == "Healthy"]
        return ok if len(ok) == 2 else None

    pods, _ = await until(running, 30, "two healthy running pods")
    timeline.print(
        "workload running",
        "ReplicaSet trainer x2, claims from template one-gpu: " + "; ".join(map(str, pods)),
        time.monotonic() - t0,
    )
    return pods


async def _remediation_mode(cluster: LocalCluster) -> tuple[str, str]:
    """(mode, why) the controller chose, once it has chosen."""

    async def chosen() -> tuple[str, str] | None:
        choice = getattr(cluster.controller, "choice", None)
        return None if choice is None else (str(choice.mode), str(choice.why))

    mode, _ = await until(chosen, 15, "the controller's remediation mode")
    return mode


async def _node_taint(client: AsyncClient, node: str) -> str | None:
    """The controller's NoSchedule taint on ``node`` (``key=value:effect``), if any."""
    obj = await client.get(Node, node)
    for taint in (obj.spec.taints if obj.spec else None) or []:
        if taint.key == TAINT_KEY:
            return f"{taint.key}={taint.value or ''}:{taint.effect}"
    return None


def _quarantine_probes(
    client: AsyncClient, cluster: LocalCluster, key: DeviceKey
) -> tuple[Callable[[], Awaitable[str | None]], Callable[[], Awaitable[bool]]]:
    """Two checks for :func:`until` on the controller's quarantine claim of ``key``:
    its ``namespace/name`` once it holds the device (allocated), and whether it is gone."""
    namespace = str(getattr(cluster.controller, "namespace", "default"))
    name = quarantine_claim_name(key)

    async def claim() -> Any:
        try:
            return await client.get(ResourceClaim, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    async def quarantined() -> str | None:
        found = await claim()
        status = found.status if found is not None else None
        return f"{namespace}/{name}" if status is not None and status.allocation else None

    async def released() -> bool:
        return await claim() is None

    return quarantined, released


async def _eviction_path(client: AsyncClient, pod: str) -> str:
    """Who evicted ``pod``, from its Events (waiting up to 5 s for one): the device-taint
    eviction controller (``DeviceTaintManagerEviction``) or drahealth's controller
    (``DeviceTaintEviction``, through the Eviction API)."""

    async def reason() -> str | None:
        async for event in client.list(Event, namespace="default"):
            if event.involvedObject.name == pod and event.reason in (
                "DeviceTaintEviction",
                "DeviceTaintManagerEviction",
            ):
                return str(event.reason)
        return None

    try:
        found, _ = await until(reason, 5, "the eviction's Event")
    except TimeoutError:
        return "no eviction Event recorded"
    if found == "DeviceTaintEviction":
        return "Eviction API by the controller, PodDisruptionBudgets honoured"
    return "DisruptionTarget: DeletionByDeviceTaintManager"


async def _first_unhealthy(
    client: AsyncClient,
    victim: Placement,
    pod_health: bool,
    started: asyncio.Event,
    driver: str = DRIVER,
) -> Placement:
    """The victim as soon as its device shows Unhealthy: in its pod status, or (no pod
    status health on this release) in its node agent's device-health record."""
    if pod_health:
        async for _, pod in client.watch(
            Pod, namespace="default", fields={"metadata.name": victim.pod}
        ):
            started.set()
            for cs in (pod.status.containerStatuses if pod.status else None) or []:
                for entry in cs.allocatedResourcesStatus or []:
                    for res in entry.resources or []:
                        if res.health == "Unhealthy":
                            return replace(victim, health=res.health, message=res.message or "")
    else:
        async for _, cm in client.watch(
            ConfigMap, namespace=DEFAULT_NAMESPACE, labels=dict(LABELS)
        ):
            started.set()
            health, message = _record_health(cm.to_dict(), driver).get(
                (victim.node, victim.device), ("", "")
            )
            if health == "Unhealthy":
                return replace(victim, health=health, message=message)
    raise TimeoutError("the watch ended before the device showed Unhealthy")


async def story(cluster: LocalCluster, timeline: Timeline) -> None:
    client = cluster.client
    assert client is not None
    profile = cluster.profile
    pod_health = profile.kubelet_pod_health
    first = await deploy(cluster, timeline)
    victim, known = first[0], {p.pod for p in first}
    pool, device = victim.device.split("/")
    node = cluster.node(victim.node)
    mode, why = await _remediation_mode(cluster)
    timeline.print(
        "remediation mode",
        f"{mode} ({why}); Kubernetes {profile.version}, device health "
        + ("in the pod status" if pod_health else "from the node agent (no pod status health)"),
        0.0,
    )
    # watched, not polled: the controller acts on the same observation and may evict the
    # pod within milliseconds, so a poll could miss the moment the health was visible
    started = asyncio.Event()
    watcher = asyncio.create_task(_first_unhealthy(client, victim, pod_health, started))
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            await started.wait()
    fault_at = time.monotonic()
    await cluster.inject(node, device, "unhealthy", "--message", FAULT)
    try:
        async with asyncio.timeout(10):
            seen = await watcher
    except TimeoutError:
        raise TimeoutError("Unhealthy device health did not show within 10 s") from None
    finally:
        watcher.cancel()
    timeline.print(
        "fault reaches the pod status"
        if pod_health
        else "fault reaches the agent's device-health record",
        str(seen),
        time.monotonic() - fault_at,
    )

    async def rule() -> Any:
        rules = [
            r async for r in client.list(cluster.controller.served.resource("DeviceTaintRule"))
        ]
        return next(
            (
                r
                for r in rules
                if r.spec and r.spec.deviceSelector and r.spec.deviceSelector.device == device
            ),
            None,
        )

    async def node_tainted() -> str | None:
        return await _node_taint(client, victim.node)

    quarantined, released = _quarantine_probes(client, cluster, DeviceKey(DRIVER, pool, device))

    if mode == "quarantine":
        pass  # the device is quarantined once its pod has let go of it (below)
    elif mode == "taint-rules":
        found, _ = await until(rule, 10, "the DeviceTaintRule")
        taint = found.spec.taint
        timeline.print(
            "controller taints the device",
            f"DeviceTaintRule {found.metadata.name} ({found.apiVersion}): "
            f"{taint.key}={taint.value}:{taint.effect}",
            time.monotonic() - fault_at,
        )
    else:
        text, _ = await until(node_tainted, 10, "the node taint")
        timeline.print(
            "controller taints the node (no DeviceTaintRule API)",
            f"node {victim.node}: {text}, and evicts only the pods using {pool}/{device}",
            time.monotonic() - fault_at,
        )

    async def evicted() -> bool:
        return all(p.pod != victim.pod for p in await placements(client, pod_health))

    await until(evicted, 10, "the eviction")
    timeline.print(
        "pod evicted",
        f"{victim.pod} ({await _eviction_path(client, victim.pod)})",
        time.monotonic() - fault_at,
    )
    if mode == "quarantine":
        claim, _ = await until(quarantined, 10, "the quarantine claim")
        timeline.print(
            "controller quarantines the device (no DeviceTaintRule API)",
            f"claim {claim} allocated to {pool}/{device} alone; the node's other GPUs "
            "stay schedulable",
            time.monotonic() - fault_at,
        )

    async def replaced() -> Placement | None:
        now = await placements(client, pod_health)
        fresh = [
            p for p in now if p.pod not in known and p.phase == "Running" and p.health == "Healthy"
        ]
        return fresh[0] if len(now) == 2 and fresh else None

    new, _ = await until(replaced, 20, "the replacement pod")
    timeline.print("replacement running on a healthy device", str(new), time.monotonic() - fault_at)

    repair_at = time.monotonic()
    await cluster.inject(node, device, "healthy", "--message", "repaired")

    if mode == "taint-rules":

        async def untainted() -> bool:
            return await rule() is None

        await until(untainted, 15, "the untaint")
        done = "DeviceTaintRule deleted"
    elif mode == "quarantine":
        await until(released, 15, "the quarantine released")
        done = "quarantine claim deallocated and deleted"
    else:

        async def node_clean() -> bool:
            return await node_tainted() is None

        await until(node_clean, 15, "the node untaint")
        done = f"node taint removed from {victim.node}"
    timeline.print(
        "device verified healthy, taint removed",
        f"{DRIVER}/{pool}/{device} Healthy for 3 s -> {done}",
        time.monotonic() - repair_at,
    )
