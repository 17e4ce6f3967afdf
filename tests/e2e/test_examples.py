"""The runnable examples run: each exits 0 and prints what its docstring promises."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(120)


def test_node_agent_quickstart_with_the_custom_driver() -> None:
    """The agent (kubelet mode) serves a third-party driver: examples/custom_driver.py."""
    proc = subprocess.run(
        [sys.executable, f"{ROOT}/examples/node_agent_quickstart.py"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == [
        "1. prepared and running",
        "2. card broken",
        "3. card repaired",
    ]
    assert lines[0].endswith("fpga-2: Healthy")
    assert "-fpga-2: Unhealthy fault file " in lines[1]
    assert lines[2].endswith("fpga-2: Healthy")


def _policy_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "drahealth",
            "policy",
            "check",
            f"{ROOT}/examples/policy.yaml",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_example_policy_passes_policy_check_and_uses_the_guard_rails() -> None:
    """examples/policy.yaml is valid and shows the fleet features: limits, a profile in
    observe-only, burn-in, an ignored application XID, a degraded outcome, a repair Job."""
    done = _policy_check()
    assert done.returncode == 0, done.stderr
    assert "valid, 5 rule(s)" in done.stdout
    assert "limits       cluster 10%" in done.stdout
    assert "h200-canary" in done.stdout and "observe-only" in done.stdout
    assert "burn-in" in done.stdout

    device = ("--device", "gpu.example.com/node-1/gpu-0", "--health", "Unhealthy")
    ignored = _policy_check(*device, "--message", "XID 13: Graphics Engine Exception")
    assert ignored.returncode == 0 and "ignored by rule application-xid" in ignored.stdout
    degraded = _policy_check(*device, "--message", "ECC: Page retirement pending")
    assert degraded.returncode == 0 and "ecc-pages-retired" in degraded.stdout
    fatal = _policy_check(*device, "--message", "XID 79: GPU has fallen off the bus")
    assert fatal.returncode == 0, fatal.stderr
    assert "rule gpu-fatal-xid" in fatal.stdout
    assert "NoExecute" in fatal.stdout and "repair       job once drained" in fatal.stdout
