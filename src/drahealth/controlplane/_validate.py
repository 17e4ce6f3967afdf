"""Validation of objects before they are stored.

Owns the schema check (the object is walked against the lightkube model class of its
kind via ``msgspec.inspect``: unknown fields, wrong types and missing required fields
become ``StatusCause``s naming the field path), object-name and label rules, and the
few cheap kind-specific checks the project relies on (resource health values,
DeviceTaintRule effects per release, ResourceSlice limits, PDB budgets,
SelfSubjectAccessReview attributes). Returns causes; never raises for invalid input.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import json
import re
from typing import Any

import msgspec
import msgspec.inspect as mi

from drahealth.core import KubeProfile, matches_dns_label, matches_dns_subdomain

from ._batch import job_causes
from ._resources import ResourceType
from ._selectors import SelectorError, validate_label_key, validate_label_value
from ._status import cause

JSON = dict[str, Any]
MAX_CAUSES = 20

_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
    "regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_DNS_LABEL_KINDS = frozenset({"Namespace"})

HEALTH_VALUES = ("Healthy", "Unhealthy", "Unknown")
#: Device taint effects, sorted as upstream lists them; ``None`` exists from 1.35 on.
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")
TAINT_EFFECTS_1_34 = ("NoExecute", "NoSchedule")
MAX_DEVICES_PER_SLICE = 128

_TYPE_NAMES = {
    mi.StrType: "string",
    mi.IntType: "integer",
    mi.FloatType: "number",
    mi.BoolType: "boolean",
    mi.DateTimeType: "string (RFC 3339 date-time)",
    mi.ListType: "array",
    mi.DictType: "object",
    mi.StructType: "object",
}

_type_cache: dict[type, mi.Type] = {}


def _show(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 80 else text[:77] + "..."


def invalid_value(field: str, value: Any, detail: str) -> JSON:
    return cause("FieldValueInvalid", f"Invalid value: {_show(value)}: {detail}", field)


def unsupported(field: str, value: Any, allowed: tuple[str, ...]) -> JSON:
    supported = ", ".join(f'"{a}"' for a in allowed)
    return cause(
        "FieldValueNotSupported",
        f"Unsupported value: {_show(value)}: supported values: {supported}",
        field,
    )


def required(field: str) -> JSON:
    return cause("FieldValueRequired", "Required value", field)


# --------------------------------------------------------------------------- schema walk


@functools.cache
def _annotations(cls: type) -> dict[str, str]:
    """The field annotations of a model class and its bases (computed once per class)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for k, v in inspect.get_annotations(klass).items():
            out[k] = v if isinstance(v, str) else repr(v)
    return out


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _check(value: Any, t: mi.Type, path: str, quantity: bool, out: list[JSON]) -> None:
    if len(out) >= MAX_CAUSES:
        return
    if isinstance(t, mi.UnionType):
        if value is None and any(isinstance(x, mi.NoneType) for x in t.types):
            return
        options = [x for x in t.types if not isinstance(x, mi.NoneType)]
        for x in options:
            if _accepts(value, x, quantity):
                _check(value, x, path, quantity, out)
                return
        names = " or ".join(dict.fromkeys(_TYPE_NAMES.get(type(x), "value") for x in options))
        out.append(
            cause(
                "FieldValueTypeInvalid",
                f"Invalid value: {_show(value)}: must be of type {names}",
                path,
            )
        )
        return
    if not _accepts(value, t, quantity):
        name = _TYPE_NAMES.get(type(t), "value")
        out.append(
            cause(
                "FieldValueTypeInvalid",
                f"Invalid value: {_show(value)}: must be of type {name}",
                path,
            )
        )
        return
    if isinstance(t, mi.StructType):
        fields = {f.encode_name: f for f in t.fields}
        notes = _annotations(t.cls)
        for key, sub in value.items():
            f = fields.get(key)
            if f is None:
                where = _join(path, key)
                out.append(cause("FieldValueInvalid", f'unknown field "{where}"', where))
                continue
            _check(sub, f.type, _join(path, key), "Quantity" in notes.get(f.name, ""), out)
        for f in t.fields:
            if f.required and f.encode_name not in value:
                out.append(required(_join(path, f.encode_name)))
    elif isinstance(t, mi.ListType):
        for i, item in enumerate(value):
            _check(item, t.item_type, f"{path}[{i}]", quantity, out)
    elif isinstance(t, mi.DictType):
        for k, item in value.items():
            _check(item, t.value_type, f"{path}[{k}]", quantity, out)
    elif isinstance(t, mi.DateTimeType):
        try:
            dt.datetime.fromisoformat(value)
        except ValueError:
            out.append(invalid_value(path, value, "must be an RFC 3339 date-time"))


