"""Attacks on the operator surfaces hardened in round three, and what they now get.

* A bearer token that cannot be an HTTP header value (a line break, a control or a
  non-ASCII character, from a kubeconfig, a token file or an exec plugin) is refused
  where it is read, with an error that names its source and never quotes the token:
  before, httpx raised an error quoting the whole ``Authorization`` header (the token
  ended up in logs) or a ``UnicodeEncodeError`` that was not a transport error.
* An exec plugin whose credential is already expired (or expires within the early
  refresh margin) is run once for a burst of concurrent requests, not once each.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import time
from pathlib import Path

import aiohttp
import httpx2
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap
from lightkube.resources.resource_v1 import DeviceTaintRule

from drahealth.kube import KubeConfigError, make_client
from drahealth.web import Dashboard
from tests.integration.cli.test_views import scenario
from tests.integration.kube.conftest import api_server_options, client
from tests.reliability.test_credentials_round3 import (
    _exec_user,
    _kubeconfig,
    _plugin,
    _runs,
    _Server,
    api,
)

__all__ = ["api", "api_server_options", "client"]

TOKEN = "s3cret-token-0123456789"

BAD_TOKENS = ["secret-abc\r\nX-Injected: 1", "secret-abc\nX", "secret-\x00abc", "sécret-abc"]


@pytest.mark.parametrize("token", BAD_TOKENS)
def test_a_kubeconfig_token_that_is_no_header_value_is_refused_at_load(
    tmp_path: Path, token: str
) -> None:
    kubeconfig = _kubeconfig(tmp_path / "kc", {"token": token}, "http://127.0.0.1:9")
    with pytest.raises(KubeConfigError) as caught:
        make_client(kubeconfig)
    text = str(caught.value)
    assert "token" in text and "secret" not in text and "\n" not in text, text


@pytest.mark.parametrize("token", BAD_TOKENS)
def test_a_token_file_that_is_no_header_value_is_refused_at_load(
    tmp_path: Path, token: str
) -> None:
    path = tmp_path / "token"
    path.write_bytes(token.encode("utf-8"))
    kubeconfig = _kubeconfig(tmp_path / "kc", {"tokenFile": str(path)}, "http://127.0.0.1:9")
    with pytest.raises(KubeConfigError) as caught:
        make_client(kubeconfig)
    text = str(caught.value)
    assert str(path) in text and "secret" not in text and "\n" not in text, text


async def test_a_rotated_token_file_that_is_no_header_value_keeps_the_last_token(
    api: _Server, tmp_path: Path
) -> None:
    path = tmp_path / "token"
    path.write_text("good-token")
    api.accept = {"good-token"}
    client = make_client(_kubeconfig(tmp_path / "kc", {"tokenFile": str(path)}, api.url))
    await client.get(ConfigMap, "x", namespace="default")
    path.write_bytes(b"secret-abc\r\nX-Injected: 1")
    api.accept = set()  # a 401 makes the client read the file again
    with pytest.raises(Exception) as caught:
        await client.get(ConfigMap, "x", namespace="default")
    assert "secret" not in str(caught.value)
    assert api.seen == ["good-token", "good-token"]  # the last good token, sent once more


@pytest.mark.parametrize("token", BAD_TOKENS)
def test_an_exec_token_that_is_no_header_value_is_refused_at_load(
    tmp_path: Path, token: str
) -> None:
    script = tmp_path / "plugin.py"
    answer = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
              "status": {"token": token}}  # fmt: skip
    script.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(answer))})\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    user = _exec_user(str(script), f"bad-token-{BAD_TOKENS.index(token)}")
    kubeconfig = _kubeconfig(tmp_path / "kc", user, "http://127.0.0.1:9")
    with pytest.raises(KubeConfigError) as caught:
        make_client(kubeconfig)
    text = str(caught.value)
    assert str(script) in text and "secret" not in text and "\n" not in text, text


async def test_an_expired_exec_credential_is_fetched_once_for_a_burst_of_requests(
    api: _Server, tmp_path: Path
) -> None:
    plugin, count, lifetime = _plugin(tmp_path)
    lifetime.write_text("-3600")  # every answer expired an hour ago (a skewed clock)
    api.min_serial = 1
    client = make_client(_kubeconfig(tmp_path / "kc", _exec_user(plugin, "burst"), api.url))
    assert _runs(count) == 1
    async with asyncio.timeout(50):
        await asyncio.gather(*(client.get(ConfigMap, "x", namespace="default") for _ in range(20)))
    assert _runs(count) <= 3, _runs(count)  # one refresh serves every waiting request
    assert api.unauthorized == 0


def test_the_header_check_accepts_real_tokens() -> None:
    from drahealth.kube._credentials import check_token

    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJlLV9-+/="
    assert check_token(jwt, "token") == jwt
    with pytest.raises(ValueError, match="token"):
        check_token("a b", "token")
    assert isinstance(httpx2.Headers({"Authorization": f"Bearer {jwt}"}), httpx2.Headers)


# -- dashboard actions: bodies nested deep ------------------------------------------------


@pytest.mark.parametrize("path", ["api/taint", "api/untaint"])
async def test_a_deeply_nested_action_body_is_a_400_not_a_crash(
    client: AsyncClient, path: str
) -> None:
    await scenario(client)
    dashboard = Dashboard(client, token=TOKEN)
    url = await dashboard.start()
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    before = [r async for r in client.list(DeviceTaintRule)]
    try:
        async with aiohttp.ClientSession(headers=auth) as http:
            for body in ("[" * 60_000, '{"device": ' + "[" * 30_000 + "]" * 30_000 + "}"):
                async with http.post(url + path, data=body) as resp:
                    assert resp.status == 400, (resp.status, (await resp.text())[:200])
                    assert "JSON" in (await resp.json())["error"]
            async with http.get(url + "healthz") as resp:
                assert resp.status == 200
        assert [r async for r in client.list(DeviceTaintRule)] == before
    finally:
        await dashboard.stop()


# -- CLI: a JSONPath filter that cannot match ---------------------------------------------


def test_a_filter_padded_with_spaces_fails_in_linear_time() -> None:
    from drahealth.cli._output import JSONPathError, jsonpath

    path = "{.items[?(@.a" + " " * 100_000 + "x)]}"  # about a minute when quadratic
    started = time.monotonic()
    with pytest.raises(JSONPathError) as caught:
        jsonpath(path, {"items": [{"a": 1}]})
    assert time.monotonic() - started < 5
    assert len(str(caught.value)) < 400
    assert jsonpath("{.items[?( @.a == 2 )]}", {"items": [{"a": 1}, {"a": 2}]}) == [{"a": 2}]


async def test_a_plugin_failing_is_run_once_for_a_burst_of_refused_requests(
    api: _Server, tmp_path: Path
) -> None:
    plugin, count, _ = _plugin(tmp_path)
    (tmp_path / "fail").write_text(" ".join(str(n) for n in range(2, 100)))
    api.min_serial = 1
    client = make_client(_kubeconfig(tmp_path / "kc", _exec_user(plugin, "fail-burst"), api.url))
    await client.get(ConfigMap, "x", namespace="default")
    api.min_serial = 2  # tok-1 is refused from now on; every later run fails
    async with asyncio.timeout(50):
        results = await asyncio.gather(
            *(client.get(ConfigMap, "x", namespace="default") for _ in range(20)),
            return_exceptions=True,
        )
    assert all(isinstance(r, httpx2.TransportError) for r in results), results
    assert all("exited with 3" in str(r) for r in results)
    assert _runs(count) <= 4, _runs(count)  # before: one run per request (21)


@pytest.mark.timeout(20)
def test_a_fifo_in_place_of_the_policy_file_is_refused_at_once(tmp_path: Path) -> None:
    """The policy is read like every file others may replace: a FIFO without a writer
    is refused when it is opened, never waited on."""
    from drahealth.remedy import load_policy
    from drahealth.remedy._policy_load import PolicyError

    fifo = tmp_path / "policy.yaml"
    os.mkfifo(fifo)
    with pytest.raises(PolicyError, match="not a regular file"):
        load_policy(str(fifo))
