"""ClaimStatusWriter without a server: the JSON patch it sends, what it leaves alone, and
its bounds (coalescing, pace, conflicts, refusals), against a fake client."""

from __future__ import annotations

import copy
from typing import Any

import httpx2
import pytest
from lightkube.resources.resource_v1 import ResourceClaim

from drahealth.controlplane._patch import json_patch
from drahealth.core import Health
from drahealth.driver import ClaimStatusOptions, ClaimStatusWriter, DeviceReport, HealthHub
from drahealth.driver._checkpoint import CheckpointDevice, ClaimEntry, ClaimState
from tests._support import eventually

DRV, NODE = "gpu.example.com", "node-1"
T0 = "2026-11-24T10:00:00Z"


def claim(devices: list[dict[str, Any]] | None = None, **result: Any) -> dict[str, Any]:
    results = [
        {"request": "gpu", "driver": DRV, "pool": NODE, "device": "gpu-0", **result},
        {"request": "gpu", "driver": "nic.example.com", "pool": "p", "device": "eth0"},
        {"request": "gpu", "driver": DRV, "pool": NODE, "device": "gpu-9"},  # hub lacks it
    ]
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}}
    if devices is not None:
        status["devices"] = devices
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "c",
            "namespace": "default",
            "uid": "u1",
            "resourceVersion": "7",
            "generation": 1,
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
        "status": status,
    }


def hub(health: Health = Health.UNHEALTHY, message: str = "XID 79") -> HealthHub:
    h = HealthHub([(NODE, "gpu-0")])
    h.submit("s", [DeviceReport(NODE, "gpu-0", health, message)])
    return h


def writer(h: HealthHub, client: Any = None, **opts: Any) -> ClaimStatusWriter:
    return ClaimStatusWriter(h, client, DRV, lambda: {}, ClaimStatusOptions(**opts), now=lambda: T0)


FOREIGN = {"driver": "nic.example.com", "pool": "p", "device": "eth0", "data": {"a": 1}}


def test_a_new_entry_is_added_and_foreign_entries_are_not_touched() -> None:
    ops, keys = writer(hub()).patch_ops(claim([FOREIGN]))
    assert keys == {(DRV, NODE, "gpu-0", None)}
    assert ops[0] == {"op": "replace", "path": "/metadata/resourceVersion", "value": "7"}
    assert ops[1]["op"] == "add" and ops[1]["path"] == "/status/devices/-"
    assert ops[1]["value"]["conditions"][0]["status"] == "False"
    assert len(ops) == 2  # gpu-9 (unknown to the hub) and the nic result: nothing
    ops, _ = writer(hub()).patch_ops(claim())
    assert ops[1]["path"] == "/status/devices" and len(ops[1]["value"]) == 1


def test_an_existing_entry_gets_only_its_conditions_replaced() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "Ok", "message": "",
             "lastTransitionTime": T0}  # fmt: skip
    ours = {"driver": DRV, "pool": NODE, "device": "gpu-0", "data": {"uuid": "GPU-0"},
            "conditions": [ready]}  # fmt: skip
    c = claim([FOREIGN, ours])
    ops, _ = writer(hub()).patch_ops(c)
    assert [o["path"] for o in ops] == ["/metadata/resourceVersion", "/status/devices/1/conditions"]
    assert ops[1]["value"][0] == ready and ops[1]["value"][1]["type"] == "DeviceHealthy"
    patched = json_patch(c, ops)
    assert patched["status"]["devices"][0] == FOREIGN
    assert patched["status"]["devices"][1]["data"] == {"uuid": "GPU-0"}
    # written once, the same state asks for nothing
    assert writer(hub()).patch_ops(patched) == ([], set())


def test_share_id_keys_the_entry() -> None:
    share = "3f0e1c52-0c9d-4c1e-9d0c-0e8a2c2b6d11"
    ops, keys = writer(hub()).patch_ops(claim(shareID=share))
    assert keys == {(DRV, NODE, "gpu-0", share)} and ops[1]["value"][0]["shareID"] == share


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="max_writes_per_second"):
        ClaimStatusOptions(max_writes_per_second=0)
    with pytest.raises(ValueError, match="conflict_attempts"):
        ClaimStatusOptions(conflict_attempts=0)


