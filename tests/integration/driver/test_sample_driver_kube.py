"""Acceptance tests of ``drahealth driver --kubeconfig`` against the embedded API server.

The API server runs in-test; the driver is a subprocess that reaches it through the
kubeconfig. Claims are created and allocated through the API, prepared over the DRA
socket with the generated stubs; slices and taints are read back through the API.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc
import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from drahealth import api
from drahealth.controlplane import APIServer
from drahealth.driver._checkpoint import Checkpoint, ClaimState
from drahealth.kube import make_client
from tests.integration.driver.test_sample_driver import (
    DRIVER,
    NODE,
    UNHEALTHY,
    DriverProcess,
    Watch,
    base,
    devices_of,
    exists,
    health_is,
    inject,
    launch,
    processes,
    read_bytes,
)

__all__ = ["base", "launch", "processes"]  # fixtures shared with test_sample_driver

pytestmark = pytest.mark.timeout(40)

TAINT_KEY = f"{DRIVER}/unhealthy"


@pytest.fixture
async def apiserver() -> AsyncIterator[APIServer]:
    server = APIServer()
    await server.start(port=0)
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def kube(apiserver: APIServer) -> AsyncIterator[AsyncClient]:
    client = make_client(server_url=apiserver.url)
    try:
        await client.create(Node(metadata=ObjectMeta(name=NODE)))
        yield client
    finally:
        await client.close()


@pytest.fixture
def kubeconfig(apiserver: APIServer, base: str) -> str:
    return str(apiserver.write_kubeconfig(f"{base}/kubeconfig"))


async def create_claim(client: AsyncClient, name: str, results: list[dict[str, Any]] | None) -> str:
    claim = cast(
        ResourceClaim,
        ResourceClaim.from_dict(
            {
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}
                },
            }
        ),
    )
    created = await client.create(claim)
    assert created.metadata is not None and created.metadata.uid
    if results is not None:
        await client.patch(
            ResourceClaim.Status,
            name,
            {"status": {"allocation": {"devices": {"results": results}}}},
            namespace="default",
            patch_type=PatchType.MERGE,
        )
    uid: str = created.metadata.uid
    return uid


def gpu(device: str, driver: str = DRIVER) -> dict[str, Any]:
    return {"request": "gpu", "driver": driver, "pool": NODE, "device": device}


def claims(*refs: tuple[str, str]) -> list[api.dra_v1.Claim]:
    return [api.dra_v1.Claim(namespace="default", name=n, uid=u) for n, u in refs]


async def prepare(d: DriverProcess, *refs: tuple[str, str]) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(f"unix://{d.dra_socket}") as ch:
        resp = await api.dra_v1_grpc.DRAPluginStub(ch).NodePrepareResources(
            api.dra_v1.NodePrepareResourcesRequest(claims=claims(*refs))
        )
    return dict(resp.claims)


async def unprepare(d: DriverProcess, *refs: tuple[str, str]) -> dict[str, str]:
    async with grpc.aio.insecure_channel(f"unix://{d.dra_socket}") as ch:
        resp = await api.dra_v1_grpc.DRAPluginStub(ch).NodeUnprepareResources(
            api.dra_v1.NodeUnprepareResourcesRequest(claims=claims(*refs))
        )
    return {uid: r.error for uid, r in resp.claims.items()}


def spec_path(d: DriverProcess, uid: str) -> str:
    return f"{d.cdi}/k8s.{d.driver}-claim_{uid}.json"


def load_checkpoint(d: DriverProcess) -> dict[str, Any]:
    return Checkpoint(f"{d.state}/prepared-claims.json").load()


async def slices(client: AsyncClient, node: str = NODE) -> list[ResourceSlice]:
    out = [s async for s in client.list(ResourceSlice, fields={"spec.nodeName": node})]
    return sorted(out, key=lambda s: (s.metadata.name or "") if s.metadata else "")


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.05)


def taints(objs: list[ResourceSlice]) -> dict[str, list[tuple[str, str | None, str]]]:
    return {
        d.name: [(t.key, t.value, t.effect) for t in d.taints]
        for o in objs
        for d in o.spec.devices or ()
        if d.taints
    }


# --------------------------------------------------------------------------- tests


async def test_prepare_and_unprepare(
    launch: Callable[..., Any], kube: AsyncClient, kubeconfig: str
) -> None:
    d: DriverProcess = await launch("--broken-device", "gpu-7", kubeconfig=kubeconfig)
    assert "no --kubeconfig" not in d.output
    good = await create_claim(kube, "good", [gpu("gpu-0"), gpu("gpu-1")])
    other = await create_claim(kube, "other", [gpu("eth0", driver="nic.example.com")])
    unalloc = await create_claim(kube, "unalloc", None)
    foreign = await create_claim(kube, "foreign", [gpu("gpu-99")])
    refs = [
        ("good", good),
        ("other", other),
        ("unalloc", unalloc),
        ("good", "old-uid"),
        ("missing", "u-missing"),
        ("foreign", foreign),
    ]
    out = await prepare(d, *refs)
    assert set(out) == {u for _, u in refs}
    assert out[good].error == ""
    kind = f"k8s.{DRIVER}/claim"
    assert [
        (list(x.request_names), x.pool_name, x.device_name, list(x.cdi_device_ids))
        for x in out[good].devices
    ] == [
        (["gpu"], NODE, "gpu-0", [f"{kind}={good}-gpu-0"]),
        (["gpu"], NODE, "gpu-1", [f"{kind}={good}-gpu-1"]),
    ]
    assert out[other].error == "" and list(out[other].devices) == []  # another driver's claim
    assert out[unalloc].error == f"claim default/unalloc (uid {unalloc}) is not allocated"
    assert out["old-uid"].error == (
        f"claim default/good (uid old-uid) got replaced: the API server has uid {good}"
    )
    assert out["u-missing"].error == "ResourceClaim default/missing not found (uid u-missing)"
    assert out[foreign].error == (
        f"device {NODE}/gpu-99 of claim default/foreign (uid {foreign}) is not a device of "
        "this driver on this node"
    )
    spec = json.loads(read_bytes(spec_path(d, good)))
    assert spec["kind"] == kind
    assert [x["name"] for x in spec["devices"]] == [f"{good}-gpu-0", f"{good}-gpu-1"]

    # idempotent: the same answer again, from the checkpoint
    again = await prepare(d, ("good", good))
    assert again[good].SerializeToString() == out[good].SerializeToString()

    # unprepare: the spec and the checkpoint entry go; an unknown claim is fine too
    assert await unprepare(d, ("good", good), ("never", "u-never")) == {good: "", "u-never": ""}
    assert not exists(spec_path(d, good))
    assert good not in load_checkpoint(d)


async def test_permanent_device_fault_from_prepare_taints_the_device(
    launch: Callable[..., Any], kube: AsyncClient, kubeconfig: str
) -> None:
    d: DriverProcess = await launch("--broken-device", "gpu-7", kubeconfig=kubeconfig)
    watch = Watch(d.dra_socket).start()
    try:
        await watch.wait_for(lambda r: True)
        broken = await create_claim(kube, "broken", [gpu("gpu-7")])
        out = await prepare(d, ("broken", broken))
        message = f"simulated hardware error: device {NODE}/gpu-7 failed to initialize"
        assert out[broken].error == message
        _, resp = await watch.wait_for(health_is("gpu-7", UNHEALTHY))
        assert devices_of(resp)["gpu-7"].message == message

        async def tainted() -> bool:
            return taints(await slices(kube)) == {"gpu-7": [(TAINT_KEY, "true", "NoSchedule")]}

        await eventually(tainted)
    finally:
        await watch.close()


async def test_slices_published_recreated_and_tainted(
    launch: Callable[..., Any], kube: AsyncClient, kubeconfig: str
) -> None:
    d: DriverProcess = await launch(kubeconfig=kubeconfig)

    async def one_slice() -> bool:
        return len(await slices(kube)) == 1

    await eventually(one_slice)
    [obj] = await slices(kube)
    assert obj.metadata is not None and obj.metadata.name is not None
    assert obj.metadata.name.startswith(f"00000-{DRIVER}-{NODE}-")
    assert [ref.kind for ref in obj.metadata.ownerReferences or []] == ["Node"]
    assert (obj.spec.driver, obj.spec.nodeName, obj.spec.pool.name) == (DRIVER, NODE, NODE)
    devs = obj.to_dict()["spec"]["devices"]
    assert [x["name"] for x in devs] == [f"gpu-{i}" for i in range(8)]
    attrs = devs[3]["attributes"]
    assert attrs["index"] == {"int": 3}
    assert attrs["model"] == {"string": "SIM-GPU-80G"}
    assert attrs["driverVersion"] == {"version": "1.0.0"}
    assert attrs["uuid"]["string"].startswith("gpu-")
    assert devs[3]["capacity"] == {"memory": {"value": "80Gi"}}
    old_uid = obj.metadata.uid

    # deleted by someone else: re-created
    await kube.delete(ResourceSlice, obj.metadata.name)

    async def recreated() -> bool:
        objs = await slices(kube)
        return len(objs) == 1 and objs[0].metadata is not None and objs[0].metadata.uid != old_uid

    await eventually(recreated)

    # a permanent fault (inject unhealthy) taints the device; explicit recovery untaints
    rc, out, _ = await inject(d.state, "gpu-3", "unhealthy", "--message", "xid 79")
    assert rc == 0, out

    async def tainted() -> bool:
        return taints(await slices(kube)) == {"gpu-3": [(TAINT_KEY, "true", "NoSchedule")]}

    await eventually(tainted)
    assert "gpu-3" in json.loads(read_bytes(f"{d.state}/device-taints.json"))["taints"][0].values()
    rc, out, _ = await inject(d.state, "gpu-3", "healthy")
    assert rc == 0, out

    async def untainted() -> bool:
        return taints(await slices(kube)) == {}

    await eventually(untainted)


async def test_large_and_advanced_profiles_are_split_and_accepted(
    launch: Callable[..., Any], kube: AsyncClient, kubeconfig: str, base: str
) -> None:
    many, nic, parts = await asyncio.gather(
        launch(kubeconfig=kubeconfig, node="node-2", devices=200, base_dir=f"{base}/a"),
        launch(
            kubeconfig=kubeconfig,
            node="node-3",
            profile="sim-nic",
            driver="nic.example.com",
            base_dir=f"{base}/b",
        ),
        launch(kubeconfig=kubeconfig, node="node-4", devices=4, partitions=2, base_dir=f"{base}/c"),
    )

    async def published(node: str, count: int) -> bool:
        return len(await slices(kube, node)) == count

    await eventually(lambda: published("node-2", 2))
    assert [len(o.spec.devices or []) for o in await slices(kube, "node-2")] == [128, 72]

    await eventually(lambda: published("node-3", 1))
    [obj] = await slices(kube, "node-3")
    nic0 = obj.to_dict()["spec"]["devices"][0]
    assert (nic0["name"], nic0["allowMultipleAllocations"]) == ("nic-0", True)
    assert nic0["capacity"]["ingressBandwidth"] == {
        "value": "100G",
        "requestPolicy": {
            "default": "1G",
            "validRange": {"min": "100M", "max": "100G", "step": "1M"},
        },
    }

    await eventually(lambda: published("node-4", 2))
    counters, devices = await slices(kube, "node-4")
    assert [c.name for c in counters.spec.sharedCounters or []] == [
        f"gpu-{i}-counters" for i in range(4)
    ]
    assert len(devices.spec.devices or []) == 4 * 3
    for p in (many, nic, parts):
        assert await p.stop() == 0


async def test_sigkill_mid_prepare_then_restart(
    launch: Callable[..., Any], kube: AsyncClient, kubeconfig: str
) -> None:
    d: DriverProcess = await launch(kubeconfig=kubeconfig, prepare_delay=0.5)
    first = await create_claim(kube, "first", [gpu("gpu-0")])
    second = await create_claim(kube, "second", [gpu("gpu-1"), gpu("gpu-2")])
    before = await prepare(d, ("first", first))
    assert before[first].error == ""
    first_spec = read_bytes(spec_path(d, first))

    # kill the driver while it is inside the (slow) prepare of the second claim
    pending = asyncio.create_task(prepare(d, ("second", second)))

    async def started() -> bool:
        try:
            entry = load_checkpoint(d).get(second)
        except Exception:
            return False
        return entry is not None and entry.state is ClaimState.PREPARE_STARTED

    await eventually(started, within=5)
    await d.stop(signal.SIGKILL)
    with pytest.raises(grpc.aio.AioRpcError):
        await pending
    # sockets are left behind by a killed process
    assert exists(d.dra_socket) and exists(d.registrar_socket)

    # the checkpoint is intact: valid checksum, both claims as they were
    state = load_checkpoint(d)
    assert state[first].state is ClaimState.PREPARE_COMPLETED
    assert state[second].state is ClaimState.PREPARE_STARTED
    assert not exists(spec_path(d, second))

    # restart on the same directories (stale sockets replaced)
    again: DriverProcess = await launch(kubeconfig=kubeconfig, base_dir=d.base)
    after = await prepare(again, ("first", first), ("second", second))
    assert after[first].SerializeToString() == before[first].SerializeToString()
    assert read_bytes(spec_path(again, first)) == first_spec
    assert after[second].error == ""
    kind = f"k8s.{DRIVER}/claim"
    assert [(x.device_name, list(x.cdi_device_ids)) for x in after[second].devices] == [
        ("gpu-1", [f"{kind}={second}-gpu-1"]),
        ("gpu-2", [f"{kind}={second}-gpu-2"]),
    ]
    second_spec = read_bytes(spec_path(again, second))
    assert load_checkpoint(again)[second].state is ClaimState.PREPARE_COMPLETED
    # re-prepare after completion: identical devices and spec file
    repeat = await prepare(again, ("second", second))
    assert repeat[second].SerializeToString() == after[second].SerializeToString()
    assert read_bytes(spec_path(again, second)) == second_spec
    assert await again.stop() == 0


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in its slow step
async def test_claim_status_flag_writes_device_health_into_the_claim(
    launch: Callable[..., Any], kube: AsyncClient, kubeconfig: str
) -> None:
    """``drahealth driver --claim-status``: a prepared device's health is a DeviceHealthy
    condition in its claim's status.devices (what kubectl describe resourceclaim shows)."""
    d: DriverProcess = await launch("--claim-status", kubeconfig=kubeconfig)
    uid = await create_claim(kube, "train", [gpu("gpu-3")])
    out = await prepare(d, ("train", uid))
    assert out[uid].error == ""

    async def condition(status: str) -> bool:
        claim = (await kube.get(ResourceClaim, "train", namespace="default")).to_dict()
        for entry in (claim.get("status") or {}).get("devices") or []:
            if (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, NODE, "gpu-3"):
                found = [c for c in entry.get("conditions") or [] if c["type"] == "DeviceHealthy"]
                return bool(found) and found[0]["status"] == status
        return False

    await eventually(lambda: condition("True"), 15.0)
    rc, text, _ = await inject(d.state, "gpu-3", "unhealthy", "--message", "xid 79")
    assert rc == 0, text
    await eventually(lambda: condition("False"), 15.0)
