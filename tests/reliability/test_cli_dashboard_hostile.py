"""The CLI and the dashboard against hostile API data and an API they cannot reach.

Device messages, names and records come from objects that drivers, agents, kubelets and
tenants write. These tests write hostile ones into the embedded API server (the scenario
of ``tests/integration/cli/test_views.py``) and check that:

* rich markup (``[/dev/nvidia0]``, ``[link=...]``) and terminal escape sequences are shown
  as plain text, never interpreted, and never crash ``status``/``pods``;
* a record's ``since`` of ``1e999`` or NaN is skipped for that row with a warning, and
  everything the CLI and dashboard print or serve stays valid JSON;
* device-health ConfigMaps outside the agent's namespace, or not named and labelled as
  the agent writes them, are ignored (``--agent-namespace`` picks the namespace);
* every one-shot command and the dashboard, run as real subprocesses against a closed
  port or a kubeconfig whose certificate authority is missing, print one ``error:`` line
  and exit 1;
* an event-stream client that never reads is disconnected instead of growing the
  dashboard, while a reading client keeps getting updates;
* with a token, a mutating request that is not ``application/json`` is refused (415)
  even when it carries the cookie.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod
from lightkube.resources.resource_v1 import DeviceTaintRule
from lightkube.types import PatchType

from drahealth._text import printable
from drahealth.controlplane import APIServer
from drahealth.web import Dashboard
from tests.integration.cli.test_views import NODE, D, run, scenario
from tests.integration.kube.conftest import api_server_options, client, eventually

__all__ = ["api_server_options", "client"]

RECORD = f"drahealth-devices-{NODE}"
HOSTILE = (
    "[/dev/nvidia0] failed [link=https://evil.example/]click[/link] [bold red]x"
    "\x1b[2J\x1b]8;;https://evil.example/\x07here\x1b]8;;\x07\x9b31m\x07\x08\r\nnext"
)
TOKEN = "s3cret-token-0123456789"


def _strict(text: str) -> Any:
    """json.loads that refuses NaN/Infinity, as a browser's JSON.parse does."""

    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


async def _set_rows(client: AsyncClient, change: dict[str, dict[str, Any]], raw: str = "") -> None:
    """Patch the agent's record: ``change`` maps device -> fields; ``raw`` replaces text."""
    cm = await client.get(ConfigMap, RECORD, namespace="default")
    rows = json.loads((cm.data or {})["devices"])
    for row in rows:
        row.update(change.get(row["device"], {}))
    text = raw or json.dumps(rows)
    await client.patch(
        ConfigMap, RECORD, {"data": {"devices": text}}, namespace="default",
        patch_type=PatchType.MERGE,
    )  # fmt: skip


@pytest.fixture
async def kubeconfig(server: APIServer, client: AsyncClient, tmp_path: Path) -> str:
    await scenario(client)
    return str(server.write_kubeconfig(tmp_path / "kubeconfig"))


# -- 9: markup, escape sequences, non-finite numbers ------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("[/dev/nvidia0] XID 79", "[/dev/nvidia0] XID 79"),
        ("\x1b[31mred\x1b[0m", "red"),
        ("\x1b]8;;https://x/\x07link\x1b]8;;\x1b\\", "link"),
        ("\x9b2Jclear", "clear"),
        ("a\nb\tc\r\x00d\x7f\x85e", "a b c d e"),
        ("\u202egnp.exe", "gnp.exe"),
        ("ÜTF-8 ✓ 名前", "ÜTF-8 ✓ 名前"),
    ],
)
def test_printable_removes_sequences_and_controls_and_keeps_text(raw: str, shown: str) -> None:
    assert printable(raw) == shown


@pytest.mark.slow  # 8-11 s on 2 cores: the default run stays under 15 min
async def test_markup_and_escape_sequences_are_shown_as_plain_text(
    kubeconfig: str, client: AsyncClient
) -> None:
    await _set_rows(client, {"gpu-1": {"message": HOSTILE}})
    pod = await client.get(Pod, "train", namespace="ml")
    status = pod.to_dict()["status"]
    status["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0]["message"] = (
        HOSTILE
    )
    await client.patch(
        Pod.Status, "train", {"status": status}, namespace="ml", patch_type=PatchType.MERGE
    )
    for command, code in (("status", 3), ("pods", 3)):  # ml/train's device is Unhealthy
        for output in ("table", "wide"):
            out = await asyncio.to_thread(
                run, command, "-A", "--kubeconfig", kubeconfig, "-o", output
            )
            assert out.returncode == code, (command, output, out.stderr)
            assert "Traceback" not in out.stderr, out.stderr
            assert "[/dev/nvidia0] failed [link=https://evil.example/]click[/link]" in out.stdout
            assert "[bold red]x" in out.stdout
            assert not any(c in out.stdout for c in "\x1b\x9b\x07\x08\r"), repr(out.stdout)
            assert "xhere" in out.stdout and "next" in out.stdout, out.stdout
        # JSON keeps the message exactly, escaped: no raw control byte reaches the terminal
        out = await asyncio.to_thread(run, command, "-A", "--kubeconfig", kubeconfig, "-o", "json")
        assert out.returncode == code, out.stderr
        assert not any(c in out.stdout for c in "\x1b\x9b\x07"), repr(out.stdout)
        assert HOSTILE in [r["message"] for r in _strict(out.stdout)]


