"""Leader changes of the remediation controller: no double action, no stale write.

Two real ``drahealth controller`` processes campaign for one Lease (1.5 s) on the
embedded API server; the test writes ResourceSlices and the agents' device-health
ConfigMaps itself and watches what the controllers write. Each round takes the leader
out (SIGKILL, SIGTERM, or SIGSTOP and later SIGCONT) at the worst moment:

* breaker (``limits: {perNode: 1}``, a fresh node per round): the leader taints the
  node's first device, is taken out, and the node's second device goes bad: the next
  leader must hold it (the window is rebuilt from the API before its first write).
  On every other round the first device recovers before the leader goes, so its rule
  is gone and only the history says it was tainted. A double action is a second rule
  created for one node.
* stale writes (SIGSTOP): the leader taints a device and is paused past its lease; the
  new leader untaints the recovered device; the old leader resumes. A stale write is a
  rule created for the recovered device, any rule or history row written by the paused
  process once the new leader took over, or a history row that disappears.

Counts and the time per round are printed. One round of the leader kill and one of the
pause run in the default suite; ``@pytest.mark.slow`` runs 20 each.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Node
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceSlice
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.kube import make_client

pytestmark = pytest.mark.timeout(300)

DRIVER = "gpu.example.com"
LEASE = 1.5  # seconds: --lease-duration of both controllers
HISTORY = "drahealth-remediation-history"
STATE = "drahealth-remediation-state"
CREATED_BY = "drahealth.io/created-by"
WAIT = 30.0  # seconds any single step may take on a loaded 2-core machine
HEAD = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
rules:
  - name: any
    match: {driver: gpu.example.com}
    action: {effect: NoSchedule}
    recovery: {healthyFor: 0.2s}
"""
SIGNALS = [signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP]
BREAKER_POLICY = HEAD + "limits: {perNode: 1, window: 1h}\n"
_EXE = Path(sys.executable).with_name("drahealth")
DRAHEALTH = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "drahealth"]


async def until(check: Any, what: str, within: float = WAIT) -> Any:
    """Poll ``check`` (async) until it answers something true; fail naming ``what``."""
    deadline = time.monotonic() + within
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(0.03)


def _open_log(path: str) -> Any:
    return open(path, "wb")


def _write(path: str, text: str) -> None:
    Path(path).write_text(text)


class Controller:
    """One ``drahealth controller`` process; restartable under the same identity."""

    def __init__(self, base: str, kubeconfig: str, identity: str, policy: str) -> None:
        self.identity, self.base = identity, base
        self.args = [
            *DRAHEALTH, "--log-level", "info", "controller", "--kubeconfig", kubeconfig,
            "--policy", policy, "--id", identity, "--lease-duration", str(LEASE),
        ]  # fmt: skip
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0
        self.log_path = ""

    @property
    def output(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    async def start(self) -> None:
        self.starts += 1
        self.log_path = f"{self.base}/{self.identity}-{self.starts}.log"
        out = _open_log(self.log_path)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.args, stdout=out, stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
            )  # fmt: skip
        finally:
            out.close()

    def active(self) -> int:
        """Times this process started leading and finished its first sync."""
        return self.output.count("remediation controller active")

    def standby(self) -> int:
        return self.output.count("standby: ")

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None and self.proc.returncode is None, self.output
        self.proc.send_signal(sig)

    async def wait_exit(self) -> None:
        assert self.proc is not None
        try:
            await asyncio.wait_for(self.proc.wait(), WAIT)
        except TimeoutError:
            raise AssertionError(f"{self.identity} did not exit:\n{self.output}") from None

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            await self.proc.wait()


@dataclass
class Ledger:
    """What the controllers wrote, from watches: rule creations, history rows."""

    created: list[tuple[float, str, str, str]] = field(default_factory=list)  # t, node, dev, by
    deleted: list[tuple[float, str, str]] = field(default_factory=list)
    history_writes: list[tuple[float, list[dict[str, Any]]]] = field(default_factory=list)


