"""The Helm chart with the real ``helm`` on the real control plane.

* ``helm lint`` passes on the chart (default and NVIDIA values).
* ``helm template`` and ``deploy/render.py`` (CI's renderer without helm) give the same
  objects, compared parsed and keyed by kind, namespace and name, for the default values
  and several representative value sets.
* ``helm install``, ``helm upgrade`` and ``helm uninstall`` at the release under test: the
  chart's ``kubeVersion`` admits it and the real validation and defaulting accept every
  object. No kubelet runs here, so no pod of the chart runs: its DaemonSets and
  Deployment are kept off every node by a node selector, and the test plays the kubelet
  for the policy-check hook Job's pod only (it runs that container's command,
  ``drahealth policy check``, on the policy the hook's ConfigMap holds, and writes the
  pod's phase and exit code), so helm's pre-install and pre-upgrade hooks run for real: a
  bad policy fails the upgrade and the installed policy stays.
* RBAC: each component (driver, agent, controller) runs with a token of its own
  ServiceAccount (TokenRequest) and the container args of the installed manifest, host
  paths moved under a temporary directory, and does its part of the story: the driver
  deletes the slice of a pool it no longer publishes, publishes its ResourceSlice and
  answers a prepare; the agent (observer mode, beside a kubelet played by the agent in
  kubelet mode with the admin's credentials and a fake PodResources socket) records each
  health change as an Event (a repeat within seconds patches the first one's count) and a
  ConfigMap; the device goes Unknown, Unhealthy, Healthy, Unknown and Healthy, and the
  controller writes a DeviceTaintRule with effect None and its impact summary (status),
  updates it to NoSchedule on the fault, evicts the pod through the Eviction API and
  removes the rule on recovery. Every request each component makes is recorded (a wrapper
  around its HTTP client's ``send``): a 403 fails the test, and so does a verb the chart
  grants that the component never used, unless :data:`CONDITIONAL` names the code that
  uses it and when (what is used and unused prints as ``chart rbac used|unused ...``).
* ``drahealth doctor`` run with each component's credentials agrees with what happened:
  its RBAC check passes and checks every permission the component exercised.

Timings print as ``chart <release>: <step> <seconds> s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc
import pytest
import yaml
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Node, Pod

from drahealth import api
from drahealth.cli.doctor import PERMISSIONS
from drahealth.kube import discover, make_client, resource_class
from tests.e2e.test_agent_e2e import AgentProcess
from tests.integration.node.test_observer import FakeKubelet
from tests.integration.node.test_observer import pod as podresources_entry
from tests.realk8s.harness import RELEASES, Cluster, _kubeconfig, bin_dir
from tests.realk8s.helm import helm_path, not_built_reason
from tests.realk8s.required import skip_unless_built

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "drahealth"
RELEASE = "chartrk"
FULLNAME = f"{RELEASE}-drahealth"
DRIVER = "gpu.chart.example.com"  # its own DeviceClass: no other module's is touched
NODE = "chart-node"
#: a ResourceSlice of the story's driver on its node in a pool the driver does not publish
RETIRED_SLICE = f"{NODE}-{DRIVER}-retired"
#: matches no node: the chart's DaemonSets and Deployment create no pod that would run
NOWHERE = {"drahealth.io/chart-test": "nowhere"}
COMPONENTS = ("driver", "agent", "controller")
DRAHEALTH = [sys.executable, "-c", "from drahealth.cli import main; main()"]
_EXE = Path(sys.executable).with_name("drahealth")
if _EXE.exists():
    DRAHEALTH = [str(_EXE)]

#: The story's flap hold: its device changes health five times within seconds, on purpose.
_NO_FLAP_HOLD = {"transitions": 10, "window": "30s"}
#: The values the chart is installed with: the story's policy (a fault taints at once, an
#: Unknown device gets a report-only rule, effect None; two healthy seconds recover) on
#: the chart's defaults (eviction mode evict, limits).
STORY_VALUES: dict[str, Any] = {
    "driver": {"name": DRIVER, "nodeSelector": NOWHERE},
    "agent": {"nodeSelector": NOWHERE},
    "controller": {
        "nodeSelector": NOWHERE,
        "policy": {
            "recovery": {"healthyFor": "2s"},
            "rules": [
                {"name": "unhealthy-devices", "match": {"health": ["Unhealthy"]},
                 "action": {"effect": "NoExecute"}, "hysteresis": _NO_FLAP_HOLD},
                {"name": "unknown-devices", "match": {"health": ["Unknown"]},
                 "action": {"effect": "None"}, "hysteresis": _NO_FLAP_HOLD},
            ],
        },
    },
}  # fmt: skip

#: Value sets compared between helm template and deploy/render.py.
VALUE_SETS: dict[str, Any] = {
    "default": None,
    "nvidia": CHART / "values-nvidia.yaml",
    "story": STORY_VALUES,
    "custom": {
        "image": {"repository": "registry.example.com/drahealth", "tag": "1.2.3"},
        "imagePullSecrets": [{"name": "regcred"}],
        "kubeletDir": "/var/lib/k0s/kubelet",
        "logLevel": "debug",
        "driver": {"name": "pci.example.com", "profile": "sim-pci", "claimCache": False,
                   "claimStatus": True, "withdrawUnknown": True, "privileged": True,
                   "nodeSelector": {"accelerator": "yes"},
                   "tolerations": [{"key": "gpu", "operator": "Exists",
                                    "effect": "NoSchedule"}]},
        "deviceClass": {"name": "pci-devices"},
        "controller": {"replicas": 3, "dryRun": True, "remediationMode": "node-taint"},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
    },
    "attach": {
        "driver": {"enabled": False},
        "agent": {"attach": {
            "config": {"drivers": [{"driver": "gpu.nvidia.com", "key": "uuid", "sources": [
                {"kind": "kmsg", "match": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has "
                 "fallen off the bus; a message longer than eighty columns"},
                {"kind": "dcgm", "interval": "10s", "enabled": "yes", "empty": "",
                 "note": "température ✓ <a & b>"}]}]},
            "kmsg": {"enabled": True},
            "hostPaths": [{"path": "/var/log/kern.log", "type": "File"}],
            "capabilities": ["DAC_READ_SEARCH"],
            "dcgmLocalService": {"enabled": True},
            "nvml": {"enabled": True, "runtimeClassName": "nvidia"}}},
        "controller": {"policyCheck": {"hook": False, "initContainer": False}},
    },
    "repair-and-rollup": {
        "rbac": {"create": True},
        "controller": {"policy": {
            "nodeRollup": {"taintNode": {"threshold": "50%"}},
            "rules": [{"name": "xid", "match": {"message": "(?i)xid (48|79) && <fatal>"},
                       "action": {"effect": "NoExecute"},
                       "repair": {"job": {"template": {"spec": {"containers": [
                           {"name": "reset", "image": "busybox",
                            "command": ["sh", "-c", "echo reset && sleep 1"]}]}}}}}]}},
    },
    "off": {"rbac": {"create": False}, "deviceClass": {"create": False},
            "agent": {"enabled": False}, "controller": {"enabled": False}},
}  # fmt: skip


def say(cluster_version: str, step: str, seconds: float) -> None:
    print(f"\nchart {cluster_version}: {step} {seconds:.2f} s")


# -- helm ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm_home() -> Iterator[Path]:
    skip_unless_built(not_built_reason())
    home = Path(tempfile.mkdtemp(prefix="helm-", dir="/tmp"))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _helm_env(home: Path) -> dict[str, str]:
    dirs = {"HELM_CACHE_HOME": "cache", "HELM_CONFIG_HOME": "config", "HELM_DATA_HOME": "data"}
    return {**os.environ, **{k: str(home / v) for k, v in dirs.items()}}


def helm(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm_path()), *args], env=_helm_env(home), capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


async def ahelm(home: Path, *args: str, within: float = 60) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(helm_path()), *args, env=_helm_env(home),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), within)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"helm {' '.join(args[:2])} still running after {within} s") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def values_args(values: Any, where: Path) -> list[str]:
    if values is None:
        return []
    if isinstance(values, Path):
        return ["-f", str(values)]
    where.write_text(yaml.safe_dump(values, allow_unicode=True))
    return ["-f", str(where)]


def objects(stream: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for doc in yaml.safe_load_all(stream):
        if not doc:
            continue
        meta = doc["metadata"]
        key = (doc["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in out, f"{key} twice"
        out[key] = doc
    return out


def test_helm_lint_passes(helm_home: Path) -> None:
    for extra in ([], ["-f", str(CHART / "values-nvidia.yaml")]):
        done = helm(helm_home, "lint", "--strict", str(CHART), *extra)
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        assert not [ln for ln in lines if ln.startswith("[ERROR]")], done.stdout
        notes = [ln for ln in lines if ln.startswith(("[WARNING]", "[INFO]"))]
        print(f"\nchart lint {' '.join(extra) or 'default values'}: {notes or 'clean'}")


def test_kube_version_admits_every_release_the_suite_runs_and_no_older(helm_home: Path) -> None:
    """Chart.yaml's kubeVersion, as helm reads it (install checks the server's version
    the same way)."""
    for version in [*RELEASES.values(), "v1.38.0"]:
        done = helm(helm_home, "template", RELEASE, str(CHART), "--kube-version", version)
        assert done.returncode == 0, (version, done.stderr)
    done = helm(helm_home, "template", RELEASE, str(CHART), "--kube-version", "v1.33.9")
    assert done.returncode != 0 and "kubeVersion" in done.stderr, done.stderr


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_helm_template_and_render_py_give_the_same_objects(helm_home: Path, name: str) -> None:
    args = values_args(VALUE_SETS[name], helm_home / f"{name}.yaml")
    ns = "drahealth-system"
    by_helm = helm(helm_home, "template", RELEASE, str(CHART), "--namespace", ns, *args)
    assert by_helm.returncode == 0, by_helm.stderr
    by_render = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "render.py"), str(CHART), "--release", RELEASE,
         "--namespace", ns, *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert by_render.returncode == 0, by_render.stderr
    h, r = objects(by_helm.stdout), objects(by_render.stdout)
    assert sorted(h) == sorted(r), (sorted(set(h) - set(r)), sorted(set(r) - set(h)))
    differ = [k for k in h if h[k] != r[k]]
    assert not differ, "\n".join(
        f"{k}:\n helm:   {json.dumps(h[k], sort_keys=True)}\n render: "
        f"{json.dumps(r[k], sort_keys=True)}"
        for k in differ
    )


# -- the admin's view ---------------------------------------------------------------------


def admin_request(
    cluster: Cluster, method: str, path: str, body: Any = None,
    content_type: str = "application/json",
) -> Any:  # fmt: skip
    ctx = ssl.create_default_context(cafile=cluster.ca_file)
    req = urllib.request.Request(
        cluster.apiserver + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {cluster.admin_token}", "Content-Type": content_type},
    )  # fmt: skip
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def policy_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/configmaps/{FULLNAME}-controller-policy"


async def until(check: Callable[[], Awaitable[Any]], within: float, what: str) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    t0 = time.monotonic()
    last: BaseException | None = None
    while True:
        try:
            value = await check()
            if value:
                return value
        except (ApiError, KeyError, AttributeError, TypeError, IndexError) as exc:
            last = exc
        if time.monotonic() - t0 > within:
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what} ({last!r})")
        await asyncio.sleep(0.1)


# -- the hook's pod, played ----------------------------------------------------------------


class HookKubelet:
    """Runs the policy-check hook Job's container command here and writes its pod's
    status, as the kubelet would: the hook's ConfigMap is the container's only input."""

    def __init__(self, cluster: Cluster, client: AsyncClient, namespace: str, work: Path) -> None:
        self.cluster, self.client, self.namespace, self.work = cluster, client, namespace, work
        self.done: dict[str, int] = {}  # pod name -> exit code

    async def run(self) -> None:
        while True:
            async for pod in self.client.list(
                Pod, namespace=self.namespace,
                labels={"app.kubernetes.io/component": "policy-check"},
            ):  # fmt: skip
                name = pod.metadata.name if pod.metadata else ""
                if name and name not in self.done and pod.status and pod.status.phase == "Pending":
                    self.done[name] = await self._run_pod(pod)
            await asyncio.sleep(0.1)

    async def _run_pod(self, pod: Pod) -> int:
        assert pod.spec is not None and pod.metadata is not None
        [container] = pod.spec.containers
        [volume] = [v for v in pod.spec.volumes or [] if v.configMap is not None]
        assert volume.configMap is not None
        cm = await self.client.get(ConfigMap, str(volume.configMap.name), namespace=self.namespace)
        mount = "/etc/drahealth"
        local = self.work / "hook" / str(pod.metadata.name)
        local.mkdir(parents=True, exist_ok=True)
        for key, text in (cm.data or {}).items():
            (local / key).write_text(text)
        args = [str(local) + a.removeprefix(mount) if a.startswith(mount) else a
                for a in container.args or []]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *DRAHEALTH, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        code = proc.returncode or 0
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                      "startedAt": now, "finishedAt": now}  # fmt: skip
        if code != 0:  # terminationMessagePolicy FallbackToLogsOnError
            terminated["message"] = out.decode(errors="replace")[-2048:]
        status = {"status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{
                "name": container.name, "image": container.image or "", "imageID": "",
                "ready": False, "restartCount": 0, "started": False,
                "state": {"terminated": terminated}}]}}  # fmt: skip
        admin_request(
            self.cluster, "PATCH",
            f"/api/v1/namespaces/{self.namespace}/pods/{pod.metadata.name}/status", status,
            content_type="application/merge-patch+json",
        )  # fmt: skip
        return code


async def helm_with_hooks(
    home: Path, cluster: Cluster, namespace: str, work: Path, *args: str
) -> tuple[int, str, dict[str, int]]:
    """``helm args`` while the hook pods are played; (exit code, output, hook exits)."""
    client = make_client(kubeconfig=cluster.kubeconfig)
    hooks = HookKubelet(cluster, client, namespace, work)
    player = asyncio.create_task(hooks.run())
    try:
        code, out = await ahelm(home, *args, within=90)
    finally:
        player.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await player
        await client.close()
    return code, out, hooks.done


# -- the release ------------------------------------------------------------------------------


@dataclass
class Release:
    cluster: Cluster
    home: Path
    namespace: str
    work: Path
    manifest: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    installed: bool = True
    story: Story | None = None

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return helm(self.home, *args, "--kubeconfig", self.cluster.kubeconfig,
                    "--namespace", self.namespace)  # fmt: skip


@pytest.fixture(scope="module")
def release(real_cluster: Cluster, helm_home: Path) -> Iterator[Release]:
    ns = f"chart-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="ch", dir="/tmp"))
    rel = Release(real_cluster, helm_home, ns, work)
    values = values_args(STORY_VALUES, work / "values.yaml")

    async def install() -> tuple[int, str, dict[str, int]]:
        return await helm_with_hooks(
            helm_home, real_cluster, ns, work, "install", RELEASE, str(CHART),
            "--kubeconfig", real_cluster.kubeconfig, "--namespace", ns,
            "--create-namespace", "--timeout", "60s", *values,
        )  # fmt: skip

    try:
        t0 = time.monotonic()
        code, out, hooks = asyncio.run(install())
        say(real_cluster.version, "helm install (pre-install hook played)", time.monotonic() - t0)
        assert code == 0, out
        assert list(hooks.values()) == [0], hooks
        got = rel.helm("get", "manifest", RELEASE)
        assert got.returncode == 0, got.stderr
        rel.manifest = objects(got.stdout)
        yield rel
    finally:
        if rel.installed:
            rel.helm("uninstall", RELEASE, "--timeout", "60s")
        with contextlib.suppress(Exception):
            admin_request(real_cluster, "DELETE", f"/api/v1/namespaces/{ns}")
        if os.environ.get("DRAHEALTH_REALK8S_KEEP") == "1":
            print(f"\nchart: logs and requests kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def test_install_is_accepted_by_the_real_server_and_its_hook_ran(release: Release) -> None:
    """Every object of the release exists as the server stored it (validated, defaulted);
    the hook's Job and ConfigMap were deleted once it succeeded (hook-succeeded)."""
    cluster = release.cluster
    kubectl = str(bin_dir(cluster.version) / "kubectl")
    manifest = release.work / "manifest.yaml"
    manifest.write_text(yaml.safe_dump_all(list(release.manifest.values())))
    got = subprocess.run(
        [kubectl, "--kubeconfig", cluster.kubeconfig, "get", "-f", str(manifest), "-o", "json"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    stored = json.loads(got.stdout)["items"]
    assert len(stored) == len(release.manifest)
    # defaulted by the server: e.g. the DaemonSets' revisionHistoryLimit, the pods' dnsPolicy
    for obj in stored:
        if obj["kind"] in ("DaemonSet", "Deployment"):
            assert obj["spec"]["revisionHistoryLimit"] == 10
            assert obj["spec"]["template"]["spec"]["dnsPolicy"] == "ClusterFirst"
    status = json.loads(release.helm("status", RELEASE, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed" and status["version"] == 1
    hooks = [h["name"] for h in status.get("hooks", [])]
    assert f"{FULLNAME}-controller-policy-check" in hooks, hooks
    jobs = admin_request(cluster, "GET", f"/apis/batch/v1/namespaces/{release.namespace}/jobs")
    assert not jobs["items"], "the hook Job was not deleted after it succeeded"
    print(f"\nchart {cluster.version}: {len(stored)} objects stored, kinds "
          f"{sorted({o['kind'] for o in stored})}")  # fmt: skip


# -- the story, each component with its own ServiceAccount ----------------------------------

#: Wraps every HTTP request a component's client sends; lines of JSON into the file named
#: by DRAHEALTH_TEST_REQUEST_LOG.
RECORDER = textwrap.dedent("""
    import json, os, threading

    _path = os.environ.get("DRAHEALTH_TEST_REQUEST_LOG")
    if _path:
        import httpx2

        _lock = threading.Lock()

        def _write(request, status, answer=""):
            entry = {"method": request.method, "url": str(request.url), "status": status}
            if request.method == "POST" and request.url.path.endswith("/events"):
                try:  # which Event: its name and reason
                    sent = json.loads(request.content)
                    entry["event"] = [sent["metadata"]["name"], sent.get("reason", "")]
                except (ValueError, KeyError, TypeError):
                    pass
            if answer:  # a refusal: what was sent and what the server said
                entry["answer"] = answer[:1000]
                entry["sent"] = request.content.decode(errors="replace")[:2000]
            with _lock, open(_path, "a") as f:
                f.write(json.dumps(entry) + "\\n")

        _async_send = httpx2.AsyncClient.send
        _sync_send = httpx2.Client.send

        async def _asend(self, request, *args, **kwargs):
            try:
                response = await _async_send(self, request, *args, **kwargs)
            except BaseException:
                _write(request, None)
                raise
            answer = ""
            if response.status_code >= 400 and response.status_code not in (404, 409):
                answer = (await response.aread()).decode(errors="replace")
            _write(request, response.status_code, answer)
            return response

        def _ssend(self, request, *args, **kwargs):
            try:
                response = _sync_send(self, request, *args, **kwargs)
            except BaseException:
                _write(request, None)
                raise
            answer = ""
            if response.status_code >= 400 and response.status_code not in (404, 409):
                answer = response.read().decode(errors="replace")
            _write(request, response.status_code, answer)
            return response

        httpx2.AsyncClient.send = _asend
        httpx2.Client.send = _ssend
""")


@dataclass(frozen=True)
class Access:
    """One request as RBAC sees it."""

    verb: str
    group: str
    resource: str  # with its subresource: pods/eviction
    namespace: str  # "" cluster-wide or cluster-scoped


def access_of(method: str, url: str) -> Access | None:
    """The RBAC attributes of a request; None for non-resource URLs (discovery, /version)."""
    parts = urlsplit(url)
    segs = [s for s in parts.path.split("/") if s]
    if segs[:2] == ["api", "v1"]:
        group, rest = "", segs[2:]
    elif segs[:1] == ["apis"] and len(segs) >= 3:
        group, rest = segs[1], segs[3:]
    else:
        return None
    if not rest:
        return None
    ns = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        ns, rest = rest[1], rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    query = parse_qs(parts.query)
    verb = {
        "GET": "get" if named else (
            "watch" if query.get("watch", [""])[0] in ("1", "true") else "list"),
        "POST": "create", "PUT": "update", "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }[method]  # fmt: skip
    return Access(verb, group, resource, ns)


def grants(manifest: dict[tuple[str, str, str], dict[str, Any]], sa: str) -> set[Access]:
    """Every (verb, group, resource, namespace) the release's roles grant ``sa``."""
    out: set[Access] = set()
    for (kind, ns, _name), obj in manifest.items():
        if kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("name") == sa for s in obj.get("subjects", [])):
            continue
        role_kind = obj["roleRef"]["kind"]
        role = manifest[(role_kind, ns if role_kind == "Role" else "", obj["roleRef"]["name"])]
        for rule in role.get("rules", []):
            for g in rule.get("apiGroups", []):
                for r in rule.get("resources", []):
                    for v in rule.get("verbs", []):
                        out.add(Access(v, g, r, ns if kind == "RoleBinding" else ""))
    return out


def granted(access: Access, granted_set: set[Access]) -> bool:
    return any(
        g.verb == access.verb and g.group == access.group and g.resource == access.resource
        and (g.namespace == "" or g.namespace == access.namespace)
        for g in granted_set
    )  # fmt: skip


@dataclass(frozen=True)
class Conditional:
    """Verbs the chart grants on one resource that the story may not reach: the code that
    uses them (``function`` in ``module``, whose source matches every one of ``calls``)
    and when."""

    component: str
    verbs: tuple[str, ...]
    group: str
    resource: str
    module: str
    function: str  # a qualified name in ``module``
    calls: tuple[str, ...]  # regular expressions: the requests in the function's source
    when: str

    def grants(self) -> list[tuple[str, str, str]]:
        return [(verb, self.group, self.resource) for verb in self.verbs]

    def missing_calls(self) -> list[str]:
        """What of ``calls`` the function's source no longer has (all: no function)."""
        obj: Any = importlib.import_module(self.module)
        for part in self.function.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                return list(self.calls)
        source = inspect.getsource(obj)
        return [call for call in self.calls if re.search(call, source) is None]


_R = "resource.k8s.io"
_CONTROLLER = "drahealth.remedy._controller"
#: mode taint-rules, which remediationMode auto (the chart's default) chooses where the
#: release serves DeviceTaintRule; the chart grants the rule verbs in every mode
_TAINT_RULES = ("mode taint-rules: remediationMode auto on a release that serves "
                "DeviceTaintRule (1.37 on; 1.34 to 1.36 with the DRADeviceTaints gate), or "
                "remediationMode taint-rules")  # fmt: skip
_QUARANTINE_MODULE = "drahealth.remedy._quarantine"
#: mode quarantine, which remediationMode auto chooses where no DeviceTaintRule is served
_QUARANTINE = ("mode quarantine: remediationMode auto on a release that serves no "
               "DeviceTaintRule (1.34 to 1.36 with default feature gates), or remediationMode "
               "quarantine")  # fmt: skip
#: The grants of the story's release it may not use, each with the code that does and
#: when: conditional on the release, a value or a timing, so kept. A granted verb that
#: the story does not use and this table does not name fails the test.
CONDITIONAL: tuple[Conditional, ...] = (
    Conditional(
        "driver", ("get",), _R, "resourceclaims", "drahealth.driver._prepare",
        "ClaimPreparer._fetch", (r"self\._client\.get\(ResourceClaim,",),
        "a claim to prepare that the claim cache does not hold allocated and reserved "
        "(driver.claimCache false, or the watch behind the kubelet's call)",
    ),
    Conditional(
        "controller", ("update",), "", "nodes", "drahealth.remedy._nodes",
        "NodeWriter._write", (r"self\.client\.replace\(Node\.from_dict",),
        "modes node-taint and cordon: remediationMode auto on a release that serves no "
        "DeviceTaintRule (1.34 to 1.36 with default feature gates), or remediationMode "
        "node-taint or cordon",
    ),
    Conditional(
        "controller", ("update",), "", "nodes", "drahealth.remedy._rollup",
        "NodeRollupWriter._write_taint", (r"self\.client\.replace\(Node\.from_dict",),
        "the node rollup's nodeRollup.taintNode (a node at its threshold of bad devices)",
    ),
    Conditional(
        "controller", ("list", "watch"), _R, "devicetaintrules", _CONTROLLER,
        "RemediationController._round", (r"Reflector\(self\.client, self\._rule_cls",),
        _TAINT_RULES,
    ),
    Conditional(
        "controller", ("create", "update", "delete"), _R, "devicetaintrules", _CONTROLLER,
        "RemediationController._write_rule",
        (r"self\.client\.create\(cls\.from_dict", r"self\.client\.replace\(cls\.from_dict",
         r"delete_with_preconditions\(\s*self\.client, cls,"),
        _TAINT_RULES,
    ),
    Conditional(
        "controller", ("create", "patch"), _R, "resourceclaims", _QUARANTINE_MODULE,
        "QuarantineWriter._fence",
        (r"self\.client\.create\(ResourceClaim\.from_dict",
         r"self\.client\.patch\(\s*ResourceClaim, name,"),
        _QUARANTINE + " (the patch: the reason of a device already fenced changed)",
    ),
    Conditional(
        "controller", ("get",), _R, "resourceclaims", _QUARANTINE_MODULE,
        "QuarantineWriter._fence", (r"self\.client\.get\(ResourceClaim, name,",),
        _QUARANTINE + ", a create that met a claim already there (a lost answer)",
    ),
    Conditional(
        "controller", ("patch",), _R, "resourceclaims/status", _QUARANTINE_MODULE,
        "QuarantineWriter._fence", (r"ResourceClaim\.Status,",), _QUARANTINE,
    ),
    Conditional(
        "controller", ("patch",), _R, "resourceclaims/binding", _QUARANTINE_MODULE,
        "QuarantineWriter._fence", (r"ResourceClaim\.Status,",),
        _QUARANTINE + "; never a request of its own: from 1.36 the API server asks for it "
        "before it takes the status write of an allocation "
        "(DRAResourceClaimGranularStatusAuthorization)",
    ),
    Conditional(
        "controller", ("delete",), _R, "resourceclaims", _QUARANTINE_MODULE,
        "QuarantineWriter._release", (r"self\.client\.delete\(ResourceClaim, name,",),
        _QUARANTINE + ", a quarantined device that recovered",
    ),
    Conditional(
        "controller", ("get",), "", "pods", "drahealth.remedy._evict",
        "Evictor._after_lost_answer", (r"self\.client\.get\(Pod,",),
        "an eviction request whose answer was lost (reset, timed out): the pod is read "
        "before it is asked again",
    ),
    Conditional(
        "controller", ("get",), _R, "devicetaintrules", _CONTROLLER,
        "RemediationController._involved_uid",
        (r'"DeviceTaintRule": self\._rule_cls', r"self\.client\.get\(cls,"),
        _TAINT_RULES + " (the UID of a rule an Event is about)",
    ),
    Conditional(
        "controller", ("patch",), _R, "devicetaintrules/status", _CONTROLLER,
        "RemediationController._impact_summary", (r"self\._rule_cls\.Status,",),
        _TAINT_RULES + ", on a release whose DeviceTaintRule has the effect None (1.35 on), "
        "and a rule wanting effect None (controller.dryRun, or a policy rule's)",
    ),
)  # fmt: skip


def container_of(manifest: dict[tuple[str, str, str], dict[str, Any]], kind: str,
                 component: str) -> dict[str, Any]:  # fmt: skip
    [obj] = [o for (k, _, n), o in manifest.items() if k == kind and n == f"{FULLNAME}-{component}"]
    containers: list[dict[str, Any]] = obj["spec"]["template"]["spec"]["containers"]
    return containers[0]


def localize(args: list[str], env: dict[str, str], moves: dict[str, str]) -> list[str]:
    """The container's args here: $(VAR) expanded as the kubelet does, host paths moved,
    metrics on loopback at a free port."""
    out = []
    for arg in args:
        arg = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)
        for old, new in moves.items():
            arg = arg.replace(f"={old}", f"={new}")
        arg = re.sub(r"^--metrics-host=.*", "--metrics-host=127.0.0.1", arg)
        arg = re.sub(r"^--metrics-port=.*", "--metrics-port=0", arg)
        out.append(arg)
    return out


@dataclass
class Component:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    requests: Path
    kubeconfig: Path
    proc: asyncio.subprocess.Process | None = None

    async def start(self, ready: str, within: float = 30) -> None:
        out = self.log.open("wb")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *DRAHEALTH, *self.argv, env=self.env, stdout=out, stderr=asyncio.subprocess.STDOUT
            )
        finally:
            out.close()
        t0 = time.monotonic()
        while not re.search(ready, self.output(), re.M):
            if self.proc.returncode is not None or time.monotonic() - t0 > within:
                raise AssertionError(f"{self.name} did not start:\n{self.output()[-3000:]}")
            await asyncio.sleep(0.05)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def recorded(self) -> list[dict[str, Any]]:
        try:
            lines = self.requests.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(ln) for ln in lines if ln.strip()]

    async def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        return self.proc.returncode


@dataclass
class Story:
    components: dict[str, Component]
    granted: dict[str, set[Access]]
    doctor: dict[str, dict[str, Any]]
    doctor_mode: str | None


def token_for(cluster: Cluster, ns: str, sa: str) -> str:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600}}  # fmt: skip
    answer = admin_request(cluster, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
                           body)  # fmt: skip
    return str(answer["status"]["token"])


