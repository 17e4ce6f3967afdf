"""Server-side apply and field ownership (``metadata.managedFields``), simplified.

Owns field sets (paths such as ``("f:spec", "f:containers", 'k:{"name":"c"}',
"f:image")``), their ``FieldsV1`` encoding, the Apply operation (conflict detection,
removal of fields a manager stopped applying, merging with the same list keys as
strategic merge) and ownership transfer on ordinary updates. Pure functions.

Simplifications against the real structured-merge-diff:
- map-valued fields are not themselves members of a set (only their leaves are),
  so ``FieldsV1`` never carries ``.`` for maps; keyed list items do carry ``.``;
- lists without a registered merge key are atomic (one leaf), ``metadata.finalizers``
  is a set (``v:`` entries);
- a conflict is a leaf the applier sets to a value different from the live one while
  another manager (Apply or Update) owns it; fields another manager owns are never
  removed when the applier stops applying them;
- an applier's Apply and Update entries are separate, and the applier never
  conflicts with itself.

As upstream, ``kubectl apply --server-side`` (manager ``kubectl``) over an object that
``kubectl apply`` managed client-side takes over, without conflict, the fields of the
last-applied annotation that still hold their applied value.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ._patch import KeyFn, SetFn, canonical, strategic_merge, strip_directives

JSON = dict[str, Any]
FieldPath = tuple[str, ...]

SERVER_METADATA = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
        "generateName",
    }
)


@dataclass(frozen=True, slots=True)
class Conflict:
    manager: str
    api_version: str
    path: FieldPath


class ApplyConflict(Exception):
    """Apply would overwrite fields other managers own (and force was not set)."""

    def __init__(self, conflicts: list[Conflict]) -> None:
        self.conflicts = conflicts
        super().__init__(conflict_message(conflicts))


def ownable(obj: JSON, has_status: bool, subresource: str | None) -> JSON:
    """The part of ``obj`` whose fields can be owned through ``subresource``."""
    out = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in SERVER_METADATA}
    if meta:
        out["metadata"] = meta
    if subresource == "status":
        return {"status": out["status"]} if "status" in out else {}
    if has_status:
        out.pop("status", None)
    return out


def field_set(obj: JSON, keys: KeyFn, sets: SetFn) -> set[FieldPath]:
    """All field paths set in ``obj`` (leaves, plus keyed list items themselves)."""
    out: set[FieldPath] = set()
    _walk(obj, (), (), keys, sets, out)
    out.discard(())
    return out


def _walk(
    value: Any, fp: FieldPath, path: tuple[str, ...], keys: KeyFn, sets: SetFn, out: set[FieldPath]
) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _walk(v, (*fp, f"f:{k}"), (*path, k), keys, sets, out)
        return
    if isinstance(value, list) and value:
        if sets(path) and all(not isinstance(v, dict | list) for v in value):
            out.update((*fp, f"v:{canonical(v)}") for v in value)
            return
        key = keys(path)
        if key and all(isinstance(v, dict) and key in v for v in value):
            for item in value:
                ip = (*fp, f"k:{canonical({key: item[key]})}")
                out.add(ip)
                for k, v in item.items():
                    _walk(v, (*ip, f"f:{k}"), (*path, k), keys, sets, out)
            return
    out.add(fp)


def leaves(paths: set[FieldPath]) -> set[FieldPath]:
    prefixes = {p[:i] for p in paths for i in range(1, len(p))}
    return paths - prefixes


def to_fields_v1(paths: Iterable[FieldPath]) -> JSON:
    """Encode a field set as the nested ``FieldsV1`` map."""
    root: JSON = {}
    paths = set(paths)
    for p in sorted(paths):
        node = root
        for pe in p:
            node = node.setdefault(pe, {})
    for p in paths:
        node = root
        for pe in p:
            node = node[pe]
        if node and "." not in node:
            node["."] = {}
    return root


def from_fields_v1(fields: Any, prefix: FieldPath = ()) -> set[FieldPath]:
    """Decode ``FieldsV1`` back into a field set."""
    out: set[FieldPath] = set()
    if not isinstance(fields, dict):
        return out
    for k, v in fields.items():
        if k == ".":
            if prefix:
                out.add(prefix)
        elif isinstance(v, dict) and v:
            out |= from_fields_v1(v, (*prefix, k))
        else:
            out.add((*prefix, k))
    return out


#: Per-call lookup indexes for ``get_at``: (id of a list, key names) -> {key values: item}.
Index = dict[tuple[int, str], Any]


def _find_in_list(cur: list[Any], kind: str, want: Any, index: Index | None) -> tuple[bool, Any]:
    if index is None:
        if kind == "v":
            return want in cur, want
        for i in cur:
            if isinstance(i, dict) and all(i.get(a) == b for a, b in want.items()):
                return True, i
        return False, None
    if kind == "v":
        values = index.get((id(cur), "v"))
        if values is None:
            values = index[(id(cur), "v")] = {canonical(v) for v in cur}
        return canonical(want) in values, want
    names = sorted(want)
    slot = (id(cur), "k:" + json.dumps(names))
    items = index.get(slot)
    if items is None:
        items = {}
        for i in cur:
            if isinstance(i, dict):
                items.setdefault(canonical([i.get(a) for a in names]), i)
        index[slot] = items
    item = items.get(canonical([want[a] for a in names]))
    return item is not None, item


def get_at(obj: Any, fp: FieldPath, index: Index | None = None) -> tuple[bool, Any]:
    """The value at a field path, as ``(found, value)``.

    Pass the same ``index`` dict to many lookups on objects that do not change in
    between: keyed list items are then found through a hash index instead of a scan,
    which keeps field-ownership tracking of long lists linear.
    """
    cur = obj
    for pe in fp:
        kind, _, rest = pe.partition(":")
        if kind == "f":
            if not isinstance(cur, dict) or rest not in cur:
                return False, None
            cur = cur[rest]
        elif kind in ("k", "v"):
            if not isinstance(cur, list):
                return False, None
            want = json.loads(rest)
            if kind == "k" and not isinstance(want, dict):
                return False, None
            found, cur = _find_in_list(cur, kind, want, index)
            if not found:
                return False, None
        else:
            return False, None
    return True, cur


def remove_at(obj: Any, fp: FieldPath) -> None:
    """Remove the field at ``fp`` from ``obj`` in place (no-op when absent)."""
    found, parent = get_at(obj, fp[:-1])
    if not found or not fp:
        return
    kind, _, rest = fp[-1].partition(":")
    if kind == "f" and isinstance(parent, dict):
        parent.pop(rest, None)
    elif kind == "v" and isinstance(parent, list):
        want = json.loads(rest)
        parent[:] = [v for v in parent if v != want]
    elif kind == "k" and isinstance(parent, list):
        want = json.loads(rest)
        parent[:] = [
            i
            for i in parent
            if not (isinstance(i, dict) and all(i.get(a) == b for a, b in want.items()))
        ]


def _doomed(item: Any, values: set[str], keyed: dict[tuple[str, ...], set[str]]) -> bool:
    if values and canonical(item) in values:
        return True
    return isinstance(item, dict) and any(
        canonical([item.get(a) for a in names]) in idents for names, idents in keyed.items()
    )


def remove_all(obj: Any, paths: Iterable[FieldPath]) -> None:
    """``remove_at`` for many paths, one pass per list (linear in the list's length)."""
    by_parent: dict[FieldPath, list[str]] = {}
    for fp in paths:
        if fp:
            by_parent.setdefault(fp[:-1], []).append(fp[-1])
    for parent_path, lasts in by_parent.items():
        found, parent = get_at(obj, parent_path)
        if not found:
            continue
        if isinstance(parent, dict):
            for pe in lasts:
                kind, _, rest = pe.partition(":")
                if kind == "f":
                    parent.pop(rest, None)
            continue
        if not isinstance(parent, list):
            continue
        values: set[str] = set()
        keyed: dict[tuple[str, ...], set[str]] = {}
        for pe in lasts:
            kind, _, rest = pe.partition(":")
            want = json.loads(rest) if kind in ("k", "v") else None
            if kind == "v":
                values.add(canonical(want))
            elif kind == "k" and isinstance(want, dict):
                names = tuple(sorted(want))
                keyed.setdefault(names, set()).add(canonical([want[a] for a in names]))

        parent[:] = [i for i in parent if not _doomed(i, values, keyed)]


def pretty(fp: FieldPath) -> str:
    """``.spec.containers[name="c"].image`` form of a field path."""
    out = []
    for pe in fp:
        kind, _, rest = pe.partition(":")
        if kind == "f":
            out.append("." + rest)
        elif kind == "k":
            items = json.loads(rest)
            out.append("[" + ",".join(f"{k}={json.dumps(v)}" for k, v in items.items()) + "]")
        else:
            out.append(f"[={rest}]")
    return "".join(out)


def conflict_message(conflicts: list[Conflict]) -> str:
    n = len(conflicts)
    head = f"Apply failed with {n} conflict{'s' if n != 1 else ''}: "
    if n == 1:
        c = conflicts[0]
        return head + f'conflict with "{c.manager}" using {c.api_version}: {pretty(c.path)}'
    blocks = []
    by_manager: dict[tuple[str, str], list[FieldPath]] = {}
    for c in conflicts:
        by_manager.setdefault((c.manager, c.api_version), []).append(c.path)
    for (mgr, av), paths in by_manager.items():
        lines = "\n".join(f"- {pretty(p)}" for p in sorted(paths))
        blocks.append(f'conflicts with "{mgr}" using {av}:\n{lines}')
    return head + "\n".join(blocks)


# --------------------------------------------------------------------------- entries


@dataclass(slots=True)
class Entry:
    """One ``managedFields`` entry, with its field set decoded."""

    manager: str
    operation: str
    api_version: str
    time: str
    subresource: str | None
    fields: set[FieldPath]

    @classmethod
    def parse(cls, raw: JSON) -> Entry:
        return cls(
            manager=str(raw.get("manager", "")),
            operation=str(raw.get("operation", "Update")),
            api_version=str(raw.get("apiVersion", "")),
            time=str(raw.get("time", "")),
            subresource=raw.get("subresource") or None,
            fields=from_fields_v1(raw.get("fieldsV1")),
        )

    def dump(self) -> JSON:
        out: JSON = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(self.fields),
        }
        if self.subresource:
            out["subresource"] = self.subresource
        return out

    def same(self, manager: str, operation: str, subresource: str | None) -> bool:
        return (self.manager, self.operation, self.subresource) == (manager, operation, subresource)


