"""``drahealth demo``: the whole device-health loop on one machine, narrated.

Starts a :class:`~drahealth.cli._cluster.LocalCluster` (embedded API server, the control
plane's stand-ins, the remediation controller, and per node a sample GPU driver and a
node agent as real processes), deploys a two-replica workload whose pods get their GPU
from a ResourceClaimTemplate, then runs the story a device failure takes: the fault
reaches the pod status, the controller taints the device NoExecute, the pod is evicted
and replaced on a healthy device, the device recovers and the taint is removed. Each
step is observed through the API and printed with its latency. ``--no-script`` leaves
the cluster running for manual fault injection. ``--profile nvidia`` tells the same story
beside a simulated NVIDIA DRA driver that streams no health, with the fault caught by a
kernel-log source attached to its GPUs (``drahealth.cli._demo_nvidia``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from pathlib import Path

import click

from drahealth._aio import on_stop_signals
from drahealth.cli._cluster import LocalCluster
from drahealth.cli._demo_story import FAULT, POLICY, Timeline, console, deploy, story
from drahealth.cli._options import feature_gates_option, kube_profile_from, kube_version_option
from drahealth.core import (
    NEWEST_KUBE_VERSION,
    KubeProfile,
    kube_profile,
)
from drahealth.remedy import parse_policy


async def run_demo(
    port: int,
    kubeconfig_out: Path | None,
    script: bool,
    nodes: int,
    keep: bool,
    dashboard_port: int = 0,
    profile: KubeProfile | None = None,
    driver_profile: str = "sample",
) -> int:
    from drahealth.web import Dashboard

    workdir = Path(tempfile.mkdtemp(prefix="drahealth-demo-"))
    profile = profile or kube_profile(NEWEST_KUBE_VERSION)
    nvidia = driver_profile == "nvidia"
    if nvidia:
        from drahealth.cli import _demo_nvidia

        cluster = _demo_nvidia.nvidia_cluster(workdir, nodes=nodes, port=port, profile=profile)
    else:
        policy = parse_policy(POLICY, "demo policy")
        cluster = LocalCluster(workdir, policy, nodes=nodes, port=port, profile=profile)
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
            _demo_nvidia.describe(cluster, devices)
            if nvidia
            else f"{nodes} nodes (sample GPU driver + node agent each), {devices} GPUs in "
            f"ResourceSlices, scheduler/eviction/ReplicaSet stand-ins, remediation controller; "
            f"{profile.describe()}",
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
            await (_demo_nvidia.story if nvidia else story)(cluster, timeline)
            console.print("[green]demo complete[/]")
            return 0
        if nvidia:
            await deploy(cluster, timeline, _demo_nvidia.workload(), pod_health=False)
        else:
            await deploy(cluster, timeline)
        first = cluster.nodes[0]
        stop = asyncio.Event()
        signals.enter_context(on_stop_signals(stop.set))
        if nvidia:
            _demo_nvidia.no_script_hint(cluster)
        else:
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
@kube_version_option("The Kubernetes release the cluster behaves as, with its default gates")
@feature_gates_option(
    "Gates turned on or off as a cluster admin could, e.g. DRADeviceTaintRules=true on 1.36."
)
@click.option(
    "--dashboard-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Dashboard port (0 = any free port).",
)
@click.option(
    "--profile",
    "driver_profile",
    type=click.Choice(["sample", "nvidia"]),
    default="sample",
    show_default=True,
    help="sample: drahealth's sample GPU driver streams the health; nvidia: a simulated "
    "NVIDIA DRA driver streams none, and a kernel-log source attached to its GPUs catches "
    "the fault.",
)
def demo_command(
    port: int, kubeconfig_out: Path | None, script: bool, nodes: int, keep: bool,
    dashboard_port: int, kube_version: str, feature_gates: str, driver_profile: str,
) -> None:  # fmt: skip
    """Run the whole device-health loop on one machine and narrate it."""
    profile = kube_profile_from(kube_version, feature_gates)
    raise SystemExit(
        asyncio.run(
            run_demo(
                port, kubeconfig_out, script, nodes, keep, dashboard_port, profile=profile,
                driver_profile=driver_profile,
            )
        )
    )  # fmt: skip
