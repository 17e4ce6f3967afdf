"""``drahealth status``, ``pods``, ``history``: which pods sit on bad devices, and why.

Owns the three read-only views of the API. They find their cluster and namespace as
kubectl does (:mod:`drahealth.cli._access`: ``--kubeconfig``, ``$KUBECONFIG``,
``--context``, ``-n``, ``-A``) and print with the shared ``-o`` formats
(:mod:`drahealth.cli._output`: table, wide, json, yaml, name, jsonpath, custom-columns).
``status -w`` and ``pods -w`` watch the API and print again when what they show changes
(:func:`_watch`); Ctrl-C or SIGTERM ends them with exit code 0.

Exit codes: 0 ok; 1 the API could not be used (one ``error:`` line naming what failed
and what to check); 2 usage error; 3 (``status``, ``pods``; not with ``-w``) a pod uses a
bad device: Unhealthy or Unknown, or (``status``) under a NoExecute taint.

Where the controller fences without DeviceTaintRules, ``status`` lists every device its
node taint or cordon keeps new pods off, Healthy ones too (``FENCED`` column, JSON
``fencedBy``: the node and the bad devices it is for, or the quarantine claim that holds
the device; at most :data:`MAX_FENCED_ROWS` such Healthy rows, the rest counted), and
``pods`` lists the Pending pods those fences block (``Pending: blocked by node/<name>
taint <key>``, ``Pending: no free device (N quarantined)``; JSON ``blockedBy``; at most
:data:`~drahealth.remedy.MAX_BLOCKED_PODS`, the rest counted). See
:mod:`drahealth.remedy._view` for what counts as drahealth's fence.

Device health is read from the node agents' records in ``--agent-namespace`` only (see
:mod:`drahealth.core`). Text from the API is shown as plain text: escape sequences and
control characters removed. Where RBAC forbids cluster-wide reads of pods, ``-A`` falls
back to the kubeconfig's namespace and says so.

Each command asks the server once which ``resource.k8s.io`` versions it serves and reads
every DRA kind at the one chosen (see :mod:`drahealth.kube`). A kind the server does not
serve (DeviceTaintRule on a 1.35 cluster without ``DRADeviceTaintRules``) is one
``note:`` line saying so and what remediation does instead; the rest of the view works.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click
import httpx2
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod

from drahealth._api_failures import CommandError
from drahealth._served import NO_CONTROLLER, auto_mode, controller_mode, not_served_note
from drahealth._text import json_text, printable
from drahealth.cli._access import Access, api_options, controller_namespace
from drahealth.cli._output import OUTPUT, Output, emit, human_age
from drahealth.core import (
    DEFAULT_NAMESPACE,
    LABELS,
    Consumer,
    DeviceKey,
    agent_records,
    format_time,
    history_label,
    mentions_device,
    parse_time,
)
from drahealth.kube import DiscoveryError, ServedAPIs, discover_sync, to_internal

if TYPE_CHECKING:
    from drahealth.remedy import Fences

__all__ = ["history_command", "pods_command", "status_command"]

#: Exit code of ``status``/``pods`` when a pod uses a bad device.
EXIT_BAD_DEVICES_IN_USE = 3
#: Health values that make a device bad.
BAD_HEALTH = frozenset({"Unhealthy", "Unknown"})
#: Watch events within this many seconds are shown as one change.
COALESCE_SECONDS = 0.3
#: Longest wait before a broken watch is opened again.
MAX_RETRY_SECONDS = 10.0
#: Healthy devices ``status`` lists because a fence of drahealth covers them (the rest
#: are counted in a line after the table).
MAX_FENCED_ROWS = 100
#: Node fences ``status`` describes in a line each (the rest are counted).
MAX_FENCE_LINES = 10
#: Namespaces whose pods and claims ``history`` reads to check pod Events (see
#: :func:`drahealth.remedy.history_source`); Events in further namespaces are not shown.
MAX_HOLDER_NAMESPACES = 100


def _warn(message: str) -> None:
    click.echo(f"warning: {printable(message)}", err=True)


def _note(message: str) -> None:
    click.echo(f"note: {printable(message)}", err=True)


def _list(client: Client, kind: Any, namespace: str | None, **kw: Any) -> list[dict[str, Any]]:
    """Objects as dicts; cluster-wide, or in ``namespace``; 403 -> the client's namespace."""
    try:
        return [o.to_dict() for o in client.list(kind, namespace=namespace or "*", **kw)]
    except ApiError as exc:
        if exc.status.code != 403:
            raise
        if namespace is None and kind.__name__ in ("Pod", "ResourceClaim", "ConfigMap", "Event"):
            ns = client.namespace
            click.echo(f"note: no cluster-wide access to {kind.__name__}s; showing {ns}", err=True)
            return [o.to_dict() for o in client.list(kind, namespace=ns, **kw)]
        click.echo(f"note: no access to {kind.__name__}s ({exc.status.message})", err=True)
        return []


