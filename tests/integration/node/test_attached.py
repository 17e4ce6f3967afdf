"""Attached health sources in the agent, on the embedded API server.

The watched driver's ResourceSlices are NVIDIA-style (``sim-nvidia``'s devices: uuid,
``resource.kubernetes.io/pciBusID``); a second driver on the same node publishes a device
with the same PCI address. A fake source (a tiny AttachedSource) says what the test
wants. Checked: signals reach the health pipeline by attribute, only for the watched
driver; leases; poll failures; slices changing; the pod condition and Event, written
without touching anything the kubelet writes; metrics.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType
from prometheus_client import CollectorRegistry, generate_latest

from drahealth.core import POD_CONDITION_TYPE, Health, Signal
from drahealth.kube import as_dict, patch_status
from drahealth.node import SOURCE_KINDS, parse_attach_config
from drahealth.node._attach_config import SourceSettings
from drahealth.node._attached import AttachedSources
from drahealth.node._events import EventRecorder
from drahealth.node._pipeline import HealthPipeline
from drahealth.simdriver import sim_nvidia_gpus, sim_nvidia_pool
from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(60)

NODE = "node-1"
NV = "gpu.nvidia.com"
OTHER = "gpu.example.com"
GPUS = sim_nvidia_gpus(NODE, 3)


class FakeSource:
    """An attached source whose answer the test sets; ``error`` makes ``poll`` raise."""

    instances: dict[str, FakeSource] = {}

    def __init__(self, name: str = "fake", interval: float = 0.05, timeout: float = 1.0) -> None:
        self.name = name
        self.interval = interval
        self.timeout = timeout
        self.signals: list[Any] = []
        self.error: str | None = None
        self.polls = 0
        self._lock = threading.Lock()
        FakeSource.instances[name] = self

    def say(self, *signals: Any) -> None:
        with self._lock:
            self.signals = list(signals)

    def poll(self) -> list[Signal]:
        with self._lock:
            self.polls += 1
            if self.error:
                raise OSError(self.error)
            return list(self.signals)


def build_fake(settings: SourceSettings) -> Any:
    return FakeSource(settings.name, settings.interval or 0.05, settings.timeout or 1.0)


@pytest.fixture(autouse=True)
def fake_kind() -> Iterator[None]:
    SOURCE_KINDS["fake"] = build_fake
    FakeSource.instances.clear()
    yield
    SOURCE_KINDS.pop("fake", None)


def nvidia_slice(node: str = NODE, count: int = 3, generation: int = 1) -> ResourceSlice:
    pool = sim_nvidia_pool(node, count)
    return ResourceSlice.from_dict({
        "metadata": {"name": f"{node}-{NV}"},
        "spec": {
            "driver": NV, "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [d.to_dict() for d in pool.devices],
        },
    })  # fmt: skip


def other_slice() -> ResourceSlice:
    """Another driver's device on the same node, with gpu-0's PCI address."""
    return ResourceSlice.from_dict({
        "metadata": {"name": f"{NODE}-{OTHER}"},
        "spec": {
            "driver": OTHER, "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {
                "resource.kubernetes.io/pciBusID": {"string": GPUS[0].pci_bus_id},
                "uuid": {"string": GPUS[0].uuid},
            }}],
        },
    })  # fmt: skip


CONFIG = f"""
drivers:
  - driver: {NV}
    sources:
      - {{kind: fake, name: fake, interval: 0.05, timeout: 0.6}}
      - {{kind: fake, name: second, interval: 0.05, timeout: 5}}
