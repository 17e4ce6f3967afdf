"""Stand-in for the scheduler's DRA allocator: structured parameters, no I/O.

Owns :func:`allocate_claim` (and :func:`allocate`, its older two-value form), which
picks devices for one ResourceClaim from ResourceSlices as upstream's structured
allocator does, and :class:`AllocationError`. A stand-in (one claim at a time, first
solution wins, no scoring), not a scheduler:

* requests ``exactly`` (``allocationMode`` ExactCount with ``count``, or All) and
  ``firstAvailable`` (subrequests in order, result ``<request>/<sub>``), searched
  with backtracking across requests, so a later request or a constraint can make an
  earlier choice change (bounded by :data:`MAX_SEARCH_STEPS`);
* claim ``constraints``: ``matchAttribute`` (every device of the listed requests has
  the attribute, with one value) and, where the release serves
  ``DRAConsumableCapacity``, ``distinctAttribute`` (pairwise different values);
* DeviceClass and request ``selectors`` in the Kubernetes CEL environment
  (:mod:`drahealth._cel_k8s`, each evaluation metered against upstream's cost budget); a
  runtime error (the budget exceeded included) aborts the allocation with
  :class:`AllocationAborted` naming the class or claim, the selector and the device;
* devices allocated to other claims are skipped unless the request has
  ``adminAccess`` or, with ``DRAConsumableCapacity``, the device allows multiple
  allocations; tainted devices (NoSchedule/NoExecute from the slice or a
  DeviceTaintRule) are skipped unless tolerated; devices with ``bindingConditions``
  are used only with ``DRADeviceBindingConditions`` (their conditions are copied into
  the result for the scheduler to wait on);
* opaque config from the DeviceClasses (``FromClass``) and the claim (``FromClaim``)
  is copied into the result with the requests each applies to;
* a claim is allocated on one node: the first node (sorted) where everything fits;
* an optional ``deadline`` bounds the whole search in wall time (upstream's scheduler
  filter timeout): past it the allocation is aborted with ``timed out trying to
  allocate devices``.

:func:`extended_resource_requests` turns a pod's extended resources backed by a
DeviceClass (``extendedResourceName``) into the requests of its special claim.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from drahealth._cel_k8s import (
    CELCompileError,
    CELRuntimeError,
    CELTimeout,
    Selector,
    Semver,
    compile_selector,
    device_value,
)
from drahealth.core import NEWEST_KUBE_VERSION, KubeProfile, Taint, kube_profile, tolerated

__all__ = [
    "MAX_SEARCH_STEPS",
    "TIMED_OUT",
    "Allocation",
    "AllocationAborted",
    "AllocationError",
    "Device",
    "Taint",
    "allocate",
    "allocate_claim",
    "cel_selects",
    "devices_from_slices",
    "extended_resource_requests",
    "tolerated",
]

#: Devices tried in one search before the claim is reported as not allocatable.
MAX_SEARCH_STEPS = 100_000
#: The reason when the allocation runs past its deadline (upstream's words).
TIMED_OUT = "timed out trying to allocate devices"

JSON = dict[str, Any]


class AllocationError(Exception):
    """The claim cannot be allocated now; the text says which request and why."""


class AllocationAborted(AllocationError):
    """Allocation stopped for every node (a CEL error, a class or claim that cannot
    work); the text is what reaches the pod's scheduling condition."""


@dataclass(frozen=True, slots=True)
class Device:
    driver: str
    pool: str
    name: str
    node: str  # "" for devices of an allNodes slice
    attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # domain -> name -> v
    capacity: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    allow_multiple: bool = False  # allowMultipleAllocations
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    binds_to_node: bool = False

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
        if "version" in raw:
            try:
                return Semver(str(raw["version"]))
            except ValueError:
                return str(raw["version"])
        for kind in ("string", "int", "bool"):
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
                    bool(d.get("allowMultipleAllocations")),
                    tuple(str(c) for c in d.get("bindingConditions") or []),
                    tuple(str(c) for c in d.get("bindingFailureConditions") or []),
                    bool(d.get("bindsToNode")),
                )
            )
    return out


def _device_cel(device: Device, profile: KubeProfile) -> Any:
    return device_value(
        device.driver,
        device.attributes,
        device.capacity,
        allow_multiple_allocations=(
            device.allow_multiple if profile.enabled("DRAConsumableCapacity") else None
        ),
    )


