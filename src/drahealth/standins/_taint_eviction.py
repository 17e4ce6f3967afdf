"""Stand-in for kube-controller-manager's device-taint eviction controller (KEP-5055).

Owns :class:`TaintEvictionStandIn`: a live pod whose allocated claim holds a device with
a NoExecute taint (from its ResourceSlice or a DeviceTaintRule) that the claim's request
does not tolerate gets the ``DisruptionTarget`` condition (reason
``DeletionByDeviceTaintManager``) and is deleted; a toleration with
``tolerationSeconds`` delays that to the taint's ``timeAdded`` + seconds. It does not
touch pods that tolerate the taint. A rule with an empty selector selects every device,
as upstream's does (KEP-5055; kubernetes#141422 shows one evicting every pod using a DRA
device): the stand-in keeps that behaviour and logs a warning naming the rule. Rules
are read at the version the release profile serves; their ``status`` is written only
where the release has it (1.35+).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import secrets
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from drahealth._time import now_rfc3339
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
    with_pod_condition,
)
from drahealth.kube import Reflector, as_dict, make_event

from ._allocate import Device, devices_from_slices
from ._loop import pod_active, reconcile_loop
from ._scheduler import rule_class, rule_taints

__all__ = ["TaintEvictionStandIn"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]


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
        live = [pod for pod in self.pods.store.dicts() if pod_active(pod)]
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
        conditions, changed = with_pod_condition(pod.get("status"), condition, now_rfc3339())
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
