"""Validation of objects before they are stored.

Owns the schema check (the object is walked against the lightkube model class of its
kind via ``msgspec.inspect``: unknown fields, wrong types and missing required fields
become ``StatusCause``s naming the field path), object-name and label rules, and the
few cheap kind-specific checks the project relies on (resource health values,
DeviceTaintRule effects per release, ResourceSlice limits, ResourceClaim
``status.devices`` entries (allocated devices only, conditions, data and network data
limits), PDB budgets,
SelfSubjectAccessReview attributes). Returns causes; never raises for invalid input.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import ipaddress
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import msgspec
import msgspec.inspect as mi

from drahealth._cel_k8s import (
    MAX_EXPRESSION_LENGTH,
    CELCompileError,
    CELCostError,
    compile_selector,
)
from drahealth.core import KubeProfile, matches_dns_label, matches_dns_subdomain

from ._batch import job_causes
from ._resources import ResourceType
from ._selectors import (
    SelectorError,
    selector_from_object,
    validate_label_key,
)
from ._status import cause

JSON = dict[str, Any]
MAX_CAUSES = 20

#: The minor release whose rules the validation in progress applies (upstream's wording,
#: field paths and checks changed between releases); :func:`object_causes` sets it from
#: its profile, the newest rules apply outside it.
_RELEASE: ContextVar[int] = ContextVar("validation_release", default=1 << 16)


def _release() -> int:
    return _RELEASE.get()


@contextmanager
def release_rules(profile: KubeProfile | None) -> Iterator[None]:
    """Validate by the rules of ``profile``'s release (None: the newest) within."""
    token = _RELEASE.set(profile.minor if profile is not None else 1 << 16)
    try:
        yield
    finally:
        _RELEASE.reset(token)


def set_duplicate(at: str, key: str, value: Any) -> JSON:
    """A duplicate entry of a list upstream's ``validateSet`` keys by ``key``: at the
    entry (1.35 on), at the entry's key field (1.34)."""
    return duplicate(f"{at}.{key}" if _release() <= 34 else at, value)


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
#: Upstream's ResourceSlice limits (``pkg/apis/resource/types.go``).
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
DEVICE_MAX_DOMAIN_LENGTH = 63
DEVICE_MAX_ID_LENGTH = 32
DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH = 64
DEVICE_TAINTS_MAX = 16
POOL_NAME_MAX = 253
BINDING_CONDITIONS_MAX = 4
MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_COUNTER_CONSUMPTIONS = 2
#: ResourceClaim status limits.
RESERVED_FOR_MAX = 256
ALLOCATION_RESULTS_MAX = 32
_C_IDENTIFIER_MSG = (
    "a valid C identifier must start with alphabetic character or '_', followed by a "
    "string of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or "
    "'MyName', regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')"
)
_SEMVER_RE = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?"
)

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


def required(field: str, detail: str = "") -> JSON:
    return cause(
        "FieldValueRequired", f"Required value: {detail}" if detail else "Required value", field
    )


# --------------------------------------------------------------------------- name formats

_QNAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QNAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
    "an alphanumeric character"
)


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    shown = ",  or ".join(f"'{e}'" for e in examples)
    return f"{msg} (e.g. {shown}, regex used for validation is '{fmt}')"


def qualified_name_errors(value: str) -> list[str]:
    """Upstream's ``IsQualifiedName``: every message (a label key, taint key, condition type)."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend(f"prefix part {m}" for m in subdomain_errors(prefix))
    else:
        return [
            "a qualified name "
            + _regex_error(_QNAME_MSG, _QNAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if not re.fullmatch(_QNAME_FMT, name):
        errs.append(
            "name part " + _regex_error(_QNAME_MSG, _QNAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errs


def label_value_errors(value: str) -> list[str]:
    """Upstream's ``IsValidLabelValue``."""
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if value and not re.fullmatch(_QNAME_FMT, value):
        errs.append(
            _regex_error(
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character",
                f"({_QNAME_FMT})?", "MyValue", "my_value", "12345",
            )
        )  # fmt: skip
    return errs


def subdomain_errors(value: str) -> list[str]:
    """Upstream's ``IsDNS1123Subdomain``."""
    errs = []
    if len(value) > 253:
        errs.append("must be no more than 253 characters")
    if not matches_dns_subdomain(value):
        errs.append(_SUBDOMAIN_MSG)
    return errs


def label_name_causes(value: str, field: str) -> list[JSON]:
    """Upstream's ``ValidateLabelName``: one cause per message."""
    return [invalid_value(field, value, m) for m in qualified_name_errors(value)]


def label_value_causes(value: str, field: str) -> list[JSON]:
    return [invalid_value(field, value, m) for m in label_value_errors(value)]


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
            if "RawExtension" in notes.get(f.name, ""):
                continue  # any JSON decodes; the kind's rules judge it
            values = _MAP_VALUES.get((t.cls.__name__, f.name))
            if values is not None and isinstance(sub, dict):
                for k, item in sub.items():
                    _check_map_value(item, values, f"{_join(path, key)}[{k}]", out)
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
    elif quantity and isinstance(value, str) and not _QUANTITY_RE.fullmatch(value):
        out.append(
            cause(
                "FieldValueTypeInvalid",
                f"Invalid value: {_show(value)}: quantities must match the regular expression "
                f"'{_QUANTITY_RE.pattern}'",
                path,
            )
        )


_QUANTITY_RE = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?")


#: Maps the models leave untyped (``dict``), and the fields of their values: the value's
#: type (``quantity`` for a resource quantity), lists as ``[type]``.
_MAP_VALUES: dict[tuple[str, str], dict[str, Any]] = {
    ("Device", "attributes"): {
        "bool": bool, "int": int, "string": str, "version": str,
        "bools": [bool], "ints": [int], "strings": [str], "versions": [str],
    },
    ("Device", "capacity"): {"value": "quantity", "requestPolicy": dict},
    ("CounterSet", "counters"): {"value": "quantity"},
    ("DeviceCounterConsumption", "counters"): {"value": "quantity"},
}  # fmt: skip
_PLAIN = {
    bool: mi.BoolType(),
    int: mi.IntType(),
    str: mi.StrType(),
    dict: mi.DictType(mi.AnyType(), mi.AnyType()),
}


def _check_map_value(item: Any, fields: dict[str, Any], path: str, out: list[JSON]) -> None:
    if not isinstance(item, dict):
        out.append(
            cause(
                "FieldValueTypeInvalid",
                f"Invalid value: {_show(item)}: must be of type object",
                path,
            )
        )
        return
    for key, value in item.items():
        want, here = fields.get(key), f"{path}.{key}"
        if want is None:
            out.append(cause("FieldValueInvalid", f'unknown field "{here}"', here))
        elif value is None:
            continue
        elif want == "quantity":
            _check(value, mi.StrType(), here, True, out)
        elif isinstance(want, list):
            _check(value, mi.ListType(_PLAIN[want[0]]), here, False, out)
        else:
            _check(value, _PLAIN[want], here, False, out)


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


def _is_time(t: mi.Type) -> bool:
    if isinstance(t, mi.UnionType):
        return any(isinstance(x, mi.DateTimeType) for x in t.types)
    return isinstance(t, mi.DateTimeType)


