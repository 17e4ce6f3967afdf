"""Stand-in for kube-controller-manager's Deployment controller (``apps/v1``).

Owns :class:`DeploymentStandIn`. Per Deployment, as upstream's ``pkg/controller/deployment``
does with the parts a one-machine cluster needs:

- the ReplicaSet of the current pod template is ``<deployment>-<hash>``: the template's
  labels plus ``pod-template-hash: <hash>`` on itself, its selector and its pod template,
  a controller owner reference, the ``deployment.kubernetes.io/revision`` annotation, and
  ``spec.replicas`` kept equal to the Deployment's (default 1; ``spec.paused`` stops it);
- ReplicaSets of older templates are scaled to 0 at once: every template change replaces
  all pods together, as the ``Recreate`` strategy does (no rolling update: ``maxSurge``
  and ``maxUnavailable`` are accepted and ignored), and the oldest beyond
  ``revisionHistoryLimit`` (default 10) that have no pods left are deleted;
- status: ``replicas``, ``updatedReplicas``, ``readyReplicas``, ``availableReplicas``,
  ``unavailableReplicas``, ``observedGeneration`` and the ``Available`` and ``Progressing``
  conditions with upstream's reasons;
- the ReplicaSets of a Deployment that no longer exists are scaled to 0 and deleted once
  their pods are gone (the garbage collector's part upstream).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.apps_v1 import Deployment, ReplicaSet
from lightkube.types import PatchType

from drahealth.kube import Reflector

from ._loop import reconcile_loop

__all__ = ["DeploymentStandIn", "template_hash"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # upstream's alphabet for generated names


def template_hash(template: JSON) -> str:
    """A short, stable name part for a pod template (10 characters of ``_SAFE``)."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    return "".join(_SAFE[b % len(_SAFE)] for b in digest[:10])


def _controller_uid(obj: JSON) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "Deployment":
            return str(ref.get("uid"))
    return None


def _count(value: Any) -> int:
    """A count from a status field: an int, or 0 for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _drained(rs: JSON) -> bool:
    """Whether ``rs`` is scaled to 0 and its controller has seen that and has no pods left
    (the status of the current generation says 0 replicas)."""
    status = rs.get("status") or {}
    seen = _count(status.get("observedGeneration")) >= _count(rs["metadata"].get("generation"))
    return (
        int((rs.get("spec") or {}).get("replicas", 1)) == 0 and seen and not status.get("replicas")
    )


def _revision(rs: JSON) -> int:
    try:
        return int((rs["metadata"].get("annotations") or {}).get(REVISION, "0"))
    except ValueError:
        return 0


def _condition(kind: str, ok: bool, reason: str, message: str, old: list[JSON]) -> JSON:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = "True" if ok else "False"
    prev = next((c for c in old if c.get("type") == kind), None)
    since = prev.get("lastTransitionTime", now) if prev and prev["status"] == status else now
    return {
        "type": kind, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": since, "lastUpdateTime": now,
    }  # fmt: skip


def deployment_status(deploy: JSON, new: JSON | None, owned: list[JSON]) -> JSON:
    """The Deployment controller's status from its ReplicaSets (``new``: the current one)."""
    meta, spec = deploy["metadata"], deploy.get("spec") or {}
    want = int(spec.get("replicas", 1))

    def total(field: str, sets: list[JSON]) -> int:
        return sum(_count((rs.get("status") or {}).get(field)) for rs in sets)

    available = total("availableReplicas", owned)
    updated = total("replicas", [new]) if new is not None else 0
    old = (deploy.get("status") or {}).get("conditions") or []
    name = f'ReplicaSet "{new["metadata"]["name"]}"' if new is not None else "ReplicaSet"
    done = new is not None and updated == want and available >= want
    conditions = [
        _condition(
            "Available", available >= want,
            "MinimumReplicasAvailable" if available >= want else "MinimumReplicasUnavailable",
            "Deployment has minimum availability." if available >= want
            else "Deployment does not have minimum availability.",
            old,
        ),
        _condition(
            "Progressing", True,
            "NewReplicaSetAvailable" if done else "ReplicaSetUpdated",
            f"{name} has successfully progressed." if done else f"{name} is progressing.",
            old,
        ),
    ]  # fmt: skip
    return {
        "observedGeneration": meta.get("generation", 1),
        "replicas": total("replicas", owned),
        "updatedReplicas": updated,
        "readyReplicas": total("readyReplicas", owned),
        "availableReplicas": available,
        "unavailableReplicas": max(0, want - available),
        "conditions": conditions,
    }


def _same_status(have: JSON, want: JSON) -> bool:
    """Whether ``have`` already says what ``want`` says (condition times aside)."""
    for key, value in want.items():
        if key != "conditions" and have.get(key) != value:
            return False

    def brief(conds: Any) -> list[tuple[Any, ...]]:
        return sorted(
            (c.get("type"), c.get("status"), c.get("reason"), c.get("message")) for c in conds or []
        )

    return brief(have.get("conditions")) == brief(want.get("conditions"))


