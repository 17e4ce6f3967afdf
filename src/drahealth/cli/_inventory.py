"""The rows behind ``drahealth status`` and ``drahealth pods``: pure functions over API objects.

Owns :func:`device_rows` (every device that is not Healthy or carries a taint, with its
node, health, message, since when, taints and the pods using it; the views spell the
times) and :func:`pod_rows` (per pod, its devices and their health). Inputs are API
objects as dicts: the agents' device-health ConfigMaps, pods, ResourceClaims,
ResourceSlices and DeviceTaintRules.

A record's ``since`` that is not a finite number (``1e999`` parses as infinity) is
dropped from that row (shown as unknown) and reported through ``warn``; the row stays.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from drahealth.core import DeviceKey, claim_observations, pod_claim_names
from drahealth.remedy import (
    claims_by_name,
    consumers,
    device_taints,
    observations,
    pod_observations,
)

__all__ = ["device_rows", "finite_since", "pod_rows"]

JSON = dict[str, Any]
Warn = Callable[[str], None]


def finite_since(since: float | None, device: str, warn: Warn | None) -> float | None:
    """``since`` if it is a finite number; otherwise None, and ``warn`` says so."""
    if since is None or math.isfinite(since):
        return since
    if warn is not None:
        warn(f"device {device}: ignoring its health record's since={since!r} (not finite)")
    return None


def device_rows(
    configmaps: list[JSON],
    pods: list[JSON],
    claims: list[JSON],
    slices: list[JSON],
    rules: list[JSON],
    now: float,
    warn: Warn | None = None,
    node_objects: list[JSON] | None = None,
    also: Iterable[str] = (),
) -> list[JSON]:
    """Devices that are not Healthy or are tainted, sorted by node and device.

    ``node_objects``: where the controller ran a node-level mode, the node taint or cordon it
    wrote for a device is listed with the device's taints. ``also``: devices
    (``DRIVER/POOL/DEVICE``) listed even when Healthy and untainted (those the
    remediation controller holds state for), where a health source reports them."""
    seen = observations(configmaps, pods, claims)
    taints = device_taints(rules, slices, node_objects or ())
    users = consumers(pods, claims)
    nodes = {
        DeviceKey(
            (s.get("spec") or {}).get("driver", ""),
            ((s.get("spec") or {}).get("pool") or {}).get("name", ""),
            d.get("name", ""),
        ): (s.get("spec") or {}).get("nodeName", "")
        for s in slices
        for d in (s.get("spec") or {}).get("devices") or []
    }
    wanted = set()
    for text in also:
        try:
            wanted.add(DeviceKey.parse(text))
        except ValueError:
            continue
    wanted &= set(seen)  # devices of this cluster whose health is known
    rows = []
    for key in sorted(set(seen) | set(taints) | wanted):
        obs = seen.get(key)
        health = obs.health.value if obs else "Unknown"
        if health == "Healthy" and key not in taints and key not in wanted:
            continue
        since = finite_since(obs.since, str(key), warn) if obs else None
        rows.append(
            {
                "node": (obs.node if obs and obs.node else "") or nodes.get(key, ""),
                "device": str(key),
                "health": health,
                "message": obs.message if obs else "",
                "since": since,
                "source": obs.source if obs else "",
                "taints": list(taints.get(key, [])),
                "consumers": [
                    {"namespace": c.namespace, "pod": c.name, "node": c.node, "claim": c.claim}
                    for c in sorted(users.get(key, []))
                ],
            }
        )
    return sorted(rows, key=lambda r: (r["node"], r["device"]))


def pod_rows(pods: list[JSON], claims: list[JSON]) -> list[JSON]:
    """One row per (pod, device): the claim, the device and its health in the pod status,
    else in the claim's ``DeviceHealthy`` condition (``source`` says which)."""
    by_name = claims_by_name(claims)
    rows = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        namespace = str(meta.get("namespace") or "default")
        seen = dict(pod_observations(pod, by_name))  # the same resolution the controller uses
        for claim_name in sorted(pod_claim_names(pod).values()):
            claim = by_name.get((namespace, claim_name)) or {}
            allocation = (claim.get("status") or {}).get("allocation") or {}
            # where the pod status says nothing, the driver's claim condition speaks
            from_claim = claim_observations(claim)
            for r in (allocation.get("devices") or {}).get("results") or []:
                key = DeviceKey(str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
                obs = seen.get(key) or from_claim.get(key)
                rows.append(
                    {
                        "namespace": namespace,
                        "pod": str(meta.get("name")),
                        "node": str((pod.get("spec") or {}).get("nodeName") or ""),
                        "phase": str(status.get("phase") or ""),
                        "claim": claim_name,
                        "request": str(r.get("request") or ""),
                        "device": str(key),
                        "health": obs.health.value if obs else "-",
                        "message": obs.message if obs else "",
                        "source": obs.source if obs else "",
                    }
                )
    return sorted(rows, key=lambda r: (r["namespace"], r["pod"], r["device"]))
