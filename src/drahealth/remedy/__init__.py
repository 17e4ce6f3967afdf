"""The remediation controller: policy -> DeviceTaintRule / eviction -> verified untaint.

Names are imported on first use (PEP 562): importing the package, or one of its
small modules, does not load the controller and the Kubernetes client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drahealth._lazy import lazy_exports

if TYPE_CHECKING:
    from drahealth.remedy._control import (
        CONTROL_CONFIGMAP,
        STATE_CONFIGMAP,
        ControlError,
        read_state,
        send_request,
    )
    from drahealth.remedy._controller import HISTORY_CONFIGMAP, RemediationController
    from drahealth.remedy._evict import Evictor
    from drahealth.remedy._metrics import ControllerMetrics
    from drahealth.remedy._modes import ModeChoice, ModeError, resolve_mode
    from drahealth.remedy._operator import (
        RuleAPIUnavailable,
        UnpublishedDevice,
        apply_taint,
        check_device,
        names_device,
        remove_taints,
    )
    from drahealth.remedy._policy_load import load_policy, parse_policy
    from drahealth.remedy._provenance import history_source, recorded_by
    from drahealth.remedy._rules import (
        CONTROLLER_LABEL,
        DEFAULT_TAINT_KEY,
        EFFECTS,
        MANAGED_BY,
        OPERATOR_LABEL,
        DeviceRef,
        RuleError,
        created_by,
        is_ours,
        parse_device,
        rule_body,
        rule_name,
        validate_taint,
    )
    from drahealth.remedy._view import (
        claims_by_name,
        consumers,
        device_facts,
        device_taints,
        observations,
        pod_observations,
    )

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "HISTORY_CONFIGMAP": "drahealth.remedy._controller",
    "RemediationController": "drahealth.remedy._controller",
    "STATE_CONFIGMAP": "drahealth.remedy._control",
    "CONTROL_CONFIGMAP": "drahealth.remedy._control",
    "ControlError": "drahealth.remedy._control",
    "read_state": "drahealth.remedy._control",
    "send_request": "drahealth.remedy._control",
    "Evictor": "drahealth.remedy._evict",
    "ControllerMetrics": "drahealth.remedy._metrics",
    "ModeChoice": "drahealth.remedy._modes",
    "ModeError": "drahealth.remedy._modes",
    "resolve_mode": "drahealth.remedy._modes",
    "RuleAPIUnavailable": "drahealth.remedy._operator",
    "apply_taint": "drahealth.remedy._operator",
    "UnpublishedDevice": "drahealth.remedy._operator",
    "check_device": "drahealth.remedy._operator",
    "history_source": "drahealth.remedy._provenance",
    "recorded_by": "drahealth.remedy._provenance",
    "names_device": "drahealth.remedy._operator",
    "remove_taints": "drahealth.remedy._operator",
    "load_policy": "drahealth.remedy._policy_load",
    "parse_policy": "drahealth.remedy._policy_load",
    "CONTROLLER_LABEL": "drahealth.remedy._rules",
    "DEFAULT_TAINT_KEY": "drahealth.remedy._rules",
    "EFFECTS": "drahealth.remedy._rules",
    "MANAGED_BY": "drahealth.remedy._rules",
    "OPERATOR_LABEL": "drahealth.remedy._rules",
    "DeviceRef": "drahealth.remedy._rules",
    "RuleError": "drahealth.remedy._rules",
    "created_by": "drahealth.remedy._rules",
    "is_ours": "drahealth.remedy._rules",
    "parse_device": "drahealth.remedy._rules",
    "rule_body": "drahealth.remedy._rules",
    "rule_name": "drahealth.remedy._rules",
    "validate_taint": "drahealth.remedy._rules",
    "claims_by_name": "drahealth.remedy._view",
    "consumers": "drahealth.remedy._view",
    "device_facts": "drahealth.remedy._view",
    "device_taints": "drahealth.remedy._view",
    "observations": "drahealth.remedy._view",
    "pod_observations": "drahealth.remedy._view",
}

__all__ = [
    "CONTROLLER_LABEL",
    "CONTROL_CONFIGMAP",
    "DEFAULT_TAINT_KEY",
    "EFFECTS",
    "HISTORY_CONFIGMAP",
    "MANAGED_BY",
    "OPERATOR_LABEL",
    "STATE_CONFIGMAP",
    "ControlError",
    "ControllerMetrics",
    "DeviceRef",
    "Evictor",
    "ModeChoice",
    "ModeError",
    "RemediationController",
    "RuleAPIUnavailable",
    "RuleError",
    "UnpublishedDevice",
    "apply_taint",
    "check_device",
    "claims_by_name",
    "consumers",
    "created_by",
    "device_facts",
    "device_taints",
    "history_source",
    "is_ours",
    "load_policy",
    "names_device",
    "observations",
    "parse_device",
    "parse_policy",
    "pod_observations",
    "read_state",
    "recorded_by",
    "remove_taints",
    "resolve_mode",
    "rule_body",
    "rule_name",
    "send_request",
    "validate_taint",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
