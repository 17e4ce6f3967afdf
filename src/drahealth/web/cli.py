"""``drahealth dashboard``: serve the device-health dashboard for any cluster."""

from __future__ import annotations

import asyncio
import signal

import click

from drahealth.kube import KubeConfigError

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
def dashboard_command(kubeconfig: str | None, host: str, port: int, token_file: str | None) -> None:
    """Serve the node x device health grid, live, until SIGTERM/SIGINT."""
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
    try:
        asyncio.run(_run(kubeconfig, host, port, token))
    except KubeConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--kubeconfig") from exc
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {host}:{port}: {exc.strerror}") from exc


async def _run(kubeconfig: str | None, host: str, port: int, token: str | None) -> None:
    from drahealth.kube import make_client
    from drahealth.web import Dashboard

    client = make_client(kubeconfig)
    dashboard = Dashboard(client, token=token)
    try:
        url = await dashboard.start(host, port)
        click.echo(f"dashboard: {url}")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await dashboard.stop()
        await client.close()
