"""lightkube's AsyncClient against the embedded API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models import resource_v1 as r
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceSlice
from lightkube.types import PatchType

from drahealth.controlplane import APIServer


@pytest.fixture
async def client(server: APIServer, tmp_path: Path) -> AsyncIterator[AsyncClient]:
    config = KubeConfig.from_file(server.write_kubeconfig(tmp_path / "kubeconfig"))
    c = AsyncClient(config=config)
    yield c
    await c.close()


def a_pod(name: str) -> Pod:
    return Pod(
        metadata=ObjectMeta(name=name, labels={"app": "web"}),
        spec=PodSpec(containers=[Container(name="c", image="img")]),
    )


async def test_create_get_list_watch_patch_status(client: AsyncClient) -> None:
    created = await client.create(a_pod("p1"))
    assert created.metadata is not None and created.metadata.uid
    got = await client.get(Pod, "p1")
    assert got.spec is not None and got.spec.containers[0].image == "img"
    listing = client.list(Pod, labels={"app": "web"})
    names = [p.metadata.name async for p in listing if p.metadata]
    assert names == ["p1"]
    seen: list[tuple[str, str | None]] = []

    async def watch() -> None:
        async for kind, obj in client.watch(
            Pod, labels={"app": "web"}, resource_version=listing.resourceVersion
        ):
            seen.append((kind, obj.status.phase if obj.status else None))
            if obj.status and obj.status.phase == "Running":
                return

    task = asyncio.create_task(watch())
    await asyncio.sleep(0.05)
    patched = await client.patch(
        Pod.Status, "p1", {"status": {"phase": "Running"}}, patch_type=PatchType.MERGE
    )
    assert patched.status is not None and patched.status.phase == "Running"
    await asyncio.wait_for(task, 2)
    assert seen == [("MODIFIED", "Running")]
    with pytest.raises(ApiError) as err:
        await client.get(Pod, "missing")
    assert err.value.status.code == 404
    await client.delete(Pod, "p1")
    assert [p async for p in client.list(Pod)] == []


async def test_watch_expired_raises_410(server: APIServer, client: AsyncClient) -> None:
    await client.create(a_pod("p1"))
    server.compact()
    with pytest.raises(ApiError) as err:
        async for _ in client.watch(Pod, resource_version="1"):
            pass
    assert err.value.status.code == 410 and err.value.status.reason == "Expired"


async def test_apply_resource_slice_and_device_taint_rule(client: AsyncClient) -> None:
    sl = ResourceSlice(
        metadata=ObjectMeta(name="n1-gpu"),
        spec=r.ResourceSliceSpec(
            driver="gpu.example.com",
            nodeName="n1",
            pool=r.ResourcePool(name="n1", generation=1, resourceSliceCount=1),
            devices=[r.Device(name="gpu-0"), r.Device(name="gpu-1")],
        ),
    )
    first = await client.apply(sl, field_manager="driver", force=True)
    assert first.metadata is not None and first.metadata.managedFields is not None
    assert first.metadata.managedFields[0].manager == "driver"
    again = await client.apply(sl, field_manager="driver", force=True)
    assert again.metadata is not None
    assert again.metadata.resourceVersion == first.metadata.resourceVersion  # no-op
    rule = DeviceTaintRule(
        metadata=ObjectMeta(name="gpu-0-unhealthy"),
        spec=r.DeviceTaintRuleSpec(
            deviceSelector=r.DeviceTaintSelector(
                driver="gpu.example.com", pool="n1", device="gpu-0"
            ),
            taint=r.DeviceTaint(key="example.com/unhealthy", effect="NoExecute"),
        ),
    )
    applied = await client.apply(rule, field_manager="remedy", force=True)
    assert applied.spec.taint.timeAdded is not None  # filled by the server
    status = {
        "status": {
            "conditions": [
                {
                    "type": "EvictionInProgress",
                    "status": "False",
                    "reason": "Done",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    }
    st = await client.patch(
        DeviceTaintRule.Status, "gpu-0-unhealthy", status, patch_type=PatchType.MERGE
    )
    assert st.status is not None and st.status.conditions is not None
    assert st.metadata is not None and st.metadata.generation == 1
    slices = [
        s async for s in client.list(ResourceSlice, fields={"spec.driver": "gpu.example.com"})
    ]
    assert [s.metadata.name for s in slices if s.metadata] == ["n1-gpu"]
