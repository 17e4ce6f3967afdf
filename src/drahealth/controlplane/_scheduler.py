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

Nodes are filtered as kube-scheduler's TaintToleration and NodeUnschedulable plugins
do: a Node taint with effect NoSchedule or NoExecute the pod's ``spec.tolerations``
do not tolerate, or ``spec.unschedulable`` (cordon, the taint
``node.kubernetes.io/unschedulable:NoSchedule``), keeps pods off the node. Device
taints follow the release profile: ignored without ``DRADeviceTaints``, and
DeviceTaintRules read at the version the release serves (not at all when none); a
1.34 alpha rule's ``deviceClassName`` and CEL ``selectors`` narrow what it selects.

Claims no live pod reserves any more are deallocated; generated claims whose pod is
gone are deleted (the garbage collector's job upstream). A stand-in for the embedded
control plane: one pod at a time, no scoring, no preemption.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources import resource_v1alpha3
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)
from lightkube.types import PatchType

from drahealth.controlplane._allocate import (
    AllocationError,
    Device,
    allocate,
    cel_selects,
    devices_from_slices,
)
from drahealth.controlplane._loop import reconcile_loop
from drahealth.controlplane._resources import DeviceTaintRuleSpec134
from drahealth.core import (
    NEWEST_KUBE_VERSION,
    KubeProfile,
    Taint,
    choose_version,
    kube_profile,
    pod_claim_names,
    selects,
    tolerated,
)
from drahealth.kube import Reflector, as_dict, resource_class

__all__ = ["SchedulerStandIn", "node_misfit", "rule_class", "rule_taints"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
_ENDED = ("Succeeded", "Failed")


UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")


class DeviceTaintRule134(resource_v1alpha3.DeviceTaintRule):
    """The 1.34 alpha rule as a client type: its selector keeps ``deviceClassName`` and
    CEL ``selectors`` (the shipped v1alpha3 type has the 1.35 shape and drops them)."""

    spec: DeviceTaintRuleSpec134  # type: ignore[assignment]  # the wider 1.34 shape


def rule_class(profile: KubeProfile) -> Any:
    """The client type for the DeviceTaintRules ``profile`` serves, or None (not served)."""
    version = choose_version(profile.served_versions("DeviceTaintRule"))
    if version is None:
        return None
    if profile.rule_cel_selectors:
        return DeviceTaintRule134
    return resource_class("DeviceTaintRule", version)


def _rule_selects(sel: Any, d: Device, classes: Mapping[str, JSON]) -> bool:
    if not isinstance(sel, Mapping) or not selects(sel, d.driver, d.pool, d.name):
        return False
    exprs = []
    if sel.get("deviceClassName"):  # 1.34 alpha: the class's selectors must match too
        cls = classes.get(str(sel["deviceClassName"]))
        if cls is None:
            return False
        exprs += list((cls.get("spec") or {}).get("selectors") or [])
    exprs += list(sel.get("selectors") or [])
    return not exprs or cel_selects(exprs, d)


def rule_taints(
    rules: list[JSON], effects: tuple[str, ...], classes: Mapping[str, JSON] | None = None
) -> Any:
    """A function device -> taints of the DeviceTaintRules that select it.

    ``classes`` (name -> DeviceClass) resolves a 1.34 rule's ``deviceClassName``.
    """
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
    known = classes or {}

    def taints(d: Device) -> list[Taint]:
        return [t for sel, t in selected if _rule_selects(sel, d, known)]

    return taints


def node_misfit(node: JSON, pod: JSON) -> str | None:
    """Why ``pod`` may not be scheduled to ``node`` (taints, cordon), or None if it may."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    spec = node.get("spec") or {}
    if spec.get("unschedulable") and not tolerated(UNSCHEDULABLE_TAINT, tolerations):
        return "node is unschedulable (cordoned)"
    for raw in spec.get("taints") or []:
        if not isinstance(raw, dict) or raw.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        taint = Taint(str(raw.get("key", "")), str(raw.get("value") or ""), str(raw["effect"]))
        if not tolerated(taint, tolerations):
            return f"node has the untolerated taint {taint.key}={taint.value}:{taint.effect}"
    return None


class SchedulerStandIn:
    """See the module docstring; ``run()`` until cancelled."""

    def __init__(self, client: AsyncClient, profile: KubeProfile | None = None) -> None:
        self.client = client
        profile = profile or kube_profile(NEWEST_KUBE_VERSION)
        #: Device taints (slice and rule) are honoured only with ``DRADeviceTaints``.
        self.device_taints = profile.slice_taints
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
        rules = rule_class(profile) if self.device_taints else None
        self.rules: Reflector[Any] | None = (
            None if rules is None else Reflector(client, rules, name="sched-rules")
        )
        self.nodes: Reflector[Node] = Reflector(client, Node, name="sched-nodes")
        self.bound = 0
        self.unschedulable: dict[str, str] = {}  # namespace/name -> reason

    async def run(self) -> None:
        reflectors: list[Reflector[Any]] = [
            self.pods, self.claims, self.templates, self.slices, self.classes, self.nodes,
        ]  # fmt: skip
        if self.rules is not None:
            reflectors.append(self.rules)
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
        if not self.device_taints:
            devices = [dataclasses.replace(d, taints=()) for d in devices]
        classes = {
            str(c.metadata.name): as_dict(c) for c in self.classes.store.list() if c.metadata
        }
        rules = self.rules.store.dicts() if self.rules is not None else []
        taints = rule_taints(rules, ("NoSchedule", "NoExecute"), classes)
        nodes = {n["metadata"]["name"]: n for n in self.nodes.store.dicts()}
        misfits = {name: why for name, n in nodes.items() if (why := node_misfit(n, pod))}
        node_names = {d.node for d in devices if d.node}
        fitting = sorted(node_names - set(misfits))
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
                if claim_node in misfits:
                    why = f"claim {c['metadata']['name']} is on {claim_node}: {misfits[claim_node]}"
                    self._unschedulable(pod, why)
                    await self._mark_unschedulable(pod, why)
                    return
                node = claim_node or node
                plans.append((c, []))
                continue
            try:
                if not fitting and node is None and node_names:
                    raise AllocationError(_misfit_text(misfits, len(nodes)))
                chosen, results = allocate(
                    c, devices, classes, in_use=in_use, rule_taints=taints,
                    nodes=fitting if node is None else [node],
                )  # fmt: skip
            except AllocationError as exc:
                self._unschedulable(pod, f"claim {c['metadata']['name']}: {exc}")
                await self._mark_unschedulable(pod, str(exc))
                return
            node = chosen
            in_use |= {(r["driver"], r["pool"], r["device"]) for r in results}
            plans.append((c, results))
        if node is None:
            free = sorted(set(nodes) - set(misfits))
            if not free:
                why = _misfit_text(misfits, len(nodes)) if misfits else "no nodes"
                self._unschedulable(pod, why)
                if misfits:
                    await self._mark_unschedulable(pod, why)
                return
            node = free[0]
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


def _misfit_text(misfits: Mapping[str, str], total: int) -> str:
    """kube-scheduler's summary: ``0/N nodes are available: <node>: <why>; ...``."""
    shown = "; ".join(f"{n}: {why}" for n, why in sorted(misfits.items())[:8])
    return f"0/{max(total, len(misfits))} nodes are available: {shown}"


def _alloc_node(alloc: JSON) -> str | None:
    for term in ((alloc.get("nodeSelector") or {}).get("nodeSelectorTerms")) or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return None
