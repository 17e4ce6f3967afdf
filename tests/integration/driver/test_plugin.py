"""The kubelet plugin over its real unix sockets, driven only by generated gRPC stubs.

Covers the registration handshake (GetInfo strings, order, absolute endpoint,
NotifyRegistrationStatus), socket hygiene (0600, stale socket replaced, other files
refused, removal on stop, rolling-update names, SIGTERM), and NodePrepare /
NodeUnprepare over v1 and v1beta1 against claims stored in the embedded API server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from lightkube import AsyncClient
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from drahealth import api
from drahealth.controlplane import APIServer
from drahealth.driver._plugin import PluginHandle, install_signal_handlers, start
from drahealth.driver._types import (
    ClaimRef,
    ErrorKind,
    PluginOptions,
    PreparedClaimRequest,
    PreparedDevice,
    PrepareResult,
)
from drahealth.kube import make_client
from tests import rawproto

DRIVER = "gpu.example.com"
POD_UID = "ad4af911-5bcd-47c5-a554-f35cea869472"


class TinyDriver:
    """Prepares every allocated result as one device; remembers what it saw."""

    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.unprepared: list[str] = []

    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        self.prepared += [c.uid for c in claims]
        return {
            c.uid: PrepareResult.ok(
                [
                    PreparedDevice([r.request], r.pool, r.device, share_id=r.share_id)
                    for r in c.results
                ]
            )
            for c in claims
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        self.unprepared += [c.uid for c in claims]
        return {c.uid: None for c in claims}


class FakeHealth:
    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        return [api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1]


@pytest.fixture
def base() -> Iterator[str]:
    d = tempfile.mkdtemp(dir="/tmp", prefix="drai-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def opts(base: str, client: AsyncClient | None = None, **kw: Any) -> PluginOptions:
    return PluginOptions(
        DRIVER,
        registry_dir=f"{base}/reg",
        plugins_dir=f"{base}/plugins",
        cdi_dir=f"{base}/cdi",
        kube_client=client,
        **kw,
    )


@asynccontextmanager
async def plugin(
    base: str, client: AsyncClient | None = None, *, driver: TinyDriver | None = None, **kw: Any
) -> AsyncIterator[PluginHandle]:
    handle = await start(driver or TinyDriver(), opts(base, client, **kw))
    try:
        yield handle
    finally:
        await handle.stop(0)


@asynccontextmanager
async def channel(path: str) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"unix://{path}") as ch:
        yield ch


def claims_v1(*refs: tuple[str, str, str]) -> list[api.dra_v1.Claim]:
    return [api.dra_v1.Claim(namespace=ns, name=n, uid=u) for ns, n, u in refs]


def claims_v1beta1(*refs: tuple[str, str, str]) -> list[api.dra_v1beta1.Claim]:
    return [api.dra_v1beta1.Claim(namespace=ns, name=n, uid=u) for ns, n, u in refs]


# ---------------------------------------------------------------------------
# registration and sockets (no API server needed)
# ---------------------------------------------------------------------------


async def test_get_info_and_registration_status(
    base: str, caplog: pytest.LogCaptureFixture
) -> None:
    handle = await start(TinyDriver(), opts(base), health=FakeHealth())
    try:
        assert handle.registrar_socket == f"{base}/reg/{DRIVER}-reg.sock"
        async with channel(handle.registrar_socket) as ch:
            stub = api.registration_grpc.RegistrationStub(ch)
            info = await stub.GetInfo(api.registration.InfoRequest())
            assert info.type == "DRAPlugin"
            assert info.name == DRIVER
            assert info.endpoint == f"{base}/plugins/{DRIVER}/dra.sock" == handle.endpoint
            assert os.path.isabs(info.endpoint)
            assert list(info.supported_versions) == [
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth",
            ]
            assert handle.registration_status is None and not handle.registered.is_set()
            await stub.NotifyRegistrationStatus(
                api.registration.RegistrationStatus(plugin_registered=True)
            )
            await asyncio.wait_for(handle.registered.wait(), 5)
            assert handle.registration_status is not None
            assert handle.registration_status.plugin_registered
            with caplog.at_level(logging.ERROR, logger="drahealth.driver.plugin"):
                await stub.NotifyRegistrationStatus(
                    api.registration.RegistrationStatus(
                        plugin_registered=False, error="plugin validation failed"
                    )
                )
            assert not handle.registered.is_set()
            assert handle.registration_status.error == "plugin validation failed"
            assert "plugin validation failed" in caplog.text
    finally:
        await handle.stop(0)


async def test_without_health_only_dra_services(base: str) -> None:
    async with plugin(base) as handle, channel(handle.registrar_socket) as ch:
        info = await api.registration_grpc.RegistrationStub(ch).GetInfo(
            api.registration.InfoRequest()
        )
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


def exists(path: str) -> bool:
    return os.path.lexists(path)


def read_text(path: str) -> str:
    return Path(path).read_text()


def write_text(path: str, text: str) -> None:
    Path(path).write_text(text)


def _mode(path: str) -> int:
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode)
    return stat.S_IMODE(st.st_mode)


async def test_socket_permissions_and_removal_on_stop(base: str) -> None:
    handle = await start(TinyDriver(), opts(base))
    dra, reg = handle.endpoint, handle.registrar_socket
    assert _mode(dra) == 0o600 and _mode(reg) == 0o600
    await handle.stop(0)
    await asyncio.wait_for(handle.wait(), 5)
    assert not exists(dra) and not exists(reg)
    await handle.stop(0)  # idempotent


async def test_custom_socket_mode(base: str) -> None:
    async with plugin(base, socket_mode=0o660, socket_group=os.getgid()) as handle:
        assert _mode(handle.endpoint) == 0o660 and _mode(handle.registrar_socket) == 0o660
        assert os.lstat(handle.endpoint).st_gid == os.getgid()


def _stale_socket(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # the file stays, nobody listens


async def test_stale_sockets_are_replaced(base: str) -> None:
    o = opts(base)
    _stale_socket(o.dra_socket)
    _stale_socket(o.registrar_socket)
    async with plugin(base) as handle, channel(handle.registrar_socket) as ch:
        info = await api.registration_grpc.RegistrationStub(ch).GetInfo(
            api.registration.InfoRequest()
        )
        assert info.name == DRIVER


@pytest.mark.parametrize("which", ["dra_socket", "registrar_socket"])
async def test_regular_file_at_socket_path_is_refused(base: str, which: str) -> None:
    o = opts(base)
    path = getattr(o, which)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_text(path, "precious")
    with pytest.raises(FileExistsError, match=f"refusing to replace {path}: it exists and is not"):
        await start(TinyDriver(), o)
    assert read_text(path) == "precious"
    # nothing left listening: the other socket (if it was bound) is gone again
    other = o.registrar_socket if which == "dra_socket" else o.dra_socket
    assert not exists(other)


async def test_rolling_update_socket_names(base: str) -> None:
    async with (
        plugin(base, pod_uid=POD_UID) as handle,
        channel(handle.registrar_socket) as ch,
    ):
        assert handle.registrar_socket == f"{base}/reg/{DRIVER}-{POD_UID}-reg.sock"
        assert handle.endpoint == f"{base}/plugins/{DRIVER}/dra-{POD_UID}.sock"
        info = await api.registration_grpc.RegistrationStub(ch).GetInfo(
            api.registration.InfoRequest()
        )
        assert info.endpoint == handle.endpoint
        assert exists(f"{base}/plugins/{DRIVER}/dra-{POD_UID}.sock")


async def test_sigterm_stops_cleanly(base: str) -> None:
    handle = await start(TinyDriver(), opts(base))
    uninstall = install_signal_handlers(asyncio.get_running_loop(), handle)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(handle.wait(), 5)
    finally:
        uninstall()
        await handle.stop(0)
    assert handle.stopped
    assert not exists(handle.endpoint)
    assert not exists(handle.registrar_socket)


async def test_prepare_without_api_access_fails_per_claim(base: str) -> None:
    async with plugin(base) as handle, channel(handle.endpoint) as ch:
        resp = await api.dra_v1_grpc.DRAPluginStub(ch).NodePrepareResources(
            api.dra_v1.NodePrepareResourcesRequest(claims=claims_v1(("ns", "a", "u1")))
        )
        assert dict(resp.claims)["u1"].error == (
            "no Kubernetes API access configured; cannot fetch ResourceClaim ns/a"
        )


# ---------------------------------------------------------------------------
# prepare / unprepare against the embedded API server
# ---------------------------------------------------------------------------


@pytest.fixture
async def kube() -> AsyncIterator[AsyncClient]:
    server = APIServer()
    await server.start(port=0)
    try:
        yield make_client(server_url=server.url)
    finally:
        await server.stop()


async def create_claim(client: AsyncClient, name: str, results: list[dict[str, Any]] | None) -> str:
    claim = cast(
        ResourceClaim,
        ResourceClaim.from_dict(
            {
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpus",
                                "firstAvailable": [
                                    {"name": "big", "deviceClassName": "gpu.example.com"},
                                ],
                            }
                        ]
                    }
                },
            }
        ),
    )
    created = await client.create(claim)
    assert created.metadata is not None and created.metadata.uid
    if results is not None:
        await client.patch(
            ResourceClaim.Status,
            name,
            {
                "status": {
                    "allocation": {
                        "devices": {
                            "results": results,
                            "config": [
                                {
                                    "source": "FromClaim",
                                    "requests": ["gpus"],
                                    "opaque": {"driver": DRIVER, "parameters": {"mode": "fast"}},
                                }
                            ],
                        }
                    }
                }
            },
            namespace="default",
            patch_type=PatchType.MERGE,
        )
    uid: str = created.metadata.uid
    return uid


def gpu(device: str, **extra: Any) -> dict[str, Any]:
    return {"request": "gpus/big", "driver": DRIVER, "pool": "node-1", "device": device, **extra}


async def test_prepare_and_unprepare_over_v1_and_v1beta1(base: str, kube: AsyncClient) -> None:
    good = await create_claim(kube, "good", [gpu("gpu-0", shareID="share-1")])
    other = await create_claim(
        kube,
        "other",
        [{"request": "gpus/big", "driver": "nic.example.com", "pool": "p", "device": "eth0"}],
    )
    unalloc = await create_claim(kube, "unalloc", None)
    driver = TinyDriver()
    refs = [
        ("default", "good", good),
        ("default", "other", other),
        ("default", "unalloc", unalloc),
        ("default", "good", "stale-uid"),  # same name, old UID: replaced
        ("default", "missing", "u-missing"),
    ]
    async with plugin(base, kube, driver=driver) as handle, channel(handle.endpoint) as ch:
        v1 = api.dra_v1_grpc.DRAPluginStub(ch)
        v1beta1 = api.dra_v1beta1_grpc.DRAPluginStub(ch)
        resp = await v1.NodePrepareResources(
            api.dra_v1.NodePrepareResourcesRequest(claims=claims_v1(*refs))
        )
        out = dict(resp.claims)
        assert set(out) == {u for _, _, u in refs}
        [dev] = out[good].devices
        assert not out[good].error
        assert list(dev.request_names) == ["gpus"]  # subrequest stripped
        assert (dev.pool_name, dev.device_name, dev.share_id) == ("node-1", "gpu-0", "share-1")
        cdi_id = f"k8s.{DRIVER}/claim={good}-gpu-0-share-1"
        assert list(dev.cdi_device_ids) == [cdi_id]
        assert not out[other].error and list(out[other].devices) == []
        assert out[unalloc].error == f"claim default/unalloc (uid {unalloc}) is not allocated"
        assert out["stale-uid"].error == (
            f"claim default/good (uid stale-uid) got replaced: the API server has uid {good}"
        )
        assert out["u-missing"].error == "ResourceClaim default/missing not found (uid u-missing)"
        assert driver.prepared == [good]

        spec_path = f"{base}/cdi/k8s.{DRIVER}-claim_{good}.json"
        spec = json.loads(read_text(spec_path))
        assert spec["devices"][0]["name"] == f"{good}-gpu-0-share-1"

        # idempotent re-prepare over v1beta1: same devices, no share_id field, driver not called
        resp_b = await v1beta1.NodePrepareResources(
            api.dra_v1beta1.NodePrepareResourcesRequest(claims=claims_v1beta1(refs[0]))
        )
        [dev_b] = resp_b.claims[good].devices
        assert (list(dev_b.request_names), dev_b.pool_name, dev_b.device_name) == (
            ["gpus"],
            "node-1",
            "gpu-0",
        )
        assert list(dev_b.cdi_device_ids) == [cdi_id]
        assert "share_id" not in api.dra_v1beta1.Device.DESCRIPTOR.fields_by_name
        assert driver.prepared == [good]

        # unprepare over v1beta1 and v1 (an unknown claim is fine, too)
        un_b = await v1beta1.NodeUnprepareResources(
            api.dra_v1beta1.NodeUnprepareResourcesRequest(claims=claims_v1beta1(refs[0]))
        )
        assert {u: r.error for u, r in un_b.claims.items()} == {good: ""}
        assert not exists(spec_path)
        un = await v1.NodeUnprepareResources(
            api.dra_v1.NodeUnprepareResourcesRequest(
                claims=claims_v1(refs[0], ("default", "never", "u-never"))
            )
        )
        assert {u: r.error for u, r in un.claims.items()} == {good: "", "u-never": ""}
        assert handle.preparer.prepared_claims() == {}
        # prepared again after unprepare: the driver is called again
        resp = await v1.NodePrepareResources(
            api.dra_v1.NodePrepareResourcesRequest(claims=claims_v1(refs[0]))
        )
        assert not resp.claims[good].error and driver.prepared == [good, good]


async def test_checkpoint_survives_restart(base: str, kube: AsyncClient) -> None:
    uid = await create_claim(kube, "c1", [gpu("gpu-1")])
    driver = TinyDriver()
    ref = ("default", "c1", uid)
    async with plugin(base, kube, driver=driver) as handle, channel(handle.endpoint) as ch:
        first = await api.dra_v1_grpc.DRAPluginStub(ch).NodePrepareResources(
            api.dra_v1.NodePrepareResourcesRequest(claims=claims_v1(ref))
        )
    os.unlink(f"{base}/cdi/k8s.{DRIVER}-claim_{uid}.json")  # tmpfs wiped by a reboot
    await kube.delete(ResourceClaim, "c1", namespace="default")
    async with plugin(base, kube, driver=driver) as handle, channel(handle.endpoint) as ch:
        assert exists(f"{base}/cdi/k8s.{DRIVER}-claim_{uid}.json")  # regenerated
        stub = api.dra_v1_grpc.DRAPluginStub(ch)
        un = await stub.NodeUnprepareResources(  # the claim is gone from the API
            api.dra_v1.NodeUnprepareResourcesRequest(claims=claims_v1(ref))
        )
        assert un.claims[uid].error == ""
        assert driver.unprepared == [uid]
    assert first.claims[uid].devices[0].device_name == "gpu-1"


class FailingDriver(TinyDriver):
    """Fails claim ``perm`` permanently (device fault) and ``busy`` transiently."""

    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        out: dict[str, PrepareResult] = {}
        for c in claims:
            if c.name == "perm":
                out[c.uid] = PrepareResult.failed(
                    "XID 79: fallen off the bus",
                    ErrorKind.PERMANENT_DEVICE,
                    device=("node-1", "gpu-0"),
                )
            else:
                out[c.uid] = PrepareResult.failed("device busy")
        return out


async def _raw_prepare_errors(
    endpoint: str, claims: list[tuple[str, str]]
) -> dict[str, dict[int, list[Any]]]:
    """Prepare over v1 reading the reply as raw bytes: claim uid -> decoded claim reply."""
    request = api.dra_v1.NodePrepareResourcesRequest(
        claims=claims_v1(*(("default", name, uid) for name, uid in claims))
    )
    async with channel(endpoint) as ch:
        raw: bytes = await ch.unary_unary(
            api.NODE_PREPARE_V1_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=None,
        )(request)
    out = {}
    for entry in rawproto.decode(raw)[1]:
        fields = rawproto.decode(cast(bytes, entry))
        out[cast(bytes, fields[1][0]).decode()] = rawproto.decode(cast(bytes, fields[2][0]))
    return out


@pytest.mark.parametrize("enabled", [False, True])
async def test_error_type_field_only_for_permanent_errors_and_only_when_enabled(
    base: str, kube: AsyncClient, enabled: bool
) -> None:
    perm = await create_claim(kube, "perm", [gpu("gpu-0")])
    busy = await create_claim(kube, "busy", [gpu("gpu-1")])
    async with plugin(
        base, kube, driver=FailingDriver(), enable_error_type_field=enabled
    ) as handle:
        replies = await _raw_prepare_errors(handle.endpoint, [("perm", perm), ("busy", busy)])
    # field 2: error (same text either way), field 3: KEP-5322 error_type
    assert replies[perm][2] == [b"XID 79: fallen off the bus"]
    assert replies[busy][2] == [b"device busy"]
    assert 3 not in replies[busy]  # Unknown is the default: not sent
    if enabled:
        assert replies[perm][3] == [api.PREPARE_ERROR_TYPE_PERMANENT]
    else:
        assert 3 not in replies[perm]


async def _reserve(client: AsyncClient, name: str) -> None:
    await client.patch(
        ResourceClaim.Status,
        name,
        {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": f"pod-{name}"}]}},
        namespace="default",
        patch_type=PatchType.MERGE,
    )


async def test_claim_cache_answers_reserved_claims_and_falls_back_to_get(
    base: str, kube: AsyncClient
) -> None:
    reserved = await create_claim(kube, "reserved", [gpu("gpu-0")])
    await _reserve(kube, "reserved")
    unreserved = await create_claim(kube, "unreserved", [gpu("gpu-1")])
    driver = TinyDriver()
    async with (
        plugin(base, kube, driver=driver, claim_cache=True) as handle,
        channel(handle.endpoint) as ch,
    ):
        preparer = handle.preparer
        watch = preparer._claim_watch
        assert watch is not None
        await watch.wait_synced(5)
        stub = api.dra_v1_grpc.DRAPluginStub(ch)

        async def prepare(name: str, uid: str) -> Any:
            req = api.dra_v1.NodePrepareResourcesRequest(claims=claims_v1(("default", name, uid)))
            return (await stub.NodePrepareResources(req)).claims[uid]

        got = await prepare("reserved", reserved)
        assert not got.error and got.devices[0].device_name == "gpu-0"
        assert (preparer.cache_hits, preparer.cache_misses) == (1, 0)
        # not reserved in the cache: the GET decides (and it is allocated, so it works)
        got = await prepare("unreserved", unreserved)
        assert not got.error and got.devices[0].device_name == "gpu-1"
        assert (preparer.cache_hits, preparer.cache_misses) == (1, 1)
        # a UID the cache does not hold: GET, which reports the replacement
        got = await prepare("reserved", "old-uid")
        assert got.error == (
            f"claim default/reserved (uid old-uid) got replaced: the API server has uid {reserved}"
        )
        assert preparer.cache_misses == 2
        # a claim created after start reaches the cache through the watch
        late = await create_claim(kube, "late", [gpu("gpu-2")])
        await _reserve(kube, "late")
        for _ in range(200):
            if (c := watch.store.get("default", "late")) and c.status and c.status.reservedFor:
                break
            await asyncio.sleep(0.01)
        got = await prepare("late", late)
        assert not got.error and preparer.cache_hits == 2
    assert preparer._claim_watch is None  # stopped with the plugin
