"""``drahealth policy check`` against a cluster: the mode, what each rule writes, typos.

Each test starts the embedded API server as one release profile (1.34, 1.35, 1.37),
publishes ResourceSlices and runs the command in-process with a kubeconfig for it. A
small aiohttp server plays a hostile cluster (endless pages of slices, a 10 KB driver
name) that the embedded server's validation would refuse.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner, Result
from lightkube import AsyncClient
from lightkube.resources.resource_v1 import ResourceSlice

from drahealth.cli import main
from drahealth.cli.policy import MAX_SLICES, SLICE_CHUNK
from drahealth.controlplane import APIServer
from drahealth.core import kube_profile
from drahealth.kube import make_client
from tests.integration.cli._profiles import write_kubeconfig

pytestmark = pytest.mark.timeout(60)

NVIDIA = "gpu.nvidia.com"
POLICY = f"""apiVersion: drahealth.io/v1
kind: RemediationPolicy
remediation: {{mode: auto, fallback: quarantine}}
rules:
  - name: fatal
    match: {{driver: {NVIDIA}, message: "XID 79"}}
    action: {{effect: NoSchedule, escalate: [{{after: 2m, effect: NoExecute}}]}}
  - name: ecc
    match: {{driver: {NVIDIA}, pool: node-1, message: "ECC"}}
    action: {{effect: NoSchedule, fallback: cordon}}
  - name: note
    match: {{driver: {NVIDIA}, message: "throttled"}}
    action: {{effect: None}}
"""
TYPO = (
    POLICY
    + """  - name: typo
    match: {driver: gpu.nvida.com}
  - name: pool-typo
    match: {driver: gpu.nvidia.com, pool: nod-1}