class DeploymentStandIn:
    """See the module docstring; ``run()`` until cancelled."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.deployments: Reflector[Deployment] = Reflector(
            client, Deployment, name="deploy-deployments"
        )
        self.sets: Reflector[ReplicaSet] = Reflector(client, ReplicaSet, name="deploy-sets")
        self.created = 0

    async def run(self) -> None:
        await reconcile_loop([self.deployments, self.sets], self.pass_once, "deployments")

    async def pass_once(self) -> None:
        sets = self.sets.store.dicts()
        live: set[str] = set()
        for deploy in self.deployments.store.dicts():
            live.add(str(deploy["metadata"]["uid"]))
            if deploy["metadata"].get("deletionTimestamp"):
                continue
            owned = [rs for rs in sets if _controller_uid(rs) == deploy["metadata"]["uid"]]
            await self._sync(deploy, owned)
        for rs in sets:  # the garbage collector's part: sets of deleted Deployments
            uid = _controller_uid(rs)
            if uid is not None and uid not in live:
                await self._retire(rs, delete=True)

    async def _sync(self, deploy: JSON, owned: list[JSON]) -> None:
        meta, spec = deploy["metadata"], deploy.get("spec") or {}
        want = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        name = f"{meta['name']}-{template_hash(template)}"
        new = next((rs for rs in owned if rs["metadata"]["name"] == name), None)
        if not spec.get("paused"):
            if new is None:
                revision = max((_revision(rs) for rs in owned), default=0) + 1
                new = await self._create(deploy, name, revision)
            elif int((new.get("spec") or {}).get("replicas", 1)) != want:
                await self._scale(new, want)
            old = [rs for rs in owned if rs is not new]
            for rs in old:
                await self._retire(rs, delete=False)
            drained = sorted((rs for rs in old if _drained(rs)), key=_revision)
            keep = int(spec.get("revisionHistoryLimit", 10))
            for rs in drained[: max(0, len(drained) - keep)]:
                await self._delete(rs)
        status = deployment_status(deploy, new, owned)
        if not _same_status(deploy.get("status") or {}, status):
            with contextlib.suppress(ApiError):
                await self.client.patch(
                    Deployment.Status, meta["name"], {"status": status},
                    namespace=meta["namespace"], patch_type=PatchType.MERGE,
                )  # fmt: skip

    async def _create(self, deploy: JSON, name: str, revision: int) -> JSON:
        meta, spec = deploy["metadata"], deploy.get("spec") or {}
        template = json.loads(json.dumps(spec.get("template") or {}))
        pod_meta = template.setdefault("metadata", {})
        labels = {**(pod_meta.get("labels") or {}), HASH_LABEL: name.rsplit("-", 1)[1]}
        pod_meta["labels"] = labels
        selector = json.loads(json.dumps(spec.get("selector") or {}))
        selector.setdefault("matchLabels", {})[HASH_LABEL] = labels[HASH_LABEL]
        body = {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {
                "name": name, "namespace": meta["namespace"], "labels": labels,
                "annotations": {REVISION: str(revision)},
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "Deployment", "name": meta["name"],
                    "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True,
                }],
            },
            "spec": {
                "replicas": int(spec.get("replicas", 1)),
                "minReadySeconds": int(spec.get("minReadySeconds", 0)),
                "selector": selector, "template": template,
            },
        }  # fmt: skip
        created = await self.client.create(ReplicaSet.from_dict(body))  # type: ignore[call-overload]
        self.created += 1
        log.info("deployment %s/%s: created ReplicaSet %s", meta["namespace"], meta["name"], name)
        result: JSON = created.to_dict()
        return result

    async def _scale(self, rs: JSON, replicas: int) -> None:
        meta = rs["metadata"]
        with contextlib.suppress(ApiError):
            await self.client.patch(
                ReplicaSet, meta["name"], {"spec": {"replicas": replicas}},
                namespace=meta["namespace"], patch_type=PatchType.MERGE,
            )  # fmt: skip

    async def _retire(self, rs: JSON, *, delete: bool) -> None:
        """Scale ``rs`` to 0; with ``delete``, delete it once its pods are gone."""
        if int((rs.get("spec") or {}).get("replicas", 1)) != 0:
            await self._scale(rs, 0)
        elif delete and _drained(rs):
            await self._delete(rs)

    async def _delete(self, rs: JSON) -> None:
        meta = rs["metadata"]
        try:
            await self.client.delete(ReplicaSet, meta["name"], namespace=meta["namespace"])
        except ApiError as exc:
            if exc.status.code != 404:
                raise
