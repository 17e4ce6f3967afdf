"""What the API objects say about devices, for the readers that list them.

Owns the whole-cluster functions over API objects (as dicts) that ``drahealth status``
and the dashboard call, each answered by the core's :class:`ClusterModel` built from
the objects given (the remediation controller keeps one model up to date instead):

* :func:`observations`: each device's health, from the node agents' device-health
  records and from pods' ``allocatedResourcesStatus``; the record wins where both
  speak, pods' entries are merged worst-first;
* :func:`device_facts`: driver, pool, device, node and attributes from ResourceSlices;
* :func:`consumers`: the live pods whose allocated claims hold a device;
* :func:`device_taints`: the taints on each device, from DeviceTaintRules (rules that
  select many devices included, as the allocator reads them) and from ResourceSlices,
  with where each comes from, plus the node taint or cordon the controller wrote for a
  device in its node-level modes;
* :func:`read_fences` and :func:`fenced_devices`: what keeps new pods off a device
  although nothing taints the device itself: drahealth's node taint or cordon on its
  node (``node-taint``, ``cordon``: ONE bad device fences EVERY device of the node) or a
  quarantine claim holding it (``quarantine``: the device alone). A node counts only
  where drahealth wrote it: a taint whose key and effect its ``drahealth.io/node-taints``
  annotation lists and the node carries, a cordon with ``drahealth.io/cordoned`` on an
  unschedulable node; a claim only in the controller's namespace, with the label and
  annotation :func:`~drahealth.remedy._quarantine.read_claim` checks, while it holds
  the allocation;
* :func:`blocked_pods`: the Pending pods those fences keep from scheduling, from their
  ``PodScheduled=False``/``Unschedulable`` message: an untolerated taint that is one of
  drahealth's node taints (key and value, as the scheduler writes ``{key: value}``),
  ``node(s) were unschedulable`` while drahealth cordons a node, or ``cannot allocate
  all claims`` while quarantine claims hold devices of the drivers the pod asks for
  (every driver where that cannot be told). At most ``limit`` listed; the total is
  counted.

Every reader here takes API objects as found: a field of the wrong type or an
annotation that is not the JSON drahealth writes adds nothing and raises nothing.

How a pod status entry is resolved to a device is the model's rule (see
:mod:`drahealth.core._cluster`).
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from drahealth.core import (
    ClusterModel,
    Consumer,
    DeviceFacts,
    DeviceKey,
    Observation,
    decode_devices,
    pod_claim_names,
)
from drahealth.remedy._nodes import (
    ANNOTATION_CORDONED,
    ANNOTATION_TAINTS,
    NodeDevice,
    node_taints,
    read_node,
)
from drahealth.remedy._quarantine import read_claim

__all__ = [
    "CORDONED_WORDS",
    "MAX_BLOCKED_PODS",
    "NO_DEVICE_WORDS",
    "TAINT_WORDS",
    "Blocked",
    "Consumer",
    "Fence",
    "Fences",
    "Observation",
    "blocked_pods",
    "claims_by_name",
    "class_drivers",
    "consumers",
    "device_facts",
    "device_taints",
    "fence_text",
    "fenced_devices",
    "observations",
    "pod_claim_names",
    "pod_observations",
    "read_fences",
    "unschedulable",
]

JSON = dict[str, Any]
#: The taint Kubernetes puts on a cordoned node (what a cordon means to the scheduler).
CORDON_TAINT: Final = "node.kubernetes.io/unschedulable"
#: Pending pods a view lists as blocked by drahealth's fences (the rest are counted).
MAX_BLOCKED_PODS: Final = 50
#: Bad devices a fence's JSON names (``forCount`` says how many there are).
MAX_FOR: Final = 16
#: Bad devices a fence's text names before "+N more".
MAX_FOR_TEXT: Final = 2
#: Characters of a scheduler message that are searched and kept.
MAX_MESSAGE: Final = 4096
#: The scheduler's words for a cordoned node, for a taint and for no device left.
CORDONED_WORDS: Final = "node(s) were unschedulable"
TAINT_WORDS: Final = "untolerated taint"
NO_DEVICE_WORDS: Final = "cannot allocate all claims"
_DRIVER_IN_CEL = re.compile(
    r"""device\.driver\s*==\s*(?:"([^"]*)"|'([^']*)')|(?:"([^"]*)"|'([^']*)')\s*==\s*device\.driver"""
)


def _model(**objects: Iterable[JSON]) -> ClusterModel:
    model = ClusterModel()
    for kind, objs in objects.items():
        for obj in objs:
            model.apply(kind, "ADDED", obj)
    return model


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


