"""Attached health sources in the node agent: health of devices another driver publishes.

Owns :class:`AttachedSources`, what ``drahealth agent --attach FILE`` runs: for each
driver of the file (:mod:`drahealth.node._attach_config`) a :class:`DriverAttachment`

* watches that driver's ResourceSlices for this node (a reflector with field selectors
  ``spec.nodeName`` and ``spec.driver``) and rebuilds the attribute index
  (:class:`~drahealth.core.AttachIndex`) when they change;
* polls each of its sources in a thread of its own (:class:`SourcePoller`: ``poll`` may
  block, at most one poll per source at a time), a poll starting ``interval`` seconds
  after the previous one started (a source that waits for news in ``poll`` is polled
  again at once); the thread hands an answer to the event loop only when it differs
  from the previous one, or to refresh the leases (at least every second), so a source
  polled fifty times a second at rest wakes the loop about once a second;
* maps the signals to devices and keeps each source's leases
  (:class:`~drahealth.core.AttachedHealth`), and hands the result to the agent's health
  pipeline as if the driver had streamed it (``HealthPipeline.report``: durable store,
  device-health record for the controller, metrics, the mode's Events and post-mortem
  records, views), whenever a device's health changes, when a lease ends, and as a
  heartbeat every third of the reported lease.

and one :class:`~drahealth.node._attached_pods.PodDeviceHealth` tells the pods that use
these devices (an Event per transition, the pod condition ``drahealth.io/DeviceHealthy``).

Sources start once the slices are listed (before that every key would match nothing).
A source that probes devices one by one (PCI sysfs, exec and file probes) has a
``watch_keys`` method: it is given the values the devices publish for the attribute its
signals are matched on, before its first poll and whenever the slices change.
A poll that raises is logged when its error changes and counted; the source's leases
run down meanwhile. Problems of the index (a device published twice, too many
devices) and of the signals (a key no device has, a key several share) are logged once
each. A driver that also streams its own health writes the same devices: the agent
warns once (attach only to drivers that stream none, such as NVIDIA's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from lightkube import AsyncClient
from lightkube.resources.resource_v1 import ResourceSlice
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from drahealth._aio import cancel_and_wait
from drahealth.core import (
    DEVICE_NAME_KEY,
    AttachedHealth,
    AttachIndex,
    DeviceKey,
    Health,
    ReportedDevice,
    Signal,
    SourceSpec,
)
from drahealth.kube import Reflector, as_dict
from drahealth.node._attach_config import (
    AttachConfig,
    DriverAttach,
    SourceSettings,
    build_source,
)
from drahealth.node._attached_pods import Covered, PodDeviceHealth
from drahealth.node._events import EventRecorder
from drahealth.node._pipeline import HealthPipeline
from drahealth.sources import AttachedSource

__all__ = [
    "REPEAT_EVERY",
    "AttachedSources",
    "DriverAttachment",
    "RunningSource",
    "SourcePoller",
    "mode_covers",
]

log = logging.getLogger(__name__)

#: A wake-up this much past a lease's end sees it ended (leases end strictly after).
_PAST = 0.001
#: A source's thread hands over an unchanged answer at least this often (seconds; and at
#: least four times per timeout), so its leases stay fresh; changes go over at once.
REPEAT_EVERY = 1.0

#: What one poll came to: the signals, or the text of the error it raised.
Outcome = tuple[Signal, ...] | str


def _outcome(poll: Callable[[], object]) -> Outcome:
    """Run one poll; a bad answer (not a list of Signals) counts as a failure."""
    try:
        answer = poll()
        if not isinstance(answer, list):
            raise TypeError(f"poll returned {type(answer).__name__}, not a list of signals")
        for item in answer:
            if not (isinstance(item, Signal) and isinstance(item.health, Health)):
                raise TypeError(f"poll returned {type(item).__name__} among its signals")
        return tuple(answer)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return text[:512]


class SourcePoller(threading.Thread):
    """One source's thread: polls it every ``interval`` seconds (``poll`` may block; the
    next poll starts ``interval`` after the previous one started, at once if it took
    longer) and hands the outcome to the loop when it differs from the previous one, or
    when the last hand-over is :data:`REPEAT_EVERY` old. A source at rest therefore
    costs no wake-up of the event loop per poll."""

    def __init__(
        self,
        running: RunningSource,
        loop: asyncio.AbstractEventLoop,
        deliver: Callable[[RunningSource, Outcome, int], None],
        stop: threading.Event,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name=f"attach-{running.name}", daemon=True)
        self.running = running
        self._loop = loop
        self._deliver = deliver
        self._halt = stop
        self._clock = clock
        self.repeat_every = min(REPEAT_EVERY, running.timeout / 4)
        #: Polls made and outcomes handed over (for tests and metrics).
        self.polls = 0
        self.handovers = 0

    def run(self) -> None:
        last: Outcome | None = None
        sent_at = -math.inf
        repeats = 0
        interval = self.running.interval
        while not self._halt.is_set():
            started = self._clock()
            outcome = _outcome(self.running.source.poll)
            self.polls += 1
            now = self._clock()
            if outcome != last or now - sent_at >= self.repeat_every:
                try:
                    self._loop.call_soon_threadsafe(self._deliver, self.running, outcome, repeats)
                except RuntimeError:  # the loop is closed: the agent is gone
                    return
                self.handovers += 1
                sent_at, repeats = now, 0
            else:
                repeats += 1
            last = outcome
            self._halt.wait(max(0.0, started + interval - self._clock()))


@dataclass(slots=True)
class RunningSource:
    """One configured source, built."""

    settings: SourceSettings
    source: AttachedSource
    interval: float
    timeout: float
    failing: str = ""

    @property
    def name(self) -> str:
        return self.settings.name


class DriverAttachment:
    """One watched driver: its slices, its sources, its devices' health (see the module
    docstring). ``on_ready`` is called once, after the first report to the pipeline."""

    def __init__(
        self,
        attach: DriverAttach,
        sources: Sequence[RunningSource],
        client: AsyncClient,
        node: str,
        pipeline: HealthPipeline,
        *,
        has_stream: Callable[[str], bool] = lambda _driver: False,
        on_ready: Callable[[str], None] = lambda _driver: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.driver = attach.driver
        self.node = node
        self.sources = list(sources)
        self.pipeline = pipeline
        self.health = AttachedHealth(
            attach.driver,
            [SourceSpec(s.name, s.timeout, s.settings.match, s.settings.unlisted) for s in sources],
            key=attach.key,
            clock=clock,
        )
        #: The lease of each report to the pipeline: the longest source lease, so a stalled
        #: agent loop turns the devices Unknown no later than any source's would.
        self.lease = max(1, math.ceil(max((s.timeout for s in sources), default=30.0)))
        self.slices: Reflector[ResourceSlice] = Reflector(
            client,
            ResourceSlice,
            fields={"spec.nodeName": node, "spec.driver": attach.driver},
            name=f"attach-slices:{attach.driver}",
        )
        self.slices.add_handler(self._on_slice)
        self._has_stream = has_stream
        self._on_ready = on_ready
        self._clock = clock
        self._wake = asyncio.Event()
        self._index_dirty = True
        self._tasks: list[asyncio.Task[None]] = []
        self._published_version = -1
        self._due: float | None = None
        self._refresh_at = 0.0
        self._last: list[ReportedDevice] | None = None
        self._logged: set[str] = set()
        self._stream_warned = False
        self._counted = False
        self._stop = threading.Event()
        self._stopped = False
        #: The sources' threads (started once the slices are listed).
        self.pollers: list[SourcePoller] = []
        #: True once the devices' health went to the pipeline.
        self.ready = False
        #: Reports handed to the pipeline, and turns of the loop (deadlines, heartbeats).
        self.reports = 0
        self.wakeups = 0

    async def start(self) -> None:
        await self.slices.start()
        self._tasks.append(asyncio.create_task(self._run(), name=f"attach:{self.driver}"))

    async def stop(self) -> None:
        self._stopped = True
        self._stop.set()  # each poller ends after its current poll (daemon threads)
        await cancel_and_wait(self._tasks)
        self._tasks = []
        await self.slices.stop()

    def _on_slice(self, _event: str, _obj: ResourceSlice, _old: ResourceSlice | None) -> None:
        self._index_dirty = True
        self._wake.set()

    def _once(self, text: str, level: int = logging.WARNING) -> None:
        if text in self._logged or len(self._logged) >= 4096:
            return
        self._logged.add(text)
        log.log(level, "attached sources of %s: %s", self.driver, text)

    async def _run(self) -> None:
        await self.slices.wait_synced()
        self._rebuild()
        loop = asyncio.get_running_loop()
        for running in self.sources:
            poller = SourcePoller(running, loop, self._deliver, self._stop, clock=self._clock)
            self.pollers.append(poller)
            poller.start()
        while True:
            self._wake.clear()
            self.wakeups += 1
            if self._index_dirty:
                self._rebuild()
            self.publish()
            now = self._clock()
            wait = self._refresh_at - now
            if self._due is not None:
                wait = min(wait, self._due - now + _PAST)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait, _PAST)):
                    await self._wake.wait()

    def _rebuild(self) -> None:
        self._index_dirty = False
        index = AttachIndex(
            self.driver, [as_dict(s) for s in self.slices.store.list()], node=self.node
        )
        for problem in index.problems:
            self._once(problem)
        if len(index) != len(self.health.index) or not self._counted:
            self._counted = True
            names = ", ".join(s.name for s in self.sources)
            log.info(
                "attached sources of %s (%s) watch %d devices on %s",
                self.driver, names, len(index), self.node,
            )  # fmt: skip
        self.health.set_index(index)
        for running in self.sources:
            watch = getattr(running.source, "watch_keys", None)
            if callable(watch):
                by = getattr(running.source, "by", DEVICE_NAME_KEY)
                watch(self.health.keys_for(running.name, by if isinstance(by, str) else ""))

    def _deliver(self, running: RunningSource, outcome: Outcome, repeats: int) -> None:
        """A poll's outcome, handed over by the source's thread (on the loop)."""
        if self._stopped:
            return
        if isinstance(outcome, str):
            self.health.failed(running.name, outcome, repeats=repeats)
            if outcome != running.failing:
                log.warning("attached source %s of %s failed: %s", running.name,
                            self.driver, outcome)  # fmt: skip
            running.failing = outcome
        else:
            for problem in self.health.observe(running.name, outcome, repeats=repeats):
                self._once(problem)
            if running.failing:
                log.info("attached source %s of %s works again", running.name, self.driver)
                running.failing = ""
        self.publish()

    def publish(self) -> None:
        """Hand the devices' health to the pipeline if it may have changed (a new
        answer, a lease that ended) or the heartbeat is due."""
        if not self.slices.has_synced:
            return
        now = self._clock()
        changed = self.health.version != self._published_version
        ended = self._due is not None and now > self._due
        if not (changed or ended or now >= self._refresh_at):
            return
        self._published_version = self.health.version
        self._due = self.health.next_deadline()
        reports = self.health.reports(self.lease)
        if not reports and self._last is None:
            # no source has answered yet: nothing to say (and nothing to flash); look
            # again when a lease ends (a silent source) or at the next heartbeat
            self._refresh_at = now + self.lease / 3
            return
        if reports == self._last and now < self._refresh_at:
            return
        if not self._stream_warned and self._has_stream(self.driver):
            self._stream_warned = True
            log.warning(
                "driver %s streams its own device health and has attached sources: both "
                "write the same devices; attach sources only to drivers that stream none",
                self.driver,
            )
        self._last = reports
        self._refresh_at = now + self.lease / 3
        self.reports += 1
        self.pipeline.report(self.driver, reports)
        if not self.ready:
            self.ready = True
            self._on_ready(self.driver)

    def device_health(self, key: DeviceKey) -> tuple[Health, str] | None:
        return self.health.device_health(key)


class _Readings(Collector):
    """The attached sources' counters as metrics."""

    def __init__(self, node: str, attached: AttachedSources) -> None:
        self._node = node
        self._attached = attached

    def collect(self) -> Iterable[Metric]:
        labels = ["node", "driver", "source"]
        families = {
            "signals": CounterMetricFamily(
                "drahealth_node_attached_signals",
                "Signals attached sources answered.",
                labels=labels,
            ),
            "unmatched": CounterMetricFamily(
                "drahealth_node_attached_unmatched_signals",
                "Signals whose key no device of the driver on this node has.",
                labels=labels,
            ),
            "ambiguous": CounterMetricFamily(
                "drahealth_node_attached_ambiguous_signals",
                "Signals whose key several devices share (not applied).",
                labels=labels,
            ),
            "polls": CounterMetricFamily(
                "drahealth_node_attached_polls", "Polls of attached sources.", labels=labels
            ),
            "failures": CounterMetricFamily(
                "drahealth_node_attached_poll_failures",
                "Polls of attached sources that raised.",
                labels=labels,
            ),
        }
        up = GaugeMetricFamily(
            "drahealth_node_attached_source_up",
            "1 while the attached source answers within its timeout.",
            labels=labels,
        )
        dropped = CounterMetricFamily(
            "drahealth_node_attached_source_dropped",
            "Input attached sources read and did not use, by reason (kmsg: fault lines "
            "for no watched device, past max_devices, from user space, malformed).",
            labels=[*labels, "reason"],
        )
        devices = GaugeMetricFamily(
            "drahealth_node_attached_devices",
            "Devices of the driver on this node that attached sources watch.",
            labels=["node", "driver"],
        )
        now = self._attached.clock()
        for driver, attachment in sorted(self._attached.drivers.items()):
            devices.add_metric([self._node, driver], len(attachment.health.index))
            for name, state in sorted(attachment.health.sources.items()):
                values = [self._node, driver, name]
                for field, family in families.items():
                    family.add_metric(values, getattr(state, field))
                answering = state.answered and now - state.last_answer <= state.spec.timeout
                up.add_metric(values, 1.0 if answering else 0.0)
            for running in attachment.sources:
                counts = getattr(running.source, "dropped", None)
                if not callable(counts):
                    continue
                for reason, count in sorted(counts().items()):
                    dropped.add_metric([self._node, driver, running.name, reason], count)
        yield from families.values()
        yield up
        yield dropped
        yield devices
        pods = self._attached.pods
        written = CounterMetricFamily(
            "drahealth_node_attached_pod_conditions_written",
            "Pod conditions drahealth.io/DeviceHealthy written.",
            labels=["node"],
        )
        written.add_metric([self._node], pods.conditions_written if pods else 0)
        yield written


