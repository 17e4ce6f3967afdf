"""End to end: embedded API server + sample driver + node agent (kubelet mode) + a pod.

Everything but the API server runs as a real subprocess (``drahealth driver``,
``drahealth agent``, ``drahealth inject``); the test only talks to the API server
and reads pod status, as an operator would. Leases are short (2 s) to keep it fast.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from tests.integration.driver.test_sample_driver import (
    DRAHEALTH,
    DRIVER,
    ENV,
    NODE,
    DriverProcess,
    _open_log,
    base,
    exists,
    inject,
    launch,
    processes,
    read_text,
)
from tests.integration.driver.test_sample_driver_kube import apiserver, kube, kubeconfig

__all__ = ["apiserver", "base", "kube", "kubeconfig", "launch", "processes"]

pytestmark = pytest.mark.timeout(90)

LEASE = 2  # seconds, the driver's --health-timeout


class AgentProcess:
    """``drahealth agent --mode kubelet`` in a subprocess."""

    _runs = 0

    def __init__(self, base: str, kubeconfig: str, *extra: str) -> None:
        self.base = base
        self.state = f"{base}/agent"
        self.args = [
            "agent", "--mode", "kubelet", "--node-name", NODE,
            "--registry-dir", f"{base}/reg", "--state-dir", self.state,
            "--kubeconfig", kubeconfig, "--restart-grace", "3", "--probe-interval", "0.5",
            *extra,
        ]  # fmt: skip
        self.proc: asyncio.subprocess.Process | None = None
        self.out_path = ""
        self._log: Any = None

    @property
    def output(self) -> str:
        return read_text(self.out_path)

    async def start(self, timeout: float = 20.0) -> AgentProcess:  # noqa: ASYNC109
        AgentProcess._runs += 1
        self.out_path = f"{self.base}/agent-{AgentProcess._runs}.log"
        self._log = _open_log(self.out_path)
        self.proc = await asyncio.create_subprocess_exec(
            *DRAHEALTH, *self.args, stdout=self._log, stderr=asyncio.subprocess.STDOUT, env=ENV
        )
        deadline = time.monotonic() + timeout
        while not re.search(r"^ready: ", self.output, re.M):
            if self.proc.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(f"agent did not get ready:\n{self.output}")
            await asyncio.sleep(0.02)
        return self

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        rc = await asyncio.wait_for(self.proc.wait(), 15)
        if self._log is not None:
            self._log.close()
            self._log = None
        return rc


class RollingDriver(DriverProcess):
    """A driver instance with rolling-update socket names (``--pod-uid``)."""

    @property
    def registrar_socket(self) -> str:
        uid = self.args[self.args.index("--pod-uid") + 1]
        return f"{self.registry}/{self.driver}-{uid}-reg.sock"


@pytest.fixture
async def agents() -> AsyncIterator[list[AgentProcess]]:
    procs: list[AgentProcess] = []
    yield procs
    for p in procs:
        if p.proc is not None and p.proc.returncode is None:
            p.proc.kill()
            await p.proc.wait()
        if p._log is not None:
            p._log.close()


@pytest.fixture
def start_agent(base: str, kubeconfig: str, agents: list[AgentProcess]) -> Callable[..., Any]:
    async def run(*extra: str) -> AgentProcess:
        agent = AgentProcess(base, kubeconfig, *extra)
        agents.append(agent)
        return await agent.start()

    return run


async def make_pod(client: AsyncClient, name: str, devices: list[str]) -> None:
    """An allocated claim ``<name>-gpu`` on ``devices`` and a pod using it on NODE."""
    claim = ResourceClaim.from_dict(
        {
            "metadata": {"name": f"{name}-gpu", "namespace": "default"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}
            },
        }
    )
    await client.create(claim)
    results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
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


async def pod_health(client: AsyncClient, name: str) -> dict[str, tuple[str, str]]:
    """device name -> (health, message) from the pod's allocatedResourcesStatus."""
    pod = await client.get(Pod, name, namespace="default")
    out: dict[str, tuple[str, str]] = {}
    for cs in (pod.status.containerStatuses or []) if pod.status else []:
        for entry in cs.allocatedResourcesStatus or []:
            for res in entry.resources or []:
                device = res.resourceID.rsplit("-", 2)
                out["-".join(device[-2:])] = (res.health or "", res.message or "")
    return out


