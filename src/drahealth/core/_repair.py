"""Repair actions of tainted devices, and their escalation: the engine's side.

Owns the repair policy (:class:`Repair` with one of ``exec``, :class:`RepairWebhook` or
:class:`RepairJob`, ``attempts``, ``backoff``, ``timeout``), the per-device repair
phases (:class:`RepairTracker` inside :class:`Aftercare`), the Job manifest a ``job``
repair creates (:func:`job_manifest`, :func:`normalize_job_template`) and the
substitution of a device's facts into it (:func:`repair_env`, :func:`substitute`).

:class:`Aftercare` is what the remedy engine calls: a new taint of a device is a new
*episode* (counted by the :class:`~drahealth.core._escalation.EscalationTracker`) and,
when its rule has a repair, starts one. A repair's phases:

* ``waiting-drain``: it runs once no pod uses the device any more (the caller says
  which devices are drained) and its backoff time has come;
* ``running``: an attempt was handed to the runner, which answers with
  :meth:`Aftercare.finished`;
* ``succeeded``: the engine's ``healthyFor`` + ``validate`` now decide the untaint (it is
  refused before that); a device that goes bad again while still tainted counts as a
  failed attempt of the repair;
* ``failed``: all ``attempts`` failed (the n-th failed attempt waits
  ``backoff * 2**(n-1)`` before the next). That is one failed repair for the
  escalation: at its ``failed_repairs`` limit the device needs a human, below it a new
  repair (a fresh set of attempts) follows after the backoff.

A device that needs a human gets no repair and no untaint until an operator clears it.
Sans-I/O: times are the caller's clock; :meth:`Aftercare.export` and
:meth:`Aftercare.restore` carry the state across a restart on the wall clock.

Substitution (``job`` templates): ``$(DRAHEALTH_<NAME>)`` is replaced only inside the
string values of ``args`` and of ``env[].value`` of the template's containers and init
containers, after the template was parsed, so a value can never change the manifest's
structure; each value must be made of ``[A-Za-z0-9._:/@+-]`` (a device's facts with
anything else, e.g. a space, ``$`` or a quote, make the attempt fail, naming it), and a
name the device has no value for is an error, never an empty string: ``nvidia-smi -r -i
""`` must not reach a node. The same names are added to every container's environment.
"""

from __future__ import annotations

import copy
import math
import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

from drahealth.core._escalation import Escalation, EscalationTracker, NeedsHuman, duration_text
from drahealth.core._health import DeviceKey

if TYPE_CHECKING:
    from drahealth.core._policy import DeviceFacts, Policy, Rule

__all__ = [
    "MAX_BACKOFF",
    "Aftercare",
    "JobPlacement",
    "Notice",
    "Repair",
    "RepairError",
    "RepairJob",
    "RepairRun",
    "RepairState",
    "RepairWebhook",
    "explain_aftercare",
    "job_manifest",
    "normalize_job_template",
    "repair_env",
    "substitute",
    "template_references",
]

#: The longest wait between two attempts, whatever the doubling says (seconds).
MAX_BACKOFF: Final = 3600.0
#: Notices waiting to be reported (the controller takes them every pass).
MAX_NOTICES: Final = 10_000
Phase = Literal["waiting-drain", "running", "succeeded", "failed"]
PHASES: Final = ("waiting-drain", "running", "succeeded", "failed")
_REFERENCE = re.compile(r"\$\(DRAHEALTH_([A-Za-z0-9_]+)\)")
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9._:/@+-]+$")
_ENV_NAME = re.compile(r"[^A-Za-z0-9_]")
#: Names every device has; ``ATTR_<name>`` come from its ResourceSlice attributes.
FIXED_NAMES: Final = ("DEVICE", "NODE", "DRIVER", "POOL", "DEVICE_NAME", "RULE")


class RepairError(ValueError):
    """A repair that cannot be built; the text names what was wrong."""


