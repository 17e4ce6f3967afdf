"""End to end on the embedded control plane: an attached source marks an NVIDIA GPU.

One node, two drivers: ``gpu.nvidia.com`` publishes two GPUs the way NVIDIA's DRA driver
does (``sim-nvidia``'s devices: ``uuid``, ``resource.kubernetes.io/pciBusID``) and
streams no health; ``gpu.example.com`` publishes one device with the same PCI address
as the first GPU. The node agent (observer mode, as beside a real kubelet) attaches a
fake source (a tiny AttachedSource of this test) to the NVIDIA driver. The control
plane's stand-ins schedule a ReplicaSet's pod on each driver; the remediation
controller taints Unhealthy NVIDIA GPUs NoExecute.

The source marks the trainer's GPU by PCI address -> the agent's device-health record
says Unhealthy, naming the source -> the controller taints that GPU -> its pod is evicted
and replaced on the healthy GPU; the pod on the other driver's device (same PCI address)
is untouched and its device never tainted -> the source says Healthy again -> untaint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.apps_v1 import ReplicaSet
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod
from lightkube.resources.resource_v1 import (
    DeviceClass,
    DeviceTaintRule,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)

from drahealth.core import POD_CONDITION_TYPE, Health, Signal
from drahealth.kube import as_dict
from drahealth.node import SOURCE_KINDS, AgentConfig, NodeAgent, parse_attach_config
from drahealth.node._attach_config import SourceSettings
from drahealth.remedy._controller import RemediationController
from drahealth.simdriver import FakeDcgmExporter, sim_nvidia_gpus, sim_nvidia_pool
from drahealth.standins import StandIns
from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client
from tests.integration.remedy.test_controller import policy

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(60)

NODE, NS = "node-1", "default"
NV, OTHER = "gpu.nvidia.com", "gpu.example.com"
GPUS = {g.name: g for g in sim_nvidia_gpus(NODE, 2)}
RULES = f"""- name: gpu-fault
  match: {{driver: {NV}}}
  action: {{effect: NoExecute}}
  recovery: {{healthyFor: 1s}}
- name: other-fault
  match: {{driver: {OTHER}}}
  action: {{effect: NoExecute}}
  recovery: {{healthyFor: 1s}}
"""
ATTACH = f"""
driver: {NV}
sources:
  - {{kind: test-source, name: xid-watch, interval: 0.05, timeout: 5}}
"""


class TestSource:
    """The test's attached source: answers what the test last said."""

    __test__ = False  # not a test class
    current: TestSource | None = None

    def __init__(self, settings: SourceSettings) -> None:
        self.name = settings.name
        self.interval = settings.interval or 0.05
        self.timeout = settings.timeout or 5.0
        self._signals: list[Signal] = []
        self._lock = threading.Lock()
        TestSource.current = self

    def say(self, *signals: Signal) -> None:
        with self._lock:
            self._signals = list(signals)

    def poll(self) -> list[Signal]:
        with self._lock:
            return list(self._signals)


@pytest.fixture(autouse=True)
def test_kind() -> Iterator[None]:
    SOURCE_KINDS["test-source"] = TestSource
    yield
    SOURCE_KINDS.pop("test-source", None)


def template(name: str, device_class: str) -> ResourceClaimTemplate:
    return ResourceClaimTemplate.from_dict({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}},
    })  # fmt: skip


def replicaset(name: str, claim_template: str) -> ReplicaSet:
    return ReplicaSet.from_dict({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "resourceClaims": [
                        {"name": "gpu", "resourceClaimTemplateName": claim_template}
                    ],
                    "containers": [{"name": "main", "image": "x",
                                    "resources": {"claims": [{"name": "gpu"}]}}],
                },
            },
        },
    })  # fmt: skip


async def seed(client: AsyncClient) -> None:
    await client.create(Node.from_dict({"metadata": {"name": NODE}}))
    nvidia = sim_nvidia_pool(NODE, 2)
    await client.create(ResourceSlice.from_dict({
        "metadata": {"name": f"{NODE}-{NV}"},
        "spec": {"driver": NV, "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                 "devices": [d.to_dict() for d in nvidia.devices]},
    }))  # fmt: skip
    await client.create(ResourceSlice.from_dict({
        "metadata": {"name": f"{NODE}-{OTHER}"},
        "spec": {"driver": OTHER, "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "card-0", "attributes": {
                     "resource.kubernetes.io/pciBusID": {"string": GPUS["gpu-0"].pci_bus_id}}}]},
    }))  # fmt: skip
    for name, driver in (("nvidia", NV), ("example", OTHER)):
        await client.create(DeviceClass.from_dict({
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        }))  # fmt: skip
    await client.create(template("one-gpu", "nvidia"))
    await client.create(template("one-card", "example"))
    await client.create(replicaset("trainer", "one-gpu"))
    await client.create(replicaset("other", "one-card"))


