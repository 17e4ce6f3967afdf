"""The sample driver program: simulated device profiles wired to every piece of the
driver toolkit.

Owns the two profiles modelled on dra-example-driver (reference/driver-side.md 2):

* ``sim-gpu``: ``gpu-<i>`` devices in pool = node name, attributes ``index``, ``uuid``
  (deterministic from node and index), ``model``, ``driverVersion``, capacity
  ``memory`` 80Gi. With ``partitions`` > 0 (like ``GPU_PARTITIONS``) each GPU gets a
  counter set ``gpu-<i>-counters`` (published in a counters-only slice) and devices
  ``gpu-<i>-full`` plus ``gpu-<i>-partition-<j>`` consuming its ``memory`` counter.
* ``sim-nic``: ``nic-<i>`` devices with ``allowMultipleAllocations: true`` and
  capacities ``vfs`` and ``ingressBandwidth``/``egressBandwidth`` with request policies.
* ``sim-pci``: the host's real PCI functions (read-only from ``<sysfs-root>/bus/pci``),
  ``pci-<address>`` devices with ``address``, ``vendor``, ``deviceID``, ``class`` and
  ``kernelDriver`` attributes, monitored by the PCI sysfs health source
  (``drahealth.sources``) instead of the simulated one. Prepare has no side effects.
* ``sim-nvidia``: GPUs published as NVIDIA's DRA driver publishes them (driver
  ``gpu.nvidia.com``; ``drahealth.simdriver._nvidia``): no health service, no taints of
  its own, and a fake kernel log (``<state-dir>/kmsg``) the control socket's ``xid``
  action writes NVIDIA XID lines into.

Also owns :class:`SampleDriver` (prepare answers the allocated devices, with no side
effects; the toolkit adds CDI ids and, with ``refuse_unhealthy``, fails a device latched
Unhealthy in the hub with a ``PERMANENT_DEVICE`` error before the driver runs),
:class:`SimulatedHealthSource` (every device Healthy, re-reported as a heartbeat) and
:class:`SampleDriverApp`, which builds the hub and the pool and hands them to the
toolkit's ``start()``, whose options run the control socket, metrics and (with API
access) the ResourceSlice publisher and taints (and, with ``withdraw_unhealthy``,
latched-Unhealthy devices left out of the slices).
The command (``drahealth.cli.driver``) only parses options and prints.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lightkube import AsyncClient
from lightkube.models.resource_v1 import (
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    Counter,
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceCounterConsumption,
)

from drahealth import api
from drahealth._aio import cancel_and_wait, on_stop_signals
from drahealth._metrics_http import MetricsServer
from drahealth.core import Health
from drahealth.driver import (
    PREPARE_FAULT_SOURCE,
    TAINT_STORE_NAME,
    WITHDRAW_MODES,
    ClaimRef,
    ClaimStatusWriter,
    ControlAction,
    ControlServer,
    DeviceReport,
    DriverMetrics,
    DriverResources,
    ErrorKind,
    HealthHub,
    PluginHandle,
    PluginOptions,
    Pool,
    PreparedClaimRequest,
    PreparedDevice,
    PrepareResult,
    ResourceSlicePublisher,
    TaintController,
    TaintPolicy,
    WithdrawMode,
    split_pool,
    start,
)
from drahealth.simdriver._nvidia import (
    DEFAULT_NVIDIA_RELEASE,
    KERNEL_LOG_NAME,
    NVIDIA_DRIVER_NAME,
    KernelLog,
    XidAction,
    sim_nvidia_gpus,
    sim_nvidia_pool,
)

if TYPE_CHECKING:
    from drahealth.sources import PciSource

__all__ = [
    "DEFAULT_DRIVER_NAMES",
    "NO_KUBECONFIG_MESSAGE",
    "PREPARE_FAULT_SOURCE",
    "PROFILES",
    "SIM_SOURCE",
    "TAINT_STORE_NAME",
    "SampleDriver",
    "SampleDriverApp",
    "SampleDriverConfig",
    "SimulatedHealthSource",
    "build_resources",
    "device_uuid",
    "sim_gpu_pool",
    "sim_nic_pool",
]

log = logging.getLogger(__name__)

PROFILES = ("sim-gpu", "sim-nic", "sim-pci", "sim-nvidia")
DEFAULT_DRIVER_NAMES = {
    "sim-gpu": "gpu.example.com",
    "sim-nic": "nic.example.com",
    "sim-pci": "pci.example.com",
    "sim-nvidia": NVIDIA_DRIVER_NAME,
}
#: Hub source of the simulated health source (permanent faults seen by prepare come
#: from the toolkit's ``PREPARE_FAULT_SOURCE``, taints persist in its ``TAINT_STORE_NAME``).
SIM_SOURCE = "sim"
NO_KUBECONFIG_MESSAGE = (
    "no --kubeconfig: ResourceSlices are not published and claims cannot be fetched"
)

_UUID_NAMESPACE = uuid.UUID("6f1c1d2e-5b0a-4c57-9a3e-7d0c2b9f4e11")
_GPU_MEMORY_MI = 80 * 1024
_GPU_MODEL = "SIM-GPU-80G"
_NIC_MODEL = "SIM-NIC-100G"
_DRIVER_VERSION = "1.0.0"


# --------------------------------------------------------------------------- profiles


def device_uuid(node: str, device: str) -> str:
    """A stable UUID string for ``device`` on ``node`` (same inputs, same UUID)."""
    return str(uuid.uuid5(_UUID_NAMESPACE, f"{node}/{device}"))


def _attrs(**values: DeviceAttribute) -> dict[str, DeviceAttribute]:
    return dict(values)


def _gpu_attributes(node: str, index: int, name: str) -> dict[str, DeviceAttribute]:
    return _attrs(
        index=DeviceAttribute(int=index),
        uuid=DeviceAttribute(string=f"gpu-{device_uuid(node, name)}"),
        model=DeviceAttribute(string=_GPU_MODEL),
        driverVersion=DeviceAttribute(version=_DRIVER_VERSION),
    )


def sim_gpu_pool(node: str, devices: int = 8, partitions: int = 0) -> Pool:
    """The ``sim-gpu`` pool of ``node`` (see the module docstring)."""
    if devices < 0 or partitions < 0:
        raise ValueError("devices and partitions must not be negative")
    if not partitions:
        return Pool(
            devices=[
                Device(
                    name=f"gpu-{i}",
                    attributes=_gpu_attributes(node, i, f"gpu-{i}"),
                    capacity={"memory": DeviceCapacity(value="80Gi")},
                )
                for i in range(devices)
            ]
        )
    share = f"{_GPU_MEMORY_MI // partitions}Mi"
    counter_sets: list[CounterSet] = []
    out: list[Device] = []
    for i in range(devices):
        counters = f"gpu-{i}-counters"
        counter_sets.append(CounterSet(name=counters, counters={"memory": Counter(value="80Gi")}))
        out.append(
            Device(
                name=f"gpu-{i}-full",
                attributes=_gpu_attributes(node, i, f"gpu-{i}"),
                capacity={"memory": DeviceCapacity(value="80Gi")},
                consumesCounters=[
                    DeviceCounterConsumption(
                        counterSet=counters, counters={"memory": Counter(value="80Gi")}
                    )
                ],
            )
        )
        for j in range(partitions):
            name = f"gpu-{i}-partition-{j}"
            attributes = _gpu_attributes(node, i, name)
            attributes["partition"] = DeviceAttribute(int=j)
            out.append(
                Device(
                    name=name,
                    attributes=attributes,
                    capacity={"memory": DeviceCapacity(value=share)},
                    consumesCounters=[
                        DeviceCounterConsumption(
                            counterSet=counters, counters={"memory": Counter(value=share)}
                        )
                    ],
                )
            )
    return Pool(devices=out, shared_counters=counter_sets)


def _bandwidth() -> DeviceCapacity:
    return DeviceCapacity(
        value="100G",
        requestPolicy=CapacityRequestPolicy(
            default="1G",
            validRange=CapacityRequestPolicyRange(min="100M", max="100G", step="1M"),
        ),
    )


def sim_nic_pool(node: str, devices: int = 8) -> Pool:
    """The ``sim-nic`` pool of ``node``: shareable NICs with bandwidth capacities."""
    if devices < 0:
        raise ValueError("devices must not be negative")
    out = []
    for i in range(devices):
        digest = uuid.uuid5(_UUID_NAMESPACE, f"{node}/nic-{i}").bytes
        mac = "02:" + ":".join(f"{b:02x}" for b in digest[:5])
        out.append(
            Device(
                name=f"nic-{i}",
                allowMultipleAllocations=True,
                attributes=_attrs(
                    index=DeviceAttribute(int=i),
                    mac=DeviceAttribute(string=mac),
                    model=DeviceAttribute(string=_NIC_MODEL),
                    driverVersion=DeviceAttribute(version=_DRIVER_VERSION),
                ),
                capacity={
                    "vfs": DeviceCapacity(
                        value="8",
                        requestPolicy=CapacityRequestPolicy(default="1", validValues=["1"]),
                    ),
                    "ingressBandwidth": _bandwidth(),
                    "egressBandwidth": _bandwidth(),
                },
            )
        )
    return Pool(devices=out)


def pci_device_name(address: str) -> str:
    """``0000:3b:00.0`` -> ``pci-0000-3b-00-0`` (a DNS label)."""
    return "pci-" + address.replace(":", "-").replace(".", "-")


def sim_pci_pool(sysfs_root: str = "/sys") -> Pool:
    """The host's PCI functions as devices (read from sysfs, nothing written)."""
    from drahealth.sources import list_pci_devices

    out = []
    for info in list_pci_devices(sysfs_root):
        out.append(
            Device(
                name=pci_device_name(info.address),
                attributes=_attrs(
                    address=DeviceAttribute(string=info.address),
                    vendor=DeviceAttribute(string=info.vendor),
                    deviceID=DeviceAttribute(string=info.device),
                    **{"class": DeviceAttribute(string=info.klass)},
                    kernelDriver=DeviceAttribute(string=info.driver or "none"),
                ),
            )
        )
    return Pool(devices=out)


