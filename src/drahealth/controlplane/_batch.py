"""What the API server itself does for ``batch/v1`` Jobs: defaulting and validation.

Owns the Job's defaults as upstream sets them (``pkg/apis/batch/v1/defaults.go``:
``completions`` and ``parallelism`` 1 when both are unset, ``parallelism`` 1,
``backoffLimit`` 6, ``completionMode`` NonIndexed, ``suspend`` false,
``podReplacementPolicy`` Failed with a ``podFailurePolicy`` and TerminatingOrFailed
without, the Job's labels from its template's when it has none), the selector the
Job strategy generates on create (``batch.kubernetes.io/controller-uid`` in
``spec.selector`` and the four tracking labels on the pod template), and the
validation rules the project's scenarios reach (``pkg/apis/batch/validation``):
restart policy, non-negative counts, selector matching the template,
``podFailurePolicy`` rules, and the fields that cannot change on update. Pure
functions over JSON dicts; the Job controller stand-in is in :mod:`drahealth.standins`.
"""

from __future__ import annotations

from typing import Any

from ._status import cause

JSON = dict[str, Any]

#: The labels upstream puts on a Job's pods (both spellings, as 1.27+ does).
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LEGACY_CONTROLLER_UID_LABEL = "controller-uid"
LEGACY_JOB_NAME_LABEL = "job-name"

DEFAULT_BACKOFF_LIMIT = 6
_RESTART_POLICIES = ("OnFailure", "Never")
_ACTIONS = ("Count", "FailJob", "FailIndex", "Ignore")
_OPERATORS = ("In", "NotIn")
_COMPLETION_MODES = ("NonIndexed", "Indexed")
_REPLACEMENT_POLICIES = ("TerminatingOrFailed", "Failed")
MAX_POD_FAILURE_RULES = 20
MAX_EXIT_CODE_VALUES = 255


def _dict(value: Any) -> JSON:
    return value if isinstance(value, dict) else {}


def default_job(obj: JSON) -> None:
    """Fill the defaults and the generated selector into ``obj`` (in place).

    ``obj`` has its ``metadata.uid`` already (create) or kept from the stored Job
    (update: a selector already present is kept).
    """
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    meta = obj.setdefault("metadata", {})
    template = spec.get("template")
    tmeta = _dict(_dict(template).get("metadata"))
    if not meta.get("labels") and tmeta.get("labels") and isinstance(tmeta["labels"], dict):
        meta["labels"] = dict(tmeta["labels"])
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
        spec["parallelism"] = 1
    spec.setdefault("parallelism", 1)
    if spec.get("backoffLimit") is None:
        spec["backoffLimit"] = (
            2**31 - 1 if spec.get("backoffLimitPerIndex") is not None else DEFAULT_BACKOFF_LIMIT
        )
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    if spec.get("podReplacementPolicy") is None:
        failed = spec.get("podFailurePolicy") is not None
        spec["podReplacementPolicy"] = "Failed" if failed else "TerminatingOrFailed"
    if spec.get("manualSelector") is True or not isinstance(template, dict):
        return
    uid, name = str(meta.get("uid") or ""), str(meta.get("name") or "")
    if not spec.get("selector"):
        spec["selector"] = {"matchLabels": {CONTROLLER_UID_LABEL: uid}}
    tm = template.setdefault("metadata", {})
    if not isinstance(tm, dict):
        return
    labels = tm.setdefault("labels", {})
    if isinstance(labels, dict):
        labels.setdefault(LEGACY_CONTROLLER_UID_LABEL, uid)
        labels.setdefault(LEGACY_JOB_NAME_LABEL, name)
        labels.setdefault(CONTROLLER_UID_LABEL, uid)
        labels.setdefault(JOB_NAME_LABEL, name)


def _non_negative(spec: JSON, field: str) -> list[JSON]:
    value = spec.get(field)
    if isinstance(value, int) and value < 0:
        return [
            cause(
                "FieldValueInvalid",
                f"Invalid value: {value}: must be greater than or equal to 0",
                f"spec.{field}",
            )
        ]
    return []


