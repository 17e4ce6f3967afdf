"""The remediation controller on each release profile of the embedded API server.

Without the DeviceTaintRule API (1.35 with its defaults) ``auto`` fences the one bad
device with a quarantine claim (once its pod has let go of it), or, as asked, taints or
cordons the node; it evicts only the bad device's consumer as its budget allows and
undoes exactly its own writes after recovery; report-only writes nothing; where rules are
served they are written at the served version; an over-broad rule never makes it evict; a vanished
version is rediscovered instead of retried in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.core import DeviceKey, kube_profile
from drahealth.kube import ServedAPIs, make_client, resource_class
from drahealth.remedy import _controller
from drahealth.remedy._controller import HISTORY_CONFIGMAP, RemediationController
from drahealth.remedy._nodes import ANNOTATION_CORDONED, ANNOTATION_DEVICES, NodeDevice
from drahealth.remedy._quarantine import ANNOTATION_QUARANTINE, claim_body, claim_name
from tests._support import eventually
from tests.integration.remedy.test_controller import NODE, make_pod, policy, set_health

pytestmark = pytest.mark.timeout(60)

RULES = """- name: xid
  match: {driver: gpu.example.com, message: "XID"}
  action: {effect: NoExecute, taintValue: xid}
  recovery: {healthyFor: 0.5s}
- name: any
  match: {driver: gpu.example.com}
  action: {effect: NoSchedule}
  recovery: {healthyFor: 0.5s}
