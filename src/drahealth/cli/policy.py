"""``drahealth policy check``: validate a remediation policy file, and ask what it does.

``drahealth policy check FILE`` loads the file with the controller's own loader, so the
errors are exactly the controller's (one line naming the file, the field and what is
wrong; exit 1); a valid file's summary names its limits, profiles and burn-in gate.
With ``--device DRIVER/POOL/DEVICE`` (and ``--health``, ``--message``,
``--attribute NAME=VALUE``) it prints which rule matches and what the controller would
do: the taint, its grace period and escalation, recovery, the fallback mode where no
DeviceTaintRule API is served, whether pods would be evicted, or that an ``ignore`` or
``degraded`` rule takes the device. ``-o json`` for
scripts. The decision is the core's (:func:`drahealth.core.explain`), the one the
controller's engine makes.
"""

from __future__ import annotations

import json
from typing import Any

import click

from drahealth._text import printable
from drahealth.core import DeviceFacts, Health, Limits, Policy, PolicyError, explain

__all__ = ["policy_group"]


def _device(text: str) -> tuple[str, str, str]:
    parts = text.split("/")
    if len(parts) < 3 or not all(parts):
        raise click.BadParameter(f"{text!r} is not DRIVER/POOL/DEVICE", param_hint="--device")
    return parts[0], "/".join(parts[1:-1]), parts[-1]


def _attribute(text: str) -> tuple[str, Any]:
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise click.BadParameter(f"{text!r} is not NAME=VALUE", param_hint="--attribute")
    value: Any = raw
    if raw in ("true", "false"):
        value = raw == "true"
    else:
        try:
            value = int(raw)
        except ValueError:
            value = raw
    return name, value


def _human(result: dict[str, Any]) -> list[str]:
    head = f"{result['device']} {result['health']}" + (
        f' "{result["message"]}"' if result["message"] else ""
    )
    if result.get("excluded"):
        return [f"{head}: excluded ({result['excluded']}): no automatic action at all"]
    if result["rule"] is None:
        return [f"{head}: no rule matches; the controller does nothing"]
    if result.get("outcome") == "ignore":
        return [f"{head}: ignored by rule {result['rule']}: no taint, no Event, no history"]
    if result.get("outcome") == "degraded":
        return [
            f"{head}: degraded by rule {result['rule']}: shown as degraded (state, an Event "
            "on its node, history); no taint, nothing evicted"
        ]
    taint = result["taint"]
    lines = [
        f"{head}: rule {result['rule']}",
        f"  taint        {taint['key']}={taint['value']}:{taint['effect']}"
        + (" (dry run: effect None)" if result["dryRun"] else ""),
        f"  after        {result['gracePeriodSeconds']:g} s of bad health",
    ]
    for step in result["escalate"]:
        lines.append(f"  escalates to {step['effect']} after {step['afterSeconds']:g} s")
    recovery = result["recovery"]
    lines.append(
        f"  untaint      after {recovery['healthyForSeconds']:g} s Healthy"
        + (" and a passing validation" if recovery["validate"] else "")
    )
    repair = result.get("repair")
    if repair:
        lines.append(
            f"  repair       {repair['kind']} once drained, {repair['attempts']} attempt(s), "
            f"backoff {repair['backoffSeconds']:g} s doubling, {repair['timeoutSeconds']:g} s each"
        )
    needs = result.get("needsHuman")
    if needs and (needs["episodes"] or (repair and needs["failedRepairs"])):
        limits = [f"{needs['episodes']} episodes"] if needs["episodes"] else []
        if repair and needs["failedRepairs"]:
            limits.append(f"{needs['failedRepairs']} failed repairs")
        lines.append(
            f"  needs human  after {' or '.join(limits)} within {needs['windowSeconds']:g} s"
        )
    if result["hysteresis"] is not None:
        h = result["hysteresis"]
        lines.append(
            f"  hysteresis   {h['transitions']} changes within {h['windowSeconds']:g} s hold it"
        )
    lines.append(
        f"  mode         {result['remediationMode']}; without a DeviceTaintRule API: "
        f"{result['fallback']}"
    )
    lines.append(
        "  pods         "
        + (
            f"using the device are evicted (eviction mode {result['evictionMode']})"
            if result["evicts"]
            else "are not evicted"
        )
    )
    rollup, node_taint = result.get("nodeRollup") or {}, None
    if rollup.get("enabled"):
        node_taint = rollup["taintNode"]
        lines.append(
            f"  node         {rollup['conditionType']}={rollup['conditionStatus']}"
            + (f"; {node_taint['key']}:{node_taint['effect']} once {node_taint['threshold']} "
               f"of its devices are tainted" if node_taint else "")
        )  # fmt: skip
    lines += _breaker_lines(result)
    return lines


