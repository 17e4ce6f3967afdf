"""Benchmark of the remediation controller at cluster scale on the embedded API server.

Owns nothing but measurements. Seeds ``nodes`` x 8 devices (ResourceSlices) and ``pods``
pods, each with an allocated claim on its own device and a Healthy
``allocatedResourcesStatus``; runs ``drahealth controller`` as a subprocess (leader
election included); then, one at a time, marks a pod's device Unhealthy in its status
and measures the time until the controller's DeviceTaintRule for that device is seen by
a watch. Prints p50/p99 reaction and the controller's peak RSS, and how often the
controller lost its Lease (it must not: its renewals run on their own thread). One
warm-up fault, not counted, waits out the controller's first pass over everything. Then a
steady-state phase changes ``--churn`` Healthy pod statuses per second for
``--churn-seconds`` and reports the controller's CPU (percent of one core) meanwhile. Every
wait has a timeout that fails with what it waited for and the controller's last output.

Run: ``python bench/remedy_bench.py [--quick] [--nodes N] [--pods M] [--faults K]``
(default 1,000 nodes, 5,000 pods; quick: 100 nodes, 500 pods).

With ``--real VERSION`` (a release built by ``scripts/realk8s build``) the same
measurements run twice in one process, one server after the other: on the embedded
server, then on a real kube-apiserver + etcd (with its controller manager and scheduler)
started for the run and stopped after it (:mod:`real_bench_support`). Both get the
objects a real cluster needs (Nodes, the DeviceClass, each claim reserved for its pod,
pods tolerating unreachable nodes); the real one is seeded through its API with
``--concurrency`` requests in flight, the embedded one in-process (or over HTTP with the
same client with ``--seed-http``); the churn goes through that client too
(:func:`churn_raw`). One result dict per server is printed, with the same
keys and the seed rate, then the two side by side. When the release is not built here
the run prints one ``skipped:`` line and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceClaim, ResourceSlice
from lightkube.types import PatchType
from pipeline_bench import pct, rss_mb
from real_bench_support import (
    PODS,
    RawAPI,
    cluster_pod,
    device_class_body,
    node_body,
    real_cluster,
    reserved,
    seed_api,
    skip_reason,
)
from waits import Output, stop_process, within

from drahealth.controlplane import APIServer
from drahealth.kube import Reflector, discover, make_client

if TYPE_CHECKING:
    from tests.realk8s.harness import Cluster

DRIVER = "gpu.example.com"
POLICY = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
rules:
  - name: xid
    match: {driver: gpu.example.com}
    action: {effect: NoSchedule}
"""
#: The same rules with the circuit breaker's limits and profiles (none of them trips: the
#: faults are far below every limit), to measure what counting and profile lookup cost.
POLICY_GUARDED = (
    POLICY
    + """limits: {window: 10m, resume: manual, cluster: "50%", perDriver: "50%", perPool: 8,
         perNode: 8}
profiles:
  - name: canary
    match: {driver: gpu.example.com, pool: no-such-pool}
    observeOnly: true
  - name: low-gpus
    match: {driver: gpu.example.com, device: "gpu-[0-3]"}
    limits: {cluster: "50%", perNode: 4}
"""
)
#: Seconds the controller may take to lead, and for its first pass (the warm-up fault).
START_TIMEOUT = 60.0
FIRST_PASS_TIMEOUT = 120.0
#: Seconds one fault may take to show up as a taint.
FAULT_TIMEOUT = 30.0
#: how long the controller may take to exit after SIGTERM before it is killed (reported)
EXIT_GRACE = 30.0


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


def slice_body(node: str) -> dict[str, object]:
    return {
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}"} for i in range(8)]},
    }  # fmt: skip


def claim_body(name: str) -> dict[str, object]:
    request = {"name": "gpu", "exactly": {"deviceClassName": "g"}}
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [request]}},
    }


