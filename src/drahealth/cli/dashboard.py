"""``drahealth dashboard``: serve the device-health dashboard for any cluster.

The cluster is found as by every command (``--kubeconfig``, ``$KUBECONFIG``,
``--context``; see :mod:`drahealth.cli._access`). Before serving, the kubeconfig and the
files it names are checked and the API server is asked once, so an unreachable server or
a missing certificate authority is one ``error:`` line (exit 1) naming what failed, and
"cannot serve on" is said only when the listen address itself fails. Usage errors exit 2.
What the server serves is asked once here; the page says which DRA kinds it does not
serve.
"""

from __future__ import annotations

import asyncio
import os

import click

from drahealth._aio import wait_for_stop_signal
from drahealth._api_failures import CommandError
from drahealth._http_guard import check_allowed_hosts
from drahealth.cli._access import Access, api_options
from drahealth.core import DEFAULT_NAMESPACE

__all__ = ["dashboard_command"]


@click.command("dashboard")
@api_options(namespaced=False)
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
    access: Access,
    host: str,
    port: int,
    token_file: str | None,
    agent_namespace: str,
    allowed_hosts: tuple[str, ...],
    controller_namespace: str,
) -> None:
    """Serve the live device-health dashboard (a row per node, filters in the URL) until
    SIGTERM/SIGINT."""
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
    access.config()  # the kubeconfig and the files it names, checked first
    with access.failures():
        asyncio.run(
            _run(
                access, host, port, token, agent_namespace, allowed_hosts,
                controller_namespace,
            )
        )  # fmt: skip


async def _run(
    access: Access,
    host: str,
    port: int,
    token: str | None,
    agent_namespace: str,
    allowed_hosts: tuple[str, ...] = (),
    controller_namespace: str = "default",
) -> None:
    from drahealth.kube import DiscoveryError, discover
    from drahealth.web import Dashboard

    client = access.async_client()
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
