"""Device identity and health values shared by every part: the driver's hub, the node
agent's cache, the status builder and the remediation controller.

Plain values only (no I/O, no clocks). ``Health`` strings are exactly the Pod API's
``allocatedResourcesStatus[].resources[].health`` values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

#: The kubelet's cut of a device-health message (bytes of UTF-8). A wire fact kept here
#: so that core needs no gRPC; ``drahealth.api`` re-exports it.
HEALTH_MESSAGE_MAX_BYTES: Final = 1024


class Health(enum.StrEnum):
    """Health of one device, spelled as in the Pod API."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"

    @property
    def severity(self) -> int:
        """Order for worst-of aggregation: Healthy < Unknown < Unhealthy."""
        return _SEVERITY[self]

    @classmethod
    def worst(cls, *values: Health) -> Health:
        """The most severe of ``values`` (Healthy when none are given)."""
        return max(values, key=_SEVERITY.__getitem__, default=cls.HEALTHY)

    @classmethod
    def from_wire(cls, value: int) -> Health:
        """Map a dra-health ``HealthStatus`` number; unknown numbers read as Unknown."""
        return _FROM_WIRE.get(value, cls.UNKNOWN)

    def to_wire(self) -> int:
        """The dra-health ``HealthStatus`` number (same in v1 and v1alpha1)."""
        return _TO_WIRE[self]


_SEVERITY = {Health.HEALTHY: 0, Health.UNKNOWN: 1, Health.UNHEALTHY: 2}
_FROM_WIRE = {0: Health.UNKNOWN, 1: Health.HEALTHY, 2: Health.UNHEALTHY}
_TO_WIRE = {v: k for k, v in _FROM_WIRE.items()}


@dataclass(frozen=True, slots=True, order=True)
class DeviceKey:
    """A device as the API names it: ``<driver>/<pool>/<device>``."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"

    @classmethod
    def parse(cls, text: str) -> DeviceKey:
        """Parse ``driver/pool/device``; the pool may itself contain slashes."""
        driver, sep, rest = text.partition("/")
        pool, sep2, device = rest.rpartition("/")
        if not (sep and sep2 and driver and pool and device):
            raise ValueError(f"device {text!r} is not of the form DRIVER/POOL/DEVICE")
        return cls(driver, pool, device)


def truncate_message(message: str, limit: int = HEALTH_MESSAGE_MAX_BYTES) -> str:
    """Cut ``message`` to at most ``limit`` UTF-8 bytes, ending in "..." when cut.

    Unlike the kubelet's byte cut, this never splits a multi-byte character: the
    result is always valid UTF-8.
    """
    data = message.encode("utf-8")
    if len(data) <= limit:
        return message
    return data[: limit - 3].decode("utf-8", errors="ignore") + "..."
