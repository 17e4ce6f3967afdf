"""The upstream kubeletplugin helper under the REAL kubelet (``scripts/realk8s node-up``).

``tests/realk8s/go/helperdriver`` is a small DRA driver written on the release's own
``k8s.io/dynamic-resource-allocation/kubeletplugin`` (built by ``scripts/realk8s build``
into the release's cache, with the ``helper_v1alpha1`` tag before 1.37): it publishes a
ResourceSlice through the helper, prepares claims (a CDI spec per claim, a checkpoint
of prepared claims in its plugin directory) and streams device health read from a JSON
file. The test runs it beside the real kubelet the way ``test_kubelet.py`` runs the
toolkit driver and follows one pod through prepare, health, the kubelet's message cut,
a silent driver and unprepare; each step's latency is printed
(``kubelet <release>: <step> <seconds>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from drahealth.node._observer import configmap_name
from tests.e2e.test_agent_e2e import AgentProcess
from tests.realk8s import test_kubelet as tk
from tests.realk8s.harness import KUBELET_NODE, Cluster, _main_fresh, bin_dir, minor_of
from tests.realk8s.node import Kubelet
from tests.realk8s.required import skip_unless_built

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(300)]

DRIVER = tk.DRIVER
NS = tk.NS
DEVICE = "gpu-3"  # the toolkit driver's tests use gpu-0 .. gpu-2
#: The kubelet's cap on a health message (v1.ResourceHealthMessageMaxLength).
MESSAGE_MAX = 1024

# the namespace (removing what a test left in it) and a scratch directory
namespace = tk.namespace
base = tk.base


def helperdriver_missing(version: str) -> str | None:
    """Why the release's helperdriver cannot run here, or None."""
    bins = bin_dir(version)
    build = f"run scripts/realk8s build --version {minor_of(version)}"
    if not (bins / "helperdriver").is_file():
        return f"helperdriver {version} not built in {bins}: {build}"
    if not _main_fresh(bins, "helperdriver"):
        return f"helperdriver {version} in {bins} is older than its sources: {build}"
    return None


@pytest.fixture
def helper_binary(real_kubelet: Kubelet) -> Path:
    skip_unless_built(helperdriver_missing(real_kubelet.version))
    return bin_dir(real_kubelet.version) / "helperdriver"


def kubelet_cut(message: str) -> str:
    """The kubelet's own cut of a long health message (``truncateHealthMessage`` in
    pkg/kubelet/cm/dra/manager.go, 1.36 and 1.37): over 1024 bytes it keeps the first
    1021 bytes and appends ``...``, slicing bytes, not characters."""
    raw = message.encode()
    if len(raw) <= MESSAGE_MAX:
        return message
    return raw[: MESSAGE_MAX - 3].decode() + "..."


class HelperDriver:
    """The helperdriver process, its health file, its checkpoint and CDI directory."""

    def __init__(
        self,
        binary: Path,
        base: str,
        cluster: Cluster,
        node: Kubelet | None = None,
        *,
        node_name: str = KUBELET_NODE,
        registry: str | None = None,
        plugins: str | None = None,
    ) -> None:
        """Under ``node`` (the real kubelet's directories), or the given ones."""
        registry = registry or (node.registry_dir if node else f"{base}/reg")
        plugins = plugins or (node.plugins_dir if node else f"{base}/plugins")
        self.registry = registry
        self.plugin_dir = Path(plugins) / DRIVER
        self.cdi = Path(base) / "cdi"
        self.health_file = Path(base) / "health.json"
        self.out_path = Path(base) / "helperdriver.log"
        self.args = [
            str(binary),
            "--driver-name", DRIVER,
            "--node-name", node_name,
            "--kubeconfig", cluster.kubeconfig,
            "--registry-dir", registry,
            "--plugins-dir", plugins,
            "--cdi-dir", str(self.cdi),
            "--health-file", str(self.health_file),
            "--health-timeout", "5",
        ]  # fmt: skip
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def output(self) -> str:
        try:
            return self.out_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    def cdi_spec(self, claim_uid: str) -> Path:
        return self.cdi / f"{DRIVER}-claim_{claim_uid}.json"

    async def start(self, within: float = 30.0) -> None:
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        with self.out_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.args, stdout=log, stderr=asyncio.subprocess.STDOUT
            )
        deadline = time.monotonic() + within
        while "ready: " not in self.output:
            if self.proc.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(f"helperdriver did not get ready:\n{self.output}")
            await asyncio.sleep(0.05)
        ready = re.search(r"^ready: (.*)$", self.output, re.M)
        assert ready is not None
        assert ready.group(1) == f"{self.registry}/{DRIVER}-reg.sock", ready.group(1)

    async def stop(self) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(10):
                return await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            return await self.proc.wait()

    def set_health(
        self, devices: dict[str, dict[str, str]], *, silent: bool = False, **more: Any
    ) -> None:
        """Replace the health file whole (the driver re-reads it every 200 ms); ``more``:
        its other fields (``omit``, ``duplicates``, ``failStream``)."""
        tmp = self.health_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"devices": devices, "silent": silent, **more}))
        os.replace(tmp, self.health_file)


