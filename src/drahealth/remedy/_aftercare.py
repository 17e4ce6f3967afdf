"""The controller's side of repeated-fault escalation and repair actions.

Owns :class:`AftercareGuard`, run once per pass after the evictions (the engine's side is
:mod:`drahealth.core._repair`):

* **clears**: the control key ``clear`` (``drahealth clear DRIVER/POOL/DEVICE``), each
  request applied once: the device's needs-a-human mark and its counts before the
  request's time go, and its recovery starts over (``healthyFor``, then ``validate``);
  a history line and a ``DeviceCleared`` Event;
* **needs a human**: each new mark is a ``DeviceNeedsHuman`` Warning Event (on the
  device's DeviceTaintRule, else its Node), a history line, the counter
  ``drahealth_controller_needs_human_marked_total``; the gauge
  ``drahealth_controller_needs_human`` counts the marked devices, and the device's rule
  carries the annotation ``drahealth.io/needs-human: <why>`` (:meth:`annotate`);
* **repairs**: the attempts the engine says are due, on devices that no pod uses any
  more (the ClusterModel's consumers) and that are not frozen (opt-out, exclusions), go
  to the :class:`~drahealth.remedy._repair.RepairRunner`; every start, end and retry is
  a history line and an Event (``DeviceRepairStarted``, ``DeviceRepairSucceeded``,
  ``DeviceRepairFailed``);
* **state**: the keys ``needsHuman``, ``episodes`` and ``repairs`` of the state ConfigMap
  (written when they changed; read back at start, so a restart resumes them, and a
  repair that was running is run again; a Job still running is adopted).
"""

from __future__ import annotations

import logging
from typing import Any, Final

from lightkube.models.core_v1 import ObjectReference

from drahealth.core import (
    BURN_IN_REPAIRED,
    DeviceKey,
    NeedsHuman,
    Notice,
    RepairRun,
    format_time,
    parse_time,
)
from drahealth.remedy._repair import RepairRunner
from drahealth.remedy._rules import ANNOTATION_NODE, ANNOTATION_RULE, is_ours

__all__ = ["ANNOTATION_NEEDS_HUMAN", "AftercareGuard"]

log = logging.getLogger(__name__)

ANNOTATION_NEEDS_HUMAN: Final = "drahealth.io/needs-human"
#: Clear requests remembered as applied (the oldest are forgotten first).
MAX_APPLIED: Final = 10_000


