"""Repair actions of tainted devices: the policy side and the Job a repair creates.

Owns the repair policy (:class:`Repair` with one of ``exec``, :class:`RepairWebhook` or
:class:`RepairJob`, ``attempts``, ``backoff``, ``timeout``), the Job manifest a ``job``
repair creates (:func:`job_manifest`, :func:`normalize_job_template`) and the
substitution of a device's facts into it (:func:`substitute`). The per-device phases and
the escalation live in :mod:`drahealth.core._aftercare` (what the remedy engine calls).
A repair's phases:

* ``waiting-drain``: it runs once no pod uses the device any more (the caller says
  which devices are drained) and its backoff time has come;
* ``running``: an attempt was handed to the runner, which answers with
  ``Aftercare.finished``;
* ``succeeded``: the engine's ``healthyFor`` + ``validate`` now decide the untaint (it is
  refused before that); a device that goes bad again while still tainted counts as a
  failed attempt of the repair;
* ``failed``: all ``attempts`` failed (the n-th failed attempt waits
  ``backoff * 2**(n-1)`` before the next). That is one failed repair for the
  escalation: at its ``failed_repairs`` limit the device needs a human, below it a new
  repair (a fresh set of attempts) follows after the backoff.

A device that needs a human gets no repair and no untaint until an operator clears it.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from drahealth.core._signals import PCI_ATTRIBUTES, normalize_pci_address

__all__ = [
    "EXEC_KILL_GRACE",
    "MAX_BACKOFF",
    "MAX_COMMAND_VALUE",
    "JobPlacement",
    "Repair",
    "RepairError",
    "RepairJob",
    "RepairWebhook",
    "command_value_problem",
    "job_manifest",
    "normalize_job_template",
    "substitute",
    "template_references",
]

#: The longest wait between two attempts, whatever the doubling says (seconds).
MAX_BACKOFF: Final = 3600.0
_REFERENCE = re.compile(r"\$\(DRAHEALTH_([A-Za-z0-9_]+)\)")
SAFE_VALUE = re.compile(r"[A-Za-z0-9._:/@+-]+")
#: Longest device value handed to a command (API attribute strings are at most 64).
MAX_COMMAND_VALUE: Final = 1024
#: Seconds past an exec repair's timeout its process group may still live (SIGTERM, then
#: SIGKILL after this grace), so the deadline recorded for an attempt includes it.
EXEC_KILL_GRACE: Final = 2.0
ENV_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
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

    def attempt_deadline(self, start: float) -> float:
        """When an attempt started at ``start`` has surely ended: its timeout, the kill
        grace of its process group and a second for the reaping."""
        return start + self.timeout + EXEC_KILL_GRACE + 1.0

    def backoff_after(self, failed: int) -> float:
        """The wait after the ``failed``-th failed attempt: doubling, at most an hour."""
        return float(min(MAX_BACKOFF, self.backoff * 2 ** max(0, failed - 1)))


# -- the environment a repair sees, and its Job ---------------------------------------


def command_value_problem(value: str, attribute: str = "") -> str:
    """Why a device's value may not be handed to a command, as an argument or in the
    environment ("" when it may): the one check of repairs (:func:`repair_env`) and exec
    probes. A value must be made of ``[A-Za-z0-9._:/@+-]`` (nothing a shell or a parser
    reads as syntax: no space, quote, ``$``, ``;``, line break or NUL, and no leading ``-``
    a command would read as an option), at most
    :data:`MAX_COMMAND_VALUE` characters; the value of a PCI address ``attribute``
    (``pciBusID``, ...) must be a PCI address."""
    if not value:
        return "it is empty"
    if len(value) > MAX_COMMAND_VALUE:
        return f"it is longer than {MAX_COMMAND_VALUE} characters"
    if not SAFE_VALUE.fullmatch(value):
        return "it may only hold letters, digits and . _ : / @ + -"
    if value.startswith("-"):
        return "it starts with '-' (a command would read it as an option)"
    name = attribute.rpartition("/")[2].lower()
    if name in PCI_ATTRIBUTES and normalize_pci_address(value) is None:
        return f"it is not a PCI address, as {attribute} must be"
    return ""


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
