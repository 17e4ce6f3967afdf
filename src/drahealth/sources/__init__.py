"""drahealth.sources: health sources for real hardware, feeding a driver's HealthHub.

Every source implements :class:`HealthSource` (``name``, ``interval``, ``devices()``,
a blocking ``poll()`` returning one report per device); :func:`run_source` polls it in
a worker thread and submits to the hub. Sources: :class:`PciSource` (PCI sysfs: presence,
AER, link, driver), :class:`ExecProbe` and :class:`FileProbe` (vendor tools), and
:class:`NvmlSource` (NVIDIA GPUs through NVML, the ``drahealth[nvml]`` extra). Sources
for devices of drivers drahealth does not own implement
:class:`~drahealth.sources._attached.AttachedSource` instead (signals keyed by a device
attribute): :class:`KmsgSource` (XID lines of the kernel log),
:class:`DcgmExporterSource` (a dcgm-exporter ``/metrics`` endpoint) and
:class:`NvmlAttachedSource` (NVML in the agent, keyed by GPU UUID or PCI bus ID),
:class:`PciAttachedSource` (PCI sysfs by PCI address), :class:`ExecAttachedProbe` and
:class:`FileAttachedProbe` (vendor tools, keyed by any attribute).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drahealth._lazy import lazy_exports
from drahealth.sources._attached import AttachedSource
from drahealth.sources._base import HealthSource, run_source, unknown_all
from drahealth.sources._nvml import GpuDevice, NvmlSource, NvmlThresholds, discover_gpus
from drahealth.sources._pci import AerThresholds, PciDevice, PciSource, list_pci_devices
from drahealth.sources._probe import ExecProbe, FileProbe

if TYPE_CHECKING:
    from drahealth.sources._dcgm import DcgmExporterSource, DcgmScrapeError, DcgmThresholds
    from drahealth.sources._keyed import ExecAttachedProbe, FileAttachedProbe, PciAttachedSource
    from drahealth.sources._kmsg import KmsgSource
    from drahealth.sources._nvml_attached import NvmlAttachedSource, NvmlUnavailable

#: Attached sources (keyed by device attribute, for other drivers' devices): public name
#: -> defining module, imported on first use (PEP 562).
_EXPORTS: dict[str, str] = {
    "KmsgSource": "drahealth.sources._kmsg",
    "DcgmExporterSource": "drahealth.sources._dcgm",
    "DcgmScrapeError": "drahealth.sources._dcgm",
    "DcgmThresholds": "drahealth.sources._dcgm",
    "NvmlAttachedSource": "drahealth.sources._nvml_attached",
    "PciAttachedSource": "drahealth.sources._keyed",
    "ExecAttachedProbe": "drahealth.sources._keyed",
    "FileAttachedProbe": "drahealth.sources._keyed",
    "NvmlUnavailable": "drahealth.sources._nvml_attached",
}

__all__ = [
    "AerThresholds",
    "AttachedSource",
    "DcgmExporterSource",
    "DcgmScrapeError",
    "DcgmThresholds",
    "ExecAttachedProbe",
    "ExecProbe",
    "FileAttachedProbe",
    "FileProbe",
    "GpuDevice",
    "HealthSource",
    "KmsgSource",
    "NvmlAttachedSource",
    "NvmlSource",
    "NvmlThresholds",
    "NvmlUnavailable",
    "PciAttachedSource",
    "PciDevice",
    "PciSource",
    "discover_gpus",
    "list_pci_devices",
    "run_source",
    "unknown_all",
]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
