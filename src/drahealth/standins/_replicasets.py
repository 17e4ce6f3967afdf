"""Stand-in for kube-controller-manager's ReplicaSet controller (``apps/v1``).

Owns :class:`ReplicaSetStandIn`: keeps ``spec.replicas`` live pods (not ended, not
being deleted) per ReplicaSet from its template, as the ReplicaSet controller does
(at most :data:`~._loop.BURST` creates per pass, in slow-start batches, stopping at once
when the set is deleted or replaced), and writes its status (``replicas``,
``fullyLabeledReplicas``, ``readyReplicas``, ``availableReplicas`` after
``minReadySeconds``, ``observedGeneration``).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import secrets
import time
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.apps_v1 import ReplicaSet
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from drahealth.kube import Reflector

from ._loop import BURST, pod_active, reconcile_loop, slow_start

__all__ = ["ReplicaSetStandIn"]

JSON = dict[str, Any]


def _owned_by(pod: JSON, owner: JSON) -> bool:
    meta = pod["metadata"]
    return meta.get("namespace") == owner["namespace"] and any(
        o.get("uid") == owner["uid"] for o in meta.get("ownerReferences") or []
    )


def _ready_since(pod: JSON) -> float | None:
    """When the pod became ready (epoch seconds; 0 when unknown), None if it is not."""
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            if cond.get("status") != "True":
                return None
            try:
                when = datetime.datetime.fromisoformat(str(cond.get("lastTransitionTime")))
            except ValueError:
                return 0.0
            return when.timestamp()
    return 0.0 if status.get("phase") == "Running" else None


def _replica_status(rs: JSON, live: list[JSON]) -> JSON:
    """The ReplicaSet controller's counts: replicas, pods whose labels carry all of the
    template's, ready pods, pods ready for ``minReadySeconds``, the generation seen."""
    spec = rs.get("spec") or {}
    template = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    min_ready = int(spec.get("minReadySeconds") or 0)
    now = time.time()
    labeled = ready = available = 0
    for pod in live:
        labels = pod["metadata"].get("labels") or {}
        labeled += all(labels.get(k) == v for k, v in template.items())
        since = _ready_since(pod)
        if since is not None:
            ready += 1
            available += min_ready == 0 or since + min_ready <= now
    return {
        "replicas": len(live),
        "fullyLabeledReplicas": labeled,
        "readyReplicas": ready,
        "availableReplicas": available,
        "observedGeneration": rs["metadata"].get("generation", 1),
    }


class ReplicaSetStandIn:
    """See the module docstring; ``run()`` until cancelled."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.sets: Reflector[ReplicaSet] = Reflector(client, ReplicaSet, name="rs-sets")
        self.pods: Reflector[Pod] = Reflector(client, Pod, name="rs-pods")
        self.created = 0

    async def run(self) -> None:
        await reconcile_loop([self.sets, self.pods], self.pass_once, "replicasets")

    async def pass_once(self) -> None:
        pods = self.pods.store.dicts()
        for rs in self.sets.store.dicts():
            meta, spec = rs["metadata"], rs.get("spec") or {}
            owned = [p for p in pods if _owned_by(p, meta)]
            live = sorted((p for p in owned if pod_active(p)), key=lambda p: p["metadata"]["name"])
            want = max(0, int(spec.get("replicas", 1)))
            if not self._current(meta):
                continue  # deleted (or replaced) since this pass began
            missing = min(want - len(live), BURST)
            if missing > 0:
                await slow_start(missing, functools.partial(self._create, rs),
                                 functools.partial(self._current, meta))  # fmt: skip
            for extra in live[want:]:
                with contextlib.suppress(ApiError):
                    await self.client.delete(
                        Pod, extra["metadata"]["name"], namespace=meta["namespace"]
                    )
            status = _replica_status(rs, live[:want])
            if {k: (rs.get("status") or {}).get(k) for k in status} != status:
                with contextlib.suppress(ApiError):
                    await self.client.patch(
                        ReplicaSet.Status, meta["name"], {"status": status},
                        namespace=meta["namespace"], patch_type=PatchType.MERGE,
                    )  # fmt: skip

    def _current(self, meta: JSON) -> bool:
        """Whether the set ``meta`` describes is still in the cache, same uid, not deleting."""
        cached = self.sets.store.get(meta["namespace"], meta["name"])
        if cached is None or cached.metadata is None:
            return False
        return cached.metadata.uid == meta["uid"] and cached.metadata.deletionTimestamp is None

    async def _create(self, rs: JSON) -> None:
        meta = rs["metadata"]
        template = (rs.get("spec") or {}).get("template") or {}
        pod_meta = dict(template.get("metadata") or {})
        pod_meta.update(
            name=f"{meta['name']}-{secrets.token_hex(3)}",
            namespace=meta["namespace"],
            ownerReferences=[
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": meta["name"],
                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}
            ],
        )  # fmt: skip
        body = {"metadata": pod_meta, "spec": template.get("spec") or {}}
        await self.client.create(Pod.from_dict(body))  # type: ignore[call-overload]
        self.created += 1