def _selectors(selectors: Iterable[Any]) -> list[str]:
    out = []
    for sel in selectors or []:
        expr = ((sel or {}).get("cel") or {}).get("expression") if isinstance(sel, dict) else None
        if expr:
            out.append(str(expr))
    return out


#: Wall time one :func:`cel_selects` call may take (its selectors on one device).
SELECTS_TIMEOUT = 0.5


def cel_selects(selectors: Iterable[Any], device: Device) -> bool:
    """Whether every CEL selector (``{"cel": {"expression": ...}}``) accepts ``device``;
    an expression that does not compile, fails at runtime, exceeds its cost budget or
    runs past :data:`SELECTS_TIMEOUT` accepts nothing."""
    value = _device_cel(device, kube_profile(NEWEST_KUBE_VERSION))
    deadline = time.monotonic() + SELECTS_TIMEOUT
    try:
        return all(
            compile_selector(e).matches(value, deadline=deadline) for e in _selectors(selectors)
        )
    except (CELCompileError, CELRuntimeError):
        return False


@dataclass(slots=True)
class _Request:
    name: str  # "<request>" or "<request>/<subrequest>"
    base: str
    class_name: str
    selectors: list[str]
    mode: str
    count: int
    admin: bool
    tolerations: list[Any]


def _request(base: str, sub: str | None, body: Mapping[str, Any]) -> _Request:
    return _Request(
        f"{base}/{sub}" if sub else base,
        base,
        str(body.get("deviceClassName") or ""),
        _selectors(body.get("selectors") or []),
        str(body.get("allocationMode") or "ExactCount"),
        int(body.get("count") or 1),
        bool(body.get("adminAccess")),
        list(body.get("tolerations") or []),
    )


def _requests(claim: JSON) -> list[tuple[str, list[_Request]]]:
    """(request name, alternatives in order) for every request of the claim."""
    out = []
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        name = str(req.get("name", ""))
        if req.get("firstAvailable"):
            subs = [
                _request(name, str(sub.get("name")), sub)
                for sub in req["firstAvailable"]
                if isinstance(sub, dict)
            ]
            out.append((name, subs))
        else:
            out.append((name, [_request(name, None, req.get("exactly") or {})]))
    return out


@dataclass(slots=True)
class _Constraint:
    kind: str  # "match" or "distinct"
    domain: str
    ident: str
    requests: frozenset[str]
    values: list[tuple[str, Any]] = field(default_factory=list)

    def applies(self, r: _Request) -> bool:
        return not self.requests or r.base in self.requests or r.name in self.requests

    def add(self, r: _Request, d: Device) -> bool:
        if not self.applies(r):
            return True
        attrs = d.attributes.get(self.domain) or {}
        if self.ident not in attrs:
            return False
        raw = attrs[self.ident]
        value = (type(raw).__name__, str(raw) if isinstance(raw, Semver) else raw)
        if self.kind == "match" and self.values and self.values[0] != value:
            return False
        if self.kind == "distinct" and value in self.values:
            return False
        self.values.append(value)
        return True

    def remove(self, r: _Request) -> None:
        if self.applies(r):
            self.values.pop()


def _constraints(claim: JSON, profile: KubeProfile) -> list[_Constraint]:
    out = []
    spec = (claim.get("spec") or {}).get("devices") or {}
    for i, c in enumerate(spec.get("constraints") or []):
        c = c if isinstance(c, dict) else {}
        requests = frozenset(str(r) for r in c.get("requests") or [])
        if c.get("matchAttribute"):
            kind, attr = "match", str(c["matchAttribute"])
        elif c.get("distinctAttribute") and profile.enabled("DRAConsumableCapacity"):
            kind, attr = "distinct", str(c["distinctAttribute"])
        else:
            raise AllocationAborted(
                f"constraint #{i}: empty constraint (unsupported constraint type?)"
            )
        domain, _, ident = attr.rpartition("/")
        out.append(_Constraint(kind, domain, ident, requests))
    return out


@dataclass(slots=True)
class Allocation:
    """A claim's allocation: ``status()`` is its ``status.allocation``."""

    node: str
    results: list[JSON]
    config: list[JSON]
    node_local: bool = True  # False when every device comes from an allNodes slice

    def status(self) -> JSON:
        devices: JSON = {"results": self.results}
        if self.config:
            devices["config"] = self.config
        out: JSON = {"devices": devices}
        if self.node_local:
            out["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In",
                                      "values": [self.node]}]}
                ]
            }  # fmt: skip
        return out


