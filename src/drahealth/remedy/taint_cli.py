"""``drahealth taint`` / ``drahealth untaint``: the kubectl-taint UX for one DRA device.

Owns the two commands. ``taint`` creates (or updates, or leaves unchanged) the
operator's DeviceTaintRule for a device and taint key; ``untaint`` deletes the rules
drahealth created for that device and key (the operator's and the controller's), never
a rule someone else created. Exit codes: 0 done, 1 API error or nothing to untaint,
2 usage error.
"""

from __future__ import annotations

import os
from typing import Any

import click
import yaml
from lightkube import ApiError, Client
from lightkube.resources.resource_v1 import DeviceTaintRule

from drahealth.kube import KubeConfigError, make_sync_client
from drahealth.remedy._rules import (
    EFFECTS,
    DeviceRef,
    RuleError,
    created_by,
    parse_device,
    rule_body,
    validate_taint,
)

__all__ = ["taint_command", "untaint_command"]


def _device(_ctx: click.Context, _param: click.Parameter, value: str) -> DeviceRef:
    try:
        return parse_device(value)
    except RuleError as exc:
        raise click.BadParameter(str(exc)) from exc


def _client(kubeconfig: str) -> Client:
    if not os.path.isfile(kubeconfig):
        raise click.BadParameter(f"{kubeconfig}: no such file", param_hint="--kubeconfig")
    try:
        return make_sync_client(kubeconfig, field_manager="drahealth-taint")
    except KubeConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--kubeconfig") from exc


def _selects(rule: Any, device: DeviceRef) -> bool:
    sel = rule.spec.deviceSelector if rule.spec else None
    return sel is not None and (sel.driver, sel.pool, sel.device) == (
        device.driver,
        device.pool,
        device.device,
    )


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
    client = _client(kubeconfig)
    try:
        try:
            current = client.get(DeviceTaintRule, name)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            client.create(DeviceTaintRule.from_dict(body))  # type: ignore[call-overload]
            click.echo(f"devicetaintrule/{name} created")
            return
        taint = current.spec.taint if current.spec else None
        if taint is not None and (taint.effect, taint.value or "") == (effect, value):
            click.echo(f"devicetaintrule/{name} unchanged")
            return
        updated = current.to_dict()
        updated["spec"]["taint"] = body["spec"]["taint"]
        client.replace(DeviceTaintRule.from_dict(updated))  # type: ignore[call-overload]
        click.echo(f"devicetaintrule/{name} updated")
    except ApiError as exc:
        raise click.ClickException(f"devicetaintrule/{name}: {exc.status.message}") from exc
    finally:
        client.close()


@click.command("untaint")
@_KUBECONFIG
@_DEVICE
@_KEY
@click.option(
    "--effect", type=click.Choice(EFFECTS), default=None, help="Only rules with this effect."
)
def untaint_command(kubeconfig: str, device: DeviceRef, key: str, effect: str | None) -> None:
    """Remove the drahealth-made DeviceTaintRules of one device and KEY."""
    client = _client(kubeconfig)
    deleted = 0
    try:
        for rule in client.list(DeviceTaintRule):
            taint = rule.spec.taint if rule.spec else None
            if (
                taint is None
                or taint.key != key
                or (effect is not None and taint.effect != effect)
                or not _selects(rule, device)
                or created_by(rule) is None
            ):
                continue
            assert rule.metadata is not None and rule.metadata.name
            client.delete(DeviceTaintRule, rule.metadata.name)
            click.echo(f"devicetaintrule/{rule.metadata.name} deleted")
            deleted += 1
    except ApiError as exc:
        raise click.ClickException(f"deleting taint rules: {exc.status.message}") from exc
    finally:
        client.close()
    if not deleted:
        raise click.ClickException(
            f"no drahealth DeviceTaintRule taints {device} with key {key}"
            + (f" and effect {effect}" if effect else "")
        )