async def _watch_rules(client: AsyncClient, ledger: Ledger) -> None:
    async for op, rule in client.watch(DeviceTaintRule):
        meta, spec = rule.metadata, rule.spec
        if meta is None or spec is None or spec.deviceSelector is None:
            continue
        sel = spec.deviceSelector
        by = (meta.annotations or {}).get(CREATED_BY, "")
        if op == "ADDED":
            ledger.created.append((time.monotonic(), str(sel.pool), str(sel.device), by))
        elif op == "DELETED":
            ledger.deleted.append((time.monotonic(), str(sel.pool), str(sel.device)))


async def _watch_history(client: AsyncClient, ledger: Ledger) -> None:
    async for op, cm in client.watch(ConfigMap, namespace="default"):
        if cm.metadata is None or cm.metadata.name != HISTORY or op == "DELETED":
            continue
        rows = json.loads((cm.data or {}).get("history", "[]"))
        ledger.history_writes.append((time.monotonic(), rows))


@dataclass
class Cluster:
    client: AsyncClient
    base: str
    kubeconfig: str
    ledger: Ledger
    health: dict[str, dict[str, str]] = field(default_factory=dict)

    async def add_node(self, node: str, devices: int = 2) -> None:
        await self.client.create(Node(metadata=ObjectMeta(name=node)))
        body = {
            "metadata": {"name": f"{node}-gpus"},
            "spec": {
                "driver": DRIVER, "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": f"gpu-{i}"} for i in range(devices)],
            },
        }  # fmt: skip
        await self.client.create(ResourceSlice.from_dict(body))
        await self.set_health(node, {f"gpu-{i}": "Healthy" for i in range(devices)})

    async def set_health(self, node: str, health: dict[str, str]) -> None:
        self.health[node] = {**self.health.get(node, {}), **health}
        rows = [
            {"driver": DRIVER, "pool": node, "device": d, "health": h,
             "message": "XID 79" if h == "Unhealthy" else "", "since": time.time()}
            for d, h in sorted(self.health[node].items())
        ]  # fmt: skip
        name, data = f"drahealth-devices-{node}", {"devices": json.dumps(rows)}
        try:
            await self.client.patch(
                ConfigMap, name, {"data": data}, namespace="default", patch_type=PatchType.MERGE
            )
        except Exception:
            meta = {
                "name": name, "namespace": "default",
                "labels": {
                    "app.kubernetes.io/component": "device-health",
                    "app.kubernetes.io/managed-by": "drahealth-agent", "drahealth.io/node": node,
                },
            }  # fmt: skip
            await self.client.create(ConfigMap.from_dict({"metadata": meta, "data": data}))

    async def holder(self) -> str:
        try:
            lease = await self.client.get(Lease, "drahealth-controller", namespace="default")
        except Exception:
            return ""
        return (lease.spec.holderIdentity if lease.spec else None) or ""

    async def rules(self) -> dict[tuple[str, str], Any]:
        return {
            (str(r.spec.deviceSelector.pool), str(r.spec.deviceSelector.device)): r
            async for r in self.client.list(DeviceTaintRule)
            if r.spec is not None and r.spec.deviceSelector is not None
        }

    async def state(self, key: str) -> Any:
        try:
            cm = await self.client.get(ConfigMap, STATE, namespace="default")
        except Exception:
            return None
        text = (cm.data or {}).get(key)
        return json.loads(text) if text else None

    async def history(self) -> list[dict[str, Any]]:
        try:
            cm = await self.client.get(ConfigMap, HISTORY, namespace="default")
        except Exception:
            return []
        rows = json.loads((cm.data or {}).get("history", "[]"))
        return rows if isinstance(rows, list) else []