@dataclass(frozen=True, slots=True)
class RepairWebhook:
    """POST ``{device, node, rule, reason}`` as JSON to ``url``; a 2xx answer is success."""

    url: str
    timeout: float = 30.0


@dataclass(frozen=True, slots=True)
class RepairJob:
    """A ``batch/v1`` Job from ``template`` (a Job spec, normalized) on the device's node,
    in ``namespace`` (empty: the controller's)."""

    template: Mapping[str, Any]
    namespace: str = ""


@dataclass(frozen=True, slots=True)
class Repair:
    """What a rule runs on a drained device before recovery may untaint it."""

    exec: tuple[str, ...] = ()
    webhook: RepairWebhook | None = None
    job: RepairJob | None = None
    attempts: int = 3
    backoff: float = 30.0
    timeout: float = 600.0

    @property
    def kind(self) -> str:
        return "job" if self.job is not None else "webhook" if self.webhook else "exec"

    def backoff_after(self, failed: int) -> float:
        """The wait after the ``failed``-th failed attempt: doubling, at most an hour."""
        return float(min(MAX_BACKOFF, self.backoff * 2 ** max(0, failed - 1)))


@dataclass(slots=True)
class RepairState:
    """One device's repair in the current episode."""

    rule: str
    kind: str
    node: str
    phase: Phase = "waiting-drain"
    attempt: int = 0  # attempts started in this round
    round: int = 1  # repairs (sets of attempts) in this episode
    since: float = 0.0  # when the phase began
    not_before: float = 0.0  # the backoff: no attempt before this
    detail: str = ""
    failed: int = 0  # failed attempts in this round


