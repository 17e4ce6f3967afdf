"""DcgmExporterSource's judgement of dcgm-exporter text: fields, thresholds, rates, keys,
malformed and hostile input (no HTTP here; see tests/integration/sources/test_dcgm_http.py).
"""

from __future__ import annotations

import logging

import pytest

from drahealth.core import Health, Signal, normalize_key
from drahealth.sources import DcgmExporterSource, DcgmScrapeError, DcgmThresholds
from drahealth.sources._dcgm import parse_exposition

H, U = Health.HEALTHY, Health.UNHEALTHY
G0 = "GPU-a8affe7e-7930-ae20-3fc6-4b0edf3ebbf3"
G1 = "GPU-72ad4d20-cfed-f08d-c894-f620962ca3e4"

_LABELS = {
    G0: 'gpu="0",UUID="{u}",pci_bus_id="00000000:0D:00.0",device="nvidia0",'
    'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="570.124.06"',
    G1: 'gpu="1",UUID="{u}",pci_bus_id="00000000:B4:00.0",device="nvidia1",'
    'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="570.124.06"',
}


def series(metric: str, uuid: str, value: str, extra: str = "") -> str:
    return f"{metric}{{{_LABELS[uuid].format(u=uuid)}{extra}}} {value}"


#: What dcgm-exporter 4.x serves for two healthy H100s with its default counters plus the
#: health fields drahealth recommends (HELP/TYPE lines, a pod-attributed series, a
#: memory temperature DCGM cannot read: DCGM_INT64_NOT_SUPPORTED).
HEALTHY = "\n".join(
    [
        "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).",
        "# TYPE DCGM_FI_DEV_SM_CLOCK gauge",
        series("DCGM_FI_DEV_SM_CLOCK", G0, "1980"),
        series("DCGM_FI_DEV_SM_CLOCK", G1, "210"),
        "# HELP DCGM_FI_DEV_MEMORY_TEMP Memory temperature (in C).",
        "# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge",
        series("DCGM_FI_DEV_MEMORY_TEMP", G0, "9223372036854775794"),
        series("DCGM_FI_DEV_MEMORY_TEMP", G1, "41"),
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).",
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
        series(
            "DCGM_FI_DEV_GPU_TEMP",
            G0,
            "47",
            ',container="trainer",namespace="ml",pod="llama-0"',
        ),
        series("DCGM_FI_DEV_GPU_TEMP", G1, "32"),
        "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).",
        "# TYPE DCGM_FI_DEV_POWER_USAGE gauge",
        series("DCGM_FI_DEV_POWER_USAGE", G0, "412.571000"),
        series("DCGM_FI_DEV_POWER_USAGE", G1, "71.203000"),
        "# HELP DCGM_FI_DEV_PCIE_REPLAY_COUNTER Total number of PCIe retries.",
        "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter",
        series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", G0, "0"),
        series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", G1, "0"),
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.",
        "# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
        series("DCGM_FI_DEV_XID_ERRORS", G0, "0"),
        series("DCGM_FI_DEV_XID_ERRORS", G1, "0"),
        "# HELP DCGM_FI_DEV_ECC_DBE_VOL_TOTAL Total number of double-bit volatile ECC errors.",
        "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter",
        series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", G0, "0"),
        series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", G1, "0"),
        "# HELP DCGM_FI_DEV_ROW_REMAP_FAILURE Whether remapping of rows has failed",
        "# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge",
        series("DCGM_FI_DEV_ROW_REMAP_FAILURE", G0, "0"),
        series("DCGM_FI_DEV_ROW_REMAP_FAILURE", G1, "0"),
        "# HELP DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL Total number of NVLink bandwidth counters",
        "# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter",
        series("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", G0, "31035686671"),
        series("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", G1, "0"),
        "",
    ]
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def setting(metric: str, uuid: str, value: str, base: str = HEALTHY) -> str:
    """``base`` with the value of ``metric`` for ``uuid`` changed (the line must exist)."""
    lines = base.split("\n")
    for i, line in enumerate(lines):
        if line.startswith(metric + "{") and f'UUID="{uuid}"' in line:
            lines[i] = line.rpartition(" ")[0] + " " + value
            return "\n".join(lines)
    raise AssertionError(f"no {metric} line for {uuid}")


def source(**kw: object) -> DcgmExporterSource:
    return DcgmExporterSource("http://127.0.0.1:9400/metrics", **kw)  # type: ignore[arg-type]


