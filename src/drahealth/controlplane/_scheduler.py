"""Stand-in for kube-scheduler's DRA path and the resourceclaim controller.

Owns :class:`SchedulerStandIn`. For every pod without ``spec.nodeName``:

1. claims from ``resourceClaimTemplateName`` are created (named
   ``<pod>-<claim>-<suffix>``, owned by the pod) and listed in the pod's
   ``status.resourceClaimStatuses``, as the resourceclaim controller does;
2. each unallocated claim is allocated by :func:`~._allocate.allocate` on one node
   (devices held by other claims and devices tainted NoSchedule/NoExecute by their
   slice or a DeviceTaintRule are skipped unless tolerated), reserved for the pod;
3. the pod is bound (``spec.nodeName``). A pod that does not fit gets
   ``PodScheduled=False`` with the reason, and is retried on the next change.

Claims no live pod reserves any more are deallocated; generated claims whose pod is
gone are deleted (the garbage collector's job upstream). A stand-in for the embedded
control plane: one pod at a time, no scoring, no preemption.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import (
    DeviceClass,
    DeviceTaintRule,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)
from lightkube.types import PatchType

from drahealth.controlplane._allocate import (
    AllocationError,
    Device,
    allocate,
    devices_from_slices,
)
from drahealth.controlplane._loop import reconcile_loop
from drahealth.core import Taint, pod_claim_names, selects
from drahealth.kube import Reflector, as_dict

__all__ = ["SchedulerStandIn", "rule_taints"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
_ENDED = ("Succeeded", "Failed")


def rule_taints(rules: list[JSON], effects: tuple[str, ...]) -> Any:
    """A function device -> taints of the DeviceTaintRules that select it."""
    selected = []
    for r in rules:
        spec = r.get("spec") or {}
        taint = spec.get("taint") or {}
        if taint.get("effect") not in effects:
            continue
        sel = spec.get("deviceSelector")
        selected.append(
            (
                sel,
                Taint(str(taint.get("key")), str(taint.get("value") or ""), str(taint["effect"])),
            )
        )

    def taints(d: Device) -> list[Taint]:
        return [t for sel, t in selected if selects(sel, d.driver, d.pool, d.name)]

    return taints


class SchedulerStandIn:
    """See the module docstring; ``run()`` until cancelled."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.pods: Reflector[Pod] = Reflector(client, Pod, name="sched-pods")
        self.claims: Reflector[ResourceClaim] = Reflector(
            client, ResourceClaim, name="sched-claims"
        )
        self.templates: Reflector[ResourceClaimTemplate] = Reflector(
            client, ResourceClaimTemplate, name="sched-templates"
        )
        self.slices: Reflector[ResourceSlice] = Reflector(
            client, ResourceSlice, name="sched-slices"
        )
        self.classes: Reflector[DeviceClass] = Reflector(client, DeviceClass, name="sched-classes")
        self.rules: Reflector[DeviceTaintRule] = Reflector(
            client, DeviceTaintRule, name="sched-rules"
        )
        self.nodes: Reflector[Node] = Reflector(client, Node, name="sched-nodes")
        self.bound = 0
        self.unschedulable: dict[str, str] = {}  # namespace/name -> reason

    async def run(self) -> None:
        reflectors: list[Reflector[Any]] = [
            self.pods, self.claims, self.templates, self.slices, self.classes, self.rules,
            self.nodes,
        ]  # fmt: skip
        await reconcile_loop(reflectors, self.pass_once, "scheduler stand-in")

    async def pass_once(self) -> None:
        pods = self.pods.store.dicts()
        live = {
            str(p["metadata"].get("uid"))
            for p in pods
            if (p.get("status") or {}).get("phase") not in _ENDED
            and not p["metadata"].get("deletionTimestamp")
        }
        await self._release(live)
        for pod in sorted(pods, key=lambda p: str(p["metadata"].get("creationTimestamp", ""))):
            spec, meta = pod.get("spec") or {}, pod["metadata"]
            if spec.get("nodeName") or meta.get("deletionTimestamp"):
                continue
            if (pod.get("status") or {}).get("phase") in _ENDED:
                continue
            await self._schedule(pod)

    async def _release(self, live: set[str]) -> None:
        existing = {str(p.metadata.uid) for p in self.pods.store.list() if p.metadata}
        for c in self.claims.store.dicts():
            meta, status = c["metadata"], c.get("status") or {}
            owners = [o for o in meta.get("ownerReferences") or [] if o.get("kind") == "Pod"]
            if owners and not any(o.get("uid") in existing for o in owners):
                with contextlib.suppress(ApiError):  # its pod is gone (an ended pod keeps it)
                    await self.client.delete(
                        ResourceClaim, meta["name"], namespace=meta["namespace"]
                    )
                continue
            reserved = status.get("reservedFor") or []
            if (
                status.get("allocation")
                and reserved
                and not any(r.get("uid") in live for r in reserved)
            ):
                await self.client.patch(
                    ResourceClaim.Status, meta["name"],
                    {"status": {"allocation": None, "reservedFor": None}},
                    namespace=meta["namespace"], patch_type=PatchType.MERGE,
                )  # fmt: skip

    async def _claim_names(self, pod: JSON) -> dict[str, str] | None:
        """ref -> claim name, creating claims from templates; None while one is missing."""
        meta, status = pod["metadata"], pod.get("status") or {}
        known = pod_claim_names(pod)
        out: dict[str, str] = {}
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = ref.get("name")
            if name in known:
                out[name] = known[name]
            elif ref.get("resourceClaimTemplateName"):
                template = self.templates.store.get(
                    meta["namespace"], ref["resourceClaimTemplateName"]
                )
                if template is None:
                    self._unschedulable(
                        pod, f"ResourceClaimTemplate {ref['resourceClaimTemplateName']} not found"
                    )
                    return None
                claim_name = f"{meta['name']}-{name}-{secrets.token_hex(3)}"[:253]
                body = {
                    "metadata": {
                        "name": claim_name,
                        "namespace": meta["namespace"],
                        "annotations": {"resource.kubernetes.io/pod-claim-name": name},
                        "ownerReferences": [
                            {
                                "apiVersion": "v1",
                                "kind": "Pod",
                                "name": meta["name"],
                                "uid": meta["uid"],
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "spec": as_dict(template).get("spec", {}).get("spec", {}),
                }
                await self.client.create(ResourceClaim.from_dict(body))  # type: ignore[call-overload]
                statuses = [
                    *(status.get("resourceClaimStatuses") or []),
                    {"name": name, "resourceClaimName": claim_name},
                ]
                await self.client.patch(
                    Pod.Status, meta["name"], {"status": {"resourceClaimStatuses": statuses}},
                    namespace=meta["namespace"], patch_type=PatchType.MERGE,
                )  # fmt: skip
                return None  # continue when the reflectors have both
        return out

    async def _schedule(self, pod: JSON) -> None:
        meta = pod["metadata"]
        names = await self._claim_names(pod)
        if names is None:
            return
        claims = {n: self.claims.store.get(meta["namespace"], c) for n, c in names.items()}
        missing = [c for n, c in names.items() if claims[n] is None]
        if missing:
            self._unschedulable(pod, f"ResourceClaim {missing[0]} not found")
            return
        all_claims = self.claims.store.dicts()
        in_use = {
            (r["driver"], r["pool"], r["device"])
            for c in all_claims
            for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            )
            or []
            if not r.get("adminAccess")
        }
        devices = devices_from_slices(self.slices.store.dicts())
        classes = {
            str(c.metadata.name): as_dict(c) for c in self.classes.store.list() if c.metadata
        }
        taints = rule_taints(self.rules.store.dicts(), ("NoSchedule", "NoExecute"))
        node: str | None = None
        plans: list[tuple[JSON, list[JSON]]] = []
        for claim_obj in claims.values():
            assert claim_obj is not None
            c = as_dict(claim_obj)
            alloc = (c.get("status") or {}).get("allocation")
            if alloc:
                claim_node = _alloc_node(alloc)
                if node is not None and claim_node and claim_node != node:
                    self._unschedulable(pod, "claims are allocated on different nodes")
                    return
                node = claim_node or node
                plans.append((c, []))
                continue
            try:
                chosen, results = allocate(
                    c, devices, classes, in_use=in_use, rule_taints=taints,
                    nodes=None if node is None else [node],
                )  # fmt: skip
            except AllocationError as exc:
                self._unschedulable(pod, f"claim {c['metadata']['name']}: {exc}")
                await self._mark_unschedulable(pod, str(exc))
                return
            node = chosen
            in_use |= {(r["driver"], r["pool"], r["device"]) for r in results}
            plans.append((c, results))
        if node is None:
            nodes = sorted(str(n.metadata.name) for n in self.nodes.store.list() if n.metadata)
            if not nodes:
                self._unschedulable(pod, "no nodes")
                return
            node = nodes[0]
        for c, results in plans:
            cm = c["metadata"]
            status: JSON = {
                "reservedFor": [{"resource": "pods", "name": meta["name"], "uid": meta["uid"]}]
            }
            if results:
                status["allocation"] = {
                    "devices": {"results": results},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                }  # fmt: skip
            await self.client.patch(
                ResourceClaim.Status, cm["name"], {"status": status}, namespace=cm["namespace"],
                patch_type=PatchType.MERGE,
            )  # fmt: skip
        await self.client.patch(
            Pod, meta["name"], {"spec": {"nodeName": node}}, namespace=meta["namespace"],
            patch_type=PatchType.MERGE,
        )  # fmt: skip
        self.unschedulable.pop(f"{meta['namespace']}/{meta['name']}", None)
        self.bound += 1
        log.info("bound pod %s/%s to %s", meta["namespace"], meta["name"], node)

    def _unschedulable(self, pod: JSON, reason: str) -> None:
        meta = pod["metadata"]
        self.unschedulable[f"{meta['namespace']}/{meta['name']}"] = reason

    async def _mark_unschedulable(self, pod: JSON, reason: str) -> None:
        meta = pod["metadata"]
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": reason[:1024],
        }
        conditions = [
            c
            for c in (pod.get("status") or {}).get("conditions") or []
            if c.get("type") != "PodScheduled"
        ]
        if any(c == condition for c in (pod.get("status") or {}).get("conditions") or []):
            return
        with contextlib.suppress(ApiError):
            await self.client.patch(
                Pod.Status, meta["name"], {"status": {"conditions": [*conditions, condition]}},
                namespace=meta["namespace"], patch_type=PatchType.MERGE,
            )  # fmt: skip


def _alloc_node(alloc: JSON) -> str | None:
    for term in ((alloc.get("nodeSelector") or {}).get("nodeSelectorTerms")) or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return None
