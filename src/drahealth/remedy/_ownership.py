"""The remediation controller's ownership filter: holds, opt-out nodes, exclusions.

Owns :class:`OwnershipGuard`, the I/O side of :mod:`drahealth.core._holds`, run once
per pass between the engine's wants and the writes:

* **operator holds**: the control key ``holds`` (``drahealth untaint --hold``) and
  deletions of the controller's own DeviceTaintRules that the controller did not make
  (``kubectl delete``), which hold the device for the policy's
  ``ownership.manualUntaintHold``. A held device gets no controller taint (nor
  eviction) until the hold ends; then the policy applies again. Each hold is said
  once when it begins (Event ``DeviceTaintHeld`` on the device's Node, a history
  line) and when it ends (``DeviceTaintHoldEnded``); the active ones are the state
  key ``holds``;
* **opt-out**: the devices of a Node labelled ``drahealth.io/remediation=disabled``,
  and those the policy's ``exclude`` names (drivers, pools, nodes), are *frozen*: no
  new taint, no untaint, no eviction, no validation or repair; what they carry stays
  as it is (:meth:`frozen`, :meth:`keeps_rule`, :meth:`freeze_nodes`). Said once per
  node (Event ``RemediationDisabled``, and ``RemediationEnabled`` when the label
  goes) and once per excluded device that wants a taint.

Node labels come from a watch of only the labelled Nodes (a label selector): the
controller keeps nothing of the other nodes (5,000 nodes cost nothing until some opt
out), and a node whose label is removed leaves the watch as a ``DELETED`` event, as
on a real API server. The NodeWriter's reads are no alternative: it reads only the
nodes it writes, in node-level modes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from lightkube import AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.resources.core_v1 import Node

from drahealth.core import (
    OPT_OUT_LABEL,
    OPT_OUT_VALUE,
    DeviceFacts,
    DeviceKey,
    Hold,
    HoldBook,
    Policy,
    Verdict,
    filter_wants,
    format_time,
    frozen_reason,
)
from drahealth.kube import Reflector
from drahealth.remedy._metrics import ControllerMetrics
from drahealth.remedy._nodes import NodeDevice
from drahealth.remedy._rules import ANNOTATION_RULE

__all__ = ["OwnershipGuard"]

log = logging.getLogger(__name__)

#: Names of rules the controller is deleting itself, remembered this long (seconds).
DELETE_MEMORY: Final = 600.0
#: Most names / devices remembered for the bookkeeping below.
MAX_REMEMBERED: Final = 10_000

#: ``event(ref, type, reason, message, action, related)``
EventSink = Callable[[ObjectReference, str, str, str, str, ObjectReference | None], None]
#: ``record(action, subject, message)``: a history line
RecordSink = Callable[[str, str, str], None]


def _selector_key(raw: Mapping[str, Any]) -> DeviceKey | None:
    sel = (raw.get("spec") or {}).get("deviceSelector") or {}
    driver, pool, device = sel.get("driver"), sel.get("pool"), sel.get("device")
    if not (driver and pool and device):
        return None
    return DeviceKey(str(driver), str(pool), str(device))


class OwnershipGuard:
    """See the module docstring; the controller calls :meth:`filter` once per pass."""

    def __init__(
        self,
        client: AsyncClient,
        policy: Policy,
        *,
        facts: Callable[[DeviceKey], DeviceFacts],
        record: RecordSink,
        event: EventSink,
        wake: Callable[[], None],
        metrics: ControllerMetrics,
        history_ref: ObjectReference,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.book = HoldBook(policy.ownership.manual_untaint_hold)
        self.exclude = policy.exclude
        #: only the opted-out Nodes (label selector), see the module docstring
        self.nodes: Reflector[Node] = Reflector(
            client, Node, labels={OPT_OUT_LABEL: OPT_OUT_VALUE}, name="remedy-opt-out-nodes"
        )
        self._facts = facts
        self._record = record
        self._event = event
        self._wake = wake
        self._metrics = metrics
        self._history_ref = history_ref
        self._wall = wall
        self.opted_out: set[str] = set()
        self._deleting: dict[str, float] = {}  # rule name -> wall time we deleted it
        self._control_generation = -1
        self._said_frozen: dict[DeviceKey, str] = {}  # frozen devices wanting a taint
        self._deferred: set[DeviceKey] = set()  # validations not run while frozen
        self.last: Verdict[Any] = Verdict({}, {}, {})

    # -- inputs ----------------------------------------------------------------------

    def on_node(self, event_type: str, obj: Any, _old: Any) -> None:
        """A watch event of an opted-out Node (DELETED: the label went, or the node)."""
        name = str(obj.metadata.name)
        labels = obj.metadata.labels or {}
        disabled = event_type != "DELETED" and labels.get(OPT_OUT_LABEL) == OPT_OUT_VALUE
        if disabled and name not in self.opted_out:
            self.opted_out.add(name)
            message = (
                f"node {name}: automatic remediation disabled by the label "
                f"{OPT_OUT_LABEL}={OPT_OUT_VALUE}: its devices get no new taint, no untaint, "
                "no eviction and no repair from drahealth until the label is removed"
            )
            self._say(name, "opt-out", "Warning", "RemediationDisabled", message, "Disable")
        elif not disabled and name in self.opted_out:
            self.opted_out.discard(name)
            message = (
                f"node {name}: the label {OPT_OUT_LABEL}={OPT_OUT_VALUE} is gone: automatic "
                "remediation applies to its devices again"
            )
            self._say(name, "opt-in", "Normal", "RemediationEnabled", message, "Enable")
        self._metrics.opted_out_nodes.set(len(self.opted_out))
        self._wake()

    def deleting(self, name: str) -> None:
        """The controller is about to delete its rule ``name`` (not an operator's untaint)."""
        now = self._wall()
        self._deleting[name] = now
        if len(self._deleting) > MAX_REMEMBERED:
            for old in [n for n, t in self._deleting.items() if t < now - DELETE_MEMORY]:
                del self._deleting[old]
            while len(self._deleting) > MAX_REMEMBERED:
                del self._deleting[next(iter(self._deleting))]

    def delete_failed(self, name: str) -> None:
        """The controller's delete of ``name`` did not happen (a 409, an error)."""
        self._deleting.pop(name, None)

    def rule_deleted(self, raw: Mapping[str, Any]) -> None:
        """A controller rule is gone: by the controller's own delete, or someone else's."""
        meta = raw.get("metadata") or {}
        name = str(meta.get("name") or "")
        if self._deleting.pop(name, None) is not None:
            return
        key = _selector_key(raw)
        if key is None:
            return
        now = self._wall()
        self._metrics.manual_untaints.inc()
        policy_rule = (meta.get("annotations") or {}).get(ANNOTATION_RULE, "")
        hold = self.book.rule_deleted(key, name, now)
        if hold is not None:
            message = (
                f"DeviceTaintRule {name} of {key} (policy rule {policy_rule or '?'}) was deleted "
                f"outside the controller: taken as an operator's untaint, held until "
                f"{format_time(hold.until)} (policy ownership.manualUntaintHold)"
            )
        else:
            message = (
                f"DeviceTaintRule {name} of {key} was deleted outside the controller; "
                "no hold applies: it is re-created if the device still wants it"
            )
        log.info("%s", message)
        self._record("rule-deleted", str(key), message)
        self._wake()

    def restore(self, state: Any, control: Any) -> None:
        """At start: the state key ``holds`` the last leader wrote, and the control key."""
        for warning in self.book.restore(state, control, self._wall()):
            log.warning("%s", warning)

    # -- the pass --------------------------------------------------------------------

    def filter(self, wants: Mapping[DeviceKey, Any], control: Any) -> dict[DeviceKey, Any]:
        """The wants to carry out; held and frozen ones are left out (and said once).

        ``control`` is the controller's :class:`ControlRequests`.
        """
        now = self._wall()
        if control.generation != self._control_generation:
            self._control_generation = control.generation
            for warning in self.book.apply_control(control.get("holds"), now):
                log.warning("%s: %s", "drahealth-remediation-control", warning)
        verdict = filter_wants(wants, self._facts, self.book, self.opted_out, self.exclude, now)
        self.last = verdict
        began, ended = self.book.changes(now)
        for key, hold in began:
            self._hold_began(key, hold, key in verdict.held)
        for key, hold in ended:
            self._hold_ended(key, hold, key in wants)
        for key, why in verdict.frozen.items():
            if self._said_frozen.get(key) != why:
                self._said_frozen[key] = why
                self._frozen_want(key, wants[key], why)
        for key in [k for k in self._said_frozen if k not in verdict.frozen]:
            del self._said_frozen[key]
        while len(self._said_frozen) > MAX_REMEMBERED:
            del self._said_frozen[next(iter(self._said_frozen))]
        self._metrics.held_devices.labels("hold").set(len(verdict.held))
        self._metrics.held_devices.labels("frozen").set(len(verdict.frozen))
        return verdict.act

    def frozen(self, key: DeviceKey, node: str | None = None) -> str | None:
        """Why the controller must leave ``key`` exactly as it is, or None."""
        if not self.opted_out and not self.exclude:
            return None
        facts = self._facts(key)
        if node is not None and not facts.node:
            facts = DeviceFacts(facts.driver, facts.pool, facts.device, node, facts.attributes)
        return frozen_reason(facts, self.opted_out, self.exclude)

    def keeps_rule(self, rule: Any) -> bool:
        """Whether the controller's rule ``rule`` must stay as it is (a frozen device)."""
        if not self.opted_out and not self.exclude:
            return False
        spec = getattr(rule, "spec", None)
        sel = getattr(spec, "deviceSelector", None)
        if sel is None or not (sel.driver and sel.pool and sel.device):
            return False
        return self.frozen(DeviceKey(sel.driver, sel.pool, sel.device)) is not None

    def freeze_nodes(
        self,
        desired: Mapping[str, Sequence[NodeDevice]],
        written: Mapping[str, Sequence[NodeDevice]],
    ) -> dict[str, list[NodeDevice]]:
        """Node-level modes: frozen devices keep what was last written on their node."""
        out = {node: list(devices) for node, devices in desired.items()}
        if not self.opted_out and not self.exclude:
            return out
        for node, devices in written.items():
            for d in devices:
                if self.frozen(d.device, node) is None:
                    continue
                mine = out.setdefault(node, [])
                if all(x.device != d.device for x in mine):
                    mine.append(d)
        return out

    def defer_validation(self, key: DeviceKey) -> bool:
        """True (and remembered) if a frozen device's validation must not run now."""
        if self.frozen(key) is None:
            return False
        self._deferred.add(key)
        return True

    def thawed(self) -> list[DeviceKey]:
        """Devices whose validation was deferred and which are no longer frozen."""
        out = [k for k in self._deferred if self.frozen(k) is None]
        self._deferred.difference_update(out)
        return sorted(out)

    def state(self) -> dict[str, dict[str, str]]:
        """The state key ``holds``."""
        return self.book.state(self._wall())

    def next_end(self) -> float | None:
        """Wall time of the next hold's end, or None."""
        return self.book.next_end(self._wall())

    # -- saying it -------------------------------------------------------------------

    def _node_ref(self, node: str) -> ObjectReference:
        if not node:
            return self._history_ref
        return ObjectReference(apiVersion="v1", kind="Node", name=node)

    def _say(self, node: str, action: str, kind: str, reason: str, message: str, verb: str) -> None:
        log.info("%s", message)
        self._record(action, node, message)
        self._event(self._node_ref(node), kind, reason, message, verb, None)

    def _hold_began(self, key: DeviceKey, hold: Hold, wanted: bool) -> None:
        node = self._facts(key).node
        message = (
            f"{key}: held by {hold.by or 'unknown'} until {format_time(hold.until)}"
            + (f" ({hold.reason})" if hold.reason else "")
            + ": the controller does not taint it until then"
            + ("; it wants a taint now" if wanted else "")
            + ", then the policy applies again"
        )
        self._say(node, "hold", "Normal", "DeviceTaintHeld", message, "Hold")

    def _hold_ended(self, key: DeviceKey, hold: Hold, wanted: bool) -> None:
        node = self._facts(key).node
        message = f"{key}: the hold by {hold.by or 'unknown'} ended: the policy applies again" + (
            "; it wants a taint, written now" if wanted else ""
        )
        self._say(node, "hold-ended", "Normal", "DeviceTaintHoldEnded", message, "Release")

    def _frozen_want(self, key: DeviceKey, want: Any, why: str) -> None:
        node = self._facts(key).node
        message = (
            f"{key} wants taint {want.key}={want.value}:{want.effect} (policy rule "
            f"{want.rule}: {want.reason}), but remediation is disabled for it: {why}; "
            "nothing is changed"
        )
        opted_out = bool(node) and node in self.opted_out
        log.info("%s", message)
        self._record("frozen", str(key), message)
        if not opted_out:  # an opted-out node said so once already
            self._event(self._node_ref(node), "Warning", "RemediationDisabled", message, "Skip",
                        None)  # fmt: skip