def _accepts(value: Any, t: mi.Type, quantity: bool) -> bool:
    if isinstance(t, mi.StrType):
        if quantity and isinstance(value, int | float) and not isinstance(value, bool):
            return True
        return isinstance(value, str)
    if isinstance(t, mi.IntType):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(t, mi.FloatType):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(t, mi.BoolType):
        return isinstance(value, bool)
    if isinstance(t, mi.DateTimeType):
        return isinstance(value, str)
    if isinstance(t, mi.ListType):
        return isinstance(value, list)
    if isinstance(t, mi.DictType | mi.StructType):
        return isinstance(value, dict)
    if isinstance(t, mi.NoneType):
        return value is None
    return True


def _prune(value: Any, t: mi.Type, path: str, out: list[str]) -> None:
    if isinstance(t, mi.UnionType):
        for x in t.types:
            if not isinstance(x, mi.NoneType) and _accepts(value, x, True):
                _prune(value, x, path, out)
                return
        return
    if isinstance(t, mi.StructType) and isinstance(value, dict):
        fields = {f.encode_name: f for f in t.fields}
        for key in list(value):
            f = fields.get(key)
            if f is None:
                out.append(_join(path, key))
                del value[key]
            else:
                _prune(value[key], f.type, _join(path, key), out)
    elif isinstance(t, mi.ListType) and isinstance(value, list):
        for i, item in enumerate(value):
            _prune(item, t.item_type, f"{path}[{i}]", out)
    elif isinstance(t, mi.DictType) and isinstance(value, dict):
        for k, item in value.items():
            _prune(item, t.value_type, f"{path}[{k}]", out)


def prune_unknown(obj: JSON, model: type[msgspec.Struct]) -> list[str]:
    """Remove fields the schema does not know from ``obj`` (in place); returns their paths.

    What the real server does under ``fieldValidation=Ignore`` and ``Warn``: unknown
    fields are dropped, never stored.
    """
    t = _type_cache.get(model)
    if t is None:
        t = _type_cache[model] = mi.type_info(model)
    out: list[str] = []
    _prune(obj, t, "", out)
    return out


def schema_causes(obj: JSON, model: type[msgspec.Struct]) -> list[JSON]:
    """Causes for unknown fields, wrong types and missing required fields."""
    t = _type_cache.get(model)
    if t is None:
        t = _type_cache[model] = mi.type_info(model)
    out: list[JSON] = []
    _check(obj, t, "", False, out)
    return out


# --------------------------------------------------------------------------- names, labels


def name_causes(kind: str, name: str, field: str = "metadata.name") -> list[JSON]:
    if kind in _DNS_LABEL_KINDS:
        if len(name) > 63:
            return [invalid_value(field, name, "must be no more than 63 characters")]
        if not matches_dns_label(name):
            return [invalid_value(field, name, _LABEL_MSG)]
        return []
    if len(name) > 253:
        return [invalid_value(field, name, "must be no more than 253 characters")]
    if not matches_dns_subdomain(name):
        return [invalid_value(field, name, _SUBDOMAIN_MSG)]
    return []


def _label_causes(meta: JSON) -> list[JSON]:
    out: list[JSON] = []
    labels = meta.get("labels")
    if isinstance(labels, dict):
        for k, v in labels.items():
            try:
                validate_label_key(str(k))
                if isinstance(v, str):
                    validate_label_value(v)
            except SelectorError as e:
                out.append(invalid_value(f"metadata.labels[{k}]", v, str(e)))
    annotations = meta.get("annotations")
    if isinstance(annotations, dict):
        for k in annotations:
            try:
                validate_label_key(str(k))
            except SelectorError as e:
                out.append(invalid_value("metadata.annotations", k, str(e)))
    return out


