"""Public values of the driver toolkit: what a DRA driver implements and receives.

Owns the narrow :class:`Driver` protocol (``prepare`` / ``unprepare``), the values
handed to it (:class:`ClaimRef`, :class:`PreparedClaimRequest`,
:class:`AllocationResult`, :class:`OpaqueConfig`), what it answers
(:class:`PrepareResult`, :class:`PreparedDevice`, :class:`ClaimError` with an
:class:`ErrorKind`), the plugin's :class:`PluginOptions` with their documented
defaults, and the toolkit's errors. Plain values and protocols only: no gRPC
servers, no file or network I/O.

Permanent errors (KEP-5322): the design on the KEP branch adds an ``error_type``
field to ``NodePrepareResourceResponse``; it was never merged and the shipping
``dra/v1`` proto has no such field. The classification therefore lives in the
Python API only (:class:`ErrorKind`, the ``on_device_fault`` callback, metrics).
With ``PluginOptions.enable_error_type_field`` (off by default) the plugin also
sends that field on the wire: a permanent error's ``NodePrepareResourceResponse``
carries ``error_type = 3`` set to ``Permanent`` (1) next to its ``error`` string.
Today's kubelets keep it as an unknown field and ignore it; the error string is the
same either way.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from drahealth import api
from drahealth.core import matches_dns_subdomain

if TYPE_CHECKING:
    import grpc
    from lightkube import AsyncClient
    from lightkube.models.resource_v1 import DeviceToleration
    from lightkube.resources.resource_v1 import ResourceClaim
    from prometheus_client import CollectorRegistry

    from drahealth.driver._control import ControlAction
    from drahealth.driver._publisher import WithdrawMode
    from drahealth.driver._taints import TaintPolicy

__all__ = [
    "AllocationResult",
    "CheckpointError",
    "ClaimError",
    "ClaimRef",
    "ConfigSource",
    "DeviceFaultCallback",
    "Driver",
    "ErrorKind",
    "HealthServiceProvider",
    "OpaqueConfig",
    "PluginOptions",
    "PrepareResult",
    "PreparedClaimRequest",
    "PreparedDevice",
    "RegistrationStatus",
    "base_request",
    "validate_driver_name",
]

#: Default gRPC message size limit for send and receive (16 MiB).
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: Default directory of transient CDI spec files.
DEFAULT_CDI_DIR = "/var/run/cdi"
#: Default CDI class; CDI kinds are ``k8s.<driver>/<class>``.
DEFAULT_CDI_CLASS = "claim"
#: File name of the prepared-claims checkpoint inside the state directory.
CHECKPOINT_NAME = "prepared-claims.json"

_DRIVER_NAME_MAX = 63


def validate_driver_name(name: str) -> str:
    """Return ``name`` if it is a valid DRA driver name, else raise ``ValueError``.

    A driver name is a lowercase DNS subdomain of at most 63 characters (the limit
    the API server and the kubelet enforce for ``driver`` fields).
    """
    if not name:
        raise ValueError("driver name must not be empty")
    if len(name) > _DRIVER_NAME_MAX:
        raise ValueError(
            f"driver name {name!r} is too long: {len(name)} characters, at most "
            f"{_DRIVER_NAME_MAX} allowed"
        )
    if not matches_dns_subdomain(name):
        raise ValueError(
            f"driver name {name!r} is not a DNS subdomain (lowercase letters, digits, "
            "'-' and '.', each label starting and ending with a letter or digit)"
        )
    return name


def base_request(request: str) -> str:
    """The main request name of a result's request: ``"main/sub"`` -> ``"main"``."""
    return request.partition("/")[0]


class ErrorKind(enum.StrEnum):
    """How a per-claim failure should be treated.

    ``TRANSIENT``: retrying may succeed (API errors, device busy, races).
    ``PERMANENT_DEVICE``: the device itself is broken; every claim on it would fail.
    The plugin calls ``PluginOptions.on_device_fault`` so the device can be tainted.
    ``PERMANENT_CONFIG``: this claim can never be prepared (bad opaque config);
    other claims on the same device are unaffected.
    """

    TRANSIENT = "transient"
    PERMANENT_DEVICE = "permanent-device"
    PERMANENT_CONFIG = "permanent-config"

    @property
    def permanent(self) -> bool:
        """Whether retrying the same claim can never succeed."""
        return self is not ErrorKind.TRANSIENT


