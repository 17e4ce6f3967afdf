"""``drahealth doctor`` and ``drahealth version`` as subprocesses against real servers.

The embedded API server plays each release (1.34-1.38, default gates, and 1.35 with
``DRADeviceTaintRules`` on); a proxy in front of it denies some access reviews; hostile
servers answer garbage, huge bodies or nothing at all. Every answer is one line per
check, never a traceback, and the exit code says whether a blocker failed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
from aiohttp import web

from drahealth.controlplane import APIServer
from drahealth.core import kube_profile
from tests.integration.cli._profiles import Narrowing
from tests.integration.cli.test_views import run

#: 1.35 with the rule API (its gate depends on the taint gate)
RULES_1_35 = {"DRADeviceTaints": True, "DRADeviceTaintRules": True}


RULES = {"1.34": None, "1.35": None, "1.36": None, "1.37": "v1", "1.38": "v1"}


async def _serve(profile: Any) -> APIServer:
    server = APIServer(profile=profile)
    await server.start(host="127.0.0.1", port=0)
    return server


def _doctor(kubeconfig: str, *args: str) -> tuple[int, dict[str, Any], str]:
    out = run("doctor", "--kubeconfig", kubeconfig, "-o", "json", *args)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout), out.stderr


def _by_check(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["check"]: c for c in doc["checks"]}


@pytest.mark.parametrize("version", sorted(RULES))
async def test_diagnosis_on_each_release(version: str, tmp_path: Path) -> None:
    server = await _serve(kube_profile(version))
    try:
        kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
        code, doc, _ = await asyncio.to_thread(_doctor, kubeconfig, "--component", "controller")
    finally:
        await server.stop()
    rules = RULES[version]
    assert code == 0, doc
    assert doc["serverVersion"].startswith(f"v{version}.")
    assert doc["apis"]["ResourceClaim"] == "resource.k8s.io/v1"
    assert doc["apis"]["DeviceTaintRule"] == (f"resource.k8s.io/{rules}" if rules else "not served")
    assert doc["mode"] == ("taint-rules" if rules else "quarantine")
    checks = _by_check(doc)
    assert checks["mode"]["status"] == ("ok" if rules else "warn")
    if not rules:
        assert "--feature-gates=DRADeviceTaint" in checks["mode"]["fix"]
    assert checks["version"]["status"] == "ok" and checks["dra-v1"]["status"] == "ok"
    assert checks["rbac:controller"]["status"] == "ok"
    assert set(doc) == {"component", "serverVersion", "apis", "mode", "blockers",
                        "warnings", "checks"}  # fmt: skip
    assert all(set(c) == {"check", "status", "message", "fix", "blocker"} for c in doc["checks"])


async def test_an_over_broad_rule_is_a_blocker_named_in_the_line(tmp_path: Path) -> None:
    profile = kube_profile("1.35", RULES_1_35)  # v1alpha3 rules
    server = await _serve(profile)
    try:
        base = f"{server.url}/apis/resource.k8s.io/v1alpha3/devicetaintrules"
        async with httpx2.AsyncClient() as http:
            for name, selector in (
                ("everything", {}),
                ("any-gpu-0", {"device": "gpu-0"}),
                ("one-device", {"driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}),
            ):
                body = {
                    "apiVersion": "resource.k8s.io/v1alpha3",
                    "kind": "DeviceTaintRule",
                    "metadata": {"name": name},
                    "spec": {"deviceSelector": selector,
                             "taint": {"key": "example.com/x", "effect": "NoSchedule"}},
                }  # fmt: skip
                resp = await http.post(base, json=body)
                assert resp.status_code == 201, resp.text
        kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
        code, doc, _ = await asyncio.to_thread(_doctor, kubeconfig, "--component", "controller")
        text = await asyncio.to_thread(run, "doctor", "--kubeconfig", kubeconfig)
    finally:
        await server.stop()
    assert code == 1 and doc["blockers"] == 1
    assert doc["apis"]["DeviceTaintRule"] == "resource.k8s.io/v1alpha3"
    assert doc["mode"] == "taint-rules"
    rules = _by_check(doc)["rules"]
    assert rules["status"] == "FAIL" and rules["blocker"] is True
    assert "everything (all)" in rules["message"] and "any-gpu-0 (partial)" in rules["message"]
    assert "one-device" not in rules["message"] and "#141422" in rules["message"]
    assert "kubectl delete devicetaintrule" in rules["fix"]
    assert text.returncode == 1 and "Traceback" not in text.stderr
    line = next(x for x in text.stdout.splitlines() if x.startswith("FAIL  rules"))
    assert "everything (all)" in line
    assert "fix: delete them" in text.stdout


class _Denying(Narrowing):
    """Answers access reviews itself: everything allowed but patching claims' status."""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/selfsubjectaccessreviews"):
            body = await request.json()
            attrs = body["spec"]["resourceAttributes"]
            allowed = not (
                attrs["resource"] == "resourceclaims"
                and attrs.get("subresource") == "status"
                and attrs["verb"] == "patch"
            )
            return web.json_response({**body, "status": {"allowed": allowed}}, status=201)
        return await super()._handle(request)