@contextlib.asynccontextmanager
async def helper_driver(
    binary: Path, base: str, cluster: Cluster, node: Kubelet
) -> AsyncIterator[HelperDriver]:
    driver = HelperDriver(binary, base, cluster, node)
    try:
        await driver.start()
        yield driver
    finally:
        if driver.proc is not None and driver.proc.returncode is None:
            await driver.stop()


async def with_message(client: AsyncClient, name: str, want: str) -> dict[str, Any] | None:
    """The pod's ``claim:gpu`` entry once it is Unhealthy with message ``want``."""
    found = await tk.health_is(client, name, "Unhealthy")
    return found if found and found["resources"][0].get("message") == want else None


async def test_the_kubeletplugin_helper_prepares_and_streams_health_to_the_real_kubelet(
    real_cluster: Cluster, real_kubelet: Kubelet, real_client: AsyncClient, namespace: str,
    base: str, helper_binary: Path,
) -> None:  # fmt: skip
    name = f"helper-{uuid.uuid4().hex[:6]}"
    want = tk.expected_health_version(real_kubelet)
    t0 = time.monotonic()
    async with helper_driver(helper_binary, base, real_cluster, real_kubelet) as driver:
        await tk.until(
            lambda: tk._async(f"dra-health {want} stream opened" in driver.output), 30,
            f"the kubelet's dra-health {want} stream",
        )  # fmt: skip
        tk.say(real_kubelet, f"helper registered, {want} stream open", time.monotonic() - t0)

        async def published() -> bool:
            names = set()
            async for rs in real_client.list(ResourceSlice):
                spec = rs.to_dict()["spec"]
                if spec["driver"] == DRIVER and spec["pool"]["name"] == KUBELET_NODE:
                    names |= {d["name"] for d in spec.get("devices") or []}
            return names == {f"gpu-{i}" for i in range(4)}

        await tk.until(published, 30, "the helper's ResourceSlice")
        tk.say(real_kubelet, "ResourceSlice published", time.monotonic() - t0)

        t1 = time.monotonic()
        await tk.place_pod(real_client, name, DEVICE)
        claim = await real_client.get(ResourceClaim, name, namespace=NS)
        assert claim.metadata is not None and claim.metadata.uid is not None
        claim_uid = claim.metadata.uid
        cdi_id = f"k8s.{DRIVER}/claim={claim_uid}-{DEVICE}"

        async def running() -> bool:
            pod = await real_client.get(Pod, name, namespace=NS)
            return pod.status is not None and pod.status.phase == "Running"

        await tk.until(running, 90, "the pod Running on the real kubelet")
        tk.say(real_kubelet, "prepared and Running", time.monotonic() - t1)
        healthy = await tk.until(
            lambda: tk.health_is(real_client, name, "Healthy"), 60, "claim:gpu Healthy"
        )
        tk.say(real_kubelet, "Healthy written", time.monotonic() - t1)
        assert healthy["resources"][0]["resourceID"] == cdi_id, healthy
        assert claim_uid in await asyncio.to_thread(driver.checkpoint.read_text)
        spec = json.loads(await asyncio.to_thread(driver.cdi_spec(claim_uid).read_text))
        assert spec["kind"] == f"k8s.{DRIVER}/claim"
        assert [d["name"] for d in spec["devices"]] == [f"{claim_uid}-{DEVICE}"]

        t2 = time.monotonic()
        await asyncio.to_thread(
            driver.set_health, {DEVICE: {"health": "Unhealthy", "message": "XID 79"}}
        )
        bad = await tk.until(
            lambda: with_message(real_client, name, "XID 79"), 60, "Unhealthy, XID 79"
        )
        tk.say(real_kubelet, "Unhealthy written", time.monotonic() - t2)
        assert bad["resources"][0]["resourceID"] == cdi_id

        t3 = time.monotonic()
        long = "0123456789" * 150  # 1500 bytes, sent whole: the helper does not cut it
        cut = kubelet_cut(long)
        assert len(cut.encode()) == MESSAGE_MAX and cut == long[:1021] + "..."
        await asyncio.to_thread(
            driver.set_health, {DEVICE: {"health": "Unhealthy", "message": long}}
        )
        await tk.until(lambda: with_message(real_client, name, cut), 60, "the kubelet's cut")
        tk.say(real_kubelet, "1500-byte message cut to 1024", time.monotonic() - t3)

        t4 = time.monotonic()
        await asyncio.to_thread(driver.set_health, {}, silent=True)
        await tk.until(
            lambda: tk.health_is(real_client, name, "Unknown"), 120, "Unknown after silence"
        )
        tk.say(real_kubelet, "Unknown after a silent driver", time.monotonic() - t4)
        # the helper calls HandleError about stale reports (1.37), a recoverable error
        assert driver.proc is not None and driver.proc.returncode is None, driver.output

        t5 = time.monotonic()
        await asyncio.to_thread(driver.set_health, {})
        await tk.until(lambda: tk.health_is(real_client, name, "Healthy"), 60, "recovery")
        tk.say(real_kubelet, "Healthy again after silence", time.monotonic() - t5)

        t6 = time.monotonic()
        await tk.remove_pod(real_client, name)
        tk.say(real_kubelet, "unprepared and deleted", time.monotonic() - t6)
        assert claim_uid not in await asyncio.to_thread(driver.checkpoint.read_text)
        assert not await asyncio.to_thread(driver.cdi_spec(claim_uid).exists)
        other = {"v1": "v1alpha1", "v1alpha1": "v1"}[want]
        assert f"dra-health {other} stream opened" not in driver.output
        rc = await driver.stop()
        assert rc == 0, driver.output


