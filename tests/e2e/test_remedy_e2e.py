"""End to end: sample driver + node agent + two leader-elected controllers, all processes.

An injected fault reaches the pod status through the agent, the leading controller
taints the device within a second of the pod status showing it, recovery removes the
rule after the policy's window, and killing the leader hands over within the lease
duration without losing or repeating an action.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.resource_v1 import DeviceTaintRule

from tests.e2e.test_agent_e2e import (
    LEASE,
    agents,
    apiserver,
    kube,
    kubeconfig,
    make_pod,
    start_agent,
    wait_health,
)
from tests.integration.driver.test_sample_driver import (
    DRAHEALTH,
    ENV,
    DriverProcess,
    _open_log,
    base,
    inject,
    launch,
    processes,
    read_text,
)

__all__ = [
    "agents",
    "apiserver",
    "base",
    "kube",
    "kubeconfig",
    "launch",
    "processes",
    "start_agent",
]

pytestmark = pytest.mark.timeout(90)

POLICY = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
rules:
  - name: fatal
    match: {driver: gpu.example.com, message: "XID"}
    action: {effect: NoSchedule, taintValue: xid}
    recovery: {healthyFor: 1s}
"""
CONTROLLER_LEASE = 2.0


class ControllerProcess:
    def __init__(self, base: str, kubeconfig: str, identity: str) -> None:
        self.identity = identity
        self.out_path = f"{base}/controller-{identity}.log"
        self.args = [
            "controller", "--kubeconfig", kubeconfig, "--policy", f"{base}/policy.yaml",
            "--id", identity, "--lease-duration", str(CONTROLLER_LEASE),
        ]  # fmt: skip
        self.proc: asyncio.subprocess.Process | None = None
        self._log: Any = None

    @property
    def output(self) -> str:
        return read_text(self.out_path)

    async def start(self) -> ControllerProcess:
        self._log = _open_log(self.out_path)
        self.proc = await asyncio.create_subprocess_exec(
            *DRAHEALTH, "--log-level", "info", *self.args,
            stdout=self._log, stderr=asyncio.subprocess.STDOUT, env=ENV,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while "ready: " not in self.output:
            assert self.proc.returncode is None and time.monotonic() < deadline, self.output
            await asyncio.sleep(0.02)
        return self

    def leading(self) -> bool:
        return self.output.count("leading: ") > self.output.count("standby: ")

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        rc = await asyncio.wait_for(self.proc.wait(), 15)
        if self._log is not None:
            self._log.close()
        return rc


@pytest.fixture
def policy_file(base: str) -> str:
    with open(f"{base}/policy.yaml", "w") as f:
        f.write(POLICY)
    return f"{base}/policy.yaml"


@pytest.fixture
async def controllers(
    base: str, kubeconfig: str, policy_file: str
) -> AsyncIterator[Callable[..., Any]]:
    started: list[ControllerProcess] = []

    async def start(identity: str) -> ControllerProcess:
        c = ControllerProcess(base, kubeconfig, identity)
        started.append(c)
        return await c.start()

    yield start
    for c in started:
        if c.proc is not None and c.proc.returncode is None:
            c.proc.kill()
            await c.proc.wait()


async def our_rules(client: AsyncClient) -> dict[str, Any]:
    return {
        str(r.metadata.name): r
        async for r in client.list(DeviceTaintRule)
        if r.metadata is not None
        and (r.metadata.labels or {}).get("app.kubernetes.io/managed-by") == "drahealth-controller"
    }


async def wait_rules(
    client: AsyncClient, count: int, within: float
) -> tuple[dict[str, Any], float]:
    t0 = time.monotonic()
    while True:
        found = await our_rules(client)
        if len(found) == count:
            return found, time.monotonic() - t0
        assert time.monotonic() - t0 < within, f"{len(found)} rules, wanted {count}"
        await asyncio.sleep(0.02)


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in its slow step
async def test_fault_taint_recovery_and_leader_handover(
    launch: Callable[..., Any],
    start_agent: Callable[..., Any],
    controllers: Callable[..., Any],
    kube: AsyncClient,
    kubeconfig: str,
) -> None:
    driver: DriverProcess = await launch(kubeconfig=kubeconfig, health_timeout=LEASE)
    await start_agent()
    first = await controllers("ctl-a")
    second = await controllers("ctl-b")
    await make_pod(kube, "trainer", ["gpu-0"])
    await make_pod(kube, "other", ["gpu-1"])
    await wait_health(kube, "trainer", "gpu-0", "Healthy", 15)
    deadline = time.monotonic() + 10
    while not (first.leading() or second.leading()):
        assert time.monotonic() < deadline, first.output + second.output
        await asyncio.sleep(0.05)
    assert not (first.leading() and second.leading())
    leader, standby = (first, second) if first.leading() else (second, first)

    # fault -> pod status -> taint within 1 s of the pod status showing it
    assert (await inject(driver.state, "gpu-0", "unhealthy", "--message", "XID 79"))[0] == 0
    await wait_health(kube, "trainer", "gpu-0", "Unhealthy", 2.0, message="XID 79")
    rules, took = await wait_rules(kube, 1, 1.0)
    print(f"pod status Unhealthy -> DeviceTaintRule: {took * 1000:.0f} ms")
    (rule,) = rules.values()
    assert rule.spec.taint.key == "drahealth.io/unhealthy" and rule.spec.taint.value == "xid"
    assert rule.spec.deviceSelector.device == "gpu-0"

    # the leader logs the create once the API answered it; kill it only after that, or the
    # answer (and its log line) may be lost with the process while the rule already exists
    deadline = time.monotonic() + 5
    while not re.search(r"\btainted gpu.example.com/node-1/gpu-0\b", leader.output):
        assert time.monotonic() < deadline, leader.output
        await asyncio.sleep(0.02)

    # kill the leader: the standby takes over within the lease duration, keeps the rule
    # (no re-create) and acts on the next fault exactly once
    t0 = time.monotonic()
    assert await leader.stop(signal.SIGKILL) == -signal.SIGKILL
    while not standby.leading():
        assert time.monotonic() - t0 < CONTROLLER_LEASE + 1.5, standby.output
        await asyncio.sleep(0.02)
    print(f"leader killed -> standby leading: {(time.monotonic() - t0) * 1000:.0f} ms")
    assert await our_rules(kube) == rules
    assert (await inject(driver.state, "gpu-1", "unhealthy", "--message", "XID 48"))[0] == 0
    await wait_health(kube, "other", "gpu-1", "Unhealthy", 2.0, message="XID 48")
    await wait_rules(kube, 2, 2.0)

    # recovery: healthy for 1 s removes both rules, each exactly once
    for device in ("gpu-0", "gpu-1"):
        assert (await inject(driver.state, device, "healthy"))[0] == 0
    await wait_rules(kube, 0, 4.0)
    # each delete is logged once the API answered it, which may be after our watch saw it
    deadline = time.monotonic() + 5
    while not all(
        re.search(rf"\buntainted gpu.example.com/node-1/{device}\b", standby.output)
        for device in ("gpu-0", "gpu-1")
    ):
        assert time.monotonic() < deadline, standby.output
        await asyncio.sleep(0.02)
    log = leader.output + standby.output
    for device in ("gpu-0", "gpu-1"):
        assert len(re.findall(rf"\btainted gpu.example.com/node-1/{device}\b", log)) == 1, log
        assert len(re.findall(rf"\buntainted gpu.example.com/node-1/{device}\b", log)) == 1, log
    assert await standby.stop() == 0