def allocation(pool: str, device: str) -> dict[str, object]:
    result = {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
    return {"status": {"allocation": {"devices": {"results": [result]}}}}


def pod_body(name: str, pool: str) -> dict[str, object]:
    container = {"name": "m", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": pool, "containers": [container],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
    }  # fmt: skip


def placement(pods: int) -> list[tuple[str, str, str]]:
    """(pod, pool, device) for every pod: eight pods a node, one device each."""
    return [(f"p{i}", f"node-{i // 8}", f"gpu-{i % 8}") for i in range(pods)]


async def seed(client: AsyncClient, nodes: int, pods: int) -> list[tuple[str, str, str]]:
    """Seed through the API; (pod, pool, device) for every pod."""
    for n in range(nodes):
        await client.create(ResourceSlice.from_dict(slice_body(f"node-{n}")))
    placed = placement(pods)

    async def one(name: str, pool: str, device: str) -> None:
        await client.create(ResourceClaim.from_dict(claim_body(name)))
        await client.patch(
            ResourceClaim.Status, name, allocation(pool, device),
            namespace="default", patch_type=PatchType.MERGE,
        )  # fmt: skip
        await client.create(Pod.from_dict(pod_body(name, pool)))
        await client.patch(
            Pod.Status, name, status(device, pool, "Healthy"), namespace="default",
            patch_type=PatchType.MERGE,
        )  # fmt: skip

    for chunk in range(0, pods, 25):
        await asyncio.gather(*(one(*p) for p in placed[chunk : chunk + 25]))
    return placed


def seed_in_process(
    server: APIServer, nodes: int, pods: int, cluster_objects: bool = False
) -> list[tuple[str, str, str]]:
    """The same objects as :func:`seed`, written through the server's own engine.

    Seeding 50,000 pods over HTTP takes four requests each (about 15 minutes on two
    cores); the objects, their resourceVersions and the watch events the controller
    later lists are the same either way, and nothing is measured while seeding. With
    ``cluster_objects`` the objects :func:`real_bench_support.seed_api` writes to a real
    server: a Node per slice, the DeviceClass, pods with tolerations, claims reserved.
    """
    from drahealth.controlplane._engine import MERGE, WriteOptions
    from drahealth.controlplane._resources import lookup

    engine = server.engine
    slices = lookup("resource.k8s.io", "v1", "resourceslices")
    claims = lookup("resource.k8s.io", "v1", "resourceclaims")
    pods_rt = lookup("", "v1", "pods")
    nodes_rt = lookup("", "v1", "nodes")
    classes = lookup("resource.k8s.io", "v1", "deviceclasses")
    assert slices is not None and claims is not None and pods_rt is not None
    assert nodes_rt is not None and classes is not None
    opts = WriteOptions(manager="bench")
    if cluster_objects:
        engine.create(classes, None, device_class_body(), opts)
    for n in range(nodes):
        if cluster_objects:
            engine.create(nodes_rt, None, node_body(f"node-{n}"), opts)
        engine.create(slices, None, slice_body(f"node-{n}"), opts)
    placed = placement(pods)
    for name, pool, device in placed:
        engine.create(claims, "default", claim_body(name), opts)
        if cluster_objects:
            pod = engine.create(pods_rt, "default", cluster_pod(pod_body(name, pool)), opts)
            uid = pod["metadata"]["uid"]
            engine.patch(claims, "default", name, MERGE,
                         reserved(allocation(pool, device), name, uid), "status", opts)  # fmt: skip
        else:
            engine.patch(claims, "default", name, MERGE, allocation(pool, device), "status",
                         opts)  # fmt: skip
            engine.create(pods_rt, "default", pod_body(name, pool), opts)
        engine.patch(pods_rt, "default", name, MERGE, status(device, pool, "Healthy"),
                     "status", opts)  # fmt: skip
    return placed


def healthy_status(device: str, pool: str) -> dict[str, object]:
    return status(device, pool, "Healthy")


async def seed_raw(
    api: RawAPI, nodes: int, pods: int, concurrency: int, label: str
) -> tuple[list[tuple[str, str, str]], dict[str, float]]:
    """The :func:`seed_in_process` objects (``cluster_objects``) through ``api``, with
    ``concurrency`` requests in flight; the placement and the seed figures."""
    placed = placement(pods)
    stats = await seed_api(
        api, nodes, placed, slice_body=slice_body, claim_body=claim_body,
        allocation=allocation, pod_body=pod_body, pod_status=healthy_status,
        concurrency=concurrency, label=label,
    )  # fmt: skip
    return placed, stats


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def churn(
    client: AsyncClient,
    placed: list[tuple[str, str, str]],
    rate: float,
    seconds: float,
    raw: RawAPI | None = None,
) -> int:
    """Change ``rate`` pod statuses per second (a Healthy pod's message) for ``seconds``;
    through ``raw`` where given: :func:`churn_raw`."""
    if raw is not None:
        return await churn_raw(raw, placed, rate, seconds)
    sent, start, i = 0, time.monotonic(), 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate) + 1
        batch = []
        while sent < due:
            name, pool, device = placed[i % len(placed)]
            i += 1
            sent += 1
            batch.append(client.patch(
                Pod.Status, name, status(device, pool, "Healthy", f"ok {sent}"),
                namespace="default", patch_type=PatchType.MERGE,
            ))  # fmt: skip
        await asyncio.gather(*batch)
        await asyncio.sleep(max(0.0, (sent / rate) - (time.monotonic() - start)))
    return sent


