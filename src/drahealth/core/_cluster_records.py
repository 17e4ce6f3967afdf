"""The node agents' device-health records: the ConfigMap convention and its codec.

Owns the one implementation of the record format. The node agent writes one ConfigMap
per node, named ``drahealth-devices-<node>``, in its ``--namespace`` (default
``default``), labelled ``app.kubernetes.io/component=device-health``,
``app.kubernetes.io/managed-by=drahealth-agent`` and ``drahealth.io/node=<node>``. Data
key ``devices`` is a JSON list of ``{"driver", "pool", "device", "health", "message",
"since"}`` (``since``: unix time of the last change), sorted by device; ``omittedHealthy``
counts Healthy devices left out to bound the object's size.

:func:`is_agent_record` keeps only ConfigMaps that match all of the convention, so a
tenant who can write ConfigMaps in its own namespace cannot make a device look
Unhealthy. :func:`encode_devices` is what the agent writes, :func:`decode_devices` what
every reader reads. No I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from drahealth.core._health import DeviceKey, Health

__all__ = [
    "DEFAULT_NAMESPACE",
    "LABELS",
    "NAME_PREFIX",
    "NODE_LABEL",
    "HealthRow",
    "Observation",
    "agent_records",
    "decode_devices",
    "encode_devices",
    "is_agent_record",
    "record_labels",
    "record_name",
]

#: The agent's ``--namespace`` default.
DEFAULT_NAMESPACE: Final = "default"
NAME_PREFIX: Final = "drahealth-devices-"
NODE_LABEL: Final = "drahealth.io/node"
LABELS: Final = {
    "app.kubernetes.io/component": "device-health",
    "app.kubernetes.io/managed-by": "drahealth-agent",
}


@dataclass(frozen=True, slots=True)
class Observation:
    """What one source says of a device's health."""

    health: Health
    message: str
    node: str
    source: str  # "agent" or "pod"
    #: Unix time of the last change, where the source says (the agent's record does).
    since: float | None = None


@dataclass(frozen=True, slots=True)
class HealthRow:
    """One device of an agent's record, as the agent writes it."""

    key: DeviceKey
    health: Health
    message: str
    since: float


def record_name(node: str) -> str:
    """The name of ``node``'s record."""
    return NAME_PREFIX + node


def record_labels(node: str) -> dict[str, str]:
    """The labels of ``node``'s record."""
    return {**LABELS, NODE_LABEL: node}


def is_agent_record(cm: Mapping[str, Any], namespace: str) -> bool:
    """True if ``cm`` (a dict) is an agent's record in ``namespace``, by the convention."""
    meta = cm.get("metadata")
    if not isinstance(meta, dict) or meta.get("namespace") != namespace:
        return False
    labels = meta.get("labels")
    if not isinstance(labels, dict) or any(labels.get(k) != v for k, v in LABELS.items()):
        return False
    node = labels.get(NODE_LABEL)
    return isinstance(node, str) and bool(node) and meta.get("name") == NAME_PREFIX + node


def agent_records(configmaps: Iterable[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The ConfigMaps among ``configmaps`` that are agents' records in ``namespace``."""
    return [cm for cm in configmaps if is_agent_record(cm, namespace)]


def encode_devices(rows: Iterable[HealthRow], omitted_healthy: int = 0) -> dict[str, str]:
    """The ConfigMap data for ``rows`` (in the order given)."""
    out = [
        {
            "driver": r.key.driver,
            "pool": r.key.pool,
            "device": r.key.device,
            "health": r.health.value,
            "message": r.message,
            "since": round(r.since, 3),
        }
        for r in rows
    ]
    data = {"devices": json.dumps(out, ensure_ascii=False, separators=(",", ":"))}
    if omitted_healthy:
        data["omittedHealthy"] = str(omitted_healthy)
    return data


def _health(value: object) -> Health:
    try:
        return Health(str(value))
    except ValueError:
        return Health.UNKNOWN


def decode_devices(cm: Mapping[str, Any]) -> dict[DeviceKey, Observation]:
    """The devices a record reports on; malformed rows (or data) are skipped."""
    meta = cm.get("metadata")
    labels = (meta.get("labels") if isinstance(meta, dict) else None) or {}
    node = str(labels.get(NODE_LABEL, "")) if isinstance(labels, dict) else ""
    data = cm.get("data")
    try:
        rows = json.loads((data.get("devices") if isinstance(data, dict) else None) or "[]")
    except (TypeError, ValueError):
        return {}
    out: dict[DeviceKey, Observation] = {}
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict):
            continue
        driver, pool, device = row.get("driver"), row.get("pool"), row.get("device")
        if not (isinstance(driver, str) and isinstance(pool, str) and isinstance(device, str)):
            continue
        message, since = row.get("message"), row.get("since")
        out[DeviceKey(driver, pool, device)] = Observation(
            _health(row.get("health")),
            message if isinstance(message, str) else "",
            node,
            "agent",
            float(since) if isinstance(since, int | float) else None,
        )
    return out
