"""ResourceSlice planning: validation, limit-aware splitting, generations, ordering.

Owns the pure half of ResourceSlice publishing (no I/O, no clock, no asyncio):

* the driver's input model (:class:`DriverResources` of :class:`Pool`), validated
  against every per-device and per-slice limit of ``resource.k8s.io/v1``; a violation
  raises :class:`SliceValidationError` naming pool, device and field, so nothing
  invalid is ever sent;
* :func:`split_pool`: deterministic splitting into slices (counters-only slices first,
  then devices in the driver's order, 128 per slice or 64 when a slice holds a device
  with taints, counter consumption or list attributes);
* :func:`plan_pool`: the resourceslice-controller rules against the slices that exist
  (index-prefixed ``generateName``, generation kept for at most one changed slice and
  no new slice, ``resourceSliceCount``, obsolete slices, taint ``timeAdded``
  truncation and preservation, semantic comparison that tolerates server defaults);
* :func:`merge_taints`: adding health taints to the driver's devices;
  :func:`strip_taints` and :func:`without_devices`: what is published where the
  server drops device taints, or while unhealthy devices are withdrawn.

May not touch: the API server (that is ``_publisher``), health state (``_taints``).
Input model objects are never mutated; everything returned is a fresh copy.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import msgspec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.models.resource_v1 import (
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceTaint,
    ResourcePool,
    ResourceSliceSpec,
)
from lightkube.resources.resource_v1 import ResourceSlice
from lightkube.utils.quantity import parse_quantity

from drahealth.core import (
    is_dns_label,
    is_dns_subdomain,
    is_label_value,
    is_qualified_name,
    matches_dns_label,
)

__all__ = [
    "DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH",
    "DEVICE_BINDING_CONDITIONS_MAX",
    "DEVICE_TAINTS_MAX",
    "SLICE_INDEX_MIN_LENGTH",
    "SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE",
    "SLICE_MAX_COUNTERS_PER_COUNTER_SET",
    "SLICE_MAX_COUNTER_SETS",
    "SLICE_MAX_DEVICES",
    "SLICE_MAX_DEVICES_WITH_ADVANCED_FEATURES",
    "SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS",
    "TAINT_EFFECTS",
    "DriverResources",
    "Pool",
    "PoolPlan",
    "SliceContent",
    "SliceValidationError",
    "decode_index",
    "devices_equal",
    "encode_index",
    "generate_name",
    "index_length",
    "is_label_value",
    "is_qualified_name",
    "merge_taints",
    "plan",
    "plan_pool",
    "split_pool",
    "strip_taints",
    "truncate_time",
    "validate_pool",
    "without_devices",
]

# Limits from k8s.io/api resource/v1 (types.go), see reference/driver-side.md 1.9.
SLICE_MAX_DEVICES = 128
SLICE_MAX_DEVICES_WITH_ADVANCED_FEATURES = 64
DEVICE_TAINTS_MAX = 16
SLICE_MAX_COUNTER_SETS = 8
SLICE_MAX_COUNTERS_PER_COUNTER_SET = 32
SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS = 2
SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE = 32
DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH = 64
DEVICE_BINDING_CONDITIONS_MAX = 4
#: Minimum width of the hex slice index at the start of a slice name (upstream
#: ``resourceSliceIndexMinLength``).
SLICE_INDEX_MIN_LENGTH = 5
#: ``DeviceTaintEffect`` values a driver may publish.
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")

_SCALAR_ATTRS = ("bool", "int", "string", "version")
_LIST_ATTRS = ("bools", "ints", "strings", "versions")


class SliceValidationError(ValueError):
    """The driver's resources cannot be published; names the pool, device and field."""

    def __init__(self, pool: str, device: str | None, field: str, problem: str) -> None:
        where = f"pool {pool!r}" + (f", device {device!r}" if device is not None else "")
        super().__init__(f"{where}, field {field}: {problem}")
        self.pool = pool
        self.device = device
        self.field = field
        self.problem = problem


@dataclass
class Pool:
    """All devices of one pool, in preference order (first = allocated first).

    ``node_name`` is the node that provides the pool; ``None`` means the node of the
    publisher (or all nodes when planning without one). ``generation`` may be left at
    0; set it higher to force a bump. ``expect_taints=True`` splits at the 64-device
    limit even while no device is tainted, so that a later health taint changes one
    slice in place (one atomic update, no generation bump) instead of re-splitting.
    """

    devices: list[Device] = field(default_factory=list)
    shared_counters: list[CounterSet] = field(default_factory=list)
    node_name: str | None = None
    generation: int = 0
    expect_taints: bool = False


