"""Prometheus metrics of the node agent.

Owns the agent's metric families on a private ``CollectorRegistry`` (label ``node``
on all of them) and the listener that keeps them current from health changes.

==================================================  =========  ==========================
name                                                type       labels / meaning
==================================================  =========  ==========================
``drahealth_node_device_health``                    gauge      ``driver``, ``pool``,
                                                               ``device``: 1 Healthy,
                                                               0 Unknown, -1 Unhealthy
``drahealth_node_health_transitions_total``         counter    ``driver``, ``from``, ``to``
``drahealth_node_stream_reconnects_total``          counter    ``driver`` (read from the
                                                               registry's streams)
``drahealth_node_notification_latency_seconds``     histogram  health change -> pod
                                                               status written
``drahealth_node_prepared_claims``                  gauge      claims prepared (live)
==================================================  =========  ==========================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from drahealth.core import Health
from drahealth.core._records import HealthChange

__all__ = ["AgentMetrics"]

_VALUE = {Health.HEALTHY: 1.0, Health.UNKNOWN: 0.0, Health.UNHEALTHY: -1.0}


class _Readings(Collector):
    def __init__(
        self,
        node: str,
        reconnects: Callable[[], dict[str, int]],
        claims: Callable[[], int],
    ) -> None:
        self._node = node
        self._reconnects = reconnects
        self._claims = claims

    def collect(self) -> Iterable[Metric]:
        rc = CounterMetricFamily(
            "drahealth_node_stream_reconnects",
            "Health stream reconnects (errors, EOF, watchdog) per driver.",
            labels=["node", "driver"],
        )
        for driver, count in sorted(self._reconnects().items()):
            rc.add_metric([self._node, driver], count)
        yield rc
        claims = GaugeMetricFamily(
            "drahealth_node_prepared_claims", "Claims prepared on this node.", labels=["node"]
        )
        claims.add_metric([self._node], self._claims())
        yield claims


class AgentMetrics:
    """The agent's metric families; call :meth:`on_changes` for every change list."""

    def __init__(self, node: str, registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.registry = registry or CollectorRegistry()
        self.device_health = Gauge(
            "drahealth_node_device_health",
            "Cached device health: 1 Healthy, 0 Unknown, -1 Unhealthy.",
            ["node", "driver", "pool", "device"],
            registry=self.registry,
        )
        self.transitions = Counter(
            "drahealth_node_health_transitions",
            "Device health transitions seen by the agent.",
            ["node", "driver", "from", "to"],
            registry=self.registry,
        )
        self.notification_latency = Histogram(
            "drahealth_node_notification_latency_seconds",
            "From a health change to the pod status carrying it.",
            ["node"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )

    def watch(self, reconnects: Callable[[], dict[str, int]], claims: Callable[[], int]) -> None:
        self.registry.register(_Readings(self.node, reconnects, claims))

    def on_changes(self, changes: list[HealthChange]) -> None:
        for c in changes:
            k = c.key
            self.device_health.labels(self.node, k.driver, k.pool, k.device).set(_VALUE[c.new])
            if c.old is not c.new:
                self.transitions.labels(self.node, k.driver, c.old.value, c.new.value).inc()

    def observe_latency(self, seconds: float) -> None:
        self.notification_latency.labels(self.node).observe(seconds)