#: ``resource.k8s.io`` kinds that are not namespaced.
_CLUSTER_SCOPED = frozenset({"DeviceClass", "DeviceTaintRule", "ResourceSlice"})


def _list_nodes(client: Client) -> list[dict[str, Any]]:
    """Nodes, for the node taints and cordons of the controller's node-level modes; a
    reader without access to Nodes still gets the rest of the view."""
    try:
        return [o.to_dict() for o in client.list(Node)]
    except ApiError as exc:
        _warn(f"nodes not readable ({exc.status.message}): node-level taints not shown")
        return []


def _discover(client: Client) -> ServedAPIs:
    """What the server serves of ``resource.k8s.io`` (asked once per command).

    A transport failure is raised as itself (one ``error:`` line naming the server); an
    answer that is not discovery is a warning, and v1 is assumed for every kind.
    """
    try:
        return discover_sync(client)
    except DiscoveryError as exc:
        cause = exc.__cause__
        if isinstance(cause, Exception) and not isinstance(cause, DiscoveryError):
            raise cause from cause.__cause__  # its own cause names why (e.g. refused)
        _warn(f"{exc}; assuming resource.k8s.io/v1 for every kind")
        return ServedAPIs.all_v1()


def _list_dra(
    client: Client, served: ServedAPIs, kind: str, namespace: str | None, unserved: set[str]
) -> list[dict[str, Any]]:
    """``kind`` of ``resource.k8s.io`` at the version the server serves, as v1 dicts.

    A kind the server does not serve (by discovery, or a 404 on its path) is added to
    ``unserved`` and lists nothing, so the rest of the view still works.
    """
    resource = served.resource(kind)
    if resource is None:
        unserved.add(kind)
        return []
    try:
        if kind in _CLUSTER_SCOPED:
            objects = [o.to_dict() for o in client.list(resource)]
        else:
            objects = _list(client, resource, namespace)
    except ApiError as exc:
        if exc.status.code == 403:
            click.echo(f"note: no access to {kind}s ({exc.status.message})", err=True)
            return []
        if exc.status.code != 404:
            raise
        unserved.add(kind)
        return []
    except httpx2.HTTPStatusError as exc:  # an answer that is not a Kubernetes Status
        code = exc.response.status_code
        if code != 404:
            raise CommandError(f"listing {kind}s: HTTP {code} from the API server") from None
        unserved.add(kind)
        return []
    return [to_internal(o) for o in objects]


def _controller_mode(client: Client, controller_namespace: str) -> Any:
    """The controller's recorded remediation mode, or None (absent, or no access)."""
    from drahealth.remedy import HISTORY_CONFIGMAP

    try:
        cm = client.get(ConfigMap, HISTORY_CONFIGMAP, namespace=controller_namespace)
    except ApiError as exc:
        if exc.status.code not in (403, 404):
            raise
        return None
    return controller_mode(cm.to_dict())


def _notes(unserved: set[str], served: ServedAPIs, mode: str | None = None) -> None:
    """One ``note:`` line per kind the server does not serve."""
    for kind in sorted(unserved):
        click.echo(f"note: {printable(not_served_note(kind, served, mode))}", err=True)


def _header(served: ServedAPIs, recorded: Any, unserved: set[str]) -> list[str]:
    """The server, its DeviceTaintRule API, and the controller's remediation mode."""
    if "DeviceTaintRule" in unserved:  # said not served: whatever discovery assumed
        kept = {k: v for k, v in served.versions.items() if k != "DeviceTaintRule"}
        served = ServedAPIs(kept, served.server_version)
    rules = served.api_version("DeviceTaintRule") or "not served"
    server = served.server_version or "unknown version"
    if recorded is not None:
        mode = f"{recorded.describe()}, as the controller recorded"
    else:
        mode = f"{NO_CONTROLLER} (auto would choose {auto_mode(served)[0]})"
    return [
        f"server: Kubernetes {server}; DeviceTaintRule API: {rules}",
        f"remediation mode: {mode}",
    ]


