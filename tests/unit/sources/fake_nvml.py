"""A scriptable fake of the pynvml functions NvmlSource uses, raising genuine NVMLErrors."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml


@dataclass
class FakeGpu:
    uuid: str
    temperature: int = 45
    power_mw: int = 250_000
    limit_mw: int = 400_000
    pages_pending: bool = False
    rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    links: list[int] | None = field(default_factory=lambda: [1, 1, 1, 1])
    recovery_action: int | None = None  # None: the field is not supported
    events: bool = True
    lost: bool = False


def error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # pynvml returns the matching subclass


class FakeNvml:
    """Module-like: pynvml's exceptions and constants plus scripted devices and events."""

    def __init__(self, *gpus: FakeGpu, init_error: int | None = None) -> None:
        self.gpus = {g.uuid: g for g in gpus}
        self.init_error = init_error
        self.queue: deque[SimpleNamespace] = deque()
        self.inits = 0

    def __getattr__(self, name: str) -> Any:  # NVMLError*, NVML_* and nvmlEventType*
        return getattr(pynvml, name)

    # scripting
    def xid(self, uuid: str, xid: int) -> None:
        self.queue.append(
            SimpleNamespace(
                device=self.gpus[uuid],
                eventType=pynvml.nvmlEventTypeXidCriticalError,
                eventData=xid,
            )
        )

    def dbe(self, uuid: str) -> None:
        self.queue.append(
            SimpleNamespace(
                device=self.gpus[uuid], eventType=pynvml.nvmlEventTypeDoubleBitEccError, eventData=0
            )
        )

    # the NVML API
    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise error(self.init_error)

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        if uuid not in self.gpus:
            raise error(pynvml.NVML_ERROR_NOT_FOUND)
        return self.gpus[uuid]

    def nvmlDeviceRegisterEvents(self, gpu: FakeGpu, mask: int, events: object) -> None:
        if not gpu.events:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetWait_v2(self, events: object, timeout_ms: int) -> SimpleNamespace:
        if not self.queue:
            raise error(pynvml.NVML_ERROR_TIMEOUT)
        return self.queue.popleft()

    def _alive(self, gpu: FakeGpu) -> None:
        if gpu.lost:
            raise error(pynvml.NVML_ERROR_GPU_IS_LOST)

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, fields: list[int]) -> list[SimpleNamespace]:
        self._alive(gpu)
        ret = 0 if gpu.recovery_action is not None else pynvml.NVML_ERROR_NOT_SUPPORTED
        return [
            SimpleNamespace(nvmlReturn=ret, value=SimpleNamespace(uiVal=gpu.recovery_action or 0))
        ]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, gpu: FakeGpu) -> int:
        self._alive(gpu)
        return pynvml.NVML_FEATURE_ENABLED if gpu.pages_pending else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, gpu: FakeGpu) -> tuple[int, int, int, int]:
        self._alive(gpu)
        if gpu.rows is None:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.rows

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        self._alive(gpu)
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        self._alive(gpu)
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeGpu) -> int:
        self._alive(gpu)
        return gpu.limit_mw

    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int) -> int:
        self._alive(gpu)
        if gpu.links is None or link >= len(gpu.links):
            raise error(
                pynvml.NVML_ERROR_INVALID_ARGUMENT if gpu.links else pynvml.NVML_ERROR_NOT_SUPPORTED
            )
        return gpu.links[link]
