"""``drahealth inject``: the fault injector's command line.

Owns only the command; it talks to the control socket that
``drahealth.driver.start`` serves for every toolkit driver (``drahealth driver`` and
any custom driver with a health hub) through the toolkit's standard-library client,
and imports nothing else of the toolkit, so scripts that inject many faults do not
pay for gRPC and the Kubernetes client on every call.
"""

from __future__ import annotations

import click

from drahealth.driver import (
    CONTROL_ACTIONS,
    ControlError,
    control_request_sync,
    control_socket_path,
)

__all__ = ["inject_command"]


@click.command("inject")
@click.option(
    "--state-dir",
    required=True,
    help="The running driver's state directory (holds control.sock); for a toolkit "
    "driver, PluginOptions.state_dir (default <plugins-dir>/<driver>).",
)
@click.option(
    "--message", default=None, help="Message for unhealthy/unknown/healthy; xid: the driver's text."
)
@click.option(
    "--xid",
    type=click.IntRange(0, 0xFFFFFFFF),
    default=None,
    help="xid: the XID number [default: 79].",
)
@click.option("--pid", type=click.IntRange(min=1), default=None, help="xid: the process's id.")
@click.option("--process", default=None, help="xid: the process's name.")
@click.option(
    "--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True, hidden=True
)
@click.argument("device")
@click.argument("action", type=click.Choice([a for a in CONTROL_ACTIONS if a != "status"]))
def inject_command(
    state_dir: str,
    message: str | None,
    xid: int | None,
    pid: int | None,
    process: str | None,
    timeout: float,
    device: str,
    action: str,
) -> None:
    """Inject a health change into a running driver (any driver built on drahealth.driver).

    DEVICE is `gpu-3` or `POOL/gpu-3` (`*` for silence/resume). ACTION: `unhealthy`
    (fatal, latched), `healthy` (explicit recovery), `unknown`, `silence` / `resume`
    (all health streams go quiet / come back), `xid` (sim-nvidia: the GPU's NVIDIA XID
    line appended to the node's fake kernel log; the driver's health does not change).
    `healthy` also clears a latched fault: an operator's explicit recovery.
    """
    path = control_socket_path(state_dir)
    fields = {k: v for k, v in (("xid", xid), ("pid", pid), ("process", process)) if v is not None}
    if fields and action != "xid":
        raise click.UsageError("--xid, --pid and --process go with the xid action only")
    try:
        reply = control_request_sync(path, action, device, message, timeout=timeout, fields=fields)
    except ControlError as exc:
        raise click.ClickException(str(exc)) from exc
    if "record" in reply:
        click.echo(f"{reply['device']}: {reply['kernelLog']}: {reply['record']}")
        return
    if "health" in reply:
        text = f"{reply['device']}: {reply['health']}"
        if reply.get("message"):
            text += f" ({reply['message']})"
    else:
        text = "ok"
    if reply.get("silenced"):
        text += " [streams silenced]"
    click.echo(text)
