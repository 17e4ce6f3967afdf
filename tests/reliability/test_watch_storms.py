"""Watch 410 storms: the reflector relists through 60 consecutive 410s and misses nothing.

The embedded API server sits behind a small aiohttp proxy (in this file) that forwards
every LIST and WATCH of the reflector. While a storm lasts, every watch attempt is
answered with a 410 in one of five shapes, in turn: an HTTP 410 Status, a 200 stream
whose first line is an ``ERROR`` event with code 410 (then end of stream, or then held
open forever), the real server's own 410 (the proxy bumps the resourceVersion and calls
the server's ``compact()`` test hook before forwarding), and a real stream cut after
30 ms by an injected ``ERROR`` 410. The storm starts with a 410 on the established watch.

Meanwhile a writer creates, updates and deletes ConfigMaps (24 names, reused, so
objects are deleted and re-created under the same name) straight on the API server.
Afterwards the reflector's store must equal the server's objects (same names, same
resourceVersions), and the events it emitted must replay to that store with no
duplicate ADDED, no MODIFIED or DELETED of an unknown object (a stale deletion) and no
resourceVersion going backwards. Every 410 is one relist; the capped backoff must keep
the LIST rate bounded (counted per second at the proxy).

The second test puts the real node agent (kubelet mode, default backoff) behind the
same proxy: a pod created during 8 consecutive 410s on its pod watch is prepared and
reported, every 410 costs exactly one pod LIST, and a later fault still reaches the pod
status. Counts are printed (pytest -s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import tempfile
import time
from collections import Counter
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.kube import Reflector, make_client, object_key, resource_version
from tests.e2e.test_agent_e2e import AgentProcess, make_pod, wait_health
from tests.integration.driver.test_sample_driver import NODE, DriverProcess, inject
from tests.reliability.test_half_open_streams import until

# 10-20 s each: CI runs them in its slow step
pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

STORM = 60  # consecutive 410s, the first on the established watch
BACKOFF_INITIAL = 0.05
BACKOFF_MAX = 0.2
JITTER = 0.5  # the reflector's Backoff default
#: Steady-state LIST rate the capped backoff allows: one per shortest capped delay.
STEADY_LIST_RATE = 1.0 / (BACKOFF_MAX * (1.0 - JITTER))
#: Most LISTs in any one-second window: the steady rate plus the ramp (the first relist
#: is immediate, the next delays are 0.025-0.05 s and 0.05-0.1 s).
PEAK_LISTS_PER_SECOND = int(STEADY_LIST_RATE) + 4
NAMES = [f"cm-{i:02d}" for i in range(24)]
NS = "default"
#: The kubelet-mode agent's pod reflector keeps its default backoff (0.1 s doubling to
#: 10 s, jitter 0.5): its n-th delay is at least 0.05 * 2**(n-1) s after an immediate
#: first relist, so at most five relists fit in one second.
AGENT_STORM = 8
AGENT_PEAK_LISTS_PER_SECOND = 5
MODES = ("http-410", "error-then-eof", "error-then-hold", "server-compacted", "error-midstream")


def gone_status(message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Expired",
        "code": 410,
    }


def error_line(message: str) -> bytes:
    return json.dumps({"type": "ERROR", "object": gone_status(message)}).encode() + b"\n"


class StormProxy:
    """Forwards GETs to the API server; while a storm lasts, watches get 410s."""

    def __init__(self, server: APIServer, direct: AsyncClient, watched: str) -> None:
        self.server = server
        self.direct = direct
        self.watched = watched  # the collection path whose LISTs are counted
        self.storm_left = 0
        self.given = 0
        self.modes: Counter[str] = Counter()
        self.server_410s = 0  # 410 ERROR events written by the real server
        self.list_times: list[float] = []
        self.watch_requests = 0
        self.live_forwards = 0
        self.storm_started_at: float | None = None
        self.storm_ended_at: float | None = None
        self.kick = asyncio.Event()
        self.url = ""
        self._bumps = 0
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self._runner = runner
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def begin(self, count: int) -> None:
        """Start a storm of ``count`` 410s; the established watch gets the first."""
        self.storm_left = count
        self.storm_started_at = time.monotonic()
        self.kick.set()

    def _take(self, mode: str | None = None) -> str | None:
        if self.storm_left <= 0:
            return None
        if mode is None:
            mode = MODES[self.given % len(MODES)]
            self.given += 1
        self.storm_left -= 1
        self.modes[mode] += 1
        if self.storm_left == 0:
            self.storm_ended_at = time.monotonic()
            self.kick.clear()
        return mode

    def _upstream(self, request: web.Request) -> str:
        return self.server.url + str(request.rel_url)

    def _headers(self, request: web.Request) -> dict[str, str]:
        return {"Accept": request.headers.get("Accept", "application/json")}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        if request.method != "GET" or request.query.get("watch") not in ("true", "1"):
            if request.method == "GET" and request.path == self.watched:
                self.list_times.append(time.monotonic())
            headers = self._headers(request)
            if request.content_type:
                headers["Content-Type"] = request.content_type
            async with self._session.request(
                request.method, self._upstream(request), headers=headers, data=await request.read()
            ) as up:
                body = await up.read()
                ctype = up.headers.get("Content-Type", "application/json")
                return web.Response(body=body, status=up.status, headers={"Content-Type": ctype})
        self.watch_requests += 1
        mode = self._take()
        if mode == "http-410":
            return web.json_response(gone_status("storm: too old resource version"), status=410)
        if mode in ("error-then-eof", "error-then-hold"):
            resp = await self._open(request)
            await resp.write(error_line("storm: too old resource version"))
            if mode == "error-then-hold":
                await asyncio.Event().wait()  # until the reflector hangs up
            await resp.write_eof()
            return resp
        if mode == "server-compacted":
            await self._bump()
            self.server.compact()  # the requested resourceVersion is now too old
            return await self._forward(request, kickable=False, expect_server_410=True)
        if mode == "error-midstream":
            return await self._forward(request, kickable=False, cut_after=0.03)
        return await self._forward(request, kickable=True)

    async def _bump(self) -> None:
        """One write outside the watched namespace: the global resourceVersion moves on."""
        self._bumps += 1
        meta = ObjectMeta(name="bump", namespace="kube-public")
        if self._bumps == 1:
            await self.direct.create(ConfigMap(metadata=meta, data={"n": "1"}))
        else:
            await self.direct.patch(
                ConfigMap, "bump", {"data": {"n": str(self._bumps)}},
                namespace="kube-public", patch_type=PatchType.MERGE,
            )  # fmt: skip

    async def _open(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200)
        resp.content_type = "application/json"
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        return resp

    async def _forward(
        self,
        request: web.Request,
        *,
        kickable: bool,
        cut_after: float | None = None,
        expect_server_410: bool = False,
    ) -> web.StreamResponse:
        assert self._session is not None
        async with self._session.get(self._upstream(request), headers=self._headers(request)) as up:
            resp = await self._open(request)
            if expect_server_410:
                first = await up.content.readline()
                event = json.loads(first)
                if event["type"] == "ERROR" and event["object"]["code"] == 410:
                    self.server_410s += 1
                await resp.write(first)
            self.live_forwards += 1
            try:
                cut = await self._pump(up, resp, kickable=kickable, cut_after=cut_after)
            finally:
                self.live_forwards -= 1
            if cut:
                await resp.write(error_line("storm: watch cut with 410"))
            await resp.write_eof()
            return resp

    async def _pump(
        self,
        up: aiohttp.ClientResponse,
        resp: web.StreamResponse,
        *,
        kickable: bool,
        cut_after: float | None,
    ) -> bool:
        """Copy upstream lines until it ends (False) or the stream is to be cut (True)."""
        loop = asyncio.get_running_loop()
        deadline = None if cut_after is None else loop.time() + cut_after
        kick = asyncio.ensure_future(self.kick.wait()) if kickable else None
        try:
            while True:
                read = asyncio.ensure_future(up.content.readline())
                waits: set[asyncio.Future[Any]] = {read} if kick is None else {read, kick}
                timeout = None if deadline is None else max(0.0, deadline - loop.time())
                done, _ = await asyncio.wait(
                    waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if read in done:
                    line = read.result()
                    if not line:
                        return False
                    await resp.write(line)
                    continue
                read.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await read
                if kick is None or not kick.done():
                    return True  # cut_after passed
                # the storm began: this stream gets its first 410 (unless it is over again)
                return self._take("error-midstream") is not None
        finally:
            if kick is not None:
                kick.cancel()


class Replay:
    """Replays the reflector's events and records every rule they break."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], int] = {}
        self.last_rv: dict[tuple[str, str], int] = {}
        self.counts: Counter[str] = Counter()
        self.violations: list[str] = []

    def __call__(self, etype: str, obj: ConfigMap, old: ConfigMap | None) -> None:
        key = object_key(obj)
        rv = int(resource_version(obj) or 0)
        self.counts[etype] += 1
        last = self.last_rv.get(key, -1)
        if rv < last or (etype != "DELETED" and rv == last):
            self.violations.append(f"{etype} {key} at rv {rv} after rv {last}")
        self.last_rv[key] = max(last, rv)
        if etype == "ADDED":
            if key in self.objects:
                self.violations.append(f"duplicate ADDED {key} at rv {rv}")
            self.objects[key] = rv
        elif etype == "MODIFIED":
            if key not in self.objects:
                self.violations.append(f"MODIFIED of unknown {key} at rv {rv}")
            self.objects[key] = rv
        elif etype == "DELETED":
            if key not in self.objects:
                self.violations.append(f"stale DELETED of unknown {key} at rv {rv}")
            self.objects.pop(key, None)


