"""Label and field selectors: parsing the query-string forms and matching objects.

Owns the grammar of ``labelSelector`` (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``,
``!key``, ``>``, ``<``), of ``fieldSelector`` (``=``, ``==``, ``!=``, comma-joined, with
backslash escapes) and of ``metav1.LabelSelector`` objects (``matchLabels`` +
``matchExpressions``). Pure functions; errors are ``SelectorError`` (the server maps
them to 400 BadRequest).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from drahealth.core import is_dns_subdomain, is_label_value, matches_qualified_name_part


class SelectorError(ValueError):
    """A selector could not be parsed or names an unsupported field."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One label requirement: ``op`` is one of = != in notin exists !exists gt lt."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if not present or value is None:
            return False
        try:
            have, want = int(value), int(self.values[0])
        except ValueError:
            return False
        return have > want if self.op == "gt" else have < want


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A conjunction of label requirements; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


def validate_label_key(key: str) -> None:
    prefix, _, name = key.rpartition("/")
    if "/" in key and not is_dns_subdomain(prefix):
        raise SelectorError(f"invalid label key {key!r}: prefix must be a DNS subdomain")
    if not name or len(name) > 63 or not matches_qualified_name_part(name):
        raise SelectorError(
            f"invalid label key {key!r}: name part must consist of alphanumeric characters, "
            "'-', '_' or '.', and must start and end with an alphanumeric character"
        )


def validate_label_value(value: str) -> None:
    if not is_label_value(value):
        raise SelectorError(
            f"invalid label value {value!r}: must be 63 characters or less and consist of "
            "alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric"
        )


_TOKEN = re.compile(r"\s*(==|!=|=|!|\(|\)|,|<|>|[^\s,()=!<>]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:  # pragma: no cover - the pattern accepts any non-space character
            raise SelectorError(f"unable to parse requirement: unexpected input at {pos}")
        out.append(m.group(1))
        pos = m.end()
    return out


_OPERATORS = {"=", "==", "!=", "!", "(", ")", ",", "<", ">"}


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse the ``labelSelector`` query form, e.g. ``app=x,tier in (a,b),!legacy``."""
    if not text or not text.strip():
        return LabelSelector()
    toks = _tokens(text)
    reqs: list[Requirement] = []
    i = 0

    def need(cond: bool, what: str) -> None:
        if not cond:
            found = toks[i] if i < len(toks) else ""
            raise SelectorError(f"unable to parse requirement: found '{found}', expected: {what}")

    def ident() -> str:
        nonlocal i
        need(i < len(toks) and toks[i] not in _OPERATORS, "identifier")
        i += 1
        return toks[i - 1]

    while True:
        if i < len(toks) and toks[i] == "!":
            i += 1
            key = ident()
            validate_label_key(key)
            reqs.append(Requirement(key, "!exists"))
        else:
            key = ident()
            validate_label_key(key)
            if i >= len(toks) or toks[i] == ",":
                reqs.append(Requirement(key, "exists"))
            elif toks[i] in ("=", "==", "!="):
                op = "!=" if toks[i] == "!=" else "="
                i += 1
                value = ""
                if i < len(toks) and toks[i] not in _OPERATORS:
                    value = toks[i]
                    i += 1
                validate_label_value(value)
                reqs.append(Requirement(key, op, (value,)))
            elif toks[i] in ("in", "notin"):
                op = toks[i]
                i += 1
                need(i < len(toks) and toks[i] == "(", "'('")
                i += 1
                values: list[str] = []
                while True:
                    if i < len(toks) and toks[i] not in _OPERATORS:
                        validate_label_value(toks[i])
                        values.append(toks[i])
                        i += 1
                    else:
                        values.append("")
                    need(i < len(toks) and toks[i] in (",", ")"), "',' or ')'")
                    i += 1
                    if toks[i - 1] == ")":
                        break
                reqs.append(Requirement(key, op, tuple(values)))
            elif toks[i] in ("<", ">"):
                op = "gt" if toks[i] == ">" else "lt"
                i += 1
                value = ident()
                if not re.fullmatch(r"-?\d+", value):
                    raise SelectorError(
                        f"unable to parse requirement: for 'Gt', 'Lt' operators, the value "
                        f"must be an integer, got {value!r}"
                    )
                reqs.append(Requirement(key, op, (value,)))
            else:
                need(False, "'=', '!=', '==', 'in', notin'")
        if i >= len(toks):
            break
        need(toks[i] == ",", "','")
        i += 1
        need(i < len(toks), "identifier")
    return LabelSelector(tuple(reqs))


def selector_from_object(sel: Mapping[str, Any] | None) -> LabelSelector | None:
    """Convert a ``metav1.LabelSelector``; ``None`` (absent) matches nothing, ``{}`` all."""
    if sel is None:
        return None
    reqs: list[Requirement] = []
    for key, value in sorted((sel.get("matchLabels") or {}).items()):
        reqs.append(Requirement(str(key), "=", (str(value),)))
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in sel.get("matchExpressions") or []:
        op = ops.get(str(expr.get("operator")))
        if op is None:
            raise SelectorError(f"{expr.get('operator')!r} is not a valid selector operator")
        values = tuple(str(v) for v in expr.get("values") or [])
        reqs.append(Requirement(str(expr.get("key")), op, values))
    return LabelSelector(tuple(reqs))


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    value: str
    negate: bool


@dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        for req in self.requirements:
            have = field_value(obj, req.field)
            if (have == req.value) == req.negate:
                return False
        return True

    def names(self) -> set[str]:
        return {r.field for r in self.requirements}


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    esc = False
    for ch in text:
        if esc:
            cur.append("\\" + ch)
            esc = False
        elif ch == "\\":
            esc = True
        elif ch == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if esc:
        raise SelectorError(f"invalid field selector: trailing backslash in {text!r}")
    parts.append("".join(cur))
    return parts


def _find_operator(part: str) -> tuple[int, str] | None:
    i = 0
    while i < len(part):
        if part[i] == "\\":
            i += 2
            continue
        for op in ("==", "!=", "="):
            if part.startswith(op, i):
                return i, op
        i += 1
    return None


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_field_selector(text: str | None, supported: Iterable[str]) -> FieldSelector:
    """Parse ``fieldSelector``; a field outside ``supported`` raises ``SelectorError``."""
    if not text or not text.strip():
        return FieldSelector()
    allowed = set(supported)
    reqs: list[FieldRequirement] = []
    for part in _split_unescaped(text, ","):
        split = _find_operator(part)
        if split is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        pos, op = split
        field = _unescape(part[:pos]).strip()
        value = _unescape(part[pos + len(op) :])
        if field not in allowed:
            raise SelectorError(f"field label not supported: {field}")
        reqs.append(FieldRequirement(field, value, op == "!="))
    return FieldSelector(tuple(reqs))


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string value of a dotted field path (``""`` when absent), as field selectors see it."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)
