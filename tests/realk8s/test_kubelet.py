"""The driver toolkit under the REAL kubelet (``scripts/realk8s node-up``).

A toolkit driver (the sample driver, ``drahealth driver``) registers in the real kubelet's
plugin registry, is asked by it to prepare a pod's claim, streams device health, and the
real kubelet writes ``allocatedResourcesStatus`` for the pod. The pod is placed the way
upstream's node e2e tests place it, with no scheduler decision in between: ``nodeName``
set, the claim's ``status.allocation`` and ``reservedFor`` written by the test. The
container runtime is upstream's in-memory fake, so the pod reaches Running without a
process; the kubelet's DRA manager, plugin manager, health cache and status code are the
release's own.

Each step's latency is printed (``kubelet <release>: <step> <seconds>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Event, Namespace, Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from drahealth.core import truncate_message
from drahealth.driver._types import CHECKPOINT_NAME
from tests.e2e.test_agent_e2e import AgentProcess
from tests.integration.driver.test_sample_driver import DriverProcess, inject
from tests.realk8s.harness import KUBELET_NODE, Cluster, minor_of
from tests.realk8s.node import Kubelet
from tests.realk8s.test_story import base, until

__all__ = ["base", "until"]  # the scratch directory and the wait, shared with the story

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(300)]

DRIVER = "gpu.example.com"
NS = "kubelet-health"


def say(node: Kubelet, step: str, seconds: float) -> None:
    print(f"\nkubelet {node.version}: {step} {seconds:.2f} s")


@contextlib.asynccontextmanager
async def toolkit_driver(
    base: str, cluster: Cluster, node: Kubelet, *args: str
) -> AsyncIterator[DriverProcess]:
    """The sample driver registered with the real kubelet (its registry and plugin
    directories), publishing its ResourceSlice with the admin kubeconfig."""
    driver = DriverProcess(
        base, *args, node=KUBELET_NODE, kubeconfig=cluster.kubeconfig, health_timeout=5,
        registry=node.registry_dir, plugins=node.plugins_dir, log_level="info",
    )  # fmt: skip
    try:
        await driver.start(timeout=30)
        yield driver
    finally:
        if driver.proc is not None and driver.proc.returncode is None:
            await driver.stop()
        driver.close()


async def place_pod(
    client: AsyncClient, name: str, device: str, driver: str = DRIVER, node: str = KUBELET_NODE
) -> None:
    """A claim allocated to ``driver``'s ``device`` and a pod on the real kubelet's node
    using it, reserved for the pod, as node e2e tests do it."""
    await client.create(
        ResourceClaim.from_dict(
            {
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": driver}}]
                    }
                },
            }
        )
    )
    pod = await client.create(
        Pod.from_dict(
            {
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "nodeName": node,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.example/app:1.0",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                    "terminationGracePeriodSeconds": 1,
                },
            }
        )
    )
    assert pod.metadata is not None
    results = [{"request": "gpu", "driver": driver, "pool": node, "device": device}]
    await client.patch(
        ResourceClaim.Status,
        name,
        {
            "status": {
                "allocation": {"devices": {"results": results}},
                "reservedFor": [{"resource": "pods", "name": name, "uid": pod.metadata.uid}],
            }
        },
        namespace=NS,
        patch_type=PatchType.MERGE,
    )
    # the kubelet tried the pod before the claim was reserved for it (or before the
    # driver's registration reached it) and now waits for its next resync, a minute
    # away; a change of the pod makes it try again at once, so one is made every 2 s
    # until the pod runs
    t0 = time.monotonic()
    for nudge in range(45):
        await client.patch(
            Pod, name, {"metadata": {"annotations": {"drahealth.test/nudge": str(nudge)}}},
            namespace=NS, patch_type=PatchType.MERGE,
        )  # fmt: skip
        for _ in range(20):
            found = await client.get(Pod, name, namespace=NS)
            if found.status is not None and found.status.phase == "Running":
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"pod {name} not Running after {time.monotonic() - t0:.0f} s")


async def remove_pod(client: AsyncClient, name: str) -> None:
    """Delete the pod gracefully and wait until the kubelet confirmed it (after it
    unprepared the claim), so the driver is still there to be asked."""
    await client.delete(Pod, name, namespace=NS, grace_period=1)

    async def gone() -> bool:
        try:
            await client.get(Pod, name, namespace=NS)
        except ApiError as exc:
            return exc.status.code == 404
        return False

    await until(gone, 60, f"pod {name} deleted by the kubelet")


async def entry(client: AsyncClient, name: str) -> dict[str, Any] | None:
    """The pod's ``claim:gpu`` entry of its container, as the kubelet wrote it."""
    pod = (await client.get(Pod, name, namespace=NS)).to_dict()
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        for e in cs.get("allocatedResourcesStatus") or []:
            if e.get("name") == "claim:gpu":
                return dict(e)
    return None