"""
FOREIGN = {"key": "ops/maintenance", "value": "planned", "effect": "NoSchedule"}


@asynccontextmanager
async def cluster(version: str, **gates: bool) -> AsyncIterator[tuple[AsyncClient, list[str]]]:
    """An API server of the release, a client, and the paths the client asked for."""
    srv = APIServer(data_file=None, watch_window=1000, profile=kube_profile(version, gates))
    await srv.start(host="127.0.0.1", port=0)
    client = make_client(server_url=srv.url, timeout=5.0)
    paths: list[str] = []

    async def note(request: Any) -> None:
        paths.append(request.url.path)

    client._client._client.event_hooks["request"].append(note)
    try:
        yield client, paths
    finally:
        await client.close()
        await srv.stop()


@asynccontextmanager
async def running(
    client: AsyncClient, text: str, extra: str = "", **kw: Any
) -> AsyncIterator[RemediationController]:
    controller = RemediationController(client, policy(text, extra), identity="c1", **kw)
    task = asyncio.create_task(controller.run())
    try:
        await eventually(lambda: _true(controller.synced), 10.0, "the controller to sync")
        yield controller
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _true(value: bool) -> bool:
    return value


async def make_node(client: AsyncClient, name: str = NODE, **spec: Any) -> None:
    await client.create(Node.from_dict({"metadata": {"name": name}, "spec": spec}))


async def node_dict(client: AsyncClient, name: str = NODE) -> dict[str, Any]:
    out = (await client.get(Node, name)).to_dict()
    assert isinstance(out, dict)
    return out


async def events(client: AsyncClient, reason: str) -> list[Any]:
    return [e async for e in client.list(Event, namespace="default") if e.reason == reason]


async def pod_names(client: AsyncClient) -> set[str]:
    return {str(p.metadata.name) async for p in client.list(Pod, namespace="default")}


async def test_node_taint_without_the_rule_api_end_to_end(caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="drahealth.remedy._controller")
    async with cluster("1.35") as (client, paths):
        await make_node(client, taints=[FOREIGN])
        await set_health(client, gpu_0="Healthy", gpu_1="Healthy")
        await make_pod(client, "victim", "gpu-0", {"app": "victim"})
        await make_pod(client, "bystander", "gpu-1", {"app": "bystander"})
        pdb = {
            "metadata": {"name": "victim", "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "victim"}}},
        }
        await client.create(PodDisruptionBudget.from_dict(pdb))
        extra = "remediation: {fallback: node-taint}\neviction: {perSecond: 20}\n"
        async with running(client, RULES, extra) as controller:
            assert controller.choice is not None and controller.choice.mode == "node-taint"
            assert controller.rules is None
            assert (
                "remediation mode: node-taint (auto: the server serves no DeviceTaintRule API, "
                "so node-taint)" in caplog.text
            )
            gauge = controller.metrics.mode.labels("node-taint")._value.get()  # type: ignore[attr-defined]
            assert gauge == 1
            cm = await client.get(ConfigMap, HISTORY_CONFIGMAP, namespace="default")
            mode = json.loads((cm.data or {})["mode"])
            assert mode["mode"] == "node-taint" and mode["deviceTaintRuleAPI"] is None
            assert mode["serverVersion"].startswith("v1.35")
            assert await events(client, "RemediationMode")

            await set_health(client, gpu_0=("Unhealthy", "XID 79"))

            async def tainted() -> dict[str, Any] | None:
                n = await node_dict(client)
                return n if len(n["spec"].get("taints") or []) == 2 else None

            n = await eventually(tainted, 5.0, "the node taint")
            assert n["spec"]["taints"] == [
                FOREIGN,
                {"key": "drahealth.io/unhealthy", "value": "gpu-0", "effect": "NoSchedule"},
            ]
            (row,) = json.loads(n["metadata"]["annotations"][ANNOTATION_DEVICES])
            assert row["device"] == f"gpu.example.com/{NODE}/gpu-0" and "XID 79" in row["reason"]
            await eventually(
                lambda: events(client, "EvictionBlocked"), 5.0, "the budget to hold the victim"
            )
            assert await pod_names(client) == {"victim", "bystander"}
            await client.patch(
                PodDisruptionBudget, "victim", {"spec": {"minAvailable": 0}},
                namespace="default", patch_type=PatchType.MERGE,
            )  # fmt: skip

            async def victim_gone() -> bool:
                return await pod_names(client) == {"bystander"}

            await eventually(victim_gone, 15.0, "only the victim to be evicted")
            # recovery: the taint and annotation go, the operator's taint stays
            await set_health(client, gpu_0="Healthy")

            async def clean() -> dict[str, Any] | None:
                n = await node_dict(client)
                return n if n["spec"].get("taints") == [FOREIGN] else None

            n = await eventually(clean, 5.0, "the node taint to be removed after recovery")
            # the record says what was written, device by device, to the end
            key = f"gpu.example.com/{NODE}/gpu-0"
            untainted = await eventually(
                lambda: events(client, "NodeUntainted"), 5.0, "the NodeUntainted Event"
            )
            assert f"{key} recovered" in untainted[0].message, untainted[0].message
            cm = await client.get(ConfigMap, HISTORY_CONFIGMAP, namespace="default")
            said = [h["message"] for h in json.loads((cm.data or {}).get("history", "[]"))]
            assert any(f"{key} recovered" in m and "removed node taint" in m for m in said)
            assert not any("updated the unhealthy-devices annotation" in m for m in said), said
            (evicted,) = await events(client, "DeviceTaintEviction")
            assert (
                f"node {NODE} is tainted drahealth.io/unhealthy=gpu-0:NoSchedule" in evicted.message
            ), evicted.message
            assert "is tainted drahealth.io/unhealthy=xid:NoExecute" not in evicted.message
            assert ANNOTATION_DEVICES not in (n["metadata"].get("annotations") or {})
            assert await pod_names(client) == {"bystander"}
    # no request ever went to a DeviceTaintRule endpoint the server does not serve
    assert not [p for p in paths if "devicetaintrules" in p], paths


ResourceClaim = resource_class("ResourceClaim", "v1")


async def claim_dict(client: AsyncClient, name: str) -> dict[str, Any] | None:
    try:
        out = (await client.get(ResourceClaim, name, namespace="default")).to_dict()
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise
    assert isinstance(out, dict)
    return out


@pytest.mark.parametrize(
    "version",
    [
        pytest.param("1.34", marks=pytest.mark.slow),
        "1.35",
        pytest.param("1.36", marks=pytest.mark.slow),
    ],
)
async def test_quarantine_fences_one_device_after_its_pod_let_go(caplog: Any, version: str) -> None:
    """auto without the rule API: the bad device's pod is evicted (budget honoured), the
    device gets an allocated quarantine claim only once the pod's claim let go, the node
    is left alone, and recovery deallocates then deletes the claim; a restarted
    controller resumes the quarantine without writing it again."""
    caplog.set_level(logging.INFO, logger="drahealth.remedy._controller")
    key = DeviceKey("gpu.example.com", NODE, "gpu-0")
    name = claim_name(key)
    async with cluster(version) as (client, paths):
        await make_node(client, taints=[FOREIGN])
        await set_health(client, gpu_0="Healthy", gpu_1="Healthy")
        await make_pod(client, "victim", "gpu-0", {"app": "victim"})
        await make_pod(client, "bystander", "gpu-1", {"app": "bystander"})
        async with running(client, RULES, "eviction: {perSecond: 20}\n") as controller:
            assert controller.choice is not None and controller.choice.mode == "quarantine"
            assert "auto: the server serves no DeviceTaintRule API, so quarantine" in caplog.text
            await set_health(client, gpu_0=("Unhealthy", "XID 79"))

            async def victim_gone() -> bool:
                return await pod_names(client) == {"bystander"}

            await eventually(victim_gone, 15.0, "only the victim to be evicted")
            (evicted,) = await events(client, "DeviceTaintEviction")
            assert f"claim default/{name} quarantines it once no other claim holds it" in (
                evicted.message
            ), evicted.message
            # the victim's claim still holds the device: the quarantine waits for it
            await eventually(
                lambda: events(client, "DeviceQuarantineWaiting"), 5.0, "the waiting Event"
            )
            assert await claim_dict(client, name) is None
            # what the resourceclaim controller does once the pod is gone
            await client.patch(
                ResourceClaim.Status, "victim-gpu",
                {"status": {"allocation": None, "reservedFor": None}},
                namespace="default", patch_type=PatchType.MERGE,
            )  # fmt: skip

            async def fenced() -> dict[str, Any] | None:
                c = await claim_dict(client, name)
                return c if c and (c.get("status") or {}).get("allocation") else None

            claim = await eventually(fenced, 5.0, "the quarantine claim allocated")
            results = claim["status"]["allocation"]["devices"]["results"]
            assert results == [
                {"request": "device", "driver": key.driver, "pool": key.pool, "device": "gpu-0"}
            ]
            (consumer,) = claim["status"]["reservedFor"]
            assert consumer == {
                "apiGroup": "drahealth.io", "resource": "devicequarantines", "name": name,
                "uid": claim["metadata"]["uid"],
            }  # fmt: skip
            row = json.loads(claim["metadata"]["annotations"][ANNOTATION_QUARANTINE])
            assert row["device"] == str(key) and "XID 79" in row["reason"]
            assert row["mode"] == "quarantine" and row["by"] == "c1"
            assert (await node_dict(client))["spec"]["taints"] == [FOREIGN]  # node untouched
            await eventually(lambda: events(client, "DeviceQuarantined"), 5.0, "the Event")
        version = claim["metadata"]["resourceVersion"]
        # a new leader resumes the quarantine from the claim: nothing is written again
        async with running(client, RULES, "eviction: {perSecond: 20}\n") as controller:
            await asyncio.sleep(1.0)
            again = await claim_dict(client, name)
            assert again is not None and again["metadata"]["resourceVersion"] == version
            assert controller.quarantine.written().keys() == {key}
            await set_health(client, gpu_0="Healthy")
            await eventually(
                lambda: _none(claim_dict(client, name)), 5.0, "the claim released after recovery"
            )
            await eventually(lambda: events(client, "DeviceReleased"), 5.0, "DeviceReleased")
            cm = await client.get(ConfigMap, HISTORY_CONFIGMAP, namespace="default")
            actions = [h["action"] for h in json.loads((cm.data or {}).get("history", "[]"))]
            assert "quarantine-quarantined" in actions and "quarantine-released" in actions
    assert not [p for p in paths if "devicetaintrules" in p], paths


async def test_an_operators_waiting_quarantine_claim_is_finished_once_the_device_is_free() -> None:
    """``drahealth taint`` on a device in use leaves its claim unallocated; the controller
    allocates it once the pod's claim lets go, and never releases it."""
    key = DeviceKey("gpu.example.com", NODE, "gpu-0")
    name = claim_name(key, operator=True)
    row = NodeDevice(
        key, "quarantine", "ops/broken", "yes", "NoSchedule", "operator", by="operator"
    )
    async with cluster("1.35") as (client, _paths):
        await make_node(client)
        await make_pod(client, "user", "gpu-0", {"app": "user"})
        await client.create(ResourceClaim.from_dict(claim_body(row, "default", operator=True)))
        async with running(client, RULES) as controller:
            assert controller.choice is not None and controller.choice.mode == "quarantine"
            await asyncio.sleep(0.5)
            c = await claim_dict(client, name)
            assert c is not None and not (c.get("status") or {}).get("allocation")
            await client.patch(
                ResourceClaim.Status, "user-gpu",
                {"status": {"allocation": None, "reservedFor": None}},
                namespace="default", patch_type=PatchType.MERGE,
            )  # fmt: skip

            async def allocated() -> dict[str, Any] | None:
                c = await claim_dict(client, name)
                return c if c and (c.get("status") or {}).get("allocation") else None

            c = await eventually(allocated, 5.0, "the operator's claim allocated")
            assert c["status"]["reservedFor"][0]["name"] == name
            await asyncio.sleep(0.5)  # healthy everywhere: still never released
            assert await claim_dict(client, name) is not None


