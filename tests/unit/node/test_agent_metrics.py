"""AgentMetrics: forgotten devices leave the label set; rejections and store failures
are exported."""

from __future__ import annotations

from prometheus_client import generate_latest

from drahealth.core import DeviceKey, Health
from drahealth.core._records import ChangeReason, HealthChange
from drahealth.node._metrics import AgentMetrics

K = DeviceKey("gpu.example.com", "pool", "gpu-0")


def test_dropped_device_loses_its_series_and_readings_are_exported() -> None:
    metrics = AgentMetrics("n1")
    metrics.watch(
        dict,
        lambda: 0,
        rejections=lambda: {("gpu.example.com", "invalid"): 3},
        stream_errors=lambda: {"gpu.example.com": 2},
        persist_failing=lambda: True,
    )
    metrics.on_changes([HealthChange(K, Health.UNKNOWN, Health.UNHEALTHY, "", ChangeReason.REPORT)])
    assert 'device="gpu-0"' in generate_latest(metrics.registry).decode()
    metrics.on_changes(
        [HealthChange(K, Health.UNHEALTHY, Health.UNKNOWN, "", ChangeReason.DROPPED)] * 2
    )
    text = generate_latest(metrics.registry).decode()
    assert "drahealth_node_device_health{" not in text
    assert (
        'drahealth_node_rejected_reports_total{driver="gpu.example.com",node="n1",'
        'reason="invalid"} 3.0' in text
    )
    assert 'drahealth_node_stream_errors_total{driver="gpu.example.com",node="n1"} 2.0' in text
    assert 'drahealth_node_health_store_failing{node="n1"} 1.0' in text