def parse_entries(obj: JSON | None) -> list[Entry]:
    raw = ((obj or {}).get("metadata") or {}).get("managedFields") or []
    return [Entry.parse(e) for e in raw if isinstance(e, dict)]


def _find(
    entries: list[Entry],
    manager: str,
    operation: str,
    subresource: str | None,
    api_version: str,
    now: str,
) -> Entry:
    for e in entries:
        if e.same(manager, operation, subresource):
            return e
    e = Entry(manager, operation, api_version, now, subresource, set())
    entries.append(e)
    return e


#: Most ``Update`` managers an object keeps (upstream's ``DefaultMaxUpdateManagers``).
MAX_UPDATE_MANAGERS = 10
#: The entry older Update managers are merged into, one per apiVersion (upstream's).
ANCIENT_CHANGES = "ancient-changes"


def cap_update_managers(entries: list[Entry], cap: int = MAX_UPDATE_MANAGERS) -> list[Entry]:
    """At most ``cap`` Update entries: the oldest are merged, fields and all, into an
    ``ancient-changes`` Update entry of their apiVersion (upstream's capManagers;
    Apply entries are never merged). Oldest means earliest ``time``, then name."""
    updates = [e for e in entries if e.operation == "Update" and e.fields]
    if len(updates) <= cap:
        return entries
    kept = [e for e in entries if e.fields]
    for old in sorted(updates, key=lambda e: (e.time, e.manager)):
        if sum(1 for e in kept if e.operation == "Update") <= cap:
            break
        if old.manager == ANCIENT_CHANGES and old.subresource is None:
            continue  # already the bucket of its version
        bucket = next(
            (e for e in kept if e.same(ANCIENT_CHANGES, "Update", None)
             and e.api_version == old.api_version),
            None,
        )  # fmt: skip
        kept.remove(old)
        if bucket is None:
            kept.append(Entry(ANCIENT_CHANGES, "Update", old.api_version, old.time, None,
                              set(old.fields)))  # fmt: skip
        else:
            bucket.fields |= old.fields
            bucket.time = max(bucket.time, old.time)
    return kept


