"""Bounded, validated decoding of request bodies (JSON, YAML, protobuf) into plain JSON.

Owns the limits on what a request body may be and what an object may grow to:
``MAX_BODY_BYTES`` (3 MiB, the real server's ``--max-request-bytes`` answer),
``MAX_OBJECT_BYTES`` (1.5 MiB encoded, etcd's default request limit),
``MAX_DEPTH`` (nesting of arrays and objects in a body; ``MAX_OBJECT_DEPTH`` for a
stored object, whose ``managedFields`` mirror it a few levels deeper), the YAML limits
(``MAX_YAML_BYTES`` for YAML that is not JSON, the alias budget), and the
normalisation every decoded body goes through before anything else sees it: the result
holds only ``dict`` (string keys), ``list``, ``str``, ``int``, finite ``float``,
``bool`` and ``None``, with no shared or cyclic containers, so anything built from it
can be encoded by the response encoder.

Text policy: JSON bodies follow Go's ``encoding/json`` (and so the real API server):
invalid UTF-8 and lone surrogate escapes become U+FFFD. YAML bodies with a lone
surrogate escape are rejected (``found invalid Unicode character escape code``, as the
real YAML decoder does); protobuf strings with invalid UTF-8 are rejected naming the
field (``_protobuf``). Every failure is a ``DecodeError`` with a message naming what was
wrong; the server answers it with 400, or 413 for ``TooLarge``.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from itertools import accumulate
from typing import Any

import msgspec
import yaml

JSON = dict[str, Any]

MAX_BODY_BYTES = 3 * 1024 * 1024
MAX_OBJECT_BYTES = 3 * 512 * 1024
MAX_DEPTH = 100
MAX_OBJECT_DEPTH = 150
MAX_YAML_ALIAS_NODES = 10_000
MAX_YAML_BYTES = 128 * 1024

_SURROGATES = re.compile("[\ud800-\udfff]")
_JSON_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class DecodeError(ValueError):
    """The body cannot be decoded into an acceptable object (the server answers 400)."""


class TooLarge(DecodeError):
    """A body or an object exceeds a size limit (the server answers 413)."""


class _NotJSON(DecodeError):
    """The text is not JSON at all (as opposed to JSON that breaks a rule)."""


def body_too_large() -> TooLarge:
    return TooLarge(f"Request entity too large: limit is {MAX_BODY_BYTES}")


# --------------------------------------------------------------------------- measuring


def encoded_size(value: Any) -> int:
    """The size of ``value`` as the server encodes it; ``DecodeError`` if it cannot be."""
    try:
        return len(msgspec.json.encode(value))
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError) as e:
        raise DecodeError(f"the object cannot be encoded as JSON: {e}") from e


def check_object(obj: Any) -> int:
    """Encode ``obj`` as the server would and return its size.

    ``TooLarge`` over ``MAX_OBJECT_BYTES``; ``DecodeError`` when it is nested deeper than
    ``MAX_OBJECT_DEPTH`` or the response encoder cannot encode it at all, so such an
    object never reaches the store.
    """
    try:
        raw = msgspec.json.encode(obj)
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError) as e:
        raise DecodeError(f"the object cannot be encoded as JSON: {e}") from e
    if len(raw) > MAX_OBJECT_BYTES:
        raise TooLarge(
            f"Request entity too large: the object would be {len(raw)} bytes, "
            f"limit is {MAX_OBJECT_BYTES}"
        )
    depth = _json_depth(raw, MAX_OBJECT_DEPTH)
    if depth > MAX_OBJECT_DEPTH:
        raise DecodeError(
            f"the object would be nested {depth} levels deep; the limit is {MAX_OBJECT_DEPTH}"
        )
    return len(raw)


# --------------------------------------------------------------------------- normalising


def _key(k: Any, path: str) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, bool):
        return "true" if k else "false"
    if k is None:
        return "null"
    if isinstance(k, int | float):
        return str(k)
    raise DecodeError(f"unsupported map key {k!r} at {path or '<root>'}: keys must be strings")


def _where(path: list[str]) -> str:
    return "".join(path).lstrip(".") or "<root>"


def normalize(value: Any, *, replace_invalid_text: bool) -> Any:
    """A fresh plain-JSON copy of ``value`` (iterative; shared containers are copied).

    Strings with lone surrogates are repaired with U+FFFD when ``replace_invalid_text``
    and rejected otherwise; non-finite numbers, non-JSON values, non-string keys that are
    not scalars and nesting deeper than ``MAX_DEPTH`` are rejected.
    """

    def text(s: str, path: list[str]) -> str:
        if not _SURROGATES.search(s):
            return s
        if replace_invalid_text:
            return _SURROGATES.sub("\ufffd", s)
        raise DecodeError(
            f"invalid Unicode (a lone surrogate) in the string at {_where(path)}: "
            "found invalid Unicode character escape code"
        )

    root: list[Any] = [None]
    # (source value, destination container, destination key/index, depth, path)
    stack: list[tuple[Any, Any, Any, int, list[str]]] = [(value, root, 0, 0, [])]
    while stack:
        v, dest, slot, depth, path = stack.pop()
        if isinstance(v, dict):
            if depth >= MAX_DEPTH:
                raise DecodeError(
                    f"the object is nested deeper than {MAX_DEPTH} levels at {_where(path)}"
                )
            out: JSON = {}
            dest[slot] = out
            for k, item in v.items():
                key = text(_key(k, _where(path)), path)
                sub = [*path, f".{key}"] if depth < 20 else path
                stack.append((item, out, key, depth + 1, sub))
        elif isinstance(v, list | tuple):
            if depth >= MAX_DEPTH:
                raise DecodeError(
                    f"the object is nested deeper than {MAX_DEPTH} levels at {_where(path)}"
                )
            items: list[Any] = [None] * len(v)
            dest[slot] = items
            for i, item in enumerate(v):
                sub = [*path, f"[{i}]"] if depth < 20 else path
                stack.append((item, items, i, depth + 1, sub))
        elif isinstance(v, str):
            dest[slot] = text(v, path)
        elif isinstance(v, bool) or v is None or isinstance(v, int):
            dest[slot] = v
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise DecodeError(f"unsupported value {v!r} at {_where(path)}: not a JSON number")
            dest[slot] = v
        else:
            raise DecodeError(
                f"unsupported value of type {type(v).__name__} at {_where(path)}: "
                "only JSON values are accepted"
            )
    return root[0]


# --------------------------------------------------------------------------- JSON


def _json_depth(raw: bytes, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a JSON text, computed without recursion (strings skipped).

    Returns 0 when the text cannot be deeper than ``limit`` (few brackets).
    """
    skeleton = _JSON_STRINGS.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if skeleton.count(b"[") + skeleton.count(b"{") <= limit:
        return 0
    return max(accumulate(map(_STEP.__getitem__, skeleton)), default=0)


