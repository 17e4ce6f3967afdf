"""The dashboard's picture of the cluster: nodes x devices, built from API objects.

Owns :func:`snapshot`: every device of every ResourceSlice, grouped by node, with its
health and message (the agents' device-health records, then pod status), its taints
(DeviceTaintRules, slice taints, and the node taints or cordons of the controller's
node-level modes), the pods using it, which of them are being evicted (``evicting``: the
pod is terminating or carries the ``DisruptionTarget`` condition an eviction sets) and
which are blocked by a PodDisruptionBudget (``blocked``: the pod still runs, its device is
tainted, and an ``EvictionBlocked`` Event of the controller names it). Pure; the server calls it on
every change and pushes the result when it differs. The caller passes only the agents'
own records (the convention in :mod:`drahealth.core`). A record's ``since`` that is not a
finite number is shown as unknown (None) and reported through ``warn``, so the state is
always valid JSON.

The remediation controller's state (:class:`~drahealth.core.RemediationState`, from its
ConfigMap ``drahealth-remediation-state``) adds ``remediation`` twice: page-wide, the
circuit breaker, counts and notes (:meth:`~drahealth.core.RemediationState.summary`,
small whatever the fleet's size), and per device, that device's entries and markers
(``NEEDS-HUMAN``, ``PAUSED``, ``HELD``, ``REPAIRING``, ``REPAIR-FAILED``, ``DEGRADED``,
``BURN-IN``; ``{}`` when none applies). Devices the state names that no slice or record
knows are counted, not drawn.

Where the controller fences without DeviceTaintRules, a device that drahealth's node
taint or cordon covers (every device of that node), or that a quarantine claim in the
controller's namespace holds, carries ``fencedBy`` (the node or claim, its mode and the
bad devices it is for: :meth:`~drahealth.remedy.Fence.as_json`; absent otherwise), and
the page-wide ``pending`` lists the Pending pods those fences block (``pods``: at most
:data:`~drahealth.remedy.MAX_BLOCKED_PODS`, each with its ``message`` and ``blockedBy``;
``total``: how many). Without DeviceClasses to read, a pod that finds no free device is
counted against every quarantined device, whatever its driver.

:func:`fleet_state` builds the same from parts a long-running reader keeps up to date
(the core's :class:`~drahealth.core.ClusterModel` fed by watches, each record decoded
once, each slice's devices, each pod's eviction facts), so a change costs no rebuild of
the model; :func:`snapshot` builds those parts from lists and calls it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from drahealth.core import (
    ClusterModel,
    Consumer,
    DeviceKey,
    Observation,
    RemediationState,
    decode_devices,
)
from drahealth.remedy import (
    blocked_pods,
    device_taints,
    fenced_devices,
    read_fences,
    recorded_by,
)

__all__ = [
    "Context",
    "PodFacts",
    "device_entry",
    "finite",
    "fleet_context",
    "fleet_state",
    "health",
    "pod_facts",
    "slice_devices",
    "snapshot",
]

JSON = dict[str, Any]
#: (namespace, name) -> (uid, being evicted) of a pod.
PodFacts = dict[tuple[str, str], tuple[str, bool]]
#: The models' kinds, in the order :func:`snapshot` feeds them.
_KINDS = ("ResourceClaim", "Pod", "ResourceSlice", "DeviceTaintRule")


def snapshot(
    configmaps: list[JSON],
    pods: list[JSON],
    claims: list[JSON],
    slices: list[JSON],
    rules: list[JSON],
    warn: Callable[[str], None] | None = None,
    node_objects: list[JSON] | None = None,
    remediation: RemediationState | None = None,
    now: float = 0.0,
    blocked_events: list[JSON] | None = None,
    quarantine_namespace: str | None = None,
) -> JSON:
    """The page's state; ``now`` (unix time) decides which operator holds have expired;
    ``quarantine_namespace``: the controller's, where its quarantine claims are."""
    model = ClusterModel()
    for kind, objs in zip(_KINDS, (claims, pods, slices, rules), strict=True):
        for obj in objs:
            model.apply(kind, "ADDED", obj)
    facts: PodFacts = {}
    for pod in pods:
        ident, fact = pod_facts(pod)
        facts[ident] = fact
    return fleet_state(
        model,
        [d for s in slices for d in slice_devices(s)[1]],
        [decode_devices(cm) for cm in configmaps],
        facts,
        warn=warn,
        node_objects=node_objects,
        remediation=remediation,
        now=now,
        blocked_events=blocked_events,
        claim_objects=claims,
        quarantine_namespace=quarantine_namespace,
        pod_objects=pods,
    )


