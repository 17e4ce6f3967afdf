"""``drahealth taint`` / ``drahealth untaint``: the kubectl-taint UX for one DRA device.

Owns the two commands (the API work is :func:`drahealth.remedy.apply_taint` and
:func:`drahealth.remedy.remove_taints`). ``taint``
creates (or updates, or leaves unchanged) the operator's DeviceTaintRule for a device
and taint key; ``untaint`` deletes the rules drahealth created for that device and key
(the operator's and the controller's), never a rule someone else created.

``untaint --hold DURATION [--reason TEXT]`` also asks the remediation controller not to
taint the device again for DURATION (the key ``holds`` of the ConfigMap
``drahealth-remediation-control`` in the controller's ``--namespace``; written before
the rules are deleted, so the controller never sees the deletion without it).
``--hold 0`` ends a hold and deletes the rules (the controller re-taints a device that
is still bad at once); ``untaint DEVICE --release`` only ends a hold. Without
``--hold``, the controller holds a device whose rule was deleted for the policy's
``ownership.manualUntaintHold``.

Exit codes: 0 done, 1 API error, API unreachable, no DeviceTaintRule API served (the
line names what the server serves and what to do instead) or nothing to untaint without
``--hold`` (one ``error:`` line on stderr naming what failed and what to check), 2 usage
error. Rules are read and written at the version the server serves (asked once per
command).
"""

from __future__ import annotations

import asyncio
import getpass
import os
import re
import socket
import time
from typing import Any

import click
import yaml
from lightkube import AsyncClient

from drahealth._api_failures import CommandError, api_failures, load_checked
from drahealth.core import format_time, parse_time
from drahealth.kube import DiscoveryError, ServedAPIs, discover, make_client
from drahealth.remedy import (
    EFFECTS,
    ControlError,
    DeviceRef,
    RuleAPIUnavailable,
    RuleError,
    apply_taint,
    parse_device,
    remove_taints,
    rule_body,
    send_request,
    validate_taint,
)