async def health_is(client: AsyncClient, name: str, want: str) -> dict[str, Any] | None:
    found = await entry(client, name)
    resources = (found or {}).get("resources") or []
    return found if resources and all(r.get("health") == want for r in resources) else None


@pytest.fixture
async def namespace(real_client: AsyncClient) -> AsyncIterator[str]:
    with contextlib.suppress(ApiError):
        await real_client.create(Namespace.from_dict({"metadata": {"name": NS}}))
    try:
        yield NS
    finally:
        for pod in [p async for p in real_client.list(Pod, namespace=NS)]:
            assert pod.metadata is not None and pod.metadata.name is not None
            with contextlib.suppress(ApiError):
                await real_client.delete(Pod, pod.metadata.name, namespace=NS, grace_period=0)
        for claim in [c async for c in real_client.list(ResourceClaim, namespace=NS)]:
            assert claim.metadata is not None and claim.metadata.name is not None
            with contextlib.suppress(ApiError):
                await real_client.delete(ResourceClaim, claim.metadata.name, namespace=NS)


async def test_the_real_kubelet_prepares_and_reports_a_toolkit_drivers_health(
    real_cluster: Cluster, real_kubelet: Kubelet, real_client: AsyncClient, namespace: str,
    base: str,
) -> None:  # fmt: skip
    name = f"healthy-{uuid.uuid4().hex[:6]}"
    async with toolkit_driver(base, real_cluster, real_kubelet) as driver:
        t0 = time.monotonic()
        await place_pod(real_client, name, "gpu-0")
        claim = await real_client.get(ResourceClaim, name, namespace=NS)
        assert claim.metadata is not None and claim.metadata.uid is not None
        claim_uid = claim.metadata.uid

        async def running() -> bool:
            pod = await real_client.get(Pod, name, namespace=NS)
            return pod.status is not None and pod.status.phase == "Running"

        await until(running, 90, "the pod Running on the real kubelet")
        say(real_kubelet, "prepared and Running", time.monotonic() - t0)
        healthy = await until(
            lambda: health_is(real_client, name, "Healthy"), 60, "claim:gpu Healthy"
        )
        resource_id = healthy["resources"][0]["resourceID"]
        # the first CDI device id the driver returned for the device
        assert resource_id.startswith(f"k8s.{DRIVER}/claim="), resource_id
        say(real_kubelet, "Healthy written", time.monotonic() - t0)
        assert claim_uid in await asyncio.to_thread(prepared_claims, driver)

        t1 = time.monotonic()
        rc, out, _ = await inject(driver.state, "gpu-0", "unhealthy", "--message", "XID 79")
        assert rc == 0, out
        bad = await until(
            lambda: health_is(real_client, name, "Unhealthy"), 60, "claim:gpu Unhealthy"
        )
        say(real_kubelet, "Unhealthy written", time.monotonic() - t1)
        assert bad["resources"][0]["resourceID"] == resource_id
        assert bad["resources"][0].get("message") == "XID 79", bad

        t2 = time.monotonic()
        rc, out, _ = await inject(driver.state, "gpu-0", "healthy")
        assert rc == 0, out
        await until(lambda: health_is(real_client, name, "Healthy"), 60, "recovery")
        say(real_kubelet, "recovery written", time.monotonic() - t2)

        t3 = time.monotonic()
        rc, out, _ = await inject(driver.state, "*", "silence")
        assert rc == 0, out
        await until(lambda: health_is(real_client, name, "Unknown"), 120, "Unknown after silence")
        say(real_kubelet, "Unknown after a silent driver", time.monotonic() - t3)
        assert await asyncio.to_thread(Path(real_kubelet.health_cache).is_file)

        rc, out, _ = await inject(driver.state, "*", "resume")
        assert rc == 0, out
        t4 = time.monotonic()
        await remove_pod(real_client, name)
        say(real_kubelet, "unprepared and deleted", time.monotonic() - t4)
        assert claim_uid not in await asyncio.to_thread(prepared_claims, driver)


def prepared_claims(driver: DriverProcess) -> str:
    """The driver's checkpoint as text (it names every claim it holds prepared)."""
    return (Path(driver.state) / CHECKPOINT_NAME).read_text()


def expected_health_version(node: Kubelet) -> str:
    """The dra-health version the release's kubelet subscribes on with a driver that
    serves both: 1.37 picks the newest advertised (v1); 1.34-1.36 know only v1alpha1."""
    minor = tuple(int(x) for x in minor_of(node.version).split("."))
    return "v1" if minor >= (1, 37) else "v1alpha1"


