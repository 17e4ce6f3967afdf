"""NoExecute end to end on the embedded control plane: taint -> eviction -> replacement.

Two nodes with two GPUs each (ResourceSlices), a DeviceClass, a ResourceClaimTemplate
and a ReplicaSet of one pod. The control plane's stand-ins schedule the pod (claim from
the template, allocation, binding), evict it when its device is tainted NoExecute, and
the ReplicaSet stand-in replaces it; the replacement must land on a healthy device.
Device health is written the way node agents publish it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.apps_v1 import ReplicaSet
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.resource_v1 import (
    DeviceClass,
    DeviceTaintRule,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)

from drahealth.remedy._controller import RemediationController
from drahealth.standins import StandIns
from tests.integration.kube.conftest import api_server_options, client
from tests.integration.remedy.test_controller import policy, set_health

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(60)

D = "gpu.example.com"

RULES = """- name: fatal
  match: {driver: gpu.example.com, message: "XID"}
  action: {effect: NoExecute}
  recovery: {healthyFor: 1s}
"""


async def seed(client: AsyncClient) -> None:
    for node in ("node-1", "node-2"):
        await client.create(Node.from_dict({"metadata": {"name": node}}))  # the scheduler's
        await client.create(
            ResourceSlice.from_dict(
                {
                    "metadata": {"name": f"{node}-{D}"},
                    "spec": {
                        "driver": D,
                        "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}],
                    },
                }
            )
        )
    await client.create(
        DeviceClass.from_dict(
            {
                "metadata": {"name": "gpu"},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{D}"'}}]},
            }
        )
    )
    await client.create(
        ResourceClaimTemplate.from_dict(
            {
                "metadata": {"name": "one-gpu", "namespace": "default"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]
                        }
                    }
                },
            }
        )
    )
    await client.create(
        ReplicaSet.from_dict(
            {
                "metadata": {"name": "trainer", "namespace": "default"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "trainer"}},
                    "template": {
                        "metadata": {"labels": {"app": "trainer"}},
                        "spec": {
                            "resourceClaims": [
                                {"name": "gpu", "resourceClaimTemplateName": "one-gpu"}
                            ],
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "x",
                                    "resources": {"claims": [{"name": "gpu"}]},
                                }
                            ],
                        },
                    },
                },
            }
        )
    )


async def placement(client: AsyncClient) -> tuple[str, str, str] | None:
    """(pod name, node, device) of the live, bound trainer pod with an allocated claim."""
    pods = [
        p async for p in client.list(Pod, namespace="default")
        if p.metadata and not p.metadata.deletionTimestamp and p.spec and p.spec.nodeName
    ]  # fmt: skip
    for pod in pods:
        for status in (pod.status.resourceClaimStatuses or []) if pod.status else []:
            claim = await client.get(ResourceClaim, status.resourceClaimName, namespace="default")
            alloc = claim.status.allocation if claim.status else None
            if alloc is not None and alloc.devices and alloc.devices.results:
                r = alloc.devices.results[0]
                return str(pod.metadata.name), str(pod.spec.nodeName), f"{r.pool}/{r.device}"
    return None


@contextlib.asynccontextmanager
async def world(client: AsyncClient) -> AsyncIterator[StandIns]:
    standins = StandIns(client)
    controller = RemediationController(client, policy(RULES), identity="c")
    await standins.start()
    task = asyncio.create_task(controller.run())
    try:
        yield standins
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await standins.stop()


async def wait(check: Any, within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_noexecute_replaces_the_pod_on_a_healthy_device(client: AsyncClient) -> None:
    await seed(client)
    await set_health(client, gpu_0="Healthy", gpu_1="Healthy")
    async with world(client) as standins:
        first = await wait(lambda: placement(client), 10, "the first pod to be scheduled")
        pod, node, device = first
        assert (node, device) == ("node-1", "node-1/gpu-0")
        t0 = time.monotonic()
        await set_health(client, gpu_0=("Unhealthy", "XID 79"), gpu_1="Healthy")

        async def replaced() -> tuple[str, str, str] | None:
            now = await placement(client)
            return now if now is not None and now[0] != pod else None

        _new_pod, new_node, new_device = await wait(replaced, 10, "a replacement pod")
        print(f"Unhealthy -> replacement bound: {(time.monotonic() - t0) * 1000:.0f} ms")
        assert new_device != device and (new_node, new_device) == ("node-1", "node-1/gpu-1")
        assert standins.taint_eviction.deleted == 1 and standins.replicasets.created == 2

        async def reported() -> Any:
            for rule in [r async for r in client.list(DeviceTaintRule)]:
                for c in (rule.status.conditions or []) if rule.status else []:
                    if c.type == "EvictionInProgress" and c.message == "1 pod(s) evicted":
                        return c
            return None

        condition = await wait(reported, 5, "EvictionInProgress on the rule")
        assert condition.status == "False" and condition.reason == "Completed"
        with pytest.raises(ApiError, match="not found"):  # the evicted pod is gone
            await client.get(Pod, pod, namespace="default")
        # the Event upstream's device-taint eviction controller records on the pod
        events = [
            e async for e in client.list(Event, namespace="default")
            if e.involvedObject.name == pod and e.reason != "Scheduled"
        ]  # fmt: skip
        assert [(e.reason, e.message) for e in events] == [
            ("DeviceTaintManagerEviction", "Marking for deletion")
        ]
