"""Prepare latency of the toolkit's sample driver against a driver on the upstream Go helper.

Owns nothing but measurements. One real control plane (``tests/realk8s/harness.py``, a
built release; without one the run prints one ``skipped:`` line and exits 0) serves the
claims of four DRA gRPC servers, each its own process, all started once for the run:

* ``python-noop``: :class:`pipeline_bench.NoopPlugin` (row 5's floor) served by this file
  in a child process (``--serve-noop SOCKET``), its start-up heap frozen as the driver's is;
* ``go-noop``: ``tests/realk8s/go/noopdra``, the same no-op answers from Go's gRPC server;
* ``toolkit``: ``drahealth driver`` (the sample driver, sim-gpu, 64 devices), which GETs
  each claim (``--claim-cache`` adds a fifth target, ``toolkit-cache``, answering from its
  ResourceClaim watch);
* ``go-helper``: ``tests/realk8s/go/helperdriver`` (64 devices) on the release's
  ``k8s.io/dynamic-resource-allocation/kubeletplugin`` helper, which GETs each claim.

Each round, for every target in turn (the order rotates every round, so load on the shared
machine falls on all alike): 50 fresh ResourceClaims are created for the drivers, each
allocated to its own device of that driver and reserved for one placeholder Pod bound to
a Node of the bench (both drivers check only that the claim exists with the UID asked
for and is allocated; the cache path also wants the reservation). ``bench/prepare_client.py``
(the kubelet's side, one channel, its own process) then prepares and unprepares the 50
once untimed (the channel connects), and times a second burst of 50 concurrent
single-claim NodePrepareResources calls on the same claims, which it unprepares
untimed; the claims are deleted. The no-op servers get made-up claims and read none.

Printed: p50/p99 per target over all rounds and per round, the p99 ratios toolkit /
go-helper (target <= 2.0) and each driver against its language's no-op, the median of the
per-round ratios, what each driver fsyncs per prepare, and whether the helper's
client-go logged client-side throttling. client-go's default client allows 5 requests/s
with a burst of 10, which alone would hold a burst of 50 prepares for up to 8 s; the helper
runs with ``--kube-api-qps``/``--kube-api-burst`` at :data:`HELPER_QPS`, as the toolkit's
client has no client-side limit (``--helper-arg=--kube-api-qps=5`` gives the default).

Run: ``python bench/prepare_helper_bench.py [--version 1.37] [--rounds 5] [--calls 50]
[--claim-cache] [--helper-arg ARG ...] [--json]``; ``bench/run.py`` runs it (without the
cache target) with the target. ``--helper-arg=--v=3`` makes client-go log every request it
held back for 50 ms or more, so the throttling count becomes one line per held-back GET.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from pipeline_bench import NoopPlugin, pct
from real_bench_support import (
    PODS,
    RawAPI,
    cluster_pod,
    device_class_body,
    node_body,
    real_cluster,
    reserved,
    skip_reason,
)
from waits import BenchTimeout, Output, stop_process, within

from drahealth import api
from tests.realk8s import harness

CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
NODES = "/api/v1/nodes"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
PLACEHOLDER_POD = "prepare-bench-holder"
LABEL = "prepare-bench"
DEVICES = 64
#: Seconds a server has to print its ready line; a caller to finish one round.
START_S, ROUND_S = 60.0, 180.0
#: The helper's client rate and burst (its flags): high enough never to hold a GET back.
HELPER_QPS = 10_000
#: What a line of client-go's throttling log contains.
THROTTLED = "client-side throttling"

FSYNCS = {
    "toolkit": (
        "per burst, in batches: a PrepareStarted and a PrepareCompleted checkpoint write "
        "(each temp file fsync + rename + directory fsync; group commit lets one batch's "
        "PrepareCompleted share the next batch's PrepareStarted), and per claim its CDI spec "
        "(file fsync + directory fsync, up to 8 in worker threads at once)"
    ),
    "go-helper": (
        "per claim, one after the other under the helper's mutex: its CDI spec and the "
        "whole checkpoint (each temp file fsync + rename + directory fsync): 4 fsyncs a claim"
    ),
    "python-noop": "nothing",
    "go-noop": "nothing",
}
FSYNCS["toolkit-cache"] = FSYNCS["toolkit"]


@dataclass
class Target:
    """One DRA gRPC server of the run."""

    key: str
    argv: list[str]
    socket: str
    driver: str = ""  # the driver whose claims it prepares; "" for a no-op server
    node: str = ""
    env: dict[str, str] = field(default_factory=dict)
    proc: asyncio.subprocess.Process | None = None
    out: Output | None = None
    samples: list[float] = field(default_factory=list)
    rounds: list[dict[str, float]] = field(default_factory=list)


def missing_binaries(version: str) -> str | None:
    """Why the Go servers of ``version`` cannot run here, or None."""
    bins = harness.bin_dir(version)
    build = f"run: scripts/realk8s build --version {harness.minor_of(version)}"
    for name in ("noopdra", "helperdriver"):
        if not (bins / name).is_file():
            return f"{name} {version} is not built in {bins} ({build})"
        if not harness._main_fresh(bins, name):
            return f"{name} {version} in {bins} is older than its sources ({build})"
    return None


def make_targets(
    base: str, bins: Path, kubeconfig: str, cache: bool, helper_args: Sequence[str]
) -> list[Target]:
    here = os.path.abspath(__file__)
    py_sock, go_sock = f"{base}/pynoop.sock", f"{base}/gonoop.sock"
    targets = [
        Target("python-noop", [sys.executable, here, "--serve-noop", py_sock], py_sock),
        Target("go-noop", [str(bins / "noopdra"), "--socket", go_sock], go_sock),
    ]

    def toolkit(key: str, driver: str, extra: list[str]) -> Target:
        d, node = f"{base}/{key}", f"bench-{key}"
        argv = [sys.executable, "-m", "drahealth", "driver", "--driver-name", driver,
                "--node-name", node, "--kubeconfig", kubeconfig, "--registry-dir", f"{d}/reg",
                "--plugins-dir", f"{d}/plugins", "--cdi-dir", f"{d}/cdi",
                "--state-dir", f"{d}/state", "--devices", str(DEVICES), *extra]  # fmt: skip
        return Target(key, argv, f"{d}/plugins/{driver}/dra.sock", driver, node)

    targets.append(toolkit("toolkit", "gpu.example.com", []))
    if cache:
        targets.append(toolkit("toolkit-cache", "cache.example.com", ["--claim-cache"]))
    d, driver = f"{base}/go-helper", "helper.example.com"
    argv = [str(bins / "helperdriver"), "--driver-name", driver, "--node-name", "bench-go-helper",
            "--kubeconfig", kubeconfig, "--registry-dir", f"{d}/reg",
            "--plugins-dir", f"{d}/plugins", "--cdi-dir", f"{d}/cdi",
            "--health-file", f"{d}/health.json", "--devices", str(DEVICES),
            # the toolkit's client has no client-side rate limit: neither has the helper's
            # here (client-go's default, 5/s with a burst of 10, would time the limiter)
            "--kube-api-qps", str(HELPER_QPS), "--kube-api-burst", str(HELPER_QPS),
            *helper_args]  # fmt: skip
    targets.append(Target("go-helper", argv, f"{d}/plugins/{driver}/dra.sock", driver,
                          "bench-go-helper"))  # fmt: skip
    return targets


async def start_target(t: Target) -> None:
    t.proc = await asyncio.create_subprocess_exec(
        *t.argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **t.env},
    )  # fmt: skip
    assert t.proc.stdout is not None
    t.out = Output(t.proc.stdout, keep=200, count=(THROTTLED,))
    # each prints its ready line once its DRA socket is served
    await t.out.line_with("ready: ", START_S, f"{t.key} to print its ready line")
    if not Path(t.socket).exists():  # noqa: ASYNC240 - one stat
        raise RuntimeError(f"{t.key} is ready but its DRA socket {t.socket} is not there")


@contextlib.asynccontextmanager
async def servers(targets: list[Target]) -> AsyncIterator[None]:
    try:
        for t in targets:
            await start_target(t)
        yield
    finally:
        for t in targets:
            if t.proc is not None:
                await stop_process(t.proc, t.key, fail=False)
            if t.out is not None:
                await t.out.close()


async def call_round(socket: str, claims: list[list[str]]) -> list[float]:
    """One untimed and one timed burst by ``prepare_client.py`` in its own process; the
    timed burst's latencies. The caller is killed if it outlives :data:`ROUND_S`."""
    job = {"socket": socket, "rounds": 1, "claims": claims}
    caller = await asyncio.create_subprocess_exec(
        sys.executable, os.path.join(os.path.dirname(__file__), "prepare_client.py"),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, _ = await within(caller.communicate(json.dumps(job).encode()), ROUND_S,
                              f"the prepare caller on {socket}")  # fmt: skip
    finally:
        if caller.returncode is None:
            caller.kill()
            await within(caller.wait(), 10, "the killed prepare caller to exit")
    if caller.returncode != 0:
        raise RuntimeError(f"the prepare caller on {socket} exited {caller.returncode}")
    samples: list[float] = json.loads(out)
    return samples


async def create_claims(rest: RawAPI, t: Target, rnd: int, calls: int,
                        holder: tuple[str, str]) -> list[list[str]]:  # fmt: skip
    """``calls`` claims of ``t``'s driver, each allocated to its own device and reserved
    for the placeholder pod; ``[[name, uid], ...]``."""

    async def one(i: int) -> list[str]:
        name = f"{t.key}-r{rnd}-c{i}"
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "labels": {LABEL: f"{t.key}-r{rnd}"}},
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "g"}}]}}}  # fmt: skip
        made = await rest.create(CLAIMS, body)
        result = {"request": "gpu", "driver": t.driver, "pool": t.node, "device": f"gpu-{i}"}
        allocation = {"status": {"allocation": {"devices": {"results": [result]}}}}
        await rest.patch_status(CLAIMS, name, reserved(allocation, *holder))
        return [name, str(made["metadata"]["uid"])]

    return list(await asyncio.gather(*(one(i) for i in range(calls))))


