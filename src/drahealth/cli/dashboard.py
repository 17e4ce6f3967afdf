"""``drahealth dashboard``: serve the device-health dashboard for any cluster.

Before serving, the kubeconfig and the files it names are checked and the API server is
asked once, so an unreachable server or a missing certificate authority is one
``error:`` line (exit 1) naming what failed, and "cannot serve on" is said only when the
listen address itself fails. Usage errors exit 2. What the server serves is asked once
here; the page says which DRA kinds it does not serve.
"""

from __future__ import annotations

import asyncio
import os

import click

from drahealth._aio import wait_for_stop_signal
from drahealth._api_failures import CommandError, api_failures, load_checked
from drahealth._http_guard import check_allowed_hosts
from drahealth.core import DEFAULT_NAMESPACE

__all__ = ["dashboard_command"]


@click.command("dashboard")
@click.option("--kubeconfig", metavar="FILE", help="API access [default: as kubectl].")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8420, show_default=True)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="File holding a token (>= 16 characters): required to view, and allows taint/untaint.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Host name browsers may use besides localhost/127.0.0.1/[::1] (repeatable). "
    "On a non-loopback --host, any Host is accepted unless this is given.",
)
@click.option(
    "--agent-namespace",
    default=DEFAULT_NAMESPACE,
    show_default=True,
    help="Namespace of the node agents' device-health ConfigMaps (the agent's --namespace).",
)
@click.option(
    "--controller-namespace",
    default="default",
    show_default=True,
    help="Namespace of the remediation controller (its history and state ConfigMaps).",
)
def dashboard_command(
    kubeconfig: str | None,
    host: str,
    port: int,
    token_file: str | None,
    agent_namespace: str,
    allowed_hosts: tuple[str, ...],
    controller_namespace: str,
) -> None:
    """Serve the node x device health grid, live, until SIGTERM/SIGINT."""
    try:
        allowed_hosts = check_allowed_hosts(allowed_hosts)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--allowed-host") from exc
    token = None
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(f"{token_file}: {exc}", param_hint="--token-file") from exc
        if len(token) < 16:
            raise click.BadParameter(
                f"{token_file}: the token must be at least 16 characters", param_hint="--token-file"
            )
    elif host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(
            f"warning: serving read-only data on {host} to anyone who can reach it", err=True
        )
    with api_failures(kubeconfig):
        load_checked(kubeconfig)
        asyncio.run(
            _run(
                kubeconfig, host, port, token, agent_namespace, allowed_hosts,
                controller_namespace,
            )
        )  # fmt: skip


async def _run(
    kubeconfig: str | None,
    host: str,
    port: int,
    token: str | None,
    agent_namespace: str,
    allowed_hosts: tuple[str, ...] = (),
    controller_namespace: str = "default",
) -> None:
    from drahealth.kube import DiscoveryError, discover, make_client
    from drahealth.web import Dashboard

    client = make_client(kubeconfig)
    try:
        try:  # is the API server there, and what does it serve?
            served = await discover(client)
        except DiscoveryError as exc:
            cause = exc.__cause__
            if isinstance(cause, Exception) and not isinstance(cause, DiscoveryError):
                raise cause from cause.__cause__  # its own cause names why (e.g. refused)
            raise CommandError(str(exc)) from None
        dashboard = Dashboard(
            client,
            token=token,
            agent_namespace=agent_namespace,
            history_namespace=controller_namespace,
            allowed_hosts=allowed_hosts,
            served=served,
        )
        try:
            try:
                url = await dashboard.start(host, port)
            except OSError as exc:
                if isinstance(exc, ConnectionError):
                    raise  # the API server, not the listen address
                reason = os.strerror(exc.errno) if exc.errno else str(exc)
                reason = reason[:1].lower() + reason[1:]
                raise CommandError(f"cannot serve on {host}:{port}: {reason}") from exc
            click.echo(f"dashboard: {url}")
            await wait_for_stop_signal()
        finally:
            await dashboard.stop()
    finally:
        await client.close()