def _selector_matches(selector: JSON, labels: JSON) -> bool:
    for k, v in _dict(selector.get("matchLabels")).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        e = _dict(expr)
        key, op, values = str(e.get("key")), e.get("operator"), e.get("values") or []
        have = key in labels
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and have and labels.get(key) in values:
            return False
        if op == "Exists" and not have:
            return False
        if op == "DoesNotExist" and have:
            return False
    return True


def _policy_causes(spec: JSON, restart: Any) -> list[JSON]:
    policy = spec.get("podFailurePolicy")
    if policy is None:
        return []
    out: list[JSON] = []
    if restart != "Never":
        out.append(
            cause(
                "FieldValueInvalid",
                f'Invalid value: "{restart}": only "Never" is supported when '
                "podFailurePolicy is specified",
                "spec.template.spec.restartPolicy",
            )
        )
    rules = _dict(policy).get("rules") or []
    if len(rules) > MAX_POD_FAILURE_RULES:
        out.append(
            cause(
                "FieldValueTooMany",
                f"Too many: {len(rules)}: must have at most {MAX_POD_FAILURE_RULES} items",
                "spec.podFailurePolicy.rules",
            )
        )
    for i, rule in enumerate(rules):
        r, where = _dict(rule), f"spec.podFailurePolicy.rules[{i}]"
        action = r.get("action")
        if action not in _ACTIONS:
            allowed = ", ".join(f'"{a}"' for a in _ACTIONS)
            out.append(
                cause(
                    "FieldValueNotSupported",
                    f'Unsupported value: "{action}": supported values: {allowed}',
                    f"{where}.action",
                )
            )
        if action == "FailIndex" and spec.get("backoffLimitPerIndex") is None:
            out.append(
                cause(
                    "FieldValueInvalid",
                    'Invalid value: "FailIndex": requires the backoffLimitPerIndex to be set',
                    f"{where}.action",
                )
            )
        codes, conds = r.get("onExitCodes"), r.get("onPodConditions")
        if (codes is None) == (conds is None):
            out.append(
                cause(
                    "FieldValueInvalid",
                    "Invalid value: specifying one of OnExitCodes and OnPodConditions is required",
                    where,
                )
            )
        if codes is not None:
            c = _dict(codes)
            if c.get("operator") not in _OPERATORS:
                out.append(
                    cause(
                        "FieldValueNotSupported",
                        f'Unsupported value: "{c.get("operator")}": supported values: '
                        '"In", "NotIn"',
                        f"{where}.onExitCodes.operator",
                    )
                )
            values = c.get("values") or []
            if not values:
                out.append(
                    cause("FieldValueInvalid", "Invalid value: at least one value is required",
                          f"{where}.onExitCodes.values")
                )  # fmt: skip
            elif len(values) > MAX_EXIT_CODE_VALUES:
                out.append(
                    cause(
                        "FieldValueTooMany",
                        f"Too many: {len(values)}: must have at most {MAX_EXIT_CODE_VALUES} items",
                        f"{where}.onExitCodes.values",
                    )
                )
            if c.get("operator") == "In" and 0 in values:
                out.append(
                    cause(
                        "FieldValueInvalid",
                        "Invalid value: 0: must not be 0 for the In operator",
                        f"{where}.onExitCodes.values",
                    )
                )
        for j, pattern in enumerate(conds or []):
            p = _dict(pattern)
            if not p.get("type"):
                out.append(
                    cause("FieldValueRequired", "Required value",
                          f"{where}.onPodConditions[{j}].type")
                )  # fmt: skip
            if p.get("status", "True") not in ("True", "False", "Unknown"):
                out.append(
                    cause(
                        "FieldValueNotSupported",
                        f'Unsupported value: "{p.get("status")}": supported values: '
                        '"False", "True", "Unknown"',
                        f"{where}.onPodConditions[{j}].status",
                    )
                )
    if spec.get("podReplacementPolicy") not in (None, "Failed"):
        out.append(
            cause(
                "FieldValueNotSupported",
                f'Unsupported value: "{spec.get("podReplacementPolicy")}": supported '
                'values: "Failed"',
                "spec.podReplacementPolicy",
            )
        )
    return out