@dataclass
class DriverResources:
    """Everything a driver publishes: pools by name."""

    pools: dict[str, Pool] = field(default_factory=dict)


@dataclass(frozen=True)
class SliceContent:
    """What goes into one slice: devices or shared counters, never both."""

    devices: tuple[Device, ...] = ()
    shared_counters: tuple[CounterSet, ...] = ()


@dataclass
class PoolPlan:
    """API calls that bring one pool from the existing slices to the desired ones.

    Order of execution: ``delete`` (obsolete slices, with UID+resourceVersion
    preconditions), ``update`` (full objects carrying the existing resourceVersion),
    ``create`` (objects with ``generateName``). Each ``update``/``create`` entry is
    ``(slice index, object)``.
    """

    pool: str
    generation: int
    slice_count: int
    delete: list[ResourceSlice] = field(default_factory=list)
    update: list[tuple[int, ResourceSlice]] = field(default_factory=list)
    create: list[tuple[int, ResourceSlice]] = field(default_factory=list)

    @property
    def in_sync(self) -> bool:
        """Nothing to do."""
        return not (self.delete or self.update or self.create)


# --------------------------------------------------------------------------- helpers


def truncate_time(value: dt.datetime) -> dt.datetime:
    """Cut a timestamp to whole seconds (all the API stores); naive means UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.replace(microsecond=0)


def _clone_device(device: Device, pool: str) -> Device:
    """Deep copy in wire form (dicts for attributes/capacity), taint times truncated."""
    name = getattr(device, "name", None)
    try:
        copy = msgspec.convert(msgspec.to_builtins(device), Device)
    except (msgspec.ValidationError, TypeError) as exc:
        raise SliceValidationError(pool, name, "devices", f"not a valid Device: {exc}") from exc
    for taint in copy.taints or ():
        if taint.timeAdded is not None:
            taint.timeAdded = truncate_time(taint.timeAdded)
        if taint.value == "":
            taint.value = None
    return copy


def _clone_counter_set(counter_set: CounterSet, pool: str) -> CounterSet:
    try:
        return msgspec.convert(msgspec.to_builtins(counter_set), CounterSet)
    except (msgspec.ValidationError, TypeError) as exc:
        raise SliceValidationError(pool, None, "sharedCounters", f"not valid: {exc}") from exc


def _attribute(value: Any) -> Any:
    """An attribute value in wire form (structs become dicts)."""
    return msgspec.to_builtins(value) if isinstance(value, DeviceAttribute) else value


def _has_list_attribute(device: Device) -> bool:
    for raw in (device.attributes or {}).values():
        value = _attribute(raw)
        if isinstance(value, Mapping) and any(value.get(k) is not None for k in _LIST_ATTRS):
            return True
    return False


def _is_advanced(device: Device) -> bool:
    """Does this device lower its slice's limit to 64 devices?"""
    return bool(device.taints) or bool(device.consumesCounters) or _has_list_attribute(device)


# --------------------------------------------------------------------------- validation