"""


class World:
    def __init__(self, client: AsyncClient, tmp: Path) -> None:
        self.client = client
        self.pipeline = HealthPipeline(str(tmp / "state"), default_timeout=5.0)
        self.events = EventRecorder(client, NODE, dedupe_seconds=0.0)
        self.registry = CollectorRegistry()
        self.attached = AttachedSources(
            parse_attach_config(CONFIG, "attach.yaml"), client, NODE, self.pipeline,
            self.events, registry=self.registry,
        )  # fmt: skip
        self.fake = FakeSource.instances["fake"]
        self.second = FakeSource.instances["second"]

    def health(self, device: str, driver: str = NV) -> tuple[str, str]:
        h, m = self.pipeline.cache.get(driver, NODE, device)
        return h.value, m

    def all_health(self) -> dict[str, tuple[str, str]]:
        return {e.device: (e.health.value, e.message) for e in self.pipeline.cache.entries(NV)}


@pytest.fixture
async def world(client: AsyncClient, tmp_path: Path) -> AsyncIterator[World]:
    await client.create(nvidia_slice())
    await client.create(nvidia_slice("node-2"))
    await client.create(other_slice())
    w = World(client, tmp_path)
    await w.pipeline.start()
    await w.attached.start()
    try:
        yield w
    finally:
        await w.attached.stop()
        await w.events.drain()
        await w.pipeline.stop()


def pci(i: int) -> Signal:
    """gpu-i keyed the way the kernel log names it."""
    return Signal("pciBusID", "PCI:" + GPUS[i].pci_bus_id[:-2], Health.UNHEALTHY, "XID 79")


async def test_signals_reach_the_pipeline_by_attribute_for_the_watched_driver_only(
    world: World,
) -> None:
    world.fake.say(pci(1))
    world.second.say(Signal("uuid", GPUS[2].uuid.upper(), Health.HEALTHY, "ok"))
    got = await eventually(
        lambda: (h := world.all_health()) and h.get("gpu-1", ("",))[0] == "Unhealthy" and h,
        5, "gpu-1 Unhealthy in the agent's cache",
    )  # fmt: skip
    assert got == {
        "gpu-0": ("Healthy", ""),
        "gpu-1": ("Unhealthy", "fake: XID 79"),
        "gpu-2": ("Healthy", "second: ok"),
    }  # node-2's GPUs are not this node's
    assert world.pipeline.cache.entries(OTHER) == []  # same PCI address, another driver
    # worst wins across sources, each named
    world.second.say(Signal("uuid", GPUS[1].uuid, Health.UNHEALTHY, "ECC"))
    await eventually(
        lambda: world.health("gpu-1") == ("Unhealthy", "fake: XID 79; second: ECC"),
        5, "both sources named",
    )  # fmt: skip
    # the lease: a device the source stops answering for turns Unknown after 0.6 s
    world.fake.say()
    world.second.say(Signal("uuid", GPUS[1].uuid, Health.HEALTHY, ""))
    assert world.health("gpu-1")[0] == "Unhealthy"
    await eventually(
        lambda: world.health("gpu-1") == ("Unknown", "fake: no report of this device for 0.6 s"),
        5, "gpu-1 Unknown after the fake source's lease",
    )  # fmt: skip


async def test_poll_failures_let_the_lease_run_down(world: World) -> None:
    await eventually(lambda: world.health("gpu-0")[0] == "Healthy", 5, "first answers")
    world.fake.error = "kernel log went away"
    await eventually(
        lambda: world.health("gpu-0") == (
            "Unknown", "fake: no answer for 0.6 s: OSError: kernel log went away"),
        5, "every device Unknown once the source is silent for its timeout",
    )  # fmt: skip
    state = world.attached.drivers[NV].health.sources["fake"]
    assert state.failures >= 1
    world.fake.error = None
    await eventually(lambda: world.health("gpu-0") == ("Healthy", ""), 5, "answers again")
    text = generate_latest(world.registry).decode()
    assert (
        'drahealth_node_attached_poll_failures_total{driver="gpu.nvidia.com",node="node-1",source="fake"}'
        in text
    )
    assert 'drahealth_node_attached_devices{driver="gpu.nvidia.com",node="node-1"} 3.0' in text
    assert (
        'drahealth_node_attached_source_up{driver="gpu.nvidia.com",node="node-1",source="fake"} 1.0'
        in text
    )


async def test_a_source_failing_from_the_start_reports_nothing_until_its_timeout(
    client: AsyncClient, tmp_path: Path
) -> None:
    await client.create(nvidia_slice())
    w = World(client, tmp_path)
    w.fake.error = w.second.error = "no kernel log"
    await w.pipeline.start()
    await w.attached.start()
    try:
        attachment = w.attached.drivers[NV]
        await eventually(lambda: w.fake.polls >= 5, 5, "the sources polled")
        assert w.all_health() == {}  # nothing answered: nothing claimed, nothing Healthy
        wakeups = attachment.wakeups
        await asyncio.sleep(0.3)  # a window to count loop turns in, not a timing assertion
        assert attachment.wakeups - wakeups <= 3, "the loop spins while nothing answers"
        got = await eventually(
            lambda: (h := w.all_health()).get("gpu-0", ("",))[0] == "Unknown" and h,
            5, "Unknown once the first source's timeout passed",
        )  # fmt: skip
        assert got["gpu-0"][1] == "fake: no answer yet for 0.6 s: OSError: no kernel log"
    finally:
        await w.attached.stop()
        await w.pipeline.stop()


async def test_a_source_at_rest_hands_over_only_changes_and_refreshes(world: World) -> None:
    world.fake.say(pci(0))
    attachment = world.attached.drivers[NV]
    await eventually(lambda: world.health("gpu-0")[0] == "Unhealthy", 5, "the fault")
    poller = next(p for p in attachment.pollers if p.running.name == "fake")
    polls, handovers = poller.polls, poller.handovers
    await eventually(lambda: poller.polls >= polls + 40, 10, "forty more polls")
    # the same answer forty times: handed over only to refresh the leases (every 0.15 s
    # here, a quarter of the 0.6 s timeout), never once per poll
    assert poller.handovers - handovers <= (poller.polls - polls) // 2
    state = attachment.health.sources["fake"]
    await eventually(lambda: state.polls >= poller.polls - 5, 5, "every poll counted")
    assert world.health("gpu-0")[0] == "Unhealthy"  # the lease never ran out meanwhile
    world.fake.say()
    await eventually(lambda: world.health("gpu-0")[0] == "Unknown", 5, "the change at once")
    await world.attached.stop()
    for p in attachment.pollers:
        await eventually(lambda p=p: not p.is_alive(), 5, f"{p.name} to end")


async def test_unmatched_and_ambiguous_keys_are_counted(world: World) -> None:
    world.fake.say(Signal("uuid", "GPU-not-here", Health.UNHEALTHY, "x"))
    state = world.attached.drivers[NV].health.sources["fake"]
    await eventually(lambda: state.unmatched >= 2, 5, "unmatched signals counted")
    assert state.reported == {("unmatched", "uuid", "gpu-not-here")}  # reported once
    assert all(h == "Healthy" for h, _ in world.all_health().values())


async def test_the_index_follows_the_slices(world: World) -> None:
    await eventually(lambda: len(world.all_health()) == 3, 5, "three GPUs")
    current = await world.client.get(ResourceSlice, f"{NODE}-{NV}")
    body = as_dict(nvidia_slice(count=4, generation=2))
    body["metadata"]["resourceVersion"] = current.metadata.resourceVersion  # type: ignore[union-attr]
    await world.client.replace(ResourceSlice.from_dict(body))
    await eventually(lambda: "gpu-3" in world.all_health(), 5, "a fourth GPU")


async def make_claimed_pod(client: AsyncClient, name: str, driver: str, device: str) -> None:
    claim = ResourceClaim.from_dict({
        "metadata": {"name": f"{name}-gpu", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
    })  # fmt: skip
    await client.create(claim)
    results = [{"request": "gpu", "driver": driver, "pool": NODE, "device": device}]
    await client.patch(
        ResourceClaim.Status, f"{name}-gpu",
        {"status": {"allocation": {"devices": {"results": results}}}},
        namespace="default", patch_type=PatchType.MERGE,
    )  # fmt: skip
    await client.create(Pod.from_dict({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
            "containers": [
                {"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }))  # fmt: skip


#: What a kubelet wrote: phase, its conditions, container statuses with device health.
KUBELET_STATUS = {
    "phase": "Running",
    "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-01T00:00:00Z"},
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-01T00:00:01Z"},
        {"type": "ContainersReady", "status": "True",
         "lastTransitionTime": "2026-11-01T00:00:01Z"},
    ],
    "containerStatuses": [{
        "name": "main", "image": "x", "imageID": "", "ready": True, "restartCount": 0,
        "started": True, "state": {"running": {"startedAt": "2026-11-01T00:00:01Z"}},
        "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [
            {"resourceID": "kubelet-wrote-this", "health": "Healthy"}]}],
    }],
}  # fmt: skip


async def pod_status(client: AsyncClient, name: str) -> dict[str, Any]:
    return dict(as_dict(await client.get(Pod, name, namespace="default"))["status"])


def ours(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c["type"] == POD_CONDITION_TYPE), None)


def without_ours(status: dict[str, Any]) -> dict[str, Any]:
    out = dict(status)
    out["conditions"] = [c for c in status.get("conditions", []) if c["type"] != POD_CONDITION_TYPE]
    return out


async def test_pods_get_a_condition_and_events_and_the_kubelets_fields_stay(
    world: World,
) -> None:
    client = world.client
    await make_claimed_pod(client, "trainer", NV, "gpu-1")
    await make_claimed_pod(client, "other", OTHER, "gpu-0")
    await patch_status(client, Pod, "trainer", {"status": KUBELET_STATUS}, namespace="default")
    kubelet = without_ours(await pod_status(client, "trainer"))

    async def condition(pod: str, status: str) -> dict[str, Any] | None:
        found = ours(await pod_status(client, pod))
        return found if found is not None and found["status"] == status else None

    healthy = await eventually(lambda: condition("trainer", "True"), 5, "condition True")
    assert healthy["reason"] == "AllDevicesHealthy" and healthy["message"] == "1 device healthy"

    world.fake.say(pci(1))
    bad = await eventually(lambda: condition("trainer", "False"), 5, "condition False")
    assert bad["reason"] == "DevicesUnhealthy"
    assert bad["message"] == "1 of 1 device unhealthy: gpu.nvidia.com/node-1/gpu-1 (fake: XID 79)"
    # nothing the kubelet wrote changed: not a field, not a condition, not device health
    assert without_ours(await pod_status(client, "trainer")) == kubelet

    async def events() -> list[tuple[str, str, str]]:
        return sorted([
            (e.involvedObject.name or "", e.reason or "", e.message or "")
            async for e in client.list(Event, namespace="default")
        ])  # fmt: skip

    got = await eventually(
        lambda: _with(events(), "DeviceUnhealthy"), 5, "a DeviceUnhealthy Event on the pod"
    )
    assert ("trainer", "DeviceUnhealthy",
            "device gpu.nvidia.com/node-1/gpu-1 is Unhealthy: fake: XID 79") in got  # fmt: skip
    assert all(name != "other" for name, _, _ in got)  # the other driver's pod: nothing
    assert ours(await pod_status(client, "other")) is None

    # a writer that drops the condition (a status replace): it is put back
    stripped = without_ours(await pod_status(client, "trainer"))
    await patch_status(client, Pod, "trainer", [
        {"op": "replace", "path": "/status/conditions", "value": stripped["conditions"]}
    ], namespace="default", patch_type=PatchType.JSON)  # fmt: skip
    await eventually(lambda: condition("trainer", "False"), 5, "the condition back")

    world.fake.say()
    world.fake.say(Signal("pciBusID", GPUS[1].pci_bus_id, Health.HEALTHY, ""))
    again = await eventually(lambda: condition("trainer", "True"), 5, "condition True again")
    assert again["lastTransitionTime"] >= bad["lastTransitionTime"]
    assert without_ours(await pod_status(client, "trainer")) == kubelet
    assert world.attached.pods is not None and world.attached.pods.patch_failures == 0


async def _with(events: Any, reason: str) -> list[tuple[str, str, str]] | None:
    got: list[tuple[str, str, str]] = await events
    return got if any(r == reason for _, r, _ in got) else None


async def test_the_attach_file_needs_api_access_and_builds_at_agent_start(tmp_path: Path) -> None:
    from drahealth.node import AgentConfig, AttachConfigError, NodeAgent

    config = AgentConfig(NODE, str(tmp_path / "reg"), str(tmp_path / "state"), mode="observer")
    attach = parse_attach_config(CONFIG, "attach.yaml")
    with pytest.raises(ValueError, match="need API access"):
        NodeAgent(config, None, attach=attach)
    SOURCE_KINDS["fake"] = lambda s: json  # type: ignore[assignment,return-value]
    with pytest.raises(
        AttachConfigError, match=r"attach.yaml: drivers\[0\].sources\[0\]: the fake"
    ):
        AttachedSources(attach, None, NODE, HealthPipeline(None), None)  # type: ignore[arg-type]
