"""``drahealth controller``: the remediation controller process (leader-elected).

Owns the command: loads and validates the policy (exit 2 naming the file and field
when it is wrong), builds the API client, then campaigns for the Lease
``<namespace>/drahealth-controller``; while leading it runs
:class:`~drahealth.remedy.RemediationController`. Prints ``ready: <id>``
once campaigning and ``leading: <id>`` / ``standby: <id>`` on each change; SIGTERM or
SIGINT stops the work first, then releases the Lease (exit 0).

``--remediation-mode`` (default: the policy's ``remediation.mode``, else ``auto``) is
checked against what the server serves before campaigning: ``taint-rules`` on a server
without the DeviceTaintRule API exits 2 saying so. With ``--metrics-port``, ``/readyz``
answers ready when this replica leads with its informers synced, or stands by with a
known leader (both mean the API answered within the lease's renew deadline).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket

import click

from drahealth._aio import on_stop_signals
from drahealth.cli._options import METRICS_HOST
from drahealth.core import REMEDIATION_MODES, Policy, PolicyError
from drahealth.kube import KubeConfigError

__all__ = ["controller_command"]


@click.command("controller")
@click.option(
    "--kubeconfig",
    default=None,
    metavar="FILE",
    help="API access [default: $KUBECONFIG, the in-cluster service account, ~/.kube/config].",
)
@click.option("--policy", "policy_file", required=True, metavar="FILE", help="Policy (YAML).")
@click.option("--dry-run", is_flag=True, help="Write every taint with effect None; evict nothing.")
@click.option(
    "--id",
    "identity",
    default=None,
    help="This replica's identity in the Lease [default: <host>-<pid>].",
)
@click.option("--namespace", default="default", show_default=True, help="Lease and history.")
@click.option(
    "--lease-duration",
    type=click.FloatRange(min=1.0),
    default=15.0,
    show_default=True,
    help="Seconds a standby waits for a silent leader before taking over.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve /metrics on --metrics-host:PORT (0 picks one).",
)
@click.option(
    "--remediation-mode",
    type=click.Choice(REMEDIATION_MODES),
    default=None,
    help="How wanted taints are carried out [default: the policy's remediation.mode, auto]: "
    "auto uses DeviceTaintRules where served, else the policy's fallback (quarantine: a "
    "claim per bad device).",
)
@METRICS_HOST
def controller_command(
    kubeconfig: str | None,
    policy_file: str,
    dry_run: bool,
    identity: str | None,
    namespace: str,
    lease_duration: float,
    metrics_port: int | None,
    metrics_host: str,
    remediation_mode: str | None,
) -> None:
    """Run the remediation controller: device health -> taints -> evictions -> untaint."""
    from drahealth.remedy import load_policy

    try:
        policy = load_policy(policy_file)
    except PolicyError as exc:
        raise click.UsageError(str(exc)) from exc
    if dry_run:
        policy = dataclasses.replace(policy, dry_run=True)
    if remediation_mode is not None:
        policy = dataclasses.replace(policy, remediation_mode=remediation_mode)
    if kubeconfig is not None and not os.path.isfile(kubeconfig):
        raise click.BadParameter(f"{kubeconfig}: no such file", param_hint="--kubeconfig")
    name = identity or f"{socket.gethostname()}-{os.getpid()}"
    try:
        asyncio.run(
            _run(kubeconfig, policy, name, namespace, lease_duration, (metrics_host, metrics_port))
        )
    except KubeConfigError as exc:
        raise click.ClickException(str(exc)) from exc


async def _run(
    kubeconfig: str | None,
    policy: Policy,
    identity: str,
    namespace: str,
    lease_duration: float,
    metrics: tuple[str, int | None],
) -> None:
    from drahealth._metrics_http import MetricsServer
    from drahealth.kube import DiscoveryError, LeaderElector, discover, make_client
    from drahealth.remedy import ControllerMetrics, RemediationController, mode_on

    client = make_client(kubeconfig, field_manager="drahealth-controller")
    try:
        served = await discover(client)
    except DiscoveryError as exc:
        served = None  # the controller keeps asking once it leads
        click.echo(f"API discovery failed ({exc}); the controller retries", err=True)
    if served is not None:
        choice, refused = mode_on(policy.remediation_mode, policy, served)
        if refused is not None:
            await client.close()
            raise click.UsageError(refused)
        click.echo(choice.line())
    metrics_host, metrics_port = metrics
    controller_metrics = ControllerMetrics()
    current: list[RemediationController] = []
    elector = LeaderElector(
        client,
        name="drahealth-controller",
        namespace=namespace,
        identity=identity,
        lease_duration=lease_duration,
        renew_deadline=lease_duration * 2 / 3,
        retry_period=max(0.1, lease_duration / 7.5),
        # renewals on their own thread and client: a long pass cannot starve them
        client_factory=lambda: make_client(kubeconfig, field_manager="drahealth-controller"),
    )

    def ready() -> tuple[bool, str]:
        if elector.is_leader:
            if current and current[0].synced:
                return True, "ok"
            return False, "leading, informers not synced yet"
        if elector.leader:
            return True, "ok"
        return False, "no leader known yet (the Lease was not read)"

    server = None
    if metrics_port is not None:
        server = MetricsServer(controller_metrics.registry, ready=ready)
        await server.start(metrics_host, metrics_port)
        click.echo(f"metrics: {server.url}")

    async def lead() -> None:
        click.echo(f"leading: {identity}")
        controller_metrics.leader.set(1)
        controller = RemediationController(
            client,
            policy,
            identity=identity,
            namespace=namespace,
            metrics=controller_metrics,
            served=served,
            fence=elector.holds,  # every write first checks the Lease is still held
        )
        current[:] = [controller]
        try:
            await controller.run()
        finally:
            current.clear()
            controller_metrics.leader.set(0)
            click.echo(f"standby: {identity}")

    task = asyncio.create_task(elector.run(lead))
    with on_stop_signals(task.cancel):
        click.echo(f"ready: {identity}")
        try:
            await task
        except asyncio.CancelledError:
            pass
        finally:
            if server is not None:
                await server.stop()
            await client.close()
