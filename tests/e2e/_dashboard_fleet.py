"""A dashboard-sized fleet in the embedded API server, and the browser that looks at it.

Owns :func:`seed_fleet` (``nodes`` x 8 devices in ResourceSlices, the node agents'
health records, pods holding devices, a pod being evicted, one whose eviction a
PodDisruptionBudget refused, operator taints), :func:`set_health` (one device's health
changed through the API, as its node agent does) and :func:`launch` (Debian's headless
Chromium). The fleet test and ``bench/dashboard_bench.py`` share them, so the benchmark
measures what the test checks.

Seeding writes through the server's own engine (a fleet of 8,000 devices is about 3,000
objects: over HTTP that alone would take most of a test's minute on two cores); the
objects, their resourceVersions and the watch events the dashboard lists are the same
either way. Changes made while measuring go through the HTTP API.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.core import record_labels, record_name

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-precise-memory-info", "--js-flags=--expose-gc",
]  # fmt: skip
GPU = "gpu.example.com"
FPGA = "fpga.example.com"
PER_NODE = 8
REQUEST = {"name": "gpu", "exactly": {"deviceClassName": "g"}}


def node_name(i: int) -> str:
    return f"node-{i:04d}"


def driver_of(i: int) -> str:
    """Every tenth node has FPGAs, the rest GPUs (two drivers to filter on)."""
    return FPGA if i % 10 == 9 else GPU


def key(i: int, device: int) -> str:
    return f"{driver_of(i)}/{node_name(i)}/dev-{device}"


@dataclass
class Fleet:
    """What :func:`seed_fleet` wrote, for the checks."""

    nodes: int
    #: node index -> the rows of its agent's record (changed by :func:`set_health`)
    rows: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    pod: str = ""  # a pod on a device: "namespace/name" on key(1, 0)
    evicting: str = ""  # on key(2, 0)
    blocked: str = ""  # on key(3, 0), whose device is tainted
    bad: str = ""  # key(7, 3): Unhealthy from the start

    @property
    def devices(self) -> int:
        return self.nodes * PER_NODE


def seed_fleet(server: APIServer, nodes: int = 1000) -> Fleet:
    """Write the fleet (see the module docstring); nodes 1-7 hold the special cases."""
    from drahealth.controlplane._engine import MERGE, WriteOptions
    from drahealth.controlplane._resources import lookup

    engine, opts = server.engine, WriteOptions(manager="fleet")

    def kind(group: str, plural: str) -> Any:
        found = lookup(group, "v1", plural)
        assert found is not None, plural
        return found

    slices, cms = kind("resource.k8s.io", "resourceslices"), kind("", "configmaps")
    claims, pods = kind("resource.k8s.io", "resourceclaims"), kind("", "pods")
    events, rules = kind("", "events"), kind("resource.k8s.io", "devicetaintrules")
    fleet = Fleet(nodes)
    now = time.time()
    for i in range(nodes):
        node, driver = node_name(i), driver_of(i)
        engine.create(slices, None, {
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"dev-{d}"} for d in range(PER_NODE)]},
        }, opts)  # fmt: skip
        rows = [
            {"driver": driver, "pool": node, "device": f"dev-{d}", "health": "Healthy",
             "message": "", "since": round(now - 3600, 3)}
            for d in range(PER_NODE)
        ]  # fmt: skip
        if i == 7:
            rows[3].update(health="Unhealthy", message="XID 79")
        fleet.rows[i] = rows
        engine.create(cms, "default", {
            "metadata": {"name": record_name(node), "namespace": "default",
                         "labels": record_labels(node)},
            "data": {"devices": json.dumps(rows)},
        }, opts)  # fmt: skip
    for i in range(1, min(nodes, 200)):  # a pod on dev-0 of nodes 1..199
        node, name = node_name(i), f"train-{i:04d}"
        engine.create(claims, "default", {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [REQUEST]}},
        }, opts)  # fmt: skip
        result = {"request": "gpu", "driver": driver_of(i), "pool": node, "device": "dev-0"}
        engine.patch(claims, "default", name, MERGE,
                     {"status": {"allocation": {"devices": {"results": [result]}}}},
                     "status", opts)  # fmt: skip
        engine.create(pods, "default", {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "m", "image": "x",
                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
        }, opts)  # fmt: skip
        conditions = [{"type": "Ready", "status": "True"}]
        if i == 2:  # the Eviction API's mark, before the pod goes
            conditions.append({"type": "DisruptionTarget", "status": "True",
                               "reason": "EvictionByEvictionAPI"})  # fmt: skip
        engine.patch(pods, "default", name, MERGE,
                     {"status": {"phase": "Running", "conditions": conditions}},
                     "status", opts)  # fmt: skip
    fleet.pod, fleet.evicting, fleet.blocked = (f"default/train-{i:04d}" for i in (1, 2, 3))
    fleet.bad = key(7, 3)
    for i, device in ((3, 0), (5, 1)):
        engine.create(rules, None, {
            "metadata": {"name": f"rma-{i}-{device}"},
            "spec": {"deviceSelector": {"driver": driver_of(i), "pool": node_name(i),
                                        "device": f"dev-{device}"},
                     "taint": {"key": "ops.example.com/rma", "effect": "NoSchedule"}},
        }, opts)  # fmt: skip
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    engine.create(events, "default", {
        "metadata": {"name": "train-0003.blocked", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "train-0003",
                           "apiVersion": "v1"},
        "reason": "EvictionBlocked", "type": "Warning",
        "message": "eviction of pod default/train-0003 refused: Cannot evict pod as it "
                   "would violate the pod's disruption budget.",
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "source": {"component": "drahealth-controller"},
        "reportingComponent": "drahealth-controller", "reportingInstance": "controller-0",
    }, opts)  # fmt: skip
    return fleet


async def set_health(
    client: AsyncClient, fleet: Fleet, i: int, device: int, health: str, message: str = ""
) -> None:
    """Change one device's health in node ``i``'s record, through the API (as its agent)."""
    rows = fleet.rows[i]
    rows[device].update(health=health, message=message, since=round(time.time(), 3))
    await client.patch(
        ConfigMap, record_name(node_name(i)), {"data": {"devices": json.dumps(rows)}},
        namespace="default", patch_type=PatchType.MERGE,
    )  # fmt: skip


async def launch(playwright: Any) -> Any:
    """Headless Debian Chromium (with precise memory figures and a callable GC)."""
    return await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)


async def heap_mb(page: Any, cdp: Any) -> float:
    """The page's JavaScript heap in use after a full garbage collection, in MB."""
    await cdp.send("HeapProfiler.collectGarbage")
    used = await page.evaluate("performance.memory.usedJSHeapSize")
    return float(used) / 1e6


async def dom_nodes(page: Any, selector: str = "*") -> int:
    """Elements of the page that match ``selector`` (all, by default)."""
    return int(await page.evaluate("s => document.querySelectorAll(s).length", selector))