def slice_devices(s: Mapping[str, Any]) -> tuple[str, list[tuple[str, DeviceKey]]]:
    """A ResourceSlice's name and its devices, each with its node ("(no node)" if none)."""
    spec = s.get("spec") or {}
    driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
    node = spec.get("nodeName") or "(no node)"
    name = str((s.get("metadata") or {}).get("name", ""))
    return name, [
        (node, DeviceKey(driver, pool, d.get("name", ""))) for d in spec.get("devices") or []
    ]


def pod_facts(pod: Mapping[str, Any]) -> tuple[tuple[str, str], tuple[str, bool]]:
    """A pod's (namespace, name) and (uid, being evicted): it is terminating or carries the
    ``DisruptionTarget`` condition an eviction sets."""
    meta = pod.get("metadata") or {}
    ident = (str(meta.get("namespace", "")), str(meta.get("name", "")))
    conditions = (pod.get("status") or {}).get("conditions") or []
    leaving = bool(meta.get("deletionTimestamp")) or any(
        isinstance(c, dict) and (c.get("type"), c.get("status")) == ("DisruptionTarget", "True")
        for c in conditions
    )
    return ident, (str(meta.get("uid", "")), leaving)


@dataclass(frozen=True)
class Context:
    """What a device's entry needs besides its own health: every device's taints and
    pods, the pods leaving, the controller's state, the time. Built once per full pass
    (:func:`fleet_context`); a change of health alone reuses it (:func:`device_entry`)."""

    taints: dict[DeviceKey, list[JSON]]
    users: dict[DeviceKey, list[Consumer]]
    leaving: dict[tuple[str, str], str | None]
    state: RemediationState
    named: set[str]
    now: float
    #: each fenced device's ``fencedBy``
    fenced: dict[DeviceKey, JSON] = field(default_factory=dict)
    #: the page-wide ``pending``: the Pending pods drahealth's fences block
    pending: JSON = field(default_factory=lambda: {"pods": [], "total": 0})


def fleet_context(
    model: ClusterModel,
    pods: PodFacts,
    *,
    node_objects: list[JSON] | None = None,
    remediation: RemediationState | None = None,
    now: float = 0.0,
    blocked_events: list[JSON] | None = None,
    claim_objects: Iterable[JSON] = (),
    quarantine_namespace: str | None = None,
    pod_objects: Iterable[JSON] = (),
) -> Context:
    """The :class:`Context` of a model of claims, pods, slices and rules and the pods'
    :func:`pod_facts`; ``claim_objects`` in ``quarantine_namespace`` (the controller's)
    and ``node_objects`` say what drahealth fences, ``pod_objects`` (Pending ones are
    enough) which pods that blocks."""
    state = remediation if remediation is not None else RemediationState()
    taints = {key: [t.as_dict() for t in ts] for key, ts in model.all_taints().items()}
    for key, more in device_taints((), (), node_objects or ()).items():  # node-level modes
        taints.setdefault(key, []).extend(more)
    leaving = _leaving(pods, blocked_events or ())
    fenced, pending = _fences(model, node_objects or (), claim_objects, quarantine_namespace,
                              pod_objects)  # fmt: skip
    return Context(
        taints, model.all_consumers(), leaving, state, state.devices(), now, fenced, pending
    )


def _fences(
    model: ClusterModel,
    nodes: Iterable[JSON],
    claims: Iterable[JSON],
    namespace: str | None,
    pods: Iterable[JSON],
) -> tuple[dict[DeviceKey, JSON], JSON]:
    """Each fenced device's ``fencedBy`` (one JSON object per fence, shared), and the
    page's ``pending``."""
    fences = read_fences(nodes, claims, namespace)
    if not fences:
        return {}, {"pods": [], "total": 0}
    on_node: dict[str, list[DeviceKey]] = {}
    if fences.nodes:
        for key, facts in model.all_facts().items():
            if facts.node in fences.nodes:
                on_node.setdefault(facts.node, []).append(key)
    shown: dict[Any, JSON] = {}
    fenced = {
        key: shown[fence] if fence in shown else shown.setdefault(fence, fence.as_json())
        for key, fence in fenced_devices(fences, on_node).items()
    }
    found, total = blocked_pods(pods, fences)
    return fenced, {"pods": [b.as_json() for b in found], "total": total}


def health(
    model: ClusterModel,
    records: Iterable[Mapping[DeviceKey, Observation]],
    warn: Callable[[str], None] | None = None,
) -> dict[DeviceKey, Observation]:
    """Each device's health: pods' statuses (the model), then the agents' records (later
    ones win); a ``since`` that is not finite is dropped (None) with a warning."""
    seen = model.observations()
    for record in records:
        seen.update(record)
    for key, obs in list(seen.items()):
        seen[key] = finite(key, obs, warn)
    return seen


