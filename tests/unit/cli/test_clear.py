"""``drahealth clear``: what it prints of the state, the request it keeps, bad input."""

from __future__ import annotations

import datetime as dt

from click.testing import CliRunner

from drahealth.cli import main
from drahealth.cli.clear import _prune, clear_lines
from drahealth.core import DeviceKey

DEV = DeviceKey("gpu.example.com", "node-1", "gpu-0")


def test_lines_say_why_and_the_repair() -> None:
    state = {
        "needsHuman": {str(DEV): {"since": "T", "why": "3 bad episodes within 24h",
                                  "rule": "xid", "node": "node-1"}},
        "repairs": {str(DEV): {"kind": "job", "phase": "failed", "attempt": 3, "detail": "x"}},
    }  # fmt: skip
    lines = clear_lines(DEV, state)
    assert lines[0].endswith("3 bad episodes within 24h (rule xid, node node-1)")
    assert lines[1] == "repair: job failed, attempt 3: x"
    assert "not marked" in clear_lines(DEV, {})[0]


def test_old_requests_are_dropped() -> None:
    now = dt.datetime(2027, 1, 31, tzinfo=dt.UTC)
    kept = _prune(
        {"a/b/c": {"at": "2027-01-30T00:00:00Z"}, "a/b/d": {"at": "2026-12-01T00:00:00Z"},
         "a/b/e": {"at": "nonsense"}},
        now,
    )  # fmt: skip
    assert list(kept) == ["a/b/c"]


def test_a_bad_device_is_a_usage_error(tmp_path: object) -> None:
    result = CliRunner().invoke(main, ["clear", "--kubeconfig", "/nonexistent", "gpu-0"])
    assert result.exit_code == 2 and "DRIVER/POOL/DEVICE" in result.output
