"""Render the drahealth Helm chart without the ``helm`` binary.

Owns: a Go ``text/template`` interpreter for the subset of the template language
and Sprig functions the chart under ``deploy/helm/drahealth`` uses, Helm's
built-in objects (``.Values``, ``.Release``, ``.Chart``, ``.Capabilities``), values
merging (``-f`` files over ``values.yaml``, ``null`` deletes a key), the chart's
``kubeVersion`` constraint and ``values.schema.json`` (checked as ``helm template``
checks them) and the output of ``helm template`` (one ``# Source:`` document per
template, ``_*`` files only define). CI has no ``helm`` binary (no registry it
reaches ships one), so the chart is rendered and validated with this; ``helm
template`` gives the same manifests.

Supported: ``{{ }}`` with ``{{-``/``-}}`` trimming, ``{{/* */}}`` comments,
pipelines, parenthesised sub-pipelines, variables (``$``, ``$x :=``, ``$x =``,
``range $i, $v :=``), ``if``/``else if``/``else``, ``range`` (lists, maps in key
order) with ``else``, ``with`` with ``else``, ``define``/``template``/``include``,
and the functions in :data:`FUNCS`. Anything else is an error that names the file
and line, never a silent miss.

Usage: ``python deploy/render.py deploy/helm/drahealth [-f values.yaml]
[--release NAME] [--namespace NS] [--kube-version v1.37.0] [--set a.b=value]``.
"""

from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import json
import re
import sys
from collections import ChainMap
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Scope = MutableMapping[str, Any]


def _child(scope: Scope) -> Scope:
    """A block's variables: its own, then those of the blocks around it."""
    return ChainMap({}, *_maps(scope))


def _maps(scope: Scope) -> list[MutableMapping[str, Any]]:
    return list(scope.maps) if isinstance(scope, ChainMap) else [scope]


class TemplateError(Exception):
    """A template that cannot be parsed or evaluated; the message names file:line."""