async def truth(direct: AsyncClient) -> dict[tuple[str, str], int]:
    return {
        object_key(o): int(resource_version(o) or 0)
        async for o in direct.list(ConfigMap, namespace=NS)
    }


def stored(reflector: Reflector[ConfigMap]) -> dict[tuple[str, str], int]:
    return {k: int(resource_version(o) or 0) for k, o in reflector.store.items()}


async def writer(
    direct: AsyncClient, rng: random.Random, alive: set[str], ops: Counter[str], stop: asyncio.Event
) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        name = rng.choice(NAMES)
        if name not in alive:
            meta = ObjectMeta(name=name, namespace=NS)
            await direct.create(ConfigMap(metadata=meta, data={"v": str(n)}))
            alive.add(name)
            ops["create"] += 1
        elif rng.random() < 0.5:
            await direct.patch(
                ConfigMap, name, {"data": {"v": str(n)}}, namespace=NS,
                patch_type=PatchType.MERGE,
            )  # fmt: skip
            ops["update"] += 1
        else:
            await direct.delete(ConfigMap, name, namespace=NS)
            alive.discard(name)
            ops["delete"] += 1
        await asyncio.sleep(rng.uniform(0.002, 0.02))


def peak_per_second(times: list[float]) -> int:
    """Most timestamps in any window of one second."""
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - 1.0:
            j += 1
        best = max(best, i - j + 1)
    return best