async def test_the_observer_beside_the_real_kubelet_follows_the_helper_driver(
    real_cluster: Cluster, real_kubelet: Kubelet, real_client: AsyncClient, namespace: str,
    base: str, helper_binary: Path,
) -> None:  # fmt: skip
    """drahealth's agent in observer mode runs beside the real kubelet with the Go helper
    driver: it opens its own health stream to the driver, finds the pod through the
    kubelet's PodResources, writes the pod's post-mortem record and a DeviceUnhealthy
    Event, and never writes the pod's status (only the kubelet's manager owns
    ``allocatedResourcesStatus``)."""
    name = f"observed-{uuid.uuid4().hex[:6]}"
    observer = AgentProcess(
        f"{base}/observer", real_cluster.kubeconfig, "--mode", "observer",
        "--node-name", KUBELET_NODE, "--registry-dir", real_kubelet.registry_dir,
        "--podresources-socket", f"{real_kubelet.root_dir}/pod-resources/kubelet.sock",
        "--podresources-interval", "0.5",
    )  # fmt: skip
    observer.args[:0] = ["--log-level", "info"]  # the log says what it saw when this fails
    async with helper_driver(helper_binary, base, real_cluster, real_kubelet) as driver:
        await observer.start(timeout=30)
        try:
            await tk.place_pod(real_client, name, DEVICE)
            await tk.until(lambda: tk.health_is(real_client, name, "Healthy"), 90, "Healthy")
            driver.set_health({DEVICE: {"health": "Unhealthy", "message": "XID 79"}})
            await tk.until(lambda: with_message(real_client, name, "XID 79"), 60, "Unhealthy")

            async def unhealthy_event() -> bool:
                events = [e async for e in real_client.list(Event, namespace=NS)]
                return any(
                    e.involvedObject.name == name and e.reason == "DeviceUnhealthy" for e in events
                )

            try:
                await tk.until(unhealthy_event, 30, "the observer's DeviceUnhealthy Event")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nobserver log:\n{observer.output[-8000:]}") from None

            async def record() -> list[Any]:
                cm = await real_client.get(
                    ConfigMap, configmap_name(KUBELET_NODE), namespace="default"
                )
                return list(json.loads((cm.data or {}).get(f"{NS}.{name}", "[]")))

            rows = await tk.until(record, 30, "the observer's record of the pod")
            assert any("Unhealthy" in json.dumps(r) for r in rows), rows
            owners = await tk.writers(real_client, name)
            assert owners.get("containerStatuses") == ["kubelet"], owners
            driver.set_health({})
            await tk.until(lambda: tk.health_is(real_client, name, "Healthy"), 60, "Healthy")
            await tk.remove_pod(real_client, name)
        finally:
            await observer.stop()
