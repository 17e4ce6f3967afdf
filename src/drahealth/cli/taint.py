"""``drahealth taint`` / ``drahealth untaint``: the kubectl-taint UX for one DRA device.

Owns the two commands (the API work is :func:`drahealth.remedy.apply_taint` and
:func:`drahealth.remedy.remove_taints`). ``taint``
creates (or updates, or leaves unchanged) the operator's DeviceTaintRule for a device
and taint key; ``untaint`` deletes the rules drahealth created for that device and key
(the operator's and the controller's), never a rule someone else created. Exit codes:
0 done, 1 API error, API unreachable, no DeviceTaintRule API served (the line names what
the server serves and what to do instead) or nothing to untaint (one ``error:`` line on
stderr naming what failed and what to check), 2 usage error. Rules are read and written
at the version the server serves (asked once per command).
"""

from __future__ import annotations

import asyncio
import os

import click
import yaml
from lightkube import AsyncClient

from drahealth._api_failures import CommandError, api_failures, load_checked
from drahealth.kube import DiscoveryError, ServedAPIs, discover, make_client
from drahealth.remedy import (
    EFFECTS,
    DeviceRef,
    RuleAPIUnavailable,
    RuleError,
    apply_taint,
    parse_device,
    remove_taints,
    rule_body,
    validate_taint,
)

__all__ = ["taint_command", "untaint_command"]


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
@_KEY
@click.option(
    "--effect", type=click.Choice(EFFECTS), default=None, help="Only rules with this effect."
)
def untaint_command(kubeconfig: str, device: DeviceRef, key: str, effect: str | None) -> None:
    """Remove the drahealth-made DeviceTaintRules of one device and KEY."""

    async def run() -> list[str]:
        client = _client(kubeconfig)
        try:
            served = await _discover(client)
            return await remove_taints(client, device, key=key, effect=effect, served=served)
        except RuleAPIUnavailable as exc:
            raise CommandError(str(exc)) from None
        finally:
            await client.close()

    with api_failures(kubeconfig, "deleting taint rules"):
        deleted = asyncio.run(run())
    for name in deleted:
        click.echo(f"devicetaintrule/{name} deleted")
    if not deleted:
        raise CommandError(
            f"no drahealth DeviceTaintRule taints {device} with key {key}"
            + (f" and effect {effect}" if effect else "")
        )
