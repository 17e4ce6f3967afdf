"""NvmlSource against a scriptable fake NVML raising genuine pynvml errors."""

from __future__ import annotations

import pynvml
import pytest

from drahealth.core import Health
from drahealth.driver import DeviceReport, HealthHub, RecoveryPolicy
from drahealth.sources import GpuDevice, NvmlSource, NvmlThresholds
from tests.unit.sources.fake_nvml import FakeGpu, FakeNvml

H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN
G0, G1 = "GPU-0000-aaaa", "GPU-1111-bbbb"
DEVICES = [
    GpuDevice("node-1", "gpu-0", G0),
    GpuDevice("node-1", "gpu-1", G1),
    GpuDevice("node-1", "gpu-0-mig-1g", "MIG-0001", parent=G0),
]


def make(**kw: object) -> tuple[FakeNvml, NvmlSource]:
    fake = FakeNvml(FakeGpu(G0), FakeGpu(G1))
    return fake, NvmlSource(DEVICES, nvml=fake, **kw)  # type: ignore[arg-type]


def by_device(src: NvmlSource) -> dict[str, DeviceReport]:
    return {r.device: r for r in src.poll()}


def test_healthy_gpus_and_their_mig_devices() -> None:
    _, src = make()
    assert [(r.device, r.health, r.message) for r in src.poll()] == [
        ("gpu-0", H, ""),
        ("gpu-1", H, ""),
        ("gpu-0-mig-1g", H, ""),
    ]


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_informational(xid: int) -> None:
    fake, src = make()
    fake.xid(G0, xid)
    gpu0 = by_device(src)["gpu-0"]
    assert gpu0.health is H and gpu0.message.startswith(f"XID {xid}: ")
    assert gpu0.message.endswith("(informational)")
    assert by_device(src)["gpu-0"].message == ""  # shown once


@pytest.mark.parametrize(
    ("xid", "text"),
    [
        (79, "XID 79: GPU has fallen off the bus (reset the GPU)"),
        (48, "XID 48: double-bit ECC error (reset the GPU)"),
        (74, "XID 74: NVLink error (reset the GPU)"),
        (94, "XID 94: contained ECC error (reset the GPU)"),
        (95, "XID 95: uncontained ECC error (reset the GPU)"),
        (119, "XID 119: GSP RPC timeout (reset the GPU)"),
        (999, "XID 999: critical error (reset the GPU)"),
    ],
)
def test_other_xids_are_fatal_with_an_actionable_message(xid: int, text: str) -> None:
    fake, src = make()
    fake.xid(G1, xid)
    gpu1 = by_device(src)["gpu-1"]
    assert (gpu1.health, gpu1.fatal, gpu1.message) == (U, True, text)


@pytest.mark.parametrize(
    ("action", "health", "suffix"),
    [
        (pynvml.NVML_GPU_RECOVERY_ACTION_NONE, H, "(informational)"),
        (pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET, U, "(reset the GPU)"),
        (pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT, U, "(reboot the node)"),
        (pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET, U, "(drain and reset)"),
    ],
)
def test_the_drivers_recovery_action_decides_over_the_table(
    action: int, health: Health, suffix: str
) -> None:
    fake, src = make()
    fake.gpus[G0].recovery_action = action
    fake.xid(G0, 13)  # an application XID in the table, but the driver says otherwise
    gpu0 = by_device(src)["gpu-0"]
    assert gpu0.health is health and gpu0.message.endswith(suffix)


def test_override_lists() -> None:
    fake, src = make(informational_xids=[79], fatal_xids=[13])
    fake.xid(G0, 79)
    fake.xid(G1, 13)
    reports = by_device(src)
    assert reports["gpu-0"].health is H and reports["gpu-1"].health is U


def test_double_bit_ecc_event_and_mig_inheritance() -> None:
    fake, src = make()
    fake.dbe(G0)
    reports = by_device(src)
    assert reports["gpu-0"] == DeviceReport(
        "node-1", "gpu-0", U, "double-bit ECC error (reset the GPU)", True
    )
    mig = reports["gpu-0-mig-1g"]
    assert (mig.health, mig.fatal) == (U, True)
    assert mig.message == f"parent GPU {G0}: double-bit ECC error (reset the GPU)"
    assert reports["gpu-1"].health is H


