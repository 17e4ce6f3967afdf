"""The kubelet plugin: registration and DRA node servers on unix sockets.

Owns the Python counterpart of the Go ``kubeletplugin.Start``: one entry point,
:func:`start`, that binds the DRA socket (``DRAPlugin`` v1 and v1beta1 from one
implementation, plus dra-health services from an optional provider), then the
registration socket, and returns a :class:`PluginHandle` (registration status,
``stop()``, ``wait()``). Also owns socket hygiene (stale sockets replaced, other
files refused, permissions, removal on stop) and SIGTERM/SIGINT handling.
Prepare/unprepare logic lives in ``_prepare``; this module only converts protos.
What runs beside the sockets (slices, taints, control socket, metrics) is assembled
by ``_services`` from the options and stopped with the handle.

Typical use::

    handle = await start(
        MyDriver(hub),
        PluginOptions("gpu.example.com", node_name=node, kube_client=client,
                      stop_on_signals=True),
        health=hub,
        resources=Pool(devices),
    )
    await handle.wait()
"""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from drahealth import api
from drahealth._metrics_http import MetricsServer
from drahealth.driver._claim_status import ClaimStatusWriter
from drahealth.driver._control import ControlServer
from drahealth.driver._hub import HealthHub
from drahealth.driver._metrics import DriverMetrics
from drahealth.driver._prepare import ClaimPreparer, error_type_field, format_error
from drahealth.driver._publisher import ResourceSlicePublisher
from drahealth.driver._services import DriverServices
from drahealth.driver._slices import DriverResources, Pool
from drahealth.driver._sockfile import clear_stale_socket, remove_own_socket
from drahealth.driver._taints import TaintController
from drahealth.driver._types import (
    ClaimRef,
    Driver,
    HealthServiceProvider,
    PluginOptions,
    PrepareResult,
    RegistrationStatus,
)

__all__ = [
    "DRAPluginServer",
    "PluginHandle",
    "RegistrationServer",
    "install_signal_handlers",
    "start",
]

log = logging.getLogger("drahealth.driver.plugin")

_Context = grpc.aio.ServicerContext[Any, Any]


class DRAPluginServer:
    """The DRA node service, served as ``...dra.v1.DRAPlugin`` and
    ``...dra.v1beta1.DRAPlugin`` from one implementation (v1beta1 replies have no
    ``share_id``)."""

    def __init__(self, preparer: ClaimPreparer, *, enable_error_type_field: bool = False) -> None:
        self.preparer = preparer
        self._error_type = enable_error_type_field

    def add_to_server(self, server: grpc.aio.Server) -> None:
        api.dra_v1_grpc.add_DRAPluginServicer_to_server(_V1Servicer(self), server)
        api.dra_v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1Servicer(self), server)

    async def prepare(self, claims: Sequence[Any]) -> dict[str, PrepareResult]:
        return await self.preparer.prepare([_ref(c) for c in claims])

    async def unprepare(self, claims: Sequence[Any]) -> dict[str, str]:
        errors = await self.preparer.unprepare([_ref(c) for c in claims])
        return {uid: "" if e is None else format_error(e) for uid, e in errors.items()}

    def error_text(self, result: PrepareResult) -> str:
        return "" if result.error is None else format_error(result.error)

    def error_type(self, result: PrepareResult) -> bytes:
        """Encoded ``error_type`` field to merge into the claim's reply (opt-in)."""
        if not self._error_type or result.error is None:
            return b""
        return error_type_field(result.error)


def _ref(claim: Any) -> ClaimRef:
    return ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid)


#: Version module -> whether its ``Device`` has ``share_id`` (looked up once each).
_HAS_SHARE_ID: dict[Any, bool] = {}


async def _prepare_reply(server: DRAPluginServer, pb: Any, claims: Sequence[Any]) -> Any:
    """Build a ``NodePrepareResourcesResponse`` of the version module ``pb``.

    ``share_id`` is set only where the version has the field (v1).
    """
    has_share_id = _HAS_SHARE_ID.get(pb)
    if has_share_id is None:
        has_share_id = _HAS_SHARE_ID[pb] = "share_id" in pb.Device.DESCRIPTOR.fields_by_name
    resp = pb.NodePrepareResourcesResponse()
    for uid, result in (await server.prepare(claims)).items():
        out = resp.claims[uid]
        if result.error is not None:
            out.error = server.error_text(result)
            # Not in the generated message: kept as an unknown field, sent as is.
            if extra := server.error_type(result):
                out.MergeFromString(extra)
            continue
        for d in result.devices or ():
            dev = out.devices.add(
                request_names=d.requests,
                pool_name=d.pool,
                device_name=d.device,
                cdi_device_ids=d.cdi_device_ids,
            )
            if has_share_id and d.share_id is not None:
                dev.share_id = d.share_id
    return resp


