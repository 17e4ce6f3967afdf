"""Child processes drahealth runs (exec probes, exec repairs) and the repair webhook, attacked.

Each test is one finding of the third robustness review: a repair or probe whose background
child keeps the pipe open outlives its timeout; a controller SIGKILLed mid-repair lets the
next one start a second repair of the same GPU while the first still runs; one NUL in one
device's attribute blinds an exec probe for all devices; attribute values reach a shell
unchecked; output without end fills memory; helpers left behind pile up; the repair webhook
follows redirects.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from lightkube import AsyncClient

from drahealth.controlplane import APIServer
from drahealth.core import DeviceFacts, DeviceKey, Health, Repair, RepairRun, RepairWebhook
from drahealth.remedy._repair import MAX_DETAIL, RepairRunner
from drahealth.sources import ExecAttachedProbe
from drahealth.sources._probe import run_probe
from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client
from tests.integration.remedy.test_controller import DRIVER, NODE, set_health

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]
KEY = DeviceKey(DRIVER, NODE, "gpu-0")
FACTS = DeviceFacts(DRIVER, NODE, "gpu-0", NODE)


def _alive(pid: int) -> bool:
    """Running (a zombie or a missing process is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


@contextlib.contextmanager
def _killed_after(pidfile: Path) -> Iterator[None]:
    """Kill whatever pids the command wrote to ``pidfile`` (old code leaves them)."""
    try:
        yield
    finally:
        for text in pidfile.read_text().split() if pidfile.exists() else []:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(text), signal.SIGKILL)


def _in_thread(fn: Any, within: float) -> Any:
    """``fn()`` on a thread; fails (instead of hanging) when it takes over ``within`` s."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(fn).result(timeout=within)
    except concurrent.futures.TimeoutError:
        raise AssertionError(f"still running after {within} s") from None
    finally:
        pool.shutdown(wait=False)


# -- a paused runner -------------------------------------------------------------------


@pytest.mark.skipif(not shutil.which("timeout"), reason="GNU timeout is not installed")
async def test_the_deadline_holds_while_the_runner_is_paused(tmp_path: Path) -> None:
    """A controller paused by SIGSTOP (or a frozen VM) cannot kill its command at the
    deadline; the command's group must still be gone by timeout + kill grace, since the
    next leader starts its own attempt after that (the recorded deadline)."""
    pids = tmp_path / "pids"
    runner = (
        "import sys\n"
        "from drahealth._child import run_child\n"
        f"run_child(['sh', '-c', 'sleep 977 & echo $$ $! > {pids}; sleep 977'],"
        " {'PATH': '/usr/bin:/bin'}, 1.0, kill_grace=0.5)\n"
    )
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", runner, cwd=ROOT)
    with _killed_after(pids):
        try:
            await eventually(
                lambda: pids.exists() and len(pids.read_text().split()) == 2, within=20
            )
            os.kill(proc.pid, signal.SIGSTOP)  # the runner can no longer enforce anything
            leftover = [int(p) for p in pids.read_text().split()]
            # timeout 1 s + grace 0.5 s; the slack is for a loaded machine
            await eventually(lambda: not [p for p in leftover if _alive(p)], within=15)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 10)


# -- probes ----------------------------------------------------------------------------


def test_a_probe_with_a_background_child_ends_at_its_timeout_with_its_group(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 977 & echo $$ $! > {pids}; sleep 60"
    with _killed_after(pids):
        started = time.monotonic()
        health, message = _in_thread(lambda: run_probe(["sh", "-c", script], {}, 1.0), 20)
        took = time.monotonic() - started
        assert health is Health.UNKNOWN and "timed out after 1 s" in message, message
        assert took < 15, took
        leftover = [int(p) for p in pids.read_text().split()]
        assert not [p for p in leftover if _alive(p)], "the probe's group outlived its timeout"


def test_a_probe_that_prints_without_end_is_read_in_bounded_memory() -> None:
    tracemalloc.start()
    try:
        health, message = run_probe(
            ["sh", "-c", "head -c 64000000 /dev/zero | tr '\\0' x; exit 1"], {}, 60.0
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert health is Health.UNHEALTHY
    assert len(message) < 20_000
    assert peak < 8_000_000, f"{peak} bytes held for 64 MB of output"


def test_helpers_a_probe_leaves_behind_die_and_are_reaped(tmp_path: Path) -> None:
    """A subreaper (as PID 1 of a container is) runs probes that leave helpers behind:
    none survives, and no zombie piles up."""
    worker = """
