"""How the listing commands print rows: the ``-o`` formats, ages and plain tables.

Owns, for ``status``, ``pods`` and ``history``:

* :data:`OUTPUT` (the ``-o/--output`` option) and :func:`parse_output`: ``table`` (the
  default), ``wide``, ``json``, ``yaml``, ``name``, ``jsonpath=TEMPLATE`` and
  ``custom-columns=HEADER:PATH,...``;
* :func:`human_age`: kubectl's age spelling (``5s``, ``3m12s``, ``2d4h``) for tables;
  machine output carries RFC 3339 times instead;
* :func:`table_text`: columns left-aligned, three spaces apart, no leading spaces, no
  colour (text labels, not colour, carry meaning);
* :func:`jsonpath` and :func:`jsonpath_template`: the subset of kubectl's JSONPath
  templates that listing needs (fields, ``[n]``, ``[a:b]``, ``[*]``, ``..name``, filters
  ``[?(@.f==v)]``, ``{range}...{end}`` and quoted literals);
* :func:`emit`: one of the formats for a list of rows, and ``No resources found`` on
  stderr for an empty list in a table format.

JSON and YAML print the rows as a list; ``jsonpath`` sees them as kubectl's list object
(``{"kind": "List", "items": [...]}``), so ``{.items[*].device}`` works as it does there.
Every value shown comes from :func:`drahealth._text.printable` (no control characters).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import click
import yaml

from drahealth._text import json_text, printable

__all__ = [
    "OUTPUT",
    "Output",
    "emit",
    "human_age",
    "jsonpath",
    "jsonpath_template",
    "parse_output",
    "table_text",
]

#: Longest template or column list accepted (a bound on hostile input).
MAX_SPEC = 4096
#: Columns ``-o custom-columns=`` may name.
MAX_COLUMNS = 64
#: Most results one JSONPath expression may produce before it is refused.
MAX_RESULTS = 100_000


class JSONPathError(ValueError):
    """A JSONPath template or expression that cannot be parsed; the message says where."""


@dataclass(frozen=True)
class Output:
    """A parsed ``-o`` value: ``kind`` is the format, ``spec`` its template or columns."""

    kind: str
    spec: str = ""
    columns: tuple[tuple[str, str], ...] = ()

    @property
    def machine(self) -> bool:
        """Output a program reads (notes and headers then go to stderr)."""
        return self.kind in ("json", "yaml", "name", "jsonpath", "custom-columns")

    @property
    def wide(self) -> bool:
        return self.kind == "wide"


_SIMPLE = ("table", "wide", "json", "yaml", "name")


def parse_output(text: str, simple: Sequence[str] = _SIMPLE) -> Output:
    """``-o`` text -> :class:`Output`; a click usage error (exit 2) names what is wrong."""
    if len(text) > MAX_SPEC:
        raise click.BadParameter(f"at most {MAX_SPEC} characters", param_hint="-o")
    if text in simple:
        return Output(text)
    kind, sep, spec = text.partition("=")
    if sep and kind == "jsonpath":
        try:
            _parse_template(spec)
        except JSONPathError as exc:
            raise click.BadParameter(f"jsonpath: {exc}", param_hint="-o") from exc
        return Output("jsonpath", spec)
    if sep and kind == "custom-columns":
        columns = []
        parts = spec.split(",")
        if len(parts) > MAX_COLUMNS:
            raise click.BadParameter(
                f"custom-columns: at most {MAX_COLUMNS} columns, got {len(parts)}", param_hint="-o"
            )
        for part in parts:
            header, colon, path = part.partition(":")
            if not colon or not header or not path:
                raise click.BadParameter(
                    f"custom-columns: {part!r} must be HEADER:PATH, e.g. DEVICE:.device",
                    param_hint="-o",
                )
            try:
                _parse_path(_strip_braces(path))
            except JSONPathError as exc:
                raise click.BadParameter(
                    f"custom-columns {header}: {exc}", param_hint="-o"
                ) from exc
            columns.append((header, _strip_braces(path)))
        return Output("custom-columns", spec, tuple(columns))
    formats = ", ".join([*simple, "jsonpath=TEMPLATE", "custom-columns=HEADER:PATH,..."])
    raise click.BadParameter(f"{text!r}: use one of {formats}", param_hint="-o")


def _output_callback(_ctx: click.Context, _param: click.Parameter, value: str) -> Output:
    return parse_output(value)


#: ``-o/--output`` for the listing commands; the command receives an :class:`Output`.
OUTPUT = click.option(
    "-o",
    "--output",
    default="table",
    show_default=True,
    metavar="FORMAT",
    callback=_output_callback,
    help="table, wide, json, yaml, name, jsonpath=TEMPLATE or custom-columns=HEADER:PATH,...",
)


def human_age(seconds: float | None) -> str:
    """A duration as kubectl shows ages: ``45s``, ``3m12s``, ``25m``, ``5h3m``, ``2d4h``,
    ``30d``, ``2y10d``; ``<unknown>`` for None; a small negative (clock skew) is ``0s``."""
    if seconds is None:
        return "<unknown>"
    if seconds < -1:
        return "<invalid>"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // 86400

    def two(big: int, big_unit: str, small: int, small_unit: str) -> str:
        return f"{big}{big_unit}" if small == 0 else f"{big}{big_unit}{small}{small_unit}"

    if m < 10:
        return two(m, "m", s % 60, "s")
    if h < 3:
        return f"{m}m"
    if h < 8:
        return two(h, "h", m % 60, "m")
    if h < 48:
        return f"{h}h"
    if h < 192:
        return two(d, "d", h % 24, "h")
    if d < 365 * 2:
        return f"{d}d"
    y = d // 365
    if y < 8:
        return two(y, "y", d % 365, "d")
    return f"{y}y"


def table_text(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain table: columns left-aligned, three spaces apart, no trailing spaces."""
    cells = [[printable(h) for h in headers]] + [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        line = "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
        lines.append(line.rstrip())
    return "\n".join(lines)


# --- JSONPath (kubectl's template flavour) ---------------------------------------------

_TOKEN = re.compile(
    r"""
      \.\.(?P<deep>[A-Za-z0-9_\-/]+|\*)          # ..name / ..*
    | \.(?P<field>[A-Za-z0-9_\-/]+|\*)           # .name / .*
    """,
    re.VERBOSE,
)
_FILTER = re.compile(
    r"""^\?\(\s*@(?P<path>(?:\.[A-Za-z0-9_\-/]+|\[[^\]]*\])*)
        (?:\s*(?P<op>==|!=|<=|>=|<|>)\s*(?P<value>'[^']*'|"[^"]*"|-?\d+(?:\.\d+)?|true|false|null))?
        \s*\)$""",  # no two runs of \s* side by side: a failed match is linear, not quadratic
    re.VERBOSE,
)

Step = tuple[str, Any]


def _strip_braces(path: str) -> str:
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1].strip()
    return path