async def test_the_kubelet_subscribes_on_its_releases_health_version(
    real_cluster: Cluster, real_kubelet: Kubelet, real_client: AsyncClient, namespace: str,
    base: str,
) -> None:  # fmt: skip
    want = expected_health_version(real_kubelet)
    other = {"v1": "v1alpha1", "v1alpha1": "v1"}[want]
    async with toolkit_driver(base, real_cluster, real_kubelet) as driver:
        await until(
            lambda: _async(f"dra-health {want} stream opened" in driver.output), 30,
            f"the kubelet's {want} stream",
        )  # fmt: skip
        await asyncio.sleep(6)  # a 1.34-1.36 kubelet retries every 5 s: none comes over v1
        assert f"dra-health {other} stream opened" not in driver.output, driver.output


async def _async(value: Any) -> Any:
    return value


async def test_a_message_over_1024_bytes_reaches_the_pod_cut(
    real_cluster: Cluster, real_kubelet: Kubelet, real_client: AsyncClient, namespace: str,
    base: str,
) -> None:  # fmt: skip
    name = f"long-{uuid.uuid4().hex[:6]}"
    long = "é" * 700  # 1400 bytes of UTF-8, two bytes a character
    async with toolkit_driver(base, real_cluster, real_kubelet) as driver:
        await place_pod(real_client, name, "gpu-1")
        await until(lambda: health_is(real_client, name, "Healthy"), 90, "claim:gpu Healthy")
        rc, out, _ = await inject(driver.state, "gpu-1", "unhealthy", "--message", long)
        assert rc == 0, out
        bad = await until(lambda: health_is(real_client, name, "Unhealthy"), 60, "Unhealthy")
        message = bad["resources"][0].get("message") or ""
        # the toolkit cuts it to 1024 bytes on whole characters before the kubelet sees it
        assert message == truncate_message(long)
        assert len(message.encode()) <= 1024 and message.endswith("...")
        await remove_pod(real_client, name)


async def test_a_restarted_plugin_registers_again_and_its_health_arrives(
    real_cluster: Cluster, real_kubelet: Kubelet, real_client: AsyncClient, namespace: str,
    base: str,
) -> None:  # fmt: skip
    """The driver stops and starts again (an upgrade, a crash), rolling-update socket
    names the second time: the kubelet registers the new instance, streams from it and
    still unprepares the claim the first instance prepared."""
    name = f"restart-{uuid.uuid4().hex[:6]}"
    async with toolkit_driver(base, real_cluster, real_kubelet) as driver:
        await place_pod(real_client, name, "gpu-2")
        await until(lambda: health_is(real_client, name, "Healthy"), 90, "claim:gpu Healthy")
    t0 = time.monotonic()
    async with toolkit_driver(
        base, real_cluster, real_kubelet, "--pod-uid", str(uuid.uuid4())
    ) as driver:
        assert driver.output.count("ready: ") == 1
        want = expected_health_version(real_kubelet)
        await until(
            lambda: _async(f"dra-health {want} stream opened" in driver.output), 30,
            "a stream to the new instance",
        )  # fmt: skip
        say(real_kubelet, "restarted plugin streaming", time.monotonic() - t0)
        rc, out, _ = await inject(driver.state, "gpu-2", "unhealthy", "--message", "after")
        assert rc == 0, out
        bad = await until(lambda: health_is(real_client, name, "Unhealthy"), 60, "Unhealthy")
        assert bad["resources"][0].get("message") == "after"
        await remove_pod(real_client, name)


