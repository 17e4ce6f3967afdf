"""The remediation controller in process against the embedded API server.

Device health is written the way node agents write it (the ``drahealth-devices-<node>``
ConfigMap) or the way a kubelet writes it (pod ``allocatedResourcesStatus``); pods use
devices through allocated ResourceClaims. Short durations keep it fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceClaim
from lightkube.types import PatchType

from drahealth.core._policy import Policy
from drahealth.remedy._controller import HISTORY_CONFIGMAP, RemediationController
from drahealth.remedy._policy_load import parse_policy
from drahealth.remedy._rules import DeviceRef, rule_body
from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(60)

DRIVER, NODE = "gpu.example.com", "node-1"
HEAD = "apiVersion: drahealth.io/v1\nkind: RemediationPolicy\n"


def policy(rules: str, extra: str = "") -> Policy:
    return parse_policy(HEAD + extra + "rules:\n" + rules, "test-policy")


async def set_health(client: AsyncClient, **devices: str | tuple[str, str]) -> None:
    """Write the node's device-health record: gpu_0="Unhealthy" or ("Unhealthy", "msg")."""
    rows = []
    for name, value in sorted(devices.items()):
        health, message = value if isinstance(value, tuple) else (value, "")
        rows.append(
            {"driver": DRIVER, "pool": NODE, "device": name.replace("_", "-"),
             "health": health, "message": message, "since": time.time()}
        )  # fmt: skip
    body = {
        "metadata": {
            "name": f"drahealth-devices-{NODE}",
            "namespace": "default",
            "labels": {
                "app.kubernetes.io/component": "device-health",
                "app.kubernetes.io/managed-by": "drahealth-agent",
                "drahealth.io/node": NODE,
            },
        },
        "data": {"devices": json.dumps(rows)},
    }
    try:
        await client.patch(
            ConfigMap, body["metadata"]["name"], {"data": body["data"]}, namespace="default",
            patch_type=PatchType.MERGE,
        )  # fmt: skip
    except Exception:
        await client.create(ConfigMap.from_dict(body))