_AGENT_NAMESPACE = click.option(
    "--agent-namespace",
    default=DEFAULT_NAMESPACE,
    show_default=True,
    help="Namespace of the node agents' device-health ConfigMaps (the agent's --namespace).",
)
_CONTROLLER_NAMESPACE = click.option(
    "--controller-namespace",
    "controller_ns",
    default=None,
    metavar="NS",
    help="Namespace of the remediation controller [default: found from its ConfigMaps].",
)
_WATCH = click.option(
    "-w", "--watch", is_flag=True, help="After the listing, print it again whenever it changes."
)
_NS_HELP = (
    "Pods of this namespace [default: the context's namespace, else default]; devices "
    "are cluster-scoped and always all listed."
)


def _bad(row: dict[str, Any]) -> bool:
    """A device row that is Unhealthy/Unknown or under a NoExecute taint."""
    return row["health"] in BAD_HEALTH or any(t.get("effect") == "NoExecute" for t in row["taints"])


@dataclass
class View:
    """One listing: its rows and the lines said around them (stderr with machine output)."""

    rows: list[dict[str, Any]]
    before: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    bad_in_use: bool = False
    #: ``note:`` lines, always on stderr
    notes: list[str] = field(default_factory=list)
    #: what ``-w`` watches for this listing: (kind, namespace; None: every namespace or
    #: cluster-scoped)
    sources: list[tuple[str, str | None]] = field(default_factory=list)


def _stamp(since: Any) -> str | None:
    """Unix seconds or an RFC 3339 text -> RFC 3339 (None stays None)."""
    if isinstance(since, int | float):
        return format_time(float(since))
    return since if isinstance(since, str) and since else None


def _age(since: Any, now: float) -> str:
    when = since if isinstance(since, int | float) else parse_time(since)
    return human_age(None if when is None else now - when)


def status_view(
    access: Access, agent_namespace: str, controller_ns: str | None, now: float
) -> View:
    """The ``status`` listing as of ``now``."""
    from drahealth.cli._inventory import device_rows
    from drahealth.cli._remediation import read_remediation_state, remediation_lines
    from drahealth.remedy import STATE_CONFIGMAP, device_facts, fenced_devices, read_fences

    client = access.sync_client()
    unserved: set[str] = set()
    notes: list[str] = []
    scope = access.scope
    try:
        with access.failures():
            served = _discover(client)
            ctl_ns = controller_namespace(client, controller_ns, access, notes.append)
            recorded = _controller_mode(client, ctl_ns)
            state = read_remediation_state(client, ctl_ns, notes.append)
            health = agent_records(
                _list(client, ConfigMap, agent_namespace, labels=LABELS), agent_namespace
            )
            claims = _list_dra(client, served, "ResourceClaim", scope, unserved)
            slices = _list_dra(client, served, "ResourceSlice", None, unserved)
            nodes = _list_nodes(client)
            fence_claims = (
                claims
                if scope is None or scope == ctl_ns
                else _quarantine_claims(client, served, ctl_ns, notes.append)
            )
            fences = read_fences(nodes, fence_claims, ctl_ns)
            on_node: dict[str, list[DeviceKey]] = {}
            if fences.nodes:
                for key, facts in device_facts(slices).items():
                    on_node.setdefault(facts.node, []).append(key)
            fenced = {str(k): f for k, f in fenced_devices(fences, on_node).items()}
            held = state.devices()
            rows = device_rows(
                health,
                _list(client, Pod, scope),
                claims,
                slices,
                _list_dra(client, served, "DeviceTaintRule", None, unserved),
                now,
                _warn,
                nodes,
                also=set(held) | fenced.keys(),
            )
    finally:
        client.close()
    mode = recorded.mode if recorded is not None else None
    said = [f"note: {not_served_note(kind, served, mode)}" for kind in sorted(unserved)]
    said += [f"note: {n}" for n in notes]
    said += [f"note: configmap {ctl_ns}/{STATE_CONFIGMAP}: {n}" for n in state.notes]
    for r in rows:
        r["remediation"] = state.device_state(r["device"], now)
        fence = fenced.get(r["device"])
        r["fencedBy"] = fence.as_json() if fence is not None else None
    rows, hidden = _bound_fenced(rows, set(held), fenced.keys())
    sources = [
        ("Pod", scope),
        ("ResourceClaim", scope),
        ("ConfigMap", agent_namespace),
        ("ResourceSlice", None),
        ("DeviceTaintRule", None),
        ("Node", None),
    ]
    if ctl_ns != agent_namespace:
        sources.append(("ConfigMap", ctl_ns))
    if scope is not None and scope != ctl_ns:
        sources.append(("ResourceClaim", ctl_ns))  # quarantine claims
    return View(
        rows,
        _header(served, recorded, unserved),
        _fence_lines(fences, on_node, hidden) + remediation_lines(state, now),
        any(_bad(r) and r["consumers"] for r in rows),
        said,
        sources,
    )