async def test_an_nvidia_like_driver_under_the_real_kubelet_gets_health_from_the_observer(
    real_cluster: Cluster, real_kubelet: Kubelet, real_client: AsyncClient, namespace: str,
    base: str,
) -> None:  # fmt: skip
    """NVIDIA's profile registers no health service: the real kubelet prepares its claim
    and runs the pod but has no health to write. drahealth's agent in observer mode beside
    it attaches the kernel-log source to the driver's devices: an XID line turns the pod's
    ``drahealth.io/DeviceHealthy`` condition False with an Event, and the observer never
    writes ``allocatedResourcesStatus`` (the kubelet's field)."""
    name = f"nvidia-{uuid.uuid4().hex[:6]}"
    driver = DriverProcess(
        base, "--profile", "sim-nvidia", driver="gpu.nvidia.com", node=KUBELET_NODE,
        kubeconfig=real_cluster.kubeconfig, registry=real_kubelet.registry_dir,
        plugins=real_kubelet.plugins_dir, log_level="info",
    )  # fmt: skip
    attach = Path(base) / "attach.yaml"
    attach.write_text(
        f"driver: gpu.nvidia.com\nsources:\n  - kind: kmsg\n    path: {driver.state}/kmsg\n"
    )
    observer = AgentProcess(
        f"{base}/observer", real_cluster.kubeconfig, "--mode", "observer",
        "--node-name", KUBELET_NODE, "--registry-dir", real_kubelet.registry_dir,
        "--podresources-socket", f"{real_kubelet.root_dir}/pod-resources/kubelet.sock",
        "--podresources-interval", "0.5", "--attach", str(attach),
    )  # fmt: skip
    try:
        await driver.start(timeout=30)
        await observer.start(timeout=30)
        await place_pod(real_client, name, "gpu-0", "gpu.nvidia.com")

        async def running() -> bool:
            pod = await real_client.get(Pod, name, namespace=NS)
            return pod.status is not None and pod.status.phase == "Running"

        await until(running, 90, "the pod Running")
        healthy = await until(lambda: condition(real_client, name), 60, "DeviceHealthy")
        assert healthy["status"] == "True", healthy
        assert "dra-health" not in driver.output  # no stream: it serves no health service
        rc, out, _ = await inject(driver.state, "gpu-0", "xid", "--xid", "79")
        assert rc == 0, out

        async def unhealthy() -> dict[str, Any] | None:
            found = await condition(real_client, name)
            return found if found and found["status"] == "False" else None

        bad = await until(unhealthy, 60, "DeviceHealthy False")
        assert "XID 79" in bad["message"], bad
        # the kubelet's field is the kubelet's alone (it writes Unknown for devices it
        # has no health for once a status sync runs); the observer wrote its condition
        owners = await writers(real_client, name)
        assert owners.get("containerStatuses") == ["kubelet"], owners
        assert owners.get("drahealth.io/DeviceHealthy"), owners
        events = [
            e async for e in real_client.list(Event, namespace=NS)
            if e.involvedObject.name == name and e.reason == "DeviceUnhealthy"
        ]  # fmt: skip
        assert events, "no DeviceUnhealthy Event for the pod"
        await remove_pod(real_client, name)
    finally:
        with contextlib.suppress(Exception):
            await observer.stop()
        if driver.proc is not None and driver.proc.returncode is None:
            await driver.stop()
        driver.close()


async def writers(client: AsyncClient, name: str) -> dict[str, list[str]]:
    """Field managers of the pod's status that wrote its ``containerStatuses`` (where
    ``allocatedResourcesStatus`` lives) or the ``drahealth.io/DeviceHealthy`` condition
    (from its managedFields)."""
    pod = (await client.get(Pod, name, namespace=NS)).to_dict()
    found: dict[str, list[str]] = {}
    for m in pod["metadata"].get("managedFields") or []:
        fields = json.dumps(m.get("fieldsV1") or {})
        # containerStatuses is atomic in the server-side apply schema: a manager that
        # wrote any of it (allocatedResourcesStatus included) owns "f:containerStatuses"
        for key, mark in (
            ("containerStatuses", '"f:containerStatuses"'),
            ("drahealth.io/DeviceHealthy", "drahealth.io/DeviceHealthy"),
        ):
            if mark in fields:
                found.setdefault(key, []).append(str(m.get("manager")))
    return found


async def condition(client: AsyncClient, name: str) -> dict[str, Any] | None:
    """The pod's ``drahealth.io/DeviceHealthy`` condition, if written."""
    pod = (await client.get(Pod, name, namespace=NS)).to_dict()
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "drahealth.io/DeviceHealthy":
            return dict(c)
    return None


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_driver.py"


async def test_the_custom_driver_example_runs_under_the_real_kubelet(
    real_cluster: Cluster, real_kubelet: Kubelet, real_client: AsyncClient, namespace: str,
    base: str,
) -> None:  # fmt: skip
    """examples/custom_driver.py as its docstring says to run it on a node: its probe's
    fault file turns the card Unhealthy in the pod's status, written by the kubelet."""
    name = f"fpga-{uuid.uuid4().hex[:6]}"
    log = Path(base) / "example.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(EXAMPLE), "--base", base, "--node", KUBELET_NODE,
            "--kubeconfig", real_cluster.kubeconfig,
            "--registry-dir", real_kubelet.registry_dir, "--plugins-dir", real_kubelet.plugins_dir,
            stdout=out, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    try:
        await until(
            lambda: _async(proc.returncode is None and "ready: " in log.read_text()), 30,
            "the example ready",
        )  # fmt: skip
        await place_pod(real_client, name, "fpga-1", "fpga.example.com")
        await until(lambda: health_is(real_client, name, "Healthy"), 90, "Healthy")
        (Path(base) / "faults" / "fpga-1").touch()
        bad = await until(lambda: health_is(real_client, name, "Unhealthy"), 60, "Unhealthy")
        assert bad["resources"][0].get("message") == f"fault file {base}/faults/fpga-1"
        await remove_pod(real_client, name)
    finally:
        if proc.returncode is None:
            proc.terminate()
            async with asyncio.timeout(15):
                await proc.wait()
