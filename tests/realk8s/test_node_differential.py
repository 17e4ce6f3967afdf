"""Differential node health: one scripted fault sequence, played at the same time on the
REAL kubelet (``scripts/realk8s node-up``) and on drahealth's agent in kubelet mode, each
with its own instance of the same driver (the sample toolkit driver) and the same pod.

Every step changes what the driver reports (or restarts something), then both pods'
``allocatedResourcesStatus`` are sampled every 0.2 s until the step's outcome shows on
both or its deadline passes. The suite prints the table: per step, the sequence each side
went through with the seconds each value appeared at, and the verdict. A step whose
outcome differs fails the test unless :data:`IMPROVEMENTS` explains it; a difference of
timing only is reported (``faster``/``slower``), and fails where the agent is slower by
more than :data:`SLOWER_OK` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node

from drahealth.core import truncate_message
from tests.e2e.test_agent_e2e import AgentProcess
from tests.integration.driver.test_sample_driver import DriverProcess, inject
from tests.realk8s.harness import KUBELET_NODE, Cluster
from tests.realk8s.node import Kubelet, restart_kubelet
from tests.realk8s.test_kubelet import base, entry, namespace, place_pod, remove_pod

__all__ = ["base", "namespace"]

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(900)]

AGENT_NODE = "differential-agent"
DRIVER = "gpu.example.com"
#: Seconds the agent may take longer than the kubelet for the same outcome.
SLOWER_OK = 5.0
LONG = "é" * 700  # 1,400 bytes of UTF-8
#: Steps whose outcome differs on purpose: the agent's behaviour is the improvement.
IMPROVEMENTS: dict[str, str] = {}


@dataclass
class Side:
    """One node under test: the real kubelet or the agent, its driver and its pod."""

    label: str
    node: str
    registry: str
    plugins: str
    base: str
    cluster: Cluster
    restart: Callable[[], Awaitable[None]]
    driver: DriverProcess | None = None
    pod: str = ""

    def new_driver(self) -> DriverProcess:
        return DriverProcess(
            self.base, node=self.node, kubeconfig=self.cluster.kubeconfig, health_timeout=5,
            registry=self.registry, plugins=self.plugins,
        )  # fmt: skip


@dataclass
class Seen:
    """What one side's pod showed during a step: (seconds, value) at each change."""

    changes: list[tuple[float, str]] = field(default_factory=list)

    def add(self, t: float, value: str) -> None:
        if not self.changes or self.changes[-1][1] != value:
            self.changes.append((t, value))

    @property
    def last(self) -> str:
        return self.changes[-1][1] if self.changes else "-"

    def first_at(self, value: str) -> float | None:
        return next((t for t, v in self.changes if v == value), None)

    def text(self) -> str:
        return " -> ".join(f"{v} @{t:.1f}s" for t, v in self.changes) or "-"


def shown(e: dict[str, Any] | None) -> str:
    """An entry as the table shows it: health, and the message (cut) when there is one."""
    if not e:
        return "none"
    res = (e.get("resources") or [{}])[0]
    message = res.get("message")
    if message and len(message) > 24:
        message = f"{message[:12]}...({len(message.encode())} bytes)"
    return f"{res.get('health')}" + (f" '{message}'" if message else "")


@dataclass
class Step:
    label: str
    act: Callable[[Side], Awaitable[None]]
    done: str  # the value (as :func:`shown` writes it) that ends the step
    within: float


async def _inject(side: Side, *args: str) -> None:
    assert side.driver is not None
    rc, out, _ = await inject(side.driver.state, *args)
    assert rc == 0, out


async def _restart_driver(side: Side) -> None:
    assert side.driver is not None
    await side.driver.stop()
    side.driver = side.new_driver()
    await side.driver.start(timeout=30)


async def _remove_driver(side: Side) -> None:
    assert side.driver is not None
    await side.driver.stop()


async def _nothing(side: Side) -> None:
    return None


STEPS = [
    Step("start", _nothing, "Healthy", 90),
    Step("unhealthy with a message", lambda s: _inject(s, "gpu-0", "unhealthy", "--message",
                                                       "XID 79"), "Unhealthy 'XID 79'", 60),
    Step("explicit recovery", lambda s: _inject(s, "gpu-0", "healthy"), "Healthy", 60),
    Step("a 1,400-byte message", lambda s: _inject(s, "gpu-0", "unhealthy", "--message", LONG),
         shown({"resources": [{"health": "Unhealthy", "message": truncate_message(LONG)}]}), 60),
    Step("recovery", lambda s: _inject(s, "gpu-0", "healthy"), "Healthy", 60),
    Step("driver silent past its 5 s timeout", lambda s: _inject(s, "*", "silence"), "Unknown",
         150),
    Step("driver speaks again", lambda s: _inject(s, "*", "resume"), "Healthy", 90),
    Step("driver restarted", _restart_driver, "Healthy", 60),
    Step("kubelet / agent restarted", lambda s: s.restart(), "Healthy", 120),
    Step("unhealthy after the restarts", lambda s: _inject(s, "gpu-0", "unhealthy",
                                                          "--message", "after"),
         "Unhealthy 'after'", 60),
    Step("driver removed", _remove_driver, "Unknown", 150),
]  # fmt: skip


