"""Differential node health: one scripted fault sequence, played at the same time on the
REAL kubelet (``scripts/realk8s node-up``) and on drahealth's agent in kubelet mode, each
with its own instance of the same driver and the same pod; the script is played once with
the sample toolkit driver and once with the Go driver on the upstream kubeletplugin helper
(``tests/realk8s/go/helperdriver``), whose health file can also leave a device out of its
reports, name one twice in a report and end a stream with an error.

Every step changes what the driver reports (or restarts something), then both pods'
``allocatedResourcesStatus`` are sampled every 0.2 s until the step's outcome shows on
both or its deadline passes. The suite prints the table: per step, the sequence each side
went through with the seconds each value appeared at, and the verdict. A step whose
outcome differs fails the test unless :data:`IMPROVEMENTS` explains it; a difference of
timing only is reported (``agent N s sooner``/``later``), and fails where the agent is
later by more than :data:`SLOWER_OK` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node

from tests.e2e.test_agent_e2e import AgentProcess
from tests.integration.driver.test_sample_driver import DriverProcess, inject
from tests.realk8s.harness import KUBELET_NODE, Cluster, bin_dir
from tests.realk8s.node import Kubelet, restart_kubelet
from tests.realk8s.required import skip_unless_built
from tests.realk8s.test_helper_driver import HelperDriver, helperdriver_missing
from tests.realk8s.test_kubelet import base, entry, namespace, place_pod, remove_pod

__all__ = ["base", "namespace"]

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(900)]

AGENT_NODE = "differential-agent"
DRIVER = "gpu.example.com"
#: Seconds the agent may take longer than the kubelet for the same outcome.
SLOWER_OK = 5.0
LONG = "é" * 700  # 1,400 bytes of UTF-8
#: Steps whose outcome differs on purpose: the agent's behaviour is the improvement.
IMPROVEMENTS: dict[tuple[str, str], str] = {
    ("helper", "a 1,400-byte message"): (
        "the kubelet cuts a long message at 1,021 bytes and adds '...', splitting a UTF-8 "
        "character; the broken byte is sent as U+FFFD (3 bytes), the message is 1,026 "
        "bytes, and the API server refuses every status write of the pod (Too long: may "
        "not be more than 1024 bytes) until the message changes, so the pod keeps showing "
        "Healthy. The agent cuts on whole characters and writes it"
    ),
}


class Control:
    """What a step can make a side's driver do (one per driver kind)."""

    #: Faults this driver can be made to report (the others' steps are not played).
    can: frozenset[str] = frozenset()

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def health(self, device: str, health: str, message: str = "") -> None: ...
    async def silence(self, silent: bool) -> None: ...
    async def fault(self, kind: str, device: str) -> None:
        raise AssertionError(f"{type(self).__name__} cannot {kind}")

    def running(self) -> bool:
        return False


class SampleControl(Control):
    """The toolkit's sample driver (``drahealth driver``), driven by ``drahealth inject``."""

    def __init__(self, base: str, node: str, registry: str, plugins: str, cluster: Cluster):
        self.make = lambda: DriverProcess(
            base, node=node, kubeconfig=cluster.kubeconfig, health_timeout=5,
            registry=registry, plugins=plugins,
        )  # fmt: skip
        self.proc: DriverProcess | None = None

    async def start(self) -> None:
        self.proc = self.make()
        await self.proc.start(timeout=30)

    async def stop(self) -> None:
        if self.proc is not None:
            if self.running():
                await self.proc.stop()
            self.proc.close()

    def running(self) -> bool:
        return (
            self.proc is not None
            and self.proc.proc is not None
            and (self.proc.proc.returncode is None)
        )

    async def _inject(self, *args: str) -> None:
        assert self.proc is not None
        rc, out, _ = await inject(self.proc.state, *args)
        assert rc == 0, out

    async def health(self, device: str, health: str, message: str = "") -> None:
        await self._inject(device, health.lower(), *(("--message", message) if message else ()))

    async def silence(self, silent: bool) -> None:
        await self._inject("*", "silence" if silent else "resume")