def canonical_time(value: str, micro: bool) -> str:
    """``value`` as the real server encodes a ``metav1.Time`` (UTC, to the second: a
    fraction is dropped) or, with ``micro``, a ``metav1.MicroTime`` (UTC, six fraction
    digits). A value that is not an RFC 3339 date-time with an offset is returned as
    it is, for validation to judge."""
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        return value
    if when.tzinfo is None:
        return value
    when = when.astimezone(dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


#: Per model class: its fields that hold a time (encode name -> MicroTime or not) and
#: those that hold something with a time somewhere below (encode name -> type).
_TimeFields = tuple[dict[str, bool], dict[str, mi.Type]]
_time_fields_cache: dict[type, _TimeFields] = {}


def _holds_time(t: mi.Type) -> bool:
    if isinstance(t, mi.UnionType):
        return any(_holds_time(x) for x in t.types)
    if isinstance(t, mi.ListType):
        return _holds_time(t.item_type)
    if isinstance(t, mi.DictType):
        return _holds_time(t.value_type)
    if isinstance(t, mi.StructType):
        times, nested = _time_fields(t)
        return bool(times or nested)
    return isinstance(t, mi.DateTimeType)


def _time_fields(t: mi.StructType) -> _TimeFields:
    cached = _time_fields_cache.get(t.cls)
    if cached is not None:
        return cached
    times: dict[str, bool] = {}
    nested: dict[str, mi.Type] = {}
    # while it is worked out, a type that holds itself (none with a time) reads as empty
    _time_fields_cache[t.cls] = (times, nested)
    notes = _annotations(t.cls)
    for f in t.fields:
        if _is_time(f.type):
            times[f.encode_name] = "MicroTime" in notes.get(f.name, "")
        elif _holds_time(f.type):
            nested[f.encode_name] = f.type
    return times, nested


def _times(value: Any, t: mi.Type) -> None:
    if isinstance(t, mi.UnionType):
        for x in t.types:
            inner = isinstance(x, mi.StructType | mi.ListType | mi.DictType)
            if inner and _accepts(value, x, True):
                _times(value, x)
                return
        return
    if isinstance(t, mi.StructType) and isinstance(value, dict):
        times, nested = _time_fields(t)
        for key, sub in value.items():
            if key in times:
                if isinstance(sub, str):
                    value[key] = canonical_time(sub, times[key])
            elif key in nested and sub is not None:
                _times(sub, nested[key])
    elif isinstance(t, mi.ListType) and isinstance(value, list):
        for item in value:
            _times(item, t.item_type)
    elif isinstance(t, mi.DictType) and isinstance(value, dict):
        for item in value.values():
            _times(item, t.value_type)


def canonical_times(obj: JSON, model: type[msgspec.Struct]) -> None:
    """Re-encode (in place) every date-time field of ``obj`` as the real server's
    encoder writes it (:func:`canonical_time`): it decodes a ``2026-01-02T03:04:05+00:00``
    or a ``...05.5Z`` and answers ``2026-01-02T03:04:05Z``."""
    t = _type_cache.get(model)
    if t is None:
        t = _type_cache[model] = mi.type_info(model)
    _times(obj, t)


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


def _label_causes(meta: JSON, prefix: str = "metadata.") -> list[JSON]:
    """Upstream's ``ValidateLabels`` and ``ValidateAnnotations``: causes at the map's path."""
    out: list[JSON] = []
    labels = meta.get("labels")
    if isinstance(labels, dict):
        for k, v in labels.items():
            out.extend(label_name_causes(str(k), f"{prefix}labels"))
            if isinstance(v, str):
                out.extend(label_value_causes(v, f"{prefix}labels"))
    annotations = meta.get("annotations")
    if isinstance(annotations, dict):
        for k in annotations:
            for m in qualified_name_errors(str(k).lower()):
                out.append(invalid_value(f"{prefix}annotations", k, m))
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


# --------------------------------------------------------------------------- pods

#: Upstream's list of what a pod update may change (``ValidatePodUpdate``).
POD_UPDATABLE_FIELDS = (
    "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
    "`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously "
    "negative)"
)
_CONTAINER_LISTS = ("initContainers", "containers")


def _pod_claim_causes(spec: JSON, pod_name: Any) -> list[JSON]:
    """Upstream's ``validatePodResourceClaims`` and the containers' ``resources.claims``."""
    out: list[JSON] = []
    names: set[str] = set()
    for i, claim in enumerate(_list(spec.get("resourceClaims"))):
        claim, here = _dict(claim), f"spec.resourceClaims[{i}]"
        name = claim.get("name")
        if not name:
            out.append(required(f"{here}.name"))
        elif name in names:
            out.append(duplicate(f"{here}.name", name))
        elif isinstance(name, str):
            out.extend(dns_label_causes(name, f"{here}.name"))
            names.add(name)
        by_name, by_template = (
            claim.get("resourceClaimName"),
            claim.get("resourceClaimTemplateName"),
        )
        if by_name is not None and by_template is not None:
            out.append(
                invalid_value(
                    here,
                    claim,
                    "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be "
                    "specified",
                )
            )
        elif by_name is None and by_template is None:
            out.append(
                invalid_value(
                    here,
                    claim,
                    "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`",
                )
            )
        for key, value in (
            ("resourceClaimName", by_name),
            ("resourceClaimTemplateName", by_template),
        ):
            if isinstance(value, str):
                out.extend(_subdomain_causes(value, f"{here}.{key}"))
    for lst in _CONTAINER_LISTS:
        for c_i, container in enumerate(_list(spec.get(lst))):
            refs = _list(_dict(_dict(container).get("resources")).get("claims"))
            where = f"spec.{lst}[{c_i}].resources.claims"
            out.extend(_container_claim_causes(refs, names, where))
    return out


def _container_claim_causes(refs: list[Any], names: set[str], where: str) -> list[JSON]:
    """Upstream's ``validateResourceClaimNames`` for one container."""
    out: list[JSON] = []
    seen: set[str] = set()
    for i, ref in enumerate(refs):
        ref, here = _dict(ref), f"{where}[{i}]"
        name, request = ref.get("name"), ref.get("request")
        if not name:
            out.append(required(here))
            continue
        key = str(name)
        if request:
            out.extend(dns_label_causes(str(request), f"{here}.request"))
            key += f"/{request}"
        if key in seen:
            out.append(duplicate(here, key))
        seen.add(key)
        if name not in names:
            detail = "must be one of the names in pod.spec.resourceClaims"
            detail += ": " + ", ".join(sorted(names)) if names else " which is empty"
            out.append(not_found(here, name, detail))
    return out


def _without_images(containers: Any, old: Any) -> Any:
    """``containers`` with each image replaced by the old one of the same index."""
    if not isinstance(containers, list) or not isinstance(old, list):
        return containers
    out = []
    for i, c in enumerate(containers):
        if isinstance(c, dict) and i < len(old) and isinstance(old[i], dict):
            c = {k: v for k, v in c.items() if k != "image"}
            if "image" in old[i]:
                c["image"] = old[i]["image"]
        out.append(c)
    return out


def _pod_update_causes(spec: JSON, old_spec: JSON) -> list[JSON]:
    """Upstream's ``ValidatePodUpdate``: only the listed fields may change.

    One simplification: setting ``spec.nodeName`` on a pod that has none is allowed,
    because the embedded scheduler binds pods that way (the real one uses the
    ``binding`` subresource); changing or clearing it is refused as upstream refuses it.
    """
    if spec == old_spec:
        return []
    out: list[JSON] = []
    for lst in _CONTAINER_LISTS:
        new_c, old_c = _list(spec.get(lst)), _list(old_spec.get(lst))
        if len(new_c) != len(old_c):
            out.append(forbidden(f"spec.{lst}", "pod updates may not add or remove containers"))
            return out
        for i, c in enumerate(new_c):
            if _dict(c).get("image") in (None, "") and _dict(old_c[i]).get("image"):
                out.append(required(f"spec.{lst}[{i}].image"))
    old_tol, new_tol = _list(old_spec.get("tolerations")), _list(spec.get("tolerations"))
    if any(t not in new_tol for t in old_tol):
        out.append(
            forbidden(
                "spec.tolerations",
                "existing toleration can not be modified except its tolerationSeconds",
            )
        )
    old_gates = _list(old_spec.get("schedulingGates"))
    if any(g not in old_gates for g in _list(spec.get("schedulingGates"))):
        out.append(
            forbidden(
                "spec.schedulingGates", "only deletion is allowed, but found new scheduling gate"
            )
        )
    munged = dict(spec)
    for lst in _CONTAINER_LISTS:
        if lst in munged or lst in old_spec:
            munged[lst] = _without_images(spec.get(lst), old_spec.get(lst))
    for key in ("activeDeadlineSeconds", "tolerations", "schedulingGates"):
        munged.pop(key, None)
        if key in old_spec:
            munged[key] = old_spec[key]
    grace, old_grace = (
        spec.get("terminationGracePeriodSeconds"),
        old_spec.get("terminationGracePeriodSeconds"),
    )
    if grace == 1 and isinstance(old_grace, int) and old_grace < 0:
        munged["terminationGracePeriodSeconds"] = old_grace
    if not old_spec.get("nodeName") and spec.get("nodeName"):
        munged.pop("nodeName", None)
        if "nodeName" in old_spec:
            munged["nodeName"] = old_spec["nodeName"]
    if munged != old_spec and not out:
        changed = sorted(k for k in set(munged) | set(old_spec) if munged.get(k) != old_spec.get(k))
        diff = "\n".join(
            f"  spec.{k}: {_show(old_spec.get(k))} -> {_show(munged.get(k))}" for k in changed[:8]
        )
        out.append(
            forbidden(
                "spec",
                f"pod updates may not change fields other than {POD_UPDATABLE_FIELDS}\n{diff}",
            )
        )
    return out


def _pod_spec_causes(obj: JSON, ctx: _Context) -> list[JSON]:
    spec = _dict(obj.get("spec"))
    out = _pod_claim_causes(spec, _dict(obj.get("metadata")).get("name"))
    if ctx.old is not None:
        out.extend(_pod_update_causes(spec, _dict(ctx.old.get("spec"))))
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


def _taint_causes(
    taint: JSON, where: str, effects: tuple[str, ...], old: JSON | None = None
) -> list[JSON]:
    """Upstream's ``validateDeviceTaint``: the key (also when empty), the value, and the
    effect (only when it changed, on update)."""
    out = label_name_causes(str(taint.get("key") or ""), f"{where}.key")
    value = taint.get("value")
    if isinstance(value, str) and value:
        out.extend(label_value_causes(value, f"{where}.value"))
    effect = taint.get("effect") or ""
    if old is None or old.get("effect") != effect:
        if not effect:
            out.append(required(f"{where}.effect"))
        elif effect not in effects:
            out.append(unsupported(f"{where}.effect", effect, effects))
    return out


def _effects(profile: KubeProfile | None) -> tuple[str, ...]:
    return TAINT_EFFECTS if profile is None or profile.taint_effect_none else TAINT_EFFECTS_1_34


def _device_taint_rule_causes(obj: JSON, ctx: _Context) -> list[JSON]:
    """Upstream's ``validateDeviceTaintRuleSpec``: the selector's driver, pool and device
    names (and, for the 1.34 rule, its class name and CEL selectors), the taint; and, on
    a status write, ``ValidateConditions`` and at most 8 conditions."""
    spec = _dict(obj.get("spec"))
    sel, where = _dict(spec.get("deviceSelector")), "spec.deviceSelector"
    out: list[JSON] = []
    if sel.get("driver") is not None:
        out.extend(_driver_name_causes(sel["driver"], f"{where}.driver"))
    if sel.get("pool") is not None:
        out.extend(_pool_name_causes(sel["pool"], f"{where}.pool"))
    device = sel.get("device")
    if isinstance(device, str):
        out.extend(dns_label_causes(device, f"{where}.device"))
    if isinstance(sel.get("deviceClassName"), str):
        out.extend(_subdomain_causes(sel["deviceClassName"], f"{where}.deviceClassName"))
    if sel.get("selectors") is not None:
        out.extend(_selector_causes(sel["selectors"], f"{where}.selectors"))
    old_spec = _dict(_dict(ctx.old).get("spec")) if ctx.old is not None else None
    old_taint = _dict(old_spec.get("taint")) if old_spec is not None else None
    out.extend(
        _taint_causes(_dict(spec.get("taint")), "spec.taint", _effects(ctx.profile), old_taint)
    )
    conditions = _list(_dict(obj.get("status")).get("conditions"))
    old_conditions = _list(_dict(_dict(ctx.old).get("status")).get("conditions"))
    if conditions != old_conditions:
        out.extend(_condition_causes(conditions, "status.conditions"))
        if len(conditions) > DEVICE_STATUS_MAX_CONDITIONS:
            out.append(too_many("status.conditions", len(conditions), DEVICE_STATUS_MAX_CONDITIONS))
    return out


def _access_review_causes(obj: JSON, profile: KubeProfile | None) -> list[JSON]:
    """Upstream's ``ValidateSelfSubjectAccessReviewSpec``: exactly one kind of attributes
    (before 1.37 reported at the attribute missing or in excess)."""
    spec = _dict(obj.get("spec"))
    res, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if _release() <= 36 and res is not None and non is not None:
        return [
            invalid_value(
                "spec.nonResourceAttributes", non,
                "cannot be specified in combination with resourceAttributes",
            )
        ]  # fmt: skip
    if _release() <= 36 and res is None and non is None:
        return [
            invalid_value(
                "spec.resourceAttributes", None,
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )
        ]  # fmt: skip
    if (res is None) == (non is None):
        return [
            invalid_value(
                "spec", non,
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )
        ]  # fmt: skip
    return []


def _pool_name_causes(value: Any, field: str) -> list[JSON]:
    """Upstream's ``validatePoolName``: DNS subdomains joined by '/', at most 253 bytes."""
    if not value:
        return [required(field)]
    if not isinstance(value, str):
        return []
    out = [too_long(field, POOL_NAME_MAX)] if len(value) > POOL_NAME_MAX else []
    for part in value.split("/")[:8]:  # the causes of the first few parts
        out.extend(invalid_value(field, part, m) for m in subdomain_errors(part))
    return out


def _node_name_causes(value: Any, field: str) -> list[JSON]:
    """Upstream's ``ValidateNodeName`` (a DNS subdomain), every message."""
    if not isinstance(value, str):
        return []
    return [invalid_value(field, value, m) for m in subdomain_errors(value)]


def _c_identifier_causes(ident: str, field: str) -> list[JSON]:
    out = [too_long(field, DEVICE_MAX_ID_LENGTH)] if len(ident) > DEVICE_MAX_ID_LENGTH else []
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ident):
        out.append(invalid_value(field, ident, _C_IDENTIFIER_MSG))
    return out


