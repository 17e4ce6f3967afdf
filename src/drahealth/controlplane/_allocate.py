"""Stand-in for the scheduler's DRA allocator: structured parameters, no I/O.

Owns :func:`allocate`, which picks devices for one ResourceClaim from ResourceSlices
the way kube-scheduler's DRA plugin does for the common cases, and
:class:`AllocationError`. It is a stand-in for the embedded control plane (a greedy
first fit per node, no backtracking, no scoring), not a scheduler:

* requests ``exactly`` (``allocationMode`` ExactCount with ``count``, or All) and
  ``firstAvailable`` (the first subrequest that fits wins, result ``<request>/<sub>``);
* DeviceClass ``spec.selectors`` and request ``selectors`` are CEL expressions
  evaluated with a maintained CEL library (``device.driver``,
  ``device.attributes["<domain>"].<name>``, ``device.capacity["<domain>"].<name>``);
* devices allocated to other claims are skipped unless the request has
  ``adminAccess``; tainted devices (ResourceSlice taints and DeviceTaintRules with
  effect NoSchedule or NoExecute) are skipped unless the request tolerates the taint,
  and with allocationMode All every matching device must be usable;
* a claim is allocated on one node: the first node (sorted) where every request fits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError

from drahealth.core import Taint, tolerated

__all__ = [
    "AllocationError",
    "Device",
    "Taint",
    "allocate",
    "cel_selects",
    "devices_from_slices",
    "tolerated",
]

JSON = dict[str, Any]


class AllocationError(Exception):
    """The claim cannot be allocated now; the text says which request and why."""


@dataclass(frozen=True, slots=True)
class Device:
    driver: str
    pool: str
    name: str
    node: str  # "" for devices of an allNodes slice
    attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # domain -> name -> v
    capacity: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)


def _qualified(driver: str, table: Mapping[str, Any], unwrap: Callable[[Any], Any]) -> JSON:
    out: dict[str, JSON] = {}
    for name, raw in table.items():
        domain, _, short = name.rpartition("/")
        out.setdefault(domain or driver, {})[short] = unwrap(raw)
    return out


def _attribute(raw: Any) -> Any:
    if isinstance(raw, dict):
        for kind in ("string", "int", "bool", "version"):
            if kind in raw:
                return raw[kind]
    return raw


def _capacity(raw: Any) -> Any:
    return raw.get("value") if isinstance(raw, dict) else raw


def devices_from_slices(slices: Iterable[JSON]) -> list[Device]:
    """Every device of ``slices`` with its node, attributes, capacity and slice taints."""
    out = []
    for s in slices:
        spec = s.get("spec") or {}
        driver = str(spec.get("driver") or "")
        pool = str((spec.get("pool") or {}).get("name") or "")
        node = str(spec.get("nodeName") or "")
        for d in spec.get("devices") or []:
            if not isinstance(d, dict) or not d.get("name"):
                continue
            taints = tuple(
                Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
                for t in d.get("taints") or []
                if isinstance(t, dict)
            )
            out.append(
                Device(
                    driver,
                    pool,
                    str(d["name"]),
                    node,
                    _qualified(driver, d.get("attributes") or {}, _attribute),
                    _qualified(driver, d.get("capacity") or {}, _capacity),
                    taints,
                )
            )
    return out


@functools.lru_cache(maxsize=512)
def _program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def _cel_true(expression: str, device: Device) -> bool:
    try:
        program = _program(expression)
    except CELParseError as exc:
        raise AllocationError(f"bad CEL expression {expression!r}: {exc}") from exc
    activation = {
        "device": json_to_cel(
            {
                "driver": device.driver,
                "attributes": {k: dict(v) for k, v in device.attributes.items()},
                "capacity": {k: dict(v) for k, v in device.capacity.items()},
            }
        )
    }
    try:
        result = program.evaluate(activation)
    except Exception:  # a missing attribute is "no match", as in Kubernetes
        return False
    return result is True or (isinstance(result, celpy.celtypes.BoolType) and bool(result))


def _selectors(selectors: Iterable[Any]) -> list[str]:
    out = []
    for sel in selectors or []:
        expr = ((sel or {}).get("cel") or {}).get("expression") if isinstance(sel, dict) else None
        if expr:
            out.append(str(expr))
    return out


def cel_selects(selectors: Iterable[Any], device: Device) -> bool:
    """Whether every CEL selector (``{"cel": {"expression": ...}}``) accepts ``device``;
    an expression that does not compile accepts nothing."""
    try:
        return all(_cel_true(e, device) for e in _selectors(selectors))
    except AllocationError:
        return False


@dataclass(slots=True)
class _Request:
    name: str
    class_name: str
    selectors: list[str]
    mode: str
    count: int
    admin: bool
    tolerations: list[Any]


def _requests(claim: JSON) -> list[tuple[str, list[_Request]]]:
    """(request name, alternatives in order) for every request of the claim."""
    out = []
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        name = str(req.get("name", ""))
        if req.get("firstAvailable"):
            subs = [
                _Request(
                    f"{name}/{sub.get('name')}",
                    str(sub.get("deviceClassName") or ""),
                    _selectors(sub.get("selectors") or []),
                    str(sub.get("allocationMode") or "ExactCount"),
                    int(sub.get("count") or 1),
                    False,
                    list(sub.get("tolerations") or []),
                )
                for sub in req["firstAvailable"]
                if isinstance(sub, dict)
            ]
            out.append((name, subs))
            continue
        ex = req.get("exactly") or {}
        out.append(
            (
                name,
                [
                    _Request(
                        name,
                        str(ex.get("deviceClassName") or ""),
                        _selectors(ex.get("selectors") or []),
                        str(ex.get("allocationMode") or "ExactCount"),
                        int(ex.get("count") or 1),
                        bool(ex.get("adminAccess")),
                        list(ex.get("tolerations") or []),
                    )
                ],
            )
        )
    return out


def allocate(
    claim: JSON,
    devices: list[Device],
    classes: Mapping[str, JSON],
    *,
    in_use: set[tuple[str, str, str]],
    rule_taints: Callable[[Device], list[Taint]] = lambda _d: [],
    nodes: Iterable[str] | None = None,
) -> tuple[str, list[JSON]]:
    """(node, allocation results) for ``claim``, or :class:`AllocationError`.

    ``nodes`` limits the candidate nodes (a pod already bound to a node); ``in_use``
    holds the devices other claims hold; ``rule_taints`` adds DeviceTaintRule taints.
    """
    requests = _requests(claim)
    if not requests:
        raise AllocationError("the claim has no device requests")
    for _, alternatives in requests:
        for r in alternatives:
            if r.class_name and r.class_name not in classes:
                raise AllocationError(f"request {r.name}: DeviceClass {r.class_name!r} not found")
    candidates = sorted({d.node for d in devices if d.node} if nodes is None else set(nodes))
    reasons: list[str] = []
    for node in candidates:
        local = [d for d in devices if d.node in (node, "")]
        try:
            return node, _fit(requests, local, classes, in_use, rule_taints)
        except AllocationError as exc:
            reasons.append(f"{node}: {exc}")
    if not candidates:
        raise AllocationError("no node has devices")
    raise AllocationError("; ".join(reasons))


def _fit(
    requests: list[tuple[str, list[_Request]]],
    devices: list[Device],
    classes: Mapping[str, JSON],
    in_use: set[tuple[str, str, str]],
    rule_taints: Callable[[Device], list[Taint]],
) -> list[JSON]:
    taken: set[tuple[str, str, str]] = set()
    results: list[JSON] = []
    for name, alternatives in requests:
        why = ""
        for r in alternatives:
            exprs = list(r.selectors)
            if r.class_name:
                spec = classes[r.class_name].get("spec") or {}
                exprs = _selectors(spec.get("selectors") or []) + exprs
            matching = [d for d in devices if all(_cel_true(e, d) for e in exprs)]

            def usable(d: Device, r: _Request = r) -> bool:
                if d.key in taken or (d.key in in_use and not r.admin):
                    return False
                return all(
                    t.effect not in ("NoSchedule", "NoExecute") or tolerated(t, r.tolerations)
                    for t in (*d.taints, *rule_taints(d))
                )

            free = [d for d in matching if usable(d)]
            if r.mode == "All":
                if not matching or len(free) != len(matching):
                    why = f"request {r.name}: not all {len(matching)} matching devices are usable"
                    continue
                chosen = free
            else:
                if len(free) < r.count:
                    why = f"request {r.name}: {len(free)} of {r.count} devices available"
                    continue
                chosen = free[: r.count]
            for d in chosen:
                taken.add(d.key)
                result: JSON = {
                    "request": r.name,
                    "driver": d.driver,
                    "pool": d.pool,
                    "device": d.name,
                }
                if r.admin:
                    result["adminAccess"] = True
                results.append(result)
            break
        else:
            raise AllocationError(why or f"request {name}: no alternative fits")
    return results
