"""``drahealth stream SOCKET``: a live view of any DRA driver's dra-health stream.

Owns the command (formerly ``drahealth watch``, a name ``-w/--watch`` of ``status`` and
``pods`` now means something else; ``watch`` stays as a hidden alias that says the new
name on stderr). It opens the kubelet's gRPC health service on a driver's socket (v1,
else v1alpha1) and prints every message: a table per message, or one JSON document per
line with ``-o json``. Ctrl-C ends it with exit code 0; a socket that does not answer is
one ``error:`` line and exit code 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import click

from drahealth._api_failures import CommandError
from drahealth._text import json_text
from drahealth.cli._output import table_text

__all__ = ["stream_command", "watch_command"]

_SOCKET = click.argument("socket", metavar="SOCKET", type=click.Path(dir_okay=False))
_ONCE = click.option("--once", is_flag=True, help="Print the first message and exit.")
_OUTPUT = click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)


@click.command("stream")
@_SOCKET
@_ONCE
@_OUTPUT
def stream_command(socket: str, once: bool, output: str) -> None:
    """Live view of any DRA driver's health stream, read from its DRA socket (dra.sock)."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_stream(socket, once, output))


@click.command("watch", hidden=True)
@_SOCKET
@_ONCE
@_OUTPUT
def watch_command(socket: str, once: bool, output: str) -> None:
    """Deprecated name of ``drahealth stream``."""
    click.echo(
        "warning: 'drahealth watch' is deprecated; use 'drahealth stream' "
        "(-w/--watch of status and pods follows the API)",
        err=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_stream(socket, once, output))


async def _stream(socket: str, once: bool, output: str) -> None:
    import grpc

    from drahealth import api
    from drahealth.core import Health

    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        for service, module, grpc_module in (
            (api.DRA_HEALTH_V1, api.health_v1, api.health_v1_grpc),
            (api.DRA_HEALTH_V1ALPHA1, api.health_v1alpha1, api.health_v1alpha1_grpc),
        ):
            stub = grpc_module.DRAResourceHealthStub(channel)
            call = stub.NodeWatchResources(module.NodeWatchResourcesRequest())
            try:
                async for message in call:
                    rows = [
                        {
                            "pool": d.device.pool_name,
                            "device": d.device.device_name,
                            "health": Health.from_wire(d.health).value,
                            "message": d.message,
                            "timeoutSeconds": d.health_check_timeout_seconds,
                        }
                        for d in message.devices
                    ]
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    if output == "json":
                        click.echo(json_text({"time": stamp, "service": service, "devices": rows}))
                    else:
                        click.echo(f"{stamp} {service}: {len(rows)} devices")
                        cells = [
                            [r["pool"], r["device"], r["health"], r["timeoutSeconds"],
                             r["message"] or "<none>"]
                            for r in rows
                        ]  # fmt: skip
                        headers = ["POOL", "DEVICE", "HEALTH", "TIMEOUT", "MESSAGE"]
                        click.echo(table_text(headers, cells))
                    if once:
                        call.cancel()
                        return
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    continue
                raise CommandError(
                    f"{socket}: {exc.code().name}: {exc.details()} "
                    "(check the path and that the driver is running)"
                ) from exc
        raise CommandError(f"{socket}: the plugin serves no dra-health service")
