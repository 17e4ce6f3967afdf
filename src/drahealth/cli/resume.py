"""``drahealth resume``: release the taints the circuit breaker holds.

Owns the command. It prints what the controller reports as tripped and held (the
``breaker`` key of the ConfigMap ``drahealth-remediation-state``), then writes the
operator's request, the key ``resume`` (``{"at", "by"}``) of the ConfigMap
``drahealth-remediation-control`` in the controller's namespace. On its next pass the
controller writes every taint held at that moment and resumes every tripped group;
taints after that count against the limits as usual. ``--dry-run`` prints only.
Exit codes: 0 done, 1 API error or API unreachable (one ``error:`` line), 2 usage error.
"""

from __future__ import annotations

import asyncio
from typing import Any

import click

from drahealth._api_failures import CommandError
from drahealth._text import printable
from drahealth._time import now_rfc3339_micro
from drahealth.cli._access import Access, api_options, operator_identity, request_namespace

__all__ = ["resume_command", "resume_lines"]

#: Held devices printed (the rest are counted).
SHOWN = 20


def resume_lines(breaker: Any, shown: int = SHOWN) -> list[str]:
    """What the ``breaker`` state value says is tripped and held, in words."""
    if not isinstance(breaker, dict) or not (breaker.get("tripped") or breaker.get("held")):
        return ["the circuit breaker holds nothing (no group is tripped)"]
    lines = []
    for t in breaker.get("tripped") or []:
        if not isinstance(t, dict):
            continue
        scope, group = t.get("scope", "?"), t.get("group", "")
        where = "cluster" if scope == "cluster" else f"{scope} {group}"
        if t.get("profile") and scope != "profile":
            where += f" (profile {t['profile']})"
        window = t.get("window")
        window = f"{window:g}" if isinstance(window, int | float) else window
        lines.append(
            f"tripped: {where}: limit {t.get('limit')} (max {t.get('max')} within "
            f"{window} s), {t.get('count')} counted, since {t.get('since')}, "
            f"resume {t.get('resume')}"
        )
    held = [h for h in breaker.get("held") or [] if isinstance(h, dict)]
    total = breaker.get("heldCount", len(held))
    total = total if isinstance(total, int) else len(held)
    lines.append(f"held: {total} new taint(s)")
    for h in held[:shown]:
        lines.append(
            f"  {h.get('device')}: {h.get('effect')} by rule {h.get('rule')} since "
            f"{h.get('since')}: {h.get('reason')}"
        )
    if total > min(shown, len(held)):
        lines.append(f"  ... and {total - min(shown, len(held))} more")
    return lines


@click.command("resume")
@api_options(
    namespaced="The remediation controller's namespace [default: found from its ConfigMaps, "
    "else the context's]."
)
@click.option("--by", "by", default=None, help="Who resumes (default: user@host).")
@click.option("--dry-run", is_flag=True, help="Print what is held; ask for nothing.")
def resume_command(access: Access, by: str | None, dry_run: bool) -> None:
    """Write the circuit breaker's held taints and resume every tripped group."""
    from lightkube import AsyncClient

    from drahealth.remedy import ControlError, read_state, send_request

    request = {"at": now_rfc3339_micro(), "by": by or operator_identity()}

    async def run() -> Any:
        client: AsyncClient = access.async_client("drahealth-resume")
        try:
            state = await read_state(client, namespace)
            if not dry_run:
                try:
                    await send_request(client, namespace, "resume", lambda _old: request)
                except ControlError as exc:
                    raise CommandError(str(exc)) from None
            return state.get("breaker")
        finally:
            await client.close()

    with access.failures():
        namespace = request_namespace(access)
    with access.failures(f"configmaps in {namespace}"):
        breaker = asyncio.run(run())
    for line in resume_lines(breaker):
        click.echo(printable(line))
    if dry_run:
        click.echo("dry run: nothing asked")
    else:
        click.echo(
            f"resume requested at {request['at']} by {request['by']}: the controller writes "
            "the held taints and resumes on its next pass"
        )
