"""Provenance, round three: a tenant's Event cannot write another device's history.

A tenant may create Events in its own namespace, and may copy the controller's or an
agent's ``source.component``, ``reportingComponent`` and ``reportingInstance`` into
them. Such an Event is only a claim by that namespace about its own pod:

* a forged eviction or health Event whose message names a device the tenant's pod does
  not hold (another tenant's pod, or no pod at all) appears in no device's history, in
  ``drahealth history`` or in the dashboard's ``/api/history``;
* the controller's own records still do: its history ConfigMap and its Events in its
  namespace; a pod-namespace Event counts only for a device its pod holds, and is shown
  with the pod as its source;
* the controller's Events about rules and nodes live in ``default`` (the API server's
  rule): its word only where the controller runs in ``default``, else shown as Events
  in ``default`` (anyone allowed to create Events there could have written them).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Pod

from drahealth.controlplane import APIServer
from drahealth.web import Dashboard
from tests.integration.cli.test_views import NODE, D, run, scenario
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

CONTROLLER, AGENT = "drahealth-controller", "drahealth-agent"
GPU = [f"{D}/{NODE}/gpu-{i}" for i in range(4)]


def _event(
    name: str, namespace: str, component: str, reason: str, message: str, obj: dict[str, Any]
) -> Event:
    event = Event.from_dict(
        {
            "metadata": {"name": name, "namespace": namespace},
            "reason": reason, "message": message, "type": "Warning", "involvedObject": obj,
            "lastTimestamp": "2026-11-22T10:00:00Z",
            "source": {"component": component}, "reportingComponent": component,
            "reportingInstance": f"{component}-0",
        }
    )  # fmt: skip
    assert isinstance(event, Event)
    return event


async def _setup(client: AsyncClient) -> None:
    """ml/train holds gpu-1, ml/infer gpu-0 (the scenario); the tenant "evil" forges."""
    await scenario(client)
    await client.create(Namespace.from_dict({"metadata": {"name": "evil"}}))  # type: ignore[call-overload]
    own = {"kind": "Pod", "namespace": "evil", "name": "own", "apiVersion": "v1"}
    forged = f"evicted pod ml/train: device {GPU[1]} is tainted by policy rule xid ({GPU[3]})"
    await client.create(_event("f1", "evil", CONTROLLER, "DeviceTaintEviction", forged, own))
    unhealthy = f"device {GPU[1]} of pod evil/own is Unhealthy: XID 79 (also {GPU[3]})"
    await client.create(_event("f2", "evil", AGENT, "DeviceUnhealthy", unhealthy, own))
    train = {"kind": "Pod", "namespace": "ml", "name": "train", "apiVersion": "v1"}

    # what the controller really wrote: its history, its Events in its own namespace,
    # and the eviction Event about ml/train (which holds gpu-1) in ml
    pod = await client.get(Pod, "train", namespace="ml")
    real = f"evicted pod ml/train: device {GPU[1]} is tainted by policy rule xid"
    history = [
        {"time": "2026-11-22T09:59:00Z", "by": "ctl-0", "action": "evict-evicted",
         "subject": "ml/train", "message": real},
    ]  # fmt: skip
    await client.create(
        ConfigMap.from_dict(  # type: ignore[call-overload]
            {
                "metadata": {"name": "drahealth-remediation-history", "namespace": "default"},
                "data": {"history": json.dumps(history)},
            }
        )
    )
    rule = {"kind": "DeviceTaintRule", "name": "dh-gpu-1", "apiVersion": "resource.k8s.io/v1"}
    await client.create(
        _event("g1", "default", CONTROLLER, "DeviceTainted", f"tainted {GPU[1]}", rule)
    )
    ref = {**train, "uid": pod.metadata.uid if pod.metadata else ""}
    await client.create(_event("g2", "ml", CONTROLLER, "DeviceTaintEviction", real, ref))


def _messages(rows: list[dict[str, Any]]) -> list[str]:
    return [str(r["message"]) for r in rows]


async def test_a_tenants_forged_events_are_in_no_devices_cli_history(
    server: APIServer, client: AsyncClient, tmp_path: Path
) -> None:
    await _setup(client)
    kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
    got: dict[str, list[dict[str, Any]]] = {}
    for device in (GPU[1], GPU[3]):
        out = await asyncio.to_thread(
            run, "history", "--kubeconfig", kubeconfig, device, "-o", "json",
            "--controller-namespace", "default",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        got[device] = json.loads(out.stdout)
        assert not any("evil" in json.dumps(r) for r in got[device]), got[device]
    assert got[GPU[3]] == []
    rows = got[GPU[1]]
    assert [(r["what"], r["source"]) for r in rows] == [
        ("evict-evicted", "controller ctl-0"),
        ("DeviceTainted", f"{CONTROLLER} on DeviceTaintRule/dh-gpu-1"),
        ("DeviceTaintEviction", "pod ml/train (Event in ml)"),
    ]

    # the table says the same: the pod, not the controller, is the last row's source
    out = await asyncio.to_thread(
        run, "history", "--kubeconfig", kubeconfig, GPU[1], "--controller-namespace", "default"
    )
    assert out.returncode == 0, out.stderr
    assert "pod ml/train (Event in ml)" in out.stdout and "evil" not in out.stdout


async def test_a_tenants_forged_events_are_in_no_devices_dashboard_history(
    client: AsyncClient,
) -> None:
    await _setup(client)
    dashboard = Dashboard(client, history_namespace="default")
    url = await dashboard.start()
    got: dict[str, list[dict[str, Any]]] = {}
    try:
        async with aiohttp.ClientSession() as http:
            for device in (GPU[1], GPU[3]):
                async with http.get(url + "api/history", params={"device": device}) as resp:
                    assert resp.status == 200, await resp.text()
                    got[device] = await resp.json()
    finally:
        await dashboard.stop()
    for rows in got.values():
        assert not any("evil" in json.dumps(r) for r in rows), rows
    assert got[GPU[3]] == []
    assert [(r["what"], r["source"]) for r in got[GPU[1]]] == [
        ("evicted (evicted)", "controller ctl-0"),
        ("DeviceTainted", f"{CONTROLLER} on DeviceTaintRule/dh-gpu-1"),
        ("DeviceTaintEviction", "pod ml/train (Event in ml)"),
    ]
    assert _messages(got[GPU[1]])[0].startswith("evicted pod ml/train")


async def test_a_tenants_claim_about_its_own_pod_shows_only_under_its_device(
    server: APIServer, client: AsyncClient, tmp_path: Path
) -> None:
    """A pod-namespace Event is a claim by that namespace: shown for a device its pod
    holds, with the pod as the source, and for no other device its message names."""
    await scenario(client)
    pod = await client.get(Pod, "infer", namespace="ml")  # holds gpu-0
    infer = {"kind": "Pod", "namespace": "ml", "name": "infer", "apiVersion": "v1",
             "uid": pod.metadata.uid if pod.metadata else ""}  # fmt: skip
    message = f"device {GPU[0]} of pod ml/infer is Unhealthy; so is {GPU[1]}"
    await client.create(_event("c1", "ml", AGENT, "DeviceUnhealthy", message, infer))
    kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
    sources: dict[str, list[str]] = {}
    for device in (GPU[0], GPU[1]):
        out = await asyncio.to_thread(
            run, "history", "--kubeconfig", kubeconfig, device, "-o", "json",
            "--controller-namespace", "default",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        sources[device] = [r["source"] for r in json.loads(out.stdout)]
    assert sources == {GPU[0]: ["pod ml/infer (Event in ml)"], GPU[1]: []}


def test_history_source_takes_a_pod_event_only_from_the_pod_holding_the_device() -> None:
    from drahealth.core import Consumer
    from drahealth.remedy import history_source

    def ev(ns: str, obj: dict[str, Any], component: str = CONTROLLER) -> dict[str, Any]:
        e = _event("x", ns, component, "DeviceTaintEviction", f"evicted {GPU[1]}", obj)
        return e.to_dict()

    train = {"kind": "Pod", "namespace": "ml", "name": "train", "uid": "u1"}
    holder = [Consumer("ml", "train", "u1", NODE, "train-gpu", "gpu")]
    assert history_source(ev("ml", train), GPU[1], "ctl", holder) == "pod ml/train (Event in ml)"
    assert history_source(ev("ml", train), GPU[1], "ctl", []) is None  # holds nothing
    assert history_source(ev("ml", train), GPU[2], "ctl", holder) is None  # not named
    older = {**train, "uid": "u0"}  # an earlier pod of the same name
    assert history_source(ev("ml", older), GPU[1], "ctl", holder) is None
    rule = {"kind": "DeviceTaintRule", "name": "dh-gpu-1"}
    assert history_source(ev("ctl", rule), GPU[1], "ctl", []) == (
        f"{CONTROLLER} on DeviceTaintRule/dh-gpu-1"
    )
    assert history_source(ev("ml", rule), GPU[1], "ctl", holder) is None  # not its place
    assert history_source(ev("ml", train, "someone"), GPU[1], "ctl", holder) is None


def test_events_about_rules_and_nodes_in_default_are_the_controllers_only_where_it_runs() -> None:
    """The API server keeps Events about cluster-scoped objects in ``default``: there the
    controller's are the controller's word only when it runs in ``default``; otherwise
    anyone who may create Events in ``default`` could have written them, so they are
    shown as Events in ``default``, never as the controller's."""
    from drahealth.remedy import history_source, recorded_by

    def ev(ns: str, obj: dict[str, Any], component: str = CONTROLLER) -> dict[str, Any]:
        return _event("x", ns, component, "DeviceTainted", f"tainted {GPU[1]}", obj).to_dict()

    rule = {"kind": "DeviceTaintRule", "name": "dh-gpu-1"}
    node = {"kind": "Node", "name": NODE}
    ctl = "drahealth-system"
    assert recorded_by(ev("default", rule), ctl) == "controller"
    assert history_source(ev("default", rule), GPU[1], ctl, []) == (
        "DeviceTaintRule/dh-gpu-1 (Event in default)"
    )
    assert history_source(ev("default", node), GPU[1], ctl, []) == f"Node/{NODE} (Event in default)"
    assert history_source(ev("default", rule), GPU[2], ctl, []) is None  # not named
    # the controller runs in default: its Events there are its word
    assert history_source(ev("default", rule), GPU[1], "default", []) == (
        f"{CONTROLLER} on DeviceTaintRule/dh-gpu-1"
    )
    # its namespace keeps its word (Events an older controller wrote there)
    assert history_source(ev(ctl, rule), GPU[1], ctl, []) == (
        f"{CONTROLLER} on DeviceTaintRule/dh-gpu-1"
    )
    # nowhere else, and only about rules and nodes
    assert recorded_by(ev("kube-system", rule), ctl) is None
    assert recorded_by(ev("ml", node), ctl) is None
    other = {"kind": "ConfigMap", "name": "x", "namespace": "default"}
    assert recorded_by(ev("default", other), ctl) is None
    assert recorded_by(ev("default", {"kind": "Namespace", "name": "ml"}), ctl) is None
    assert recorded_by(ev("default", rule, "someone"), ctl) is None


