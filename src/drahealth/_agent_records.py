"""Which ConfigMaps are node agents' device-health records, for the readers that show them.

Owns the convention the readers (``drahealth status``, the dashboard) rely on, as the
node agent writes it: one ConfigMap per node, named ``drahealth-devices-<node>``, in the
agent's ``--namespace`` (default ``default``), labelled
``app.kubernetes.io/component=device-health``, ``app.kubernetes.io/managed-by=
drahealth-agent`` and ``drahealth.io/node=<node>``. :func:`agent_records` keeps only
ConfigMaps that match all of it, so a tenant who can write ConfigMaps in its own
namespace cannot make a device look Unhealthy. :data:`LABELS` is the list selector.
The convention and the record's codec live in the core; this module re-exports them.
"""

from __future__ import annotations

from drahealth.core import (
    DEFAULT_NAMESPACE,
    LABELS,
    NAME_PREFIX,
    NODE_LABEL,
    agent_records,
    is_agent_record,
)

__all__ = [
    "DEFAULT_NAMESPACE",
    "LABELS",
    "NAME_PREFIX",
    "NODE_LABEL",
    "agent_records",
    "is_agent_record",
]
