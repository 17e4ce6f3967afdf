"""Independent-peer check of the wire contract.

Servers are built on the generated code; the client knows only method paths and
speaks hand-encoded protobuf bytes (tests/rawproto.py), so any drift in proto
packages, service names or field numbers fails here.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator

import grpc
import pytest

from drahealth import api
from tests.rawproto import decode, field_bytes, field_varint


class Registration(api.registration_grpc.RegistrationServicer):
    def __init__(self) -> None:
        self.statuses: list[tuple[bool, str]] = []

    async def GetInfo(self, request, context):  # type: ignore[no-untyped-def]
        return api.registration.PluginInfo(
            type=api.DRA_PLUGIN_TYPE,
            name="gpu.example.com",
            endpoint="/var/lib/kubelet/plugins/gpu.example.com/dra.sock",
            supported_versions=[*api.DRA_PLUGIN_SERVICES, api.DRA_HEALTH_V1],
        )

    async def NotifyRegistrationStatus(self, request, context):  # type: ignore[no-untyped-def]
        self.statuses.append((request.plugin_registered, request.error))
        return api.registration.RegistrationStatusResponse()


class DRAv1(api.dra_v1_grpc.DRAPluginServicer):
    async def NodePrepareResources(self, request, context):  # type: ignore[no-untyped-def]
        resp = api.dra_v1.NodePrepareResourcesResponse()
        for claim in request.claims:
            out = resp.claims[claim.uid]
            if claim.name == "broken":
                out.error = f"claim {claim.namespace}/{claim.name} failed"
                continue
            out.devices.add(
                request_names=["gpus"],
                pool_name="node-1",
                device_name="gpu-0",
                cdi_device_ids=["gpu.example.com/gpu=gpu-0"],
                share_id="share-1",
            )
        return resp

    async def NodeUnprepareResources(self, request, context):  # type: ignore[no-untyped-def]
        resp = api.dra_v1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            resp.claims[claim.uid].error = ""
        return resp


def _health_servicer(mod, grpc_mod):  # type: ignore[no-untyped-def]
    class Health(grpc_mod.DRAResourceHealthServicer):  # type: ignore[misc]
        async def NodeWatchResources(self, request, context) -> AsyncIterator[object]:  # type: ignore[no-untyped-def]
            for health, msg in (
                (mod.HEALTHY, ""),
                (mod.UNHEALTHY, "XID 79: GPU fallen off the bus"),
            ):
                yield mod.NodeWatchResourcesResponse(
                    devices=[
                        mod.DeviceHealth(
                            device=mod.DeviceIdentifier(pool_name="node-1", device_name="gpu-0"),
                            health=health,
                            last_updated_time=1_700_000_000,
                            health_check_timeout_seconds=45,
                            message=msg,
                        )
                    ]
                )

    return Health()


@pytest.fixture
async def sockdir() -> AsyncIterator[str]:
    d = tempfile.mkdtemp(prefix="dh-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def server(sockdir: str) -> AsyncIterator[tuple[str, Registration]]:
    srv = grpc.aio.server()
    reg = Registration()
    api.registration_grpc.add_RegistrationServicer_to_server(reg, srv)
    api.dra_v1_grpc.add_DRAPluginServicer_to_server(DRAv1(), srv)
    api.health_v1_grpc.add_DRAResourceHealthServicer_to_server(
        _health_servicer(api.health_v1, api.health_v1_grpc), srv
    )
    api.health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
        _health_servicer(api.health_v1alpha1, api.health_v1alpha1_grpc), srv
    )
    target = f"unix://{sockdir}/plugin.sock"
    srv.add_insecure_port(target)
    await srv.start()
    yield target, reg
    await srv.stop(0)


def _raw(channel: grpc.aio.Channel, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
    return channel.unary_unary(method, request_serializer=None, response_deserializer=None)


async def test_get_info_and_notify(server: tuple[str, Registration]) -> None:
    target, reg = server
    async with grpc.aio.insecure_channel(target) as ch:
        raw = await _raw(ch, "/pluginregistration.Registration/GetInfo")(b"")
        info = decode(raw)
        assert info[1] == [b"DRAPlugin"]
        assert info[2] == [b"gpu.example.com"]
        assert info[3] == [b"/var/lib/kubelet/plugins/gpu.example.com/dra.sock"]
        assert info[4] == [b"v1.DRAPlugin", b"v1beta1.DRAPlugin", b"v1.DRAResourceHealth"]
        body = field_varint(1, 0) + field_bytes(2, "validation failed")
        out = await _raw(ch, "/pluginregistration.Registration/NotifyRegistrationStatus")(body)
        assert out == b""
    assert reg.statuses == [(False, "validation failed")]


async def test_node_prepare_v1_raw(server: tuple[str, Registration]) -> None:
    target, _ = server

    def claim(ns: str, uid: str, name: str) -> bytes:
        return field_bytes(1, ns) + field_bytes(2, uid) + field_bytes(3, name)

    body = field_bytes(1, claim("default", "uid-1", "c1")) + field_bytes(
        1, claim("ns2", "uid-2", "broken")
    )
    async with grpc.aio.insecure_channel(target) as ch:
        raw = await _raw(ch, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources")(body)
    entries = {}
    for entry in decode(raw)[
        1
    ]:  # map<string, NodePrepareResourceResponse> = repeated (key=1, value=2)
        assert isinstance(entry, bytes)
        kv = decode(entry)
        entries[kv[1][0]] = decode(kv[2][0]) if 2 in kv else {}
    assert set(entries) == {b"uid-1", b"uid-2"}
    dev = decode(entries[b"uid-1"][1][0])  # type: ignore[arg-type]
    assert dev == {
        1: [b"gpus"],
        2: [b"node-1"],
        3: [b"gpu-0"],
        4: [b"gpu.example.com/gpu=gpu-0"],
        5: [b"share-1"],
    }
    assert entries[b"uid-2"][2] == [b"claim ns2/broken failed"]


@pytest.mark.parametrize("method", [api.WATCH_V1_METHOD, api.WATCH_V1ALPHA1_METHOD])
async def test_health_stream_raw(server: tuple[str, Registration], method: str) -> None:
    target, _ = server
    async with grpc.aio.insecure_channel(target) as ch:
        call = ch.unary_stream(method, request_serializer=None, response_deserializer=None)(b"")
        msgs = [m async for m in call]
    assert len(msgs) == 2
    devices = [decode(decode(m)[1][0]) for m in msgs]  # type: ignore[arg-type]
    first, second = devices
    assert decode(first[1][0]) == {1: [b"node-1"], 2: [b"gpu-0"]}  # type: ignore[arg-type]
    assert first[2] == [1] and first[3] == [1_700_000_000] and first[4] == [45]
    assert 5 not in first  # empty message is not on the wire
    assert second[2] == [2] and second[5] == [b"XID 79: GPU fallen off the bus"]


async def test_unknown_method_is_unimplemented(server: tuple[str, Registration]) -> None:
    target, _ = server
    async with grpc.aio.insecure_channel(target) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _raw(ch, "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources")(
                b""
            )
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_generated_client_reads_hand_encoded_health() -> None:
    """The reverse direction: bytes built by hand decode into the generated classes."""
    dev = field_bytes(1, field_bytes(1, "p") + field_bytes(2, "d")) + field_varint(2, 2)
    dev += field_varint(4, (1 << 64) - 5) + field_bytes(5, "é")  # -5 as int64 varint
    msg = api.health_v1.NodeWatchResourcesResponse.FromString(field_bytes(1, dev))
    (d,) = msg.devices
    assert (d.device.pool_name, d.device.device_name) == ("p", "d")
    assert d.health == api.health_v1.UNHEALTHY
    assert d.health_check_timeout_seconds == -5
    assert d.message == "é"
    # An out-of-range enum value is kept as its number (proto3 open enums).
    odd = api.health_v1.DeviceHealth.FromString(field_varint(2, 7))
    assert odd.health == 7
