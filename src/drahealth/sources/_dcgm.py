"""GPU health from a dcgm-exporter ``/metrics`` endpoint on the node, keyed by GPU attribute.

Owns :class:`DcgmExporterSource` (an :class:`~drahealth.sources._attached.AttachedSource`),
:class:`DcgmThresholds`, :class:`DcgmScrapeError` and :func:`parse_exposition`.

Each poll (a worker thread) scrapes the exporter over HTTP (one deadline,
``scrape_timeout``, for the whole scrape: connect, TLS handshake, request, status line,
headers and body, however slowly the bytes come; a size cap; no proxy; no redirect),
keeps only the sample lines of the DCGM fields below, parses them with
``prometheus_client``'s text parser and judges every GPU the scrape names. A GPU is
keyed by a label of its series: ``UUID`` (``key="uuid"``; the exporter's old namespace
writes ``uuid``, its link-level series ``gpu_uuid``), ``pci_bus_id``
(``key="pci"``) or ``gpu`` (``key="index"``), or any ``label=``; the Signal names the
device attribute that holds the same value (``uuid``, ``resource.kubernetes.io/pciBusID``,
``index``, or ``by=``). A MIG device shares its GPU's PCI address: keyed by PCI (with
the agent's ``match_all``) the GPU's verdict reaches its MIG devices too.

The verdicts follow DCGM's own health watches where one exists (a DCGM "fail" is
Unhealthy, a "warn" is a note on a Healthy device) and the NVML source otherwise, so both
sources say the same of one GPU; XIDs are read with core's one XID table.

* XID: ``DCGM_EXP_XID_ERRORS_COUNT`` (XIDs within the exporter's window, 5 min by
  default) when the exporter has that collector on, else ``DCGM_FI_DEV_XID_ERRORS`` (the
  last XID; DCGM keeps it until DCGM restarts, which a GPU reset or reboot does).
  Application XIDs are notes, every other XID is Unhealthy.
* ``DCGM_EXP_GPU_HEALTH_STATUS`` (DCGM's health watches): fail Unhealthy, warn a note.
* Memory: volatile double-bit ECC errors, row remapping failed or pending, retired pages
  pending, retired pages at DCGM's limit: Unhealthy; uncorrectable remapped rows at the
  limit: a note.
* Thermal and power: GPU temperature at the threshold or the GPU's own slowdown
  temperature, memory temperature at its maximum, power over the enforced limit.
* Rates over ``window_s`` (from successive scrapes): NVLink replay/recovery errors and
  CRC errors per second (Unhealthy, DCGM's limits), PCIe replays per minute (a note).

Values DCGM marks blank or unsupported (at least 2**47) and NaN are ignored. A scrape that
fails, and one that names no GPU, raises :class:`DcgmScrapeError`: the agent counts the
failed poll and refreshes nothing, so the GPUs turn Unknown when their lease ends, never
Healthy without evidence. A malformed line is skipped and counted; a GPU the scrape does
not name gets no signal (its lease runs down).
"""

from __future__ import annotations

import http.client
import io
import logging
import math
import socket
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from drahealth.core import (
    APPLICATION_XIDS,
    Health,
    Signal,
    normalize_key,
    xid_is_fatal,
    xid_message,
)

__all__ = [
    "DCGM_KEYS",
    "DcgmExporterSource",
    "DcgmScrapeError",
    "DcgmThresholds",
    "ParsedExposition",
    "ParsedSample",
    "parse_exposition",
]

log = logging.getLogger(__name__)

# -- the DCGM fields read (each with the name newer DCGM releases give it) ------------------

