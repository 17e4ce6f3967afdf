"""The kubelet's side of the prepare benchmark, in its own process.

Owns nothing but load generation: reads ``{"socket", "claims": [[name, uid], ...],
"rounds"}`` as JSON on stdin, then per round sends one NodePrepareResources call per
claim, all at once, then (untimed) unprepares them all, and prints the prepare
latencies in seconds as one JSON list. A separate process, as the kubelet is,
so the driver's event loop does not also run the caller's gRPC client.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import grpc

from drahealth import api


async def run(socket: str, claims: list[list[str]], rounds: int) -> list[float]:
    samples: list[float] = []
    async with grpc.aio.insecure_channel(f"unix:{socket}") as ch:
        stub = api.dra_v1_grpc.DRAPluginStub(ch)

        async def one(name: str, uid: str) -> None:
            claim = api.dra_v1.Claim(namespace="default", name=name, uid=uid)
            req = api.dra_v1.NodePrepareResourcesRequest(claims=[claim])
            t0 = time.perf_counter()
            resp = await stub.NodePrepareResources(req)
            samples.append(time.perf_counter() - t0)
            if resp.claims[uid].error:
                raise RuntimeError(f"prepare of {name} failed: {resp.claims[uid].error}")

        async def release(name: str, uid: str) -> None:
            claim = api.dra_v1.Claim(namespace="default", name=name, uid=uid)
            resp = await stub.NodeUnprepareResources(
                api.dra_v1.NodeUnprepareResourcesRequest(claims=[claim])
            )
            if resp.claims[uid].error:
                raise RuntimeError(f"unprepare of {name} failed: {resp.claims[uid].error}")

        for i in range(rounds + 1):  # round 0 warms up
            if i == 1:
                samples.clear()
            await asyncio.gather(*(one(n, u) for n, u in claims))
            await asyncio.gather(*(release(n, u) for n, u in claims))
    return samples


if __name__ == "__main__":
    job = json.load(sys.stdin)
    print(json.dumps(asyncio.run(run(job["socket"], job["claims"], job["rounds"]))))