class AttachedSources:
    """Every watched driver of the attach file, and the pods using their devices.

    The sources are built here (a bad entry raises
    :class:`~drahealth.node._attach_config.AttachConfigError`); :meth:`start` starts
    watching and polling. ``covered``: see :class:`PodDeviceHealth`; ``has_stream``:
    whether a driver streams its own health to this agent.
    """

    def __init__(
        self,
        config: AttachConfig,
        client: AsyncClient,
        node: str,
        pipeline: HealthPipeline,
        events: EventRecorder,
        *,
        registry: CollectorRegistry | None = None,
        covered: Covered | None = None,
        has_stream: Callable[[str], bool] = lambda _driver: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.node = node
        self.pipeline = pipeline
        self.clock = clock
        built: list[tuple[DriverAttach, list[RunningSource]]] = []
        for attach in config.drivers:
            running = []
            for settings in attach.sources:
                source, interval, timeout = build_source(settings, config.source)
                running.append(RunningSource(settings, source, interval, timeout))
            built.append((attach, running))
        self.drivers: dict[str, DriverAttachment] = {}
        for attach, running in built:
            self.drivers[attach.driver] = DriverAttachment(
                attach, running, client, node, pipeline,
                has_stream=has_stream, on_ready=self._driver_ready, clock=clock,
            )  # fmt: skip
        self.pods: PodDeviceHealth | None = PodDeviceHealth(
            client,
            node,
            frozenset(self.drivers),
            lambda key: pipeline.cache.get(key.driver, key.pool, key.device),
            events,
            ready=lambda driver: driver in self.drivers and self.drivers[driver].ready,
            covered=covered,
        )
        if registry is not None:
            registry.register(_Readings(node, self))
        self._started: list[str] = []

    def _driver_ready(self, driver: str) -> None:
        if self.pods is not None:
            self.pods.mark_driver(driver)

    async def start(self) -> None:
        assert self.pods is not None
        self.pipeline.add_listener(self.pods.on_changes)
        await self.pods.start()
        self._started.append("pods")
        for attachment in self.drivers.values():
            await attachment.start()
            self._started.append(attachment.driver)

    async def stop(self) -> None:
        for attachment in self.drivers.values():
            if attachment.driver in self._started:
                await attachment.stop()
        if "pods" in self._started and self.pods is not None:
            await self.pods.stop()
        self._started.clear()


def mode_covers(mode: object, key: DeviceKey, namespace: str, name: str, uid: str) -> bool:
    """Whether the agent's ``mode`` records ``key``'s health Events on this pod itself:
    the kubelet mode for claims it prepared, the observer for pods PodResources lists."""
    from drahealth.node._kubelet import KubeletMode
    from drahealth.node._observer import ObserverMode

    if isinstance(mode, KubeletMode):
        return uid in mode.tracker.pods_for([key])
    if isinstance(mode, ObserverMode):
        return any(
            (ref.namespace, ref.name) == (namespace, name) and not ended
            for ref, _claim, ended in mode.map.pods_for(key)
        )
    return False