@contextlib.asynccontextmanager
async def fake_podresources(path: Path) -> AsyncIterator[FakeKubelet]:
    fake = FakeKubelet()
    server = grpc.aio.server()
    api.podresources_v1_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    path.parent.mkdir(parents=True, exist_ok=True)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield fake
    finally:
        await server.stop(0)


async def run_story(rel: Release) -> Story:
    cluster, ns, work = rel.cluster, rel.namespace, rel.work
    version = cluster.version
    kubelet_ns = f"{ns}-kubelet"
    admin_request(cluster, "POST", "/api/v1/namespaces",
                  {"metadata": {"name": kubelet_ns}})  # fmt: skip
    base = work / "n"  # short: unix socket paths stay under 108 bytes
    kubelet_dir = base / "k"
    for d in ("plugins_registry", "plugins"):
        (kubelet_dir / d).mkdir(parents=True, exist_ok=True)
    rec = work / "rec"
    rec.mkdir()
    (rec / "sitecustomize.py").write_text(RECORDER)
    cm = admin_request(cluster, "GET", policy_path(ns))
    (work / "policy.yaml").write_text(cm["data"]["policy.yaml"])
    moves = {"/var/lib/kubelet": str(kubelet_dir), "/var/run/cdi": str(base / "cdi"),
             "/var/lib/drahealth/agent": str(base / "obs"),
             "/etc/drahealth/policy.yaml": str(work / "policy.yaml")}  # fmt: skip
    kinds = {"driver": "DaemonSet", "agent": "DaemonSet", "controller": "Deployment"}
    components: dict[str, Component] = {}
    granted_sets: dict[str, set[Access]] = {}
    for name in COMPONENTS:
        sa = f"{FULLNAME}-{name}"
        kc = work / f"{name}.kubeconfig"
        _kubeconfig(kc, cluster.apiserver, Path(cluster.ca_file), token_for(cluster, ns, sa))
        container = container_of(rel.manifest, kinds[name], name)
        env = {**os.environ, "GRPC_VERBOSITY": "ERROR", "KUBECONFIG": str(kc),
               "PYTHONPATH": os.pathsep.join([str(rec), os.environ.get("PYTHONPATH", "")]),
               "DRAHEALTH_TEST_REQUEST_LOG": str(work / f"{name}.requests")}  # fmt: skip
        for var in container.get("env", []):  # the downward API's values, as on a node
            field_path = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
            fields = {"spec.nodeName": NODE, "metadata.uid": str(uuid.uuid4()),
                      "metadata.name": f"{sa}-0"}  # fmt: skip
            env[var["name"]] = fields.get(field_path, var.get("value", ""))
        components[name] = Component(
            name, localize(container["args"], env, moves), env, work / f"{name}.log",
            work / f"{name}.requests", kc,
        )  # fmt: skip
        granted_sets[name] = grants(rel.manifest, sa)

    client = make_client(kubeconfig=cluster.kubeconfig)
    kubelet = AgentProcess(
        str(base), cluster.kubeconfig, "--node-name", NODE,
        "--registry-dir", str(kubelet_dir / "plugins_registry"), "--namespace", kubelet_ns,
        "--cdi-dir", str(base / "cdi"),
    )  # fmt: skip
    served = await discover(client)
    claim_cls = served.resource("ResourceClaim") or resource_class("ResourceClaim", "v1")
    slice_cls = served.resource("ResourceSlice") or resource_class("ResourceSlice", "v1")
    rules_version = served.api_version("DeviceTaintRule")
    rule_cls = None
    if rules_version is not None:
        rule_cls = resource_class("DeviceTaintRule", rules_version.split("/")[1])
    # the taint effect None: every DeviceTaintRule version but the 1.34 alpha API's
    effect_none = rules_version is not None and not (
        rules_version.endswith("/v1alpha3") and version.startswith("v1.34.")
    )
    doctor: dict[str, dict[str, Any]] = {}
    try:
        async with fake_podresources(kubelet_dir / "pod-resources" / "kubelet.sock") as podres:
            # what an earlier run of the driver left: the slice of a pool it no longer
            # publishes, which the driver deletes
            await client.create(slice_cls.from_dict({
                "metadata": {"name": RETIRED_SLICE},
                "spec": {"driver": DRIVER, "nodeName": NODE, "devices": [],
                         "pool": {"name": "retired", "generation": 1,
                                  "resourceSliceCount": 1}}}))  # fmt: skip
            t0 = time.monotonic()
            await asyncio.gather(
                kubelet.start(timeout=30),
                components["driver"].start(r"^ready: "),
                components["controller"].start(r"^leading: "),
            )
            say(version, "kubelet, driver and controller started", time.monotonic() - t0)
            t0 = time.monotonic()

            async def slices() -> list[Any]:
                found = [s async for s in client.list(slice_cls) if s.spec]
                mine = [s for s in found if s.spec.driver == DRIVER and s.spec.nodeName == NODE]
                return [] if any(s.spec.pool.name == "retired" for s in mine) else mine

            await until(slices, 30, "the driver's ResourceSlice and the retired pool's deleted "
                        "(driver's token)")  # fmt: skip
            say(version, "ResourceSlice published, the retired pool's deleted",
                time.monotonic() - t0)  # fmt: skip

            t0 = time.monotonic()
            await client.create(claim_cls.from_dict({
                "metadata": {"name": "trainer-gpu", "namespace": ns},
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}))  # fmt: skip
            await client.create(Pod.from_dict({
                "metadata": {"name": "trainer", "namespace": ns, "labels": {"app": "trainer"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "trainer-gpu"}],
                    "containers": [{"name": "main", "image": "busybox",
                                    "resources": {"claims": [{"name": "gpu"}]}}]}}))  # fmt: skip

            async def allocated() -> str:
                claim = await client.get(claim_cls, "trainer-gpu", namespace=ns)
                alloc = claim.status.allocation if claim.status else None
                results = alloc.devices.results if alloc and alloc.devices else None
                return str(results[0].device) if results else ""

            device = await until(allocated, 60, "the scheduler's allocation")

            async def running() -> bool:
                pod = await client.get(Pod, "trainer", namespace=ns)
                return bool(pod.status and pod.status.phase == "Running")

            await until(running, 60, "the pod Running (prepared by the driver's token)")
            say(version, "claim allocated, prepared, pod Running", time.monotonic() - t0)

            podres.pods = [podresources_entry("trainer", (DRIVER, NODE, device),
                                              claim="trainer-gpu", ns=ns)]  # fmt: skip
            t0 = time.monotonic()
            await components["agent"].start(r"^ready: ")
            say(version, "observer agent started", time.monotonic() - t0)

            t0 = time.monotonic()
            state = kubelet_dir / "plugins" / DRIVER
            agent, controller = components["agent"], components["controller"]

            async def health(action: str, *args: str) -> None:
                rc = await inject(state, device, action, *args)
                assert rc[0] == 0, rc

            def event_writes() -> list[tuple[str, str, str]]:
                """The observer agent's Event writes that went through, in order:
                (method, Event name, reason: only for a create)."""
                out = []
                for r in agent.recorded():
                    path = urlsplit(r["url"]).path
                    if "/events" not in path or r["status"] not in (200, 201):
                        continue
                    name, reason = r.get("event") or [path.rsplit("/", 1)[-1], ""]
                    out.append((r["method"], name, reason))
                return out

            async def event(reason: str) -> str:
                """The name of the agent's (first) Event ``reason``; "" before it."""
                return next((n for m, n, why in event_writes()
                             if m == "POST" and why == reason), "")  # fmt: skip

            async def on_the_pod(reason: str) -> bool:
                """An Event ``reason`` about the pod, naming its UID, as the server has it."""
                events = [e async for e in client.list(Event, namespace=ns)]
                return any(
                    e.reason == reason and e.involvedObject.name == "trainer"
                    and e.involvedObject.uid for e in events
                )  # fmt: skip

            async def rule(effect: str | None = None) -> Any:
                assert rule_cls is not None
                async for r in client.list(rule_cls):
                    sel = r.spec.deviceSelector if r.spec else None
                    if sel is not None and sel.driver == DRIVER and sel.device == device:
                        return r if effect is None or r.spec.taint.effect == effect else None
                return None

            def rule_writes(method: str, status: bool = False) -> bool:
                """Whether the controller's ``method`` of its rule (or its status) went
                through."""
                tail = r"/devicetaintrules/[^/]+" + ("/status" if status else "") + "$"
                return any(
                    r["method"] == method and r["status"] in (200, 201)
                    and re.search(tail, urlsplit(r["url"]).path) for r in controller.recorded()
                )  # fmt: skip

            async def went(check: Callable[[], bool]) -> bool:
                return check()

            # 1. Unknown: the agent's Event; the report-only rule (effect None) and its
            # impact summary in status.conditions
            await health("unknown", "--message", "no report")
            await until(lambda: event("DeviceHealthUnknown"), 30,
                        "the agent's DeviceHealthUnknown Event on the pod")  # fmt: skip
            if effect_none:
                await until(lambda: rule("None"), 30, "the controller's rule with effect None")
                await until(lambda: went(lambda: rule_writes("PATCH", status=True)), 30,
                            "the controller's impact summary in the rule's status")  # fmt: skip
            say(version, "Unknown -> agent's Event, rule effect None (controller's token)",
                time.monotonic() - t0)  # fmt: skip

            # 2. the fault: the agent's Event, the rule updated, the pod evicted
            t0 = time.monotonic()
            await health("unhealthy", "--message", "XID 79")
            await until(lambda: event("DeviceUnhealthy"), 30,
                        "the agent's DeviceUnhealthy Event on the pod")  # fmt: skip
            await until(lambda: on_the_pod("DeviceUnhealthy"), 30, "the Event with the pod's UID")
            say(version, "fault -> agent's Event (agent's token)", time.monotonic() - t0)
            if rules_version is not None:
                await until(lambda: rule("NoSchedule"), 30, "the controller's NoSchedule rule")
                if effect_none:  # the rule with effect None became this one
                    await until(lambda: went(lambda: rule_writes("PUT")), 30,
                                "the controller's update of its rule")  # fmt: skip
                say(version, f"fault -> {rules_version} DeviceTaintRule (controller's token)",
                    time.monotonic() - t0)  # fmt: skip

            async def gone() -> bool:
                try:
                    await client.get(Pod, "trainer", namespace=ns)
                except ApiError as exc:
                    return exc.status.code == 404
                return False

            await until(gone, 60, "the pod evicted by the controller")
            say(version, "fault -> pod evicted (controller's token)", time.monotonic() - t0)

            # 3. Healthy, Unknown again, Healthy again within seconds: the agent folds the
            # second DeviceHealthy Event into the first (a patch of its count)
            t0 = time.monotonic()
            await health("healthy")
            first = await until(lambda: event("DeviceHealthy"), 30,
                                "the agent's DeviceHealthy Event")  # fmt: skip
            before = len(event_writes())
            await health("unknown", "--message", "no report")
            await until(lambda: went(lambda: len(event_writes()) > before), 30,
                        "the agent's second DeviceHealthUnknown Event (or its count)")  # fmt: skip
            if effect_none:
                await until(lambda: rule("None"), 30, "the rule back to effect None")
            await health("healthy")
            await until(lambda: went(lambda: ("PATCH", first, "") in event_writes()), 30,
                        "the agent's patch of the repeated DeviceHealthy Event")  # fmt: skip
            say(version, "flap -> agent's Event count patched (agent's token)",
                time.monotonic() - t0)  # fmt: skip
            if rules_version is not None:

                async def no_rule() -> bool:
                    return await rule() is None

                await until(no_rule, 30, "the rule removed on recovery")
                say(version, "recovery -> rule removed", time.monotonic() - t0)

            t0 = time.monotonic()
            doctor = await run_doctors(components, ns, base)
            say(version, "doctor with each component's token", time.monotonic() - t0)
    finally:
        for comp in components.values():
            await comp.stop()
        await kubelet.stop()
        with contextlib.suppress(ApiError):
            await client.delete(Node, NODE)  # its ResourceSlices go with it (owner)
        with contextlib.suppress(ApiError):  # no owner: gone unless the driver did not run
            await client.delete(slice_cls, RETIRED_SLICE)
        if rule_cls is not None:  # a story cut short leaves no rule of its driver
            with contextlib.suppress(ApiError):
                async for r in client.list(rule_cls):
                    sel = r.spec.deviceSelector if r.spec else None
                    if sel is not None and sel.driver == DRIVER and r.metadata:
                        await client.delete(rule_cls, r.metadata.name)
        with contextlib.suppress(ApiError):
            await client.delete(Namespace, kubelet_ns)
        await client.close()
    mode = next((d.get("mode") for d in doctor.values() if d.get("mode")), None)
    return Story(components, granted_sets, doctor, mode)


