"""Node-level rollup: the health of a node's DRA devices as one Node condition.

Owns the ``nodeRollup`` policy records (:class:`NodeRollupPolicy`, :class:`NodeTaintPolicy`,
:class:`Threshold`), the condition a node's devices add up to (:func:`node_condition`)
and :class:`NodeRollup`, which keeps the devices per node and says which nodes changed.
Sans-I/O: the controller feeds what it knows per device and writes the answers.

The condition (type ``DRADevicesHealthy`` unless the policy renames it):

* ``False``, reason ``DevicesUnhealthy``: at least one device of the node is Unhealthy
  or carries (or is held with) a drahealth taint (a recovering or flapping device stays
  tainted, so it still counts);
* ``Unknown``, reason ``DevicesUnknown``: none is bad, but at least one is Unknown;
* ``True``, reason ``AllDevicesHealthy``: otherwise. A device nobody reports on counts
  as healthy: the kubelet only reports on allocated devices, so a cluster without
  node agents would otherwise see every node Unknown.

The message counts (``2 of 8 devices unhealthy, 1 unknown: <device> (<why>), ...``) and
is cut to :data:`NODE_MESSAGE_MAX` characters with ``... and N more``; each device's health
message to :data:`ROLLUP_DEVICE_MESSAGE_MAX`.

The optional node taint (``taintNode``) is wanted when at least ``threshold`` (a count,
or a percentage of the node's devices, rounded up) of the node's devices carry a
drahealth taint that blocks scheduling (NoSchedule or NoExecute): health alone, a
device still in its rule's grace period and health no rule acts on do not count.
``maxNodes`` bounds how many nodes may carry it at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from drahealth.core._health import DeviceKey, Health

__all__ = [
    "DEFAULT_NODE_TAINT_KEY",
    "KUBELET_CONDITION_TYPES",
    "NODE_CONDITION_TYPE",
    "NODE_MESSAGE_MAX",
    "REASON_ALL_DEVICES_HEALTHY",
    "REASON_DEVICES_UNHEALTHY",
    "REASON_DEVICES_UNKNOWN",
    "ROLLUP_DEVICE_MESSAGE_MAX",
    "NodeCondition",
    "NodeRollup",
    "NodeRollupPolicy",
    "NodeTaintPolicy",
    "RollupDevice",
    "Threshold",
    "explain_rollup",
    "node_condition",
    "parse_threshold",
]

NODE_CONDITION_TYPE: Final = "DRADevicesHealthy"
REASON_DEVICES_UNHEALTHY: Final = "DevicesUnhealthy"
REASON_DEVICES_UNKNOWN: Final = "DevicesUnknown"
REASON_ALL_DEVICES_HEALTHY: Final = "AllDevicesHealthy"
DEFAULT_NODE_TAINT_KEY: Final = "drahealth.io/devices-unhealthy"
#: Condition types the kubelet and the node lifecycle controller own: never written.
KUBELET_CONDITION_TYPES: Final = frozenset(
    {"Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"}
)
#: The condition message is at most this many characters.
NODE_MESSAGE_MAX: Final = 1024
#: A device's health message is cut to this many characters in the condition message.
ROLLUP_DEVICE_MESSAGE_MAX: Final = 80
#: The effects that block scheduling: a device tainted with one counts toward taintNode.
_BLOCKING: Final = ("NoSchedule", "NoExecute")
_THRESHOLD = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%?)\s*$")


@dataclass(frozen=True, slots=True)
class Threshold:
    """At least ``count`` of the whole, or ``percent`` of it (rounded up; at least 1)."""

    count: int = 0
    percent: float = 0.0

    def of(self, total: int) -> int:
        """How many of ``total`` reach the threshold (at least 1)."""
        if self.percent > 0:
            # the epsilon keeps 50% of 8 at 4 where float arithmetic says 4.000000001
            return max(1, math.ceil(total * self.percent / 100.0 - 1e-9))
        return max(1, self.count)

    def reached(self, bad: int, total: int) -> bool:
        return total > 0 and bad >= self.of(total)

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent > 0 else str(self.count)


def parse_threshold(value: int | str) -> Threshold:
    """``3`` or ``"3"`` (a count, at least 1), or ``"50%"`` (above 0, at most 100).

    Raises :class:`ValueError` saying what is wrong.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a count or a percentage such as '50%', got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"a count must be at least 1, got {value}")
        return Threshold(count=value)
    m = _THRESHOLD.match(value)
    if m is None:
        raise ValueError(f"expected a count or a percentage such as '50%', got {value!r}")
    number, percent = float(m.group(1)), bool(m.group(2))
    if percent:
        if not 0 < number <= 100:
            raise ValueError(f"a percentage must be above 0% and at most 100%, got {value!r}")
        return Threshold(percent=number)
    if number != int(number) or number < 1:
        raise ValueError(f"a count must be a whole number of at least 1, got {value!r}")
    return Threshold(count=int(number))


