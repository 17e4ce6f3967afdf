"""The fault-injection control socket: protocol rules, hub effects, malformed input."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from drahealth.core import Health
from drahealth.driver import (
    INJECT_SOURCE,
    ControlError,
    ControlServer,
    control_socket_path,
)
from drahealth.driver import control_request as request
from drahealth.driver._control import MAX_LINE_BYTES, handle_line, handle_request
from drahealth.driver._hub import DeviceReport, HealthHub

pytestmark = pytest.mark.timeout(10)

POOL = "node-1"
DEVICES = [(POOL, f"gpu-{i}") for i in range(4)]


@pytest.fixture
def hub() -> HealthHub:
    h = HealthHub(DEVICES)
    h.submit("sim", [DeviceReport(p, d, Health.HEALTHY) for p, d in DEVICES])
    return h


@pytest.fixture
def state_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(dir="/tmp", prefix="ctl-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def server(hub: HealthHub, state_dir: str) -> AsyncIterator[ControlServer]:
    srv = ControlServer(hub, control_socket_path(state_dir))
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


# --------------------------------------------------------------------------- protocol


def test_unhealthy_is_fatal_from_inject_and_latched(hub: HealthHub) -> None:
    reply = handle_request(hub, {"action": "unhealthy", "device": "gpu-1", "message": "xid 79"})
    assert reply == {
        "ok": True,
        "device": "node-1/gpu-1",
        "health": "Unhealthy",
        "message": "xid 79",
        "sticky": True,
        "silenced": False,
    }
    state = hub.state(POOL, "gpu-1")
    assert dict(state.sources) == {INJECT_SOURCE: Health.UNHEALTHY, "sim": Health.HEALTHY}
    # the simulated source's heartbeat does not clear it
    hub.submit("sim", [DeviceReport(POOL, "gpu-1", Health.HEALTHY)])
    assert hub.state(POOL, "gpu-1").health is Health.UNHEALTHY


def test_default_fault_message(hub: HealthHub) -> None:
    assert handle_request(hub, {"action": "unhealthy", "device": "node-1/gpu-0"})["message"] == (
        "injected fault"
    )


def test_healthy_recovers_every_latch_and_clears_inject(hub: HealthHub) -> None:
    hub.submit("prepare", [DeviceReport(POOL, "gpu-2", Health.UNHEALTHY, "init failed")])
    handle_request(hub, {"action": "unknown", "device": "gpu-2"})
    assert hub.state(POOL, "gpu-2").health is Health.UNHEALTHY
    reply = handle_request(hub, {"action": "healthy", "device": "gpu-2"})
    assert (reply["health"], reply["sticky"], reply["message"]) == ("Healthy", False, "")
    assert dict(hub.state(POOL, "gpu-2").sources)[INJECT_SOURCE] is Health.HEALTHY


def test_unknown(hub: HealthHub) -> None:
    reply = handle_request(hub, {"action": "unknown", "device": "gpu-3", "message": "probe lost"})
    assert (reply["health"], reply["message"], reply["sticky"]) == ("Unknown", "probe lost", False)


def test_silence_and_resume_toggle_the_hub(hub: HealthHub) -> None:
    assert handle_request(hub, {"action": "silence", "device": "gpu-0"})["silenced"] is True
    assert hub.silenced
    assert handle_request(hub, {"action": "resume", "device": "*"}) == {
        "ok": True,
        "silenced": False,
    }
    assert not hub.silenced
    assert handle_request(hub, {"action": "silence"})["ok"] and hub.silenced
    # an unknown device is refused and nothing changes
    assert not handle_request(hub, {"action": "resume", "device": "gpu-9"})["ok"]
    assert hub.silenced


def test_status(hub: HealthHub) -> None:
    reply = handle_request(hub, {"action": "status"})
    assert reply["ok"] and reply["streams"] == 0
    assert [d["device"] for d in reply["devices"]] == [f"{p}/{d}" for p, d in DEVICES]
    assert handle_request(hub, {"action": "status", "device": "gpu-0"})["health"] == "Healthy"


def test_ambiguous_device_name_needs_the_pool() -> None:
    hub = HealthHub([("a", "gpu-0"), ("b", "gpu-0")])
    reply = handle_request(hub, {"action": "unknown", "device": "gpu-0"})
    assert reply == {
        "ok": False,
        "error": "device name 'gpu-0' is ambiguous (pools a, b); use POOL/DEVICE",
    }
    assert handle_request(hub, {"action": "unknown", "device": "b/gpu-0"})["ok"]


@pytest.mark.parametrize(
    ("req", "error"),
    [
        ([], "request must be a JSON object, got list"),
        ("unhealthy", "request must be a JSON object, got str"),
        ({}, "missing field 'action'"),
        ({"device": "gpu-0"}, "missing field 'action'"),
        ({"action": "unhealthy"}, "missing field 'device' (needed by action 'unhealthy')"),
        ({"action": "reboot", "device": "gpu-0"}, "unknown action 'reboot'; expected one of"),
        ({"action": 3, "device": "gpu-0"}, "unknown action 3"),
        ({"action": "unhealthy", "device": ""}, "field 'device' must be a non-empty string"),
        ({"action": "unhealthy", "device": 7}, "field 'device' must be a non-empty string"),
        ({"action": "unhealthy", "device": "gpu-0", "message": 1}, "'message' must be a string"),
        (
            {"action": "unhealthy", "device": "gpu-0", "force": True},
            "unknown field(s) in request: force",
        ),
        ({"action": "unhealthy", "device": "gpu-7"}, "unknown device 'gpu-7'"),
        ({"action": "unhealthy", "device": "node-2/gpu-0"}, "unknown device 'node-2/gpu-0'"),
    ],
)
def test_bad_requests_get_an_error_and_change_nothing(hub: HealthHub, req: Any, error: str) -> None:
    version = hub.version
    reply = handle_request(hub, req)
    assert reply["ok"] is False
    assert error in reply["error"]
    assert hub.version == version


@pytest.mark.parametrize("line", [b"{", b"not json\n", b"\xff\xfe\n", b'{"action": "silence"'])
def test_bad_json(hub: HealthHub, line: bytes) -> None:
    reply = handle_line(hub, line)
    assert reply["ok"] is False and reply["error"].startswith("request is not valid JSON")


# --------------------------------------------------------------------------- over the socket


def exists(path: str) -> bool:
    return os.path.lexists(path)


def read_text(path: str) -> str:
    return Path(path).read_text()


def write_text(path: str, text: str) -> None:
    Path(path).write_text(text)


async def converse(path: str, *lines: bytes) -> list[dict[str, Any]]:
    reader, writer = await asyncio.open_unix_connection(path, limit=4 * MAX_LINE_BYTES)
    try:
        out = []
        for line in lines:
            writer.write(line)
            await writer.drain()
            out.append(json.loads(await reader.readline()))
        return out
    finally:
        writer.close()
        await writer.wait_closed()


async def test_socket_is_private_and_serves_many_requests_per_connection(
    server: ControlServer, hub: HealthHub
) -> None:
    assert stat.S_IMODE(os.lstat(server.path).st_mode) == 0o600
    replies = await converse(
        server.path,
        b'{"action": "unhealthy", "device": "gpu-0"}\n',
        b"garbage\n",
        b'{"action": "bogus"}\n',
        b'{"action": "status", "device": "gpu-0"}\n',
    )
    assert [r["ok"] for r in replies] == [True, False, False, True]
    assert replies[3]["health"] == "Unhealthy"


async def test_huge_line_gets_an_error_and_the_server_lives_on(
    server: ControlServer, hub: HealthHub
) -> None:
    reader, writer = await asyncio.open_unix_connection(server.path)
    writer.write(b'{"action": "unhealthy", "device": "gpu-0", "message": "' + b"x" * 100_000)
    await writer.drain()
    reply = json.loads(await reader.readline())
    assert reply == {"ok": False, "error": f"request line longer than {MAX_LINE_BYTES} bytes"}
    assert await reader.read() == b""  # the connection is closed
    writer.close()
    assert hub.state(POOL, "gpu-0").health is Health.HEALTHY
    # a fresh connection works
    [ok] = await converse(server.path, b'{"action": "unknown", "device": "gpu-0"}\n')
    assert ok["health"] == "Unknown"


async def test_abrupt_disconnects_do_not_hurt(server: ControlServer) -> None:
    for payload in (b"", b'{"action": "unhe', b"\n\n\n"):
        _, writer = await asyncio.open_unix_connection(server.path)
        writer.write(payload)
        writer.close()
        await writer.wait_closed()
    reply = await request(server.path, "status")
    assert reply["ok"]


async def test_client_reports_driver_errors(server: ControlServer, hub: HealthHub) -> None:
    reply = await request(server.path, "unhealthy", "node-1/gpu-1", "boom")
    assert reply["health"] == "Unhealthy" and hub.state(POOL, "gpu-1").message == "boom"
    with pytest.raises(ControlError, match="unknown device 'gpu-9'"):
        await request(server.path, "unhealthy", "gpu-9")
    with pytest.raises(ControlError, match="unknown action 'explode'"):
        await request(server.path, "explode", "gpu-1")


async def test_client_without_driver(state_dir: str) -> None:
    path = control_socket_path(state_dir)
    with pytest.raises(
        ControlError,
        match=r"no control socket at .*is the driver running with this state directory",
    ):
        await request(path, "silence")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()
    with pytest.raises(ControlError, match="the driver is not running: nobody listens on"):
        await request(path, "silence")


async def test_start_replaces_a_stale_socket_and_close_removes_it(
    hub: HealthHub, state_dir: str
) -> None:
    path = control_socket_path(state_dir)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()
    srv = ControlServer(hub, path)
    await srv.start()
    assert (await request(path, "status"))["ok"]
    await srv.close()
    assert not exists(path)
    await srv.close()  # idempotent


async def test_close_leaves_a_newer_instances_socket(hub: HealthHub, state_dir: str) -> None:
    path = control_socket_path(state_dir)
    old, new = ControlServer(hub, path), ControlServer(hub, path)
    await old.start()
    await new.start()  # takes over (rolling update: the newest instance wins)
    await old.close()
    assert (await request(path, "status"))["ok"]
    await new.close()
    assert not exists(path)


async def test_refuses_to_replace_a_regular_file(hub: HealthHub, state_dir: str) -> None:
    path = control_socket_path(state_dir)
    write_text(path, "precious")
    with pytest.raises(FileExistsError, match="it exists and is not a unix socket"):
        await ControlServer(hub, path).start()
    assert read_text(path) == "precious"
