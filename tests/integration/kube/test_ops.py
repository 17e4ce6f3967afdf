"""Write helpers against the embedded API server: status patches, server-side apply,
conflict retries and error predicates on real responses."""

from __future__ import annotations

import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod
from lightkube.types import PatchType

from drahealth.kube import (
    apply,
    apply_status,
    is_already_exists,
    is_conflict,
    is_not_found,
    patch_status,
    retry_on_conflict,
)


def pod(name: str) -> Pod:
    """A pod whose container uses claim ``gpu-0`` (so claim status entries are valid)."""
    return Pod.from_dict(
        {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "resourceClaims": [{"name": "gpu-0", "resourceClaimName": "gpu-0"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"claims": [{"name": "gpu-0"}]},
                    }
                ],
            },
        }
    )


async def test_patch_status_merge(client: AsyncClient) -> None:
    await client.create(pod("p1"))
    out = await patch_status(
        client,
        Pod,
        "p1",
        {"status": {"phase": "Running"}, "spec": {"nodeName": "sneaky"}},
        namespace="default",
    )
    assert isinstance(out, Pod)  # typed as the main resource, not the subresource
    assert out.status is not None and out.status.phase == "Running"
    stored = await client.get(Pod, "p1", namespace="default")
    assert stored.status is not None and stored.status.phase == "Running"
    assert stored.spec is not None and stored.spec.nodeName is None  # spec untouched


async def test_patch_status_strategic_merges_conditions_and_replaces_container_statuses(
    client: AsyncClient,
) -> None:
    """As upstream's Pod type says: conditions merge by type; containerStatuses is
    atomic, so a strategic merge patch replaces it (health inside it included)."""
    await client.create(pod("p2"))
    health = [{"name": "claim:gpu-0", "resources": [{"resourceID": "dev-0", "health": "Healthy"}]}]
    status = {
        "name": "main", "ready": False, "restartCount": 0, "image": "busybox", "imageID": "",
    }  # fmt: skip
    await patch_status(
        client, Pod, "p2",
        {"status": {"conditions": [{"type": "DisruptionTarget", "status": "True"}],
                    "containerStatuses": [{**status, "allocatedResourcesStatus": health}]}},
        namespace="default", patch_type=PatchType.STRATEGIC,
    )  # fmt: skip
    out = await patch_status(
        client, Pod, "p2",
        {"status": {"conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [{**status, "ready": True}]}},
        namespace="default", patch_type=PatchType.STRATEGIC,
    )  # fmt: skip
    assert out.status is not None and out.status.containerStatuses is not None
    (cs,) = out.status.containerStatuses
    assert cs.ready is True
    assert cs.allocatedResourcesStatus is None  # replaced whole: not in the patch, gone
    assert {c.type for c in out.status.conditions or []} == {"DisruptionTarget", "Ready"}


async def test_patch_status_requires_status_subresource(client: AsyncClient) -> None:
    with pytest.raises(ValueError, match="no status subresource"):
        await patch_status(client, ConfigMap, "x", {"status": {}}, namespace="default")


async def test_patch_status_missing_object(client: AsyncClient) -> None:
    with pytest.raises(Exception) as info:
        await patch_status(
            client, Pod, "nope", {"status": {"phase": "Failed"}}, namespace="default"
        )
    assert is_not_found(info.value)


async def test_apply_dict_creates_then_updates(client: AsyncClient) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "applied", "namespace": "default"},
        "data": {"a": "1"},
    }
    first = await apply(client, manifest, field_manager="test-a")
    assert isinstance(first, ConfigMap) and first.data == {"a": "1"}
    second = await apply(client, {**manifest, "data": {"a": "2", "b": "x"}}, field_manager="test-a")
    assert second.data == {"a": "2", "b": "x"}
    assert first.metadata is not None and second.metadata is not None
    assert int(second.metadata.resourceVersion or 0) > int(first.metadata.resourceVersion or 0)
    managers = {m.manager for m in second.metadata.managedFields or []}
    assert "test-a" in managers


async def test_apply_typed_object_and_cluster_scoped(client: AsyncClient) -> None:
    out = await apply(
        client, ConfigMap(metadata=ObjectMeta(name="typed", namespace="default"), data={"k": "v"})
    )
    assert out.data == {"k": "v"}
    ns = await apply(
        client, Namespace(metadata=ObjectMeta(name="applied-ns")), field_manager="test-a"
    )
    assert isinstance(ns, Namespace)
    got = await client.get(Namespace, "applied-ns")
    assert got.metadata is not None and got.metadata.name == "applied-ns"


async def test_apply_conflict_between_managers(client: AsyncClient) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "owned", "namespace": "default"},
        "data": {"a": "1"},
    }
    await apply(client, manifest, field_manager="owner")
    other = {**manifest, "data": {"a": "2"}}
    with pytest.raises(Exception) as info:
        await apply(client, other, field_manager="intruder")
    assert is_conflict(info.value)
    forced = await apply(client, other, field_manager="intruder", force=True)
    assert forced.data == {"a": "2"}


async def test_apply_rejects_incomplete_manifest(client: AsyncClient) -> None:
    with pytest.raises(ValueError, match="apiVersion"):
        await apply(client, {"metadata": {"name": "x"}})
    with pytest.raises(ValueError, match=r"metadata\.name"):
        await apply(client, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}})


async def test_apply_status(client: AsyncClient) -> None:
    await client.create(pod("p3"))
    out = await apply_status(
        client,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p3", "namespace": "default"},
            "status": {"phase": "Running", "message": "applied"},
        },
        field_manager="status-writer",
    )
    assert isinstance(out, Pod)
    assert out.status is not None and out.status.message == "applied"
    assert out.spec is not None and out.spec.containers[0].name == "main"


async def test_predicates_on_real_errors(client: AsyncClient) -> None:
    with pytest.raises(Exception) as info:
        await client.get(ConfigMap, "missing", namespace="default")
    assert is_not_found(info.value) and not is_conflict(info.value)
    await client.create(ConfigMap(metadata=ObjectMeta(name="dup", namespace="default")))
    with pytest.raises(Exception) as info:
        await client.create(ConfigMap(metadata=ObjectMeta(name="dup", namespace="default")))
    assert is_already_exists(info.value) and not is_conflict(info.value)


async def test_retry_on_conflict_read_modify_write(client: AsyncClient) -> None:
    await client.create(
        ConfigMap(metadata=ObjectMeta(name="counter", namespace="default"), data={"n": "0"})
    )
    attempts = 0

    async def increment() -> ConfigMap:
        nonlocal attempts
        attempts += 1
        cur = await client.get(ConfigMap, "counter", namespace="default")
        if attempts == 1:  # someone else writes between our read and our write
            await client.patch(
                ConfigMap,
                "counter",
                {"data": {"other": "x"}},
                namespace="default",
                patch_type=PatchType.MERGE,
            )
        cur.data = {**(cur.data or {}), "n": str(int((cur.data or {})["n"]) + 1)}
        return await client.replace(cur)

    out = await retry_on_conflict(increment, base_delay=0.001)
    assert attempts == 2
    assert out.data == {"n": "1", "other": "x"}