@contextlib.asynccontextmanager
async def cluster(policy: str, nodes: int) -> AsyncIterator[tuple[Cluster, list[Controller]]]:
    server = APIServer()
    await server.start(port=0)
    base = tempfile.mkdtemp(prefix="lc-")
    client = make_client(server_url=server.url)
    ledger = Ledger()
    watches = [
        asyncio.create_task(_watch_rules(client, ledger)),
        asyncio.create_task(_watch_history(client, ledger)),
    ]
    controllers: list[Controller] = []
    try:
        kubeconfig = str(server.write_kubeconfig(f"{base}/kubeconfig"))
        c = Cluster(client, base, kubeconfig, ledger)
        for n in range(nodes):
            await c.add_node(f"node-{n}")
        _write(f"{base}/policy.yaml", policy)
        controllers = [
            Controller(base, kubeconfig, name, f"{base}/policy.yaml") for name in ("ctl-a", "ctl-b")
        ]
        for ctl in controllers:
            await ctl.start()
        yield c, controllers
    finally:
        for ctl in controllers:
            await ctl.kill()
        for t in watches:
            t.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        await client.close()
        await server.stop()
        shutil.rmtree(base, ignore_errors=True)


async def leader_of(c: Cluster, controllers: list[Controller], active: dict[str, int]) -> Any:
    """The controller holding the Lease once it finished a sync it had not before."""

    async def check() -> Controller | None:
        holder = await c.holder()
        for ctl in controllers:
            if ctl.identity == holder and ctl.active() > active.get(ctl.identity, 0):
                return ctl
        return None

    try:
        return await until(check, "a controller to lead and sync")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_outputs(controllers)}") from None


def _outputs(controllers: list[Controller]) -> str:
    return "\n".join(f"--- {c.identity}\n{c.output[-4000:]}" for c in controllers)


# -- the breaker across leader changes ----------------------------------------------------


async def breaker_rounds(sig: signal.Signals, rounds: int) -> None:
    async with cluster(BREAKER_POLICY, rounds) as (c, controllers):
        leader = await leader_of(c, controllers, {})
        times: list[float] = []
        for r in range(rounds):
            node = f"node-{r}"
            t0 = time.monotonic()
            await c.set_health(node, {"gpu-0": "Unhealthy"})
            await until(lambda node=node: _has_rule(c, node, "gpu-0"), f"the rule for {node}/gpu-0")
            if r % 2 == 1:  # its rule goes: only the history and the state remember it
                await c.set_health(node, {"gpu-0": "Healthy"})
                await until(lambda node=node: _no_rule(c, node, "gpu-0"), f"{node}/gpu-0 untainted")
            active = {ctl.identity: ctl.active() for ctl in controllers}
            leader.signal(sig)
            if sig != signal.SIGSTOP:
                await leader.wait_exit()
            await c.set_health(node, {"gpu-1": "Unhealthy"})
            new = await leader_of(c, controllers, active)
            assert new is not leader
            await until(
                lambda node=node: _decided(c, node, "gpu-1"),
                f"the new leader to decide about {node}/gpu-1",
            )
            if sig == signal.SIGSTOP:
                standby = leader.standby()
                leader.signal(signal.SIGCONT)
                await until(
                    _async(lambda leader=leader, s=standby: leader.standby() > s),
                    "the resumed leader to step down",
                )
            else:
                await leader.start()
            leader = new
            times.append(time.monotonic() - t0)
        per_node: dict[str, int] = {}
        for _, node, _dev, _by in c.ledger.created:
            per_node[node] = per_node.get(node, 0) + 1
        double = sum(max(0, n - 1) for n in per_node.values())
        print(
            f"breaker across {sig.name}: {rounds} rounds, {double} double actions, "
            f"{sum(times) / len(times):.2f} s per round (max {max(times):.2f} s)"
        )
        assert double == 0, f"{double} double actions: {per_node}\n{_outputs(controllers)}"


async def _has_rule(c: Cluster, node: str, device: str) -> bool:
    return (node, device) in await c.rules()


async def _no_rule(c: Cluster, node: str, device: str) -> bool:
    return (node, device) not in await c.rules()


async def _decided(c: Cluster, node: str, device: str) -> bool:
    """The device's taint is written (a rule) or held (the breaker's state lists it)."""
    if (node, device) in await c.rules():
        return True
    held = (await c.state("breaker") or {}).get("held") or []
    return any(h.get("device") == f"{DRIVER}/{node}/{device}" for h in held)


