"""The real-kubelet harness's pure parts, without Go or a kubelet: which processes and
mounts ``node_down`` takes as the node's (over fake ``/proc`` files), the node record,
a kubelet that exits while it restarts, and when a test-tree Go main counts as built
from its current sources."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.realk8s import harness
from tests.realk8s import node as node_mod
from tests.realk8s.harness import HarnessError
from tests.realk8s.node import Kubelet, mounts_under, processes_under, restart_kubelet

pytestmark = pytest.mark.timeout(20)


class _FakeProc:
    """``/proc/self/mounts`` and ``/proc/<pid>/cmdline`` from a folder of the test."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        (root / "self").mkdir(parents=True)
        (root / "self" / "mounts").write_text("")

        def fake_path(*parts: Any) -> Path:
            if parts and str(parts[0]).startswith("/proc"):
                return Path(str(root) + str(parts[0])[len("/proc") :], *parts[1:])
            return Path(*parts)

        monkeypatch.setattr(node_mod, "Path", fake_path)

    def mounts(self, *points: bytes) -> None:
        lines = [b"tmpfs " + p + b" tmpfs rw,relatime 0 0" for p in points]
        (self.root / "self" / "mounts").write_bytes(b"\n".join([b"proc /proc proc rw 0 0", *lines]))

    def process(self, pid: int, *argv: str) -> None:
        d = self.root / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(b"\0".join(os.fsencode(a) for a in argv) + b"\0")


@pytest.fixture
def proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _FakeProc:
    return _FakeProc(tmp_path / "proc", monkeypatch)


# -- mounts --------------------------------------------------------------------------------


def test_mount_points_are_unescaped_and_matched_on_whole_path_components(
    proc: _FakeProc, tmp_path: Path
) -> None:
    base = tmp_path / "my node\tx\\y"  # a space, a tab and a backslash
    base.mkdir()
    esc = str(base).replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").encode()
    proc.mounts(
        esc + b"/kubelet",
        esc + b"/kubelet/pods/p/volumes/kubernetes.io~projected/token",
        esc + b"x/kubelet",  # another directory that only starts like it
        esc,
    )
    root = str(base)
    assert mounts_under(root) == [
        f"{root}/kubelet",
        f"{root}/kubelet/pods/p/volumes/kubernetes.io~projected/token",
        root,
    ]
    assert mounts_under(str(tmp_path / "elsewhere")) == []


def test_a_node_directory_with_non_ascii_characters_finds_its_mounts(
    proc: _FakeProc, tmp_path: Path
) -> None:
    base = tmp_path / "nœud-é"
    base.mkdir()
    proc.mounts(os.fsencode(str(base)) + b"/kubelet")
    assert mounts_under(str(base)) == [f"{base}/kubelet"]


# -- processes -----------------------------------------------------------------------------


def test_processes_of_a_directory_that_only_starts_like_it_are_not_taken(
    proc: _FakeProc, tmp_path: Path
) -> None:
    node = tmp_path / "a"
    proc.process(101, "/bin/kubelet", f"--root-dir={node}/kubelet")
    proc.process(102, "/bin/kubelet", f"--root-dir={tmp_path}/ab/kubelet")
    proc.process(103, "/bin/sleep", "100")
    proc.process(os.getpid(), "python", f"{node}/x")  # the caller itself
    (proc.root / "104").mkdir()  # exited between the listing and the read
    assert processes_under(str(node)) == {101: "/bin/kubelet"}


def test_a_path_that_merely_ends_with_the_node_directory_is_not_inside_it(
    proc: _FakeProc, tmp_path: Path
) -> None:
    node = tmp_path / "a"
    proc.process(201, "/usr/bin/agent", f"--state=/srv{node}/state")
    assert processes_under(str(node)) == {}


def test_the_callers_parent_naming_the_node_directory_is_not_taken(
    proc: _FakeProc, tmp_path: Path
) -> None:
    """``uv run scripts/realk8s node-down --dir C --node-dir C/node/`` (a trailing slash
    from shell completion): the ``uv`` process above the harness names the directory."""
    node = tmp_path / "c" / "node"
    proc.process(
        os.getppid(), "uv", "run", "scripts/realk8s", "node-down", "--dir", str(node.parent),
        "--node-dir", f"{node}/",
    )  # fmt: skip
    assert os.getppid() not in processes_under(str(node))


# -- the node record -----------------------------------------------------------------------


def _record(tmp_path: Path, **over: Any) -> Path:
    rec = {"version": "v1.37.2", "cluster_dir": str(tmp_path), "dir": str(tmp_path),
           "name": "realk8s-node", "pids": {"kubelet": 1234}, "ports": {"healthz": 1}}  # fmt: skip
    rec.update(over)
    (tmp_path / "node.json").write_text(json.dumps(rec))
    return tmp_path


@pytest.mark.parametrize(
    "text",
    ["", "{", "[]", "null", '"x"', '{"version": "v1.37.2"}', '{"bogus": 1}'],
    ids=["empty", "truncated", "list", "null", "string", "missing", "unknown"],
)
def test_a_corrupt_node_record_is_a_harness_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "node.json").write_text(text)
    with pytest.raises(HarnessError, match="not a kubelet record"):
        Kubelet.load(tmp_path)