async def test_missing_permissions_are_named_with_the_fix(tmp_path: Path) -> None:
    server = await _serve(kube_profile("1.35"))
    proxy = _Denying(server, version="1.35", hidden=())
    await proxy.start()
    try:
        kubeconfig = proxy.kubeconfig(tmp_path / "kubeconfig")
        code, doc, _ = await asyncio.to_thread(_doctor, kubeconfig)
    finally:
        await proxy.stop()
        await server.stop()
    checks = _by_check(doc)
    assert code == 1 and doc["mode"] == "quarantine"
    assert checks["rbac:controller"]["status"] == "FAIL"
    assert checks["rbac:controller"]["message"] == (
        "controller may not: patch resourceclaims/status (resource.k8s.io) in default"
    )
    assert "ServiceAccount" in checks["rbac:controller"]["fix"]
    assert checks["rbac:agent"]["status"] == "ok" and checks["rbac:driver"]["status"] == "ok"


NS = "drahealth-system"


def _chart_grants(values: dict[str, Any] | None, component: str) -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, namespace) the chart's roles grant ``component``'s account."""
    from tests.deploy._render import CHART, render

    out: set[tuple[str, str, str, str]] = set()
    for doc in render.manifests(render.render_chart(CHART, values, namespace=NS)):
        if doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"].endswith(
            f"-{component}"
        ):
            ns = NS if doc["kind"] == "Role" else ""
            for rule in doc["rules"]:
                out |= {(g, r, v, ns) for g in rule["apiGroups"] for r in rule["resources"]
                        for v in rule["verbs"]}  # fmt: skip
    return out


class _AsAccount(Narrowing):
    """The server as one component's ServiceAccount sees it: access reviews answered
    from the chart's roles, and a list of DeviceTaintRules refused (403) unless granted."""

    def __init__(self, upstream: APIServer, grants: set[tuple[str, str, str, str]]) -> None:
        super().__init__(upstream, version="1.37", hidden=())
        self.grants = grants

    def _allowed(self, group: str, resource: str, verb: str, namespace: str) -> bool:
        return any(
            (g, r, v) == (group, resource, verb) and ns in ("", namespace)
            for g, r, v, ns in self.grants
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/selfsubjectaccessreviews"):
            body = await request.json()
            a = body["spec"]["resourceAttributes"]
            resource = a["resource"] + (f"/{a['subresource']}" if a.get("subresource") else "")
            allowed = self._allowed(a.get("group", ""), resource, a["verb"],
                                    a.get("namespace", ""))  # fmt: skip
            return web.json_response({**body, "status": {"allowed": allowed}}, status=201)
        if request.path.endswith("/devicetaintrules") and not self._allowed(
            "resource.k8s.io", "devicetaintrules", "list", ""
        ):
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                      "reason": "Forbidden", "message": "forbidden"}  # fmt: skip
            return web.json_response(status, status=403)
        return await super()._handle(request)


async def _doctor_as(
    values: dict[str, Any] | None, component: str, tmp_path: Path, *args: str
) -> tuple[int, dict[str, Any]]:
    server = await _serve(kube_profile("1.37"))
    proxy = _AsAccount(server, _chart_grants(values, component))
    await proxy.start()
    try:
        kubeconfig = proxy.kubeconfig(tmp_path / f"{component}.kubeconfig")
        code, doc, _ = await asyncio.to_thread(
            _doctor, kubeconfig, "--component", component, "--namespace", NS, *args
        )
    finally:
        await proxy.stop()
        await server.stop()
    return code, doc


@pytest.mark.parametrize("component", ["driver", "agent", "controller"])
async def test_each_component_passes_with_the_charts_roles(component: str, tmp_path: Path) -> None:
    """The driver's and agent's roles grant no DeviceTaintRule access: the over-broad rule
    check is the controller's (before: a FAIL for both); each role passes its RBAC check."""
    _code, doc = await _doctor_as(None, component, tmp_path, "--node-root", str(tmp_path))
    checks = _by_check(doc)
    assert checks[f"rbac:{component}"]["status"] == "ok", checks[f"rbac:{component}"]
    assert ("rules" in checks) == (component == "controller"), sorted(checks)
    # (no kubelet here: the node checks fail)
    assert [c for c in doc["checks"] if c["status"] == "FAIL" and not c["check"].startswith(
        "node:")] == []  # fmt: skip