def allocate(
    claim: JSON,
    devices: list[Device],
    classes: Mapping[str, JSON],
    *,
    in_use: set[tuple[str, str, str]],
    rule_taints: Callable[[Device], list[Taint]] = lambda _d: [],
    nodes: Iterable[str] | None = None,
    profile: KubeProfile | None = None,
) -> tuple[str, list[JSON]]:
    """(node, allocation results) for ``claim``; see :func:`allocate_claim`."""
    found = allocate_claim(
        claim, devices, classes, in_use=in_use, rule_taints=rule_taints, nodes=nodes,
        profile=profile,
    )  # fmt: skip
    return found.node, found.results


def allocate_claim(
    claim: JSON,
    devices: list[Device],
    classes: Mapping[str, JSON],
    *,
    in_use: set[tuple[str, str, str]],
    rule_taints: Callable[[Device], list[Taint]] = lambda _d: [],
    nodes: Iterable[str] | None = None,
    profile: KubeProfile | None = None,
    deadline: float | None = None,
) -> Allocation:
    """The allocation of ``claim``, or :class:`AllocationError` (per node reasons) /
    :class:`AllocationAborted` (nothing can succeed: a CEL error, a missing class).

    ``nodes`` limits the candidate nodes (a pod already bound to a node); ``in_use``
    holds the devices other claims hold; ``rule_taints`` adds DeviceTaintRule taints;
    ``profile`` is the release whose feature gates apply (the newest by default);
    ``deadline`` (a ``time.monotonic()`` value) bounds the search.
    """
    profile = profile or kube_profile(NEWEST_KUBE_VERSION)
    requests = _requests(claim)
    if not requests:
        raise AllocationError("the claim has no device requests")
    for _, alternatives in requests:
        for r in alternatives:
            if r.class_name and r.class_name not in classes:
                raise AllocationError(f"request {r.name}: DeviceClass {r.class_name!r} not found")
            if r.mode not in ("ExactCount", "All"):
                raise AllocationAborted(f"request {r.name}: unsupported count mode {r.mode}")
    label = _claim_label(claim)
    selectors = _compiled(requests, classes, label)
    candidates = sorted({d.node for d in devices if d.node} if nodes is None else set(nodes))
    reasons: list[str] = []
    for node in candidates:
        local = [d for d in devices if d.node in (node, "")]
        search = _Search(
            requests, _constraints(claim, profile), local, selectors, classes, in_use,
            rule_taints, profile, label, deadline,
        )  # fmt: skip
        picked = search.run()
        if picked is None:
            reasons.append(f"{node}: {search.why}")
            continue
        return Allocation(
            node,
            picked,
            _config(claim, requests, classes, search.chosen_alternatives),
            node_local=any(d.node for d in search.chosen_devices),
        )
    if not candidates:
        raise AllocationError("no node has devices")
    raise AllocationError("; ".join(reasons))


def _claim_label(claim: JSON) -> str:
    meta = claim.get("metadata") or {}
    ns, name = meta.get("namespace"), meta.get("name")
    return f"{ns}/{name}" if ns and name else str(name or "<claim>")


_Compiled = dict[str, list[tuple[str, int, Selector]]]


def _compiled(
    requests: list[tuple[str, list[_Request]]], classes: Mapping[str, JSON], label: str
) -> _Compiled:
    """Per alternative: (who, index, selector), the class's selectors first."""
    out: _Compiled = {}
    for _, alternatives in requests:
        for r in alternatives:
            entries: list[tuple[str, int, Selector]] = []
            sources: list[tuple[str, list[str]]] = []
            if r.class_name:
                spec = classes[r.class_name].get("spec") or {}
                sources.append((f"class {r.class_name}", _selectors(spec.get("selectors") or [])))
            sources.append((f"claim {label}", r.selectors))
            for who, exprs in sources:
                for i, expr in enumerate(exprs):
                    try:
                        entries.append((who, i, compile_selector(expr)))
                    except CELCompileError as exc:
                        raise AllocationAborted(
                            f"{who}: selector #{i}: CEL compile error: {exc}"
                        ) from None
            out[r.name] = entries
    return out