# --------------------------------------------------------------------- lexing

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(
    r"""\s*(?:
      (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<raw>`[^`]*`)
    | (?P<num>-?\d+(?:\.\d+)?)
    | (?P<decl>:=)
    | (?P<assign>=)
    | (?P<pipe>\|)
    | (?P<lp>\()
    | (?P<rp>\))
    | (?P<comma>,)
    | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
    | (?P<field>(?:\.[A-Za-z0-9_]+)+|\.)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.X,
)


@dataclass
class Tok:
    kind: str
    text: str


def _tokens(src: str, where: str) -> list[Tok]:
    out: list[Tok] = []
    pos = 0
    while pos < len(src):
        if src[pos:].strip() == "":
            break
        m = _TOKEN.match(src, pos)
        if m is None or m.end() == pos:
            raise TemplateError(f"{where}: cannot read {src[pos:].strip()[:30]!r}")
        kind = m.lastgroup
        assert kind is not None
        text = m.group(kind)
        out.append(Tok(kind, text))
        pos = m.end()
    return out


# --------------------------------------------------------------------- parsing


@dataclass
class Pipeline:
    decl: list[str]
    assign: bool  # '=' (re-assign) rather than ':='
    cmds: list[list[Any]]  # each command: list of terms
    where: str


@dataclass
class Node:
    kind: str  # text, action, if, range, with, define, template
    where: str = ""
    text: str = ""
    pipe: Pipeline | None = None
    body: list[Node] = field(default_factory=list)
    branches: list[tuple[Pipeline, list[Node]]] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)
    name: str = ""


class _TermParser:
    def __init__(self, toks: list[Tok], where: str) -> None:
        self.toks = toks
        self.i = 0
        self.where = where

    def peek(self) -> Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> Tok:
        t = self.peek()
        if t is None:
            raise TemplateError(f"{self.where}: unexpected end of action")
        self.i += 1
        return t

    def pipeline(self, stop: str | None = None) -> Pipeline:
        decl: list[str] = []
        assign = False
        # variable declaration: $x := ... or $k, $v := ...
        j = self.i
        names: list[str] = []
        while j < len(self.toks) and self.toks[j].kind == "var":
            names.append(self.toks[j].text)
            if j + 1 < len(self.toks) and self.toks[j + 1].kind == "comma":
                j += 2
                continue
            j += 1
            break
        if names and j < len(self.toks) and self.toks[j].kind in ("decl", "assign"):
            decl, assign = names, self.toks[j].kind == "assign"
            self.i = j + 1
        cmds: list[list[Any]] = [[]]
        while (t := self.peek()) is not None and t.kind != stop:
            if t.kind == "pipe":
                self.take()
                if not cmds[-1]:
                    raise TemplateError(f"{self.where}: empty command in pipeline")
                cmds.append([])
                continue
            cmds[-1].append(self.term())
        if not cmds[-1]:
            raise TemplateError(f"{self.where}: missing value")
        return Pipeline(decl, assign, cmds, self.where)

    def term(self) -> Any:
        t = self.take()
        if t.kind == "lp":
            inner = self.pipeline(stop="rp")
            self.take()
            nxt = self.peek()
            if nxt is not None and nxt.kind == "field" and nxt.text != ".":
                self.take()
                return ("sub", inner, nxt.text[1:].split("."))
            return ("sub", inner, [])
        if t.kind == "str":
            return ("lit", json.loads(t.text))
        if t.kind == "raw":
            return ("lit", t.text[1:-1])
        if t.kind == "num":
            return ("lit", float(t.text) if "." in t.text else int(t.text))
        if t.kind == "field":
            return ("field", [] if t.text == "." else t.text[1:].split("."))
        if t.kind == "var":
            name, _, rest = t.text.partition(".")
            return ("var", name, rest.split(".") if rest else [])
        if t.kind == "ident":
            if t.text in ("true", "false"):
                return ("lit", t.text == "true")
            if t.text == "nil":
                return ("lit", None)
            return ("func", t.text)
        raise TemplateError(f"{self.where}: unexpected {t.text!r}")


def _parse_pipeline(src: str, where: str) -> Pipeline:
    p = _TermParser(_tokens(src, where), where)
    pipe = p.pipeline()
    if p.peek() is not None:
        raise TemplateError(f"{where}: unexpected {p.peek().text!r}")  # type: ignore[union-attr]
    return pipe


def parse(text: str, name: str) -> list[Node]:
    """Parse one template file into nodes (``define`` blocks included)."""
    items: list[tuple[str, str, str]] = []  # (kind, content, where)
    pos = 0
    pending_trim = False
    for m in _ACTION.finditer(text):
        chunk = text[pos : m.start()]
        if pending_trim:
            chunk = chunk.lstrip()
        if m.group(1):
            chunk = chunk.rstrip()
        line = text.count("\n", 0, m.start()) + 1
        items.append(("text", chunk, f"{name}:{line}"))
        items.append(("action", m.group(2).strip(), f"{name}:{line}"))
        pending_trim = bool(m.group(3))
        pos = m.end()
    tail = text[pos:]
    if "{{" in tail:
        line = text.count("\n", 0, pos + tail.index("{{")) + 1
        raise TemplateError(f"{name}:{line}: unclosed action")
    items.append(("text", tail.lstrip() if pending_trim else tail, f"{name}:end"))

    it = iter(items)
    nodes, _ = _parse_block(it, name, top=True)
    return nodes


_KEYWORD = re.compile(r"^(if|else if|else with|else|end|range|with|define|template|block)\b\s*")


def _parse_block(
    it: Iterator[tuple[str, str, str]], name: str, top: bool = False
) -> tuple[list[Node], tuple[str, str, str]]:
    nodes: list[Node] = []
    for kind, content, where in it:
        if kind == "text":
            if content:
                nodes.append(Node("text", where, text=content))
            continue
        if content.startswith("/*"):
            if not content.endswith("*/"):
                raise TemplateError(f"{where}: unterminated comment")
            continue
        m = _KEYWORD.match(content)
        word = m.group(1) if m else ""
        rest = content[m.end() :] if m else content
        if word in ("end", "else", "else if", "else with"):
            if top:
                raise TemplateError(f"{where}: unexpected {{{{{word}}}}}")
            return nodes, (word, rest, where)
        if word in ("if", "with"):
            node = Node(word, where)
            cond = _parse_pipeline(rest, where)
            while True:
                body, (stop, srest, swhere) = _parse_block(it, name)
                node.branches.append((cond, body))
                if stop == f"else {word}" or (stop == "else if" and word == "if"):
                    cond = _parse_pipeline(srest, swhere)
                    continue
                if stop == "else":
                    node.orelse, (stop2, _, w2) = _parse_block(it, name)
                    if stop2 != "end":
                        raise TemplateError(f"{w2}: expected {{{{end}}}}, got {stop2}")
                elif stop != "end":
                    raise TemplateError(f"{swhere}: unexpected {stop} in {word}")
                break
            nodes.append(node)
        elif word == "range":
            node = Node("range", where, pipe=_parse_pipeline(rest, where))
            node.body, (stop, _, swhere) = _parse_block(it, name)
            if stop == "else":
                node.orelse, (stop, _, swhere) = _parse_block(it, name)
            if stop != "end":
                raise TemplateError(f"{swhere}: expected {{{{end}}}} for range")
            nodes.append(node)
        elif word == "define":
            pipe = _parse_pipeline(rest, where)
            tname = _literal_name(pipe, where)
            node = Node("define", where, name=tname)
            node.body, (stop, _, swhere) = _parse_block(it, name)
            if stop != "end":
                raise TemplateError(f"{swhere}: expected {{{{end}}}} for define")
            nodes.append(node)
        elif word == "template":
            toks = _TermParser(_tokens(rest, where), where)
            first = toks.term()
            if first[0] != "lit" or not isinstance(first[1], str):
                raise TemplateError(f"{where}: template needs a quoted name")
            arg = toks.pipeline() if toks.peek() is not None else None
            nodes.append(Node("template", where, name=first[1], pipe=arg))
        elif word == "block":
            raise TemplateError(f"{where}: block is not supported; use define + include")
        else:
            nodes.append(Node("action", where, pipe=_parse_pipeline(content, where)))
    if not top:
        raise TemplateError(f"{name}: missing {{{{end}}}}")
    return nodes, ("eof", "", name)


def _literal_name(pipe: Pipeline, where: str) -> str:
    if len(pipe.cmds) == 1 and len(pipe.cmds[0]) == 1 and pipe.cmds[0][0][0] == "lit":
        value = pipe.cmds[0][0][1]
        if isinstance(value, str):
            return value
    raise TemplateError(f"{where}: define needs a quoted name")


# --------------------------------------------------------------------- values


def truth(v: Any) -> bool:
    """Go template truthiness: false, 0, nil, and empty strings/lists/maps are false."""
    if v is None or v is False:
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v != 0
    if isinstance(v, (str, list, dict, tuple)):
        return len(v) > 0
    return True


def to_text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (dict, list)):
        raise TemplateError(f"printing a {type(v).__name__} directly; use toYaml or toJson")
    return str(v)


# -- toYaml and toJson as helm writes them ----------------------------------------------
#
# helm's toYaml is sigs.k8s.io/yaml: Go's encoding/json, read back and written by
# go.yaml.in/yaml/v2 (80 columns, unicode as is, keys in its "natural" order, a string
# that would read back as another type double-quoted, a multi-line one literal). toJson is
# encoding/json: keys sorted bytewise, compact, <, > and & escaped, integral numbers
# without a fraction (helm's values are float64).

_V2_SPECIAL = frozenset(
    ["y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE",
     "false", "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF", "~", "null", "Null",
     "NULL", ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF",
     "-.inf", "-.Inf", "-.INF", "<<"]
)  # fmt: skip
_V2_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_V2_BASE60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_V2_INT = re.compile(r"[-+]?(0[bB][01]+|0[oO]?[0-7]+|0[xX][0-9a-fA-F]+|[0-9]+)")
_V2_TIME = re.compile(
    r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}"
    r"(?:(?:[Tt]| )[0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(?:\.[0-9]+)?(?:Z|[-+][0-9]{2}:[0-9]{2})?)?"
)


def _v2_not_a_string(s: str) -> bool:
    """Whether go-yaml v2 would read ``s``, written plain, as something else than a string."""
    if s == "" or s in _V2_SPECIAL:
        return True
    plain = s.replace("_", "")
    return bool(
        _V2_FLOAT.fullmatch(s) or _V2_BASE60.fullmatch(s) or _V2_TIME.fullmatch(s)
        or (plain and _V2_INT.fullmatch(plain))
    )  # fmt: skip


def _v2_key_less(a: str, b: str) -> bool:
    """go-yaml v2's order of string map keys (its keyList.Less): digit runs compare as
    numbers, other characters before letters."""
    for i in range(min(len(a), len(b))):
        if a[i] == b[i]:
            continue
        al, bl = a[i].isalpha(), b[i].isalpha()
        if al and bl:
            return a[i] < b[i]
        if al or bl:
            return bl
        an = bn = 0
        if a[i] == "0" or b[i] == "0":
            j = i - 1
            while j >= 0 and a[j].isdigit():
                if a[j] != "0":
                    an = bn = 1
                    break
                j -= 1
        ai = i
        while ai < len(a) and a[ai].isdigit():
            an = an * 10 + int(a[ai])
            ai += 1
        bi = i
        while bi < len(b) and b[bi].isdigit():
            bn = bn * 10 + int(b[bi])
            bi += 1
        if an != bn:
            return an < bn
        if ai != bi:
            return ai < bi
        return a[i] < b[i]
    return len(a) < len(b)


def _v2_cmp(a: str, b: str) -> int:
    return -1 if _v2_key_less(a, b) else (1 if _v2_key_less(b, a) else 0)


def _v2_sorted(keys: list[str]) -> list[str]:
    import functools

    return sorted(keys, key=functools.cmp_to_key(_v2_cmp))


class _GoYamlDumper(yaml.SafeDumper):
    """PyYAML's emitter (libyaml's, as go-yaml's) with go-yaml v2's choices of style."""

    def ignore_aliases(self, data: Any) -> bool:
        """No anchors: helm's toYaml goes through JSON, so a value met twice (a values
        file's alias) is written out twice."""
        return True


def _go_str(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    style = "|" if "\n" in s else ('"' if _v2_not_a_string(s) else None)
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


def _go_map(dumper: yaml.SafeDumper, m: Mapping[Any, Any]) -> yaml.MappingNode:
    keys = _v2_sorted([to_text(k) for k in m])
    by_text = {to_text(k): v for k, v in m.items()}
    return dumper.represent_mapping("tag:yaml.org,2002:map", [(k, by_text[k]) for k in keys])


def _go_float(dumper: yaml.SafeDumper, f: float) -> yaml.ScalarNode:
    text = _go_yaml_number(f)  # tagged as PyYAML reads it back, so it is written plain
    tag: str = dumper.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    return dumper.represent_scalar(tag, text)


_GoYamlDumper.add_representer(str, _go_str)
_GoYamlDumper.add_representer(dict, _go_map)
_GoYamlDumper.add_representer(float, _go_float)


def _digits(f: float) -> tuple[str, str, int]:
    """Sign, shortest digits and decimal point position of ``f`` (0.05 -> "", "5", -1)."""
    from decimal import Decimal

    sign, digits, exponent = Decimal(repr(f)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    point = len(digits) + exponent
    return ("-" if sign else ""), text, point


def _format_float(f: float, exp_form: Callable[[int], bool], min_exp_digits: int) -> str:
    sign, digs, point = _digits(f)
    exp = point - 1
    if exp_form(exp):
        mant = digs[0] + ("." + digs[1:] if len(digs) > 1 else "")
        return f"{sign}{mant}e{'-' if exp < 0 else '+'}{abs(exp):0{min_exp_digits}d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digs}"
    if point >= len(digs):
        return sign + digs + "0" * (point - len(digs))
    return f"{sign}{digs[:point]}.{digs[point:]}"


def _go_number(f: float) -> str:
    """A float64 as encoding/json writes it (helm's values are float64: 3.0 is 3)."""
    if f != f or f in (float("inf"), float("-inf")):
        raise TemplateError(f"toJson: {f} is not a JSON number")
    if f == 0:
        return "0"
    return _format_float(f, lambda e: abs(f) < 1e-6 or abs(f) >= 1e21, 1)


def _go_yaml_number(f: float) -> str:
    """A float64 as toYaml writes it: JSON, read back by go-yaml (an integral one as an
    int) and written with strconv's shortest %g (exponent below -4 or from 6 on)."""
    text = _go_number(f)
    if re.fullmatch(r"-?[0-9]+", text):
        return text
    return _format_float(f, lambda e: e < -4 or e >= 6, 2)


def to_yaml(v: Any) -> str:
    if v is None:
        return "null"
    return yaml.dump(
        v, Dumper=_GoYamlDumper, default_flow_style=False, sort_keys=False, width=80,
        allow_unicode=True,
    ).rstrip("\n")  # fmt: skip


#: what encoding/json escapes beyond json.dumps(ensure_ascii=False): HTML and JS separators
_JSON_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                               "\u2028": "\\u2028", "\u2029": "\\u2029"})  # fmt: skip


def _go_json_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False).translate(_JSON_ESCAPES)


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
               "\t": "\\t", "\v": "\\v", "\\": "\\\\", '"': '\\"'}  # fmt: skip