@pytest.mark.parametrize(("fallback", "fenced"), [("node-taint", False), ("quarantine", True)])
async def test_the_breaker_counts_every_device_a_node_taint_fences(
    fallback: str, fenced: bool
) -> None:
    """With at most half the node's two GPUs fenced, a node taint (both GPUs) is held by
    the circuit breaker, while a quarantine (one GPU) goes ahead."""
    extra = f"remediation: {{fallback: {fallback}}}\nlimits: {{cluster: 50%}}\n"
    async with cluster("1.35") as (client, _paths):
        await make_node(client)
        await set_health(client, gpu_0="Healthy", gpu_1="Healthy")
        async with running(client, RULES, extra) as controller:
            assert controller.choice is not None and controller.choice.mode == fallback
            await set_health(client, gpu_0=("Unhealthy", "XID 79"), gpu_1="Healthy")
            key = DeviceKey("gpu.example.com", NODE, "gpu-0")

            async def decided() -> bool:
                return bool(controller.breaker.breaker.held) or bool(
                    controller.quarantine.written()
                )

            await eventually(decided, 5.0, "the breaker's decision")
            assert (key in controller.quarantine.written()) is fenced
            assert (key in controller.breaker.breaker.held) is not fenced
            if not fenced:
                assert not (await node_dict(client))["spec"].get("taints")
                await eventually(
                    lambda: events(client, "RemediationPaused"), 5.0, "RemediationPaused"
                )