def finite(key: DeviceKey, obs: Observation, warn: Callable[[str], None] | None) -> Observation:
    """``obs``, without a ``since`` that is not finite (said through ``warn``)."""
    if obs.since is None or math.isfinite(obs.since):
        return obs
    if warn is not None:
        warn(f"device {key}: ignoring its health record's since={obs.since!r} (not finite)")
    return replace(obs, since=None)


def fleet_state(
    model: ClusterModel,
    devices: Iterable[tuple[str, DeviceKey]],
    records: Iterable[Mapping[DeviceKey, Observation]],
    pods: PodFacts,
    *,
    warn: Callable[[str], None] | None = None,
    node_objects: list[JSON] | None = None,
    remediation: RemediationState | None = None,
    now: float = 0.0,
    blocked_events: list[JSON] | None = None,
    claim_objects: Iterable[JSON] = (),
    quarantine_namespace: str | None = None,
    pod_objects: Iterable[JSON] = (),
) -> JSON:
    """The page's state from a model of claims, pods, slices and rules, the slices'
    ``(node, device)`` pairs, the agents' decoded records (later ones win) and the pods'
    :func:`pod_facts` (fences: see :func:`fleet_context`)."""
    ctx = fleet_context(
        model, pods, node_objects=node_objects, remediation=remediation, now=now,
        blocked_events=blocked_events, claim_objects=claim_objects,
        quarantine_namespace=quarantine_namespace, pod_objects=pod_objects,
    )  # fmt: skip
    seen = health(model, records, warn)
    nodes: dict[str, list[JSON]] = {}
    known: set[DeviceKey] = set()
    for node, key in devices:
        known.add(key)
        nodes.setdefault(node, []).append(device_entry(key, seen.get(key), ctx))
    for key, obs in seen.items():  # reported by an agent but not (yet) in a slice
        if key not in known:
            nodes.setdefault(obs.node or "(no node)", []).append(device_entry(key, obs, ctx))
    return {
        "remediation": ctx.state.summary(),
        "pending": ctx.pending,
        "nodes": [
            {
                "name": name,
                "devices": sorted(devs, key=lambda d: (d["driver"], d["pool"], d["device"])),
            }
            for name, devs in sorted(nodes.items())
        ],
    }


def device_entry(key: DeviceKey, obs: Observation | None, ctx: Context) -> JSON:
    """One device as the page shows it."""
    pods: Any = ctx.users.get(key, ())
    pods = sorted(pods) if len(pods) > 1 else pods
    mine = ctx.taints.get(key, [])
    evicting, blocked, names = [], [], []
    for c in pods:
        name = f"{c.namespace}/{c.name}"
        names.append(name)
        why = ctx.leaving.get((c.namespace, c.name), "")
        if why is None:
            evicting.append(name)
        elif why and mine:
            blocked.append({"pod": name, "message": why})
    text = str(key)
    fenced = ctx.fenced.get(key)
    out: JSON = {
        "key": text,
        "driver": key.driver,
        "pool": key.pool,
        "device": key.device,
        "health": obs.health.value if obs else "Unknown",
        "message": obs.message if obs else "",
        "since": obs.since if obs else None,
        "taints": mine,
        "pods": names,
        "evicting": evicting,
        "blocked": blocked,
        "remediation": ctx.state.device_state(text, ctx.now) if text in ctx.named else {},
    }
    if fenced is not None:
        out["fencedBy"] = fenced
    return out


def _leaving(pods: PodFacts, events: Iterable[JSON]) -> dict[tuple[str, str], str | None]:
    """(namespace, name) -> None for a pod being evicted, or the newest refusal's message
    for a running pod whose eviction a PodDisruptionBudget blocked."""
    out: dict[tuple[str, str], str | None] = {
        ident: None for ident, (_uid, leaving) in pods.items() if leaving
    }
    uids = {ident: uid for ident, (uid, _leaving) in pods.items()}
    newest: dict[tuple[str, str], tuple[str, str]] = {}
    for e in events:
        obj = e.get("involvedObject") or {}
        if e.get("reason") != "EvictionBlocked" or obj.get("kind") != "Pod":
            continue
        if recorded_by(e, None) != "controller":
            continue  # not the controller's (a tenant's Event about some pod)
        ident = (str(obj.get("namespace", "")), str(obj.get("name", "")))
        if ident not in uids or ident in out or (obj.get("uid") and obj["uid"] != uids[ident]):
            continue  # gone, being evicted, or an earlier pod of the same name
        when = str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "")
        if ident not in newest or when >= newest[ident][0]:
            newest[ident] = (when, str(e.get("message", "")))
    for ident, (_when, message) in newest.items():
        out[ident] = message or "eviction refused"
    return out