async def one_round(rest: RawAPI, t: Target, rnd: int, calls: int,
                    holder: tuple[str, str]) -> None:  # fmt: skip
    if t.driver:
        claims = await within(create_claims(rest, t, rnd, calls, holder), 120,
                              f"{calls} claims for {t.key}")  # fmt: skip
    else:
        claims = [[f"noop-r{rnd}-c{i}", f"uid-{t.key}-{rnd}-{i}"] for i in range(calls)]
    samples = await call_round(t.socket, claims)
    if t.driver:
        await within(rest.call("DELETE", f"{CLAIMS}?labelSelector={LABEL}%3D{t.key}-r{rnd}", {}),
                     60, f"deleting the claims of {t.key} round {rnd}")  # fmt: skip
    t.samples += samples
    t.rounds.append({"p50_ms": pct(samples, 0.5) * 1e3, "p99_ms": pct(samples, 0.99) * 1e3})


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def run(
    version: str = "1.37",
    rounds: int = 5,
    calls: int = 50,
    cache: bool = False,
    helper_args: Sequence[str] = (),
) -> dict[str, Any] | None:
    """The benchmark on a real control plane of ``version``; None (after printing a
    ``skipped:`` line) when it is not built here. Returns per target its p50/p99 (ms, over
    all rounds) and per-round p99s, and the p99 ratios."""
    reason = skip_reason(version)
    resolved = harness.resolve_version(version) if reason is None else version
    reason = reason or missing_binaries(resolved)
    if reason is not None:
        print(f"prepare_helper_bench {version}: skipped: {reason}", flush=True)
        return None
    print(f"{os.cpu_count()} CPUs, load average {load_average()} at start; {rounds} rounds of "
          f"{calls} concurrent prepares per target", flush=True)  # fmt: skip
    base = tempfile.mkdtemp(prefix="prep-helper-", dir="/tmp")
    try:
        with real_cluster(resolved) as cluster:
            rest = RawAPI.for_cluster(cluster, connections=calls + 4)
            try:
                return await _measure(cluster, rest, base, rounds, calls, cache, helper_args)
            finally:
                await rest.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def _measure(cluster: harness.Cluster, rest: RawAPI, base: str, rounds: int, calls: int,
                   cache: bool, helper_args: Sequence[str]) -> dict[str, Any]:  # fmt: skip
    bins = harness.bin_dir(cluster.version)
    targets = make_targets(base, bins, cluster.kubeconfig, cache, helper_args)
    await rest.create(CLASSES, device_class_body())
    for t in targets:
        if t.node:
            await rest.create(NODES, node_body(t.node))
    pod = cluster_pod({"metadata": {"name": PLACEHOLDER_POD, "namespace": "default"},
                       "spec": {"nodeName": targets[-1].node,
                                "containers": [{"name": "c", "image": "x"}]}})  # fmt: skip
    made = await rest.create(PODS, pod)
    holder = (PLACEHOLDER_POD, str(made["metadata"]["uid"]))
    t0 = time.monotonic()
    async with servers(targets):
        print(f"servers ready: {', '.join(t.key for t in targets)}", flush=True)
        for rnd in range(rounds):
            order = targets[rnd % len(targets) :] + targets[: rnd % len(targets)]
            for t in order:
                await one_round(rest, t, rnd, calls, holder)
            print(f"round {rnd + 1}/{rounds} ({time.monotonic() - t0:.0f} s, load "
                  f"{load_average()}): " + ", ".join(
                      f"{t.key} p99 {t.rounds[-1]['p99_ms']:.1f} ms" for t in targets),
                  flush=True)  # fmt: skip
        throttled = {t.key: t.out.counts[THROTTLED] for t in targets if t.out is not None}
    return summarize(targets, throttled)