class _Search:
    """Backtracking over requests and devices for one node (upstream's allocateOne)."""

    def __init__(
        self,
        requests: list[tuple[str, list[_Request]]],
        constraints: list[_Constraint],
        devices: list[Device],
        selectors: _Compiled,
        classes: Mapping[str, JSON],
        in_use: set[tuple[str, str, str]],
        rule_taints: Callable[[Device], list[Taint]],
        profile: KubeProfile,
        label: str,
        deadline: float | None = None,
    ) -> None:
        self.requests = requests
        self.constraints = constraints
        self.devices = devices
        self.selectors = selectors
        self.in_use = in_use
        self.rule_taints = rule_taints
        self.profile = profile
        self.label = label
        self.deadline = deadline
        self.taken: dict[tuple[str, str, str], int] = {}
        self.results: list[JSON] = []
        self.chosen_devices: list[Device] = []
        self.chosen_alternatives: dict[str, _Request] = {}
        self.steps = 0
        self.why = ""
        self._match: dict[tuple[str, tuple[str, str, str]], bool] = {}
        self._values: dict[tuple[str, str, str], Any] = {}

    def run(self) -> list[JSON] | None:
        return self.results if self._solve(0) else None

    def _selectable(self, r: _Request, d: Device) -> bool:
        key = (r.name, d.key)
        if key not in self._match:
            value = self._values.get(d.key)
            if value is None:
                value = self._values[d.key] = _device_cel(d, self.profile)
            ok = True
            for who, i, sel in self.selectors[r.name]:
                try:
                    if not sel.matches(value, deadline=self.deadline):
                        ok = False
                        break
                except CELTimeout:
                    raise AllocationAborted(TIMED_OUT) from None
                except CELRuntimeError as exc:
                    raise AllocationAborted(
                        f"{who}: selector #{i} on device {'/'.join(d.key)}: "
                        f"CEL runtime error: {exc}"
                    ) from None
            self._match[key] = ok
        return self._match[key]

    def _usable(self, r: _Request, d: Device) -> bool:
        shared = d.allow_multiple and self.profile.enabled("DRAConsumableCapacity")
        if r.admin:
            if d.key in self.taken:
                return False
        elif not shared and (d.key in self.taken or d.key in self.in_use):
            return False
        if d.binding_conditions and not self.profile.enabled("DRADeviceBindingConditions"):
            return False
        return all(
            t.effect not in ("NoSchedule", "NoExecute") or tolerated(t, r.tolerations)
            for t in (*d.taints, *self.rule_taints(d))
        )

    def _place(self, r: _Request, d: Device) -> bool:
        for i, c in enumerate(self.constraints):
            if not c.add(r, d):
                for done in self.constraints[:i]:
                    done.remove(r)
                return False
        self.taken[d.key] = self.taken.get(d.key, 0) + 1
        result: JSON = {"request": r.name, "driver": d.driver, "pool": d.pool, "device": d.name}
        if r.admin:
            result["adminAccess"] = True
        if r.tolerations and self.profile.slice_taints:
            result["tolerations"] = r.tolerations
        if d.binding_conditions and self.profile.enabled("DRADeviceBindingConditions"):
            result["bindingConditions"] = list(d.binding_conditions)
            result["bindingFailureConditions"] = list(d.binding_failure_conditions)
        self.results.append(result)
        self.chosen_devices.append(d)
        return True

    def _unplace(self, r: _Request, d: Device) -> None:
        for c in self.constraints:
            c.remove(r)
        self.taken[d.key] -= 1
        if not self.taken[d.key]:
            del self.taken[d.key]
        self.results.pop()
        self.chosen_devices.pop()

    def _step(self) -> None:
        self.steps += 1
        if self.steps > MAX_SEARCH_STEPS:
            raise AllocationError(f"gave up after trying {MAX_SEARCH_STEPS} device combinations")

    def _solve(self, index: int) -> bool:
        if index == len(self.requests):
            return True
        name, alternatives = self.requests[index]
        for r in alternatives:
            self.chosen_alternatives[name] = r
            if r.mode == "All":
                if self._all(r, index):
                    return True
            elif self._pick(r, index, r.count, 0):
                return True
        del self.chosen_alternatives[name]
        return False

    def _all(self, r: _Request, index: int) -> bool:
        matching = [d for d in self.devices if self._selectable(r, d)]
        if not matching or not all(self._usable(r, d) for d in matching):
            self.why = f"request {r.name}: not all {len(matching)} matching devices are usable"
            return False
        placed: list[Device] = []
        for d in matching:
            self._step()
            if not self._place(r, d):
                self.why = (
                    f"request {r.name}: device {'/'.join(d.key)} does not satisfy "
                    "the claim's constraints"
                )
                break
            placed.append(d)
        else:
            if self._solve(index + 1):
                return True
        for d in reversed(placed):
            self._unplace(r, d)
        return False

    def _pick(self, r: _Request, index: int, remaining: int, start: int) -> bool:
        if remaining == 0:
            return self._solve(index + 1)
        usable = 0
        for j in range(start, len(self.devices)):
            d = self.devices[j]
            if not self._selectable(r, d) or not self._usable(r, d):
                continue
            usable += 1
            self._step()
            if not self._place(r, d):
                continue
            if self._pick(r, index, remaining - 1, j + 1):
                return True
            self._unplace(r, d)
        if remaining == r.count:
            if usable < r.count:
                self.why = f"request {r.name}: {usable} of {r.count} devices available"
            elif not self.why:
                self.why = f"request {r.name}: no {r.count} devices satisfy the claim's constraints"
        return False