class ClaimError(Exception):
    """Preparing or unpreparing one claim failed.

    Drivers return it in :class:`PrepareResult` (or raise it from ``prepare`` to
    fail the whole batch with one kind). ``device`` names the ``(pool, device)`` at
    fault for ``PERMANENT_DEVICE`` errors.
    """

    def __init__(
        self,
        message: str,
        kind: ErrorKind = ErrorKind.TRANSIENT,
        *,
        device: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = ErrorKind(kind)
        self.device = device

    def __repr__(self) -> str:
        extra = f", device={self.device!r}" if self.device else ""
        return f"ClaimError({self.message!r}, {self.kind.value!r}{extra})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClaimError):
            return NotImplemented
        return (self.message, self.kind, self.device) == (other.message, other.kind, other.device)

    def __hash__(self) -> int:
        return hash((self.message, self.kind, self.device))


class CheckpointError(Exception):
    """The prepared-claims checkpoint could not be read (corrupt, bad checksum or
    unknown version). The message names the file; by the time this is raised the bad
    file has been moved aside (``quarantined_to``)."""

    def __init__(self, message: str, *, path: str, quarantined_to: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.quarantined_to = quarantined_to


@dataclass(frozen=True, slots=True, order=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepare/NodeUnprepare."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (uid {self.uid})"


class ConfigSource(enum.StrEnum):
    """Where an opaque config of an allocation came from."""

    FROM_CLASS = "FromClass"
    FROM_CLAIM = "FromClaim"


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    """One opaque config of this driver that applies to an allocation result.

    ``parameters`` is the decoded JSON object as stored in the claim; ``requests``
    are the request names the config was restricted to (empty = all requests).
    """

    driver: str
    parameters: Any
    source: ConfigSource
    requests: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AllocationResult:
    """One allocated device of a claim, for this driver.

    ``request`` is the name from the allocation, ``"main"`` or ``"main/sub"`` for
    a prioritized-list subrequest. ``configs`` are this driver's opaque configs that
    apply to the result, lowest precedence first: class configs before claim
    configs, each in API order, so a later entry overrides an earlier one
    (:attr:`parameters` applies that rule for the common merge-nothing case).
    """

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[DeviceToleration, ...] = ()
    configs: tuple[OpaqueConfig, ...] = ()

    @property
    def base_request(self) -> str:
        """The main request name (``"main/sub"`` -> ``"main"``)."""
        return base_request(self.request)

    @property
    def parameters(self) -> Any:
        """Parameters of the winning config (the last one), or ``None`` without configs."""
        return self.configs[-1].parameters if self.configs else None


@dataclass(frozen=True, eq=False)
class PreparedClaimRequest:
    """What the driver gets for one claim to prepare.

    ``claim`` is the full ResourceClaim as fetched from the API (allocated, UID
    checked). ``results`` are the allocation results of *this* driver only, in API
    order, each with its resolved configs.
    """

    claim: ResourceClaim
    results: list[AllocationResult]

    @cached_property
    def ref(self) -> ClaimRef:
        """The claim's identity (computed once: the claim is not changed afterwards)."""
        meta = self.claim.metadata
        assert meta is not None
        return ClaimRef(meta.namespace or "", meta.name or "", meta.uid or "")

    @property
    def uid(self) -> str:
        return self.ref.uid

    @property
    def namespace(self) -> str:
        return self.ref.namespace

    @property
    def name(self) -> str:
        return self.ref.name


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """A device the driver prepared for a claim.

    ``requests`` may be full (``"main/sub"``) names; the plugin strips subrequests
    in replies. ``cdi_device_ids`` are fully qualified CDI ids the driver produced
    itself; the plugin appends the id of the spec it writes (unless CDI is off).
    """

    requests: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str] = field(default_factory=list)
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """Outcome for one claim: devices on success, ``error`` on failure."""

    devices: list[PreparedDevice] | None = None
    error: ClaimError | None = None

    @classmethod
    def ok(cls, devices: Sequence[PreparedDevice]) -> PrepareResult:
        return cls(devices=list(devices))

    @classmethod
    def failed(
        cls,
        message: str,
        kind: ErrorKind = ErrorKind.TRANSIENT,
        *,
        device: tuple[str, str] | None = None,
    ) -> PrepareResult:
        return cls(error=ClaimError(message, kind, device=device))


@runtime_checkable
class Driver(Protocol):
    """What a DRA driver implements. Both calls get batches and must answer every
    claim of the batch by UID (a missing entry counts as a transient failure).

    ``prepare`` must be idempotent. ``unprepare`` may be called for claims that were
    never prepared or are unknown to the driver (answer ``None`` = success); it gets
    only the claim's identity because the claim may be gone from the API. Raising
    from either call fails every claim of that batch (a raised :class:`ClaimError`
    keeps its kind).
    """

    async def prepare(
        self, claims: Sequence[PreparedClaimRequest]
    ) -> Mapping[str, PrepareResult]: ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]: ...


class HealthServiceProvider(Protocol):
    """Something that serves dra-health on the DRA socket (``HealthHub``).

    ``add_to_server`` registers its services and returns the registration strings
    to advertise after the DRA services (possibly none).
    """

    def add_to_server(self, server: grpc.aio.Server) -> list[str]: ...


#: ``on_device_fault(pool, device, message)``; may be a plain function or a coroutine.
DeviceFaultCallback = Callable[[str, str, str], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class RegistrationStatus:
    """What the kubelet said in ``NotifyRegistrationStatus``."""

    plugin_registered: bool
    error: str = ""


@dataclass(frozen=True)
class PluginOptions:
    """Every knob of the kubelet plugin, with the Go helper's defaults.

    ``driver_name``: DRA driver name (DNS subdomain, at most 63 characters).
    ``node_name``: this node (informational: logs and metrics).
    ``registry_dir``: kubelet plugin registry, watched by the kubelet
    (default ``/var/lib/kubelet/plugins_registry``).
    ``plugins_dir``: parent of the plugin data dir ``<plugins_dir>/<driver>`` that
    holds the DRA socket (default ``/var/lib/kubelet/plugins``).
    ``cdi_dir``: where transient CDI specs go (default ``/var/run/cdi``); ``None``
    turns CDI generation off (the driver writes its own specs).
    ``cdi_class``: class part of the CDI kind ``k8s.<driver>/<class>`` (``claim``).
    ``state_dir``: checkpoint and lock directory (default: the plugin data dir,
    which rolling-update instances share).
    ``pod_uid``: rolling-update mode: sockets named with the pod UID
    (``<driver>-<podUID>-reg.sock``, ``dra-<podUID>.sock``) and an ``flock`` on
    ``<state_dir>/serialize.lock`` on top of the in-process lock.
    ``serialize``: run prepare/unprepare one at a time (default ``True``).
    ``kube_client``: lightkube ``AsyncClient`` for claim GETs; ``None`` = no API
    access (every prepare fails per claim with a clear message).
    ``claim_cache``: watch ResourceClaims (all namespaces) and answer a prepare from
    the watch cache when it holds the claim with the requested UID, an allocation and
    at least one reservation; anything else falls back to the GET (default ``False``:
    one GET per claim, as the Go helper does). Costs one watch and the memory of the
    cluster's claims.
    ``socket_mode`` / ``socket_group``: permissions of both sockets (``0o600``,
    group unchanged). ``max_message_bytes``: gRPC send/receive limit (16 MiB).
    ``enable_error_type_field``: see the module docstring (KEP-5322, not merged).
    ``on_device_fault``: called with ``(pool, device, message)`` for every
    ``PERMANENT_DEVICE`` error (the glue taints the device).
    ``metrics_registry``: prometheus registry for the claim-operation counter and,
    from :func:`start`, every other ``drahealth_driver_*`` family (a new one when
    ``None``; see ``handle.metrics``).

    What :func:`start` runs beside the sockets (docs/driver.md, "PluginOptions"):

    ``serve_health``: advertise and serve the hub's dra-health services on the DRA
    socket (``True``); ``False`` keeps the hub for the control socket, taints and
    metrics only (a driver that, like NVIDIA's, streams no health).
    ``health_taints``: with a hub and published resources, turn latched faults into
    ResourceSlice device taints (``True``). ``taint_policy``: how (``None``:
    ``TaintPolicy(driver_name)``, i.e. ``<driver>/unhealthy`` with effect
    **NoSchedule**; ``NoExecute`` only when you choose it, see the docs on eviction).
    ``withdraw_unhealthy``: ``"never"`` (default), ``"auto"`` or ``"always"``: leave
    tainted devices out of the slices (``ResourceSlicePublisher``).
    ``report_device_faults``: with a hub, every ``PERMANENT_DEVICE`` prepare error is
    also a fatal report from source ``"prepare"`` (``True``), so it latches and taints.
    ``refuse_unhealthy``: with a hub, a claim with a device latched Unhealthy (or one
    the hub does not know) fails before the driver is called (``False``).
    ``control_socket``: with a hub, serve ``<state_dir>/control.sock`` for
    ``drahealth inject`` and operator recovery (``True``); ``control_actions``: extra
    actions by name (:class:`ControlAction`).
    ``claim_status``: with a hub and ``kube_client``, write device health into
    prepared claims' ``status.devices`` (``False``; :class:`ClaimStatusWriter`).
    ``metrics_port``: serve ``/metrics`` and ``/healthz`` on ``metrics_host``
    (``127.0.0.1``) at this port (``None``: not served; 0: any free port).
    ``stop_on_signals``: SIGTERM/SIGINT stop the plugin (``False``; see
    :func:`install_signal_handlers`).
    """

    driver_name: str
    node_name: str = ""
    registry_dir: str = api.KUBELET_REGISTRY_DIR
    plugins_dir: str = api.KUBELET_PLUGINS_DIR
    cdi_dir: str | None = DEFAULT_CDI_DIR
    cdi_class: str = DEFAULT_CDI_CLASS
    state_dir: str | None = None
    pod_uid: str | None = None
    serialize: bool = True
    kube_client: AsyncClient | None = None
    claim_cache: bool = False
    socket_mode: int = 0o600
    socket_group: int | str | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    enable_error_type_field: bool = False
    on_device_fault: DeviceFaultCallback | None = None
    metrics_registry: CollectorRegistry | None = None
    serve_health: bool = True
    health_taints: bool = True
    taint_policy: TaintPolicy | None = None
    withdraw_unhealthy: WithdrawMode = "never"
    report_device_faults: bool = True
    refuse_unhealthy: bool = False
    control_socket: bool = True
    control_actions: Mapping[str, ControlAction] = field(default_factory=dict)
    claim_status: bool = False
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    stop_on_signals: bool = False

    def __post_init__(self) -> None:
        validate_driver_name(self.driver_name)
        if self.metrics_port is not None and (
            isinstance(self.metrics_port, bool)
            or not isinstance(self.metrics_port, int)
            or not 0 <= self.metrics_port <= 65535
        ):
            raise ValueError(
                f"metrics_port must be a port number from 0 to 65535 or None, "
                f"got {self.metrics_port!r}"
            )
        if self.withdraw_unhealthy not in ("never", "auto", "always"):
            raise ValueError(
                f"withdraw_unhealthy {self.withdraw_unhealthy!r}: choose one of never, auto, always"
            )
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?", self.cdi_class):
            raise ValueError(
                f"cdi_class {self.cdi_class!r} is not a valid CDI class "
                "(letters, digits, '-' and '_', starting and ending with a letter or digit)"
            )
        if self.max_message_bytes <= 0:
            raise ValueError(f"max_message_bytes must be positive, got {self.max_message_bytes}")
        for label, path in (
            ("DRA socket", self.dra_socket),
            ("registration socket", self.registrar_socket),
        ):
            if len(path.encode()) >= api.UNIX_PATH_MAX:
                raise ValueError(
                    f"{label} path {path!r} is {len(path.encode())} bytes; unix socket "
                    f"paths must be shorter than {api.UNIX_PATH_MAX} bytes"
                )

    @property
    def data_dir(self) -> str:
        """The plugin data dir, ``<plugins_dir>/<driver>``."""
        return api.plugin_data_dir(self.driver_name, self.plugins_dir)

    @property
    def effective_state_dir(self) -> str:
        return self.state_dir if self.state_dir is not None else self.data_dir

    @property
    def dra_socket(self) -> str:
        return api.dra_socket_path(self.driver_name, self.plugins_dir, self.pod_uid)

    @property
    def registrar_socket(self) -> str:
        return api.registrar_socket_path(self.driver_name, self.registry_dir, self.pod_uid)

    @property
    def checkpoint_path(self) -> str:
        return f"{self.effective_state_dir}/{CHECKPOINT_NAME}"

    @property
    def lock_path(self) -> str:
        return f"{self.effective_state_dir}/{api.SERIALIZE_LOCK_NAME}"
