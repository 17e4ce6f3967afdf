"""Plain records shared by the node agent's parts: what a health stream reported,
what a prepared claim holds, and what changed in the health cache.

Owns only these value types (frozen dataclasses, no behaviour beyond small helpers).
The stream client produces :class:`ReportedDevice`; the health cache turns reports
into :class:`DeviceEntry` and :class:`HealthChange`; the claim tracker produces
:class:`ClaimInfo` (the prepared devices of one ResourceClaim), which the status
builder and the reverse index read.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from drahealth.core._health import DeviceKey, Health

__all__ = [
    "ChangeReason",
    "ClaimInfo",
    "DeviceEntry",
    "HealthChange",
    "PreparedDeviceInfo",
    "ReportedDevice",
]


@dataclass(frozen=True, slots=True)
class ReportedDevice:
    """One ``DeviceHealth`` entry of a ``NodeWatchResources`` response, converted.

    ``message`` is already truncated (``truncate_message``); ``timeout_seconds`` is
    the raw wire value (``<= 0`` means the cache's default).
    """

    pool: str
    device: str
    health: Health
    message: str = ""
    timeout_seconds: int = 0


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    """The health cache's stored state of one device.

    ``health`` is the stored value (it may be an explicitly reported Unknown); a
    reader must still apply the lease (``HealthCache.get``). ``last_seen`` is the
    cache clock (monotonic) of the last report that listed the device;
    ``last_seen_wall`` / ``changed_wall`` are unix seconds for display and
    persistence.
    """

    driver: str
    pool: str
    device: str
    health: Health
    message: str
    #: Resolved lease in seconds (never 0: ``<= 0`` on the wire became the default).
    timeout: float
    last_seen: float
    last_seen_wall: float
    changed_wall: float

    @property
    def key(self) -> DeviceKey:
        return DeviceKey(self.driver, self.pool, self.device)


class ChangeReason(enum.StrEnum):
    """Why a device's cached health changed."""

    REPORT = "report"  # a stream message listed it with new health, message or timeout
    EXPIRED = "expired"  # its lease ended without a report: now Unknown
    CLEARED = "cleared"  # the driver's data was dropped (upstream clearDriver semantics)
    RESTORED = "restored"  # loaded from disk at start
    #: Forgotten: its driver stopped listing it (or went away) and its lease ended. The
    #: entry is gone from the cache (it reads Unknown); ``new`` is Unknown.
    DROPPED = "dropped"


@dataclass(frozen=True, slots=True)
class HealthChange:
    """One device whose cached health, message or lease changed."""

    key: DeviceKey
    old: Health
    new: Health
    message: str
    reason: ChangeReason


@dataclass(frozen=True, slots=True)
class PreparedDeviceInfo:
    """One device of a prepared claim, as ``NodePrepareResources`` returned it."""

    driver: str
    pool: str
    device: str
    request_names: tuple[str, ...] = ()
    cdi_device_ids: tuple[str, ...] = ()

    @property
    def key(self) -> DeviceKey:
        return DeviceKey(self.driver, self.pool, self.device)


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    """A prepared ResourceClaim on this node: its identity and devices (all drivers)."""

    namespace: str
    name: str
    uid: str
    devices: tuple[PreparedDeviceInfo, ...] = ()