class HelperControl(Control):
    """The Go driver on the upstream kubeletplugin helper, driven by its health file."""

    can = frozenset({"omit", "duplicate", "fail-stream"})

    def __init__(
        self, binary: Path, base: str, node: str, registry: str, plugins: str, cluster: Cluster
    ):
        self.make = lambda: HelperDriver(
            binary, base, cluster, node_name=node, registry=registry, plugins=plugins
        )
        self.proc: HelperDriver | None = None
        self.state: dict[str, Any] = {"devices": {}, "silent": False}

    def _write(self) -> None:
        assert self.proc is not None
        devices = self.state["devices"]
        self.proc.set_health(devices, **{k: v for k, v in self.state.items() if k != "devices"})

    async def start(self) -> None:
        self.proc = self.make()
        await self.proc.start()
        self._write()

    async def stop(self) -> None:
        if self.running():
            assert self.proc is not None
            await self.proc.stop()

    def running(self) -> bool:
        return (
            self.proc is not None
            and self.proc.proc is not None
            and (self.proc.proc.returncode is None)
        )

    async def health(self, device: str, health: str, message: str = "") -> None:
        self.state["devices"][device] = {"health": health, "message": message}
        self.state.pop("omit", None)
        self.state.pop("duplicates", None)
        self._write()

    async def silence(self, silent: bool) -> None:
        self.state["silent"] = silent
        self._write()

    async def fault(self, kind: str, device: str) -> None:
        if kind == "omit":  # the device is left out of every report from now on
            self.state["omit"] = [device]
        elif kind == "duplicate":  # one report names the device twice, Unhealthy second
            self.state["duplicates"] = {device: {"health": "Unhealthy", "message": "twice"}}
        elif kind == "fail-stream":  # the open stream ends with an error
            self.state["failStream"] = int(self.state.get("failStream", 0)) + 1
        self._write()


@dataclass
class Side:
    """One node under test: the real kubelet or the agent, its driver and its pod."""

    label: str
    node: str
    restart: Callable[[], Awaitable[None]]
    driver: Control
    pod: str = ""


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
    done: Callable[[str], bool]  # on the value as :func:`shown` writes it: the step ended
    within: float
    needs: str = ""  # a fault of :attr:`Control.can`; "" for every driver


def be(value: str) -> Callable[[str], bool]:
    return lambda shown_value: shown_value == value


def unhealthy_long(shown_value: str) -> bool:
    return shown_value.startswith("Unhealthy 'éééééééééééé...(")


async def _restart_driver(side: Side) -> None:
    await side.driver.stop()
    await side.driver.start()


async def _nothing(side: Side) -> None:
    return None


STEPS = [
    Step("start", _nothing, be("Healthy"), 90),
    Step("unhealthy with a message",
         lambda s: s.driver.health("gpu-0", "Unhealthy", "XID 79"), be("Unhealthy 'XID 79'"), 60),
    Step("explicit recovery", lambda s: s.driver.health("gpu-0", "Healthy"), be("Healthy"), 60),
    Step("a 1,400-byte message", lambda s: s.driver.health("gpu-0", "Unhealthy", LONG),
         unhealthy_long, 60),
    Step("recovery", lambda s: s.driver.health("gpu-0", "Healthy"), be("Healthy"), 60),
    Step("one report names the device twice (Healthy, then Unhealthy 'twice')",
         lambda s: s.driver.fault("duplicate", "gpu-0"), be("Unhealthy 'twice'"), 60,
         needs="duplicate"),
    Step("recovery after the duplicate", lambda s: s.driver.health("gpu-0", "Healthy"),
         be("Healthy"), 60, needs="duplicate"),
    Step("the device left out of every report", lambda s: s.driver.fault("omit", "gpu-0"),
         be("Unknown"), 150, needs="omit"),
    Step("the device reported again", lambda s: s.driver.health("gpu-0", "Healthy"),
         be("Healthy"), 120, needs="omit"),
    Step("the stream ends with an error, then Unhealthy 'after error'",
         lambda s: _fail_then(s, "after error"), be("Unhealthy 'after error'"), 60,
         needs="fail-stream"),
    Step("recovery after the stream error", lambda s: s.driver.health("gpu-0", "Healthy"),
         be("Healthy"), 60, needs="fail-stream"),
    Step("driver silent past its 5 s timeout", lambda s: s.driver.silence(True), be("Unknown"),
         150),
    Step("driver speaks again", lambda s: s.driver.silence(False), be("Healthy"), 120),
    Step("driver restarted", _restart_driver, be("Healthy"), 60),
    Step("kubelet / agent restarted", lambda s: s.restart(), be("Healthy"), 120),
    Step("unhealthy after the restarts",
         lambda s: s.driver.health("gpu-0", "Unhealthy", "after"), be("Unhealthy 'after'"), 60),
    Step("driver removed", lambda s: s.driver.stop(), be("Unknown"), 150),
]  # fmt: skip


