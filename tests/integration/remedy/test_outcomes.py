"""Ignore and degraded rules and the burn-in gate, end to end on the embedded API server.

Device health is written the way node agents write it; devices are listed by a
ResourceSlice, and a device added to it after the controller started is a new device.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Node
from lightkube.resources.resource_v1 import ResourceSlice
from lightkube.types import PatchType

from drahealth.core import DeviceKey
from drahealth.remedy._controller import HISTORY_CONFIGMAP
from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client
from tests.integration.remedy.test_controller import NODE, policy, rules, running, set_health

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(60)

D = "gpu.example.com"
RULES = """- name: app-xid
  match: {driver: gpu.example.com, message: "XID (13|31|43|45|68)\\\\b"}
  action: {outcome: ignore}
- name: ecc
  match: {driver: gpu.example.com, message: corrected}
  action: {outcome: degraded}
- name: bad
  match: {driver: gpu.example.com}
  recovery: {healthyFor: 1s}
"""


async def state(client: AsyncClient, key: str) -> Any:
    try:
        cm = await client.get(ConfigMap, "drahealth-remediation-state", namespace="default")
    except Exception:
        return None
    text = (cm.data or {}).get(key)
    return None if text is None else json.loads(text)


async def events(client: AsyncClient, reason: str) -> list[Event]:
    return [e async for e in client.list(Event, namespace="default") if e.reason == reason]


async def history(client: AsyncClient) -> list[dict[str, Any]]:
    cm = await client.get(ConfigMap, HISTORY_CONFIGMAP, namespace="default")
    rows = json.loads((cm.data or {}).get("history", "[]"))
    assert isinstance(rows, list)
    return rows


async def slice_with(client: AsyncClient, *devices: str) -> None:
    body = {
        "metadata": {"name": f"{NODE}-{D}"},
        "spec": {
            "driver": D,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": d} for d in devices],
        },
    }
    try:
        await client.get(ResourceSlice, body["metadata"]["name"])
    except Exception:
        await client.create(Node.from_dict({"metadata": {"name": NODE}}))
        await client.create(ResourceSlice.from_dict(body))
        return
    await client.patch(
        ResourceSlice, body["metadata"]["name"], {"spec": body["spec"]},
        patch_type=PatchType.MERGE,
    )  # fmt: skip


def by_device(found: dict[str, Any]) -> dict[str, Any]:
    return {r.spec.deviceSelector.device: r for r in found.values() if r.spec}


async def test_an_ignored_xid_writes_nothing(client: AsyncClient) -> None:
    await set_health(client, gpu_0="Healthy", gpu_1="Healthy")
    async with running(client, policy(RULES)) as controller:
        await eventually(lambda: controller.passes >= 1, 5.0, "a first pass")
        # one record: gpu-0 with an application XID, gpu-1 with a fatal one
        await set_health(
            client, gpu_0=("Unhealthy", "XID 13: graphics engine exception"),
            gpu_1=("Unhealthy", "XID 79"),
        )  # fmt: skip

        async def gpu1_tainted() -> dict[str, Any]:
            return {k: v for k, v in by_device(await rules(client)).items() if k == "gpu-1"}

        await eventually(gpu1_tainted, 5.0, "gpu-1's rule (the same pass saw gpu-0)")
        assert "gpu-0" not in by_device(await rules(client))
        everything = [e async for e in client.list(Event, namespace="default")]
        assert not [e for e in everything if "gpu-0" in (e.message or "")]
        assert not [h for h in await history(client) if "gpu-0" in h["subject"]]
        assert not await state(client, "degraded")


async def test_a_degraded_device_is_shown_never_tainted(client: AsyncClient) -> None:
    await set_health(client, gpu_0="Healthy")
    async with running(client, policy(RULES)) as controller:
        await eventually(lambda: controller.passes >= 1, 5.0, "a first pass")
        await set_health(client, gpu_0=("Unhealthy", "corrected ECC errors above threshold"))

        async def degraded() -> Any:
            return await state(client, "degraded")

        shown = await eventually(degraded, 5.0, "the degraded state key")
        entry = shown[f"{D}/{NODE}/gpu-0"]
        assert (entry["rule"], entry["node"]) == ("ecc", NODE)
        assert entry["reason"] == "corrected ECC errors above threshold"
        assert entry["since"].endswith("Z")
        said = await eventually(
            lambda: events(client, "DeviceDegraded"), 5.0, "a DeviceDegraded Event"
        )
        assert said[0].involvedObject.kind == "Node" and said[0].involvedObject.name == NODE
        assert await rules(client) == {}
        # the same health again: no second Event
        await set_health(client, gpu_0=("Unhealthy", "corrected ECC errors above threshold"))
        await set_health(client, gpu_0="Healthy")

        async def cleared() -> bool:
            return await state(client, "degraded") == {}

        await eventually(cleared, 5.0, "the degraded entry to clear")
        await eventually(
            lambda: events(client, "DeviceNoLongerDegraded"), 5.0, "DeviceNoLongerDegraded"
        )
        assert len(await events(client, "DeviceDegraded")) == 1
        assert await rules(client) == {}


async def burn_in_entry(client: AsyncClient, device: str) -> Any:
    """The device's entry of the burnIn state key, or None: the state is written at the end
    of the pass that wrote the rule, so a reader waits for it."""
    return ((await state(client, "burnIn")) or {}).get(f"{D}/{NODE}/{device}")


def burn_in_policy(flag: Path) -> str:
    return (
        "burnIn:\n"
        f"  validate: {{exec: [sh, -c, 'test -e {flag}'], timeout: 5s}}\n"
        "  retryInitial: 100ms\n  retryMax: 300ms\n"
    )


async def test_a_new_device_burns_in_until_its_validation_passes(
    client: AsyncClient, tmp_path: Path
) -> None:
    flag = tmp_path / "pass"
    await slice_with(client, "gpu-0")
    async with running(client, policy(RULES, burn_in_policy(flag))) as controller:
        await eventually(lambda: controller.passes >= 1, 5.0, "a first pass")
        await slice_with(client, "gpu-0", "gpu-1")  # gpu-1 appears

        async def burn_in_rule() -> Any:
            return by_device(await rules(client)).get("gpu-1")

        rule = await eventually(burn_in_rule, 5.0, "gpu-1's burn-in rule")
        taint = rule.spec.taint
        assert (taint.key, taint.value, taint.effect) == (
            "drahealth.io/burn-in",
            "new",
            "NoSchedule",
        )
        assert rule.metadata.annotations["drahealth.io/burn-in"] == "new device"
        assert "gpu-0" not in by_device(await rules(client))  # listed at start: not new
        entry = await eventually(
            lambda: burn_in_entry(client, "gpu-1"), 5.0, "gpu-1 in the burnIn state key"
        )
        assert (entry["why"], entry["node"]) == ("new device", NODE)
        await eventually(lambda: events(client, "DeviceBurnInStarted"), 5.0, "DeviceBurnInStarted")
        failed = await eventually(
            lambda: events(client, "DeviceBurnInFailed"), 5.0, "a failed validation"
        )
        assert "exit 1" in (failed[0].message or "")
        assert "gpu-1" in by_device(await rules(client))  # still tainted
        flag.touch()

        async def untainted() -> bool:
            return "gpu-1" not in by_device(await rules(client))

        await eventually(untainted, 5.0, "the burn-in rule to go once the validation passes")
        await eventually(lambda: events(client, "DeviceBurnInPassed"), 5.0, "DeviceBurnInPassed")

        async def state_empty() -> bool:
            return await state(client, "burnIn") == {}

        await eventually(state_empty, 5.0, "the burnIn state key to empty")
        assert controller.metrics.burn_in_validations.labels("passed")._value.get() == 1  # type: ignore[attr-defined]


async def test_a_restart_resumes_a_burn_in_and_burns_in_nothing_else(
    client: AsyncClient, tmp_path: Path
) -> None:
    flag = tmp_path / "pass"
    p = policy(RULES, burn_in_policy(flag))
    await slice_with(client, "gpu-0")
    async with running(client, p, identity="c1") as controller:
        await eventually(lambda: controller.passes >= 1, 5.0, "a first pass")
        await slice_with(client, "gpu-0", "gpu-1")

        async def burn_in_rule() -> Any:
            return by_device(await rules(client)).get("gpu-1")

        first = await eventually(burn_in_rule, 5.0, "gpu-1's burn-in rule")
        entry = await eventually(
            lambda: burn_in_entry(client, "gpu-1"), 5.0, "gpu-1 in the burnIn state key"
        )
        since = entry["since"]
    # the state key is gone too: the burn-in resumes from the controller's rule alone
    await client.delete(ConfigMap, "drahealth-remediation-state", namespace="default")
    async with running(client, p, identity="c2") as controller:
        await eventually(lambda: controller.passes >= 2, 5.0, "two passes")
        # resumed; gpu-0, listed at start, is not new
        assert set(controller.engine.burn_ins.devices) == {DeviceKey(D, NODE, "gpu-1")}
        found = by_device(await rules(client))
        assert set(found) == {"gpu-1"}
        assert found["gpu-1"].metadata.uid == first.metadata.uid  # kept, not rewritten

        async def resumed_since() -> Any:
            return ((await state(client, "burnIn")) or {}).get(f"{D}/{NODE}/gpu-1")

        entry = await eventually(resumed_since, 5.0, "the burnIn key written again")
        assert entry["why"] == "new device"
        assert abs(_epoch(entry["since"]) - _epoch(since)) <= 1.0  # from the taint's time
        flag.touch()

        async def untainted() -> bool:
            return not by_device(await rules(client))

        await eventually(untainted, 5.0, "the resumed burn-in to pass")


def _epoch(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def test_a_repaired_device_burns_in_before_it_takes_work_again(
    client: AsyncClient, tmp_path: Path
) -> None:
    flag = tmp_path / "pass"
    rules_with_repair = """- name: fatal
  match: {driver: gpu.example.com}
  recovery: {healthyFor: 0.3s}
  repair: {exec: [sh, -c, 'exit 0'], backoff: 0.1s}
