"""The controller and pods that got their device through an extended resource (KEP-5004).

In ``eviction.mode: delete`` the cluster's device-taint eviction controller deletes the
claims' users of a NoExecute device, but it misses pods whose device came from the
scheduler's special claim (k/k #141290): the controller evicts those itself, through
the Eviction API, and leaves the claim users to the cluster.
"""

from __future__ import annotations

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client
from tests.integration.remedy.test_controller import (
    DRIVER,
    NODE,
    make_pod,
    policy,
    rules,
    running,
    set_health,
)

__all__ = ["api_server_options", "client"]

RULES = """- name: xid
  match: {driver: gpu.example.com, message: "XID"}
  action: {effect: NoExecute}
  recovery: {healthyFor: 1s}
"""
SPECIAL = "ext-extended-resources-abcde"


async def make_extended_pod(client: AsyncClient, device: str) -> None:
    claim = {
        "metadata": {"name": SPECIAL, "namespace": "default",
                     "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
            "deviceClassName": "g", "allocationMode": "ExactCount", "count": 1}}]}},
    }  # fmt: skip
    await client.create(ResourceClaim.from_dict(claim))
    result = {"request": "container-0-request-0", "driver": DRIVER, "pool": NODE, "device": device}
    await client.patch(
        ResourceClaim.Status, SPECIAL,
        {"status": {"allocation": {"devices": {"results": [result]}}}},
        namespace="default", patch_type=PatchType.MERGE,
    )  # fmt: skip
    pod = {
        "metadata": {"name": "ext", "namespace": "default"},
        "spec": {"nodeName": NODE, "containers": [
            {"name": "main", "image": "x", "resources": {"requests": {"example.com/gpu": "1"}}}]},
    }  # fmt: skip
    await client.create(Pod.from_dict(pod))
    status = {
        "phase": "Running",
        "extendedResourceClaimStatus": {
            "resourceClaimName": SPECIAL,
            "requestMappings": [{"containerName": "main", "resourceName": "example.com/gpu",
                                 "requestName": "container-0-request-0"}],
        },
    }  # fmt: skip
    await client.patch(
        Pod.Status, "ext", {"status": status}, namespace="default", patch_type=PatchType.MERGE
    )


async def names(client: AsyncClient) -> set[str]:
    return {str(p.metadata.name) async for p in client.list(Pod, namespace="default")}


async def test_delete_mode_evicts_only_what_the_cluster_would_miss(client: AsyncClient) -> None:
    await set_health(client, gpu_0="Healthy")
    await make_pod(client, "claimer", "gpu-0", {"app": "claimer"})
    await make_extended_pod(client, "gpu-0")
    async with running(client, policy(RULES)):
        await set_health(client, gpu_0=("Unhealthy", "XID 79"))

        async def ext_gone() -> bool:
            return await names(client) == {"claimer"}

        await eventually(ext_gone, 10.0, "the extended-resource pod to be evicted")
        (rule,) = (await rules(client)).values()
        assert rule.spec.taint.effect == "NoExecute"  # the claim user is the cluster's
        assert await names(client) == {"claimer"}
