"""``drahealth demo --profile nvidia``: the loop beside a driver that streams no health.

Owns the NVIDIA story. Per node the simulated NVIDIA DRA driver (profile ``sim-nvidia``:
driver ``gpu.nvidia.com``, NVIDIA's device names and attributes, no health service) and a
node agent whose attached-sources file (``drahealth agent --attach``) watches
``gpu.nvidia.com`` keyed by the GPUs' PCI address (:data:`KEY`) with a kernel-log source
following the node's fake kernel log. The story: an XID 79 line appears in one node's
kernel log (written by the driver, as NVIDIA's kernel module would), the kmsg source
marks the GPU at that PCI address Unhealthy, the controller taints that device, its pod
is evicted and replaced on a healthy GPU, the source's latch ends after
:data:`CLEAR_AFTER` seconds without another fatal line, and the GPU, verified healthy,
is untainted. Each step is observed through the API, printed with its latency, and the
timeline names the source that caught the fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
import time
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Pod
from rich.markup import escape

from drahealth.cli._cluster import LocalCluster, NodeProcesses
from drahealth.cli._demo_story import (
    Placement,
    Timeline,
    _agent_health,
    _eviction_path,
    _node_taint,
    _quarantine_probes,
    _record_health,
    _remediation_mode,
    _workload,
    console,
    deploy,
    placements,
    until,
)
from drahealth.core import DEFAULT_NAMESPACE, LABELS, POD_CONDITION_TYPE, DeviceKey
from drahealth.simdriver import (
    DEFAULT_NVIDIA_RELEASE,
    NVIDIA_DRIVER_NAME,
    pci_attribute,
    sim_nvidia_gpus,
)

__all__ = ["CLEAR_AFTER", "KEY", "POLICY", "attach_config", "nvidia_cluster", "story"]

NVIDIA = NVIDIA_DRIVER_NAME
#: The attribute the agent keys the kernel log's PCI addresses by (NVIDIA's driver
#: publishes the standard ``resource.kubernetes.io/pciBusID`` since 25.12).
KEY = pci_attribute(DEFAULT_NVIDIA_RELEASE)
#: Seconds without a new fatal XID after which the kmsg source lets a GPU be Healthy
#: again (an SRE would keep minutes; the demo keeps seconds).
CLEAR_AFTER = 6
XID = 79
#: The demo's policy: NVIDIA's fatal XIDs evict at once, anything else stops scheduling.
POLICY = f"""apiVersion: drahealth.io/v1
kind: RemediationPolicy
rules:
  - name: gpu-fatal-xid
    match: {{driver: {NVIDIA}, message: '(?i)\\bxid (48|79)\\b'}}
    action: {{effect: NoExecute, taintValue: fatal-xid}}
    recovery: {{healthyFor: 3s}}
  - name: gpu-unhealthy
    match: {{driver: {NVIDIA}}}
    action: {{effect: NoSchedule, gracePeriod: 2s}}
    recovery: {{healthyFor: 3s}}
"""
_SOURCE = re.compile(r"^([a-z0-9][-a-z0-9]{0,62}): ")


def kernel_log(node: NodeProcesses) -> Path:
    """The node's fake kernel log: the driver writes it, the agent's kmsg source reads it."""
    return node.base / "kmsg"


def attach_config(log: Path) -> str:
    """The node agent's ``--attach`` file: NVIDIA's GPUs by PCI address, a kmsg source on
    ``log`` whose fatal XIDs latch for :data:`CLEAR_AFTER` seconds."""
    return f"""apiVersion: drahealth.io/v1
kind: AttachedSources
drivers:
  - driver: {NVIDIA}
    key: {{attribute: {KEY}}}
    sources:
      - kind: kmsg
        path: {log}
        clearAfter: {CLEAR_AFTER}
