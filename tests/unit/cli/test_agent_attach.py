"""``drahealth agent --attach``: the file is checked before anything starts."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from drahealth.cli import main


def run(tmp_path: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, ["agent", "--mode", "observer", "--state-dir", str(tmp_path / "s"), *args]
    )
    return result.exit_code, result.output


def test_a_bad_file_is_a_usage_error_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "attach.yaml"
    bad.write_text("driver: gpu.nvidia.com\nsources: [{kind: kmsg, interval: soon}]\n")
    code, out = run(tmp_path, "--kubeconfig", str(tmp_path / "kc"), "--attach", str(bad))
    assert code == 2
    assert f"{bad}: sources[0].interval: 'soon' is not a duration" in out


def test_attach_needs_api_access(tmp_path: Path) -> None:
    good = tmp_path / "attach.yaml"
    good.write_text("driver: gpu.nvidia.com\nsources: [{kind: kmsg}]\n")
    code, out = run(tmp_path, "--attach", str(good))
    assert code == 2 and "--attach needs API access" in out
    code, out = run(tmp_path, "--kubeconfig", "x", "--attach", str(tmp_path / "missing.yaml"))
    assert code == 2 and "missing.yaml: cannot read" in out
