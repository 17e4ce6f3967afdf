"""Claim-level device health end to end on the embedded plane.

A driver built with the toolkit prepares a claim over its real DRA socket; its
:class:`ClaimStatusWriter` writes the device's ``DeviceHealthy`` condition into the
claim's ``status.devices`` (what ``kubectl describe resourceclaim`` shows); the
remediation controller, with no node agent and no pod health, taints the device from
that condition alone. On a server without ``status.devices`` the writer says so once
and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceClaim
from lightkube.types import PatchType

from drahealth import api
from drahealth.controlplane import APIServer
from drahealth.core import Health, kube_profile
from drahealth.driver import (
    ClaimStatusOptions,
    ClaimStatusWriter,
    DeviceReport,
    HealthHub,
    PluginOptions,
    PreparedDevice,
    PrepareResult,
    start,
)
from drahealth.driver._types import ClaimRef, PreparedClaimRequest
from drahealth.kube import embedded_kubeconfig, make_client
from drahealth.remedy._controller import RemediationController
from drahealth.remedy._policy_load import parse_policy
from tests._support import eventually

pytestmark = pytest.mark.timeout(60)

DRIVER, NODE, SOURCE = "gpu.example.com", "node-1", "sim"
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))
FAST = ClaimStatusOptions(min_interval=0.05, resync_seconds=0.1, retry_seconds=0.1)
POLICY = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
rules:
- name: unhealthy
  match: {driver: gpu.example.com}
  action: {effect: NoSchedule}
  recovery: {healthyFor: 1s}
"""


class TinyDriver:
    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        return {
            c.uid: PrepareResult.ok(
                [PreparedDevice([r.request], r.pool, r.device) for r in c.results]
            )
            for c in claims
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        return {c.uid: None for c in claims}


@pytest.fixture
def base() -> Iterator[str]:
    d = tempfile.mkdtemp(dir="/tmp", prefix="dhcs-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@asynccontextmanager
async def cluster(**gates: bool) -> AsyncIterator[tuple[APIServer, AsyncClient]]:
    server = APIServer(profile=kube_profile("1.37" if not gates else "1.36", gates))
    await server.start(host="127.0.0.1", port=0)
    client = make_client(server_url=server.url, timeout=5.0)
    try:
        yield server, client
    finally:
        await client.close()
        await server.stop()


async def allocated_claim(client: AsyncClient, name: str) -> str:
    body = {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
    }
    created = await client.create(ResourceClaim.from_dict(body))
    assert created.metadata is not None and created.metadata.uid
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"},
        {"request": "gpu", "driver": "nic.example.com", "pool": "p", "device": "eth0"},
    ]
    allocation = {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [term]}}
    await client.patch(
        ResourceClaim.Status, name, {"status": {"allocation": allocation}},
        namespace="default", patch_type=PatchType.MERGE,
    )  # fmt: skip
    return str(created.metadata.uid)


async def running_pod(client: AsyncClient, name: str, claim: str) -> None:
    pod = {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }
    await client.create(Pod.from_dict(pod))
    await client.patch(
        Pod.Status, name, {"status": {"phase": "Running"}}, namespace="default",
        patch_type=PatchType.MERGE,
    )  # fmt: skip


@asynccontextmanager
async def toolkit_driver(
    base: str, client: AsyncClient, refs: list[tuple[str, str, str]]
) -> AsyncIterator[tuple[HealthHub, ClaimStatusWriter]]:
    """The toolkit plugin with a hub and the writer; ``refs`` prepared over the socket."""
    hub = HealthHub([(NODE, "gpu-0"), (NODE, "gpu-1")])
    hub.submit(SOURCE, [DeviceReport(NODE, d, Health.HEALTHY) for d in ("gpu-0", "gpu-1")])
    options = PluginOptions(
        DRIVER, registry_dir=f"{base}/reg", plugins_dir=f"{base}/plugins", cdi_dir=None,
        kube_client=client,
    )  # fmt: skip
    handle = await start(TinyDriver(), options, health=hub)
    writer = ClaimStatusWriter(hub, client, DRIVER, handle.preparer.prepared_claims, FAST)
    try:
        async with grpc.aio.insecure_channel(f"unix://{handle.endpoint}") as ch:
            resp = await api.dra_v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                api.dra_v1.NodePrepareResourcesRequest(
                    claims=[api.dra_v1.Claim(namespace=ns, name=n, uid=u) for ns, n, u in refs]
                )
            )
            assert all(not c.error for c in resp.claims.values()), resp
        await writer.start()
        yield hub, writer
    finally:
        await writer.stop()
        await handle.stop(0)


async def entries(client: AsyncClient, name: str) -> list[dict[str, Any]]:
    claim = await client.get(ResourceClaim, name, namespace="default")
    return list((claim.to_dict().get("status") or {}).get("devices") or [])


def condition(devices: list[dict[str, Any]], device: str) -> dict[str, Any]:
    for e in devices:
        if e["device"] == device:
            return next(c for c in e.get("conditions") or [] if c["type"] == "DeviceHealthy")
    return {}