def observations(
    configmaps: Iterable[JSON], pods: Iterable[JSON], claims: Iterable[JSON]
) -> dict[DeviceKey, Observation]:
    """Per device; ``configmaps`` are agents' records (already filtered), later ones win."""
    out = _model(ResourceClaim=claims, Pod=pods).observations()
    for cm in configmaps:
        out.update(decode_devices(cm))
    return out


def claims_by_name(claims: Iterable[JSON]) -> dict[tuple[str, str], JSON]:
    return {(str(_meta(c).get("namespace")), str(_meta(c).get("name"))): c for c in claims}


def pod_observations(
    pod: JSON, claims: Mapping[tuple[str, str], JSON]
) -> Iterable[tuple[DeviceKey, Observation]]:
    """The devices ``pod``'s status reports on (the worst entry per device)."""
    meta = _meta(pod)
    namespace = str(meta.get("namespace") or "default")
    named = [
        claims[(namespace, n)] for n in pod_claim_names(pod).values() if (namespace, n) in claims
    ]
    model = _model(ResourceClaim=named, Pod=[pod])
    key_ns = str(meta.get("namespace") or "")
    return model.pod_observations(key_ns, str(meta.get("name") or "")).items()


def device_facts(slices: Iterable[JSON]) -> dict[DeviceKey, DeviceFacts]:
    return _model(ResourceSlice=slices).all_facts()


def consumers(pods: Iterable[JSON], claims: Iterable[JSON]) -> dict[DeviceKey, list[Consumer]]:
    """Live pods (not ended, not being deleted) per allocated device."""
    return _model(ResourceClaim=claims, Pod=pods).all_consumers()


def _node_devices(node: Mapping[str, Any]) -> list[NodeDevice]:
    """:func:`read_node`, or nothing for a node whose annotations cannot be read."""
    try:
        return read_node(node)
    except (TypeError, ValueError, RecursionError, AttributeError):
        return []


def device_taints(
    rules: Iterable[JSON], slices: Iterable[JSON], nodes: Iterable[JSON] = ()
) -> dict[DeviceKey, list[JSON]]:
    """Taints per device: from DeviceTaintRules and slices, and, where the controller ran
    a node-level mode (no DeviceTaintRule API), the node taint or cordon it wrote for the
    device (source ``node/<name>``; the controller's node annotation says which devices)."""
    model = _model(DeviceTaintRule=rules, ResourceSlice=slices)
    out = {key: [t.as_dict() for t in taints] for key, taints in model.all_taints().items()}
    for node in nodes:
        name = str(_meta(node).get("name") or "")
        listed = _node_devices(node)
        written = node_taints(d for d in listed if d.mode == "node-taint")
        for d in listed:
            since = (
                datetime.datetime.fromtimestamp(d.since, datetime.UTC).isoformat()
                if d.since
                else ""
            )
            if d.mode == "node-taint":
                taint = {"key": d.key, "value": written.get(d.key, ""), "effect": "NoSchedule"}
            else:
                taint = {"key": CORDON_TAINT, "value": "", "effect": "NoSchedule"}
            out.setdefault(d.device, []).append(
                {"source": f"node/{name} ({d.mode})", **taint, "since": since}
            )
    return out


# --------------------------------------------------------------------------- fences


@dataclass(frozen=True, slots=True)
class Fence:
    """One thing drahealth wrote that keeps new pods off devices (see the module
    docstring): a Node (its taint or cordon: every device of the node) or a quarantine
    ResourceClaim (the one device it holds)."""

    kind: str  # "Node" or "ResourceClaim"
    name: str  # the node's name, or the claim's
    mode: str  # node-taint, cordon or quarantine
    #: the bad devices it is written for
    devices: tuple[DeviceKey, ...] = ()
    namespace: str = ""  # a claim's
    #: node-taint: (key, value, effect) of each node taint drahealth wrote and the node has
    taints: tuple[tuple[str, str, str], ...] = ()
    by: str = ""  # a claim's writer: controller or operator

    def as_json(self) -> JSON:
        """The ``fencedBy`` field of the views (``for``: at most :data:`MAX_FOR` devices,
        ``forCount``: how many)."""
        out: JSON = {"kind": self.kind, "name": self.name, "mode": self.mode}
        if self.namespace:
            out["namespace"] = self.namespace
        out["for"] = [str(d) for d in self.devices[:MAX_FOR]]
        out["forCount"] = len(self.devices)
        if self.taints:
            out["taints"] = [{"key": k, "value": v, "effect": e} for k, v, e in self.taints]
        if self.by:
            out["by"] = self.by
        return out

    def text(self) -> str:
        return fence_text(self.as_json())