async def test_the_policy_and_driver_flags_decide_the_optional_permissions(
    tmp_path: Path,
) -> None:
    """A release without the node rollup grants no nodes/status patch (a Node read it
    grants in every mode: the uid of a Node an Event is about): doctor asks for it unless
    ``--policy`` says the rollup is off; a driver without
    the claim cache is asked for list/watch unless ``--no-claim-cache``."""
    policy = {"apiVersion": "drahealth.io/v1", "kind": "RemediationPolicy",
              "nodeRollup": {"enabled": False},
              "rules": [{"name": "bad", "match": {"health": ["Unhealthy"]},
                         "action": {"effect": "NoExecute"}}]}  # fmt: skip
    values = {"controller": {"remediationMode": "taint-rules", "policy": policy},
              "driver": {"claimCache": False}}  # fmt: skip
    code, doc = await _doctor_as(values, "controller", tmp_path)
    rbac = _by_check(doc)["rbac:controller"]
    assert code == 1 and rbac["message"] == "controller may not: patch nodes/status"
    path = tmp_path / "policy.yaml"
    path.write_text(json.dumps(policy))
    code, doc = await _doctor_as(values, "controller", tmp_path, "--policy", str(path))
    assert code == 0 and _by_check(doc)["rbac:controller"]["status"] == "ok", doc
    code, doc = await _doctor_as(values, "driver", tmp_path, "--node-root", str(tmp_path))
    assert _by_check(doc)["rbac:driver"]["message"] == (
        "driver may not: list resourceclaims (resource.k8s.io), "
        "watch resourceclaims (resource.k8s.io)"
    )
    code, doc = await _doctor_as(
        values, "driver", tmp_path, "--no-claim-cache", "--node-root", str(tmp_path)
    )
    assert _by_check(doc)["rbac:driver"]["status"] == "ok", doc
    bad = await asyncio.to_thread(run, "doctor", "--policy", str(tmp_path / "missing.yaml"))
    assert bad.returncode == 2 and "--policy" in bad.stderr, bad.stderr


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Set when a test ends: lets the stalling handler return so its server can stop.
_RELEASE = asyncio.Event()


@pytest.fixture
async def hostile() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    _RELEASE.set()
    for runner in runners:
        await runner.cleanup()
    _RELEASE.clear()


async def _garbage(_request: web.Request) -> web.StreamResponse:
    return web.Response(text="<html>not kubernetes</html>", content_type="text/html")


async def _huge(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    chunk = b" " * 65536
    for _ in range(5 * 1024 * 1024 // len(chunk)):  # 5 MiB of whitespace
        await resp.write(chunk)
    return resp


async def _stall(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    await resp.write(b"{")
    await _RELEASE.wait()  # never finishes within the test's --timeout
    return resp


@pytest.mark.parametrize(
    ("handler", "says"),
    [
        (_garbage, "GET /version: HTTP 200, and the answer is not JSON"),
        (_huge, "GET /version: answer larger than 4194304 bytes"),
        (_stall, "did not answer within"),
    ],
)
async def test_hostile_servers_are_one_line_each(
    hostile: Callable[[Handler], Awaitable[str]], handler: Handler, says: str, tmp_path: Path
) -> None:
    url = await hostile(handler)
    kubeconfig = Narrowing.__new__(Narrowing)
    kubeconfig.url = url
    path = kubeconfig.kubeconfig(tmp_path / "kubeconfig")
    out = await asyncio.to_thread(run, "doctor", "--kubeconfig", path, "--timeout", "1")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("FAIL  api")]
    assert says in line, out.stdout
    if handler is _stall:
        return  # version waits the client's default timeout; doctor's line is the point
    version = await asyncio.to_thread(run, "version", "--kubeconfig", path)
    assert version.returncode == 1 and "Traceback" not in version.stderr, version.stderr
    assert version.stdout.startswith("drahealth ") and version.stderr.startswith("error: ")


async def test_version_names_the_server_the_apis_and_the_mode(tmp_path: Path) -> None:
    server = await _serve(kube_profile("1.36"))
    try:
        kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
        out = await asyncio.to_thread(run, "version", "--kubeconfig", kubeconfig, "-o", "json")
        text = await asyncio.to_thread(run, "version", "--kubeconfig", kubeconfig)
    finally:
        await server.stop()
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["serverVersion"]["gitVersion"].startswith("v1.36.")
    assert doc["serverVersion"]["apis"]["DeviceTaintRule"] == "not served"
    assert doc["serverVersion"]["remediationMode"]["auto"] == "quarantine"
    assert text.returncode == 0 and "Remediation mode auto: quarantine" in text.stdout
    gone = await asyncio.to_thread(run, "version", "--kubeconfig", kubeconfig)
    assert gone.returncode == 1 and "cannot reach the API server" in gone.stderr
    assert gone.stdout.startswith("drahealth ")