def describe(server: APIServer, tmp: str, name: str) -> str:
    assert KUBECTL is not None
    cfg = Path(tmp) / "kubeconfig"
    cfg.write_text(json.dumps(embedded_kubeconfig(server.url)))
    out = subprocess.run(
        [KUBECTL, "--kubeconfig", str(cfg), "describe", "resourceclaim", name, "-n", "default"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return out.stdout


async def test_unhealthy_device_shows_in_the_claim_and_the_controller_taints_from_it(
    base: str,
) -> None:
    async with cluster() as (server, client):
        uid = await allocated_claim(client, "train-gpu")
        await running_pod(client, "train", "train-gpu")
        # another driver's entry (and, below, a data field of ours) survive our writes
        ready = {"type": "Ready", "status": "True", "reason": "Attached", "message": "",
                 "lastTransitionTime": "2026-11-24T10:00:00Z"}  # fmt: skip
        foreign = {"driver": "nic.example.com", "pool": "p", "device": "eth0",
                   "conditions": [ready], "networkData": {"interfaceName": "net1"}}  # fmt: skip
        await client.patch(
            ResourceClaim.Status, "train-gpu", {"status": {"devices": [foreign]}},
            namespace="default", patch_type=PatchType.MERGE, field_manager="nic.example.com",
        )  # fmt: skip
        async with toolkit_driver(base, client, [("default", "train-gpu", uid)]) as (hub, writer):
            first = await eventually(
                lambda: _cond(client, "gpu-0", "True"), 5.0, "the DeviceHealthy=True condition"
            )
            assert first["reason"] == "Healthy"
            # ResourceClaims carry no metadata.generation (as upstream): nothing observed
            assert first.get("observedGeneration", 0) == 0
            # the driver's data next to our condition stays as it is
            devices = await entries(client, "train-gpu")
            assert devices[0] == foreign and devices[1]["device"] == "gpu-0"
            devices[1]["data"] = {"uuid": "GPU-0"}
            await client.patch(
                ResourceClaim.Status, "train-gpu", {"status": {"devices": devices}},
                namespace="default", patch_type=PatchType.MERGE,
            )  # fmt: skip
            hub.submit(SOURCE, [DeviceReport(NODE, "gpu-0", Health.UNHEALTHY, "XID 79", True)])
            bad = await eventually(
                lambda: _cond(client, "gpu-0", "False"), 5.0, "the DeviceHealthy=False condition"
            )
            assert (bad["reason"], bad["message"]) == ("Unhealthy", "XID 79")
            devices = await entries(client, "train-gpu")
            assert devices[0] == foreign and devices[1]["data"] == {"uuid": "GPU-0"}
            assert [e["device"] for e in devices] == ["eth0", "gpu-0"]  # not gpu-1: not ours
            if KUBECTL is not None:
                text = await asyncio.to_thread(describe, server, base, "train-gpu")
                assert "DeviceHealthy" in text and "XID 79" in text, text

            # the controller acts on the claim condition alone: no agent record, no pod health
            controller = RemediationController(client, parse_policy(POLICY, "p"), identity="c1")
            task = asyncio.create_task(controller.run())
            try:

                async def tainted() -> Any:
                    rules = [r async for r in client.list(DeviceTaintRule)]
                    return [
                        r for r in rules
                        if r.spec is not None and r.spec.deviceSelector is not None
                        and r.spec.deviceSelector.device == "gpu-0"
                    ]  # fmt: skip

                rules = await eventually(tainted, 10.0, "a DeviceTaintRule for gpu-0")
                assert len(rules) == 1 and rules[0].spec.taint.effect == "NoSchedule"
                obs = controller.model.observation(_key("gpu-0"))
                assert obs is not None and obs.source == "claim default/train-gpu"
                assert not [cm async for cm in _records(client)], (
                    "no node agent record may exist in this test"
                )
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert writer.writes >= 2 and writer.served is True


async def test_a_server_that_drops_status_devices_stops_the_writer_once(
    base: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="drahealth.driver._claim_status")
    async with cluster(DRAResourceClaimDeviceStatus=False) as (_server, client):
        uid = await allocated_claim(client, "c")
        async with toolkit_driver(base, client, [("default", "c", uid)]) as (hub, writer):
            await eventually(lambda: writer.served is False, 5.0, "the writer to notice")
            hub.submit(SOURCE, [DeviceReport(NODE, "gpu-0", Health.UNHEALTHY, "XID 79", True)])
            await asyncio.sleep(0)  # a change after the stop triggers nothing
            assert await entries(client, "c") == []
            assert writer.writes == 1
    lines = [r.getMessage() for r in caplog.records if "status.devices" in r.getMessage()]
    assert len(lines) == 1 and "DRAResourceClaimDeviceStatus" in lines[0]


def _key(device: str) -> Any:
    from drahealth.core import DeviceKey

    return DeviceKey(DRIVER, NODE, device)


async def _cond(client: AsyncClient, device: str, status: str) -> dict[str, Any] | None:
    c = condition(await entries(client, "train-gpu"), device)
    return c if c.get("status") == status else None


async def _records(client: AsyncClient) -> AsyncIterator[Any]:
    from lightkube.resources.core_v1 import ConfigMap

    async for cm in client.list(ConfigMap, namespace="default"):
        if cm.metadata is not None and str(cm.metadata.name).startswith("drahealth-devices-"):
            yield cm
