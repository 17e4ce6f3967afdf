"""drahealth.sources: health sources for real hardware, feeding a driver's HealthHub.

Every source implements :class:`HealthSource` (``name``, ``interval``, ``devices()``,
a blocking ``poll()`` returning one report per device); :func:`run_source` polls it in
a worker thread and submits to the hub. Sources: :class:`PciSource` (PCI sysfs: presence,
AER, link, driver), :class:`ExecProbe` and :class:`FileProbe` (vendor tools), and
:class:`NvmlSource` (NVIDIA GPUs through NVML, the ``drahealth[nvml]`` extra).
"""

from __future__ import annotations

from drahealth.sources._base import HealthSource, run_source, unknown_all
from drahealth.sources._nvml import GpuDevice, NvmlSource, NvmlThresholds, discover_gpus
from drahealth.sources._pci import AerThresholds, PciDevice, PciSource, list_pci_devices
from drahealth.sources._probe import ExecProbe, FileProbe

__all__ = [
    "AerThresholds",
    "ExecProbe",
    "FileProbe",
    "GpuDevice",
    "HealthSource",
    "NvmlSource",
    "NvmlThresholds",
    "PciDevice",
    "PciSource",
    "discover_gpus",
    "list_pci_devices",
    "run_source",
    "unknown_all",
]