class AftercareGuard:
    """See the module docstring. ``controller`` is the RemediationController."""

    def __init__(self, controller: Any) -> None:
        self.c = controller
        self.runner = RepairRunner(
            controller.client, controller.namespace, self._done,
            recorded=lambda: bool(controller.state.written("repairs")),  # before a command runs
        )  # fmt: skip
        self._applied: dict[str, str] = {}  # device -> the `at` of the last clear applied
        self._loaded = False

    @property
    def care(self) -> Any:
        return self.c.engine.care

    # -- time ------------------------------------------------------------------------

    def _to_wall(self, t: float) -> str:
        return format_time(self.c._wall() - (self.c._clock() - t))

    def _from_wall(self, text: Any) -> float | None:
        wall = parse_time(text)
        if wall is None:
            return None
        return float(self.c._clock() - (self.c._wall() - wall))

    # -- start -----------------------------------------------------------------------

    def restore(self) -> None:
        """Resume from the state ConfigMap (after it was loaded)."""
        problems = self.care.restore(self.c.state.values, self._from_wall, self.c._clock())
        for p in problems:
            log.warning("remediation state: %s", p)
        # a mark the state lost (an edit by hand) but the device's rule still says
        marked = self.care.escalation.marked
        for rule in self.c.rules.store.list() if self.c.rules is not None else []:
            meta, spec = rule.metadata, rule.spec
            why = ((meta.annotations or {}) if meta else {}).get(ANNOTATION_NEEDS_HUMAN)
            sel = spec.deviceSelector if spec is not None else None
            if (
                not is_ours(rule)
                or not why
                or sel is None
                or not (sel.driver and sel.pool and sel.device)
            ):
                continue
            key = DeviceKey(sel.driver, sel.pool, sel.device)
            if key not in marked:
                annotations = meta.annotations or {}
                marked[key] = NeedsHuman(
                    self.c._clock(), why, annotations.get(ANNOTATION_RULE, ""),
                    annotations.get(ANNOTATION_NODE, ""),
                )  # fmt: skip
        # what was applied before the restart is not applied again
        for name, req in (self.c.control.get("clear") or {}).items():
            if isinstance(req, dict):
                self._applied[name] = str(req.get("at", ""))
        self._loaded = True

    async def stop(self) -> None:
        await self.runner.stop()

    # -- one pass --------------------------------------------------------------------

    def apply_clears(self, now: float) -> None:
        requests = self.c.control.get("clear") or {}
        if not isinstance(requests, dict):
            return
        for name, req in sorted(requests.items()):
            if not isinstance(req, dict) or self._applied.get(name) == str(req.get("at", "")):
                continue
            self._applied.pop(name, None)
            self._applied[name] = str(req.get("at", ""))
            while len(self._applied) > MAX_APPLIED:
                del self._applied[next(iter(self._applied))]
            at = self._from_wall(req.get("at"))
            try:
                key = DeviceKey.parse(name)
            except ValueError:
                key = None
            if key is None or at is None:
                log.warning("clear request %r: not a device with a time: ignored", name)
                continue
            went = self.c.engine.clear(key, min(at, now), now)
            by, reason = req.get("by") or "an operator", req.get("reason") or ""
            message = (
                f"{key} cleared by {by}"
                + (f": {reason}" if reason else "")
                + (
                    "; it needs no human any more and recovers as usual"
                    if went
                    else "; it was not marked needs-a-human, its counts start again"
                )
            )
            log.info("%s", message)
            self.c._record("clear", str(key), message)
            self.c._spawn(self.c._event(self._ref(key), "Normal", "DeviceCleared", message))

    def after_pass(self, now: float, frozen: Any = None) -> None:
        """Notices to Events, due repairs to the runner, gauges, the state keys."""
        for notice in self.care.take_notices():
            self._notice(notice)
        runs = self.care.due(now, lambda k: self._drained(k, frozen))
        for run in runs:
            self._start(run)
        self.c.metrics.needs_human.set(len(self.care.escalation.marked))
        self.c.metrics.repairs_running.set(self.runner.running)
        if self.care.changed or self.care.escalation.changed or not self._loaded:
            for key, value in self.care.export(self._to_wall, now).items():
                self.c.state.set(key, value)
            self._loaded = True

    def annotate(self, key: DeviceKey, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with ``drahealth.io/needs-human`` when the device needs a human (a
        copy: built bodies are shared)."""
        mark = self.care.escalation.needs_human(key)
        if mark is None:
            return body
        meta = dict(body["metadata"])
        meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION_NEEDS_HUMAN: mark.why}
        return {**body, "metadata": meta}

    @staticmethod
    def stale(current: Any, body: dict[str, Any]) -> bool:
        """Whether the rule in the API lacks (or wrongly has) the needs-human annotation."""
        have = (current.metadata.annotations or {}) if current.metadata else {}
        want = body["metadata"].get("annotations") or {}
        return have.get(ANNOTATION_NEEDS_HUMAN) != want.get(ANNOTATION_NEEDS_HUMAN)

    # -- internals -------------------------------------------------------------------

    def _drained(self, key: DeviceKey, frozen: Any) -> bool:
        if frozen is not None and frozen(key):
            return False
        return not self.c.model.consumers(key)

    def _ref(self, key: DeviceKey) -> ObjectReference:
        name = self.c._rule_names.get(key)
        if name:
            return ObjectReference(apiVersion=self.c._rules_api, kind="DeviceTaintRule", name=name)
        node = self.c._facts(key).node
        if node:
            return ObjectReference(apiVersion="v1", kind="Node", name=node)
        return ObjectReference(
            apiVersion="v1", kind="ConfigMap", name="drahealth-remediation-history",
            namespace=self.c.namespace,
        )  # fmt: skip

    def _notice(self, n: Notice) -> None:
        log.warning("%s", n.message)
        if n.kind == "needs-human":
            mark = self.care.escalation.needs_human(n.key)
            cause = "repairs" if mark is not None and "repair" in mark.why else "episodes"
            self.c.metrics.needs_human_marked.labels(cause).inc()
            self.c._record("needs-human", str(n.key), n.message)
            self.c._spawn(self.c._event(self._ref(n.key), "Warning", "DeviceNeedsHuman", n.message))
            self.c._wake.set()  # the rule's annotation
            return
        # an attempt's own end is repair-failed; all attempts spent is repair-exhausted
        action = "repair-exhausted" if n.kind == "repair-failed" else n.kind
        self.c._record(action, str(n.key), n.message)
        if n.kind == "repair-failed":
            self.c._spawn(
                self.c._event(self._ref(n.key), "Warning", "DeviceRepairFailed", n.message)
            )

    def _start(self, run: RepairRun) -> None:
        facts = self.c._facts(run.key)
        rule = self.c.policy.rule_named(run.rule)
        reason = self.c.engine.explain(run.key, self.c._clock())
        tolerate = [rule.action.taint_key] if rule is not None else []
        rollup_key = getattr(getattr(self.c.policy, "node_rollup", None), "taint_node", None)
        if rollup_key is not None and getattr(rollup_key, "key", None):
            tolerate.append(rollup_key.key)
        message = (
            f"repair of {run.key} started: {run.repair.kind}, attempt {run.attempt} of "
            f"{run.repair.attempts}" + (f" (repair {run.round})" if run.round > 1 else "")
        )
        log.info("%s", message)
        self.c._record("repair-start", str(run.key), message)
        self.c._spawn(self.c._event(self._ref(run.key), "Normal", "DeviceRepairStarted", message))
        self.runner.start(run, facts, reason, tolerate)

    def _done(self, run: RepairRun, ok: bool, detail: str, job: str) -> None:
        now = self.c._clock()
        phase = self.care.finished(run.key, run, ok, detail, now)
        if phase == "succeeded":  # the burn-in gate, where the policy has one for repairs
            self.c.engine.burn_in(run.key, BURN_IN_REPAIRED, now)
        if phase == "succeeded":  # burnIn.appliesTo lists repaired: the burn-in gate starts
            self.c.engine.burn_in(run.key, BURN_IN_REPAIRED, now)
        result = "succeeded" if ok else "failed"
        self.c.metrics.repairs.labels(run.repair.kind, result).inc()
        message = (
            f"repair of {run.key} attempt {run.attempt} {result}: {detail}"
            + (f" (job {job})" if job and job not in detail else "")
            + ("" if phase is not None else "; no longer wanted")
        )
        (log.info if ok else log.warning)("%s", message)
        self.c._record(f"repair-{result}", str(run.key), message)
        reason = "DeviceRepairSucceeded" if ok else "DeviceRepairFailed"
        self.c._spawn(
            self.c._event(self._ref(run.key), "Normal" if ok else "Warning", reason, message)
        )
        self.c._wake.set()