def _validate_device(pool: str, device: Device, counters: Mapping[str, set[str]]) -> None:
    name = device.name
    if not name or not is_dns_label(name):
        raise SliceValidationError(pool, name, "name", "must be a DNS label (RFC 1123)")
    taints = device.taints or []
    if len(taints) > DEVICE_TAINTS_MAX:
        raise SliceValidationError(
            pool, name, "taints", f"{len(taints)} taints, at most {DEVICE_TAINTS_MAX} allowed"
        )
    for i, taint in enumerate(taints):
        where = f"taints[{i}]"
        if not taint.key or not is_qualified_name(taint.key):
            raise SliceValidationError(pool, name, f"{where}.key", f"{taint.key!r} is invalid")
        if taint.value is not None and not is_label_value(taint.value):
            raise SliceValidationError(
                pool, name, f"{where}.value", f"{taint.value!r} is not a label value"
            )
        if taint.effect not in TAINT_EFFECTS:
            raise SliceValidationError(
                pool, name, f"{where}.effect", f"{taint.effect!r} not one of {TAINT_EFFECTS}"
            )
    attributes = device.attributes or {}
    capacity = device.capacity or {}
    total = len(attributes) + len(capacity)
    if total > SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
        raise SliceValidationError(
            pool,
            name,
            "attributes+capacity",
            f"{len(attributes)} attributes + {len(capacity)} capacities = {total}, "
            f"at most {SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE} allowed",
        )
    for key, raw in attributes.items():
        where = f"attributes[{key!r}]"
        value = _attribute(raw)
        if not isinstance(value, Mapping):
            raise SliceValidationError(pool, name, where, "must be a DeviceAttribute")
        set_fields = [k for k in (*_SCALAR_ATTRS, *_LIST_ATTRS) if value.get(k) is not None]
        if len(set_fields) != 1:
            raise SliceValidationError(pool, name, where, "exactly one value must be set")
        for k in ("string", "version"):
            text = value.get(k)
            if isinstance(text, str) and len(text) > DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH:
                raise SliceValidationError(
                    pool,
                    name,
                    f"{where}.{k}",
                    f"longer than {DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH} characters",
                )
    consumes = device.consumesCounters or []
    if len(consumes) > SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS:
        raise SliceValidationError(
            pool,
            name,
            "consumesCounters",
            f"{len(consumes)} entries, at most {SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS} allowed",
        )
    for i, consumption in enumerate(consumes):
        where = f"consumesCounters[{i}]"
        known = counters.get(consumption.counterSet)
        if known is None:
            raise SliceValidationError(
                pool, name, f"{where}.counterSet", f"unknown counter set {consumption.counterSet!r}"
            )
        for counter in consumption.counters or {}:
            if counter not in known:
                raise SliceValidationError(
                    pool,
                    name,
                    f"{where}.counters",
                    f"counter {counter!r} not in counter set {consumption.counterSet!r}",
                )
    for fname in ("bindingConditions", "bindingFailureConditions"):
        conditions = getattr(device, fname) or []
        if len(conditions) > DEVICE_BINDING_CONDITIONS_MAX:
            raise SliceValidationError(
                pool, name, fname, f"at most {DEVICE_BINDING_CONDITIONS_MAX} allowed"
            )


def validate_pool(pool_name: str, pool: Pool) -> None:
    """Check one pool against every API limit; raise :class:`SliceValidationError`."""
    if not pool_name or len(pool_name) > 253:
        raise SliceValidationError(pool_name, None, "pool.name", "must be 1-253 characters")
    if any(not is_dns_subdomain(part) for part in pool_name.split("/")):
        raise SliceValidationError(
            pool_name, None, "pool.name", "must be DNS subdomains separated by slashes"
        )
    counters: dict[str, set[str]] = {}
    for i, counter_set in enumerate(pool.shared_counters):
        where = f"sharedCounters[{i}]"
        if not counter_set.name or not matches_dns_label(counter_set.name):
            raise SliceValidationError(pool_name, None, f"{where}.name", "must be a DNS label")
        if counter_set.name in counters:
            raise SliceValidationError(
                pool_name, None, f"{where}.name", f"duplicate counter set {counter_set.name!r}"
            )
        names = set(counter_set.counters or {})
        if len(names) > SLICE_MAX_COUNTERS_PER_COUNTER_SET:
            raise SliceValidationError(
                pool_name,
                None,
                f"{where}.counters",
                f"{len(names)} counters, at most {SLICE_MAX_COUNTERS_PER_COUNTER_SET} allowed",
            )
        counters[counter_set.name] = names
    seen: set[str] = set()
    for device in pool.devices:
        _validate_device(pool_name, device, counters)
        if device.name in seen:
            raise SliceValidationError(pool_name, device.name, "name", "duplicate device name")
        seen.add(device.name)


# --------------------------------------------------------------------------- splitting


def split_pool(pool_name: str, pool: Pool) -> list[SliceContent]:
    """Validate ``pool`` and split it into slice contents, in publishing order.

    Counters-only slices come first (at most 8 counter sets each), then the devices
    in the driver's order, greedily filled up to 128 per slice, or 64 when the slice
    holds a device with taints, counter consumption or list attributes (or
    ``pool.expect_taints``). A pool with neither devices nor counters yields one
    empty slice ("empty pool" is not "no pool").
    """
    devices = [_clone_device(d, pool_name) for d in pool.devices]
    counter_sets = [_clone_counter_set(c, pool_name) for c in pool.shared_counters]
    validate_pool(pool_name, Pool(devices, counter_sets, pool.node_name, pool.generation))
    out: list[SliceContent] = []
    for start in range(0, len(counter_sets), SLICE_MAX_COUNTER_SETS):
        chunk = counter_sets[start : start + SLICE_MAX_COUNTER_SETS]
        out.append(SliceContent(shared_counters=tuple(chunk)))
    current: list[Device] = []
    advanced = pool.expect_taints
    for device in devices:
        dev_advanced = _is_advanced(device)
        limit = (
            SLICE_MAX_DEVICES_WITH_ADVANCED_FEATURES
            if advanced or dev_advanced
            else SLICE_MAX_DEVICES
        )
        if len(current) + 1 > limit:
            out.append(SliceContent(devices=tuple(current)))
            current, advanced = [], pool.expect_taints
        current.append(device)
        advanced = advanced or dev_advanced
    if current or not out:
        out.append(SliceContent(devices=tuple(current)))
    return out