async def _none(value: Any) -> bool:
    return (await value) is None


async def test_cordon_never_uncordons_an_operator_cordoned_node() -> None:
    async with cluster("1.36") as (client, _):
        await make_node(client)  # node-1: drahealth cordons and uncordons it
        await make_node(client, "node-2", unschedulable=True)  # the operator's cordon
        rows = [{"driver": "gpu.example.com", "pool": "node-2", "device": "gpu-0",
                 "health": "Unhealthy", "message": "ECC"}]  # fmt: skip
        other = {
            "metadata": {
                "name": "drahealth-devices-node-2", "namespace": "default",
                "labels": {"app.kubernetes.io/component": "device-health",
                           "app.kubernetes.io/managed-by": "drahealth-agent",
                           "drahealth.io/node": "node-2"},
            },
            "data": {"devices": json.dumps(rows)},
        }  # fmt: skip
        await set_health(client, gpu_0=("Unhealthy", "ECC"))
        await client.create(ConfigMap.from_dict(other))
        async with running(client, RULES, "remediation: {fallback: cordon}\n") as controller:
            assert controller.choice is not None and controller.choice.mode == "cordon"

            async def cordoned() -> bool:
                n = await node_dict(client)
                return bool(n["spec"].get("unschedulable"))

            await eventually(cordoned, 5.0, "drahealth's cordon of node-1")
            n2 = await node_dict(client, "node-2")
            await eventually(
                lambda: _listed(client, "node-2"), 5.0, "node-2's devices to be listed"
            )
            assert ANNOTATION_CORDONED not in (n2["metadata"].get("annotations") or {})
            await set_health(client, gpu_0="Healthy")
            rows[0]["health"] = "Healthy"
            await client.patch(
                ConfigMap, "drahealth-devices-node-2", {"data": {"devices": json.dumps(rows)}},
                namespace="default", patch_type=PatchType.MERGE,
            )  # fmt: skip

            async def uncordoned() -> bool:
                return not await cordoned()

            await eventually(uncordoned, 5.0, "node-1 uncordoned after recovery")
            await eventually(lambda: _listed(client, "node-2", False), 5.0, "node-2 cleared")
            assert (await node_dict(client, "node-2"))["spec"]["unschedulable"] is True


