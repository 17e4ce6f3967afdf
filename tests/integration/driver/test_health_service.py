"""dra-health streams served by a HealthHub on a real grpc.aio server over a unix socket,
read with the generated v1 and v1alpha1 stubs."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import ModuleType
from typing import Any

import grpc
import pytest

from drahealth import api
from drahealth.core import Health
from drahealth.driver._hub import DeviceReport, HealthHub
from tests._support import eventually, short_dir

pytestmark = pytest.mark.timeout(20)

H, U = Health.HEALTHY, Health.UNHEALTHY
DEVS = [("node-1", "gpu-0"), ("node-1", "gpu-1")]
Version = tuple[ModuleType, ModuleType]
V1: Version = (api.health_v1, api.health_v1_grpc)
V1ALPHA1: Version = (api.health_v1alpha1, api.health_v1alpha1_grpc)
VERSIONS = [pytest.param(V1, id="v1"), pytest.param(V1ALPHA1, id="v1alpha1")]


@asynccontextmanager
async def serve(hub: HealthHub) -> AsyncIterator[grpc.aio.Channel]:
    """A server with the hub's services on a fresh unix socket, and a channel to it."""
    sockdir = short_dir()
    server = grpc.aio.server()
    assert hub.add_to_server(server) == hub.advertised_services()
    target = f"unix://{sockdir}/dra.sock"
    server.add_insecure_port(target)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            yield channel
    finally:
        await server.stop(0)
        shutil.rmtree(sockdir, ignore_errors=True)


class Reader:
    """Reads one stream in a background task, timestamping each message.

    (Cancelling ``call.read()`` would cancel the RPC, so waits happen on a queue.)
    """

    def __init__(self, channel: grpc.aio.Channel, version: Version) -> None:
        mod, grpc_mod = version
        self.call: Any = grpc_mod.DRAResourceHealthStub(channel).NodeWatchResources(
            mod.NodeWatchResourcesRequest()
        )
        self.queue: asyncio.Queue[tuple[float, Any] | None] = asyncio.Queue()
        self.error: grpc.aio.AioRpcError | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for msg in self.call:
                self.queue.put_nowait((loop.time(), msg))
        except grpc.aio.AioRpcError as exc:
            self.error = exc
        except asyncio.CancelledError:
            if not self.call.cancelled():  # cancelled by close(), not from outside
                raise
        finally:
            self.queue.put_nowait(None)

    async def get(self, within: float = 1.0) -> Any:
        item = await asyncio.wait_for(self.queue.get(), within)
        assert item is not None, f"stream ended: {self.error}"
        return item[1]

    async def until(self, pred: Callable[[Any], bool], within: float = 1.0) -> Any:
        async with asyncio.timeout(within):
            while not pred(msg := await self.get(within)):
                pass
        return msg

    async def quiet_for(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.queue.get(), seconds)
        except TimeoutError:
            return True
        return False

    async def close(self) -> None:
        self.call.cancel()
        await self.task


def view(msg: Any) -> list[tuple[str, str, int, str]]:
    return [(d.device.pool_name, d.device.device_name, d.health, d.message) for d in msg.devices]


@pytest.mark.parametrize("version", VERSIONS)
async def test_initial_snapshot(version: Version) -> None:
    hub = HealthHub(DEVS, default_timeout_seconds=40, wall_clock=lambda: 1_700_000_000.5)
    hub.set_timeout("node-1", "gpu-1", 7)
    hub.submit("nvml", [DeviceReport("node-1", "gpu-0", U, "XID 79")])
    async with serve(hub) as ch:
        reader = Reader(ch, version)
        msg = await reader.get()
        assert view(msg) == [("node-1", "gpu-0", 2, "XID 79"), ("node-1", "gpu-1", 0, "")]
        assert [d.health_check_timeout_seconds for d in msg.devices] == [40, 7]
        assert [d.last_updated_time for d in msg.devices] == [1_700_000_000] * 2
        await reader.close()


@pytest.mark.parametrize("version", VERSIONS)
async def test_change_arrives_within_100ms(version: Version) -> None:
    hub = HealthHub(DEVS)
    async with serve(hub) as ch:
        reader = Reader(ch, version)
        await reader.get()
        loop = asyncio.get_running_loop()
        for i in range(5):
            t0 = loop.time()
            hub.submit("nvml", [DeviceReport("node-1", "gpu-0", U, f"fault {i}")])
            item = await asyncio.wait_for(reader.queue.get(), 1.0)
            assert item is not None
            arrived, msg = item
            assert view(msg)[0] == ("node-1", "gpu-0", 2, f"fault {i}")
            assert arrived - t0 < 0.1
        await reader.close()


@pytest.mark.parametrize("version", VERSIONS)
async def test_heartbeat_before_timeout_without_changes(version: Version) -> None:
    hub = HealthHub(DEVS, default_timeout_seconds=1)
    hub.submit("nvml", [DeviceReport("node-1", "gpu-0", H)])
    async with serve(hub) as ch:
        reader = Reader(ch, version)
        first = await reader.get()
        loop = asyncio.get_running_loop()
        last = loop.time()
        for _ in range(2):
            item = await asyncio.wait_for(reader.queue.get(), 1.0)
            assert item is not None
            arrived, msg = item
            assert 0.2 < arrived - last < 0.6  # every timeout/3, well before the 1 s lease
            assert msg == first
            last = arrived
        await reader.close()


