"""A fake dcgm-exporter: a real HTTP ``/metrics`` endpoint serving settable GPU fields.

Owns :class:`FakeDcgmExporter` and :class:`FakeDcgmGpu`, for tests and the demo. The text
is laid out as dcgm-exporter writes it (``# HELP`` / ``# TYPE`` per field, then one series
per GPU with the labels ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``,
``Hostname`` and ``DCGM_FI_DRIVER_VERSION``); every GPU starts healthy, and faults are
written into it with :meth:`FakeDcgmExporter.set` and :meth:`FakeDcgmExporter.xid`.
:meth:`FakeDcgmExporter.fail` answers an HTTP error, :meth:`FakeDcgmExporter.set_body`
serves raw bytes (malformed or hostile text) and ``delay`` holds every answer back.

The server runs in a daemon thread (standard library only), so a synchronous test and an
asyncio program use it alike; ``start``/``stop`` or ``with``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Protocol

__all__ = ["DCGM_HEALTHY_FIELDS", "FakeDcgmExporter", "FakeDcgmGpu", "nvml_bus_id"]

#: field -> (Prometheus type, help, the healthy value); dcgm-exporter's default counters
#: plus the health fields drahealth recommends adding to them.
DCGM_HEALTHY_FIELDS: dict[str, tuple[str, str, float]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz).", 1980),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz).", 2619),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C).", 38),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C).", 34),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W).", 71.2),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("gauge", "Enforced power limit (in W).", 700),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries.", 0),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %).", 0),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered.", 0),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB).", 80994),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB).", 1),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": (
        "counter",
        "Total number of double-bit volatile ECC errors.",
        0,
    ),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": (
        "counter",
        "Total number of double-bit persistent ECC errors.",
        0,
    ),
    "DCGM_FI_DEV_RETIRED_SBE": (
        "counter",
        "Total number of retired pages due to single-bit errors.",
        0,
    ),
    "DCGM_FI_DEV_RETIRED_DBE": (
        "counter",
        "Total number of retired pages due to double-bit errors.",
        0,
    ),
    "DCGM_FI_DEV_RETIRED_PENDING": ("counter", "Total number of pages pending retirement.", 0),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": (
        "counter",
        "Total number of NVLink flow-control CRC errors.",
        0,
    ),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": (
        "counter",
        "Total number of NVLink data CRC errors.",
        0,
    ),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": (
        "counter",
        "Total number of NVLink retries.",
        0,
    ),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": (
        "counter",
        "Total number of NVLink recovery errors.",
        0,
    ),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
        "counter",
        "Number of remapped rows for uncorrectable errors",
        0,
    ),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (
        "counter",
        "Number of remapped rows for correctable errors",
        0,
    ),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed", 0),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gauge", "Whether remapping of rows is pending", 0),
}
_XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
_XID_COUNT_HELP = (
    "Count of XID Errors within user-specified time window (see xid-count-window-size param)."
)


class _GpuLike(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...
    @property
    def pci_bus_id(self) -> str: ...


def nvml_bus_id(address: str) -> str:
    """``0000:3b:00.0`` as NVML and dcgm-exporter write it: ``00000000:3B:00.0``."""
    domain, _, rest = address.rpartition(":")
    domain, _, bus = domain.rpartition(":") if domain.count(":") else ("0", "", domain)
    return f"{int(domain or '0', 16):08X}:{bus.upper()}:{rest.upper()}"


@dataclass
class FakeDcgmGpu:
    """One GPU the fake exporter serves; ``values`` overrides the healthy fields."""

    index: int
    uuid: str
    #: As NVML and dcgm-exporter write it: ``00000000:3B:00.0``.
    pci_bus_id: str
    model_name: str = "NVIDIA H100 80GB HBM3"
    values: dict[str, float] = field(default_factory=dict)
    #: XIDs within the exporter's window (DCGM_EXP_XID_ERRORS_COUNT), XID -> count.
    xid_counts: dict[int, int] = field(default_factory=dict)


class FakeDcgmExporter:
    """See the module docstring."""

    def __init__(
        self,
        gpus: Iterable[FakeDcgmGpu] = (),
        *,
        hostname: str = "node-1",
        driver_version: str = "570.124.06",
        xid_window_ms: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.hostname = hostname
        self.driver_version = driver_version
        #: With a window, the DCGM_EXP_XID_ERRORS_COUNT collector is on.
        self.xid_window_ms = xid_window_ms
        self.delay = 0.0
        self.requests = 0
        self._gpus = {g.uuid: g for g in gpus}
        self._status: int | None = None
        self._body: bytes | None = None
        self._lock = threading.Lock()
        self._host, self._port = host, port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_gpus(cls, gpus: Iterable[_GpuLike], **kwargs: object) -> FakeDcgmExporter:
        """An exporter for GPUs that have ``index``, ``uuid`` and ``pci_bus_id`` (the
        simulated NVIDIA driver's ``SimGpu``); the bus ID is written NVML's way."""
        fakes = [FakeDcgmGpu(g.index, g.uuid, nvml_bus_id(g.pci_bus_id)) for g in gpus]
        return cls(fakes, **kwargs)  # type: ignore[arg-type]

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> FakeDcgmExporter:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake._answer(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((self._host, self._port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},  # stop() returns within that
            name="fake-dcgm-exporter",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeDcgmExporter:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the fake dcgm-exporter is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/metrics"

    # -- scripting -----------------------------------------------------------------------

    def add(self, gpu: FakeDcgmGpu) -> None:
        with self._lock:
            self._gpus[gpu.uuid] = gpu

    def remove(self, uuid: str) -> None:
        """The exporter stops naming this GPU (as when a GPU falls off the bus)."""
        with self._lock:
            self._gpus.pop(uuid, None)

    def set(self, uuid: str, metric: str, value: float) -> None:
        """Serve ``value`` for ``metric`` of this GPU (any metric name)."""
        with self._lock:
            self._gpus[uuid].values[metric] = value

    def xid(self, uuid: str, xid: int) -> None:
        """An XID on this GPU: the last XID and, with a window, one more in its count."""
        with self._lock:
            gpu = self._gpus[uuid]
            gpu.values["DCGM_FI_DEV_XID_ERRORS"] = xid
            gpu.xid_counts[xid] = gpu.xid_counts.get(xid, 0) + 1

    def clear(self, uuid: str) -> None:
        """Back to healthy: every field to its healthy value, no XIDs."""
        with self._lock:
            gpu = self._gpus[uuid]
            gpu.values.clear()
            gpu.xid_counts.clear()

    def fail(self, status: int | None = 503) -> None:
        """Answer every request with HTTP ``status`` (``None``: answer normally again)."""
        with self._lock:
            self._status = status

    def set_body(self, body: bytes | str | None) -> None:
        """Serve exactly this body (``None``: the rendered GPUs again)."""
        with self._lock:
            self._body = body.encode() if isinstance(body, str) else body

    def render(self) -> str:
        """The exposition text of the GPUs now, as dcgm-exporter lays it out."""
        with self._lock:
            return self._render()

    # -- serving -------------------------------------------------------------------------

    def _render(self) -> str:
        gpus = sorted(self._gpus.values(), key=lambda g: g.index)
        lines: list[str] = []
        metrics = dict.fromkeys(DCGM_HEALTHY_FIELDS)
        for g in gpus:
            metrics.update(dict.fromkeys(g.values))
        for metric in metrics:
            kind, text, healthy = DCGM_HEALTHY_FIELDS.get(metric, ("gauge", metric, 0))
            lines.append(f"# HELP {metric} {text}")
            lines.append(f"# TYPE {metric} {kind}")
            for g in gpus:
                value = g.values.get(metric, healthy)
                lines.append(f"{metric}{{{self._labels(g)}}} {_number(value)}")
        if self.xid_window_ms is not None:
            lines.append(f"# HELP {_XID_COUNT} {_XID_COUNT_HELP}")
            lines.append(f"# TYPE {_XID_COUNT} gauge")
            for g in gpus:
                for xid, count in sorted(g.xid_counts.items()):
                    extra = f',window_size_in_ms="{self.xid_window_ms}",xid="{xid}"'
                    lines.append(f"{_XID_COUNT}{{{self._labels(g)}{extra}}} {count}")
        return "\n".join(lines) + "\n"

    def _labels(self, g: FakeDcgmGpu) -> str:
        return (
            f'gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="{g.pci_bus_id}",'
            f'device="nvidia{g.index}",modelName="{g.model_name}",Hostname="{self.hostname}",'
            f'DCGM_FI_DRIVER_VERSION="{self.driver_version}"'
        )

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        if self.delay:
            time.sleep(self.delay)
        with self._lock:
            self.requests += 1
            status, body = self._status, self._body
            if handler.path.split("?")[0] != "/metrics":
                status = 404
            if body is None and status is None:
                body = self._render().encode()
        if status is not None:
            handler.send_error(status)
            return
        assert body is not None
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:f}"