async def _listed(client: AsyncClient, name: str, want: bool = True) -> bool:
    n = await node_dict(client, name)
    return (ANNOTATION_DEVICES in (n["metadata"].get("annotations") or {})) == want


async def test_report_only_writes_nothing_to_nodes_or_pods() -> None:
    async with cluster("1.37") as (client, _):
        await make_node(client)
        await set_health(client, gpu_0="Healthy")
        await make_pod(client, "victim", "gpu-0", {"app": "victim"})
        before = await node_dict(client)
        async with running(client, RULES, "eviction: {mode: evict}\n", mode="report-only") as c:
            await set_health(client, gpu_0=("Unhealthy", "XID 79"))
            (event,) = await eventually(
                lambda: events(client, "DeviceWouldBeTainted"), 5.0, "a report"
            )
            assert "would be tainted drahealth.io/unhealthy=xid:NoExecute" in event.message
            passes = c.passes
            await eventually(lambda: _true(c.passes >= passes + 3), 5.0)
            after = await node_dict(client)
            # only the DRADevicesHealthy condition, information written in every mode
            assert after["spec"] == before["spec"]
            assert after["metadata"].get("annotations") == before["metadata"].get("annotations")
            assert [c["type"] for c in after["status"]["conditions"]] == ["DRADevicesHealthy"]
            assert await pod_names(client) == {"victim"}
            rules = resource_class("DeviceTaintRule", "v1")
            assert [r async for r in client.list(rules)] == []
            assert c.evictor.evicted == 0


@pytest.mark.parametrize(
    ("version", "gates", "api"),
    [
        ("1.34", {"DRADeviceTaints": True}, "v1alpha3"),
        ("1.36", {"DRADeviceTaintRules": True}, "v1beta2"),
        ("1.37", {}, "v1"),
    ],
)
async def test_rules_are_written_at_the_served_version(
    version: str, gates: dict[str, bool], api: str
) -> None:
    async with cluster(version, **gates) as (client, paths):
        await set_health(client, gpu_0="Healthy")
        async with running(client, RULES) as controller:
            assert controller.choice is not None and controller.choice.mode == "taint-rules"
            await set_health(client, gpu_0=("Unhealthy", "XID 79"))
            cls = resource_class("DeviceTaintRule", api)

            async def written() -> list[Any]:
                return [r async for r in client.list(cls)]

            (rule,) = await eventually(written, 5.0, f"a {api} rule")
            assert rule.spec.deviceSelector.device == "gpu-0"
            assert rule.spec.taint.effect == "NoExecute"
            (event,) = await eventually(lambda: events(client, "DeviceTainted"), 5.0)
            assert event.involvedObject.apiVersion == f"resource.k8s.io/{api}"
    assert all(f"/{api}/" in p for p in paths if "devicetaintrules" in p)


async def test_an_empty_selector_rule_causes_no_eviction_and_one_warning() -> None:
    async with cluster("1.37") as (client, _):
        await set_health(client, gpu_0="Healthy")
        await make_pod(client, "victim", "gpu-0", {"app": "victim"})
        cls = resource_class("DeviceTaintRule", "v1")
        wide = {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": "everything"},
            "spec": {"deviceSelector": {}, "taint": {"key": "k", "effect": "NoExecute"}},
        }  # fmt: skip
        await client.create(cls.from_dict(wide))
        async with running(client, RULES, "eviction: {mode: evict, perSecond: 20}\n") as c:
            (warning,) = await eventually(
                lambda: events(client, "OverBroadDeviceTaintRule"), 5.0, "the warning"
            )
            assert "everything" in warning.message and "#141422" in warning.message
            assert warning.type == "Warning"
            passes = c.passes
            await set_health(client, gpu_0=("Unhealthy", "ECC"))  # a NoSchedule rule only
            await eventually(lambda: _true(c.passes >= passes + 3), 5.0)
            assert len(await events(client, "OverBroadDeviceTaintRule")) == 1
            assert c.evictor.evicted == 0 and not await events(client, "DeviceTaintEviction")
            assert await pod_names(client) == {"victim"}