def _attribute_name_causes(name: str, field: str) -> list[JSON]:
    """Upstream's ``validateQualifiedName``: a C identifier, optionally after a domain
    (a name with more than one slash is not checked, as upstream does not check it).
    1.34 reports an empty name, domain or identifier as required."""
    old = _release() <= 34
    if old and not name:
        return [required(field, "name required")]
    parts = name.split("/")
    if len(parts) == 1:
        return _c_identifier_causes(name, field)
    if len(parts) > 2:
        return []
    out: list[JSON] = []
    domain, ident = parts
    if not domain:
        detail = "the domain must not be empty"
        out.append(required(field, detail) if old else invalid_value(field, "", detail))
    else:
        out.extend(_driver_name_causes(domain, field))
    if not ident:
        detail = "the name must not be empty"
        out.append(required(field, detail) if old else invalid_value(field, "", detail))
    else:
        out.extend(_c_identifier_causes(ident, field))
    return out


def _map_key_field(where: str, key: str, limit: int) -> str:
    """Where upstream's ``validateMap`` reports a key's own causes: at the map (1.36 on),
    at the (truncated) key's path before."""
    return _key_path(where, key, limit) if _release() <= 35 else where


#: Upstream's ``attributeAndCapacityMaxKeyLength``: where a key is shortened in a path.
_QUALIFIED_KEY = DEVICE_MAX_DOMAIN_LENGTH + 1 + DEVICE_MAX_ID_LENGTH


