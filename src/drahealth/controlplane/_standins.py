"""Stand-ins for two kube-controller-manager controllers, and the runner of all stand-ins.

Owns :class:`TaintEvictionStandIn` (the device-taint eviction controller, KEP-5055):
a live pod whose allocated claim holds a device with a NoExecute taint (from its
ResourceSlice or a DeviceTaintRule) that the claim's request does not tolerate gets
the ``DisruptionTarget`` condition (reason ``DeletionByDeviceTaintManager``) and is
deleted; a toleration with ``tolerationSeconds`` delays that to the taint's
``timeAdded`` + seconds. It does not touch pods that tolerate the taint. A rule with an
empty selector selects every device, as upstream's does (KEP-5055; kubernetes#141422
shows one evicting every pod using a DRA device): the stand-in keeps that behaviour
and logs a warning naming the rule. Rules are read at the version the release profile
serves; their ``status`` is written only where the release has it (1.35+).

Owns :class:`ReplicaSetStandIn`: keeps ``spec.replicas`` live pods (not ended, not
being deleted) per ReplicaSet from its template, as the ReplicaSet controller does
(at most :data:`~._loop.BURST` creates per pass, in slow-start batches, stopping at once
when the set is deleted or replaced), and writes its status (``replicas``,
``fullyLabeledReplicas``, ``readyReplicas``, ``availableReplicas`` after
``minReadySeconds``, ``observedGeneration``).

:class:`StandIns` runs the scheduler, resourceclaim, Deployment (``_deployments``) and Job
(``_jobs``) stand-ins and these two, following a release profile: the eviction stand-in
runs only where the release evicts for device taints (``DRADeviceTaints``). Stand-ins
serve the embedded control plane only; a real
cluster has the real controllers.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import secrets
import time
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.resources.apps_v1 import ReplicaSet
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from drahealth._aio import cancel_and_wait
from drahealth._time import now_rfc3339
from drahealth.controlplane._allocate import Device, devices_from_slices
from drahealth.controlplane._claims import ClaimsStandIn
from drahealth.controlplane._deployments import DeploymentStandIn
from drahealth.controlplane._eviction import with_condition
from drahealth.controlplane._jobs import JobStandIn
from drahealth.controlplane._loop import BURST, reconcile_loop, slow_start
from drahealth.controlplane._scheduler import SchedulerStandIn, rule_class, rule_taints
from drahealth.core import (
    NEWEST_KUBE_VERSION,
    KubeProfile,
    Taint,
    eviction_due,
    kube_profile,
    pod_claim_names,
    request_tolerations,
    selector_scope,
    selects,
    tolerated,
)
from drahealth.kube import Reflector, as_dict, make_event

__all__ = ["ReplicaSetStandIn", "StandIns", "TaintEvictionStandIn"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
_ENDED = ("Succeeded", "Failed")


def _live(pod: JSON) -> bool:
    return (
        not pod["metadata"].get("deletionTimestamp")
        and (pod.get("status") or {}).get("phase") not in _ENDED
    )


class TaintEvictionStandIn:
    """See the module docstring; ``run()`` until cancelled."""

    def __init__(self, client: AsyncClient, profile: KubeProfile | None = None) -> None:
        self.client = client
        profile = profile or kube_profile(NEWEST_KUBE_VERSION)
        self.rule_status = profile.rule_status
        self.pods: Reflector[Pod] = Reflector(client, Pod, name="taint-evict-pods")
        self.claims: Reflector[ResourceClaim] = Reflector(
            client, ResourceClaim, name="taint-evict-claims"
        )
        self.slices: Reflector[ResourceSlice] = Reflector(
            client, ResourceSlice, name="taint-evict-slices"
        )
        self.rule_type: Any = rule_class(profile)
        self.rules: Reflector[Any] | None = None
        self.classes: Reflector[DeviceClass] | None = None
        if self.rule_type is not None:
            self.rules = Reflector(client, self.rule_type, name="taint-evict-rules")
            if profile.rule_cel_selectors:  # a 1.34 rule may name a DeviceClass
                self.classes = Reflector(client, DeviceClass, name="taint-evict-classes")
        self.deleted = 0
        self.evicted_by_rule: dict[str, int] = {}
        self._warned: set[str] = set()

    async def run(self) -> None:
        reflectors: list[Reflector[Any]] = [self.pods, self.claims, self.slices]
        reflectors += [r for r in (self.rules, self.classes) if r is not None]
        await reconcile_loop(reflectors, self.pass_once, "taint eviction")

    def _warn_select_all(self, rules: list[JSON]) -> None:
        """Log once per rule whose empty selector selects every device in the cluster."""
        for r in rules:
            sel = (r.get("spec") or {}).get("deviceSelector")
            name = str(r["metadata"]["name"])
            narrowed = isinstance(sel, dict) and (
                sel.get("deviceClassName") or sel.get("selectors")
            )
            if selector_scope(sel) != "all" or narrowed or name in self._warned:
                continue
            self._warned.add(name)
            effect = ((r.get("spec") or {}).get("taint") or {}).get("effect")
            log.warning(
                "DeviceTaintRule %s has an empty device selector: its %s taint applies to "
                "every device in the cluster (as upstream; kubernetes#141422)",
                name,
                effect,
            )

    async def pass_once(self) -> None:
        devices = {d.key: d for d in devices_from_slices(self.slices.store.dicts())}
        rules = self.rules.store.dicts() if self.rules is not None else []
        self._warn_select_all(rules)
        classes = {}
        if self.classes is not None:
            classes = {str(c["metadata"]["name"]): c for c in self.classes.store.dicts()}
        live = [pod for pod in self.pods.store.dicts() if _live(pod)]
        from_rules = await self._rule_taints_off_loop(
            rule_taints(rules, ("NoExecute",), classes), devices, live
        )
        added = {
            (r["spec"]["taint"]["key"], r["spec"]["taint"].get("effect")): r["spec"]["taint"].get(
                "timeAdded"
            )
            for r in rules
            if (r.get("spec") or {}).get("taint")
        }
        now = datetime.datetime.now(datetime.UTC)
        for pod in live:
            found = self._eviction_reason(pod, devices, from_rules, added, now)
            if found is not None and await self._evict(pod, found[0]):
                for r in rules:
                    if _from_rule(r, found[1], found[2]):
                        name = r["metadata"]["name"]
                        self.evicted_by_rule[name] = self.evicted_by_rule.get(name, 0) + 1
        if self.rule_status:
            await self._rule_status(rules)

    async def _rule_taints_off_loop(
        self,
        from_rules: Any,
        devices: dict[tuple[str, str, str], Device],
        pods: list[JSON],
    ) -> Any:
        """``from_rules`` for every device the ``pods`` hold, worked out in a thread.

        A rule's CEL selectors are evaluated per device (each within its cost budget and
        deadline); on the event loop, a few costly selectors times many devices would
        stall the API server and every other controller for as long. The devices are
        read here, on the loop; the answer is a plain lookup.
        """
        keys: set[tuple[str, str, str]] = set()
        for pod in pods:
            for claim_name in pod_claim_names(pod, extended=False).values():
                claim = self.claims.store.get(pod["metadata"]["namespace"], claim_name)
                if claim is None:
                    continue
                c = as_dict(claim)
                alloc = ((c.get("status") or {}).get("allocation") or {}).get("devices") or {}
                for r in alloc.get("results") or []:
                    keys.add((r["driver"], r["pool"], r["device"]))
        if not keys:
            return lambda _d: []
        chosen = [devices.get(k) or Device(*k, node="") for k in sorted(keys)]
        found = await asyncio.to_thread(lambda: {d.key: from_rules(d) for d in chosen})
        return lambda d: found.get(d.key, [])

    async def _rule_status(self, rules: list[JSON]) -> None:
        """``EvictionInProgress`` on NoExecute rules: False with how many pods were evicted."""
        for r in rules:
            taint = (r.get("spec") or {}).get("taint") or {}
            name = r["metadata"]["name"]
            if taint.get("effect") != "NoExecute":
                continue
            message = f"{self.evicted_by_rule.get(name, 0)} pod(s) evicted"
            conditions = (r.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "EvictionInProgress" and c.get("message") == message
                   for c in conditions):  # fmt: skip
                continue
            condition = {
                "type": "EvictionInProgress", "status": "False", "reason": "Completed",
                "message": message,
                "lastTransitionTime": datetime.datetime.now(datetime.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
            }  # fmt: skip
            with contextlib.suppress(ApiError):
                await self.client.patch(
                    self.rule_type.Status, name, {"status": {"conditions": [condition]}},
                    patch_type=PatchType.MERGE,
                )  # fmt: skip

    def _eviction_reason(
        self,
        pod: JSON,
        devices: dict[tuple[str, str, str], Device],
        from_rules: Any,
        added: dict[tuple[str, Any], Any],
        now: datetime.datetime,
    ) -> tuple[str, tuple[str, str, str], Taint] | None:
        """(why, device, taint) of the first taint that evicts ``pod``, or None."""
        meta = pod["metadata"]
        for claim_name in pod_claim_names(pod, extended=False).values():
            claim = self.claims.store.get(meta["namespace"], claim_name)
            if claim is None:
                continue
            c = as_dict(claim)
            results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            ) or []
            for r in results:
                key = (r["driver"], r["pool"], r["device"])
                device = devices.get(key) or Device(*key, node="")
                taints = [t for t in device.taints if t.effect == "NoExecute"] + from_rules(device)
                tolerations = request_tolerations(c, str(r.get("request", "")))
                for t in taints:
                    if not tolerated(t, tolerations):
                        why = f"device {'/'.join(key)} has the NoExecute taint {t.key}={t.value}"
                        return why, key, t
                    since = added.get((t.key, t.effect))
                    start = (
                        datetime.datetime.fromisoformat(str(since).replace("Z", "+00:00"))
                        if since
                        else None
                    )
                    due = eviction_due(t, tolerations, start.timestamp() if start else None)
                    if due is not None and now.timestamp() >= due:
                        return f"device {'/'.join(key)}: toleration of {t.key} expired", key, t
        return None

    async def _evict(self, pod: JSON, why: str) -> bool:
        meta = pod["metadata"]
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByDeviceTaintManager",
            "message": "Device Taint manager: deleting due to NoExecute taint",
        }
        conditions, changed = with_condition(pod.get("status"), condition, now_rfc3339())
        if changed:
            with contextlib.suppress(ApiError):
                await self.client.patch(
                    Pod.Status, meta["name"], {"status": {"conditions": conditions}},
                    namespace=meta["namespace"], patch_type=PatchType.MERGE,
                )  # fmt: skip
        # the Event upstream's controller records on the pod before deleting it
        event = make_event(
            name=f"{meta['name']}.{secrets.token_hex(8)}",
            namespace=meta["namespace"],
            involved=ObjectReference(
                apiVersion="v1", kind="Pod", name=meta["name"], namespace=meta["namespace"],
                uid=meta.get("uid"),
            ),
            event_type="Normal",
            reason="DeviceTaintManagerEviction",
            message="Marking for deletion",
            component="device-taint-eviction-controller",
            instance="drahealth-embedded",
        )  # fmt: skip
        with contextlib.suppress(ApiError):
            await self.client.create(event)
        try:
            await self.client.delete(Pod, meta["name"], namespace=meta["namespace"])
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            return False
        self.deleted += 1
        log.info("deleted pod %s/%s: %s", meta["namespace"], meta["name"], why)
        return True


def _from_rule(rule: JSON, device: tuple[str, str, str], taint: Taint) -> bool:
    """Whether ``rule`` selects ``device`` and carries ``taint``."""
    spec = rule.get("spec") or {}
    own = spec.get("taint") or {}
    if (own.get("key"), own.get("effect")) != (taint.key, taint.effect):
        return False
    return selects(spec.get("deviceSelector"), *device)


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
            live = sorted((p for p in owned if _live(p)), key=lambda p: p["metadata"]["name"])
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


class StandIns:
    """The embedded control plane's controllers: scheduler, resourceclaims, taint eviction,
    Deployments, ReplicaSets, Jobs.

    ``profile`` is the release the API server serves (None: the newest); without
    ``DRADeviceTaints`` there is no taint eviction (``taint_eviction`` is None).
    """

    def __init__(self, client: AsyncClient, profile: KubeProfile | None = None) -> None:
        profile = profile or kube_profile(NEWEST_KUBE_VERSION)
        self.profile = profile
        self.scheduler = SchedulerStandIn(client, profile)
        self.claims = ClaimsStandIn(client)
        self.taint_eviction: TaintEvictionStandIn | None = (
            TaintEvictionStandIn(client, profile) if profile.taint_eviction else None
        )
        self.replicasets = ReplicaSetStandIn(client)
        self.deployments = DeploymentStandIn(client)
        self.jobs = JobStandIn(client)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.scheduler.run(), name="scheduler-stand-in"),
            asyncio.create_task(self.claims.run(), name="resourceclaim-stand-in"),
            asyncio.create_task(self.replicasets.run(), name="replicaset-stand-in"),
            asyncio.create_task(self.deployments.run(), name="deployment-stand-in"),
            asyncio.create_task(self.jobs.run(), name="job-stand-in"),
        ]
        if self.taint_eviction is not None:
            self._tasks.append(
                asyncio.create_task(self.taint_eviction.run(), name="taint-eviction-stand-in")
            )

    def describe(self) -> list[str]:
        """What runs, one phrase per stand-in, in the order they start."""
        running = [
            "scheduler (node filters, DRA allocation, binding)",
            "resourceclaim controller (claims from templates, reservations)",
            "Deployment controller (Recreate)",
            "ReplicaSet controller",
            "Job controller",
        ]
        if self.taint_eviction is not None:
            running.append("device-taint eviction (NoExecute)")
        return running

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
