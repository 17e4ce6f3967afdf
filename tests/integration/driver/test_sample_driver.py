"""Acceptance tests of ``drahealth driver`` (sample driver) and ``drahealth inject``.

The driver runs as a subprocess; the tests talk to it only over its sockets: the
registration and DRA sockets with the generated gRPC stubs, the control socket with
``drahealth inject`` (a subprocess too) or the control client. This file needs no API
server; ``test_sample_driver_kube.py`` covers claims, slices and taints.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from drahealth import api, simdriver
from drahealth.cli import driver as cli
from drahealth.simdriver import control_socket_path, request

pytestmark = pytest.mark.timeout(30)

DRIVER = "gpu.example.com"
NODE = "node-1"
HEALTHY, UNHEALTHY, UNKNOWN = 1, 2, 0

_EXE = Path(sys.executable).with_name("drahealth")
DRAHEALTH = (
    [str(_EXE)]
    if _EXE.exists()
    else [sys.executable, "-c", "from drahealth.cli import main; main()"]
)
ENV = {**os.environ, "GRPC_VERBOSITY": "ERROR"}


# --------------------------------------------------------------------------- helpers


def read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        return ""


def read_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


def exists(path: str) -> bool:
    return os.path.lexists(path)


def mode(path: str) -> int:
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode), path
    return stat.S_IMODE(st.st_mode)


def _open_log(path: str) -> Any:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return open(path, "wb")


class DriverProcess:
    """``drahealth driver`` in a subprocess with short socket paths under ``base``."""

    _runs = 0

    def __init__(
        self,
        base: str,
        *args: str,
        driver: str = DRIVER,
        node: str = NODE,
        registry: str | None = None,
        plugins: str | None = None,
        log_level: str | None = None,
        **opts: Any,
    ) -> None:
        self.base, self.driver, self.node = base, driver, node
        # a real kubelet's own directories, or short ones under base
        self.registry = registry or f"{base}/reg"
        self.plugins = plugins or f"{base}/plugins"
        self.cdi = f"{base}/cdi"
        self.state = f"{base}/state"
        self.args = [
            *(["--log-level", log_level] if log_level else []),
            "driver",
            "--driver-name", driver,
            "--node-name", node,
            "--registry-dir", self.registry,
            "--plugins-dir", self.plugins,
            "--cdi-dir", self.cdi,
            "--state-dir", self.state,
            *args,
        ]  # fmt: skip
        for key, value in opts.items():
            self.args += [f"--{key.replace('_', '-')}", str(value)]
        self.proc: asyncio.subprocess.Process | None = None
        self.out_path = ""
        self._log: Any = None

    @property
    def registrar_socket(self) -> str:
        uid = self.args[self.args.index("--pod-uid") + 1] if "--pod-uid" in self.args else None
        return api.registrar_socket_path(self.driver, self.registry, uid)

    @property
    def dra_socket(self) -> str:
        return f"{self.plugins}/{self.driver}/dra.sock"

    @property
    def control_socket(self) -> str:
        return control_socket_path(self.state)

    @property
    def output(self) -> str:
        return read_text(self.out_path)

    async def start(self, timeout: float = 20.0) -> DriverProcess:  # noqa: ASYNC109
        DriverProcess._runs += 1
        self.out_path = f"{self.base}/driver-{DriverProcess._runs}.log"
        self._log = _open_log(self.out_path)
        self.proc = await asyncio.create_subprocess_exec(
            *DRAHEALTH, *self.args, stdout=self._log, stderr=asyncio.subprocess.STDOUT, env=ENV
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while "ready: " not in self.output:
            if self.proc.returncode is not None or loop.time() > deadline:
                raise AssertionError(f"driver did not get ready:\n{self.output}")
            await asyncio.sleep(0.02)
        ready = re.search(r"^ready: (.*)$", self.output, re.M)
        assert ready is not None and ready.group(1) == self.registrar_socket
        return self

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        rc = await asyncio.wait_for(self.proc.wait(), 10)
        self.close()
        return rc

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


@pytest.fixture
def base() -> Iterator[str]:
    d = tempfile.mkdtemp(dir="/tmp", prefix="sd-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def processes() -> AsyncIterator[list[DriverProcess]]:
    """Driver processes a test started; anything still running is stopped at the end."""
    procs: list[DriverProcess] = []
    yield procs
    for p in procs:
        if p.proc is not None and p.proc.returncode is None:
            p.proc.kill()
            await p.proc.wait()
        p.close()


@pytest.fixture
def launch(base: str, processes: list[DriverProcess]) -> Callable[..., Any]:
    async def run(*args: str, base_dir: str | None = None, **kw: Any) -> DriverProcess:
        p = DriverProcess(base_dir or base, *args, **kw)
        processes.append(p)
        return await p.start()

    return run


async def inject(state_dir: str, *args: str) -> tuple[int, str, float]:
    """Run ``drahealth inject``; returns (exit code, output, loop time at exit)."""
    proc = await asyncio.create_subprocess_exec(
        *DRAHEALTH, "inject", "--state-dir", state_dir, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=ENV,
    )  # fmt: skip
    out, _ = await proc.communicate()
    exited = asyncio.get_running_loop().time()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), exited


def devices_of(resp: Any) -> dict[str, Any]:
    return {d.device.device_name: d for d in resp.devices}


class Watch:
    """One NodeWatchResources stream, read in the background, timestamped."""

    def __init__(self, socket_path: str, version: str = "v1", **channel_opts: Any) -> None:
        options = list(channel_opts.items())
        self.channel = grpc.aio.insecure_channel(f"unix://{socket_path}", options=options)
        mod, stub = (
            (api.health_v1, api.health_v1_grpc)
            if version == "v1"
            else (api.health_v1alpha1, api.health_v1alpha1_grpc)
        )
        self.call = stub.DRAResourceHealthStub(self.channel).NodeWatchResources(
            mod.NodeWatchResourcesRequest()
        )
        self.received: list[tuple[float, Any]] = []
        self._new = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> Watch:
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        while (resp := await self.call.read()) is not grpc.aio.EOF:
            self.received.append((loop.time(), resp))
            self._new.set()

    async def wait_for(
        self,
        check: Callable[[Any], bool],
        *,
        start: int = 0,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> tuple[float, Any]:
        """The first response from index ``start`` on that passes ``check``."""
        async with asyncio.timeout(timeout):
            i = start
            while True:
                while i < len(self.received):
                    t, resp = self.received[i]
                    if check(resp):
                        return t, resp
                    i += 1
                self._new.clear()
                await self._new.wait()

    async def close(self) -> None:
        self.call.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.channel.close()


def health_is(device: str, health: int) -> Callable[[Any], bool]:
    return lambda resp: devices_of(resp)[device].health == health


# --------------------------------------------------------------------------- tests


def test_cli_profiles_match_the_sample() -> None:
    assert cli.PROFILES == simdriver.PROFILES


async def test_registration_sockets_and_clean_sigterm(launch: Callable[..., Any]) -> None:
    d: DriverProcess = await launch()
    assert simdriver.NO_KUBECONFIG_MESSAGE in d.output.splitlines()
    async with grpc.aio.insecure_channel(f"unix://{d.registrar_socket}") as ch:
        info = await api.registration_grpc.RegistrationStub(ch).GetInfo(
            api.registration.InfoRequest()
        )
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, d.dra_socket)
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    for path in (d.registrar_socket, d.dra_socket, d.control_socket):
        assert mode(path) == 0o600
    assert await d.stop(signal.SIGTERM) == 0
    for path in (d.registrar_socket, d.dra_socket, d.control_socket):
        assert not exists(path), path


async def test_sigint_stops_cleanly_too(launch: Callable[..., Any]) -> None:
    d: DriverProcess = await launch()
    watch = Watch(d.dra_socket).start()
    await watch.wait_for(lambda r: True)
    assert await d.stop(signal.SIGINT) == 0
    assert not exists(d.registrar_socket) and not exists(d.dra_socket)
    await watch.close()


async def test_prepare_without_api_access_fails_per_claim(launch: Callable[..., Any]) -> None:
    d: DriverProcess = await launch()
    async with grpc.aio.insecure_channel(f"unix://{d.dra_socket}") as ch:
        stub = api.dra_v1_grpc.DRAPluginStub(ch)
        claims = [api.dra_v1.Claim(namespace="ns", name="a", uid="u1")]
        resp = await stub.NodePrepareResources(
            api.dra_v1.NodePrepareResourcesRequest(claims=claims)
        )
        assert resp.claims["u1"].error == (
            "no Kubernetes API access configured; cannot fetch ResourceClaim ns/a"
        )
        un = await stub.NodeUnprepareResources(
            api.dra_v1.NodeUnprepareResourcesRequest(claims=claims)
        )
        assert un.claims["u1"].error == ""


async def test_initial_snapshot_and_inject_latency(launch: Callable[..., Any]) -> None:
    d: DriverProcess = await launch(health_timeout=7)
    watch = Watch(d.dra_socket).start()
    try:
        _, first = await watch.wait_for(lambda r: True)
        devs = devices_of(first)
        assert sorted(devs) == [f"gpu-{i}" for i in range(8)]
        for dev in first.devices:
            assert dev.device.pool_name == NODE
            assert dev.health == HEALTHY
            assert dev.health_check_timeout_seconds == 7
            assert dev.last_updated_time > 0

        for action, health, message in [
            ("unhealthy", UNHEALTHY, "xid 79"),
            ("healthy", HEALTHY, ""),
            ("unknown", UNKNOWN, "lost"),
            ("healthy", HEALTHY, ""),
        ]:
            mark = len(watch.received)
            args = ["--message", message] if message else []
            rc, out, exited = await inject(d.state, f"{NODE}/gpu-3", action, *args)
            assert rc == 0, out
            t, resp = await watch.wait_for(health_is("gpu-3", health), start=mark)
            assert t - exited <= 0.1, f"{action}: seen {t - exited:.3f}s after inject exited"
            assert devices_of(resp)["gpu-3"].message == message
            assert all(x.health == HEALTHY for x in resp.devices if x.device.device_name != "gpu-3")
        assert "gpu-3: Healthy" in out
    finally:
        await watch.close()


async def test_inject_errors(launch: Callable[..., Any], base: str) -> None:
    d: DriverProcess = await launch()
    unknown, bad_action, elsewhere = await asyncio.gather(
        inject(d.state, "gpu-42", "unhealthy"),
        inject(d.state, "gpu-1", "explode"),
        inject(f"{base}/elsewhere", "gpu-1", "unhealthy"),
    )
    assert unknown[0] == 1 and "unknown device 'gpu-42'" in unknown[1]
    assert bad_action[0] == 2 and "Invalid value for" in bad_action[1]
    assert elsewhere[0] == 1 and "no control socket at" in elsewhere[1]
    assert await d.stop() == 0
    rc, out, _ = await inject(d.state, "gpu-1", "unhealthy")
    assert rc == 1 and "no control socket at" in out


async def test_heartbeat_before_timeout(launch: Callable[..., Any]) -> None:
    d: DriverProcess = await launch(health_timeout=1)
    watch = Watch(d.dra_socket).start()
    try:
        await watch.wait_for(lambda r: True)
        await watch.wait_for(lambda r: True, start=4)
        times = [t for t, _ in watch.received[:5]]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(gap < 0.7 for gap in gaps), gaps  # re-sent every third of the 1 s timeout
        assert all(r.devices[0].health_check_timeout_seconds == 1 for _, r in watch.received)
        assert len({r.SerializeToString() for _, r in watch.received[:5]}) == 1  # no change
    finally:
        await watch.close()


async def test_two_concurrent_streams_v1_and_v1alpha1(launch: Callable[..., Any]) -> None:
    d: DriverProcess = await launch()
    a, b = Watch(d.dra_socket, "v1").start(), Watch(d.dra_socket, "v1alpha1").start()
    try:
        _, ra = await a.wait_for(lambda r: True)
        _, rb = await b.wait_for(lambda r: True)
        assert ra.SerializeToString() == rb.SerializeToString()  # byte-identical versions
        assert len(ra.devices) == 8
        status = await request(d.control_socket, "status")
        assert status["streams"] == 2
        rc, out, exited = await inject(d.state, "gpu-5", "unhealthy", "--message", "gone")
        assert rc == 0, out
        ta, _ = await a.wait_for(health_is("gpu-5", UNHEALTHY))
        tb, _ = await b.wait_for(health_is("gpu-5", UNHEALTHY))
        assert max(ta, tb) - exited <= 0.1
    finally:
        await a.close()
        await b.close()


async def test_stalled_reader_does_not_delay_the_other(launch: Callable[..., Any]) -> None:
    d: DriverProcess = await launch(health_timeout=2)
    # a reader that never reads, with a 1 KiB flow-control window: the driver's writes
    # to it block almost at once
    stalled = Watch(d.dra_socket, **{"grpc.http2.lookahead_bytes": 1024, "grpc.http2.bdp_probe": 0})
    await stalled.call.read()
    live = Watch(d.dra_socket).start()
    try:
        await live.wait_for(lambda r: True)
        changes = 120
        for i in range(changes):
            reply = await request(d.control_socket, "unknown", f"gpu-{i % 8}", f"{i} " + "x" * 900)
            assert reply["ok"]
        done = asyncio.get_running_loop().time()
        last = f"{changes - 1} "
        t, _ = await live.wait_for(
            lambda r: devices_of(r)[f"gpu-{(changes - 1) % 8}"].message.startswith(last)
        )
        assert t - done <= 0.1
        # a further change still reaches the live reader at once
        rc, out, exited = await inject(d.state, "gpu-0", "unhealthy")
        assert rc == 0, out
        t, _ = await live.wait_for(health_is("gpu-0", UNHEALTHY))
        assert t - exited <= 0.1
        # the stalled reader really was stalled: it skipped to the newest snapshots
        stalled.start()
        await stalled.wait_for(health_is("gpu-0", UNHEALTHY))
        assert len(stalled.received) < changes / 2 < len(live.received)
    finally:
        await stalled.close()
        await live.close()


async def test_long_multibyte_message_is_truncated_utf8_safe(launch: Callable[..., Any]) -> None:
    d: DriverProcess = await launch()
    watch = Watch(d.dra_socket).start()
    try:
        await watch.wait_for(lambda r: True)
        message = "é" * 1000
        assert len(message.encode()) == 2000
        rc, out, _ = await inject(d.state, "gpu-2", "unhealthy", "--message", message)
        assert rc == 0, out
        _, resp = await watch.wait_for(health_is("gpu-2", UNHEALTHY))
        wire = devices_of(resp)["gpu-2"].message
        assert len(wire.encode()) <= 1024
        assert wire.endswith("...")
        assert wire == "é" * 510 + "..."  # 1020 bytes of whole characters
    finally:
        await watch.close()


async def test_silence_and_resume(launch: Callable[..., Any]) -> None:
    d: DriverProcess = await launch(health_timeout=1)
    watch = Watch(d.dra_socket).start()
    try:
        await watch.wait_for(lambda r: True)
        rc, out, _ = await inject(d.state, "*", "silence")
        assert rc == 0 and "[streams silenced]" in out
        quiet_from = len(watch.received)
        await asyncio.sleep(1.0)  # three heartbeat intervals
        assert len(watch.received) - quiet_from <= 1  # at most one already in flight
        mark = len(watch.received)
        rc, out, exited = await inject(d.state, "*", "resume")
        assert rc == 0, out
        t, _ = await watch.wait_for(lambda r: True, start=mark)
        assert t - exited <= 0.1
    finally:
        await watch.close()


async def test_metrics_endpoint(launch: Callable[..., Any]) -> None:
    d: DriverProcess = await launch(metrics_port=0)
    found = re.search(r"^metrics: (http://127\.0\.0\.1:\d+/metrics)$", d.output, re.M)
    assert found is not None
    watch = Watch(d.dra_socket).start()
    try:
        await watch.wait_for(lambda r: True)
        rc, out, _ = await inject(d.state, "gpu-1", "unhealthy")
        assert rc == 0, out
        async with aiohttp.ClientSession() as http, http.get(found.group(1)) as resp:
            assert resp.status == 200
            text = await resp.text()
    finally:
        await watch.close()
    values = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return values[(name, frozenset({"driver": DRIVER, **labels}.items()))]

    health = "drahealth_driver_device_health"
    assert value(health, pool=NODE, device="gpu-1", state="Unhealthy") == 1
    assert value(health, pool=NODE, device="gpu-1", state="Healthy") == 0
    assert value(health, pool=NODE, device="gpu-0", state="Healthy") == 1
    assert value("drahealth_driver_health_streams") == 1
    assert value("drahealth_driver_slice_publish_errors_total") == 0
    for family in ("drahealth_driver_prepare_seconds", "drahealth_driver_unprepare_seconds"):
        assert value(f"{family}_count") == 0


async def test_sim_nic_profile_and_partitions(launch: Callable[..., Any], base: str) -> None:
    nic: DriverProcess = await launch(
        profile="sim-nic", driver="nic.example.com", devices=3, base_dir=f"{base}/n"
    )
    watch = Watch(nic.dra_socket).start()
    try:
        _, resp = await watch.wait_for(lambda r: True)
        assert sorted(devices_of(resp)) == ["nic-0", "nic-1", "nic-2"]
    finally:
        await watch.close()
    gpu: DriverProcess = await launch(devices=2, partitions=4, base_dir=f"{base}/g")
    watch = Watch(gpu.dra_socket).start()
    try:
        _, resp = await watch.wait_for(lambda r: True)
        names = sorted(devices_of(resp))
        assert len(names) == 2 * 5
        assert "gpu-1-full" in names and "gpu-1-partition-3" in names
    finally:
        await watch.close()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--profile", "sim-nic", "--partitions", "2"], "--partitions applies to the sim-gpu"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "kubeconfig /nonexistent/kubeconfig: file"),
        (["--broken-device", "gpu-99"], "--broken-device names unknown devices: gpu-99"),
    ],
)
async def test_bad_options_exit_nonzero(base: str, args: list[str], error: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *DRAHEALTH, "driver", *args,
        "--registry-dir", f"{base}/reg", "--plugins-dir", f"{base}/plugins",
        "--cdi-dir", f"{base}/cdi", "--state-dir", f"{base}/state",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=ENV,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 1, out
    assert f"Error: {error}".encode() in out
    assert b"Traceback" not in out