# --------------------------------------------------------------------------- kind rules


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> JSON:
    return value if isinstance(value, dict) else {}


def duplicate(field: str, value: Any) -> JSON:
    return cause("FieldValueDuplicate", f"Duplicate value: {_show(value)}", field)


def forbidden(field: str, detail: str) -> JSON:
    return cause("FieldValueForbidden", f"Forbidden: {detail}", field)


_CLAIM_NAME_MSG = (
    "must match one of the container's resource claims in a format "
    "'claim:<claimName>/<request>' or 'claim:<claimName>' if request is empty"
)
_REQUEST_NAME_MSG = "must match one of the container's resource requests"


def _allowed_names(container: JSON) -> tuple[set[str], set[str]]:
    """The ``claim:`` names and the other names a container's status may report."""
    resources = _dict(container.get("resources"))
    claim_names: set[str] = set()
    for ref in _list(resources.get("claims")):
        name, request = _dict(ref).get("name"), _dict(ref).get("request")
        if isinstance(name, str):
            claim_names.add(f"claim:{name}/{request}" if request else f"claim:{name}")
    return claim_names, {str(k) for k in _dict(resources.get("requests"))}


def _resource_status_causes(entries: list[Any], container: JSON | None, where: str) -> list[JSON]:
    out: list[JSON] = []
    claims, requests = _allowed_names(container) if container is not None else (set(), set())
    for j, rs in enumerate(entries):
        rs = _dict(rs)
        here = f"{where}.allocatedResourcesStatus[{j}]"
        name = rs.get("name")
        if container is not None and isinstance(name, str):  # unknown container: skipped
            if name.startswith("claim:"):
                if name not in claims:
                    out.append(invalid_value(f"{here}.name", name, _CLAIM_NAME_MSG))
            elif name not in requests:
                out.append(invalid_value(f"{here}.name", name, _REQUEST_NAME_MSG))
        seen: set[Any] = set()
        for k, res in enumerate(_list(rs.get("resources"))):
            health = _dict(res).get("health")
            if health is not None and health not in HEALTH_VALUES:
                out.append(unsupported(f"{here}.resources[{k}].health", health, HEALTH_VALUES))
            rid = _dict(res).get("resourceID")
            if isinstance(rid, str) and rid in seen:
                out.append(duplicate(f"{here}.resources[{k}].resourceID", rid))
            seen.add(rid)
    return out


def _pod_causes(obj: JSON, profile: KubeProfile | None) -> list[JSON]:
    out: list[JSON] = []
    spec = _dict(obj.get("spec"))
    status = _dict(obj.get("status"))
    for lst, spec_key in (
        ("containerStatuses", "containers"),
        ("initContainerStatuses", "initContainers"),
    ):
        containers: dict[str, JSON] = {}
        for c in _list(spec.get(spec_key)):
            name = _dict(c).get("name")
            if isinstance(name, str):
                containers.setdefault(name, _dict(c))
        for i, cs in enumerate(_list(status.get(lst))):
            cs = _dict(cs)
            entries = _list(cs.get("allocatedResourcesStatus"))
            name = cs.get("name")
            container = containers.get(name) if isinstance(name, str) else None
            out.extend(_resource_status_causes(entries, container, f"status.{lst}[{i}]"))
    for i, cs in enumerate(_list(status.get("ephemeralContainerStatuses"))):
        if _dict(cs).get("allocatedResourcesStatus") is not None:
            where = f"status.ephemeralContainerStatuses[{i}].allocatedResourcesStatus"
            out.append(forbidden(where, "must not be specified in container status"))
    return out


def _taint_causes(taint: JSON, where: str, effects: tuple[str, ...]) -> list[JSON]:
    out: list[JSON] = []
    key = taint.get("key")
    if not key:
        out.append(required(f"{where}.key"))
    elif isinstance(key, str):
        try:
            validate_label_key(key)
        except SelectorError as e:
            out.append(invalid_value(f"{where}.key", key, str(e)))
    effect = taint.get("effect")
    if not effect:
        out.append(required(f"{where}.effect"))
    elif effect not in effects:
        out.append(unsupported(f"{where}.effect", effect, effects))
    return out


