"""``drahealth inject``: the fault injector's command line.

Owns only the command; it talks to a running ``drahealth driver`` through
the simulated driver's control client and imports nothing else of it, so
scripts that inject many faults do not pay for the driver's imports on every call.
"""

from __future__ import annotations

import click

from drahealth.simdriver import (
    ACTIONS,
    ControlError,
    control_socket_path,
    request_sync,
)

__all__ = ["inject_command"]


@click.command("inject")
@click.option(
    "--state-dir",
    required=True,
    help="The running driver's state directory (holds control.sock).",
)
@click.option("--message", default=None, help="Message for unhealthy/unknown/healthy.")
@click.option(
    "--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True, hidden=True
)
@click.argument("device")
@click.argument("action", type=click.Choice(ACTIONS[:5]))
def inject_command(
    state_dir: str, message: str | None, timeout: float, device: str, action: str
) -> None:
    """Inject a health change into a running `drahealth driver`.

    DEVICE is `gpu-3` or `POOL/gpu-3` (`*` for silence/resume). ACTION: `unhealthy`
    (fatal, latched), `healthy` (explicit recovery), `unknown`, `silence` / `resume`
    (all health streams go quiet / come back).
    """
    path = control_socket_path(state_dir)
    try:
        reply = request_sync(path, action, device, message, timeout=timeout)
    except ControlError as exc:
        raise click.ClickException(str(exc)) from exc
    if "health" in reply:
        text = f"{reply['device']}: {reply['health']}"
        if reply.get("message"):
            text += f" ({reply['message']})"
    else:
        text = "ok"
    if reply.get("silenced"):
        text += " [streams silenced]"
    click.echo(text)
