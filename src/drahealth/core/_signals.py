"""Health signals keyed by a device attribute, for devices of drivers drahealth does not own.

Owns :class:`Signal` (what an attached health source says: the health of the device
whose ResourceSlice attribute ``by`` has ``value``) and :func:`normalize_key`, the one
spelling of each kind of key, so a kernel log's ``PCI:0000:3b:00``, NVML's
``00000000:3B:00.0`` and a ResourceSlice's ``0000:3b:00.0`` name the same device.

Sans-I/O: plain data. The sources that produce signals live in
:mod:`drahealth.sources`; the agent maps them to devices of the watched driver's
ResourceSlices for its node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from drahealth.core._health import Health

__all__ = ["PCI_ATTRIBUTES", "Signal", "normalize_key", "normalize_pci_address"]

#: Attribute names (the part after a domain) that hold a PCI address.
PCI_ATTRIBUTES: Final = frozenset({"pcibusid", "pciebusid", "pciaddress", "pcibus", "busid"})
#: domain:bus:device(.function): 1-8 hex digits of domain (NVML writes 8), 2 of bus, 2 of
#: device, an optional function digit.
_PCI = re.compile(
    r"^(?:pci:)?(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{2}):(?P<dev>[0-9a-f]{2})"
    r"(?:\.(?P<fn>[0-7]))?$"
)
#: Longest key value kept: attribute strings are at most 64 characters in the API.
MAX_KEY: Final = 256


@dataclass(frozen=True, slots=True)
class Signal:
    """The health of the device whose attribute ``by`` has ``value``.

    ``by`` is an attribute name as a ResourceSlice writes it, with or without its
    domain (``uuid``, ``gpu.nvidia.com/pcieBusID``), or ``name`` for the device's name.
    """

    by: str
    value: str
    health: Health
    message: str = ""


def normalize_pci_address(value: str) -> str | None:
    """``dddd:bb:dd.f`` lowercase (domain 4 digits, function 0 when not given), or None
    when ``value`` is not a PCI address."""
    m = _PCI.match(value.strip().lower())
    if m is None:
        return None
    domain = int(m.group("domain") or "0", 16)
    if domain > 0xFFFF:
        return None
    return f"{domain:04x}:{m.group('bus')}:{m.group('dev')}.{m.group('fn') or '0'}"


def normalize_key(by: str, value: object) -> str:
    """The spelling of ``value`` that two sources of the same attribute agree on:
    PCI addresses as :func:`normalize_pci_address`, UUIDs and other strings lowercased
    and stripped, numbers and booleans as text; at most ``MAX_KEY`` characters."""
    name = by.rpartition("/")[2].lower()
    text = str(value).lower() if isinstance(value, bool) else str(value)
    text = text.strip()[:MAX_KEY]
    if name in PCI_ATTRIBUTES:
        pci = normalize_pci_address(text)
        if pci is not None:
            return pci
    return text.lower()