async def make_pod(client: AsyncClient, name: str, device: str, labels: dict[str, str]) -> None:
    claim = {
        "metadata": {"name": f"{name}-gpu", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
    }
    await client.create(ResourceClaim.from_dict(claim))
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    await client.patch(
        ResourceClaim.Status, f"{name}-gpu",
        {"status": {"allocation": {"devices": {"results": [result]}}}},
        namespace="default", patch_type=PatchType.MERGE,
    )  # fmt: skip
    pod = {
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
            "containers": [
                {"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }
    await client.create(Pod.from_dict(pod))
    await client.patch(
        Pod.Status, name, {"status": {"phase": "Running"}}, namespace="default",
        patch_type=PatchType.MERGE,
    )  # fmt: skip


async def rules(client: AsyncClient) -> dict[str, Any]:
    return {str(r.metadata.name): r async for r in client.list(DeviceTaintRule) if r.metadata}


@asynccontextmanager
async def running(
    client: AsyncClient, p: Policy, identity: str = "c1"
) -> AsyncIterator[RemediationController]:
    controller = RemediationController(client, p, identity=identity)
    task = asyncio.create_task(controller.run())
    try:
        yield controller
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


RULE = """- name: xid
  match: {driver: gpu.example.com, message: "XID"}
  action: {effect: NoExecute, taintValue: xid}
  recovery: {healthyFor: 1s}
- name: any
  match: {driver: gpu.example.com}
  action: {effect: NoSchedule}
  recovery: {healthyFor: 1s}
"""


async def test_taint_follows_health_and_recovery_removes_only_its_own_rules(
    client: AsyncClient,
) -> None:
    foreign = rule_body(
        DeviceRef(DRIVER, NODE, "gpu-0"), key="ops/x", value="", effect="NoSchedule"
    )
    foreign["metadata"] = {"name": "ops-maintenance", "labels": {"team": "ops"}}
    await client.create(DeviceTaintRule.from_dict(foreign))  # type: ignore[call-overload]
    await set_health(client, gpu_0="Healthy", gpu_1="Healthy")
    async with running(client, policy(RULE)) as controller:
        await eventually(lambda: _ge(controller.passes, 1))
        t0 = time.monotonic()
        await set_health(client, gpu_0=("Unhealthy", "XID 79"), gpu_1=("Unhealthy", "ECC"))

        async def two_rules() -> dict[str, Any]:
            found = {n: r for n, r in (await rules(client)).items() if n.startswith("dh-")}
            return found if len(found) == 2 else {}

        ours = await eventually(two_rules, 2.0, "two controller rules")
        took = time.monotonic() - t0
        assert took < 1.0, took
        effects = sorted(
            (r.spec.deviceSelector.device, r.spec.taint.effect, r.spec.taint.value)
            for r in ours.values()
        )
        assert effects == [("gpu-0", "NoExecute", "xid"), ("gpu-1", "NoSchedule", "unhealthy")]
        # recovery: Healthy for healthyFor (1 s) removes the controller's rules only
        await set_health(client, gpu_0="Healthy", gpu_1="Healthy")
        await asyncio.sleep(0.5)
        assert len([n for n in await rules(client) if n.startswith("dh-")]) == 2
        await eventually(
            lambda: _none_ours(client), 3.0, "recovery to remove the controller's rules"
        )
        assert "ops-maintenance" in await rules(client)

        async def actions() -> list[str]:
            cm = await client.get(ConfigMap, HISTORY_CONFIGMAP, namespace="default")
            return [h["action"] for h in json.loads((cm.data or {}).get("history", "[]"))]

        # the history is written at the end of the pass that deleted the rules
        await eventually(
            lambda: history_count(actions, "delete", 2), 3.0, "both deletions in the history"
        )
        assert (await actions()).count("create") == 2
        assert controller.metrics.reaction._sum.get() > 0  # type: ignore[attr-defined]


async def _none_ours(client: AsyncClient) -> bool:
    return not [n for n in await rules(client) if n.startswith("dh-")]


async def _ge(value: int, floor: int) -> bool:
    return value >= floor


async def test_pod_status_is_a_health_source_too(client: AsyncClient) -> None:
    await make_pod(client, "trainer", "gpu-3", {"app": "t"})
    entry = {
        "name": "claim:gpu",
        "resources": [
            {
                "resourceID": "k8s.gpu.example.com/claim=abc-gpu-3",
                "health": "Unhealthy",
                "message": "XID 48",
            }
        ],
    }
    status = {
        "containerStatuses": [
            {
                "name": "main",
                "ready": True,
                "restartCount": 0,
                "image": "x",
                "imageID": "",
                "allocatedResourcesStatus": [entry],
            }
        ]
    }
    async with running(client, policy(RULE)):
        await client.patch(
            Pod.Status,
            "trainer",
            {"status": status},
            namespace="default",
            patch_type=PatchType.MERGE,
        )

        async def tainted() -> list[Any]:
            return [
                r for r in (await rules(client)).values() if r.spec.deviceSelector.device == "gpu-3"
            ]

        (rule,) = await eventually(tainted, 2.0, "a rule for gpu-3")
        assert rule.spec.taint.effect == "NoExecute"


async def test_eviction_mode_waits_for_the_disruption_budget(client: AsyncClient) -> None:
    await set_health(client, gpu_2="Healthy")
    await make_pod(client, "web", "gpu-2", {"app": "web"})
    pdb = {
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
    }
    await client.create(PodDisruptionBudget.from_dict(pdb))
    p = policy(RULE, "eviction: {mode: evict, perSecond: 20}\n")
    async with running(client, p) as controller:
        await set_health(client, gpu_2=("Unhealthy", "XID 79"))

        async def blocked() -> list[Any]:
            return [
                e
                async for e in client.list(Event, namespace="default")
                if e.reason == "EvictionBlocked"
            ]

        events = await eventually(blocked, 5.0, "an EvictionBlocked event")
        (rule,) = [r for n, r in (await rules(client)).items() if n.startswith("dh-")]
        assert rule.spec.taint.effect == "NoSchedule"  # pods leave by evictions only
        assert "web" in events[0].message and "disruption budget" in events[0].message.lower()
        assert controller.evictor.blocked_pods()
        await client.get(Pod, "web", namespace="default")  # still there
        await client.patch(
            PodDisruptionBudget, "web", {"spec": {"minAvailable": 0}}, namespace="default",
            patch_type=PatchType.MERGE,
        )  # fmt: skip

        async def gone() -> bool:
            return not [
                p
                async for p in client.list(Pod, namespace="default")
                if p.metadata and p.metadata.name == "web"
            ]

        await eventually(gone, 15.0, "the pod to be evicted once the budget allows it")
        evicted = [
            e
            async for e in client.list(Event, namespace="default")
            if e.reason == "DeviceTaintEviction"
        ]
        assert len(evicted) == 1 and controller.evictor.evicted == 1


async def test_a_flapping_device_is_held_without_churn(client: AsyncClient) -> None:
    flappy = """- name: any
  match: {driver: gpu.example.com}
  action: {effect: NoSchedule, gracePeriod: 0.5s}
  hysteresis: {transitions: 5, window: 30s}
  recovery: {healthyFor: 0.2s}
"""
    await set_health(client, gpu_4="Healthy")
    async with running(client, policy(flappy)) as controller:
        await eventually(lambda: _ge(controller.passes, 1))
        for _ in range(5):  # 5 bad periods of 0.15 s: each shorter than the grace period
            await set_health(client, gpu_4="Unhealthy")
            await asyncio.sleep(0.15)
            await set_health(client, gpu_4="Healthy")
            await asyncio.sleep(0.15)
        await asyncio.sleep(1.0)  # healthy now for much longer than healthyFor
        ours = [n for n in await rules(client) if n.startswith("dh-")]
        assert len(ours) == 1, "a flapping device is held tainted"
        assert controller.metrics.actions.labels("create")._value.get() == 1  # type: ignore[attr-defined]
        assert controller.metrics.actions.labels("delete")._value.get() == 0  # type: ignore[attr-defined]
        assert "held" in controller.engine.explain(
            next(iter(controller.engine._devices)), time.monotonic()
        )


async def test_dry_run_writes_effect_none_with_an_impact_summary(client: AsyncClient) -> None:
    await set_health(client, gpu_5="Healthy")
    await make_pod(client, "batch", "gpu-5", {"app": "b"})
    async with running(client, policy(RULE, "dryRun: true\n")):
        await set_health(client, gpu_5=("Unhealthy", "XID 79"))

        async def summarized() -> Any:
            for r in (await rules(client)).values():
                conds = (r.status.conditions or []) if r.status else []
                if conds:
                    return r
            return None

        rule = await eventually(summarized, 3.0, "an impact summary")
        assert rule.spec.taint.effect == "None"
        (cond,) = rule.status.conditions
        assert cond.type == "EvictionInProgress" and cond.status == "False"
        assert "NoExecute would evict 1 pod(s) in namespace(s) default" in cond.message


async def test_a_restarted_controller_keeps_the_taint(client: AsyncClient) -> None:
    await set_health(client, gpu_6=("Unhealthy", "XID 79"))
    async with running(client, policy(RULE), "first"):
        await eventually(lambda: _count_ours(client, 1), 2.0, "the first taint")
    before = await rules(client)
    async with running(client, policy(RULE), "second") as second:
        await eventually(lambda: _ge(second.passes, 3), 3.0)
        assert await rules(client) == before  # nothing deleted, re-created or changed
        assert second.metrics.actions.labels("create")._value.get() == 0  # type: ignore[attr-defined]


async def history_has(read: Callable[[], Awaitable[list[str]]], text: str) -> bool:
    return any(text in m for m in await read())


async def history_count(read: Callable[[], Awaitable[list[str]]], text: str, n: int) -> bool:
    return (await read()).count(text) == n


async def _count_ours(client: AsyncClient, n: int) -> bool:
    return len([x for x in await rules(client) if x.startswith("dh-")]) == n


async def test_recovery_waits_for_the_validation_hook(client: AsyncClient, tmp_path: Any) -> None:
    flag = tmp_path / "passed"
    check = f'test -f {flag} && test "$DRAHEALTH_DEVICE" = gpu.example.com/node-1/gpu-7'
    hooked = f"""- name: any
  match: {{driver: gpu.example.com}}
  action: {{effect: NoSchedule}}
  recovery:
    healthyFor: 0.2s
    validate: {{exec: ["sh", "-c", {check!r}], timeout: 5s}}
"""
    await set_health(client, gpu_7=("Unhealthy", "ECC"))
    async with running(client, policy(hooked)) as controller:
        await eventually(lambda: _count_ours(client, 1), 2.0, "the taint")
        await set_health(client, gpu_7="Healthy")
        await asyncio.sleep(1.0)  # the hook fails (no flag file): the taint stays
        assert await _count_ours(client, 1)
        flag.write_text("ok")
        await eventually(lambda: _count_ours(client, 0), 3.0, "the untaint after the hook passed")

        async def history() -> list[str]:
            cm = await client.get(ConfigMap, HISTORY_CONFIGMAP, namespace="default")
            return [h["message"] for h in json.loads((cm.data or {}).get("history", "[]"))]

        # the history is written at the end of the pass that deleted the rule
        passed = "validation of gpu.example.com/node-1/gpu-7 passed"
        await eventually(
            lambda: history_has(history, passed), 3.0, "the passed validation in the history"
        )
        messages = await history()
        assert any(
            "validation of gpu.example.com/node-1/gpu-7 failed: exit 1" in m for m in messages
        )
        assert controller.engine.wants(time.monotonic()) == {}


async def test_health_records_not_written_by_an_agent_are_not_acted_on(
    client: AsyncClient,
) -> None:
    """A ConfigMap that looks like a device-health record but lacks the agent's labels or
    name (anyone with ConfigMap access could write one) never leads to a taint."""
    rows = [{"driver": DRIVER, "pool": NODE, "device": "gpu-5", "health": "Unhealthy",
             "message": "XID 79 (forged)", "since": time.time()}]  # fmt: skip
    forged = [
        ("forged-name", {"app.kubernetes.io/component": "device-health",
                         "app.kubernetes.io/managed-by": "drahealth-agent",
                         "drahealth.io/node": NODE}),
        (f"drahealth-devices-{NODE}", {"app.kubernetes.io/component": "device-health",
                                       "drahealth.io/node": NODE}),
    ]  # fmt: skip
    async with running(client, policy(RULE)) as controller:
        for name, labels in forged:
            await client.create(
                ConfigMap.from_dict(
                    {"metadata": {"name": name, "namespace": "default", "labels": labels},
                     "data": {"devices": json.dumps(rows)}}
                )
            )  # fmt: skip
        passes = controller.passes
        await eventually(lambda: _ge(controller.passes, passes + 2))
        assert not [n for n in await rules(client) if n.startswith("dh-")]