def summarize(targets: list[Target], throttled: dict[str, int]) -> dict[str, Any]:
    by = {t.key: t for t in targets}
    out: dict[str, Any] = {"targets": {}, "ratios": {}, "throttle_lines": throttled}
    for t in targets:
        out["targets"][t.key] = {
            "p50_ms": pct(t.samples, 0.5) * 1e3,
            "p99_ms": pct(t.samples, 0.99) * 1e3,
            "round_p99_ms": [r["p99_ms"] for r in t.rounds],
        }

    def ratio(a: str, b: str) -> None:
        if a in by and b in by:
            per_round = [x["p99_ms"] / y["p99_ms"]
                         for x, y in zip(by[a].rounds, by[b].rounds, strict=True)]  # fmt: skip
            out["ratios"][f"{a}/{b}"] = {
                "p99": out["targets"][a]["p99_ms"] / out["targets"][b]["p99_ms"],
                "median_of_rounds": statistics.median(per_round),
            }

    ratio("toolkit", "go-helper")
    ratio("toolkit-cache", "go-helper")
    ratio("toolkit", "python-noop")
    ratio("toolkit-cache", "python-noop")
    ratio("go-helper", "go-noop")
    ratio("python-noop", "go-noop")
    return out


def report(result: dict[str, Any]) -> None:
    print(f"\n{'target':14} {'p50 ms':>9} {'p99 ms':>9}  per-round p99 ms")
    for key, r in result["targets"].items():
        rounds = ", ".join(f"{x:.1f}" for x in r["round_p99_ms"])
        print(f"{key:14} {r['p50_ms']:9.1f} {r['p99_ms']:9.1f}  {rounds}")
    print()
    for name, r in result["ratios"].items():
        judged = "  (target <= 2.0: " + ("met)" if r["p99"] <= 2 else "NOT met)")
        print(f"p99 {name:26} {r['p99']:7.2f}x  median of rounds {r['median_of_rounds']:.2f}x"
              f"{judged if name == 'toolkit/go-helper' else ''}")  # fmt: skip
    print("\nfsynced per prepare:")
    for key in result["targets"]:
        print(f"  {key}: {FSYNCS[key]}")
    lines = result["throttle_lines"].get("go-helper", 0)
    print(f"\ngo-helper: {lines} log lines of client-go's client-side throttling (at --v=3 "
          "one per request held back 50 ms or more; by default at most one per 10 s, for "
          "holds of 1 s or more)" if lines else "\ngo-helper: no client-side throttling "
          "logged", flush=True)  # fmt: skip


