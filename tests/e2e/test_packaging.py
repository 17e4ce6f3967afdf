"""The built wheel, installed with pip into a clean virtual environment, runs the demo.

Builds the wheel as a user or a release job would (``uv build --wheel``, or ``pip wheel``
where uv is absent; the build backend is hatchling), checks that it carries every module
and data file of ``src/drahealth`` that runtime reads (generated protobuf modules, the
dashboard's static page, the OpenAPI schemas, ``py.typed``) and the ``drahealth`` entry
point, creates a venv with ``python -m venv``, ``pip install``s the wheel there (its
dependencies come from the package index), and runs ``drahealth demo`` from that venv, in
a directory outside the source tree, to ``demo complete``. Skipped, not failed, only when
the package index cannot be reached.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "drahealth"
DEFAULT_INDEX = "https://pypi.org/simple/"

#: about a minute on two cores (build, install, demo): in the default run
# a wheel build, a clean venv and a demo run (30-80 s): CI runs it in its slow step
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def _run(args: list[str], timeout: float, **kw: object) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(  # type: ignore[call-overload]
        args, capture_output=True, text=True, timeout=timeout, check=False, **kw
    )
    if res.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, args))} exited {res.returncode}:\n{res.stdout[-4000:]}"
            f"\n{res.stderr[-4000:]}"
        )
    return res  # type: ignore[no-any-return]


def _clean_env() -> dict[str, str]:
    """The environment without this interpreter's venv and source paths."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _index_url(venv_python: Path, env: dict[str, str]) -> str:
    """The index the venv's pip installs from (its configuration, else PyPI)."""
    if env.get("PIP_INDEX_URL"):
        return env["PIP_INDEX_URL"].split()[0]
    res = subprocess.run(
        [str(venv_python), "-m", "pip", "config", "list"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    for line in res.stdout.splitlines():
        found = re.fullmatch(r"(?:global|install)\.index-url='?([^']+)'?", line.strip())
        if found:
            return found.group(1)
    return DEFAULT_INDEX


def _skip_unless_reachable(index: str) -> None:
    if index.startswith("file:"):
        return
    url = index.rstrip("/") + "/pip/"
    try:
        with urllib.request.urlopen(url, timeout=15) as r:
            r.read(1)
    except (urllib.error.URLError, OSError) as exc:
        pytest.skip(f"the package index {index} is unreachable ({exc})")


def _build_wheel(out: Path, venv_python: Path, env: dict[str, str]) -> Path:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is not None:
        _run([uv, "build", "--wheel", "--out-dir", str(out), str(ROOT)], 600, env=env)
    else:
        _run([str(venv_python), "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(ROOT)],
             600, env=env)  # fmt: skip
    (wheel,) = out.glob("drahealth-*.whl")
    return wheel


def _needed_files() -> set[str]:
    """Every file of the package that runtime may read: modules, stubs, data."""
    out = set()
    for path in PACKAGE.rglob("*"):
        if path.is_dir() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        out.add(path.relative_to(PACKAGE.parent).as_posix())
    return out


def _check_contents(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = z.read(entry_points).decode()
    missing = sorted(_needed_files() - names)
    assert not missing, f"the wheel lacks {missing}"
    for required in (
        "drahealth/py.typed",
        "drahealth/web/static/index.html",
        "drahealth/controlplane/openapi/v1.37.json.gz",
        "drahealth/api/_proto/dra/v1/api_pb2.py",
        "drahealth/api/_proto/dra_health/v1/api_pb2_grpc.py",
        "drahealth/api/_proto/pluginregistration/v1/api_pb2.py",
    ):
        assert required in names, f"the wheel lacks {required}"
    assert re.search(r"^drahealth = drahealth\.cli:main$", scripts, re.M), scripts


def test_wheel_installs_in_a_clean_venv_and_runs_the_demo(tmp_path: Path) -> None:
    env = _clean_env()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], 120, env=env)
    python = venv / "bin" / "python"
    _skip_unless_reachable(_index_url(python, env))
    wheel = _build_wheel(tmp_path / "dist", python, env)
    _check_contents(wheel)
    _run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], 600, env=env)
    where = _run(
        [str(python), "-c", "import drahealth, sys; print(drahealth.__file__)"],
        60, env=env, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(venv), f"drahealth imported from {where}, not the venv"
    demo = _run([str(venv / "bin" / "drahealth"), "demo"], 300, env=env, cwd=tmp_path)
    assert "demo complete" in demo.stdout, demo.stdout[-4000:]