import ctypes, os, sys
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
from drahealth.sources._probe import run_probe
for _ in range(20):
    run_probe(["sh", "-c", "sleep 977 & sleep 977 & exit 0"], {}, 5.0)
import time; time.sleep(0.3)
run_probe(["true"], {}, 5.0)  # reaps what died since
me = str(os.getpid())
kids = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read().rpartition(b")")[2].split()
    except OSError:
        continue
    if stat[1].decode() == me:
        kids.append((pid, stat[0].decode()))
        os.kill(int(pid), 9)
print(len(kids), kids[:5])
"""
    done = subprocess.run(
        [sys.executable, "-c", worker], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("0 "), f"children left: {done.stdout}"


def test_one_nul_in_one_value_makes_only_that_device_unknown() -> None:
    probe = ExecAttachedProbe(["sh", "-c", "exit 0", "probe", "{key}"], by="uuid", parallel=2)
    probe.watch_keys(["GPU-good", "GPU-bad\x00x", "GPU-fine"])
    signals = {s.value: s for s in probe.poll()}
    assert signals["GPU-good"].health is Health.HEALTHY
    assert signals["GPU-fine"].health is Health.HEALTHY
    bad = signals["GPU-bad\x00x"]
    assert bad.health is Health.UNKNOWN and "not passed to the probe" in bad.message


@pytest.mark.parametrize(
    "value",
    ["GPU-1;touch {out}", "GPU-1 $(touch {out})", "`touch {out}`", "GPU-1\ntouch {out}"],
)
def test_an_attribute_value_never_reaches_a_shell_as_code(tmp_path: Path, value: str) -> None:
    out = tmp_path / "owned"
    key = value.format(out=out)
    probe = ExecAttachedProbe(["sh", "-c", "echo checking {key}"], by="uuid", parallel=1)
    probe.watch_keys([key, "GPU-2"])
    signals = {s.value: s for s in probe.poll()}
    assert not out.exists(), "the value ran as a command"
    assert signals[key].health is Health.UNKNOWN
    assert "letters, digits" in signals[key].message
    assert signals["GPU-2"].health is Health.HEALTHY


def test_a_pci_keyed_probe_takes_only_pci_addresses() -> None:
    probe = ExecAttachedProbe(["true", "{key}"], by="resource.kubernetes.io/pciBusID")
    probe.watch_keys(["0000:3b:00.0", "../../etc"])
    signals = {s.value: s for s in probe.poll()}
    assert signals["0000:3b:00.0"].health is Health.HEALTHY
    assert "not a PCI address" in signals["../../etc"].message


# -- repairs ---------------------------------------------------------------------------


async def _repair(repair: Repair, within: float) -> tuple[bool, str]:
    answers: list[tuple[bool, str]] = []
    runner = RepairRunner(None, "default", lambda _r, ok, d, _j: answers.append((ok, d)))  # type: ignore[arg-type]
    runner.start(RepairRun(KEY, "xid", repair, 1, 1), FACTS, "XID 79", ())
    try:
        await eventually(lambda: answers, within, "the repair's answer")
    finally:
        await runner.stop()
    return answers[0]


async def test_an_exec_repair_with_a_background_child_fails_at_its_timeout(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 977 & echo $$ $! > {pids}; sleep 60"
    with _killed_after(pids):
        ok, detail = await _repair(Repair(exec=("sh", "-c", script), timeout=1.0), 15)
        assert not ok and "timed out" in detail, detail
        leftover = [int(p) for p in pids.read_text().split()]
        assert not [p for p in leftover if _alive(p)], "the repair's group outlived its timeout"


async def test_repair_stderr_is_held_in_bounded_memory() -> None:
    code = "import os\nfor _ in range(1000): os.write(2, b'e' * 64000)\nraise SystemExit(4)"
    tracemalloc.start()
    try:
        ok, detail = await _repair(Repair(exec=(sys.executable, "-c", code), timeout=60), 60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not ok and detail.startswith("exit 4")
    assert len(detail) <= MAX_DETAIL + 20
    assert peak < 8_000_000, f"{peak} bytes held for 64 MB of stderr"


async def test_the_repair_webhook_does_not_follow_redirects() -> None:
    hits: list[str] = []

    async def hook(request: web.Request) -> web.Response:
        hits.append(request.path)
        if request.path == "/hook":
            raise web.HTTPTemporaryRedirect("/elsewhere")
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    app.router.add_post("/elsewhere", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        webhook = RepairWebhook(f"http://127.0.0.1:{port}/hook", timeout=5)
        ok, detail = await _repair(Repair(webhook=webhook, timeout=10), 15)
    finally:
        await runner.cleanup()
    assert not ok and "307" in detail and "redirect" in detail, detail
    assert hits == ["/hook"]


# -- a controller SIGKILLed mid-repair -------------------------------------------------

RECORDER = """
import os, sys, time
log = sys.argv[1]
with open(log, "a") as f:
    f.write(f"start {os.getpid()} {time.time()}\\n")
