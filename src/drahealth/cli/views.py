"""``drahealth status``, ``pods``, ``history``, ``watch``: which pods sit on bad devices, and why.

Owns the four read-only commands. ``status``, ``pods`` and ``history`` read the API
(any cluster through a kubeconfig, or the embedded one); ``watch`` opens a dra-health
stream on any DRA driver's socket. Output: a table (``-o wide`` adds columns), or
``json`` / ``yaml``. ``status`` exits 3 when a device that is not Healthy is used by a
pod, so scripts and alerts can use it. Where RBAC forbids cluster-wide reads of pods,
the commands fall back to the kubeconfig's namespace and say so.

Device health is read from the node agents' records in ``--agent-namespace`` only (see
:mod:`drahealth.core`). Text from the API is shown as plain text: no rich
markup, escape sequences and control characters removed. When the API cannot be used
the commands print one ``error:`` line and exit 1 (2 for usage errors).

Each command asks the server once which ``resource.k8s.io`` versions it serves and reads
every DRA kind at the one chosen (see :mod:`drahealth.kube`). A kind the server does not
serve (DeviceTaintRule on a 1.35 cluster without ``DRADeviceTaintRules``) is one
``note:`` line saying so and what remediation does instead; the rest of the view works.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from typing import Any

import click
import httpx2
import yaml
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod
from rich.console import Console
from rich.table import Table
from rich.text import Text

from drahealth._api_failures import CommandError, api_failures, load_checked
from drahealth._served import NO_CONTROLLER, auto_mode, controller_mode, not_served_note
from drahealth._text import json_text, printable
from drahealth.core import (
    DEFAULT_NAMESPACE,
    LABELS,
    agent_records,
    history_label,
    mentions_device,
)
from drahealth.kube import DiscoveryError, ServedAPIs, discover_sync, make_sync_client, to_internal

__all__ = ["history_command", "pods_command", "status_command", "watch_command"]

EXIT_BAD_DEVICES_IN_USE = 3
OUTPUTS = click.Choice(["table", "wide", "json", "yaml"])


def _client(kubeconfig: str | None) -> Client:
    with api_failures(kubeconfig):
        load_checked(kubeconfig)
        return make_sync_client(kubeconfig)


def _cell(value: object, style: str = "") -> Text:
    """A table cell showing ``value`` as plain text (never markup, no control characters)."""
    return Text(printable(value), style=style)


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


def _emit(rows: list[dict[str, Any]], output: str, table: Table) -> None:
    if output == "json":
        click.echo(json_text(rows, indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(rows, sort_keys=False, allow_unicode=True), nl=False)
    else:
        # like kubectl: never wrap rows when the output is not a terminal
        width = None if sys.stdout.isatty() else 250
        Console(width=width, highlight=False).print(table)


_KUBECONFIG = click.option("--kubeconfig", metavar="FILE", help="API access [default: as kubectl].")
_NAMESPACE = click.option("-n", "--namespace", default=None, help="Only pods of this namespace.")
_OUTPUT = click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True)
_AGENT_NAMESPACE = click.option(
    "--agent-namespace",
    default=DEFAULT_NAMESPACE,
    show_default=True,
    help="Namespace of the node agents' device-health ConfigMaps (the agent's --namespace).",
)


def _api_errors(fn: Any) -> Any:
    """One ``error:`` line and exit 1 when the API cannot be used (see the module doc)."""

    def wrapper(*args: Any, **kw: Any) -> Any:
        with api_failures(kw.get("kubeconfig")):
            return fn(*args, **kw)

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


_CONTROLLER_NAMESPACE = click.option(
    "--controller-namespace",
    default="default",
    show_default=True,
    help="Namespace of the remediation controller (its history and state ConfigMaps).",
)


def _header(served: ServedAPIs, recorded: Any, unserved: set[str]) -> list[str]:
    """The server, its DeviceTaintRule API, and the controller's remediation mode."""
    if "DeviceTaintRule" in unserved:
        served = ServedAPIs({}, served.server_version)
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


