"""Extended resources backed by DRA (``DRAExtendedResource``, GA in 1.37): a pod asking
``example.com/gpu: 1`` gets a claim the scheduler creates.

Written from upstream kubernetes/kubernetes
``pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go``: the
special claim is created at PreBind with ``generateName: <pod>-extended-resources-``, the
pod as controlling owner and the annotation
``resource.kubernetes.io/extended-resource-claim: "true"``; one ExactCount request per
container and resource named ``container-<i>-request-<j>``; the pod's
``status.extendedResourceClaimStatus`` maps each container's resource to its request.
The claim is then allocated and reserved like any other, and, being owned by the pod,
deleted by the resourceclaim controller once the pod is done
(``pkg/controller/resourceclaim/controller.go``). The gate's stages are in
``pkg/features/kube_features.go``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.conformance._dra_world import CLAIMS, NS, RES, World, eventually, world

__all__ = ["world"]

pytestmark = pytest.mark.timeout(60)


async def test_pod_asking_an_extended_resource_gets_a_generated_claim(world: World) -> None:
    w = world
    await w.node("node-1")
    await w.gpus("node-1", 2)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu"},
        "spec": {
            "selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}],
            "extendedResourceName": "example.com/gpu",
        },
    }
    await w.http.ok("POST", f"{RES}/deviceclasses", body)
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {
                        "requests": {"cpu": "1", "example.com/gpu": "2"},
                        "limits": {"example.com/gpu": "2"},
                    },
                }
            ]
        },
    }
    created = await w.http.ok("POST", f"{NS}/pods", pod)
    assert await w.bound("trainer") == "node-1"
    got = await w.http.ok("GET", f"{NS}/pods/trainer")
    status = got["status"]["extendedResourceClaimStatus"]
    name = status["resourceClaimName"]
    assert re.fullmatch(r"trainer-extended-resources-[a-z0-9]{5}", name), name
    # requests sorted in the container: cpu (0), example.com/gpu (1)
    assert status["requestMappings"] == [
        {"containerName": "main", "resourceName": "example.com/gpu",
         "requestName": "container-0-request-1"}
    ]  # fmt: skip
    claim = await w.http.ok("GET", f"{CLAIMS}/{name}")
    meta = claim["metadata"]
    assert meta["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
    owner = meta["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Pod", "trainer", created["metadata"]["uid"], True
    )  # fmt: skip
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["name"] == "container-0-request-1"
    assert request["exactly"]["deviceClassName"] == "gpu"
    assert request["exactly"]["count"] == 2
    assert len(claim["status"]["allocation"]["devices"]["results"]) == 2
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [created["metadata"]["uid"]]
    assert "resource.kubernetes.io/delete-protection" in meta["finalizers"]

    await w.finish("trainer")

    async def gone() -> bool:
        return await w.http.get(f"{CLAIMS}/{name}") is None

    await eventually(gone, 10, "the extended-resource claim deleted after its pod finished")