"""
)
#: Where the same stdout would be printed offline.
OFFLINE = "valid, 3 rule(s)\n"


def _env(home: Path, kubeconfig: str | None = None) -> dict[str, str | None]:
    """No configuration but the one given: an empty home, no $KUBECONFIG, not in a pod."""
    return {"HOME": str(home), "KUBECONFIG": kubeconfig, "KUBERNETES_SERVICE_HOST": None}


def check(tmp_path: Path, text: str, *args: str, env: dict[str, str | None]) -> Result:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return CliRunner().invoke(main, ["policy", "check", str(path), *args], env=env)


async def acheck(tmp_path: Path, text: str, *args: str, home: Path | None = None) -> Result:
    """The command in a thread (the servers run on this loop), isolated from the host's
    configuration."""
    env = _env(home or tmp_path / "home")
    return await asyncio.to_thread(check, tmp_path, text, *args, env=env)


@asynccontextmanager
async def cluster(version: str, tmp_path: Path, **gates: bool) -> AsyncIterator[str]:
    """An API server of the release with one slice of gpu.nvidia.com (pool node-1);
    yields a kubeconfig for it."""
    srv = APIServer(data_file=None, watch_window=1000, profile=kube_profile(version, gates))
    await srv.start(host="127.0.0.1", port=0)
    client = make_client(server_url=srv.url, timeout=5.0)
    try:
        await publish(client, NVIDIA, "node-1")
        yield str(srv.write_kubeconfig(tmp_path / "kubeconfig"))
    finally:
        await client.close()
        await srv.stop()


async def publish(client: AsyncClient, driver: str, pool: str) -> None:
    await client.create(
        ResourceSlice.from_dict(
            {
                "metadata": {"name": f"{pool}-{driver}"},
                "spec": {
                    "driver": driver,
                    "nodeName": pool,
                    "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": f"gpu-{i}"} for i in range(2)],
                },
            }
        )
    )


def steps(out: dict[str, Any], rule: str) -> list[dict[str, Any]]:
    [plan] = [p for p in out["cluster"]["rules"] if p["rule"] == rule]
    return list(plan["steps"])


async def test_137_serves_v1_device_taint_rules(tmp_path: Path) -> None:
    async with cluster("1.37", tmp_path) as kubeconfig:
        res = await acheck(tmp_path, POLICY, "--kubeconfig", kubeconfig)
        js = await acheck(tmp_path, POLICY, "--kubeconfig", kubeconfig, "-o", "json")
    assert res.exit_code == 0, res.output
    assert res.stderr == ""  # no warning: every rule's driver and pool is published
    assert OFFLINE in res.stdout
    assert "mode       taint-rules (auto: the server serves resource.k8s.io/v1" in res.stdout
    assert (
        "rule fatal: NoSchedule -> taint-rules: a DeviceTaintRule (resource.k8s.io/v1) per "
        "bad device\n" in res.stdout
    )
    assert "rule fatal: NoExecute after 120 s -> taint-rules" in res.stdout
    assert "eviction deletes its pods" in res.stdout
    assert "slices     1 ResourceSlice(s), drivers gpu.nvidia.com" in res.stdout
    out = json.loads(js.stdout)
    mode = out["cluster"]["mode"]
    assert (mode["mode"], mode["deviceTaintRuleAPI"]) == ("taint-rules", "resource.k8s.io/v1")
    assert [s["writes"] for s in steps(out, "fatal")] == ["deviceTaintRule"] * 2
    assert [s["evictedBy"] for s in steps(out, "fatal")] == [None, "cluster"]
    # the rule's fallback does not apply where rules are served; effect None is written
    assert [(s["mode"], s["writes"]) for s in steps(out, "ecc")] == [
        ("taint-rules", "deviceTaintRule")
    ]
    assert steps(out, "note")[0]["effect"] == "None"
    assert steps(out, "note")[0]["writes"] == "deviceTaintRule"
    assert out["cluster"]["warnings"] == []


async def test_135_without_the_rule_api_quarantines_and_the_rule_fallback_cordons(
    tmp_path: Path,
) -> None:
    async with cluster("1.35", tmp_path) as kubeconfig:
        res = await acheck(tmp_path, POLICY, "--kubeconfig", kubeconfig)
        js = await acheck(tmp_path, POLICY, "--kubeconfig", kubeconfig, "-o", "json")
    assert res.exit_code == 0, res.output
    assert "mode       quarantine (auto: the server serves no DeviceTaintRule API" in res.stdout
    assert (
        "rule fatal: NoSchedule -> quarantine: a quarantine ResourceClaim "
        "(resource.k8s.io/v1) per bad device" in res.stdout
    )
    assert "rule ecc: NoSchedule -> cordon: cordons the device's node: fences every device" in (
        res.stdout
    )
    assert "the rule's own action.fallback" in res.stdout
    out = json.loads(js.stdout)
    assert out["cluster"]["mode"]["deviceTaintRuleAPI"] is None
    fatal = steps(out, "fatal")
    assert [(s["mode"], s["writes"], s["evictedBy"]) for s in fatal] == [
        ("quarantine", "quarantineClaim", None),
        ("quarantine", "quarantineClaim", "controller"),
    ]
    [ecc] = steps(out, "ecc")
    assert (ecc["mode"], ecc["fencesNode"]) == ("cordon", True)
    [note] = steps(out, "note")  # effect None: quarantine has nothing to write
    assert (note["mode"], note["writes"]) == ("quarantine", "nothing")


async def test_135_with_the_rule_api_writes_v1alpha3_rules(tmp_path: Path) -> None:
    gates = {"DRADeviceTaints": True, "DRADeviceTaintRules": True}
    async with cluster("1.35", tmp_path, **gates) as kubeconfig:
        js = await acheck(tmp_path, POLICY, "--kubeconfig", kubeconfig, "-o", "json")
    out = json.loads(js.stdout)
    assert out["cluster"]["mode"]["deviceTaintRuleAPI"] == "resource.k8s.io/v1alpha3"
    [note] = steps(out, "note")  # 1.35's alpha API has effect None
    assert (note["mode"], note["writes"]) == ("taint-rules", "deviceTaintRule")


async def test_134_effect_none_is_report_only_and_without_the_gate_quarantine(
    tmp_path: Path,
) -> None:
    async with cluster("1.34", tmp_path, DRADeviceTaints=True) as kubeconfig:
        res = await acheck(tmp_path, POLICY, "--kubeconfig", kubeconfig)
        js = await acheck(tmp_path, POLICY, "--kubeconfig", kubeconfig, "-o", "json")
    assert res.exit_code == 0, res.output
    assert (
        "rule note: None -> report-only: nothing written, only reported "
        "(resource.k8s.io/v1alpha3 has no taint effect None (1.35 on))" in res.stdout
    )
    out = json.loads(js.stdout)
    assert out["cluster"]["mode"]["mode"] == "taint-rules"
    assert [s["mode"] for s in steps(out, "fatal")] == ["taint-rules"] * 2
    assert steps(out, "note")[0]["mode"] == "report-only"
    plain = tmp_path / "plain"
    plain.mkdir()
    async with cluster("1.34", plain) as kubeconfig:
        js = await acheck(plain, POLICY, "--kubeconfig", kubeconfig, "-o", "json")
    assert json.loads(js.stdout)["cluster"]["mode"]["mode"] == "quarantine"


async def test_dry_run_on_134_is_report_only(tmp_path: Path) -> None:
    text = POLICY.replace("remediation:", "dryRun: true\nremediation:")
    async with cluster("1.34", tmp_path, DRADeviceTaints=True) as kubeconfig:
        js = await acheck(tmp_path, text, "--kubeconfig", kubeconfig, "-o", "json")
    out = json.loads(js.stdout)
    assert out["cluster"]["mode"]["mode"] == "report-only"
    assert "without the taint effect None" in out["cluster"]["mode"]["why"]
    assert {s["writes"] for p in out["cluster"]["rules"] for s in p["steps"]} == {"nothing"}


async def test_a_refused_mode_warns_and_runs_report_only(tmp_path: Path) -> None:
    text = POLICY.replace("mode: auto", "mode: taint-rules")
    async with cluster("1.35", tmp_path) as kubeconfig:
        res = await acheck(tmp_path, text, "--kubeconfig", kubeconfig)
    assert res.exit_code == 0, res.output
    assert "mode       report-only (remediation mode taint-rules needs" in res.stdout
    assert res.stderr.startswith("warning: the controller cannot run mode taint-rules here")


async def test_a_driver_typo_warns_and_names_the_closest_published_driver(
    tmp_path: Path,
) -> None:
    async with cluster("1.37", tmp_path) as kubeconfig:
        res = await acheck(tmp_path, TYPO, "--kubeconfig", kubeconfig)
        strict = await acheck(tmp_path, TYPO, "--kubeconfig", kubeconfig, "--strict")
        js = await acheck(tmp_path, TYPO, "--kubeconfig", kubeconfig, "-o", "json")
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == [
        "warning: rule typo never matches on this cluster: no ResourceSlice publishes driver "
        '"gpu.nvida.com" (closest published: "gpu.nvidia.com")',
        "warning: rule pool-typo never matches on this cluster: no ResourceSlice of driver "
        '"gpu.nvidia.com" publishes pool "nod-1" (closest published: "node-1")',
    ]
    assert strict.exit_code == 1 and strict.stderr == res.stderr
    warnings = json.loads(js.stdout)["cluster"]["warnings"]
    assert [(w["rule"], w["field"], w["value"], w["closest"]) for w in warnings] == [
        ("typo", "driver", "gpu.nvida.com", NVIDIA),
        ("pool-typo", "pool", "nod-1", "node-1"),
    ]


async def test_an_explicit_unreachable_kubeconfig_is_an_error(tmp_path: Path) -> None:
    async with cluster("1.37", tmp_path) as kubeconfig:
        pass  # stopped: nothing listens on its port any more
    res = await acheck(tmp_path, POLICY, "--kubeconfig", kubeconfig)
    assert res.exit_code == 1
    [line] = res.stderr.splitlines()
    assert line.startswith("error: cannot reach the API server at http://127.0.0.1:")
    assert "Traceback" not in res.output
    env = await asyncio.to_thread(
        check, tmp_path, POLICY, env=_env(tmp_path / "home", kubeconfig)
    )  # $KUBECONFIG asks as explicitly
    assert env.exit_code == 1 and env.stderr == res.stderr


async def test_a_default_kubeconfig_that_does_not_answer_is_skipped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    async with cluster("1.37", tmp_path) as kubeconfig:
        pass
    await asyncio.to_thread(shutil.copyfile, kubeconfig, home / ".kube" / "config")
    res = await acheck(tmp_path, POLICY, home=home)
    assert res.exit_code == 0, res.output
    assert res.stdout.endswith(OFFLINE)
    [line] = res.stderr.splitlines()
    assert line.startswith("note: cluster part skipped, checked offline: cannot reach")


def test_no_kubeconfig_checks_offline_and_says_so_in_one_line(tmp_path: Path) -> None:
    res = check(tmp_path, POLICY, env=_env(tmp_path / "home"))
    assert res.exit_code == 0, res.output
    assert res.stdout.endswith(OFFLINE) and "cluster" not in res.stdout
    [line] = res.stderr.splitlines()
    assert line.startswith("note: cluster part skipped, checked offline: no Kubernetes")
    js = check(tmp_path, POLICY, "-o", "json", env=_env(tmp_path / "home"))
    assert js.exit_code == 0
    assert "no Kubernetes configuration found" in json.loads(js.stdout)["cluster"]["skipped"]


# -- a hostile cluster ----------------------------------------------------------------------

HUGE = "gpu." + "x" * 10_000 + ".com"


class Hostile:
    """Discovery of a 1.37 server and a ResourceSlice list that never ends: a continue
    token on every page, a 10 KB driver and pool name, a new driver on every slice."""

    def __init__(self) -> None:
        self.pages = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/version", self._version)
        app.router.add_get("/apis/resource.k8s.io", self._group)
        app.router.add_get("/apis/resource.k8s.io/v1", self._resources)
        app.router.add_get("/apis/resource.k8s.io/v1/resourceslices", self._slices)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def kubeconfig(self, path: Path) -> str:
        return write_kubeconfig(self.url, path)

    async def _version(self, _request: web.Request) -> web.Response:
        return web.json_response({"major": "1", "minor": "37", "gitVersion": "v1.37.0"})

    async def _group(self, _request: web.Request) -> web.Response:
        version = {"groupVersion": "resource.k8s.io/v1", "version": "v1"}
        return web.json_response(
            {"kind": "APIGroup", "name": "resource.k8s.io", "versions": [version]}
        )

    async def _resources(self, _request: web.Request) -> web.Response:
        kinds = [("resourceslices", "ResourceSlice"), ("resourceclaims", "ResourceClaim"),
                 ("devicetaintrules", "DeviceTaintRule")]  # fmt: skip
        resources = [{"name": n, "kind": k, "namespaced": k == "ResourceClaim",
                      "singularName": "", "verbs": ["list"]} for n, k in kinds]  # fmt: skip
        return web.json_response(
            {"kind": "APIResourceList", "groupVersion": "resource.k8s.io/v1",
             "resources": resources}
        )  # fmt: skip

    async def _slices(self, request: web.Request) -> web.Response:
        page = int(request.query.get("continue") or 0)
        limit = int(request.query.get("limit") or 100)
        self.pages += 1
        items = []
        for i in range(page * limit, (page + 1) * limit):
            driver = HUGE if i == 0 else f"d{i}.example.com"
            pool = HUGE if i == 1 else f"pool-{i}"
            items.append({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": f"s-{i}"},
                "spec": {"driver": driver, "nodeName": "n",
                         "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1}},
            })  # fmt: skip
        return web.json_response(
            {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
             "metadata": {"continue": str(page + 1)}, "items": items}
        )  # fmt: skip


@pytest.fixture
async def hostile() -> AsyncIterator[Hostile]:
    server = Hostile()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_a_hostile_cluster_keeps_the_output_bounded(hostile: Hostile, tmp_path: Path) -> None:
    kubeconfig = hostile.kubeconfig(tmp_path / "kubeconfig")
    text = TYPO + f"  - name: huge\n    match: {{driver: {'y' * 200}.com}}\n"
    res = await acheck(tmp_path, text, "--kubeconfig", kubeconfig)
    assert res.exit_code == 0, res.output
    assert hostile.pages <= MAX_SLICES // SLICE_CHUNK + 1  # the endless list was cut
    lines = res.output.splitlines()
    assert len(lines) < 40 and max(map(len, lines)) < 500, res.output
    assert f"slices     {MAX_SLICES} ResourceSlice(s) read (the first ones only)" in res.stdout
    assert "and 4995 more" in res.stdout  # five drivers named
    assert "x" * 100 not in res.output  # the 10 KB names are cut everywhere
    assert (
        f"warning: rule typo may never match on this cluster: among the first {MAX_SLICES} "
        'ResourceSlices read, no ResourceSlice publishes driver "gpu.nvida.com"'
    ) in res.stderr
    js = await acheck(tmp_path, text, "--kubeconfig", kubeconfig, "-o", "json")
    slices = json.loads(js.stdout)["cluster"]["slices"]
    assert slices["complete"] is False and len(slices["drivers"]) == 20
    assert max(len(d) for d in slices["drivers"]) <= 253


async def test_observe_only_profile_rules_and_device_mode_json(tmp_path: Path) -> None:
    text = (
        POLICY
        + """profiles:
  - name: canary
    match: {driver: gpu.nvidia.com, pool: node-1}
    observeOnly: true
    rules:
      - name: canary-xid
        match: {message: "XID"}
        action: {effect: NoExecute}
"""
    )
    device = ("--device", f"{NVIDIA}/node-1/gpu-0", "--message", "XID 79", "-o", "json")
    async with cluster("1.37", tmp_path) as kubeconfig:
        js = await acheck(tmp_path, text, "--kubeconfig", kubeconfig, "-o", "json")
        explained = await acheck(tmp_path, text, "--kubeconfig", kubeconfig, *device)
    out = json.loads(js.stdout)
    [step] = steps(out, "canary-xid")
    assert (step["mode"], step["writes"], step["evictedBy"]) == ("report-only", "nothing", None)
    assert step["why"] == "profile canary is observe-only"
    got = json.loads(explained.stdout)
    assert got["rule"] == "canary-xid" and got["cluster"]["mode"]["mode"] == "taint-rules"
