"""The NVML source run inside the node agent, keyed by GPU UUID or PCI bus ID.

Owns :class:`NvmlAttachedSource` (an :class:`~drahealth.sources._attached.AttachedSource`):
it finds every GPU NVML sees on the node, runs :class:`~drahealth.sources.NvmlSource` on
them (the same checks, XID table and messages) and answers with one
:class:`~drahealth.core.Signal` per GPU, keyed by ``uuid`` (``key="uuid"``, NVIDIA's DRA
driver's attribute) or ``resource.kubernetes.io/pciBusID`` (``key="pci"``), or ``by=`` for a
driver that names the attribute differently. A MIG device shares its GPU's PCI address:
keyed by PCI (with the agent's ``match_all``) the GPU's verdict reaches its MIG devices.

A fatal fault (an XID other than the application ones, a double-bit ECC event, a GPU
lost, pages or rows pending) is latched: the GPU stays Unhealthy until ``clear_after``
seconds pass without it (10 minutes, as the kernel-log source; ``None``: until the
source restarts; ``0``: each poll says only what it sees). The driver's health hub
latches such faults; the agent takes each answer as it comes, and an XID is an event
that one poll sees once.

Without NVML (the ``drahealth[nvml]`` extra missing, no driver library, no GPU) the
source logs why once, keeps it in :attr:`NvmlAttachedSource.unavailable`, and every poll
raises :class:`NvmlUnavailable` with that reason: the agent counts a failed poll and
refreshes nothing, so the source gives no device an opinion (never Healthy without
evidence), a device it never reported does not turn Unknown on its account, and a
device it did report turns Unknown when its lease ends. A missing library is final; a
failing ``nvmlInit`` is retried every poll (a driver that loads after the agent).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from drahealth.core import APPLICATION_XIDS, Health, Signal
from drahealth.sources._latch import FaultLatch
from drahealth.sources._nvml import (
    GpuDevice,
    NvmlSource,
    NvmlThresholds,
    _pynvml,
)

__all__ = ["NVML_KEYS", "NvmlAttachedSource", "NvmlUnavailable"]

log = logging.getLogger(__name__)

#: key -> the device attribute its Signals name.
NVML_KEYS = {"uuid": "uuid", "pci": "resource.kubernetes.io/pciBusID"}
_MAX_MESSAGE = 1024
_THRESHOLDS = NvmlThresholds()  # frozen: one default shared


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this node (the message says why)."""


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlAttachedSource:
    """See the module docstring."""

    def __init__(
        self,
        *,
        nvml: Any = None,
        key: str = "uuid",
        by: str | None = None,
        interval: float = 5.0,
        timeout: float = 30.0,
        clear_after: float | None = 600.0,
        thresholds: NvmlThresholds = _THRESHOLDS,
        informational_xids: Iterable[int] = APPLICATION_XIDS,
        fatal_xids: Iterable[int] = (),
        event_timeout_ms: int = 0,
        name: str = "nvml",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(key, str) or key not in NVML_KEYS:
            raise ValueError(f"nvml key must be one of {', '.join(NVML_KEYS)}, got {key!r}")
        for what, number in (("interval", interval), ("timeout", timeout)):
            if not (_is_number(number) and math.isfinite(number) and number > 0):
                raise ValueError(f"nvml {what} must be > 0 seconds, got {number!r}")
        if clear_after is not None and not (_is_number(clear_after) and clear_after >= 0):
            raise ValueError(f"nvml clear_after must be >= 0 seconds, got {clear_after!r}")
        self.name = name
        self.interval = interval
        self.timeout = timeout
        self.key = key
        self.by = by or NVML_KEYS[key]
        self.clear_after = clear_after
        #: Why NVML cannot be used ("" while it works).
        self.unavailable = ""
        self._nvml = nvml
        self._options: dict[str, Any] = {
            "thresholds": thresholds,
            "informational_xids": tuple(informational_xids),
            "fatal_xids": tuple(fatal_xids),
            "event_timeout_ms": event_timeout_ms,
            "name": name,
        }
        self._clock = clock
        self._source: NvmlSource | None = None
        self._keys: dict[str, str] = {}  # GPU UUID -> the Signal's key value
        self._latch = FaultLatch(clear_after)
        self._no_library = False

    @property
    def gpus(self) -> dict[str, str]:
        """The GPUs found: UUID -> the value their Signals carry (empty before NVML works)."""
        return dict(self._keys)

    def poll(self) -> list[Signal]:
        """One observation of every GPU NVML sees (raises NvmlUnavailable without NVML)."""
        if self._source is None and not self._start():
            raise NvmlUnavailable(self.unavailable)
        assert self._source is not None
        reports = self._source.poll()
        if self._source.unavailable:
            self._unavailable(self._source.unavailable)
            raise NvmlUnavailable(self.unavailable)
        now = self._clock()
        out: list[Signal] = []
        for r in reports:
            fatal = r.health is Health.UNHEALTHY and r.fatal is not False  # None: Unhealthy is
            health, message = self._latch.apply(r.device, r.health, r.message, fatal, now)
            message = message[:_MAX_MESSAGE]
            value = self._keys[r.device]
            out.append(Signal(self.by, value, health, message))
        return out

    # -- finding the GPUs ------------------------------------------------------------------

    def _start(self) -> bool:
        if self._no_library:
            return False
        try:
            nv = self._nvml if self._nvml is not None else _pynvml()
        except ImportError as exc:
            self._no_library = True
            self._unavailable(f"NVML not available: {exc} (install drahealth[nvml])")
            return False
        try:
            nv.nvmlInit()
        except Exception as exc:  # NVMLError and its subclasses: no driver library, ...
            self._unavailable(f"NVML not available: {exc}")
            return False
        keys: dict[str, str] = {}
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
                if self.key == "pci":  # as NVML writes it; the agent matches any spelling
                    keys[uuid] = _text(nv.nvmlDeviceGetPciInfo(handle).busId)
                else:
                    keys[uuid] = uuid
        except Exception as exc:  # NVMLError and its subclasses
            keys.clear()
            reason = f"NVML not available: {exc}"
        else:
            reason = "" if keys else "NVML sees no GPU on this node"
        if reason:
            self._unavailable(reason)
            _shutdown(nv)  # undo this attempt's nvmlInit (NVML counts them)
            return False
        self._nvml, self._keys = nv, keys
        devices = [GpuDevice("", uuid, uuid) for uuid in keys]
        self._source = NvmlSource(devices, nvml=nv, interval=self.interval, **self._options)
        self.unavailable = ""
        log.info("NVML source: %d GPU(s): %s", len(keys), ", ".join(sorted(keys)))
        return True

    def _unavailable(self, reason: str) -> None:
        if reason != self.unavailable:
            log.warning("%s; the NVML source has no opinion of any device", reason)
        self.unavailable = reason


def _shutdown(nv: Any) -> None:
    try:
        nv.nvmlShutdown()
    except Exception as exc:  # NVMLError: nothing more to undo
        log.debug("nvmlShutdown: %s", exc)