async def _unprepare_reply(server: DRAPluginServer, pb: Any, claims: Sequence[Any]) -> Any:
    resp = pb.NodeUnprepareResourcesResponse()
    for uid, error in (await server.unprepare(claims)).items():
        resp.claims[uid].error = error
    return resp


class _V1Servicer(api.dra_v1_grpc.DRAPluginServicer):
    def __init__(self, server: DRAPluginServer) -> None:
        self._s = server

    async def NodePrepareResources(
        self, request: api.dra_v1.NodePrepareResourcesRequest, context: _Context
    ) -> api.dra_v1.NodePrepareResourcesResponse:
        reply: api.dra_v1.NodePrepareResourcesResponse
        reply = await _prepare_reply(self._s, api.dra_v1, request.claims)
        return reply

    async def NodeUnprepareResources(
        self, request: api.dra_v1.NodeUnprepareResourcesRequest, context: _Context
    ) -> api.dra_v1.NodeUnprepareResourcesResponse:
        reply: api.dra_v1.NodeUnprepareResourcesResponse
        reply = await _unprepare_reply(self._s, api.dra_v1, request.claims)
        return reply


class _V1beta1Servicer(api.dra_v1beta1_grpc.DRAPluginServicer):
    def __init__(self, server: DRAPluginServer) -> None:
        self._s = server

    async def NodePrepareResources(
        self, request: api.dra_v1beta1.NodePrepareResourcesRequest, context: _Context
    ) -> api.dra_v1beta1.NodePrepareResourcesResponse:
        reply: api.dra_v1beta1.NodePrepareResourcesResponse
        reply = await _prepare_reply(self._s, api.dra_v1beta1, request.claims)
        return reply

    async def NodeUnprepareResources(
        self, request: api.dra_v1beta1.NodeUnprepareResourcesRequest, context: _Context
    ) -> api.dra_v1beta1.NodeUnprepareResourcesResponse:
        reply: api.dra_v1beta1.NodeUnprepareResourcesResponse
        reply = await _unprepare_reply(self._s, api.dra_v1beta1, request.claims)
        return reply


class RegistrationServer(api.registration_grpc.RegistrationServicer):
    """``pluginregistration.Registration`` for one DRA plugin."""

    def __init__(
        self,
        driver_name: str,
        endpoint: str,
        supported_versions: Sequence[str],
        on_status: Callable[[RegistrationStatus], None],
    ) -> None:
        self._info = api.registration.PluginInfo(
            type=api.DRA_PLUGIN_TYPE,
            name=driver_name,
            endpoint=endpoint,
            supported_versions=list(supported_versions),
        )
        self._on_status = on_status

    async def GetInfo(
        self, request: api.registration.InfoRequest, context: _Context
    ) -> api.registration.PluginInfo:
        return self._info

    async def NotifyRegistrationStatus(
        self, request: api.registration.RegistrationStatus, context: _Context
    ) -> api.registration.RegistrationStatusResponse:
        self._on_status(RegistrationStatus(request.plugin_registered, request.error))
        return api.registration.RegistrationStatusResponse()


class _Socket:
    """One listening unix socket file: stale-file handling, permissions, removal."""

    def __init__(self, path: str, mode: int, gid: int | None) -> None:
        self.path = os.path.abspath(path)
        self._mode = mode
        self._gid = gid
        self._ino: int | None = None

    def clear(self) -> None:
        """Remove a stale socket at the path; refuse anything that is not a socket."""
        if clear_stale_socket(self.path):
            log.info("removing stale socket %s", self.path)

    async def serve(self, server: grpc.aio.Server) -> None:
        self.clear()
        try:
            server.add_insecure_port(f"unix://{self.path}")
        except RuntimeError as exc:
            raise OSError(f"cannot listen on unix socket {self.path}: {exc}") from exc
        await server.start()
        st = os.stat(self.path)
        self._ino = st.st_ino
        os.chmod(self.path, self._mode)
        if self._gid is not None:
            os.chown(self.path, -1, self._gid)

    def remove(self) -> None:
        """Remove the socket file if it is still the one this process bound."""
        remove_own_socket(self.path, self._ino)


