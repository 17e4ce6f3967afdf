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

Counts and the time per round are printed. These run in CI's slow step (one round of the
leader kill and of the pause as a quick check, then 20 rounds each); the default suite
keeps the single-process checks.
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
from drahealth.core import DeviceKey, Match, Policy, Repair, Rule, parse_time
from drahealth.core._remedy_engine import RemedyEngine
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
        self.pids: set[int] = set()  # of every process started under this identity

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
        self.pids.add(self.proc.pid)

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
    #: (wall time it took effect, holder): its acquireTime, or its renewTime for a release
    holders: list[tuple[float, str]] = field(default_factory=list)

    def holder_at(self, when: float) -> str:
        """Who held the Lease at wall time ``when``, by the transitions watched.

        Taken in the order the watch delivered them (the API server's order), not by
        their times: a candidate stamps acquireTime before it reads the Lease, so it can
        fall before the renewTime of the release it followed. A transition took effect no
        earlier than the one before it."""
        held, latest = "", 0.0
        for t, who in self.holders:
            latest = max(latest, t)
            if latest > when:
                break
            held = who
        return held


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


async def _watch_lease(client: AsyncClient, ledger: Ledger) -> None:
    async for op, lease in client.watch(Lease, namespace="default"):
        spec = lease.spec
        if op == "DELETED" or spec is None:
            continue
        who = spec.holderIdentity or ""
        if ledger.holders and ledger.holders[-1][1] == who:
            continue
        at = spec.acquireTime if who else spec.renewTime
        ledger.holders.append((at.timestamp() if at is not None else time.time(), who))


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
        await self.client.create(ResourceSlice.from_dict(body))  # type: ignore[call-overload]
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
            await self.client.create(ConfigMap.from_dict({"metadata": meta, "data": data}))  # type: ignore[call-overload]

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
        asyncio.create_task(_watch_lease(client, ledger)),
    ]
    controllers: list[Controller] = []
    try:
        kubeconfig = str(server.write_kubeconfig(f"{base}/kubeconfig"))
        c = Cluster(client, base, kubeconfig, ledger)
        for n in range(nodes):
            await c.add_node(f"node-{n}")
        _write(f"{base}/policy.yaml", policy.replace("@BASE@", base))
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


def _tracebacks(base: str) -> list[str]:
    """Tracebacks in any controller's log, of any of its processes (none is expected)."""
    out = []
    for log in sorted(Path(base).glob("ctl-*.log")):
        text = log.read_text(errors="replace")
        at = text.find("Traceback")
        if at >= 0:
            out.append(f"{log.name}: {text[max(0, at - 300) : at + 1500]}")
    return out


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


# -- repairs across leader changes ---------------------------------------------------------

#: An exec repair that records its attempts: "start DEVICE PID PPID TIME [overlap]" once it
#: holds the device's lock (or found it held by an attempt still running: an overlap), and
#: "end DEVICE PID TIME" when it finished. A killed attempt writes no end; its lock goes
#: with it. A device's first attempt hangs past its timeout (3 s of 1.5 s: its controller
#: kills it, unless that controller is paused), the others succeed in 0.8 s.
RECORDER = """
import fcntl, os, sys, time
base = sys.argv[1]
dev = os.environ["DRAHEALTH_DEVICE"]
try:
    with open(os.path.join(base, "repairs.log")) as f:
        first = not any(line.split()[:2] == ["start", dev] for line in f)
except FileNotFoundError:
    first = True
lock = open(os.path.join(base, "lock-" + dev.replace("/", "_")), "a")
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    busy = ""
except BlockingIOError:
    busy = " overlap"
def line(text):
    with open(os.path.join(base, "repairs.log"), "a") as f:
        f.write(text + "\\n")
def controller_pid():
    # the controller that started this attempt: the parent, or the parent's parent when
    # the parent is the timeout wrapper the child runner puts commands under
    pid = os.getppid()
    with open(f"/proc/{pid}/comm") as f:
        wrapper = f.read().strip() == "timeout"
    if wrapper:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    return pid
line(f"start {dev} {os.getpid()} {controller_pid()} {time.time()}{busy}")
time.sleep(3.0 if first else 0.8)
line(f"end {dev} {os.getpid()} {time.time()}")
"""
REPAIR_TIMEOUT = 1.5  # seconds: an attempt's limit
REPAIR_POLICY = (
    HEAD
    + "    repair:\n"
    + f"      exec: {json.dumps([sys.executable, '-c', RECORDER, '@BASE@'])}\n"
    + f"      timeout: {REPAIR_TIMEOUT:g}s\n      backoff: 0.1s\n      attempts: 5\n"
)


