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

Where a cluster is configured (``--kubeconfig``/``--context``, ``$KUBECONFIG``, the pod's
service account, ``~/.kube/config``, as every command finds it) it also asks that server:
what it serves (:func:`drahealth.kube.discover_sync`), the mode the controller would run
in there (:func:`drahealth.remedy.mode_on`), what each rule would write there (the
controller's own ``device_mode`` and ``mode_writes`` decide) and, from the ResourceSlices
published, which rules name a driver or pool nothing publishes. Without a configuration
the check stays offline and says so in one line; a configuration found by default that
cannot be used is skipped the same way, one named with a flag or ``$KUBECONFIG`` is an
error (exit 1; 2 for a malformed kubeconfig).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from dataclasses import dataclass
from typing import Any

import click

from drahealth._api_failures import CommandError
from drahealth._text import printable
from drahealth.cli._access import CONTEXT_OPTION, DISCOVERY_HINT, KUBECONFIG_OPTION, Access
from drahealth.core import (
    DeviceFacts,
    Health,
    Limits,
    Policy,
    PolicyError,
    Rule,
    Want,
    explain,
)

__all__ = ["policy_group"]

#: ResourceSlices asked for per list request, and read at most in all, for the match check.
SLICE_CHUNK = 500
MAX_SLICES = 5000
#: A name from the cluster or the policy is cut to this many characters in a message.
NAME_CUT = 63
#: Published names longer than this are no valid driver or pool name: never "closest".
CANDIDATE_MAX_LEN = 253
#: Most published names compared for the closest one, rule lines and warnings printed.
MAX_CANDIDATES = 2000
MAX_RULE_LINES = 60
MAX_WARNINGS = 20


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


def _cut(value: object, limit: int = NAME_CUT) -> str:
    """``value`` printable and at most ``limit`` characters (cut ones end in ``...``)."""
    text = printable(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the cluster part ---------------------------------------------------------------------


@dataclass
class _Published:
    """The (driver, pool) pairs the ResourceSlices read publish."""

    pairs: set[tuple[str, str]]
    read: int
    complete: bool
    #: why none could be read ("" when they could)
    unreadable: str = ""


#: mode -> (what it writes, in a word for scripts; in words) for one bad device
_WRITES = {
    "quarantine": (
        "quarantineClaim",
        "a quarantine ResourceClaim (resource.k8s.io/v1) per bad device, allocated to it",
    ),
    "node-taint": (
        "nodeTaint",
        "a NoSchedule taint on the device's node: fences every device of the node",
    ),
    "cordon": ("cordon", "cordons the device's node: fences every device of the node"),
    "evict-only": ("evictions", "no fence: only the pods using the device are evicted"),
}


def _discover(client: Any) -> Any:
    """What the server serves; a transport failure as itself (the caller names the server)."""
    from drahealth.kube import DiscoveryError, discover_sync

    try:
        return discover_sync(client)
    except DiscoveryError as exc:
        cause = exc.__cause__
        if isinstance(cause, Exception) and not isinstance(cause, DiscoveryError):
            raise cause from cause.__cause__  # its own cause names why (e.g. refused)
        raise CommandError(f"{exc} ({DISCOVERY_HINT})") from None


def _published(client: Any, served: Any) -> _Published:
    """The ResourceSlices' drivers and pools, at the served version, in pages of
    ``SLICE_CHUNK``, at most ``MAX_SLICES`` of them."""
    from lightkube import ApiError

    resource = served.resource("ResourceSlice")
    if resource is None:
        return _Published(set(), 0, False, "the server serves no ResourceSlices")
    pairs: set[tuple[str, str]] = set()
    read = 0
    keep = CANDIDATE_MAX_LEN + 1  # longer is no valid name: kept only as "too long"
    try:
        for obj in client.list(resource, chunk_size=SLICE_CHUNK):
            if read >= MAX_SLICES:
                return _Published(pairs, read, False)
            read += 1
            spec = getattr(obj, "spec", None)
            driver = getattr(spec, "driver", None) or ""
            pool = getattr(getattr(spec, "pool", None), "name", None) or ""
            pairs.add((str(driver)[:keep], str(pool)[:keep]))
    except ApiError as exc:
        code = exc.status.code
        if code not in (401, 403, 404):
            raise
        why = f"ResourceSlices not readable (HTTP {code}: {_cut(exc.status.message, 200)})"
        return _Published(pairs, read, False, why)
    return _Published(pairs, read, True)


def _mode(policy: Policy, served: Any) -> tuple[Any, str | None]:
    """The controller's mode on ``served`` for this policy, and why the requested one
    cannot run there (None: it can); the controller then runs report-only."""
    from drahealth.remedy import mode_on

    return mode_on(policy.remediation_mode, policy, served)


def _ladder(policy: Policy, rule: Rule) -> list[tuple[float, str]]:
    """(seconds, effect): the rule's effect once tainted, then each escalation that
    raises it (seconds since the taint); dry run wants effect None throughout."""
    action = rule.action
    if policy.dry_run:
        return [(0.0, "None")]
    out: list[tuple[float, str]] = [(0.0, action.effect)]
    for step in action.escalate:
        effect = action.effect_at(step.after)
        if effect != out[-1][1]:
            out.append((step.after, effect))
    return out


def _step(
    choice: Any, policy: Policy, rule: Rule, after: float, effect: str, observe: str | None
) -> dict[str, Any]:
    """What the controller writes for one bad device of ``rule`` wanting ``effect``."""
    from drahealth.remedy import device_mode, mode_writes

    want = Want(effect, rule.action.taint_key, rule.action.taint_value, rule.name, "")
    if observe is not None:  # the controller's device_mode, given the device's profile
        mode, why = "report-only", f"profile {_cut(observe)} is observe-only"
    else:
        mode = device_mode(choice, policy, want)
        why = choice.why
        if choice.fallback_path and rule.action.fallback and mode == rule.action.fallback:
            why = "the rule's own action.fallback, as no DeviceTaintRule API is served"
        elif choice.mode == "taint-rules" and mode == "report-only":
            why = f"{choice.rules_api} has no taint effect None (1.35 on)"
    writes = mode == "taint-rules" or mode_writes(mode, want)
    evicts = writes and effect == "NoExecute"
    if mode == "taint-rules":
        kind, words = "deviceTaintRule", f"a DeviceTaintRule ({choice.rules_api}) per bad device"
    elif not writes:
        kind = "nothing"
        words = "nothing written, only reported" + (
            ""
            if mode == "report-only"
            else f" ({mode} acts on effect "
            + ("NoExecute only)" if mode == "evict-only" else "NoSchedule or NoExecute)")
        )
    else:
        kind, words = _WRITES[mode]
    by = None
    if evicts:
        cluster = mode == "taint-rules" and policy.eviction.mode == "delete"
        by = "cluster" if cluster else "controller"
        words += (
            "; the cluster's device-taint eviction deletes its pods"
            if cluster
            else "; the controller evicts its pods"
        )
    return {
        "effect": effect,
        "afterSeconds": after,
        "mode": mode,
        "why": why,
        "writes": kind,
        "apiVersion": choice.rules_api
        if mode == "taint-rules"
        else ("resource.k8s.io/v1" if kind == "quarantineClaim" else None),
        "fencesNode": mode in ("node-taint", "cordon") and writes,
        "evictedBy": by,
        "text": words,
    }


def _rule_plans(policy: Policy, choice: Any) -> list[dict[str, Any]]:
    """Per rule (the policy's, then each profile's own) what it writes on this server."""
    owner = {r.name: p for p in policy.profiles for r in p.rules or ()}
    plans = []
    for rule in policy.all_rules():
        profile = owner.get(rule.name)
        plan: dict[str, Any] = {
            "rule": rule.name,
            "outcome": rule.action.outcome,
            "fallback": rule.action.fallback,
            "profile": None if profile is None else profile.name,
            "steps": [],
        }
        if rule.action.outcome == "taint":
            observe = profile.name if profile is not None and profile.observe_only else None
            plan["steps"] = [
                _step(choice, policy, rule, a, e, observe) for a, e in _ladder(policy, rule)
            ]
        plans.append(plan)
    return plans


def _closest(value: str, names: set[str]) -> str | None:
    """The published name most like ``value`` (difflib), if one is close."""
    candidates = sorted(n for n in names if n and len(n) <= CANDIDATE_MAX_LEN)[:MAX_CANDIDATES]
    found = difflib.get_close_matches(value[:CANDIDATE_MAX_LEN], candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def _match_warnings(policy: Policy, published: _Published) -> list[dict[str, Any]]:
    """Rules whose match driver or pool no ResourceSlice read publishes: they never match
    (the rule's own matcher decides, on its driver and pool alone)."""
    pairs = published.pairs
    if not pairs:
        return []
    out = []
    for rule in policy.all_rules():
        m = rule.match
        if m.driver is None and m.pool is None:
            continue
        probe = dataclasses.replace(m, device=None, attributes={})
        if any(probe.device_matches(DeviceFacts(d, p, "")) for d, p in pairs):
            continue
        by_driver = dataclasses.replace(probe, pool=None)
        of_driver = {p for d, p in pairs if by_driver.device_matches(DeviceFacts(d, p, ""))}
        if m.driver is not None and not of_driver:
            field, value = "driver", m.driver
            closest = _closest(value, {d for d, _ in pairs})
            where = f'no ResourceSlice publishes driver "{_cut(value)}"'
        else:
            field, value = "pool", str(m.pool)
            closest = _closest(value, of_driver)
            of = "" if m.driver is None else f' of driver "{_cut(m.driver)}"'
            where = f'no ResourceSlice{of} publishes pool "{_cut(value)}"'
        if published.complete:
            message = f"rule {_cut(rule.name)} never matches on this cluster: {where}"
        else:  # a later page may publish it
            message = (
                f"rule {_cut(rule.name)} may never match on this cluster: among the first "
                f"{published.read} ResourceSlices read, {where}"
            )
        if closest is not None:
            message += f' (closest published: "{_cut(closest)}")'
        out.append(
            {"rule": rule.name, "field": field, "value": value, "closest": closest,
             "message": message}
        )  # fmt: skip
    return out


def _ask(policy: Policy, access: Access) -> dict[str, Any]:
    """The cluster part: what the server behind ``access`` serves and what the
    controller would do there with ``policy``."""
    config = access.config()
    client = access.sync_client()
    try:
        with access.failures():
            served = _discover(client)
            published = _published(client, served)
    finally:
        client.close()
    choice, refused = _mode(policy, served)
    warnings = _match_warnings(policy, published)
    if refused is not None:
        warnings.insert(0, {
            "rule": None, "field": "remediation.mode", "value": policy.remediation_mode,
            "closest": None,
            "message": f"the controller cannot run mode {policy.remediation_mode} here: "
            f"{refused}; it runs report-only",
        })  # fmt: skip
    drivers = sorted({d for d, _ in published.pairs})
    return {
        "server": _cut(config.cluster.server, 200),
        "serverVersion": served.server_version,
        "served": served.summary(),
        "mode": {
            **choice.as_json(),
            "requested": policy.remediation_mode,
            "fallback": policy.remediation_fallback,
            "dryRun": policy.dry_run,
        },
        "rules": _rule_plans(policy, choice),
        "slices": {
            "read": published.read,
            "complete": published.complete,
            "drivers": [_cut(d, CANDIDATE_MAX_LEN) for d in drivers[:20]],
            "driverCount": len(drivers),
            "unreadable": published.unreadable or None,
        },
        "warnings": warnings,
    }


def _cluster(policy: Policy, kubeconfig: str | None, context: str | None) -> dict[str, Any]:
    """:func:`_ask`, or ``{"skipped": why}`` where no cluster was asked for and the
    default one cannot be used (none configured, broken, unreachable)."""
    access = Access(kubeconfig, context)
    explicit = bool(kubeconfig or context or os.environ.get("KUBECONFIG"))
    try:
        return _ask(policy, access)
    except click.ClickException as exc:
        if explicit:
            raise
        return {"skipped": _cut(exc.format_message(), 300)}


def _cluster_lines(cluster: dict[str, Any]) -> list[str]:
    """The cluster part as text, bounded (the rule lines and the names in them)."""
    mode = cluster["mode"]
    version = cluster["serverVersion"] or "(version not said)"
    lines = [
        f"cluster      Kubernetes {_cut(version)} at {cluster['server']}",
        f"  mode       {mode['mode']} ({_cut(mode['why'], 300)})",
    ]
    shown = 0
    plans = cluster["rules"]
    for plan in plans:
        if shown >= MAX_RULE_LINES:
            lines.append(f"  ... and more rules ({len(plans)} in all; -o json lists each)")
            break
        name = _cut(plan["rule"])
        if plan["outcome"] != "taint":
            lines.append(f"  rule {name}: {plan['outcome']}: nothing written")
            shown += 1
            continue
        for step in plan["steps"]:
            when = f" after {step['afterSeconds']:g} s" if step["afterSeconds"] else ""
            note = ""
            if step["mode"] != mode["mode"] or step["mode"] == "report-only":
                note = f" ({_cut(step['why'], 200)})"
            lines.append(
                f"  rule {name}: {step['effect']}{when} -> {step['mode']}: {step['text']}{note}"
            )
            shown += 1
    slices = cluster["slices"]
    if slices["unreadable"]:
        lines.append(f"  slices     {slices['unreadable']}: driver and pool names not checked")
    else:
        names = ", ".join(_cut(d) for d in slices["drivers"][:5])
        more = slices["driverCount"] - min(5, len(slices["drivers"]))
        lines.append(
            f"  slices     {slices['read']} ResourceSlice(s)"
            + ("" if slices["complete"] else " read (the first ones only)")
            + (f", drivers {names}" if names else ": none published, names not checked")
            + (f" and {more} more" if more > 0 else "")
        )
    return lines


def _say_cluster(cluster: dict[str, Any], output: str) -> None:
    """The skip note or the warnings on stderr; the cluster part itself in text."""
    if "skipped" in cluster:
        click.echo(f"note: cluster part skipped, checked offline: {cluster['skipped']}", err=True)
        return
    if output != "json":
        for line in _cluster_lines(cluster):
            click.echo(printable(line))
    warnings = cluster["warnings"]
    for w in warnings[:MAX_WARNINGS]:
        click.echo(f"warning: {printable(w['message'])}", err=True)
    if len(warnings) > MAX_WARNINGS:
        click.echo(f"warning: and {len(warnings) - MAX_WARNINGS} more", err=True)


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
@KUBECONFIG_OPTION
@CONTEXT_OPTION
@click.option(
    "--strict",
    is_flag=True,
    help="Exit 1 when the cluster part warns (a rule's driver or pool is published by no "
    "ResourceSlice, or the requested mode cannot run there).",
)
def check_command(
    file: str,
    device: str | None,
    health: str,
    message: str,
    attributes: tuple[str, ...],
    output: str,
    kubeconfig: str | None,
    context: str | None,
    strict: bool,
) -> None:
    """Validate FILE as the controller loads it; with --device, explain what it does.

    Where a cluster is configured (--kubeconfig, --context, $KUBECONFIG, ~/.kube/config)
    it also says what the controller would write there per rule, and warns about rules
    whose driver or pool no ResourceSlice publishes; without one it checks offline.
    """
    from drahealth.remedy import load_policy

    try:
        policy = load_policy(file)
    except PolicyError as exc:
        if output == "json":
            click.echo(json.dumps({"valid": False, "error": str(exc)}))
        click.echo(f"error: {printable(str(exc))}", err=True)
        raise SystemExit(1) from None
    cluster = _cluster(policy, kubeconfig, context)
    if device is None:
        if output == "json":
            rules = [r.name for r in policy.rules]
            click.echo(json.dumps({"valid": True, "rules": rules, "cluster": cluster}))
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
    else:
        driver, pool, name = _device(device)
        facts = DeviceFacts(driver, pool, name, attributes=dict(map(_attribute, attributes)))
        result = explain(policy, facts, Health(health), message)
        if output == "json":
            click.echo(json.dumps({"valid": True, **result, "cluster": cluster}))
        else:
            for line in _human(result):
                click.echo(printable(line))
    _say_cluster(cluster, output)
    if strict and cluster.get("warnings"):
        raise SystemExit(1)
