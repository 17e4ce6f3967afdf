"""Stand-in for kube-controller-manager's resourceclaim controller.

Owns :class:`ClaimsStandIn` and the facts it shares with the scheduler stand-in
(:data:`FINALIZER`, :data:`POD_CLAIM_ANNOTATION`, :data:`RESERVED_FOR_MAX`,
:func:`pod_done`, :func:`generate_name`, :func:`reserve_ops`). As upstream's
controller (``pkg/controller/resourceclaim``):

* for a pod that is not being deleted and not done, each ``resourceClaimTemplateName``
  reference gets a ResourceClaim from the template: ``generateName``
  ``<pod>-<claim>-`` (both parts cut in proportion past 57 characters), owned by the
  pod (controller, blockOwnerDeletion), annotated
  ``resource.kubernetes.io/pod-claim-name: <claim>``, with the template's labels and
  annotations; an orphan from an earlier attempt is adopted instead of creating a
  second claim. The names go to ``pod.status.resourceClaimStatuses``. A missing
  template is a ``FailedResourceClaimCreation`` Warning Event on the pod;
* an allocated claim of a pod bound without the scheduler (``spec.nodeName`` set) is
  reserved for it;
* ``status.reservedFor`` entries of pods that are gone, replaced (other UID) or done
  (``Succeeded``/``Failed``, or deleted before being bound) are removed with a
  resourceVersion-checked patch; when none is left, the allocation is cleared and the
  ``resource.kubernetes.io/delete-protection`` finalizer the scheduler added is
  removed (also for a claim being deleted);
* an unreserved claim generated for a pod that is done or replaced is deleted; so is
  one whose pod is gone (the garbage collector's job upstream, which the stand-ins do
  not run).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimTemplate
from lightkube.types import PatchType

from drahealth.kube import Reflector, as_dict, make_event

from ._loop import reconcile_loop

__all__ = [
    "FINALIZER",
    "POD_CLAIM_ANNOTATION",
    "RESERVED_FOR_MAX",
    "ClaimsStandIn",
    "generate_name",
    "owning_pod",
    "pod_done",
    "reserve_ops",
]

log = logging.getLogger(__name__)

JSON = dict[str, Any]

#: Added by the scheduler before it writes an allocation, removed by this controller
#: once the claim is deallocated (upstream ``resourceapi.Finalizer``).
FINALIZER = "resource.kubernetes.io/delete-protection"
#: Ties a generated claim to the pod's ``spec.resourceClaims[].name``.
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
#: Upstream ``ResourceClaimReservedForMaxSize``.
RESERVED_FOR_MAX = 256
#: Room for the hyphen and the 5 random characters in a 63-character name.
_MAX_BASE = 57
#: Distinct Event messages remembered per pod (so a retried failure is one Event).
_EVENTS_REMEMBERED = 4096


def pod_done(pod: Mapping[str, Any]) -> bool:
    """No container of ``pod`` runs or will run: a terminal phase, or deleted unbound."""
    status, meta = pod.get("status") or {}, pod.get("metadata") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    return bool(meta.get("deletionTimestamp")) and not (pod.get("spec") or {}).get("nodeName")


def generate_name(pod_name: str, claim_name: str) -> str:
    """``<pod>-<claim>-``; past 57 characters both parts are cut in proportion."""
    base = f"{pod_name}-{claim_name}-"
    if len(base) > _MAX_BASE:
        total = len(base)
        base = (
            pod_name[: len(pod_name) * _MAX_BASE // total]
            + "-"
            + claim_name[: len(claim_name) * _MAX_BASE // total]
        )
    return base


def owning_pod(claim: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the pod that controls ``claim``, or None."""
    for o in (claim.get("metadata") or {}).get("ownerReferences") or []:
        if o.get("controller") and o.get("apiVersion") == "v1" and o.get("kind") == "Pod":
            return str(o.get("name")), str(o.get("uid"))
    return None