async def serve_noop(socket: str) -> None:
    """Serve :class:`NoopPlugin` on ``socket`` until SIGTERM/SIGINT."""
    server = grpc.aio.server()
    api.dra_v1_grpc.add_DRAPluginServicer_to_server(NoopPlugin(), server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    gc.collect()
    gc.freeze()  # as drahealth driver does once started
    print(f"ready: {socket}", flush=True)
    await stop.wait()
    await server.stop(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="1.37", help="the built release to run (1.37)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per target (5)")
    parser.add_argument("--calls", type=int, default=50, help="concurrent prepares (50)")
    parser.add_argument("--claim-cache", action="store_true",
                        help="also the toolkit driver with --claim-cache")  # fmt: skip
    parser.add_argument(
        "--helper-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra argument for helperdriver (repeatable), e.g. --helper-arg=--v=3",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON too")
    parser.add_argument("--serve-noop", metavar="SOCKET", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_noop:
        asyncio.run(serve_noop(args.serve_noop))
        return 0
    if args.calls > DEVICES:
        parser.error(f"--calls must be at most {DEVICES} (the drivers' devices)")
    try:
        result = asyncio.run(
            run(args.version, args.rounds, args.calls, args.claim_cache, args.helper_arg)
        )
    except BenchTimeout as exc:
        print(f"prepare_helper_bench: {exc}", file=sys.stderr)
        return 1
    if result is not None:
        report(result)
        if args.json:
            print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
