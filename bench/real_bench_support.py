"""The real kube-apiserver as a benchmark peer: start it, seed it fast, stop it.

Owns what ``remedy_bench.py --real`` needs beyond the embedded server:

* :func:`real_cluster`: a real control plane (etcd, kube-apiserver, kube-controller-manager,
  kube-scheduler) of a built release, started by ``tests/realk8s/harness.py`` in a
  temporary directory and stopped (the directory removed) when the block ends, on error,
  Ctrl-C or SIGTERM too. :func:`skip_reason` says why it cannot run here.
* :class:`RawAPI`: bare JSON requests (admin token, the cluster's CA, ``connections``
  HTTP/1.1 keep-alive connections) without building client-side models, so the client is
  not what limits the seed rate. Throttling (429) and transient server errors are retried
  with backoff; a create retried after a lost answer that meets its own object (409) reads
  it back.
* :func:`seed_api`: the bench's objects through the API with ``concurrency`` workers, each
  running one pod's requests in order, so at most ``concurrency`` requests are in flight.

What a real cluster needs that the embedded server does not (:func:`cluster_bodies`):
Node objects, because the kube-controller-manager's pod garbage collector force-deletes a
pod whose ``spec.nodeName`` names no Node (about 40-60 s after it is created); the Nodes
carry no status and no kubelet renews them, so the node lifecycle controller marks them
Ready=Unknown after 60 s and taints them ``node.kubernetes.io/unreachable:NoSchedule``;
with every Node not ready it enters its "master disruption mode" and evicts nothing, and
the pods tolerate ``unreachable`` and ``not-ready`` NoExecute without a time limit anyway,
so no pod is evicted however long a run takes. Pods are created with ``spec.nodeName``
(the scheduler never sees them) and without a service-account token volume. A DeviceClass
``g`` exists for the claims' request. Each claim's allocation is written together with
``reservedFor`` naming its pod (as the scheduler writes it), so the controller manager's
resourceclaim controller, which reserves allocated claims of bound pods, has nothing to
write. The bench policy's effect is NoSchedule: the device-taint eviction controller,
which deletes pods only for NoExecute device taints, leaves the pods alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx2

sys.path.append(str(Path(__file__).resolve().parent.parent))  # tests.realk8s.harness

from tests.realk8s import harness

__all__ = [
    "PODS",
    "RawAPI",
    "cluster_pod",
    "device_class_body",
    "gates_for",
    "node_body",
    "real_cluster",
    "reserved",
    "seed_api",
    "skip_reason",
]

JSON = dict[str, Any]
MERGE = "application/merge-patch+json"
#: Answers worth another try: throttled, or the server busy for a moment.
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
RETRIES = 8
#: Seconds between progress lines while seeding.
PROGRESS_S = 15.0
DEVICE_CLASS = "g"


def gates_for(version: str) -> str:
    """The harness gate set under which ``version`` serves DeviceTaintRule and keeps
    ``allocatedResourcesStatus``: ``default`` from 1.37 on, ``taints`` before."""
    minor = int(harness.minor_of(version).split(".")[1])
    return "default" if minor >= 37 else "taints"


def skip_reason(version: str) -> str | None:
    """Why the real control plane of ``version`` cannot run here, or None."""
    try:
        resolved = harness.resolve_version(version)
    except harness.HarnessError as exc:
        return str(exc)
    return harness.not_built_reason(resolved)


@contextlib.contextmanager
def real_cluster(version: str, gates: str | None = None) -> Iterator[harness.Cluster]:
    """A started control plane of ``version`` for the block; stopped and removed after it
    (on an exception, Ctrl-C or SIGTERM too: SIGTERM is turned into SystemExit while the
    block runs)."""
    resolved = harness.resolve_version(version)
    directory = tempfile.mkdtemp(prefix=f"remedy-bench-{resolved}-", dir="/tmp")

    def on_term(_sig: int, _frame: object) -> None:
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, on_term)
    cluster = None
    try:
        print(f"real {resolved}: starting in {directory}", file=sys.stderr, flush=True)
        cluster = harness.up(resolved, directory, gates=gates or gates_for(resolved),
                             say=lambda _m: None)  # fmt: skip
        print(f"real {resolved}: ready at {cluster.apiserver} (gates {cluster.gates})",
              file=sys.stderr, flush=True)  # fmt: skip
        yield cluster
    finally:
        try:
            if cluster is not None:
                harness.down(cluster, remove=True)
            else:  # up() stops what it started when it fails
                shutil.rmtree(directory, ignore_errors=True)
        finally:
            signal.signal(signal.SIGTERM, previous)


class RawAPI:
    """JSON requests to one API server over ``connections`` keep-alive connections."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        connections: int = 64,
    ) -> None:
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=ca_file) if ca_file else True
        )
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx2.AsyncClient(
            base_url=base_url, verify=verify, headers=headers, trust_env=False,
            timeout=httpx2.Timeout(60.0),
            limits=httpx2.Limits(max_connections=connections,
                                 max_keepalive_connections=connections),
        )  # fmt: skip
        self.requests = 0
        self.retries = 0

    @classmethod
    def for_cluster(cls, cluster: harness.Cluster, connections: int = 64) -> RawAPI:
        return cls(cluster.apiserver, token=cluster.admin_token, ca_file=cluster.ca_file,
                   connections=connections)  # fmt: skip

    async def close(self) -> None:
        await self.http.aclose()

    async def call(self, method: str, path: str, body: JSON, content_type: str = "") -> JSON:
        """``method path`` with ``body``; the answer's object. Raises RuntimeError naming the
        request on an answer that is neither success nor worth retrying."""
        data = json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": content_type or "application/json"}
        delay = 0.05
        for attempt in range(RETRIES + 1):
            self.requests += 1
            try:
                resp = await self.http.request(method, path, content=data, headers=headers)
            except httpx2.TransportError as exc:
                if attempt == RETRIES:
                    raise RuntimeError(f"{method} {path}: {exc!r}") from exc
            else:
                if resp.status_code < 300:
                    answer: JSON = resp.json()
                    return answer
                if resp.status_code == 409 and method == "POST" and attempt > 0:
                    # an earlier try of this create reached the server: read the object
                    name = body["metadata"]["name"]
                    got = await self.http.get(f"{path}/{name}")
                    if got.status_code == 200:
                        found: JSON = got.json()
                        return found
                if resp.status_code not in RETRY_STATUS or attempt == RETRIES:
                    raise RuntimeError(f"{method} {path}: {resp.status_code} {resp.text[:300]}")
            self.retries += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    async def create(self, path: str, body: JSON) -> JSON:
        return await self.call("POST", path, body)

    async def patch_status(self, path: str, name: str, body: JSON) -> JSON:
        return await self.call("PATCH", f"{path}/{name}/status", body, MERGE)