def _reject_constant(name: str) -> Any:
    raise DecodeError(f"invalid JSON number {name}")


def decode_json(raw: bytes) -> Any:
    """Decode a JSON body: bounded depth, Go's text repair, plain JSON out."""
    if len(raw) > MAX_BODY_BYTES:
        raise body_too_large()
    depth = _json_depth(raw)
    if depth > MAX_DEPTH:
        raise DecodeError(f"the JSON body is nested {depth} levels deep; the limit is {MAX_DEPTH}")
    try:
        # Fast path: valid UTF-8, no lone surrogates, finite numbers -> plain JSON already.
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        pass
    text = raw.decode("utf-8", "replace")
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except DecodeError:
        raise
    except (ValueError, RecursionError) as e:
        raise _NotJSON(f"json parse error: {e}") from e
    return normalize(value, replace_invalid_text=True)


# --------------------------------------------------------------------------- YAML


_FastLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_FastLoader):  # type: ignore[misc]
    """Safe YAML (libyaml when present) with timestamps and binary kept as strings.

    Map keys become strings as they are built (``1`` and ``true`` stay distinct keys
    ``"1"`` and ``"true"``, as in the real server's YAML-to-JSON conversion).
    """

    def construct_mapping(self, node: Any, deep: bool = False) -> JSON:
        if not isinstance(node, yaml.MappingNode):
            raise DecodeError(f"yaml: expected a mapping node, got {node.id}")
        self.flatten_mapping(node)
        out: JSON = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            out[_key(key, "")] = self.construct_object(value_node, deep=deep)
        return out