async def inject(state: Path, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *DRAHEALTH, "inject", "--state-dir", str(state), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def run_doctors(
    components: dict[str, Component], ns: str, node_root: Path
) -> dict[str, dict[str, Any]]:
    async def one(comp: Component) -> tuple[str, dict[str, Any]]:
        proc = await asyncio.create_subprocess_exec(
            *DRAHEALTH, "doctor", "--kubeconfig", str(comp.kubeconfig), "--component",
            comp.name, "--namespace", ns, "--node-root", str(node_root), "--kubelet-dir", "/k",
            "-o", "json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        try:
            doc: dict[str, Any] = json.loads(out)
        except ValueError:
            raise AssertionError(f"doctor {comp.name}: {out!r} {err!r}") from None
        doc["exitCode"] = proc.returncode
        return comp.name, doc

    return dict(await asyncio.gather(*(one(c) for c in components.values())))


@pytest.fixture(scope="module")
def story(release: Release) -> Story:
    if release.story is None:
        t0 = time.monotonic()
        release.story = asyncio.run(run_story(release))
        say(release.cluster.version, "the whole story", time.monotonic() - t0)
    return release.story


def exercised(comp: Component) -> tuple[set[Access], list[str], list[str]]:
    """(the accesses it made, its denied requests, other requests that failed)."""
    used: set[Access] = set()
    denied, failed = [], []
    for req in comp.recorded():
        status, what = req["status"], f"{req['method']} {urlsplit(req['url']).path}"
        if status == 403:
            denied.append(f"{what} -> 403")
        elif status is None or status == 401 or status >= 500:
            failed.append(f"{what} -> {status}")
        else:  # authorized: any other answer comes after the authorizer said yes
            access = access_of(req["method"], req["url"])
            if access is not None:
                used.add(access)
    return used, denied, failed


@pytest.mark.parametrize("name", COMPONENTS)
def test_component_does_its_part_with_exactly_the_charts_rights(story: Story, name: str) -> None:
    comp = story.components[name]
    used, denied, _failed = exercised(comp)
    assert comp.recorded(), f"{name}: no request recorded (the recorder did not load)"
    assert not denied, f"{name} was refused:\n" + "\n".join(denied)
    log = comp.output()
    # (not a log line's milliseconds: "00:03:44,403")
    assert not re.search(r"(?<!,)\b403\b|forbidden", log, re.I), f"{name} log:\n{log[-3000:]}"
    beyond = sorted(str(a) for a in used if not granted(a, story.granted[name])
                    and a.group != "authorization.k8s.io")  # fmt: skip
    assert not beyond, f"{name} used what the chart does not grant: {beyond}"
    unused = sorted({
        (g.verb, g.group, g.resource) for g in story.granted[name]
        if not any(u.verb == g.verb and u.group == g.group and u.resource == g.resource
                   for u in used)
    })  # fmt: skip
    kept = {g for c in CONDITIONAL if c.component == name for g in c.grants()}
    print(f"\nchart rbac used {name}: " + ", ".join(sorted({
        f"{u.verb} {u.resource}" + (f".{u.group}" if u.group else "") for u in used})))  # fmt: skip
    print(f"chart rbac unused {name}: " + (", ".join(
        f"{v} {r}" + (f".{g}" if g else "") + (" (conditional)" if (v, g, r) in kept else "")
        for v, g, r in unused) or "none"))  # fmt: skip
    unexplained = [f"{v} {r}" + (f".{g}" if g else "") for v, g, r in unused
                   if (v, g, r) not in kept]  # fmt: skip
    assert not unexplained, (
        f"the chart grants {name} what it never used in the story and CONDITIONAL does not "
        f"explain: {unexplained}"
    )


def test_each_conditional_grant_is_granted_and_names_the_code_that_uses_it(
    story: Story,
) -> None:
    """The table of kept grants cannot rot: each is still granted to its component by
    the story's release, and its function still exists and makes the request."""
    for c in CONDITIONAL:
        granted_now = {(g.verb, g.group, g.resource) for g in story.granted[c.component]}
        assert set(c.grants()) <= granted_now, (c.component, c.grants())
        missing = c.missing_calls()
        assert not missing, f"{c.component}: {c.module}:{c.function} no longer has {missing}"


@pytest.mark.parametrize("name", COMPONENTS)
def test_component_writes_pass_the_real_validation(story: Story, name: str) -> None:
    """No request the component made was refused as invalid (400, 422)."""
    refused = [
        f"{r['method']} {urlsplit(r['url']).path} -> {r['status']}: {r.get('answer', '')[:300]}"
        for r in story.components[name].recorded()
        if r["status"] in (400, 422)
    ]
    assert not refused, f"the real API server refused {name}'s requests:\n" + "\n".join(
        dict.fromkeys(refused)
    )


@pytest.mark.parametrize("name", COMPONENTS)
def test_doctor_with_the_components_token_agrees_with_what_it_did(story: Story, name: str) -> None:
    doc = story.doctor[name]
    checks = {c["check"]: c for c in doc["checks"]}
    summary = ", ".join(f"{c['check']} {c['status']}" for c in doc["checks"])
    print(f"\nchart doctor {name}: {summary}")
    rbac = checks[f"rbac:{name}"]
    assert rbac["status"] == "ok", rbac
    fails = [c for c in doc["checks"] if c["status"] == "FAIL"]
    assert not fails and doc["exitCode"] == 0, f"doctor {name} reports blockers: {fails}"
    mode = story.doctor_mode or doc.get("mode")
    checked: set[tuple[str, str, str]] = set()
    for p in PERMISSIONS[name]:
        if p.when == "rules" and mode not in (None, "taint-rules"):
            continue
        if p.when == "nodes" and mode not in ("node-taint", "cordon"):
            continue
        for verb in p.verbs:
            checked.add((verb, p.group, p.name()))
    used, _denied, _failed = exercised(story.components[name])
    unchecked = sorted(
        f"{u.verb} {u.resource}" + (f".{u.group}" if u.group else "")
        for u in used
        if (u.verb, u.group, u.resource) not in checked and u.group != "authorization.k8s.io"
    )
    assert not unchecked, f"doctor --component {name} does not check what it used: {unchecked}"


def test_upgrade_refused_by_the_hook_then_accepted_then_uninstall(release: Release) -> None:
    """A bad policy fails ``helm upgrade`` in its pre-upgrade hook (the installed policy
    stays); a good upgrade goes through; ``helm uninstall`` leaves none of its objects."""
    cluster, ns, work = release.cluster, release.namespace, release.work
    before = admin_request(cluster, "GET", policy_path(ns))
    bad = json.loads(json.dumps(STORY_VALUES))
    bad["controller"]["policy"]["rules"] = []
    good = json.loads(json.dumps(STORY_VALUES))
    good["logLevel"] = "debug"

    async def upgrade(values: Any, name: str) -> tuple[int, str, dict[str, int]]:
        return await helm_with_hooks(
            release.home, cluster, ns, work, "upgrade", RELEASE, str(CHART),
            "--kubeconfig", cluster.kubeconfig, "--namespace", ns, "--timeout", "60s",
            *values_args(values, work / f"{name}.yaml"),
        )  # fmt: skip

    t0 = time.monotonic()
    code, out, hooks = asyncio.run(upgrade(bad, "bad"))
    say(cluster.version, "helm upgrade refused by the hook", time.monotonic() - t0)
    assert code != 0 and "pre-upgrade hooks failed" in out, out
    assert list(hooks.values()) == [1], hooks
    after = admin_request(cluster, "GET", policy_path(ns))
    assert after["data"] == before["data"], "a refused upgrade changed the installed policy"

    t0 = time.monotonic()
    code, out, hooks = asyncio.run(upgrade(good, "good"))
    say(cluster.version, "helm upgrade", time.monotonic() - t0)
    assert code == 0, out
    assert list(hooks.values()) == [0], hooks
    status = json.loads(release.helm("status", RELEASE, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed" and status["version"] == 3, status["info"]
    ds = admin_request(cluster, "GET", f"/apis/apps/v1/namespaces/{ns}/daemonsets/{FULLNAME}-agent")
    assert "--log-level=debug" in ds["spec"]["template"]["spec"]["containers"][0]["args"]

    t0 = time.monotonic()
    done = release.helm("uninstall", RELEASE, "--timeout", "60s")
    say(cluster.version, "helm uninstall", time.monotonic() - t0)
    assert done.returncode == 0, done.stderr
    release.installed = False
    left = []
    for kind, obj_ns, name in release.manifest:
        path = {
            "ClusterRole": f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}",
            "ClusterRoleBinding": f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}",
            "DeviceClass": f"/apis/resource.k8s.io/v1/deviceclasses/{name}",
            "ServiceAccount": f"/api/v1/namespaces/{obj_ns}/serviceaccounts/{name}",
            "ConfigMap": f"/api/v1/namespaces/{obj_ns}/configmaps/{name}",
        }.get(kind)
        if path is None:
            continue
        with contextlib.suppress(urllib.error.HTTPError):
            obj = admin_request(cluster, "GET", path)
            if not obj.get("metadata", {}).get("deletionTimestamp"):
                left.append(f"{kind}/{name}")
    assert not left, f"helm uninstall left {left}"
