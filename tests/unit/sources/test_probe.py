"""Exec and file probes: exit codes, timeouts, placeholders, stale and malformed files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from drahealth.core import Health
from drahealth.driver import DeviceReport
from drahealth.sources import ExecProbe, FileProbe

H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN
DEVS = [("node-1", "gpu-0"), ("node-1", "gpu-1")]
PY = sys.executable


def script(body: str) -> list[str]:
    return [PY, "-c", body, "{pool}", "{device}"]


def test_exit_codes_map_to_health_and_first_line_to_message() -> None:
    body = (
        "import os, sys\n"
        "d = sys.argv[2]\n"
        "assert os.environ['DRAHEALTH_DEVICE'] == d and sys.argv[1] == 'node-1'\n"
        "print('\\n  ' + d + ' checked\\nsecond line')\n"
        "sys.exit({'gpu-0': 0, 'gpu-1': 1}[d])"
    )
    probe = ExecProbe(script(body), DEVS)
    assert probe.poll() == [
        DeviceReport("node-1", "gpu-0", H, "gpu-0 checked"),
        DeviceReport("node-1", "gpu-1", U, "gpu-1 checked"),
    ]


def test_other_exit_codes_timeouts_and_missing_commands_are_unknown() -> None:
    assert ExecProbe(script("import sys; sys.exit(3)"), DEVS[:1]).poll() == [
        DeviceReport("node-1", "gpu-0", X, "probe exited with 3")
    ]
    assert ExecProbe(script("import sys; sys.exit(1)"), DEVS[:1]).poll()[0].message == (
        "probe failed (exit 1)"
    )
    slow = ExecProbe(script("import time; time.sleep(5)"), DEVS[:1], timeout={"gpu-0": 0.2})
    assert slow.timeout_for("gpu-0") == 0.2 and slow.timeout_for("other") == 10.0
    assert slow.poll()[0] == DeviceReport("node-1", "gpu-0", X, f"probe {PY} timed out after 0.2 s")
    missing = ExecProbe(["/nonexistent/probe"], DEVS[:1]).poll()[0]
    assert missing.health is X and "could not run: No such file or directory" in missing.message
    with pytest.raises(ValueError, match="non-empty list"):
        ExecProbe([], DEVS)


def write(path: Path, data: object) -> None:
    path.write_text(json.dumps(data))


def test_file_probe_reads_fresh_entries(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    entries = [
        {"device": "gpu-0", "health": "Healthy", "time": 1000.0},
        {"pool": "node-1", "device": "gpu-1", "health": "Unhealthy", "message": "ECC", "time": 990},
    ]
    write(path, {"devices": entries})
    probe = FileProbe(str(path), DEVS, max_age={"*": 60, "gpu-1": 5}, clock=lambda: 1001.0)
    assert probe.poll() == [
        DeviceReport("node-1", "gpu-0", H, ""),
        DeviceReport("node-1", "gpu-1", X, f"{path}: no update for 11 s"),
    ]


def test_file_probe_uses_the_file_time_and_lists_missing_devices(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    write(path, {"devices": [{"device": "gpu-0", "health": "Unhealthy", "message": "hot"}]})
    fresh = FileProbe(str(path), DEVS, max_age=60).poll()
    assert fresh == [
        DeviceReport("node-1", "gpu-0", U, "hot"),
        DeviceReport("node-1", "gpu-1", X, f"not listed in {path}"),
    ]
    stale = FileProbe(str(path), DEVS[:1], max_age=60, clock=lambda: path.stat().st_mtime + 61)
    assert stale.poll()[0].health is X


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "is not JSON: Expecting property name enclosed in double quotes at line 1"),
        ("[]", 'the top level must be an object with a "devices" list'),
        ('{"devices": [1]}', "devices[0] must be an object"),
        ('{"devices": [{"health": "Healthy"}]}', "devices[0].device must be a non-empty string"),
        ('{"devices": [{"device": "gpu-0", "health": "fine"}]}', "devices[0].health must be"),
        (
            '{"devices": [{"device": "gpu-0", "health": "Healthy", "time": "now"}]}',
            "devices[0].time must be unix seconds",
        ),
    ],
)
def test_malformed_files_make_every_device_unknown(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "health.json"
    path.write_text(content)
    reports = FileProbe(str(path), DEVS).poll()
    assert [r.health for r in reports] == [X, X]
    assert problem in reports[0].message and str(path) in reports[0].message


def test_a_missing_file_is_unknown(tmp_path: Path) -> None:
    reports = FileProbe(str(tmp_path / "nope.json"), DEVS).poll()
    assert reports[0] == DeviceReport(
        "node-1", "gpu-0", X, f"probe file {tmp_path}/nope.json does not exist"
    )