@click.command("status")
@_KUBECONFIG
@_NAMESPACE
@_OUTPUT
@_AGENT_NAMESPACE
@_CONTROLLER_NAMESPACE
@_api_errors
def status_command(
    kubeconfig: str | None,
    namespace: str | None,
    output: str,
    agent_namespace: str,
    controller_namespace: str,
) -> None:
    """Every device that is Unhealthy/Unknown or tainted, and the pods using it.

    A header names the server, its DeviceTaintRule API and the controller's remediation
    mode; a "Remediation" block after the table shows the controller's guard rails: the
    circuit breaker, devices that need a human, operator holds, degraded devices, burn-in
    and repairs (both on stderr with ``-o json|yaml``, where each row carries its device's
    ``remediation`` state). Exits 3 when a device that is not Healthy is used by a pod.
    """
    from drahealth.cli._inventory import device_rows
    from drahealth.cli._remediation import read_remediation_state, remediation_lines
    from drahealth.remedy import STATE_CONFIGMAP

    client = _client(kubeconfig)
    unserved: set[str] = set()
    now = time.time()
    try:
        served = _discover(client)
        recorded = _controller_mode(client, controller_namespace)
        state = read_remediation_state(client, controller_namespace, _note)
        health = agent_records(
            _list(client, ConfigMap, agent_namespace, labels=LABELS), agent_namespace
        )
        rows = device_rows(
            health,
            _list(client, Pod, namespace),
            _list_dra(client, served, "ResourceClaim", namespace, unserved),
            _list_dra(client, served, "ResourceSlice", None, unserved),
            _list_dra(client, served, "DeviceTaintRule", None, unserved),
            now,
            _warn,
            _list_nodes(client),
            also=state.devices(),
        )
    finally:
        client.close()
    structured = output in ("json", "yaml")
    for line in _header(served, recorded, unserved):
        click.echo(printable(line), err=structured)
    _notes(unserved, served, recorded.mode if recorded is not None else None)
    for note in state.notes:
        _note(f"configmap {controller_namespace}/{STATE_CONFIGMAP}: {note}")
    for r in rows:
        r["remediation"] = state.device_state(r["device"], now)
    wide = output == "wide"
    marked = any(r["remediation"].get("markers") for r in rows)
    table = Table(box=None, header_style="bold")
    for col in ("NODE", "DEVICE", "HEALTH", "AGE", "MESSAGE", "TAINTS", "PODS"):
        table.add_column(col)
    if marked:
        table.add_column("REMEDIATION")
    if wide:
        table.add_column("SOURCE")
    for r in rows:
        colour = {"Unhealthy": "red", "Unknown": "yellow"}.get(r["health"], "green")
        taints = ", ".join(
            f"{t['key']}={t['value']}:{t['effect']}"
            + (f" ({t['source']}, {t['age']})" if wide else "")
            for t in r["taints"]
        )
        pods = ", ".join(
            f"{c['namespace']}/{c['pod']}" + (f" (claim {c['claim']})" if wide else "")
            for c in r["consumers"]
        )
        cells = [
            _cell(r["node"]),
            _cell(r["device"]),
            _cell(r["health"], colour),
            _cell(r["age"]),
            _cell(r["message"]),
            _cell(taints),
            _cell(pods),
        ]
        if marked:
            markers = r["remediation"].get("markers", [])
            cells.append(_cell(",".join(markers), "bold magenta" if markers else ""))
        table.add_row(*cells, *([_cell(r["source"])] if wide else []))
    _emit(rows, output, table)
    for line in remediation_lines(state, now):
        click.echo(printable(line), err=structured)
    if any(r["health"] != "Healthy" and r["consumers"] for r in rows):
        sys.exit(EXIT_BAD_DEVICES_IN_USE)


@click.command("pods")
@_KUBECONFIG
@_NAMESPACE
@_OUTPUT
@_api_errors
def pods_command(kubeconfig: str | None, namespace: str | None, output: str) -> None:
    """Per pod: its devices and their health as the pod status shows it (else as the
    driver's claim condition does; ``-o wide`` names the source)."""
    from drahealth.cli._inventory import pod_rows

    client = _client(kubeconfig)
    unserved: set[str] = set()
    try:
        served = _discover(client)
        claims = _list_dra(client, served, "ResourceClaim", namespace, unserved)
        rows = pod_rows(_list(client, Pod, namespace), claims)
    finally:
        client.close()
    _notes(unserved, served)
    wide = output == "wide"
    table = Table(box=None, header_style="bold")
    for col in ("NAMESPACE", "POD", "NODE", "DEVICE", "HEALTH", "MESSAGE"):
        table.add_column(col)
    if wide:
        table.add_column("PHASE")
        table.add_column("CLAIM")
        table.add_column("SOURCE")
    for r in rows:
        colour = {"Unhealthy": "red", "Unknown": "yellow", "Healthy": "green"}.get(
            r["health"], "dim"
        )
        cells = [
            _cell(r["namespace"]),
            _cell(r["pod"]),
            _cell(r["node"]),
            _cell(r["device"]),
            _cell(r["health"], colour),
            _cell(r["message"]),
        ]
        extra = (
            [_cell(r["phase"]), _cell(f"{r['claim']}/{r['request']}"), _cell(r["source"])]
            if wide
            else []
        )
        table.add_row(*cells, *extra)
    _emit(rows, output, table)