_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "xid": ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"),
    "xid_count": ("DCGM_EXP_XID_ERRORS_COUNT",),
    "health": ("DCGM_EXP_GPU_HEALTH_STATUS",),
    "gpu_temp": ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS"),
    "slowdown_temp": ("DCGM_FI_DEV_SLOWDOWN_TEMP", "DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS"),
    "shutdown_temp": ("DCGM_FI_DEV_SHUTDOWN_TEMP", "DCGM_FI_DEV_GPU_TEMP_SHUTDOWN_CELSIUS"),
    "mem_temp": ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS"),
    "mem_max_temp": ("DCGM_FI_DEV_MEM_MAX_OP_TEMP", "DCGM_FI_DEV_MEMORY_MAX_OP_TEMP_CELSIUS"),
    "power": ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS"),
    "power_limit": (
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS",
    ),
    "dbe_vol": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",),
    "dbe_agg": ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",),
    "row_remap_failure": ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED"),
    "row_remap_pending": ("DCGM_FI_DEV_ROW_REMAP_PENDING",),
    "uncorrectable_rows": (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
    ),
    "retired_pending": ("DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_PAGE_RETIRED_PENDING"),
    "retired_sbe": ("DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL"),
    "retired_dbe": ("DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL"),
    "nvlink_crc_flit": (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
    ),
    "nvlink_crc_data": (
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL",
    ),
    "nvlink_replay": (
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
    ),
    "nvlink_recovery": (
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL",
    ),
    "pcie_replay": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL"),
}
#: metric name -> field
_METRIC_FIELD: Final = {name: f for f, names in _FIELDS.items() for name in names}
#: Counters judged by their increase over the window (field groups summed per GPU).
_RATES: Final = {
    "nvlink_errors": ("nvlink_replay", "nvlink_recovery"),
    "nvlink_crc": ("nvlink_crc_flit", "nvlink_crc_data"),
    "pcie_replay": ("pcie_replay",),
}

#: How GPUs are keyed: key -> (labels tried in order, the device attribute of the Signal).
DCGM_KEYS: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    "uuid": (("UUID", "uuid", "gpu_uuid"), "uuid"),
    "pci": (("pci_bus_id",), "resource.kubernetes.io/pciBusID"),
    "index": (("gpu",), "index"),
}

#: DCGM_INT64_BLANK and DCGM_FP64_BLANK (and the NOT_FOUND / NOT_SUPPORTED /
#: NOT_PERMISSIONED values above them): "no value".
_BLANK: Final = 140737488355328.0
#: DCGM health watch results (dcgmHealthWatchResults_t).
_HEALTH_WARN, _HEALTH_FAIL = 10, 20
_MAX_MESSAGE = 1024
_MAX_KEY = 256  # characters of a key label value kept (attribute values are at most 64)
_MAX_HISTORY = 256  # samples kept per rate and GPU (bounds the window at a fast interval)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class DcgmScrapeError(RuntimeError):
    """The exporter could not be scraped (connection, status, timeout, size)."""