async def play(step: Step, sides: list[Side], client: AsyncClient) -> dict[str, Seen]:
    """Run ``step`` on every side at once; sample until it ended on all or timed out."""
    seen = {s.label: Seen() for s in sides}
    t0 = time.monotonic()
    await asyncio.gather(*(step.act(s) for s in sides))
    while time.monotonic() - t0 < step.within:
        for s in sides:
            seen[s.label].add(time.monotonic() - t0, shown(await entry(client, s.pod)))
        if all(seen[s.label].last == step.done for s in sides):
            break
        await asyncio.sleep(0.2)
    return seen


def verdict(step: Step, kubelet: Seen, agent: Seen) -> tuple[str, bool]:
    """The table's verdict and whether it is acceptable."""
    if kubelet.last != agent.last or kubelet.last != step.done:
        why = IMPROVEMENTS.get(step.label)
        return (f"differs: {why}", True) if why else ("DIFFERS", False)
    tk, ta = kubelet.first_at(step.done), agent.first_at(step.done)
    assert tk is not None and ta is not None
    if ta + 1.0 < tk:
        return f"same; agent {tk - ta:.0f} s sooner", True
    if ta > tk + 1.0:
        return f"same; agent {ta - tk:.1f} s later", ta - tk <= SLOWER_OK
    return "same", True


async def clean_up(side: Side, client: AsyncClient) -> None:
    """Delete the side's pod with its driver running (so the claim is unprepared, not
    left to a later test), then stop the driver."""
    with contextlib.suppress(Exception):
        proc = side.driver.proc if side.driver is not None else None
        if proc is None or proc.returncode is not None:
            side.driver = side.new_driver()
            await side.driver.start(timeout=30)
        if side.pod:
            await remove_pod(client, side.pod)
    if side.driver is not None:
        if side.driver.proc is not None and side.driver.proc.returncode is None:
            await side.driver.stop()
        side.driver.close()


@contextlib.asynccontextmanager
async def agent_side(base: str, cluster: Cluster) -> AsyncIterator[Side]:
    agent = AgentProcess(base, cluster.kubeconfig, "--node-name", AGENT_NODE)
    await agent.start(timeout=30)

    async def restart() -> None:
        await agent.stop()
        await agent.start(timeout=30)

    side = Side(
        "agent", AGENT_NODE, f"{base}/reg", f"{base}/plugins", f"{base}/drv", cluster, restart
    )
    try:
        yield side
    finally:
        await agent.stop()


async def test_the_same_fault_script_on_the_real_kubelet_and_on_the_agent(
    real_cluster: Cluster, real_kubelet: Kubelet, real_client: AsyncClient, namespace: str,
    base: str,
) -> None:  # fmt: skip
    async def restart_real() -> None:
        await asyncio.to_thread(restart_kubelet, real_kubelet, real_cluster)

    real = Side(
        "kubelet", KUBELET_NODE, real_kubelet.registry_dir, real_kubelet.plugins_dir,
        f"{base}/real", real_cluster, restart_real,
    )  # fmt: skip
    rows: list[tuple[str, Seen, Seen, str]] = []
    bad: list[str] = []
    async with agent_side(f"{base}/agent", real_cluster) as agent:
        sides = [real, agent]
        try:
            for side in sides:
                side.driver = side.new_driver()
                await side.driver.start(timeout=30)
                side.pod = f"diff-{side.label}-{uuid.uuid4().hex[:5]}"
                await place_pod(real_client, side.pod, "gpu-0", DRIVER, side.node)
            for step in STEPS:
                seen = await play(step, sides, real_client)
                text, ok = verdict(step, seen["kubelet"], seen["agent"])
                rows.append((step.label, seen["kubelet"], seen["agent"], text))
                if not ok:
                    bad.append(step.label)
        finally:
            print(f"\nnode differential {real_cluster.version}:")
            print("| step | real kubelet | drahealth agent (kubelet mode) | verdict |")
            print("|---|---|---|---|")
            for label, k, a, text in rows:
                print(f"| {label} | {k.text()} | {a.text()} | {text} |")
            for side in sides:
                await clean_up(side, real_client)
        with contextlib.suppress(ApiError):
            await real_client.delete(Node, AGENT_NODE)
    assert not bad, f"steps that differ without an explanation: {bad}"
