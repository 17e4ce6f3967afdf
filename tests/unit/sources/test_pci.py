"""PciSource on a fake sysfs tree: presence, AER deltas, link degradation, driver binding."""

from __future__ import annotations

from pathlib import Path

import pytest

from drahealth.core import Health
from drahealth.driver import DeviceReport
from drahealth.sources import AerThresholds, PciDevice, PciSource, list_pci_devices
from tests.unit.sources.fake_sysfs import FakeSysfs

H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN
A = "0000:3b:00.0"


def source(tmp_path: Path, **kw: object) -> tuple[FakeSysfs, PciSource]:
    fake = FakeSysfs(str(tmp_path))
    fake.add(A)
    return fake, PciSource([PciDevice("node-1", "gpu-0", A)], root=str(tmp_path), **kw)  # type: ignore[arg-type]


def one(src: PciSource) -> DeviceReport:
    (report,) = src.poll()
    return report


def test_a_present_device_with_a_full_link_is_healthy(tmp_path: Path) -> None:
    _, src = source(tmp_path)
    assert one(src) == DeviceReport("node-1", "gpu-0", H)


def test_removal_and_return(tmp_path: Path) -> None:
    fake, src = source(tmp_path)
    one(src)
    fake.remove(A)
    assert one(src) == DeviceReport("node-1", "gpu-0", U, f"PCI device {A} is gone", False)
    fake.add(A)
    assert one(src).health is H


def test_aer_growth_over_the_threshold_per_poll(tmp_path: Path) -> None:
    fake, src = source(tmp_path, aer=AerThresholds(fatal=1, nonfatal=2, correctable=100))
    fake.aer(A, fatal=0, nonfatal=0, correctable=5000)
    assert one(src).health is H  # the first poll learns the baseline: old errors do not count
    fake.aer(A, fatal=0, nonfatal=1, correctable=5099)
    assert one(src).health is H  # below both thresholds
    fake.aer(A, fatal=0, nonfatal=3, correctable=5099)
    report = one(src)
    assert (report.health, report.fatal) == (U, False)
    assert report.message == f"AER: 2 new non-fatal error(s) on {A} (total 3)"
    fake.aer(A, fatal=0, nonfatal=3, correctable=5300)
    assert one(src).message == f"AER: 201 new correctable error(s) on {A} (total 5300)"
    assert one(src).health is H  # no growth since
    fake.aer(A, fatal=1, nonfatal=3, correctable=5300)
    report = one(src)
    assert (report.health, report.fatal) == (U, True)
    assert report.message == f"AER: 1 new fatal error(s) on {A} (total 1)"


def test_disabled_aer_class_and_missing_or_garbled_files(tmp_path: Path) -> None:
    fake, src = source(tmp_path, aer=AerThresholds(correctable=0))
    one(src)
    fake.aer(A, fatal=0, nonfatal=0, correctable=10**6)
    assert one(src).health is H
    fake.write(A, "aer_dev_fatal", "garbage without numbers")
    assert one(src).health is H
    (Path(fake.path(A)) / "aer_dev_nonfatal").unlink()
    assert one(src).health is H


@pytest.mark.parametrize(
    ("link", "message"),
    [
        (("8.0 GT/s PCIe", "16.0 GT/s PCIe", "16", "16"), "8.0 GT/s x16, capable of 16.0 GT/s x16"),
        (("16.0 GT/s PCIe", "16.0 GT/s PCIe", "8", "16"), "16.0 GT/s x8, capable of 16.0 GT/s x16"),
        (("2.5 GT/s PCIe", "32.0 GT/s PCIe", "1", "16"), "2.5 GT/s x1, capable of 32.0 GT/s x16"),
    ],
)
def test_a_degraded_link_is_reported(
    tmp_path: Path, link: tuple[str, str, str, str], message: str
) -> None:
    fake = FakeSysfs(str(tmp_path))
    fake.add(A, link=link)
    report = one(PciSource([PciDevice("node-1", "gpu-0", A)], root=str(tmp_path)))
    assert (report.health, report.fatal) == (U, False)
    assert report.message == f"PCIe link degraded: {message}"


def test_unknown_or_missing_link_values_are_not_a_fault(tmp_path: Path) -> None:
    fake = FakeSysfs(str(tmp_path))
    fake.add(A, link=("Unknown", "16.0 GT/s PCIe", "0", "16"))
    fake.add("0000:00:00.0", link=None, aer=False)
    src = PciSource(
        [PciDevice("p", "a", A), PciDevice("p", "b", "0000:00:00.0")], root=str(tmp_path)
    )
    assert [r.health for r in src.poll()] == [H, H]


def test_driver_binding_is_checked_when_required(tmp_path: Path) -> None:
    fake = FakeSysfs(str(tmp_path))
    fake.add(A, driver=None)
    devices = [PciDevice("node-1", "gpu-0", A)]
    assert one(PciSource(devices, root=str(tmp_path))).health is H
    report = one(PciSource(devices, root=str(tmp_path), require_driver=True))
    assert report.message == f"PCI device {A} has no driver bound" and report.health is U


def test_list_and_bad_addresses(tmp_path: Path) -> None:
    fake = FakeSysfs(str(tmp_path))
    fake.add(A)
    fake.add("0000:00:02.0", driver=None, klass="0x060400")
    (Path(fake.base) / "not-an-address").mkdir()
    found = list_pci_devices(str(tmp_path))
    assert [(d.address, d.driver, d.klass) for d in found] == [
        ("0000:00:02.0", "", "0x060400"),
        (A, "nvidia", "0x030200"),
    ]
    assert list_pci_devices(str(tmp_path / "nothing")) == []
    with pytest.raises(ValueError, match=r"'3b:00.0' is not a PCI address"):
        PciSource([PciDevice("p", "d", "3b:00.0")])
