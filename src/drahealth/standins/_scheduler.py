"""Stand-in for kube-scheduler: its filters, the DRA plugin, binding and its Events.

Owns :class:`SchedulerStandIn`. For every pending pod without ``spec.nodeName`` (a
pod created with one is bound already, as upstream, and never scheduled):

1. PreFilter (DynamicResources): the pod's ResourceClaims must exist (generated ones
   recorded in ``status.resourceClaimStatuses`` by the resourceclaim controller
   stand-in, :mod:`._claims`, and owned by the pod), not be being deleted, and an
   allocated claim must have room in ``reservedFor`` (256 consumers);
2. Filter, per Node object in name order, the first plugin that rejects a node names
   it: NodeUnschedulable (``spec.unschedulable`` unless tolerated), TaintToleration
   (NoSchedule/NoExecute Node taints), NodeAffinity (``spec.nodeSelector`` and the
   required node affinity: ``matchExpressions`` In, NotIn, Exists, DoesNotExist, Gt,
   Lt; ``matchFields`` on ``metadata.name``), DynamicResources (an allocated claim's
   ``nodeSelector`` must match; unallocated claims are allocated on the node by
   :func:`~._allocate.allocate`, around devices other claims hold and, following the
   release profile, devices tainted by their slice or a DeviceTaintRule);
3. PreBind: each newly allocated claim gets the ``resource.kubernetes.io/delete-protection``
   finalizer, then allocation and ``reservedFor`` in one resourceVersion-checked write;
   an already allocated (shared) claim gets the pod appended to ``reservedFor`` by a
   JSON patch, never replacing other consumers; then the pod is bound
   (``spec.nodeName``, ``PodScheduled=True``) and a ``Scheduled`` Event says
   ``Successfully assigned <ns>/<pod> to <node>``.

A pod that fits nowhere gets ``PodScheduled=False`` reason ``Unschedulable`` with
kube-scheduler's FitError text (``0/2 nodes are available: 1 node(s) were
unschedulable, 1 node(s) had untolerated taint {key: value}. preemption: ...``) and a
``FailedScheduling`` Warning Event with the same text (once per distinct message); an
allocation that fails on a CEL expression aborts scheduling with reason
``SchedulerError`` and the allocator's message, as upstream. Device taints follow the
release profile: ignored without ``DRADeviceTaints``, DeviceTaintRules read at the
version the release serves (not at all when none); a 1.34 alpha rule's
``deviceClassName`` and CEL ``selectors`` narrow what it selects.

A stand-in: one pod at a time, the first feasible node by name (no scoring), no
preemption.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import secrets
import time
from collections.abc import Awaitable, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.resources import resource_v1alpha3
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import (
    DeviceClass,
    ResourceClaim,
    ResourceSlice,
)
from lightkube.types import PatchType

from drahealth.core import (
    NEWEST_KUBE_VERSION,
    KubeProfile,
    Taint,
    choose_version,
    kube_profile,
    selects,
    tolerated,
)
from drahealth.kube import DeviceTaintRuleSpec134, Reflector, as_dict, make_event, resource_class

from ._allocate import (
    Allocation,
    AllocationAborted,
    AllocationError,
    Device,
    allocate_claim,
    cel_selects,
    devices_from_slices,
    extended_resource_requests,
)
from ._claims import (
    FINALIZER,
    RESERVED_FOR_MAX,
    owning_pod,
    reserve_ops,
)
from ._loop import reconcile_loop

__all__ = [
    "SchedulerStandIn",
    "fit_error",
    "node_misfit",
    "node_selector_matches",
    "pod_affinity_matches",
    "rule_class",
    "rule_taints",
]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
_ENDED = ("Succeeded", "Failed")


#: Wall time one pod's DynamicResources filter may take (upstream's default filter
#: timeout): past it the pod fails with ``timed out trying to allocate devices``.
FILTER_TIMEOUT = 10.0

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
    """Why ``pod`` may not run on ``node``, in the words of the first kube-scheduler
    filter plugin that rejects it (NodeUnschedulable, TaintToleration, NodeAffinity, in
    upstream's order), or None if it may."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    spec = node.get("spec") or {}
    if spec.get("unschedulable") and not tolerated(UNSCHEDULABLE_TAINT, tolerations):
        return "node(s) were unschedulable"
    for raw in spec.get("taints") or []:
        if not isinstance(raw, dict) or raw.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        taint = Taint(str(raw.get("key", "")), str(raw.get("value") or ""), str(raw["effect"]))
        if not tolerated(taint, tolerations):
            return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    if not pod_affinity_matches(pod, node):
        return "node(s) didn't match Pod's node affinity/selector"
    return None


def _int(text: Any) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def _requirement(expr: Any, value: str | None) -> bool:
    """One ``NodeSelectorRequirement`` against the node's label (or field) ``value``."""
    if not isinstance(expr, dict):
        return False
    op, values = expr.get("operator"), [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        have, want = _int(value), _int(values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_selector_matches(selector: Any, node: JSON) -> bool:
    """A ``NodeSelector``: any term matches; in a term every label expression and every
    field expression (only ``metadata.name``) holds; a term with neither matches nothing."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    for term in (selector or {}).get("nodeSelectorTerms") or []:
        if not isinstance(term, dict):
            continue
        exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not fields:
            continue
        if all(_requirement(e, labels.get(str(e.get("key")))) for e in exprs) and all(
            _requirement(f, str(meta.get("name")) if f.get("key") == "metadata.name" else None)
            for f in fields
        ):
            return True
    return False


def pod_affinity_matches(pod: JSON, node: JSON) -> bool:
    """kube-scheduler's NodeAffinity filter: ``spec.nodeSelector`` labels and the
    required node affinity both hold (preferred terms only score, so they never filter)."""
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return required is None or node_selector_matches(required, node)


def fit_error(total: int, reasons: Mapping[str, str], prefilter: str = "") -> str:
    """kube-scheduler's FitError text with the preemption verdict after it:
    ``0/N nodes are available: <PreFilter msg>.`` or the sorted ``<count> <reason>``
    histogram of the nodes, then ``preemption: ...`` (the reasons written here are all
    unresolvable, so preemption is never helpful)."""
    text = f"0/{total} nodes are available:"
    if prefilter:
        text += f" {prefilter}."
    else:
        counts: dict[str, int] = {}
        for why in reasons.values():
            counts[why] = counts.get(why, 0) + 1
        histogram = sorted(f"{n} {why}" for why, n in counts.items())
        if histogram:
            text += f" {', '.join(histogram)}."
    return (
        f"{text} preemption: 0/{total} nodes are available: "
        f"{total} Preemption is not helpful for scheduling."
    )


class _Unschedulable(Exception):
    """The pod fits no node now: the message is the FitError text."""


class _Waiting(Exception):
    """DynamicResources' PreEnqueue keeps the pod out of scheduling (a claim is missing);
    upstream records neither an Event nor a condition for that."""


class _SchedulerError(Exception):
    """Scheduling was aborted (condition reason ``SchedulerError``)."""


#: The special claim's name while it exists only in the scheduler (not a valid name).
_SPECIAL_CLAIM = "<extended-resources>"
#: Where the in-memory special claim carries its container request mappings.
_MAPPINGS = "x-request-mappings"
#: Marks the claim the scheduler created for a pod's extended resources.
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"

#: How many distinct FailedScheduling messages are remembered (one Event each).
_REMEMBERED = 4096


class SchedulerStandIn:
    """See the module docstring; ``run()`` until cancelled."""

    def __init__(self, client: AsyncClient, profile: KubeProfile | None = None) -> None:
        self.client = client
        profile = profile or kube_profile(NEWEST_KUBE_VERSION)
        self.profile = profile
        #: Device taints (slice and rule) are honoured only with ``DRADeviceTaints``.
        self.device_taints = profile.slice_taints
        self.pods: Reflector[Pod] = Reflector(client, Pod, name="sched-pods")
        self.claims: Reflector[ResourceClaim] = Reflector(
            client, ResourceClaim, name="sched-claims"
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
        self.unschedulable: dict[str, str] = {}  # namespace/name -> FitError text
        self._reported: dict[tuple[str, str], None] = {}  # (pod uid, message), bounded
        #: Claims this stand-in wrote that its reflector may not have seen yet, so the
        #: next pod in the same pass neither reuses their devices nor trips on their
        #: resourceVersion (the scheduler's assume cache upstream).
        self._assumed: dict[tuple[str, str], JSON] = {}
        self.claims.add_handler(self._forget_deleted)

    async def run(self) -> None:
        reflectors: list[Reflector[Any]] = [
            self.pods, self.claims, self.slices, self.classes, self.nodes,
        ]  # fmt: skip
        if self.rules is not None:
            reflectors.append(self.rules)
        await reconcile_loop(reflectors, self.pass_once, "scheduler stand-in")

    def _forget_deleted(self, kind: str, obj: Any, _old: Any) -> None:
        if kind == "DELETED" and obj.metadata is not None:
            self._assumed.pop((str(obj.metadata.namespace), str(obj.metadata.name)), None)

    def _claim(self, ns: str, name: str) -> JSON | None:
        """The newer of the reflector's and the assumed copy of a claim."""
        stored = self.claims.store.get(ns, name)
        known = as_dict(stored) if stored is not None else None
        assumed = self._assumed.get((ns, name))
        if assumed is None:
            return known
        if known is not None and _rv(known) >= _rv(assumed):
            del self._assumed[(ns, name)]  # the reflector caught up
            return known
        return assumed

    def _claim_view(self) -> list[JSON]:
        """Every claim, assumed copies over the reflector's."""
        out = {(c["metadata"]["namespace"], c["metadata"]["name"]): c
               for c in self.claims.store.dicts()}  # fmt: skip
        for key in list(self._assumed):
            fresh = self._claim(*key)
            if fresh is not None:
                out[key] = fresh
        return list(out.values())

    async def pass_once(self) -> None:
        pods = self.pods.store.dicts()
        for pod in sorted(pods, key=lambda p: str(p["metadata"].get("creationTimestamp", ""))):
            spec, meta = pod.get("spec") or {}, pod["metadata"]
            if spec.get("nodeName") or meta.get("deletionTimestamp"):
                continue  # bound (by us, or by whoever set spec.nodeName), or going
            if (pod.get("status") or {}).get("phase") in _ENDED:
                continue
            if spec.get("schedulerName", "default-scheduler") != "default-scheduler":
                continue  # another scheduler's pod
            try:
                await self._schedule(pod)
            except ApiError as exc:  # a conflict: this pod is tried again next pass
                log.info("scheduling %s/%s: %s", meta["namespace"], meta["name"],
                         exc.status.message)  # fmt: skip
                self._assumed.clear()

    def _pod_claims(self, pod: JSON) -> list[JSON]:
        """The pod's claims; :class:`_Waiting` where DynamicResources' PreEnqueue holds the
        pod back (a claim missing, not the pod's, being deleted), :class:`_Unschedulable`
        where its PreFilter rejects it (an allocated claim with no room for the pod)."""
        meta = pod["metadata"]
        ns, uid = meta["namespace"], str(meta.get("uid"))
        statuses = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        out = []
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            check_owner = False
            if ref.get("resourceClaimName"):
                name = str(ref["resourceClaimName"])
            elif ref.get("resourceClaimTemplateName"):
                if ref.get("name") not in statuses:
                    raise _Waiting(f'pod "{ns}/{meta["name"]}": ResourceClaim not created yet')
                if not statuses[ref.get("name")]:
                    continue  # intentionally not created
                name, check_owner = str(statuses[ref.get("name")]), True
            else:
                continue
            c = self._claim(ns, name)
            if c is None:
                raise _Waiting(f'resourceclaim.resource.k8s.io "{name}" not found')
            if check_owner and owning_pod(c) != (meta["name"], uid):
                raise _Waiting(
                    f"ResourceClaim {ns}/{name} was not created for pod {ns}/{meta['name']} "
                    "(pod is not owner)"
                )
            if c["metadata"].get("deletionTimestamp"):
                raise _Waiting(f'resourceclaim "{name}" is being deleted')
            reserved = (c.get("status") or {}).get("reservedFor") or []
            if (
                (c.get("status") or {}).get("allocation")
                and len(reserved) >= RESERVED_FOR_MAX
                and not any(r.get("uid") == uid for r in reserved)
            ):
                raise _Unschedulable("resourceclaim in use")
            out.append(c)
        return out

    async def _schedule(self, pod: JSON) -> None:
        meta = pod["metadata"]
        nodes = sorted(self.nodes.store.dicts(), key=lambda n: str(n["metadata"]["name"]))
        try:
            if not nodes:
                raise _SchedulerError("no nodes available to schedule pods")
            try:
                claims = self._pod_claims(pod)
            except _Waiting as exc:  # PreEnqueue: not attempted, nothing recorded
                self.unschedulable[f"{meta['namespace']}/{meta['name']}"] = str(exc)
                return
            except _Unschedulable as exc:
                raise _Unschedulable(fit_error(len(nodes), {}, str(exc))) from None
            node, plans = await self._place(pod, claims, nodes)
        except (_Unschedulable, _SchedulerError) as exc:
            await self._failed(pod, str(exc), isinstance(exc, _SchedulerError))
            return
        for c, allocation in plans:
            await self._bind_claim(pod, c, allocation)
        await self.client.patch(
            Pod, meta["name"], {"spec": {"nodeName": node}}, namespace=meta["namespace"],
            patch_type=PatchType.MERGE,
        )  # fmt: skip
        await self._set_condition(pod, {"type": "PodScheduled", "status": "True"})
        await self._event(
            pod, "Normal", "Scheduled",
            f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}",
        )  # fmt: skip
        self.unschedulable.pop(f"{meta['namespace']}/{meta['name']}", None)
        self.bound += 1
        log.info("bound pod %s/%s to %s", meta["namespace"], meta["name"], node)

    def _extended_claim(self, pod: JSON, classes: Mapping[str, JSON]) -> JSON | None:
        """The in-memory special claim for the pod's extended resources backed by DRA
        (None when it has none, the release lacks them, or it exists already)."""
        try:
            requests, mappings = extended_resource_requests(pod, classes, self.profile)
        except AllocationAborted as exc:
            raise _SchedulerError(f'running "DynamicResources" filter plugin: {exc}') from exc
        if not requests:
            return None
        meta = pod["metadata"]
        return {
            "metadata": {"name": _SPECIAL_CLAIM, "namespace": meta["namespace"]},
            "spec": {"devices": {"requests": requests}},
            _MAPPINGS: mappings,
        }

    def _place(
        self, pod: JSON, claims: list[JSON], nodes: list[JSON]
    ) -> Awaitable[tuple[str, list[tuple[JSON, Allocation | None]]]]:
        """The first node (by name) every filter accepts, and the allocation per claim.

        What the reflectors hold is read here, on the event loop; the search (CEL
        selectors included) runs in a worker thread within :data:`FILTER_TIMEOUT`, so
        one costly claim never stalls the API server or the other controllers.
        """
        classes = {
            str(c.metadata.name): as_dict(c) for c in self.classes.store.list() if c.metadata
        }
        uid = str(pod["metadata"].get("uid"))
        if not any(_is_extended_claim(c, uid) for c in claims):
            special = self._extended_claim(pod, classes)
            if special is not None:
                claims = [*claims, special]
        devices: list[Device] = []
        in_use: set[tuple[str, str, str]] = set()
        taints: Any = None
        if any(not (c.get("status") or {}).get("allocation") for c in claims):
            devices = devices_from_slices(self.slices.store.dicts())
            if not self.device_taints:
                devices = [dataclasses.replace(d, taints=()) for d in devices]
            rules = self.rules.store.dicts() if self.rules is not None else []
            taints = rule_taints(rules, ("NoSchedule", "NoExecute"), classes)
            in_use = {
                (r["driver"], r["pool"], r["device"])
                for c in self._claim_view()
                for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {})
                .get("results") or []
                if not r.get("adminAccess")
            }  # fmt: skip
        deadline = time.monotonic() + FILTER_TIMEOUT

        def search() -> tuple[str, list[tuple[JSON, Allocation | None]]]:
            reasons: dict[str, str] = {}
            for node in nodes:
                name = str(node["metadata"]["name"])
                why = node_misfit(node, pod)
                if why is None:
                    why, plans = self._fit_claims(
                        claims, node, devices, classes, in_use, taints, deadline
                    )
                    if why is None:
                        return name, plans
                reasons[name] = why
            raise _Unschedulable(fit_error(len(nodes), reasons))

        return asyncio.to_thread(search)

    def _fit_claims(
        self,
        claims: list[JSON],
        node: JSON,
        devices: list[Device],
        classes: Mapping[str, JSON],
        in_use: set[tuple[str, str, str]],
        taints: Any,
        deadline: float | None = None,
    ) -> tuple[str | None, list[tuple[JSON, Allocation | None]]]:
        """DynamicResources' Filter on one node: (reason it rejects the node, plans)."""
        name = str(node["metadata"]["name"])
        plans: list[tuple[JSON, Allocation | None]] = []
        taken = set(in_use)
        for c in claims:
            alloc = (c.get("status") or {}).get("allocation")
            if alloc:
                selector = alloc.get("nodeSelector")
                if selector and not node_selector_matches(selector, node):
                    return "resourceclaim not available on the node", []
                plans.append((c, None))
                continue
            try:
                allocation = allocate_claim(
                    c, devices, classes, in_use=taken, rule_taints=taints, nodes=[name],
                    profile=self.profile, deadline=deadline,
                )  # fmt: skip
            except AllocationAborted as exc:
                raise _SchedulerError(f'running "DynamicResources" filter plugin: {exc}') from exc
            except AllocationError:
                return "cannot allocate all claims", []
            taken |= {(r["driver"], r["pool"], r["device"]) for r in allocation.results}
            plans.append((c, allocation))
        return None, plans

    async def _create_extended_claim(self, pod: JSON, special: JSON) -> JSON:
        """PreBind of the special claim: create it (``<pod>-extended-resources-xxxxx``,
        owned by the pod, annotated) and record it in the pod's status."""
        meta = pod["metadata"]
        body = {
            "metadata": {
                "generateName": f"{meta['name']}-extended-resources-",
                "namespace": meta["namespace"],
                "annotations": {EXTENDED_CLAIM_ANNOTATION: "true"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                     "controller": True}
                ],
            },
            "spec": special["spec"],
        }  # fmt: skip
        new_claim: Any = ResourceClaim.from_dict(body)
        created = as_dict(await self.client.create(new_claim))
        status = {
            "extendedResourceClaimStatus": {
                "resourceClaimName": created["metadata"]["name"],
                "requestMappings": special[_MAPPINGS],
            }
        }
        await self.client.patch(
            Pod.Status, meta["name"], {"status": status}, namespace=meta["namespace"],
            patch_type=PatchType.MERGE,
        )  # fmt: skip
        return created

    async def _bind_claim(self, pod: JSON, claim: JSON, allocation: Allocation | None) -> None:
        """PreBind: the finalizer first, then allocation and reservation in one
        resourceVersion-checked status write; an allocated claim gets the pod appended."""
        if claim["metadata"]["name"] == _SPECIAL_CLAIM:
            claim = await self._create_extended_claim(pod, claim)
        meta = claim["metadata"]
        ns, name = meta["namespace"], meta["name"]
        uid = str(pod["metadata"].get("uid"))
        if any(r.get("uid") == uid for r in (claim.get("status") or {}).get("reservedFor") or []):
            return
        if allocation is not None:
            if FINALIZER not in (meta.get("finalizers") or []):
                ops: list[JSON] = [
                    {"op": "test", "path": "/metadata/resourceVersion",
                     "value": meta["resourceVersion"]},
                    {"op": "add", "path": "/metadata/finalizers",
                     "value": [*(meta.get("finalizers") or []), FINALIZER]},
                ]  # fmt: skip
                claim = as_dict(
                    await self.client.patch(
                        ResourceClaim, name, ops, namespace=ns, patch_type=PatchType.JSON
                    )
                )
            status = {
                "allocation": allocation.status(),
                "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": uid}],
            }
            ops = [
                {"op": "test", "path": "/metadata/resourceVersion",
                 "value": claim["metadata"]["resourceVersion"]},
                {"op": "add", "path": "/status", "value": status},
            ]  # fmt: skip
        else:
            ops = reserve_ops(claim, pod)
        updated = await self.client.patch(
            ResourceClaim.Status, name, ops, namespace=ns, patch_type=PatchType.JSON
        )
        self._assumed[(ns, name)] = as_dict(updated)

    async def _failed(self, pod: JSON, message: str, error: bool) -> None:
        """FailedScheduling: the Event (once per distinct message) and the condition."""
        meta = pod["metadata"]
        self.unschedulable[f"{meta['namespace']}/{meta['name']}"] = message
        await self._set_condition(
            pod,
            {"type": "PodScheduled", "status": "False",
             "reason": "SchedulerError" if error else "Unschedulable",
             "message": message[:1024]},
        )  # fmt: skip
        await self._event(pod, "Warning", "FailedScheduling", message)

    async def _set_condition(self, pod: JSON, condition: JSON) -> None:
        old = (pod.get("status") or {}).get("conditions") or []
        same = next((c for c in old if c.get("type") == condition["type"]), None)
        if same is not None and all(same.get(k) == v for k, v in condition.items()):
            return
        meta = pod["metadata"]
        condition = {
            **condition,
            "lastProbeTime": None,
            "lastTransitionTime": datetime.datetime.now(datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
        }
        conditions = [c for c in old if c.get("type") != condition["type"]]
        with contextlib.suppress(ApiError):
            await self.client.patch(
                Pod.Status, meta["name"], {"status": {"conditions": [*conditions, condition]}},
                namespace=meta["namespace"], patch_type=PatchType.MERGE,
            )  # fmt: skip

    async def _event(self, pod: JSON, kind: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        key = (str(meta.get("uid")), message)
        if key in self._reported:
            return
        if len(self._reported) >= _REMEMBERED:
            self._reported.pop(next(iter(self._reported)))
        self._reported[key] = None
        event = make_event(
            name=f"{meta['name']}.{secrets.token_hex(8)}", namespace=meta["namespace"],
            involved=ObjectReference(apiVersion="v1", kind="Pod", name=meta["name"],
                                     namespace=meta["namespace"], uid=meta.get("uid")),
            event_type=kind, reason=reason, message=message,
            component="default-scheduler", instance="drahealth-embedded",
        )  # fmt: skip
        with contextlib.suppress(ApiError):
            await self.client.create(event)


def _rv(obj: JSON) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def _is_extended_claim(claim: JSON, pod_uid: str) -> bool:
    """Whether ``claim`` is the pod's special claim for extended resources."""
    annotations = claim["metadata"].get("annotations") or {}
    owner = owning_pod(claim)
    return annotations.get(EXTENDED_CLAIM_ANNOTATION) == "true" and (
        owner is not None and owner[1] == pod_uid
    )
