"""ResourceSlicePublisher against the embedded API server over real HTTP (lightkube)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import Device, DeviceAttribute, DeviceTaint
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice

from drahealth.controlplane import APIServer
from drahealth.core import Health
from drahealth.driver._hub import DeviceReport, HealthHub
from drahealth.driver._publisher import ResourceSlicePublisher
from drahealth.driver._slices import DriverResources, Pool, SliceValidationError
from drahealth.driver._taints import TaintController, TaintPolicy, TaintStore
from drahealth.kube import make_client

pytestmark = pytest.mark.timeout(20)

DRIVER = "gpu.example.com"
NODE = "node-1"
KEY = f"{DRIVER}/unhealthy"
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


@pytest.fixture
async def client(server: APIServer) -> AsyncIterator[AsyncClient]:
    c = make_client(server_url=server.url)
    yield c
    await c.close()


@pytest.fixture
async def node(client: AsyncClient) -> Node:
    return await client.create(Node(metadata=ObjectMeta(name=NODE)))


@pytest.fixture
async def publisher(client: AsyncClient) -> AsyncIterator[ResourceSlicePublisher]:
    pub = ResourceSlicePublisher(
        client, DRIVER, NODE, sync_delay=0.3, backoff_initial=0.05, backoff_max=0.2
    )
    yield pub
    await pub.stop()


def devices(n: int) -> list[Device]:
    return [Device(name=f"gpu-{i}") for i in range(n)]


def resources(devs: list[Device]) -> DriverResources:
    return DriverResources({"pool": Pool(devs)})


async def slices(client: AsyncClient) -> list[ResourceSlice]:
    out = [s async for s in client.list(ResourceSlice)]
    return sorted(out, key=lambda s: (s.metadata.name or "") if s.metadata else "")


def taints_of(objs: list[ResourceSlice]) -> dict[str, list[DeviceTaint]]:
    return {d.name: d.taints for o in objs for d in o.spec.devices or () if d.taints}


async def eventually(check: Callable[[], Awaitable[bool]], within: float) -> float:
    """Poll until ``check()``; return the seconds it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not await check():
        if loop.time() - start > within:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.05)
    return loop.time() - start


async def test_300_devices_split_into_three_slices_owned_by_the_node(
    client: AsyncClient, node: Node, publisher: ResourceSlicePublisher
) -> None:
    publisher.publish(resources(devices(300)))
    await publisher.wait_synced(5)
    objs = await slices(client)
    assert [len(o.spec.devices or []) for o in objs] == [128, 128, 44]
    assert node.metadata is not None
    for i, o in enumerate(objs):
        assert o.metadata is not None and o.metadata.name is not None
        assert o.metadata.name.startswith(f"0000{i}-{DRIVER}-{NODE}-")
        [ref] = o.metadata.ownerReferences or []
        assert (ref.kind, ref.name, ref.uid, ref.controller) == (
            "Node",
            NODE,
            node.metadata.uid,
            True,
        )
        assert (o.spec.nodeName, o.spec.pool.generation, o.spec.pool.resourceSliceCount) == (
            NODE,
            1,
            3,
        )
    names = [d.name for o in objs for d in o.spec.devices or ()]
    assert names == [f"gpu-{i}" for i in range(300)]
    assert publisher.slices == 3 and publisher.creates == 3

    # the same state again: no API writes, no duplicates from our own watch echoes
    publisher.publish(resources(devices(300)))
    await publisher.wait_synced(5)
    await asyncio.sleep(0.5)  # past sync_delay: echo-triggered resyncs must be no-ops
    assert (publisher.creates, publisher.updates, publisher.deletes) == (3, 0, 0)
    assert len(await slices(client)) == 3
    assert publisher.publish_errors_total == 0


async def test_updating_one_device_keeps_the_generation(
    client: AsyncClient, node: Node, publisher: ResourceSlicePublisher
) -> None:
    devs = devices(300)
    publisher.publish(resources(devs))
    await publisher.wait_synced(5)
    before = {o.metadata.uid for o in await slices(client) if o.metadata}
    devs[150] = Device(name="gpu-150", attributes={"model": DeviceAttribute(string="h100")})
    publisher.publish(resources(devs))
    await publisher.wait_synced(5)
    objs = await slices(client)
    assert {o.metadata.uid for o in objs if o.metadata} == before
    assert {o.spec.pool.generation for o in objs} == {1}
    assert publisher.updates == 1
    assert objs[1].spec.devices and objs[1].spec.devices[22].attributes == {
        "model": {"string": "h100"}
    }