def _store_entries(obj: JSON, entries: list[Entry]) -> None:
    kept = [e.dump() for e in cap_update_managers(entries) if e.fields]
    meta = obj.setdefault("metadata", {})
    if kept:
        meta["managedFields"] = kept
    else:
        meta.pop("managedFields", None)


def track_update(
    old: JSON | None,
    new: JSON,
    manager: str,
    *,
    api_version: str,
    subresource: str | None,
    has_status: bool,
    keys: KeyFn,
    sets: SetFn,
    now: str,
) -> JSON:
    """Record an Update by ``manager``: it takes the fields it changed; returns ``new``."""
    entries = parse_entries(old)
    fo = field_set(ownable(old, has_status, subresource), keys, sets) if old else set()
    fn = field_set(ownable(new, has_status, subresource), keys, sets)
    changed = {p for p in fn if p not in fo}
    index: Index = {}
    changed |= {p for p in leaves(fn) & fo if get_at(old, p, index) != get_at(new, p, index)}
    gone = fo - fn
    for e in entries:
        e.fields -= changed | gone
    if changed:
        mine = _find(entries, manager, "Update", subresource, api_version, now)
        mine.fields |= changed
        mine.time = now
        mine.api_version = api_version
    _store_entries(new, entries)
    return new


#: The annotation ``kubectl apply`` (client-side) records the applied configuration in.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
#: The only manager whose Apply takes over client-side applied fields (``kubectl apply
#: --server-side``'s default; another manager name opts out, as upstream).
KUBECTL_APPLY_MANAGER = "kubectl"