@dataclass
class Attempt:
    device: str
    pid: int
    parent: int
    start: float
    overlap: bool
    end: float | None = None


def _attempts(base: str) -> list[Attempt]:
    """The attempts the repair command recorded, in the order they started."""
    try:
        text = Path(f"{base}/repairs.log").read_text()
    except FileNotFoundError:
        return []
    out: dict[int, Attempt] = {}
    for line in text.splitlines():
        part = line.split()
        if part[:1] == ["start"]:
            out[int(part[2])] = Attempt(
                part[1], int(part[2]), int(part[3]), float(part[4]), "overlap" in part
            )
        elif part[:1] == ["end"] and int(part[2]) in out:
            out[int(part[2])].end = float(part[3])
    return list(out.values())


async def _repair_phase(c: Cluster, device: str) -> str:
    entry = (await c.state("repairs") or {}).get(device) or {}
    return str(entry.get("phase", ""))


async def repair_rounds(sig: signal.Signals, rounds: int) -> None:
    """Per round a device goes bad and its repair starts; the leader is taken out while
    the attempt runs. Counted: attempts of one device that ran at once (overlaps),
    attempts started by a replica not holding the Lease (stale starts), repairs that
    never succeeded within :data:`WAIT` (lost)."""
    async with cluster(REPAIR_POLICY, rounds) as (c, controllers):
        leader = await leader_of(c, controllers, {})
        lost: list[str] = []
        times: list[float] = []
        for r in range(rounds):
            node = f"node-{r}"
            device = f"{DRIVER}/{node}/gpu-0"
            t0 = time.monotonic()

            def started(device: str = device) -> int:
                return sum(a.device == device for a in _attempts(c.base))

            await c.set_health(node, {"gpu-0": "Unhealthy"})
            await until(_async(lambda s=started: s() >= 1), f"the repair of {device} to start")
            active = {ctl.identity: ctl.active() for ctl in controllers}
            leader.signal(sig)
            if sig != signal.SIGSTOP:
                await leader.wait_exit()
            new = await leader_of(c, controllers, active)
            assert new is not leader
            if sig == signal.SIGSTOP:
                if r % 2 == 1:  # resume it while the new leader's attempt runs
                    with contextlib.suppress(AssertionError):
                        await until(_async(lambda s=started: s() >= 2), "a second attempt")
                standby = leader.standby()
                leader.signal(signal.SIGCONT)
                await until(
                    _async(lambda leader=leader, s=standby: leader.standby() > s),
                    "the resumed leader to step down",
                )
            else:
                await leader.start()
            try:
                await until(
                    lambda device=device: _phase_is(c, device, "succeeded"),
                    f"the repair of {device} to succeed",
                )
            except AssertionError as exc:
                lost.append(f"round {r}: {exc}")
            await c.set_health(node, {"gpu-0": "Healthy"})
            leader = new
            times.append(time.monotonic() - t0)
        await asyncio.sleep(REPAIR_TIMEOUT)  # the last attempts end (or are killed)
        attempts = _attempts(c.base)
        identity = {pid: ctl.identity for ctl in controllers for pid in ctl.pids}
        overlaps = [a for a in attempts if a.overlap]
        stale = [
            (a, identity.get(a.parent, "?"), c.ledger.holder_at(a.start))
            for a in attempts
            if identity.get(a.parent) != c.ledger.holder_at(a.start)
        ]
        print(
            f"repairs across {sig.name}: {rounds} rounds, {len(attempts)} attempts, "
            f"{len(overlaps)} overlaps, {len(stale)} stale starts, {len(lost)} lost, "
            f"{sum(times) / len(times):.2f} s per round (max {max(times):.2f} s)"
        )
        assert not (tracebacks := _tracebacks(c.base)), "\n".join(tracebacks)
        assert not overlaps, f"attempts that overlapped: {overlaps}\n{_outputs(controllers)}"
        assert not stale, f"started without the Lease (attempt, by, holder): {stale}"
        assert not lost, "\n".join(lost) + "\n" + _outputs(controllers)


async def _phase_is(c: Cluster, device: str, phase: str) -> bool:
    return await _repair_phase(c, device) == phase


# -- rule writes across leader changes -----------------------------------------------------