async def test_two_concurrent_streams_both_versions() -> None:
    hub = HealthHub(DEVS)
    async with serve(hub) as ch:
        a, b = Reader(ch, V1), Reader(ch, V1ALPHA1)
        await a.get()
        await b.get()
        await eventually(lambda: hub.stream_count == 2, 2.0)
        hub.submit("nvml", [DeviceReport("node-1", "gpu-1", U, "XID 48")])
        for r in (a, b):
            msg = await r.get(0.5)
            assert view(msg)[1] == ("node-1", "gpu-1", 2, "XID 48")
        await a.close()
        await b.close()


async def test_stalled_reader_does_not_delay_others() -> None:
    devices = [("node-1", f"gpu-{i:02d}") for i in range(64)]
    hub = HealthHub(devices)
    mod, grpc_mod = V1
    async with serve(hub) as ch:
        stalled = grpc_mod.DRAResourceHealthStub(ch).NodeWatchResources(
            mod.NodeWatchResourcesRequest()
        )
        await eventually(lambda: hub.stream_count == 1, 2.0)
        live = Reader(ch, V1)
        await live.get()
        loop = asyncio.get_running_loop()
        big = "x" * 1500  # cut to 1024 bytes on the wire: ~68 KB per snapshot
        worst = 0.0
        for i in range(200):
            t0 = loop.time()
            hub.submit(
                "nvml", [DeviceReport(p, d, U, f"{i:03d} {big}", fatal=False) for p, d in devices]
            )
            # submit is synchronous: it cannot wait for any stream, stalled or not
            prefix = f"{i:03d} "
            await live.until(lambda m: bool(m.devices[0].message.startswith(prefix)))  # noqa: B023
            worst = max(worst, loop.time() - t0)
        # generous: a loaded CI machine is slow, a live reader queued behind the
        # stalled one would wait for ever (the stalled stream never reads)
        assert worst < 2.0, worst
        assert hub.stream_count == 2
        # gRPC flow control really backed the stalled stream up: it is far behind.
        assert min(m.sent for m in hub._streams.mailboxes) < hub.version - 100
        # The stalled stream then catches up: newest data last, never stale after fresh.
        seen: list[int] = []
        async for msg in stalled:
            first = msg.devices[0].message
            seen.append(int(first[:3]) if first else -1)
            if seen[-1] == 199:
                break
        assert seen == sorted(seen) and seen[-1] == 199
        assert len(seen) < 150, len(seen)  # intermediate snapshots were coalesced
        stalled.cancel()
        await eventually(lambda: hub.stream_count == 1, 2.0)
        await live.close()


async def test_silence_stops_everything_and_resume_restarts() -> None:
    hub = HealthHub(DEVS, default_timeout_seconds=1)
    async with serve(hub) as ch:
        reader = Reader(ch, V1)
        await reader.get()
        hub.silence(True)
        hub.submit("nvml", [DeviceReport("node-1", "gpu-0", U, "during silence")])
        late = Reader(ch, V1ALPHA1)  # opened while silenced
        assert await reader.quiet_for(0.6)  # > 1 heartbeat interval: nothing at all
        assert late.queue.empty()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        hub.silence(False)
        for r in (reader, late):
            msg = await r.get(0.5)
            assert view(msg)[0] == ("node-1", "gpu-0", 2, "during silence")
        assert loop.time() - t0 < 0.1
        await reader.get(1.0)  # heartbeats are back
        await reader.close()
        await late.close()


@pytest.mark.parametrize("version", VERSIONS)
async def test_not_supported_is_unimplemented(version: Version) -> None:
    hub = HealthHub(DEVS, supported=False)
    assert hub.advertised_services() == []
    async with serve(hub) as ch:
        reader = Reader(ch, version)
        await reader.task
        assert reader.error is not None
        assert reader.error.code() == grpc.StatusCode.UNIMPLEMENTED
        assert reader.error.details() == "health not supported"
    assert hub.stream_count == 0


async def test_stream_count_returns_to_zero_after_cancel() -> None:
    hub = HealthHub(DEVS)
    async with serve(hub) as ch:
        readers = [Reader(ch, (V1, V1ALPHA1)[i % 2]) for i in range(4)]
        for r in readers:
            await r.get()
        assert hub.stream_count == 4
        for r in readers[:3]:
            await r.close()
        await eventually(lambda: hub.stream_count == 1, 2.0)
        await readers[3].close()
        await eventually(lambda: hub.stream_count == 0, 2.0)


async def test_close_ends_streams_and_refuses_new_ones() -> None:
    hub = HealthHub(DEVS)
    async with serve(hub) as ch:
        reader = Reader(ch, V1)
        await reader.get()
        hub.close()
        await asyncio.wait_for(reader.task, 1.0)
        assert reader.error is None  # ended with OK
        await eventually(lambda: hub.stream_count == 0, 2.0)
        again = Reader(ch, V1ALPHA1)
        await again.task
        assert again.error is not None and again.error.code() == grpc.StatusCode.UNAVAILABLE


async def test_server_stop_drops_streams() -> None:
    hub = HealthHub(DEVS)
    async with serve(hub) as ch:
        reader = Reader(ch, V1)
        await reader.get()
        assert hub.stream_count == 1
    await eventually(lambda: hub.stream_count == 0, 2.0)
    await asyncio.wait_for(reader.task, 1.0)