def _key_path(where: str, key: str, limit: int = _QUALIFIED_KEY) -> str:
    """``where[key]``, the key shortened in the middle as upstream's ``truncateIfTooLong``."""
    limit = max(limit, 16)
    if len(key) > limit:
        rest = limit - 3
        key = key[: (rest + 1) // 2] + "..." + key[len(key) - rest // 2 :]
    return f"{where}[{key}]"


def _attribute_causes(attrs: JSON, where: str) -> list[JSON]:
    """Upstream's ``validateMap`` of attributes: name causes at the map's path, value
    causes at the (truncated) key's."""
    out: list[JSON] = []
    for name, attr in attrs.items():
        here = _key_path(where, str(name))
        out.extend(
            _attribute_name_causes(str(name), _map_key_field(where, str(name), _QUALIFIED_KEY))
        )
        attr = _dict(attr)
        for k in ("string", "version"):
            value = attr.get(k)
            if not isinstance(value, str):
                continue
            if len(value.encode()) > DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH:
                out.append(too_long(f"{here}.{k}", DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH))
            elif k == "version" and not _SEMVER_RE.fullmatch(value):
                out.append(
                    invalid_value(
                        f"{here}.version", value,
                        "must be a string compatible with semver.org spec 2.0.0",
                    )
                )  # fmt: skip
        for k in ("bools", "ints", "strings", "versions"):
            if attr.get(k) is not None and not _list(attr.get(k)):
                out.append(
                    invalid_value(f"{here}.{k}", attr.get(k), "must not be empty if specified")
                )
        kinds = [k for k in _ATTRIBUTE_KINDS if attr.get(k) is not None]
        if not kinds and _release() <= 34:
            out.append(required(here, "exactly one value must be specified"))
        elif len(kinds) != 1:
            out.append(
                invalid_value(
                    here, "" if not kinds else attr, "exactly one value must be specified"
                )
            )
    return out


_ATTRIBUTE_KINDS = ("bool", "int", "string", "version", "bools", "ints", "strings", "versions")


def _binding_causes(dev: JSON, where: str) -> list[JSON]:
    """Upstream's ``validateDeviceBindingParameters``."""
    out: list[JSON] = []
    conds, fails = _list(dev.get("bindingConditions")), _list(dev.get("bindingFailureConditions"))
    for key, items in (("bindingConditions", conds), ("bindingFailureConditions", fails)):
        if len(items) > BINDING_CONDITIONS_MAX:
            out.append(too_many(f"{where}.{key}", len(items), BINDING_CONDITIONS_MAX))
            continue
        for i, cond in enumerate(items):
            out.extend(label_name_causes(str(cond), f"{where}.{key}[{i}]"))
    seen: set[Any] = set()
    for i, cond in enumerate(conds):
        if cond in seen:
            out.append(duplicate(f"{where}.bindingConditions[{i}]", cond))
        seen.add(cond)
    seen_fail: set[Any] = set()
    for i, cond in enumerate(fails):
        if cond in seen_fail:
            out.append(duplicate(f"{where}.bindingFailureConditions[{i}]", cond))
        seen_fail.add(cond)
        if cond in conds:
            out.append(
                invalid_value(
                    f"{where}.bindingFailureConditions[{i}]", cond,
                    "bindingFailureConditions must not overlap with bindingConditions",
                )
            )  # fmt: skip
    if not conds and fails:
        out.append(
            invalid_value(
                f"{where}.bindingConditions", conds,
                "bindingConditions are required to use bindingFailureConditions",
            )
        )  # fmt: skip
    if not fails and conds:
        out.append(
            invalid_value(
                f"{where}.bindingFailureConditions", fails,
                "bindingFailureConditions are required to use bindingConditions",
            )
        )  # fmt: skip
    return out


def _counters_causes(counters: Any, where: str) -> list[JSON]:
    """A non-empty map of at most 32 counters, names DNS labels (causes at the map)."""
    items = _dict(counters)
    if not items:
        return [required(where)]
    if len(items) > MAX_COUNTERS:
        return [too_many(where, len(items), MAX_COUNTERS)]
    out: list[JSON] = []
    for name in items:
        out.extend(dns_label_causes(str(name), _map_key_field(where, str(name), 63)))
    return out


def _counter_set_name_causes(name: Any, field: str) -> list[JSON]:
    if not name:
        return [required(field)]
    return dns_label_causes(str(name), field)


def node_selector_causes(sel: Any, where: str) -> list[JSON]:
    """Upstream's ``ValidateNodeSelector`` (label values checked)."""
    terms = _list(_dict(sel).get("nodeSelectorTerms"))
    if not terms:
        return [required(f"{where}.nodeSelectorTerms", "must have at least one node selector term")]
    out: list[JSON] = []
    for i, term in enumerate(terms):
        term, at = _dict(term), f"{where}.nodeSelectorTerms[{i}]"
        for j, req in enumerate(_list(term.get("matchExpressions"))):
            req, here = _dict(req), f"{at}.matchExpressions[{j}]"
            op, values = req.get("operator"), _list(req.get("values"))
            if op in ("In", "NotIn"):
                if not values:
                    out.append(
                        required(
                            f"{here}.values", "must be specified when `operator` is 'In' or 'NotIn'"
                        )
                    )
            elif op in ("Exists", "DoesNotExist"):
                if values:
                    out.append(
                        forbidden(
                            f"{here}.values",
                            "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                        )
                    )
            elif op in ("Gt", "Lt"):
                if len(values) != 1:
                    out.append(
                        required(
                            f"{here}.values",
                            "must be specified single value when `operator` is 'Lt' or 'Gt'",
                        )
                    )
            else:
                out.append(invalid_value(f"{here}.operator", op, "not a valid selector operator"))
            out.extend(label_name_causes(str(req.get("key") or ""), f"{here}.key"))
            for k, v in enumerate(values):
                out.extend(label_value_causes(str(v), f"{here}.values[{k}]"))
        for j, req in enumerate(_list(term.get("matchFields"))):
            req, here = _dict(req), f"{at}.matchFields[{j}]"
            values = _list(req.get("values"))
            if req.get("operator") in ("In", "NotIn"):
                if len(values) != 1:
                    out.append(
                        required(
                            f"{here}.values",
                            "must be only one value when `operator` is 'In' or 'NotIn' for node "
                            "field selector",
                        )
                    )
            else:
                out.append(
                    invalid_value(
                        f"{here}.operator", req.get("operator"), "not a valid selector operator"
                    )
                )
            if req.get("key") != "metadata.name":
                out.append(
                    invalid_value(f"{here}.key", req.get("key"), "not a valid field selector key")
                )
            else:
                for k, v in enumerate(values):
                    out.extend(_node_name_causes(str(v), f"{here}.values[{k}]"))
    return out


def _device_node_causes(dev: JSON, where: str, per_device: bool) -> list[JSON]:
    out: list[JSON] = []
    if not per_device:
        if any(dev.get(f) is not None for f in ("nodeName", "nodeSelector", "allNodes")):
            out.append(
                invalid_value(
                    where, None,
                    "`nodeName`, `nodeSelector` and `allNodes` can only be set if "
                    "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
                )
            )  # fmt: skip
        return out
    chosen: list[str] = []
    if dev.get("nodeName") is not None:
        if dev["nodeName"]:
            chosen.append("`nodeName`")
            out.extend(_node_name_causes(dev["nodeName"], f"{where}.nodeName"))
        else:
            out.append(invalid_value(f"{where}.nodeName", dev["nodeName"], "must not be empty"))
    if dev.get("nodeSelector") is not None:
        chosen.append("`nodeSelector`")
        out.extend(node_selector_causes(dev["nodeSelector"], f"{where}.nodeSelector"))
    if dev.get("allNodes") is not None:
        if dev["allNodes"] is True:
            chosen.append("`allNodes`")
        else:
            out.append(
                invalid_value(
                    f"{where}.allNodes", dev["allNodes"], "must be either unset or set to true"
                )
            )
    msg = (
        "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
        "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
    )
    if not chosen:
        out.append(required(where, msg))
    elif len(chosen) > 1:
        out.append(invalid_value(where, "{" + ", ".join(chosen) + "}", msg))
    return out


def _device_causes(dev: JSON, where: str, per_device: bool, effects: tuple[str, ...]) -> list[JSON]:
    """Upstream's ``validateDevice``."""
    name = dev.get("name")
    out = dns_label_causes(name if isinstance(name, str) else "", f"{where}.name")
    attrs, caps = _dict(dev.get("attributes")), _dict(dev.get("capacity"))
    if len(attrs) + len(caps) > MAX_ATTRIBUTES_AND_CAPACITIES:
        out.append(
            invalid_value(
                where, len(attrs) + len(caps),
                "the total number of attributes and capacities must not exceed "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES}",
            )
        )  # fmt: skip
    out.extend(_attribute_causes(attrs, f"{where}.attributes"))
    for cap in caps:
        at = _map_key_field(f"{where}.capacity", str(cap), _QUALIFIED_KEY)
        out.extend(_attribute_name_causes(str(cap), at))
    taints = _list(dev.get("taints"))
    if len(taints) > DEVICE_TAINTS_MAX:
        out.append(too_many(f"{where}.taints", len(taints), DEVICE_TAINTS_MAX))
    else:
        for j, taint in enumerate(taints):
            out.extend(_taint_causes(_dict(taint), f"{where}.taints[{j}]", effects))
    consumes = _list(dev.get("consumesCounters"))
    if len(consumes) > MAX_COUNTER_CONSUMPTIONS:
        out.append(too_many(f"{where}.consumesCounters", len(consumes), MAX_COUNTER_CONSUMPTIONS))
    else:
        seen: set[Any] = set()
        for j, c in enumerate(consumes):
            c, here = _dict(c), f"{where}.consumesCounters[{j}]"
            out.extend(_counter_set_name_causes(c.get("counterSet"), f"{here}.counterSet"))
            out.extend(_counters_causes(c.get("counters"), f"{here}.counters"))
            if c.get("counterSet") in seen:
                out.append(set_duplicate(here, "counterSet", c.get("counterSet")))
            seen.add(c.get("counterSet"))
    out.extend(_device_node_causes(dev, where, per_device))
    out.extend(_binding_causes(dev, where))
    return out


def _resource_slice_causes(obj: JSON, ctx: _Context) -> list[JSON]:
    """Upstream's ``validateResourceSliceSpec``: names, pool, node selection, devices
    (names, attributes, capacities, taints, counters, binding conditions), counters; on
    update the driver, pool name and node name are immutable."""
    spec = _dict(obj.get("spec"))
    out = _driver_name_causes(spec.get("driver"), "spec.driver")
    pool = _dict(spec.get("pool"))
    out.extend(_pool_name_causes(pool.get("name"), "spec.pool.name"))
    count, gen = pool.get("resourceSliceCount") or 0, pool.get("generation") or 0
    if isinstance(count, int) and count <= 0:
        out.append(
            invalid_value("spec.pool.resourceSliceCount", count, "must be greater than zero")
        )
    if isinstance(gen, int) and gen < 0:
        out.append(
            invalid_value("spec.pool.generation", gen, "must be greater than or equal to zero")
        )
    if ctx.old is not None:
        old = _dict(ctx.old.get("spec"))
        for key, value, before in (
            ("pool.name", pool.get("name"), _dict(old.get("pool")).get("name")),
            ("driver", spec.get("driver"), old.get("driver")),
            ("nodeName", spec.get("nodeName"), old.get("nodeName")),
        ):
            if value != before:
                out.append(immutable(f"spec.{key}", value))
    chosen: list[str] = []
    if spec.get("nodeName") is not None:
        if spec["nodeName"]:
            chosen.append("`nodeName`")
            out.extend(_node_name_causes(spec["nodeName"], "spec.nodeName"))
        else:
            out.append(
                invalid_value(
                    "spec.nodeName", "", "must be either unset or set to a non-empty string"
                )
            )
    if spec.get("nodeSelector") is not None:
        chosen.append("`nodeSelector`")
        out.extend(node_selector_causes(spec["nodeSelector"], "spec.nodeSelector"))
        terms = _list(_dict(spec["nodeSelector"]).get("nodeSelectorTerms"))
        if len(terms) != 1:
            out.append(
                invalid_value(
                    "spec.nodeSelector.nodeSelectorTerms", terms,
                    "must have exactly one node selector term",
                )
            )  # fmt: skip
    for key in ("allNodes", "perDeviceNodeSelection"):
        if spec.get(key) is not None:
            if spec[key] is True:
                chosen.append(f"`{key}`")
            else:
                out.append(
                    invalid_value(f"spec.{key}", spec[key], "must be either unset or set to true")
                )
    msg = (
        "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` "
        "is required"
    )
    if not chosen:
        out.append(required("spec", msg))
    elif len(chosen) > 1:
        out.append(
            invalid_value(
                "spec", "{" + ", ".join(chosen) + "}", msg + ", but multiple fields are set"
            )
        )
    devices = _list(spec.get("devices"))
    if spec.get("sharedCounters") is not None and spec.get("devices") is not None:
        out.append(
            invalid_value("spec", "", "only one of `sharedCounters` or `devices` is allowed")
        )
    limit = MAX_DEVICES_PER_SLICE
    advanced = any(_dict(d).get("taints") or _dict(d).get("consumesCounters") for d in devices)
    if advanced and _release() >= 35:  # the lower limit exists from 1.35 on
        limit = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
    if len(devices) > limit:
        out.append(too_many("spec.devices", len(devices), limit))
    else:
        seen: set[Any] = set()
        per_device = spec.get("perDeviceNodeSelection") is True
        effects = _effects(ctx.profile)
        for i, dev in enumerate(devices):
            dev, where = _dict(dev), f"spec.devices[{i}]"
            out.extend(_device_causes(dev, where, per_device, effects))
            if len(out) >= MAX_CAUSES:
                return out
        for i, dev in enumerate(devices):
            if _dict(dev).get("name") in seen:
                out.append(set_duplicate(f"spec.devices[{i}]", "name", _dict(dev).get("name")))
            seen.add(_dict(dev).get("name"))
    counter_sets = _list(spec.get("sharedCounters"))
    if len(counter_sets) > MAX_COUNTER_SETS:
        out.append(too_many("spec.sharedCounters", len(counter_sets), MAX_COUNTER_SETS))
        return out
    names: set[Any] = set()
    for i, cs in enumerate(counter_sets):
        cs, where = _dict(cs), f"spec.sharedCounters[{i}]"
        out.extend(_counter_set_name_causes(cs.get("name"), f"{where}.name"))
        out.extend(_counters_causes(cs.get("counters"), f"{where}.counters"))
    for i, cs in enumerate(counter_sets):
        name = _dict(cs).get("name")
        if name in names:
            out.append(set_duplicate(f"spec.sharedCounters[{i}]", "name", name))
        names.add(name)
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


@dataclass(frozen=True, slots=True)
class _Context:
    """What a rule may consult besides the object: the release, the stored object (on
    update) and the object's namespace (for namespaced kinds)."""

    profile: KubeProfile | None
    old: JSON | None
    namespace: JSON | None


# --------------------------------------------------------------------------- DRA claims

#: Upstream's size limits for a device claim (``pkg/apis/resource/types.go``).
DEVICE_REQUESTS_MAX = 32
DEVICE_SELECTORS_MAX = 32
DEVICE_CONSTRAINTS_MAX = 32
DEVICE_CONFIG_MAX = 32
FIRST_AVAILABLE_MAX = 8
DEVICE_TOLERATIONS_MAX = 16
OPAQUE_PARAMETERS_MAX_BYTES = 10 * 1024
DRIVER_NAME_MAX = 63
ALLOCATION_MODES = ("All", "ExactCount")
TOLERATION_OPERATORS = ("Equal", "Exists")
CONFIG_SOURCES = ("FromClaim", "FromClass")
#: The namespace label that allows admin access to devices.
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
_REQUEST_REF_MSG = (
    "must be the name of a request in the claim or the name of a request and a subrequest "
    "separated by '/'"
)


def too_many(field: str, n: int, limit: int) -> JSON:
    return cause("FieldValueTooMany", f"Too many: {n}: must have at most {limit} items", field)


def too_long(field: str, limit: int) -> JSON:
    return cause("FieldValueTooLong", f"Too long: must have at most {limit} bytes", field)


def not_found(field: str, value: Any, detail: str) -> JSON:
    return cause("FieldValueNotFound", f"Not found: {_show(value)}: {detail}", field)


def dns_label_causes(value: str, field: str) -> list[JSON]:
    """Upstream's ``ValidateDNS1123Label`` (request names, pod claim names, device names)."""
    out = []
    if len(value) > 63:
        out.append(invalid_value(field, value, "must be no more than 63 characters"))
    if not matches_dns_label(value):
        out.append(invalid_value(field, value, _LABEL_MSG))
    return out


def _subdomain_causes(value: str, field: str) -> list[JSON]:
    if len(value) > 253:
        return [invalid_value(field, value, "must be no more than 253 characters")]
    if not matches_dns_subdomain(value):
        return [invalid_value(field, value, _SUBDOMAIN_MSG)]
    return []


def _driver_name_causes(value: Any, field: str) -> list[JSON]:
    """Upstream's ``ValidateCSIDriverName``, which DRA driver names reuse (1.34: an
    empty name is also an invalid subdomain)."""
    if not value:
        if _release() <= 34 and value in ("", None):
            return [required(field), invalid_value(field, "", _SUBDOMAIN_MSG)]
        return [required(field)]
    if not isinstance(value, str):
        return []
    out = []
    if len(value) > DRIVER_NAME_MAX:
        out.append(too_long(field, DRIVER_NAME_MAX))
    if not matches_dns_subdomain(value.lower()):
        out.append(invalid_value(field, value, _SUBDOMAIN_MSG))
    return out


def _selector_causes(selectors: Any, where: str) -> list[JSON]:
    items = _list(selectors)
    if len(items) > DEVICE_SELECTORS_MAX:
        return [too_many(where, len(items), DEVICE_SELECTORS_MAX)]
    out: list[JSON] = []
    for j, sel in enumerate(items):
        cel = _dict(sel).get("cel")
        if not isinstance(cel, dict):
            out.append(required(f"{where}[{j}].cel"))
            continue
        expression = cel.get("expression")
        field = f"{where}[{j}].cel.expression"
        if not isinstance(expression, str):
            expression = ""
        if len(expression.encode()) > MAX_EXPRESSION_LENGTH:
            out.append(too_long(field, MAX_EXPRESSION_LENGTH))
            continue
        try:
            compile_selector(expression)
        except CELCostError:
            out.append(forbidden(field, "too complex, exceeds cost limit"))
        except CELCompileError as e:
            out.append(invalid_value(field, expression, str(e)))
    return out


def _toleration_causes(tolerations: Any, where: str) -> list[JSON]:
    out: list[JSON] = []
    for k, tol in enumerate(_list(tolerations)):  # upstream bounds no count here
        tol, here = _dict(tol), f"{where}[{k}]"
        key = tol.get("key")
        if isinstance(key, str) and key:
            out.extend(label_name_causes(key, f"{here}.key"))
        op, value = tol.get("operator") or "Equal", tol.get("value") or ""
        if op == "Exists":
            if value:
                out.append(
                    invalid_value(f"{here}.value", value, "must be empty for operator `Exists`")
                )
        elif op == "Equal":
            out.extend(label_value_causes(str(value), f"{here}.value"))
        else:
            out.append(unsupported(f"{here}.operator", op, TOLERATION_OPERATORS))
        effect = tol.get("effect")
        if effect and effect not in TAINT_EFFECTS:
            out.append(unsupported(f"{here}.effect", effect, TAINT_EFFECTS))
    return out


def _allocation_mode_causes(req: JSON, where: str) -> list[JSON]:
    """Upstream's ``validateDeviceAllocationMode`` (after v1 defaulting: mode ExactCount,
    count 1 when unset or 0)."""
    mode = req.get("allocationMode") or "ExactCount"
    count = req.get("count")
    if mode == "All":
        if count not in (None, 0):
            return [
                invalid_value(
                    f"{where}.count", count, "must not be specified when allocationMode is 'All'"
                )
            ]
        return []
    if mode == "ExactCount":
        if isinstance(count, int) and count < 0:
            return [invalid_value(f"{where}.count", count, "must be greater than zero")]
        return []
    return [unsupported(f"{where}.allocationMode", mode, ALLOCATION_MODES)]


def _device_class_ref_causes(name: Any, field: str) -> list[JSON]:
    if not name:
        return [required(field)]
    return _subdomain_causes(name, field) if isinstance(name, str) else []


def _exact_causes(req: JSON, where: str) -> list[JSON]:
    out = _device_class_ref_causes(req.get("deviceClassName"), f"{where}.deviceClassName")
    out.extend(_selector_causes(req.get("selectors"), f"{where}.selectors"))
    out.extend(_allocation_mode_causes(req, where))
    out.extend(_toleration_causes(req.get("tolerations"), f"{where}.tolerations"))
    return out


def _request_causes(req: JSON, where: str) -> list[JSON]:
    name = req.get("name")
    out = dns_label_causes(name if isinstance(name, str) else "", f"{where}.name")
    exactly, first = req.get("exactly"), _list(req.get("firstAvailable"))
    if exactly is None and not first:
        out.append(required(where, "exactly one of `exactly` or `firstAvailable` is required"))
    elif exactly is not None and first:
        out.append(
            invalid_value(
                where,
                None,
                "exactly one of `exactly` or `firstAvailable` is required, but multiple fields "
                "are set",
            )
        )
    elif first:
        sub_where = f"{where}.firstAvailable"
        if len(first) > FIRST_AVAILABLE_MAX:
            return [*out, too_many(sub_where, len(first), FIRST_AVAILABLE_MAX)]
        seen: set[Any] = set()
        for j, sub in enumerate(first):
            sub, here = _dict(sub), f"{sub_where}[{j}]"
            sub_name = sub.get("name")
            out.extend(
                dns_label_causes(sub_name if isinstance(sub_name, str) else "", f"{here}.name")
            )
            out.extend(_exact_causes(sub, here))
            if sub_name in seen:
                out.append(set_duplicate(here, "name", sub_name))
            seen.add(sub_name)
    else:
        out.extend(_exact_causes(_dict(exactly), f"{where}.exactly"))
    return out


def _request_names(devices: JSON) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for req in _list(devices.get("requests")):
        req = _dict(req)
        name = req.get("name")
        if isinstance(name, str):
            out[name] = {str(_dict(s).get("name")) for s in _list(req.get("firstAvailable"))}
    return out


def _request_ref_causes(refs: Any, where: str, names: dict[str, set[str]]) -> list[JSON]:
    items = _list(refs)
    if len(items) > DEVICE_REQUESTS_MAX:
        return [too_many(where, len(items), DEVICE_REQUESTS_MAX)]
    out: list[JSON] = []
    seen: set[Any] = set()
    for j, ref in enumerate(items):
        field = f"{where}[{j}]"
        if not isinstance(ref, str):
            continue
        out.extend(_request_ref_one(ref, field, names))
        if ref in seen:
            out.append(duplicate(field, ref))
        seen.add(ref)
    return out


def _request_ref_one(ref: str, field: str, names: dict[str, set[str]]) -> list[JSON]:
    """Upstream's ``validateRequestNameRef``: ``<request>`` or ``<request>/<sub>``."""
    parts = ref.split("/")
    if len(parts) > 2:
        return [invalid_value(field, ref, _REQUEST_REF_MSG)]
    out: list[JSON] = []
    for part in parts:
        out.extend(dns_label_causes(part, field))
    known = parts[0] in names and (len(parts) == 1 or parts[1] in names[parts[0]])
    if not known:
        out.append(invalid_value(field, ref, _REQUEST_REF_MSG))
    return out


def _qualified_name_causes(value: Any, field: str) -> list[JSON]:
    """Upstream's ``validateFullyQualifiedName``: ``<domain>/<C identifier>``."""
    if not isinstance(value, str):
        return []
    if _release() <= 34:  # validateQualifiedName, then "must include a domain"
        named = _attribute_name_causes(value, field)
        if value and "/" not in value:
            named.append(invalid_value(field, value, "must include a domain"))
        return named
    parts = value.split("/")
    out: list[JSON] = []
    if len(parts) > 2:  # upstream's validateQualifiedName leaves these unchecked
        return []
    ident = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            out.append(invalid_value(field, "", "the domain must not be empty"))
        else:
            out.extend(_driver_name_causes(parts[0], field))
    if not ident:
        out.append(invalid_value(field, "", "the name must not be empty"))
    elif not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ident):
        out.append(
            invalid_value(
                field,
                ident,
                "a valid C identifier must start with alphabetic character or '_', followed "
                "by a string of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',"
                "  or 'MyName', regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')",
            )
        )
    if len(parts) == 1:
        out.append(
            invalid_value(
                field,
                value,
                "a fully qualified name must be a domain and a name separated by a slash",
            )
        )
    return out