@dataclass(frozen=True, slots=True)
class RepairRun:
    """An attempt the runner should start now."""

    key: DeviceKey
    rule: str
    repair: Repair
    attempt: int
    round: int


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the controller should say (an Event, a history line)."""

    key: DeviceKey
    kind: Literal["needs-human", "repair-retry", "repair-failed", "repair-regressed"]
    message: str
    rule: str = ""
    node: str = ""


class Aftercare:
    """Episodes, escalation and repairs of tainted devices (see the module docstring)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.escalation = EscalationTracker()
        self.repairs: dict[DeviceKey, RepairState] = {}
        self._notices: deque[Notice] = deque(maxlen=MAX_NOTICES)
        self.changed = False  # the repairs changed since the last export
        #: counts older than this matter for no rule
        self.window = max(
            [policy.escalation.window]
            + [r.escalation.window for r in policy.all_rules() if r.escalation is not None]
        )

    def escalation_of(self, rule: Rule | None) -> Escalation:
        if rule is not None and rule.escalation is not None:
            return rule.escalation
        return self.policy.escalation

    # -- engine hooks ------------------------------------------------------------

    def on_taint(self, key: DeviceKey, rule: Rule, node: str, now: float) -> None:
        """A new episode: the device's taint starts at ``now``."""
        esc = self.escalation_of(rule)
        if esc.episodes > 0:
            mark = self.escalation.episode(key, esc, now, rule.name, node)
            if mark is not None:
                self._needs_human(key, mark)
        if rule.repair is not None and self.escalation.needs_human(key) is None:
            self.repairs[key] = RepairState(
                rule.name, rule.repair.kind, node, since=now, not_before=now,
                detail="waiting for the device's pods to leave",
            )  # fmt: skip
            self.changed = True

    def on_bad_again(self, key: DeviceKey, now: float) -> None:
        """The tainted device went bad again: after a successful repair, it did not hold."""
        st = self.repairs.get(key)
        if st is not None and st.phase == "succeeded":
            self._attempt_failed(key, st, now, "the device went bad again after the repair")

    def allows_untaint(self, key: DeviceKey) -> bool:
        """No mark, and no repair that has yet to succeed."""
        if key in self.escalation.marked:
            return False
        st = self.repairs.get(key)
        return st is None or st.phase == "succeeded"

    def on_untaint(self, key: DeviceKey) -> None:
        """The episode is over."""
        if self.repairs.pop(key, None) is not None:
            self.changed = True

    def next_wakeup(self) -> float | None:
        times = [s.not_before for s in self.repairs.values() if s.phase == "waiting-drain"]
        return min(times) if times else None

    # -- controller side ---------------------------------------------------------

    def waiting(self, now: float) -> list[DeviceKey]:
        """Devices whose repair would start now if they were drained."""
        return sorted(
            k for k, s in self.repairs.items() if s.phase == "waiting-drain" and s.not_before <= now
        )

    def due(self, now: float, drained: Callable[[DeviceKey], bool]) -> list[RepairRun]:
        """The attempts to start now (marked running): drained devices past their backoff."""
        runs: list[RepairRun] = []
        for key in self.waiting(now):
            st = self.repairs[key]
            rule = self.policy.rule_named(st.rule)
            if rule is None or rule.repair is None:
                del self.repairs[key]  # the rule left the policy: nothing to run
                self.changed = True
                continue
            if not drained(key):
                detail = "waiting for the device's pods to leave"
                if st.detail != detail:
                    st.detail = detail
                    self.changed = True
                continue
            st.phase, st.since, st.detail = "running", now, ""
            st.attempt += 1
            self.changed = True
            runs.append(RepairRun(key, st.rule, rule.repair, st.attempt, st.round))
        return runs

    def finished(
        self, key: DeviceKey, run: RepairRun, ok: bool, detail: str, now: float
    ) -> str | None:
        """The runner's answer for ``run``: the phase it led to (None: no longer wanted)."""
        st = self.repairs.get(key)
        if (
            st is None
            or st.phase != "running"
            or (st.attempt, st.round)
            != (
                run.attempt,
                run.round,
            )
        ):
            return None
        self.changed = True
        if ok:
            st.phase, st.since, st.detail = "succeeded", now, detail
            return "succeeded"
        self._attempt_failed(key, st, now, detail)
        return st.phase

    def clear(self, key: DeviceKey, at: float) -> bool:
        """An operator cleared the device at ``at``: its mark and counts before ``at`` go,
        and a repair still owed no longer holds the untaint. True if a mark went."""
        went = self.escalation.clear(key, at)
        st = self.repairs.get(key)
        if st is not None and st.phase != "running" and (went or st.phase == "failed"):
            del self.repairs[key]
            self.changed = True
        return went

    def take_notices(self) -> list[Notice]:
        out = list(self._notices)
        self._notices.clear()
        return out

    def export(self, wall: Callable[[float], Any], now: float) -> dict[str, Any]:
        """The state keys ``needsHuman``, ``episodes`` and ``repairs`` (times via ``wall``)."""
        needs, counted = self.escalation.export(wall, now, self.window)
        repairs = {
            str(k): {
                "phase": s.phase, "attempt": s.attempt, "kind": s.kind, "since": wall(s.since),
                "detail": s.detail, "rule": s.rule, "node": s.node, "round": s.round,
                "failed": s.failed, "notBefore": wall(s.not_before),
            }
            for k, s in sorted(self.repairs.items())
        }  # fmt: skip
        self.changed = self.escalation.changed = False
        return {"needsHuman": needs, "episodes": counted, "repairs": repairs}

    def restore(self, state: Mapping[str, Any], clock: Callable[[Any], float | None]) -> list[str]:
        """Load :meth:`export`'s keys; a repair that was running is run again (its attempt
        is not counted twice). Returns one line per entry left out."""
        needs, counted = state.get("needsHuman") or {}, state.get("episodes") or {}
        problems = self.escalation.restore(
            needs if isinstance(needs, Mapping) else {},
            counted if isinstance(counted, Mapping) else {},
            clock,
        )
        repairs = state.get("repairs") or {}
        for name, value in (repairs if isinstance(repairs, Mapping) else {}).items():
            try:
                key = DeviceKey.parse(name)
                phase = value["phase"]
                since, not_before = clock(value.get("since")), clock(value.get("notBefore"))
                if phase not in PHASES or since is None:
                    raise ValueError(phase)
                st = RepairState(
                    str(value["rule"]), str(value.get("kind", "")), str(value.get("node", "")),
                    phase, int(value.get("attempt", 0)), int(value.get("round", 1)), since,
                    since if not_before is None else not_before, str(value.get("detail", "")),
                    int(value.get("failed", 0)),
                )  # fmt: skip
            except (KeyError, TypeError, ValueError, AttributeError):
                problems.append(f"repairs: {name!r}: unreadable: left out")
                continue
            if st.phase == "running":  # the runner went with the last leader: run it again
                st.phase, st.attempt = "waiting-drain", max(0, st.attempt - 1)
                st.detail = "run again: the controller restarted while it ran"
            self.repairs[key] = st
        return problems

    # -- internals ---------------------------------------------------------------

    def _attempt_failed(self, key: DeviceKey, st: RepairState, now: float, detail: str) -> None:
        rule = self.policy.rule_named(st.rule)
        repair = rule.repair if rule is not None else None
        self.changed = True
        st.failed += 1
        st.since, st.detail = now, detail
        if repair is None:
            st.phase = "failed"
            return
        wait = repair.backoff_after(st.failed)
        if st.attempt < repair.attempts:
            st.phase, st.not_before = "waiting-drain", now + wait
            self._notices.append(
                Notice(
                    key, "repair-retry",
                    f"repair of {key} attempt {st.attempt} of {repair.attempts} failed: "
                    f"{detail}; next attempt in {duration_text(round(wait, 3))}",
                    st.rule, st.node,
                )
            )  # fmt: skip
            return
        st.phase = "failed"
        esc = self.escalation_of(rule)
        mark = None
        if esc.failed_repairs > 0:
            mark = self.escalation.repair_failed(key, esc, now, st.rule, st.node)
        limit = esc.failed_repairs
        self._notices.append(
            Notice(
                key, "repair-failed",
                f"repair of {key} failed after {st.attempt} attempt(s): {detail}"
                + (f" ({self.escalation.counts(key)[1]} of {limit} failed repairs)"
                   if limit else ""),
                st.rule, st.node,
            )
        )  # fmt: skip
        if mark is not None:
            self._needs_human(key, mark)
        elif self.escalation.needs_human(key) is None:
            # below the limit: a new repair, a fresh set of attempts, after the backoff
            st.phase, st.round, st.attempt, st.failed = "waiting-drain", st.round + 1, 0, 0
            st.not_before = now + wait

    def _needs_human(self, key: DeviceKey, mark: NeedsHuman) -> None:
        st = self.repairs.get(key)
        if st is not None and st.phase == "waiting-drain":
            st.phase, st.detail = "failed", f"not run: the device needs a human ({mark.why})"
            self.changed = True
        self._notices.append(
            Notice(
                key, "needs-human", f"{key} needs a human: {mark.why}; its taint stays until "
                f"an operator runs: drahealth clear {key}", mark.rule, mark.node,
            )
        )  # fmt: skip