def _quarantine_claims(
    client: Client, served: ServedAPIs, namespace: str, note: Callable[[str], None]
) -> list[dict[str, Any]]:
    """The ResourceClaims of the controller's namespace (its quarantine claims are
    there); none where they cannot be read, with a note when access is denied."""
    resource = served.resource("ResourceClaim")
    if resource is None:
        return []
    try:
        return [to_internal(o.to_dict()) for o in client.list(resource, namespace=namespace)]
    except ApiError as exc:
        if exc.status.code == 403:
            note(
                f"no access to ResourceClaims in {namespace} ({exc.status.message}): "
                "quarantine claims not shown"
            )
            return []
        if exc.status.code == 404:
            return []
        raise


def _bound_fenced(
    rows: list[dict[str, Any]], held: set[str], fenced: Iterable[str]
) -> tuple[list[dict[str, Any]], int]:
    """``rows`` with at most :data:`MAX_FENCED_ROWS` of those listed only because a
    fence covers them (Healthy, untainted, no controller state); how many fenced devices
    are not listed (cut here, or with no health record to show)."""
    out, shown = [], 0
    for r in rows:
        only_fenced = (
            r["fencedBy"] is not None
            and r["health"] == "Healthy"
            and not r["taints"]
            and r["device"] not in held
        )
        if only_fenced:
            shown += 1
            if shown > MAX_FENCED_ROWS:
                continue
        out.append(r)
    listed = {r["device"] for r in out if r["fencedBy"] is not None}
    return out, sum(1 for key in fenced if key not in listed)


def _fence_lines(fences: Fences, on_node: dict[str, list[DeviceKey]], hidden: int) -> list[str]:
    """What drahealth's fences keep new pods off, in a few lines."""
    lines = []
    node_fences = fences.node_list()
    for fence in node_fences[:MAX_FENCE_LINES]:
        n = len(set(on_node.get(fence.name, ())) | set(fence.devices))
        lines.append(
            f"fenced by drahealth: {fence.text()}: no new pod gets any of the node's "
            f"{n} device{'s' * (n != 1)}"
        )
    if len(node_fences) > MAX_FENCE_LINES:
        lines.append(f"fenced by drahealth: {len(node_fences) - MAX_FENCE_LINES} more node fences")
    if fences.claims:
        n = len(fences.claims)
        lines.append(
            f"fenced by drahealth: {n} device{'s' * (n != 1)} held by quarantine claims "
            "(each fences only itself)"
        )
    if hidden:
        lines.append(
            f"{hidden} more fenced device{'s' * (hidden != 1)} not listed "
            "(Healthy, or without a health record)"
        )
    return lines


def _status_machine(row: dict[str, Any]) -> dict[str, Any]:
    """A ``status`` row for json/yaml: RFC 3339 times, no ages."""
    out = {k: v for k, v in row.items() if k != "age"}
    out["since"] = _stamp(row.get("since"))
    out["taints"] = [{k: v for k, v in t.items() if k != "age"} for t in row["taints"]]
    return out