NODES = "/api/v1/nodes"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
PODS = "/api/v1/namespaces/default/pods"
#: Forever: the node lifecycle controller must never evict a bench pod.
TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
]


def node_body(name: str) -> JSON:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def device_class_body() -> JSON:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DEVICE_CLASS}, "spec": {}}  # fmt: skip


def cluster_pod(body: JSON) -> JSON:
    """``body`` (a bench pod) as a real cluster keeps it: tolerations, no token volume."""
    spec = {**body["spec"], "tolerations": TOLERATIONS, "automountServiceAccountToken": False}
    return {"apiVersion": "v1", "kind": "Pod", **body, "spec": spec}


def reserved(allocation: JSON, pod: str, uid: str) -> JSON:
    """The claim-status patch ``allocation`` with ``reservedFor`` naming the pod."""
    status = {**allocation["status"],
              "reservedFor": [{"resource": "pods", "name": pod, "uid": uid}]}  # fmt: skip
    return {"status": status}


async def _workers(
    items: Sequence[Any], concurrency: int, one: Callable[[Any], Awaitable[None]]
) -> None:
    """Run ``one(item)`` for every item with ``concurrency`` workers; the first failure
    cancels the rest and is raised."""
    it = iter(items)

    async def worker() -> None:
        for item in it:
            await one(item)

    async with asyncio.TaskGroup() as tg:
        for _ in range(min(concurrency, len(items)) or 1):
            tg.create_task(worker())


async def seed_api(
    api: RawAPI,
    nodes: int,
    placed: Sequence[tuple[str, str, str]],
    *,
    slice_body: Callable[[str], JSON],
    claim_body: Callable[[str], JSON],
    allocation: Callable[[str, str], JSON],
    pod_body: Callable[[str, str], JSON],
    pod_status: Callable[[str, str], JSON],
    concurrency: int = 64,
    label: str = "real",
) -> dict[str, float]:
    """Seed ``nodes`` Nodes with their ResourceSlice and the pods of ``placed`` (claim,
    pod, the claim's allocation and reservation, the pod's status) through the API.

    Returns the seconds, requests and rates; prints progress every :data:`PROGRESS_S`.
    """
    t0 = time.monotonic()
    done = {"nodes": 0, "pods": 0}
    first = api.requests

    async def progress() -> None:
        while True:
            await asyncio.sleep(PROGRESS_S)
            el = time.monotonic() - t0
            print(f"{label}: seeded {done['nodes']}/{nodes} nodes, {done['pods']}/"
                  f"{len(placed)} pods in {el:.0f} s "
                  f"({(api.requests - first) / el:.0f} requests/s)",
                  file=sys.stderr, flush=True)  # fmt: skip

    async def one_node(n: int) -> None:
        await api.create(NODES, node_body(f"node-{n}"))
        await api.create(SLICES, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                  **slice_body(f"node-{n}")})  # fmt: skip
        done["nodes"] += 1

    async def one_pod(p: tuple[str, str, str]) -> None:
        name, pool, device = p
        await api.create(CLAIMS, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                  **claim_body(name)})  # fmt: skip
        pod = await api.create(PODS, cluster_pod(pod_body(name, pool)))
        await api.patch_status(CLAIMS, name, reserved(allocation(pool, device), name,
                                                      pod["metadata"]["uid"]))  # fmt: skip
        await api.patch_status(PODS, name, pod_status(device, pool))
        done["pods"] += 1

    reporter = asyncio.create_task(progress())
    try:
        await api.create(CLASSES, device_class_body())
        await _workers(range(nodes), concurrency, one_node)
        t_nodes = time.monotonic() - t0
        await _workers(placed, concurrency, one_pod)
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
    seconds = time.monotonic() - t0
    requests = api.requests - first
    return {
        "seed_s": seconds,
        "seed_requests": float(requests),
        "seed_requests_per_s": requests / seconds,
        "seed_pods_per_s": len(placed) / max(seconds - t_nodes, 1e-9),
        "seed_retries": float(api.retries),
    }