async def test_reflector_survives_a_410_storm_and_misses_nothing() -> None:
    rng = random.Random(20261123)
    server = APIServer(data_file=None)
    await server.start(port=0)
    direct = make_client(server_url=server.url, timeout=10.0)
    proxy = StormProxy(server, direct, f"/api/v1/namespaces/{NS}/configmaps")
    await proxy.start()
    via_proxy = make_client(server_url=proxy.url, timeout=10.0)
    reflector = Reflector(
        via_proxy, ConfigMap, namespace=NS,
        backoff_initial=BACKOFF_INITIAL, backoff_max=BACKOFF_MAX,
    )  # fmt: skip
    replay = Replay()
    reflector.add_handler(replay)
    alive: set[str] = set()
    ops: Counter[str] = Counter()
    stop = asyncio.Event()
    write_task: asyncio.Task[None] | None = None
    try:
        for name in NAMES[:10]:
            await direct.create(ConfigMap(metadata=ObjectMeta(name=name, namespace=NS)))
            alive.add(name)
        await reflector.start()
        await reflector.wait_synced(10)
        await until(lambda: proxy.live_forwards == 1, 10, "the first watch")
        write_task = asyncio.create_task(writer(direct, rng, alive, ops, stop))
        await until(lambda: ops.total() >= 20, 10, "writes on the healthy watch")

        proxy.begin(STORM)
        await until(lambda: proxy.storm_left == 0, 60, f"{STORM} watch attempts")
        await until(lambda: reflector.relists == STORM, 10, "the last relist")
        assert proxy.storm_started_at is not None and proxy.storm_ended_at is not None
        storm_s = proxy.storm_ended_at - proxy.storm_started_at
        during = [
            t for t in proxy.list_times if proxy.storm_started_at <= t <= proxy.storm_ended_at
        ]
        # writes go on for a while on the watch after the storm
        after_storm = ops.total()
        await until(lambda: ops.total() >= after_storm + 40, 10, "writes after the storm")
        stop.set()
        await write_task

        expected = await truth(direct)
        caught_up = await until(
            lambda: stored(reflector) == expected, 10, "the store to equal the server"
        )
        assert stored(reflector) == await truth(direct)  # nothing arrived late
    finally:
        stop.set()
        if write_task is not None and not write_task.done():
            write_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await write_task
        await reflector.stop()
        await via_proxy.close()
        await proxy.stop()
        await direct.close()
        await server.stop()

    peak = peak_per_second(during)
    mean = (len(during) - 1) / max(during[-1] - during[0], 1e-9)
    print(
        f"\n{STORM} consecutive 410s in {storm_s:.1f} s ({dict(sorted(proxy.modes.items()))}, "
        f"{proxy.server_410s} written by the server itself); "
        f"{ops['create']} creates, {ops['update']} updates, {ops['delete']} deletes"
        f"\nreflector: lists={reflector.lists} relists={reflector.relists} "
        f"watches={reflector.watches} reconnects={reflector.reconnects}; "
        f"events {dict(sorted(replay.counts.items()))}"
        f"\nLIST requests during the storm: {len(during)}, peak {peak}/s in a 1 s window "
        f"(bound {PEAK_LISTS_PER_SECOND}), mean {mean:.1f}/s (bound {STEADY_LIST_RATE:.1f})"
        f"\nstore equal to the server ({len(expected)} objects) {caught_up * 1000:.0f} ms after "
        f"the last write; {len(replay.violations)} missed/duplicate/stale events"
    )
    assert replay.violations == []
    assert replay.objects == expected  # the events replay to the server's state
    assert set(expected) == {(NS, n) for n in alive}  # the writer's own view agrees
    assert ops["delete"] >= 20 and ops["create"] >= 20 + 10  # names were re-created
    # every 410 is exactly one relist; nothing else failed
    assert proxy.modes.total() == STORM and proxy.given == STORM - 1
    assert min(proxy.modes[m] for m in MODES) >= 10
    assert proxy.server_410s == proxy.modes["server-compacted"]
    assert reflector.relists == STORM
    assert reflector.lists == STORM + 1 == len(proxy.list_times)
    assert reflector.reconnects == 0 and reflector.last_error is None
    assert reflector.watches == proxy.watch_requests >= STORM + 1
    # the backoff bounds the LIST rate (a tight relist loop would do hundreds a second)
    assert peak <= PEAK_LISTS_PER_SECOND, during
    assert mean <= STEADY_LIST_RATE