def _status_table(now: float) -> Callable[[list[dict[str, Any]], bool], Any]:
    from drahealth.remedy import fence_text

    def table(rows: list[dict[str, Any]], wide: bool) -> tuple[list[str], list[list[str]]]:
        marked = any(r["remediation"].get("markers") for r in rows)
        fenced = any(r.get("fencedBy") for r in rows)
        headers = ["NODE", "DEVICE", "HEALTH", "AGE", "MESSAGE", "TAINTS", "PODS"]
        headers += ["REMEDIATION"] * marked + ["FENCED"] * fenced + ["SOURCE"] * wide
        cells = []
        for r in rows:
            taints = ", ".join(
                f"{t['key']}={t['value']}:{t['effect']}"
                + (f" ({t['source']}, {_age(t.get('since'), now)})" if wide else "")
                for t in r["taints"]
            )
            pods = ", ".join(
                f"{c['namespace']}/{c['pod']}" + (f" (claim {c['claim']})" if wide else "")
                for c in r["consumers"]
            )
            line = [
                r["node"] or "<none>",
                r["device"],
                r["health"],
                _age(r.get("since"), now),
                r["message"] or "<none>",
                taints or "<none>",
                pods or "<none>",
            ]
            if marked:
                line.append(",".join(r["remediation"].get("markers", [])) or "<none>")
            if fenced:
                line.append(fence_text(r["fencedBy"]) if r.get("fencedBy") else "<none>")
            if wide:
                line.append(r["source"] or "<none>")
            cells.append(line)
        return headers, cells

    return table


def _say(lines: list[str], machine: bool) -> None:
    for line in lines:
        click.echo(printable(line), err=machine)


def _print_status(view: View, output: Output, access: Access, now: float) -> None:
    _say(view.before, output.machine)
    _say(view.notes, True)
    emit(
        view.rows,
        output,
        machine=_status_machine,
        table=_status_table(now),
        name=lambda r: f"device/{r['device']}",
        empty="No bad or tainted devices found.",
    )
    _say(view.after, output.machine)


@click.command("status")
@api_options(namespaced=True, namespace_help=_NS_HELP)
@OUTPUT
@_WATCH
@_AGENT_NAMESPACE
@_CONTROLLER_NAMESPACE
def status_command(
    access: Access,
    output: Output,
    watch: bool,
    agent_namespace: str,
    controller_ns: str | None,
) -> None:
    """Every device that is Unhealthy/Unknown or tainted, and the pods using it.

    Devices are cluster-scoped and all listed; -n/-A choose whose pods are shown using
    them (default: the context's namespace). A header names the server, its
    DeviceTaintRule API and the controller's remediation mode; a "Remediation" block
    after the table shows the controller's guard rails: the circuit breaker, devices
    that need a human, operator holds, degraded devices, burn-in and repairs (both on
    stderr with machine output, where each row carries its device's "remediation"
    state). Exits 3 when a pod listed uses a device that is Unhealthy, Unknown or under
    a NoExecute taint.
    """
    now = time.time()
    if watch:

        def listing() -> Listing:
            t = time.time()
            v = status_view(access, agent_namespace, controller_ns, t)
            show = lambda: _print_status(v, output, access, t)  # noqa: E731
            return [_status_machine(r) for r in v.rows], show, v.sources

        _watch(access, listing)
        return
    view = status_view(access, agent_namespace, controller_ns, now)
    _print_status(view, output, access, now)
    if view.bad_in_use:
        sys.exit(EXIT_BAD_DEVICES_IN_USE)


def pods_view(access: Access, controller_ns: str | None = None) -> View:
    from drahealth.cli._inventory import pod_rows

    client = access.sync_client()
    unserved: set[str] = set()
    notes: list[str] = []
    scope = access.scope
    try:
        with access.failures():
            served = _discover(client)
            claims = _list_dra(client, served, "ResourceClaim", scope, unserved)
            pods = _list(client, Pod, scope)
            rows = pod_rows(pods, claims)
            for r in rows:
                r["blockedBy"] = None
            blocked, more = _blocked_rows(
                client, access, served, pods, claims, controller_ns, unserved, notes
            )
            rows = sorted(rows + blocked, key=lambda r: (r["namespace"], r["pod"], r["device"]))
    finally:
        client.close()
    said = [f"note: {not_served_note(kind, served, None)}" for kind in sorted(unserved)]
    said += [f"note: {n}" for n in notes]
    after = []
    if more:
        after.append(
            f"{more} more Pending pod{'s' * (more != 1)} blocked by drahealth's fences not listed"
        )
    bad = any(r["health"] in BAD_HEALTH for r in rows)
    return View(rows, [], after, bad, said, [("Pod", scope), ("ResourceClaim", scope)])


