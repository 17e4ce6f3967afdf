"""A Job with ``podFailurePolicy`` on the real Job controller, claims from a template on
the real resourceclaim controller, and a device fault in the middle.

The Job allows no failure (``backoffLimit: 0``) but ignores pods that failed with the
``DisruptionTarget`` condition. The real resourceclaim controller makes the pod's claim from
its ResourceClaimTemplate, the real scheduler allocates it, the agent (kubelet mode) runs
the pod. A fault on its device: drahealth's DeviceTaintRule (NoExecute, mode ``delete``),
the real device-taint eviction controller marks the pod ``DisruptionTarget`` and deletes
it, the agent ends it Failed, the real Job controller does not count that failure and
starts a replacement, which the real scheduler puts on another device. Where the release
serves no DeviceTaintRule the controller evicts through the Eviction API itself, which
marks the pod the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Namespace, Pod

from drahealth.kube import resource_class
from drahealth.remedy._controller import RemediationController
from drahealth.remedy._policy_load import parse_policy
from tests.integration.driver.test_sample_driver import inject
from tests.realk8s.harness import Cluster
from tests.realk8s.test_story import (
    DRIVER,
    POLICY,
    _device_class,
    base,
    expected_rules_version,
    node_with_driver,
    say,
    served,
    until,
)

__all__ = ["base"]

pytestmark = [pytest.mark.timeout(240), pytest.mark.realk8s]
NS = "jobs"


async def _claim_device(client: AsyncClient, claim_cls: Any, pod: Pod) -> str:
    """The device allocated to the pod's claim (named in its resourceClaimStatuses)."""
    statuses = (pod.status.resourceClaimStatuses or []) if pod.status else []
    if not statuses or not statuses[0].resourceClaimName:
        return ""
    claim = await client.get(claim_cls, statuses[0].resourceClaimName, namespace=NS)
    alloc = claim.status.allocation if claim.status else None
    if alloc is None or alloc.devices is None or not alloc.devices.results:
        return ""
    result = alloc.devices.results[0]
    return f"{result.pool}/{result.device}"


async def _job_pods(client: AsyncClient) -> list[Pod]:
    return [p async for p in client.list(Pod, namespace=NS, labels={"job-name": "train"})]


async def test_a_job_ignores_the_device_taint_eviction_and_replaces_the_pod(
    real_cluster: Cluster, real_client: AsyncClient, base: str
) -> None:
    client = real_client
    apis = await served(client)
    claim_cls = apis.resource("ResourceClaim") or resource_class("ResourceClaim", "v1")
    template_cls = apis.resource("ResourceClaimTemplate") or resource_class(
        "ResourceClaimTemplate", "v1"
    )
    # two nodes: where the release serves no DeviceTaintRule the controller fences the
    # whole node, and the replacement has to go to the other one
    node, other = "job-node", "job-node-2"
    with contextlib.suppress(ApiError):
        await client.create(Namespace(metadata=ObjectMeta(name=NS)))
    for sub in ("a", "b"):
        os.makedirs(f"{base}/{sub}")
    async with (
        node_with_driver(f"{base}/a", real_cluster, node) as (_agent, driver),
        node_with_driver(f"{base}/b", real_cluster, other) as (_other_agent, other_driver),
    ):
        for name in (node, other):
            await until(lambda name=name: _node_ready(client, name), 60, f"{name} Ready")
        await _device_class(client, apis)
        await client.create(
            template_cls.from_dict(
                {
                    "metadata": {"name": "one-gpu", "namespace": NS},
                    "spec": {
                        "spec": {
                            "devices": {
                                "requests": [
                                    {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
                                ]
                            }
                        }
                    },
                }
            )
        )
        await client.create(Job.from_dict(_job([node, other])))
        t0 = time.monotonic()

        async def first_running() -> tuple[str, str]:
            for pod in await _job_pods(client):
                if pod.status and pod.status.phase == "Running" and pod.metadata:
                    device = await _claim_device(client, claim_cls, pod)
                    return (str(pod.metadata.name), device) if device else ("", "")
            return "", ""

        first, bad = await until(
            lambda: _truthy_pair(first_running()), 60, "the Job's pod Running on its claim"
        )
        pool, device = bad.split("/")
        if pool == other:
            driver = other_driver  # the fault goes to the device the pod holds
        say(real_cluster, "Job pod: claim from template, allocated, Running",
            time.monotonic() - t0)  # fmt: skip

        mode = "delete" if expected_rules_version(real_cluster) is not None else "evict"
        policy = parse_policy(POLICY.format(mode=mode), "p")
        controller = RemediationController(client, policy, identity="jobs")
        ctl = asyncio.create_task(controller.run())
        try:
            t0 = time.monotonic()
            rc = await inject(driver.state, device, "unhealthy", "--message", "XID 79")
            assert rc[0] == 0, rc

            async def replaced() -> tuple[str, str]:
                for pod in await _job_pods(client):
                    name = str(pod.metadata.name) if pod.metadata else ""
                    if name != first and pod.status and pod.status.phase == "Running":
                        held = await _claim_device(client, claim_cls, pod)
                        return (name, held) if held else ("", "")
                return "", ""

            second, placed = await until(
                lambda: _truthy_pair(replaced()), 90, "a replacement pod Running"
            )
            say(real_cluster, "fault -> Job replacement Running", time.monotonic() - t0)
            assert placed != bad, f"replacement {second} was placed on the bad device {bad}"
            job = await client.get(Job, "train", namespace=NS)
            status = job.status
            assert status is not None
            failed = [c.type for c in status.conditions or [] if c.status == "True"]
            assert "Failed" not in failed and "FailureTarget" not in failed, status
            assert not status.failed, f"the disrupted pod counted as a failure: {status}"
        finally:
            ctl.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ctl
            with contextlib.suppress(ApiError):
                await client.delete(Job, "train", namespace=NS)


async def _truthy_pair(pending: Any) -> tuple[str, str] | None:
    pair = await pending
    return pair if all(pair) else None


async def _node_ready(client: AsyncClient, node: str) -> bool:
    from lightkube.resources.core_v1 import Node

    obj = await client.get(Node, node)
    conds = (obj.status.conditions or []) if obj.status else []
    return any(c.type == "Ready" and c.status == "True" for c in conds)


def _on_nodes(nodes: list[str]) -> dict[str, Any]:
    """Node affinity to any of ``nodes`` (other tests' nodes stay registered)."""
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                  "values": nodes}]}  # fmt: skip
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}  # fmt: skip


def _job(nodes: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": NS},
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                    {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}},
                ]
            },
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "affinity": _on_nodes(nodes),
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 1,
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "command": ["sleep", "3600"],
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                }
            },
        },
    }
