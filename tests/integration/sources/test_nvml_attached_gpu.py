"""NvmlAttachedSource on a real NVIDIA GPU: every GPU answered Healthy under its real UUID
and PCI bus ID. Skipped cleanly where pynvml is missing or no NVIDIA driver answers."""

from __future__ import annotations

import pytest

pytest.importorskip("pynvml")

from drahealth.core import Health, normalize_pci_address
from drahealth.sources import NvmlAttachedSource, NvmlUnavailable

pytestmark = pytest.mark.gpu


def _poll(key: str) -> list[object]:
    src = NvmlAttachedSource(key=key)
    try:
        return list(src.poll())
    except NvmlUnavailable as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")


def test_real_gpus_by_uuid_and_by_pci_bus_id() -> None:
    by_uuid = _poll("uuid")
    by_pci = _poll("pci")
    print(by_uuid, by_pci)
    assert by_uuid and len(by_uuid) == len(by_pci)
    assert all(s.value.startswith("GPU-") for s in by_uuid)  # type: ignore[attr-defined]
    assert all(normalize_pci_address(s.value) for s in by_pci)  # type: ignore[attr-defined]
    assert {s.health for s in by_uuid + by_pci} == {Health.HEALTHY}  # type: ignore[attr-defined]