def _blocked_rows(
    client: Client,
    access: Access,
    served: ServedAPIs,
    pods: list[dict[str, Any]],
    claims: list[dict[str, Any]],
    controller_ns: str | None,
    unserved: set[str],
    notes: list[str],
) -> tuple[list[dict[str, Any]], int]:
    """Rows for the Pending pods drahealth's fences block, and how many more there are.

    Nodes are read only when a pod waits on a taint or a cordon, the controller's
    namespace and DeviceClasses only when one finds no free device."""
    from drahealth.remedy import (
        CORDONED_WORDS,
        NO_DEVICE_WORDS,
        TAINT_WORDS,
        blocked_pods,
        claims_by_name,
        class_drivers,
        read_fences,
        unschedulable,
    )

    waiting = [m for m in (unschedulable(p) for p in pods) if m is not None]
    on_nodes = any(TAINT_WORDS in m or CORDONED_WORDS in m for m in waiting)
    on_devices = any(NO_DEVICE_WORDS in m for m in waiting)
    if not (on_nodes or on_devices):
        return [], 0
    nodes = _list_nodes(client) if on_nodes else []
    ctl_ns: str | None = None
    fence_claims: list[dict[str, Any]] = []
    if on_devices:
        ctl_ns = controller_namespace(client, controller_ns, access, notes.append)
        in_scope = access.scope is None or access.scope == ctl_ns
        fence_claims = (
            claims if in_scope else _quarantine_claims(client, served, ctl_ns, notes.append)
        )
    fences = read_fences(nodes, fence_claims, ctl_ns)
    found, total = blocked_pods(
        pods,
        fences,
        claims=claims_by_name(claims),
        drivers_of_class=lambda: class_drivers(
            _list_dra(client, served, "DeviceClass", None, unserved)
        ),
    )
    rows = [
        {
            "namespace": b.namespace,
            "pod": b.pod,
            "node": "",
            "phase": "Pending",
            "claim": "",
            "request": "",
            "device": "",
            "health": "-",
            "message": b.message,
            "source": "PodScheduled",
            "blockedBy": list(b.by),
            "scheduler": b.scheduler,
        }
        for b in found
    ]
    return rows, total - len(found)


def _pods_table(rows: list[dict[str, Any]], wide: bool) -> tuple[list[str], list[list[str]]]:
    headers = ["NAMESPACE", "POD", "NODE", "DEVICE", "HEALTH", "MESSAGE"]
    headers += ["PHASE", "CLAIM", "SOURCE"] * wide
    cells = []
    for r in rows:
        device = r["device"] or "<none>"
        line = [r["namespace"], r["pod"], r["node"] or "<none>", device, r["health"]]
        line.append(r["message"] or "<none>")
        if wide:
            claim = f"{r['claim']}/{r['request']}" if r["claim"] else "<none>"
            line += [r["phase"], claim, r["source"] or "<none>"]
        cells.append(line)
    return headers, cells


def _print_pods(view: View, output: Output, access: Access) -> None:
    _say(view.notes, True)
    emit(
        view.rows,
        output,
        table=_pods_table,
        name=lambda r: f"pod/{r['pod']}",
        empty=f"No pods using DRA devices found {access.where()}.",
    )
    _say(view.after, output.machine)


@click.command("pods")
@api_options(namespaced=True)
@OUTPUT
@_WATCH
@_CONTROLLER_NAMESPACE
def pods_command(access: Access, output: Output, watch: bool, controller_ns: str | None) -> None:
    """Per pod: its devices and their health, as the pod status shows it (else as the
    driver's claim condition does).

    Pending pods that drahealth's node taint, cordon or quarantine claims keep from
    scheduling are listed too ("Pending: blocked by node/NAME taint KEY", "Pending: no
    free device (N quarantined)"; JSON "blockedBy"), at most 50, the rest counted.
    -o wide names the source of each health. Exits 3 when a pod listed has a device
    that is Unhealthy or Unknown.
    """
    if watch:

        def listing() -> Listing:
            v = pods_view(access, controller_ns)
            return v.rows, lambda: _print_pods(v, output, access), v.sources

        _watch(access, listing)
        return
    view = pods_view(access, controller_ns)
    _print_pods(view, output, access)
    if view.bad_in_use:
        sys.exit(EXIT_BAD_DEVICES_IN_USE)


# --- -w: print again on change --------------------------------------------------------


#: A listing for ``-w``: its key (machine rows), how to print it, and what to watch.
Listing = tuple[Any, Callable[[], None], list[tuple[str, str | None]]]


