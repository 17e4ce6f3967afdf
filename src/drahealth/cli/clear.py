"""``drahealth clear DRIVER/POOL/DEVICE``: an operator takes a device off "needs a human".

Owns the command. It prints what the controller reports about the device (the keys
``needsHuman`` and ``repairs`` of the ConfigMap ``drahealth-remediation-state``), then
writes the operator's request into the key ``clear`` (``{"DRIVER/POOL/DEVICE": {"at",
"by", "reason"}}``) of the ConfigMap ``drahealth-remediation-control`` in the
controller's namespace. On its next pass the controller drops the device's mark and the
episodes and failed repairs counted before that time; the device then recovers as usual
(``healthyFor`` from the clear, then ``validate``). Requests older than
:data:`KEEP_DAYS` days are dropped from the key when a new one is written, so it stays
small. ``--dry-run`` prints only. Exit codes: 0 done, 1 API error or API unreachable
(one ``error:`` line), 2 usage error.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any, Final

import click

from drahealth._api_failures import CommandError
from drahealth._text import printable
from drahealth._time import now_rfc3339_micro
from drahealth.cli._access import Access, api_options, operator_identity, request_namespace
from drahealth.core import DeviceKey

__all__ = ["clear_command", "clear_lines"]

#: Requests kept in the control key (days).
KEEP_DAYS: Final = 30
MAX_REASON: Final = 512


def _device(_ctx: click.Context, _param: click.Parameter, value: str) -> DeviceKey:
    try:
        return DeviceKey.parse(value)
    except ValueError as exc:
        raise click.BadParameter(
            f"{value!r} must be DRIVER/POOL/DEVICE, e.g. gpu.example.com/node-1/gpu-0"
        ) from exc


def clear_lines(device: DeviceKey, state: dict[str, Any]) -> list[str]:
    """What the controller's state says about ``device``, in words."""
    needs = state.get("needsHuman") if isinstance(state.get("needsHuman"), dict) else {}
    mark = needs.get(str(device)) if needs else None
    lines = []
    if isinstance(mark, dict):
        lines.append(
            f"{device} needs a human since {mark.get('since')}: {mark.get('why')} "
            f"(rule {mark.get('rule')}, node {mark.get('node')})"
        )
    else:
        lines.append(f"{device} is not marked needs-a-human; its counts start again")
    repairs = state.get("repairs") if isinstance(state.get("repairs"), dict) else {}
    repair = repairs.get(str(device)) if repairs else None
    if isinstance(repair, dict):
        lines.append(
            f"repair: {repair.get('kind')} {repair.get('phase')}, attempt "
            f"{repair.get('attempt')}: {repair.get('detail')}"
        )
    return lines


def _prune(current: Any, now: dt.datetime) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for name, req in (current if isinstance(current, dict) else {}).items():
        try:
            at = dt.datetime.fromisoformat(str(req["at"]).replace("Z", "+00:00"))
        except (KeyError, TypeError, ValueError):
            continue
        if now - at < dt.timedelta(days=KEEP_DAYS):
            kept[name] = req
    return kept


@click.command("clear")
@api_options(
    namespaced="The remediation controller's namespace [default: found from its ConfigMaps, "
    "else the context's]."
)
@click.argument("device", metavar="DRIVER/POOL/DEVICE", callback=_device)
@click.option("--reason", default="", help="Why (kept in the device's history).")
@click.option("--by", "by", default=None, help="Who clears (default: user@host).")
@click.option("--dry-run", is_flag=True, help="Print the device's state; ask for nothing.")
def clear_command(
    access: Access, device: DeviceKey, reason: str, by: str | None, dry_run: bool
) -> None:
    """Clear a device's needs-a-human mark: it then recovers as usual."""
    from lightkube import AsyncClient

    from drahealth.remedy import ControlError, read_state, send_request

    if len(reason) > MAX_REASON:
        raise click.BadParameter(f"at most {MAX_REASON} characters", param_hint="--reason")
    request = {"at": now_rfc3339_micro(), "by": by or operator_identity()}
    if reason:
        request["reason"] = reason

    def update(current: Any) -> dict[str, Any]:
        kept = _prune(current, dt.datetime.now(dt.UTC))
        kept[str(device)] = request
        return kept

    async def run() -> dict[str, Any]:
        client: AsyncClient = access.async_client("drahealth-clear")
        try:
            state = await read_state(client, namespace)
            if not dry_run:
                try:
                    await send_request(client, namespace, "clear", update)
                except ControlError as exc:
                    raise CommandError(str(exc)) from None
            return state
        finally:
            await client.close()

    with access.failures():
        namespace = request_namespace(access)
    with access.failures(f"configmaps in {namespace}"):
        state = asyncio.run(run())
    for line in clear_lines(device, state):
        click.echo(printable(line))
    if dry_run:
        click.echo("dry run: nothing asked")
    else:
        click.echo(
            f"clear of {device} requested at {request['at']} by {request['by']}: the "
            "controller applies it on its next pass"
        )