async def placement(client: AsyncClient, app: str) -> tuple[str, str, str] | None:
    """(pod, driver, device) of the app's live, bound pod with an allocated claim."""
    async for pod in client.list(Pod, namespace=NS, labels={"app": app}):
        p = as_dict(pod)
        if p["metadata"].get("deletionTimestamp") or not p["spec"].get("nodeName"):
            continue
        for status in p.get("status", {}).get("resourceClaimStatuses") or []:
            claim = as_dict(await client.get(ResourceClaim, status["resourceClaimName"],
                                             namespace=NS))  # fmt: skip
            alloc = (claim.get("status") or {}).get("allocation") or {}
            for r in (alloc.get("devices") or {}).get("results") or []:
                return p["metadata"]["name"], r["driver"], r["device"]
    return None


async def tainted(client: AsyncClient) -> set[tuple[str, str]]:
    """(driver, device) of every DeviceTaintRule."""
    out = set()
    async for rule in client.list(DeviceTaintRule):
        sel = as_dict(rule)["spec"].get("deviceSelector") or {}
        out.add((sel.get("driver"), sel.get("device")))
    return out


async def record(client: AsyncClient) -> dict[str, tuple[str, str]]:
    """The agent's device-health record of the node: device key -> (health, message)."""
    try:
        cm = await client.get(ConfigMap, f"drahealth-devices-{NODE}", namespace=NS)
    except Exception:
        return {}
    rows = json.loads((cm.data or {}).get("devices", "[]"))
    return {f"{r['driver']}/{r['pool']}/{r['device']}": (r["health"], r["message"]) for r in rows}


@contextlib.asynccontextmanager
async def cluster(client: AsyncClient, tmp: Path, attach: str = ATTACH) -> AsyncIterator[NodeAgent]:
    standins = StandIns(client)
    controller = RemediationController(client, policy(RULES), identity="c")
    config = AgentConfig(
        NODE, str(tmp / "reg"), str(tmp / "agent"), mode="observer",
        podresources_socket=str(tmp / "no-kubelet.sock"), postmortem_namespace=NS,
    )  # fmt: skip
    agent = NodeAgent(config, client, attach=parse_attach_config(attach, "attach.yaml"))
    await standins.start()
    task = asyncio.create_task(controller.run())
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await standins.stop()


async def test_a_fault_keyed_by_pci_address_taints_the_gpu_and_moves_its_pod(
    client: AsyncClient, tmp_path: Path
) -> None:
    await seed(client)
    async with cluster(client, tmp_path):
        source = TestSource.current
        assert source is not None
        trainer = await eventually(lambda: placement(client, "trainer"), 10, "trainer placed")
        other = await eventually(lambda: placement(client, "other"), 10, "other placed")
        pod, driver, device = trainer
        assert driver == NV and other[1:] == (OTHER, "card-0")
        healthy = "gpu-1" if device == "gpu-0" else "gpu-0"
        key = f"{NV}/{NODE}/{device}"
        # at rest: the GPUs read Healthy in the record (the source answers, nothing wrong)
        await eventually(
            lambda: _has(record(client), key, "Healthy"), 10, "the GPU Healthy in the record"
        )

        t0 = time.monotonic()
        bus = GPUS[device].pci_bus_id  # 0000:bb:dd.0; the kernel log writes PCI:0000:bb:dd
        source.say(Signal("pciBusID", f"PCI:{bus[:-2]}", Health.UNHEALTHY,
                          "XID 79: GPU has fallen off the bus"))  # fmt: skip
        got = await eventually(
            lambda: _has(record(client), key, "Unhealthy"), 10, "Unhealthy in the record"
        )
        assert got[key] == ("Unhealthy", "xid-watch: XID 79: GPU has fallen off the bus")
        assert all(not k.startswith(OTHER) for k in got)  # the other driver: no record
        await eventually(lambda: _contains(tainted(client), (NV, device)), 10, "the GPU tainted")

        async def replaced() -> tuple[str, str, str] | None:
            now = await placement(client, "trainer")
            return now if now is not None and now[0] != pod else None

        new_pod, _, new_device = await eventually(replaced, 15, "a replacement trainer pod")
        print(f"fault -> replacement bound: {(time.monotonic() - t0) * 1000:.0f} ms")
        assert new_device == healthy
        # the other driver's device shares the PCI address: untouched
        assert (OTHER, "card-0") not in await tainted(client)
        assert await placement(client, "other") == other
        reasons = [
            (e.involvedObject.name, e.reason)
            async for e in client.list(Event, namespace=NS)
            if e.involvedObject.name == other[0]
        ]
        assert not any(r in ("DeviceUnhealthy", "DeviceTaintManagerEviction") for _, r in reasons)
        # the replacement uses a healthy GPU: its condition says so (no kubelet here)
        cond = await eventually(
            lambda: _condition(client, new_pod, "True"), 10, "the new pod's condition True"
        )
        assert cond["message"] == "1 device healthy"

        source.say(Signal("pciBusID", bus, Health.HEALTHY, ""))
        await eventually(
            lambda: _has(record(client), key, "Healthy"), 10, "Healthy in the record again"
        )
        await eventually(lambda: _lacks(tainted(client), (NV, device)), 15, "the GPU untainted")