def _watch(access: Access, listing: Callable[[], Listing]) -> None:
    """Print ``listing()``, then watch what it names (kind and namespace) and, after
    events, list again and print when the listing's key (its machine rows: times as
    RFC 3339, so no ages) differs from the last one printed.

    Ends with exit 0 on Ctrl-C or SIGTERM, from the first listing on; a watch that
    breaks is opened again. A signal never interrupts a request: it is noted, and the
    command stops at the next step (at the latest when the listing under way ends).
    """
    stopping = threading.Event()

    def note_stop(_signum: int, _frame: Any) -> None:
        stopping.set()

    async def main(shown: Any, sources: list[tuple[str, str | None]]) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if stopping.is_set():  # a signal before the handlers above were in place
            return
        changed = asyncio.Event()
        client = access.async_client()
        tasks: list[asyncio.Task[None]] = []
        last = _key(shown)

        async def until_stopped(seconds: float | None) -> bool:
            """Wait for ``changed`` (or ``seconds``); True when asked to stop."""
            waits = {asyncio.create_task(stop.wait())}
            if seconds is None:
                waits.add(asyncio.create_task(changed.wait()))
            _, pending = await asyncio.wait(
                waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
            )
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return stop.is_set()

        try:
            served = await asyncio.to_thread(_served_for_watch, access)
            tasks += [
                asyncio.create_task(_follow(client, served, kind, namespace, changed))
                for kind, namespace in dict.fromkeys(sources)
            ]
            while not await until_stopped(None):
                if await until_stopped(COALESCE_SECONDS):
                    break
                changed.clear()
                key, show, _ = await asyncio.to_thread(listing)
                if stop.is_set():
                    break
                if _key(key) != last:
                    last = _key(key)
                    click.echo("")
                    show()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()

    previous = {sig: signal.signal(sig, note_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with contextlib.suppress(KeyboardInterrupt):  # a last resort: exit 0 all the same
            first, show, sources = listing()
            if stopping.is_set():
                return
            show()
            asyncio.run(main(first, sources))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _key(rows: Any) -> str:
    return json_text(rows, sort_keys=True, default=str)


def _served_for_watch(access: Access) -> ServedAPIs:
    client = access.sync_client()
    try:
        with access.failures():
            return _discover(client)
    finally:
        client.close()


async def _follow(
    client: Any, served: ServedAPIs, kind: str, scope: str | None, changed: asyncio.Event
) -> None:
    """Set ``changed`` on every event of ``kind`` (in namespace ``scope``; None: every
    namespace, or cluster-scoped); reopen the watch when it ends or fails."""
    core: dict[str, Any] = {"Pod": Pod, "ConfigMap": ConfigMap, "Node": Node}
    resource: Any = core.get(kind) or served.resource(kind)
    if resource is None:
        return  # not served: nothing of it can change
    namespaced = kind not in _CLUSTER_SCOPED and kind != "Node"
    delay = 0.5
    while True:
        try:
            kw = {"namespace": scope or "*"} if namespaced else {}
            async for _event in client.watch(resource, **kw):
                changed.set()
                delay = 0.5
        except asyncio.CancelledError:
            raise
        except Exception:  # a broken watch (reset, 410, forbidden): list again after a wait
            changed.set()
        await asyncio.sleep(delay)
        delay = min(MAX_RETRY_SECONDS, delay * 2)


def _holders(
    client: Client,
    served: ServedAPIs,
    device: str,
    events: list[dict[str, Any]],
    ctl_ns: str,
    unserved: set[str],
) -> list[Consumer]:
    """The live pods holding ``device`` now, read only in the namespaces of drahealth's
    Events about Pods outside the controller's namespace that name it (the ones that need
    a holder), at most :data:`MAX_HOLDER_NAMESPACES` of them."""
    from drahealth.remedy import consumers, recorded_by

    namespaces = sorted(
        {
            str((e.get("metadata") or {}).get("namespace") or "")
            for e in events
            if (e.get("involvedObject") or {}).get("kind") == "Pod"
            and mentions_device(str(e.get("message", "")), device)
            and recorded_by(e, ctl_ns) is not None
        }
        - {ctl_ns, ""}
    )
    if len(namespaces) > MAX_HOLDER_NAMESPACES:
        _note(
            f"pod Events naming the device in {len(namespaces)} namespaces; only the first "
            f"{MAX_HOLDER_NAMESPACES} are checked against the pods there"
        )
        namespaces = namespaces[:MAX_HOLDER_NAMESPACES]
    pods: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    for ns in namespaces:
        pods += _list(client, Pod, ns)
        claims += _list_dra(client, served, "ResourceClaim", ns, unserved)
    return consumers(pods, claims).get(DeviceKey.parse(device), [])


@click.command("history")
@api_options(namespaced=False)
@click.argument("device", metavar="DRIVER/POOL/DEVICE")
@_CONTROLLER_NAMESPACE
@OUTPUT
def history_command(access: Access, device: str, controller_ns: str | None, output: Output) -> None:
    """What happened to one device: controller actions and Events, oldest first.

    A device is cluster-scoped: its Events are read in every namespace the reader may
    list (else in the context's namespace, and a note says so). The controller's actions
    are shown in words ("needs a human", "repair (failed)", "circuit breaker"...;
    machine output keeps the action as written in "what" and adds "label"), and a
    "now:" line says what the controller holds of the device today (on stderr with
    machine output). The controller's namespace is found from its ConfigMaps.
    """
    from drahealth.cli._remediation import history_line, read_remediation_state
    from drahealth.remedy import (
        HISTORY_CONFIGMAP,
        STATE_CONFIGMAP,
        RuleError,
        history_source,
        parse_device,
    )

    try:
        key = str(parse_device(device))
    except RuleError as exc:
        raise click.BadParameter(str(exc), param_hint="DEVICE") from exc
    if output.kind == "name":
        raise click.BadParameter("history lists events, not named objects", param_hint="-o")
    client = access.sync_client()
    rows: list[dict[str, Any]] = []
    unserved: set[str] = set()
    recorded = None
    notes: list[str] = []
    try:
        with access.failures():
            served = _discover(client)
            ctl_ns = controller_namespace(client, controller_ns, access, notes.append)
            state = read_remediation_state(client, ctl_ns, notes.append)
            if not served.served("DeviceTaintRule"):
                unserved.add("DeviceTaintRule")
            try:
                cm = client.get(ConfigMap, HISTORY_CONFIGMAP, namespace=ctl_ns)
                recorded = controller_mode(cm.to_dict())
                try:
                    entries = json.loads((cm.data or {}).get("history", "[]"))
                except ValueError as exc:
                    _warn(f"{HISTORY_CONFIGMAP}: history is not JSON ({exc}); skipped")
                    entries = []
                for h in entries if isinstance(entries, list) else []:
                    if not isinstance(h, dict):
                        continue
                    if mentions_device(str(h.get("subject", "")), key) or mentions_device(
                        str(h.get("message", "")), key
                    ):
                        action = str(h.get("action", ""))
                        rows.append(
                            {
                                "time": _stamp(h.get("time")),
                                "source": f"controller {h.get('by', '')}",
                                "what": action,
                                "label": history_label(action),
                                "message": h.get("message", ""),
                            }
                        )
            except ApiError as exc:
                if exc.status.code != 403:
                    if exc.status.code != 404:
                        raise
                else:
                    notes.append(
                        f"no access to configmap {ctl_ns}/{HISTORY_CONFIGMAP} "
                        f"({exc.status.message}): the controller's actions not shown"
                    )
            events = _list(client, Event, None)
            holders = _holders(client, served, key, events, ctl_ns, unserved)
            for e in events:
                source = history_source(e, key, ctl_ns, holders)
                if source is None:
                    continue  # not drahealth's word on this device (see history_source)
                rows.append(
                    {
                        "time": _stamp(
                            e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp")
                        ),
                        "source": source,
                        "what": e.get("reason", ""),
                        "label": e.get("reason", ""),
                        "message": e.get("message", ""),
                    }
                )
    finally:
        client.close()
    machine = output.machine
    for n in notes:
        _note(n)
    _notes(unserved, served, recorded.mode if recorded is not None else None)
    rows.sort(key=lambda r: parse_time(r["time"]) or 0.0)
    now = time.time()

    def table(rs: list[dict[str, Any]], wide: bool) -> tuple[list[str], list[list[str]]]:
        headers = ["LAST SEEN", "SOURCE", "WHAT", "MESSAGE"] + ["TIME"] * wide
        cells = []
        for r in rs:
            line = [_age(r["time"], now), r["source"], r["label"], r["message"] or "<none>"]
            cells.append(line + ([r["time"] or "<unknown>"] if wide else []))
        return headers, cells

    emit(rows, output, table=table, empty=f"No history found for {printable(key)}.")
    for n in state.notes:
        _note(f"configmap {ctl_ns}/{STATE_CONFIGMAP}: {n}")
    now_line = history_line(state, key, now)
    if now_line is not None:
        click.echo(printable(now_line), err=machine)
