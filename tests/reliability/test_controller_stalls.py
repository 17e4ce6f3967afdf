"""The remediation controller cannot be stalled by a policy regex or by its own work.

* A policy pattern with catastrophic backtracking in Python ``re`` (``XID (\\d+,?)+ on
  GPU``: seconds on a 33-character message, doubling with every character) loads and
  matches a 10 kB adversarial message in well under 0.1 s, because patterns are RE2;
  a pattern RE2 refuses fails the load with the rule and the pattern named.
* A leader whose work hogs the event loop for longer than the lease keeps its Lease:
  renewals run on their own thread, event loop and HTTP client, so the holder never
  changes and ``renewTime`` advances at least every ``lease_duration / 2``.
* Every wait of the benchmarks has a timeout that fails naming what it waited for.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.coordination_v1 import Lease

from drahealth.controlplane import APIServer
from drahealth.core import Health
from drahealth.core._policy import DeviceFacts, PolicyError
from drahealth.kube import make_client, make_sync_client
from drahealth.kube._leader import LeaderElector
from drahealth.remedy._policy_load import parse_policy

pytestmark = pytest.mark.timeout(60)

CATASTROPHIC = r"XID (\d+,?)+ on GPU"
POLICY = f"""apiVersion: drahealth.io/v1
kind: RemediationPolicy
rules:
  - name: xid-list
    match: {{message: '{CATASTROPHIC}'}}
