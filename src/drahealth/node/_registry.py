"""The plugin registry: registered DRA plugin instances, their DRA clients and health streams.

Owns :class:`PluginRegistry` (the watcher's
:class:`~drahealth.node._types.RegistrationHandler`), :class:`DRAClient` (the
``NodePrepareResources`` / ``NodeUnprepareResources`` calls of one instance) and
:class:`PrepareReply`. It does not read the health cache or pods: health reports go
to the ``on_report`` callback, tagged with their driver.

Rules (reference sections 1.4, 2.3, 2.4 and 3, fixes 6, 7 and 20 of section 9):

* Registration picks the DRA service version the plugin lists first among those
  this node speaks (``v1.DRAPlugin``, ``v1beta1.DRAPlugin``); errors are worded as
  the kubelet words them. Instances of one driver are kept in registration order;
  the same endpoint twice is refused, different endpoints coexist (rolling update).
* One ``grpc.aio`` channel per instance (``unix:<endpoint>``), shared by the DRA
  calls and the health stream, kept connected (a dropped connection is re-dialled
  at once, as the kubelet does on ``ConnEnd``). DRA calls go to the newest
  connected instance, else to the newest.
* One authoritative health stream per driver: the newest registered instance's,
  opened only if it advertises a dra-health version the node speaks (``health_services``:
  a kubelet before 1.37 speaks only v1alpha1; a driver serving only v1 then gives no
  health, which is logged once per driver). Each activation starts a new
  generation (per driver, never reused); every report is delivered only while its
  stream's generation is the current one, so an older stream, even with a message
  in flight, can never overwrite the newer instance's health. Removing the active
  instance hands health to the newest remaining one (upstream's PR deactivates);
  removing the last, or registering a newest instance without health, deactivates.
* Nothing is cleared when a stream stops or an instance goes away (upstream clears
  the whole driver); leases decide when silent devices turn Unknown.
* State changes happen synchronously before any ``await``, so a stream is always
  registered before anyone can try to stop it (no start race).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import grpc
from google.protobuf.unknown_fields import UnknownFieldSet

from drahealth import api
from drahealth.core import PreparedDeviceInfo, ReportedDevice, positive_seconds
from drahealth.kube import Backoff
from drahealth.node._stream import HealthStream, pick_health_service
from drahealth.node._types import PluginInfo, RegistrationError
from drahealth.node._validation import go_quote_list

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DRAClient",
    "DriverNotRegisteredError",
    "PluginRegistry",
    "PrepareReply",
    "StreamFactory",
    "negotiate_dra_service",
]

log = logging.getLogger(__name__)

#: The kubelet's per-call timeout for NodePrepareResources / NodeUnprepareResources.
DEFAULT_CALL_TIMEOUT: Final = 45.0

#: Channel options of an instance: reconnect quickly after a plugin restart.
#: Largest gRPC message the agent takes from or sends to a plugin (as the toolkit's servers).
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024

_CHANNEL_OPTIONS: Final[list[tuple[str, Any]]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 5000),
    ("grpc.use_local_subchannel_pool", 1),
]

#: Registration string -> (proto module, prepare method, unprepare method).
_DRA: Final[dict[str, tuple[Any, str, str]]] = {
    api.DRA_PLUGIN_V1: (api.dra_v1, api.NODE_PREPARE_V1_METHOD, api.NODE_UNPREPARE_V1_METHOD),
    api.DRA_PLUGIN_V1BETA1: (
        api.dra_v1beta1,
        api.NODE_PREPARE_V1BETA1_METHOD,
        api.NODE_UNPREPARE_V1BETA1_METHOD,
    ),
}

ClaimRefTuple = tuple[str, str, str]


class DriverNotRegisteredError(LookupError):
    """No instance of the DRA driver is registered."""


def negotiate_dra_service(versions: Sequence[str]) -> str:
    """The DRA service to use: the first of the plugin's ``versions`` this node speaks.

    Raises :class:`RegistrationError` with the kubelet's texts for an empty list or
    a list without a supported DRA service (health entries are ignored here).
    """
    if isinstance(versions, str):
        raise TypeError("versions must be a sequence of registration strings, not one string")
    if not versions:
        raise RegistrationError("empty list of supported gRPC services (aka supported versions)")
    for version in versions:
        if version in _DRA:
            return version
    raise RegistrationError(
        f"none of services supported by the plugin ({go_quote_list(versions)}) "
        f"are supported by the kubelet ({go_quote_list(api.DRA_PLUGIN_SERVICES)})"
    )


def _error_type(message: Any) -> int:
    """The KEP-5322 ``error_type`` (field 3, varint) of a per-claim prepare reply.

    The field is not in the generated message, so it is read from the unknown
    fields; absent -> 0 (Unknown).
    """
    fields = UnknownFieldSet(message)
    value = api.PREPARE_ERROR_TYPE_UNKNOWN
    for i in range(len(fields)):
        field = fields[i]
        if field.field_number == api.PREPARE_ERROR_TYPE_FIELD and field.wire_type == 0:
            value = int(field.data)  # last occurrence wins, as for a scalar field
    return value


@dataclass(frozen=True, slots=True)
class PrepareReply:
    """One claim's answer to ``NodePrepareResources``.

    ``devices`` carry the driver name. ``error`` is empty on success. ``permanent``
    is True only for a failed claim whose reply carries the KEP-5322 field
    ``error_type`` = Permanent (1).
    """

    devices: tuple[PreparedDeviceInfo, ...] = ()
    error: str = ""
    permanent: bool = False


def _check_claims(claims: Sequence[ClaimRefTuple]) -> list[ClaimRefTuple]:
    if isinstance(claims, str | bytes):
        raise TypeError("claims must be a sequence of (namespace, name, uid) tuples")
    out = []
    for i, claim in enumerate(claims):
        if not (
            isinstance(claim, tuple) and len(claim) == 3 and all(isinstance(x, str) for x in claim)
        ):
            raise ValueError(f"claims[{i}] must be a (namespace, name, uid) tuple of strings")
        namespace, name, uid = claim
        for what, value in (("namespace", namespace), ("name", name), ("uid", uid)):
            if not value:
                raise ValueError(f"claims[{i}]: {what} must not be empty")
        out.append(claim)
    return out


class DRAClient:
    """DRA node calls to one plugin instance, in its negotiated version.

    ``service`` is ``v1.DRAPlugin`` or ``v1beta1.DRAPlugin``; ``timeout`` applies
    to each call (kubelet: 45 s). A failed call (the plugin is unreachable, times
    out, or answers with a gRPC error) does not raise: every claim of the batch gets
    a transient error naming the call and the gRPC status. Claims the plugin leaves
    out of its answer are left out of the result.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        driver: str,
        endpoint: str,
        service: str,
        timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        spec = _DRA.get(service)
        if spec is None:
            raise ValueError(f"unknown DRA service {service!r}: expected one of {sorted(_DRA)}")
        timeout = positive_seconds("timeout", timeout)
        self.driver = driver
        self.endpoint = endpoint
        self.service = service
        self.timeout = float(timeout)
        self._pb, prepare_method, unprepare_method = spec
        self._prepare: grpc.aio.UnaryUnaryMultiCallable[Any, Any] = channel.unary_unary(
            prepare_method,
            request_serializer=self._pb.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=self._pb.NodePrepareResourcesResponse.FromString,
        )
        self._unprepare: grpc.aio.UnaryUnaryMultiCallable[Any, Any] = channel.unary_unary(
            unprepare_method,
            request_serializer=self._pb.NodeUnprepareResourcesRequest.SerializeToString,
            response_deserializer=self._pb.NodeUnprepareResourcesResponse.FromString,
        )
        #: True after a call got an answer, False after one could not reach the plugin.
        self.last_call_ok = False
        #: Set when the instance was deregistered: calls fail without being sent.
        self.closed = False

    def _request(self, request_type: Any, claims: list[ClaimRefTuple]) -> Any:
        return request_type(
            claims=[self._pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )

    async def _call(
        self, method: grpc.aio.UnaryUnaryMultiCallable[Any, Any], name: str, request: Any
    ) -> tuple[Any, str]:
        """(response, "") or (None, error text for every claim)."""
        if self.closed:
            return None, (
                f"{name} failed: DRA driver {self.driver} plugin at {self.endpoint} "
                "is no longer registered"
            )
        try:
            response = await method(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self.last_call_ok = False
            return None, f"{name} failed: {exc.code().name}: {exc.details()}"
        self.last_call_ok = True
        return response, ""

    async def prepare(self, claims: Sequence[ClaimRefTuple]) -> dict[str, PrepareReply]:
        """``NodePrepareResources`` for ``(namespace, name, uid)`` claims -> uid -> reply."""
        refs = _check_claims(claims)
        if not refs:
            return {}
        request = self._request(self._pb.NodePrepareResourcesRequest, refs)
        response, failure = await self._call(self._prepare, "NodePrepareResources", request)
        if response is None:
            return {uid: PrepareReply(error=failure) for _, _, uid in refs}
        wanted = {uid for _, _, uid in refs}
        replies: dict[str, PrepareReply] = {}
        for uid, claim in response.claims.items():
            if uid not in wanted:
                log.warning(
                    "DRA driver %s answered NodePrepareResources for claim %s it was not asked "
                    "about; ignored",
                    self.driver,
                    uid,
                )
                continue
            if claim.error:
                permanent = _error_type(claim) == api.PREPARE_ERROR_TYPE_PERMANENT
                replies[uid] = PrepareReply(error=claim.error, permanent=permanent)
                continue
            devices = tuple(
                PreparedDeviceInfo(
                    driver=self.driver,
                    pool=d.pool_name,
                    device=d.device_name,
                    request_names=tuple(d.request_names),
                    cdi_device_ids=tuple(d.cdi_device_ids),
                )
                for d in claim.devices
            )
            replies[uid] = PrepareReply(devices=devices)
        return replies

    async def unprepare(self, claims: Sequence[ClaimRefTuple]) -> dict[str, str]:
        """``NodeUnprepareResources`` -> uid -> error text ("" on success)."""
        refs = _check_claims(claims)
        if not refs:
            return {}
        request = self._request(self._pb.NodeUnprepareResourcesRequest, refs)
        response, failure = await self._call(self._unprepare, "NodeUnprepareResources", request)
        if response is None:
            return {uid: failure for _, _, uid in refs}
        wanted = {uid for _, _, uid in refs}
        return {uid: claim.error for uid, claim in response.claims.items() if uid in wanted}


class StreamFactory(Protocol):
    """How the registry creates a health stream (``HealthStream`` or a test double)."""

    def __call__(
        self,
        channel: grpc.aio.Channel,
        service: str,
        *,
        driver: str,
        on_report: Callable[[list[ReportedDevice]], None],
        default_timeout: float,
        backoff: Backoff | None,
    ) -> HealthStream: ...


class _Instance:
    """One registered plugin instance: its channel, DRA client and connection monitor."""

    def __init__(self, info: PluginInfo, service: str, timeout: float) -> None:
        self.info = info
        self.channel = grpc.aio.insecure_channel(f"unix:{info.endpoint}", options=_CHANNEL_OPTIONS)
        self.client = DRAClient(
            self.channel,
            driver=info.driver,
            endpoint=info.endpoint,
            service=service,
            timeout=timeout,
        )
        self.monitor = asyncio.get_running_loop().create_task(
            self._keep_connected(), name=f"dra-conn-{info.driver}"
        )

    @property
    def connected(self) -> bool:
        """READY, or IDLE with the last call answered and no drop seen since."""
        state = self.channel.get_state(try_to_connect=False)
        if state == grpc.ChannelConnectivity.READY:
            return True
        return state == grpc.ChannelConnectivity.IDLE and self.client.last_call_ok

    async def _keep_connected(self) -> None:
        state = self.channel.get_state(try_to_connect=True)
        while True:
            await self.channel.wait_for_state_change(state)
            previous, state = state, self.channel.get_state(try_to_connect=False)
            if previous == grpc.ChannelConnectivity.READY:
                self.client.last_call_ok = False  # the connection dropped
            if state == grpc.ChannelConnectivity.IDLE:
                state = self.channel.get_state(try_to_connect=True)
            elif state == grpc.ChannelConnectivity.SHUTDOWN:
                return

    async def close(self) -> None:
        self.client.closed = True
        self.monitor.cancel()
        await asyncio.gather(self.monitor, return_exceptions=True)
        await self.channel.close(None)


@dataclass(frozen=True, slots=True)
class _Active:
    """The authoritative health stream of a driver."""

    instance: _Instance
    generation: int
    service: str
    stream: HealthStream


class PluginRegistry:
    """Registered DRA plugin instances per driver (see the module docstring).

    ``on_report(driver, devices)`` receives every message of each driver's
    authoritative stream (on the event loop; it must not block).
    ``health_enabled=False`` (the kubelet's ``ResourceHealthStatus`` gate off) never
    opens a stream. ``default_timeout`` is the streams' default lease.
    ``on_event(driver, kind, generation)`` is told ``"activate"`` when a new
    generation becomes authoritative and ``"deactivate"`` when a driver's health
    ends without a successor (a handover to a newer generation is only its
    ``activate``). ``health_services``: the dra-health services this node speaks
    (default both, v1 preferred). ``stream_factory`` and ``backoff_factory`` (one fresh
    backoff per stream) are for tests and tuning; ``call_timeout`` bounds each DRA call.
    """

    def __init__(
        self,
        *,
        on_report: Callable[[str, list[ReportedDevice]], object],
        health_enabled: bool = True,
        default_timeout: float = 30.0,
        on_event: Callable[[str, str, int], None] | None = None,
        stream_factory: StreamFactory = HealthStream,
        backoff_factory: Callable[[], Backoff] | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        health_services: Sequence[str] = api.DRA_HEALTH_SERVICES,
    ) -> None:
        unknown = sorted(set(health_services) - set(api.DRA_HEALTH_SERVICES))
        if isinstance(health_services, str) or unknown or not health_services:
            raise ValueError(
                f"health_services {health_services!r}: choose among "
                f"{', '.join(api.DRA_HEALTH_SERVICES)}"
            )
        self.health_services = tuple(health_services)
        self._unspoken_logged: set[str] = set()
        default_timeout = positive_seconds("default_timeout", default_timeout)
        call_timeout = positive_seconds("call_timeout", call_timeout)
        self._on_report = on_report
        self.health_enabled = health_enabled
        self.default_timeout = float(default_timeout)
        self._on_event = on_event
        self._stream_factory = stream_factory
        self._backoff_factory = backoff_factory
        self.call_timeout = float(call_timeout)
        self._instances: dict[str, list[_Instance]] = {}
        self._active: dict[str, _Active] = {}
        self._generations: dict[str, int] = {}
        self._closed = False
        #: Reports dropped because their stream's generation was no longer current.
        self.fenced_reports = 0

    # -- RegistrationHandler -----------------------------------------------------------

    async def register(self, info: PluginInfo) -> None:
        """Add an instance; raises :class:`RegistrationError` with the kubelet's texts."""
        if self._closed:
            raise RegistrationError("the DRA plugin registry is shut down")
        service = negotiate_dra_service(info.versions)
        if not info.endpoint:
            raise RegistrationError(f"empty endpoint for DRA driver plugin {info.driver}")
        instances = self._instances.get(info.driver, [])
        if any(inst.info.endpoint == info.endpoint for inst in instances):
            raise RegistrationError(
                f"endpoint {info.endpoint} already registered for DRA driver plugin {info.driver}"
            )
        instance = _Instance(info, service, self.call_timeout)
        self._instances.setdefault(info.driver, []).append(instance)
        log.info(
            "DRA driver %s: registered instance at %s (%s, instance %d)",
            info.driver,
            info.endpoint,
            service,
            len(self._instances[info.driver]),
        )
        retired = self._reconcile(info.driver)
        await self._stop_streams(retired)

    async def deregister(self, info: PluginInfo) -> None:
        """Remove the instance with ``info``'s driver and endpoint (unknown: no-op)."""
        instances = self._instances.get(info.driver, [])
        instance = next((i for i in instances if i.info.endpoint == info.endpoint), None)
        if instance is None:
            log.debug("DRA driver %s: no instance at %s to deregister", info.driver, info.endpoint)
            return
        instances.remove(instance)
        if not instances:
            del self._instances[info.driver]
        log.info("DRA driver %s: deregistered instance at %s", info.driver, info.endpoint)
        retired = self._reconcile(info.driver)
        await self._stop_streams(retired)
        await instance.close()

    # -- queries -----------------------------------------------------------------------

    def drivers(self) -> list[str]:
        """Drivers with at least one registered instance, sorted."""
        return sorted(self._instances)

    def instances(self, driver: str) -> list[PluginInfo]:
        """The driver's instances in registration order (empty if none)."""
        return [inst.info for inst in self._instances.get(driver, [])]

    def dra_client(self, driver: str) -> DRAClient:
        """The client of the newest connected instance, else of the newest one.

        Raises :class:`DriverNotRegisteredError` (a ``LookupError``) with the
        kubelet's text "DRA driver <name> is not registered".
        """
        instances = self._instances.get(driver)
        if not instances:
            raise DriverNotRegisteredError(f"DRA driver {driver} is not registered")
        for instance in reversed(instances):
            if instance.connected:
                return instance.client
        return instances[-1].client

    def active_health(self, driver: str) -> tuple[PluginInfo, int, str] | None:
        """(instance, generation, health service) of the driver's authoritative stream."""
        active = self._active.get(driver)
        if active is None:
            return None
        return active.instance.info, active.generation, active.service

    def stream(self, driver: str) -> HealthStream | None:
        """The driver's authoritative health stream, if any."""
        active = self._active.get(driver)
        return None if active is None else active.stream

    def generation(self, driver: str) -> int:
        """The driver's latest generation number (0 before its first activation)."""
        return self._generations.get(driver, 0)

    async def close(self) -> None:
        """Stop every stream and close every channel (no events); refuses new plugins."""
        self._closed = True
        streams = [active.stream for active in self._active.values()]
        self._active.clear()
        instances = [inst for group in self._instances.values() for inst in group]
        self._instances.clear()
        await self._stop_streams(streams)
        await asyncio.gather(*(inst.close() for inst in instances))

    # -- internals ---------------------------------------------------------------------

    def _reconcile(self, driver: str) -> list[HealthStream]:
        """Make the newest instance authoritative; returns streams to stop. No awaits."""
        instances = self._instances.get(driver, [])
        newest = instances[-1] if instances else None
        active = self._active.get(driver)
        if active is not None and active.instance is newest:
            return []
        retired: list[HealthStream] = []
        if active is not None:
            del self._active[driver]
            retired.append(active.stream)
        service = None
        if newest is not None and self.health_enabled:
            service = pick_health_service(newest.info.versions, self.health_services)
            if service is None:
                self._log_unspoken(newest.info)
        if newest is not None and service is not None:
            generation = self._generations.get(driver, 0) + 1
            self._generations[driver] = generation
            stream = self._stream_factory(
                newest.channel,
                service,
                driver=driver,
                on_report=self._deliverer(driver, generation),
                default_timeout=self.default_timeout,
                backoff=self._backoff_factory() if self._backoff_factory else None,
            )
            self._active[driver] = _Active(newest, generation, service, stream)
            stream.start()
            log.info(
                "DRA driver %s: health generation %d from %s (%s)",
                driver,
                generation,
                newest.info.endpoint,
                service,
            )
            self._event(driver, "activate", generation)
        elif active is not None:
            why = "no instance left" if newest is None else "the newest instance has no health"
            log.info(
                "DRA driver %s: health generation %d ended (%s)", driver, active.generation, why
            )
            self._event(driver, "deactivate", active.generation)
        return retired

    def _log_unspoken(self, info: PluginInfo) -> None:
        """A plugin advertising only dra-health versions this node does not speak."""
        offered = [v for v in info.versions if v in api.DRA_HEALTH_SERVICES]
        if not offered or info.driver in self._unspoken_logged:
            return
        self._unspoken_logged.add(info.driver)
        log.warning(
            "DRA driver %s serves %s, which this node does not call (it speaks %s, as the "
            "kubelet of its Kubernetes release): no device health from this driver",
            info.driver,
            ", ".join(offered),
            ", ".join(self.health_services),
        )

    def _deliverer(self, driver: str, generation: int) -> Callable[[list[ReportedDevice]], None]:
        def deliver(devices: list[ReportedDevice]) -> None:
            active = self._active.get(driver)
            if active is None or active.generation != generation:
                self.fenced_reports += 1
                log.debug(
                    "DRA driver %s: dropped a report of retired health generation %d",
                    driver,
                    generation,
                )
                return
            self._on_report(driver, devices)

        return deliver

    def _event(self, driver: str, kind: str, generation: int) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(driver, kind, generation)
        except Exception:
            log.exception("health event callback failed for DRA driver %s", driver)

    @staticmethod
    async def _stop_streams(streams: Sequence[HealthStream]) -> None:
        if streams:
            await asyncio.gather(*(stream.stop() for stream in streams))
