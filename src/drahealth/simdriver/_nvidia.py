"""The ``sim-nvidia`` profile: GPUs published the way NVIDIA's DRA driver publishes them.

Owns the simulated NVIDIA environment the demo and the tests of attached health sources
run beside: :func:`sim_nvidia_pool` (driver ``gpu.nvidia.com``, one pool named after the
node, devices ``gpu-<minor>`` with NVIDIA's attribute names and value types for a chosen
release, capacity ``memory``), and :class:`KernelLog`, the node's fake kernel log: records
in ``/dev/kmsg``'s format (``prio,seq,usec,flags;message``) appended to a file, into which
the driver writes NVIDIA's ``NVRM: Xid (PCI:dddd:bb:dd): <xid>, pid=..., name=..., <text>``
lines on request (:class:`XidAction`, the control socket's ``xid`` action).

Like NVIDIA's plugins (whose health check is behind an alpha gate, off by default), a
driver of this profile registers no ``DRAResourceHealth`` service and streams no health:
what the node knows about a GPU is in its kernel log, NVML and DCGM, not in the kubelet.

Facts carried over from NVIDIA's driver (attribute names, value types, device names,
capacity), each release as its code published it:

=========  =====================================================================
release    attributes of a full GPU (besides ``type`` = ``gpu`` and ``uuid``)
=========  =====================================================================
``25.3``   ``minor``, ``index`` (int), ``productName``, ``brand``, ``architecture``,
           ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion``
           (versions), ``pcieBusID``, ``resource.kubernetes.io/pcieRoot``
``25.8``   as 25.3 without ``minor`` and ``index``
``25.12``  ``pcieBusID`` becomes the standard ``resource.kubernetes.io/pciBusID``
``0.5``    (kubernetes-sigs/dra-driver-nvidia-gpu) adds ``resource.kubernetes.io/numaNode``
=========  =====================================================================

The values are a simulated HGX H100 node's (product, brand, architecture and version
spellings as NVIDIA's code derives them from NVML); UUIDs are stable per node and GPU.
Nothing here is NVIDIA's code.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from lightkube.models.resource_v1 import Device, DeviceAttribute, DeviceCapacity

from drahealth.driver import DeviceState, Pool

__all__ = [
    "DEFAULT_NVIDIA_RELEASE",
    "KERNEL_LOG_NAME",
    "MAX_KMSG_MESSAGE",
    "NVIDIA_DRIVER_NAME",
    "NVIDIA_RELEASES",
    "XID_FIELDS",
    "KernelLog",
    "SimGpu",
    "XidAction",
    "kmsg_record",
    "nvidia_attributes",
    "pci_attribute",
    "sim_nvidia_gpus",
    "sim_nvidia_pool",
    "xid_line",
]

NVIDIA_DRIVER_NAME: Final = "gpu.nvidia.com"
#: release -> where its facts were read (repository, tag or commit)
NVIDIA_RELEASES: Final[Mapping[str, str]] = {
    "25.3": "NVIDIA/k8s-dra-driver-gpu v25.3.2",
    "25.8": "NVIDIA/k8s-dra-driver-gpu v25.8.1",
    "25.12": "NVIDIA/k8s-dra-driver-gpu v25.12.0",
    "0.5": "kubernetes-sigs/dra-driver-nvidia-gpu 9593204 (v0.5.0-dev, 2026-08-07)",
}
DEFAULT_NVIDIA_RELEASE: Final = "0.5"
#: File name of the fake kernel log inside the driver's state directory.
KERNEL_LOG_NAME: Final = "kmsg"
#: Longest message of one record: the kernel keeps at most 1024 bytes a record, its
#: header included.
MAX_KMSG_MESSAGE: Final = 976
#: Request fields of the ``xid`` control action besides action, device and message.
XID_FIELDS: Final = frozenset({"xid", "pid", "process"})

_STD = "resource.kubernetes.io/"
_UUID_NAMESPACE = uuid.UUID("0b6c7c4e-2f53-4f0e-8d1e-6a1f4bb0c9a2")
# the PCI buses of an HGX H100 board's eight GPUs (simulated; more GPUs repeat them in
# the next PCI domain)
_BUSES = (0x18, 0x2A, 0x3B, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_PRODUCT = "NVIDIA H100 80GB HBM3"
_BRAND = "Nvidia"  # NVML's BRAND_NVIDIA as NVIDIA's go-nvlib spells it
_ARCHITECTURE = "Hopper"
_COMPUTE_CAPABILITY = "9.0.0"  # "9.0" made a semantic version, as NVIDIA's driver does
_DRIVER_VERSION = "570.133.20"
_CUDA_DRIVER_VERSION = "12.8.0"  # NVML's 12080
_MEMORY = "81559Mi"  # NVML's total of an H100 80GB HBM3, 85520809984 bytes
#: XID -> the driver's own text, for the lines the simulated GPUs write
_XID_DRIVER_TEXT: Final[Mapping[int, str]] = {
    79: "GPU has fallen off the bus.",
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PROCESS = re.compile(r"^[^\x00-\x1f\x7f,]{1,64}$")


@dataclass(frozen=True)
class SimGpu:
    """One simulated GPU of a node: what NVML would say about it."""

    index: int
    minor: int
    uuid: str
    pci_bus_id: str  # dddd:bb:dd.f, lowercase, as NVIDIA's driver publishes it
    pcie_root: str  # pci<domain>:<bus>
    numa_node: int

    @property
    def name(self) -> str:
        """The device name NVIDIA's driver publishes: ``gpu-<minor>``."""
        return f"gpu-{self.minor}"


