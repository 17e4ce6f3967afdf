"""Node-level rollup, the controller's part: the node condition and the node taint.

Owns :class:`NodeRollupWriter`, which keeps on every Node that has DRA devices the
condition its devices add up to (:mod:`drahealth.core._rollup`: type
``DRADevicesHealthy`` unless the policy renames it) and, where the policy's
``nodeRollup.taintNode`` asks for it, a node taint once enough of the node's devices are
tainted. It writes only that:

* **the condition**: a strategic-merge patch of ``nodes/status`` whose
  ``status.conditions`` holds this one condition; conditions merge by ``type`` (the
  API's merge key, as node-problem-detector and the kubelet patch theirs), so the
  kubelet's ``Ready``, the pressure conditions and anyone else's stay as they are. It is
  written only when its status, reason or message changes (a change of the message
  alone at most every :data:`MESSAGE_INTERVAL` seconds per node), ``lastHeartbeatTime``
  on every write, ``lastTransitionTime`` only when the status changes. A node whose
  devices are all gone loses the condition (a ``$patch: delete`` of that type). At most
  ``max_writes`` requests per pass; the rest wait for the next pass;
* **the node taint** (``taintNode``): key ``drahealth.io/devices-unhealthy`` by default,
  no value, the policy's effect; written by a read and a ``resourceVersion``-checked
  update retried on conflict, so others' taints survive; the annotation
  ``drahealth.io/rollup-taint`` records which taint drahealth added (and why and
  since when), and only that one is ever removed, once the node is under the threshold.
  A taint someone else put there with the same key and effect is left alone and not
  adopted. At most ``maxNodes`` nodes carry it; a node beyond that is held untainted
  and reported (``NodeTaintHeld``) until a slot frees. Never written in dry run or
  report-only, and neither added nor removed on a node opted out of automatic action
  (what would be done is said once per node in the history).

Events on the Node: ``NodeDevicesUnhealthy`` / ``NodeDevicesUnknown`` (Warning) and
``NodeDevicesHealthy`` (Normal) when the condition's status changes (not for a node
first seen healthy), ``NodeDevicesTainted`` / ``NodeDevicesUntainted`` and
``NodeTaintHeld`` for the node taint; each is also a line in the controller's history.
At start one LIST of the Nodes tells what is there already (the condition's transition
time survives a restart); a node the LIST did not show is read before its first write.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from drahealth._time import now_rfc3339
from drahealth.core import (
    DeviceFacts,
    DeviceKey,
    NodeCondition,
    NodeRollup,
    NodeRollupPolicy,
    Observation,
    RollupDevice,
    Want,
)
from drahealth.kube import Backoff, as_dict, is_not_found, patch_status, retry_on_conflict

__all__ = ["ANNOTATION_ROLLUP_TAINT", "MAX_WRITES_PER_PASS", "MESSAGE_INTERVAL", "NodeRollupWriter"]

log = logging.getLogger(__name__)

ANNOTATION_ROLLUP_TAINT: Final = "drahealth.io/rollup-taint"
#: Requests to the API (reads and writes of Nodes) per controller pass at most.
MAX_WRITES_PER_PASS: Final = 20
#: A node's condition whose message alone changed is rewritten at most this often (s).
MESSAGE_INTERVAL: Final = 5.0
_BLOCKING: Final = ("NoSchedule", "NoExecute")
_EVENT_REASON: Final = {
    "False": ("Warning", "NodeDevicesUnhealthy"),
    "Unknown": ("Warning", "NodeDevicesUnknown"),
    "True": ("Normal", "NodeDevicesHealthy"),
}
JSON = dict[str, Any]
#: ``event(reference, type, reason, message)``: record an Event.
EventSink = Callable[[ObjectReference, str, str, str], None]
#: ``record(action, subject, message)``: a line in the controller's history.
RecordSink = Callable[[str, str, str], None]


@dataclass(slots=True)
class _Written:
    """The rollup condition as the node carries it."""

    status: str
    reason: str
    message: str
    since: str  # lastTransitionTime
    at: float = float("-inf")  # when this controller wrote it (monotonic)

    def key(self) -> tuple[str, str, str]:
        return (self.status, self.reason, self.message)


def _our_taint(annotations: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (key, effect) the rollup annotation says drahealth added, if readable."""
    try:
        found = json.loads(str(annotations.get(ANNOTATION_ROLLUP_TAINT) or "null"))
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    key, effect = found.get("key"), found.get("effect")
    if isinstance(key, str) and effect in _BLOCKING:
        return (key, str(effect))
    return None