async def test_a_non_finite_since_is_skipped_per_row_with_a_warning(
    kubeconfig: str, client: AsyncClient
) -> None:
    cm = await client.get(ConfigMap, RECORD, namespace="default")
    text = (cm.data or {})["devices"]
    rows = json.loads(text)
    rows[1]["since"], rows[2]["since"] = "@INF@", "@NAN@"  # gpu-1, gpu-2
    raw = json.dumps(rows).replace('"@INF@"', "1e999").replace('"@NAN@"', "NaN")
    await _set_rows(client, {}, raw=raw)

    out = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig, "-o", "json")
    assert out.returncode == 3 and "Traceback" not in out.stderr, out.stderr
    got = {r["device"].rpartition("/")[2]: r["since"] for r in _strict(out.stdout)}
    assert got["gpu-1"] is None and got["gpu-2"] is None
    assert f"{D}/{NODE}/gpu-1" in out.stderr and "not finite" in out.stderr, out.stderr
    table = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig)
    assert table.returncode == 3 and "XID 79" in table.stdout, table.stderr
    assert "Unhealthy   <unknown>   XID 79" in table.stdout, table.stdout

    dashboard = Dashboard(client)
    url = await dashboard.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "api/state") as resp:
                state = _strict(await resp.text())
            async with http.get(url + "api/events") as stream:
                first = await asyncio.wait_for(_next_event(stream), 5)
        devices = {d["device"]: d for d in state["nodes"][0]["devices"]}
        assert devices["gpu-1"]["since"] is None and devices["gpu-1"]["health"] == "Unhealthy"
        assert isinstance(devices["gpu-0"]["since"], float)
        assert _strict(first) == state
    finally:
        await dashboard.stop()


# -- 10: only the agent's own records --------------------------------------------------


async def test_health_records_not_written_by_the_agent_are_ignored(
    kubeconfig: str, client: AsyncClient
) -> None:
    labels = {
        "app.kubernetes.io/component": "device-health",
        "app.kubernetes.io/managed-by": "drahealth-agent",
        "drahealth.io/node": NODE,
    }
    fake = [{"driver": D, "pool": NODE, "device": "gpu-0", "health": "Unhealthy",
             "message": "FAKE", "since": 1.0}]  # fmt: skip
    await client.create(Namespace.from_dict({"metadata": {"name": "tenant"}}))
    for namespace, name in (("tenant", RECORD), ("default", "not-the-agents-name")):
        await client.create(
            ConfigMap.from_dict(
                {
                    "metadata": {"name": name, "namespace": namespace, "labels": labels},
                    "data": {"devices": json.dumps(fake)},
                }
            )
        )
    out = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig, "-o", "json")
    assert out.returncode == 3, out.stderr
    assert "FAKE" not in out.stdout and f"{D}/{NODE}/gpu-0" not in out.stdout

    dashboard = Dashboard(client)
    url = await dashboard.start()
    try:
        async with aiohttp.ClientSession() as http, http.get(url + "api/state") as resp:
            devices = {d["device"]: d for d in (await resp.json())["nodes"][0]["devices"]}
        assert (devices["gpu-0"]["health"], devices["gpu-0"]["message"]) == ("Healthy", "")
        assert devices["gpu-1"]["message"] == "XID 79"  # the agent's record is still read
    finally:
        await dashboard.stop()

    # an agent deployed with --namespace tenant: the readers follow --agent-namespace
    out = await asyncio.to_thread(
        run, "status", "-A", "--kubeconfig", kubeconfig, "--agent-namespace", "tenant", "-o", "json"
    )
    gpu0 = next(r for r in _strict(out.stdout) if r["device"] == f"{D}/{NODE}/gpu-0")
    assert (gpu0["health"], gpu0["message"]) == ("Unhealthy", "FAKE")


# -- 11: one line and exit 1 when the API is out of reach ------------------------------

COMMANDS = [
    ["status"],
    ["pods"],
    ["history", f"{D}/{NODE}/gpu-1"],
    ["taint", f"{D}/{NODE}/gpu-1", "--key", "example.com/m", "--effect", "NoSchedule"],
    ["untaint", f"{D}/{NODE}/gpu-1", "--key", "example.com/m"],
    ["dashboard", "--port", "0"],
]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # nothing listens there now


