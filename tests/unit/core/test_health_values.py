"""Health values, device keys and UTF-8-safe message truncation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drahealth.core import DeviceKey, Health, truncate_message


def test_worst_of_ordering() -> None:
    assert Health.worst(Health.HEALTHY, Health.UNKNOWN) is Health.UNKNOWN
    assert Health.worst(Health.UNHEALTHY, Health.UNKNOWN, Health.HEALTHY) is Health.UNHEALTHY
    assert Health.worst() is Health.HEALTHY


def test_wire_mapping() -> None:
    assert [Health.from_wire(n) for n in (0, 1, 2, 3, -1)] == [
        Health.UNKNOWN,
        Health.HEALTHY,
        Health.UNHEALTHY,
        Health.UNKNOWN,
        Health.UNKNOWN,
    ]
    assert [h.to_wire() for h in Health] == [1, 2, 0]


def test_device_key_parse() -> None:
    assert DeviceKey.parse("gpu.example.com/node-1/gpu-0") == DeviceKey(
        "gpu.example.com", "node-1", "gpu-0"
    )
    assert DeviceKey.parse("d/a/b/c").pool == "a/b"
    assert str(DeviceKey("d", "p", "x")) == "d/p/x"
    for bad in ("", "d", "d/p", "/p/x", "d//x", "d/p/"):
        with pytest.raises(ValueError, match="DRIVER/POOL/DEVICE"):
            DeviceKey.parse(bad)


@pytest.mark.parametrize(
    ("size", "cut"),
    [(0, False), (10, False), (1024, False), (1025, True), (2048, True)],
)
def test_truncation_boundaries(size: int, cut: bool) -> None:
    msg = "x" * size
    out = truncate_message(msg)
    assert (out != msg) is cut
    if cut:
        assert out == "x" * 1021 + "..."


def test_truncation_of_multibyte_never_splits_a_character() -> None:
    msg = "é" * 1000  # 2,000 bytes
    out = truncate_message(msg)
    assert out.endswith("...")
    assert len(out.encode()) <= 1024
    assert out == "é" * 510 + "..."


@given(st.text(max_size=1500))
def test_truncation_property(msg: str) -> None:
    out = truncate_message(msg)
    data = out.encode("utf-8")
    assert len(data) <= 1024
    if len(msg.encode()) <= 1024:
        assert out == msg
    else:
        assert out.endswith("...") and msg.startswith(out[:-3])