async def test_a_taint_resplits_into_64_device_slices_with_server_time(
    client: AsyncClient, node: Node, publisher: ResourceSlicePublisher
) -> None:
    publisher.publish(resources(devices(300)))
    await publisher.wait_synced(5)
    publisher.set_device_taints({("pool", "gpu-0"): [DeviceTaint(key=KEY, effect="NoSchedule")]})
    await publisher.wait_synced(5)
    objs = await slices(client)
    assert [len(o.spec.devices or []) for o in objs] == [64, 128, 108]
    assert {o.spec.pool.generation for o in objs} == {2}
    [t] = taints_of(objs)["gpu-0"]
    assert (t.key, t.effect) == (KEY, "NoSchedule") and t.timeAdded is not None
    assert [d.name for o in objs for d in o.spec.devices or ()] == [f"gpu-{i}" for i in range(300)]


async def test_slices_deleted_by_someone_else_come_back_within_two_seconds(
    client: AsyncClient, node: Node
) -> None:
    publisher = ResourceSlicePublisher(client, DRIVER, NODE)  # default sync_delay: 1 s
    publisher.publish(resources(devices(300)))
    await publisher.wait_synced(5)
    for o in await slices(client):
        assert o.metadata is not None and o.metadata.name is not None
        await client.delete(ResourceSlice, o.metadata.name)  # e.g. the kubelet wiping them

    async def back() -> bool:
        objs = await slices(client)
        return [len(o.spec.devices or []) for o in objs] == [128, 128, 44]

    took = await eventually(back, 2.0)
    assert took < 2.0
    objs = await slices(client)
    assert {o.spec.pool.resourceSliceCount for o in objs} == {3}
    await publisher.wait_synced(2)
    assert publisher.creates == 6
    await publisher.stop()


async def test_time_added_survives_republish_and_resplit(
    client: AsyncClient, node: Node, publisher: ResourceSlicePublisher
) -> None:
    devs = devices(300)
    publisher.publish(resources(devs))
    publisher.set_device_taints({("pool", "gpu-1"): [DeviceTaint(key=KEY, effect="NoExecute")]})
    await publisher.wait_synced(5)
    [t] = taints_of(await slices(client))["gpu-1"]
    first = t.timeAdded
    assert first is not None
    await asyncio.sleep(1.1)  # the server clock moves on by at least a second
    devs[2] = Device(name="gpu-2", attributes={"a": DeviceAttribute(int=1)})  # same slice
    publisher.publish(resources(devs))
    await publisher.wait_synced(5)
    # re-split: a taint on gpu-200 changes every slice and bumps the generation
    publisher.set_device_taints(
        {
            ("pool", "gpu-1"): [DeviceTaint(key=KEY, effect="NoExecute")],
            ("pool", "gpu-200"): [DeviceTaint(key=KEY, effect="NoSchedule")],
        }
    )
    await publisher.wait_synced(5)
    objs = await slices(client)
    assert {o.spec.pool.generation for o in objs} == {2}
    found = taints_of(objs)
    assert found["gpu-1"][0].timeAdded == first
    assert found["gpu-200"][0].timeAdded is not None
    assert found["gpu-200"][0].timeAdded > first


async def test_publisher_restart_keeps_taint_time_from_the_store(
    client: AsyncClient, node: Node, tmp_path: Path
) -> None:
    store_path = tmp_path / "taints.json"
    devs = [("pool", f"gpu-{i}") for i in range(4)]
    resources_ = resources(devices(4))

    async def run(clock: dt.datetime, fault: bool) -> None:
        pub = ResourceSlicePublisher(client, DRIVER, NODE)
        hub = HealthHub(devs)
        ctl = TaintController(
            hub, TaintPolicy(DRIVER), pub.set_device_taints, store=TaintStore(store_path),
            clock=lambda: clock,
        )  # fmt: skip
        pub.publish(resources_)
        await ctl.start()
        if fault:
            hub.submit("nvml", [DeviceReport("pool", "gpu-3", Health.UNHEALTHY, "Xid 79")])
        await ctl.wait_idle(2)
        await pub.wait_synced(5)
        await ctl.stop()
        await pub.stop()

    await run(T0, fault=True)
    [t] = taints_of(await slices(client))["gpu-3"]
    assert (t.key, t.value, t.effect, t.timeAdded) == (KEY, "true", "NoSchedule", T0)

    # the kubelet wipes the slices when the plugin restarts; the new hub knows no fault yet
    for o in await slices(client):
        assert o.metadata is not None and o.metadata.name is not None
        await client.delete(ResourceSlice, o.metadata.name)
    await run(T0 + dt.timedelta(hours=1), fault=False)
    [t] = taints_of(await slices(client))["gpu-3"]
    assert t.timeAdded == T0


