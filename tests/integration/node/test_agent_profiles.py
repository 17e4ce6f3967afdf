"""The kubelet-mode agent playing the kubelet of each release, in process.

A toolkit plugin (the sample driver's ``SampleDriver`` and a ``HealthHub``) registers
with a real :class:`NodeAgent` over unix sockets; pods, claims, Events and the node's
device-health ConfigMap go through the embedded API server over HTTP. The agent's
settings come from ``kubelet_settings(kube_profile(...))``, as ``drahealth agent
--kube-version`` builds them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from drahealth import api
from drahealth.controlplane import APIServer
from drahealth.core import Health, kube_profile, parse_feature_gates
from drahealth.driver import DeviceReport, HealthHub, PluginOptions, start
from drahealth.kube import make_client
from drahealth.node import AgentConfig, NodeAgent, kubelet_settings
from drahealth.simdriver import SampleDriver
from tests._support import eventually

pytestmark = pytest.mark.timeout(30)

DRIVER = "gpu.example.com"
NODE = "node-1"
DEVICES = [(NODE, f"gpu-{i}") for i in range(2)]


class Advertising:
    """A health provider that serves the hub but advertises only ``versions``."""

    def __init__(self, hub: HealthHub, versions: list[str]) -> None:
        self.hub = hub
        self.versions = versions

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        self.hub.add_to_server(server)
        return self.versions


@dataclass
class Node1:
    client: AsyncClient
    agent: NodeAgent
    hub: HealthHub


@asynccontextmanager
async def node(
    sockdir: str,
    version: str,
    gates: str = "",
    *,
    server_version: str | None = None,
    advertise: list[str] | None = None,
) -> AsyncIterator[Node1]:
    """API server (``server_version``, default the agent's), a driver and the agent."""
    server = APIServer(profile=kube_profile(server_version or version))
    await server.start(host="127.0.0.1", port=0)
    client = make_client(server_url=server.url)
    hub = HealthHub(DEVICES, default_timeout_seconds=30)
    hub.submit("sim", [DeviceReport(p, d, Health.HEALTHY) for p, d in DEVICES])
    options = PluginOptions(
        DRIVER,
        node_name=NODE,
        registry_dir=f"{sockdir}/reg",
        plugins_dir=f"{sockdir}/plugins",
        cdi_dir=None,
        state_dir=f"{sockdir}/driver",
        kube_client=client,
    )
    provider = hub if advertise is None else Advertising(hub, advertise)
    config = AgentConfig(
        node_name=NODE,
        registry_dir=f"{sockdir}/reg",
        state_dir=f"{sockdir}/agent",
        rescan_interval=0.05,
        **kubelet_settings(kube_profile(version, parse_feature_gates(gates))),
    )
    agent = NodeAgent(config, client)
    handle = None
    try:
        await client.create(Node(metadata=ObjectMeta(name=NODE)))
        handle = await start(SampleDriver(DEVICES, hub), options, health=provider)
        await agent.start()
        await eventually(lambda: agent.registry.drivers() == [DRIVER], 5, "driver registered")
        yield Node1(client, agent, hub)
    finally:
        await agent.stop()
        if handle is not None:
            await handle.stop(0)
        hub.close()
        await client.close()
        await server.stop()


async def make_pod(client: AsyncClient, name: str, device: str) -> None:
    claim = ResourceClaim.from_dict(
        {
            "metadata": {"name": f"{name}-gpu", "namespace": "default"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}
            },
        }
    )
    await client.create(claim)
    results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]
    await client.patch(
        ResourceClaim.Status,
        f"{name}-gpu",
        {"status": {"allocation": {"devices": {"results": results}}}},
        namespace="default",
        patch_type=PatchType.MERGE,
    )
    pod = Pod.from_dict(
        {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
                "containers": [
                    {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        }
    )
    await client.create(pod)

    async def running() -> bool:
        return (await pod_status(client, name)).get("phase") == "Running"

    await eventually(running, 5, f"pod {name} Running")


async def pod_status(client: AsyncClient, name: str) -> dict[str, Any]:
    status: dict[str, Any] = (await client.get(Pod, name, namespace="default")).to_dict()["status"]
    return status


def health_entries(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        r
        for cs in status.get("containerStatuses") or []
        for entry in cs.get("allocatedResourcesStatus") or []
        for r in entry.get("resources") or []
    ]


async def record(client: AsyncClient) -> dict[str, tuple[str, str]]:
    """device -> (health, message) from the node's device-health ConfigMap."""
    try:
        cm = await client.get(ConfigMap, f"drahealth-devices-{NODE}", namespace="default")
    except Exception:
        return {}
    rows = json.loads((cm.data or {}).get("devices", "[]"))
    return {r["device"]: (r["health"], r.get("message", "")) for r in rows}


def waiter(check: Callable[[], Any], what: str) -> Any:
    return eventually(check, 5, what)


@pytest.mark.parametrize("server_version", ["1.35", "1.38"])
async def test_135_kubelet_writes_no_pod_health_but_the_record_and_events_say_unhealthy(
    sockdir: str, server_version: str
) -> None:
    """On 1.38 the server would keep ``allocatedResourcesStatus``: its absence is the
    agent's doing, not the server's field dropping."""
    async with node(sockdir, "1.35", server_version=server_version) as n:
        assert n.agent.registry.active_health(DRIVER) is not None  # health still streams
        await make_pod(n.client, "p", "gpu-0")
        n.hub.submit("sim", [DeviceReport(NODE, "gpu-0", Health.UNHEALTHY, "XID 79", True)])

        async def unhealthy_record() -> bool:
            return (await record(n.client)).get("gpu-0") == ("Unhealthy", "XID 79")

        await waiter(unhealthy_record, "the node's record says Unhealthy")

        async def event() -> bool:
            events = [e async for e in n.client.list(Event, namespace="default")]
            return any(
                e.reason == "DeviceUnhealthy" and e.involvedObject.name == "p" for e in events
            )

        await waiter(event, "a DeviceUnhealthy Event on the pod")
        assert health_entries(await pod_status(n.client, "p")) == []
        assert n.agent.builder.options.health_status is False


@pytest.mark.parametrize(
    ("version", "gates", "message"),
    [("1.36", "", "XID 79"), ("1.35", "ResourceHealthStatus=true", None)],
)
async def test_pod_health_with_message_from_136_without_before(
    sockdir: str, version: str, gates: str, message: str | None
) -> None:
    """1.36: health with its message; 1.35 with the alpha gate on: health, no message."""
    async with node(sockdir, version, gates, server_version="1.38") as n:
        await make_pod(n.client, "p", "gpu-1")
        entries = health_entries(await pod_status(n.client, "p"))
        assert [e["health"] for e in entries] == ["Healthy"]
        n.hub.submit("sim", [DeviceReport(NODE, "gpu-1", Health.UNHEALTHY, "XID 79", True)])

        async def unhealthy() -> list[dict[str, Any]]:
            entries = health_entries(await pod_status(n.client, "p"))
            return [e for e in entries if e.get("health") == "Unhealthy"]

        [entry] = await waiter(unhealthy, "Unhealthy in pod status")
        assert entry.get("message") == message


@pytest.mark.parametrize(
    ("version", "advertise", "used"),
    [
        ("1.36", [api.DRA_HEALTH_V1], None),
        ("1.36", [api.DRA_HEALTH_V1ALPHA1], api.DRA_HEALTH_V1ALPHA1),
        ("1.37", [api.DRA_HEALTH_V1], api.DRA_HEALTH_V1),
        ("1.38", [api.DRA_HEALTH_V1ALPHA1], api.DRA_HEALTH_V1ALPHA1),
        ("1.38", [api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1], api.DRA_HEALTH_V1),
    ],
)
async def test_only_the_dra_health_versions_of_the_release_are_called(
    sockdir: str,
    version: str,
    advertise: list[str],
    used: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="drahealth.node._registry"):
        async with node(sockdir, version, advertise=advertise) as n:
            active = n.agent.registry.active_health(DRIVER)
            if used is None:
                assert active is None and n.hub.stream_count == 0
                [warning] = [r.getMessage() for r in caplog.records]
                assert "v1.DRAResourceHealth" in warning and "no device health" in warning
                assert await record(n.client) == {}
            else:
                assert active is not None and active[2] == used
                await waiter(lambda: n.hub.stream_count == 1, "one health stream")

                async def recorded() -> bool:
                    return (await record(n.client)).get("gpu-0") == ("Healthy", "")

                await waiter(recorded, "health recorded")
