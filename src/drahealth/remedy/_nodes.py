"""Node-level remediation, for clusters without a DeviceTaintRule API (or by choice).

Owns what the controller writes on a Node in modes ``node-taint`` and ``cordon``, and
only that:

* ``node-taint``: one Node taint per policy taint key with effect ``NoSchedule`` (never
  ``NoExecute``: that would evict every pod on the node, not only the bad device's),
  value the bad device's name, or ``<n>-devices`` when several devices share the key;
* ``cordon``: ``spec.unschedulable: true`` plus the annotation
  ``drahealth.io/cordoned`` saying why; a node that was already unschedulable (an
  operator's cordon) is left alone and never uncordoned by drahealth;
* both: the annotation ``drahealth.io/unhealthy-devices`` listing every bad device on the
  node (device, mode, taint key, value, wanted effect, policy rule, reason, since, and
  the provenance: ``by`` the controller's identity, ``health``, ``firstSeen`` when the
  bad health was first observed), from which a restarted controller resumes, and
  ``drahealth.io/node-taints`` naming the node taints drahealth wrote, so that it only
  ever removes those.

Taints and annotations anyone else wrote are kept as they were; a taint of someone else
with the same key and effect is left in place (and not adopted). Writes are a read of
the node and a ``resourceVersion``-checked update, retried on conflict, so a concurrent
writer's taints survive. :func:`plan_node` (the change) and :func:`read_node` (what a
node says drahealth wrote) are pure; :class:`NodeWriter` does the I/O.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node

from drahealth.core import DeviceKey, is_label_value
from drahealth.kube import Backoff, as_dict, is_not_found, retry_on_conflict

__all__ = [
    "ANNOTATION_CORDONED",
    "ANNOTATION_DEVICES",
    "ANNOTATION_TAINTS",
    "NODE_MODES",
    "NodeDevice",
    "NodeWriter",
    "device_row",
    "plan_node",
    "read_node",
]

log = logging.getLogger(__name__)

ANNOTATION_DEVICES: Final = "drahealth.io/unhealthy-devices"
ANNOTATION_TAINTS: Final = "drahealth.io/node-taints"
ANNOTATION_CORDONED: Final = "drahealth.io/cordoned"
#: The modes that write to Nodes.
NODE_MODES: Final = ("node-taint", "cordon")
#: At most this many devices listed per node (a node has a few dozen at most).
MAX_DEVICES: Final = 256
#: A device's reason is cut to this many characters in the annotation.
MAX_REASON: Final = 256
JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeDevice:
    """One bad device as written in the node's annotation."""

    device: DeviceKey
    mode: str  # node-taint or cordon
    key: str
    value: str
    effect: str  # the effect the policy wants for the device
    rule: str = ""
    reason: str = ""
    since: float = 0.0  # unix time the device first wanted its taint
    by: str = ""  # who wrote it: the controller's identity
    health: str = ""  # the bad health (Unhealthy, Unknown)
    first_seen: float = 0.0  # unix time the bad health was first observed

    def as_json(self) -> JSON:
        provenance: JSON = {}
        if self.by:
            provenance["by"] = self.by
        if self.health:
            provenance["health"] = self.health
        if self.first_seen:
            provenance["firstSeen"] = round(self.first_seen, 3)
        return {
            "device": str(self.device),
            "mode": self.mode,
            "key": self.key,
            "value": self.value,
            "effect": self.effect,
            "rule": self.rule,
            "reason": self.reason[:MAX_REASON],
            "since": round(self.since, 3),
            **provenance,
        }


def _device_key(text: str) -> DeviceKey | None:
    parts = text.split("/")
    if len(parts) < 3 or not all(parts):
        return None
    return DeviceKey(parts[0], "/".join(parts[1:-1]), parts[-1])


def _annotations(node: Mapping[str, Any]) -> dict[str, str]:
    meta = node.get("metadata") or {}
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    return dict(found) if isinstance(found, Mapping) else {}


def device_row(row: Mapping[str, Any], modes: Sequence[str]) -> NodeDevice | None:
    """One device as :meth:`NodeDevice.as_json` wrote it, or None when it cannot be read
    or its mode is not one of ``modes``."""
    key = _device_key(str(row.get("device", "")))
    mode = row.get("mode")
    if key is None or mode not in modes or not isinstance(row.get("key"), str):
        return None
    since = row.get("since")
    first_seen = row.get("firstSeen")
    return NodeDevice(
        key,
        str(mode),
        str(row["key"]),
        str(row.get("value") or ""),
        str(row.get("effect") or "NoSchedule"),
        str(row.get("rule") or ""),
        str(row.get("reason") or ""),
        _finite(since),
        str(row.get("by") or ""),
        str(row.get("health") or ""),
        _finite(first_seen),
    )