def go_quote(s: str) -> str:
    """``s`` as Go's %q (strconv.Quote) writes it: printable characters as they are."""
    out = []
    for c in s:
        if c in _GO_ESCAPES:
            out.append(_GO_ESCAPES[c])
        elif c.isprintable():
            out.append(c)
        elif ord(c) < 0x80:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return '"' + "".join(out) + '"'


def to_json(v: Any) -> str:
    """``v`` as Go's encoding/json writes it (helm's toJson)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _go_number(v)
    if isinstance(v, str):
        return _go_json_str(v)
    if isinstance(v, Mapping):
        items = sorted((to_text(k).encode(), to_text(k), x) for k, x in v.items())
        return "{" + ",".join(f"{_go_json_str(k)}:{to_json(x)}" for _, k, x in items) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(to_json(x) for x in v) + "]"
    raise TemplateError(f"toJson: cannot write a {type(v).__name__}")


def _indent(n: int, s: str) -> str:
    pad = " " * n
    return "\n".join(pad + line for line in to_text(s).split("\n"))


def _default(d: Any, *v: Any) -> Any:
    if not v:
        return d
    return v[0] if truth(v[0]) else d


def _required(msg: str, v: Any) -> Any:
    if v is None or v == "":
        raise TemplateError(msg)
    return v


def _fail(msg: str) -> Any:
    raise TemplateError(msg)


def _printf(fmt: str, *args: Any) -> str:
    """Go's ``fmt.Sprintf`` for ``%s``, ``%v``, ``%d``, ``%q`` and ``%%``."""
    vals = iter(args)

    def one(m: re.Match[str]) -> str:
        verb = m.group(1)
        if verb == "%":
            return "%"
        try:
            v = next(vals)
        except StopIteration:
            raise TemplateError(f"printf {fmt!r}: too few arguments") from None
        return go_quote(to_text(v)) if verb == "q" else to_text(v)

    out = re.sub(r"%([vsdq%])", one, fmt)
    if next(vals, _NOTHING) is not _NOTHING:
        raise TemplateError(f"printf {fmt!r}: too many arguments")
    return out


