"""Benchmarks of attached health sources in the node agent (``drahealth agent --attach``).

Owns nothing but measurements, on one simulated node with 8 GPUs published the way
NVIDIA's DRA driver publishes them (``sim-nvidia``'s devices in a ResourceSlice of the
embedded API server):

* ``latency``: a node agent (observer mode, in this process) attaches a kernel-log source
  (:class:`drahealth.sources.KmsgSource` following a file) to the GPUs. A writer appends
  an NVIDIA XID line for one GPU at a random moment; measured is the time until the
  agent's health pipeline has the device's new health on disk and its listeners hear of
  it (``record``: the device-health record of the agent), and until the node's
  device-health ConfigMap the controller reads shows it (``configmap``). Each sample
  changes what the log says (XID 79 and 48 alternate on one of the 8 GPUs);
* ``at_rest``: ``drahealth agent --mode observer --attach FILE`` as a subprocess with
  every source kind on (kmsg on a file, dcgm on a fake dcgm-exporter, nvml without a GPU)
  and, for comparison, the same agent without ``--attach``; nothing happens for
  ``seconds``; the agent process's CPU time over the wall time (from /proc).

Run: ``python bench/attached_bench.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lightkube.resources.core_v1 import ConfigMap, Node
from lightkube.resources.resource_v1 import ResourceSlice
from waits import Output, stop_process, within

from drahealth.controlplane import APIServer
from drahealth.core import HealthChange
from drahealth.kube import Reflector, make_client
from drahealth.node import AgentConfig, NodeAgent, parse_attach_config
from drahealth.simdriver import sim_nvidia_gpus, sim_nvidia_pool

NODE = "node-1"
NV = "gpu.nvidia.com"
GPUS = sim_nvidia_gpus(NODE, 8)


def xid_line(bus_id: str, xid: int) -> str:
    return f"NVRM: Xid (PCI:{bus_id[:-2]}): {xid}, pid=4242, name=python, bench fault.\n"


async def seed(client: Any) -> None:
    await client.create(Node.from_dict({"metadata": {"name": NODE}}))
    pool = sim_nvidia_pool(NODE, 8)
    await client.create(ResourceSlice.from_dict({
        "metadata": {"name": f"{NODE}-{NV}"},
        "spec": {"driver": NV, "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                 "devices": [d.to_dict() for d in pool.devices]},
    }))  # fmt: skip


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def latency(samples: int) -> dict[str, float]:
    server = APIServer()
    await server.start(host="127.0.0.1", port=0)
    client = make_client(server_url=server.url)
    with tempfile.TemporaryDirectory(prefix="dh-attach-bench-") as tmp:
        log = Path(tmp) / "kmsg"
        log.touch()
        await seed(client)
        attach = parse_attach_config(
            f"driver: {NV}\nsources: [{{kind: kmsg, path: {log}, clearAfter: 3600}}]\n", "bench"
        )
        config = AgentConfig(
            NODE, f"{tmp}/reg", f"{tmp}/agent", mode="observer",
            podresources_socket=f"{tmp}/none.sock",
        )  # fmt: skip
        agent = NodeAgent(config, client, attach=attach)
        seen: dict[str, tuple[str, float]] = {}
        wanted: asyncio.Event = asyncio.Event()
        target: dict[str, str] = {}

        def on_changes(changes: list[HealthChange]) -> None:
            now = time.perf_counter()
            for c in changes:
                if c.key.device == target.get("device") and target.get("text", "~") in c.message:
                    seen["record"] = (c.message, now)
                    wanted.set()

        cms: Reflector[ConfigMap] = Reflector(
            client, ConfigMap, namespace="default",
            fields={"metadata.name": f"drahealth-devices-{NODE}"},
        )  # fmt: skip
        shown = asyncio.Event()

        def on_cm(_type: str, cm: ConfigMap, _old: ConfigMap | None) -> None:
            rows = json.loads((cm.data or {}).get("devices", "[]"))
            for r in rows:
                if r["device"] == target.get("device") and target.get("text", "~") in r["message"]:
                    seen.setdefault("configmap", (r["message"], time.perf_counter()))
                    shown.set()

        cms.add_handler(on_cm)
        await agent.start()
        await cms.start()
        agent.pipeline.add_listener(on_changes)
        attachment = agent.attached.drivers[NV] if agent.attached else None
        assert attachment is not None
        await within(_until(lambda: attachment.ready), 10, "the agent's first report")
        record: list[float] = []
        shown_ms: list[float] = []
        rng = random.Random(7)
        # the writer is the test itself: appending to a local file from the loop is the point
        with open(log, "a", encoding="utf-8") as f:  # noqa: ASYNC230
            for i in range(samples):
                gpu = GPUS[i % len(GPUS)]
                xid = 79 if (i // len(GPUS)) % 2 == 0 else 48
                seen.clear()
                wanted.clear()
                shown.clear()
                target.update(device=gpu.name, text=f"XID {xid}")
                await asyncio.sleep(rng.uniform(0.0, 0.05))  # a random phase of the poll cycle
                t0 = time.perf_counter()
                f.write(xid_line(gpu.pci_bus_id, xid))
                f.flush()
                await within(wanted.wait(), 5, f"the record of sample {i}")
                await within(shown.wait(), 5, f"the ConfigMap of sample {i}")
                record.append((seen["record"][1] - t0) * 1000)
                shown_ms.append((seen["configmap"][1] - t0) * 1000)
        await cms.stop()
        await agent.stop()
    await client.close()
    await server.stop()
    return {
        "samples": samples,
        "record_p50_ms": statistics.median(record),
        "record_p99_ms": percentile(record, 99),
        "record_max_ms": max(record),
        "configmap_p50_ms": statistics.median(shown_ms),
        "configmap_p99_ms": percentile(shown_ms, 99),
    }


async def _until(check: Any) -> None:
    while not check():  # noqa: ASYNC110 - a flag of another object, no event to wait on
        await asyncio.sleep(0.01)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def at_rest(seconds: float) -> dict[str, float]:
    from drahealth.simdriver import FakeDcgmExporter

    server = APIServer()
    await server.start(host="127.0.0.1", port=0)
    client = make_client(server_url=server.url)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="dh-attach-rest-") as tmp, \
            FakeDcgmExporter.from_gpus(GPUS) as dcgm:  # fmt: skip
        kubeconfig = Path(tmp) / "kubeconfig"
        server.write_kubeconfig(kubeconfig)
        await seed(client)
        log = Path(tmp) / "kmsg"
        with open(log, "w", encoding="utf-8") as f:  # noqa: ASYNC230 - before the agent runs
            for gpu in GPUS[:4]:  # four GPUs with a latched fault: the source answers for them
                f.write(xid_line(gpu.pci_bus_id, 79))
        attach = Path(tmp) / "attach.yaml"
        attach.write_text(
            f"driver: {NV}\nkey: {{attribute: resource.kubernetes.io/pciBusID, matchAll: true}}\n"
            "sources:\n"
            f"  - {{kind: kmsg, path: {log}, fromStart: true, clearAfter: 3600}}\n"
            f"  - {{kind: dcgm, url: '{dcgm.url}'}}\n"
            "  - {kind: nvml}\n"
        )
        for label, extra in (("without_attach", []), ("with_attach", ["--attach", str(attach)])):
            state = Path(tmp) / label
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "drahealth", "agent", "--mode", "observer",
                "--node-name", NODE, "--registry-dir", f"{state}/reg",
                "--state-dir", f"{state}/agent", "--kubeconfig", str(kubeconfig),
                "--podresources-socket", f"{state}/none.sock", *extra,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            assert proc.stdout is not None
            output = Output(proc.stdout)
            try:
                await output.line_with("ready: ", 20, f"the agent ({label}) ready")
                await asyncio.sleep(5.0)  # first polls, first reports, first scrapes
                cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
                await asyncio.sleep(seconds)
                cpu1, t1 = _cpu_seconds(proc.pid), time.monotonic()
                out[f"{label}_core_percent"] = 100 * (cpu1 - cpu0) / (t1 - t0)
            finally:
                await stop_process(proc, f"the agent ({label})")
                with contextlib.suppress(Exception):
                    await output.close()
    await client.close()
    await server.stop()
    base = out["without_attach_core_percent"]
    out["attach_core_percent"] = out["with_attach_core_percent"] - base
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, shorter rest")
    args = parser.parse_args()
    results = {
        "latency": await latency(40 if args.quick else 200),
        "at_rest": await at_rest(10.0 if args.quick else 30.0),
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