def write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


async def test_kubelet_mode_agent_rides_out_a_410_storm() -> None:
    """The real agent (kubelet mode) reaches the API only through the storm proxy; a pod
    created during ``AGENT_STORM`` consecutive 410s on its pod watch is prepared and
    gets its device health once the storm is over, and later faults still arrive."""
    base = tempfile.mkdtemp(dir="/tmp", prefix="dws-")
    server = APIServer(data_file=None)
    await server.start(port=0)
    direct = make_client(server_url=server.url, timeout=10.0)
    proxy = StormProxy(server, direct, "/api/v1/pods")
    await proxy.start()
    kubeconfig = str(server.write_kubeconfig(f"{base}/kubeconfig"))
    write_text(f"{base}/kubeconfig-proxy", read_text(kubeconfig).replace(server.url, proxy.url))
    driver = DriverProcess(base, kubeconfig=kubeconfig, health_timeout=2)  # direct access
    agent = AgentProcess(base, f"{base}/kubeconfig-proxy")
    try:
        await direct.create(Node(metadata=ObjectMeta(name=NODE)))
        await driver.start()
        await agent.start()
        await make_pod(direct, "before", ["gpu-0"])
        await wait_health(direct, "before", "gpu-0", "Healthy", 15)
        await until(lambda: proxy.live_forwards == 1, 10, "the agent's pod watch")

        proxy.begin(AGENT_STORM)
        await until(lambda: proxy.modes.total() >= 3, 10, "the storm to be under way")
        await make_pod(direct, "during", ["gpu-1"])
        created = time.monotonic()
        await wait_health(direct, "during", "gpu-1", "Healthy", 30)  # from a relist
        took = time.monotonic() - created
        await until(lambda: proxy.storm_left == 0, 30, f"{AGENT_STORM} watch attempts")
        assert proxy.storm_started_at is not None and proxy.storm_ended_at is not None
        storm_s = proxy.storm_ended_at - proxy.storm_started_at
        start = proxy.storm_started_at
        await until(
            lambda: len([t for t in proxy.list_times if t >= start]) >= AGENT_STORM, 15,
            "the relist after the last 410",
        )  # fmt: skip
        await until(lambda: proxy.live_forwards == 1, 10, "the agent's pod watch again")
        rc, out, _ = await inject(driver.state, "gpu-1", "unhealthy", "--message", "after")
        assert rc == 0, out
        fault = await wait_health(direct, "during", "gpu-1", "Unhealthy", 5, message="after")
        assert (await wait_health(direct, "before", "gpu-0", "Healthy", 1)) < 1
        assert agent.proc is not None and agent.proc.returncode is None
        lists = [t for t in proxy.list_times if t >= start]
    finally:
        if agent.proc is not None:
            await agent.stop()
        if driver.proc is not None:
            await driver.stop()
        await proxy.stop()
        await direct.close()
        await server.stop()
        shutil.rmtree(base, ignore_errors=True)

    peak = peak_per_second(lists)
    print(
        f"\nkubelet-mode agent: {AGENT_STORM} consecutive 410s on its pod watch in "
        f"{storm_s:.1f} s ({dict(sorted(proxy.modes.items()))}); {len(lists)} pod LISTs "
        f"(peak {peak}/s, bound {AGENT_PEAK_LISTS_PER_SECOND}); the pod created during the "
        f"storm was prepared and Healthy {took:.2f} s after its creation, a fault after the "
        f"storm in the pod status {fault * 1000:.0f} ms after the inject"
    )
    assert proxy.modes.total() == AGENT_STORM
    assert len(lists) == AGENT_STORM  # one relist per 410, nothing more
    assert peak <= AGENT_PEAK_LISTS_PER_SECOND
