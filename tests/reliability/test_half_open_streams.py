"""Half-open health streams: plugins that accept the stream but never (again) send.

A real agent process (``drahealth agent --mode observer``, metrics on) watches a
registry directory with four plugins served from this test, each registered through
its own registration socket as the kubelet expects:

* ``silent.example.com`` accepts ``NodeWatchResources`` and never sends a message;
* ``once.example.com`` sends one snapshot (1 s lease) on each stream, then nothing; after
  ``CYCLES`` streams it sends nothing at all;
* ``raw.example.com``'s endpoint is a plain unix socket server that accepts connections
  and reads, but never speaks HTTP/2;
* ``ok.example.com`` is a toolkit plugin with a ``HealthHub``, changed by the test.

The agent's watchdog must cancel each stalled stream (the plugin sees the cancellation)
and open a new one; ``once``'s devices turn Unknown one lease after its last snapshot;
``ok``'s changes reach the agent within ``PROPAGATION_BOUND`` all along; and over the
reconnect cycles the agent's open file descriptors (``/proc/<pid>/fd``) do not grow.
Everything is read from the agent's ``/metrics``. Counts are printed (pytest -s).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from functools import partial
from typing import Any

import aiohttp
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from drahealth import api
from drahealth.core import Health
from drahealth.driver._hub import DeviceReport, HealthHub
from drahealth.driver._plugin import start as start_plugin
from drahealth.driver._types import ClaimRef, PluginOptions, PreparedClaimRequest, PrepareResult
from tests.integration.driver.test_sample_driver import DRAHEALTH, ENV, _open_log, read_text
from tests.integration.node.test_watcher import RawPlugin as Registrar
from tests.integration.node.test_watcher import raw_info, serve

pytestmark = pytest.mark.timeout(120)

NODE = "node-h"
CYCLES = 22  # streams of once.example.com that get a snapshot
LEASE = 1  # seconds, health_check_timeout_seconds of once.example.com's devices
DEFAULT_TIMEOUT = 0.5  # the agent's --default-timeout: watchdog before a first message
PROPAGATION_BOUND = 1.0  # seconds from a HealthHub change to the agent's metrics
FD_SLACK = 4
VERSIONS = (api.DRA_PLUGIN_V1, api.DRA_HEALTH_V1)
_Context = grpc.aio.ServicerContext[Any, Any]


def snapshot(devices: Sequence[str], timeout: int) -> bytes:
    msg = api.health_v1.NodeWatchResourcesResponse()
    for name in devices:
        msg.devices.add(
            device=api.health_v1.DeviceIdentifier(pool_name="pool", device_name=name),
            health=Health.HEALTHY.to_wire(),
            health_check_timeout_seconds=timeout,
            last_updated_time=int(time.time()),
        )
    return msg.SerializeToString()


class HalfOpenPlugin:
    """A dra-health server whose streams go silent: after ``snapshots`` streams that get
    one snapshot each, every further stream gets nothing. Counts calls as the plugin sees
    them: opened, cancelled by the client, open now."""

    def __init__(self, path: str, devices: Sequence[str] = (), snapshots: int = 0) -> None:
        self.path = path
        self.devices = list(devices)
        self.snapshots = snapshots
        self.calls = 0
        self.cancelled = 0
        self.open = 0
        self.max_open = 0
        self.last_snapshot_at: float | None = None
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        server = grpc.aio.server()
        handler: grpc.RpcMethodHandler[Any, Any] = grpc.unary_stream_rpc_method_handler(
            self.watch, request_deserializer=None, response_serializer=None
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    api.DRA_HEALTH_V1, {"NodeWatchResources": handler}
                ),
            )
        )
        server.add_insecure_port(f"unix://{self.path}")
        await server.start()
        self.server = server

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)

    async def watch(self, request: bytes, context: _Context) -> AsyncIterator[bytes]:
        self.calls += 1
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        try:
            if self.calls <= self.snapshots:
                yield snapshot(self.devices, LEASE)
                self.last_snapshot_at = time.monotonic()
            await asyncio.Event().wait()  # accepted, never another word
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.open -= 1


class MuteSocket:
    """A unix socket server that accepts and reads but never writes (no HTTP/2 at all)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.accepted = 0
        self.open = 0
        self.max_open = 0
        self.bytes_read = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._server = await asyncio.start_unix_server(self._handle, path=self.path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.accepted += 1
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        try:
            while chunk := await reader.read(65536):
                self.bytes_read += len(chunk)
        finally:
            self.open -= 1
            self._tasks.discard(task)
            writer.close()


class TinyDriver:
    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        return {c.uid: PrepareResult.ok([]) for c in claims}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        return {c.uid: None for c in claims}


class Agent:
    """``drahealth agent --mode observer`` with metrics, in a subprocess."""

    def __init__(
        self, base: str, node: str = NODE, default_timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.base = base
        self.node = node
        self.default_timeout = default_timeout
        self.log_path = f"{base}/agent.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.metrics_url = ""
        self._log: Any = None

    @property
    def output(self) -> str:
        return read_text(self.log_path)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> None:
        self._log = _open_log(self.log_path)
        self.proc = await asyncio.create_subprocess_exec(
            *DRAHEALTH, "--log-level", "info", "agent", "--mode", "observer",
            "--node-name", self.node, "--registry-dir", f"{self.base}/reg",
            "--state-dir", f"{self.base}/agent", "--default-timeout", str(self.default_timeout),
            "--restart-grace", "0", "--metrics-port", "0", "--probe-interval", "0.5",
            "--podresources-socket", f"{self.base}/podresources.sock",
            stdout=self._log, stderr=asyncio.subprocess.STDOUT, env=ENV,
        )  # fmt: skip
        await until(lambda: "ready: " in self.output, 20, "the agent to get ready", self)
        found = re.search(r"^metrics: (\S+)$", self.output, re.M)
        assert found, self.output
        self.metrics_url = found.group(1)

    async def stop(self) -> int | None:
        rc = None
        if self.proc is not None:
            if self.proc.returncode is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    rc = await asyncio.wait_for(self.proc.wait(), 15)
                except TimeoutError:
                    self.proc.kill()
                    await self.proc.wait()
            else:
                rc = self.proc.returncode
        if self._log is not None:
            self._log.close()
        return rc

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def threads(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))  # type: ignore[union-attr]


class Metrics:
    """Reads the agent's /metrics: device health gauges and stream reconnects."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        self.scrapes = 0
        self.slowest = 0.0

    async def read(self) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
        t0 = time.monotonic()
        async with self.session.get(self.url) as resp:
            text = await resp.text()
        self.slowest = max(self.slowest, time.monotonic() - t0)
        self.scrapes += 1
        health: dict[tuple[str, str], float] = {}
        reconnects: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "drahealth_node_device_health":
                    health[(s.labels["driver"], s.labels["device"])] = s.value
                elif s.name == "drahealth_node_stream_reconnects_total":
                    reconnects[s.labels["driver"]] = s.value
        return health, reconnects

    async def to_unknown(self, driver: str) -> float:
        """How many transitions of ``driver``'s devices to Unknown the agent counted."""
        async with self.session.get(self.url) as resp:
            text = await resp.text()
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "drahealth_node_health_transitions_total"
            and s.labels["driver"] == driver
            and s.labels["to"] == "Unknown"
        )

    async def health(self, driver: str, device: str) -> float | None:
        return (await self.read())[0].get((driver, device))

    async def close(self) -> None:
        await self.session.close()