def _scalar_string(loader: Any, node: yaml.Node) -> Any:
    return loader.construct_scalar(node)


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _scalar_string)
_Loader.add_constructor("tag:yaml.org,2002:binary", _scalar_string)

_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _check_yaml_depth(text: str) -> None:
    """Walk the event stream (no recursion) and reject nesting deeper than ``MAX_DEPTH``."""
    depth = 0
    for ev in yaml.parse(text, Loader=_Loader):
        if isinstance(ev, _OPEN):
            depth += 1
            if depth > MAX_DEPTH:
                line = ev.start_mark.line + 1 if ev.start_mark is not None else 0
                raise DecodeError(
                    f"the YAML body is nested deeper than {MAX_DEPTH} levels (line {line})"
                )
        elif isinstance(ev, _CLOSE):
            depth -= 1


def _check_aliases(root: yaml.Node) -> None:
    """Reject cycles and alias expansion beyond ``MAX_YAML_ALIAS_NODES`` or the body limit."""
    nodes: dict[int, int] = {}
    weight: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        ident = id(node)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            on_path.discard(ident)
            nodes[ident] = 1 + sum(nodes[id(c)] for c in children)
            weight[ident] = 2 + sum(weight[id(c)] for c in children)
            continue
        if ident in nodes:
            continue
        if ident in on_path:
            raise DecodeError("yaml: document contains a cycle (an anchor refers to itself)")
        if not children:
            nodes[ident] = 1
            weight[ident] = 2 + len(str(node.value))
            continue
        on_path.add(ident)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in nodes)
    expanded = nodes[id(root)]
    if expanded - len(nodes) > MAX_YAML_ALIAS_NODES or weight[id(root)] > MAX_BODY_BYTES:
        raise DecodeError(
            "yaml: document contains excessive aliasing "
            f"(aliases expand it to {expanded} values; at most {MAX_YAML_ALIAS_NODES} "
            f"may come from aliases and at most {MAX_BODY_BYTES} bytes in all)"
        )


def decode_yaml(raw: bytes) -> Any:
    """Decode a single-document YAML body: bounded depth and aliasing, plain JSON out.

    A body that is a JSON object or array (what kubectl sends as apply patches) is
    decoded as JSON, which is much faster and follows the JSON text policy.
    """
    if len(raw) > MAX_BODY_BYTES:
        raise body_too_large()
    if raw.lstrip()[:1] in (b"{", b"["):
        with contextlib.suppress(_NotJSON):
            return decode_json(raw)
    if len(raw) > MAX_YAML_BYTES:
        raise TooLarge(
            f"Request entity too large: a YAML body that is not JSON is limited to "
            f"{MAX_YAML_BYTES} bytes (send JSON for larger bodies)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DecodeError(f"yaml: invalid UTF-8 at byte {e.start}") from e
    loader = _Loader(text)
    try:
        _check_yaml_depth(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _check_aliases(node)
        value = loader.construct_document(node)
    except DecodeError:
        raise
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as e:
        raise DecodeError(f"yaml: {e}") from e
    finally:
        loader.dispose()
    return normalize(value, replace_invalid_text=False)


__all__ = [
    "MAX_BODY_BYTES",
    "MAX_DEPTH",
    "MAX_OBJECT_BYTES",
    "MAX_OBJECT_DEPTH",
    "MAX_YAML_ALIAS_NODES",
    "MAX_YAML_BYTES",
    "DecodeError",
    "TooLarge",
    "body_too_large",
    "check_object",
    "decode_json",
    "decode_yaml",
    "encoded_size",
    "normalize",
]
