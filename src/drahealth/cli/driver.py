"""The ``drahealth driver`` command (``drahealth inject`` lives in ``drahealth.cli.inject``).

``driver_command`` runs the sample driver (:class:`drahealth.simdriver.SampleDriverApp`) in the
foreground. This module only parses options, prints, and turns errors into exit
codes: 0 on success, 1 when the driver could not start, 2 for usage errors (click).
With ``--metrics-port``, ``/readyz`` says whether the kubelet has the plugin registered,
its ResourceSlices were published and the API server answers
(:mod:`drahealth.cli._readiness`).
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket

import click

from drahealth import api
from drahealth._aio import cancel_and_wait, on_stop_signals
from drahealth._metrics_http import Readiness
from drahealth.cli._options import IN_CLUSTER, METRICS_HOST
from drahealth.cli._readiness import API_CHECK_INTERVAL, ApiCheck, all_of, driver_readiness
from drahealth.driver import DEFAULT_CDI_DIR, WITHDRAW_MODES, CheckpointError
from drahealth.kube import KubeConfigError
from drahealth.simdriver import (
    DEFAULT_DRIVER_NAMES,
    DEFAULT_NVIDIA_RELEASE,
    NVIDIA_RELEASES,
    PROFILES,
    SampleDriverApp,
    SampleDriverConfig,
)

__all__ = ["driver_command"]


def _say(line: str) -> None:
    click.echo(line)  # click.echo flushes


@click.command("driver")
@click.option(
    "--profile",
    type=click.Choice(PROFILES),
    default="sim-gpu",
    show_default=True,
    help="Simulated device profile.",
)
@click.option(
    "--driver-name",
    default=None,
    help="DRA driver name [default: gpu.example.com, nic.example.com, pci.example.com or "
    "gpu.nvidia.com].",
)
@click.option(
    "--node-name",
    envvar="NODE_NAME",
    default=socket.gethostname,
    show_default="$NODE_NAME or the host name",
    help="Node name; also the pool name.",
)
@click.option(
    "--registry-dir",
    default=api.KUBELET_REGISTRY_DIR,
    show_default=True,
    help="Kubelet plugin registry directory (registration socket).",
)
@click.option(
    "--plugins-dir",
    default=api.KUBELET_PLUGINS_DIR,
    show_default=True,
    help="Parent of the plugin data dir <plugins-dir>/<driver> (DRA socket).",
)
@click.option(
    "--cdi-dir", default=DEFAULT_CDI_DIR, show_default=True, help="Where CDI specs are written."
)
@click.option(
    "--state-dir",
    default=None,
    help="Checkpoint, taint store and control socket [default: <plugins-dir>/<driver>].",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="API access: fetch claims, publish ResourceSlices and taints.",
)
@click.option(
    "--devices", type=click.IntRange(min=0), default=8, show_default=True, help="Device count."
)
@click.option(
    "--health-timeout",
    type=click.IntRange(min=1),
    default=api.DEFAULT_HEALTH_TIMEOUT_SECONDS,
    show_default=True,
    help="health_check_timeout_seconds sent per device; streams re-send every third of it.",
)
@click.option(
    "--pod-uid",
    envvar="POD_UID",
    default=None,
    help="Rolling-update mode: socket names carry this pod UID ($POD_UID).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    help="Serve Prometheus metrics on --metrics-host:PORT/metrics (0 picks a free port).",
)
@METRICS_HOST
@IN_CLUSTER
@click.option(
    "--partitions",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="sim-gpu: partitions per GPU (shared counters); 0 = whole GPUs only.",
)
@click.option(
    "--prepare-delay",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds each prepare call sleeps (to test crashes mid-prepare).",
)
@click.option(
    "--broken-device",
    "broken_devices",
    multiple=True,
    metavar="DEVICE",
    help="Simulate hardware that fails to prepare (a permanent device fault); repeatable.",
)
@click.option(
    "--sysfs-root",
    default="/sys",
    show_default=True,
    help="sim-pci: the sysfs tree to read PCI devices from (a fake tree in tests).",
)
@click.option(
    "--error-type-field",
    is_flag=True,
    help="Send the KEP-5322 error_type field (Permanent/Transient) with prepare errors.",
)
@click.option(
    "--claim-cache",
    is_flag=True,
    help="Answer prepares from a ResourceClaim watch cache; a miss falls back to a GET.",
)
@click.option(
    "--withdraw-unhealthy",
    type=click.Choice(WITHDRAW_MODES),
    default="never",
    show_default=True,
    is_flag=False,
    flag_value="auto",
    help="Leave latched-Unhealthy devices out of the ResourceSlices until Healthy: auto "
    "(also the flag alone) = only where the server drops device taints (DRADeviceTaints "
    "off), always = also where it keeps them.",
)
@click.option(
    "--withdraw-unknown",
    is_flag=True,
    help="Withdraw Unknown devices too (where devices are withdrawn).",
)
@click.option(
    "--claim-status",
    is_flag=True,
    help="Write each prepared device's health into its ResourceClaim's status.devices "
    "(condition DeviceHealthy; needs API access and patch on resourceclaims/status).",
)
@click.option(
    "--nvidia-release",
    type=click.Choice(list(NVIDIA_RELEASES)),
    default=DEFAULT_NVIDIA_RELEASE,
    show_default=True,
    help="sim-nvidia: publish the attributes of this release of NVIDIA's DRA driver.",
)
@click.option(
    "--kernel-log",
    type=click.Path(dir_okay=False),
    default=None,
    help="sim-nvidia: the fake kernel log the xid action appends to [default: <state-dir>/kmsg].",
)
@API_CHECK_INTERVAL
def driver_command(
    profile: str,
    driver_name: str | None,
    node_name: str,
    registry_dir: str,
    plugins_dir: str,
    cdi_dir: str,
    state_dir: str | None,
    kubeconfig: str | None,
    devices: int,
    health_timeout: int,
    pod_uid: str | None,
    metrics_port: int | None,
    metrics_host: str,
    in_cluster: bool,
    partitions: int,
    prepare_delay: float,
    broken_devices: tuple[str, ...],
    error_type_field: bool,
    sysfs_root: str,
    claim_cache: bool,
    api_check_interval: float,
    withdraw_unhealthy: str,
    withdraw_unknown: bool,
    claim_status: bool,
    nvidia_release: str,
    kernel_log: str | None,
) -> None:
    """Run the sample DRA driver with simulated devices until SIGTERM/SIGINT."""
    config = SampleDriverConfig(
        profile=profile,
        driver_name=driver_name or DEFAULT_DRIVER_NAMES[profile],
        node_name=node_name,
        registry_dir=os.path.abspath(registry_dir),
        plugins_dir=os.path.abspath(plugins_dir),
        cdi_dir=os.path.abspath(cdi_dir),
        state_dir=os.path.abspath(state_dir) if state_dir else None,
        kubeconfig=kubeconfig,
        devices=devices,
        health_timeout=health_timeout,
        pod_uid=pod_uid or None,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        in_cluster=in_cluster,
        partitions=partitions,
        prepare_delay=prepare_delay,
        broken_devices=broken_devices,
        error_type_field=error_type_field,
        sysfs_root=sysfs_root,
        claim_cache=claim_cache,
        withdraw_unhealthy=withdraw_unhealthy,  # type: ignore[arg-type]
        withdraw_unknown=withdraw_unknown,
        claim_status=claim_status,
        nvidia_release=nvidia_release,
        kernel_log=os.path.abspath(kernel_log) if kernel_log else None,
    )
    try:
        app = SampleDriverApp(config, say=_say)
        asyncio.run(_run(app, api_check_interval))
    except (CheckpointError, KubeConfigError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc


async def _run(app: SampleDriverApp, api_check_interval: float) -> None:
    """``app.run()`` plus the readiness of ``/readyz`` once the driver has started."""
    api_check: ApiCheck | None = None
    published = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def watch_published() -> None:
        assert app.publisher is not None
        while True:  # wait_synced gives up after its timeout: keep waiting
            try:
                await app.publisher.wait_synced(timeout=60)
            except TimeoutError:
                continue
            published.set()
            return

    with on_stop_signals(app.request_stop):
        try:
            await app.start()
            if app.metrics_server is not None:
                checks: list[Readiness]
                if app.publisher is not None and app.client is not None:
                    tasks.append(asyncio.create_task(watch_published(), name="slices-published"))
                    api_check = ApiCheck(app.client, max_age=api_check_interval)
                    checks = [driver_readiness(app, published), api_check]
                else:
                    checks = [driver_readiness(app)]
                app.metrics_server.ready = all_of(*checks)
            # what was built at start lives as long as the process: out of the
            # collector's scans, so a full collection cannot stall a burst of prepares
            gc.collect()
            gc.freeze()
            await app.wait()
        finally:
            await cancel_and_wait(tasks)
            if api_check is not None:
                await api_check.close()
            await app.stop()
