"""SIGKILL the embedded API server during a stream of writes: nothing acknowledged is lost
and no resourceVersion is ever handed out twice.

A worker (``_apiserver_worker``) forks API server processes on one data file. Each
round, concurrent clients create, update and delete ConfigMaps (one name per client,
so each name's history is a sequence); the server is killed with SIGKILL at a random
moment, restarted on the same files, and then every name must hold its last
acknowledged write or the one that was in flight when the kill came. Every
resourceVersion seen in an answer must belong to exactly one write across all lives,
and a restarted server's list resourceVersion must be at least the highest one ever
handed out. A small compaction threshold makes kills land in snapshot writes and log
rotations too. The counts are printed (pytest -s).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from pathlib import Path

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PATH = "/api/v1/namespaces/default/configmaps"
NAMES = [f"cm-{i}" for i in range(8)]
PAD = "x" * 600  # objects of ~1 KB: a compaction every ~16 writes at 16 KiB


class Model:
    """What each name must hold, and which write produced each resourceVersion."""

    def __init__(self) -> None:
        self.state: dict[str, int | None] = dict.fromkeys(NAMES)  # seq of the data, None: absent
        self.inflight: dict[str, int | None] = {}  # name -> outcome of the unanswered write
        self.owner: dict[int, tuple[str, int]] = {}  # rv -> (name, write id)
        self.max_rv = 0
        self.acked = self.sent = 0

    def handed_out(self, rv: str, name: str, write: int) -> None:
        n = int(rv)
        prior = self.owner.setdefault(n, (name, write))
        assert prior == (name, write), f"resourceVersion {n} handed out twice: {prior}, {name}"
        self.max_rv = max(self.max_rv, n)


async def writer(http: aiohttp.ClientSession, name: str, model: Model, rng: random.Random) -> None:
    while True:
        exists = model.state[name] is not None
        model.sent += 1
        write = model.sent
        body = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"},
            "data": {"seq": str(write), "pad": PAD},
        }  # fmt: skip
        if not exists:
            method, url, outcome = "POST", PATH, write
        elif rng.random() < 0.25:
            method, url, outcome, body = "DELETE", f"{PATH}/{name}", None, {}
        else:
            method, url, outcome = "PUT", f"{PATH}/{name}", write
        model.inflight[name] = outcome
        async with http.request(method, url, json=body) as resp:
            got = await resp.json()
            assert resp.status in (200, 201), (method, name, resp.status, got)
        del model.inflight[name]
        model.state[name] = outcome
        model.acked += 1
        if method != "DELETE":  # a DELETE of a ConfigMap answers a Status, as upstream's
            model.handed_out(got["metadata"]["resourceVersion"], name, write)


async def check_restart(http: aiohttp.ClientSession, model: Model) -> None:
    async with http.get(PATH) as resp:
        listing = await resp.json()
    found = {
        o["metadata"]["name"]: int(o["data"]["seq"])
        for o in listing["items"]
        if o["metadata"]["name"] in model.state
    }
    list_rv = int(listing["metadata"]["resourceVersion"])
    assert list_rv >= model.max_rv, f"restarted at resourceVersion {list_rv} < {model.max_rv}"
    for name in NAMES:
        allowed = {model.state[name]}
        if name in model.inflight:
            allowed.add(model.inflight[name])
        assert found.get(name) in allowed, (name, found.get(name), allowed)
        model.state[name] = found.get(name)
    for o in listing["items"]:  # objects that survived carry the rv of their own write
        name = o["metadata"]["name"]
        model.handed_out(o["metadata"]["resourceVersion"], name, int(o["data"]["seq"]))
    model.inflight.clear()


async def run_kills(tmp_path: Path, iterations: int, seed: int) -> None:
    rng = random.Random(seed)
    data = tmp_path / "apiserver.json"
    zygote = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.reliability._apiserver_worker", str(data), "16384",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert zygote.stdin is not None and zygote.stdout is not None
    model = Model()
    started = time.monotonic()

    async def reply(prefix: str) -> list[str]:
        assert zygote.stdout is not None
        line = (await asyncio.wait_for(zygote.stdout.readline(), 30)).decode().split()
        assert line and line[0] == prefix, f"worker said {line!r}, expected {prefix}"
        return line

    try:
        for _ in range(iterations):
            zygote.stdin.write(b"spawn\n")
            _, pid, url = await reply("ready")
            async with aiohttp.ClientSession(base_url=url) as http:
                await check_restart(http, model)
                tasks = [asyncio.create_task(writer(http, n, model, rng)) for n in NAMES]
                target = model.acked + rng.randint(0, 40)
                deadline = time.monotonic() + 10
                while model.acked < target:
                    assert time.monotonic() < deadline, "writes stalled"
                    assert not any(t.done() for t in tasks), [t.exception() for t in tasks]
                    await asyncio.sleep(0.001)
                await asyncio.sleep(rng.random() * 0.005)
                os.kill(int(pid), signal.SIGKILL)
                zygote.stdin.write(f"reap {pid}\n".encode())
                await reply("dead")
                for t in tasks:
                    t.cancel()
                results = await asyncio.gather(*tasks, return_exceptions=True)
                for r in results:  # a failed write must be a lost connection, nothing else
                    assert isinstance(r, asyncio.CancelledError | aiohttp.ClientError), r
        zygote.stdin.write(b"spawn\n")
        _, pid, url = await reply("ready")
        async with aiohttp.ClientSession(base_url=url) as http:
            await check_restart(http, model)
        os.kill(int(pid), signal.SIGKILL)
    finally:
        zygote.stdin.close()
        await asyncio.wait_for(zygote.wait(), 30)
    took = time.monotonic() - started
    print(
        f"\n{iterations} SIGKILLs in {took:.1f} s, {model.sent} writes sent, {model.acked} "
        f"acknowledged, 0 lost, {len(model.owner)} resourceVersions, none reused"
    )


async def test_sigkill_during_writes_loses_nothing_acknowledged(tmp_path: Path) -> None:
    await run_kills(tmp_path, 20, 20261201)


@pytest.mark.slow
async def test_two_hundred_sigkills_lose_nothing_acknowledged(tmp_path: Path) -> None:
    await run_kills(tmp_path, 200, 20261202)