async def _has(rows: Any, key: str, health: str) -> dict[str, tuple[str, str]] | None:
    got: dict[str, tuple[str, str]] = await rows
    return got if got.get(key, ("",))[0] == health else None


async def _contains(found: Any, item: tuple[str, str]) -> bool:
    return item in await found


async def _lacks(found: Any, item: tuple[str, str]) -> bool:
    return item not in await found


async def _condition(client: AsyncClient, pod: str, status: str) -> dict[str, Any] | None:
    try:
        p = as_dict(await client.get(Pod, pod, namespace=NS))
    except Exception:
        return None
    for c in (p.get("status") or {}).get("conditions") or []:
        if c["type"] == POD_CONDITION_TYPE and c["status"] == status:
            return dict(c)
    return None


async def test_a_dcgm_exporter_xid_taints_the_gpu_by_uuid_and_moves_its_pod(
    client: AsyncClient, tmp_path: Path
) -> None:
    """The same story from a (fake, real-HTTP) dcgm-exporter: the XID gauge of one GPU's
    UUID -> that GPU tainted, its pod replaced on the other GPU, the other driver's device
    with the same PCI address untouched; the gauge cleared -> untainted."""
    await seed(client)
    with FakeDcgmExporter.from_gpus(GPUS.values()) as exporter:
        attach = f"""
driver: {NV}
sources:
  - {{kind: dcgm, name: dcgm, url: "{exporter.url}", key: uuid, interval: 0.1, timeout: 5}}
"""
        async with cluster(client, tmp_path, attach):
            trainer = await eventually(lambda: placement(client, "trainer"), 10, "trainer placed")
            other = await eventually(lambda: placement(client, "other"), 10, "other placed")
            pod, _, device = trainer
            healthy = "gpu-1" if device == "gpu-0" else "gpu-0"
            key = f"{NV}/{NODE}/{device}"
            await eventually(
                lambda: _has(record(client), key, "Healthy"), 10, "the GPU Healthy in the record"
            )
            exporter.xid(GPUS[device].uuid, 79)
            got = await eventually(
                lambda: _has(record(client), key, "Unhealthy"), 10, "Unhealthy in the record"
            )
            assert got[key][1].startswith("dcgm: ") and "79" in got[key][1], got[key]
            await eventually(lambda: _contains(tainted(client), (NV, device)), 10, "tainted")

            async def replaced() -> tuple[str, str, str] | None:
                now = await placement(client, "trainer")
                return now if now is not None and now[0] != pod else None

            _, _, new_device = await eventually(replaced, 15, "a replacement trainer pod")
            assert new_device == healthy
            assert (OTHER, "card-0") not in await tainted(client)
            assert await placement(client, "other") == other

            exporter.clear(GPUS[device].uuid)
            await eventually(
                lambda: _has(record(client), key, "Healthy"), 10, "Healthy in the record again"
            )
            await eventually(lambda: _lacks(tainted(client), (NV, device)), 15, "untainted")