def _constraint_causes(
    constraints: Any, where: str, names: dict[str, set[str]], consumable: bool = True
) -> list[JSON]:
    items = _list(constraints)
    if len(items) > DEVICE_CONSTRAINTS_MAX:
        return [too_many(where, len(items), DEVICE_CONSTRAINTS_MAX)]
    out: list[JSON] = []
    for i, c in enumerate(items):
        c, here = _dict(c), f"{where}[{i}]"
        out.extend(_request_ref_causes(c.get("requests"), f"{here}.requests", names))
        if c.get("matchAttribute") is not None:
            out.extend(_qualified_name_causes(c["matchAttribute"], f"{here}.matchAttribute"))
        elif c.get("distinctAttribute") is not None:
            out.extend(_qualified_name_causes(c["distinctAttribute"], f"{here}.distinctAttribute"))
        elif consumable:  # DRAConsumableCapacity: distinctAttribute is an alternative
            out.append(
                required(
                    here,
                    'exactly one of "matchAttribute" or "distinctAttribute" is required, but '
                    "multiple fields are set",
                )
            )
        else:
            out.append(required(f"{here}.matchAttribute"))
    return out


def _opaque_causes(config: JSON, where: str) -> list[JSON]:
    opaque = config.get("opaque")
    if not isinstance(opaque, dict):
        return [required(f"{where}.opaque")]
    out = _driver_name_causes(opaque.get("driver"), f"{where}.opaque.driver")
    params, field = opaque.get("parameters"), f"{where}.opaque.parameters"
    if params is None:
        out.append(required(field))
    elif len(json.dumps(params, separators=(",", ":"))) > OPAQUE_PARAMETERS_MAX_BYTES:
        out.append(too_long(field, OPAQUE_PARAMETERS_MAX_BYTES))
    elif not isinstance(params, dict):
        out.append(
            cause(
                "FieldValueInvalid",
                'Invalid value: "<value omitted>": must be a valid JSON object',
                field,
            )
        )
    return out


