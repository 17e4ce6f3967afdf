"""The kubelet mode's pod status write keeps conditions it does not own.

The agent writes a pod's status from its cached copy of the pod. When another
controller adds a condition between that read and the write (the device-taint eviction
controller's ``DisruptionTarget``, the Eviction API's), the write must not remove it:
a Job's podFailurePolicy reads that condition to ignore the failure. Seen on the real
control plane as a Job failed by a device eviction now and then. The write is a strategic
merge patch (:data:`~drahealth.node._kubelet.POD_STATUS_PATCH`), whose conditions merge by
type; this holds it to that on the embedded API server.
"""

from __future__ import annotations

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from drahealth.kube import patch_status
from drahealth.node._kubelet import POD_STATUS_PATCH
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(30)

RUNNING = {
    "phase": "Failed",
    "conditions": [
        {"type": "Ready", "status": "False", "reason": "PodFailed"},
        {"type": "ContainersReady", "status": "False", "reason": "PodFailed"},
    ],
}


async def _pod_with_disruption_target(client: AsyncClient) -> None:
    await client.create(
        Pod.from_dict(
            {
                "metadata": {"name": "worker", "namespace": "default"},
                "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "x"}]},
            }
        )
    )
    target = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "DeletionByDeviceTaintManager",
    }
    await patch_status(
        client, Pod, "worker", {"status": {"phase": "Running", "conditions": [target]}},
        namespace="default", patch_type=PatchType.MERGE,
    )  # fmt: skip


async def _conditions(client: AsyncClient) -> set[str]:
    pod = await client.get(Pod, "worker", namespace="default")
    return {c.type for c in (pod.status.conditions or [])} if pod.status else set()


async def test_the_agents_status_write_keeps_a_condition_it_did_not_see(
    client: AsyncClient,
) -> None:
    await _pod_with_disruption_target(client)
    # the agent's write, from a cached pod that has not seen DisruptionTarget yet
    await patch_status(
        client, Pod, "worker", {"status": RUNNING}, namespace="default",
        patch_type=POD_STATUS_PATCH,
    )  # fmt: skip
    assert await _conditions(client) == {"DisruptionTarget", "Ready", "ContainersReady"}


async def test_a_json_merge_patch_would_have_dropped_it(client: AsyncClient) -> None:
    """Why the patch type matters: the same write as a JSON merge patch loses it."""
    await _pod_with_disruption_target(client)
    await patch_status(
        client, Pod, "worker", {"status": RUNNING}, namespace="default",
        patch_type=PatchType.MERGE,
    )  # fmt: skip
    assert "DisruptionTarget" not in await _conditions(client)
