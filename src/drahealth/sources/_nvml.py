"""NVIDIA GPU health through NVML (``nvidia-ml-py``, the ``drahealth[nvml]`` extra).

Owns :class:`NvmlSource`, :class:`GpuDevice` and :class:`NvmlThresholds`; the XID table
is core's (:data:`~drahealth.core.XID_TEXT`, re-exported here), shared with the other sources.
Everything goes through ``nvml``, an object with pynvml's functions and constants (the
``pynvml`` module itself, or a scriptable fake in tests), so the source runs and is tested
without a GPU.

Per poll (in a worker thread, see :func:`~drahealth.sources.run_source`):

1. the event set (XID critical errors, double-bit ECC) is drained. An XID is classified
   by the driver's recovery action where NVML exposes it (``GPU_RECOVERY_ACTION``:
   none -> informational; reset, reboot, drain -> fatal and latched), else by the
   table: the application-error XIDs 13, 31, 43, 45, 68, 109 are informational (their
   message is shown, the device stays Healthy), every other XID is fatal. Overrides:
   ``informational_xids`` / ``fatal_xids``. Messages say what happened and what to do
   ("XID 79: GPU has fallen off the bus (reset the GPU)");
2. each GPU is checked: lost (``GPU_IS_LOST`` from any call: fatal), retired pages or
   remapped rows pending (fatal: a reset is needed), a row-remapping failure (fatal),
   temperature and power over thresholds, an NVLink that was up and is down
   (informational);
3. MIG devices (``GpuDevice.parent``) report their parent's faults.

Without NVML (no library, no driver, init fails) every device is Unknown with
"NVML not available: ...", never Healthy; init is retried on the next poll.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from drahealth.core import APPLICATION_XIDS, XID_TEXT, DeviceReport, Health

__all__ = [
    "APPLICATION_XIDS",
    "XID_TEXT",
    "GpuDevice",
    "NvmlSource",
    "NvmlThresholds",
    "discover_gpus",
]

log = logging.getLogger(__name__)

_ACTION_TEXT = {1: "reset the GPU", 2: "reboot the node", 3: "drain P2P", 4: "drain and reset"}


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """A DRA device backed by a GPU (``uuid``) or a MIG device of one (``parent``)."""

    pool: str
    device: str
    uuid: str
    parent: str = ""  # the parent GPU's UUID for a MIG device


@dataclass(frozen=True, slots=True)
class NvmlThresholds:
    temperature_c: int = 90
    power_fraction: float = 1.05  # of the enforced power limit


@dataclass(slots=True)
class _Fault:
    message: str
    fatal: bool


@dataclass(slots=True)
class _Gpu:
    handle: Any
    links_up: set[int] = field(default_factory=set)
    fault: _Fault | None = None  # latched from events until the GPU reports clean
    note: str = ""  # informational XID, shown once


def _pynvml() -> Any:
    """The ``pynvml`` module (``nvidia-ml-py``); ImportError without the extra."""
    import pynvml  # type: ignore[import-untyped]

    return pynvml


def discover_gpus(pool: str, nvml: Any = None) -> list[GpuDevice]:
    """Every GPU NVML sees, as ``gpu-<index>`` devices of ``pool`` (raises NVMLError)."""
    nvml = nvml or _pynvml()
    nvml.nvmlInit()
    out = []
    for i in range(nvml.nvmlDeviceGetCount()):
        uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
        out.append(GpuDevice(pool, f"gpu-{i}", uuid.decode() if isinstance(uuid, bytes) else uuid))
    return out


class NvmlSource:
    """See the module docstring."""

    def __init__(
        self,
        devices: Sequence[GpuDevice],
        *,
        nvml: Any = None,
        interval: float = 5.0,
        thresholds: NvmlThresholds = NvmlThresholds(),  # frozen
        informational_xids: Iterable[int] = APPLICATION_XIDS,
        fatal_xids: Iterable[int] = (),
        event_timeout_ms: int = 0,
        name: str = "nvml",
    ) -> None:
        self.name = name
        self.interval = interval
        self.thresholds = thresholds
        self.informational = frozenset(informational_xids) - frozenset(fatal_xids)
        self.event_timeout_ms = event_timeout_ms
        self._devices = list(devices)
        self._nvml = nvml
        self._ready = False
        self._gpus: dict[str, _Gpu] = {}
        self._events: Any = None
        self.unavailable = ""

    def devices(self) -> Sequence[tuple[str, str]]:
        return [(d.pool, d.device) for d in self._devices]

    # -- setup -------------------------------------------------------------------------

    def _lib(self) -> Any:
        if self._nvml is None:
            self._nvml = _pynvml()
        return self._nvml

    def _init(self) -> bool:
        if self._ready:
            return True
        try:
            nv = self._lib()
            nv.nvmlInit()
            self._events = nv.nvmlEventSetCreate()
            mask = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
            for uuid in sorted({d.parent or d.uuid for d in self._devices}):
                handle = nv.nvmlDeviceGetHandleByUUID(uuid)
                self._gpus[uuid] = _Gpu(handle)
                try:
                    nv.nvmlDeviceRegisterEvents(handle, mask, self._events)
                except nv.NVMLError_NotSupported:
                    log.info("GPU %s does not support NVML events; polling only", uuid)
        except ImportError as exc:
            self.unavailable = f"NVML not available: {exc}"
            return False
        except Exception as exc:  # NVMLError and subclasses: no driver, no GPU, ...
            self.unavailable = f"NVML not available: {exc}"
            self._gpus.clear()
            return False
        self._ready, self.unavailable = True, ""
        return True

    # -- polling -----------------------------------------------------------------------

    def poll(self) -> list[DeviceReport]:
        if not self._init():
            return [DeviceReport(d.pool, d.device, Health.UNKNOWN, self.unavailable)
                    for d in self._devices]  # fmt: skip
        self._drain_events()
        checked = {uuid: self._check(uuid, gpu) for uuid, gpu in self._gpus.items()}
        out = []
        for d in self._devices:
            report = checked[d.parent or d.uuid]
            message = report.message
            if d.parent and message:
                message = f"parent GPU {d.parent}: {message}"
            out.append(DeviceReport(d.pool, d.device, report.health, message, report.fatal))
        return out

    def _drain_events(self) -> None:
        nv = self._nvml
        by_handle = {id(g.handle): (u, g) for u, g in self._gpus.items()}
        while True:
            try:
                event = nv.nvmlEventSetWait_v2(self._events, self.event_timeout_ms)
            except nv.NVMLError_Timeout:
                return
            except nv.NVMLError as exc:
                log.warning("reading NVML events failed: %s", exc)
                return
            found = by_handle.get(id(event.device))
            if found is None:
                found = next(
                    ((u, g) for u, g in self._gpus.items() if g.handle == event.device), None
                )
            if found is None:
                continue
            _uuid, gpu = found
            if event.eventType == nv.nvmlEventTypeDoubleBitEccError:
                gpu.fault = _Fault("double-bit ECC error (reset the GPU)", True)
            elif event.eventType == nv.nvmlEventTypeXidCriticalError:
                self._xid(gpu, int(event.eventData))

    def _xid(self, gpu: _Gpu, xid: int) -> None:
        nv = self._nvml
        text = f"XID {xid}: {XID_TEXT.get(xid, 'critical error')}"
        action = self._recovery_action(gpu.handle)
        if action is not None:
            if action == nv.NVML_GPU_RECOVERY_ACTION_NONE:
                gpu.note = f"{text} (informational)"
                return
            gpu.fault = _Fault(f"{text} ({_ACTION_TEXT.get(action, 'reset the GPU')})", True)
            return
        if xid in self.informational:
            gpu.note = f"{text} (informational)"
            return
        gpu.fault = _Fault(f"{text} (reset the GPU)", True)

    def _recovery_action(self, handle: Any) -> int | None:
        nv = self._nvml
        try:
            values = nv.nvmlDeviceGetFieldValues(handle, [nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        except nv.NVMLError:
            return None
        if not values or values[0].nvmlReturn != 0:
            return None
        return int(values[0].value.uiVal)

    def _check(self, uuid: str, gpu: _Gpu) -> DeviceReport:
        nv = self._nvml
        try:
            polled = self._polled_fault(gpu)
        except nv.NVMLError_GpuIsLost:
            gpu.fault = _Fault(
                "GPU is lost: it no longer answers (reset the GPU or the node)", True
            )
            polled = None
        if gpu.fault is not None:
            fault, gpu.fault = gpu.fault, None  # the hub latches fatal faults
            return DeviceReport("", uuid, Health.UNHEALTHY, fault.message, fault.fatal)
        if polled is not None:
            return DeviceReport("", uuid, Health.UNHEALTHY, polled.message, polled.fatal)
        note, gpu.note = gpu.note, ""
        return DeviceReport("", uuid, Health.HEALTHY, note)

    def _polled_fault(self, gpu: _Gpu) -> _Fault | None:
        nv = self._nvml
        h = gpu.handle

        def optional(call: Any, *args: Any) -> Any:
            try:
                return call(h, *args)
            except nv.NVMLError_GpuIsLost:
                raise
            except nv.NVMLError:
                return None  # not supported on this GPU or driver

        if optional(nv.nvmlDeviceGetRetiredPagesPendingStatus) == nv.NVML_FEATURE_ENABLED:
            return _Fault("retired memory pages pending (reset the GPU)", True)
        rows = optional(nv.nvmlDeviceGetRemappedRows)
        if rows is not None:
            _corr, _uncorr, pending, failure = rows
            if failure:
                return _Fault("row remapping failed (replace the GPU)", True)
            if pending:
                return _Fault("row remapping pending (reset the GPU)", True)
        temp = optional(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        if temp is not None and temp >= self.thresholds.temperature_c:
            return _Fault(f"temperature {temp} C >= {self.thresholds.temperature_c} C", False)
        power, limit = (
            optional(nv.nvmlDeviceGetPowerUsage),
            optional(nv.nvmlDeviceGetEnforcedPowerLimit),
        )
        if power is not None and limit and power > limit * self.thresholds.power_fraction:
            return _Fault(f"power {power / 1000:.0f} W over the {limit / 1000:.0f} W limit", False)
        down = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            state = optional(nv.nvmlDeviceGetNvLinkState, link)
            if state is None:
                break
            if state == nv.NVML_FEATURE_ENABLED:
                gpu.links_up.add(link)
            elif link in gpu.links_up:
                down.append(link)
        if down:
            return _Fault(f"NVLink {', '.join(map(str, down))} down", False)
        return None
