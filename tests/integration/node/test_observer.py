"""Observer mode: the agent beside a (fake) kubelet.

The PodResources map is tested on generated messages; the mode itself runs as a real
``drahealth agent --mode observer`` subprocess with the sample driver, the embedded
API server and a fake kubelet PodResources server on a unix socket.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Pod

from drahealth import api
from drahealth.core import DeviceKey, Health
from drahealth.core._records import ChangeReason, HealthChange, ReportedDevice
from drahealth.node import _observer
from drahealth.node._agent import AgentConfig
from drahealth.node._events import EventRecorder
from drahealth.node._observer import ObserverMode, PodDeviceMap, PodRef, configmap_name
from drahealth.node._pipeline import HealthPipeline
from tests._support import eventually
from tests.e2e.test_agent_e2e import AgentProcess, make_pod
from tests.integration.driver.test_sample_driver import (
    DRIVER,
    NODE,
    DriverProcess,
    base,
    inject,
    launch,
    processes,
)
from tests.integration.driver.test_sample_driver_kube import apiserver, kube, kubeconfig

__all__ = ["apiserver", "base", "kube", "kubeconfig", "launch", "processes"]

pb = api.podresources_v1


def pod(name: str, *devices: tuple[str, str, str], claim: str = "gpu", ns: str = "ml") -> Any:
    resources = [
        pb.ClaimResource(
            driver_name=d, pool_name=p, device_name=x, cdi_devices=[pb.CDIDevice(name=f"{d}/x")]
        )
        for d, p, x in devices
    ]
    dynamic = pb.DynamicResource(claim_name=claim, claim_namespace=ns, claim_resources=resources)
    container = pb.ContainerResources(name="main", dynamic_resources=[dynamic])
    return pb.PodResources(name=name, namespace=ns, containers=[container])


def listing(*pods: Any) -> Any:
    return pb.ListPodResourcesResponse(pod_resources=list(pods))


GPU0 = (DRIVER, NODE, "gpu-0")
KEY0 = DeviceKey(*GPU0)


# -- PodDeviceMap ------------------------------------------------------------------------


def test_map_lists_live_pods_and_keeps_ended_ones_as_tombstones() -> None:
    m = PodDeviceMap(max_tombstones=2)
    m.replace(listing(pod("a", GPU0), pod("b", GPU0, (DRIVER, NODE, "gpu-1"), claim="c2")))
    assert m.pods_for(KEY0) == [(PodRef("ml", "a"), "gpu", False), (PodRef("ml", "b"), "c2", False)]
    m.replace(listing(pod("b", GPU0, claim="c2")))
    assert m.pods_for(KEY0) == [(PodRef("ml", "a"), "gpu", True), (PodRef("ml", "b"), "c2", False)]
    assert m.pods_for(DeviceKey(DRIVER, NODE, "gpu-9")) == []
    # a pod that comes back is live again, not a tombstone
    m.replace(listing(pod("a", GPU0), pod("b", GPU0, claim="c2")))
    assert not m.tombstones
    # tombstones are bounded: the oldest go first
    for name in ("x", "y", "z"):
        m.replace(listing(pod(name, GPU0)))
    assert list(m.tombstones) == [PodRef("ml", "x"), PodRef("ml", "y")]


def test_map_skips_incomplete_entries() -> None:
    m = PodDeviceMap()
    m.replace(
        listing(
            pod("", GPU0),  # no pod name
            pod("half", (DRIVER, "", "gpu-0"), ("", NODE, "gpu-0"), (DRIVER, NODE, "")),
            pb.PodResources(name="bare"),  # no containers at all
        )
    )
    assert m.pods_for(KEY0) == []
    assert set(m.live) == {PodRef("ml", "half"), PodRef("default", "bare")}
    m.replace(listing())
    assert set(m.tombstones) == {PodRef("ml", "half"), PodRef("default", "bare")}


def test_map_merges_containers_and_repeated_pods() -> None:
    m = PodDeviceMap()
    two = pod("a", GPU0)
    two.containers.append(
        pb.ContainerResources(
            name="side",
            dynamic_resources=[
                pb.DynamicResource(
                    claim_name="other",
                    claim_resources=[
                        pb.ClaimResource(driver_name=DRIVER, pool_name=NODE, device_name="gpu-1")
                    ],
                )
            ],
        )
    )
    m.replace(listing(two, pod("a", (DRIVER, NODE, "gpu-2"), claim="third")))
    assert m.live == {
        PodRef("ml", "a"): {
            KEY0: "gpu",
            DeviceKey(DRIVER, NODE, "gpu-1"): "other",
            DeviceKey(DRIVER, NODE, "gpu-2"): "third",
        }
    }


def test_map_rejects_a_negative_tombstone_bound_and_allows_none() -> None:
    with pytest.raises(ValueError, match="max_tombstones must be >= 0, not -1"):
        PodDeviceMap(max_tombstones=-1)
    m = PodDeviceMap(max_tombstones=0)
    m.replace(listing(pod("a", GPU0)))
    m.replace(listing())
    assert m.pods_for(KEY0) == [] and not m.tombstones


# -- the mode, end to end --------------------------------------------------------------


class FakeKubelet(api.podresources_v1_grpc.PodResourcesListerServicer):
    """Serves ``List`` with whatever :attr:`pods` holds."""

    def __init__(self) -> None:
        self.pods: list[Any] = []
        self.calls = 0

    async def List(self, request: Any, context: Any) -> Any:
        self.calls += 1
        return listing(*self.pods)

    async def Get(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not served by the fake")

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not served by the fake")


@pytest.fixture
async def kubelet(base: str) -> AsyncIterator[tuple[FakeKubelet, str]]:
    fake = FakeKubelet()
    server = grpc.aio.server()
    api.podresources_v1_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    path = f"{base}/podres.sock"
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield fake, path
    finally:
        await server.stop(0)


async def observer(base: str, kubeconfig: str, podres: str) -> AgentProcess:
    agent = AgentProcess(base, kubeconfig)
    agent.args[agent.args.index("kubelet")] = "observer"
    agent.args += ["--podresources-socket", podres, "--podresources-interval", "0.2"]
    return await agent.start()


async def records(client: AsyncClient, key: str) -> list[dict[str, Any]]:
    try:
        cm = await client.get(ConfigMap, configmap_name(NODE), namespace="default")
    except Exception:
        return []
    return list(json.loads((cm.data or {}).get(key, "[]")))


async def test_observer_publishes_events_and_post_mortem_records(
    processes: list[DriverProcess],
    kube: AsyncClient,
    kubeconfig: str,
    base: str,
    kubelet: tuple[FakeKubelet, str],
) -> None:
    fake, podres = kubelet
    # info logs show whether anyone answered the driver's registration
    driver = DriverProcess(base, kubeconfig=kubeconfig, health_timeout=2)
    driver.args[:0] = ["--log-level", "info"]
    processes.append(driver)
    await driver.start()
    await make_pod(kube, "trainer", ["gpu-0"])  # the Pod object the Events point at
    meta = (await kube.get(Pod, "trainer", namespace="default")).metadata
    uid = meta.uid if meta is not None else None
    fake.pods = [pod("trainer", GPU0, claim="trainer-gpu", ns="default")]
    agent = await observer(base, kubeconfig, podres)
    try:
        assert (await inject(driver.state, "gpu-0", "unhealthy", "--message", "XID 79"))[0] == 0

        async def unhealthy_event() -> Any:
            return [
                e
                async for e in kube.list(Event, namespace="default")
                if e.reason == "DeviceUnhealthy" and e.involvedObject.name == "trainer"
            ]

        events = await eventually(unhealthy_event, 3.0, "a DeviceUnhealthy event")
        assert f"device {DRIVER}/{NODE}/gpu-0 is Unhealthy: XID 79" == events[0].message
        # with the UID, or `kubectl describe pod` would not show it
        assert uid and events[0].involvedObject.uid == uid
        # the agent streams health from the plugin, yet only the kubelet answers its
        # registration: the observer never calls NotifyRegistrationStatus
        assert "registered DRA plugin" not in driver.output
        assert "failed to register" not in driver.output

        async def unhealthy_record() -> list[dict[str, Any]]:
            rows = await records(kube, "default.trainer")
            return rows if rows and rows[-1]["health"] == "Unhealthy" else []

        rows = await eventually(unhealthy_record, 3.0, "the Unhealthy record")
        assert rows[-1]["health"] == "Unhealthy" and rows[-1]["message"] == "XID 79"
        assert rows[-1]["claim"] == "trainer-gpu" and rows[-1]["podEnded"] is False

        # the pod ends: the kubelet stops listing it; a later fault still lands
        fake.pods = []
        calls = fake.calls
        await eventually(lambda: _ge(fake.calls, calls + 2), 3.0, "two more List calls")
        assert (await inject(driver.state, "gpu-0", "healthy", "--message", "late"))[0] == 0

        async def late() -> bool:
            return any(
                r["message"] == "late" and r["podEnded"]
                for r in await records(kube, "default.trainer")
            )

        await eventually(late, 3.0, "the post-mortem record")

        # never the kubelet's job: allocatedResourcesStatus stays untouched
        obj = await kube.get(Pod, "trainer", namespace="default")
        assert obj.status is None or not any(
            cs.allocatedResourcesStatus for cs in obj.status.containerStatuses or []
        )
        assert obj.status is None or obj.status.phase in (None, "Pending")
    finally:
        assert await agent.stop() == 0


async def _ge(value: int, floor: int) -> bool:
    return value >= floor


async def test_observer_survives_an_unreachable_kubelet(
    kubeconfig: str, base: str, kube: AsyncClient
) -> None:
    agent = await observer(base, kubeconfig, f"{base}/no-such.sock")
    try:
        await asyncio.sleep(0.7)  # the first List and a few polls, every 0.2 s
        assert agent.proc is not None and agent.proc.returncode is None
        out = agent.output
        assert "PodResources List failed: UNAVAILABLE" in out
        assert f"(socket {base}/no-such.sock); retrying every 0.2s" in out
        assert out.count("PodResources List failed") == 1  # once, not every poll
    finally:
        assert await agent.stop() == 0


# -- post-mortem records across restarts, bounded ----------------------------------------


async def test_records_survive_a_restart_and_evicted_pods_leave_the_configmap(
    kube: AsyncClient, base: str, kubelet: tuple[FakeKubelet, str], monkeypatch: Any
) -> None:
    fake, podres = kubelet
    fake.pods = [pod("new", GPU0, ns="default")]
    name = configmap_name(NODE)
    earlier = [{"time": "2026-01-01T00:00:00Z", "health": "Unhealthy", "message": "before"}]
    older = [{"time": "2025-01-01T00:00:00Z", "health": "Unknown", "message": "old"}]
    await kube.create(
        ConfigMap(
            metadata=ObjectMeta(name=name, namespace="default"),
            data={
                "default.new": json.dumps(earlier),
                "default.old": json.dumps(older),
                "default.bad": "{not json",
            },
        )
    )
    config = AgentConfig(
        NODE, f"{base}/reg", f"{base}/agent", mode="observer",
        podresources_socket=podres, podresources_interval=60,
    )  # fmt: skip
    mode = ObserverMode(config, kube, HealthPipeline(None), EventRecorder(kube, NODE))
    await mode.start()
    assert list(mode.records) == ["default.old", "default.new"]  # oldest change first
    monkeypatch.setattr(_observer, "PODS_PER_NODE", 1)
    mode._on_changes(
        [HealthChange(KEY0, Health.UNHEALTHY, Health.HEALTHY, "fixed", ChangeReason.REPORT)]
    )
    await mode.stop()
    cm = await kube.get(ConfigMap, name, namespace="default")
    data = cm.data or {}
    assert "default.old" not in data  # evicted: its key is deleted, not left behind
    assert data["default.bad"] == "{not json"  # not ours to read; left as it was
    rows = json.loads(data["default.new"])
    assert [r["message"] for r in rows] == ["before", "fixed"]
    assert rows[-1]["podEnded"] is False and rows[-1]["claim"] == "gpu"


async def test_a_pod_that_appears_on_an_unhealthy_device_gets_its_event_once(
    kube: AsyncClient, base: str, kubelet: tuple[FakeKubelet, str]
) -> None:
    """The report reaches the observer before the pod list does (a pod that starts on a
    failed device, or whose device fails between two polls): the pod still gets its
    Event and record when it first shows up, and a restarted observer that reads the
    record back does not add it again."""
    fake, podres = kubelet
    await make_pod(kube, "late", ["gpu-0"])
    config = AgentConfig(
        NODE, f"{base}/reg", f"{base}/agent", mode="observer",
        podresources_socket=podres, podresources_interval=60,
    )  # fmt: skip
    unhealthy = [ReportedDevice(NODE, "gpu-0", Health.UNHEALTHY, "XID 48")]
    healthy_other = [ReportedDevice(NODE, "gpu-1", Health.HEALTHY, "")]

    async def run_once() -> list[dict[str, Any]]:
        pipeline = HealthPipeline(None)
        mode = ObserverMode(config, kube, pipeline, EventRecorder(kube, NODE))
        await mode.start()
        try:
            before = list(mode.records.get("default.late", []))  # read back at a restart
            pipeline.report(DRIVER, unhealthy + healthy_other)  # nobody on gpu-0 yet
            assert mode.records.get("default.late", []) == before
            fake.pods = [pod("late", GPU0, (DRIVER, NODE, "gpu-1"), ns="default")]
            await mode.refresh()
            await mode.refresh()  # still there: not an arrival any more
            return list(mode.records.get("default.late", []))
        finally:
            await mode.stop()
            fake.pods = []

    rows = await run_once()
    assert [(r["device"], r["from"], r["health"], r["message"]) for r in rows] == [
        (str(KEY0), "Unknown", "Unhealthy", "XID 48")  # gpu-1 is Healthy: nothing to say
    ]
    events = [
        e
        async for e in kube.list(Event, namespace="default")
        if e.reason == "DeviceUnhealthy" and e.involvedObject.name == "late"
    ]
    assert len(events) == 1 and events[0].message == f"device {KEY0} is Unhealthy: XID 48"
    assert events[0].involvedObject.uid
    assert len(await run_once()) == 1  # the restart read it back: no second row
    saved = await records(kube, "default.late")
    assert [r["message"] for r in saved] == ["XID 48"]