def _resolve_gid(group: int | str | None) -> int | None:
    if group is None or isinstance(group, int):
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"socket_group {group!r}: no such group") from None


class PluginHandle:
    """A running plugin, as :func:`start` returns it.

    ``registration_status`` is the last ``NotifyRegistrationStatus`` (``None``
    before the first); ``registered`` is set while the kubelet reports success.
    ``hub``, ``metrics``, ``publisher``, ``taints``, ``control``, ``claim_status`` and
    ``metrics_server`` are what :func:`start` runs beside the sockets (``None`` where
    the options or a missing hub or API client turn a piece off).
    """

    def __init__(
        self,
        options: PluginOptions,
        preparer: ClaimPreparer,
        supported_versions: list[str],
        dra: tuple[grpc.aio.Server, _Socket],
        services: DriverServices | None = None,
    ) -> None:
        self.options = options
        self.preparer = preparer
        self.supported_versions = supported_versions
        self.registration_status: RegistrationStatus | None = None
        self.registered = asyncio.Event()
        self._dra_server, self._dra_socket = dra
        self._reg: tuple[grpc.aio.Server, _Socket] | None = None
        self._stopped = asyncio.Event()
        self._stopping: asyncio.Task[None] | None = None
        self.services = services
        self._uninstall_signals: Callable[[], None] | None = None

    @property
    def driver_name(self) -> str:
        return self.options.driver_name

    @property
    def hub(self) -> HealthHub | None:
        """The ``health`` given to :func:`start` when it is a :class:`HealthHub`."""
        return self.services.hub if self.services else None

    @property
    def metrics(self) -> DriverMetrics | None:
        """The driver's metric families (on ``options.metrics_registry``)."""
        return self.services.metrics if self.services else None

    @property
    def publisher(self) -> ResourceSlicePublisher | None:
        """Publishes ``resources`` (needs ``kube_client``)."""
        return self.services.publisher if self.services else None

    @property
    def taints(self) -> TaintController | None:
        """Health-driven slice taints (needs a hub and a publisher)."""
        return self.services.taints if self.services else None

    @property
    def control(self) -> ControlServer | None:
        """The control socket (``<state_dir>/control.sock``; needs a hub)."""
        return self.services.control if self.services else None

    @property
    def claim_status(self) -> ClaimStatusWriter | None:
        return self.services.claim_status if self.services else None

    @property
    def metrics_server(self) -> MetricsServer | None:
        """``/metrics`` and ``/healthz`` (``metrics_port``); ``.url`` says where."""
        return self.services.metrics_server if self.services else None

    @property
    def endpoint(self) -> str:
        """Absolute path of the DRA socket (``PluginInfo.endpoint``)."""
        return self._dra_socket.path

    @property
    def registrar_socket(self) -> str:
        return self._reg[1].path if self._reg else os.path.abspath(self.options.registrar_socket)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def _on_status(self, status: RegistrationStatus) -> None:
        self.registration_status = status
        if status.plugin_registered:
            log.info("kubelet registered DRA plugin %s", self.driver_name)
            self.registered.set()
        else:
            log.error(
                "kubelet failed to register DRA plugin %s: %s", self.driver_name, status.error
            )
            self.registered.clear()

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop the registrar, then the DRA server; remove both sockets. Idempotent."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(grace))
        await asyncio.shield(self._stopping)

    async def _stop(self, grace: float | None) -> None:
        try:
            if self._reg is not None:
                server, sock = self._reg
                await server.stop(grace)
                sock.remove()
            await self._dra_server.stop(grace)
            self._dra_socket.remove()
            await self.preparer.close()
            if self.services is not None:
                await self.services.stop()
        finally:
            if self._uninstall_signals is not None:
                self._uninstall_signals()
                self._uninstall_signals = None
            self._stopped.set()
            log.info("DRA plugin %s stopped", self.driver_name)

    async def wait(self) -> None:
        """Return once the plugin has stopped."""
        await self._stopped.wait()

    async def __aenter__(self) -> PluginHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _grpc_options(options: PluginOptions) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", options.max_message_bytes),
        ("grpc.max_receive_message_length", options.max_message_bytes),
    ]


