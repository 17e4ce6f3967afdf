"""Which ConfigMaps are node agents' device-health records, for the readers that show them.

Owns the convention the readers (``drahealth status``, the dashboard) rely on, as the
node agent writes it: one ConfigMap per node, named ``drahealth-devices-<node>``, in the
agent's ``--namespace`` (default ``default``), labelled
``app.kubernetes.io/component=device-health``, ``app.kubernetes.io/managed-by=
drahealth-agent`` and ``drahealth.io/node=<node>``. :func:`agent_records` keeps only
ConfigMaps that match all of it, so a tenant who can write ConfigMaps in its own
namespace cannot make a device look Unhealthy. :data:`LABELS` is the list selector.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

__all__ = [
    "DEFAULT_NAMESPACE",
    "LABELS",
    "NAME_PREFIX",
    "NODE_LABEL",
    "agent_records",
    "is_agent_record",
]

#: The agent's ``--namespace`` default.
DEFAULT_NAMESPACE: Final = "default"
NAME_PREFIX: Final = "drahealth-devices-"
NODE_LABEL: Final = "drahealth.io/node"
LABELS: Final = {
    "app.kubernetes.io/component": "device-health",
    "app.kubernetes.io/managed-by": "drahealth-agent",
}


def is_agent_record(cm: dict[str, Any], namespace: str) -> bool:
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
