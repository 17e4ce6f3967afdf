"""Round-three attacks on the embedded API server's CEL metering that got past it.

The runtime meter charged each operation one unit plus the size of what it created,
after it ran. Two kinds of operation escaped it:

* one call whose work grows with the product or the depth of its operands:
  ``sets.intersects`` of two 5,000-item lists (25 million comparisons in one call,
  charged one unit; 13 s past a 0.5 s deadline), and equality or ``join`` on lists of
  lists that share one another (``[a, a, ...]`` nested six deep is a million leaves
  built by a few hundred units of literals; 12 s and hundreds of megabytes);
* the DeviceTaintRule eviction stand-in evaluated rule selectors on the event loop,
  one device after another, so costly rules stalled the whole server.

Every operation is now charged what it will scan *before* it runs (deep sizes for
lists and maps, the product for the ``sets`` functions), long library calls look at
the meter as they build, and the eviction stand-in evaluates selectors in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest

from drahealth._cel_k8s import (
    CELCompileError,
    CELRuntimeError,
    compile_selector,
    device_value,
)

pytestmark = pytest.mark.timeout(60)

DEVICE = device_value("gpu.example.com", {"gpu.example.com": {"model": "a100"}}, {})


def _doubled(var: str, times: int) -> tuple[str, int]:
    """``cel.bind`` chain binding ``var`` to 'xxxxxxxxxx' doubled ``times`` times; the
    size is hidden from the static estimate behind ``dyn``."""
    text = f"cel.bind({var}0, 'xxxxxxxxxx', "
    for i in range(1, times + 1):
        text += f"cel.bind({var}{i}, {var}{i - 1} + {var}{i - 1}, "
    return text, times + 1


def _shared_lists(var: str, depth: int) -> str:
    """``var<depth>``: ten references to ``var<depth-1>``, ``depth`` levels deep."""
    text = f"cel.bind({var}0, [1, 2], "
    for i in range(1, depth + 1):
        text += f"cel.bind({var}{i}, [" + ", ".join([f"{var}{i - 1}"] * 10) + "], "
    return text


def _stops_fast(expr: str, limit: float = 5.0) -> str:
    """Compile (it must pass the static estimate), evaluate with a 0.5 s deadline, and
    return the runtime error; the evaluation must end well within ``limit``."""
    selector = compile_selector(expr)
    start = time.monotonic()
    with pytest.raises(CELRuntimeError) as err:
        selector.matches(DEVICE, deadline=time.monotonic() + 0.5)
    elapsed = time.monotonic() - start
    assert elapsed < limit, f"one evaluation ran {elapsed:.1f} s past a 0.5 s deadline"
    return str(err.value)


def test_sets_intersects_of_two_long_lists_is_charged_the_product() -> None:
    prefix, binds = _doubled("s", 9)  # 5,120 characters, split into 5,120 items each
    expr = (
        prefix + "cel.bind(l, dyn(s9).split(''), "
        "cel.bind(m, dyn(s9).replace('x', 'y').split(''), !sets.intersects(l, m)))" + ")" * binds
    )
    assert "cancelled" in _stops_fast(expr)


def test_equality_and_join_of_shared_nested_lists_are_charged_their_depth() -> None:
    depth = 6  # a million leaves each side, from a few hundred units of literals
    expr = (
        _shared_lists("a", depth)
        + _shared_lists("b", depth)
        + f"a{depth} == b{depth} && [[a{depth}].join()].size() > 0"
        + ")" * (2 * (depth + 1))
    )
    assert "cancelled" in _stops_fast(expr)


def test_join_takes_only_a_list_of_strings() -> None:
    with pytest.raises(CELRuntimeError, match="no such overload"):
        compile_selector("[[1, 2]].join() == '[1, 2]'").matches(DEVICE)
    assert compile_selector("['a', 'b'].join('-') == 'a-b'").matches(DEVICE)


def test_long_split_looks_at_the_deadline_while_it_builds() -> None:
    prefix, binds = _doubled("s", 16)  # 655,360 characters: one split, 655,360 items
    expr = prefix + "dyn(s16).split('').size() > 0" + ")" * binds
    _stops_fast(expr, limit=2.0)


def test_sets_functions_are_estimated_at_the_product_of_their_lists() -> None:
    big = "'" + "x" * 1100 + "'.split('')"  # 1,101 items at most
    with pytest.raises(CELCompileError, match="too complex"):
        compile_selector(f"sets.intersects({big}, {big})")
    assert compile_selector("sets.contains([1, 2, 3], [2])").matches(DEVICE)


# -- DeviceTaintRule selectors off the event loop -----------------------------------


class _Claim:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def to_dict(self) -> dict[str, Any]:
        return self.body


class _Store:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def dicts(self) -> list[dict[str, Any]]:
        return self.items

    def get(self, namespace: str, name: str) -> Any:
        for o in self.items:
            if o["metadata"]["name"] == name and o["metadata"].get("namespace") == namespace:
                return _Claim(o)
        return None


def _slow_rule_selector() -> str:
    """Within the static estimate; each evaluation runs to the 0.5 s deadline."""
    prefix, binds = _doubled("s", 14)  # 163,840 items to walk
    return prefix + "dyn(s14).split('').all(x, x == 'x' && x != 'y')" + ")" * binds


async def test_eviction_stand_in_evaluates_rule_selectors_off_the_event_loop() -> None:
    from drahealth.core import kube_profile
    from drahealth.standins._taint_eviction import TaintEvictionStandIn

    devices = 6

    class _Client:
        _client = None

    stand_in = TaintEvictionStandIn(_Client(), kube_profile("1.34", {"DRADeviceTaints": True}))  # type: ignore[arg-type]
    assert stand_in.rules is not None, "the 1.34 profile serves rules with CEL selectors"
    pods, claims = [], []
    for i in range(devices):
        pods.append({
            "metadata": {"name": f"p{i}", "namespace": "default"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": f"c{i}"}]},
            "status": {"phase": "Running"},
        })  # fmt: skip
        claims.append({
            "metadata": {"name": f"c{i}", "namespace": "default"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": f"g{i}"}
            ]}}},
        })  # fmt: skip
    rule = {
        "metadata": {"name": "slow"},
        "spec": {
            "deviceSelector": {"selectors": [{"cel": {"expression": _slow_rule_selector()}}]},
            "taint": {"key": "k", "value": "v", "effect": "NoExecute"},
        },
    }
    stand_in.pods.store = _Store(pods)  # type: ignore[assignment]
    stand_in.claims.store = _Store(claims)  # type: ignore[assignment]
    stand_in.slices.store = _Store([])  # type: ignore[assignment]
    stand_in.rules.store = _Store([rule])  # type: ignore[assignment]
    if stand_in.classes is not None:
        stand_in.classes.store = _Store([])  # type: ignore[assignment]
    stand_in.rule_status = False

    gaps: list[float] = []
    done = threading.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    start = time.monotonic()
    try:
        await asyncio.wait_for(stand_in.pass_once(), timeout=30)
    finally:
        done.set()
        await ticker
    took = time.monotonic() - start
    assert took >= 0.4 * devices / 2, "the selector was meant to take its deadline per device"
    assert max(gaps) < 1.0, f"the event loop stalled {max(gaps):.1f} s in one pass"


# -- watch slots: made-up identities ------------------------------------------------

_CMS = "/api/v1/namespaces/default/configmaps"


async def _watch_as(
    port: int, agent: str
) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {_CMS}?watch=1 HTTP/1.1\r\nHost: localhost\r\nUser-Agent: {agent}\r\n\r\n".encode()
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
    return int(head.split(b" ", 2)[1]), reader, writer


@pytest.mark.parametrize("agents", [3, 40], ids=["three-agents", "one-agent-per-watch"])
async def test_made_up_user_agents_cannot_take_every_watch(agents: int) -> None:
    from drahealth._http_guard import HTTPLimits
    from drahealth.controlplane import APIServer

    server = APIServer(bookmark_interval=60.0, limits=HTTPLimits(max_connections=40))
    await server.start()
    held: list[tuple[int, asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        total = server.watch_slots.total
        for i in range(total + 5):  # one party, cycling through made-up User-Agents
            held.append(await _watch_as(server.port, f"evil/{i % agents}"))
        assert server.watch_slots.active == total
        # Someone else still gets a watch: one of the party's ends to make room.
        code, _r, w = await _watch_as(server.port, "kubectl/v1.34")
        held.append((code, _r, w))
        assert code == 200, "a made-up identity locked every other client out of watches"
        # The watch ended for it closes cleanly (the chunked stream's last chunk).
        ended = 0
        for code, reader, _w in held[:-1]:
            if code != 200:
                continue
            data = b""
            with contextlib.suppress(TimeoutError):
                while b"0\r\n\r\n" not in data:
                    chunk = await asyncio.wait_for(reader.read(65536), 0.1)
                    if not chunk:
                        break
                    data += chunk
            ended += b"0\r\n\r\n" in data
            if ended:
                break
        assert ended >= 1
        assert server.watch_slots.active <= total
    finally:
        for _c, _r, w in held:
            w.close()
        await server.stop()
