"""The node agent process: wires watcher, registry, health pipeline and a mode.

Owns :class:`NodeAgent` (its settings are :class:`~drahealth.node._config.AgentConfig`),
which starts the parts in dependency order and stops them in reverse:

1. health pipeline (store replay by recorded lease end, expiry timer);
2. claim tracker (checkpoint load);
3. plugin registry (streams, DRA clients) and plugin watcher (registration);
4. the mode: ``kubelet`` (:class:`~drahealth.node._kubelet.KubeletMode`, writes pod
   status) or ``observer`` (:class:`~drahealth.node._observer.ObserverMode`, beside a
   real kubelet: Events, metrics and post-mortem records, never pod status);
5. the device-health ConfigMap of the node (when the agent has API access);
6. attached health sources (``attach``: devices of drivers that stream no health, see
   :mod:`drahealth.node._attached`);
7. the metrics endpoint.

Problems found at start (a corrupt store or checkpoint, quarantined) are logged and
kept in :attr:`NodeAgent.problems`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from lightkube import AsyncClient

from drahealth import api
from drahealth._metrics_http import MetricsServer
from drahealth.core import StatusBuilder, StatusOptions
from drahealth.node._claims import ClaimTracker
from drahealth.node._config import AgentConfig
from drahealth.node._events import EventRecorder
from drahealth.node._metrics import AgentMetrics
from drahealth.node._pipeline import HealthPipeline
from drahealth.node._publish import DeviceHealthPublisher
from drahealth.node._registry import PluginRegistry
from drahealth.node._watcher import PluginWatcher

if TYPE_CHECKING:
    from drahealth.node._attach_config import AttachConfig
    from drahealth.node._attached import AttachedSources

__all__ = ["AgentConfig", "NodeAgent"]

log = logging.getLogger(__name__)

_HEALTH_SERVICES = {"v1": api.DRA_HEALTH_V1, "v1alpha1": api.DRA_HEALTH_V1ALPHA1}


class Mode(Protocol):
    """What the agent runs on top of the health pipeline."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class NodeAgent:
    """One node's agent (see the module docstring)."""

    def __init__(
        self,
        config: AgentConfig,
        client: AsyncClient | None,
        *,
        say: Callable[[str], None] | None = None,
        attach: AttachConfig | None = None,
    ) -> None:
        if config.mode == "kubelet" and client is None:
            raise ValueError("kubelet mode needs API access (a kubeconfig)")
        if attach is not None and client is None:
            raise ValueError(
                "attached sources need API access (the driver's ResourceSlices): "
                "--kubeconfig or --in-cluster"
            )
        self.config = config
        self.client = client
        self._say = say or (lambda _msg: None)
        self.problems: list[str] = []
        self.pipeline = HealthPipeline(
            config.state_dir,
            default_timeout=config.default_timeout,
            removal_grace=config.removal_grace,
        )
        self.tracker = ClaimTracker(config.state_dir)
        self.metrics = AgentMetrics(config.node_name)
        # Health streams open whatever the pod-status gate says: with it off the node's
        # record and the Events are the health path. The observer calls any version.
        services: tuple[str, ...] = api.DRA_HEALTH_SERVICES
        if config.mode == "kubelet":
            services = tuple(_HEALTH_SERVICES[v] for v in config.health_versions)
        self.registry = PluginRegistry(
            on_report=self.pipeline.report,
            default_timeout=config.default_timeout,
            on_event=self._on_health_event,
            health_services=services,
        )
        roots = config.allowed_roots
        if roots is None:
            roots = [os.path.dirname(os.path.abspath(config.registry_dir))]
        self.watcher = PluginWatcher(
            config.registry_dir,
            self.registry,
            allowed_roots=roots,
            allowed_uids=config.allowed_uids,
            rescan_interval=config.rescan_interval,
            probe_interval=config.probe_interval,
            notify=config.mode == "kubelet",
        )
        self.builder = StatusBuilder(
            StatusOptions(
                health_status=config.health_status,
                health_message=config.health_message,
                resource_id=config.resource_id,
            )
        )
        self.events = EventRecorder(client, config.node_name)
        self.publisher = (
            None
            if client is None
            else DeviceHealthPublisher(
                client, self.pipeline.cache, config.node_name, namespace=config.postmortem_namespace
            )
        )
        self.mode: Mode | None = None
        self.metrics_server: MetricsServer | None = None
        self._started: list[str] = []
        self.attached: AttachedSources | None = None
        if attach is not None:
            from drahealth.node._attached import AttachedSources, mode_covers

            assert client is not None
            self.attached = AttachedSources(
                attach,
                client,
                config.node_name,
                self.pipeline,
                self.events,
                registry=self.metrics.registry,
                covered=lambda key, ns, name, uid: mode_covers(self.mode, key, ns, name, uid),
                has_stream=lambda driver: self.registry.active_health(driver) is not None,
            )

    async def start(self) -> None:
        os.makedirs(self.config.state_dir, mode=0o700, exist_ok=True)
        await self.pipeline.start()
        self._started.append("pipeline")
        if self.pipeline.problem:
            self.problems.append(self.pipeline.problem)
        problem = self.tracker.load()
        if problem:
            log.warning("%s", problem)
            self.problems.append(problem)
        self.pipeline.add_listener(self.metrics.on_changes)
        self.metrics.on_changes(self.pipeline.restored)
        self.metrics.watch(
            self._reconnects,
            lambda: len(self.tracker.claims()),
            rejections=lambda: self.pipeline.cache.rejections,
            stream_errors=self._stream_errors,
            persist_failing=lambda: self.pipeline.persist_failing,
        )
        if self.config.mode == "kubelet":
            from drahealth.node._kubelet import KubeletMode

            assert self.client is not None
            c = self.config
            log.info(
                "kubelet mode as Kubernetes %s: pod health status %s, messages %s, dra-health %s",
                c.kube_version,
                "on" if c.health_status else "off (ResourceHealthStatus)",
                "on" if c.health_status and c.health_message else "off",
                ", ".join(c.health_versions),
            )
            self.mode = KubeletMode(
                self.client,
                self.config.node_name,
                self.registry,
                self.tracker,
                self.pipeline,
                self.builder,
                self.events,
                resync_interval=self.config.resync_interval,
                on_status_written=self.metrics.observe_latency,
                cdi_dirs=c.cdi_dirs,
                kube_version=c.kube_version,
                storage_dir=c.state_dir,
            )
        else:
            from drahealth.node._observer import ObserverMode

            self.mode = ObserverMode(self.config, self.client, self.pipeline, self.events)
        await self.watcher.start()
        self._started.append("watcher")
        await self.mode.start()
        self._started.append("mode")
        if self.publisher is not None:
            self.pipeline.add_listener(self.publisher.on_changes)
            await self.publisher.start()
        if self.attached is not None:
            await self.attached.start()
            self._started.append("attached")
        if self.config.metrics_port is not None:
            self.metrics_server = MetricsServer(self.metrics.registry)
            await self.metrics_server.start(self.config.metrics_host, self.config.metrics_port)
            self._say(f"metrics: {self.metrics_server.url}")

    async def stop(self) -> None:
        if "attached" in self._started and self.attached is not None:
            await self.attached.stop()
        if self.publisher is not None:
            await self.publisher.stop()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
            self.metrics_server = None
        if "mode" in self._started and self.mode is not None:
            await self.mode.stop()
        if "watcher" in self._started:
            await self.watcher.stop()
        await self.registry.close()
        if "pipeline" in self._started:
            await self.pipeline.stop()
        self._started.clear()

    def _on_health_event(self, driver: str, kind: str, generation: int) -> None:
        if kind == "deactivate":  # no instance with health left: cap and forget
            self.pipeline.retire(driver)

    def _stream_errors(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for driver in self.registry.drivers():
            stream = self.registry.stream(driver)
            if stream is not None:
                out[driver] = stream.bad_messages + stream.unexpected_errors
        return out

    def _reconnects(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for driver in self.registry.drivers():
            stream = self.registry.stream(driver)
            if stream is not None:
                out[driver] = stream.reconnects
        return out
