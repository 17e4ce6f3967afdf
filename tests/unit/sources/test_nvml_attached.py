"""NvmlAttachedSource against the fake NVML of the NVML source's tests: GPUs found and keyed
by UUID or PCI bus ID, fatal faults latched for clear_after, and a node without NVML."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pynvml  # type: ignore[import-untyped]
import pytest

import drahealth.sources._nvml_attached as attached_module
from drahealth.core import Health, Signal, normalize_key
from drahealth.sources import NvmlAttachedSource, NvmlThresholds, NvmlUnavailable
from tests.unit.sources.fake_nvml import FakeGpu, FakeNvml, error

H, U = Health.HEALTHY, Health.UNHEALTHY
G0, G1 = "GPU-0000-aaaa", "GPU-1111-bbbb"
BUS = {G0: "00000000:3B:00.0", G1: "00000000:86:00.0"}


class EnumeratingNvml(FakeNvml):
    """The fake plus what discovery asks: count, handles by index, UUIDs, PCI info."""

    def __init__(self, *gpus: FakeGpu, init_error: int | None = None) -> None:
        super().__init__(*gpus, init_error=init_error)
        self.shutdowns = 0

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return list(self.gpus.values())[index]

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> bytes:
        return gpu.uuid.encode()  # older pynvml releases answer bytes

    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(busId=BUS[gpu.uuid])

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(**kw: object) -> tuple[EnumeratingNvml, NvmlAttachedSource, Clock]:
    fake = EnumeratingNvml(FakeGpu(G0), FakeGpu(G1))
    clock = Clock()
    return fake, NvmlAttachedSource(nvml=fake, clock=clock, **kw), clock  # type: ignore[arg-type]


def by_value(signals: list[Signal]) -> dict[str, Signal]:
    return {s.value: s for s in signals}


def test_every_gpu_keyed_by_uuid() -> None:
    _, src, _ = make()
    assert src.poll() == [Signal("uuid", G0, H, ""), Signal("uuid", G1, H, "")]
    assert src.gpus == {G0: G0, G1: G1} and src.unavailable == ""


def test_keyed_by_pci_bus_id() -> None:
    _, src, _ = make(key="pci")
    signals = src.poll()
    assert {s.by for s in signals} == {"resource.kubernetes.io/pciBusID"}
    assert [normalize_key(s.by, s.value) for s in signals] == ["0000:3b:00.0", "0000:86:00.0"]
    _, custom, _ = make(by="gpu.example.com/uuid")
    assert {s.by for s in custom.poll()} == {"gpu.example.com/uuid"}


def test_a_fatal_xid_is_latched_until_clear_after() -> None:
    fake, src, clock = make()
    fake.xid(G0, 79)
    first = by_value(src.poll())
    assert first[G0] == Signal("uuid", G0, U, "XID 79: GPU has fallen off the bus (reset the GPU)")
    assert first[G1].health is H
    clock.now += 599  # NVML has no more events, the GPU answers: still the XID
    assert by_value(src.poll())[G0] == first[G0]
    clock.now += 1
    assert by_value(src.poll())[G0] == Signal("uuid", G0, H, "")


def test_a_new_fault_while_latched_joins_the_message_and_a_new_fatal_renews_it() -> None:
    fake, src, clock = make()
    fake.xid(G0, 48)
    src.poll()
    clock.now += 300
    fake.gpus[G0].temperature = 95
    got = by_value(src.poll())[G0]
    assert got.health is U
    assert got.message == "XID 48: double-bit ECC error (reset the GPU); temperature 95 C >= 90 C"
    fake.gpus[G0].temperature = 40
    fake.xid(G0, 79)
    src.poll()
    clock.now += 500  # 800 s after the first XID, 500 s after the second
    assert by_value(src.poll())[G0].message.startswith("XID 79")


def test_clear_after_zero_says_only_what_each_poll_sees_and_none_never_clears() -> None:
    fake, src, clock = make(clear_after=0)
    fake.xid(G0, 79)
    assert by_value(src.poll())[G0].health is U
    assert by_value(src.poll())[G0].health is H
    fake, src, clock = make(clear_after=None)
    fake.xid(G0, 79)
    src.poll()
    clock.now += 10**9
    assert by_value(src.poll())[G0].health is U


def test_application_xids_are_not_latched_and_temperature_is_not_fatal() -> None:
    fake, src, _ = make(thresholds=NvmlThresholds(temperature_c=80))
    fake.xid(G1, 13)
    fake.gpus[G0].temperature = 85
    got = by_value(src.poll())
    assert got[G1].health is H and got[G1].message.endswith("(informational)")
    assert (got[G0].health, got[G0].message) == (U, "temperature 85 C >= 80 C")
    fake.gpus[G0].temperature = 40
    assert by_value(src.poll()) == {G0: Signal("uuid", G0, H, ""), G1: Signal("uuid", G1, H, "")}


def test_a_lost_gpu_is_unhealthy() -> None:
    fake, src, _ = make()
    src.poll()
    fake.gpus[G1].lost = True
    got = by_value(src.poll())[G1]
    assert got.health is U and got.message.startswith("GPU is lost")


def test_without_the_library_it_says_so_once_and_has_no_opinion(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = []

    def missing() -> object:
        calls.append(1)
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(attached_module, "_pynvml", missing)
    src = NvmlAttachedSource()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            with pytest.raises(NvmlUnavailable, match=r"install drahealth\[nvml\]"):
                src.poll()
    assert "No module named 'pynvml'" in src.unavailable
    assert len([r for r in caplog.records if "NVML not available" in r.getMessage()]) == 1
    assert calls == [1]  # a missing library is final: not looked for again


def test_a_failing_init_is_retried_and_undone(caplog: pytest.LogCaptureFixture) -> None:
    fake = EnumeratingNvml(FakeGpu(G0), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    src = NvmlAttachedSource(nvml=fake)
    with caplog.at_level(logging.WARNING), pytest.raises(NvmlUnavailable, match="NVML"):
        src.poll()
    with pytest.raises(NvmlUnavailable):
        src.poll()
    assert fake.inits == 2  # tried at every poll
    fake.init_error = None  # the driver finished loading
    assert src.poll() == [Signal("uuid", G0, H, "")]
    assert src.unavailable == ""


def test_no_gpu_is_unavailable_and_releases_nvml() -> None:
    fake = EnumeratingNvml()
    src = NvmlAttachedSource(nvml=fake)
    with pytest.raises(NvmlUnavailable, match="NVML sees no GPU"):
        src.poll()
    assert fake.shutdowns == 1  # the init of a failed attempt is undone


def test_discovery_errors_are_unavailable() -> None:
    class Broken(EnumeratingNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise error(pynvml.NVML_ERROR_UNKNOWN)

    src = NvmlAttachedSource(nvml=Broken(FakeGpu(G0)))
    with pytest.raises(NvmlUnavailable, match="NVML not available"):
        src.poll()


@pytest.mark.parametrize(
    ("kwargs", "error_text"),
    [
        ({"key": "serial"}, "key must be one of uuid, pci"),
        ({"interval": 0}, "interval must be > 0"),
        ({"timeout": -1}, "timeout must be > 0"),
        ({"clear_after": -5}, "clear_after must be >= 0"),
        ({"clear_after": "10m"}, "clear_after must be >= 0"),
        ({"interval": float("inf")}, "interval must be > 0"),
    ],
)
def test_bad_configuration_is_refused(kwargs: dict[str, object], error_text: str) -> None:
    with pytest.raises(ValueError, match=error_text):
        NvmlAttachedSource(**kwargs)  # type: ignore[arg-type]