"""


def _driver_args(node: NodeProcesses) -> list[str]:
    return ["--profile", "sim-nvidia", "--kernel-log", str(kernel_log(node))]


def _agent_args(node: NodeProcesses) -> list[str]:
    node.base.mkdir(parents=True, exist_ok=True)
    kernel_log(node).touch()  # the source follows it from its end, from the start on
    path = node.base / "attach.yaml"
    path.write_text(attach_config(kernel_log(node)))
    return ["--attach", str(path)]


def nvidia_cluster(workdir: Path, **kw: Any) -> LocalCluster:
    """A :class:`LocalCluster` of simulated NVIDIA nodes with attached kmsg sources."""
    from drahealth.remedy import parse_policy

    return LocalCluster(
        workdir,
        parse_policy(POLICY, "demo policy (nvidia)"),
        driver=NVIDIA,
        driver_args=_driver_args,
        agent_args=_agent_args,
        **kw,
    )


def workload() -> list[dict[str, Any]]:
    """The sample workload with NVIDIA's DeviceClass (the selector its chart installs)."""
    objs = copy.deepcopy(_workload())
    objs[0] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": NVIDIA},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f"device.driver == '{NVIDIA}' && "
                        f"device.attributes['{NVIDIA}'].type == 'gpu'"
                    }
                }
            ]
        },
    }
    objs[1]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = NVIDIA
    return objs


def describe(cluster: LocalCluster, devices: int) -> str:
    """The "cluster up" line."""
    n = len(cluster.nodes)
    return (
        f"{n} nodes (simulated NVIDIA DRA driver {NVIDIA}, release {DEFAULT_NVIDIA_RELEASE}, "
        f"no health stream; node agent with a kmsg source attached by {KEY}), {devices} GPUs "
        f"in ResourceSlices, scheduler/eviction/ReplicaSet stand-ins, remediation controller; "
        f"{cluster.profile.describe()}"
    )


async def _unhealthy_record(client: AsyncClient, victim: Placement, started: asyncio.Event) -> str:
    """The message of the victim's device once its agent's record says Unhealthy."""
    async for _, cm in client.watch(ConfigMap, namespace=DEFAULT_NAMESPACE, labels=dict(LABELS)):
        started.set()
        health, message = _record_health(cm.to_dict(), NVIDIA).get(
            (victim.node, victim.device), ("", "")
        )
        if health == "Unhealthy":
            return message
    raise TimeoutError("the watch ended before the device showed Unhealthy")


async def _pod_told(client: AsyncClient, pod: str, seen: dict[str, str]) -> None:
    """Watch ``pod`` and note the first :data:`POD_CONDITION_TYPE` condition that is not
    True (the pod may be gone before the agent writes it: the eviction is that fast)."""
    async for _, obj in client.watch(Pod, namespace="default", fields={"metadata.name": pod}):
        for cond in (obj.status.conditions if obj.status else None) or []:
            if cond.type == POD_CONDITION_TYPE and cond.status != "True":
                seen.setdefault("condition", f"{cond.type}={cond.status} ({cond.reason})")
                return


async def _pod_event(client: AsyncClient, pod: str) -> str | None:
    """The agent's DeviceUnhealthy Event on ``pod`` (Events outlive the pod)."""

    async def find() -> str | None:
        async for event in client.list(Event, namespace="default"):
            if event.involvedObject.name == pod and event.reason == "DeviceUnhealthy":
                return f"Event {event.reason}"
        return None

    with contextlib.suppress(TimeoutError):
        found, _ = await until(find, 5, "the DeviceUnhealthy Event")
        return found
    return None


