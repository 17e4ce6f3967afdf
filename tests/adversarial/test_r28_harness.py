"""The real control plane's harness (scripts/realk8s) in a broken environment.

A record left by a run that crashed names pids the system may since have given to other
processes; ``down`` signalled their whole process groups. ``up`` in a directory whose
control plane still ran waited 120 s on etcd's data-directory lock, then failed naming
neither the cause nor the processes, and its new record left the running ones with nobody
to stop them. A record cut short, and a binary that cannot be run, ended in tracebacks.
No real Kubernetes is needed: stand-ins named like the components are enough.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realk8s import harness
from tests.unit.test_realk8s_harness import run_script

pytestmark = pytest.mark.timeout(30)

VERSION = "v1.37.2"


def _spawn(argv0: str, *args: str) -> subprocess.Popen[bytes]:
    """A long-running process whose command line is ``argv0 args...`` (its own group),
    returned once it runs as that (after its exec)."""
    proc = subprocess.Popen(
        [argv0, "-c", "sleep 30; :", *args], executable="/bin/sh",
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 5.0
    while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(os.fsencode(argv0)):
        assert time.monotonic() < deadline, "the stand-in never started"
        time.sleep(0.005)
    return proc


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for p in started:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache where VERSION counts as built (stand-in binaries, the stamp)."""
    root = tmp_path / "cache"
    bins = root / VERSION / "bin"
    bins.mkdir(parents=True)
    for name in (*harness.COMPONENTS, "etcd", "kubectl"):
        (bins / name).write_text("#!/bin/sh\nexit 1\n")
        (bins / name).chmod(0o755)
    (bins / "BUILT").write_text("{}")
    monkeypatch.setenv("DRAHEALTH_K8S_CACHE", str(root))
    return root


def _record(directory: Path, pids: dict[str, int]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    harness.Cluster(
        version=VERSION, gates="default", dir=str(directory), apiserver="https://127.0.0.1:1",
        etcd="http://127.0.0.1:2", kubeconfig=str(directory / "kubeconfig"),
        admin_token="t", pids=pids,
    ).save()  # fmt: skip


def test_down_leaves_alone_a_process_that_got_a_recorded_pid(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """The recorded pid now belongs to something else (here: a shell of another job,
    leading its own process group): down must not signal it."""
    stranger = _spawn("/bin/sh")
    procs.append(stranger)
    directory = tmp_path / "crashed"
    _record(directory, {"etcd": stranger.pid, "kube-apiserver": stranger.pid})
    t0 = time.monotonic()
    harness.down(harness.Cluster.load(directory))
    assert time.monotonic() - t0 < 2.0
    assert stranger.poll() is None, "down killed a process that was not the control plane's"


def test_down_still_stops_the_components_it_started(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    directory = (tmp_path / "live").resolve()
    etcd = _spawn(str(tmp_path / "bin" / "etcd"), f"--data-dir={directory}/etcd")
    procs.append(etcd)
    _record(directory, {"etcd": etcd.pid})
    assert harness.Cluster.load(directory).running() == {"etcd": etcd.pid}
    harness.down(harness.Cluster.load(directory))
    assert etcd.wait(timeout=5) is not None


def test_up_where_a_control_plane_still_runs_says_so_at_once(
    tmp_path: Path, cache: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    directory = (tmp_path / "busy").resolve()
    etcd = _spawn(str(cache / VERSION / "bin" / "etcd"), f"--data-dir={directory}/etcd")
    procs.append(etcd)
    _record(directory, {"etcd": etcd.pid})
    before = (directory / "cluster.json").read_text()
    t0 = time.monotonic()
    with pytest.raises(harness.HarnessError) as info:
        harness.up(VERSION, directory, say=lambda _m: None)
    assert time.monotonic() - t0 < 2.0
    message = str(info.value)
    assert "\n" not in message
    assert "still running" in message and f"etcd pid {etcd.pid}" in message
    assert "down --dir" in message
    assert (directory / "cluster.json").read_text() == before  # the record is kept
    assert etcd.poll() is None


@pytest.mark.parametrize(
    "text",
    ['{"version": "v1.37.2", "gates": "default", "dir": "/x"', "[]", '{"pids": 1}', "\x00\xff",
     json.dumps({"version": "v", "gates": "d", "dir": "/x", "apiserver": "a", "etcd": "e",
                 "kubeconfig": "k", "admin_token": "t", "pids": {"etcd": 1}})],
    ids=["cut-short", "a-list", "wrong-fields", "binary", "pid-1"],
)  # fmt: skip
def test_down_with_a_broken_record_fails_in_one_line(tmp_path: Path, text: str) -> None:
    directory = tmp_path / "broken"
    directory.mkdir()
    (directory / "cluster.json").write_text(text, errors="surrogateescape")
    with pytest.raises(harness.HarnessError, match="is not a control plane record") as info:
        harness.Cluster.load(directory)
    assert "\n" not in str(info.value)


def test_the_script_says_a_broken_record_in_one_line(tmp_path: Path) -> None:
    directory = tmp_path / "broken"
    directory.mkdir()
    (directory / "cluster.json").write_text('{"version": ')
    out = run_script("down", "--dir", str(directory), cache=tmp_path)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "cluster.json" in lines[0]


def test_a_binary_that_cannot_run_fails_in_one_line_and_leaves_nothing(
    tmp_path: Path, cache: Path
) -> None:
    """A partial copy of the cache: etcd is there but not executable."""
    etcd = cache / VERSION / "bin" / "etcd"
    etcd.chmod(stat.S_IRUSR | stat.S_IWUSR)
    if os.access(etcd, os.X_OK):
        pytest.skip("this user may execute anything")
    directory = tmp_path / "c"
    with pytest.raises(harness.HarnessError) as info:
        harness.up(VERSION, directory, say=lambda _m: None)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("cannot start etcd")
