"""``drahealth apiserver --with-controllers`` with a driver and a kubelet-mode agent, driven
by real kubectl with the YAML examples of ``docs/examples/``.

The sequence ``docs/apiserver.md`` shows a driver author: the API server with the stand-in
controllers as one process, then for node ``node-1`` the sample driver (``drahealth
driver``) and the node agent playing the kubelet (``drahealth agent --mode kubelet``) as
two more, then ``kubectl apply -f`` of every example file. Checks that every file is
applied, that the pod, the pod on the shared claim and the Deployment's two pods run with
devices of their own claims (the driver's CDI environment in their logs), that the
DeviceTaintRule keeps its device out of every allocation, that a template change rolls the
Deployment to a new ReplicaSet, and that the server stops cleanly on SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import pytest

BIN = Path(sys.executable).with_name("drahealth")
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
#: the order docs/apiserver.md applies them in
ORDER = (
    "deviceclass.yaml",
    "devicetaintrule.yaml",
    "resourceclaimtemplate.yaml",
    "resourceclaim.yaml",
    "pod.yaml",
    "pod-shared-claim.yaml",
    "deployment.yaml",
)
NODE = "node-1"
T = TypeVar("T")

pytestmark = [
    pytest.mark.skipif(KUBECTL is None, reason="kubectl not found next to the interpreter"),
    pytest.mark.timeout(180),
]


def until(check: Callable[[], T | None], within: float, what: str) -> T:
    deadline = time.monotonic() + within
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        time.sleep(0.2)


@dataclass
class Cluster:
    kubeconfig: Path
    apiserver: subprocess.Popen[str]
    banner: str
    logs: Path

    def kubectl(self, *args: str) -> str:
        assert KUBECTL is not None
        res = subprocess.run(
            [KUBECTL, "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {res.stderr}{self.tail()}")
        return res.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def tail(self) -> str:
        return "".join(
            f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.logs.glob("*.log"))
        )


def _spawn(args: list[str], log: IO[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [str(BIN), *args], stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{proc.args!r} did not stop within 20 s of SIGTERM") from None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("apiserver-controllers")
    kubeconfig = tmp / "kubeconfig"
    with open(tmp / "apiserver.log", "w") as log:
        server = _spawn(
            ["apiserver", "--with-controllers", "--kubeconfig-out", str(kubeconfig)], log
        )
    procs: list[subprocess.Popen[str]] = []
    try:
        banner = until(
            lambda: (lambda t: t if "listening on" in t else None)(
                (tmp / "apiserver.log").read_text()
            )
            or (server.poll() is not None and "exited") or None,
            60, "the API server to listen",
        )  # fmt: skip
        assert server.poll() is None, (tmp / "apiserver.log").read_text()
        node = tmp / NODE
        for kind, args in (
            ("driver", [
                "driver", "--driver-name", "gpu.example.com", "--node-name", NODE,
                "--registry-dir", str(node / "reg"), "--plugins-dir", str(node / "plugins"),
                "--cdi-dir", str(node / "cdi"), "--state-dir", str(node / "driver"),
                "--kubeconfig", str(kubeconfig),
            ]),
            ("agent", [
                "agent", "--mode", "kubelet", "--node-name", NODE,
                "--registry-dir", str(node / "reg"), "--state-dir", str(node / "agent"),
                "--cdi-dir", str(node / "cdi"), "--kubeconfig", str(kubeconfig),
            ]),
        ):  # fmt: skip
            with open(tmp / f"{kind}.log", "w") as log:
                procs.append(_spawn(args, log))
        for kind in ("driver", "agent"):
            until(
                lambda k=kind: "ready: " in (tmp / f"{k}.log").read_text(),  # type: ignore[misc]
                60, f"the {kind} to be ready",
            )  # fmt: skip
        yield Cluster(kubeconfig, server, banner, tmp)
    finally:
        for proc in reversed(procs):
            _stop(proc)
        _stop(server)


def _device(claim: dict[str, Any]) -> str:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    (result,) = (alloc.get("devices") or {}).get("results") or [{}]
    return f"{result.get('pool')}/{result.get('device')}"


def _pod_claim(c: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    name = pod["metadata"]["name"]
    (status,) = pod["status"].get("resourceClaimStatuses") or [
        {"resourceClaimName": pod["spec"]["resourceClaims"][0].get("resourceClaimName")}
    ]
    claim: dict[str, Any] = c.get("resourceclaim", status["resourceClaimName"])
    assert any(r["name"] == name for r in claim["status"]["reservedFor"]), claim
    return claim


def test_banner_says_what_runs(cluster: Cluster) -> None:
    """The command says which controllers run and where the kubeconfig is."""
    assert f"kubeconfig: {cluster.kubeconfig}" in cluster.banner
    for controller in ("scheduler", "resourceclaim", "ReplicaSet", "Deployment", "Job"):
        assert controller in cluster.banner, cluster.banner
    assert "device-taint eviction" in cluster.banner  # the newest release evicts


def test_every_example_applies_and_pods_get_devices(cluster: Cluster) -> None:
    assert sorted(ORDER) == sorted(p.name for p in EXAMPLES.glob("*.yaml")), (
        "a file in docs/examples/ is not applied by this test"
    )
    nodes = cluster.get("nodes")["items"]
    assert [n["metadata"]["name"] for n in nodes] == [NODE]
    for name in ORDER:
        out = cluster.kubectl("apply", "-f", str(EXAMPLES / name))
        assert "created" in out, out
    cluster.kubectl("wait", "pod/gpu-pod", "pod/shared-gpu-pod", "--for=condition=Ready",
                    "--timeout=60s")  # fmt: skip
    cluster.kubectl("wait", "deployment/trainer", "--for=condition=Available", "--timeout=60s")
    pods = {p["metadata"]["name"]: p for p in cluster.get("pods")["items"]}
    trainers = [n for n in pods if n.startswith("trainer-")]
    assert len(trainers) == 2, sorted(pods)
    devices = {}
    for name in ["gpu-pod", "shared-gpu-pod", *trainers]:
        pod = pods[name]
        assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == NODE
        devices[name] = _device(_pod_claim(cluster, pod))
        env = [ln for ln in cluster.kubectl("logs", name).splitlines() if "DRA_DEVICE_" in ln]
        assert env, f"{name}: no device in the container's environment"
    assert len(set(devices.values())) == 4, devices  # one GPU each
    assert f"{NODE}/gpu-0" not in devices.values(), "the tainted GPU was allocated"
    shared = cluster.get("resourceclaim", "shared-gpu")
    assert _device(shared) == devices["shared-gpu-pod"]
    deploy = cluster.get("deployment", "trainer")
    assert deploy["status"]["readyReplicas"] == 2 and deploy["status"]["updatedReplicas"] == 2
    (rs,) = cluster.get("replicasets")["items"]
    assert re.fullmatch(r"trainer-[a-z0-9]{10}", rs["metadata"]["name"])
    table = cluster.kubectl("get", "deployment", "trainer")
    assert re.search(r"^trainer\s+2/2\s+2\s+2\s", table, re.M), table
    # applying the same files again changes no spec (kubectl says "configured" for the
    # claim and template, whose atomic request lists it patches, as on a real cluster;
    # status writers may move resourceVersions meanwhile, generations stay)
    files = [a for n in ORDER for a in ("-f", str(EXAMPLES / n))]

    def versions() -> dict[str, Any]:
        # the generation where the kind has one upstream, else the spec itself
        # (a ResourceClaimTemplate or DeviceClass has none)
        return {
            f"{o['kind']}/{o['metadata']['name']}": o["metadata"].get("generation")
            or json.dumps(o.get("spec"), sort_keys=True)
            for o in cluster.get(*files)["items"]
        }

    before = versions()
    assert len(before) == len(ORDER)
    cluster.kubectl("apply", *files)
    assert versions() == before


def test_deployment_template_change_and_delete(cluster: Cluster) -> None:
    """A template change makes a new ReplicaSet and scales the old one to 0 (Recreate);
    deleting the Deployment removes its ReplicaSets and pods, and their claims go."""
    cluster.kubectl("wait", "deployment/trainer", "--for=condition=Available", "--timeout=60s")
    (old,) = cluster.get("replicasets")["items"]
    cluster.kubectl("set", "env", "deployment/trainer", "MODE=second")

    def rolled() -> list[str] | None:
        sets = {
            r["metadata"]["name"]: r["spec"]["replicas"]
            for r in cluster.get("replicasets")["items"]
        }
        new = [n for n, replicas in sets.items() if n != old["metadata"]["name"] and replicas]
        return new if sets.get(old["metadata"]["name"]) == 0 and len(new) == 1 else None

    (new,) = until(rolled, 30, "a new ReplicaSet with the old one scaled to 0")
    cluster.kubectl("rollout", "status", "deployment/trainer", "--timeout=60s")
    cluster.kubectl("wait", "deployment/trainer", "--for=condition=Available", "--timeout=60s")
    pods = [p for p in cluster.get("pods")["items"] if p["metadata"]["name"].startswith(new)]
    assert len(pods) == 2
    cluster.kubectl("delete", "deployment", "trainer")

    def gone() -> bool:
        left = [
            p["metadata"]["name"] for p in cluster.get("pods")["items"]
            if p["metadata"]["name"].startswith("trainer-")
        ]  # fmt: skip
        return not left and not cluster.get("replicasets")["items"]

    until(gone, 60, "the Deployment's ReplicaSets and pods to go")


def test_clean_shutdown_on_sigterm(cluster: Cluster) -> None:
    """Last: SIGTERM stops the server and its controllers with exit status 0."""
    assert _stop(cluster.apiserver) == 0, cluster.tail()
