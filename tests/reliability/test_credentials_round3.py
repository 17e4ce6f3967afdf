"""Credentials of long-running clients stay fresh: tokenFile and exec plugins.

The agent and the controller run for weeks; a projected service-account token is
rotated on disk and an exec plugin's token (EKS-style) expires within minutes. The
client must:

* re-run an exec plugin when its token is within 30 s of expiring, and after a 401
  (retrying the request once), in the async and the sync client alike;
* re-read a token file after a 401 (and at most every minute) and send the new token;
* report a plugin that fails at request time as one clear error naming it;
* carry its credentials on the httpx client lightkube wraps (the attribute path is
  pinned here, so a lightkube upgrade that moves it fails this test).

Also: the agent's attach file is read with YAML bounds (alias bomb, deep nesting), and
the Event writer names have one definition.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from aiohttp import web
from lightkube import ApiError
from lightkube.resources.core_v1 import ConfigMap

from drahealth._api_failures import CommandError, api_failures
from drahealth.kube import make_client, make_sync_client
from drahealth.node import AttachConfigError, load_attach_config


class _Server:
    """A loopback API server that answers 401 to any token it does not accept."""

    def __init__(self) -> None:
        self.accept: set[str] = set()
        self.min_serial = 0  # exec tokens "tok-<n>" with n >= this are accepted too
        self.unauthorized = 0
        self.seen: list[str] = []
        self.url = ""

    def ok(self, token: str) -> bool:
        if token in self.accept:
            return True
        prefix, _, serial = token.partition("-")
        return prefix == "tok" and serial.isdigit() and int(serial) >= self.min_serial > 0

    async def handle(self, request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.seen.append(token)
        if not self.ok(token):
            self.unauthorized += 1
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "message": "Unauthorized", "reason": "Unauthorized", "code": 401}  # fmt: skip
            return web.json_response(status, status=401)
        cm = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "x", "namespace": "default"}, "data": {"k": "v"}}  # fmt: skip
        return web.json_response(cm)


@pytest.fixture
async def api() -> AsyncIterator[_Server]:
    server = _Server()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


def _kubeconfig(path: Path, user: dict[str, Any], server: str) -> str:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }  # fmt: skip
    path.write_text(json.dumps(doc))
    return str(path)


def _plugin(tmp_path: Path) -> tuple[str, Path, Path]:
    """A plugin that counts its runs; it answers ``tok-<run>`` expiring after the seconds
    in ``lifetime`` (a run listed in ``fail`` exits 3 saying ``boom``)."""
    count, lifetime, fail = tmp_path / "count", tmp_path / "lifetime", tmp_path / "fail"
    count.write_text("0")
    lifetime.write_text("3600")
    fail.write_text("")
    script = tmp_path / "plugin.py"
    script.write_text(
        f"#!{sys.executable}\n"
        "import datetime as dt, json, pathlib, sys\n"
        f"count = pathlib.Path({str(count)!r})\n"
        "n = int(count.read_text()) + 1\n"
        "count.write_text(str(n))\n"
        f"if str(n) in pathlib.Path({str(fail)!r}).read_text().split():\n"
        "    print('boom', file=sys.stderr); sys.exit(3)\n"
        f"seconds = float(pathlib.Path({str(lifetime)!r}).read_text())\n"
        "until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1',\n"
        "  'kind': 'ExecCredential', 'status': {'token': f'tok-{n}',\n"
        "  'expirationTimestamp': until.strftime('%Y-%m-%dT%H:%M:%SZ')}}))\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), count, lifetime


def _exec_user(plugin: str, tag: str) -> dict[str, Any]:
    # the tag keeps the process-wide credential cache of one test apart from another's
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": plugin,
                     "args": [tag], "interactiveMode": "Never"}}  # fmt: skip


def _runs(count: Path) -> int:
    return int(count.read_text())


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_an_exec_token_is_renewed_before_it_expires_and_after_a_401(
    api: _Server, tmp_path: Path, flavour: str
) -> None:
    plugin, count, lifetime = _plugin(tmp_path)
    kubeconfig = _kubeconfig(tmp_path / "kc", _exec_user(plugin, f"renew-{flavour}"), api.url)
    api.min_serial = 1
    if flavour == "async":
        client = make_client(kubeconfig)

        async def get() -> ConfigMap:
            return await client.get(ConfigMap, "x", namespace="default")
    else:
        sync = make_sync_client(kubeconfig)

        async def get() -> ConfigMap:
            return await asyncio.to_thread(sync.get, ConfigMap, "x", namespace="default")

    assert _runs(count) == 1  # checked at load
    await get()
    await get()
    assert _runs(count) == 1 and api.seen[-1] == "tok-1"  # a long-lived token is reused

    api.min_serial = 2  # the server no longer takes tok-1 (revoked, or its clock differs)
    cm = await get()
    assert cm.data == {"k": "v"}
    assert _runs(count) == 2 and api.seen[-2:] == ["tok-1", "tok-2"]

    lifetime.write_text("5")  # short-lived from the next run on
    api.min_serial = 3
    await get()  # 401 on tok-2, run 3 answers a token that expires in 5 s
    await get()  # within 30 s of its expiry: run again before sending
    assert _runs(count) == 4 and api.seen[-1] == "tok-4"
    unauthorized = api.unauthorized
    await get()
    assert api.unauthorized == unauthorized  # refreshed ahead of time, no 401 needed


async def test_a_plugin_failing_at_request_time_is_one_clear_error(
    api: _Server, tmp_path: Path
) -> None:
    plugin, _, _ = _plugin(tmp_path)
    (tmp_path / "fail").write_text("2 3 4 5 6")
    kubeconfig = _kubeconfig(tmp_path / "kc", _exec_user(plugin, "fails"), api.url)
    api.min_serial = 1
    client = make_client(kubeconfig)
    await client.get(ConfigMap, "x", namespace="default")
    api.min_serial = 2  # tok-1 refused; the plugin now fails
    with pytest.raises(httpx2.TransportError) as caught:
        await client.get(ConfigMap, "x", namespace="default")
    text = str(caught.value)
    assert plugin in text and "exited with 3" in text and "boom" in text, text
    assert "\n" not in text
    with pytest.raises(CommandError) as one_line, api_failures(kubeconfig):
        raise caught.value
    assert plugin in one_line.value.message and "\n" not in one_line.value.message


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_a_rotated_token_file_is_read_again_after_a_401(
    api: _Server, tmp_path: Path, flavour: str
) -> None:
    token = tmp_path / "token"
    token.write_text("old-token\n")
    kubeconfig = _kubeconfig(tmp_path / "kc", {"tokenFile": str(token)}, api.url)
    api.accept = {"old-token"}
    if flavour == "async":
        client = make_client(kubeconfig)

        async def get() -> ConfigMap:
            return await client.get(ConfigMap, "x", namespace="default")
    else:
        sync = make_sync_client(kubeconfig)

        async def get() -> ConfigMap:
            return await asyncio.to_thread(sync.get, ConfigMap, "x", namespace="default")

    await get()
    token.write_text("new-token\n")  # the kubelet rotated the projected token
    api.accept = {"new-token"}
    cm = await get()
    assert cm.data == {"k": "v"} and api.seen[-2:] == ["old-token", "new-token"]
    token.write_text("x" * (1 << 20))  # a file grown past the bound is not read ...
    api.accept = set()
    with pytest.raises((ApiError, httpx2.HTTPStatusError)):
        await get()
    assert api.seen[-1] == "new-token"  # ... the last good token is kept


async def test_a_token_file_is_reloaded_each_minute_without_a_401(
    api: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import drahealth.kube._credentials as credentials

    monkeypatch.setattr(credentials, "TOKEN_FILE_RELOAD", 0.0)
    token = tmp_path / "token"
    token.write_text("old-token")
    api.accept = {"old-token", "new-token"}
    client = make_client(_kubeconfig(tmp_path / "kc", {"tokenFile": str(token)}, api.url))
    await client.get(ConfigMap, "x", namespace="default")
    token.write_text("new-token")
    await client.get(ConfigMap, "x", namespace="default")
    assert api.seen == ["old-token", "new-token"] and api.unauthorized == 0


def test_the_credentials_sit_on_the_httpx_client_lightkube_wraps(tmp_path: Path) -> None:
    from drahealth.kube._credentials import RefreshingBearerAuth

    token = tmp_path / "token"
    token.write_text("t")
    kubeconfig = _kubeconfig(tmp_path / "kc", {"tokenFile": str(token)}, "https://127.0.0.1:1")
    inner = make_client(kubeconfig)._client._client  # pinned: lightkube 1.0.1 (uv.lock)
    assert isinstance(inner, httpx2.AsyncClient)
    assert isinstance(inner.auth, RefreshingBearerAuth)
    sync_inner = make_sync_client(kubeconfig)._client._client
    assert isinstance(sync_inner, httpx2.Client)
    assert isinstance(sync_inner.auth, RefreshingBearerAuth)


def test_a_certificate_from_an_exec_plugin_is_resolved_at_load(tmp_path: Path) -> None:
    """httpx cannot swap a client certificate per request: it is read once, at load."""
    from drahealth.kube import load_config

    script = tmp_path / "cert.py"
    answer = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
              "status": {"clientCertificateData": "CERT", "clientKeyData": "KEY",
                         "expirationTimestamp": (dt.datetime.now(dt.UTC)
                                                 + dt.timedelta(hours=1)).isoformat()}}  # fmt: skip
    script.write_text(f"#!{sys.executable}\nprint({json.dumps(answer)!r})\n")
    script.chmod(0o755)
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(script),
                     "interactiveMode": "Never"}}  # fmt: skip
    config = load_config(_kubeconfig(tmp_path / "kc", user, "https://127.0.0.1:1"))
    assert config.user is not None
    assert config.user.client_cert_data == "CERT" and config.user.client_key_data == "KEY"


# -- the attach file is bounded YAML ----------------------------------------------------


def test_an_attach_file_alias_bomb_or_deep_nesting_is_one_clear_error(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(AttachConfigError, match=r"bomb\.yaml.*alias") as caught:
        load_attach_config(str(bomb))
    assert "\n" not in str(caught.value)
    deep = tmp_path / "deep.yaml"
    deep.write_text("drivers: " + "[" * 10_000 + "]" * 10_000 + "\n")
    with pytest.raises(AttachConfigError, match=r"deep\.yaml.*nested too deep") as caught:
        load_attach_config(str(deep))
    assert "\n" not in str(caught.value)
    fifo = tmp_path / "fifo"
    import os

    os.mkfifo(fifo)
    with pytest.raises(AttachConfigError, match="not a regular file"):
        load_attach_config(str(fifo))


def test_event_writer_names_have_one_definition() -> None:
    import drahealth.node._events as agent_events
    import drahealth.remedy._controller as controller
    import drahealth.remedy._provenance as provenance
    from drahealth import kube

    assert provenance.CONTROLLER_COMPONENT is kube.CONTROLLER_COMPONENT
    assert provenance.AGENT_COMPONENT is kube.AGENT_COMPONENT
    assert controller.COMPONENT is kube.CONTROLLER_COMPONENT
    assert agent_events.COMPONENT is kube.AGENT_COMPONENT
