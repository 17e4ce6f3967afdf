"""The ``drahealth agent`` command: run the node agent in the foreground.

Parses options into an :class:`~drahealth.node.AgentConfig`, builds the API
client, runs the agent until SIGTERM/SIGINT, and turns start-up errors into exit
code 1 with a message naming the problem (2 for usage errors, from click). Prints
``ready: <registry dir>`` once the agent watches for plugins. With ``--metrics-port``,
``/readyz`` says whether the agent's view of the node is synced and, with API access,
whether the API server answers (:mod:`drahealth.cli._readiness`).
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket

import click

from drahealth import api
from drahealth._aio import on_stop_signals
from drahealth.cli._options import (
    IN_CLUSTER,
    METRICS_HOST,
    feature_gates_option,
    kube_profile_from,
    kube_version_option,
)
from drahealth.cli._readiness import API_CHECK_INTERVAL
from drahealth.kube import KubeConfigError

__all__ = ["agent_command"]


@click.command("agent")
@click.option(
    "--mode",
    type=click.Choice(["kubelet", "observer"]),
    default="kubelet",
    show_default=True,
    help="kubelet: play the node's kubelet (write pod status); observer: run beside one.",
)
@click.option(
    "--node-name",
    envvar="NODE_NAME",
    default=socket.gethostname,
    show_default="$NODE_NAME or the host name",
    help="The node this agent serves.",
)
@click.option(
    "--registry-dir",
    default=api.KUBELET_REGISTRY_DIR,
    show_default=True,
    help="Plugin registry directory to watch for registration sockets.",
)
@click.option(
    "--state-dir",
    required=True,
    help="Health log, claim checkpoint (created if missing).",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="API access (kubelet mode needs this or --in-cluster).",
)
@click.option(
    "--namespace",
    default="default",
    show_default=True,
    help="Namespace of the agent's ConfigMaps (device health, post-mortem records).",
)
@IN_CLUSTER
@click.option(
    "--default-timeout",
    type=click.FloatRange(min=0.001),
    default=float(api.DEFAULT_HEALTH_TIMEOUT_SECONDS),
    show_default=True,
    help="Lease (seconds) of a device whose report has no timeout.",
)
@click.option(
    "--restart-grace",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Deprecated, ignored: after a restart each restored device keeps the rest of its "
    "recorded lease.",
)
@click.option(
    "--metrics-port", type=click.IntRange(0, 65535), default=None, help="Serve /metrics here."
)
@METRICS_HOST
@kube_version_option(
    "Kubelet mode plays this release's kubelet: pod health status, its message and the "
    "dra-health versions follow its default gates"
)
@feature_gates_option(
    "Gates to turn on or off, as on the kubelet (ResourceHealthStatus, "
    "ResourceHealthStatusMessage; the release's other gates are accepted)."
)
@click.option(
    "--resource-id",
    type=click.Choice(["cdi", "device"]),
    default="cdi",
    show_default=True,
    help="resourceID: first CDI device ID (as upstream) or <driver>/<pool>/<device>.",
)
@click.option(
    "--allowed-root",
    "allowed_roots",
    multiple=True,
    help="Plugin endpoints must lie inside this directory [default: the registry dir's parent].",
)
@click.option(
    "--allowed-uid",
    "allowed_uids",
    multiple=True,
    type=click.IntRange(min=0),
    help="A user whose plugin sockets are trusted [default: root and the agent's user].",
)
@click.option(
    "--podresources-socket",
    default="/var/lib/kubelet/pod-resources/kubelet.sock",
    show_default=True,
    help="Observer mode: the kubelet's PodResources socket.",
)
@click.option(
    "--podresources-interval",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="Observer mode: seconds between PodResources List calls.",
)
@click.option(
    "--cdi-dir",
    "cdi_dirs",
    multiple=True,
    help="Kubelet mode: a directory of CDI spec files (repeatable) [default: /etc/cdi and "
    "/var/run/cdi].",
)
@click.option(
    "--attach",
    "attach_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Attached health sources for devices of drivers that stream no health (NVIDIA's): "
    "a YAML file naming the drivers and their sources (docs/agent.md). Needs API access.",
)
@click.option("--resync-interval", type=click.FloatRange(min=0.1), default=60.0, hidden=True)
@click.option("--probe-interval", type=click.FloatRange(min=0.05), default=10.0, hidden=True)
@API_CHECK_INTERVAL
def agent_command(
    mode: str,
    node_name: str,
    registry_dir: str,
    state_dir: str,
    kubeconfig: str | None,
    namespace: str,
    in_cluster: bool,
    default_timeout: float,
    restart_grace: float,
    metrics_port: int | None,
    metrics_host: str,
    kube_version: str,
    feature_gates: str,
    resource_id: str,
    allowed_roots: tuple[str, ...],
    allowed_uids: tuple[int, ...],
    podresources_socket: str,
    podresources_interval: float,
    cdi_dirs: tuple[str, ...],
    attach_file: str | None,
    resync_interval: float,
    probe_interval: float,
    api_check_interval: float,
) -> None:
    """Run the node agent: the kubelet's DRA device-health pipeline."""
    from drahealth.node import AgentConfig, kubelet_settings

    profile = kube_profile_from(kube_version, feature_gates)
    if mode == "kubelet" and not kubeconfig and not in_cluster:
        raise click.UsageError("kubelet mode needs API access: --kubeconfig or --in-cluster")
    try:
        config = AgentConfig(
            node_name=node_name,
            registry_dir=os.path.abspath(registry_dir),
            state_dir=os.path.abspath(state_dir),
            mode=mode,  # type: ignore[arg-type]
            default_timeout=default_timeout,
            restart_grace=restart_grace,
            **kubelet_settings(profile),
            resource_id=resource_id,  # type: ignore[arg-type]
            allowed_roots=[os.path.abspath(r) for r in allowed_roots] or None,
            allowed_uids=list(allowed_uids) or None,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            postmortem_namespace=namespace,
            podresources_socket=podresources_socket,
            podresources_interval=podresources_interval,
            resync_interval=resync_interval,
            probe_interval=probe_interval,
            cdi_dirs=[os.path.abspath(d) for d in cdi_dirs] or AgentConfig.cdi_dirs,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    attach = None
    if attach_file is not None:
        from drahealth.node import AttachConfigError, load_attach_config

        if not kubeconfig and not in_cluster:
            raise click.UsageError("--attach needs API access: --kubeconfig or --in-cluster")
        try:
            attach = load_attach_config(attach_file)
        except AttachConfigError as exc:
            raise click.UsageError(str(exc)) from exc
    try:
        asyncio.run(_run(config, kubeconfig, in_cluster, api_check_interval, attach))
    except (KubeConfigError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc


async def _run(
    config: object,
    kubeconfig: str | None,
    in_cluster: bool,
    api_check_interval: float,
    attach: object = None,
) -> None:
    from drahealth.node import AgentConfig, NodeAgent

    assert isinstance(config, AgentConfig)
    client = None
    if kubeconfig or in_cluster:
        from drahealth.kube import make_client

        client = make_client(kubeconfig)
    os.makedirs(config.registry_dir, exist_ok=True)
    from drahealth.cli._readiness import ApiCheck, agent_readiness, all_of

    if attach is not None:
        from drahealth.node import AttachConfig

        assert isinstance(attach, AttachConfig)
    agent = NodeAgent(config, client, say=click.echo, attach=attach)
    api_check = ApiCheck(client, max_age=api_check_interval) if client is not None else None
    stop = asyncio.Event()
    with on_stop_signals(stop.set):
        try:
            await agent.start()
            if agent.metrics_server is not None:
                checks = [agent_readiness(agent)] + ([api_check] if api_check else [])
                agent.metrics_server.ready = all_of(*checks)
            for problem in agent.problems:
                click.echo(f"warning: {problem}", err=True)
            # what was built at start lives as long as the process: take it out of the
            # collector's scans, so a full collection cannot stall a health update
            gc.collect()
            gc.freeze()
            click.echo(f"ready: {config.registry_dir}")
            await stop.wait()
        finally:
            if api_check is not None:
                await api_check.close()
            await agent.stop()
            if client is not None:
                await client.close()
