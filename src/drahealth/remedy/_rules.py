"""DeviceTaintRules the controller and the operator CLI write: names, bodies, ownership.

Owns the deterministic rule name of a (node, driver, pool, device, taint key), the rule
body (a ``spec.deviceSelector`` naming exactly one device and one ``spec.taint``), the
labels that say who created a rule, the provenance annotations (who, which policy rule,
why, since when: see :func:`rule_body`), and the validation of taint keys, values and
effects with errors that name the bad input. No I/O.

Names: ``dh-<readable part>-<hash>``, where the readable part is made of the device
name, pool and driver lowercased to RFC 1123 characters and cut to fit, and the hash
is the first 10 hex digits of the SHA-256 of the exact, unambiguous tuple, so two
devices whose names only differ in case or punctuation still get different names; at
most 253 characters.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final

from drahealth.core import (
    DeviceKey,
    is_dns_subdomain,
    is_label_value,
    matches_qualified_name_part,
)

__all__ = [
    "ANNOTATION_CREATED_BY",
    "ANNOTATION_FIRST_SEEN",
    "ANNOTATION_HEALTH",
    "CONTROLLER_LABEL",
    "DEFAULT_TAINT_KEY",
    "EFFECTS",
    "MANAGED_BY",
    "OPERATOR_LABEL",
    "DeviceRef",
    "RuleError",
    "created_by",
    "health_of",
    "is_ours",
    "parse_device",
    "rule_body",
    "rule_name",
    "validate_taint",
]

DOMAIN: Final = "drahealth.io"
DEFAULT_TAINT_KEY: Final = f"{DOMAIN}/unhealthy"
MANAGED_BY: Final = "app.kubernetes.io/managed-by"
#: ``app.kubernetes.io/managed-by`` value on rules the controller created.
CONTROLLER_LABEL: Final = "drahealth-controller"
#: ``drahealth.io/created-by`` value on rules an operator created with the CLI.
CREATED_BY: Final = f"{DOMAIN}/created-by"
OPERATOR_LABEL: Final = "operator"
ANNOTATION_NODE: Final = f"{DOMAIN}/node"
ANNOTATION_RULE: Final = f"{DOMAIN}/policy-rule"
ANNOTATION_REASON: Final = f"{DOMAIN}/reason"
#: Who wrote the rule: the controller's identity (its leader election identity) or the
#: operator's user (an annotation; the label of the same name says which kind).
ANNOTATION_CREATED_BY: Final = f"{DOMAIN}/created-by"
#: The device health that led to the rule (Unhealthy, Unknown).
ANNOTATION_HEALTH: Final = f"{DOMAIN}/health"
#: When the bad health was first observed (RFC 3339); the taint's timeAdded is when the
#: rule was written.
ANNOTATION_FIRST_SEEN: Final = f"{DOMAIN}/first-seen"
#: Health values a reason may start with (``"Unhealthy: XID 79"``).
_HEALTHS: Final = ("Unhealthy", "Unknown", "Healthy")
EFFECTS: Final = ("None", "NoSchedule", "NoExecute")
MAX_NAME: Final = 253


class RuleError(ValueError):
    """Bad taint input; the text names the field and the value."""


#: A device, as ``DRIVER/POOL/DEVICE`` (the core's key).
DeviceRef = DeviceKey


def parse_device(text: str) -> DeviceRef:
    """``DRIVER/POOL/DEVICE`` -> :class:`DeviceRef` (the pool may contain slashes)."""
    parts = text.split("/")
    if len(parts) < 3 or not all(parts):
        raise RuleError(
            f"device {text!r} must be DRIVER/POOL/DEVICE, e.g. gpu.example.com/node-1/gpu-0"
        )
    return DeviceRef(parts[0], "/".join(parts[1:-1]), parts[-1])


def validate_taint(key: str, value: str, effect: str) -> None:
    """Raise :class:`RuleError` naming the bad field of a device taint."""
    prefix, _, name = key.rpartition("/")
    if not name or len(name) > 63 or not matches_qualified_name_part(name):
        raise RuleError(
            f"taint key {key!r}: the name part must be 1-63 characters of [A-Za-z0-9-_.], "
            "starting and ending with an alphanumeric character"
        )
    if "/" in key and not is_dns_subdomain(prefix):
        raise RuleError(f"taint key {key!r}: the prefix must be a DNS subdomain")
    if not is_label_value(value):
        raise RuleError(
            f"taint value {value!r} must be at most 63 characters of [A-Za-z0-9-_.], "
            "starting and ending with an alphanumeric character (or empty)"
        )
    if effect not in EFFECTS:
        raise RuleError(f"taint effect {effect!r} must be one of {', '.join(EFFECTS)}")


def _slug(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


def rule_name(node: str, device: DeviceRef, key: str) -> str:
    """The deterministic, collision-free name of the rule for ``device`` and ``key``."""
    exact = json.dumps([node, device.driver, device.pool, device.device, key])
    digest = hashlib.sha256(exact.encode()).hexdigest()[:10]
    readable = "-".join(p for p in (_slug(device.device), _slug(device.pool)) if p)
    readable = readable[: MAX_NAME - len("dh--") - len(digest)].strip("-")
    return f"dh-{readable}-{digest}" if readable else f"dh-{digest}"


def created_by(rule: Any) -> str | None:
    """``"controller"``, ``"operator"`` or None (a rule drahealth did not create)."""
    meta = rule.get("metadata") if isinstance(rule, dict) else getattr(rule, "metadata", None)
    labels = (meta.get("labels") if isinstance(meta, dict) else getattr(meta, "labels", None)) or {}
    if labels.get(MANAGED_BY) == CONTROLLER_LABEL:
        return "controller"
    if labels.get(CREATED_BY) == OPERATOR_LABEL:
        return "operator"
    return None


def health_of(reason: str) -> str:
    """The health a controller reason (``"Unhealthy: XID 79"``) names, or ``""``."""
    head = reason.split(":", 1)[0].strip()
    return head if head in _HEALTHS else ""


def is_ours(rule: Any) -> bool:
    """Whether the controller created ``rule`` (the only rules it may change or delete)."""
    return created_by(rule) == "controller"


def rule_body(
    device: DeviceRef,
    *,
    key: str,
    value: str,
    effect: str,
    node: str = "",
    by: str = "controller",
    policy_rule: str = "",
    reason: str = "",
    writer: str = "",
    health: str = "",
    first_seen: str = "",
) -> dict[str, Any]:
    """A ``resource.k8s.io/v1`` DeviceTaintRule for exactly ``device``.

    Provenance, as annotations where given: ``writer`` (who: the controller's identity
    or the operator's user) in ``drahealth.io/created-by``, ``policy_rule``, ``reason``
    (health and message, at most 1024 characters), ``health`` (derived from ``reason``
    when not given) and ``first_seen`` (RFC 3339: when the bad health was first
    observed).
    """
    validate_taint(key, value, effect)
    if by not in ("controller", "operator"):
        raise RuleError(f"created by {by!r} must be 'controller' or 'operator'")
    labels = {MANAGED_BY: CONTROLLER_LABEL} if by == "controller" else {CREATED_BY: OPERATOR_LABEL}
    annotations = {ANNOTATION_NODE: node} if node else {}
    if policy_rule:
        annotations[ANNOTATION_RULE] = policy_rule
    if reason:
        annotations[ANNOTATION_REASON] = reason[:1024]
    if writer:
        annotations[ANNOTATION_CREATED_BY] = writer[:253]
    health = health or health_of(reason)
    if health:
        annotations[ANNOTATION_HEALTH] = health
    if first_seen:
        annotations[ANNOTATION_FIRST_SEEN] = first_seen
    taint = {"key": key, "value": value, "effect": effect}
    if not value:
        del taint["value"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(node, device, key),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "deviceSelector": {
                "driver": device.driver,
                "pool": device.pool,
                "device": device.device,
            },
            "taint": taint,
        },
    }