_NOTHING = object()


def _index(coll: Any, *keys: Any) -> Any:
    for k in keys:
        if isinstance(coll, dict):
            coll = coll.get(k)
        elif isinstance(coll, (list, tuple)) and isinstance(k, int) and 0 <= k < len(coll):
            coll = coll[k]
        else:
            raise TemplateError(f"index of {type(coll).__name__} with {k!r}")
    return coll


def _dict(*kv: Any) -> dict[str, Any]:
    if len(kv) % 2:
        raise TemplateError("dict needs key/value pairs")
    return {to_text(kv[i]): kv[i + 1] for i in range(0, len(kv), 2)}


def _cmp(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def f(a: Any, b: Any) -> bool:
        try:
            return op(a, b)
        except TypeError:
            raise TemplateError(f"cannot compare {a!r} and {b!r}") from None

    return f


FUNCS: dict[str, Callable[..., Any]] = {
    "toYaml": to_yaml,
    "toJson": to_json,
    "indent": _indent,
    "nindent": lambda n, s: "\n" + _indent(n, s),
    "quote": lambda *v: " ".join(go_quote(to_text(x)) for x in v),
    "squote": lambda *v: " ".join("'" + to_text(x) + "'" for x in v),
    "default": _default,
    "required": _required,
    "fail": _fail,
    "printf": _printf,
    "print": lambda *v: "".join(to_text(x) for x in v),
    "trunc": lambda n, s: to_text(s)[:n] if n >= 0 else to_text(s)[n:],
    "trimSuffix": lambda suf, s: to_text(s).removesuffix(suf),
    "trimPrefix": lambda pre, s: to_text(s).removeprefix(pre),
    "replace": lambda old, new, s: to_text(s).replace(old, new),
    "lower": lambda s: to_text(s).lower(),
    "upper": lambda s: to_text(s).upper(),
    "toString": to_text,
    "int": lambda v: int(v or 0),
    "b64enc": lambda s: base64.b64encode(to_text(s).encode()).decode(),
    "sha256sum": lambda s: hashlib.sha256(to_text(s).encode()).hexdigest(),
    "index": _index,
    "join": lambda sep, v: sep.join(to_text(x) for x in (v or [])),
    "list": lambda *v: list(v),
    "dict": _dict,
    "hasKey": lambda m, k: isinstance(m, dict) and k in m,
    "has": lambda needle, haystack: needle in (haystack or []),
    "empty": lambda v: not truth(v),
    "not": lambda v: not truth(v),
    "and": lambda *v: next((x for x in v if not truth(x)), v[-1]),
    "or": lambda *v: next((x for x in v if truth(x)), v[-1]),
    "eq": lambda a, *bs: any(a == b for b in bs),
    "ne": _cmp(lambda a, b: a != b),
    "lt": _cmp(lambda a, b: a < b),
    "le": _cmp(lambda a, b: a <= b),
    "gt": _cmp(lambda a, b: a > b),
    "ge": _cmp(lambda a, b: a >= b),
}


# --------------------------------------------------------------------- evaluation


class _Renderer:
    def __init__(self, defines: Mapping[str, Node], root: Any) -> None:
        self.defines = defines
        self.root = root
        self.depth = 0

    def render(self, nodes: list[Node], dot: Any, scope: Scope) -> str:
        out: list[str] = []
        for n in nodes:
            out.append(self._node(n, dot, scope))
        return "".join(out)

    def _node(self, n: Node, dot: Any, scope: Scope) -> str:
        if n.kind == "text":
            return n.text
        if n.kind == "define":
            return ""
        if n.kind == "action":
            assert n.pipe is not None
            value = self.pipeline(n.pipe, dot, scope)
            return "" if n.pipe.decl else to_text(value)
        if n.kind in ("if", "with"):
            for cond, body in n.branches:
                inner = _child(scope)
                value = self.pipeline(cond, dot, inner)
                if truth(value):
                    return self.render(body, value if n.kind == "with" else dot, inner)
            return self.render(n.orelse, dot, _child(scope))
        if n.kind == "range":
            assert n.pipe is not None
            inner = _child(scope)
            pipe = Pipeline([], False, n.pipe.cmds, n.pipe.where)
            coll = self.pipeline(pipe, dot, inner)
            if isinstance(coll, dict):
                pairs: list[tuple[Any, Any]] = [(k, coll[k]) for k in sorted(coll)]
            elif isinstance(coll, (list, tuple)):
                pairs = list(enumerate(coll))
            elif isinstance(coll, int) and not isinstance(coll, bool):
                pairs = [(i, i) for i in range(coll)]
            elif coll is None:
                pairs = []
            else:
                raise TemplateError(f"{n.where}: range over {type(coll).__name__}")
            if not pairs:
                return self.render(n.orelse, dot, _child(scope))
            out = []
            for k, v in pairs:
                body_scope = _child(inner)
                if len(n.pipe.decl) == 1:
                    body_scope[n.pipe.decl[0]] = v
                elif len(n.pipe.decl) == 2:
                    body_scope[n.pipe.decl[0]], body_scope[n.pipe.decl[1]] = k, v
                out.append(self.render(n.body, v, body_scope))
            return "".join(out)
        if n.kind == "template":
            arg = self.pipeline(n.pipe, dot, _child(scope)) if n.pipe else None
            return self.include(n.name, arg, n.where)
        raise TemplateError(f"{n.where}: unknown node {n.kind}")

    def include(self, name: str, dot: Any, where: str) -> str:
        node = self.defines.get(name)
        if node is None:
            raise TemplateError(f"{where}: no template {name!r} defined")
        self.depth += 1
        if self.depth > 100:
            raise TemplateError(f"{where}: include nested too deeply ({name!r} recursion?)")
        try:
            return self.render(node.body, dot, {"$": dot})
        finally:
            self.depth -= 1

    def pipeline(self, p: Pipeline, dot: Any, scope: Scope) -> Any:
        value: Any = None
        for i, cmd in enumerate(p.cmds):
            value = self.command(cmd, dot, scope, p.where, piped=(value,) if i else ())
        for name in p.decl:
            if not p.assign:
                scope[name] = value  # ':=' declares in the innermost block
                continue
            # '=' sets the variable where it was declared, as Go's text/template does:
            # an assignment inside if/range/with is seen after the block ends
            home = next((m for m in _maps(scope) if name in m), None)
            if home is None:
                raise TemplateError(f"{p.where}: undefined variable {name}")
            home[name] = value
        return value

    def command(
        self, cmd: list[Any], dot: Any, scope: Scope, where: str, piped: tuple[Any, ...]
    ) -> Any:
        head = cmd[0]
        if head[0] == "func":
            name = head[1]
            args = [self.term(t, dot, scope, where) for t in cmd[1:]] + list(piped)
            if name == "include":
                if len(args) != 2:
                    raise TemplateError(f"{where}: include needs a name and a context")
                return self.include(to_text(args[0]), args[1], where)
            if name == "tpl":
                if len(args) != 2:
                    raise TemplateError(f"{where}: tpl needs a string and a context")
                return self.render(
                    parse(to_text(args[0]), f"{where}(tpl)"), args[1], {"$": args[1]}
                )
            fn = FUNCS.get(name)
            if fn is None:
                raise TemplateError(f"{where}: function {name!r} not defined")
            try:
                return fn(*args)
            except TemplateError as exc:
                raise TemplateError(f"{where}: {name}: {exc}") from None
            except (TypeError, ValueError) as exc:
                raise TemplateError(f"{where}: {name}: {exc}") from None
        if len(cmd) > 1 or piped:
            raise TemplateError(f"{where}: {head!r} is not a function; cannot take arguments")
        return self.term(head, dot, scope, where)

    def term(self, t: Any, dot: Any, scope: Scope, where: str) -> Any:
        kind = t[0]
        if kind == "lit":
            return t[1]
        if kind == "field":
            return self.walk(dot, t[1], where)
        if kind == "var":
            if t[1] not in scope:
                raise TemplateError(f"{where}: undefined variable {t[1]}")
            return self.walk(scope[t[1]], t[2], where)
        if kind == "sub":
            return self.walk(self.pipeline(t[1], dot, _child(scope)), t[2], where)
        if kind == "func":
            return self.command([t], dot, scope, where, ())
        raise TemplateError(f"{where}: bad term {t!r}")

    @staticmethod
    def walk(value: Any, path: list[str], where: str) -> Any:
        for i, key in enumerate(path):
            if value is None:
                before = "." + ".".join(path[:i]) if i else "."
                raise TemplateError(f"{where}: nil pointer evaluating {before}.{key}")
            if not isinstance(value, dict):
                raise TemplateError(f"{where}: cannot read .{key} of a {type(value).__name__}")
            value = value.get(key)
        return value


# --------------------------------------------------------------------- chart


def merge_values(base: Any, override: Any) -> Any:
    """Helm's values coalescing: maps merge deeply, anything else replaces, null deletes."""
    if not isinstance(base, dict) or not isinstance(override, dict):
        return copy.deepcopy(override)
    out = copy.deepcopy(base)
    for k, v in override.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_values(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def parse_set(expr: str) -> dict[str, Any]:
    """``a.b=value`` -> ``{"a": {"b": value}}`` (value read as YAML: numbers, booleans)."""
    key, sep, raw = expr.partition("=")
    if not sep or not key:
        raise ValueError(f"--set {expr!r}: expected key=value")
    value = yaml.safe_load(raw) if raw else ""
    out: dict[str, Any] = {}
    node = out
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


_CONSTRAINT = re.compile(r"^(>=|<=|>|<|=|!=)?v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(-[0-9A-Za-z.-]+)?$")


def kube_version_allowed(constraint: str, version: str) -> bool:
    """Helm's ``kubeVersion`` check for the forms charts use: space-separated ANDs of
    ``>=``/``<=``/``>``/``<``/``=``/``!=`` versions, ``||`` between alternatives. A
    ``-0`` suffix (any pre-release) compares as the release itself minus pre-releases,
    so ``>=1.34.0-0`` admits ``v1.34.0-eks-1`` and ``<1.39.0-0`` refuses ``v1.39.0``."""
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if m is None:
        raise TemplateError(f"kube version {version!r}: expected vMAJOR.MINOR[.PATCH]")
    have = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    for alternative in constraint.split("||"):
        ok = True
        for part in alternative.split():
            c = _CONSTRAINT.match(part)
            if c is None:
                raise TemplateError(f"Chart.yaml: kubeVersion {constraint!r}: cannot read {part!r}")
            op = c.group(1) or "="
            want = (int(c.group(2)), int(c.group(3) or 0), int(c.group(4) or 0))
            ok = ok and {
                ">=": have >= want, "<=": have <= want, ">": have > want,
                "<": have < want, "=": have == want, "!=": have != want,
            }[op]  # fmt: skip
        if ok:
            return True
    return False


class _ValuesLoader(yaml.SafeLoader):
    """YAML as helm reads a values file (go-yaml v2): y/Y/n/N are booleans too, and a
    timestamp stays a string."""


_ValuesLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ValuesLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN")
)


def _values_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    text = loader.construct_scalar(node)
    if text in ("y", "Y", "n", "N"):
        return text in ("y", "Y")
    return bool(loader.construct_yaml_bool(node))


_ValuesLoader.add_constructor("tag:yaml.org,2002:bool", _values_bool)


def _load_yaml_map(path: Path, what: str) -> dict[str, Any]:
    try:
        data = yaml.load(path.read_text(), Loader=_ValuesLoader)  # a SafeLoader
    except (OSError, yaml.YAMLError) as exc:
        raise TemplateError(f"{what} {path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TemplateError(f"{what} {path}: expected a map at the top")
    if _contains_itself(data):
        # helm: "yaml: anchor 'x' value contains itself" (JSON cannot hold it; written out
        # in full, as toYaml writes an alias, it would never end)
        raise TemplateError(f"{what} {path}: an anchor's value contains itself")
    return data


def _contains_itself(value: Any) -> bool:
    """Whether ``value`` holds itself somewhere below (a YAML alias inside its anchor)."""
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, leaving = stack.pop()
        if leaving:
            on_path.discard(id(item))
            continue
        if not isinstance(item, dict | list):
            continue
        if id(item) in on_path:
            return True
        on_path.add(id(item))
        stack.append((item, True))
        stack.extend((v, False) for v in (item.values() if isinstance(item, dict) else item))
    return False


def render_chart(
    chart_dir: str | Path,
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "drahealth",
    namespace: str = "drahealth",
    kube_version: str = "v1.37.0",
) -> dict[str, str]:
    """Render every template of the chart: ``{"templates/x.yaml": text}``."""
    chart = Path(chart_dir)
    meta = _load_yaml_map(chart / "Chart.yaml", "Chart.yaml")
    for key in ("apiVersion", "name", "version"):
        if key not in meta:
            raise TemplateError(f"Chart.yaml: {key} is missing")
    constraint = meta.get("kubeVersion")
    if constraint and not kube_version_allowed(str(constraint), kube_version):
        raise TemplateError(
            f"chart requires kubeVersion: {constraint} which is incompatible with "
            f"Kubernetes {kube_version}"
        )
    defaults = chart / "values.yaml"
    base = _load_yaml_map(defaults, "values") if defaults.exists() else {}
    merged = merge_values(base, dict(values or {}))
    schema = chart / "values.schema.json"
    if schema.exists():
        _check_schema(schema, merged)
    major, minor = kube_version.lstrip("v").split(".")[:2]
    root = {
        "Values": merged,
        "Release": {
            "Name": release,
            "Namespace": namespace,
            "Service": "Helm",
            "IsInstall": True,
            "IsUpgrade": False,
            "Revision": 1,
        },
        "Chart": {k[:1].upper() + k[1:]: v for k, v in meta.items()},
        "Capabilities": {
            "KubeVersion": {"Version": kube_version, "Major": major, "Minor": minor},
        },
    }
    files = sorted((chart / "templates").glob("*"))
    parsed: dict[str, list[Node]] = {}
    defines: dict[str, Node] = {}
    for f in files:
        if f.suffix not in (".yaml", ".yml", ".tpl", ".txt"):
            continue
        rel = f"templates/{f.name}"
        nodes = parse(f.read_text(), rel)
        parsed[rel] = nodes
        for n in nodes:
            if n.kind == "define":
                defines[n.name] = n
    renderer = _Renderer(defines, root)
    out: dict[str, str] = {}
    for rel, nodes in parsed.items():
        if Path(rel).name.startswith("_") or rel.endswith(".txt"):
            continue
        root["Template"] = {
            "Name": f"{meta['name']}/{rel}",
            "BasePath": f"{meta['name']}/templates",
        }
        out[rel] = renderer.render(nodes, root, {"$": root})
    return out


def _check_schema(path: Path, values: Mapping[str, Any]) -> None:
    """Validate the merged values against ``values.schema.json``, as helm does."""
    try:
        import jsonschema  # type: ignore[import-untyped]  # a dev dependency, no stubs
    except ImportError:
        raise TemplateError(
            f"{path.name}: checking the values needs the jsonschema package "
            "(pip install jsonschema)"
        ) from None

    try:
        schema = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TemplateError(f"{path.name}: {exc}") from None
    errors = sorted(
        jsonschema.Draft7Validator(schema).iter_errors(values), key=lambda e: list(e.path)
    )
    if errors:
        lines = [f"- {'.'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors]
        raise TemplateError("values don't meet the specifications of the schema(s):\n"
                            + "\n".join(lines))  # fmt: skip


def manifests(rendered: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every non-empty YAML document of the rendered chart, parsed."""
    docs: list[dict[str, Any]] = []
    for rel, text in rendered.items():
        try:
            loaded = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise TemplateError(f"{rel} does not render to valid YAML: {exc}") from None
        for doc in loaded:
            if doc is None:
                continue
            if not isinstance(doc, dict):
                raise TemplateError(f"{rel}: a document is not a map")
            docs.append(doc)
    return docs


def helm_template_output(chart_name: str, rendered: Mapping[str, str]) -> str:
    """What ``helm template`` prints: ``---`` + ``# Source:`` per non-empty template."""
    parts = []
    for rel, text in rendered.items():
        for doc in re.split(r"^---\s*$", text, flags=re.M):
            if doc.strip():
                parts.append(f"---\n# Source: {chart_name}/{rel}\n{doc.strip(chr(10))}\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chart")
    ap.add_argument("-f", "--values", action="append", default=[], help="values file")
    ap.add_argument("--set", action="append", default=[], help="key.path=value")
    ap.add_argument("--release", default="drahealth")
    ap.add_argument("--namespace", default="drahealth")
    ap.add_argument("--kube-version", default="v1.37.0", help="as helm's --kube-version")
    args = ap.parse_args(argv)
    try:
        values: dict[str, Any] = {}
        for f in args.values:
            values = merge_values(values, _load_yaml_map(Path(f), "values"))
        for s in args.set:
            values = merge_values(values, parse_set(s))
        rendered = render_chart(
            args.chart,
            values,
            release=args.release,
            namespace=args.namespace,
            kube_version=args.kube_version,
        )
        manifests(rendered)
    except (TemplateError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    name = _load_yaml_map(Path(args.chart) / "Chart.yaml", "Chart.yaml")["name"]
    sys.stdout.write(helm_template_output(name, rendered))
    return 0


if __name__ == "__main__":
    sys.exit(main())
