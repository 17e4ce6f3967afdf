"""The dashboard's picture of the cluster: nodes x devices, built from API objects.

Owns :func:`snapshot`: every device of every ResourceSlice, grouped by node, with its
health and message (the agents' device-health records, then pod status), its taints
(DeviceTaintRules, slice taints, and the node taints or cordons of the controller's
node-level modes) and the pods using it. Pure; the server calls it on
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
    nodes: dict[str, list[JSON]] = {}
    known: set[DeviceKey] = set()
    for s in slices:
        spec = s.get("spec") or {}
        driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
        for d in spec.get("devices") or []:
            key = DeviceKey(driver, pool, d.get("name", ""))
            known.add(key)
            nodes.setdefault(spec.get("nodeName") or "(no node)", []).append(
                _device(key, seen, taints, users, state, now)
            )
    for key, obs in seen.items():  # reported by an agent but not (yet) in a slice
        if key not in known:
            nodes.setdefault(obs.node or "(no node)", []).append(
                _device(key, seen, taints, users, state, now)
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
    state: RemediationState,
    now: float,
) -> JSON:
    obs = seen.get(key)
    return {
        "key": str(key),
        "driver": key.driver,
        "pool": key.pool,
        "device": key.device,
        "health": obs.health.value if obs else "Unknown",
        "message": obs.message if obs else "",
        "since": obs.since if obs else None,
        "taints": taints.get(key, []),
        "pods": [f"{c.namespace}/{c.name}" for c in sorted(users.get(key, []))],
        "remediation": state.device_state(str(key), now),
    }