async def rule_rounds(sig: signal.Signals, rounds: int) -> None:
    """Per round a device goes bad, is tainted, and recovers around the leader's exit:
    before the signal, between the signal and the takeover, or after the takeover.
    Counted per device (one bad episode each): a second rule while one exists
    (duplicate), a rule created after the device recovered, a rule deleted and created
    again (flap)."""
    async with cluster(HEAD, rounds) as (c, controllers):
        leader = await leader_of(c, controllers, {})
        recovered: dict[str, float] = {}
        times: list[float] = []
        for r in range(rounds):
            node = f"node-{r}"
            t0 = time.monotonic()
            await c.set_health(node, {"gpu-0": "Unhealthy"})
            await until(lambda node=node: _has_rule(c, node, "gpu-0"), f"the rule for {node}/gpu-0")
            active = {ctl.identity: ctl.active() for ctl in controllers}
            when = r % 3  # 0: before the signal, 1: before the takeover, 2: after it
            if when == 0:
                recovered[node] = time.monotonic()
                await c.set_health(node, {"gpu-0": "Healthy"})
            leader.signal(sig)
            if when == 1:
                recovered[node] = time.monotonic()
                await c.set_health(node, {"gpu-0": "Healthy"})
            await leader.wait_exit()
            new = await leader_of(c, controllers, active)
            assert new is not leader
            if when == 2:
                recovered[node] = time.monotonic()
                await c.set_health(node, {"gpu-0": "Healthy"})
            await until(lambda node=node: _no_rule(c, node, "gpu-0"), f"{node}/gpu-0 untainted")
            await leader.start()
            leader = new
            times.append(time.monotonic() - t0)
        await asyncio.sleep(0.5)  # anything still sent has landed
        events = sorted(
            [(t, "add", node) for t, node, _dev, _by in c.ledger.created]
            + [(t, "del", node) for t, node, _dev in c.ledger.deleted]
        )
        duplicate, recreated, flap = [], [], []
        for node in recovered:
            ops = [(t, op) for t, op, n in events if n == node]
            live, gone = 0, False
            for t, op in ops:
                if op == "add":
                    if live:
                        duplicate.append(node)
                    if gone:
                        flap.append(node)
                    if t > recovered[node] + 0.1:  # the watch's delay: 0.1 s
                        recreated.append(node)
                    live += 1
                else:
                    live, gone = max(0, live - 1), True
        print(
            f"rule writes across {sig.name}: {rounds} rounds, {len(duplicate)} duplicates, "
            f"{len(recreated)} re-created after recovery, {len(flap)} flaps, "
            f"{sum(times) / len(times):.2f} s per round (max {max(times):.2f} s)"
        )
        assert not (tracebacks := _tracebacks(c.base)), "\n".join(tracebacks)
        assert not (duplicate or recreated or flap), (
            f"duplicates {duplicate}, re-created {recreated}, flaps {flap}\n"
            + _outputs(controllers)
        )


# -- the tests -----------------------------------------------------------------------------


@pytest.mark.slow
async def test_the_breaker_counts_across_a_leader_kill() -> None:
    await breaker_rounds(signal.SIGKILL, 1)


@pytest.mark.slow
async def test_a_paused_leader_writes_nothing_when_it_resumes() -> None:
    await stale_rounds(1)


def test_a_new_leader_waits_for_the_recorded_deadline_of_a_running_repair() -> None:
    """The last leader's attempt started 1 s ago and may run until its deadline, 4 s
    ahead: the next attempt is not due before it (a deadline ahead was read as now)."""
    repair = Repair(exec=("true",), timeout=2.0)
    engine = RemedyEngine(Policy(rules=(Rule("xid", Match(), repair=repair),)))
    key = DeviceKey(DRIVER, "node-0", "gpu-0")
    now = 1_800_000_000.0

    def wall(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"

    row = {
        "phase": "running", "attempt": 1, "kind": "exec", "rule": "xid", "node": "node-0",
        "since": wall(now - 1), "notBefore": wall(now - 1),
        "deadline": wall(repair.attempt_deadline(now - 1)),
    }  # fmt: skip
    assert engine.care.restore({"repairs": {str(key): row}}, parse_time, now) == []
    st = engine.care.repairs[key]
    assert st.phase == "waiting-drain"
    assert st.not_before == pytest.approx(repair.attempt_deadline(now - 1), abs=0.01)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
async def test_the_breaker_counts_across_20_leader_changes(sig: signal.Signals) -> None:
    await breaker_rounds(sig, 20)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_paused_leader_writes_nothing_over_20_rounds() -> None:
    await stale_rounds(20)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
async def test_repairs_never_overlap_across_20_leader_changes(sig: signal.Signals) -> None:
    await repair_rounds(sig, 20)


RULE_SIGNALS = [signal.SIGKILL, signal.SIGTERM]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("sig", RULE_SIGNALS, ids=[s.name for s in RULE_SIGNALS])
async def test_rule_writes_across_20_leader_changes(sig: signal.Signals) -> None:
    await rule_rounds(sig, 20)