async def story(cluster: LocalCluster, timeline: Timeline) -> None:
    """The scripted story (see the module docstring)."""
    client = cluster.client
    assert client is not None
    first = await deploy(cluster, timeline, workload(), pod_health=False)
    victim, known = first[0], {p.pod for p in first}
    pool, device = victim.device.split("/")
    node = cluster.node(victim.node)
    gpu = next(g for g in sim_nvidia_gpus(victim.node, cluster.devices) if g.name == device)
    mode, why = await _remediation_mode(cluster)
    timeline.print(
        "remediation mode",
        f"{mode} ({why}); Kubernetes {cluster.profile.version}; {NVIDIA} streams no health, "
        "so device health comes from the attached sources (agent record, pod condition)",
        0.0,
    )

    # watched, not polled: the controller acts on the same record and may evict the pod
    # within milliseconds, so a poll could miss the moment the health was visible
    started = asyncio.Event()
    watcher = asyncio.create_task(_unhealthy_record(client, victim, started))
    told: dict[str, str] = {}
    pod_watch = asyncio.create_task(_pod_told(client, victim.pod, told))
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            await started.wait()
    log = kernel_log(node)
    fault_at = time.monotonic()
    await cluster.inject(
        node, device, "xid", "--xid", str(XID), "--pid", "4242", "--process", "trainer"
    )
    record = log.read_text(errors="replace").splitlines()[-1]
    line = record.partition(";")[2]
    timeline.print(
        f"XID {XID} in {victim.node}'s kernel log",
        escape(f"{line} ({device} has {KEY} {gpu.pci_bus_id})"),
        time.monotonic() - fault_at,
    )
    try:
        async with asyncio.timeout(10):
            message = await watcher
    except TimeoutError:
        raise TimeoutError("no attached source marked the GPU Unhealthy within 10 s") from None
    finally:
        watcher.cancel()
    source = _SOURCE.match(message)
    caught = source.group(1) if source else "an attached source"
    seen = escape(f'{victim.pod} on {victim.device} Unhealthy "{message}"')
    timeline.print(
        f"{caught} source marks the GPU Unhealthy",
        f"{seen}: caught by {caught} (kernel log), matched by {KEY} {gpu.pci_bus_id}; in the "
        "agent's device-health record",
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

    quarantined, released = _quarantine_probes(client, cluster, DeviceKey(NVIDIA, pool, device))

    if mode == "quarantine":
        pass  # the GPU is quarantined once its pod has let go of it (after the eviction)
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
        return all(p.pod != victim.pod for p in await placements(client, False, NVIDIA))

    await until(evicted, 10, "the eviction")
    pod_watch.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await pod_watch
    told_how = [t for t in (await _pod_event(client, victim.pod), told.get("condition")) if t]
    timeline.print(
        "pod evicted",
        f"{victim.pod} ({await _eviction_path(client, victim.pod)}); the pod was told: "
        + ("; ".join(told_how) or "nothing before it left"),
        time.monotonic() - fault_at,
    )
    if mode == "quarantine":
        claim, _ = await until(quarantined, 10, "the quarantine claim")
        timeline.print(
            "controller quarantines the GPU (no DeviceTaintRule API)",
            f"claim {claim} allocated to {pool}/{device} alone; the node's other GPUs stay "
            "schedulable",
            time.monotonic() - fault_at,
        )

    async def replaced() -> Placement | None:
        now = await placements(client, False, NVIDIA)
        fresh = [
            p for p in now if p.pod not in known and p.phase == "Running" and p.health == "Healthy"
        ]
        return fresh[0] if len(now) == 2 and fresh else None

    new, _ = await until(replaced, 20, "the replacement pod")
    timeline.print("replacement running on a healthy GPU", str(new), time.monotonic() - fault_at)

    async def latch_ended() -> bool:
        records = await _agent_health(client, NVIDIA)
        return records.get((victim.node, victim.device), ("Healthy", ""))[0] == "Healthy"

    await until(latch_ended, CLEAR_AFTER + 10, "the end of the kmsg latch")
    healthy_at = time.monotonic()
    timeline.print(
        f"{caught} latch ends",
        f"no fatal XID on {gpu.pci_bus_id} for {CLEAR_AFTER} s: {victim.device} Healthy",
        healthy_at - fault_at,
    )

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
        f"{NVIDIA}/{pool}/{device} Healthy for 3 s -> {done}",
        time.monotonic() - healthy_at,
    )


def no_script_hint(cluster: LocalCluster) -> None:
    """What ``--no-script`` prints: how to write an XID line into a node's kernel log."""
    first = cluster.nodes[0]
    console.print(
        "running; write an XID line into node-1's kernel log with:\n"
        f"  drahealth inject --state-dir {first.driver_state} gpu-0 xid --xid {XID}\n"
        f"(the kmsg source follows {kernel_log(first)}; the latch ends {CLEAR_AFTER} s after "
        "the last fatal line)\npress Ctrl-C to stop"
    )