@click.command("history")
@_KUBECONFIG
@click.argument("device", metavar="DRIVER/POOL/DEVICE")
@click.option("--controller-namespace", default="default", show_default=True)
@_OUTPUT
@_api_errors
def history_command(
    kubeconfig: str | None, device: str, controller_namespace: str, output: str
) -> None:
    """What happened to one device: controller actions and Events, oldest first.

    The controller's actions are shown in words (``needs a human``, ``repair (failed)``,
    ``circuit breaker``...; ``-o json|yaml`` keeps the action as written in ``what``
    and adds ``label``), and a ``now:`` line says what the controller holds of the
    device today (needs a human, held, repair...), on stderr with ``-o json|yaml``.
    """
    from drahealth.cli._remediation import history_line, read_remediation_state
    from drahealth.remedy import HISTORY_CONFIGMAP, STATE_CONFIGMAP, RuleError, parse_device

    try:
        key = str(parse_device(device))
    except RuleError as exc:
        raise click.BadParameter(str(exc), param_hint="DEVICE") from exc
    client = _client(kubeconfig)
    rows: list[dict[str, Any]] = []
    unserved: set[str] = set()
    recorded = None
    try:
        served = _discover(client)
        state = read_remediation_state(client, controller_namespace, _note)
        if not served.served("DeviceTaintRule"):
            unserved.add("DeviceTaintRule")
        try:
            cm = client.get(ConfigMap, HISTORY_CONFIGMAP, namespace=controller_namespace)
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
                            "time": h.get("time", ""),
                            "source": f"controller {h.get('by', '')}",
                            "what": action,
                            "label": history_label(action),
                            "message": h.get("message", ""),
                        }
                    )
        except ApiError as exc:
            if exc.status.code != 404:
                raise
        for e in _list(client, Event, None):
            if mentions_device(str(e.get("message", "")), key):
                obj = e.get("involvedObject") or {}
                component = (e.get("source") or {}).get("component", "")
                rows.append(
                    {
                        "time": e.get("lastTimestamp") or e.get("firstTimestamp") or "",
                        "source": f"{component} on {obj.get('kind', '')}/{obj.get('name', '')}",
                        "what": e.get("reason", ""),
                        "label": e.get("reason", ""),
                        "message": e.get("message", ""),
                    }
                )
    finally:
        client.close()
    _notes(unserved, served, recorded.mode if recorded is not None else None)
    rows.sort(key=lambda r: str(r["time"]))
    table = Table(box=None, header_style="bold")
    for col in ("TIME", "SOURCE", "WHAT", "MESSAGE"):
        table.add_column(col)
    for r in rows:
        table.add_row(*(_cell(r[k]) for k in ("time", "source", "label", "message")))
    _emit(rows, output, table)
    if not rows:
        click.echo(f"no history for {printable(key)}", err=True)
    for note in state.notes:
        _note(f"configmap {controller_namespace}/{STATE_CONFIGMAP}: {note}")
    now_line = history_line(state, key, time.time())
    if now_line is not None:
        click.echo(printable(now_line), err=output in ("json", "yaml"))


@click.command("watch")
@click.argument("socket", metavar="SOCKET", type=click.Path(dir_okay=False))
@click.option("--once", is_flag=True, help="Print the first message and exit.")
@click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)
def watch_command(socket: str, once: bool, output: str) -> None:
    """Live view of any DRA driver's health stream (the DRA socket, e.g. .../dra.sock)."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_watch(socket, once, output))


async def _watch(socket: str, once: bool, output: str) -> None:
    import grpc

    from drahealth import api
    from drahealth.core import Health

    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        for service, module, grpc_module in (
            (api.DRA_HEALTH_V1, api.health_v1, api.health_v1_grpc),
            (api.DRA_HEALTH_V1ALPHA1, api.health_v1alpha1, api.health_v1alpha1_grpc),
        ):
            stub = grpc_module.DRAResourceHealthStub(channel)
            call = stub.NodeWatchResources(module.NodeWatchResourcesRequest())
            try:
                async for message in call:
                    rows = [
                        {
                            "pool": d.device.pool_name,
                            "device": d.device.device_name,
                            "health": Health.from_wire(d.health).value,
                            "message": d.message,
                            "timeoutSeconds": d.health_check_timeout_seconds,
                        }
                        for d in message.devices
                    ]
                    stamp = time.strftime("%H:%M:%S")
                    if output == "json":
                        click.echo(json_text({"time": stamp, "service": service, "devices": rows}))
                    else:
                        table = Table(
                            title=f"{stamp} {service}: {len(rows)} devices",
                            box=None,
                            header_style="bold",
                        )
                        for col in ("POOL", "DEVICE", "HEALTH", "TIMEOUT", "MESSAGE"):
                            table.add_column(col)
                        for r in rows:
                            colour = {"Unhealthy": "red", "Unknown": "yellow"}.get(
                                r["health"], "green"
                            )
                            table.add_row(
                                _cell(r["pool"]),
                                _cell(r["device"]),
                                _cell(r["health"], colour),
                                _cell(r["timeoutSeconds"]),
                                _cell(r["message"]),
                            )
                        Console(highlight=False).print(table)
                    if once:
                        call.cancel()
                        return
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    continue
                raise click.ClickException(f"{socket}: {exc.code().name}: {exc.details()}") from exc
        raise click.ClickException(f"{socket}: the plugin serves no dra-health service")
