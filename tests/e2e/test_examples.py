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