async def _fail_then(side: Side, message: str) -> None:
    await side.driver.fault("fail-stream", "gpu-0")
    await asyncio.sleep(1.0)  # the stream ended; the kubelet opens another
    await side.driver.health("gpu-0", "Unhealthy", message)


async def play(step: Step, sides: list[Side], client: AsyncClient) -> dict[str, Seen]:
    """Run ``step`` on every side at once; sample until it ended on all or timed out."""
    seen = {s.label: Seen() for s in sides}
    t0 = time.monotonic()
    await asyncio.gather(*(step.act(s) for s in sides))
    while time.monotonic() - t0 < step.within:
        for s in sides:
            seen[s.label].add(time.monotonic() - t0, shown(await entry(client, s.pod)))
        if all(step.done(seen[s.label].last) for s in sides):
            break
        await asyncio.sleep(0.2)
    return seen


def verdict(kind: str, step: Step, kubelet: Seen, agent: Seen) -> tuple[str, bool]:
    """The table's verdict and whether it is acceptable."""
    if kubelet.last != agent.last or not step.done(kubelet.last):
        why = IMPROVEMENTS.get((kind, step.label))
        return (f"differs: {why}", True) if why else ("DIFFERS", False)
    tk, ta = kubelet.first_at(kubelet.last), agent.first_at(agent.last)
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
        if not side.driver.running():
            await side.driver.start()
        if side.pod:
            await remove_pod(client, side.pod)
    with contextlib.suppress(Exception):
        await side.driver.stop()


def controls(
    kind: str, base: str, cluster: Cluster, node: str, registry: str, plugins: str
) -> Control:
    if kind == "toolkit":
        return SampleControl(base, node, registry, plugins, cluster)
    binary = bin_dir(cluster.version) / "helperdriver"
    return HelperControl(binary, base, node, registry, plugins, cluster)


@pytest.mark.parametrize("kind", ["toolkit", "helper"])
async def test_the_same_fault_script_on_the_real_kubelet_and_on_the_agent(
    kind: str, real_cluster: Cluster, real_kubelet: Kubelet, real_client: AsyncClient,
    namespace: str, base: str,
) -> None:  # fmt: skip
    if kind == "helper":
        skip_unless_built(helperdriver_missing(real_cluster.version))

    async def restart_real() -> None:
        await asyncio.to_thread(restart_kubelet, real_kubelet, real_cluster)

    real = Side(
        "kubelet", KUBELET_NODE, restart_real,
        controls(kind, f"{base}/real", real_cluster, KUBELET_NODE, real_kubelet.registry_dir,
                 real_kubelet.plugins_dir),
    )  # fmt: skip
    agent = AgentProcess(f"{base}/agent", real_cluster.kubeconfig, "--node-name", AGENT_NODE)

    async def restart_agent() -> None:
        await agent.stop()
        await agent.start(timeout=30)

    mine = Side(
        "agent", AGENT_NODE, restart_agent,
        controls(kind, f"{base}/agent/drv", real_cluster, AGENT_NODE, f"{base}/agent/reg",
                 f"{base}/agent/plugins"),
    )  # fmt: skip
    sides = [real, mine]
    rows: list[tuple[str, Seen, Seen, str]] = []
    bad: list[str] = []
    await agent.start(timeout=30)
    try:
        for side in sides:
            await side.driver.start()
            side.pod = f"diff-{side.label}-{uuid.uuid4().hex[:5]}"
            await place_pod(real_client, side.pod, "gpu-0", DRIVER, side.node)
        for step in STEPS:
            if step.needs and step.needs not in real.driver.can:
                continue
            seen = await play(step, sides, real_client)
            text, ok = verdict(kind, step, seen["kubelet"], seen["agent"])
            rows.append((step.label, seen["kubelet"], seen["agent"], text))
            if not ok:
                bad.append(step.label)
    finally:
        print(f"\nnode differential {real_cluster.version}, {kind} driver:")
        print("| step | real kubelet | drahealth agent (kubelet mode) | verdict |")
        print("|---|---|---|---|")
        for label, k, a, text in rows:
            print(f"| {label} | {k.text()} | {a.text()} | {text} |")
        for side in sides:
            await clean_up(side, real_client)
        await agent.stop()
        with contextlib.suppress(ApiError):
            await real_client.delete(Node, AGENT_NODE)
    assert not bad, f"steps that differ without an explanation: {bad}"
