"""Benchmark of the remediation controller at cluster scale on the embedded API server.

Owns nothing but measurements. Seeds ``nodes`` x 8 devices (ResourceSlices) and ``pods``
pods, each with an allocated claim on its own device and a Healthy
``allocatedResourcesStatus``; runs ``drahealth controller`` as a subprocess (leader
election included); then, one at a time, marks a pod's device Unhealthy in its status
and measures the time until the controller's DeviceTaintRule for that device is seen by
a watch. Prints p50/p99 reaction and the controller's peak RSS.

Run: ``python bench/remedy_bench.py [--quick]`` (quick: 100 nodes, 500 pods).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceClaim, ResourceSlice
from lightkube.types import PatchType
from pipeline_bench import pct, rss_mb

from drahealth.controlplane import APIServer
from drahealth.kube import Reflector, make_client

DRIVER = "gpu.example.com"
POLICY = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
rules:
  - name: xid
    match: {driver: gpu.example.com}
    action: {effect: NoSchedule}
"""


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def status(device: str, pool: str, health: str, message: str = "") -> dict[str, object]:
    res = {"resourceID": f"{DRIVER}/{pool}/{device}", "health": health}
    if message:
        res["message"] = message
    entry = {"name": "claim:gpu", "resources": [res]}
    container = {"name": "m", "ready": True, "restartCount": 0, "image": "x", "imageID": "",
                 "allocatedResourcesStatus": [entry]}  # fmt: skip
    return {"status": {"phase": "Running", "containerStatuses": [container]}}


async def seed(client: AsyncClient, nodes: int, pods: int) -> list[tuple[str, str, str]]:
    """(pod, pool, device) for every pod."""
    for n in range(nodes):
        node = f"node-{n}"
        await client.create(ResourceSlice.from_dict({
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}"} for i in range(8)]},
        }))  # fmt: skip
    placed = [(f"p{i}", f"node-{i // 8}", f"gpu-{i % 8}") for i in range(pods)]

    async def one(name: str, pool: str, device: str) -> None:
        request = {"name": "gpu", "exactly": {"deviceClassName": "g"}}
        await client.create(ResourceClaim.from_dict({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [request]}},
        }))  # fmt: skip
        result = {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
        await client.patch(
            ResourceClaim.Status, name,
            {"status": {"allocation": {"devices": {"results": [result]}}}},
            namespace="default", patch_type=PatchType.MERGE,
        )  # fmt: skip
        container = {"name": "m", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
        await client.create(Pod.from_dict({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": pool, "containers": [container],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
        }))  # fmt: skip
        await client.patch(
            Pod.Status, name, status(device, pool, "Healthy"), namespace="default",
            patch_type=PatchType.MERGE,
        )  # fmt: skip

    for chunk in range(0, pods, 25):
        await asyncio.gather(*(one(*p) for p in placed[chunk : chunk + 25]))
    return placed


async def run(nodes: int, pods: int, faults: int) -> dict[str, float]:
    base = tempfile.mkdtemp(prefix="dhr-", dir="/tmp")
    server = APIServer()
    await server.start(port=0)
    kubeconfig = str(server.write_kubeconfig(f"{base}/kubeconfig"))
    write(f"{base}/policy.yaml", POLICY)
    client = make_client(server_url=server.url)
    proc = None
    try:
        t0 = time.monotonic()
        placed = await seed(client, nodes, pods)
        seeded = time.monotonic() - t0
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "drahealth", "controller", "--kubeconfig", kubeconfig,
            "--policy", f"{base}/policy.yaml", "--id", "bench", "--lease-duration", "2",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        assert proc.stdout is not None
        while b"leading:" not in await proc.stdout.readline():
            pass
        rules: Reflector[DeviceTaintRule] = Reflector(client, DeviceTaintRule)
        seen: dict[str, asyncio.Event] = {}

        def on_rule(_kind: str, rule: DeviceTaintRule, _old: object) -> None:
            sel = rule.spec.deviceSelector if rule.spec else None
            if sel is not None and f"{sel.pool}/{sel.device}" in seen:
                seen[f"{sel.pool}/{sel.device}"].set()

        rules.add_handler(on_rule)
        await rules.start()
        await rules.wait_synced()
        await asyncio.sleep(1.0)  # the controller's first pass over everything
        samples, peak = [], rss_mb(proc.pid)
        step = max(1, len(placed) // faults)
        for name, pool, device in placed[::step][:faults]:
            seen[f"{pool}/{device}"] = asyncio.Event()
            start = time.perf_counter()
            await client.patch(
                Pod.Status, name, status(device, pool, "Unhealthy", "XID 79"),
                namespace="default", patch_type=PatchType.MERGE,
            )  # fmt: skip
            await asyncio.wait_for(seen[f"{pool}/{device}"].wait(), 30)
            samples.append(time.perf_counter() - start)
            peak = max(peak, rss_mb(proc.pid))
        await rules.stop()
        return {
            "seed_s": seeded,
            "p50_s": pct(samples, 0.5),
            "p99_s": pct(samples, 0.99),
            "rss_mb": peak,
        }
    finally:
        if proc is not None and proc.returncode is None:
            proc.terminate()
            await proc.wait()
        await client.close()
        await server.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    print(asyncio.run(run(100 if quick else 1000, 500 if quick else 5000, 50)))