def fence_text(fence: Mapping[str, Any]) -> str:
    """A ``fencedBy`` object in words: ``node/<name> (node-taint for <device>)`` or
    ``claim <namespace>/<name> (quarantine)``."""
    mode = str(fence.get("mode") or "")
    if fence.get("kind") == "ResourceClaim":
        by = " by an operator" if fence.get("by") == "operator" else ""
        return f"claim {fence.get('namespace', '')}/{fence.get('name', '')} ({mode}{by})"
    names = [str(d) for d in fence.get("for") or []]
    count = fence.get("forCount")
    total = count if isinstance(count, int) and count >= len(names) else len(names)
    shown = ", ".join(names[:MAX_FOR_TEXT])
    more = f" +{total - min(len(names), MAX_FOR_TEXT)} more" if total > MAX_FOR_TEXT else ""
    why = f" for {shown}{more}" if shown else ""
    return f"node/{fence.get('name', '')} ({mode}{why})"


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    found = _meta(obj).get("annotations")
    if not isinstance(found, Mapping):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}


def _written_taints(annotations: Mapping[str, str]) -> set[tuple[str, str]]:
    """(key, effect) of the node taints drahealth says it wrote."""
    try:
        pairs = json.loads(annotations.get(ANNOTATION_TAINTS, "[]"))
    except (ValueError, RecursionError):
        return set()
    return {
        (p[0], p[1])
        for p in (pairs if isinstance(pairs, list) else [])
        if isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
    }


def node_fences(node: Mapping[str, Any]) -> list[Fence]:
    """drahealth's node taint and cordon on ``node`` as it is now (none where the node
    carries neither, or carries a taint with drahealth's key that drahealth did not
    write)."""
    name = str(_meta(node).get("name") or "")
    spec = node.get("spec") if isinstance(node, Mapping) else None
    spec = spec if isinstance(spec, Mapping) else {}
    if not name:
        return []
    annotations = _annotations(node)
    out: list[Fence] = []
    listed = _node_devices({"metadata": {"annotations": annotations}})
    ours = _written_taints(annotations)
    raw = spec.get("taints")
    present = [
        (str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in (raw if isinstance(raw, list) else [])
        if isinstance(t, Mapping)
    ]
    taints = tuple(
        sorted({t for t in present if (t[0], t[2]) in ours and t[2] in ("NoSchedule", "NoExecute")})
    )
    if taints:
        keys = {t[0] for t in taints}
        bad = sorted(
            {d.device for d in listed if d.mode == "node-taint" and d.key in keys}, key=str
        )
        out.append(Fence("Node", name, "node-taint", tuple(bad), taints=taints))
    if ANNOTATION_CORDONED in annotations and spec.get("unschedulable") is True:
        bad = sorted({d.device for d in listed if d.mode == "cordon"}, key=str)
        out.append(Fence("Node", name, "cordon", tuple(bad)))
    return out


def claim_fence(claim: Mapping[str, Any], namespace: str) -> Fence | None:
    """The quarantine ``claim`` (the controller's or an operator's) in ``namespace`` that
    holds its device now, as a fence; None for any other claim."""
    meta = _meta(claim)
    if meta.get("namespace") != namespace:
        return None
    for by, operator in (("controller", False), ("operator", True)):
        try:
            read = read_claim(claim, operator=operator)
        except (TypeError, ValueError, AttributeError, RecursionError):
            read = None
        if read is None:
            continue
        device, held = read
        if not held:
            return None  # written, not (or no longer) allocated: it fences nothing
        name = str(meta.get("name") or "")
        return Fence("ResourceClaim", name, "quarantine", (device.device,), namespace, by=by)
    return None


@dataclass
class Fences:
    """Every fence drahealth keeps: node fences by node name, claim fences by device."""

    nodes: dict[str, list[Fence]] = field(default_factory=dict)
    claims: dict[DeviceKey, Fence] = field(default_factory=dict)
    _by_driver: dict[str, list[Fence]] | None = field(default=None, repr=False, compare=False)

    def __bool__(self) -> bool:
        return bool(self.nodes or self.claims)

    def node_list(self) -> list[Fence]:
        return [f for name in sorted(self.nodes) for f in self.nodes[name]]

    def claims_by_driver(self) -> dict[str, list[Fence]]:
        """The claim fences grouped by their device's driver, each sorted (computed once:
        a view asks it for every Pending pod)."""
        if self._by_driver is None:
            grouped: dict[str, list[Fence]] = {}
            for key, f in sorted(self.claims.items(), key=lambda kv: str(kv[0])):
                grouped.setdefault(key.driver, []).append(f)
            self._by_driver = grouped
        return self._by_driver


def read_fences(
    nodes: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]] = (),
    namespace: str | None = None,
) -> Fences:
    """drahealth's fences in ``nodes`` and, where ``namespace`` (the controller's) is
    given, in the quarantine claims among ``claims``."""
    out = Fences()
    for node in nodes:
        found = node_fences(node)
        if found:
            out.nodes[found[0].name] = found
    if namespace is not None:
        for claim in claims:
            fence = claim_fence(claim, namespace)
            if fence is not None:
                out.claims.setdefault(fence.devices[0], fence)
    return out