async def start(
    driver: Driver,
    options: PluginOptions,
    *,
    health: HealthServiceProvider | None = None,
    resources: Pool | DriverResources | None = None,
) -> PluginHandle:
    """Start a DRA kubelet plugin for ``driver`` and return its handle.

    Validates ``resources`` (a ``Pool``, named after ``options.node_name``, or
    ``DriverResources``; ``SliceValidationError`` names the field at fault). Loads the
    checkpoint (raising ``CheckpointError`` for a corrupt one, already moved aside) and
    regenerates missing CDI specs, serves the DRA socket
    (``<plugins_dir>/<driver>/dra.sock`` or ``dra-<podUID>.sock``), then the
    registration socket. Advertises ``v1.DRAPlugin``, ``v1beta1.DRAPlugin`` and
    whatever ``health.add_to_server`` returns (unless ``options.serve_health`` is
    off), in that order. Then starts what the options ask for beside the sockets
    (``_services``): with a :class:`HealthHub` as ``health``, the control socket,
    health metrics and the hub report of permanent device faults; with
    ``kube_client`` and ``resources``, ResourceSlice publishing and (with a hub)
    health-driven device taints; ``/metrics`` with ``metrics_port``. A failure in any
    of them stops what was started and is raised.
    """
    services = DriverServices(options, health, resources)
    options = services.options
    driver = services.prepare_driver(driver)
    if not options.serve_health:
        health = None
    gid = _resolve_gid(options.socket_group)
    preparer = ClaimPreparer(driver, options)
    await preparer.load()
    os.makedirs(options.data_dir, exist_ok=True)
    os.makedirs(options.registry_dir, exist_ok=True)

    dra_server = grpc.aio.server(options=_grpc_options(options))
    DRAPluginServer(
        preparer, enable_error_type_field=options.enable_error_type_field
    ).add_to_server(dra_server)
    versions = list(api.DRA_PLUGIN_SERVICES)
    if health is not None:
        versions += [v for v in health.add_to_server(dra_server) if v not in versions]
    dra_socket = _Socket(options.dra_socket, options.socket_mode, gid)
    try:
        await dra_socket.serve(dra_server)
    except BaseException:
        await dra_server.stop(None)
        dra_socket.remove()
        await preparer.close()
        raise
    handle = PluginHandle(options, preparer, versions, (dra_server, dra_socket), services)

    reg_server = grpc.aio.server(options=_grpc_options(options))
    api.registration_grpc.add_RegistrationServicer_to_server(
        RegistrationServer(options.driver_name, dra_socket.path, versions, handle._on_status),
        reg_server,
    )
    reg_socket = _Socket(options.registrar_socket, options.socket_mode, gid)
    try:
        await reg_socket.serve(reg_server)
    except BaseException:
        await reg_server.stop(None)
        reg_socket.remove()
        await handle.stop(None)
        raise
    handle._reg = (reg_server, reg_socket)
    try:
        await services.start(preparer.prepared_claims)
        if options.stop_on_signals:
            handle._uninstall_signals = install_signal_handlers(asyncio.get_running_loop(), handle)
    except BaseException:
        await handle.stop(None)
        raise
    log.info(
        "DRA plugin %s serving %s on %s, registration on %s",
        options.driver_name,
        ", ".join(versions),
        dra_socket.path,
        reg_socket.path,
    )
    return handle


def install_signal_handlers(
    loop: asyncio.AbstractEventLoop,
    handle: PluginHandle,
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> Callable[[], None]:
    """Stop ``handle`` cleanly on SIGTERM/SIGINT (a new instance cannot remove this
    instance's sockets, so pods must do this). Returns a function that uninstalls."""
    tasks: set[asyncio.Task[None]] = set()

    def on_signal(sig: signal.Signals) -> None:
        log.info("received %s, stopping DRA plugin %s", sig.name, handle.driver_name)
        task = loop.create_task(handle.stop())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)

    def uninstall() -> None:
        for sig in signals:
            loop.remove_signal_handler(sig)

    return uninstall
