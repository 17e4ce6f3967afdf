"""An operator's taint where no DeviceTaintRule API is served (1.35 with its defaults):
``apply_taint`` fences the device with the operator's quarantine claim, allocated only
once no other claim holds it, and ``remove_taints`` deallocates, then deletes, the
operator's and the controller's quarantine claims of the device, never anyone else's.

Against the embedded API server at the 1.35 profile; the client's requests are recorded
so that the order of writes (deallocation before delete) is checked as sent.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Namespace
from lightkube.resources.resource_v1 import ResourceSlice
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.core import DeviceKey, kube_profile
from drahealth.kube import ServedAPIs, discover, make_client, resource_class
from drahealth.remedy import RuleError, UnpublishedDevice
from drahealth.remedy._nodes import NodeDevice
from drahealth.remedy._operator import (
    Applied,
    RuleAPIUnavailable,
    apply_taint,
    remove_taints,
)
from drahealth.remedy._quarantine import (
    ANNOTATION_QUARANTINE,
    allocation,
    claim_body,
    claim_name,
)

pytestmark = pytest.mark.timeout(30)

ResourceClaim = resource_class("ResourceClaim", "v1")
DRIVER, NODE, NS = "gpu.example.com", "node-1", "drahealth"
DEV = DeviceKey(DRIVER, NODE, "gpu-0")
KEY = "ops.example.com/maint"
Request = tuple[str, str, dict[str, Any] | None]


@pytest.fixture
def api_server_options() -> dict[str, Any]:
    return {"data_file": None, "profile": kube_profile("1.35", {})}


@pytest.fixture
async def client(server: APIServer) -> AsyncIterator[AsyncClient]:
    c = make_client(server_url=server.url, timeout=5.0)
    for ns in (NS, "ml"):
        await c.create(Namespace.from_dict({"metadata": {"name": ns}}))
    await c.create(
        ResourceSlice.from_dict(
            {
                "metadata": {"name": "node-1-gpu"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": NODE,
                    "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": f"gpu-{i}"} for i in range(4)],
                },
            }
        )
    )
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def sent(client: AsyncClient) -> list[Request]:
    """(method, path, JSON body) of every request the client sends from now on."""
    out: list[Request] = []

    async def note(request: Any) -> None:
        body = request.content
        out.append((request.method, request.url.path, json.loads(body) if body else None))

    client._client._client.event_hooks["request"].append(note)  # type: ignore[attr-defined]
    return out


def writes(sent: list[Request]) -> list[Request]:
    return [r for r in sent if r[0] not in ("GET",)]


async def claim(client: AsyncClient, name: str, namespace: str = NS) -> dict[str, Any] | None:
    try:
        out = (await client.get(ResourceClaim, name, namespace=namespace)).to_dict()
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise
    assert isinstance(out, dict)
    return out


async def hold(client: AsyncClient, name: str, device: str, namespace: str = "ml") -> None:
    """A workload's claim, allocated to ``device`` (what the scheduler would write)."""
    body = {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
    }
    await client.create(ResourceClaim.from_dict(body))
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    await client.patch(
        ResourceClaim.Status, name, {"status": {"allocation": {"devices": {"results": [result]}}}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip


async def let_go(client: AsyncClient, name: str, namespace: str = "ml") -> None:
    await client.patch(
        ResourceClaim.Status, name, {"status": {"allocation": None, "reservedFor": None}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip


async def taint(client: AsyncClient, effect: str = "NoSchedule", **kw: Any) -> Applied:
    kw.setdefault("value", "rma")
    return await apply_taint(client, DEV, key=KEY, effect=effect, namespace=NS, **kw)


def results(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(((obj.get("status") or {}).get("allocation") or {}).get("devices", {})["results"])


async def test_a_free_device_gets_an_allocated_operator_claim(client: AsyncClient) -> None:
    served = await discover(client)
    assert served.resource("DeviceTaintRule") is None  # 1.35 with its defaults
    result = await taint(client, served=served)
    name = claim_name(DEV, operator=True)
    assert result == Applied(name, "created", "resourceclaim", NS)
    assert tuple(result) == (name, "created")  # still unpacks as (name, outcome)
    obj = await claim(client, name)
    assert obj is not None
    assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "drahealth-operator"}
    row = json.loads(obj["metadata"]["annotations"][ANNOTATION_QUARANTINE])
    assert row["device"] == str(DEV) and row["mode"] == "quarantine"
    assert (row["key"], row["value"], row["effect"]) == (KEY, "rma", "NoSchedule")
    assert row["rule"] == "operator" and row["by"] == "operator"
    assert results(obj) == [
        {"request": "device", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    ]
    assert obj["status"]["reservedFor"] == [
        {"apiGroup": "drahealth.io", "resource": "devicequarantines", "name": name,
         "uid": obj["metadata"]["uid"]}
    ]  # fmt: skip


async def test_a_held_device_stays_pending_until_the_holder_lets_go(client: AsyncClient) -> None:
    await hold(client, "train-gpu", "gpu-0")
    await hold(client, "other-gpu", "gpu-1")
    name = claim_name(DEV, operator=True)
    first = await taint(client)
    assert first == Applied(name, "pending", "resourceclaim", NS, ("ml/train-gpu",))
    obj = await claim(client, name)
    assert obj is not None and not (obj.get("status") or {}).get("allocation")
    assert (await taint(client)).outcome == "pending"  # still held: nothing else changes
    await let_go(client, "train-gpu")
    assert (await taint(client)).outcome == "updated"  # free now: allocated
    obj = await claim(client, name)
    assert obj is not None and results(obj)[0]["device"] == "gpu-0"
    assert (await taint(client)).outcome == "unchanged"


async def test_the_controllers_claim_of_the_device_is_no_holder(client: AsyncClient) -> None:
    row = NodeDevice(DEV, "quarantine", "drahealth.io/unhealthy", "xid", "NoExecute", "xid")
    body = claim_body(row, NS)
    made = (await client.create(ResourceClaim.from_dict(body))).to_dict()
    await client.patch(
        ResourceClaim.Status, claim_name(DEV), {"status": allocation(DEV, made["metadata"]["uid"])},
        namespace=NS, patch_type=PatchType.MERGE,
    )  # fmt: skip
    assert (await taint(client)).outcome == "created"


async def test_same_taint_is_unchanged_another_updates_the_annotation(client: AsyncClient) -> None:
    name = claim_name(DEV, operator=True)
    assert (await taint(client)).outcome == "created"
    before = await claim(client, name)
    assert (await taint(client)).outcome == "unchanged"
    after = await claim(client, name)
    assert before is not None and after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert (await taint(client, value="other")).outcome == "updated"
    changed = await claim(client, name)
    assert changed is not None
    row = json.loads(changed["metadata"]["annotations"][ANNOTATION_QUARANTINE])
    old = json.loads(before["metadata"]["annotations"][ANNOTATION_QUARANTINE])
    assert row["value"] == "other" and row["since"] == old["since"]
    assert results(changed) == results(before)  # still fenced


async def test_noexecute_and_none_are_refused_with_what_to_do(
    client: AsyncClient, sent: list[Request]
) -> None:
    served = await discover(client)
    sent.clear()
    with pytest.raises(RuleError, match="no device taint eviction") as refused:
        await taint(client, "NoExecute", served=served)
    assert "kubectl drain" in str(refused.value) and "NoSchedule" in str(refused.value)
    with pytest.raises(RuleError, match="effect None cannot be written"):
        await taint(client, "None", served=served)
    assert sent == []  # refused before any request


async def test_untaint_deallocates_then_deletes_both_claims(
    client: AsyncClient, sent: list[Request]
) -> None:
    await taint(client)
    row = NodeDevice(DEV, "quarantine", KEY, "xid", "NoExecute", "xid")
    made = (await client.create(ResourceClaim.from_dict(claim_body(row, NS)))).to_dict()
    await client.patch(
        ResourceClaim.Status, claim_name(DEV), {"status": allocation(DEV, made["metadata"]["uid"])},
        namespace=NS, patch_type=PatchType.MERGE,
    )  # fmt: skip
    sent.clear()
    removed = await remove_taints(client, DEV, key=KEY, namespace=NS)
    ours, controllers = claim_name(DEV, operator=True), claim_name(DEV)
    assert list(removed) == [ours, controllers]
    assert removed.kind == "resourceclaim" and removed.controller == (controllers,)
    base = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
    cleared = {"status": {"allocation": None, "reservedFor": None}}
    assert writes(sent) == [
        ("PATCH", f"{base}/{ours}/status", cleared),
        ("DELETE", f"{base}/{ours}", None),
        ("PATCH", f"{base}/{controllers}/status", cleared),
        ("DELETE", f"{base}/{controllers}", None),
    ]
    assert await claim(client, ours) is None and await claim(client, controllers) is None
    # nothing left: no error, nothing named
    assert list(await remove_taints(client, DEV, key=KEY, namespace=NS)) == []


async def test_untaint_keeps_other_keys_effects_and_devices(client: AsyncClient) -> None:
    await taint(client)
    name = claim_name(DEV, operator=True)
    assert list(await remove_taints(client, DEV, key="other.example.com/k", namespace=NS)) == []
    assert list(await remove_taints(client, DEV, key=KEY, effect="NoExecute", namespace=NS)) == []
    other = DeviceKey(DRIVER, NODE, "gpu-1")
    assert list(await remove_taints(client, other, key=KEY, namespace=NS)) == []
    assert await claim(client, name) is not None
    assert list(await remove_taints(client, DEV, key=KEY, effect="NoSchedule", namespace=NS)) == [
        name
    ]


async def test_a_foreign_claim_with_the_operator_claims_name_is_never_adopted(
    client: AsyncClient,
) -> None:
    name = claim_name(DEV, operator=True)
    foreign = {
        "metadata": {"name": name, "namespace": NS, "labels": {"team": "infra"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
    }
    await client.create(ResourceClaim.from_dict(foreign))
    with pytest.raises(RuleError, match=f"resourceclaim {NS}/{name} exists but is not"):
        await taint(client)
    obj = await claim(client, name)
    assert obj is not None and obj["metadata"]["labels"] == {"team": "infra"}
    assert not (obj.get("status") or {}).get("allocation")
    assert list(await remove_taints(client, DEV, key=KEY, namespace=NS)) == []
    assert await claim(client, name) is not None


async def test_a_forged_annotation_naming_another_device_is_not_touched(
    client: AsyncClient,
) -> None:
    """Our label and the operator claim's name of gpu-0, but an annotation naming gpu-1:
    neither taint nor untaint of gpu-0 (or gpu-1) adopts or deletes it."""
    other = DeviceKey(DRIVER, NODE, "gpu-1")
    row = NodeDevice(other, "quarantine", KEY, "rma", "NoSchedule", "operator")
    body = claim_body(row, NS, operator=True)
    body["metadata"]["name"] = claim_name(DEV, operator=True)
    await client.create(ResourceClaim.from_dict(body))
    with pytest.raises(RuleError, match="not adopted"):
        await taint(client)
    for device in (DEV, other):
        assert list(await remove_taints(client, device, key=KEY, namespace=NS)) == []
    obj = await claim(client, claim_name(DEV, operator=True))
    assert obj is not None and not (obj.get("status") or {}).get("allocation")


@pytest.mark.parametrize(
    ("device", "fragment"),
    [
        (DeviceKey("Bad_Driver", NODE, "gpu-0"), "driver 'Bad_Driver'"),
        (DeviceKey(DRIVER, "node 1", "gpu-0"), "pool 'node 1'"),
        (DeviceKey(DRIVER, NODE, "gpu.0"), "device 'gpu.0'"),
        (DeviceKey(DRIVER, NODE, "x" * 64), "must be a DNS label"),
    ],
)
async def test_bad_device_names_are_refused_before_any_request(
    client: AsyncClient, sent: list[Request], device: DeviceKey, fragment: str
) -> None:
    with pytest.raises(RuleError, match=fragment):
        await apply_taint(client, device, key=KEY, value="", effect="NoSchedule", namespace=NS)
    assert sent == []


async def test_unpublished_devices_and_bad_namespaces_are_refused(
    client: AsyncClient, sent: list[Request]
) -> None:
    missing = DeviceKey(DRIVER, NODE, "gpu-9")
    with pytest.raises(UnpublishedDevice):
        await apply_taint(client, missing, key=KEY, value="", effect="NoSchedule", namespace=NS)
    forced = await apply_taint(
        client, missing, key=KEY, value="", effect="NoSchedule", namespace=NS, force=True
    )
    assert forced.outcome == "created"
    for namespace in (None, "", "Bad_NS", "../x"):
        with pytest.raises(RuleError, match="the controller's namespace"):
            await apply_taint(
                client, DEV, key=KEY, value="", effect="NoSchedule", namespace=namespace
            )
    assert not [r for r in writes(sent) if "/namespaces/Bad" in r[1] or ".." in r[1]]


async def test_neither_api_served_still_raises_rule_api_unavailable(client: AsyncClient) -> None:
    served = ServedAPIs({"ResourceClaim": ("v1beta1",), "ResourceSlice": ("v1beta1",)}, "v1.33.1")
    with pytest.raises(RuleAPIUnavailable, match="quarantine claim") as raised:
        await taint(client, served=served)
    assert "v1.33.1 serves no DeviceTaintRule API" in str(raised.value)
    with pytest.raises(RuleAPIUnavailable):
        await remove_taints(client, DEV, key=KEY, served=served, namespace=NS)