async def test_a_vanished_version_is_rediscovered_not_retried(monkeypatch: Any) -> None:
    """The first discovery says v1beta2 (as before an upgrade); the 1.37 server answers
    404 there: the controller asks again and continues at v1, with no 404 loop."""
    real = _controller.discover
    calls: list[ServedAPIs] = []

    async def stale_then_real(client: AsyncClient) -> ServedAPIs:
        served = await real(client)
        if not calls:
            served = ServedAPIs({**served.versions, "DeviceTaintRule": ("v1beta2",)}, "v1.36.0")
        calls.append(served)
        return served

    monkeypatch.setattr(_controller, "discover", stale_then_real)
    async with cluster("1.37") as (client, paths):
        await set_health(client, gpu_0="Healthy")
        async with running(client, RULES) as controller:
            assert controller.discoveries == 2 and controller._rules_api == "resource.k8s.io/v1"
            await set_health(client, gpu_0=("Unhealthy", "XID 79"))
            cls = resource_class("DeviceTaintRule", "v1")

            async def written() -> list[Any]:
                return [r async for r in client.list(cls)]

            await eventually(written, 5.0, "a v1 rule after rediscovery")
    stale = [p for p in paths if "/v1beta2/devicetaintrules" in p]
    assert 1 <= len(stale) <= 2, stale


QUARANTINE_RULE = """- name: xid
  match: {driver: gpu.example.com}
  action: {effect: NoSchedule}
  recovery: {healthyFor: 0.5s}
"""


async def test_quarantine_obeys_holds_and_the_opt_out_label(tmp_path: Any) -> None:
    """``untaint --hold`` releases the quarantine and keeps it away until the hold ends;
    a node opted out keeps its quarantine as it is, even past recovery, until the label
    goes."""
    from click.testing import CliRunner

    from drahealth.cli.taint import untaint_command

    key = DeviceKey("gpu.example.com", NODE, "gpu-0")
    name = claim_name(key)
    srv = APIServer(data_file=None, watch_window=1000, profile=kube_profile("1.35", {}))
    await srv.start(host="127.0.0.1", port=0)
    kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
    client = make_client(server_url=srv.url, timeout=5.0)

    async def fenced() -> bool:
        c = await claim_dict(client, name)
        return bool(c and (c.get("status") or {}).get("allocation"))

    async def gone() -> bool:
        return await claim_dict(client, name) is None

    try:
        await make_node(client)
        await set_health(client, gpu_0="Healthy")
        async with running(client, QUARANTINE_RULE) as controller:
            assert controller.choice is not None and controller.choice.mode == "quarantine"
            await set_health(client, gpu_0=("Unhealthy", "XID 79"))
            await eventually(fenced, 5.0, "the quarantine")
            args = [
                "--kubeconfig", str(kubeconfig), str(key), "--key", "drahealth.io/unhealthy",
                "--hold", "2s", "--by", "alice",
            ]  # fmt: skip
            result = await asyncio.to_thread(CliRunner().invoke, untaint_command, args)
            assert result.exit_code == 0, result.output
            await eventually(gone, 5.0, "the quarantine released for the hold")
            await asyncio.sleep(1.0)  # still bad, still held: not fenced again
            assert await claim_dict(client, name) is None
            await eventually(fenced, 6.0, "the quarantine back after the hold")
            # opt-out: frozen as it is, even past its recovery
            await client.patch(
                Node, NODE, {"metadata": {"labels": {"drahealth.io/remediation": "disabled"}}},
                patch_type=PatchType.MERGE,
            )  # fmt: skip
            await eventually(lambda: _true(NODE in controller.ownership.opted_out), 5.0, "label")
            await set_health(client, gpu_0="Healthy")
            await asyncio.sleep(1.2)  # past healthyFor: a release would be due
            assert await fenced()
            await client.patch(
                Node, NODE, {"metadata": {"labels": {"drahealth.io/remediation": None}}},
                patch_type=PatchType.MERGE,
            )  # fmt: skip
            await eventually(gone, 5.0, "the release once the label is gone")
    finally:
        await client.close()
        await srv.stop()