def _config_causes(configs: Any, where: str, names: dict[str, set[str]] | None) -> list[JSON]:
    items = _list(configs)
    if len(items) > DEVICE_CONFIG_MAX:
        return [too_many(where, len(items), DEVICE_CONFIG_MAX)]
    out: list[JSON] = []
    for i, config in enumerate(items):
        config, here = _dict(config), f"{where}[{i}]"
        if names is not None:
            out.extend(_request_ref_causes(config.get("requests"), f"{here}.requests", names))
        out.extend(_opaque_causes(config, here))
    return out


def device_claim_causes(devices: Any, where: str, consumable: bool = True) -> list[JSON]:
    """Upstream's ``validateDeviceClaim`` for a new claim spec's ``devices`` at ``where``
    (``consumable``: the release has DRAConsumableCapacity on)."""
    devices = _dict(devices)
    requests = _list(devices.get("requests"))
    if len(requests) > DEVICE_REQUESTS_MAX:
        return [too_many(f"{where}.requests", len(requests), DEVICE_REQUESTS_MAX)]
    out: list[JSON] = []
    seen: set[Any] = set()
    for i, req in enumerate(requests):
        here = f"{where}.requests[{i}]"
        out.extend(_request_causes(_dict(req), here))
        name = _dict(req).get("name")
        if name in seen:
            out.append(set_duplicate(here, "name", name))
        seen.add(name)
    names = _request_names(devices)
    out.extend(
        _constraint_causes(devices.get("constraints"), f"{where}.constraints", names, consumable)
    )
    out.extend(_config_causes(devices.get("config"), f"{where}.config", names))
    return out


def _admin_requested(devices: Any) -> int | None:
    """The index of the first request asking for admin access (only ``exactly`` may)."""
    for i, req in enumerate(_list(_dict(devices).get("requests"))):
        if _dict(_dict(req).get("exactly")).get("adminAccess") is True:
            return i
    return None


def admin_access_causes(devices: Any, namespace: JSON | None) -> list[JSON]:
    """Upstream's ``AuthorizedForAdmin``: admin access needs the namespace label."""
    i = _admin_requested(devices)
    if i is None:
        return []
    labels = _dict(_dict(_dict(namespace).get("metadata")).get("labels"))
    if labels.get(ADMIN_ACCESS_LABEL) == "true":
        return []
    return [
        forbidden(
            f"spec.devices.requests[{i}].adminAccess",
            f"admin access to devices requires the `{ADMIN_ACCESS_LABEL}: true` label on the "
            "containing namespace",
        )
    ]


def immutable(field: str, value: Any) -> JSON:
    """Upstream's ``ValidateImmutableField`` cause."""
    return invalid_value(field, value, "field is immutable")


# ResourceClaim status.devices (KEP-4817): upstream's validateDeviceStatus and the
# metav1 ValidateConditions it calls, with their texts.
DEVICE_STATUS_MAX_CONDITIONS = 8
DEVICE_STATUS_DATA_MAX = 10 * 1024
_NETWORK_LIMITS = (("interfaceName", 256), ("hardwareAddress", 128))
_NETWORK_MAX_IPS = 16
_REASON_FMT = "[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?"
_REASON_MSG = (
    "a condition reason must start with alphabetic character, optionally followed by a "
    "string of alphanumeric characters or '_,:', and must end with an alphanumeric "
    "character or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',"
    "  or 'ReasonA:ReasonB', regex used for validation is '" + _REASON_FMT + "')"
)


def _shared_device_id(d: JSON) -> str:
    base = f"{d.get('driver') or ''}/{d.get('pool') or ''}/{d.get('device') or ''}"
    return f"{base}/{d['shareID']}" if d.get("shareID") else base


def _condition_causes(conditions: list[Any], where: str) -> list[JSON]:
    """metav1 ``ValidateConditions``. Before 1.37 a duplicate is reported at its ``type``,
    and an empty type or status is checked as any other value (label name; one of the
    statuses)."""
    old = _release() <= 36
    out: list[JSON] = []
    seen: set[str] = set()
    for i, c in enumerate(conditions):
        c, at = _dict(c), f"{where}[{i}]"
        ctype = str(c.get("type") or "")
        if ctype in seen:
            out.append(duplicate(f"{at}.type" if old else at, ctype))
        seen.add(ctype)
        if not ctype and not old:
            out.append(required(f"{at}.type", "is required"))
        else:
            out.extend(label_name_causes(ctype, f"{at}.type"))
        if not c.get("status") and not old:
            out.append(required(f"{at}.status"))
        elif c.get("status") not in ("False", "True", "Unknown"):
            status = c.get("status") or ""
            out.append(unsupported(f"{at}.status", status, ("False", "True", "Unknown")))
        gen = c.get("observedGeneration")
        if isinstance(gen, int) and gen < 0:
            out.append(
                invalid_value(
                    f"{at}.observedGeneration", gen, "must be greater than or equal to zero"
                )
            )
        if not c.get("lastTransitionTime"):
            out.append(required(f"{at}.lastTransitionTime", "must be set"))
        reason = str(c.get("reason") or "")
        if not reason:
            out.append(required(f"{at}.reason", "must be set"))
        else:
            if not re.fullmatch(_REASON_FMT, reason):
                out.append(invalid_value(f"{at}.reason", reason, _REASON_MSG))
            if len(reason.encode()) > 1024:
                out.append(too_long(f"{at}.reason", 1024))
        if len(str(c.get("message") or "").encode()) > 32 * 1024:
            out.append(too_long(f"{at}.message", 32 * 1024))
    return out


def _network_data_causes(net: Any, where: str) -> list[JSON]:
    net, out = _dict(net), []
    for name, limit in _NETWORK_LIMITS:
        if len(str(net.get(name) or "").encode()) > limit:
            out.append(too_long(f"{where}.{name}", limit))
    ips = _list(net.get("ips"))
    if len(ips) > _NETWORK_MAX_IPS:
        return [*out, too_many(f"{where}.ips", len(ips), _NETWORK_MAX_IPS)]
    seen: set[str] = set()
    for j, ip in enumerate(ips):
        text = str(ip)
        try:
            ipaddress.ip_interface(text)
            ok = "/" in text
        except ValueError:
            ok = False
        if not ok:
            out.append(
                invalid_value(
                    f"{where}.ips[{j}]",
                    ip,
                    "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)",
                )
            )
        if text in seen:
            out.append(duplicate(f"{where}.ips[{j}]", ip))
        seen.add(text)
    return out


def device_status_causes(status: JSON, where: str = "status.devices") -> list[JSON]:
    """``status.devices`` of a claim against its ``status.allocation``, as upstream's
    ``validateResourceClaimStatusUpdate``: each entry names an allocated device (with its
    ``shareID``), at most once, with at most 8 valid conditions (unique types), ``data``
    a JSON object of at most 10 KiB and ``networkData`` within its limits."""
    entries = _list(status.get("devices"))
    if not entries:
        return []
    allocated = {
        _shared_device_id(_dict(r))
        for r in _list(_dict(_dict(status.get("allocation")).get("devices")).get("results"))
    }
    out: list[JSON] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        d, at = _dict(entry), f"{where}[{i}]"
        out.extend(_driver_name_causes(d.get("driver"), f"{at}.driver"))
        out.extend(_pool_name_causes(str(d.get("pool") or ""), f"{at}.pool"))
        out.extend(dns_label_causes(str(d.get("device") or ""), f"{at}.device"))
        ident = _shared_device_id(d)
        if ident in seen:
            out.append(set_duplicate(at, "deviceID", ident))
        seen.add(ident)
        if ident not in allocated:
            out.append(invalid_value(at, ident, "must be an allocated device in the claim"))
        conditions = _list(d.get("conditions"))
        if len(conditions) > DEVICE_STATUS_MAX_CONDITIONS:
            out.append(too_many(f"{at}.conditions", len(conditions), DEVICE_STATUS_MAX_CONDITIONS))
        out.extend(_condition_causes(conditions, f"{at}.conditions"))
        if "data" in d and d["data"] is not None:
            if not isinstance(d["data"], dict):
                out.append(
                    invalid_value(f"{at}.data", "<value omitted>", "must be a valid JSON object")
                )
            elif (
                len(json.dumps(d["data"], separators=(",", ":")).encode()) > DEVICE_STATUS_DATA_MAX
            ):
                out.append(too_long(f"{at}.data", DEVICE_STATUS_DATA_MAX))
        if d.get("networkData") is not None:
            out.extend(_network_data_causes(d["networkData"], f"{at}.networkData"))
    return out


def _reserved_for_causes(status: JSON, old_status: JSON, deleted: bool) -> list[JSON]:
    """``status.reservedFor``: at most 256 consumers, unique by uid, each complete; only
    with an allocation; no new ones while the claim is being deleted."""
    items, where = _list(status.get("reservedFor")), "status.reservedFor"
    if len(items) > RESERVED_FOR_MAX:
        return [too_many(where, len(items), RESERVED_FOR_MAX)]
    out: list[JSON] = []
    seen: set[Any] = set()
    for i, ref in enumerate(items):
        ref = _dict(ref)
        for key in ("resource", "name", "uid"):
            if not ref.get(key):
                out.append(required(f"{where}[{i}].{key}"))
        if ref.get("uid") in seen:
            out.append(set_duplicate(f"{where}[{i}]", "uid", ref.get("uid")))
        seen.add(ref.get("uid"))
    if items and not status.get("allocation"):
        out.append(forbidden(where, "may not be specified when `allocated` is not set"))
    elif items and deleted and any(r not in _list(old_status.get("reservedFor")) for r in items):
        out.append(
            forbidden(
                where,
                "new entries may not be added while `deallocationRequested` or "
                "`deletionTimestamp` are set",
            )
        )
    return out