def fenced_devices(
    fences: Fences, node_devices: Mapping[str, Iterable[DeviceKey]]
) -> dict[DeviceKey, Fence]:
    """The fence of each device: its quarantine claim, else its node's fence (every
    device ``node_devices`` places on the node, and the bad devices the fence names)."""
    out = dict(fences.claims)
    for name, found in fences.nodes.items():
        fence = found[0]
        for key in (*node_devices.get(name, ()), *(d for f in found for d in f.devices)):
            out.setdefault(key, fence)
    return out


# --------------------------------------------------------------------------- blocked pods


@dataclass(frozen=True, slots=True)
class Blocked:
    """A Pending pod that drahealth's fences keep from scheduling."""

    namespace: str
    pod: str
    #: ``Pending: blocked by node/<name> taint <key>`` / ``Pending: no free device (N
    #: quarantined)``, ``; ``-joined where several apply
    message: str
    #: the fences, each {kind, name (or count), mode, ...}
    by: tuple[JSON, ...]
    #: the scheduler's own message (cut to :data:`MAX_MESSAGE` characters)
    scheduler: str

    def as_json(self) -> JSON:
        return {
            "namespace": self.namespace,
            "pod": self.pod,
            "message": self.message,
            "blockedBy": list(self.by),
            "scheduler": self.scheduler,
        }


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message of a Pending, unbound pod whose ``PodScheduled`` condition
    is False for reason ``Unschedulable``; None for any other pod."""
    if not isinstance(pod, Mapping):
        return None
    meta, spec, status = (pod.get(k) for k in ("metadata", "spec", "status"))
    if not isinstance(status, Mapping) or (
        isinstance(meta, Mapping) and meta.get("deletionTimestamp")
    ):
        return None
    if isinstance(spec, Mapping) and spec.get("nodeName"):
        return None
    if status.get("phase") not in (None, "", "Pending"):
        return None
    conditions = status.get("conditions")
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, Mapping) and c.get("type") == "PodScheduled":
            if c.get("status") == "False" and c.get("reason") == "Unschedulable":
                return str(c.get("message") or "")[:MAX_MESSAGE]
            return None
    return None


def class_drivers(classes: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """DeviceClass name -> the drivers its CEL selectors require (``device.driver ==
    "..."``); classes that name none are left out (any driver)."""
    out: dict[str, set[str]] = {}
    for cls in classes:
        meta = _meta(cls)
        spec = cls.get("spec") if isinstance(cls, Mapping) else None
        selectors = spec.get("selectors") if isinstance(spec, Mapping) else None
        drivers: set[str] = set()
        for sel in selectors if isinstance(selectors, list) else []:
            cel = sel.get("cel") if isinstance(sel, Mapping) else None
            expr = cel.get("expression") if isinstance(cel, Mapping) else None
            if isinstance(expr, str):
                for m in _DRIVER_IN_CEL.finditer(expr[:MAX_MESSAGE]):
                    drivers.add(next(g for g in m.groups() if g is not None))
        if drivers and isinstance(meta.get("name"), str):
            out[meta["name"]] = drivers
    return out


def _request_classes(claim: Mapping[str, Any]) -> list[str] | None:
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    out: list[str] = []
    for r in requests if isinstance(requests, list) else []:
        if not isinstance(r, Mapping):
            return None
        choices = [r.get("exactly"), *(r.get("firstAvailable") or [])]
        if r.get("deviceClassName"):  # the v1beta1 shape
            choices.append(r)
        names = [c.get("deviceClassName") for c in choices if isinstance(c, Mapping)]
        if not names or not all(isinstance(n, str) and n for n in names):
            return None
        out += [str(n) for n in names]
    return out or None


def pod_drivers(
    pod: Mapping[str, Any],
    claims: Mapping[tuple[str, str], Mapping[str, Any]],
    drivers_of_class: Mapping[str, set[str]],
) -> set[str] | None:
    """The drivers ``pod``'s claims ask for, through their DeviceClasses; None when
    that cannot be told (a claim not there yet, a class that names no driver)."""
    meta = _meta(pod)
    namespace = str(meta.get("namespace") or "default")
    spec = pod.get("spec")
    refs = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    names = pod_claim_names(pod)
    if not names or (isinstance(refs, list) and len(names) < len(refs)):
        return None
    drivers: set[str] = set()
    for name in names.values():
        claim = claims.get((namespace, name))
        classes = _request_classes(claim) if claim is not None else None
        if classes is None:
            return None
        for cls in classes:
            found = drivers_of_class.get(cls)
            if not found:
                return None
            drivers |= found
    return drivers


def _cut(items: list[str], limit: int = 3) -> str:
    more = f" +{len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _blocked(
    message: str, fences: Fences, drivers: Callable[[], set[str] | None]
) -> tuple[list[str], list[JSON]]:
    words: list[str] = []
    by: list[JSON] = []
    if TAINT_WORDS in message:
        # the scheduler names key and value: someone else's taint with drahealth's key
        # (another value) is not drahealth's doing
        taints = [(f, t) for f in fences.node_list() for t in f.taints]
        hits = [(f, t) for f, t in taints if f"{{{t[0]}: {t[1]}}}" in message]
        for f, (key, value, effect) in hits:
            taint = {"key": key, "value": value, "effect": effect}
            by.append({"kind": "Node", "name": f.name, "mode": f.mode, "taint": taint})
        if hits:
            words.append("blocked by " + _cut([f"node/{f.name} taint {t[0]}" for f, t in hits]))
    if CORDONED_WORDS in message:
        cordoned = [f for f in fences.node_list() if f.mode == "cordon"]
        by += [{"kind": "Node", "name": f.name, "mode": f.mode} for f in cordoned]
        if cordoned:
            words.append("blocked by " + _cut([f"node/{f.name} cordon" for f in cordoned]))
    if NO_DEVICE_WORDS in message and fences.claims:
        wanted = drivers()
        grouped = fences.claims_by_driver()
        held = [
            f for driver in sorted(grouped) if wanted is None or driver in wanted
            for f in grouped[driver]
        ]  # fmt: skip
        if held:
            words.append(f"no free device ({len(held)} quarantined)")
            by.append({"kind": "ResourceClaim", "mode": "quarantine", "count": len(held),
                       "claims": [f"{f.namespace}/{f.name}" for f in held[:MAX_FOR]]})  # fmt: skip
    return words, by


def blocked_pods(
    pods: Iterable[Mapping[str, Any]],
    fences: Fences,
    *,
    claims: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
    drivers_of_class: Mapping[str, set[str]] | Callable[[], Mapping[str, set[str]]] = {},  # noqa: B006
    limit: int = MAX_BLOCKED_PODS,
) -> tuple[list[Blocked], int]:
    """(the first ``limit`` Pending pods ``fences`` block, by namespace and name; how many
    there are in all). ``claims`` (by namespace and name) and ``drivers_of_class`` (see
    :func:`class_drivers`; a function is called once, when first needed) tell which
    drivers a pod asks for; without them every quarantined device counts."""
    if not fences:
        return [], 0
    found: list[Blocked] = []
    total = 0
    classes: list[Mapping[str, set[str]]] = []

    def known_classes() -> Mapping[str, set[str]]:
        if not classes:
            classes.append(drivers_of_class() if callable(drivers_of_class) else drivers_of_class)
        return classes[0]

    for pod in pods:
        message = unschedulable(pod)
        if message is None:
            continue

        def drivers(pod: Mapping[str, Any] = pod) -> set[str] | None:
            return None if claims is None else pod_drivers(pod, claims, known_classes())

        words, by = _blocked(message, fences, drivers)
        if not words:
            continue
        total += 1
        meta = _meta(pod)
        found.append(
            Blocked(
                str(meta.get("namespace") or "default"),
                str(meta.get("name") or ""),
                "Pending: " + "; ".join(words),
                tuple(by),
                message,
            )
        )
        if len(found) > limit:
            found.sort(key=lambda b: (b.namespace, b.pod))
            del found[limit:]
    found.sort(key=lambda b: (b.namespace, b.pod))
    return found[:limit], total
