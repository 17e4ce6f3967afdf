"""The views on a server that does not serve some DRA kinds: say so, show the rest, exit 0.

The scenario of ``test_views`` behind a server playing Kubernetes 1.35 without
``DRADeviceTaintRules`` (no DeviceTaintRule API); the real ``drahealth`` CLI runs as a
subprocess. A server without ResourceClaims too still lists pods.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Pod

from drahealth.controlplane import APIServer
from tests.integration.cli._profiles import Narrowing
from tests.integration.cli.test_views import NODE, D, run, scenario
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

NOT_SERVED = (
    "DeviceTaintRules: not served by this server (Kubernetes 1.35 without DRADeviceTaintRules"
)


@pytest.fixture
async def narrow(server: APIServer, client: AsyncClient) -> AsyncIterator[Narrowing]:
    await scenario(client)
    await client.delete(Pod, "train", namespace="ml")  # no bad device in use: status exits 0
    proxy = Narrowing(server, version="1.35", hidden=("DeviceTaintRule",))
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


async def test_status_without_the_rule_api_says_so_and_shows_the_rest(
    narrow: Narrowing, tmp_path: Path
) -> None:
    kubeconfig = narrow.kubeconfig(tmp_path / "kubeconfig")
    out = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert NOT_SERVED in out.stderr
    assert "remediation fences each bad device with a quarantine ResourceClaim" in out.stderr
    assert "server: Kubernetes v1.35.0; DeviceTaintRule API: not served" in out.stdout
    assert "remediation mode: unknown: no controller has run (auto would choose quarantine)" in (
        out.stdout
    )
    assert "gpu-1" in out.stdout and "XID 79" in out.stdout  # health still shown
    # the operator's rule on gpu-3 is invisible: the server does not serve rules
    js = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig, "-o", "json")
    assert js.returncode == 0, js.stderr
    rows = json.loads(js.stdout)
    assert [r["device"].rpartition("/")[2] for r in rows] == ["gpu-1", "gpu-2"]
    assert "DeviceTaintRule API: not served" in js.stderr


async def test_status_header_shows_the_mode_the_controller_recorded(
    narrow: Narrowing, client: AsyncClient, tmp_path: Path
) -> None:
    record = {"mode": "cordon", "why": "chosen: cordon", "serverVersion": "v1.35.0"}
    await client.create(
        ConfigMap.from_dict(
            {
                "metadata": {"name": "drahealth-remediation-history", "namespace": "default"},
                "data": {"history": "[]", "mode": json.dumps(record)},
            }
        )
    )
    kubeconfig = narrow.kubeconfig(tmp_path / "kubeconfig")
    out = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig)
    assert out.returncode == 0, out.stderr
    assert "remediation mode: cordon (chosen: cordon), as the controller recorded" in out.stdout
    assert "remediation cordons nodes" in out.stderr
    hist = await asyncio.to_thread(
        run, "history", "--kubeconfig", kubeconfig, f"{D}/{NODE}/gpu-1", "-o", "json"
    )
    assert hist.returncode == 0 and json.loads(hist.stdout) == [], hist.stderr
    assert NOT_SERVED in hist.stderr and "Traceback" not in hist.stderr


async def test_pods_on_a_server_without_resource_claims(
    server: APIServer, client: AsyncClient, tmp_path: Path
) -> None:
    await scenario(client)
    proxy = Narrowing(server, version="1.36", hidden=("DeviceTaintRule", "ResourceClaim"))
    await proxy.start()
    try:
        kubeconfig = proxy.kubeconfig(tmp_path / "kubeconfig")
        out = await asyncio.to_thread(run, "pods", "-A", "--kubeconfig", kubeconfig, "-o", "json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == []  # pods without claims have no device rows
        assert "ResourceClaims: not served by this server (Kubernetes 1.36" in out.stderr
        assert "Traceback" not in out.stderr
    finally:
        await proxy.stop()


class _NoDiscovery(Narrowing):
    """Answers the resource.k8s.io discovery with a 500, and 404 without a Status body."""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/apis/resource.k8s.io":
            return web.Response(text="<html>oops</html>", status=500, content_type="text/html")
        if "devicetaintrules" in request.path:
            return web.Response(text="404 page not found", status=404)
        return await super()._handle(request)


async def test_status_when_discovery_fails_warns_and_still_shows_devices(
    narrow: Narrowing, server: APIServer, tmp_path: Path
) -> None:
    proxy = _NoDiscovery(server, version="1.35", hidden=())
    await proxy.start()
    try:
        kubeconfig = proxy.kubeconfig(tmp_path / "kubeconfig")
        out = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        assert "GET /apis/resource.k8s.io: HTTP 500; assuming resource.k8s.io/v1" in out.stderr
        assert "DeviceTaintRules: not served" in out.stderr, out.stderr
        assert "remediation fences each bad device with a quarantine ResourceClaim" in out.stderr
        assert "DeviceTaintRule API: not served" in out.stdout and "XID 79" in out.stdout
    finally:
        await proxy.stop()


async def test_taint_without_the_rule_api_quarantines_the_device(tmp_path: Path) -> None:
    """1.35 serves no DeviceTaintRule: taint checks the device as on 1.37 (an unpublished
    one is refused in one line) and, forced, fences it with an operator quarantine claim
    that untaint deallocates and deletes."""
    from drahealth.core import kube_profile

    server = APIServer(profile=kube_profile("1.35"))
    await server.start(host="127.0.0.1", port=0)
    try:
        kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
        args = ("--kubeconfig", kubeconfig, f"{D}/{NODE}/gpu-1", "--key", "example.com/rma")
        refused = await asyncio.to_thread(run, "taint", *args, "--effect", "NoSchedule")
        out = await asyncio.to_thread(run, "taint", *args, "--effect", "NoSchedule", "--force")
        untaint = await asyncio.to_thread(run, "untaint", *args)
        status = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig)
    finally:
        await server.stop()
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    (line,) = refused.stderr.splitlines()
    assert line.startswith("error:") and "no ResourceSlice publishes" in line, line
    assert out.returncode == 0, out.stderr
    assert "resourceclaim/drahealth-operator-quarantine-gpu-1-" in out.stdout, out.stdout
    assert untaint.returncode == 0 and " deleted" in untaint.stdout, untaint.stdout
    assert status.returncode == 0 and NOT_SERVED in status.stderr, status.stderr


async def test_taint_writes_at_the_served_beta_version(tmp_path: Path) -> None:
    from drahealth.core import kube_profile

    server = APIServer(profile=kube_profile("1.36", {"DRADeviceTaintRules": True}))
    await server.start(host="127.0.0.1", port=0)
    try:
        kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
        args = ("--kubeconfig", kubeconfig, f"{D}/{NODE}/gpu-1", "--key", "example.com/rma")
        # no slice publishes gpu-1 here: --force taints it anyway
        out = await asyncio.to_thread(run, "taint", *args, "--effect", "NoSchedule", "--force")
        status = await asyncio.to_thread(
            run, "status", "-A", "--kubeconfig", kubeconfig, "-o", "json"
        )
        untaint = await asyncio.to_thread(run, "untaint", *args)
    finally:
        await server.stop()
    assert out.returncode == 0 and "created" in out.stdout, out.stderr
    assert "DeviceTaintRule API: resource.k8s.io/v1beta2" in status.stderr
    (row,) = json.loads(status.stdout)
    assert [t["key"] for t in row["taints"]] == ["example.com/rma"]
    assert untaint.returncode == 0 and "deleted" in untaint.stdout, untaint.stderr


async def test_dashboard_without_the_rule_api_says_so_and_serves_the_rest(
    narrow: Narrowing, tmp_path: Path
) -> None:
    import aiohttp as http_client

    from drahealth.kube import make_client
    from drahealth.web import Dashboard

    client = make_client(server_url=narrow.url, timeout=5.0)
    dashboard = Dashboard(client)
    try:
        url = await dashboard.start()
        assert "rules" not in dashboard.reflectors  # no reflector on a kind not served
        async with http_client.ClientSession() as http:
            async with http.get(url + "api/state") as resp:
                state = await resp.json()
            async with http.post(
                url + "api/taint", json={"device": f"{D}/{NODE}/gpu-1", "key": "a", "value": "",
                                          "effect": "NoSchedule"},
            ) as resp:  # fmt: skip
                assert resp.status == 403  # read-only without a token, as before
            async with http.get(url) as resp:
                assert 'id="unavailable"' in await resp.text()
    finally:
        await dashboard.stop()
        await client.close()
    (line,) = state["unavailable"]
    assert line.startswith(NOT_SERVED)
    assert "remediation fences each bad device with a quarantine ResourceClaim" in line
    devices = {d["device"]: d for d in state["nodes"][0]["devices"]}
    assert devices["gpu-1"]["health"] == "Unhealthy" and devices["gpu-3"]["taints"] == []


async def test_dashboard_taint_on_a_server_without_the_rule_api_checks_the_device(
    tmp_path: Path,
) -> None:
    import aiohttp as http_client

    from drahealth.core import kube_profile
    from drahealth.kube import make_client
    from drahealth.web import Dashboard

    server = APIServer(profile=kube_profile("1.34"))
    await server.start(host="127.0.0.1", port=0)
    client = make_client(server_url=server.url, timeout=5.0)
    token = "t" * 20
    dashboard = Dashboard(client, token=token)
    try:
        url = await dashboard.start()
        headers = {"Authorization": f"Bearer {token}"}
        async with http_client.ClientSession(headers=headers) as http:
            body = {"device": f"{D}/{NODE}/gpu-1", "key": "a", "value": "", "effect": "NoSchedule"}
            async with http.post(url + "api/taint", json=body) as resp:
                assert resp.status == 400  # the quarantine path checks as the rule path does
                error = (await resp.json())["error"]
            async with http.get(url + "api/state") as resp:
                state = await resp.json()
    finally:
        await dashboard.stop()
        await client.close()
        await server.stop()
    assert "no ResourceSlice publishes" in error, error
    assert "Kubernetes 1.34 without DRADeviceTaints" in state["unavailable"][0]