#: The latest unix time a row may say (9999-12-31T23:59:59Z): later is no time at all.
MAX_UNIX_TIME: Final = 253_402_300_799


def _finite(value: Any) -> float:
    """A unix time from JSON: a number from 0 to :data:`MAX_UNIX_TIME`, else 0 (unknown).
    Compared before any conversion, so a 400-digit integer is no error either."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    if isinstance(value, float) and not math.isfinite(value):
        return 0.0
    return float(value) if 0 <= value <= MAX_UNIX_TIME else 0.0


def read_node(node: Mapping[str, Any]) -> list[NodeDevice]:
    """The devices drahealth listed on ``node`` (entries it cannot read are skipped)."""
    try:
        rows = json.loads(_annotations(node).get(ANNOTATION_DEVICES, "[]"))
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return []
    out: list[NodeDevice] = []
    for row in rows if isinstance(rows, list) else []:
        device = device_row(row, NODE_MODES) if isinstance(row, dict) else None
        if device is not None:
            out.append(device)
    return out[:MAX_DEVICES]


def _our_taints(annotations: Mapping[str, str]) -> set[tuple[str, str]]:
    try:
        pairs = json.loads(annotations.get(ANNOTATION_TAINTS, "[]"))
    except ValueError:
        return set()
    return {
        (p[0], p[1])
        for p in (pairs if isinstance(pairs, list) else [])
        if isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
    }


def node_taints(devices: Iterable[NodeDevice]) -> dict[str, str]:
    """taint key -> value for the ``node-taint`` devices (one taint per key)."""
    by_key: dict[str, list[str]] = {}
    for d in devices:
        if d.mode == "node-taint":
            by_key.setdefault(d.key, []).append(d.device.device)
    out = {}
    for key, names in by_key.items():
        names = sorted(set(names))
        single = len(names) == 1 and is_label_value(names[0])
        out[key] = names[0] if single else f"{len(names)}-devices"
    return out


def plan_node(node: Mapping[str, Any], devices: Sequence[NodeDevice]) -> tuple[JSON, list[str]]:
    """``node`` (a dict) changed to carry drahealth's part for ``devices``, and the
    changes in words (empty: nothing to write). See the module docstring."""
    out: JSON = json.loads(json.dumps(node))  # a deep copy of plain JSON
    meta = out.setdefault("metadata", {})
    spec = out.setdefault("spec", {})
    annotations = dict(meta.get("annotations") or {})
    changes: list[str] = []
    devices = sorted(devices, key=lambda d: str(d.device))[:MAX_DEVICES]
    # taints: keep everyone else's, make ours exactly the wanted set
    ours_before = _our_taints(annotations)
    taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
    foreign = [t for t in taints if (t.get("key"), t.get("effect")) not in ours_before]
    foreign_keys = {(t.get("key"), t.get("effect")) for t in foreign}
    current = {
        (t.get("key"), t.get("effect")): t
        for t in taints
        if (t.get("key"), t.get("effect")) in ours_before
    }
    ours: list[JSON] = []
    for key, value in sorted(node_taints(devices).items()):
        if (key, "NoSchedule") in foreign_keys:
            continue  # someone else's taint with our key: it blocks already, leave it
        old = current.get((key, "NoSchedule"))
        if old is not None and (old.get("value") or "") == value:
            ours.append(old)
            continue
        ours.append({"key": key, "value": value, "effect": "NoSchedule"})
        changes.append(f"tainted node {key}={value}:NoSchedule")
    kept = {(t["key"], t["effect"]) for t in ours}
    changes += [f"removed node taint {k}:{e}" for k, e in sorted(current.keys() - kept)]
    new_taints = foreign + ours
    if new_taints != taints:
        if new_taints:
            spec["taints"] = new_taints
        else:
            spec.pop("taints", None)
    _set(
        annotations,
        ANNOTATION_TAINTS,
        json.dumps(sorted([k, e] for k, e in kept)) if kept else None,
    )
    # cordon: only a node drahealth cordoned is ever uncordoned
    cordon = [d for d in devices if d.mode == "cordon"]
    if cordon:
        why = "unhealthy device(s): " + ", ".join(str(d.device) for d in cordon)
        if ANNOTATION_CORDONED in annotations:
            annotations[ANNOTATION_CORDONED] = why[:1024]
        elif not spec.get("unschedulable"):
            spec["unschedulable"] = True
            annotations[ANNOTATION_CORDONED] = why[:1024]
            changes.append("cordoned node")
    elif ANNOTATION_CORDONED in annotations:
        del annotations[ANNOTATION_CORDONED]
        spec.pop("unschedulable", None)
        changes.append("uncordoned node")
    rows = [d.as_json() for d in devices]
    _set(annotations, ANNOTATION_DEVICES, json.dumps(rows, ensure_ascii=False) if rows else None)
    if annotations != dict(meta.get("annotations") or {}):
        meta["annotations"] = annotations
        changes += _device_changes(read_node(node), devices)
        if not changes:
            changes.append("updated the unhealthy-devices annotation")
    return out, changes


#: Fields of a listed device whose change is worth a line in the history.
_SAID: Final = ("effect", "health", "rule", "reason", "mode", "key", "value")


def _device_changes(before: Sequence[NodeDevice], after: Sequence[NodeDevice]) -> list[str]:
    """What changed in the node's device list, device by device, in words."""
    old = {d.device: d for d in before}
    new = {d.device: d for d in after}
    out: list[str] = []
    for key in sorted(new.keys() - old.keys(), key=str):
        d = new[key]
        out.append(f"listed {key} ({d.health or 'bad'}, wants {d.effect}, rule {d.rule or '?'})")
    for key in sorted(old.keys() - new.keys(), key=str):
        out.append(f"{key} recovered: no longer listed")
    for key in sorted(old.keys() & new.keys(), key=str):
        was, now = old[key].as_json(), new[key].as_json()
        diff = [f"{f} {was.get(f)!r} -> {now.get(f)!r}" for f in _SAID if was.get(f) != now.get(f)]
        if diff:
            out.append(f"{key}: {', '.join(diff)}")
    return out