def _config(
    claim: JSON,
    requests: list[tuple[str, list[_Request]]],
    classes: Mapping[str, JSON],
    chosen: Mapping[str, _Request],
) -> list[JSON]:
    """``status.allocation.devices.config`` as upstream's allocator fills it: for each
    allocated request, its class's configs (``FromClass``, ``requests: [<request>]``), then
    the claim's configs (``FromClaim``, ``requests`` copied as written) - one entry per
    request a config names, and once with no ``requests`` when it names none."""
    out: list[JSON] = []
    for name, _ in requests:
        r = chosen.get(name)
        if r is None or not r.class_name:
            continue
        for cfg in (classes[r.class_name].get("spec") or {}).get("config") or []:
            if isinstance(cfg, dict) and cfg.get("opaque"):
                out.append({"source": "FromClass", "requests": [r.name], "opaque": cfg["opaque"]})
    spec = (claim.get("spec") or {}).get("devices") or {}
    for cfg in spec.get("config") or []:
        if not isinstance(cfg, dict) or not cfg.get("opaque"):
            continue
        wanted = [str(x) for x in cfg.get("requests") or []]
        if not wanted:
            out.append({"source": "FromClaim", "opaque": cfg["opaque"]})
            continue
        for name, _ in requests:
            r = chosen.get(name)
            if name in wanted or (r is not None and r.name in wanted):
                out.append(
                    {"source": "FromClaim", "requests": list(wanted), "opaque": cfg["opaque"]}
                )
    return out


def extended_resource_requests(
    pod: JSON, classes: Mapping[str, JSON], profile: KubeProfile | None = None
) -> tuple[list[JSON], list[JSON]]:
    """(device requests, container mappings) of ``pod``'s special claim for extended
    resources backed by DRA, empty when there are none or the release lacks
    ``DRAExtendedResource``.

    A resource maps to the DeviceClass whose ``spec.extendedResourceName`` names it, or
    to ``deviceclass.resource.kubernetes.io/<class>``. One ExactCount request per
    container (init containers first) and resource, named
    ``container-<container index>-request-<index among the container's sorted
    requests>``; a mapping is ``{containerName, resourceName, requestName}`` for
    ``pod.status.extendedResourceClaimStatus.requestMappings``.
    """
    profile = profile or kube_profile(NEWEST_KUBE_VERSION)
    if not profile.enabled("DRAExtendedResource"):
        return [], []
    by_resource: dict[str, str] = {}
    for name in sorted(classes):
        by_resource[f"deviceclass.resource.kubernetes.io/{name}"] = name
    for name in sorted(classes):
        ext = (classes[name].get("spec") or {}).get("extendedResourceName")
        if ext:
            by_resource.setdefault(str(ext), name)
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    requests: list[JSON] = []
    mappings: list[JSON] = []
    for ci, container in enumerate(containers):
        wanted = ((container or {}).get("resources") or {}).get("requests") or {}
        limits = ((container or {}).get("resources") or {}).get("limits") or {}
        merged = {**limits, **wanted}
        keys = sorted(merged)
        for ri, resource in enumerate(keys):
            cls = by_resource.get(resource)
            if cls is None:
                continue
            try:
                count = int(str(merged[resource]))
            except ValueError:
                raise AllocationAborted(
                    f"container {container.get('name')}: {resource}: "
                    f"must be a whole number, not {merged[resource]!r}"
                ) from None
            if count <= 0:
                continue
            req_name = f"container-{ci}-request-{ri}"
            requests.append(
                {
                    "name": req_name,
                    "exactly": {
                        "deviceClassName": cls,
                        "allocationMode": "ExactCount",
                        "count": count,
                    },
                }
            )
            mappings.append(
                {
                    "containerName": str(container.get("name")),
                    "resourceName": resource,
                    "requestName": req_name,
                }
            )
    return requests, mappings