def test_a_node_record_with_pids_that_are_not_processes_is_a_harness_error(
    tmp_path: Path,
) -> None:
    for pids in ({"kubelet": 0}, {"kubelet": True}, {"kubelet": "1234"}, {"kubelet": -1}):
        with pytest.raises(HarnessError, match="pids"):
            Kubelet.load(_record(tmp_path, pids=pids))


@pytest.mark.parametrize("pids", [[1234], None, 1234], ids=["list", "null", "number"])
def test_a_node_record_whose_pids_are_not_an_object_is_a_harness_error(
    tmp_path: Path, pids: Any
) -> None:
    with pytest.raises(HarnessError):
        Kubelet.load(_record(tmp_path, pids=pids))


# -- a kubelet that exits while it restarts ------------------------------------------------


def test_a_kubelet_that_exits_during_restart_fails_fast_and_is_not_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Kubelet.load(_record(tmp_path, pids={}))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "kubelet.log").write_text("E0101 failed to run Kubelet: no cgroups\n")
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str, argv: list[str], logs: Path) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(["sh", "-c", "exit 3"], start_new_session=True)
        started.append(p)
        return p

    monkeypatch.setattr(node_mod, "_start", start)
    with pytest.raises(HarnessError, match=r"kubelet exited with code 3.*no cgroups"):
        restart_kubelet(node, None)  # type: ignore[arg-type]
    assert started and started[0].poll() == 3
    recorded = Kubelet.load(tmp_path)
    assert recorded.pids == {"kubelet": started[0].pid}
    assert recorded.running() == {}


# -- test-tree mains: built from their current sources? -------------------------------------


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    go = tmp_path / "go"
    (go / "m1" / "sub").mkdir(parents=True)
    (go / "m1" / "main.go").write_text("package main\nfunc main() {}\n")
    (go / "m1" / "sub" / "x.go").write_text("package sub\n")
    monkeypatch.setattr(harness, "GO_TREE", go)
    monkeypatch.setattr(harness, "TEST_MAINS", ("m1", "absent"))
    return go


def _stamp(bins: Path, name: str) -> None:
    bins.mkdir(exist_ok=True)
    (bins / name).write_bytes(b"\x7fELF")
    (bins / f"{name}.sha256").write_text(harness._main_digest(name) + "\n")


def test_a_main_is_fresh_until_a_source_changes_appears_or_is_renamed(
    tree: Path, tmp_path: Path
) -> None:
    bins = tmp_path / "bins"
    assert not harness._main_fresh(bins, "m1")  # nothing built
    _stamp(bins, "m1")
    assert harness._main_fresh(bins, "m1")
    assert harness._main_fresh(bins, "absent")  # not in the tree: nothing to build
    (tree / "m1" / "notes.txt").write_text("not a Go source")
    assert harness._main_fresh(bins, "m1")
    for change in (
        lambda: (tree / "m1" / "sub" / "x.go").write_text("package sub\n// edited\n"),
        lambda: (tree / "m1" / "extra.go").write_text("package main\n"),
        lambda: (tree / "m1" / "sub" / "x.go").rename(tree / "m1" / "sub" / "y.go"),
    ):
        _stamp(bins, "m1")
        change()
        assert not harness._main_fresh(bins, "m1")
    _stamp(bins, "m1")
    (bins / "m1").unlink()
    assert not harness._main_fresh(bins, "m1")
    _stamp(bins, "m1")
    (bins / "m1.sha256").write_text("garbage")
    assert not harness._main_fresh(bins, "m1")


def test_a_source_edited_while_its_main_builds_leaves_the_main_stale(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sources are copied into the build module first and compiled minutes later;
    an edit in between gets into the stamp but not into the binary, and the binary then
    counts as fresh until the next edit."""
    bins, cache = tmp_path / "bins", tmp_path / "cache"
    monkeypatch.setattr(harness, "bin_dir", lambda _v: bins)
    monkeypatch.setattr(harness, "cache_root", lambda: cache)
    monkeypatch.setattr(harness, "built", lambda _v: False)
    monkeypatch.setattr(harness, "module_gomod", lambda _m, _v: {})
    monkeypatch.setattr(harness, "consumer_gomod", lambda _v, _t: "module consumer\n")
    monkeypatch.setattr(shutil, "which", lambda _n: "/usr/bin/go")
    compiled: dict[str, bytes] = {}

    def run(argv: list[str], **_kw: Any) -> None:
        if argv[:2] != ["go", "build"]:
            return
        out, target = Path(argv[argv.index("-o") + 1]), argv[-1]
        if target == "./cmd/m1":
            compiled["m1"] = (cache / "v1.37.2" / "src" / "cmd" / "m1" / "main.go").read_bytes()
            # the developer saves a change while the compiler runs
            (tree / "m1" / "main.go").write_text("package main\nfunc main() { println() }\n")
        out.write_bytes(b"\x7fELF")

    monkeypatch.setattr(harness, "_run", run)
    harness.build("v1.37.2", say=lambda _m: None)
    assert compiled["m1"] != (tree / "m1" / "main.go").read_bytes()  # built from the old
    assert not harness._main_fresh(bins, "m1"), "a stale binary counts as fresh"