async def wait_health(
    client: AsyncClient,
    pod: str,
    device: str,
    health: str,
    timeout: float,  # noqa: ASYNC109
    message: str | None = None,
) -> float:
    """Poll the pod status until ``device`` shows ``health``; the seconds it took."""
    start = time.monotonic()
    last: Any = None
    while time.monotonic() - start < timeout:
        last = (await pod_health(client, pod)).get(device)
        if last is not None and last[0] == health and (message is None or last[1] == message):
            return time.monotonic() - start
        await asyncio.sleep(0.02)
    raise AssertionError(f"{pod}: {device} is {last}, not {health} after {timeout}s")


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return cast(bytes, response.read()).decode()


async def test_kubelet_mode_end_to_end(
    launch: Callable[..., Any],
    start_agent: Callable[..., Any],
    kube: AsyncClient,
    kubeconfig: str,
    base: str,
) -> None:
    driver: DriverProcess = await launch(kubeconfig=kubeconfig, health_timeout=LEASE)
    agent: AgentProcess = await start_agent("--metrics-port", "0")
    await make_pod(kube, "trainer", ["gpu-0"])

    # Healthy appears in the pod status once the claim is prepared and the pod runs.
    await wait_health(kube, "trainer", "gpu-0", "Healthy", 15)
    pod = await kube.get(Pod, "trainer", namespace="default")
    assert pod.status is not None and pod.status.phase == "Running"
    entry = pod.status.containerStatuses[0].allocatedResourcesStatus[0]  # type: ignore[index]
    assert entry.name == "claim:gpu"
    assert entry.resources[0].resourceID.startswith(f"k8s.{DRIVER}/claim=")

    # An injected fault shows Unhealthy with its message within 1 s.
    t0 = time.monotonic()
    rc, out, _ = await inject(driver.state, "gpu-0", "unhealthy", "--message", "XID 79")
    assert rc == 0, out
    took = await wait_health(kube, "trainer", "gpu-0", "Unhealthy", 1.0, message="XID 79")
    total = time.monotonic() - t0
    print(f"fault -> pod status: {took * 1000:.0f} ms ({total * 1000:.0f} ms with the inject CLI)")

    # So does the node's device-health record (every device, not only those in pods).
    for _ in range(50):
        cm = await kube.get(ConfigMap, f"drahealth-devices-{NODE}", namespace="default")
        rows = {r["device"]: r for r in json.loads((cm.data or {})["devices"])}
        if rows["gpu-0"]["health"] == "Unhealthy":
            break
        await asyncio.sleep(0.02)
    assert len(rows) == 8 and rows["gpu-0"]["health"] == "Unhealthy"
    assert rows["gpu-0"]["message"] == "XID 79" and rows["gpu-1"]["health"] == "Healthy"

    # The metrics say the same.
    match = re.search(r"^metrics: (\S+)", agent.output, re.M)
    assert match, agent.output
    text = await asyncio.to_thread(fetch, match.group(1))
    labels = f'device="gpu-0",driver="{DRIVER}",node="{NODE}",pool="{NODE}"'
    assert f"drahealth_node_device_health{{{labels}}} -1.0" in text
    assert re.search(
        r'drahealth_node_health_transitions_total\{[^}]*to="Unhealthy"[^}]*\} 1\.0', text
    )
    assert re.search(
        r'drahealth_node_notification_latency_seconds_count\{node="node-1"\} [1-9]', text
    )
    assert 'drahealth_node_prepared_claims{node="node-1"} 1.0' in text

    # Recovery, then a silenced driver: Unknown within lease + 1 s.
    assert (await inject(driver.state, "gpu-0", "healthy"))[0] == 0
    await wait_health(kube, "trainer", "gpu-0", "Healthy", 2)
    assert (await inject(driver.state, "*", "silence"))[0] == 0
    took = await wait_health(kube, "trainer", "gpu-0", "Unknown", LEASE + 1.0)
    print(f"silence -> Unknown: {took * 1000:.0f} ms (lease {LEASE} s)")
    assert (await inject(driver.state, "*", "resume"))[0] == 0
    await wait_health(kube, "trainer", "gpu-0", "Healthy", 2)

    # An acknowledged change survives SIGKILL of the agent; a restart does not flash
    # the stable device to Unknown and does not lose the change.
    assert (await inject(driver.state, "gpu-0", "unhealthy", "--message", "ECC"))[0] == 0
    await wait_health(kube, "trainer", "gpu-0", "Unhealthy", 1.0, message="ECC")
    await agent.stop(signal.SIGKILL)
    assert "ECC" in read_text(f"{agent.state}/health.log")
    agent = await start_agent()
    for _ in range(20):  # 1 s of observations right after the restart
        assert (await pod_health(kube, "trainer"))["gpu-0"] == ("Unhealthy", "ECC")
        await asyncio.sleep(0.05)
    assert (await inject(driver.state, "gpu-0", "healthy"))[0] == 0
    await wait_health(kube, "trainer", "gpu-0", "Healthy", 2)

    # A pod that terminated still gets the health of its device (post-mortem).
    now = "2026-01-01T00:00:00Z"
    await kube.patch(
        Pod.Status,
        "trainer",
        {
            "status": {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        **pod.status.containerStatuses[0].to_dict(),  # type: ignore[index]
                        "ready": False,
                        "state": {
                            "terminated": {"exitCode": 0, "startedAt": now, "finishedAt": now}
                        },
                    }
                ],
            }
        },
        namespace="default",
        patch_type=PatchType.MERGE,
    )
    await asyncio.sleep(0.5)  # the agent unprepares the claim
    assert (await inject(driver.state, "gpu-0", "unhealthy", "--message", "late XID"))[0] == 0
    await wait_health(kube, "trainer", "gpu-0", "Unhealthy", 2, message="late XID")
    assert await agent.stop() == 0
    assert exists(f"{agent.state}/claims.json")


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in its slow step
async def test_rolling_update_never_shows_a_wrong_health(
    processes: list[DriverProcess],
    start_agent: Callable[..., Any],
    kube: AsyncClient,
    kubeconfig: str,
    base: str,
) -> None:
    async def instance(pod_uid: str, state: str) -> DriverProcess:
        p = RollingDriver(base, kubeconfig=kubeconfig, health_timeout=LEASE, pod_uid=pod_uid)
        p.args[p.args.index("--state-dir") + 1] = p.state = f"{base}/{state}"
        processes.append(p)
        return await p.start()

    old = await instance("11111111-aaaa", "s1")
    await start_agent()
    await make_pod(kube, "web", ["gpu-1"])
    await wait_health(kube, "web", "gpu-1", "Healthy", 15)

    new = await instance("22222222-bbbb", "s2")
    await asyncio.sleep(1.5)  # the agent registers the new instance
    seen: list[tuple[str, str]] = []
    stop = asyncio.Event()

    async def observe() -> None:
        while not stop.is_set():
            seen.append((await pod_health(kube, "web"))["gpu-1"])
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(observe())
    # The old instance goes bad on its way out; only the new one is authoritative.
    assert (await inject(old.state, "gpu-1", "unhealthy", "--message", "old says bad"))[0] == 0
    await asyncio.sleep(1.0)
    assert await old.stop() == 0  # its stream ends: nothing may be wiped
    await asyncio.sleep(LEASE + 1.0)
    stop.set()
    await watcher
    assert seen and all(h == ("Healthy", "") for h in seen), sorted(set(seen))
    assert new.proc is not None and new.proc.returncode is None


async def test_agent_usage_errors(base: str) -> None:
    async def run(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            *DRAHEALTH, "agent", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=ENV,
        )  # fmt: skip
        out, _ = await proc.communicate()
        return cast(int, proc.returncode), out.decode()

    rc, out = await run("--state-dir", f"{base}/a")
    assert rc == 2 and "kubelet mode needs API access: --kubeconfig or --in-cluster" in out
    rc, out = await run(
        "--state-dir", f"{base}/a", "--kubeconfig", f"{base}/k", "--feature-gates", "Bogus=true"
    )
    assert rc == 2 and "unrecognized feature gate: Bogus" in out
    rc, out = await run(
        "--state-dir", f"{base}/a", "--kubeconfig", f"{base}/missing", "--node-name", NODE
    )
    assert rc == 1 and f"{base}/missing" in out
    rc, out = await run("--mode", "sideways", "--state-dir", f"{base}/a")
    assert rc == 2 and "sideways" in out