def _parse_path(path: str) -> list[Step]:
    """``.a.b[0][*]..c`` (a leading ``$`` or ``@`` is the root) -> steps."""
    text = path.strip()
    if text.startswith(("$", "@")):
        text = text[1:]
    if text in ("", "."):
        return []
    steps: list[Step] = []
    pos = 0
    while pos < len(text):
        if text[pos] == "[":  # scanned by hand: one pass, no backtracking
            end = _bracket_end(text, pos, path)
            steps.append(_bracket(text[pos + 1 : end].strip(), path))
            pos = end + 1
            continue
        m = _TOKEN.match(text, pos)
        if m is None:
            raise JSONPathError(f"unexpected {text[pos:][:40]!r} in {path[:80]!r}")
        pos = m.end()
        if m.group("deep") is not None:
            steps.append(("deep", m.group("deep")))
        elif m.group("field") is not None:
            name = m.group("field")
            steps.append(("all", None) if name == "*" else ("field", name))
    return steps


def _bracket_end(text: str, start: int, path: str) -> int:
    """Index of the ``]`` closing the ``[`` at ``start`` (quoted text may hold ``]``)."""
    quote = ""
    for i in range(start + 1, len(text)):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "]":
            return i
    what = f"unclosed {quote} quote" if quote else "unclosed ["
    raise JSONPathError(f"unexpected {text[start:][:40]!r} in {path[:80]!r}: {what}")