async def test_the_cli_history_shows_events_in_default_with_their_source(
    server: APIServer, client: AsyncClient, tmp_path: Path
) -> None:
    """Controller in drahealth-system: its history ConfigMap is its word; an Event in
    default about a rule (its own, or one a tenant wrote there) is shown as an Event in
    default, never as the controller's."""
    await scenario(client)
    ctl = "drahealth-system"
    await client.create(Namespace.from_dict({"metadata": {"name": ctl}}))  # type: ignore[call-overload]
    history = [{"time": "2026-11-22T09:59:00Z", "by": "ctl-0", "action": "create",
                "subject": GPU[1], "message": f"tainted {GPU[1]}"}]  # fmt: skip
    await client.create(
        ConfigMap.from_dict(  # type: ignore[call-overload]
            {
                "metadata": {"name": "drahealth-remediation-history", "namespace": ctl},
                "data": {"history": json.dumps(history)},
            }
        )
    )
    rule = {"kind": "DeviceTaintRule", "name": "dh-gpu-1", "apiVersion": "resource.k8s.io/v1"}
    await client.create(
        _event("d1", "default", CONTROLLER, "DeviceTainted", f"tainted {GPU[1]}", rule)
    )
    kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
    out = await asyncio.to_thread(
        run, "history", "--kubeconfig", kubeconfig, GPU[1], "-o", "json",
        "--controller-namespace", ctl,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert [(r["what"], r["source"]) for r in json.loads(out.stdout)] == [
        ("create", "controller ctl-0"),
        ("DeviceTainted", "DeviceTaintRule/dh-gpu-1 (Event in default)"),
    ]
