"""NvmlSource on a real NVIDIA GPU: every GPU reported Healthy under its real UUID.

Skipped cleanly where no NVIDIA driver answers (CI never has one).
"""

from __future__ import annotations

import pytest

pynvml = pytest.importorskip("pynvml")

from drahealth.core import Health  # noqa: E402
from drahealth.sources import NvmlSource, discover_gpus  # noqa: E402

pytestmark = pytest.mark.gpu


def _gpus() -> list[object]:
    try:
        return list(discover_gpus("node-1"))
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")


def test_real_gpus_are_reported_healthy_with_their_uuids() -> None:
    gpus = _gpus()
    if not gpus:
        pytest.skip("NVML sees no GPU")
    src = NvmlSource(gpus)  # type: ignore[arg-type]
    reports = src.poll()
    print([(g.device, g.uuid) for g in gpus])  # type: ignore[attr-defined]
    assert [r.device for r in reports] == [g.device for g in gpus]  # type: ignore[attr-defined]
    assert all(g.uuid.startswith("GPU-") for g in gpus)  # type: ignore[attr-defined]
    assert {r.health for r in reports} == {Health.HEALTHY}, reports
