"""``drahealth status``, ``pods``, ``history``, ``watch``: which pods sit on bad devices, and why.

Owns the four read-only commands. ``status``, ``pods`` and ``history`` read the API
(any cluster through a kubeconfig, or the embedded one); ``watch`` opens a dra-health
stream on any DRA driver's socket. Output: a table (``-o wide`` adds columns), or
``json`` / ``yaml``. ``status`` exits 3 when a device that is not Healthy is used by a
pod, so scripts and alerts can use it. Where RBAC forbids cluster-wide reads of pods,
the commands fall back to the kubeconfig's namespace and say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from typing import Any

import click
import yaml
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import ConfigMap, Event, Pod
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceClaim, ResourceSlice
from rich.console import Console
from rich.table import Table

from drahealth.kube import KubeConfigError, make_sync_client

__all__ = ["history_command", "pods_command", "status_command", "watch_command"]

EXIT_BAD_DEVICES_IN_USE = 3
OUTPUTS = click.Choice(["table", "wide", "json", "yaml"])


def _client(kubeconfig: str | None) -> Client:
    try:
        return make_sync_client(kubeconfig)
    except KubeConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--kubeconfig") from exc


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


def _emit(rows: list[dict[str, Any]], output: str, table: Table) -> None:
    if output == "json":
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
    elif output == "yaml":
        click.echo(yaml.safe_dump(rows, sort_keys=False, allow_unicode=True), nl=False)
    else:
        # like kubectl: never wrap rows when the output is not a terminal
        width = None if sys.stdout.isatty() else 250
        Console(width=width, highlight=False).print(table)


_KUBECONFIG = click.option("--kubeconfig", metavar="FILE", help="API access [default: as kubectl].")
_NAMESPACE = click.option("-n", "--namespace", default=None, help="Only pods of this namespace.")
_OUTPUT = click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True)


def _api_errors(fn: Any) -> Any:
    def wrapper(*args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except ApiError as exc:
            raise click.ClickException(
                f"API error {exc.status.code}: {exc.status.message}"
            ) from exc

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


@click.command("status")
@_KUBECONFIG
@_NAMESPACE
@_OUTPUT
@_api_errors
def status_command(kubeconfig: str | None, namespace: str | None, output: str) -> None:
    """Every device that is Unhealthy/Unknown or tainted, and the pods using it.

    Exits 3 when a device that is not Healthy is used by a pod.
    """
    from drahealth.cli._inventory import device_rows

    client = _client(kubeconfig)
    try:
        health = _list(
            client, ConfigMap, None, labels={"app.kubernetes.io/component": "device-health"}
        )
        rows = device_rows(
            health,
            _list(client, Pod, namespace),
            _list(client, ResourceClaim, namespace),
            [s.to_dict() for s in client.list(ResourceSlice)],
            [r.to_dict() for r in client.list(DeviceTaintRule)],
            time.time(),
        )
    finally:
        client.close()
    wide = output == "wide"
    table = Table(box=None, header_style="bold")
    for col in ("NODE", "DEVICE", "HEALTH", "AGE", "MESSAGE", "TAINTS", "PODS"):
        table.add_column(col)
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
            r["node"],
            r["device"],
            f"[{colour}]{r['health']}[/]",
            r["age"],
            r["message"],
            taints,
            pods,
        ]
        table.add_row(*cells, *([r["source"]] if wide else []))
    _emit(rows, output, table)
    if any(r["health"] != "Healthy" and r["consumers"] for r in rows):
        sys.exit(EXIT_BAD_DEVICES_IN_USE)


@click.command("pods")
@_KUBECONFIG
@_NAMESPACE
@_OUTPUT
@_api_errors
def pods_command(kubeconfig: str | None, namespace: str | None, output: str) -> None:
    """Per pod: its devices and their health as the pod status shows it."""
    from drahealth.cli._inventory import pod_rows

    client = _client(kubeconfig)
    try:
        rows = pod_rows(_list(client, Pod, namespace), _list(client, ResourceClaim, namespace))
    finally:
        client.close()
    wide = output == "wide"
    table = Table(box=None, header_style="bold")
    for col in ("NAMESPACE", "POD", "NODE", "DEVICE", "HEALTH", "MESSAGE"):
        table.add_column(col)
    if wide:
        table.add_column("PHASE")
        table.add_column("CLAIM")
    for r in rows:
        colour = {"Unhealthy": "red", "Unknown": "yellow", "Healthy": "green"}.get(
            r["health"], "dim"
        )
        cells = [
            r["namespace"],
            r["pod"],
            r["node"],
            r["device"],
            f"[{colour}]{r['health']}[/]",
            r["message"],
        ]
        table.add_row(*cells, *([r["phase"], f"{r['claim']}/{r['request']}"] if wide else []))
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
    """What happened to one device: controller actions and Events, oldest first."""
    from drahealth.remedy._controller import HISTORY_CONFIGMAP
    from drahealth.remedy._rules import RuleError, parse_device

    try:
        key = str(parse_device(device))
    except RuleError as exc:
        raise click.BadParameter(str(exc), param_hint="DEVICE") from exc
    client = _client(kubeconfig)
    rows: list[dict[str, Any]] = []
    try:
        try:
            cm = client.get(ConfigMap, HISTORY_CONFIGMAP, namespace=controller_namespace)
            for h in json.loads((cm.data or {}).get("history", "[]")):
                if key in str(h.get("subject", "")) or key in str(h.get("message", "")):
                    rows.append(
                        {
                            "time": h.get("time", ""),
                            "source": f"controller {h.get('by', '')}",
                            "what": h.get("action", ""),
                            "message": h.get("message", ""),
                        }
                    )
        except ApiError as exc:
            if exc.status.code != 404:
                raise
        for e in _list(client, Event, None):
            if key in str(e.get("message", "")):
                obj = e.get("involvedObject") or {}
                component = (e.get("source") or {}).get("component", "")
                rows.append(
                    {
                        "time": e.get("lastTimestamp") or e.get("firstTimestamp") or "",
                        "source": f"{component} on {obj.get('kind', '')}/{obj.get('name', '')}",
                        "what": e.get("reason", ""),
                        "message": e.get("message", ""),
                    }
                )
    finally:
        client.close()
    rows.sort(key=lambda r: str(r["time"]))
    table = Table(box=None, header_style="bold")
    for col in ("TIME", "SOURCE", "WHAT", "MESSAGE"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["time"]), r["source"], r["what"], r["message"])
    _emit(rows, output, table)
    if not rows:
        click.echo(f"no history for {key}", err=True)


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
                        click.echo(json.dumps({"time": stamp, "service": service, "devices": rows}))
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
                                r["pool"],
                                r["device"],
                                f"[{colour}]{r['health']}[/]",
                                str(r["timeoutSeconds"]),
                                r["message"],
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
