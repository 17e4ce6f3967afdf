"""How the views say what a server does not serve, and which remediation mode is in force.

Owns what the CLI views and the dashboard share when a cluster lacks some
``resource.k8s.io`` kinds (a 1.35 cluster without ``DRADeviceTaintRules`` serves no
DeviceTaintRule): the one-line note naming the kind, the release and gate it runs
without and what remediation does instead (:func:`not_served_note`), and the
controller's remediation mode as it recorded it in its history ConfigMap
(:func:`controller_mode`, the ``mode`` key: JSON with ``mode``, ``why``, the rule API
version and the server version). Pure functions over discovery results and dicts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from drahealth.core import choose_remediation_mode, unserved_reason
from drahealth.kube import ServedAPIs

__all__ = [
    "MODE_PHRASES",
    "NO_CONTROLLER",
    "ControllerMode",
    "auto_mode",
    "controller_mode",
    "not_served_note",
    "plural",
]

#: What remediation does in each mode, for "...; remediation uses node taints".
MODE_PHRASES: dict[str, str] = {
    "taint-rules": "remediation uses DeviceTaintRules",
    "quarantine": "remediation fences each bad device with a quarantine ResourceClaim",
    "node-taint": "remediation uses node taints",
    "cordon": "remediation cordons nodes",
    "evict-only": "remediation only evicts pods",
    "report-only": "remediation only reports",
}
NO_CONTROLLER = "unknown: no controller has run"
#: Longest text taken from the history ConfigMap's ``mode`` record per field.
_FIELD_MAX = 256


def plural(kind: str) -> str:
    return kind + "s"


def auto_mode(served: ServedAPIs) -> tuple[str, str]:
    """(mode, why) that remediation mode ``auto`` chooses against ``served``."""
    return choose_remediation_mode(
        "auto", served.chosen("DeviceTaintRule"), claims_v1=served.chosen("ResourceClaim") == "v1"
    )


def not_served_note(kind: str, served: ServedAPIs, mode: str | None = None) -> str:
    """``DeviceTaintRules: not served by this server (<release, gate, fix>); <what follows>``.

    ``mode`` is the controller's mode when known; otherwise the one ``auto`` chooses.
    """
    reason = unserved_reason(kind, served.server_version)
    note = f"{plural(kind)}: not served by this server ({reason})"
    if kind == "DeviceTaintRule":
        if mode not in MODE_PHRASES:  # no controller recorded one: what auto would do
            claims_v1 = served.chosen("ResourceClaim") == "v1"
            mode = choose_remediation_mode("auto", None, claims_v1=claims_v1)[0]
        note += f"; {MODE_PHRASES[mode]}"
    return note


@dataclass(frozen=True)
class ControllerMode:
    """The remediation mode a controller recorded (all text, bounded, possibly empty)."""

    mode: str
    why: str = ""
    rule_api: str = ""
    server_version: str = ""

    def describe(self) -> str:
        return self.mode + (f" ({self.why})" if self.why else "")


def _field(record: Mapping[str, Any], *names: str) -> str:
    for name in names:
        value = record.get(name)
        if isinstance(value, str) and value:
            return value[:_FIELD_MAX]
    return ""


def controller_mode(configmap: Mapping[str, Any] | None) -> ControllerMode | None:
    """The ``mode`` record of the controller's history ConfigMap (a dict), or None.

    None when there is no ConfigMap, no ``mode`` key, or it is not a JSON object naming a
    mode; a bare string is taken as the mode itself.
    """
    data = (configmap or {}).get("data") or {}
    raw = data.get("mode") if isinstance(data, Mapping) else None
    if not isinstance(raw, str) or not raw.strip():
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        record = {"mode": raw.strip()}
    if isinstance(record, str):
        record = {"mode": record}
    if not isinstance(record, Mapping):
        return None
    mode = _field(record, "mode")
    if not mode:
        return None
    return ControllerMode(
        mode=mode,
        why=_field(record, "why", "reason"),
        rule_api=_field(record, "deviceTaintRuleAPI"),
        server_version=_field(record, "serverVersion", "server"),
    )