async def until(
    check: Callable[[], Any], within: float, what: str, agent: Agent | None = None
) -> float:
    """Poll ``check`` (sync or async) until true; the seconds it took."""
    t0 = time.monotonic()
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - t0
        if agent is not None and agent.proc is not None and agent.proc.returncode is not None:
            raise AssertionError(f"the agent exited while waiting for {what}:\n{agent.output}")
        detail = f"\n{agent.output[-3000:]}" if agent is not None else ""
        assert time.monotonic() - t0 < within, f"timed out after {within} s: {what}{detail}"
        await asyncio.sleep(0.02)


@pytest.mark.slow  # about 30 s on 2 cores: CI runs it in its slow step
async def test_half_open_streams_are_cancelled_and_reopened_without_leaks() -> None:
    base = tempfile.mkdtemp(dir="/tmp", prefix="dho-")
    reg = f"{base}/reg"
    os.makedirs(reg)
    silent = HalfOpenPlugin(f"{base}/p/silent.sock")
    once = HalfOpenPlugin(f"{base}/p/once.sock", ["once-0", "once-1"], snapshots=CYCLES)
    mute = MuteSocket(f"{base}/p/raw.sock")
    hub = HealthHub([("pool", "dev-0"), ("pool", "dev-1")], default_timeout_seconds=5)
    hub.submit("test", [DeviceReport("pool", d, Health.HEALTHY) for d in ("dev-0", "dev-1")])
    agent = Agent(base)
    metrics: Metrics | None = None
    handle = None
    latencies: list[float] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            for plugin, driver in ((silent, "silent"), (once, "once"), (mute, "raw")):
                await plugin.start()
                info = raw_info(f"{driver}.example.com", plugin.path, versions=VERSIONS)
                await stack.enter_async_context(serve(f"{reg}/{driver}-reg.sock", Registrar(info)))
            options = PluginOptions(
                "ok.example.com", registry_dir=reg, plugins_dir=f"{base}/p", cdi_dir=f"{base}/cdi"
            )
            handle = await start_plugin(TinyDriver(), options, health=hub)
            await agent.start()
            metrics = Metrics(agent.metrics_url)
            m = metrics

            async def shows(driver: str, device: str, value: float) -> bool:
                return await m.health(driver, device) == value

            await until(lambda: shows("ok.example.com", "dev-0", 1.0), 15, "ok's devices", agent)
            await until(lambda: shows("once.example.com", "once-0", 1.0), 15, "once's snapshot")
            await until(lambda: silent.calls >= 1 and mute.accepted >= 1, 15, "the other streams")
            await until(lambda: once.calls >= 3, 15, "three streams of once.example.com")
            fds_before, threads_before = agent.fds(), agent.threads()
            calls_before = once.calls

            # while the half-open streams hang and reconnect, ok's changes still flow
            flips = 0
            deadline = time.monotonic() + CYCLES * (LEASE + 1.0)
            while once.calls < CYCLES:
                assert time.monotonic() < deadline, f"only {once.calls} streams of once"
                flips += 1
                bad = flips % 2 == 1
                report = DeviceReport(
                    "pool", "dev-0", Health.UNHEALTHY if bad else Health.HEALTHY,
                    f"flip {flips}", fatal=False if bad else None,
                )  # fmt: skip
                t0 = time.monotonic()
                hub.submit("test", [report])
                await until(
                    partial(shows, "ok.example.com", "dev-0", -1.0 if bad else 1.0),
                    PROPAGATION_BOUND, f"flip {flips} of ok's dev-0", agent,
                )  # fmt: skip
                latencies.append(time.monotonic() - t0)
                await asyncio.sleep(0.2)  # pacing between changes

            # once.example.com goes silent for good: its devices turn Unknown after the lease
            await until(lambda: once.calls > CYCLES, 10, "a stream without a snapshot")
            assert once.last_snapshot_at is not None
            await until(lambda: shows("once.example.com", "once-0", 0.0), LEASE + 3, "Unknown")
            unknown_after = time.monotonic() - once.last_snapshot_at
            await until(lambda: once.calls >= CYCLES + 2, 10, "reconnects while silent")
            health, reconnects = await m.read()
            assert health[("once.example.com", "once-1")] == 0.0
            assert health[("ok.example.com", "dev-1")] == 1.0
            await until(
                lambda: agent.fds() <= fds_before + FD_SLACK, 5,
                f"the agent's fds back to {fds_before} + {FD_SLACK} (now {agent.fds()})",
            )  # fmt: skip
            fds_after, threads_after = agent.fds(), agent.threads()
            calls_during = once.calls - calls_before
            rc = await agent.stop()
    finally:
        if metrics is not None:
            await metrics.close()
        await agent.stop()
        if handle is not None:
            await handle.stop(0)
        for plugin in (silent, once, mute):
            await plugin.stop()
        output = agent.output
        shutil.rmtree(base, ignore_errors=True)

    print(
        f"\nstreams opened by the agent: once={once.calls} (cancelled {once.cancelled}, "
        f"{CYCLES} with a snapshot), silent={silent.calls} (cancelled {silent.cancelled}), "
        f"raw socket connections={mute.accepted} (max open {mute.max_open}, "
        f"{mute.bytes_read} bytes read, none answered)"
        f"\nagent reconnects: {dict(sorted(reconnects.items()))}"
        f"\nonce's devices Unknown {unknown_after:.2f} s after its last snapshot (lease {LEASE} s)"
        f"\nok's changes while the others hang: {len(latencies)}, median "
        f"{statistics.median(latencies) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms "
        f"(bound {PROPAGATION_BOUND * 1000:.0f} ms); slowest /metrics scrape "
        f"{metrics.slowest * 1000 if metrics else 0:.0f} ms"
        f"\nagent fds {fds_before} -> {fds_after} over {calls_during} stream cycles of once "
        f"(slack {FD_SLACK}); threads {threads_before} -> {threads_after}"
    )
    assert rc == 0, output
    assert "Traceback" not in output, output
    # every stalled stream was cancelled (the plugin saw it) and a new one opened
    assert once.calls >= CYCLES + 2 and calls_during >= 20
    assert once.cancelled >= once.calls - 1 and once.max_open <= 2
    assert silent.calls >= 4 and silent.cancelled >= silent.calls - 1 and silent.max_open <= 2
    assert reconnects["once.example.com"] >= once.calls - 1
    assert reconnects["silent.example.com"] >= silent.calls - 1
    assert reconnects["raw.example.com"] >= 4
    assert reconnects["ok.example.com"] == 0
    assert mute.max_open <= 2
    # the lease decides: Unknown one lease after the last snapshot, not before
    assert LEASE * 0.9 <= unknown_after <= LEASE + 1.0
    # ok's health flowed all along, within the bound
    assert len(latencies) >= 10 and max(latencies) <= PROPAGATION_BOUND
    # no descriptor leak over the cycles
    assert fds_after <= fds_before + FD_SLACK
