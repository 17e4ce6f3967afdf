"""PCI health from sysfs: presence, AER error counters, link degradation, driver binding.

Owns :class:`PciSource` and :func:`list_pci_devices`. Devices are identified by PCI
address (``0000:3b:00.0``) under ``<root>/bus/pci/devices``; ``root`` is injectable so
tests run on a fake tree, and the real ``/sys`` is only ever read. Per poll, a device is:

* Unhealthy (not latched) when its directory is gone ("PCI device ... is gone"), and
  Healthy again when it returns;
* Unhealthy when the AER counters grew by at least the threshold since the previous poll
  (``TOTAL_ERR_FATAL`` >= 1 is fatal and latched; ``TOTAL_ERR_NONFATAL`` and
  ``TOTAL_ERR_COR`` are informational), with the growth in the message;
* Unhealthy (informational) when the link trained below its capability (current speed
  or width lower than the maximum), e.g. "PCIe link degraded: 8.0 GT/s x8, capable of
  16.0 GT/s x16";
* Unhealthy (informational) when ``require_driver`` is set and no driver is bound;
* otherwise Healthy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from drahealth.core import DeviceReport, Health

__all__ = ["AerThresholds", "PciDevice", "PciSource", "list_pci_devices"]

_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_SPEED = re.compile(r"^([0-9.]+)\s*GT/s")


@dataclass(frozen=True, slots=True)
class PciDevice:
    pool: str
    device: str  # the name in the ResourceSlice
    address: str  # PCI address, e.g. 0000:3b:00.0


@dataclass(frozen=True, slots=True)
class AerThresholds:
    """Growth per poll that turns a device Unhealthy (0 disables that class)."""

    fatal: int = 1
    nonfatal: int = 1
    correctable: int = 100


@dataclass(frozen=True, slots=True)
class PciInfo:
    address: str
    vendor: str
    device: str
    klass: str
    driver: str


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def list_pci_devices(root: str = "/sys") -> list[PciInfo]:
    """Every PCI function under ``<root>/bus/pci/devices``, sorted by address."""
    base = os.path.join(root, "bus", "pci", "devices")
    out = []
    for address in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        if not _ADDRESS.match(address):
            continue
        path = os.path.join(base, address)
        driver = (
            os.path.basename(os.readlink(os.path.join(path, "driver")))
            if os.path.islink(os.path.join(path, "driver"))
            else ""
        )
        out.append(
            PciInfo(
                address,
                _read(os.path.join(path, "vendor")) or "",
                _read(os.path.join(path, "device")) or "",
                _read(os.path.join(path, "class")) or "",
                driver,
            )
        )
    return out


def _aer_total(text: str | None, key: str) -> int | None:
    """The ``TOTAL_*`` line of an AER counter file, else the sum of its lines."""
    if text is None:
        return None
    total = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            continue
        if parts[0] == key:
            return int(parts[1])
        total += int(parts[1])
    return total


class PciSource:
    """See the module docstring."""

    def __init__(
        self,
        devices: Sequence[PciDevice],
        *,
        root: str = "/sys",
        interval: float = 5.0,
        aer: AerThresholds = AerThresholds(),  # frozen
        require_driver: bool = False,
        name: str = "pci",
    ) -> None:
        for d in devices:
            if not _ADDRESS.match(d.address):
                raise ValueError(f"device {d.device}: {d.address!r} is not a PCI address")
        self.name = name
        self.interval = interval
        self.root = root
        self.aer = aer
        self.require_driver = require_driver
        self._devices = list(devices)
        self._counters: dict[str, dict[str, int]] = {}

    def devices(self) -> Sequence[tuple[str, str]]:
        return [(d.pool, d.device) for d in self._devices]

    def poll(self) -> list[DeviceReport]:
        return [self.check(d) for d in self._devices]

    def check(self, d: PciDevice) -> DeviceReport:
        """One device's health now (the AER baseline is kept per address)."""
        path = os.path.join(self.root, "bus", "pci", "devices", d.address)
        if not os.path.isdir(path):
            self._counters.pop(d.address, None)
            return DeviceReport(
                d.pool, d.device, Health.UNHEALTHY, f"PCI device {d.address} is gone", False
            )
        problem = self._aer(d.address, path)
        if problem is not None:
            message, fatal = problem
            return DeviceReport(d.pool, d.device, Health.UNHEALTHY, message, fatal)
        link = self._link(path)
        if link:
            return DeviceReport(d.pool, d.device, Health.UNHEALTHY, link, False)
        if self.require_driver and not os.path.islink(os.path.join(path, "driver")):
            message = f"PCI device {d.address} has no driver bound"
            return DeviceReport(d.pool, d.device, Health.UNHEALTHY, message, False)
        return DeviceReport(d.pool, d.device, Health.HEALTHY)

    def _aer(self, address: str, path: str) -> tuple[str, bool] | None:
        now = {
            "fatal": _aer_total(_read(os.path.join(path, "aer_dev_fatal")), "TOTAL_ERR_FATAL"),
            "nonfatal": _aer_total(
                _read(os.path.join(path, "aer_dev_nonfatal")), "TOTAL_ERR_NONFATAL"
            ),
            "correctable": _aer_total(
                _read(os.path.join(path, "aer_dev_correctable")), "TOTAL_ERR_COR"
            ),
        }
        before = self._counters.get(address)
        self._counters[address] = {k: v for k, v in now.items() if v is not None}
        if before is None:
            return None  # the first poll only learns the baseline
        for kind in ("fatal", "nonfatal", "correctable"):
            threshold = getattr(self.aer, kind)
            value, old = now[kind], before.get(kind)
            if not threshold or value is None or old is None:
                continue
            grew = value - old
            if grew >= threshold:
                label = {"correctable": "correctable", "nonfatal": "non-fatal"}.get(kind, kind)
                message = f"AER: {grew} new {label} error(s) on {address} (total {value})"
                return message, kind == "fatal"
        return None

    @staticmethod
    def _link(path: str) -> str:
        cur_speed = _read(os.path.join(path, "current_link_speed"))
        max_speed = _read(os.path.join(path, "max_link_speed"))
        cur_width = _read(os.path.join(path, "current_link_width"))
        max_width = _read(os.path.join(path, "max_link_width"))
        if not (cur_speed and max_speed and cur_width and max_width):
            return ""
        cs, ms = _SPEED.match(cur_speed), _SPEED.match(max_speed)
        if not (cs and ms and cur_width.isdigit() and max_width.isdigit()):
            return ""  # e.g. "Unknown" on a link that is down or virtual
        speed_low = float(cs.group(1)) < float(ms.group(1))
        width_low = int(cur_width) < int(max_width)
        if not (speed_low or width_low):
            return ""
        return (
            f"PCIe link degraded: {cs.group(1)} GT/s x{cur_width}, "
            f"capable of {ms.group(1)} GT/s x{max_width}"
        )