def job_causes(obj: JSON, context: object = None) -> list[JSON]:
    """Validation causes for a Job as it would be stored (after defaulting).

    ``context`` is what the validator knows beside the object: its ``old`` attribute,
    when present and not None, is the stored Job of an update (the release does not
    change these rules in 1.34-1.38).
    """
    spec = _dict(obj.get("spec"))
    out: list[JSON] = []
    old = getattr(context, "old", None)
    if isinstance(old, dict):
        out.extend(job_update_causes(old, obj))
    for f in ("parallelism", "completions", "backoffLimit", "activeDeadlineSeconds",
              "ttlSecondsAfterFinished"):  # fmt: skip
        out.extend(_non_negative(spec, f))
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and deadline == 0:
        out.append(
            cause("FieldValueInvalid", "Invalid value: 0: must be greater than 0",
                  "spec.activeDeadlineSeconds")
        )  # fmt: skip
    template = _dict(spec.get("template"))
    if not spec.get("template"):
        out.append(cause("FieldValueRequired", "Required value", "spec.template"))
    pod_spec = _dict(template.get("spec"))
    restart = pod_spec.get("restartPolicy")
    if restart not in _RESTART_POLICIES:
        out.append(
            cause(
                "FieldValueNotSupported" if restart else "FieldValueRequired",
                f'Unsupported value: "{restart or ""}": supported values: "OnFailure", "Never"',
                "spec.template.spec.restartPolicy",
            )
        )
    if not pod_spec.get("containers"):
        out.append(cause("FieldValueRequired", "Required value", "spec.template.spec.containers"))
    mode = spec.get("completionMode", "NonIndexed")
    if mode not in _COMPLETION_MODES:
        out.append(
            cause(
                "FieldValueNotSupported",
                f'Unsupported value: "{mode}": supported values: "NonIndexed", "Indexed"',
                "spec.completionMode",
            )
        )
    elif mode == "Indexed" and spec.get("completions") is None:
        out.append(
            cause(
                "FieldValueRequired",
                "Required value: when completion mode is Indexed",
                "spec.completions",
            )
        )
    replacement = spec.get("podReplacementPolicy")
    if replacement is not None and replacement not in _REPLACEMENT_POLICIES:
        out.append(
            cause(
                "FieldValueNotSupported",
                f'Unsupported value: "{replacement}": supported values: "Failed", '
                '"TerminatingOrFailed"',
                "spec.podReplacementPolicy",
            )
        )
    out.extend(_policy_causes(spec, restart))
    selector = spec.get("selector")
    if selector is None and spec.get("manualSelector") is True:
        out.append(cause("FieldValueRequired", "Required value", "spec.selector"))
    elif isinstance(selector, dict):
        labels = _dict(_dict(template.get("metadata")).get("labels"))
        if not _selector_matches(selector, labels):
            out.append(
                cause(
                    "FieldValueInvalid",
                    "Invalid value: `selector` does not match template `labels`",
                    "spec.template.metadata.labels",
                )
            )
    return out


#: Fields of a Job's spec that cannot change once it exists (upstream's ValidateJobSpecUpdate;
#: the pod template may change only while the Job is suspended, which is not modelled).
IMMUTABLE_SPEC = (
    "selector",
    "template",
    "completionMode",
    "podFailurePolicy",
    "backoffLimitPerIndex",
)


def job_update_causes(old: JSON, new: JSON) -> list[JSON]:
    """Causes for changing what a Job cannot change."""
    old_spec, new_spec = _dict(old.get("spec")), _dict(new.get("spec"))
    out = []
    for f in IMMUTABLE_SPEC:
        if f == "template" and old_spec.get("suspend") and new_spec.get("suspend"):
            continue
        if old_spec.get(f) != new_spec.get(f):
            out.append(cause("FieldValueInvalid", "Invalid value: field is immutable",
                             f"spec.{f}"))  # fmt: skip
    if new_spec.get("completionMode", "NonIndexed") == "NonIndexed" and old_spec.get(
        "completions"
    ) != new_spec.get("completions"):
        out.append(cause("FieldValueInvalid", "Invalid value: field is immutable",
                         "spec.completions"))  # fmt: skip
    return out
