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

``taint`` refuses a device that no ResourceSlice publishes (a typo would otherwise make
a rule that taints nothing), unless ``--force``. ``untaint`` of a rule the remediation
controller made says what the controller does next (it holds the device for the
policy's ``ownership.manualUntaintHold``, or for ``--hold``).

Where the server serves no DeviceTaintRule API but ``resource.k8s.io/v1``
ResourceClaims (Kubernetes 1.34-1.36 with their default gates), ``taint`` fences the
device with the operator's quarantine claim in the controller's namespace instead: a
claim allocated to exactly that device, so the scheduler counts it as in use (like
``NoSchedule``); while another claim holds the device it stays ``pending`` and the line
names the holders. ``NoExecute`` (and ``None``) are refused there: this release has no
device taint eviction. ``untaint`` deallocates, then deletes, the operator's and the
controller's quarantine claims of the device and key; ``--hold`` works as everywhere.

The cluster is found as kubectl finds it (``--kubeconfig``, ``$KUBECONFIG``,
``--context``; :mod:`drahealth.cli._access`). DeviceTaintRules are cluster-scoped;
``-n`` names the controller's namespace (for holds, and for quarantine claims), found
from the controller's ConfigMaps when not given.

Exit codes: 0 done, 1 API error, API unreachable, neither a DeviceTaintRule API nor v1
ResourceClaims served (the line names what the server serves and what to do instead),
an effect a quarantine claim cannot carry, a foreign claim with the quarantine claim's
name, a device no slice publishes (without ``--force``) or nothing to untaint without
``--hold`` (one ``error:`` line on stderr naming what failed and what to check), 2 usage
error. Rules are read and written
at the version the server serves (asked once per command).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import click
import yaml
from lightkube import AsyncClient

from drahealth._api_failures import CommandError
from drahealth.cli._access import (
    DISCOVERY_HINT,
    Access,
    api_options,
    controller_namespace,
    operator_identity,
)
from drahealth.core import format_time, parse_time
from drahealth.kube import DiscoveryError, ServedAPIs, discover
from drahealth.remedy import (
    EFFECTS,
    ControlError,
    DeviceRef,
    RuleAPIUnavailable,
    RuleError,
    UnpublishedDevice,
    apply_taint,
    check_device,
    created_by,
    names_device,
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


def _note(message: str) -> None:
    click.echo(f"note: {message}", err=True)


def _device(_ctx: click.Context, _param: click.Parameter, value: str) -> DeviceRef:
    try:
        return parse_device(value)
    except RuleError as exc:
        raise click.BadParameter(str(exc)) from exc


async def _controller_rules(
    client: AsyncClient, served: ServedAPIs, device: DeviceRef, key: str, effect: str | None
) -> list[str]:
    """Names of the remediation controller's rules that ``untaint`` would delete."""
    cls = served.resource("DeviceTaintRule")
    if cls is None:
        return []
    names = []
    async for rule in client.list(cls):
        taint = rule.spec.taint if rule.spec else None
        if taint is None or taint.key != key or (effect is not None and taint.effect != effect):
            continue
        if names_device(rule, device) and created_by(rule) == "controller":
            names.append(str(rule.metadata.name))
    return names


async def _discover(client: AsyncClient) -> ServedAPIs:
    """What the server serves, asked once per command; transport failures as themselves."""
    try:
        return await discover(client)
    except DiscoveryError as exc:
        cause = exc.__cause__
        if isinstance(cause, Exception) and not isinstance(cause, DiscoveryError):
            raise cause from cause.__cause__  # its own cause names why (e.g. refused)
        raise CommandError(f"{exc} ({DISCOVERY_HINT})") from None


def _quarantines(served: ServedAPIs) -> bool:
    """Whether taints are quarantine claims here: no rule API, v1 ResourceClaims."""
    return served.resource("DeviceTaintRule") is None and served.chosen("ResourceClaim") == "v1"


def _find_namespace(access: Access) -> str:
    """The remediation controller's namespace: ``-n``, else found from its ConfigMaps."""
    sync = access.sync_client()
    try:
        return controller_namespace(sync, access.namespace, access, _note, flag="-n")
    finally:
        sync.close()


_DEVICE = click.argument("device", metavar="DRIVER/POOL/DEVICE", callback=_device)
_KEY = click.option("--key", required=True, help="Taint key, e.g. example.com/maintenance.")


@click.command("taint")
@api_options(
    namespaced="The remediation controller's namespace, for the quarantine claim where no "
    "DeviceTaintRule API is served [default: found from its ConfigMaps, else the context's]."
)
@_DEVICE
@_KEY
@click.option("--value", default="", help="Taint value (a label value).")
@click.option("--effect", required=True, type=click.Choice(EFFECTS), help="Taint effect.")
@click.option("--dry-run", is_flag=True, help="Print the DeviceTaintRule; write nothing.")
@click.option("--force", is_flag=True, help="Taint a device even if no ResourceSlice publishes it.")
def taint_command(
    access: Access,
    device: DeviceRef,
    key: str,
    value: str,
    effect: str,
    dry_run: bool,
    force: bool,
) -> None:
    """Taint one device: create or update the operator's DeviceTaintRule for it and KEY.

    DeviceTaintRules are cluster-scoped. Where no DeviceTaintRule API is served
    (1.34-1.36 by default) the device is fenced by a quarantine claim in the
    controller's namespace (-n) instead: NoSchedule only. A device that no ResourceSlice
    publishes is refused unless --force.
    """
    try:
        check_device(device)
        validate_taint(key, value, effect)
    except RuleError as exc:
        raise click.UsageError(str(exc)) from exc
    body = rule_body(device, key=key, value=value, effect=effect, by="operator")
    name = body["metadata"]["name"]
    if dry_run:
        click.echo(yaml.safe_dump(body, sort_keys=False), nl=False)
        return

    async def run() -> str:
        client = access.async_client("drahealth-taint")
        try:
            served = await _discover(client)
            if served.resource("DeviceTaintRule") is not None:
                result = await apply_taint(
                    client, device, key=key, value=value, effect=effect, served=served,
                    force=force,
                )  # fmt: skip
                return f"devicetaintrule/{name} {result.outcome}"
            if not _quarantines(served):
                raise RuleAPIUnavailable(served)
            namespace = await asyncio.to_thread(_find_namespace, access)
            with access.failures(f"quarantine claim of {device} in namespace {namespace}"):
                result = await apply_taint(
                    client, device, key=key, value=value, effect=effect, served=served,
                    force=force, namespace=namespace,
                )  # fmt: skip
        except UnpublishedDevice as exc:
            raise CommandError(
                f"{exc} (check the name with 'drahealth status -o wide' or "
                "'kubectl get resourceslices'; --force taints it anyway)"
            ) from None
        except (RuleAPIUnavailable, RuleError) as exc:
            raise CommandError(str(exc)) from None
        finally:
            await client.close()
        release = served.server_version or "the server"
        _note(
            f"{release} serves no DeviceTaintRule API: the taint is a quarantine claim "
            f"allocated to {device} (the scheduler then counts it as in use, as NoSchedule "
            "would)"
        )
        where = f"resourceclaim/{result.name} {result.outcome} (namespace {result.namespace})"
        if result.outcome == "pending":
            return (
                f"{where}: takes effect when {', '.join(result.holders)} "
                f"let{'s' if len(result.holders) == 1 else ''} go of the device"
            )
        return f"{where}: {device} quarantined"

    with access.failures(f"devicetaintrule/{name}"):
        click.echo(asyncio.run(run()))


@click.command("untaint")
@api_options(
    namespaced="The remediation controller's namespace, for holds and quarantine claims "
    "[default: found from its ConfigMaps, else the context's]."
)
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
@click.option("--by", "by", default=None, help="Who holds (default: user@host).")
def untaint_command(
    access: Access,
    device: DeviceRef,
    key: str | None,
    effect: str | None,
    hold: str | None,
    reason: str,
    release: bool,
    by: str | None,
) -> None:
    """Remove the drahealth-made DeviceTaintRules of one device and KEY (optionally
    holding the controller off it), or end a hold with --release.

    DeviceTaintRules are cluster-scoped; -n names the controller's namespace. Deleting a
    rule the controller made is an untaint the controller respects: it does not taint
    the device again for the policy's ownership.manualUntaintHold (or --hold). Where no
    DeviceTaintRule API is served (1.34-1.36 by default), the operator's and the
    controller's quarantine claims of the device are deallocated, then deleted; the
    controller fences a still-bad device again unless --hold.
    """
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
    who = by or operator_identity()
    if len(reason) > 1024:
        raise click.UsageError("--reason: at most 1024 characters")

    async def write_hold(client: AsyncClient, until: float, why: str) -> None:
        try:
            await send_request(client, namespace, "holds", _set_hold(device, until, who, why))
        except ControlError as exc:
            raise CommandError(str(exc)) from None

    ours: list[str] = []
    namespace = ""
    claims = False  # quarantine claims, not rules (no DeviceTaintRule API served)

    async def run() -> list[str]:
        nonlocal namespace, claims
        namespace = await asyncio.to_thread(_find_namespace, access)
        client = access.async_client("drahealth-taint")
        try:
            if release:
                await write_hold(client, time.time(), reason or "released")
                return []
            assert key is not None
            if seconds:  # the hold first: the controller never sees the deletion alone
                await write_hold(client, time.time() + seconds, reason or "operator untaint")
            served = await _discover(client)
            claims = _quarantines(served)
            ours.extend(await _controller_rules(client, served, device, key, effect))
            removed = await remove_taints(
                client, device, key=key, effect=effect, served=served, namespace=namespace
            )
            ours.extend(removed.controller if claims else ())
            deleted = list(removed)
            if seconds == 0.0:  # after the deletion: it ends whatever hold it started
                await write_hold(client, time.time(), reason or "hold 0: re-taint at once")
            return deleted
        except RuleAPIUnavailable as exc:
            raise CommandError(str(exc)) from None
        finally:
            await client.close()

    with access.failures("deleting taint rules"):
        deleted = asyncio.run(run())
    for name in deleted:
        if claims:
            click.echo(f"resourceclaim/{name} deleted (namespace {namespace})")
        else:
            click.echo(f"devicetaintrule/{name} deleted")
    made = [n for n in deleted if n in ours]
    if made and claims and seconds is None:
        click.echo(
            f"note: the remediation controller made {', '.join(made)}: it fences {device} "
            "again at once while the device is still bad (--hold DURATION keeps it off)",
            err=True,
        )
    elif made and seconds is None:
        click.echo(
            f"note: the remediation controller made {', '.join(made)}: it takes the deletion "
            f"as an operator's untaint and does not taint {device} again for the policy's "
            "ownership.manualUntaintHold (default 30m); after that a device still bad is "
            "tainted again (--hold DURATION chooses how long, --hold 0 re-taints at once)",
            err=True,
        )
    elif made and seconds == 0.0:
        click.echo(
            f"note: the remediation controller made {', '.join(made)}: with --hold 0 it "
            f"taints {device} again at once if the device is still bad",
            err=True,
        )
    if not deleted and seconds and claims:
        click.echo(
            f"no drahealth quarantine claim of {device} with key {key} left to delete in "
            f"namespace {namespace} (the controller releases its own claim of a held device "
            "itself)"
        )
    elif not deleted and seconds:
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
        what = (
            f"no drahealth quarantine claim in namespace {namespace} fences"
            if claims
            else "no drahealth DeviceTaintRule taints"
        )
        raise CommandError(
            f"{what} {device} with key {key}" + (f" and effect {effect}" if effect else "")
        )