"""
GPU = DeviceFacts("gpu.example.com", "node-1", "gpu-0", "node-1")


def test_a_catastrophic_pattern_matches_a_10k_adversarial_message_fast() -> None:
    policy = parse_policy(POLICY, "policy.yaml")
    assert policy.rule_for(GPU, Health.UNHEALTHY, "XID 79,48 on GPU 3") is not None
    adversarial = "XID " + "1" * 10_000 + "!"  # no " on GPU": Python re backtracks forever
    t0 = time.perf_counter()
    for _ in range(10):
        assert policy.rule_for(GPU, Health.UNHEALTHY, adversarial) is None
    took = (time.perf_counter() - t0) / 10
    assert took < 0.1, f"matching a 10 kB message took {took:.3f} s"


def test_a_huge_message_is_matched_on_its_first_kib_only() -> None:
    policy = parse_policy(POLICY, "policy.yaml")
    late = "x" * 2_000 + "XID 79 on GPU"
    assert policy.rule_for(GPU, Health.UNHEALTHY, late) is None
    t0 = time.perf_counter()
    assert policy.rule_for(GPU, Health.UNHEALTHY, "XID " + "1," * 5_000_000) is None
    assert time.perf_counter() - t0 < 0.1


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(\d+) \1", "invalid escape sequence"),
        (r"XID (?=79)", "invalid perl operator"),
        (r"(?<!no )XID", "invalid perl operator"),
    ],
)
def test_a_pattern_re2_refuses_fails_the_load_naming_rule_and_pattern(
    pattern: str, reason: str
) -> None:
    text = POLICY.replace(CATASTROPHIC, pattern)
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "policy.yaml")
    message = str(info.value)
    assert message.startswith("policy.yaml: rules[0].match.message: rule 'xid-list': "), message
    assert repr(pattern) in message and reason in message, message
    assert "RE2 syntax" in message, message


# -- the leader keeps its lease while its work hogs the event loop ----------------------


class ServerThread:
    """The embedded API server on its own thread and event loop (not blocked by ours)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = APIServer()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(port=0), self.loop).result(10)
        return self

    def __exit__(self, *_exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        assert not self.thread.is_alive(), "the API server thread did not stop"
        self.loop.close()


@pytest.fixture
def server() -> Iterator[ServerThread]:
    with ServerThread() as s:
        yield s


def _renewals(url: str, stop: threading.Event, out: list[tuple[float, str, str]]) -> None:
    """Sample the Lease every 20 ms from a plain thread: (monotonic, holder, renewTime)."""
    client = make_sync_client(server_url=url)
    try:
        while not stop.is_set():
            try:
                lease = client.get(Lease, "ctl", namespace="default")
            except Exception:  # not created yet
                pass
            else:
                spec = lease.spec
                assert spec is not None
                renew = spec.renewTime
                out.append((time.monotonic(), spec.holderIdentity or "", str(renew)))
            stop.wait(0.02)
    finally:
        client.close()


async def test_the_leader_keeps_its_lease_while_its_work_hogs_the_loop(
    server: ServerThread,
) -> None:
    lease_duration = 2.0
    url = server.server.url
    client = make_client(server_url=url)
    elector = LeaderElector(
        client,
        name="ctl",
        identity="hog",
        lease_duration=lease_duration,
        renew_deadline=lease_duration * 2 / 3,
        retry_period=lease_duration / 7.5,
        client_factory=lambda: make_client(server_url=url),
    )
    hogged = asyncio.Event()
    span: list[float] = []

    async def lead() -> None:
        t0 = time.monotonic()
        span.append(t0)
        while time.monotonic() - t0 < 3 * lease_duration:  # one long pass, never yielding
            sum(range(2_000))
        span.append(time.monotonic())
        hogged.set()
        await asyncio.Event().wait()

    stop = threading.Event()
    samples: list[tuple[float, str, str]] = []
    sampler = threading.Thread(target=_renewals, args=(url, stop, samples), daemon=True)
    sampler.start()
    task = asyncio.create_task(elector.run(lead))
    try:
        async with asyncio.timeout(30):
            await hogged.wait()
        t_start, t_end = span
        await asyncio.sleep(0.3)  # let the loop run once the hog is over: still leading
        assert elector.is_leader and elector.transitions == 1, "the leader stepped down"
    finally:
        stop.set()
        task.cancel()
        async with asyncio.timeout(10):
            await asyncio.gather(task, return_exceptions=True)
        await client.close()
        sampler.join(5)
    renewing = [t.name for t in threading.enumerate() if t.name == "renew-ctl"]
    assert not renewing, "the renewal thread outlived the campaign"
    during = [s for s in samples if t_start <= s[0] <= t_end]
    assert len(during) > 10, f"too few lease samples while the work ran: {len(during)}"
    holders = {h for _, h, _ in during}
    assert holders == {"hog"}, f"the lease changed hands during the pass: {holders}"
    changes = [t for (_, _, prev), (t, _, r) in itertools.pairwise(during) if r != prev]
    stamps = [t_start, *changes, t_end]
    gap = max(b - a for a, b in itertools.pairwise(stamps))
    assert gap <= lease_duration / 2, f"renewTime stood still for {gap:.2f} s during the pass"


# -- every benchmark wait has a timeout that says what it waited for --------------------


def _bench_waits() -> Any:
    path = Path(__file__).resolve().parents[2] / "bench" / "waits.py"
    spec = importlib.util.spec_from_file_location("bench_waits", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_a_bench_wait_that_never_ends_fails_naming_what_it_waited_for() -> None:
    waits = _bench_waits()
    t0 = time.monotonic()
    with pytest.raises(waits.BenchTimeout, match=r"timed out after 0.2 s waiting for the taint"):
        await waits.within(asyncio.Event().wait(), 0.2, "the taint")
    assert time.monotonic() - t0 < 5


async def test_a_silent_child_fails_the_bench_with_its_last_output() -> None:
    waits = _bench_waits()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; print('ready: x', flush=True); time.sleep(60)",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    out = waits.Output(proc.stdout)
    try:
        assert "ready" in await out.line_with("ready:", 10, "the child to start")
        with pytest.raises(waits.BenchTimeout, match=r"(?s)the child to lead.*ready: x"):
            await out.line_with("leading:", 0.2, "the child to lead")
    finally:
        await waits.stop_process(proc, "the child", grace=5)
        await out.close()
    assert proc.returncode is not None
