"""``drahealth doctor --policy`` against hostile files (held): each is refused before any
request, in one line naming the file and what is wrong, without reading past the limit
or waiting on a FIFO."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from drahealth.cli import main

pytestmark = pytest.mark.timeout(20)


def _files(tmp: Path) -> dict[str, tuple[str, str]]:
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    (tmp / "huge.yaml").write_bytes(b"a" * (3 << 20))
    (tmp / "binary.yaml").write_bytes(b"\xff\xfe\x00policy")
    (tmp / "deep.yaml").write_text("a: " + "[" * 100_000)
    (tmp / "wrong.yaml").write_text(
        "apiVersion: drahealth.io/v1\nkind: RemediationPolicy\nrules: 5\n"
    )
    (tmp / "alias.yaml").write_text(
        "a: &a [x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n"
                  for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    )  # fmt: skip
    return {
        "fifo": (str(fifo), "not a regular file"),
        "device": ("/dev/zero", "not a regular file"),
        "huge": (str(tmp / "huge.yaml"), "larger than"),
        "binary": (str(tmp / "binary.yaml"), "not UTF-8"),
        "deep": (str(tmp / "deep.yaml"), "nested too deep"),
        "wrong": (str(tmp / "wrong.yaml"), "rules"),
        "alias": (str(tmp / "alias.yaml"), ""),
        "missing": (str(tmp / "missing.yaml"), "cannot read"),
    }


@pytest.mark.parametrize(
    "case", ["fifo", "device", "huge", "binary", "deep", "wrong", "alias", "missing"]
)
def test_a_hostile_policy_file_is_one_line_before_any_request(tmp_path: Path, case: str) -> None:
    path, expect = _files(tmp_path)[case]
    t0 = time.monotonic()
    result = CliRunner().invoke(
        main, ["doctor", "--component", "controller", "--policy", path,
               "--kubeconfig", str(tmp_path / "no-kubeconfig")],
    )  # fmt: skip
    assert time.monotonic() - t0 < 5.0
    assert result.exit_code == 2, result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "--policy" in errors[0] and expect in errors[0], result.output
    assert len(errors[0]) < 600