async def test_restart_without_store_copies_time_from_existing_slice(
    client: AsyncClient, node: Node
) -> None:
    taints = {("pool", "gpu-0"): [DeviceTaint(key=KEY, effect="NoSchedule")]}
    first = ResourceSlicePublisher(client, DRIVER, NODE)
    first.publish(resources(devices(3)))
    first.set_device_taints(taints)
    await first.wait_synced(5)
    await first.stop()
    [before] = taints_of(await slices(client))["gpu-0"]
    await asyncio.sleep(1.1)
    second = ResourceSlicePublisher(client, DRIVER, NODE)
    second.set_device_taints(taints)
    second.publish(resources([*devices(3), Device(name="gpu-3")]))  # forces an update
    await second.wait_synced(5)
    await second.stop()
    assert second.updates == 1
    [after] = taints_of(await slices(client))["gpu-0"]
    assert after.timeAdded == before.timeAdded


async def test_without_a_node_slices_have_no_owner(
    client: AsyncClient, publisher: ResourceSlicePublisher, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="drahealth.driver._publisher"):
        publisher.publish(resources(devices(2)))
        await publisher.wait_synced(5)
    [o] = await slices(client)
    assert o.metadata is not None and not o.metadata.ownerReferences
    assert publisher.owner is None
    assert "Node node-1 not found" in caplog.text


async def test_invalid_resources_raise_and_keep_the_published_state(
    client: AsyncClient, node: Node, publisher: ResourceSlicePublisher
) -> None:
    publisher.publish(resources(devices(3)))
    await publisher.wait_synced(5)
    bad = devices(3)
    bad[1] = Device(
        name="gpu-1", taints=[DeviceTaint(key=f"{KEY}{i}", effect="None") for i in range(17)]
    )
    with pytest.raises(SliceValidationError, match="gpu-1"):
        publisher.publish(resources(bad))
    with pytest.raises(SliceValidationError, match="nodeName"):
        publisher.publish(DriverResources({"pool": Pool(devices(1), node_name="node-2")}))
    await publisher.wait_synced(1)
    assert len((await slices(client))[0].spec.devices or []) == 3


async def test_pools_are_removed_and_foreign_edits_reverted(
    client: AsyncClient, node: Node, publisher: ResourceSlicePublisher
) -> None:
    publisher.publish(DriverResources({"a": Pool(devices(2)), "b": Pool(devices(1))}))
    await publisher.wait_synced(5)
    assert sorted(o.spec.pool.name for o in await slices(client)) == ["a", "b"]
    publisher.publish(DriverResources({"a": Pool(devices(2))}))
    await publisher.wait_synced(5)
    [o] = await slices(client)
    assert o.spec.pool.name == "a"

    o.spec.devices = devices(1)  # someone edits our slice
    await client.replace(o)

    async def reverted() -> bool:
        [cur] = await slices(client)
        return len(cur.spec.devices or []) == 2

    await eventually(reverted, 3.0)


async def test_errors_are_counted_reported_and_retried(server: APIServer, node: Node) -> None:
    errors: list[BaseException] = []
    dead = make_client(server_url="http://127.0.0.1:9", timeout=0.5)
    pub = ResourceSlicePublisher(
        dead, DRIVER, NODE, backoff_initial=0.05, backoff_max=0.1, sync_timeout=0.1,
        on_error=errors.append,
    )  # fmt: skip
    pub.publish(resources(devices(1)))
    with pytest.raises(TimeoutError, match="not in sync"):
        await pub.wait_synced(0.6)
    assert pub.publish_errors_total >= 2 and errors and pub.last_error is not None
    await pub.stop()
    await pub.stop()  # idempotent
    await dead.close()
