"""The ``drahealth apiserver`` command: run the embedded API server in the foreground.

Prints exactly ``listening on http://127.0.0.1:PORT`` once it accepts connections (after
``serving Kubernetes 1.NN: ...`` on stderr, saying what the release profile serves) and
stops cleanly on SIGINT/SIGTERM. ``--kube-version`` and ``--feature-gates`` choose the
release and gates it serves (default: the newest release with its defaults); a value
the release would refuse is a usage error (exit 2). ``python -m drahealth.controlplane``
runs the same command standalone. With ``--data``
every write is durable before it is answered; exits 1 with the reason when the data
file cannot be loaded, or when persistence is failing at shutdown.

``--with-controllers`` also runs the control plane's stand-in controllers (scheduler with
DRA allocation, resourceclaim, ReplicaSet, Job and device-taint eviction controllers), the
same ones ``drahealth demo`` runs, but no driver, node agent or workload: a driver author
runs their own driver and a kubelet-mode agent per node (``docs/apiserver.md``). It says on
stderr which controllers run and where the kubeconfig is (a temporary one unless
``--kubeconfig-out`` names a file).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from drahealth._http_guard import check_allowed_hosts
from drahealth.cli._options import feature_gates_option, kube_profile_from, kube_version_option
from drahealth.controlplane import DataFileError, serve_forever

__all__ = ["apiserver_command"]


@click.command("apiserver")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="TCP port (0 picks a free one).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0 for in-cluster use).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Host name clients may use besides localhost/127.0.0.1/[::1] (repeatable). "
    "On a non-loopback --host, any Host is accepted unless this is given.",
)
@click.option(
    "--kubeconfig-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a kubeconfig for this server to FILE.",
)
@click.option(
    "--data",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Persist all objects to FILE and FILE.wal (loaded at start; every write is "
    "durable before it is answered).",
)
@click.option(
    "--with-controllers",
    is_flag=True,
    help="Also run the stand-in controllers (scheduler with DRA allocation, resourceclaim, "
    "ReplicaSet, Job, device-taint eviction), so that pods with claims get devices once a "
    "driver and a kubelet-mode agent run for a node.",
)
@kube_version_option(
    "Kubernetes release to serve: its API versions, kinds and fields with its default feature gates"
)
@feature_gates_option(
    "Feature gates to turn on or off, as a cluster admin could (DRADeviceTaints, "
    "DRADeviceTaintRules, ResourceHealthStatus, ResourceHealthStatusMessage)."
)
def apiserver_command(
    port: int,
    host: str,
    allowed_hosts: tuple[str, ...],
    kubeconfig_out: Path | None,
    data: Path | None,
    with_controllers: bool,
    kube_version: str,
    feature_gates: str,
) -> None:
    """Run the embedded Kubernetes API server."""
    try:
        allowed_hosts = check_allowed_hosts(allowed_hosts)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--allowed-host") from e
    profile = kube_profile_from(kube_version, feature_gates)
    print(f"serving {profile.describe()}", file=sys.stderr, flush=True)
    try:
        asyncio.run(
            serve_forever(
                port=port,
                kubeconfig_out=kubeconfig_out,
                data=data,
                host=host,
                allowed_hosts=allowed_hosts,
                profile=profile,
                with_controllers=with_controllers,
            )
        )
    except DataFileError as e:
        raise click.ClickException(str(e)) from e
    except OSError as e:
        raise click.ClickException(f"cannot serve on {host}:{port}: {e}") from e