def sim_nvidia_gpus(node: str, devices: int = 8) -> list[SimGpu]:
    """The ``devices`` GPUs of ``node``: same node and count, same GPUs."""
    if devices < 0:
        raise ValueError("devices must not be negative")
    if devices > len(_BUSES) * 0x10000:
        raise ValueError(f"at most {len(_BUSES) * 0x10000} simulated NVIDIA GPUs")
    out = []
    for i in range(devices):
        domain, bus = divmod(i, len(_BUSES))
        bus_no = _BUSES[bus]
        out.append(
            SimGpu(
                index=i,
                minor=i,
                uuid=f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{i}')}",
                pci_bus_id=f"{domain:04x}:{bus_no:02x}:00.0",
                pcie_root=f"pci{domain:04x}:{bus_no & 0xF0:02x}",
                numa_node=0 if bus < len(_BUSES) // 2 else 1,
            )
        )
    return out


def pci_attribute(release: str = DEFAULT_NVIDIA_RELEASE) -> str:
    """The attribute holding a GPU's PCI address in ``release``."""
    _check_release(release)
    return "pcieBusID" if release in ("25.3", "25.8") else f"{_STD}pciBusID"


def _check_release(release: str) -> None:
    if release not in NVIDIA_RELEASES:
        raise ValueError(
            f"unknown NVIDIA driver release {release!r}; expected one of "
            f"{', '.join(NVIDIA_RELEASES)}"
        )


def nvidia_attributes(
    gpu: SimGpu, release: str = DEFAULT_NVIDIA_RELEASE
) -> dict[str, DeviceAttribute]:
    """The attributes NVIDIA's driver of ``release`` publishes for a full GPU."""
    _check_release(release)
    attrs: dict[str, DeviceAttribute] = {
        "type": DeviceAttribute(string="gpu"),
        "uuid": DeviceAttribute(string=gpu.uuid),
    }
    if release == "25.3":
        attrs["minor"] = DeviceAttribute(int=gpu.minor)
        attrs["index"] = DeviceAttribute(int=gpu.index)
    attrs.update(
        productName=DeviceAttribute(string=_PRODUCT),
        brand=DeviceAttribute(string=_BRAND),
        architecture=DeviceAttribute(string=_ARCHITECTURE),
        cudaComputeCapability=DeviceAttribute(version=_COMPUTE_CAPABILITY),
        driverVersion=DeviceAttribute(version=_DRIVER_VERSION),
        cudaDriverVersion=DeviceAttribute(version=_CUDA_DRIVER_VERSION),
    )
    attrs[pci_attribute(release)] = DeviceAttribute(string=gpu.pci_bus_id)
    attrs[f"{_STD}pcieRoot"] = DeviceAttribute(string=gpu.pcie_root)
    if release == "0.5":
        attrs[f"{_STD}numaNode"] = DeviceAttribute(int=gpu.numa_node)
    return attrs


def sim_nvidia_pool(node: str, devices: int = 8, release: str = DEFAULT_NVIDIA_RELEASE) -> Pool:
    """The ``sim-nvidia`` pool of ``node`` (see the module docstring)."""
    return Pool(
        devices=[
            Device(
                name=gpu.name,
                attributes=nvidia_attributes(gpu, release),
                capacity={"memory": DeviceCapacity(value=_MEMORY)},
            )
            for gpu in sim_nvidia_gpus(node, devices)
        ]
    )