def with_lines(*lines: str, base: str = HEALTHY) -> str:
    return base + "\n".join(lines) + "\n"


def by_value(signals: list[Signal]) -> dict[str, Signal]:
    return {s.value: s for s in signals}


def test_healthy_gpus_keyed_by_uuid_as_the_exporter_writes_it() -> None:
    got = source().judge(HEALTHY)
    assert sorted(got, key=lambda s: s.value) == [
        Signal("uuid", G1, H, ""),
        Signal("uuid", G0, H, ""),
    ]


def test_keyed_by_pci_bus_id_or_index() -> None:
    pci = by_value(source(key="pci").judge(HEALTHY))
    assert {normalize_key(s.by, s.value) for s in pci.values()} == {"0000:0d:00.0", "0000:b4:00.0"}
    assert {s.by for s in pci.values()} == {"resource.kubernetes.io/pciBusID"}
    index = by_value(source(key="index").judge(HEALTHY))
    assert set(index) == {"0", "1"} and {s.by for s in index.values()} == {"index"}
    custom = source(label="device", by="gpu.example.com/dev").judge(HEALTHY)
    assert {(s.by, s.value) for s in custom} == {
        ("gpu.example.com/dev", "nvidia0"),
        ("gpu.example.com/dev", "nvidia1"),
    }


def test_old_namespace_uuid_label() -> None:
    text = HEALTHY.replace('UUID="', 'uuid="')
    assert {s.value for s in source().judge(text)} == {G0, G1}


@pytest.mark.parametrize(
    ("xid", "health", "message"),
    [
        (79, U, "XID 79: GPU has fallen off the bus (reset the GPU)"),
        (48, U, "XID 48: double-bit ECC error (reset the GPU)"),
        (119, U, "XID 119: GSP RPC timeout (reset the GPU)"),
        (154, U, "XID 154: critical error (reset the GPU)"),
        (13, H, "XID 13: graphics engine exception (application error) (informational)"),
        (31, H, "XID 31: GPU memory page fault (application error) (informational)"),
    ],
)
def test_last_xid_uses_the_one_xid_table(xid: int, health: Health, message: str) -> None:
    text = setting("DCGM_FI_DEV_XID_ERRORS", G0, str(xid))
    got = by_value(source().judge(text))
    assert (got[G0].health, got[G0].message) == (health, message)
    assert (got[G1].health, got[G1].message) == (H, "")


def test_xid_overrides() -> None:
    text = setting("DCGM_FI_DEV_XID_ERRORS", G0, "13")
    assert by_value(source(fatal_xids=[13]).judge(text))[G0].health is U
    text = setting("DCGM_FI_DEV_XID_ERRORS", G0, "74", text)
    assert by_value(source(informational_xids=[74]).judge(text))[G0].health is H


def test_the_xid_window_wins_over_the_sticky_last_xid() -> None:
    count_type = "# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge"
    window = ',window_size_in_ms="300000",xid="79"'
    sticky = setting("DCGM_FI_DEV_XID_ERRORS", G1, "79")
    # the collector is on and counts XID 79 twice on GPU 0; GPU 1's XID 79 is older
    text = with_lines(
        "# HELP DCGM_EXP_XID_ERRORS_COUNT Count of XID Errors within user-specified time window",
        count_type,
        series("DCGM_EXP_XID_ERRORS_COUNT", G0, "2", window),
        base=sticky,
    )
    got = by_value(source().judge(text))
    assert got[G0].health is U
    assert got[G0].message == (
        "XID 79: GPU has fallen off the bus (reset the GPU), 2 time(s) in the last 5 min"
    )
    assert (got[G1].health, got[G1].message) == (H, "")
    # without the collector, the last XID is all there is
    assert by_value(source().judge(sticky))[G1].health is U


def health(uuid: str, value: str, code: str, watch: str) -> str:
    extra = f',health_error_code="{code}",health_watch="{watch}"'
    return series("DCGM_EXP_GPU_HEALTH_STATUS", uuid, value, extra)


def test_dcgm_health_watches_fail_is_unhealthy_warn_is_a_note() -> None:
    text = with_lines(
        "# TYPE DCGM_EXP_GPU_HEALTH_STATUS gauge",
        health(G0, "20", "DCGM_FR_ROW_REMAP_FAILURE", "MEM"),
        health(G0, "0", "DCGM_FR_OK", "PCIE"),
        health(G1, "10", "DCGM_FR_PCI_REPLAY_RATE", "PCIE"),
    )
    got = by_value(source().judge(text))
    assert (got[G0].health, got[G0].message) == (
        U,
        "DCGM health MEM: fail (DCGM_FR_ROW_REMAP_FAILURE)",
    )
    assert (got[G1].health, got[G1].message) == (
        H,
        "DCGM health PCIE: warn (DCGM_FR_PCI_REPLAY_RATE)",
    )