@dataclass(frozen=True, slots=True)
class NodeTaintPolicy:
    """Taint the whole node once ``threshold`` of its devices carry a blocking taint."""

    threshold: Threshold
    effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    key: str = DEFAULT_NODE_TAINT_KEY
    #: At most this many nodes (a count or a percentage of the nodes with DRA devices)
    #: carry the taint at once; further nodes are held and reported.
    max_nodes: Threshold = field(default_factory=lambda: Threshold(percent=10.0))


@dataclass(frozen=True, slots=True)
class NodeRollupPolicy:
    """The policy's ``nodeRollup`` section."""

    enabled: bool = True
    condition_type: str = NODE_CONDITION_TYPE
    taint_node: NodeTaintPolicy | None = None


@dataclass(frozen=True, slots=True)
class RollupDevice:
    """What the controller knows of one device for the rollup."""

    #: The device's health; None: nobody reports on it.
    health: Health | None
    message: str = ""
    #: The policy rule whose drahealth taint the device carries or is held with ("": none).
    tainted_by: str = ""
    #: That taint's effect blocks scheduling (NoSchedule or NoExecute).
    blocking: bool = False

    @property
    def bad(self) -> bool:
        return self.health is Health.UNHEALTHY or bool(self.tainted_by)


@dataclass(frozen=True, slots=True)
class NodeCondition:
    """A node's rollup condition and the counts behind it."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str
    total: int
    unhealthy: int
    unknown: int
    #: devices whose drahealth taint blocks scheduling (what ``taintNode`` counts)
    blocking: int

    def key(self) -> tuple[str, str, str]:
        """What a write compares: status, reason and message."""
        return (self.status, self.reason, self.message)


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())  # one line: newlines and runs of blanks
    return text if len(text) <= limit else text[: max(0, limit - 3)].rstrip() + "..."


def _why(d: RollupDevice) -> str:
    if d.health is Health.UNHEALTHY or (d.health is Health.UNKNOWN and not d.tainted_by):
        return _cut(d.message, ROLLUP_DEVICE_MESSAGE_MAX) or d.health.value
    if d.tainted_by:
        health = d.health.value if d.health is not None else "not reported"
        return f"{health}, still tainted by rule {d.tainted_by}"
    return d.health.value if d.health is not None else "not reported"


def node_condition(
    devices: Mapping[DeviceKey, RollupDevice],
    condition_type: str = NODE_CONDITION_TYPE,
    limit: int = NODE_MESSAGE_MAX,
) -> NodeCondition:
    """The condition ``devices`` (one node's) add up to; see the module docstring."""
    total = len(devices)
    bad = sorted(k for k, d in devices.items() if d.bad)
    unknown = sorted(k for k, d in devices.items() if not d.bad and d.health is Health.UNKNOWN)
    blocking = sum(1 for d in devices.values() if d.tainted_by and d.blocking)
    noun = "device" if total == 1 else "devices"
    if bad:
        status: Literal["True", "False", "Unknown"] = "False"
        reason = REASON_DEVICES_UNHEALTHY
        head = f"{len(bad)} of {total} {noun} unhealthy" + (
            f", {len(unknown)} unknown" if unknown else ""
        )
    elif unknown:
        status, reason = "Unknown", REASON_DEVICES_UNKNOWN
        head = f"{len(unknown)} of {total} {noun} unknown"
    else:
        status, reason = "True", REASON_ALL_DEVICES_HEALTHY
        head = f"all {total} {noun} healthy" if total != 1 else "the 1 device is healthy"
    items = [f"{k} ({_why(devices[k])})" for k in (*bad, *unknown)]
    message = _listing(head, items, limit)
    return NodeCondition(
        condition_type, status, reason, message, total, len(bad), len(unknown), blocking
    )


def _listing(head: str, items: list[str], limit: int) -> str:
    """``head: a, b ... and N more``, at most ``limit`` characters."""
    if not items:
        return _cut(head, limit)
    out = head + ":"
    for i, item in enumerate(items):
        piece = (", " if i else " ") + item
        rest = len(items) - i - 1
        tail = f" ... and {rest} more" if rest else ""
        if len(out) + len(piece) + len(tail) <= limit:
            out += piece
            continue
        if i:  # the previous item left room for this tail
            return out + f" ... and {len(items) - i} more"
        # not even the first item fits: cut it
        return _cut(out + piece, max(0, limit - len(tail))) + tail
    return out


class NodeRollup:
    """The devices per node and which nodes' conditions may have changed.

    :meth:`set` costs O(1) plus the node's devices when asked for its condition; a
    pass asks only for the nodes :meth:`take_dirty` hands out.
    """

    def __init__(self, policy: NodeRollupPolicy | None = None) -> None:
        self.policy = policy or NodeRollupPolicy()
        self._node_of: dict[DeviceKey, str] = {}
        self._by_node: dict[str, dict[DeviceKey, RollupDevice]] = {}
        self._dirty: set[str] = set()

    def set(self, key: DeviceKey, node: str, device: RollupDevice | None) -> None:
        """The device's state on ``node``; ``None`` or no node: it is gone."""
        old = self._node_of.get(key)
        if old is not None and (old != node or device is None):
            devices = self._by_node[old]
            del devices[key]
            if not devices:
                del self._by_node[old]
            del self._node_of[key]
            self._dirty.add(old)
        if device is None or not node:
            return
        devices = self._by_node.setdefault(node, {})
        if devices.get(key) != device:
            devices[key] = device
            self._node_of[key] = node
            self._dirty.add(node)

    def mark(self, nodes: Iterable[str]) -> None:
        """Hand these nodes out again at the next :meth:`take_dirty` (a retry)."""
        self._dirty.update(nodes)

    def take_dirty(self) -> list[str]:
        """The nodes whose devices changed since the last call, sorted."""
        dirty, self._dirty = self._dirty, set()
        return sorted(dirty)

    def nodes(self) -> list[str]:
        """The nodes with at least one device, sorted."""
        return sorted(self._by_node)

    def devices(self, node: str) -> dict[DeviceKey, RollupDevice]:
        return dict(self._by_node.get(node, {}))

    def condition(self, node: str) -> NodeCondition | None:
        """The node's condition; None when it has no devices (it gets none)."""
        devices = self._by_node.get(node)
        if not devices:
            return None
        return node_condition(devices, self.policy.condition_type)

    def taint_wanted(self, condition: NodeCondition | None) -> bool:
        """Whether ``taintNode``'s threshold is reached for a node with ``condition``."""
        taint = self.policy.taint_node
        if taint is None or condition is None:
            return False
        return taint.threshold.reached(condition.blocking, condition.total)

    def max_tainted(self) -> int:
        """How many nodes may carry the node taint at once (0: no taintNode)."""
        taint = self.policy.taint_node
        return 0 if taint is None else taint.max_nodes.of(len(self._by_node))


def explain_rollup(policy: NodeRollupPolicy, health: Health, effect: str | None) -> dict[str, Any]:
    """What ``nodeRollup`` does for a device in ``health`` whose rule wants ``effect``
    (None: no rule matches), as plain data for ``drahealth policy check``."""
    if not policy.enabled:
        return {"enabled": False}
    device = RollupDevice(health, "", "rule" if effect is not None else "", effect in _BLOCKING)
    condition = node_condition({DeviceKey("d", "p", "d"): device}, policy.condition_type)
    out: dict[str, Any] = {
        "enabled": True,
        "conditionType": policy.condition_type,
        "conditionStatus": condition.status,
        "reason": condition.reason,
        "taintNode": None,
    }
    taint = policy.taint_node
    if taint is not None:
        out["taintNode"] = {
            "key": taint.key,
            "effect": taint.effect,
            "threshold": str(taint.threshold),
            "maxNodes": str(taint.max_nodes),
            "deviceCounts": device.blocking,
        }
    return out