def _allocation_causes(allocation: JSON, names: dict[str, set[str]]) -> list[JSON]:
    """Upstream's ``validateAllocationResult`` for a new allocation."""
    where = "status.allocation.devices"
    devices = _dict(allocation.get("devices"))
    results = _list(devices.get("results"))
    if len(results) > ALLOCATION_RESULTS_MAX:
        return [too_many(f"{where}.results", len(results), ALLOCATION_RESULTS_MAX)]
    out: list[JSON] = []
    for i, r in enumerate(results):
        r, here = _dict(r), f"{where}.results[{i}]"
        out.extend(_request_ref_one(str(r.get("request") or ""), f"{here}.request", names))
        out.extend(_driver_name_causes(r.get("driver"), f"{here}.driver"))
        out.extend(_pool_name_causes(r.get("pool"), f"{here}.pool"))
        device = r.get("device")
        out.extend(dns_label_causes(device if isinstance(device, str) else "", f"{here}.device"))
        out.extend(_binding_causes(r, here))
    configs = _list(devices.get("config"))
    if len(configs) > 2 * DEVICE_CONFIG_MAX:
        out.append(too_many(f"{where}.config", len(configs), 2 * DEVICE_CONFIG_MAX))
    return out


def _claim_status_causes(obj: JSON, old: JSON) -> list[JSON]:
    status, old_status = _dict(obj.get("status")), _dict(old.get("status"))
    deleted = bool(_dict(obj.get("metadata")).get("deletionTimestamp"))
    out = _reserved_for_causes(status, old_status, deleted)
    allocation, old_allocation = status.get("allocation"), old_status.get("allocation")
    if old_allocation and allocation:
        if allocation != old_allocation:
            out.append(immutable("status.allocation", allocation))
    elif isinstance(allocation, dict):
        names = _request_names(_dict(_dict(obj.get("spec")).get("devices")))
        out.extend(_allocation_causes(allocation, names))
    if status.get("devices") != old_status.get("devices") or allocation != old_allocation:
        out.extend(device_status_causes(status))
    return out


def _consumable(profile: KubeProfile | None) -> bool:
    return profile is None or profile.enabled("DRAConsumableCapacity")


def _claim_causes(obj: JSON, ctx: _Context) -> list[JSON]:
    spec = _dict(obj.get("spec"))
    if ctx.old is not None:  # the spec is immutable; the status is validated on its own
        old_spec = _dict(ctx.old.get("spec"))
        out = [] if spec == old_spec else [immutable("spec", spec)]
        if obj.get("status") != ctx.old.get("status"):
            out.extend(_claim_status_causes(obj, ctx.old))
        return out
    out = device_claim_causes(spec.get("devices"), "spec.devices", _consumable(ctx.profile))
    out.extend(admin_access_causes(spec.get("devices"), ctx.namespace))
    return out


def _claim_template_causes(obj: JSON, ctx: _Context) -> list[JSON]:
    spec = _dict(obj.get("spec"))
    if ctx.old is not None:
        old_spec = _dict(ctx.old.get("spec"))
        return [] if spec == old_spec else [immutable("spec", spec)]
    inner = _dict(spec.get("spec"))
    out = _label_causes(_dict(spec.get("metadata")), "spec.metadata.")
    out.extend(
        device_claim_causes(inner.get("devices"), "spec.spec.devices", _consumable(ctx.profile))
    )
    out.extend(admin_access_causes(inner.get("devices"), ctx.namespace))
    return out


def _device_class_causes(obj: JSON, ctx: _Context) -> list[JSON]:
    """Upstream's ``validateDeviceClassSpec``: selectors and config checked where new or
    changed. 1.34's update validates the class as new too (``ValidateDeviceClass``, then
    ``ValidateDeviceClassUpdate``), so each cause of a changed part comes twice."""
    if ctx.old is not None and _release() <= 34:
        again = _device_class_causes(obj, _Context(ctx.profile, None, ctx.namespace))
        return again + _device_class_spec_causes(obj, ctx)
    return _device_class_spec_causes(obj, ctx)


def _device_class_spec_causes(obj: JSON, ctx: _Context) -> list[JSON]:
    spec = _dict(obj.get("spec"))
    old_spec = _dict(_dict(ctx.old).get("spec")) if ctx.old is not None else None
    out: list[JSON] = []
    if old_spec is None or old_spec.get("selectors") != spec.get("selectors"):
        out.extend(_selector_causes(spec.get("selectors"), "spec.selectors"))
    if old_spec is None or old_spec.get("config") != spec.get("config"):
        out.extend(_config_causes(spec.get("config"), "spec.config", None))
    ext = spec.get("extendedResourceName")
    if isinstance(ext, str) and not _is_extended_resource_name(ext):
        out.append(
            invalid_value(
                "spec.extendedResourceName", ext, "must be a valid extended resource name"
            )
        )
    return out


def _is_extended_resource_name(name: str) -> bool:
    """Upstream's ``IsExtendedResourceName``: qualified, not ``kubernetes.io/``, not
    ``requests.``-prefixed, and ``requests.<name>`` a valid qualified name."""
    if "/" not in name or name.startswith("requests.") or "kubernetes.io/" in name:
        return False
    try:
        validate_label_key(name)
        validate_label_key("requests." + name)
    except SelectorError:
        return False
    return True


def _deployment_causes(obj: JSON, profile: KubeProfile | None) -> list[JSON]:
    """apps/v1 Deployment: upstream's checks of what the Deployment stand-in reads
    (counts not negative, a selector that selects the template's labels, containers)."""
    spec = _dict(obj.get("spec"))
    out: list[JSON] = []
    for f in ("replicas", "minReadySeconds", "revisionHistoryLimit"):
        value = spec.get(f)
        if isinstance(value, int) and value < 0:
            out.append(invalid_value(f"spec.{f}", value, "must be greater than or equal to 0"))
    template = _dict(spec.get("template"))
    labels = _dict(_dict(template.get("metadata")).get("labels"))
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not (
        selector.get("matchLabels") or selector.get("matchExpressions")
    ):
        out.append(required("spec.selector"))
    else:
        try:
            parsed = selector_from_object(selector)
        except SelectorError as e:
            out.append(invalid_value("spec.selector", selector, str(e)))
        else:
            if parsed is not None and not parsed.matches(
                {str(k): str(v) for k, v in labels.items()}
            ):
                out.append(
                    invalid_value(
                        "spec.template.metadata.labels", labels,
                        "`selector` does not match template `labels`",
                    )
                )  # fmt: skip
    if not _list(_dict(template.get("spec")).get("containers")):
        out.append(required("spec.template.spec.containers"))
    return out


# --------------------------------------------------------------------------- core kinds

NODE_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _node_causes(obj: JSON, profile: KubeProfile | None) -> list[JSON]:
    """Upstream's ``validateNodeTaints`` (at ``metadata.taints``, as upstream reports it)."""
    out: list[JSON] = []
    seen: set[tuple[Any, Any]] = set()
    for i, taint in enumerate(_list(_dict(obj.get("spec")).get("taints"))):
        taint, at = _dict(taint), f"metadata.taints[{i}]"
        out.extend(label_name_causes(str(taint.get("key") or ""), f"{at}.key"))
        errs = label_value_errors(str(taint.get("value") or ""))
        if errs:
            out.append(invalid_value(f"{at}.value", taint.get("value"), ";".join(errs)))
        effect = taint.get("effect") or ""
        if not effect:
            out.append(required(f"{at}.effect"))
        elif effect not in NODE_TAINT_EFFECTS:
            out.append(unsupported(f"{at}.effect", effect, NODE_TAINT_EFFECTS))
        ident = (taint.get("key"), effect)
        if ident in seen:
            out.append(
                cause(
                    "FieldValueDuplicate",
                    f"Duplicate value: {_show(taint)}: taints must be unique by key and effect "
                    "pair",
                    at,
                )
            )
            continue
        seen.add(ident)
    return out


def _lease_causes(obj: JSON, profile: KubeProfile | None) -> list[JSON]:
    """Upstream's ``ValidateLeaseSpec``."""
    spec, out = _dict(obj.get("spec")), []
    duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
    if isinstance(duration, int) and duration <= 0:
        out.append(invalid_value("spec.leaseDurationSeconds", duration, "must be greater than 0"))
    if isinstance(transitions, int) and transitions < 0:
        out.append(
            invalid_value(
                "spec.leaseTransitions", transitions, "must be greater than or equal to 0"
            )
        )
    if spec.get("preferredHolder") and not spec.get("strategy"):
        out.append(
            forbidden("spec.preferredHolder", "may only be specified if `strategy` is defined")
        )
    return out


def _event_causes(event: JSON, namespace: str, new_api: bool) -> list[JSON]:
    """Upstream's ``ValidateEventCreate`` on the core Event (``new_api``: sent through
    events.k8s.io, which adds its stricter rules); fields named as the core Event's."""
    out: list[JSON] = []
    involved_ns = _dict(event.get("involvedObject")).get("namespace") or ""
    controller = "reportingController" if new_api else "reportingComponent"
    if not event.get("eventTime"):
        if not involved_ns:
            if namespace not in ("", "default"):
                out.append(
                    invalid_value(
                        "involvedObject.namespace", involved_ns, "does not match event.namespace"
                    )
                )
        elif namespace != involved_ns:
            out.append(
                invalid_value(
                    "involvedObject.namespace", involved_ns, "does not match event.namespace"
                )
            )
    else:
        if not involved_ns and namespace not in ("default", "kube-system"):
            out.append(
                invalid_value(
                    "involvedObject.namespace", involved_ns, "does not match event.namespace"
                )
            )
        reporting = str(event.get("reportingComponent") or "")
        if not reporting:
            out.append(required(controller))
        out.extend(
            invalid_value(controller, reporting, m) for m in qualified_name_errors(reporting)
        )
        instance = str(event.get("reportingInstance") or "")
        if not instance:
            out.append(required("reportingInstance"))
        elif len(instance) > 128:
            out.append(invalid_value("reportingInstance", "", "can have at most 128 characters"))
        action = str(event.get("action") or "")
        if not action:
            out.append(required("action"))
        elif len(action) > 128:
            out.append(invalid_value("action", "", "can have at most 128 characters"))
        reason = str(event.get("reason") or "")
        if not reason:
            out.append(required("reason"))
        elif len(reason) > 128:
            out.append(invalid_value("reason", "", "can have at most 128 characters"))
        if len(str(event.get("message") or "")) > 1024:
            out.append(invalid_value("message", "", "can have at most 1024 characters"))
    if not new_api:
        return out
    if not event.get("eventTime"):
        out.append(required("eventTime"))
    if event.get("type") not in ("Normal", "Warning"):
        out.append(invalid_value("type", "", f"has invalid value: {event.get('type') or ''}"))
    for key in ("firstTimestamp", "lastTimestamp"):
        if event.get(key):
            out.append(invalid_value(key, "", "needs to be unset"))
    if event.get("count"):
        out.append(invalid_value("count", "", "needs to be unset"))
    source = _dict(event.get("source"))
    if source.get("component") or source.get("host"):
        out.append(invalid_value("source", "", "needs to be unset"))
    return out