def _breaker_lines(result: dict[str, Any]) -> list[str]:
    """The profile that owns the device and the circuit breaker's limits on it."""
    lines = []
    profile = result.get("profile")
    if profile:
        lines.append(
            f"  profile      {profile['name']}"
            + (" (observe-only: reported, nothing written)" if profile["observeOnly"] else "")
        )
    for lim in result.get("limits") or []:
        where = "cluster" if lim["scope"] == "cluster" else f"{lim['scope']} {lim['group']}"
        if lim["profile"] and lim["scope"] != "profile":
            where += f" (profile {lim['profile']})"
        lines.append(
            f"  limit        {where}: {lim['limit']} new taints within "
            f"{lim['windowSeconds']:g} s, then held (resume {lim['resume']})"
        )
    return lines


def _limits(limits: Limits) -> str:
    caps = ", ".join(f"{scope} {limit.text}" for scope, limit in limits.by_scope())
    return f"{caps or 'none'} new taints within {limits.window:g} s (resume {limits.resume})"


def _summary(policy: Policy) -> list[str]:
    """The policy-wide guard rails: its limits and each profile."""
    lines = [] if policy.limits is None else [f"  limits       {_limits(policy.limits)}"]
    for p in policy.profiles:
        parts = [
            "the policy's rules" if p.rules is None else f"{len(p.rules)} rule(s) of its own",
            *([] if p.limits is None else [f"limits {_limits(p.limits)}"]),
            *(["observe-only"] if p.observe_only else []),
        ]
        lines.append(f"  profile      {p.name}: {'; '.join(parts)}")
    return lines


@click.group("policy")
def policy_group() -> None:
    """Work with remediation policy files."""


@policy_group.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--device", help="DRIVER/POOL/DEVICE: show what the policy does with it.")
@click.option(
    "--health",
    type=click.Choice([h.value for h in Health]),
    default=Health.UNHEALTHY.value,
    show_default=True,
    help="The device's health (with --device).",
)
@click.option("--message", default="", help="The health message (with --device).")
@click.option(
    "--attribute",
    "attributes",
    multiple=True,
    help="A device attribute NAME=VALUE as its ResourceSlice has it (repeatable; "
    "true/false are booleans, whole numbers are integers).",
)
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text")
def check_command(
    file: str,
    device: str | None,
    health: str,
    message: str,
    attributes: tuple[str, ...],
    output: str,
) -> None:
    """Validate FILE as the controller loads it; with --device, explain what it does."""
    from drahealth.remedy import load_policy

    try:
        policy = load_policy(file)
    except PolicyError as exc:
        if output == "json":
            click.echo(json.dumps({"valid": False, "error": str(exc)}))
        click.echo(f"error: {printable(str(exc))}", err=True)
        raise SystemExit(1) from None
    if device is None:
        if output == "json":
            click.echo(json.dumps({"valid": True, "rules": [r.name for r in policy.rules]}))
        else:
            click.echo(f"{file}: valid, {len(policy.rules)} rule(s)")
            for line in _summary(policy):
                click.echo(printable(line))
            if policy.burn_in is not None:
                b = policy.burn_in
                click.echo(
                    f"  burn-in      {', '.join(sorted(b.applies_to))} devices: "
                    f"drahealth.io/burn-in:{'None' if policy.dry_run else b.effect} "
                    f"until the validation passes (retry {b.retry_initial:g} s .. "
                    f"{b.retry_max:g} s)"
                )
        return
    driver, pool, name = _device(device)
    facts = DeviceFacts(driver, pool, name, attributes=dict(map(_attribute, attributes)))
    result = explain(policy, facts, Health(health), message)
    if output == "json":
        click.echo(json.dumps({"valid": True, **result}))
        return
    for line in _human(result):
        click.echo(printable(line))
