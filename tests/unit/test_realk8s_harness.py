"""The real-cluster harness's own logic, without Go: versions, the consumer go.mod,
gate sets, and the one-line errors of ``scripts/realk8s``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.realk8s import harness

ROOT = Path(__file__).resolve().parents[2]

TAG = {
    "Module": {"Path": "k8s.io/kubernetes"},
    "Go": "1.26.0",
    "Godebug": [{"Key": "default", "Value": "go1.26"}],
    "Require": [
        {"Path": "k8s.io/api", "Version": "v0.0.0"},
        {"Path": "k8s.io/cri-streaming", "Version": "v0.0.0"},
        {"Path": "k8s.io/klog/v2", "Version": "v2.130.1"},
        {"Path": "go.etcd.io/etcd/server/v3", "Version": "v3.7.0", "Indirect": True},
        {"Path": "k8s.io/utils", "Version": "v0.0.0-20260101000000-abcdef012345"},
    ],
}


def test_versions_resolve_to_the_patch_release_built() -> None:
    assert harness.resolve_version("1.37") == "v1.37.2"
    assert harness.resolve_version("v1.36.3") == "v1.36.3"
    assert harness.resolve_version("1.34.4") == "v1.34.4"
    for bad in ("1.99", "2.0.0", "latest", "1.37.x"):
        with pytest.raises(harness.HarnessError, match=r"give a release like 1\.37"):
            harness.resolve_version(bad)
    assert harness.minor_of("v1.37.2") == "1.37"


def test_the_consumer_module_replaces_exactly_the_staging_modules_of_the_tag() -> None:
    text = harness.consumer_gomod("v1.37.2", TAG)
    assert "go 1.26.0\n" in text and "godebug default=go1.26\n" in text
    assert "require k8s.io/kubernetes v1.37.2\n" in text
    assert "\tk8s.io/api => k8s.io/api v0.37.2\n" in text
    assert "\tk8s.io/cri-streaming => k8s.io/cri-streaming v0.37.2\n" in text
    # pinned (not v0.0.0) k8s.io modules and other modules are left to the tag's graph
    assert "klog" not in text and "k8s.io/utils" not in text and "etcd" not in text
    with pytest.raises(harness.HarnessError, match="no staging modules"):
        harness.consumer_gomod("v1.37.2", {"Go": "1.26.0", "Require": []})


def test_gate_sets_per_release() -> None:
    assert harness.gates_for("v1.37.2", "default") == ({}, [])
    gates, runtime = harness.gates_for("v1.34.4", "taints")
    assert gates["DRADeviceTaints"] and "DRADeviceTaintRules" not in gates  # not in 1.34
    assert runtime == ["resource.k8s.io/v1alpha3=true"]
    assert harness.gates_for("v1.36.3", "taints")[1] == ["resource.k8s.io/v1beta2=true"]
    with pytest.raises(harness.HarnessError, match="gates 'all'"):
        harness.gates_for("v1.37.2", "all")


def test_an_unbuilt_release_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAHEALTH_K8S_CACHE", str(tmp_path))
    reason = harness.not_built_reason("v1.35.4")
    assert reason is not None
    assert "scripts/realk8s build --version 1.35" in reason and str(tmp_path) in reason
    bins = tmp_path / "v1.35.4" / "bin"
    bins.mkdir(parents=True)
    for name in (*harness.COMPONENTS, "etcd"):
        (bins / name).write_text("")
    assert harness.not_built_reason("v1.35.4") is not None  # no stamp: a build cut short
    (bins / "BUILT").write_text("{}")
    assert harness.built("v1.35.4")


def run_script(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "realk8s"), *args],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cache), "DRAHEALTH_K8S_CACHE": str(cache)},
    )  # fmt: skip


def test_the_script_fails_in_one_line_naming_what_is_missing(tmp_path: Path) -> None:
    up = run_script("up", "--dir", str(tmp_path / "c"), "--version", "1.36", cache=tmp_path)
    assert up.returncode == 1
    assert up.stderr.strip().splitlines() == [
        f"error: real Kubernetes v1.36.3 is not built in {tmp_path}/v1.36.3/bin "
        "(run: scripts/realk8s build --version 1.36)"
    ]
    down = run_script("down", "--dir", str(tmp_path / "nothing"), cache=tmp_path)
    assert down.returncode == 1 and "no control plane recorded" in down.stderr
    bad = run_script("build", "--version", "1.99", cache=tmp_path)
    assert bad.returncode == 1 and "version '1.99'" in bad.stderr
    where = run_script("where", "--version", "1.37", cache=tmp_path)
    assert where.stdout.strip() == f"{tmp_path}/v1.37.2/bin"


def test_build_without_go_says_so(tmp_path: Path) -> None:
    out = run_script("build", "--version", "1.37", cache=tmp_path)
    if out.returncode == 0:
        pytest.skip("go found on /usr/bin:/bin")
    assert (
        out.stderr.strip() == "error: go is not installed: the real control plane is built with it"
    )