@pytest.mark.parametrize(
    ("metric", "value", "health", "message"),
    [
        (
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "2",
            U,
            "2 volatile double-bit ECC error(s) (reset the GPU)",
        ),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1", U, "row remapping failed (replace the GPU)"),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", "1", U, "row remapping pending (reset the GPU)"),
        ("DCGM_FI_DEV_RETIRED_PENDING", "3", U, "retired memory pages pending (reset the GPU)"),
        (
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "512",
            H,
            "512 rows remapped for uncorrectable errors",
        ),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "7", H, ""),
        ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "40", H, ""),  # off by default
        ("DCGM_FI_DEV_ROW_REMAP_FAILED", "1", U, "row remapping failed (replace the GPU)"),
        ("DCGM_FI_DEV_XID_ERROR", "95", U, "XID 95: uncontained ECC error (reset the GPU)"),
        ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "91", U, "temperature 91 C >= 90 C"),
    ],
)
def test_memory_and_newer_field_names(
    metric: str, value: str, health: Health, message: str
) -> None:
    got = by_value(source().judge(with_lines(series(metric, G0, value))))
    assert (got[G0].health, got[G0].message) == (health, message)


def test_retired_pages_at_dcgms_limit_and_aggregate_dbe_when_asked() -> None:
    text = with_lines(
        series("DCGM_FI_DEV_RETIRED_SBE", G0, "40"),
        series("DCGM_FI_DEV_RETIRED_DBE", G0, "23"),
        series("DCGM_FI_DEV_RETIRED_SBE", G1, "40"),
        series("DCGM_FI_DEV_RETIRED_DBE", G1, "22"),
        series("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", G1, "3"),
    )
    got = by_value(source().judge(text))
    assert (got[G0].health, got[G0].message) == (U, "63 retired memory pages (replace the GPU)")
    assert got[G1].health is H
    got = by_value(source(thresholds=DcgmThresholds(dbe_aggregate=1)).judge(text))
    assert got[G1].message == "3 double-bit ECC error(s) over the GPU's life"


def test_temperature_threshold_and_the_gpus_own_slowdown_temperature() -> None:
    text = setting("DCGM_FI_DEV_GPU_TEMP", G1, "90")
    assert by_value(source().judge(text))[G1].message == "temperature 90 C >= 90 C"
    assert (
        by_value(source(thresholds=DcgmThresholds(temperature_c=None)).judge(text))[G1].health is H
    )
    # the GPU says it slows down at 87 C
    text = with_lines(
        series("DCGM_FI_DEV_SLOWDOWN_TEMP", G0, "87"),
        series("DCGM_FI_DEV_SHUTDOWN_TEMP", G0, "92"),
        base=setting("DCGM_FI_DEV_GPU_TEMP", G0, "88"),
    )
    assert (
        by_value(source().judge(text))[G0].message
        == "temperature 88 C >= 87 C (its slowdown temperature)"
    )
    hot = setting("DCGM_FI_DEV_GPU_TEMP", G0, "93", text)
    assert (
        by_value(source().judge(hot))[G0].message
        == "temperature 93 C >= 92 C (its shutdown temperature)"
    )


def test_memory_temperature_blank_values_and_the_gpus_own_maximum() -> None:
    # G0's memory temperature is DCGM_INT64_NOT_SUPPORTED: ignored, never "too hot"
    got = by_value(source().judge(HEALTHY))
    assert got[G0].health is H
    text = setting("DCGM_FI_DEV_MEMORY_TEMP", G1, "96")
    assert by_value(source().judge(text))[G1].message == "memory temperature 96 C >= 95 C"
    text = with_lines(series("DCGM_FI_DEV_MEM_MAX_OP_TEMP", G1, "105"), base=text)
    assert by_value(source().judge(text))[G1].health is H


def test_power_over_the_enforced_limit() -> None:
    text = with_lines(series("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", G0, "350"))  # G0 draws 412.6 W
    got = by_value(source().judge(text))
    assert (got[G0].health, got[G0].message) == (U, "power 413 W over the 350 W limit")
    assert by_value(source().judge(HEALTHY))[G0].health is H  # no limit published: no verdict


