"""deploy/Dockerfile without a Docker daemon (CI has none and reaches no image
registry): its instructions are checked, and its two build steps (``uv sync``) run
for real into a scratch environment whose ``drahealth`` entry point must work."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy._render import ROOT

DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_two_stages_slim_base_non_root_user() -> None:
    steps = instructions()
    froms = [rest for word, rest in steps if word == "FROM"]
    assert len(froms) == 2 and all("-slim" in f for f in froms)
    final = steps[[i for i, (w, _) in enumerate(steps) if w == "FROM"][-1] :]
    [user] = [rest for word, rest in final if word == "USER"]
    assert user.split(":")[0] not in ("0", "root") and user.split(":")[0].isdigit()
    assert ("ENTRYPOINT", '["drahealth"]') in final
    # the final stage copies only the built environment
    copies = [rest for word, rest in final if word == "COPY"]
    assert copies == ["--from=build /opt/drahealth /opt/drahealth"]


def test_copied_sources_exist_and_are_not_ignored() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for word, rest in instructions():
        if word == "COPY" and not rest.startswith("--from"):
            *sources, _dest = rest.split()
            for src in sources:
                assert (ROOT / src).exists(), src
                assert src not in ignored, src


@pytest.mark.timeout(300)
def test_build_steps_install_a_working_entry_point(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed")
    work = tmp_path / "src"
    work.mkdir()
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy(ROOT / name, work / name)
    shutil.copytree(ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(tmp_path / "env"), "UV_LINK_MODE": "copy"}
    env.pop("VIRTUAL_ENV", None)
    runs = [rest for word, rest in instructions() if word == "RUN" and rest.startswith("uv sync")]
    assert len(runs) == 2
    for cmd in runs:
        subprocess.run(cmd.split(), cwd=work, env=env, check=True, capture_output=True)
    exe = tmp_path / "env" / "bin" / "drahealth"
    shutil.rmtree(work)  # --no-editable: the environment must not need the sources
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert "0.1.0" in out.stdout
    py = tmp_path / "env" / "bin" / "python"
    probe = "import pynvml, drahealth.sources, drahealth.cli.controller; print('ok')"
    assert subprocess.run([str(py), "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "ok"  # fmt: skip
    dev = subprocess.run([str(py), "-c", "import pytest"], capture_output=True)
    assert dev.returncode != 0  # no dev dependencies in the image