def churned(device: str, pool: str, k: int) -> dict[str, object]:
    """The ``k``-th churn status: a new message and restart count (releases before 1.36
    drop ``message``; a change of it alone would leave the pod as it was, no event)."""
    body = status(device, pool, "Healthy", f"ok {k}")
    body["status"]["containerStatuses"][0]["restartCount"] = k  # type: ignore[index]
    return body


async def churn_raw(
    raw: RawAPI,
    placed: list[tuple[str, str, str]],
    rate: float,
    seconds: float,
    in_flight: int = 64,
) -> int:
    """:func:`churn` with bare JSON requests (:func:`churned` bodies), each sent at its own
    time (the k-th at ``k / rate`` s) without waiting for the ones before, at most
    ``in_flight`` at once: a slow answer does not hold back the next change. Returns the
    changes answered."""
    slots = asyncio.Semaphore(in_flight)
    answered, k, start = 0, 0, time.monotonic()

    async def one(name: str, body: dict[str, object]) -> None:
        nonlocal answered
        try:
            await raw.patch_status(PODS, name, body)
            answered += 1
        finally:
            slots.release()

    async with asyncio.TaskGroup() as tg:
        while (elapsed := time.monotonic() - start) < seconds:
            if k / rate > elapsed:
                await asyncio.sleep(k / rate - elapsed)
                continue
            await slots.acquire()
            name, pool, device = placed[k % len(placed)]
            k += 1
            tg.create_task(one(name, churned(device, pool, k)))
    return answered