def merge_taints(
    resources: DriverResources, taints: Mapping[tuple[str, str], Sequence[DeviceTaint]]
) -> DriverResources:
    """Return ``resources`` with ``taints[(pool, device)]`` appended to each device.

    A taint equal in key, value and effect to one the driver already set is skipped
    (the driver's wins). Taints for unknown devices are ignored. Input untouched.
    """
    if not taints:
        return resources
    pools: dict[str, Pool] = {}
    for pool_name, pool in resources.pools.items():
        devices: list[Device] = []
        for device in pool.devices:
            extra = taints.get((pool_name, device.name))
            if extra:
                own = list(device.taints or [])
                have = {_taint_id(t) for t in own}
                own.extend(_copy_taint(t) for t in extra if _taint_id(t) not in have)
                device = msgspec.structs.replace(device, taints=own)
            devices.append(device)
        pools[pool_name] = Pool(
            devices, pool.shared_counters, pool.node_name, pool.generation, pool.expect_taints
        )
    return DriverResources(pools)


def strip_taints(resources: DriverResources) -> DriverResources:
    """Return ``resources`` with no device taints (for a server that drops them).

    ``expect_taints`` is cleared too: without taints the 64-device limit has no reason.
    Input untouched.
    """
    pools: dict[str, Pool] = {}
    for pool_name, pool in resources.pools.items():
        devices = [msgspec.structs.replace(d, taints=None) if d.taints else d for d in pool.devices]
        pools[pool_name] = Pool(devices, pool.shared_counters, pool.node_name, pool.generation)
    return DriverResources(pools)


def without_devices(
    resources: DriverResources, leave_out: Iterable[tuple[str, str]]
) -> tuple[DriverResources, frozenset[tuple[str, str]]]:
    """``resources`` without the ``(pool, device)`` pairs of ``leave_out``, and the pairs
    that were actually left out (names not in ``resources`` are ignored).

    Shared counters stay: a withdrawn device no longer consumes them, its siblings may.
    Input untouched.
    """
    wanted = frozenset(leave_out)
    if not wanted:
        return resources, frozenset()
    gone: set[tuple[str, str]] = set()
    pools: dict[str, Pool] = {}
    for pool_name, pool in resources.pools.items():
        devices = []
        for device in pool.devices:
            if (pool_name, device.name) in wanted:
                gone.add((pool_name, device.name))
            else:
                devices.append(device)
        pools[pool_name] = Pool(
            devices, pool.shared_counters, pool.node_name, pool.generation, pool.expect_taints
        )
    return DriverResources(pools), frozenset(gone)


def _copy_taint(taint: DeviceTaint) -> DeviceTaint:
    return DeviceTaint(
        key=taint.key, effect=taint.effect, value=taint.value, timeAdded=taint.timeAdded
    )


def _taint_id(taint: DeviceTaint) -> tuple[str, str, str]:
    return (taint.key, taint.value or "", taint.effect)


# --------------------------------------------------------------------------- naming


def index_length(slice_count: int) -> int:
    """Width of the hex index prefix for a pool of ``slice_count`` slices."""
    return max(SLICE_INDEX_MIN_LENGTH, len(f"{max(slice_count - 1, 0):x}"))


def encode_index(index: int, width: int) -> str:
    return f"{index:0{width}x}"


def decode_index(name: str, width: int) -> int | None:
    """The slice index encoded at the start of ``name``, or ``None`` if absent."""
    head, sep, _ = name.partition("-")
    if not sep or len(head) != width:
        return None
    try:
        return int(head, 16)
    except ValueError:
        return None


def generate_name(index: int, width: int, driver: str, owner: str | None) -> str:
    """Upstream scheme: ``<index in hex>-<driver>-<owner>-`` (owner part optional)."""
    name = f"{encode_index(index, width)}-{driver}-"
    return name + f"{owner}-" if owner else name


# --------------------------------------------------------------------------- comparison