def _last_applied_fields(
    live: JSON, api_version: str, has_status: bool, keys: KeyFn, sets: SetFn, index: Index
) -> set[FieldPath]:
    """The leaves of the live object's last-applied configuration that still hold the
    live value (upstream's lastAppliedManager: the fields client-side apply set and
    nobody changed since); empty without a usable annotation of the same version."""
    raw = ((live.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    if not raw:
        return set()
    try:
        last = json.loads(raw)
    except ValueError:
        return set()
    if not isinstance(last, dict) or last.get("apiVersion") != api_version:
        return set()
    last.get("metadata", {}).pop("managedFields", None)
    try:
        paths = leaves(field_set(ownable(last, has_status, None), keys, sets))
    except (AttributeError, TypeError, ValueError):
        return set()
    out = set()
    for p in paths:
        found, have = get_at(live, p, index)
        if found and get_at(last, p)[1] == have:
            out.add(p)
    return out


def apply(
    live: JSON,
    applied: JSON,
    manager: str,
    *,
    force: bool,
    api_version: str,
    subresource: str | None,
    has_status: bool,
    keys: KeyFn,
    sets: SetFn,
    now: str,
) -> JSON:
    """Server-side apply ``applied`` (a partial object) onto ``live``; returns the new object.

    Raises ``ApplyConflict`` when another manager owns a leaf that would change and
    ``force`` is false. With ``force`` the other managers lose those fields.
    """
    body = strip_directives(applied)
    body.get("metadata", {}).pop("managedFields", None)
    mine_now = field_set(ownable(body, has_status, subresource), keys, sets)
    entries = parse_entries(live)
    conflicts: list[tuple[Entry, FieldPath]] = []
    index: Index = {}
    for e in entries:
        if e.manager == manager:
            continue
        for p in sorted(leaves(mine_now) & e.fields):
            found, have = get_at(live, p, index)
            if found and get_at(body, p, index)[1] != have:
                conflicts.append((e, p))
    if conflicts and not force and manager == KUBECTL_APPLY_MANAGER:
        allowed = _last_applied_fields(live, api_version, has_status, keys, sets, index)
        left = [(e, p) for e, p in conflicts if p not in allowed]
        if left:
            conflicts = left
        else:
            force = True  # the client-side applier's fields pass to kubectl's Apply
    if conflicts and not force:
        raise ApplyConflict([Conflict(e.manager, e.api_version, p) for e, p in conflicts])
    for e, p in conflicts:
        e.fields.discard(p)
    mine = _find(entries, manager, "Apply", subresource, api_version, now)
    others: set[FieldPath] = set()
    for e in entries:
        if e is not mine:
            others |= e.fields
    owned_by_others = others | {p[:i] for p in others for i in range(1, len(p))}
    keep = mine_now | {p[:i] for p in mine_now for i in range(1, len(p))}
    new = copy.deepcopy(live)
    dropped = {p for p in mine.fields - mine_now if p not in owned_by_others and p not in keep}
    remove_all(new, [p for p in dropped if not any(p[:i] in dropped for i in range(1, len(p)))])
    new = strategic_merge(new, body, keys, sets)
    if mine.fields != mine_now:
        mine.fields = mine_now
        mine.time = now
    mine.api_version = api_version
    _store_entries(new, entries)
    return new  # type: ignore[no-any-return]