class NodeRollupWriter:
    """Keeps each node's rollup condition (and node taint) equal to its devices' health."""

    def __init__(
        self,
        client: AsyncClient,
        policy: NodeRollupPolicy,
        *,
        event: EventSink,
        record: RecordSink,
        clock: Callable[[], float] = time.monotonic,
        max_writes: int = MAX_WRITES_PER_PASS,
    ) -> None:
        self.client = client
        self.policy = policy
        self.core = NodeRollup(policy)
        self._event = event
        self._record = record
        self._clock = clock
        self.max_writes = max_writes
        self._written: dict[str, _Written] = {}  # node -> our condition on it
        self._known: set[str] = set()  # nodes whose condition and taint were read
        self._tainted: dict[str, tuple[str, str]] = {}  # node -> our (key, effect) on it
        self._held: set[str] = set()  # over the threshold, but maxNodes reached
        self._would: set[str] = set()  # dry run / report-only: said it would taint
        self._wants: dict[DeviceKey, tuple[str, bool]] = {}  # device -> (rule, blocking)
        self._retry: dict[str, tuple[float, Backoff]] = {}
        self._frozen: set[str] = set()  # nodes opted out at the last pass
        self._said: set[int] = set()  # error codes already logged as warnings
        self.writes = 0

    # -- input -------------------------------------------------------------------------

    async def load(self) -> None:
        """One LIST: the rollup condition and taint each node already carries."""
        if not self.policy.enabled:
            return
        kind = self.policy.condition_type
        try:
            async for node in self.client.list(Node):
                self._learn(as_dict(node), kind)
        except ApiError as exc:
            log.warning(
                "listing nodes failed (%s): each node is read before its first rollup write",
                exc.status.message,
            )
            return
        # a node that carries drahealth's part but has no devices any more must lose it
        self.core.mark(self._written.keys() | self._tainted.keys())

    def _learn(self, raw: Mapping[str, Any], kind: str) -> None:
        meta = raw.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name:
            return
        self._known.add(name)
        self._written.pop(name, None)
        for c in (raw.get("status") or {}).get("conditions") or []:
            if isinstance(c, dict) and c.get("type") == kind:
                self._written[name] = _Written(
                    str(c.get("status") or ""),
                    str(c.get("reason") or ""),
                    str(c.get("message") or ""),
                    str(c.get("lastTransitionTime") or ""),
                )
        ours = _our_taint(meta.get("annotations") or {})
        if ours is None:
            self._tainted.pop(name, None)
        else:
            self._tainted[name] = ours

    def feed(
        self,
        changed: Iterable[DeviceKey],
        wants: Mapping[DeviceKey, Want],
        facts: Callable[[DeviceKey], DeviceFacts],
        observation: Callable[[DeviceKey], Observation | None],
    ) -> None:
        """The devices whose observation changed, and every taint wanted now (a pass
        costs O(changed + wanted))."""
        new = {k: (w.rule, w.effect in _BLOCKING) for k, w in wants.items()}
        touched = set(changed)
        touched.update(
            k for k in new.keys() | self._wants.keys() if new.get(k) != self._wants.get(k)
        )
        self._wants = new
        for key in touched:
            node = facts(key).node
            obs = observation(key)
            rule, blocking = new.get(key, ("", False))
            known = obs is not None or bool(rule) or node != ""
            device = None
            if known:
                device = RollupDevice(
                    None if obs is None else obs.health,
                    "" if obs is None else obs.message,
                    rule,
                    blocking,
                )
            self.core.set(key, node, device)

    # -- output ------------------------------------------------------------------------

    async def sync(self, *, may_taint: bool, frozen: Collection[str] = ()) -> bool:
        """Write the nodes whose rollup changed, at most ``max_writes`` requests; True
        when some were left for the next pass because of that bound. On ``frozen`` nodes
        (opted out of automatic action) the node taint is neither added nor removed."""
        thawed = self._frozen - set(frozen)
        self._frozen = set(frozen)
        if thawed:  # (not every pass: listing the nodes sorts all of them)
            self.core.mark(thawed & (self._tainted.keys() | set(self.core.nodes())))
        dirty = self.core.take_dirty()
        if not self.policy.enabled:
            return False
        now = self._clock()
        budget = self.max_writes
        later: list[str] = []
        for name in dirty:
            retry = self._retry.get(name)
            if budget <= 0 or (retry is not None and retry[0] > now):
                later.append(name)
                continue
            try:
                used, defer = await self._sync_node(name, now, may_taint and name not in frozen)
            except ApiError as exc:
                budget -= 1
                if is_not_found(exc):
                    self._forget(name)
                    continue
                backoff = retry[1] if retry is not None else Backoff(1.0, 60.0)
                self._retry[name] = (now + backoff.next(), backoff)
                code = exc.status.code or 0
                # a missing permission (403) is said once, not once per node and retry
                (log.debug if code in self._said else log.warning)(
                    "node %s: rollup write failed: %s%s", name, exc.status.message,
                    " (the controller needs get/list nodes, patch nodes/status, and update "
                    "nodes for taintNode)" if code == 403 else "",
                )  # fmt: skip
                if code == 403:
                    self._said.add(code)
                later.append(name)
                continue
            self._retry.pop(name, None)
            budget -= used
            if defer:
                later.append(name)
        self.core.mark(later)
        return budget <= 0 and bool(later)

    def _forget(self, name: str) -> None:
        for table in (self._written, self._tainted, self._retry):
            table.pop(name, None)
        for names in (self._known, self._held, self._would):
            names.discard(name)
        log.info("node %s is gone: no rollup to write", name)

    async def _sync_node(self, name: str, now: float, may_taint: bool) -> tuple[int, bool]:
        """(requests made, whether a message-only change waits for MESSAGE_INTERVAL)."""
        used = 0
        if name not in self._known:
            self._learn(as_dict(await self.client.get(Node, name)), self.policy.condition_type)
            used += 1
        cond = self.core.condition(name)
        have = self._written.get(name)
        defer = False
        if cond is None:
            if have is not None:
                await self._delete_condition(name)
                used += 1
        elif have is None or have.key() != cond.key():
            if have is not None and have.status == cond.status and now - have.at < MESSAGE_INTERVAL:
                defer = True
            else:
                await self._write_condition(name, cond, have, now)
                used += 1
        used += await self._sync_taint(name, cond, may_taint)
        return used, defer

    async def _write_condition(
        self, name: str, cond: NodeCondition, have: _Written | None, now: float
    ) -> None:
        stamp = now_rfc3339()
        since = (
            have.since if have is not None and have.status == cond.status and have.since else stamp
        )
        body = {
            "type": cond.type,
            "status": cond.status,
            "reason": cond.reason,
            "message": cond.message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": since,
        }
        await patch_status(
            self.client, Node, name, {"status": {"conditions": [body]}},
            patch_type=PatchType.STRATEGIC,
        )  # fmt: skip
        self.writes += 1
        self._written[name] = _Written(cond.status, cond.reason, cond.message, since, now)
        if have is None and cond.status == "True":
            return  # a node first seen healthy: nothing to tell
        if have is not None and have.status == cond.status:
            return  # the counts or messages changed, not the status
        kind, reason = _EVENT_REASON[cond.status]
        text = f"node {name}: {cond.type}={cond.status} ({cond.reason}): {cond.message}"
        log.info("%s", text)
        self._record("node-rollup", name, text)
        self._event(_ref(name), kind, reason, text)

    async def _delete_condition(self, name: str) -> None:
        patch = {
            "status": {"conditions": [{"type": self.policy.condition_type, "$patch": "delete"}]}
        }
        await patch_status(self.client, Node, name, patch, patch_type=PatchType.STRATEGIC)
        self.writes += 1
        del self._written[name]
        text = f"node {name}: no DRA devices any more, {self.policy.condition_type} removed"
        log.info("%s", text)
        self._record("node-rollup", name, text)

    # -- the node taint ------------------------------------------------------------------

    async def _sync_taint(self, name: str, cond: NodeCondition | None, may_taint: bool) -> int:
        taint = self.policy.taint_node
        wanted = self.core.taint_wanted(cond)
        ours = self._tainted.get(name)
        target = (taint.key, taint.effect) if wanted and taint is not None else None
        if not wanted:
            self._held.discard(name)
            self._would.discard(name)
        if not may_taint:
            if target is not None and ours is None and name not in self._would:
                self._would.add(name)
                text = (
                    f"node {name} would be tainted {target[0]}:{target[1]}: "
                    f"{_why(cond, taint)}; not written (dry run, report-only or opted out)"
                )
                log.info("%s", text)
                self._record("node-rollup", name, text)
            return 0  # neither added nor removed: nothing is written in these modes
        if target == ours:
            return 0
        full = len(self._tainted) >= self.core.max_tainted()
        if target is not None and ours is None and full:
            if name not in self._held:
                self._held.add(name)
                assert taint is not None
                text = (
                    f"node {name}: {_why(cond, taint)}, but {len(self._tainted)} node(s) "
                    f"already carry {taint.key} (maxNodes {taint.max_nodes}): held untainted"
                )
                log.warning("%s", text)
                self._record("node-rollup", name, text)
                self._event(_ref(name), "Warning", "NodeTaintHeld", text)
            return 0
        why = _why(cond, taint) if target is not None else "under the threshold"
        written = await retry_on_conflict(lambda: self._write_taint(name, target, why))
        self.writes += 1
        self._held.discard(name)
        if written is None:
            self._tainted.pop(name, None)
            if ours is not None:
                text = f"node {name}: removed node taint {ours[0]}:{ours[1]} ({why})"
                log.info("%s", text)
                self._record("node-rollup", name, text)
                self._event(_ref(name), "Normal", "NodeDevicesUntainted", text)
                self.core.mark(self._held)  # a slot is free: look at held nodes again
        else:
            self._tainted[name] = written
            text = f"node {name}: tainted {written[0]}:{written[1]}: {why}"
            log.info("%s", text)
            self._record("node-rollup", name, text)
            self._event(_ref(name), "Warning", "NodeDevicesTainted", text)
        return 2  # a read and an update

    async def _write_taint(
        self, name: str, target: tuple[str, str] | None, why: str
    ) -> tuple[str, str] | None:
        """Make drahealth's rollup taint on ``name`` equal to ``target``; the taint now
        recorded as ours (None: none, also when someone else's has the same key/effect)."""
        raw = as_dict(await self.client.get(Node, name))
        meta = raw.setdefault("metadata", {})
        spec = raw.setdefault("spec", {})
        annotations = dict(meta.get("annotations") or {})
        ours = _our_taint(annotations)
        taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
        kept = [t for t in taints if ours is None or (t.get("key"), t.get("effect")) != ours]
        result: tuple[str, str] | None = None
        if target is not None and not any((t.get("key"), t.get("effect")) == target for t in kept):
            added: JSON = {"key": target[0], "effect": target[1]}
            if target[1] == "NoExecute":
                added["timeAdded"] = now_rfc3339()  # only NoExecute taints carry it
            kept.append(added)
            result = target
            record = {"key": target[0], "effect": target[1], "since": now_rfc3339(), "reason": why}
            annotations[ANNOTATION_ROLLUP_TAINT] = json.dumps(record, ensure_ascii=False)
        else:
            annotations.pop(ANNOTATION_ROLLUP_TAINT, None)
        if kept == taints and annotations == dict(meta.get("annotations") or {}):
            return result
        if kept:
            spec["taints"] = kept
        else:
            spec.pop("taints", None)
        meta["annotations"] = annotations
        # the update carries the resourceVersion read: a concurrent write is a 409
        await self.client.replace(Node.from_dict(raw))  # type: ignore[call-overload]
        return result


def _why(cond: NodeCondition | None, taint: Any) -> str:
    if cond is None or taint is None:
        return ""
    return (
        f"{cond.blocking} of {cond.total} device(s) tainted by drahealth "
        f"(threshold {taint.threshold})"
    )


def _ref(node: str) -> ObjectReference:
    return ObjectReference(apiVersion="v1", kind="Node", name=node)