def _quantity(value: Any) -> Any:
    if isinstance(value, str):
        try:
            parsed: Decimal | None = parse_quantity(value)
        except (ValueError, ArithmeticError):
            return value
        return parsed
    return value


def _prune(value: Any) -> Any:
    """Drop ``None`` and empty collections, recursively (they mean "unset")."""
    if isinstance(value, dict):
        out = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None and v != {} and v != []}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def _norm_counters(counters: Any) -> Any:
    if not isinstance(counters, dict):
        return counters
    return {
        k: ({**v, "value": _quantity(v.get("value"))} if isinstance(v, dict) else v)
        for k, v in counters.items()
    }


def _norm_device(device: Device) -> Any:
    """Comparable wire form without taints; quantities compared by value."""
    data = msgspec.to_builtins(msgspec.structs.replace(device, taints=None))
    for cap in (data.get("capacity") or {}).values():
        if not isinstance(cap, dict):
            continue
        cap["value"] = _quantity(cap.get("value"))
        policy = cap.get("requestPolicy")
        if isinstance(policy, dict):
            policy["default"] = _quantity(policy.get("default"))
            if isinstance(policy.get("validValues"), list):
                policy["validValues"] = [_quantity(v) for v in policy["validValues"]]
            rng = policy.get("validRange")
            if isinstance(rng, dict):
                for k in ("min", "max", "step"):
                    rng[k] = _quantity(rng.get(k))
    for consumption in data.get("consumesCounters") or []:
        if isinstance(consumption, dict):
            consumption["counters"] = _norm_counters(consumption.get("counters"))
    return _prune(data)


def _norm_counter_sets(counter_sets: Iterable[CounterSet]) -> Any:
    out = []
    for cs in counter_sets:
        data = msgspec.to_builtins(cs)
        data["counters"] = _norm_counters(data.get("counters"))
        out.append(_prune(data))
    return out


def _taints_equal(a: Sequence[DeviceTaint], b: Sequence[DeviceTaint]) -> bool:
    """Like upstream ``DevicesDeepEqual`` for taints: an unset ``timeAdded`` matches
    any time, set times match within one second (round-trip rounding)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if _taint_id(x) != _taint_id(y):
            return False
        if (
            x.timeAdded is not None
            and y.timeAdded is not None
            and abs((x.timeAdded - y.timeAdded).total_seconds()) > 1.0
        ):
            return False
    return True


def devices_equal(a: Sequence[Device], b: Sequence[Device]) -> bool:
    """Semantic equality of device lists; order matters (it is allocation priority)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if not _taints_equal(x.taints or [], y.taints or []):
            return False
        if _norm_device(x) != _norm_device(y):
            return False
    return True


# --------------------------------------------------------------------------- planning


def _copy_time_added(devices: Iterable[Device], known: Mapping[str, list[DeviceTaint]]) -> None:
    """Fill unset taint ``timeAdded`` from ``known[device]`` (same key/value/effect)."""
    for device in devices:
        old = known.get(device.name)
        if not old:
            continue
        for taint in device.taints or ():
            if taint.timeAdded is not None:
                continue
            for prev in old:
                if _taint_id(prev) == _taint_id(taint) and prev.timeAdded is not None:
                    taint.timeAdded = prev.timeAdded
                    break


def _generation(obj: ResourceSlice) -> int:
    return int(obj.spec.pool.generation)