async def run(
    nodes: int,
    pods: int,
    faults: int,
    churn_rate: float = 100.0,
    churn_s: float = 20.0,
    seed_http: bool = False,
    lease_duration: float = 2.0,
    policy: str = POLICY,
    *,
    real: Cluster | None = None,
    cluster_objects: bool = False,
    concurrency: int = 64,
) -> dict[str, float]:
    """One measurement on the embedded server, or on ``real`` (a started control plane,
    seeded through its API). ``cluster_objects``: seed the embedded server with what the
    real one gets, and add the seed figures (``seed_*``) to the result."""
    base = tempfile.mkdtemp(prefix="dhr-", dir="/tmp")
    write(f"{base}/policy.yaml", policy)
    server: APIServer | None = None
    if real is None:
        server = APIServer()
        await server.start(port=0)
        kubeconfig = str(server.write_kubeconfig(f"{base}/kubeconfig"))
        client = make_client(server_url=server.url)
    else:
        kubeconfig = real.kubeconfig
        client = make_client(kubeconfig=kubeconfig)
    proc = None
    out: Output | None = None
    extra: dict[str, float] = {}
    # --real: bare JSON requests, the same client for both servers (seeding, churn)
    api: RawAPI | None = None
    label = "embedded"
    if real is not None:
        api, label = RawAPI.for_cluster(real, concurrency), f"real {real.version}"
    elif cluster_objects:
        assert server is not None
        api, label = RawAPI(server.url, connections=concurrency), "embedded"
    try:
        t0 = time.monotonic()
        if api is not None and (real is not None or seed_http):
            placed, extra = await seed_raw(api, nodes, pods, concurrency, label)
        elif seed_http:
            placed = await seed(client, nodes, pods)
        else:
            assert server is not None
            placed = seed_in_process(server, nodes, pods, cluster_objects)
        seeded = time.monotonic() - t0
        if cluster_objects and not extra:  # in-process: engine writes, not requests
            writes = 1 + 2 * nodes + 4 * pods
            extra = {"seed_s": seeded, "seed_requests": float(writes),
                     "seed_requests_per_s": writes / seeded,
                     "seed_pods_per_s": pods / seeded, "seed_retries": 0.0}  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "drahealth", "controller", "--kubeconfig", kubeconfig,
            "--policy", f"{base}/policy.yaml", "--id", "bench",
            "--lease-duration", f"{lease_duration:g}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        assert proc.stdout is not None
        out = Output(proc.stdout, count=("standby:",))
        await out.line_with("leading:", START_TIMEOUT, "the controller to lead")
        rule_cls: Any = DeviceTaintRule
        if real is not None:  # the version this release serves (v1alpha3, v1beta2, v1)
            rule_cls = (await discover(client)).resource("DeviceTaintRule") or DeviceTaintRule
        rules: Reflector[Any] = Reflector(client, rule_cls)
        seen: dict[str, asyncio.Event] = {}

        def on_rule(_kind: str, rule: Any, _old: object) -> None:
            sel = rule.spec.deviceSelector if rule.spec else None
            if sel is not None and f"{sel.pool}/{sel.device}" in seen:
                seen[f"{sel.pool}/{sel.device}"].set()

        async def fault(name: str, pool: str, device: str, seconds: float) -> float:
            seen[f"{pool}/{device}"] = asyncio.Event()
            start = time.perf_counter()
            await client.patch(
                Pod.Status, name, status(device, pool, "Unhealthy", "XID 79"),
                namespace="default", patch_type=PatchType.MERGE,
            )  # fmt: skip
            assert out is not None
            await within(
                seen[f"{pool}/{device}"].wait(), seconds,
                f"the taint of {pool}/{device} (pod {name})", out.tail(),
            )  # fmt: skip
            return time.perf_counter() - start

        rules.add_handler(on_rule)
        await rules.start()
        try:
            await within(rules.wait_synced(), 30, "the DeviceTaintRule list")
            step = max(1, len(placed) // faults)
            measured = placed[::step][:faults]
            chosen = set(measured)
            spare = [p for p in placed if p not in chosen]
            first_pass = max(FIRST_PASS_TIMEOUT, pods / 250)
            await fault(*spare[-1], first_pass)  # warm-up: the first pass is over
            samples, peak = [], rss_mb(proc.pid)
            for name, pool, device in measured:
                samples.append(await fault(name, pool, device, FAULT_TIMEOUT))
                peak = max(peak, rss_mb(proc.pid))
            # steady state: pod statuses keep changing, nothing to taint
            healthy = [p for p in spare[:-1] if p not in chosen] or placed
            cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()
            changed = await churn(client, healthy, churn_rate, churn_s, api)
            churn_wall = max(time.monotonic() - wall0, 1e-6)
            churn_cpu = (cpu_seconds(proc.pid) - cpu0) / churn_wall
            peak = max(peak, rss_mb(proc.pid))
        finally:
            await rules.stop()
        result = {
            **extra,
            "seed_s": seeded,
            "p50_s": pct(samples, 0.5),
            "p99_s": pct(samples, 0.99),
            "rss_mb": peak,
            "lost_lease": float(out.counts["standby:"]),
            "churn_per_s": changed / churn_wall,
            "churn_cpu_pct": churn_cpu * 100,
        }
        # its figures are in: a slow exit (over EXIT_GRACE s) is reported, not fatal
        exit_s = await stop_process(proc, "the controller", EXIT_GRACE, fail=False)
        result["exit_s"] = exit_s
        if exit_s == math.inf:
            print(f"{label}: the controller did not exit within {EXIT_GRACE:g} s of SIGTERM; "
                  f"its last output:\n{out.tail()}", flush=True)  # fmt: skip
        return result
    finally:
        if proc is not None:
            await stop_process(proc, "the controller")
        if out is not None:
            await out.close()
        if api is not None:
            await api.close()
        await client.close()
        if server is not None:
            await server.stop()
        shutil.rmtree(base, ignore_errors=True)


async def compare(nodes: int, pods: int, faults: int, rounds: int = 3) -> dict[str, float]:
    """Fault -> taint latency with :data:`POLICY` and :data:`POLICY_GUARDED`, alternating
    ``rounds`` times in this process (no churn phase): the median p50/p99 of each and the
    guarded policy's overhead (a load spike hits both policies alike)."""
    base: list[dict[str, float]] = []
    guarded: list[dict[str, float]] = []
    for _ in range(rounds):
        base.append(await run(nodes, pods, faults, churn_s=0.0))
        guarded.append(await run(nodes, pods, faults, churn_s=0.0, policy=POLICY_GUARDED))
    out: dict[str, float] = {}
    for name, runs in (("base", base), ("guarded", guarded)):
        for q in ("p50_s", "p99_s"):
            out[f"{name}_{q}"] = statistics.median(r[q] for r in runs)
    for q in ("p50_s", "p99_s"):
        out[f"overhead_{q}"] = out[f"guarded_{q}"] / out[f"base_{q}"] - 1
    return out


#: The keys printed side by side, in this order, with their headings.
TABLE = (
    ("seed_s", "seed, s"), ("seed_requests", "seed requests (in-process: writes)"),
    ("seed_requests_per_s", "seed requests/s"), ("seed_pods_per_s", "seed pods/s"),
    ("seed_retries", "seed retries (429/5xx)"), ("p50_s", "fault -> taint p50, ms"),
    ("p99_s", "fault -> taint p99, ms"), ("rss_mb", "controller peak RSS, MB"),
    ("churn_per_s", "pod status changes/s"), ("churn_cpu_pct", "controller CPU, % of a core"),
    ("lost_lease", "Lease losses"), ("exit_s", "controller exit after SIGTERM, s"),
)  # fmt: skip


def side_by_side(results: dict[str, dict[str, float]]) -> str:
    """The results of each server as a Markdown table, one column per server."""
    names = list(results)
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key, heading in TABLE:
        cells = []
        for name in names:
            value = results[name].get(key)
            if value is None:
                cells.append("-")
            elif key in ("p50_s", "p99_s"):
                cells.append(f"{value * 1000:.0f}")
            elif key in ("seed_s", "rss_mb", "churn_per_s", "churn_cpu_pct", "exit_s"):
                cells.append(f"{value:.1f}")
            else:
                cells.append(f"{value:.0f}")
        lines.append(f"| {heading} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def against_real(args: argparse.Namespace, nodes: int, pods: int, policy: str) -> int:
    """The embedded server, then the real one of ``args.real``: one dict each, the table."""
    reason = skip_reason(args.real)
    if reason is not None:
        print(f"remedy_bench --real {args.real}: skipped: {reason}")
        return 0

    async def one(real: Cluster | None) -> dict[str, float]:
        return await run(
            nodes, pods, args.faults, args.churn, args.churn_seconds, args.seed_http,
            args.lease_duration, policy, real=real, cluster_objects=True,
            concurrency=args.concurrency,
        )  # fmt: skip

    print(f"{nodes} nodes x 8 devices, {pods} pods, {args.faults} faults, "
          f"{os.cpu_count()} cores", flush=True)  # fmt: skip
    results: dict[str, dict[str, float]] = {}
    results["embedded"] = asyncio.run(one(None))
    print(f"embedded: {results['embedded']}", flush=True)
    with real_cluster(args.real, args.gates) as cluster:
        name = f"real {cluster.version}"
        results[name] = asyncio.run(one(cluster))
        print(f"{name}: {results[name]}", flush=True)
    print(side_by_side(results))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="100 nodes, 500 pods")
    parser.add_argument("--nodes", type=int, default=None, help="nodes of 8 devices (1000)")
    parser.add_argument("--pods", type=int, default=None, help="pods, one device each (5000)")
    parser.add_argument("--faults", type=int, default=50, help="faults measured (50)")
    parser.add_argument(
        "--churn",
        type=float,
        default=100.0,
        help="pod status changes per second in the steady-state phase (100)",
    )
    parser.add_argument(
        "--churn-seconds", type=float, default=20.0, help="length of the steady-state phase (20)"
    )
    parser.add_argument(
        "--lease-duration",
        type=float,
        default=2.0,
        help="the controller's --lease-duration (2; the command's default is 15)",
    )
    parser.add_argument(
        "--guarded",
        action="store_true",
        help="a policy with circuit-breaker limits and profiles (none trips)",
    )
    parser.add_argument(
        "--compare",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="plain vs guarded policy, alternating ROUNDS times: medians and the overhead",
    )
    parser.add_argument(
        "--seed-http",
        action="store_true",
        help="seed through the API (4 requests a pod) instead of in-process",
    )
    parser.add_argument(
        "--real",
        metavar="VERSION",
        default=None,
        help="also on a real kube-apiserver + etcd of this built release (1.34 ... 1.37), "
        "beside the embedded server's figures",
    )
    parser.add_argument(
        "--gates",
        choices=("default", "taints"),
        default=None,
        help="the real control plane's gate set (default: 'default' from 1.37 on, else "
        "'taints', so that DeviceTaintRule is served)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="with --real: requests in flight while seeding through the API (64)",
    )
    args = parser.parse_args()
    nodes = args.nodes or (100 if args.quick else 1000)
    pods = args.pods or (500 if args.quick else 5000)
    if pods > nodes * 8:
        parser.error(f"--pods {pods} needs at least {(pods + 7) // 8} nodes of 8 devices")
    if args.real:
        if args.compare:
            parser.error("--compare runs on the embedded server only (leave out --real)")
        raise SystemExit(against_real(args, nodes, pods,
                                      POLICY_GUARDED if args.guarded else POLICY))  # fmt: skip
    if args.compare:
        print(asyncio.run(compare(nodes, pods, args.faults, args.compare)))
        raise SystemExit(0)
    print(asyncio.run(run(nodes, pods, args.faults, args.churn, args.churn_seconds,
                          args.seed_http, args.lease_duration,
                          POLICY_GUARDED if args.guarded else POLICY)))  # fmt: skip
