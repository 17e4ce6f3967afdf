"""Kubelet-mode scenarios of the reference (section 8, 28-33) and the agent's kubelet duties.

Real subprocesses (``drahealth driver``, ``drahealth agent``, ``drahealth inject``)
against the embedded API server, like ``test_agent_e2e.py``, whose fixtures these
tests share. Upstream's end-to-end timings (30 s / 60 s / 2 min polls with 30 s leases)
map to a 2 s lease here: every bound below is "lease + 1 s" or a couple of seconds.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Event, Pod

from tests.e2e.test_agent_e2e import (
    LEASE,
    AgentProcess,
    agents,
    apiserver,
    kube,
    kubeconfig,
    make_pod,
    pod_health,
    start_agent,
    wait_health,
)
from tests.integration.driver.test_sample_driver import (
    DriverProcess,
    base,
    inject,
    launch,
    processes,
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


async def fault(driver: DriverProcess, device: str, action: str, message: str = "") -> None:
    args = [device, action] + (["--message", message] if message else [])
    rc, out, _ = await inject(driver.state, *args)
    assert rc == 0, out


async def events_of(client: AsyncClient, pod: str) -> list[Any]:
    return [
        e
        async for e in client.list(Event, namespace="default")
        if e.involvedObject.name == pod and e.involvedObject.kind == "Pod"
    ]


async def wait_event(
    client: AsyncClient,
    pod: str,
    reason: str,
    timeout: float = 5.0,  # noqa: ASYNC109
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in await events_of(client, pod):
            if event.reason == reason:
                return event
        await asyncio.sleep(0.05)
    seen = [(e.reason, e.message) for e in await events_of(client, pod)]
    raise AssertionError(f"no {reason} event on {pod} within {timeout}s; events: {seen}")


async def wait_phase(client: AsyncClient, pod: str, phase: str, timeout: float = 10.0) -> Any:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        obj = await client.get(Pod, pod, namespace="default")
        last = obj.status.phase if obj.status else None
        if last == phase:
            return obj
        await asyncio.sleep(0.05)
    raise AssertionError(f"{pod} is {last}, not {phase} after {timeout}s")


@pytest.mark.slow  # 8-11 s on 2 cores: the default run stays under 15 min
async def test_s28_s30_s31_health_follows_the_driver_across_a_restart(
    launch: Callable[..., Any],
    start_agent: Callable[..., Any],
    kube: AsyncClient,
    kubeconfig: str,
) -> None:
    """28: Healthy -> Unhealthy -> Healthy; 30: driver stopped -> Unknown within lease + 1 s,
    restarted -> Healthy; 31: after re-registration a new pod's fault still lands."""
    driver: DriverProcess = await launch(kubeconfig=kubeconfig, health_timeout=LEASE)
    await start_agent()
    await make_pod(kube, "first", ["gpu-0"])
    await wait_health(kube, "first", "gpu-0", "Healthy", 15)
    await fault(driver, "gpu-0", "unhealthy", "XID 48")
    await wait_health(kube, "first", "gpu-0", "Unhealthy", 1.0, message="XID 48")
    await fault(driver, "gpu-0", "healthy")
    await wait_health(kube, "first", "gpu-0", "Healthy", 1.0)

    assert await driver.stop() == 0
    took = await wait_health(kube, "first", "gpu-0", "Unknown", LEASE + 1.0)
    print(f"driver stopped -> Unknown: {took * 1000:.0f} ms (lease {LEASE} s)")
    await driver.start()
    await wait_health(kube, "first", "gpu-0", "Healthy", 5)

    await make_pod(kube, "second", ["gpu-1"])
    await wait_health(kube, "second", "gpu-1", "Healthy", 15)
    await fault(driver, "gpu-1", "unhealthy", "after restart")
    await wait_health(kube, "second", "gpu-1", "Unhealthy", 1.0, message="after restart")
    assert (await pod_health(kube, "first"))["gpu-0"] == ("Healthy", "")


async def test_s32_three_pods_concurrent_reports_and_deletion_unprepares(
    launch: Callable[..., Any],
    start_agent: Callable[..., Any],
    kube: AsyncClient,
    kubeconfig: str,
) -> None:
    """32: three pods on three devices, Healthy then concurrent Unhealthy reports, all
    reflected; deleting a pod unprepares its claim (the driver's CDI spec goes away)."""
    driver: DriverProcess = await launch(kubeconfig=kubeconfig, health_timeout=LEASE)
    await start_agent()
    pods = {"p0": "gpu-2", "p1": "gpu-3", "p2": "gpu-4"}
    await asyncio.gather(*(make_pod(kube, pod, [dev]) for pod, dev in pods.items()))
    await asyncio.gather(*(wait_health(kube, p, d, "Healthy", 15) for p, d in pods.items()))
    await asyncio.gather(*(fault(driver, d, "unhealthy", f"bad {d}") for d in pods.values()))
    await asyncio.gather(
        *(wait_health(kube, p, d, "Unhealthy", 2.0, message=f"bad {d}") for p, d in pods.items())
    )
    event = await wait_event(kube, "p1", "DeviceUnhealthy")
    assert "gpu-3" in event.message and "bad gpu-3" in event.message

    claim_specs = [f for f in _listdir(driver.cdi) if f.endswith(".json")]
    assert len(claim_specs) == 3, claim_specs
    await kube.delete(Pod, "p0", namespace="default")
    deadline = time.monotonic() + 5
    while len([f for f in _listdir(driver.cdi) if f.endswith(".json")]) != 2:
        assert time.monotonic() < deadline, f"claim not unprepared: {_listdir(driver.cdi)}"
        await asyncio.sleep(0.05)