time.sleep(5)
with open(log, "a") as f:
    f.write(f"end {os.getpid()} {time.time()}\\n")
"""


def _lines(log: Path, what: str) -> list[tuple[int, float]]:
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        kind, pid, when = line.split()
        if kind == what:
            out.append((int(pid), float(when)))
    return out


def _spawn(server: APIServer, policy_file: Path, identity: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reliability._repair_controller_worker",
         server.url, str(policy_file), identity],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.slow
async def test_a_new_controller_never_starts_a_repair_while_the_last_ones_may_run(
    server: APIServer, client: AsyncClient, tmp_path: Path
) -> None:
    """SIGKILL the controller while its exec repair runs, start another at once: the
    second attempt starts only after the first attempt's recorded deadline."""
    log = tmp_path / "repairs.log"
    timeout = 8.0
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        "apiVersion: drahealth.io/v1\nkind: RemediationPolicy\nrules:\n"
        "- name: xid\n  match: {driver: gpu.example.com}\n  hysteresis: null\n"
        "  repair:\n"
        f"    exec: {json.dumps([sys.executable, '-c', RECORDER, str(log)])}\n"
        f"    timeout: {timeout:g}s\n    backoff: 0.1s\n    attempts: 3\n"
    )
    await set_health(client, gpu_0=("Unhealthy", "XID 79"))
    procs = [_spawn(server, policy_file, "c1")]
    try:
        await eventually(lambda: _lines(log, "start"), 30, "the first attempt")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(timeout=10)
        killed_at = time.time()
        procs.append(_spawn(server, policy_file, "c2"))
        await eventually(lambda: len(_lines(log, "start")) >= 2, 45, "the second attempt")
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=10)
    (pid1, start1), (_pid2, start2) = _lines(log, "start")[:2]
    assert start2 >= start1 + timeout, (
        f"the second attempt started {start2 - start1:.1f} s after the first, "
        f"within its {timeout:g} s timeout"
    )
    ends = dict(_lines(log, "end"))
    assert pid1 not in ends or ends[pid1] <= start2, "the two attempts overlapped"
    # the first attempt died with its controller (PR_SET_PDEATHSIG)
    assert pid1 not in ends or ends[pid1] < killed_at
