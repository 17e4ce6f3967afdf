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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from drahealth.core import DeviceKey, RemediationState
from drahealth.remedy import consumers, device_taints, observations

__all__ = ["snapshot"]

JSON = dict[str, Any]


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
) -> JSON:
    """The page's state; ``now`` (unix time) decides which operator holds have expired."""
    state = remediation if remediation is not None else RemediationState()
    seen = observations(configmaps, pods, claims)
    for key, obs in list(seen.items()):
        if obs.since is not None and not math.isfinite(obs.since):
            if warn is not None:
                warn(f"device {key}: ignoring its health record's since={obs.since!r} (not finite)")
            seen[key] = replace(obs, since=None)
    taints = device_taints(rules, slices, node_objects or ())
    users = consumers(pods, claims)
    leaving = _leaving(pods, blocked_events or ())
    nodes: dict[str, list[JSON]] = {}
    known: set[DeviceKey] = set()
    for s in slices:
        spec = s.get("spec") or {}
        driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
        for d in spec.get("devices") or []:
            key = DeviceKey(driver, pool, d.get("name", ""))
            known.add(key)
            nodes.setdefault(spec.get("nodeName") or "(no node)", []).append(
                _device(key, seen, taints, users, leaving, state, now)
            )
    for key, obs in seen.items():  # reported by an agent but not (yet) in a slice
        if key not in known:
            nodes.setdefault(obs.node or "(no node)", []).append(
                _device(key, seen, taints, users, leaving, state, now)
            )
    return {
        "remediation": state.summary(),
        "nodes": [
            {
                "name": name,
                "devices": sorted(devs, key=lambda d: (d["driver"], d["pool"], d["device"])),
            }
            for name, devs in sorted(nodes.items())
        ],
    }


def _device(
    key: DeviceKey,
    seen: dict[DeviceKey, Any],
    taints: dict[DeviceKey, list[JSON]],
    users: Any,
    leaving: dict[tuple[str, str], str | None],
    state: RemediationState,
    now: float,
) -> JSON:
    obs = seen.get(key)
    pods = sorted(users.get(key, []))
    tainted = bool(taints.get(key))
    evicting, blocked = [], []
    for c in pods:
        name = f"{c.namespace}/{c.name}"
        why = leaving.get((c.namespace, c.name), "")
        if why is None:
            evicting.append(name)
        elif why and tainted:
            blocked.append({"pod": name, "message": why})
    return {
        "key": str(key),
        "driver": key.driver,
        "pool": key.pool,
        "device": key.device,
        "health": obs.health.value if obs else "Unknown",
        "message": obs.message if obs else "",
        "since": obs.since if obs else None,
        "taints": taints.get(key, []),
        "pods": [f"{c.namespace}/{c.name}" for c in pods],
        "evicting": evicting,
        "blocked": blocked,
        "remediation": state.device_state(str(key), now),
    }


def _leaving(pods: list[JSON], events: Any) -> dict[tuple[str, str], str | None]:
    """(namespace, name) -> None for a pod being evicted, or the newest refusal's message
    for a running pod whose eviction a PodDisruptionBudget blocked."""
    out: dict[tuple[str, str], str | None] = {}
    uids: dict[tuple[str, str], str] = {}
    for p in pods:
        meta = p.get("metadata") or {}
        ident = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        uids[ident] = str(meta.get("uid", ""))
        conditions = (p.get("status") or {}).get("conditions") or []
        if meta.get("deletionTimestamp") or any(
            isinstance(c, dict) and (c.get("type"), c.get("status")) == ("DisruptionTarget", "True")
            for c in conditions
        ):
            out[ident] = None
    newest: dict[tuple[str, str], tuple[str, str]] = {}
    for e in events:
        obj = e.get("involvedObject") or {}
        if e.get("reason") != "EvictionBlocked" or obj.get("kind") != "Pod":
            continue
        ident = (str(obj.get("namespace", "")), str(obj.get("name", "")))
        if ident not in uids or ident in out or (obj.get("uid") and obj["uid"] != uids[ident]):
            continue  # gone, being evicted, or an earlier pod of the same name
        when = str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "")
        if ident not in newest or when >= newest[ident][0]:
            newest[ident] = (when, str(e.get("message", "")))
    for ident, (_when, message) in newest.items():
        out[ident] = message or "eviction refused"
    return out