def test_a_lost_gpu_is_fatal() -> None:
    fake, src = make()
    fake.gpus[G1].lost = True
    gpu1 = by_device(src)["gpu-1"]
    assert (gpu1.health, gpu1.fatal) == (U, True) and gpu1.message.startswith("GPU is lost")


@pytest.mark.parametrize(
    ("change", "message", "fatal"),
    [
        ({"pages_pending": True}, "retired memory pages pending (reset the GPU)", True),
        ({"rows": (0, 0, 1, 0)}, "row remapping pending (reset the GPU)", True),
        ({"rows": (0, 0, 0, 1)}, "row remapping failed (replace the GPU)", True),
        ({"temperature": 93}, "temperature 93 C >= 90 C", False),
        ({"power_mw": 450_000}, "power 450 W over the 400 W limit", False),
    ],
)
def test_polled_thresholds(change: dict[str, object], message: str, fatal: bool) -> None:
    fake, src = make()
    for k, v in change.items():
        setattr(fake.gpus[G0], k, v)
    gpu0 = by_device(src)["gpu-0"]
    assert (gpu0.health, gpu0.message, gpu0.fatal) == (U, message, fatal)


def test_custom_thresholds_and_unsupported_queries() -> None:
    fake, src = make(thresholds=NvmlThresholds(temperature_c=50))
    fake.gpus[G0].temperature = 55
    fake.gpus[G1].rows = None  # not supported: skipped, not a fault
    fake.gpus[G1].links = None
    reports = by_device(src)
    assert reports["gpu-0"].message == "temperature 55 C >= 50 C"
    assert reports["gpu-1"].health is H


def test_an_nvlink_that_was_up_and_went_down() -> None:
    fake, src = make()
    assert by_device(src)["gpu-0"].health is H
    fake.gpus[G0].links = [1, 0, 1, 0]
    gpu0 = by_device(src)["gpu-0"]
    assert (gpu0.health, gpu0.message, gpu0.fatal) == (U, "NVLink 1, 3 down", False)


def test_without_nvml_every_device_is_unknown_and_init_is_retried() -> None:
    fake = FakeNvml(FakeGpu(G0), FakeGpu(G1), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    src = NvmlSource(DEVICES, nvml=fake)
    reports = src.poll()
    assert {r.health for r in reports} == {X}
    assert reports[0].message.startswith("NVML not available: ")
    fake.init_error = None
    assert {r.health for r in src.poll()} == {H} and fake.inits == 2


def test_unknown_uuid_and_no_event_support() -> None:
    fake = FakeNvml(FakeGpu(G0, events=False))
    assert by_device(NvmlSource(DEVICES[:1], nvml=fake))["gpu-0"].health is H
    missing = NvmlSource([GpuDevice("node-1", "gpu-9", "GPU-missing")], nvml=fake).poll()
    assert missing[0].health is X and "NVML not available" in missing[0].message


def test_the_hub_latches_a_fatal_xid_after_the_event_is_gone() -> None:
    fake, src = make()
    hub = HealthHub(
        [(d.pool, d.device) for d in DEVICES], recovery=RecoveryPolicy(consecutive_healthy=3)
    )
    hub.submit(src.name, src.poll())
    fake.xid(G0, 79)
    hub.submit(src.name, src.poll())
    for _ in range(2):  # the event is gone and the GPU polls clean: still latched
        hub.submit(src.name, src.poll())
        assert hub.state("node-1", "gpu-0").health is U
        assert hub.state("node-1", "gpu-0-mig-1g").health is U
    hub.submit(src.name, src.poll())
    assert hub.state("node-1", "gpu-0").health is H


def test_real_pynvml_without_a_gpu_reports_unknown() -> None:
    src = NvmlSource(DEVICES[:1])  # the real library; CI machines have no NVIDIA driver
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present: covered by the GPU test")
    except pynvml.NVMLError:
        pass
    (report,) = src.poll()
    assert report.health is X and report.message.startswith("NVML not available")