def plan_pool(
    driver: str,
    pool_name: str,
    desired: Sequence[SliceContent] | None,
    existing: Sequence[ResourceSlice],
    *,
    node_name: str | None = None,
    owner: OwnerReference | None = None,
    owner_name: str | None = None,
    min_generation: int = 0,
) -> PoolPlan:
    """Plan the API calls for one pool, following the upstream resourceslice controller.

    ``desired`` is the output of :func:`split_pool` (``None``: the pool is gone, delete
    all its slices); ``existing`` the pool's slices on the server. ``node_name`` goes
    into ``spec.nodeName`` (``None``: ``allNodes``). ``owner`` becomes the owner
    reference of new slices; ``owner_name`` (default: ``owner.name``) the third part
    of ``generateName``. ``min_generation`` is ``Pool.generation``.

    Taints whose ``timeAdded`` is unset inherit it from the same taint of the same
    device in any existing slice of the pool, so eviction clocks survive updates,
    re-splits and generation bumps; set-vs-unset times compare equal, so a
    server-filled ``timeAdded`` never causes an update.
    """
    existing = sorted(existing, key=lambda s: (s.metadata.name or "") if s.metadata else "")
    if desired is None:
        return PoolPlan(pool_name, 0, 0, delete=list(existing))
    count = len(desired)
    width = index_length(count)
    generation = max((_generation(s) for s in existing), default=0)

    # Device copies we may fill timeAdded into (callers' contents stay untouched).
    contents = [
        SliceContent(
            tuple(msgspec.convert(msgspec.to_builtins(d), Device) for d in c.devices),
            c.shared_counters,
        )
        for c in desired
    ]
    known: dict[str, list[DeviceTaint]] = {}
    for obj in sorted(existing, key=_generation, reverse=True):
        for device in obj.spec.devices or ():
            if device.taints and device.name not in known:
                known[device.name] = list(device.taints)
    for c in contents:
        _copy_time_added(c.devices, known)

    matched: dict[int, ResourceSlice] = {}
    obsolete: list[ResourceSlice] = []
    for obj in existing:
        name = obj.metadata.name if obj.metadata else None
        index = decode_index(name or "", width)
        if _generation(obj) < generation or index is None or index >= count or index in matched:
            obsolete.append(obj)
        else:
            matched[index] = obj

    all_nodes = True if node_name is None else None

    def spec(index: int, gen: int) -> ResourceSliceSpec:
        c = contents[index]
        return ResourceSliceSpec(
            driver=driver,
            pool=ResourcePool(name=pool_name, generation=gen, resourceSliceCount=count),
            nodeName=node_name,
            allNodes=all_nodes,
            devices=list(c.devices) if c.devices or not c.shared_counters else None,
            sharedCounters=list(c.shared_counters) or None,
        )

    def differs(obj: ResourceSlice, want: ResourceSliceSpec) -> bool:
        have = obj.spec
        return (
            have.driver != want.driver
            or have.pool.name != want.pool.name
            or have.pool.generation != want.pool.generation
            or have.pool.resourceSliceCount != want.pool.resourceSliceCount
            or (have.nodeName or None) != want.nodeName
            or bool(have.allNodes) != bool(want.allNodes)
            or have.nodeSelector is not None
            or bool(have.perDeviceNodeSelection)
            or not devices_equal(have.devices or [], want.devices or [])
            or _norm_counter_sets(have.sharedCounters or [])
            != _norm_counter_sets(want.sharedCounters or [])
        )

    changed = {i for i, obj in matched.items() if differs(obj, spec(i, generation))}
    new = count - len(matched)
    bumped = True
    if min_generation > generation:
        generation = min_generation
    elif new == 0 and len(changed) <= 1:
        bumped = False
    else:
        generation += 1

    result = PoolPlan(pool_name, generation, count, delete=obsolete)
    for i in sorted(matched):
        if i not in changed and not bumped:
            continue
        old = matched[i]
        updated = ResourceSlice(
            apiVersion=old.apiVersion,
            kind=old.kind,
            metadata=old.metadata,
            spec=spec(i, generation),
        )
        result.update.append((i, updated))
    for i in range(count):
        if i in matched:
            continue
        prefix = owner_name if owner_name is not None else (owner.name if owner else None)
        meta = ObjectMeta(
            generateName=generate_name(i, width, driver, prefix),
            ownerReferences=[owner] if owner is not None else None,
        )
        result.create.append((i, ResourceSlice(metadata=meta, spec=spec(i, generation))))
    return result


def plan(
    driver: str,
    resources: DriverResources,
    existing: Sequence[ResourceSlice],
    *,
    node_name: str | None = None,
    owner: OwnerReference | None = None,
    owner_name: str | None = None,
) -> list[PoolPlan]:
    """Plan every pool of ``resources`` plus pools that only exist on the server.

    Pools are planned in name order; ``Pool.node_name`` overrides ``node_name``.
    """
    by_pool: dict[str, list[ResourceSlice]] = {}
    for obj in existing:
        by_pool.setdefault(obj.spec.pool.name, []).append(obj)
    plans = []
    for pool_name in sorted(set(resources.pools) | set(by_pool)):
        pool = resources.pools.get(pool_name)
        desired = split_pool(pool_name, pool) if pool is not None else None
        plans.append(
            plan_pool(
                driver,
                pool_name,
                desired,
                by_pool.get(pool_name, []),
                node_name=(pool.node_name if pool and pool.node_name else node_name),
                owner=owner,
                owner_name=owner_name,
                min_generation=pool.generation if pool else 0,
            )
        )
    return plans