class FakeClient:
    """One stored claim; ``patch`` applies a JSON patch under the resourceVersion."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.patches: list[list[dict[str, Any]]] = []
        self.conflicts_left = 0
        self.refuse = False

    async def get(self, _res: Any, name: str, *, namespace: str) -> Any:
        return ResourceClaim.from_dict(copy.deepcopy(self.obj))

    async def patch(self, _res: Any, name: str, ops: Any, **_kw: Any) -> Any:
        self.patches.append(ops)
        if self.refuse:
            raise _error(422)
        if self.conflicts_left:
            self.conflicts_left -= 1
            self.obj["metadata"]["resourceVersion"] = str(
                int(self.obj["metadata"]["resourceVersion"]) + 1
            )
            raise _error(409)
        new = json_patch(self.obj, ops)
        if new["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            raise _error(409)
        new["metadata"]["resourceVersion"] = str(int(new["metadata"]["resourceVersion"]) + 1)
        self.obj = new
        return ResourceClaim.from_dict(copy.deepcopy(new))


def _error(code: int) -> httpx2.HTTPStatusError:
    req = httpx2.Request("PATCH", "http://x")
    body = {"kind": "Status", "code": code, "message": f"error {code}"}
    return httpx2.HTTPStatusError(
        "e", request=req, response=httpx2.Response(code, json=body, request=req)
    )


PREPARED = {
    "u1": ClaimEntry(
        "default", "c", ClaimState.PREPARE_COMPLETED, (CheckpointDevice(NODE, "gpu-0"),)
    )
}


def status_of(client: FakeClient) -> str:
    entries = client.obj["status"].get("devices") or []
    return entries[0]["conditions"][0]["status"] if entries else ""


async def test_a_burst_of_changes_is_coalesced_and_conflicts_are_retried() -> None:
    h = hub(Health.HEALTHY, "")
    client = FakeClient(claim())
    client.conflicts_left = 2
    w = ClaimStatusWriter(
        h, client, DRV, lambda: PREPARED,  # type: ignore[arg-type]
        ClaimStatusOptions(min_interval=0.3, resync_seconds=0.05),
    )  # fmt: skip
    await w.start()
    try:
        await eventually(lambda: status_of(client) == "True", 3.0, "the first write")
        assert w.conflicts == 2
        before = len(client.patches)
        for i in range(50):  # flapping within one min_interval
            health = Health.UNHEALTHY if i % 2 == 0 else Health.HEALTHY
            h.submit("s", [DeviceReport(NODE, "gpu-0", health, f"flap {i}")])
        h.submit("s", [DeviceReport(NODE, "gpu-0", Health.UNHEALTHY, "final")])
        await eventually(lambda: status_of(client) == "False", 3.0, "the final state")
        cond = client.obj["status"]["devices"][0]["conditions"][0]
        assert cond["message"] == "final"
        assert len(client.patches) - before <= 2  # 51 changes, at most 2 writes
    finally:
        await w.stop()


async def test_a_refused_write_is_not_retried_until_the_next_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = hub()
    client = FakeClient(claim())
    client.refuse = True
    w = ClaimStatusWriter(
        h, client, DRV, lambda: PREPARED,  # type: ignore[arg-type]
        ClaimStatusOptions(min_interval=0.0, resync_seconds=0.02),
    )  # fmt: skip
    await w.start()
    try:
        await eventually(lambda: w.failures == 1, 3.0, "the refused write")
        later = w.passes + 3
        await eventually(lambda: w.passes >= later, 3.0, "three more rounds")
        assert len(client.patches) == 1
        h.submit("s", [DeviceReport(NODE, "gpu-0", Health.HEALTHY, "")])
        await eventually(lambda: len(client.patches) == 2, 3.0, "a write after the change")
    finally:
        await w.stop()
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "error 422" in refused[0].getMessage()


async def test_unprepared_claims_are_forgotten() -> None:
    h = hub()
    client = FakeClient(claim())
    prepared = dict(PREPARED)
    w = ClaimStatusWriter(
        h, client, DRV, lambda: prepared,  # type: ignore[arg-type]
        ClaimStatusOptions(min_interval=0.0, resync_seconds=0.02),
    )  # fmt: skip
    await w.start()
    try:
        await eventually(lambda: len(client.patches) == 1, 3.0, "the first write")
        prepared.clear()
        later = w.passes + 2
        await eventually(lambda: w.passes >= later, 3.0, "two more rounds")
        h.submit("s", [DeviceReport(NODE, "gpu-0", Health.HEALTHY, "")])
        later = w.passes + 3
        await eventually(lambda: w.passes >= later, 3.0, "three more rounds")
        assert len(client.patches) == 1
    finally:
        await w.stop()