def _kubeconfig(path: Path, server: str, ca: str | None = None) -> str:
    cluster: dict[str, Any] = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = ca
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }  # fmt: skip
    path.write_text(json.dumps(doc))
    return str(path)


def _run_module(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drahealth", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("problem", ["closed-port", "missing-ca"])
def test_every_command_says_in_one_line_what_failed(problem: str, tmp_path: Path) -> None:
    server = f"https://127.0.0.1:{_closed_port()}"
    if problem == "closed-port":
        kubeconfig = _kubeconfig(tmp_path / "kubeconfig", server)
        expected = f"error: cannot reach the API server at {server}: connection refused"
    else:
        ca = str(tmp_path / "missing" / "ca.crt")
        kubeconfig = _kubeconfig(tmp_path / "kubeconfig", server, ca)
        expected = f"error: kubeconfig {kubeconfig}: certificate-authority file {ca} not found"
    with ThreadPoolExecutor(len(COMMANDS)) as pool:
        results = list(
            pool.map(_run_module, [[*cmd, "--kubeconfig", kubeconfig] for cmd in COMMANDS])
        )
    for cmd, out in zip(COMMANDS, results, strict=True):
        assert out.returncode == 1, (cmd, out.returncode, out.stderr)
        assert out.stderr.splitlines() == [out.stderr.strip()], (cmd, out.stderr)
        assert out.stderr.startswith(expected), (cmd, out.stderr)
        assert "cannot serve on" not in out.stderr and out.stdout == "", (cmd, out.stdout)


async def test_the_dashboard_blames_the_listen_address_only_when_it_is_taken(
    kubeconfig: str,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = await asyncio.to_thread(
            _run_module, ["dashboard", "--kubeconfig", kubeconfig, "--port", str(port)]
        )
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip() == f"error: cannot serve on 127.0.0.1:{port}: address already in use"


# -- weaknesses: slow stream consumers, content type -------------------------------------


async def _next_event(stream: aiohttp.ClientResponse) -> str:
    data = ""
    async for raw in stream.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            data = line[len("data: ") :]
        elif line == "" and data:
            return data
    raise AssertionError("the stream ended")


async def test_a_client_that_never_reads_its_event_stream_is_disconnected(
    client: AsyncClient,
) -> None:
    await scenario(client)
    dashboard = Dashboard(client)
    dashboard.stream_queue = 2
    url = await dashboard.start()
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        stuck.connect((host, int(port)))
        request = f"GET /api/events HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
        stuck.sendall(request.encode())  # and never reads
        await eventually(lambda: len(dashboard._subscribers) == 1, 5)
        async with aiohttp.ClientSession() as http, http.get(url + "api/events") as reader:
            await asyncio.wait_for(_next_event(reader), 5)
            big = "E" * 100_000  # each state is ~100 KB: the stuck client's buffers fill
            n = 0
            while dashboard.slow_streams_closed == 0:
                assert n < 200, "a client that never reads was never disconnected"
                n += 1
                await _set_rows(client, {"gpu-0": {"message": f"{n} {big}"}})
                pushed = _strict(await asyncio.wait_for(_next_event(reader), 5))
                gpu0 = next(d for d in pushed["set"] if d["device"] == "gpu-0")
                assert gpu0["message"].startswith(f"{n} "), "the reading client fell behind"
            assert len(dashboard._subscribers) == 1  # the reader stays
        stuck.settimeout(10)
        while stuck.recv(1 << 20):  # the server closed the connection: reading ends
            pass
    finally:
        stuck.close()
        await dashboard.stop()


async def test_mutations_need_a_json_content_type_even_with_the_cookie(
    client: AsyncClient,
) -> None:
    await scenario(client)
    dashboard = Dashboard(client, token=TOKEN)
    url = await dashboard.start()
    body = json.dumps({"device": f"{D}/{NODE}/gpu-0", "key": "example.com/m",
                       "effect": "NoSchedule"})  # fmt: skip
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
            async with browser.get(url, params={"token": TOKEN}) as resp:
                assert resp.status == 200  # the cookie is set
            for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
                async with browser.post(
                    url + "api/taint", data=body, headers={"Content-Type": kind}
                ) as resp:
                    assert resp.status == 415, (kind, await resp.text())
                    assert "application/json" in (await resp.json())["error"]
            assert [r async for r in client.list(DeviceTaintRule)
                    if r.spec and r.spec.deviceSelector.device == "gpu-0"] == []  # fmt: skip
            async with browser.post(
                url + "api/taint", data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                assert resp.status == 200 and (await resp.json())["outcome"] == "created"
    finally:
        await dashboard.stop()