def nvlink(uuid: str, replay: int, recovery: int = 0, crc: int = 0) -> str:
    return with_lines(
        series("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", uuid, str(replay)),
        series("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", uuid, str(recovery)),
        series("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", uuid, str(crc)),
    )


def test_nvlink_replay_errors_within_the_window() -> None:
    clock = Clock()
    src = source(clock=clock)
    assert by_value(src.judge(nvlink(G0, 5)))[G0].health is H  # a baseline, not a rate
    clock.now += 15
    assert by_value(src.judge(nvlink(G0, 5)))[G0].health is H
    clock.now += 15
    got = by_value(src.judge(nvlink(G0, 5, recovery=1)))[G0]
    assert (got.health, got.message) == (U, "1 NVLink replay/recovery error(s) in 30 s")
    clock.now += 45  # the error is still within the last minute
    assert by_value(src.judge(nvlink(G0, 5, recovery=1)))[G0].health is U
    clock.now += 30  # now it is not
    assert by_value(src.judge(nvlink(G0, 5, recovery=1)))[G0].health is H


def test_nvlink_crc_rate_and_counter_reset() -> None:
    clock = Clock()
    src = source(clock=clock)
    src.judge(nvlink(G0, 0, crc=1000))
    clock.now += 10
    got = by_value(src.judge(nvlink(G0, 0, crc=3000)))[G0]
    assert (got.health, got.message) == (U, "NVLink CRC errors at 200/s (limit 100/s)")
    # the GPU was reset: counters start again; the drop is not a negative rate
    src = source(clock=clock)
    src.judge(nvlink(G0, 0, crc=5000))
    clock.now += 10
    assert by_value(src.judge(nvlink(G0, 0, crc=20)))[G0].health is H
    clock.now += 10
    assert by_value(src.judge(nvlink(G0, 0, crc=40)))[G0].health is H


def test_pcie_replays_are_a_note() -> None:
    clock = Clock()
    src = source(clock=clock)
    src.judge(HEALTHY)
    clock.now += 30
    text = setting("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", G0, "20")
    got = by_value(src.judge(text))[G0]
    assert (got.health, got.message) == (H, "PCIe replays at 40/min")


def test_faults_first_then_notes_and_the_message_is_bounded() -> None:
    text = with_lines(
        series("DCGM_FI_DEV_ROW_REMAP_PENDING", G0, "1"),
        series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", G0, "600"),
        base=setting("DCGM_FI_DEV_XID_ERRORS", G0, "79"),
    )
    got = by_value(source().judge(text))[G0]
    assert got.message == (
        "XID 79: GPU has fallen off the bus (reset the GPU); row remapping pending (reset the "
        "GPU); 600 rows remapped for uncorrectable errors"
    )
    many = "".join(
        series("DCGM_EXP_GPU_HEALTH_STATUS", G0, "20", f',health_watch="W{i}"') + "\n"
        for i in range(200)
    )
    assert len(by_value(source().judge(HEALTHY + many))[G0].message) == 1024


def test_malformed_lines_are_skipped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    src = source()
    bad = [
        'DCGM_FI_DEV_GPU_TEMP{gpu="2",UUID="GPU-x" 5',  # unterminated label set
        'DCGM_FI_DEV_GPU_TEMP{gpu="3",UUID="GPU-y"} hot',  # not a number
        'DCGM_FI_DEV_XID_ERRORS{UUID="GPU-z",bad"label="1"} 79',
    ]
    text = with_lines(*bad, series("DCGM_FI_DEV_XID_ERRORS", G1, "79"))
    with caplog.at_level(logging.WARNING):
        got = by_value(src.judge(text))
        src.judge(text)
    assert set(got) == {G0, G1}
    assert got[G1].health is U  # the good line after the bad ones still counts
    assert src.malformed_lines == 6
    warnings = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(warnings) == 1 and "3 malformed line(s)" in warnings[0]
    # lines of metrics this source does not read are never parsed, so never counted
    parsed = parse_exposition("garbage line\nDCGM_FI_DEV_FB_USED{oops 1\n")
    assert (parsed.malformed, parsed.samples) == (0, [])