def _bracket(inner: str, path: str) -> Step:
    if inner == "*":
        return ("all", None)
    if inner[:1] in "'\"" and inner[-1:] == inner[:1] and len(inner) >= 2:
        return ("field", inner[1:-1])
    if re.fullmatch(r"-?\d+", inner):
        return ("index", int(inner))
    m = re.fullmatch(r"(-?\d*):(-?\d*)", inner)
    if m is not None:
        lo, hi = (int(g) if g else None for g in m.groups())
        return ("slice", (lo, hi))
    f = _FILTER.match(inner)
    if f is not None:
        value: Any = None
        if f.group("op"):
            value = json.loads(f.group("value").replace("'", '"'))
        return ("filter", (_parse_path(f.group("path") or ""), f.group("op"), value))
    raise JSONPathError(f"cannot read [{inner[:80]}] in {path[:80]!r}")


def _children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list):
        return list(value)
    return []


def _descend(value: Any) -> Iterator[Any]:
    yield value
    for child in _children(value):
        yield from _descend(child)


def _compare(left: Any, op: str, right: Any) -> bool:
    try:
        return bool(
            {
                "==": lambda: left == right,
                "!=": lambda: left != right,
                "<": lambda: left < right,
                ">": lambda: left > right,
                "<=": lambda: left <= right,
                ">=": lambda: left >= right,
            }[op]()
        )
    except TypeError:
        return False


def _apply(steps: list[Step], values: list[Any]) -> list[Any]:
    for kind, arg in steps:
        out: list[Any] = []
        for v in values:
            if kind == "field":
                if isinstance(v, dict) and arg in v:
                    out.append(v[arg])
            elif kind == "all":
                out.extend(_children(v))
            elif kind == "index":
                if isinstance(v, list) and -len(v) <= arg < len(v):
                    out.append(v[arg])
            elif kind == "slice":
                if isinstance(v, list):
                    out.extend(v[arg[0] : arg[1]])
            elif kind == "deep":
                for d in _descend(v):
                    if arg == "*":
                        out.extend(_children(d))
                    elif isinstance(d, dict) and arg in d:
                        out.append(d[arg])
            elif kind == "filter":
                sub, op, want = arg
                for item in v if isinstance(v, list) else []:
                    got = _apply(sub, [item])
                    if (op is None and got and got[0] not in (None, False)) or (
                        op is not None and got and _compare(got[0], op, want)
                    ):
                        out.append(item)
            if len(out) > MAX_RESULTS:
                raise JSONPathError(f"more than {MAX_RESULTS} results")
        values = out
    return values


def jsonpath(path: str, data: Any) -> list[Any]:
    """Every value ``path`` (e.g. ``.items[*].device``) selects in ``data``."""
    return _apply(_parse_path(_strip_braces(path)), [data])


def _show(value: Any) -> str:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, int | float):
        return printable(json_text(value))
    return printable(json_text(value))


@dataclass
class _Node:
    kind: str  # "text", "path", "range"
    text: str = ""
    steps: list[Step] | None = None
    body: list[_Node] | None = None


def _literal(text: str) -> str:
    try:
        value = json.loads(text if text.startswith('"') else '"' + text[1:-1] + '"')
    except ValueError as exc:
        raise JSONPathError(f"bad literal {text}") from exc
    return str(value)


