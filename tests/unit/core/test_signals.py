"""One spelling per key kind: PCI addresses from kmsg, NVML and ResourceSlices agree."""

from __future__ import annotations

import pytest

from drahealth.core import normalize_key, normalize_pci_address


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML: 8 domain digits, upper case
        ("PCI:0000:3b:00", "0000:3b:00.0"),  # the kernel log's NVRM lines: no function
        ("3b:00.1", "0000:3b:00.1"),
        ("  0001:af:1f.7 ", "0001:af:1f.7"),
        ("not-pci", None),
        ("100000000:3b:00.0", None),
        ("0000:3b:00.8", None),
        ("", None),
    ],
)
def test_pci_addresses(text: str, want: str | None) -> None:
    assert normalize_pci_address(text) == want


def test_keys_by_attribute_kind() -> None:
    assert normalize_key("gpu.nvidia.com/pcieBusID", "PCI:0000:3B:00") == "0000:3b:00.0"
    assert normalize_key("pciBusID", "garbage") == "garbage"  # kept, never matches a real one
    assert normalize_key("uuid", " GPU-8f3c ") == "gpu-8f3c"
    assert normalize_key("index", 3) == "3" and normalize_key("healthy", True) == "true"
    assert len(normalize_key("uuid", "x" * 10_000)) == 256