def _core_event_causes(obj: JSON, ctx: _Context) -> list[JSON]:
    if ctx.old is not None:
        return []
    ns = str(_dict(obj.get("metadata")).get("namespace") or "")
    return _event_causes(obj, ns, new_api=False)


#: events.k8s.io/v1 field -> the core Event's.
_NEW_EVENT_FIELDS = {
    "regarding": "involvedObject", "note": "message", "deprecatedCount": "count",
    "deprecatedSource": "source", "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp", "reportingController": "reportingComponent",
}  # fmt: skip


def _new_event_causes(obj: JSON, ctx: _Context) -> list[JSON]:
    if ctx.old is not None:
        return []
    core = {_NEW_EVENT_FIELDS.get(k, k): v for k, v in obj.items()}
    ns = str(_dict(obj.get("metadata")).get("namespace") or "")
    return _event_causes(core, ns, new_api=True)


_CONFIG_KEY_FMT = "[-._a-zA-Z0-9]+"
_CONFIG_KEY = re.compile(_CONFIG_KEY_FMT)
_CONFIG_KEY_MSG = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"


def config_key_errors(key: str) -> list[str]:
    """Upstream's ``IsConfigMapKey``: every message for a ConfigMap (or Secret) key."""
    errs: list[str] = []
    if len(key) > 253:
        errs.append("must be no more than 253 characters")
    if not _CONFIG_KEY.fullmatch(key):
        examples = ("key.name", "KEY_NAME", "key-name")
        errs.append(_regex_error(_CONFIG_KEY_MSG, _CONFIG_KEY_FMT, *examples))
    if key in (".", ".."):
        errs.append(f"must not be '{key}'")
    elif key.startswith(".."):
        errs.append("must not start with '..'")
    return errs


def _config_map_data_causes(obj: JSON) -> list[JSON]:
    """Upstream's ``ValidateConfigMap``: valid keys, none in both ``data`` and
    ``binaryData``. (Its 1 MiB bound on the values together is not checked: the object
    size limit applies.)"""
    out: list[JSON] = []
    binary = _dict(obj.get("binaryData"))
    for bag in ("data", "binaryData"):
        for key in _dict(obj.get(bag)):
            key = str(key)
            out.extend(invalid_value(f"{bag}[{key}]", key, m) for m in config_key_errors(key))
            if bag == "data" and key in binary:
                msg = "duplicate of key present in binaryData"
                out.append(invalid_value(f"{bag}[{key}]", key, msg))
    return out


def _config_map_causes(obj: JSON, ctx: _Context) -> list[JSON]:
    """Upstream's ``ValidateConfigMap`` and ``ValidateConfigMapUpdate`` (an immutable
    ConfigMap keeps its data)."""
    out = _config_map_data_causes(obj)
    old = ctx.old
    if old is None or old.get("immutable") is not True:
        return out
    if obj.get("immutable") is not True:
        out.append(forbidden("immutable", "field is immutable when `immutable` is set"))
    for key in ("data", "binaryData"):
        if (obj.get(key) or {}) != (old.get(key) or {}):
            out.append(forbidden(key, "field is immutable when `immutable` is set"))
    return out


#: (group, kind): the rules hold for every version of the kind.
_KIND_RULES: dict[tuple[str, str], Callable[[JSON, KubeProfile | None], list[JSON]]] = {
    ("", "Pod"): _pod_causes,
    ("", "Node"): _node_causes,
    ("coordination.k8s.io", "Lease"): _lease_causes,
    ("policy", "PodDisruptionBudget"): _pdb_causes,
    ("apps", "Deployment"): _deployment_causes,
    ("authorization.k8s.io", "SelfSubjectAccessReview"): _access_review_causes,
}


_CONTEXT_RULES: dict[tuple[str, str], Callable[[JSON, _Context], list[JSON]]] = {
    # rules that need the stored object or the namespace
    ("", "Pod"): _pod_spec_causes,
    ("resource.k8s.io", "ResourceClaim"): _claim_causes,
    ("resource.k8s.io", "ResourceClaimTemplate"): _claim_template_causes,
    ("resource.k8s.io", "DeviceClass"): _device_class_causes,
    ("resource.k8s.io", "DeviceTaintRule"): _device_taint_rule_causes,
    ("resource.k8s.io", "ResourceSlice"): _resource_slice_causes,
    ("batch", "Job"): job_causes,
    ("", "Event"): _core_event_causes,
    ("events.k8s.io", "Event"): _new_event_causes,
    ("", "ConfigMap"): _config_map_causes,
}


def metadata_update_causes(meta: JSON, old_meta: JSON) -> list[JSON]:
    """Upstream's ``ValidateObjectMetaUpdate`` for what an update may send: the uid (an
    empty one is filled from the stored object before this runs) may not change."""
    uid, old_uid = meta.get("uid"), old_meta.get("uid")
    if uid and old_uid and uid != old_uid:
        return [immutable("metadata.uid", uid)]
    return []


_UNKNOWN_FIELD = "unknown field "


def is_unknown_field(c: JSON) -> bool:
    """Whether ``c`` is the schema walk's cause for a field the kind does not have."""
    return str(c.get("message", "")).startswith(_UNKNOWN_FIELD)


def strict_decoding_message(rt: ResourceType, unknown: list[JSON]) -> str:
    """The real server's 400 message for unknown fields under ``fieldValidation=Strict``:
    ``Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown
    field "spec.foo"`` (every unknown field, comma-separated)."""
    fields = ", ".join(str(c["message"]) for c in unknown)
    return (
        f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
        f"strict decoding error: {fields}"
    )


def object_causes(
    rt: ResourceType,
    obj: JSON,
    profile: KubeProfile | None = None,
    *,
    old: JSON | None = None,
    namespace: JSON | None = None,
) -> list[JSON]:
    """All validation causes for ``obj`` (an object of kind ``rt``), schema first.

    ``profile`` is the release whose rules apply (None: the newest); ``old`` the stored
    object when this is an update (immutability and update rules apply, as the real
    server's ``ValidateUpdate``); ``namespace`` the object's Namespace, when it has one
    (admin access to devices depends on its labels).
    """
    with release_rules(profile):
        return _object_causes(rt, obj, profile, old, namespace)


#: How often an update's metadata causes come before 1.37 (labels and annotations, then
#: an immutable field such as the uid): the generic update checks and the kind's own
#: ``ValidateUpdate`` each validate the metadata again (1.37's declarative validation
#: reports each once). The count of the other kinds is 4 and 2.
_UPDATE_META_REPEATS: dict[tuple[str, str], tuple[int, int]] = {
    ("", "Event"): (2, 1),
    ("events.k8s.io", "Event"): (3, 2),
    ("coordination.k8s.io", "Lease"): (3, 2),
    ("apps", "Deployment"): (3, 2),
    ("apps", "ReplicaSet"): (3, 2),
    ("policy", "PodDisruptionBudget"): (2, 1),
    ("resource.k8s.io", "ResourceSlice"): (3, 2),
    ("resource.k8s.io", "DeviceTaintRule"): (3, 2),
}


def _object_causes(
    rt: ResourceType,
    obj: JSON,
    profile: KubeProfile | None,
    old: JSON | None,
    namespace: JSON | None,
) -> list[JSON]:
    schema = schema_causes(obj, rt.model)
    if any(c["reason"] == "FieldValueTypeInvalid" for c in schema):
        return schema[:MAX_CAUSES]
    out: list[JSON] = []
    meta = _dict(obj.get("metadata"))
    name = meta.get("name")
    if isinstance(name, str):
        out.extend(name_causes(rt.kind, name))
    labels, immutable_meta = _label_causes(meta), []
    if old is not None:
        immutable_meta = metadata_update_causes(meta, _dict(old.get("metadata")))
        if _release() <= 36:
            n_labels, n_immutable = _UPDATE_META_REPEATS.get((rt.group, rt.kind), (4, 2))
            labels, immutable_meta = labels * n_labels, immutable_meta * n_immutable
    out.extend(labels)
    out.extend(immutable_meta)
    rule = _KIND_RULES.get((rt.group, rt.kind))
    if rule is not None:
        causes = rule(obj, profile)
        if (rt.group, rt.kind) == ("", "Node") and old is not None and _release() <= 36:
            causes = causes * 2  # ValidateNode and ValidateNodeUpdate check the taints
        out.extend(causes)
    context_rule = _CONTEXT_RULES.get((rt.group, rt.kind))
    if context_rule is not None:
        out.extend(context_rule(obj, _Context(profile, old, namespace)))
    # A missing required field is the kind's rules' to report where they check it (the
    # real server's types have no "required" of their own: a zero value is validated);
    # the DRA kinds' rules check every one, with upstream's reasons.
    ruled = {c.get("field") for c in out}
    dra = rt.group == "resource.k8s.io"
    kept = [c for c in schema if not (_is_schema_required(c) and (dra or c.get("field") in ruled))]
    return (kept + out)[:MAX_CAUSES]


def _is_schema_required(c: JSON) -> bool:
    return c.get("reason") == "FieldValueRequired" and c.get("message") == "Required value"