def test_hostile_sizes_are_bounded() -> None:
    src = source(max_devices=3)
    flood = "".join(f'DCGM_FI_DEV_GPU_TEMP{{UUID="GPU-{i:05d}"}} 40\n' for i in range(10))
    assert len(src.judge(flood)) == 3 and src.dropped_devices == 7
    long_line = 'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-1",x="' + "a" * 20000 + '"} 99'
    parsed = parse_exposition(long_line + "\n" + series("DCGM_FI_DEV_GPU_TEMP", G0, "40"))
    assert parsed.malformed == 1 and [s.key for s in parsed.samples] == [G0]
    huge_key = 'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-' + "b" * 5000 + '"} 40\n'
    (signal,) = source().judge(huge_key)
    assert len(signal.value) == 256
    noise = "".join(f'DCGM_FI_DEV_FB_USED{{gpu="{i}"}} {i}\n' for i in range(100_000))
    assert {s.value for s in source().judge(noise + HEALTHY)} == {G0, G1}


def test_a_scrape_naming_no_gpu_is_an_error_not_healthy() -> None:
    src = source()
    with pytest.raises(DcgmScrapeError, match="no GPU in the scrape"):
        src.judge("# HELP nothing here\n")
    with pytest.raises(DcgmScrapeError, match="UUID/uuid/gpu_uuid label"):
        src.judge('DCGM_FI_DEV_GPU_TEMP{gpu="0"} 40\n')  # keyed by UUID, no UUID label
    with pytest.raises(DcgmScrapeError):
        src.judge('DCGM_FI_DEV_GPU_TEMP{UUID="GPU-1"} NaN\n')


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"url": "unix:///run/dcgm.sock"}, "must be http"),
        ({"url": "http:///metrics"}, "must be http"),
        ({"key": "serial"}, "key must be one of uuid, pci, index"),
        ({"label": ""}, "label must be a non-empty string"),
        ({"scrape_timeout": "5s"}, "scrape_timeout must be > 0 seconds, got '5s'"),
        ({"max_devices": 2.5}, "max_devices must be a whole number"),
        ({"key": ["uuid"]}, "key must be one of"),
        ({"interval": 0}, "interval must be > 0"),
        ({"scrape_timeout": float("nan")}, "scrape_timeout must be > 0"),
        ({"max_bytes": 0}, "max_bytes"),
    ],
)
def test_bad_configuration_is_refused(kwargs: dict[str, object], error: str) -> None:
    url = kwargs.pop("url", "http://127.0.0.1:9400/metrics")
    with pytest.raises(ValueError, match=error):
        DcgmExporterSource(url, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"temperature_c": -1}, r"temperature_c must be >= 0"),
        ({"nvlink_crc_per_s": "100"}, r"nvlink_crc_per_s must be a number"),
        ({"retired_pages": True}, r"retired_pages must be a number"),
        ({"window_s": 0}, r"window_s must be > 0"),
        ({"power_fraction": float("inf")}, r"power_fraction must be >= 0"),
    ],
)
def test_bad_thresholds_are_refused(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        DcgmThresholds(**kwargs)  # type: ignore[arg-type]


def nvidia_slice(driver: str, devices: dict[str, tuple[str, str]]) -> dict[str, object]:
    """A ResourceSlice as NVIDIA's driver writes one: ``uuid`` and the standard PCI bus ID."""
    return {
        "spec": {
            "driver": driver,
            "nodeName": "gpu-node-7",
            "pool": {"name": "gpu-node-7", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": name,
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": uuid},
                        "resource.kubernetes.io/pciBusID": {"string": pci},
                    },
                }
                for name, (uuid, pci) in devices.items()
            ],
        }
    }


@pytest.mark.parametrize("key", ["uuid", "pci"])
def test_signals_find_the_nvidia_drivers_devices_and_no_other(key: str) -> None:
    from drahealth.core import AttachedHealth, AttachIndex, SourceSpec

    gpus = {"gpu-0": (G0, "0000:0d:00.0"), "gpu-1": (G1, "0000:b4:00.0")}
    slices = [
        nvidia_slice("gpu.nvidia.com", gpus),
        nvidia_slice("gpu.example.com", {"gpu-0": gpus["gpu-0"]}),  # a second driver
    ]
    health = AttachedHealth("gpu.nvidia.com", [SourceSpec("dcgm", 60)])
    health.set_index(AttachIndex("gpu.nvidia.com", slices, node="gpu-node-7"))
    text = setting("DCGM_FI_DEV_XID_ERRORS", G1, "79")
    assert health.observe("dcgm", source(key=key).judge(text)) == []  # all matched
    got = {r.device: (r.health, r.message) for r in health.reports()}
    assert got == {
        "gpu-0": (H, ""),
        "gpu-1": (U, "dcgm: XID 79: GPU has fallen off the bus (reset the GPU)"),
    }
