"""What :func:`drahealth.driver.start` runs beside the kubelet sockets.

Owns the assembly every driver needs around its hub, driven by ``PluginOptions``:
ResourceSlice publishing of the driver's resources (``Pool`` or ``DriverResources``),
health-driven device taints (``TaintController`` with a persisted ``TaintStore``),
the fault-injection control socket (``ControlServer``), metrics (``DriverMetrics`` and,
with ``metrics_port``, the ``/metrics`` server), opt-in claim health conditions
(``ClaimStatusWriter``), the hub report of permanent device faults seen by prepare,
and the optional refusal of latched-Unhealthy devices before the driver is called.

:class:`DriverServices` is created by ``start()`` (``prepare_driver`` before the
sockets, ``start`` after them) and stopped by ``PluginHandle.stop()``; all of it runs
as tasks on the caller's event loop. It never creates or closes the hub or the API
client: the driver owns those.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from drahealth._metrics_http import MetricsServer
from drahealth.core import Health
from drahealth.driver._claim_status import ClaimStatusWriter
from drahealth.driver._control import ControlServer, validate_actions
from drahealth.driver._control_client import control_socket_path
from drahealth.driver._hub import DeviceReport, HealthHub
from drahealth.driver._metrics import DriverMetrics
from drahealth.driver._publisher import ResourceSlicePublisher
from drahealth.driver._slices import DriverResources, Pool, split_pool
from drahealth.driver._taints import TaintController, TaintPolicy, TaintStore
from drahealth.driver._types import (
    ClaimRef,
    DeviceFaultCallback,
    Driver,
    ErrorKind,
    HealthServiceProvider,
    PluginOptions,
    PreparedClaimRequest,
    PrepareResult,
)

if TYPE_CHECKING:
    from drahealth.driver._claim_status import PreparedClaims

__all__ = [
    "PREPARE_FAULT_SOURCE",
    "TAINT_STORE_NAME",
    "DriverServices",
    "HealthGuardedDriver",
    "as_resources",
]

log = logging.getLogger("drahealth.driver.services")

#: Hub source of the permanent device faults prepare saw (``report_device_faults``).
PREPARE_FAULT_SOURCE = "prepare"
#: File of the persisted health taints inside the state directory.
TAINT_STORE_NAME = "device-taints.json"


def as_resources(
    resources: Pool | DriverResources | None, node_name: str
) -> DriverResources | None:
    """``resources`` as ``DriverResources`` (a ``Pool`` is named after the node),
    validated against every ResourceSlice limit (``SliceValidationError``)."""
    if resources is None:
        return None
    if isinstance(resources, Pool):
        if not node_name:
            raise ValueError(
                "resources=Pool(...) needs PluginOptions.node_name: the pool is named "
                "after the node"
            )
        resources = DriverResources({node_name: resources})
    elif not isinstance(resources, DriverResources):
        raise TypeError(
            f"resources must be a Pool or DriverResources, got {type(resources).__name__}"
        )
    for pool_name, pool in resources.pools.items():
        split_pool(pool_name, pool)
    return resources


class HealthGuardedDriver:
    """A :class:`Driver` that fails, before the wrapped driver is called, every claim
    with a device latched Unhealthy in ``hub`` (``PERMANENT_DEVICE``) or one the hub
    does not know (``PERMANENT_CONFIG``); the other claims go to the driver in one call."""

    def __init__(self, driver: Driver, hub: HealthHub) -> None:
        self.driver = driver
        self.hub = hub

    def _refusal(self, claim: PreparedClaimRequest) -> PrepareResult | None:
        for r in claim.results:
            try:
                state = self.hub.state(r.pool, r.device)
            except ValueError:
                return PrepareResult.failed(
                    f"device {r.pool}/{r.device} of claim {claim.ref} is not a device of "
                    "this driver on this node",
                    ErrorKind.PERMANENT_CONFIG,
                )
            if state.health is Health.UNHEALTHY and state.sticky:
                return PrepareResult.failed(
                    f"device {r.pool}/{r.device} is unhealthy ({state.message or 'no message'})",
                    ErrorKind.PERMANENT_DEVICE,
                    device=(r.pool, r.device),
                )
        return None

    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        out: dict[str, PrepareResult] = {}
        passed: list[PreparedClaimRequest] = []
        for claim in claims:
            refusal = self._refusal(claim)
            if refusal is None:
                passed.append(claim)
            else:
                out[claim.uid] = refusal
        if passed:
            out.update(await self.driver.prepare(passed))
        return out

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        return await self.driver.unprepare(claims)


class DriverServices:
    """The pieces ``start()`` runs for one plugin (see the module docstring).

    Attributes are ``None`` where the options (or a missing hub or API client) turn
    the piece off: ``publisher``, ``taints``, ``control``, ``claim_status``,
    ``metrics_server``. ``metrics`` always exists.
    """

    def __init__(
        self,
        options: PluginOptions,
        health: HealthServiceProvider | None,
        resources: Pool | DriverResources | None,
    ) -> None:
        self.hub = health if isinstance(health, HealthHub) else None
        if options.taint_policy is not None and not isinstance(options.taint_policy, TaintPolicy):
            raise TypeError(
                f"taint_policy must be a TaintPolicy, got {type(options.taint_policy).__name__}"
            )
        validate_actions(options.control_actions)
        self.resources = as_resources(resources, options.node_name)
        self.metrics = _metrics(options)
        self.options = dataclasses.replace(
            options,
            metrics_registry=self.metrics.registry,
            on_device_fault=self._device_fault_callback(options),
        )
        self.publisher: ResourceSlicePublisher | None = None
        self.taints: TaintController | None = None
        self.control: ControlServer | None = None
        self.claim_status: ClaimStatusWriter | None = None
        self.metrics_server: MetricsServer | None = None
        self._unwatch: Callable[[], None] | None = None
        self._stopped = False

    def _device_fault_callback(self, options: PluginOptions) -> DeviceFaultCallback | None:
        user = options.on_device_fault
        hub = self.hub
        if hub is None or not options.report_device_faults:
            return user

        async def on_device_fault(pool: str, device: str, message: str) -> None:
            log.warning(
                "permanent fault of device %s/%s seen by prepare: %s", pool, device, message
            )
            report = DeviceReport(pool, device, Health.UNHEALTHY, message, True)
            try:
                hub.submit(PREPARE_FAULT_SOURCE, [report])
            except ValueError as exc:  # a device the hub does not know
                log.warning("device fault of %s/%s not reported to the hub: %s", pool, device, exc)
            if user is not None:
                ret = user(pool, device, message)
                if inspect.isawaitable(ret):
                    await ret

        return on_device_fault

    def prepare_driver(self, driver: Driver) -> Driver:
        """``driver`` as the plugin calls it: timed, and guarded where asked."""
        if self.hub is not None and self.options.refuse_unhealthy:
            driver = HealthGuardedDriver(driver, self.hub)
        return self.metrics.instrument(driver)

    async def start(self, prepared: PreparedClaims) -> None:
        """Start every piece the options ask for; on failure the caller calls ``stop``."""
        o = self.options
        hub = self.hub
        if hub is not None:
            self._unwatch = self.metrics.watch_hub(hub)
        if hub is not None and o.control_socket:
            self.control = ControlServer(
                hub, control_socket_path(o.effective_state_dir), o.control_actions
            )
            await self.control.start()
        if o.metrics_port is not None:
            self.metrics_server = MetricsServer(self.metrics.registry)
            await self.metrics_server.start(o.metrics_host, o.metrics_port)
        client = o.kube_client
        if self.resources is not None and client is None:
            log.warning(
                "driver %s has no kube_client: its ResourceSlices are not published",
                o.driver_name,
            )
        if self.resources is not None and client is not None:
            self.publisher = ResourceSlicePublisher(
                client, o.driver_name, o.node_name, withdraw_unhealthy=o.withdraw_unhealthy
            )
            self.metrics.watch_publisher(self.publisher)
            self.publisher.publish(self.resources)
            if hub is not None and o.health_taints:
                policy = o.taint_policy or TaintPolicy(o.driver_name)
                self.taints = TaintController(
                    hub,
                    policy,
                    self.publisher.set_device_taints,
                    store=TaintStore(os.path.join(o.effective_state_dir, TAINT_STORE_NAME)),
                    withdraw=self.publisher.set_withdrawn,
                )
                await self.taints.start()
        if hub is not None and client is not None and o.claim_status:
            self.claim_status = ClaimStatusWriter(hub, client, o.driver_name, prepared)
            await self.claim_status.start()

    async def stop(self) -> None:
        """Stop every piece that runs, newest first. Idempotent; the attributes stay
        set, so their counters can be read after the stop."""
        if self._stopped:
            return
        self._stopped = True
        if self.control is not None:
            await self.control.close()
        if self.claim_status is not None:
            await self.claim_status.stop()
        if self.taints is not None:
            await self.taints.stop()
        if self.publisher is not None:
            await self.publisher.stop()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None


def _metrics(options: PluginOptions) -> DriverMetrics:
    try:
        return DriverMetrics(options.driver_name, options.metrics_registry)
    except ValueError as exc:  # the families are registered there already
        raise ValueError(
            f"PluginOptions.metrics_registry already holds the driver's metric families "
            f"({exc}): start() creates them itself (see handle.metrics), pass the registry "
            "only"
        ) from None