def reserve_ops(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> list[JSON]:
    """A JSON patch that appends ``pod`` to ``status.reservedFor`` if the claim has not
    changed since it was read (its resourceVersion), never replacing other consumers."""
    meta = pod["metadata"]
    entry = {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
    status = claim.get("status")
    ops: list[JSON] = [
        {"op": "test", "path": "/metadata/resourceVersion",
         "value": claim["metadata"]["resourceVersion"]},
    ]  # fmt: skip
    if not isinstance(status, dict):
        ops.append({"op": "add", "path": "/status", "value": {"reservedFor": [entry]}})
    elif not status.get("reservedFor"):
        ops.append({"op": "add", "path": "/status/reservedFor", "value": [entry]})
    else:
        ops.append({"op": "add", "path": "/status/reservedFor/-", "value": entry})
    return ops


class _ClaimIndex:
    """One pass's claims by (namespace, name), by owning pod UID, and the UIDs each is
    reserved for (so a pass is linear in pods and claims)."""

    def __init__(self, claims: list[JSON]) -> None:
        self.by_key: dict[tuple[str, str], JSON] = {}
        self.by_owner: dict[str, list[JSON]] = {}
        self.reserved: dict[tuple[str, str], set[str]] = {}
        for c in claims:
            key = (str(c["metadata"]["namespace"]), str(c["metadata"]["name"]))
            self.by_key[key] = c
            self.reserved[key] = {
                str(r.get("uid")) for r in (c.get("status") or {}).get("reservedFor") or []
            }
            owner = owning_pod(c)
            if owner is not None:
                self.by_owner.setdefault(owner[1], []).append(c)


class ClaimsStandIn:
    """See the module docstring; ``run()`` until cancelled."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.pods: Reflector[Pod] = Reflector(client, Pod, name="claims-pods")
        self.claims: Reflector[ResourceClaim] = Reflector(
            client, ResourceClaim, name="claims-claims"
        )
        self.templates: Reflector[ResourceClaimTemplate] = Reflector(
            client, ResourceClaimTemplate, name="claims-templates"
        )
        self.created = 0
        self.deleted = 0
        self._events: dict[tuple[str, str], None] = {}  # (pod uid, message), bounded

    async def run(self) -> None:
        await reconcile_loop(
            [self.pods, self.claims, self.templates], self.pass_once, "resourceclaims"
        )

    async def pass_once(self) -> None:
        pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p
                for p in self.pods.store.dicts()}  # fmt: skip
        claims = self.claims.store.dicts()
        index = _ClaimIndex(claims)
        for pod in pods.values():
            if pod["metadata"].get("deletionTimestamp") or pod_done(pod):
                continue
            with contextlib.suppress(ApiError):
                await self._sync_pod(pod, index)
        for claim in claims:
            try:
                await self._sync_claim(claim, pods)
            except ApiError as exc:  # a conflict: the next pass sees the newer claim
                log.debug("claim %s: %s", claim["metadata"]["name"], exc.status.message)

    # ------------------------------------------------------------------ pods

    async def _sync_pod(self, pod: JSON, index: _ClaimIndex) -> None:
        meta = pod["metadata"]
        ns, uid = meta["namespace"], str(meta.get("uid"))
        known = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        new: dict[str, str] = {}
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            name, template = str(ref.get("name") or ""), ref.get("resourceClaimTemplateName")
            if not template:
                continue
            existing = index.by_key.get((ns, str(known.get(name) or "")))
            if existing is not None and owning_pod(existing) == (meta["name"], uid):
                continue
            orphan = next(
                (c for c in index.by_owner.get(uid, [])
                 if c["metadata"]["namespace"] == ns and owning_pod(c) == (meta["name"], uid)
                 and (c["metadata"].get("annotations") or {}).get(POD_CLAIM_ANNOTATION) == name),
                None,
            )  # fmt: skip
            if orphan is not None:
                new[name] = orphan["metadata"]["name"]
                continue
            created = await self._create(pod, name, str(template))
            if created is None:
                return
            new[name] = created
        if new:
            statuses = [
                s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
                if s.get("name") not in new
            ] + [{"name": n, "resourceClaimName": c} for n, c in sorted(new.items())]  # fmt: skip
            await self.client.patch(
                Pod.Status, meta["name"], {"status": {"resourceClaimStatuses": statuses}},
                namespace=ns, patch_type=PatchType.MERGE,
            )  # fmt: skip
        if (pod.get("spec") or {}).get("nodeName"):
            await self._reserve_bound(pod, index, {**known, **new})

    async def _create(self, pod: JSON, name: str, template_name: str) -> str | None:
        meta = pod["metadata"]
        template = self.templates.store.get(meta["namespace"], template_name)
        if template is None:
            await self._event(
                pod, "FailedResourceClaimCreation",
                f"PodResourceClaim {name}: resource claim template {template_name!r}: "
                f'resourceclaimtemplate.resource.k8s.io "{template_name}" not found',
            )  # fmt: skip
            return None
        spec = as_dict(template).get("spec") or {}
        tmeta = spec.get("metadata") or {}
        annotations = {**(tmeta.get("annotations") or {}), POD_CLAIM_ANNOTATION: name}
        body: JSON = {
            "metadata": {
                "generateName": generate_name(meta["name"], name),
                "namespace": meta["namespace"],
                "annotations": annotations,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                     "controller": True, "blockOwnerDeletion": True}
                ],
            },
            "spec": spec.get("spec") or {},
        }  # fmt: skip
        if tmeta.get("labels"):
            body["metadata"]["labels"] = dict(tmeta["labels"])
        created = await self.client.create(ResourceClaim.from_dict(body))  # type: ignore[call-overload]
        self.created += 1
        log.info("created ResourceClaim %s/%s for pod %s",
                 meta["namespace"], created.metadata.name, meta["name"])  # fmt: skip
        return str(created.metadata.name)

    async def _reserve_bound(self, pod: JSON, index: _ClaimIndex, names: Mapping[Any, Any]) -> None:
        """Reserve the allocated claims of a pod that was bound without the scheduler."""
        ns, uid = pod["metadata"]["namespace"], str(pod["metadata"].get("uid"))
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            key = (ns, str(ref.get("resourceClaimName") or names.get(ref.get("name")) or ""))
            claim = index.by_key.get(key)
            if claim is None or not (claim.get("status") or {}).get("allocation"):
                continue
            reserved = index.reserved[key]
            if uid in reserved or len(reserved) >= RESERVED_FOR_MAX:
                continue
            await self.client.patch(
                ResourceClaim.Status, claim["metadata"]["name"], reserve_ops(claim, pod),
                namespace=claim["metadata"]["namespace"], patch_type=PatchType.JSON,
            )  # fmt: skip

    async def _event(self, pod: JSON, reason: str, message: str) -> None:
        meta = pod["metadata"]
        key = (str(meta.get("uid")), message)
        if key in self._events:
            return
        if len(self._events) >= _EVENTS_REMEMBERED:
            self._events.pop(next(iter(self._events)))
        self._events[key] = None
        event = make_event(
            name=f"{meta['name']}.{secrets.token_hex(8)}", namespace=meta["namespace"],
            involved=ObjectReference(apiVersion="v1", kind="Pod", name=meta["name"],
                                     namespace=meta["namespace"], uid=meta.get("uid")),
            event_type="Warning", reason=reason, message=message,
            component="resource_claim", instance="drahealth-embedded",
        )  # fmt: skip
        with contextlib.suppress(ApiError):
            await self.client.create(event)

    # ---------------------------------------------------------------- claims

    async def _pod_now(self, ns: str, name: str) -> JSON | None:
        """The pod from the API server (the reflector may not have seen it yet)."""
        try:
            return (await self.client.get(Pod, name, namespace=ns)).to_dict()
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    async def _sync_claim(self, claim: JSON, pods: Mapping[tuple[str, str], JSON]) -> None:
        meta, status = claim["metadata"], claim.get("status") or {}
        ns, name = meta["namespace"], meta["name"]
        reserved = status.get("reservedFor") or []
        valid = []
        for r in reserved:
            if r.get("apiGroup") or r.get("resource") != "pods":
                valid.append(r)  # not ours to judge
                continue
            pod = pods.get((ns, str(r.get("name"))))
            if pod is None:
                pod = await self._pod_now(ns, str(r.get("name")))
            if pod is None or pod["metadata"].get("uid") != r.get("uid") or pod_done(pod):
                continue
            valid.append(r)
        finalizers = list(meta.get("finalizers") or [])
        if len(valid) < len(reserved):
            new_status: JSON = {**status, "reservedFor": valid or None}
            if not valid and FINALIZER in finalizers:
                new_status["allocation"] = None
            ops = [
                {"op": "test", "path": "/metadata/resourceVersion",
                 "value": meta["resourceVersion"]},
                {"op": "replace", "path": "/status",
                 "value": {k: v for k, v in new_status.items() if v is not None}},
            ]  # fmt: skip
            updated = await self.client.patch(
                ResourceClaim.Status, name, ops, namespace=ns, patch_type=PatchType.JSON
            )
            log.info("claim %s/%s: %d consumer(s) left%s", ns, name, len(valid),
                     "" if valid else ", deallocated")  # fmt: skip
            if not valid and FINALIZER in finalizers:
                await self._drop_finalizer(updated.to_dict())
        elif not valid and FINALIZER in finalizers and meta.get("deletionTimestamp"):
            if status.get("allocation"):
                ops = [
                    {"op": "test", "path": "/metadata/resourceVersion",
                     "value": meta["resourceVersion"]},
                    {"op": "remove", "path": "/status/allocation"},
                ]  # fmt: skip
                claim = (await self.client.patch(
                    ResourceClaim.Status, name, ops, namespace=ns, patch_type=PatchType.JSON
                )).to_dict()  # fmt: skip
            await self._drop_finalizer(claim)
            return
        if not valid and not meta.get("deletionTimestamp"):
            await self._delete_if_unneeded(claim, pods)

    async def _drop_finalizer(self, claim: JSON) -> None:
        meta = claim["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER not in finalizers:
            return
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
            {"op": "remove", "path": f"/metadata/finalizers/{finalizers.index(FINALIZER)}"},
        ]
        await self.client.patch(
            ResourceClaim, meta["name"], ops, namespace=meta["namespace"],
            patch_type=PatchType.JSON,
        )  # fmt: skip

    async def _delete_if_unneeded(self, claim: JSON, pods: Mapping[tuple[str, str], JSON]) -> None:
        owner = owning_pod(claim)
        if owner is None:
            return
        meta = claim["metadata"]
        pod = pods.get((meta["namespace"], owner[0]))
        if pod is None:  # the garbage collector's part: delete only if truly gone
            pod = await self._pod_now(meta["namespace"], owner[0])
        if pod is not None and pod["metadata"].get("uid") == owner[1] and not pod_done(pod):
            return
        with contextlib.suppress(ApiError):
            await self.client.delete(ResourceClaim, meta["name"], namespace=meta["namespace"])
            self.deleted += 1
            log.info("deleted ResourceClaim %s/%s: its pod %s is done or gone",
                     meta["namespace"], meta["name"], owner[0])  # fmt: skip