# -- the environment a repair sees, and its Job ---------------------------------------


def _env_name(attribute: str) -> str:
    return "ATTR_" + _ENV_NAME.sub("_", attribute.rpartition("/")[2])


def repair_env(facts: DeviceFacts, rule: str) -> dict[str, str]:
    """``DRAHEALTH_<NAME>`` -> value for a device (names without the prefix in errors):
    DEVICE (``driver/pool/device``), NODE, DRIVER, POOL, DEVICE_NAME, RULE and
    ``ATTR_<attribute>`` (the attribute's name without its domain; other characters than
    letters, digits and ``_`` become ``_``). Values that are not safe to hand to a
    command are left out (a reference to one is then an error)."""
    key = f"{facts.driver}/{facts.pool}/{facts.device}"
    values: dict[str, str] = {
        "DEVICE": key, "NODE": facts.node, "DRIVER": facts.driver, "POOL": facts.pool,
        "DEVICE_NAME": facts.device, "RULE": rule,
    }  # fmt: skip
    for name, value in sorted(facts.attributes.items()):
        text = str(value).lower() if isinstance(value, bool) else str(value)
        values.setdefault(_env_name(name), text)
    return {f"DRAHEALTH_{k}": v for k, v in values.items() if _SAFE_VALUE.match(v)}


