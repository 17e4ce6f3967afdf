"""Patch algorithms: JSON merge patch, JSON patch and strategic merge patch.

Pure functions over JSON-like values (dicts, lists, scalars); inputs are never
mutated. Strategic merge needs to know which lists merge by key: callers pass a
``KeyFn`` mapping a field path (list indices left out, e.g.
``("status", "containerStatuses", "allocatedResourcesStatus")``) to the merge key,
and a ``SetFn`` saying which primitive lists merge as sets (``metadata.finalizers``).
Supported directives: ``$patch: replace|delete`` (on maps and list items),
``$deleteFromPrimitiveList/<field>``; ``$setElementOrder/<field>`` and ``$retainKeys``
are accepted and ignored.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import msgspec

Path = tuple[str, ...]
KeyFn = Callable[[Path], "str | None"]
SetFn = Callable[[Path], bool]


MAX_JSON_PATCH_OPERATIONS = 10_000
#: Most bytes a patched document may reach while a patch is applied (the request limit).
MAX_PATCH_BYTES = 3 * 1024 * 1024


class PatchError(ValueError):
    """A patch could not be applied (the server answers 422)."""


class PatchTooLarge(PatchError):
    """A patch has too many operations or would grow the object too far (413)."""


def _size(value: Any) -> int:
    try:
        return len(msgspec.json.encode(value))
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError) as e:
        raise PatchError(f"the patched value cannot be encoded: {e}") from e


def _no_keys(_: Path) -> str | None:
    return None


def _no_sets(_: Path) -> bool:
    return False


# --------------------------------------------------------------------------- RFC 7386


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 JSON merge patch; returns a new value."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --------------------------------------------------------------------------- RFC 6902


def _pointer(ptr: str) -> list[str]:
    if ptr == "":
        return []
    if not ptr.startswith("/"):
        raise PatchError(f"invalid JSON pointer {ptr!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in ptr[1:].split("/")]


def _index(container: list[Any], token: str, *, for_add: bool) -> int:
    if token == "-" and for_add:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}")
    idx = int(token)
    limit = len(container) if for_add else len(container) - 1
    if idx > limit:
        raise PatchError(f"array index {idx} out of range")
    return idx


def _parent(doc: Any, tokens: list[str]) -> Any:
    cur = doc
    for tok in tokens[:-1]:
        if isinstance(cur, dict):
            if tok not in cur:
                raise PatchError(f"path element {tok!r} not found")
            cur = cur[tok]
        elif isinstance(cur, list):
            cur = cur[_index(cur, tok, for_add=False)]
        else:
            raise PatchError(f"cannot descend into a scalar at {tok!r}")
    return cur


def _get(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        return doc
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path element {last!r} not found")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, for_add=False)]
    raise PatchError(f"cannot read {last!r} from a scalar")


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path element {last!r} not found")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, for_add=False))
    raise PatchError(f"cannot remove {last!r} from a scalar")


def _add(doc: Any, tokens: list[str], value: Any, *, replace: bool = False) -> Any:
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"path element {last!r} not found")
        parent[last] = value
    elif isinstance(parent, list):
        if replace:
            parent[_index(parent, last, for_add=False)] = value
        else:
            parent.insert(_index(parent, last, for_add=True), value)
    else:
        raise PatchError(f"cannot add {last!r} to a scalar")
    return doc


def json_patch(target: Any, ops: Any, max_bytes: int = MAX_PATCH_BYTES) -> Any:
    """Apply an RFC 6902 JSON patch (add, remove, replace, move, copy, test).

    At most ``MAX_JSON_PATCH_OPERATIONS`` operations. The document's size is tracked as
    it grows (its size at the start plus every value added, replaced or copied, removals
    not subtracted) and the patch fails with ``PatchTooLarge`` as soon as that passes
    ``max_bytes``, so neither the result nor the work of building it can explode.
    """
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    if len(ops) > MAX_JSON_PATCH_OPERATIONS:
        raise PatchTooLarge(
            f"The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, "
            f"got {len(ops)}"
        )
    doc = copy.deepcopy(target)
    grown = _size(doc)

    def grow(value: Any) -> Any:
        nonlocal grown
        grown += _size(value)
        if grown > max_bytes:
            raise PatchTooLarge(
                f"Request entity too large: the patch grows the object past {max_bytes} bytes"
            )
        return copy.deepcopy(value)

    try:
        for op in ops:
            if not isinstance(op, dict) or "op" not in op or "path" not in op:
                raise PatchError(f"invalid JSON patch operation {op!r:.200}")
            kind, path = op["op"], _pointer(str(op["path"]))
            if kind in ("add", "replace", "test") and "value" not in op:
                raise PatchError(f"operation {kind!r} needs a value")
            if kind == "add":
                doc = _add(doc, path, grow(op["value"]))
            elif kind == "remove":
                _remove(doc, path)
            elif kind == "replace":
                doc = _add(doc, path, grow(op["value"]), replace=True)
            elif kind in ("move", "copy"):
                if "from" not in op:
                    raise PatchError(f"operation {kind!r} needs 'from'")
                src = _pointer(str(op["from"]))
                value = _remove(doc, src) if kind == "move" else grow(_get(doc, src))
                doc = _add(doc, path, value)
            elif kind == "test":
                if _get(doc, path) != op["value"]:
                    raise PatchError(f"test operation failed at {op['path']!r}")
            else:
                raise PatchError(f"unknown JSON patch operation {kind!r:.100}")
    except RecursionError as e:
        raise PatchError("the patched object is nested too deeply") from e
    return doc


# --------------------------------------------------------------------------- strategic merge

_DIRECTIVE = "$patch"
_DELETED = object()
_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"
_IGNORED_PREFIXES = ("$setElementOrder/", "$retainKeys")


def _is_list_directive(v: Any) -> bool:
    return isinstance(v, dict) and len(v) == 1 and v.get(_DIRECTIVE) in ("delete", "replace")


def strip_directives(value: Any) -> Any:
    """A copy of ``value`` without ``$``-directives and without null map entries."""
    if isinstance(value, dict):
        return {
            k: strip_directives(v)
            for k, v in value.items()
            if not k.startswith("$") and v is not None
        }
    if isinstance(value, list):
        return [strip_directives(v) for v in value if not _is_list_directive(v)]
    return copy.deepcopy(value)


def strategic_merge(
    original: Any,
    patch: Any,
    keys: KeyFn = _no_keys,
    sets: SetFn = _no_sets,
    path: Path = (),
    ordered: bool = False,
) -> Any:
    """Apply a strategic merge patch; returns a new value (``original`` is not mutated).

    ``ordered``: merged lists take upstream's strategic-merge order (see
    :func:`_element_order`); otherwise new items are appended (server-side apply)."""
    if not isinstance(patch, dict):
        return strip_directives(patch)
    directive = patch.get(_DIRECTIVE)
    if directive == "replace":
        return strip_directives({k: v for k, v in patch.items() if k != _DIRECTIVE})
    if directive not in (None, "merge"):
        raise PatchError(f"unknown patch directive {directive!r} at {'.'.join(path) or '<root>'}")
    out: dict[str, Any] = copy.deepcopy(original) if isinstance(original, dict) else {}
    for key, value in patch.items():
        if key == _DIRECTIVE or key.startswith(_IGNORED_PREFIXES):
            continue
        if key.startswith(_DELETE_PRIMITIVE):
            field = key[len(_DELETE_PRIMITIVE) :]
            drop = {canonical(v) for v in (value if isinstance(value, list) else [value])}
            if isinstance(out.get(field), list):
                out[field] = [v for v in out[field] if canonical(v) not in drop]
            continue
        sub = (*path, key)
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            if value.get(_DIRECTIVE) == "delete":
                out.pop(key, None)
            else:
                out[key] = strategic_merge(out.get(key), value, keys, sets, sub, ordered)
        elif isinstance(value, list):
            out[key] = _merge_list(out.get(key), value, keys, sets, sub, ordered)
        else:
            out[key] = value
    return out


def _merge_list(
    original: Any, patch: list[Any], keys: KeyFn, sets: SetFn, path: Path, ordered: bool = False
) -> list[Any]:
    orig = original if isinstance(original, list) else []
    if any(_is_list_directive(v) and v[_DIRECTIVE] == "replace" for v in patch):
        return [strip_directives(v) for v in patch if not _is_list_directive(v)]
    if sets(path):
        merged = copy.deepcopy(orig)
        seen = {canonical(v) for v in merged}
        for v in patch:
            c = canonical(v)
            if c not in seen:
                seen.add(c)
                merged.append(copy.deepcopy(v))
        if not ordered:
            return merged
        return _element_order(merged, [canonical(v) for v in patch],
                              [canonical(v) for v in orig], canonical)  # fmt: skip
    key = keys(path)
    if key is None or not all(isinstance(v, dict) for v in patch):
        return strip_directives(patch)  # type: ignore[no-any-return]
    out: list[Any] = copy.deepcopy(orig)
    # Index the items by merge key (in list order, so the first match wins as a linear
    # scan would find it); a long patch against a long list stays linear.
    where: dict[str, list[int]] = {}
    for i, o in enumerate(out):
        if isinstance(o, dict):
            where.setdefault(canonical(o.get(key)), []).append(i)
    deleted = False
    for item in patch:
        if key not in item:
            raise PatchError(f"map in list {'.'.join(path)} is missing the merge key {key!r}")
        ident = canonical(item[key])
        found = where.get(ident)
        idx = found[0] if found else None
        if item.get(_DIRECTIVE) == "delete":
            if found:
                out[found.pop(0)] = _DELETED
                deleted = True
            continue
        body = {k: v for k, v in item.items() if k != _DIRECTIVE}
        if idx is None:
            where.setdefault(ident, []).append(len(out))
            out.append(strip_directives(body))
        elif item.get(_DIRECTIVE) == "replace":
            out[idx] = strip_directives(body)
        else:
            out[idx] = strategic_merge(out[idx], body, keys, sets, path, ordered)
    merged = [o for o in out if o is not _DELETED] if deleted else out
    if not ordered:
        return merged

    def ident_of(v: Any) -> str:
        return canonical(v.get(key)) if isinstance(v, dict) else canonical(v)

    patch_order = [canonical(v[key]) for v in patch if v.get(_DIRECTIVE) != "delete"]
    return _element_order(merged, patch_order, [ident_of(o) for o in orig], ident_of)


def _element_order(
    merged: list[Any], patch_order: list[str], server_order: list[str], ident: Any
) -> list[Any]:
    """Upstream's ``normalizeElementOrder``: the items the patch names in the patch's
    order, the others in the original's, interleaved by the original order where both
    are known (an item the original lacks goes before the server's remaining ones)."""
    in_patch = set(patch_order)
    patch_pos = {k: i for i, k in reversed(list(enumerate(patch_order)))}
    server_pos = {k: i for i, k in reversed(list(enumerate(server_order)))}
    right = sorted((v for v in merged if ident(v) in in_patch),
                   key=lambda v: patch_pos.get(ident(v), len(patch_pos)))  # fmt: skip
    left = sorted((v for v in merged if ident(v) not in in_patch),
                  key=lambda v: server_pos.get(ident(v), len(server_pos)))  # fmt: skip
    out: list[Any] = []
    i = j = 0
    while i < len(left) or j < len(right):
        if i >= len(left):
            out.append(right[j])
            j += 1
        elif j >= len(right):
            out.append(left[i])
            i += 1
        else:
            li, ri = server_pos.get(ident(left[i])), server_pos.get(ident(right[j]))
            if li is not None and ri is not None and li < ri:
                out.append(left[i])
                i += 1
            else:
                out.append(right[j])
                j += 1
    return out


def canonical(value: Any) -> str:
    """A stable JSON text used to compare and key values."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