def _set(annotations: dict[str, str], key: str, value: str | None) -> None:
    if value is None:
        annotations.pop(key, None)
    else:
        annotations[key] = value


#: ``on_change(node, changes, devices)`` after a write that changed something.
ChangeSink = Callable[[str, list[str], Sequence[NodeDevice]], None]


class NodeWriter:
    """Keeps drahealth's part of each Node equal to what the controller wants."""

    def __init__(self, client: AsyncClient, *, on_change: ChangeSink) -> None:
        self.client = client
        self._on_change = on_change
        self._written: dict[str, tuple[NodeDevice, ...]] = {}
        self._retry: dict[str, tuple[float, Backoff]] = {}  # node -> (not before, backoff)
        self._dirty: set[str] = set()  # nodes to write even if the devices look the same
        self.writes = 0

    async def load(self) -> dict[str, list[NodeDevice]]:
        """What drahealth wrote on each node (one LIST), remembered as written."""
        found: dict[str, list[NodeDevice]] = {}
        async for node in self.client.list(Node):
            raw = as_dict(node)
            annotations = _annotations(raw)
            if not (
                {ANNOTATION_DEVICES, ANNOTATION_TAINTS, ANNOTATION_CORDONED} & annotations.keys()
            ):
                continue
            name = str(raw["metadata"]["name"])
            devices = read_node(raw)
            found[name] = devices
            self._written[name] = tuple(sorted(devices, key=lambda d: str(d.device)))
            self._dirty.add(name)  # compare with the node itself on the first pass
        return found

    def written(self) -> dict[str, tuple[NodeDevice, ...]]:
        return dict(self._written)

    async def sync(self, desired: Mapping[str, Sequence[NodeDevice]]) -> None:
        """Write every node whose wanted devices differ from what was last written."""
        now = time.monotonic()
        for name in sorted(desired.keys() | self._written.keys()):
            want = tuple(sorted(desired.get(name, ()), key=lambda d: str(d.device)))
            if name not in self._dirty and self._written.get(name, ()) == want:
                continue
            retry = self._retry.get(name)
            if retry is not None and retry[0] > now:
                continue
            try:
                changes = await retry_on_conflict(functools.partial(self._write, name, want))
            except ApiError as exc:
                if is_not_found(exc):
                    self._written.pop(name, None)
                    self._retry.pop(name, None)
                    self._dirty.discard(name)
                    log.info("node %s is gone: nothing to write", name)
                    continue
                backoff = retry[1] if retry is not None else Backoff(1.0, 60.0)
                self._retry[name] = (now + backoff.next(), backoff)
                log.warning("writing node %s failed: %s", name, exc.status.message)
                continue
            self._retry.pop(name, None)
            self._dirty.discard(name)
            if want:
                self._written[name] = want
            else:
                self._written.pop(name, None)
            if changes:
                self.writes += 1
                self._on_change(name, changes, want)

    async def _write(self, name: str, devices: Sequence[NodeDevice]) -> list[str]:
        node = as_dict(await self.client.get(Node, name))
        updated, changes = plan_node(node, devices)
        if updated != node:
            # the update carries the resourceVersion read: a concurrent write is a 409
            await self.client.replace(Node.from_dict(updated))  # type: ignore[call-overload]
        return changes
