"""Prometheus metrics of a driver process, and the ``/metrics`` HTTP endpoint.

Owns the driver-level metric families (on a private ``CollectorRegistry``, never the
global one, so two drivers in one process do not collide), the wrapper that times a
:class:`Driver`'s ``prepare``/``unprepare``, the hub subscription that keeps the
per-device health gauge current, the collector that reads a publisher's counters,
and re-exports the shared ``/metrics`` server.

Families (label ``driver`` on all of them):

==============================================  =========  ===============================
name                                            type       labels / meaning
==============================================  =========  ===============================
``drahealth_driver_claim_operations_total``     counter    ``operation``, ``outcome`` (from
                                                           the toolkit's claim preparer)
``drahealth_driver_prepare_seconds``            histogram  one driver ``prepare`` call
``drahealth_driver_unprepare_seconds``          histogram  one driver ``unprepare`` call
``drahealth_driver_device_health``              gauge      ``pool``, ``device``, ``state``
                                                           (1 for the current state, else 0)
``drahealth_driver_health_streams``             gauge      open dra-health streams
``drahealth_driver_slice_publish_errors_total`` counter    ResourceSlice publish failures
``drahealth_driver_resource_slices``            gauge      slices currently published
``drahealth_driver_slice_taints``               gauge      ``state``: ``kept``, ``dropped``
                                                           (the server's ``DRADeviceTaints``
                                                           is off) or ``unknown``; 1 for
                                                           the current state, else 0
``drahealth_driver_withdrawn_devices``          gauge      devices left out of the slices
==============================================  =========  ===============================

May not touch: gRPC servers, the API server, the hub's state (read-only here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from drahealth._metrics_http import MetricsServer
from drahealth.core import Health
from drahealth.driver._hub import DeviceState, HealthHub
from drahealth.driver._publisher import ResourceSlicePublisher
from drahealth.driver._types import ClaimRef, Driver, PreparedClaimRequest, PrepareResult

__all__ = ["DriverMetrics", "MetricsServer", "TimedDriver"]


class TimedDriver:
    """A :class:`Driver` that times every call of the driver it wraps."""

    def __init__(self, driver: Driver, prepare: Histogram, unprepare: Histogram) -> None:
        self.driver = driver
        self._prepare = prepare
        self._unprepare = unprepare

    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        start = time.perf_counter()
        try:
            return await self.driver.prepare(claims)
        finally:
            self._prepare.observe(time.perf_counter() - start)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        start = time.perf_counter()
        try:
            return await self.driver.unprepare(claims)
        finally:
            self._unprepare.observe(time.perf_counter() - start)


class _PublisherCollector(Collector):
    """Reads a publisher's plain counters at scrape time."""

    def __init__(self, driver_name: str) -> None:
        self.driver_name = driver_name
        self.publisher: ResourceSlicePublisher | None = None

    def collect(self) -> Iterable[Metric]:
        pub = self.publisher
        errors = CounterMetricFamily(
            "drahealth_driver_slice_publish_errors",
            "ResourceSlice publish failures (validation, API errors, dropped fields).",
            labels=["driver"],
        )
        errors.add_metric([self.driver_name], pub.publish_errors_total if pub else 0)
        slices = GaugeMetricFamily(
            "drahealth_driver_resource_slices",
            "ResourceSlices of this driver on this node, as last seen.",
            labels=["driver"],
        )
        slices.add_metric([self.driver_name], pub.slices if pub else 0)
        taints = GaugeMetricFamily(
            "drahealth_driver_slice_taints",
            "Whether the API server keeps ResourceSlice device taints (1 for the current "
            "state): dropped means its DRADeviceTaints gate is off.",
            labels=["driver", "state"],
        )
        kept = pub.taints_kept if pub else None
        current = "unknown" if kept is None else "kept" if kept else "dropped"
        for state in ("kept", "dropped", "unknown"):
            taints.add_metric([self.driver_name, state], 1 if state == current else 0)
        withdrawn = GaugeMetricFamily(
            "drahealth_driver_withdrawn_devices",
            "Unhealthy devices left out of the ResourceSlices until they recover.",
            labels=["driver"],
        )
        withdrawn.add_metric([self.driver_name], len(pub.withdrawn) if pub else 0)
        return [errors, slices, taints, withdrawn]


class DriverMetrics:
    """The metric families of one driver (see the module docstring).

    Pass ``registry`` to ``PluginOptions.metrics_registry`` too, so the toolkit's
    per-claim counter lands next to these.
    """

    def __init__(self, driver_name: str, registry: CollectorRegistry | None = None) -> None:
        self.driver_name = driver_name
        self.registry = registry if registry is not None else CollectorRegistry()
        self.prepare_seconds = Histogram(
            "drahealth_driver_prepare_seconds",
            "Seconds one driver prepare call took (a batch of claims not yet prepared).",
            ["driver"],
            registry=self.registry,
        )
        self.unprepare_seconds = Histogram(
            "drahealth_driver_unprepare_seconds",
            "Seconds one driver unprepare call took (a batch of claims).",
            ["driver"],
            registry=self.registry,
        )
        self.device_health = Gauge(
            "drahealth_driver_device_health",
            "Aggregated device health: 1 for the device's current state, 0 for the others.",
            ["driver", "pool", "device", "state"],
            registry=self.registry,
        )
        self.health_streams = Gauge(
            "drahealth_driver_health_streams",
            "Open dra-health NodeWatchResources streams (v1 and v1alpha1).",
            ["driver"],
            registry=self.registry,
        )
        self._publisher = _PublisherCollector(driver_name)
        self.registry.register(self._publisher)
        self._devices: set[tuple[str, str]] = set()

    def instrument(self, driver: Driver) -> TimedDriver:
        """Wrap ``driver`` so its calls are timed."""
        return TimedDriver(
            driver,
            self.prepare_seconds.labels(self.driver_name),
            self.unprepare_seconds.labels(self.driver_name),
        )

    def watch_hub(self, hub: HealthHub) -> Callable[[], None]:
        """Follow ``hub``: health gauge per device and the open-stream gauge.
        Returns a function that stops following."""
        self.health_streams.labels(self.driver_name).set_function(lambda: hub.stream_count)
        self._resync(hub.snapshot())

        def on_change(changed: list[DeviceState]) -> None:
            if changed:
                for state in changed:
                    self._set(state)
            else:  # devices were removed
                self._resync(hub.snapshot())

        return hub.subscribe(on_change)

    def watch_publisher(self, publisher: ResourceSlicePublisher) -> None:
        """Expose ``publisher``'s error and slice counters."""
        self._publisher.publisher = publisher

    def _set(self, state: DeviceState) -> None:
        self._devices.add((state.pool, state.device))
        for health in Health:
            self.device_health.labels(self.driver_name, state.pool, state.device, health.value).set(
                1 if state.health is health else 0
            )

    def _resync(self, states: list[DeviceState]) -> None:
        present = {(s.pool, s.device) for s in states}
        for pool, device in self._devices - present:
            for health in Health:
                self.device_health.remove(self.driver_name, pool, device, health.value)
        self._devices &= present
        for state in states:
            self._set(state)
