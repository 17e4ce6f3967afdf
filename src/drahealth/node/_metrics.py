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
``drahealth_node_rejected_reports_total``           counter    ``driver``, ``reason``:
                                                               health report entries
                                                               refused (``invalid``,
                                                               ``driver_full``,
                                                               ``node_full``)
``drahealth_node_stream_errors_total``              counter    ``driver``: undecodable
                                                               messages and unexpected
                                                               errors of the stream
``drahealth_node_health_store_failing``             gauge      1 while writes to the
                                                               health log fail
==================================================  =========  ==========================

A device the cache forgets (reason ``dropped``) loses its ``device_health`` series, so
the label set follows the devices drivers currently report.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from drahealth.core import ChangeReason, Health, HealthChange

__all__ = ["AgentMetrics"]

_VALUE = {Health.HEALTHY: 1.0, Health.UNKNOWN: 0.0, Health.UNHEALTHY: -1.0}


class _Readings(Collector):
    def __init__(
        self,
        node: str,
        reconnects: Callable[[], dict[str, int]],
        claims: Callable[[], int],
        rejections: Callable[[], dict[tuple[str, str], int]],
        stream_errors: Callable[[], dict[str, int]],
        persist_failing: Callable[[], bool],
    ) -> None:
        self._node = node
        self._reconnects = reconnects
        self._claims = claims
        self._rejections = rejections
        self._stream_errors = stream_errors
        self._persist_failing = persist_failing

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
        rejected = CounterMetricFamily(
            "drahealth_node_rejected_reports",
            "Health report entries refused (bad names or fields, over a device bound).",
            labels=["node", "driver", "reason"],
        )
        for (driver, reason), count in sorted(self._rejections().items()):
            rejected.add_metric([self._node, driver, reason], count)
        yield rejected
        errors = CounterMetricFamily(
            "drahealth_node_stream_errors",
            "Health stream messages that could not be decoded and unexpected stream errors.",
            labels=["node", "driver"],
        )
        for driver, count in sorted(self._stream_errors().items()):
            errors.add_metric([self._node, driver], count)
        yield errors
        failing = GaugeMetricFamily(
            "drahealth_node_health_store_failing",
            "1 while writes to the health log fail (the agent runs from memory).",
            labels=["node"],
        )
        failing.add_metric([self._node], 1.0 if self._persist_failing() else 0.0)
        yield failing


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

    def watch(
        self,
        reconnects: Callable[[], dict[str, int]],
        claims: Callable[[], int],
        *,
        rejections: Callable[[], dict[tuple[str, str], int]] = dict,
        stream_errors: Callable[[], dict[str, int]] = dict,
        persist_failing: Callable[[], bool] = lambda: False,
    ) -> None:
        self.registry.register(
            _Readings(self.node, reconnects, claims, rejections, stream_errors, persist_failing)
        )

    def on_changes(self, changes: list[HealthChange]) -> None:
        for c in changes:
            k = c.key
            if c.reason is ChangeReason.DROPPED:
                with contextlib.suppress(KeyError):
                    self.device_health.remove(self.node, k.driver, k.pool, k.device)
            else:
                self.device_health.labels(self.node, k.driver, k.pool, k.device).set(_VALUE[c.new])
            if c.old is not c.new:
                self.transitions.labels(self.node, k.driver, c.old.value, c.new.value).inc()

    def observe_latency(self, seconds: float) -> None:
        self.notification_latency.labels(self.node).observe(seconds)