def _effects(profile: KubeProfile | None) -> tuple[str, ...]:
    return TAINT_EFFECTS if profile is None or profile.taint_effect_none else TAINT_EFFECTS_1_34


def _device_taint_rule_causes(obj: JSON, profile: KubeProfile | None) -> list[JSON]:
    taint = _dict(obj.get("spec")).get("taint")
    if not isinstance(taint, dict):
        return [required("spec.taint")]
    return _taint_causes(taint, "spec.taint", _effects(profile))


def _access_review_causes(obj: JSON, profile: KubeProfile | None) -> list[JSON]:
    """Upstream's ``ValidateSelfSubjectAccessReviewSpec``: exactly one kind of attributes."""
    spec = _dict(obj.get("spec"))
    res, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if res is not None and non is not None:
        return [
            invalid_value(
                "spec.nonResourceAttributes",
                non,
                "cannot be specified in combination with resourceAttributes",
            )
        ]
    if res is None and non is None:
        return [
            invalid_value(
                "spec.resourceAttributes",
                None,
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )
        ]
    return []


def _resource_slice_causes(obj: JSON, profile: KubeProfile | None) -> list[JSON]:
    out: list[JSON] = []
    spec = _dict(obj.get("spec"))
    if not spec.get("driver"):
        out.append(required("spec.driver"))
    if not _dict(spec.get("pool")).get("name"):
        out.append(required("spec.pool.name"))
    node_fields = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
    chosen = [f for f in node_fields if spec.get(f) not in (None, False, "")]
    if len(chosen) != 1:
        msg = (
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
            "`perDeviceNodeSelection` is required"
        )
        out.append(cause("FieldValueRequired" if not chosen else "FieldValueInvalid", msg, "spec"))
    devices = _list(spec.get("devices"))
    if len(devices) > MAX_DEVICES_PER_SLICE:
        out.append(
            cause(
                "FieldValueTooMany",
                f"Too many: {len(devices)}: must have at most {MAX_DEVICES_PER_SLICE} items",
                "spec.devices",
            )
        )
    for i, dev in enumerate(devices):
        for j, taint in enumerate(_list(_dict(dev).get("taints"))):
            where = f"spec.devices[{i}].taints[{j}]"
            out.extend(_taint_causes(_dict(taint), where, _effects(profile)))
    return out


def _pdb_causes(obj: JSON, profile: KubeProfile | None) -> list[JSON]:
    spec = _dict(obj.get("spec"))
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        return [invalid_value("spec", spec, "minAvailable and maxUnavailable cannot be both set")]
    out = []
    for f in ("minAvailable", "maxUnavailable"):
        v = spec.get(f)
        if isinstance(v, str) and not re.fullmatch(r"\d+%", v):
            out.append(invalid_value(f"spec.{f}", v, "must be an integer or percentage (e.g 5%)"))
        if isinstance(v, int) and v < 0:
            out.append(invalid_value(f"spec.{f}", v, "must be greater than or equal to 0"))
    return out


_KIND_RULES = {  # (group, kind): the rules hold for every version of the kind
    ("", "Pod"): _pod_causes,
    ("resource.k8s.io", "DeviceTaintRule"): _device_taint_rule_causes,
    ("resource.k8s.io", "ResourceSlice"): _resource_slice_causes,
    ("policy", "PodDisruptionBudget"): _pdb_causes,
    ("authorization.k8s.io", "SelfSubjectAccessReview"): _access_review_causes,
    ("batch", "Job"): job_causes,
}


def object_causes(rt: ResourceType, obj: JSON, profile: KubeProfile | None = None) -> list[JSON]:
    """All validation causes for ``obj`` (an object of kind ``rt``), schema first.

    ``profile`` is the release whose rules apply (None: the newest).
    """
    out = schema_causes(obj, rt.model)
    meta = _dict(obj.get("metadata"))
    name = meta.get("name")
    if isinstance(name, str):
        out.extend(name_causes(rt.kind, name))
    out.extend(_label_causes(meta))
    rule = _KIND_RULES.get((rt.group, rt.kind))
    if rule is not None and not any(c["reason"] == "FieldValueTypeInvalid" for c in out):
        out.extend(rule(obj, profile))
    return out[:MAX_CAUSES]
