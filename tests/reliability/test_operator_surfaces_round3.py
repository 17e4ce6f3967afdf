"""Operator surfaces, round three: dashboard actions and streams, CLI parsing,
kubeconfig loading, the provenance of Events and the policy loader.

Each test attacks one surface with the input a hostile tenant, a broken file or a
careless script would give it, and checks the bound holds with a clear error:

* the dashboard's ``POST /api/taint`` refuses a device no ResourceSlice publishes (a
  10,000-character name, ``a/b/c/d/e``), as ``drahealth taint`` does;
* hundreds of event-stream readers never lock the operator out of a stream, the page,
  ``/api/state`` or ``/healthz``; non-UTF-8 bytes in the token give 401;
* ``-o custom-columns=`` with many quotes ends at once with a usage error;
* a kubeconfig nested thousands deep, ``tokenFile: /dev/zero`` or a hanging exec plugin
  end in one ``error:`` line; exec credentials (v1 and v1beta1) work;
* Events a tenant writes with the controller's name are not read as the controller's;
* a policy with an alias bomb, deep nesting, too many bytes or too many rules is refused
  with an error naming the bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace
from lightkube.resources.resource_v1 import DeviceTaintRule

from drahealth.controlplane import APIServer
from drahealth.core import PolicyError
from drahealth.kube import KubeConfigError, load_config
from drahealth.remedy import parse_policy
from drahealth.web import Dashboard
from tests.integration.cli.test_views import NODE, D, run, scenario
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

TOKEN = "s3cret-token-0123456789"
CONTROLLER = "drahealth-controller"


def _run_module(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drahealth", *args], capture_output=True, text=True,
        timeout=60, check=False, env={**os.environ, **env},
    )  # fmt: skip


def _one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.stderr.splitlines() == [out.stderr.strip()], out.stderr
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr, out.stderr
    return out.stderr.strip()


# -- bug 13: the dashboard taints only devices a ResourceSlice publishes -----------------


async def test_dashboard_taint_refuses_devices_nobody_publishes(client: AsyncClient) -> None:
    await scenario(client)
    dashboard = Dashboard(client, token=TOKEN)
    url = await dashboard.start()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    before = [r async for r in client.list(DeviceTaintRule)]
    try:
        async with aiohttp.ClientSession(headers=auth) as http:
            for device in (f"{D}/{NODE}/" + "g" * 10_000, "a/b/c/d/e", f"{D}/{NODE}/gpu-9"):
                body = {"device": device, "key": "example.com/m", "effect": "NoSchedule"}
                async with http.post(url + "api/taint", json=body) as resp:
                    assert resp.status == 400, (device[:40], resp.status, await resp.text())
                    error = (await resp.json())["error"]
                    assert "no ResourceSlice publishes" in error or "device" in error, error
            assert [r async for r in client.list(DeviceTaintRule)] == before
            body = {"device": f"{D}/{NODE}/gpu-0", "key": "example.com/m", "effect": "NoSchedule"}
            async with http.post(url + "api/taint", json=body) as resp:
                assert resp.status == 200, await resp.text()
    finally:
        await dashboard.stop()


# -- dashboard: event streams, tokens that are not UTF-8 ---------------------------------


async def _open_stream(host: str, port: int, token: str) -> asyncio.StreamWriter:
    _reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"GET /api/events HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    await writer.drain()
    return writer


async def test_many_event_stream_readers_never_lock_the_operator_out(
    client: AsyncClient,
) -> None:
    await scenario(client)
    dashboard = Dashboard(client, token=TOKEN)
    url = await dashboard.start()
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    writers: list[asyncio.StreamWriter] = []
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        for _ in range(260):
            writers.append(await _open_stream(host, int(port), TOKEN))
        await asyncio.sleep(0.5)
        async with aiohttp.ClientSession(headers=auth) as http:
            async with http.get(url + "healthz") as resp:
                assert resp.status == 200
            async with http.get(url + "api/state") as resp:
                assert resp.status == 200, await resp.text()
            async with http.get(url) as resp:
                assert resp.status == 200
            async with http.get(url + "api/events") as stream:
                assert stream.status == 200, await stream.text()
                line = await asyncio.wait_for(stream.content.readline(), 10)
                assert line.startswith(b"event: state")
        assert len(dashboard._subscribers) <= 64
    finally:
        for w in writers:
            w.close()
        await dashboard.stop()


@pytest.mark.parametrize(
    "header", [b"Authorization: Bearer \xff\xfe\x80token", b"Cookie: drahealth_token=\xff\xfe"]
)
async def test_a_token_that_is_not_utf8_is_refused_with_401(
    client: AsyncClient, header: bytes
) -> None:
    await scenario(client)
    dashboard = Dashboard(client, token=TOKEN)
    url = await dashboard.start()
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"GET /api/state HTTP/1.1\r\nHost: " + f"{host}:{port}".encode() + b"\r\n"
            + header + b"\r\nConnection: close\r\n\r\n"
        )  # fmt: skip
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    finally:
        await dashboard.stop()


# -- CLI: custom-columns, kubeconfig files, exec credentials ------------------------------


def test_custom_columns_with_many_quotes_end_at_once_with_a_usage_error() -> None:
    spec = "custom-columns=A:.a[" + "'" * 40 + ",B:" + '"' * 41
    out = _run_module(["status", "--kubeconfig", "/nonexistent/kubeconfig", "-o", spec])
    assert out.returncode == 2, out.stderr
    assert "custom-columns" in out.stderr and "Traceback" not in out.stderr


def _config(path: Path, user: dict[str, Any], server: str = "https://127.0.0.1:1") -> str:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }  # fmt: skip
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_kubeconfig_nested_thousands_deep_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("a: " + "[" * 3000 + "]" * 3000 + "\n")
    out = _run_module(["status", "--kubeconfig", str(path)])
    assert out.returncode == 2, out.stderr
    assert "nest" in _one_error_line(out)


def test_a_token_file_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    kubeconfig = _config(tmp_path / "kubeconfig", {"tokenFile": "/dev/zero"})
    out = _run_module(["status", "--kubeconfig", kubeconfig])
    assert out.returncode == 2, out.stderr
    assert "/dev/zero" in _one_error_line(out) and "regular file" in out.stderr
    big = tmp_path / "big-token"
    with open(big, "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB that take no disk
    with pytest.raises(KubeConfigError, match=r"big-token.*larger than"):
        load_config(_config(tmp_path / "kc2", {"tokenFile": str(big)}))
    ca = _config(tmp_path / "kc3", {"token": "t"})
    doc = json.loads(Path(ca).read_text())
    doc["clusters"][0]["cluster"]["certificate-authority"] = "/dev/zero"
    Path(ca).write_text(json.dumps(doc))
    with pytest.raises(KubeConfigError, match=r"certificate-authority.*regular file"):
        load_config(ca)


def _plugin(tmp_path: Path, body: str) -> str:
    script = tmp_path / "plugin.py"
    script.write_text(f"#!{sys.executable}\nimport json, os, sys\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_exec_credentials_are_run_with_their_args_and_env(
    server: APIServer, client: AsyncClient, tmp_path: Path, version: str
) -> None:
    await scenario(client)
    api = f"client.authentication.k8s.io/{version}"
    plugin = _plugin(
        tmp_path,
        "assert sys.argv[1:] == ['--flag', 'x'] and os.environ['PLUGIN_ENV'] == 'yes'\n"
        "assert sys.stdin is None or sys.stdin.read() == ''\n"
        f"print(json.dumps({{'apiVersion': {api!r}, 'kind': 'ExecCredential',"
        " 'status': {'token': 'tok', 'expirationTimestamp': '2999-01-01T00:00:00Z'}}))",
    )
    user = {"exec": {"apiVersion": api, "command": plugin, "args": ["--flag", "x"],
                     "env": [{"name": "PLUGIN_ENV", "value": "yes"}],
                     "interactiveMode": "Never"}}  # fmt: skip
    kubeconfig = _config(tmp_path / "kubeconfig", user, server=server.url)
    config = load_config(kubeconfig)
    assert config.user.token == "tok" and config.user.exec is None
    out = await asyncio.to_thread(run, "status", "--kubeconfig", kubeconfig)
    assert out.returncode == 0, out.stderr


def test_a_failing_or_hanging_exec_plugin_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = "client.authentication.k8s.io/v1"
    unset = _config(tmp_path / "k0", {"exec": {"apiVersion": api, "command": "true"}})
    with pytest.raises(KubeConfigError, match="interactiveMode must be given"):
        load_config(unset)  # v1 requires it, as client-go says
    never = {"apiVersion": api, "interactiveMode": "Never"}
    bad = _plugin(tmp_path, "print('oops', file=sys.stderr); sys.exit(3)")
    kubeconfig = _config(tmp_path / "kubeconfig", {"exec": {**never, "command": bad}})
    out = _run_module(["status", "--kubeconfig", kubeconfig])
    assert out.returncode == 2, out.stderr
    assert "exited with 3" in _one_error_line(out) and "oops" in out.stderr
    import drahealth.kube._exec_credential as ec

    monkeypatch.setattr(ec, "EXEC_TIMEOUT", 1.0)
    hang = _plugin(tmp_path, "import time; time.sleep(60)")
    started = time.monotonic()
    with pytest.raises(KubeConfigError, match="did not answer within"):
        load_config(_config(tmp_path / "k2", {"exec": {**never, "command": hang}}))
    assert time.monotonic() - started < 30
    spam = _plugin(tmp_path, "sys.stdout.write('x' * (8 << 20))")
    with pytest.raises(KubeConfigError, match="more than"):
        load_config(_config(tmp_path / "k3", {"exec": {**never, "command": spam}}))


# -- provenance: only the controller's own Events are read as the controller's ------------


def _forged(name: str, namespace: str, reason: str, message: str, obj: dict[str, Any]) -> Event:
    return Event.from_dict(
        {
            "metadata": {"name": name, "namespace": namespace},
            "reason": reason, "message": message, "type": "Warning", "involvedObject": obj,
            "lastTimestamp": "2026-11-22T10:00:00Z",
            "source": {"component": CONTROLLER}, "reportingComponent": CONTROLLER,
            "reportingInstance": "ctl-forged",
        }
    )  # fmt: skip


async def test_a_tenants_events_are_not_read_as_the_controllers(
    server: APIServer, client: AsyncClient, tmp_path: Path
) -> None:
    await scenario(client)
    await client.create(Namespace.from_dict({"metadata": {"name": "evil"}}))
    device = f"{D}/{NODE}/gpu-1"
    rule = {"kind": "DeviceTaintRule", "name": "dh-gpu-1"}
    # the API server keeps an Event about a rule out of "evil" (cluster-scoped objects'
    # Events are in "default"): the tenant's forgery is about an object of its own
    own = {"kind": "Pod", "namespace": "evil", "name": "own"}
    await client.create(_forged("f1", "evil", "DeviceUntainted", f"untainted {device}", own))
    genuine = _forged("g1", "default", "DeviceTainted", f"tainted {device}", rule)
    await client.create(genuine)
    await client.create(
        ConfigMap.from_dict(
            {"metadata": {"name": "drahealth-remediation-history", "namespace": "default"},
             "data": {"history": "[]"}}
        )
    )  # fmt: skip
    kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
    out = await asyncio.to_thread(
        run,
        "history",
        "--kubeconfig",
        kubeconfig,
        device,
        "-o",
        "json",
        "--controller-namespace",
        "default",
    )
    assert out.returncode == 0, out.stderr
    assert [r["what"] for r in json.loads(out.stdout)] == ["DeviceTainted"]

    # a tenant names another tenant's pod in an EvictionBlocked Event of its own (the API
    # server refuses it, an Event about a Pod of another namespace: read as if it had not)
    pod = {"kind": "Pod", "namespace": "ml", "name": "train"}
    blocked = f"eviction of pod ml/train refused {device}"
    from drahealth.web._state import _leaving

    events = [e.to_dict() async for e in client.list(Event, namespace="*")]
    events.append(_forged("f2", "evil", "EvictionBlocked", blocked, pod).to_dict())
    assert _leaving({("ml", "train"): ("", False)}, events) == {}


# -- policy: bombs, nesting, size and rule count ------------------------------------------


HEAD = "apiVersion: drahealth.io/v1\nkind: RemediationPolicy\n"


def _bomb(indent: str) -> str:
    """Anchors a0..a6, each ten aliases of the one before (10^7 nodes expanded)."""
    lines = [f"{indent}a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 7):
        lines.append(f"{indent}a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    body = f"{indent}containers: [{{name: c, image: i, args: *a6}}]"
    return "\n".join([*lines, body]) + "\n"


def test_a_policy_with_an_alias_bomb_in_a_job_template_is_refused() -> None:
    rule = "rules:\n- name: xid\n  match: {driver: gpu.example.com}\n  repair:\n    job:\n"
    started = time.monotonic()
    with pytest.raises(PolicyError, match="alias"):
        parse_policy(HEAD + rule + "      template:\n" + _bomb("        "), "bomb.yaml")
    text = json.dumps(_bomb(""))  # the template as text, a YAML document of its own
    with pytest.raises(PolicyError, match="alias"):
        parse_policy(HEAD + rule + f"      template: {text}\n", "bomb2.yaml")
    assert time.monotonic() - started < 10


def test_a_deeply_nested_policy_is_a_clear_error() -> None:
    with pytest.raises(PolicyError, match="nest"):
        parse_policy(HEAD + "rules: " + "[" * 3000 + "]" * 3000 + "\n", "deep.yaml")


def test_a_huge_policy_file_is_refused_before_parsing(tmp_path: Path) -> None:
    from drahealth.remedy import load_policy

    path = tmp_path / "policy.yaml"
    path.write_text("rules:\n" + "# padding\n" * 1_100_000)
    started = time.monotonic()
    with pytest.raises(PolicyError, match="larger than"):
        load_policy(str(path))
    assert time.monotonic() - started < 5
    rule = "- {{name: r{0}, match: {{driver: gpu.example.com}}}}\n"
    many = HEAD + "rules:\n" + "".join(rule.format(i) for i in range(1001))
    with pytest.raises(PolicyError, match="at most 1000 rules"):
        parse_policy(many, "many.yaml")