@dataclass(frozen=True, slots=True)
class DcgmThresholds:
    """When a DCGM value makes a GPU Unhealthy (``None`` turns a check off).

    The defaults are DCGM's own health-watch limits where DCGM has one, the NVML
    source's thresholds otherwise.
    """

    #: GPU temperature (C) at which the GPU is Unhealthy (NVML source: 90); the GPU's own
    #: slowdown temperature, when the exporter publishes it, if lower.
    temperature_c: float | None = 90.0
    #: Memory (HBM) temperature (C); the GPU's own maximum operating memory temperature
    #: when the exporter publishes it. 95 C is what A100 and H100 report.
    memory_temperature_c: float | None = 95.0
    #: Power over this fraction of the enforced power limit (NVML source: 1.05); needs
    #: DCGM_FI_DEV_ENFORCED_POWER_LIMIT in the exporter's counters.
    power_fraction: float | None = 1.05
    #: Volatile double-bit ECC errors (since the last reset); DCGM fails at 1.
    dbe_volatile: int | None = 1
    #: Double-bit ECC errors over the GPU's life. Off: retired pages and remapped rows
    #: repair them, and the count never goes down.
    dbe_aggregate: int | None = None
    #: Retired pages (single- plus double-bit); DCGM_LIMIT_MAX_RETIRED_PAGES is 63.
    retired_pages: int | None = 63
    #: Rows remapped for uncorrectable errors: a note (DCGM warns at 512).
    uncorrectable_rows: int | None = 512
    #: NVLink replay plus recovery errors within the window; DCGM fails at 1.
    nvlink_errors: int | None = 1
    #: NVLink CRC (flit plus data) errors per second; DCGM fails at 100.
    nvlink_crc_per_s: float | None = 100.0
    #: PCIe replays per minute: a note (DCGM warns at this rate for a Gen4 x16 link).
    pcie_replays_per_min: float | None = 16.0
    #: Seconds of scrapes the rates are computed over (DCGM's health watch: a minute).
    window_s: float = 60.0

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is None:
                continue
            if not _is_number(value):
                raise ValueError(f"DcgmThresholds.{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"DcgmThresholds.{name} must be >= 0, got {value!r}")
        if self.window_s <= 0:
            raise ValueError(f"DcgmThresholds.window_s must be > 0, got {self.window_s!r}")


@dataclass(frozen=True, slots=True)
class ParsedSample:
    """One sample of a DCGM field, with its GPU key (as the label wrote it)."""

    field: str
    key: str
    labels: Mapping[str, str]
    value: float


@dataclass(slots=True)
class ParsedExposition:
    """What :func:`parse_exposition` kept of one scrape, and what it skipped."""

    samples: list[ParsedSample]
    malformed: int = 0
    first_malformed: str = ""
    unkeyed: int = 0
    #: The exporter declares DCGM_EXP_XID_ERRORS_COUNT (it has no series without XIDs).
    xid_window: bool = False


def parse_exposition(
    text: str, key_labels: Iterable[str] = DCGM_KEYS["uuid"][0], *, max_line: int = 16384
) -> ParsedExposition:
    """The samples of the DCGM fields this module reads, from Prometheus text.

    Lines of other metrics are not parsed; a line that does not parse or is longer than
    ``max_line`` characters is skipped and counted; a sample without any of
    ``key_labels`` is counted as unkeyed; blank and NaN values are dropped.
    """
    labels_tried = tuple(key_labels)
    out = ParsedExposition([])
    kept: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            if line.startswith("# TYPE DCGM_EXP_XID_ERRORS_COUNT"):
                out.xid_window = True
            continue
        end = 0
        while end < len(line) and line[end] not in "{ \t":
            end += 1
        if line[:end] not in _METRIC_FIELD:
            continue
        if len(line) > max_line:
            _malformed(out, line)
            continue
        kept.append(line)
    try:
        families = list(text_string_to_metric_families("\n".join(kept) + "\n"))
    except ValueError:  # a bad line: parse one by one, skipping the bad ones
        families = []
        for line in kept:
            try:
                families.extend(text_string_to_metric_families(line + "\n"))
            except ValueError:
                _malformed(out, line)
    for family in families:
        for sample in family.samples:
            fld = _METRIC_FIELD.get(sample.name)
            if fld is None:  # a name the parser split differently: not ours
                continue
            value = float(sample.value)
            if math.isnan(value) or abs(value) >= _BLANK:
                continue
            key = next((sample.labels[k] for k in labels_tried if sample.labels.get(k)), None)
            if key is None:
                out.unkeyed += 1
                continue
            out.samples.append(ParsedSample(fld, key, sample.labels, value))
    return out


def _malformed(out: ParsedExposition, line: str) -> None:
    out.malformed += 1
    if not out.first_malformed:
        out.first_malformed = line[:120]


# -- judging one GPU -------------------------------------------------------------------------


@dataclass(slots=True)
class _Gpu:
    raw: str  # the key as the exporter wrote it (the first spelling seen)
    values: dict[str, float] = field(default_factory=dict)  # field -> max over its series
    xids: dict[int, float] = field(default_factory=dict)  # windowed XID -> count
    xid_window_ms: str = ""
    health: list[tuple[str, str, float]] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _fmt(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


class DcgmExporterSource:
    """See the module docstring."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:9400/metrics",
        *,
        key: str = "uuid",
        label: str | None = None,
        by: str | None = None,
        thresholds: DcgmThresholds = DcgmThresholds(),  # frozen
        informational_xids: Iterable[int] = APPLICATION_XIDS,
        fatal_xids: Iterable[int] = (),
        interval: float = 15.0,
        timeout: float = 60.0,
        scrape_timeout: float = 5.0,
        max_bytes: int = 4 * 1024 * 1024,
        max_devices: int = 1024,
        name: str = "dcgm",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"dcgm-exporter url must be http(s)://HOST[:PORT]/PATH, got {url!r}")
        if label is None:
            if not isinstance(key, str) or key not in DCGM_KEYS:
                raise ValueError(
                    f"dcgm-exporter key must be one of {', '.join(DCGM_KEYS)} "
                    f"(or give label=), got {key!r}"
                )
            labels, attribute = DCGM_KEYS[key]
        else:
            if not isinstance(label, str) or not label:
                raise ValueError("dcgm-exporter label must be a non-empty string")
            labels, attribute = (label,), label
        for what, number in (
            ("interval", interval),
            ("timeout", timeout),
            ("scrape_timeout", scrape_timeout),
        ):
            if not (_is_number(number) and math.isfinite(number) and number > 0):
                raise ValueError(f"dcgm-exporter {what} must be > 0 seconds, got {number!r}")
        for what, count in (("max_bytes", max_bytes), ("max_devices", max_devices)):
            if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
                raise ValueError(f"dcgm-exporter {what} must be a whole number >= 1, got {count!r}")
        if by is not None and (not isinstance(by, str) or not by):
            raise ValueError("dcgm-exporter by must be a non-empty attribute name")
        self.name = name
        self.interval = interval
        self.timeout = timeout
        self.url = url
        self.key_labels: tuple[str, ...] = labels
        self.by = by or attribute
        self.thresholds = thresholds
        self.informational = frozenset(informational_xids)
        self.fatal = frozenset(fatal_xids)
        self.scrape_timeout = scrape_timeout
        self.max_bytes = max_bytes
        self.max_devices = max_devices
        self._clock = clock
        self._history: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        #: Counters for metrics and views: scrapes, failed scrapes, skipped lines.
        self.scrapes = 0
        self.scrape_errors = 0
        self.malformed_lines = 0
        self.dropped_devices = 0
        self.last_error = ""
        self._warned: set[str] = set()

    # -- polling ---------------------------------------------------------------------------

    def poll(self) -> list[Signal]:
        """Scrape once and judge every GPU the scrape names (raises DcgmScrapeError)."""
        try:
            signals = self.judge(self._scrape())
        except DcgmScrapeError as exc:
            self.scrape_errors += 1
            if str(exc) != self.last_error:
                log.warning("%s", exc)
            self.last_error = str(exc)
            raise
        if self.last_error:
            log.info("dcgm-exporter %s answers again", self.url)
            self.last_error = ""
        self.scrapes += 1
        return signals

    def judge(self, text: str) -> list[Signal]:
        """The signals for one scrape's text (also keeps the rate history); raises
        DcgmScrapeError when the text names no GPU."""
        parsed = parse_exposition(text, self.key_labels)
        if parsed.malformed:
            self.malformed_lines += parsed.malformed
            self._warn_once(
                "malformed",
                f"dcgm-exporter {self.url}: {parsed.malformed} malformed line(s) skipped "
                f"(first: {parsed.first_malformed!r})",
            )
        gpus: dict[str, _Gpu] = {}
        for s in parsed.samples:
            raw = s.key[:_MAX_KEY]
            k = normalize_key(self.by, raw)
            gpu = gpus.get(k)
            if gpu is None:
                if len(gpus) >= self.max_devices:
                    self.dropped_devices += 1
                    self._warn_once(
                        "devices", f"dcgm-exporter {self.url}: over {self.max_devices} GPUs"
                    )
                    continue
                gpu = gpus[k] = _Gpu(raw)
            self._collect(gpu, s)
        if not gpus:
            raise DcgmScrapeError(
                f"dcgm-exporter {self.url}: no GPU in the scrape (no DCGM health field "
                f"with a {'/'.join(self.key_labels)} label)"
            )
        now = self._clock()
        for stale in [h for h in self._history if h[1] not in gpus]:
            del self._history[stale]
        out: list[Signal] = []
        for k, gpu in sorted(gpus.items()):
            self._judge(k, gpu, now, parsed.xid_window)
            health = Health.UNHEALTHY if gpu.faults else Health.HEALTHY
            message = "; ".join(gpu.faults + gpu.notes)[:_MAX_MESSAGE]
            out.append(Signal(self.by, gpu.raw, health, message))
        return out

    def dropped(self) -> dict[str, int]:
        """What scrapes held and was not used, by reason (for the agent's metrics)."""
        return {"malformed": self.malformed_lines, "overflow": self.dropped_devices}

    def _warn_once(self, what: str, text: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("%s", text)

    # -- scraping --------------------------------------------------------------------------

    def _scrape(self) -> str:
        """The body of one GET of the exporter, within ``scrape_timeout`` seconds for
        everything (connect, TLS, request, status line, headers and body: every read
        waits at most for what is left of that one deadline, so bytes trickled one at a
        time cannot stretch it) and at most ``max_bytes`` of body."""
        deadline = time.monotonic() + self.scrape_timeout
        parts = urllib.parse.urlsplit(self.url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn = _deadline_connection(parts, deadline)
        try:
            conn.request(
                "GET",
                path,
                headers={
                    "Accept": "text/plain;version=0.0.4",
                    "User-Agent": "drahealth",
                    "Connection": "close",
                },
            )
            response = conn.getresponse()
            if response.status != 200:  # no redirect is followed: dcgm-exporter has none
                raise DcgmScrapeError(f"dcgm-exporter {self.url}: HTTP {response.status}")
            chunks: list[bytes] = []
            size = 0
            while True:
                chunk = response.read1(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > self.max_bytes:
                    raise DcgmScrapeError(
                        f"dcgm-exporter {self.url}: response over {self.max_bytes} bytes"
                    )
                chunks.append(chunk)
        except (_DeadlinePassed, TimeoutError):
            raise DcgmScrapeError(
                f"dcgm-exporter {self.url}: timed out, no complete response in "
                f"{self.scrape_timeout:g} s"
            ) from None
        except (http.client.HTTPException, OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise DcgmScrapeError(f"dcgm-exporter {self.url}: {reason}") from None
        finally:
            conn.close()
        return b"".join(chunks).decode("utf-8", errors="replace")

    # -- judging ---------------------------------------------------------------------------

    def _collect(self, gpu: _Gpu, s: ParsedSample) -> None:
        if s.field == "xid_count":
            xid = _int(s.labels.get("xid", ""))
            if xid is not None and s.value > 0:
                gpu.xids[xid] = gpu.xids.get(xid, 0.0) + s.value
                gpu.xid_window_ms = s.labels.get("window_size_in_ms", "")
        elif s.field == "health":
            gpu.health.append(
                (s.labels.get("health_watch", "?"), s.labels.get("health_error_code", ""), s.value)
            )
        else:
            gpu.values[s.field] = max(s.value, gpu.values.get(s.field, s.value))

    def _judge(self, key: str, gpu: _Gpu, now: float, xid_window: bool) -> None:
        t = self.thresholds
        v = gpu.values
        self._judge_xids(gpu, xid_window)
        for watch, code, result in gpu.health:
            if result >= _HEALTH_WARN:
                verdict = "fail" if result >= _HEALTH_FAIL else "warn"
                text = f"DCGM health {watch}: {verdict}" + (f" ({code})" if code else "")
                (gpu.faults if result >= _HEALTH_FAIL else gpu.notes).append(text)
        # memory
        _at(gpu, v.get("dbe_vol"), t.dbe_volatile, "{} volatile double-bit ECC error(s) "
            "(reset the GPU)")  # fmt: skip
        _at(gpu, v.get("dbe_agg"), t.dbe_aggregate, "{} double-bit ECC error(s) over the "
            "GPU's life")  # fmt: skip
        _at(gpu, v.get("row_remap_failure"), 1, "row remapping failed (replace the GPU)")
        _at(gpu, v.get("row_remap_pending"), 1, "row remapping pending (reset the GPU)")
        _at(gpu, v.get("retired_pending"), 1, "retired memory pages pending (reset the GPU)")
        if "retired_sbe" in v or "retired_dbe" in v:
            retired = v.get("retired_sbe", 0.0) + v.get("retired_dbe", 0.0)
            _at(gpu, retired, t.retired_pages, "{} retired memory pages (replace the GPU)")
        _at(gpu, v.get("uncorrectable_rows"), t.uncorrectable_rows,
            "{} rows remapped for uncorrectable errors", note=True)  # fmt: skip
        # thermal and power
        self._judge_temperature(gpu)
        power, limit = v.get("power"), v.get("power_limit")
        fraction = t.power_fraction
        if power is not None and limit and fraction is not None and power > limit * fraction:
            gpu.faults.append(f"power {power:.0f} W over the {limit:.0f} W limit")
        # rates
        for rate, fields in _RATES.items():
            present = [v[f] for f in fields if f in v]
            if present:
                self._judge_rate(gpu, key, rate, sum(present), now)

    def _judge_xids(self, gpu: _Gpu, xid_window: bool) -> None:
        if xid_window:
            window = _int(gpu.xid_window_ms)
            span = f" in the last {window / 60000:g} min" if window else ""
            for xid, count in sorted(gpu.xids.items()):
                self._xid(gpu, xid, f", {_fmt(count)} time(s){span}")
            return
        last = gpu.values.get("xid")
        if last is not None and last >= 1 and last == int(last):
            self._xid(gpu, int(last), "")

    def _xid(self, gpu: _Gpu, xid: int, context: str) -> None:
        fatal = xid_is_fatal(xid, self.informational, self.fatal)
        (gpu.faults if fatal else gpu.notes).append(xid_message(xid, fatal) + context)

    def _judge_temperature(self, gpu: _Gpu) -> None:
        t, v = self.thresholds, gpu.values
        temp = v.get("gpu_temp")
        if temp is not None:
            limits = [(t.temperature_c, "")] if t.temperature_c is not None else []
            for fld, what in (("slowdown_temp", "slowdown"), ("shutdown_temp", "shutdown")):
                own = v.get(fld)
                if own and own > 0:
                    limits.append((own, f" (its {what} temperature)"))
            hit = [(lim, what) for lim, what in limits if temp >= lim]
            if hit:
                lim, what = max(hit, key=lambda h: h[0])  # the highest limit reached
                gpu.faults.append(f"temperature {_fmt(temp)} C >= {_fmt(lim)} C{what}")
        mem = v.get("mem_temp")
        own = v.get("mem_max_temp")
        limit = own if own and own > 0 else t.memory_temperature_c
        if mem is not None and mem > 0 and limit is not None and mem >= limit:
            gpu.faults.append(f"memory temperature {_fmt(mem)} C >= {_fmt(limit)} C")

    def _judge_rate(self, gpu: _Gpu, key: str, rate: str, value: float, now: float) -> None:
        t = self.thresholds
        hist = self._history.setdefault((rate, key), deque(maxlen=_MAX_HISTORY))
        hist.append((now, value))
        while len(hist) > 2 and hist[1][0] <= now - t.window_s:
            hist.popleft()
        if len(hist) < 2 or hist[-1][0] <= hist[0][0]:
            return
        increase = 0.0
        for (_, a), (_, b) in zip(hist, list(hist)[1:], strict=False):
            increase += b - a if b >= a else b  # a drop is a counter reset (GPU reset)
        elapsed = hist[-1][0] - hist[0][0]
        span = f"{_fmt(elapsed)} s"
        if rate == "nvlink_errors" and t.nvlink_errors is not None:
            if increase >= max(t.nvlink_errors, 1):
                gpu.faults.append(f"{_fmt(increase)} NVLink replay/recovery error(s) in {span}")
        elif rate == "nvlink_crc" and t.nvlink_crc_per_s is not None:
            per_s = increase / elapsed
            if increase and per_s >= t.nvlink_crc_per_s:
                gpu.faults.append(
                    f"NVLink CRC errors at {_fmt(per_s)}/s (limit {_fmt(t.nvlink_crc_per_s)}/s)"
                )
        elif rate == "pcie_replay" and t.pcie_replays_per_min is not None:
            per_min = increase * 60 / elapsed
            if increase and per_min >= t.pcie_replays_per_min:
                gpu.notes.append(f"PCIe replays at {_fmt(per_min)}/min")


def _at(
    gpu: _Gpu, value: float | None, limit: float | None, text: str, *, note: bool = False
) -> None:
    """Record ``text`` (``{}``: the value) when ``value`` reached ``limit``."""
    if value is None or limit is None or value < max(limit, 1):
        return
    (gpu.notes if note else gpu.faults).append(text.format(_fmt(value)))


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


class _DeadlinePassed(Exception):
    """The scrape's total deadline passed (before or during a read)."""


class _DeadlineReader(io.RawIOBase):
    """Reads of a socket, each waiting at most until the scrape's deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise _DeadlinePassed
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            raise _DeadlinePassed from None


class _DeadlineSocket:
    """What ``http.client`` needs of a socket, bound by one deadline: sends wait at most
    until it, and the response is read through :class:`_DeadlineReader`."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def _left(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise _DeadlinePassed
        return left

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(self._left())
        self._sock.sendall(data)

    def makefile(self, mode: str, *args: object, **kwargs: object) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def close(self) -> None:
        """``http.client`` closes the connection once the response is read or will be
        read to its end; the socket is closed by the scrape, after the body."""


def _deadline_connection(parts: urllib.parse.SplitResult, deadline: float) -> _Connection:
    """An HTTP(S) connection to ``parts``' host whose connect, TLS handshake, request
    and response all end by ``deadline`` (no proxy is used)."""
    host = parts.hostname or ""
    port = parts.port
    left = max(deadline - time.monotonic(), 0.001)
    if parts.scheme == "https":
        return _Connection(http.client.HTTPSConnection(host, port, timeout=left), deadline)
    return _Connection(http.client.HTTPConnection(host, port, timeout=left), deadline)


class _Connection:
    """One connection of one scrape: connects (within the deadline; a TLS handshake
    is bounded by the socket timeout as a whole), then every read and write is bound by
    the deadline."""

    def __init__(self, conn: http.client.HTTPConnection, deadline: float) -> None:
        self._conn = conn
        self._deadline = deadline
        self._sock: socket.socket | None = None

    def request(self, method: str, path: str, headers: Mapping[str, str]) -> None:
        conn = self._conn
        if time.monotonic() >= self._deadline:
            raise _DeadlinePassed
        conn.connect()  # create_connection and the TLS handshake, within the timeout
        sock = conn.sock
        assert sock is not None
        self._sock = sock
        conn.sock = _DeadlineSocket(sock, self._deadline)
        conn.request(method, path, headers=dict(headers))

    def getresponse(self) -> http.client.HTTPResponse:
        return self._conn.getresponse()

    def close(self) -> None:
        self._conn.close()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
