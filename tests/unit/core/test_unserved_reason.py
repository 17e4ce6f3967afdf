"""Why a kind is not served, per release: the gate it is served without and the fix."""

from __future__ import annotations

import pytest

from drahealth.core import release_of, unserved_reason


@pytest.mark.parametrize(
    ("version", "gate", "runtime"),
    [
        ("v1.34.3", "DRADeviceTaints", "resource.k8s.io/v1alpha3=true"),
        ("v1.35.0", "DRADeviceTaintRules", "resource.k8s.io/v1alpha3=true"),
        ("v1.36.1-gke.100", "DRADeviceTaintRules", "resource.k8s.io/v1beta2=true"),
    ],
)
def test_rules_name_the_gate_and_runtime_config(version: str, gate: str, runtime: str) -> None:
    text = unserved_reason("DeviceTaintRule", version)
    release = version.removeprefix("v")[:4]
    assert text.startswith(f"Kubernetes {release} without {gate}"), text
    assert "--feature-gates=" in text and f"{gate}=true" in text
    assert f"--runtime-config={runtime}" in text
    if gate == "DRADeviceTaintRules" and "1.35" in version:  # it depends on DRADeviceTaints
        assert "--feature-gates=DRADeviceTaints=true,DRADeviceTaintRules=true" in text


def test_ga_releases_say_the_resource_was_turned_off() -> None:
    for version in ("v1.37.0", "1.38"):
        text = unserved_reason("DeviceTaintRule", version)
        assert "DeviceTaintRule turned off" in text and "--runtime-config" in text
        assert "DRADeviceTaintRules=false" in text


def test_core_kinds_and_unknown_releases() -> None:
    assert "resource.k8s.io/v1 turned off" in unserved_reason("ResourceSlice", "v1.35.2")
    assert unserved_reason("ResourceSlice", "v1.31.0") == "Kubernetes v1.31.0, outside 1.34-1.38"
    assert "unknown version" in unserved_reason("DeviceTaintRule", "")
    assert len(unserved_reason("DeviceTaintRule", "x" * 10_000)) < 200


@pytest.mark.parametrize(
    ("git", "release"),
    [
        ("v1.36.2", "1.36"),
        ("v1.35.0+k3s1", "1.35"),
        ("v1.34.1-eks-113cf36", "1.34"),
        ("1.38", "1.38"),
        ("v1.31.0", "1.31"),
        ("", None),
        ("garbage", None),
        ("v1." + "9" * 50, None),
    ],
)
def test_release_of_a_git_version(git: str, release: str | None) -> None:
    assert release_of(git) == release
