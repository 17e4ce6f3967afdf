"""``drahealth demo``: the whole device-health loop on one machine, narrated.

Starts a :class:`~drahealth.cli._cluster.LocalCluster` (embedded API server, the control
plane's stand-ins, the remediation controller, and per node a sample GPU driver and a
node agent as real processes), deploys a two-replica workload whose pods get their GPU
from a ResourceClaimTemplate, then runs the story a device failure takes: the fault
reaches the pod status, the controller taints the device NoExecute, the pod is evicted
and replaced on a healthy device, the device recovers and the taint is removed. Each
step is observed through the API and printed with its latency. ``--no-script`` leaves
the cluster running for manual fault injection.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from lightkube import AsyncClient, codecs
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceClaim
from rich.console import Console

from drahealth._aio import on_stop_signals
from drahealth.cli._cluster import DRIVER, LocalCluster
from drahealth.remedy import parse_policy

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


async def placements(client: AsyncClient) -> list[Placement]:
    """The live workload pods with their device and its health from the pod status."""
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


async def deploy(cluster: LocalCluster, timeline: Timeline) -> list[Placement]:
    client = cluster.client
    assert client is not None
    t0 = time.monotonic()
    for obj in _workload():
        await client.create(codecs.from_dict(obj))

    async def running() -> list[Placement] | None:
        now = await placements(client)
        ok = [p for p in now if p.phase == "Running" and p.health == "Healthy"]
        return ok if len(ok) == 2 else None

    pods, _ = await until(running, 30, "two healthy running pods")
    timeline.print(
        "workload running",
        "ReplicaSet trainer x2, claims from template one-gpu: " + "; ".join(map(str, pods)),
        time.monotonic() - t0,
    )
    return pods


async def story(cluster: LocalCluster, timeline: Timeline) -> None:
    client = cluster.client
    assert client is not None
    first = await deploy(cluster, timeline)
    victim, known = first[0], {p.pod for p in first}
    pool, device = victim.device.split("/")
    node = cluster.node(victim.node)
    fault_at = time.monotonic()
    await cluster.inject(node, device, "unhealthy", "--message", FAULT)

    async def unhealthy() -> Placement | None:
        return next(
            (
                p
                for p in await placements(client)
                if p.pod == victim.pod and p.health == "Unhealthy"
            ),
            None,
        )

    seen, _ = await until(unhealthy, 10, "Unhealthy in the pod status")
    timeline.print("fault reaches the pod status", str(seen), time.monotonic() - fault_at)

    async def tainted() -> Any:
        rules = [r async for r in client.list(DeviceTaintRule)]
        return next(
            (
                r
                for r in rules
                if r.spec and r.spec.deviceSelector and r.spec.deviceSelector.device == device
            ),
            None,
        )

    rule, _ = await until(tainted, 10, "the DeviceTaintRule")
    taint = rule.spec.taint
    timeline.print(
        "controller taints the device",
        f"DeviceTaintRule {rule.metadata.name}: {taint.key}={taint.value}:{taint.effect}",
        time.monotonic() - fault_at,
    )

    async def evicted() -> bool:
        return all(p.pod != victim.pod for p in await placements(client))

    await until(evicted, 10, "the eviction")
    timeline.print(
        "pod evicted",
        f"{victim.pod} (DisruptionTarget: DeletionByDeviceTaintManager)",
        time.monotonic() - fault_at,
    )

    async def replaced() -> Placement | None:
        now = await placements(client)
        fresh = [
            p for p in now if p.pod not in known and p.phase == "Running" and p.health == "Healthy"
        ]
        return fresh[0] if len(now) == 2 and fresh else None

    new, _ = await until(replaced, 20, "the replacement pod")
    timeline.print("replacement running on a healthy device", str(new), time.monotonic() - fault_at)

    repair_at = time.monotonic()
    await cluster.inject(node, device, "healthy", "--message", "repaired")

    async def untainted() -> bool:
        return await tainted() is None

    await until(untainted, 15, "the untaint")
    timeline.print(
        "device verified healthy, taint removed",
        f"{DRIVER}/{pool}/{device} Healthy for 3 s -> DeviceTaintRule deleted",
        time.monotonic() - repair_at,
    )


async def run_demo(
    port: int,
    kubeconfig_out: Path | None,
    script: bool,
    nodes: int,
    keep: bool,
    dashboard_port: int = 0,
) -> int:
    from drahealth.web import Dashboard

    workdir = Path(tempfile.mkdtemp(prefix="drahealth-demo-"))
    policy = parse_policy(POLICY, "demo policy")
    cluster = LocalCluster(workdir, policy, nodes=nodes, port=port)
    timeline = Timeline()
    dashboard: Dashboard | None = None
    # once the demo runs, a stop signal also covers the clean-up below
    signals = contextlib.ExitStack()
    try:
        t0 = time.monotonic()
        await cluster.start()
        devices = 0
        for published in await cluster.slices():
            devices += len(published.spec.devices or []) if published.spec else 0
        timeline.print(
            "cluster up",
            f"{nodes} nodes (sample GPU driver + node agent each), {devices} GPUs in "
            f"ResourceSlices, scheduler/eviction/ReplicaSet stand-ins, remediation controller",
            time.monotonic() - t0,
        )
        kubeconfig = cluster.kubeconfig
        if kubeconfig_out is not None:
            shutil.copyfile(kubeconfig, kubeconfig_out)
            kubeconfig = kubeconfig_out
        assert cluster.client is not None
        dashboard = Dashboard(cluster.client)
        console.print(f"dashboard: {await dashboard.start(port=dashboard_port)}")
        console.print(f"embedded API server: {cluster.server.url}")
        console.print(
            f"kubeconfig: {kubeconfig}   (try: kubectl --kubeconfig {kubeconfig} get pods -w)"
        )
        if script:
            await story(cluster, timeline)
            console.print("[green]demo complete[/]")
            return 0
        await deploy(cluster, timeline)
        first = cluster.nodes[0]
        stop = asyncio.Event()
        signals.enter_context(on_stop_signals(stop.set))
        console.print(
            "running; inject a fault with:\n"
            f"  drahealth inject --state-dir {first.driver_state} gpu-0 unhealthy "
            f'--message "{FAULT}"\n'
            "press Ctrl-C to stop"
        )
        await stop.wait()
        return 0
    except (TimeoutError, RuntimeError) as exc:
        console.print(f"[red]demo failed: {exc}[/] (logs in {workdir})")
        keep = True
        return 1
    finally:
        if dashboard is not None:
            await dashboard.stop()
        await cluster.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        signals.close()


@click.command()
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="API server port (0 = any free port).",
)
@click.option(
    "--kubeconfig-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the kubeconfig here.",
)
@click.option(
    "--script/--no-script",
    default=True,
    show_default=True,
    help="Run the scripted story, or deploy the workload and stay up.",
)
@click.option(
    "--nodes", type=click.IntRange(1, 8), default=2, show_default=True, help="Simulated nodes."
)
@click.option("--keep", is_flag=True, help="Keep the work directory (logs, state) at the end.")
@click.option(
    "--dashboard-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Dashboard port (0 = any free port).",
)
def demo_command(
    port: int, kubeconfig_out: Path | None, script: bool, nodes: int, keep: bool,
    dashboard_port: int,
) -> None:  # fmt: skip
    """Run the whole device-health loop on one machine and narrate it."""
    raise SystemExit(
        asyncio.run(run_demo(port, kubeconfig_out, script, nodes, keep, dashboard_port))
    )