def _async(check: Any) -> Any:
    async def run() -> Any:
        return check()

    return run


# -- stale writes of a paused leader ------------------------------------------------------


async def stale_rounds(rounds: int) -> None:
    async with cluster(HEAD, rounds) as (c, controllers):
        leader = await leader_of(c, controllers, {})
        stale: list[str] = []
        times: list[float] = []
        for r in range(rounds):
            node = f"node-{r}"
            t0 = time.monotonic()
            await c.set_health(node, {"gpu-0": "Unhealthy"})
            await until(lambda node=node: _has_rule(c, node, "gpu-0"), f"the rule for {node}/gpu-0")
            active = {ctl.identity: ctl.active() for ctl in controllers}
            # a device the paused leader will see recover only late: its health changes
            # twice while it sleeps, so its own view is stale in more than one place
            await c.set_health(node, {"gpu-1": "Unhealthy"})
            await until(lambda node=node: _has_rule(c, node, "gpu-1"), f"{node}/gpu-1 tainted")
            leader.signal(signal.SIGSTOP)
            new = await leader_of(c, controllers, active)
            # from here on the paused process holds no lease: whatever it sent before it
            # stopped has landed, and anything it writes now is a stale write
            taken_over = time.monotonic()
            await c.set_health(node, {"gpu-0": "Healthy", "gpu-1": "Healthy"})
            for dev in ("gpu-0", "gpu-1"):
                await until(
                    lambda node=node, dev=dev: _no_rule(c, node, dev), f"{node}/{dev} untainted"
                )
            await until(
                lambda node=node, new=new: _history_has(c, new.identity, "delete", node),
                "the new leader's untaint in the history",
            )
            standby = leader.standby()
            leader.signal(signal.SIGCONT)
            await until(
                _async(lambda leader=leader, s=standby: leader.standby() > s),
                "the resumed leader to step down",
            )
            await asyncio.sleep(0.5)  # anything it still sent has landed
            for t, pool, dev, by in c.ledger.created:
                if pool == node and t > taken_over:
                    stale.append(f"round {r}: rule for {pool}/{dev} created by {by}")
            stale += _history_stale(c.ledger, taken_over, leader.identity, r)
            leader = new
            times.append(time.monotonic() - t0)
        print(
            f"stale writes across SIGSTOP/SIGCONT: {rounds} rounds, {len(stale)} stale writes, "
            f"{sum(times) / len(times):.2f} s per round (max {max(times):.2f} s)"
        )
        assert not stale, "\n".join(stale) + "\n" + _outputs(controllers)


async def _history_has(c: Cluster, by: str, action: str, node: str) -> bool:
    return any(
        row.get("by") == by
        and row.get("action") == action
        and f"/{node}/" in row.get("subject", "")
        for row in await c.history()
    )


def _history_stale(ledger: Ledger, since: float, paused: str, r: int) -> list[str]:
    """History writes after ``since`` that add a row by ``paused`` or drop a row."""
    out = []
    versions = ledger.history_writes
    for (_, before), (t, after) in itertools.pairwise(versions):
        if t <= since:
            continue
        added = [row for row in after if row not in before]
        if any(row.get("by") == paused for row in added):
            out.append(f"round {r}: history rows written by the paused {paused}: {added}")
        lost = [row for row in before if row not in after]
        if lost and len(before) < 200:  # the history keeps its newest 200 rows
            out.append(f"round {r}: {len(lost)} history rows overwritten: {lost}")
    return out


# -- the tests -----------------------------------------------------------------------------


async def test_the_breaker_counts_across_a_leader_kill() -> None:
    await breaker_rounds(signal.SIGKILL, 1)


async def test_a_paused_leader_writes_nothing_when_it_resumes() -> None:
    await stale_rounds(1)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
async def test_the_breaker_counts_across_20_leader_changes(sig: signal.Signals) -> None:
    await breaker_rounds(sig, 20)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_paused_leader_writes_nothing_over_20_rounds() -> None:
    await stale_rounds(20)