def _listdir(path: str) -> list[str]:
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


@pytest.mark.slow  # 8-11 s on 2 cores: the default run stays under 15 min
async def test_s33_health_gate_off_writes_no_status(
    launch: Callable[..., Any],
    start_agent: Callable[..., Any],
    kube: AsyncClient,
    kubeconfig: str,
) -> None:
    """33: with ResourceHealthStatus off the pod runs, but allocatedResourcesStatus stays
    absent while faults are injected (upstream watches for 30 s; here 3 s, 1.5 leases)."""
    driver: DriverProcess = await launch(kubeconfig=kubeconfig, health_timeout=LEASE)
    await start_agent("--feature-gates", "ResourceHealthStatus=false")
    await make_pod(kube, "quiet", ["gpu-0"])
    await wait_phase(kube, "quiet", "Running", 15)
    await fault(driver, "gpu-0", "unhealthy", "XID 79")
    for _ in range(30):
        obj = await kube.get(Pod, "quiet", namespace="default")
        assert obj.status is not None
        for cs in obj.status.containerStatuses or []:
            assert not cs.allocatedResourcesStatus, cs.allocatedResourcesStatus
        await asyncio.sleep(0.1)


async def test_message_gate_off_keeps_entries_without_messages(
    launch: Callable[..., Any],
    start_agent: Callable[..., Any],
    kube: AsyncClient,
    kubeconfig: str,
) -> None:
    driver: DriverProcess = await launch(kubeconfig=kubeconfig, health_timeout=LEASE)
    await start_agent("--feature-gates", "ResourceHealthStatusMessage=false")
    await make_pod(kube, "terse", ["gpu-0"])
    await wait_health(kube, "terse", "gpu-0", "Healthy", 15)
    await fault(driver, "gpu-0", "unhealthy", "XID 79")
    await wait_health(kube, "terse", "gpu-0", "Unhealthy", 1.0, message="")


async def test_permanent_prepare_error_fails_the_pod_once(
    launch: Callable[..., Any],
    start_agent: Callable[..., Any],
    kube: AsyncClient,
    kubeconfig: str,
) -> None:
    """KEP-5322 design: the driver classifies the error Permanent -> the pod is Failed
    with a clear reason, one FailedPrepareDynamicResources event, no retries."""
    await launch("--error-type-field", kubeconfig=kubeconfig, broken_device="gpu-5")
    agent: AgentProcess = await start_agent()
    await make_pod(kube, "doomed", ["gpu-5"])
    obj = await wait_phase(kube, "doomed", "Failed", 15)
    assert obj.status.reason == "DRAPrepareFailedPermanently"
    assert "permanent error preparing claim doomed-gpu" in obj.status.message
    assert "gpu-5" in obj.status.message
    event = await wait_event(kube, "doomed", "FailedPrepareDynamicResources")
    assert "(permanent)" in event.message and "gpu-5" in event.message
    await asyncio.sleep(1.5)  # a retry would have happened by now
    failures = [
        e for e in await events_of(kube, "doomed") if e.reason == "FailedPrepareDynamicResources"
    ]
    assert len(failures) == 1 and (failures[0].count or 1) == 1, failures
    assert agent.proc is not None and agent.proc.returncode is None


async def test_unclassified_prepare_error_is_retried_with_backoff(
    launch: Callable[..., Any],
    start_agent: Callable[..., Any],
    kube: AsyncClient,
    kubeconfig: str,
) -> None:
    """Without the error_type field the same failure is transient: the pod stays
    Pending and prepare is retried; repeats fold into the event's count."""
    await launch(kubeconfig=kubeconfig, broken_device="gpu-5")
    await start_agent()
    await make_pod(kube, "hopeful", ["gpu-5"])
    event = await wait_event(kube, "hopeful", "FailedPrepareDynamicResources", 15)
    assert "(transient, will retry)" in event.message
    deadline = time.monotonic() + 8
    attempts = 0
    while time.monotonic() < deadline and attempts < 2:
        failures = [
            e
            for e in await events_of(kube, "hopeful")
            if e.reason == "FailedPrepareDynamicResources"
        ]
        attempts = sum(e.count or 1 for e in failures)
        await asyncio.sleep(0.1)
    assert attempts >= 2, "prepare was not retried"
    obj = await kube.get(Pod, "hopeful", namespace="default")
    assert obj.status is None or obj.status.phase in (None, "Pending")