# --------------------------------------------------------------------------- kernel log


def xid_line(
    pci_bus_id: str, xid: int, text: str = "", *, pid: int | None = None, process: str = ""
) -> str:
    """NVIDIA's kernel log line for ``xid`` on the GPU at ``pci_bus_id``.

    The driver names the GPU by domain, bus and device (no function) and the process as
    ``pid=<pid>, name=<name>``, or ``pid='<unknown>', name=<unknown>`` when it has none.
    """
    m = re.fullmatch(r"([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.[0-7]", pci_bus_id)
    if m is None:
        raise ValueError(f"not a PCI bus ID (dddd:bb:dd.f): {pci_bus_id!r}")
    if not 0 <= xid <= 0xFFFFFFFF:
        raise ValueError(f"XID {xid} out of range")
    who = f"pid={pid}, name={process or '<unknown>'}" if pid else "pid='<unknown>', name=<unknown>"
    text = text or _XID_DRIVER_TEXT.get(xid, f"simulated Xid {xid}.")
    return f"NVRM: Xid (PCI:{m.group(1)}:{m.group(2)}:{m.group(3)}): {xid}, {who}, {text}"


def kmsg_record(seq: int, usec: int, message: str, priority: int = 4) -> str:
    """One ``/dev/kmsg`` record: ``prio,seq,usec,flags;message`` and a newline.

    Control characters in ``message`` are escaped ``\\xNN`` as the kernel does, and the
    message is cut to :data:`MAX_KMSG_MESSAGE` characters.
    """
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", message)[:MAX_KMSG_MESSAGE]
    return f"{priority},{seq},{usec},-;{text}\n"


class KernelLog:
    """A node's fake kernel log: ``/dev/kmsg`` records appended to ``path``.

    The file is created if missing; sequence numbers continue from its last record.
    Each record is one ``write`` to a file opened with ``O_APPEND``, so a reader that
    follows the file never sees half a record. Thread-safe.
    """

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.path.abspath(path)
        self._clock = clock
        self._lock = threading.Lock()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.close(fd)
        self._seq = self._last_seq() + 1

    def _last_seq(self) -> int:
        with open(self.path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            tail = f.read().splitlines()
        for line in reversed(tail):
            parts = line.split(b";", 1)[0].split(b",")
            if len(parts) >= 3:
                with contextlib.suppress(ValueError):
                    return int(parts[1])
        return -1

    def append(self, message: str, priority: int = 4) -> str:
        """Append one record; return it (newline included)."""
        with self._lock:
            record = kmsg_record(self._seq, int(self._clock() * 1_000_000), message, priority)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, record.encode("utf-8", "replace"))
            finally:
                os.close(fd)
            self._seq += 1
            return record


class XidAction:
    """The control socket's ``xid`` action: the device's XID line into the kernel log.

    Request fields: ``device`` (required), ``xid`` (int, default 79), ``message`` (the
    driver's text after the process, default NVIDIA's for the XID), ``pid`` (positive
    int) and ``process`` (name) of the process the driver blames.
    """

    fields = XID_FIELDS

    def __init__(self, log: KernelLog, pci_bus_ids: Mapping[str, str]) -> None:
        self.log = log
        self.pci_bus_ids = dict(pci_bus_ids)  # device name -> PCI bus ID

    def __call__(self, state: DeviceState, req: Mapping[str, Any]) -> dict[str, Any]:
        from drahealth.driver import ControlError

        xid = req.get("xid", 79)
        if isinstance(xid, bool) or not isinstance(xid, int) or not 0 <= xid <= 0xFFFFFFFF:
            raise ControlError("field 'xid' must be an integer from 0 to 4294967295")
        pid = req.get("pid")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
            raise ControlError("field 'pid' must be a positive integer")
        process = req.get("process") or ""
        if not isinstance(process, str) or (process and not _PROCESS.match(process)):
            raise ControlError(
                "field 'process' must be a process name (1-64 characters, no commas or "
                "control characters)"
            )
        message = req.get("message") or ""
        pci = self.pci_bus_ids.get(state.device)
        if pci is None:
            raise ControlError(f"device {state.device!r} has no PCI bus ID")
        line = xid_line(pci, xid, message, pid=pid, process=process)
        record = self.log.append(line)
        return {
            "ok": True,
            "device": f"{state.pool}/{state.device}",
            "pciBusID": pci,
            "kernelLog": self.log.path,
            "record": record.rstrip("\n"),
        }