"""
    p = policy(
        rules_with_repair, burn_in_policy(flag).replace("\n", "\n  appliesTo: [repaired]\n", 1)
    )
    await slice_with(client, "gpu-0")
    await set_health(client, gpu_0="Healthy")
    async with running(client, p) as controller:
        await eventually(lambda: controller.passes >= 1, 5.0, "a first pass")
        await set_health(client, gpu_0=("Unhealthy", "XID 79"))

        async def taint_key() -> Any:
            rule = by_device(await rules(client)).get("gpu-0")
            return None if rule is None else rule.spec.taint.key

        assert await eventually(taint_key, 5.0, "the rule's taint") == "drahealth.io/unhealthy"
        await set_health(client, gpu_0="Healthy")

        async def burning_in() -> bool:
            return await taint_key() == "drahealth.io/burn-in"

        # repaired and recovered: the rule's taint gives way to the burn-in taint, never
        # leaving the device untainted in between
        seen: set[Any] = set()

        async def watch() -> bool:
            seen.add(await taint_key())
            return await burning_in()

        await eventually(watch, 5.0, "the burn-in taint after the repair")
        assert None not in seen, seen
        rule = by_device(await rules(client))["gpu-0"]
        assert rule.spec.taint.value == "repaired"
        assert rule.metadata.annotations["drahealth.io/burn-in"] == "after repair"

        async def burn_in_why() -> Any:
            return ((await burn_in_entry(client, "gpu-0")) or {}).get("why")

        assert await eventually(burn_in_why, 5.0, "gpu-0 in the burnIn state") == "after repair"
        flag.touch()

        async def untainted() -> bool:
            return "gpu-0" not in by_device(await rules(client))

        await eventually(untainted, 5.0, "the burn-in to pass")