async def test_an_nvml_xid_event_taints_the_gpu_by_uuid_and_moves_its_pod(
    client: AsyncClient, tmp_path: Path
) -> None:
    """The same story from NVML in the agent (the fake NVML of the source tests): an XID
    event on one GPU's UUID -> that GPU tainted and its pod moved; the latch ends ->
    untainted."""
    from types import SimpleNamespace

    from drahealth.sources import NvmlAttachedSource
    from tests.unit.sources.fake_nvml import FakeGpu
    from tests.unit.sources.test_nvml_attached import EnumeratingNvml

    buses = {g.uuid: g.pci_bus_id for g in GPUS.values()}

    class NodeNvml(EnumeratingNvml):
        def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> SimpleNamespace:
            return SimpleNamespace(busId=buses[gpu.uuid])

    fake = NodeNvml(*(FakeGpu(u) for u in buses))

    def build(settings: SourceSettings) -> NvmlAttachedSource:
        return NvmlAttachedSource(
            nvml=fake, interval=settings.interval or 0.05, timeout=settings.timeout or 5.0,
            clear_after=2.0,
        )  # fmt: skip

    SOURCE_KINDS["fake-nvml"] = build
    attach = f"""
driver: {NV}
sources:
  - {{kind: fake-nvml, name: nvml, interval: 0.05, timeout: 5}}
"""
    await seed(client)
    try:
        async with cluster(client, tmp_path, attach):
            trainer = await eventually(lambda: placement(client, "trainer"), 10, "trainer placed")
            pod, _, device = trainer
            healthy = "gpu-1" if device == "gpu-0" else "gpu-0"
            key = f"{NV}/{NODE}/{device}"
            await eventually(
                lambda: _has(record(client), key, "Healthy"), 10, "the GPU Healthy in the record"
            )
            fake.xid(GPUS[device].uuid, 79)
            got = await eventually(
                lambda: _has(record(client), key, "Unhealthy"), 10, "Unhealthy in the record"
            )
            assert got[key][1].startswith("nvml: ") and "79" in got[key][1], got[key]
            await eventually(lambda: _contains(tainted(client), (NV, device)), 10, "tainted")

            async def replaced() -> tuple[str, str, str] | None:
                now = await placement(client, "trainer")
                return now if now is not None and now[0] != pod else None

            _, _, new_device = await eventually(replaced, 15, "a replacement trainer pod")
            assert new_device == healthy
            assert (OTHER, "card-0") not in await tainted(client)
            await eventually(lambda: _lacks(tainted(client), (NV, device)), 15, "untainted")
    finally:
        SOURCE_KINDS.pop("fake-nvml", None)


async def test_a_kernel_log_xid_line_taints_the_gpu_by_pci_address_and_moves_its_pod(
    client: AsyncClient, tmp_path: Path
) -> None:
    """The same story from a followed kernel-log file: an NVRM Xid line naming one GPU's
    PCI address -> that GPU tainted, its pod moved, the other driver's device with the
    same PCI address untouched; the latch ends -> untainted."""
    log = tmp_path / "kern.log"
    log.write_text("")
    attach = f"""
driver: {NV}
sources:
  - {{kind: kmsg, name: kmsg, path: "{log}", clearAfter: 2s, interval: 0.05}}
"""
    await seed(client)
    async with cluster(client, tmp_path, attach):
        trainer = await eventually(lambda: placement(client, "trainer"), 10, "trainer placed")
        other = await eventually(lambda: placement(client, "other"), 10, "other placed")
        pod, _, device = trainer
        healthy = "gpu-1" if device == "gpu-0" else "gpu-0"
        key = f"{NV}/{NODE}/{device}"
        bus = GPUS[device].pci_bus_id  # 0000:bb:dd.0; the kernel log writes PCI:0000:bb:dd
        with log.open("a") as f:
            f.write(
                f"[ 1234.567890] NVRM: Xid (PCI:{bus[:-2]}): 79, pid=4242, name=python, "
                "GPU has fallen off the bus.\n"
            )
        got = await eventually(
            lambda: _has(record(client), key, "Unhealthy"), 10, "Unhealthy in the record"
        )
        assert got[key][1].startswith("kmsg: ") and "79" in got[key][1], got[key]
        await eventually(lambda: _contains(tainted(client), (NV, device)), 10, "tainted")

        async def replaced() -> tuple[str, str, str] | None:
            now = await placement(client, "trainer")
            return now if now is not None and now[0] != pod else None

        _, _, new_device = await eventually(replaced, 15, "a replacement trainer pod")
        assert new_device == healthy
        assert (OTHER, "card-0") not in await tainted(client)
        assert await placement(client, "other") == other
        await eventually(lambda: _lacks(tainted(client), (NV, device)), 15, "untainted")