def substitute(text: str, env: Mapping[str, str], where: str) -> str:
    """Replace each ``$(DRAHEALTH_<NAME>)`` in ``text`` with ``env``'s value; a name
    without a (safe) value is a :class:`RepairError` naming ``where`` and the name."""

    def one(m: re.Match[str]) -> str:
        name = f"DRAHEALTH_{m.group(1)}"
        value = env.get(name)
        if value is None:
            raise RepairError(
                f"{where}: $({name}): the device has no value for it that is safe to use "
                "(a value must be made of letters, digits and . _ : / @ + -)"
            )
        return value

    return _REFERENCE.sub(one, text)


def _containers(template: Mapping[str, Any]) -> list[tuple[str, Any]]:
    pod = (template.get("template") or {}).get("spec") or {}
    out: list[tuple[str, Any]] = []
    for field_ in ("initContainers", "containers"):
        for i, c in enumerate(pod.get(field_) or []):
            out.append((f"template.spec.{field_}[{i}]", c))
    return out


def template_references(template: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field path, ``DRAHEALTH_`` name) of every reference in args and env values."""
    refs: list[tuple[str, str]] = []
    for path, c in _containers(template):
        for i, arg in enumerate(c.get("args") or []):
            refs += [(f"{path}.args[{i}]", m.group(1)) for m in _REFERENCE.finditer(str(arg))]
        for i, env in enumerate(c.get("env") or []):
            value = env.get("value") if isinstance(env, Mapping) else None
            if isinstance(value, str):
                refs += [(f"{path}.env[{i}].value", m.group(1)) for m in _REFERENCE.finditer(value)]
    return refs


def normalize_job_template(raw: Any) -> dict[str, Any]:
    """A Job (``kind: Job``), a Job spec (with ``template``), a pod template (with
    ``spec.containers``) or a pod spec (with ``containers``) -> a Job spec. Raises
    :class:`RepairError` naming what is wrong."""
    if not isinstance(raw, Mapping):
        raise RepairError(f"must be a mapping (a Job spec or a pod template), got {raw!r:.40}")
    spec: dict[str, Any]
    if raw.get("kind") == "Job":
        spec = copy.deepcopy(dict(raw.get("spec") or {}))
    elif "template" in raw:
        spec = copy.deepcopy(dict(raw))
    elif isinstance(raw.get("spec"), Mapping) and "containers" in raw["spec"]:
        spec = {"template": copy.deepcopy(dict(raw))}
    elif "containers" in raw:
        spec = {"template": {"spec": copy.deepcopy(dict(raw))}}
    else:
        raise RepairError("must be a Job spec (with template) or a pod template (with spec)")
    template = spec.get("template")
    pod = template.get("spec") if isinstance(template, Mapping) else None
    if not isinstance(pod, Mapping):
        raise RepairError("template.spec: must be a pod spec")
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        raise RepairError("template.spec.containers: must list at least one container")
    for path, c in _containers(spec):
        if not isinstance(c, Mapping) or not c.get("name") or not c.get("image"):
            raise RepairError(f"{path}: a container needs a name and an image")
        for f in ("args", "command"):
            if c.get(f) is not None and not (
                isinstance(c[f], list) and all(isinstance(a, str) for a in c[f])
            ):
                raise RepairError(f"{path}.{f}: must be a list of strings")
        env = c.get("env")
        if env is not None and not (
            isinstance(env, list) and all(isinstance(e, Mapping) and e.get("name") for e in env)
        ):
            raise RepairError(f"{path}.env: must be a list of {{name, value}}")
    restart = pod.get("restartPolicy", "Never")
    if restart not in ("Never", "OnFailure"):
        raise RepairError(
            f"template.spec.restartPolicy: {restart!r}: a Job's pods must be Never or OnFailure"
        )
    for path, name in template_references(spec):
        if name not in FIXED_NAMES and not name.startswith("ATTR_"):
            raise RepairError(
                f"{path}: $(DRAHEALTH_{name}) is not a known name: use "
                + ", ".join(f"DRAHEALTH_{n}" for n in FIXED_NAMES)
                + " or DRAHEALTH_ATTR_<attribute>"
            )
    return spec


@dataclass(frozen=True, slots=True)
class JobPlacement:
    """Where and as what a repair Job runs."""

    name: str
    namespace: str
    node: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    tolerate: Sequence[str] = ()  # taint keys the pod tolerates (drahealth's own)


def job_manifest(repair: Repair, env: Mapping[str, str], place: JobPlacement) -> dict[str, Any]:
    """The ``batch/v1`` Job of one attempt: the template's spec with the device's facts
    substituted (module docstring), on ``place.node`` (``nodeName``, so neither the
    scheduler nor a cordon keeps it off), tolerating drahealth's taints and
    ``unschedulable``, one pod (``backoffLimit: 0``; attempts are the controller's), at
    most ``repair.timeout`` long. :class:`RepairError` names a bad substitution."""
    assert repair.job is not None
    if not place.node:
        raise RepairError("the device's node is not known: a repair Job cannot be placed")
    spec = copy.deepcopy(dict(repair.job.template))
    template = spec.setdefault("template", {})
    meta = template.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **place.labels}
    meta["annotations"] = {**(meta.get("annotations") or {}), **place.annotations}
    pod = template["spec"]
    for path, c in _containers(spec):
        if c.get("args"):
            c["args"] = [substitute(a, env, f"{path}.args[{i}]") for i, a in enumerate(c["args"])]
        given = []
        for i, e in enumerate(c.get("env") or []):
            e = dict(e)
            if isinstance(e.get("value"), str):
                e["value"] = substitute(e["value"], env, f"{path}.env[{i}].value")
            given.append(e)
        names = {e["name"] for e in given}
        c["env"] = given + [
            {"name": k, "value": v} for k, v in sorted(env.items()) if k not in names
        ]
    pod["nodeName"] = place.node
    pod.setdefault("restartPolicy", "Never")
    tolerations = list(pod.get("tolerations") or [])
    for key in (*place.tolerate, "node.kubernetes.io/unschedulable"):
        tolerations.append({"key": key, "operator": "Exists"})
    pod["tolerations"] = tolerations
    spec["backoffLimit"] = 0
    spec["activeDeadlineSeconds"] = max(1, math.ceil(repair.timeout))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": place.name,
            "namespace": place.namespace,
            "labels": dict(place.labels),
            "annotations": dict(place.annotations),
        },
        "spec": spec,
    }


def explain_aftercare(policy: Policy, rule: Rule) -> dict[str, Any]:
    """The ``escalation`` (needs-a-human limits) and ``repair`` of ``rule`` as plain data,
    for ``drahealth policy check``."""
    esc = rule.escalation if rule.escalation is not None else policy.escalation
    repair = rule.repair
    out: dict[str, Any] = {
        "needsHuman": {
            "episodes": esc.episodes,
            "failedRepairs": esc.failed_repairs,
            "windowSeconds": esc.window,
        },
        "repair": None,
    }
    if repair is not None:
        out["repair"] = {
            "kind": repair.kind,
            "attempts": repair.attempts,
            "backoffSeconds": repair.backoff,
            "timeoutSeconds": repair.timeout,
        }
    return out