__all__ = ["hold_seconds", "taint_command", "untaint_command"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
#: Longest hold: a forgotten hold must not silence remediation for ever.
MAX_HOLD = 30 * 86400.0
#: Control entries that ended this long ago are dropped when a hold is written.
KEEP_ENDED = 86400.0


def hold_seconds(text: str) -> float:
    """``--hold`` text (seconds, or e.g. 90s, 30m, 2h, 1d) -> seconds; ValueError names it."""
    m = _DURATION.match(text.strip())
    if m is None:
        raise ValueError(f"--hold {text!r}: use seconds or e.g. 30s, 30m, 2h, 1d")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds > MAX_HOLD:
        raise ValueError(f"--hold {text!r}: at most 30d (a hold must end)")
    return seconds


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "operator"
    return f"{user}@{socket.gethostname()}"


def _set_hold(device: DeviceRef, until: float, by: str, reason: str) -> Any:
    """The control key ``holds`` with ``device``'s entry set (ended entries pruned)."""
    now = time.time()

    def update(current: Any) -> Any:
        holds = dict(current) if isinstance(current, dict) else {}
        for key, entry in list(holds.items()):
            end = parse_time(entry.get("until")) if isinstance(entry, dict) else None
            if end is None or end < now - KEEP_ENDED:
                del holds[key]
        holds[str(device)] = {"until": format_time(until), "by": by, "reason": reason}
        return holds

    return update


def _device(_ctx: click.Context, _param: click.Parameter, value: str) -> DeviceRef:
    try:
        return parse_device(value)
    except RuleError as exc:
        raise click.BadParameter(str(exc)) from exc


def _client(kubeconfig: str) -> AsyncClient:
    if not os.path.isfile(kubeconfig):
        raise click.BadParameter(f"{kubeconfig}: no such file", param_hint="--kubeconfig")
    with api_failures(kubeconfig):
        load_checked(kubeconfig)
        return make_client(kubeconfig, field_manager="drahealth-taint")


async def _discover(client: AsyncClient) -> ServedAPIs:
    """What the server serves, asked once per command; transport failures as themselves."""
    try:
        return await discover(client)
    except DiscoveryError as exc:
        cause = exc.__cause__
        if isinstance(cause, Exception) and not isinstance(cause, DiscoveryError):
            raise cause from cause.__cause__  # its own cause names why (e.g. refused)
        raise CommandError(str(exc)) from None


_KUBECONFIG = click.option(
    "--kubeconfig", required=True, metavar="FILE", help="API access (kubeconfig file)."
)
_DEVICE = click.argument("device", metavar="DRIVER/POOL/DEVICE", callback=_device)
_KEY = click.option("--key", required=True, help="Taint key, e.g. example.com/maintenance.")


@click.command("taint")
@_KUBECONFIG
@_DEVICE
@_KEY
@click.option("--value", default="", help="Taint value (a label value).")
@click.option("--effect", required=True, type=click.Choice(EFFECTS), help="Taint effect.")
@click.option("--dry-run", is_flag=True, help="Print the DeviceTaintRule; write nothing.")
def taint_command(
    kubeconfig: str, device: DeviceRef, key: str, value: str, effect: str, dry_run: bool
) -> None:
    """Taint one device: create or update the operator's DeviceTaintRule for it and KEY."""
    try:
        validate_taint(key, value, effect)
    except RuleError as exc:
        raise click.UsageError(str(exc)) from exc
    body = rule_body(device, key=key, value=value, effect=effect, by="operator")
    name = body["metadata"]["name"]
    if dry_run:
        click.echo(yaml.safe_dump(body, sort_keys=False), nl=False)
        return

    async def run() -> str:
        client = _client(kubeconfig)
        try:
            served = await _discover(client)
            _, outcome = await apply_taint(
                client, device, key=key, value=value, effect=effect, served=served
            )
        except RuleAPIUnavailable as exc:
            raise CommandError(str(exc)) from None
        finally:
            await client.close()
        return f"devicetaintrule/{name} {outcome}"

    with api_failures(kubeconfig, f"devicetaintrule/{name}"):
        click.echo(asyncio.run(run()))


@click.command("untaint")
@_KUBECONFIG
@_DEVICE
@click.option("--key", default=None, help="Taint key, e.g. drahealth.io/unhealthy.")
@click.option(
    "--effect", type=click.Choice(EFFECTS), default=None, help="Only rules with this effect."
)
@click.option(
    "--hold",
    "hold",
    default=None,
    metavar="DURATION",
    help="Also keep the controller from tainting the device again for DURATION "
    "(e.g. 30m, 2h; 0 ends a hold).",
)
@click.option("--reason", default="", help="Why (with --hold or --release; shown in Events).")
@click.option(
    "--release", is_flag=True, help="Only end the device's hold: the policy applies again."
)
@click.option(
    "--namespace", default="default", show_default=True, help="The controller's namespace."
)
@click.option("--by", "by", default=None, help="Who holds (default: user@host).")
def untaint_command(
    kubeconfig: str,
    device: DeviceRef,
    key: str | None,
    effect: str | None,
    hold: str | None,
    reason: str,
    release: bool,
    namespace: str,
    by: str | None,
) -> None:
    """Remove the drahealth-made DeviceTaintRules of one device and KEY (optionally
    holding the controller off it), or end a hold with --release."""
    if release and (hold is not None or key is not None or effect is not None):
        raise click.UsageError("--release takes no --key, --effect or --hold")
    if not release and key is None:
        raise click.UsageError("Missing option '--key' (or use --release)")
    seconds: float | None = None
    if hold is not None:
        try:
            seconds = hold_seconds(hold)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
    if release:
        seconds = 0.0
    who = by or _who()
    if len(reason) > 1024:
        raise click.UsageError("--reason: at most 1024 characters")

    async def write_hold(client: AsyncClient, until: float, why: str) -> None:
        try:
            await send_request(client, namespace, "holds", _set_hold(device, until, who, why))
        except ControlError as exc:
            raise CommandError(str(exc)) from None

    async def run() -> list[str]:
        client = _client(kubeconfig)
        try:
            if release:
                await write_hold(client, time.time(), reason or "released")
                return []
            assert key is not None
            if seconds:  # the hold first: the controller never sees the deletion alone
                await write_hold(client, time.time() + seconds, reason or "operator untaint")
            served = await _discover(client)
            deleted = await remove_taints(client, device, key=key, effect=effect, served=served)
            if seconds == 0.0:  # after the deletion: it ends whatever hold it started
                await write_hold(client, time.time(), reason or "hold 0: re-taint at once")
            return deleted
        except RuleAPIUnavailable as exc:
            raise CommandError(str(exc)) from None
        finally:
            await client.close()

    with api_failures(kubeconfig, "deleting taint rules"):
        deleted = asyncio.run(run())
    for name in deleted:
        click.echo(f"devicetaintrule/{name} deleted")
    if not deleted and seconds:
        click.echo(
            f"no drahealth DeviceTaintRule of {device} with key {key} left to delete "
            "(the controller removes its own rules of a held device itself)"
        )
    if release or seconds == 0.0:
        click.echo(f"{device}: hold ended by {who}: the controller's policy applies again")
    elif seconds:
        until = format_time(time.time() + seconds)
        click.echo(f"{device}: held by {who} until about {until}: the controller does not taint it")
    if not deleted and seconds is None:
        raise CommandError(
            f"no drahealth DeviceTaintRule taints {device} with key {key}"
            + (f" and effect {effect}" if effect else "")
        )
