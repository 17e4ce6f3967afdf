"""The dashboard's bounded memory of change: each device's health timeline, counts over time.

Owns :class:`Timeline`. :meth:`Timeline.observe` is given every device of each new
snapshot and records, per device, a ``[time, health, taint]`` entry whenever its health or
its strongest taint effect differs from the last entry (the first entry of a device takes
the agent's ``since`` when it is a finite time not in the future), and one counts sample
for the fleet whenever the counts differ from the last sample.

Everything is bounded whatever the fleet does: at most ``per_device`` entries a device
(the oldest go), at most ``max_devices`` devices (the one that changed least recently
goes first), at most ``max_samples`` samples; a sample less than ``sample_gap`` seconds
after the previous one replaces it, so a burst of changes does not push an hour of
history out. Pure (the caller passes the time); the server calls it on every change.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

from drahealth.core import EFFECT_ORDER

__all__ = [
    "COUNTS",
    "MAX_DEVICES",
    "MAX_SAMPLES",
    "PER_DEVICE",
    "SAMPLE_GAP",
    "Timeline",
    "counts",
    "worst_taint",
]

JSON = dict[str, Any]
#: Entries kept per device.
PER_DEVICE = 32
#: Devices whose timeline is kept.
MAX_DEVICES = 20_000
#: Counts samples kept (with SAMPLE_GAP 2 s: at least 24 minutes under constant churn).
MAX_SAMPLES = 720
#: Seconds within which a new sample replaces the last one.
SAMPLE_GAP = 2.0
#: The counts of a sample, in the order the page draws them.
COUNTS = ("healthy", "unhealthy", "unknown", "tainted", "evicting", "blocked")


def worst_taint(device: JSON) -> str:
    """The strongest effect among the device's taints ("" when it has none)."""
    best = ""
    for t in device.get("taints") or ():
        effect = str(t.get("effect", ""))
        if not best or _rank(effect) > _rank(best):
            best = effect
    return best


def _rank(effect: str) -> int:
    return EFFECT_ORDER.get(effect, -1)


def counts(devices: Iterable[JSON]) -> dict[str, int]:
    """The fleet's counts: by health, tainted, pods being evicted, pods blocked by a PDB."""
    out = dict.fromkeys(("devices", *COUNTS), 0)
    for d in devices:
        out["devices"] += 1
        health = str(d.get("health", "Unknown")).lower()
        out[health if health in ("healthy", "unhealthy") else "unknown"] += 1
        out["tainted"] += 1 if d.get("taints") else 0
        out["evicting"] += len(d.get("evicting") or ())
        out["blocked"] += len(d.get("blocked") or ())
    return out


class Timeline:
    """See the module docstring."""

    def __init__(
        self,
        *,
        per_device: int = PER_DEVICE,
        max_devices: int = MAX_DEVICES,
        max_samples: int = MAX_SAMPLES,
        sample_gap: float = SAMPLE_GAP,
    ) -> None:
        if per_device < 1 or max_devices < 1 or max_samples < 1 or sample_gap < 0:
            raise ValueError("timeline bounds must be positive")
        self.per_device = per_device
        self.max_devices = max_devices
        self.sample_gap = sample_gap
        self._devices: OrderedDict[str, deque[tuple[float, str, str]]] = OrderedDict()
        self.samples: deque[JSON] = deque(maxlen=max_samples)

    def __len__(self) -> int:
        return len(self._devices)

    def observe(self, devices: Iterable[JSON], now: float) -> tuple[list[str], JSON | None, bool]:
        """Record a snapshot's devices; the keys whose timeline grew, the new sample (None
        when the counts did not change) and whether it replaced the last one."""
        changed: list[str] = []
        seen: list[JSON] = []
        for d in devices:
            seen.append(d)
            key = str(d.get("key", ""))
            entry = (str(d.get("health", "Unknown")), worst_taint(d))
            line = self._devices.get(key)
            if line is not None and line[-1][1:] == entry:
                continue
            if line is None:
                since = d.get("since")
                ok = isinstance(since, int | float) and math.isfinite(since) and since <= now
                when = float(since) if ok and since is not None else now
                line = self._devices[key] = deque(maxlen=self.per_device)
                while len(self._devices) > self.max_devices:
                    self._devices.popitem(last=False)
            else:
                when = now
                self._devices.move_to_end(key)
            line.append((round(when, 3), *entry))
            changed.append(key)
        sample = {"t": round(now, 3), **counts(seen)}
        last = self.samples[-1] if self.samples else None
        if last is not None and {**last, "t": 0} == {**sample, "t": 0}:
            return changed, None, False
        replace = last is not None and now - last["t"] < self.sample_gap and len(self.samples) > 1
        if replace:
            self.samples.pop()
        self.samples.append(sample)
        return changed, sample, replace

    def device(self, key: str) -> list[list[Any]]:
        """The device's entries, oldest first: ``[time, health, taint]`` each."""
        return [list(e) for e in self._devices.get(key, ())]