def _parse_template(template: str) -> list[_Node]:
    """kubectl's template: text, ``{path}``, ``{"literal"}``, ``{range path}...{end}``."""
    stack: list[list[_Node]] = [[]]
    pos = 0
    while pos < len(template):
        start = template.find("{", pos)
        if start < 0:
            stack[-1].append(_Node("text", template[pos:]))
            break
        if start > pos:
            stack[-1].append(_Node("text", template[pos:start]))
        end = _closing(template, start)
        action = template[start + 1 : end].strip()
        pos = end + 1
        if action.startswith("range ") or action == "range":
            node = _Node("range", steps=_parse_path(action[5:]), body=[])
            stack[-1].append(node)
            assert node.body is not None
            stack.append(node.body)
        elif action == "end":
            if len(stack) == 1:
                raise JSONPathError("{end} without {range}")
            stack.pop()
        elif action[:1] in "'\"":
            stack[-1].append(_Node("text", _literal(action)))
        else:
            stack[-1].append(_Node("path", steps=_parse_path(action)))
    if len(stack) != 1:
        raise JSONPathError("{range} without {end}")
    return stack[0]


def _closing(template: str, start: int) -> int:
    quote = ""
    for i in range(start + 1, len(template)):
        ch = template[i]
        if quote:
            if ch == "\\":
                continue
            if ch == quote and template[i - 1] != "\\":
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "}":
            return i
    raise JSONPathError(f"unclosed {{ at character {start + 1}")


def _render(nodes: list[_Node], data: Any, out: list[str]) -> None:
    for node in nodes:
        if node.kind == "text":
            out.append(node.text)
        elif node.kind == "path":
            assert node.steps is not None
            out.append(" ".join(_show(v) for v in _apply(node.steps, [data])))
        else:
            assert node.steps is not None and node.body is not None
            for item in _apply(node.steps, [data]):
                _render(node.body, item, out)


def jsonpath_template(template: str, data: Any) -> str:
    """``template`` (e.g. ``{range .items[*]}{.device}{"\\n"}{end}``) filled from ``data``."""
    out: list[str] = []
    _render(_parse_template(template), data, out)
    return "".join(out)


# --- emitting rows ---------------------------------------------------------------------


def emit(
    rows: list[dict[str, Any]],
    output: Output,
    *,
    machine: Callable[[dict[str, Any]], dict[str, Any]] = lambda r: r,
    table: Callable[[list[dict[str, Any]], bool], tuple[Sequence[str], list[list[str]]]],
    name: Callable[[dict[str, Any]], str] | None = None,
    empty: str,
) -> None:
    """Print ``rows`` as ``output`` asks.

    ``machine`` turns a row into its JSON/YAML form (RFC 3339 times), ``table`` gives the
    headers and cells (``wide`` or not), ``name`` the ``kind/name`` of a row (None: ``-o
    name`` is not offered), ``empty`` the line said on stderr when a table is empty.
    """
    kind = output.kind
    if kind in ("table", "wide"):
        if not rows:
            click.echo(empty, err=True)
            return
        headers, cells = table(rows, kind == "wide")
        click.echo(table_text(headers, cells))
        return
    docs = [machine(r) for r in rows]
    if kind == "json":
        click.echo(json_text(docs, indent=2))
    elif kind == "yaml":
        click.echo(yaml.safe_dump(docs, sort_keys=False, allow_unicode=True), nl=False)
    elif kind == "name":
        if name is None:
            raise click.UsageError("-o name: this command lists no named objects")
        seen: set[str] = set()
        for r in rows:
            n = printable(name(r))
            if n not in seen:
                seen.add(n)
                click.echo(n)
    elif kind == "jsonpath":  # as kubectl: exactly the template, no newline added
        data = {"apiVersion": "v1", "kind": "List", "items": docs}
        click.echo(jsonpath_template(output.spec, data), nl=False)
    elif kind == "custom-columns":
        if not rows:
            click.echo(empty, err=True)
            return
        cells = []
        for d in docs:
            line = []
            for _header, path in output.columns:
                found = jsonpath(path, d)
                line.append(",".join(_show(v) for v in found) if found else "<none>")
            cells.append(line)
        click.echo(table_text([h for h, _ in output.columns], cells))