def build_resources(
    profile: str,
    node: str,
    devices: int = 8,
    partitions: int = 0,
    sysfs_root: str = "/sys",
    nvidia_release: str = DEFAULT_NVIDIA_RELEASE,
) -> DriverResources:
    """The driver's resources for ``profile``: one pool named after the node.

    Validated against every ResourceSlice limit (``SliceValidationError``).
    """
    if profile == "sim-gpu":
        pool = sim_gpu_pool(node, devices, partitions)
    elif profile == "sim-nic":
        if partitions:
            raise ValueError("--partitions applies to the sim-gpu profile only")
        pool = sim_nic_pool(node, devices)
    elif profile == "sim-pci":
        if partitions:
            raise ValueError("--partitions applies to the sim-gpu profile only")
        pool = sim_pci_pool(sysfs_root)
    elif profile == "sim-nvidia":
        if partitions:
            raise ValueError("--partitions applies to the sim-gpu profile only")
        pool = sim_nvidia_pool(node, devices, nvidia_release)
    else:
        raise ValueError(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    split_pool(node, pool)  # validate now, with or without API access
    return DriverResources({node: pool})


# --------------------------------------------------------------------------- driver


class SampleDriver:
    """Prepares the allocated devices of each claim with no side effects.

    A result naming a device this driver does not publish fails the claim
    (``PERMANENT_CONFIG``). A device named in ``broken`` (simulated hardware that
    looks fine to monitoring but fails to set up) or latched Unhealthy in ``hub``
    fails it with ``PERMANENT_DEVICE``, which the plugin hands to
    ``on_device_fault``. ``prepare_delay`` seconds of sleep at the start of each
    prepare call make a crash mid-prepare easy to provoke in tests.
    """

    def __init__(
        self,
        devices: Iterable[tuple[str, str]],
        hub: HealthHub | None = None,
        *,
        broken: Iterable[str] = (),
        prepare_delay: float = 0.0,
    ) -> None:
        self.devices = frozenset(devices)
        self.hub = hub
        self.broken = frozenset(broken)
        self.prepare_delay = prepare_delay

    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        if self.prepare_delay > 0:
            await asyncio.sleep(self.prepare_delay)
        return {c.uid: self._prepare_one(c) for c in claims}

    def _prepare_one(self, claim: PreparedClaimRequest) -> PrepareResult:
        devices: list[PreparedDevice] = []
        for r in claim.results:
            key = (r.pool, r.device)
            if key not in self.devices:
                return PrepareResult.failed(
                    f"device {r.pool}/{r.device} of claim {claim.ref} is not a device of "
                    "this driver on this node",
                    ErrorKind.PERMANENT_CONFIG,
                )
            if r.device in self.broken:
                return PrepareResult.failed(
                    f"simulated hardware error: device {r.pool}/{r.device} failed to initialize",
                    ErrorKind.PERMANENT_DEVICE,
                    device=key,
                )
            if self.hub is not None:
                state = self.hub.state(*key)
                if state.health is Health.UNHEALTHY and state.sticky:
                    return PrepareResult.failed(
                        f"simulated hardware error: device {r.pool}/{r.device} is faulty "
                        f"({state.message})",
                        ErrorKind.PERMANENT_DEVICE,
                        device=key,
                    )
            devices.append(PreparedDevice([r.request], r.pool, r.device, share_id=r.share_id))
        return PrepareResult.ok(devices)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        return {c.uid: None for c in claims}


class SimulatedHealthSource:
    """Reports every device Healthy from source ``"sim"`` now and every ``interval``
    seconds (a source's heartbeat; unchanged reports cost the hub nothing)."""

    def __init__(self, hub: HealthHub, devices: Iterable[tuple[str, str]], interval: float) -> None:
        self.hub = hub
        self.devices = list(devices)
        self.interval = interval
        self.reports = 0

    def report(self) -> None:
        self.hub.submit(SIM_SOURCE, [DeviceReport(p, d, Health.HEALTHY) for p, d in self.devices])
        self.reports += 1

    async def run(self) -> None:
        while True:
            self.report()
            await asyncio.sleep(self.interval)


# --------------------------------------------------------------------------- app


@dataclass(frozen=True)
class SampleDriverConfig:
    """Everything ``drahealth driver`` takes (see ``docs/driver.md``)."""

    profile: str
    driver_name: str
    node_name: str
    registry_dir: str
    plugins_dir: str
    cdi_dir: str | None
    state_dir: str | None = None
    kubeconfig: str | None = None
    devices: int = 8
    health_timeout: int = 30
    pod_uid: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    in_cluster: bool = False
    partitions: int = 0
    prepare_delay: float = 0.0
    broken_devices: tuple[str, ...] = ()
    error_type_field: bool = False
    claim_cache: bool = False
    sysfs_root: str = "/sys"
    #: Leave latched-Unhealthy devices out of the ResourceSlices (``auto``: only where
    #: the server drops device taints); ``withdraw_unknown``: Unknown ones too.
    withdraw_unhealthy: WithdrawMode = "never"
    withdraw_unknown: bool = False
    #: Write each prepared device's health into its claim's ``status.devices`` (needs API
    #: access): :class:`drahealth.driver.ClaimStatusWriter`.
    claim_status: bool = False
    #: sim-nvidia: the NVIDIA driver release whose attributes are published, and the
    #: fake kernel log (default ``<state-dir>/kmsg``).
    nvidia_release: str = DEFAULT_NVIDIA_RELEASE
    kernel_log: str | None = None

    def __post_init__(self) -> None:
        if self.profile == "sim-nvidia" and (
            self.claim_status or self.withdraw_unhealthy != "never"
        ):
            raise ValueError(
                "--claim-status and --withdraw-unhealthy need the driver's own health; "
                "sim-nvidia, like NVIDIA's driver, has none"
            )
        if self.withdraw_unhealthy not in WITHDRAW_MODES:
            raise ValueError(
                f"withdraw_unhealthy {self.withdraw_unhealthy!r}: choose one of "
                f"{', '.join(WITHDRAW_MODES)}"
            )


class SampleDriverApp:
    """The assembled sample driver; ``start()``, then ``wait()`` or ``stop()``.

    ``say`` receives the lines meant for the operator (``ready: ...`` and so on).
    """

    def __init__(self, config: SampleDriverConfig, *, say: Callable[[str], None] = print) -> None:
        self.config = config
        self.say = say
        self.resources = build_resources(
            config.profile,
            config.node_name,
            config.devices,
            config.partitions,
            config.sysfs_root,
            config.nvidia_release,
        )
        #: NVIDIA's plugins serve no health stream; neither does their simulation
        self.streams_health = config.profile != "sim-nvidia"
        self.device_ids = [
            (pool_name, d.name)
            for pool_name, pool in self.resources.pools.items()
            for d in pool.devices
        ]
        self.hub = HealthHub(self.device_ids, default_timeout_seconds=config.health_timeout)
        self.source = SimulatedHealthSource(
            self.hub, self.device_ids, max(0.05, config.health_timeout / 3)
        )
        self.pci: PciSource | None = None
        if config.profile == "sim-pci":
            from drahealth.sources import PciDevice, PciSource

            self.pci = PciSource(
                [
                    PciDevice(pool, d.name, (d.attributes or {})["address"].string or "")
                    for pool, p in self.resources.pools.items()
                    for d in p.devices
                ],
                root=config.sysfs_root,
                interval=max(0.05, config.health_timeout / 3),
            )
        unknown = sorted(set(config.broken_devices) - {d for _, d in self.device_ids})
        if unknown:
            raise ValueError(f"--broken-device names unknown devices: {', '.join(unknown)}")
        # latched-Unhealthy devices are refused by the toolkit (refuse_unhealthy)
        self.driver = SampleDriver(
            self.device_ids, broken=config.broken_devices, prepare_delay=config.prepare_delay
        )
        self.client: AsyncClient | None = None
        self.handle: PluginHandle | None = None
        self.kernel_log: KernelLog | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()

    # What the toolkit's start() runs for this driver (None before start).

    @property
    def metrics(self) -> DriverMetrics | None:
        return self.handle.metrics if self.handle else None

    @property
    def control(self) -> ControlServer | None:
        return self.handle.control if self.handle else None

    @property
    def metrics_server(self) -> MetricsServer | None:
        return self.handle.metrics_server if self.handle else None

    @property
    def publisher(self) -> ResourceSlicePublisher | None:
        return self.handle.publisher if self.handle else None

    @property
    def taints(self) -> TaintController | None:
        return self.handle.taints if self.handle else None

    @property
    def claim_status(self) -> ClaimStatusWriter | None:
        return self.handle.claim_status if self.handle else None

    def plugin_options(self) -> PluginOptions:
        """The toolkit options for this configuration (API client set by ``start``)."""
        c = self.config
        return PluginOptions(
            c.driver_name,
            node_name=c.node_name,
            registry_dir=c.registry_dir,
            plugins_dir=c.plugins_dir,
            cdi_dir=c.cdi_dir,
            state_dir=c.state_dir,
            pod_uid=c.pod_uid,
            kube_client=self.client,
            enable_error_type_field=c.error_type_field,
            claim_cache=c.claim_cache,
            refuse_unhealthy=True,
            # NVIDIA's plugins serve no health stream and taint nothing; neither does
            # their simulation (its hub still answers the control socket)
            serve_health=self.streams_health,
            health_taints=self.streams_health,
            taint_policy=TaintPolicy(c.driver_name, withdraw_unknown=c.withdraw_unknown),
            withdraw_unhealthy=c.withdraw_unhealthy,
            claim_status=c.claim_status,
            control_actions=self._profile_actions(),
            metrics_port=c.metrics_port,
            metrics_host=c.metrics_host,
        )

    async def start(self) -> None:
        """Start everything; prints ``ready: <registrar socket>`` once served."""
        c = self.config
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        if self.client is None:
            self.say(NO_KUBECONFIG_MESSAGE)
        if self.metrics_server is not None:
            self.say(f"metrics: {self.metrics_server.url}")
        assert self.handle is not None and self.control is not None
        self.say(f"control: {self.control.path}")
        if self.kernel_log is not None:
            self.say(f"kernel log: {self.kernel_log.path}")
        log.info("sample driver %s (%s) on node %s started", c.driver_name, c.profile, c.node_name)
        self.say(f"ready: {self.handle.registrar_socket}")

    async def _start(self) -> None:
        c = self.config
        if self.pci is not None:  # real hardware: its first poll, never assumed Healthy
            self.hub.submit(self.pci.name, self.pci.poll())
        else:
            self.source.report()  # every device Healthy before the first stream opens
        if c.kubeconfig is not None or c.in_cluster:
            from drahealth.kube import make_client

            self.client = make_client(c.kubeconfig)
        self.handle = await start(
            self.driver, self.plugin_options(), health=self.hub, resources=self.resources
        )
        if self.pci is not None:
            from drahealth.sources import run_source

            self._tasks.append(asyncio.create_task(run_source(self.hub, self.pci), name="pci"))
        else:
            self._tasks.append(asyncio.create_task(self.source.run(), name="sim-health"))

    def _profile_actions(self) -> dict[str, ControlAction]:
        """The control actions only this profile serves (sim-nvidia: ``xid``)."""
        c = self.config
        if c.profile != "sim-nvidia":
            return {}
        if self.kernel_log is None:
            state_dir = c.state_dir or api.plugin_data_dir(c.driver_name, c.plugins_dir)
            self.kernel_log = KernelLog(c.kernel_log or os.path.join(state_dir, KERNEL_LOG_NAME))
        gpus = {g.name: g.pci_bus_id for g in sim_nvidia_gpus(c.node_name, c.devices)}
        return {"xid": XidAction(self.kernel_log, gpus)}

    def request_stop(self) -> None:
        """Ask :meth:`wait` to return (signal-handler safe)."""
        self._stop.set()

    async def wait(self) -> None:
        """Return when :meth:`request_stop` was called or the plugin stopped."""
        assert self.handle is not None
        stop = asyncio.ensure_future(self._stop.wait())
        done = asyncio.ensure_future(self.handle.wait())
        try:
            await asyncio.wait([stop, done], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            done.cancel()

    async def stop(self) -> None:
        """Stop everything: streams end, sockets are removed. Idempotent."""
        self.hub.close()
        if self.handle is not None:
            await self.handle.stop()
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT (or the plugin stops), then stop."""
        with on_stop_signals(self.request_stop):
            try:
                await self.start()
                await self.wait()
            finally:
                await self.stop()
