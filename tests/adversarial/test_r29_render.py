"""deploy/render.py writes no YAML anchors (helm's toYaml goes through JSON): a values
file whose anchor holds its own alias then had no end. ``render.py -f`` died in a
RecursionError traceback; helm refuses the file ("anchor 'p' value contains itself").
Held: an alias used twice is written out in full each time, as helm writes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy._render import CHART, render


def test_a_values_file_whose_anchor_holds_itself_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = tmp_path / "v.yaml"
    values.write_text("controller:\n  policy: &p\n    rules: [*p]\n")
    assert render.main([str(CHART), "-f", str(values)]) == 1
    err = capsys.readouterr().err
    assert f"values {values}: an anchor's value contains itself" in err


def test_an_alias_used_twice_is_written_out_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = tmp_path / "v.yaml"
    values.write_text(
        "driver:\n  tolerations: &t\n  - {key: gpu, operator: Exists, effect: NoSchedule}\n"
        "agent:\n  tolerations: *t\n"
    )
    assert render.main([str(CHART), "-f", str(values)]) == 0
    out = capsys.readouterr().out
    assert "&" not in out.replace("&&", "") and "*id" not in out
    assert out.count("key: gpu") == 2
