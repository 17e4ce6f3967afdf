"""What the kubelet-mode agent takes from a release: gates, messages, dra-health versions."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from drahealth import api
from drahealth.cli import main
from drahealth.core import KUBE_VERSIONS, kube_profile
from drahealth.node import AgentConfig, kubelet_settings
from drahealth.node._registry import PluginRegistry
from drahealth.node._stream import pick_health_service

V1, V1ALPHA1 = api.DRA_HEALTH_V1, api.DRA_HEALTH_V1ALPHA1


@pytest.mark.parametrize(
    ("version", "status", "message", "versions"),
    [
        ("1.34", False, False, ("v1alpha1",)),
        ("1.35", False, False, ("v1alpha1",)),
        ("1.36", True, True, ("v1alpha1",)),
        ("1.37", True, True, ("v1", "v1alpha1")),
        ("1.38", True, True, ("v1", "v1alpha1")),
    ],
)
def test_each_release_default_gates(
    version: str, status: bool, message: bool, versions: tuple[str, ...]
) -> None:
    assert kubelet_settings(kube_profile(version)) == {
        "kube_version": version,
        "health_status": status,
        "health_message": message,
        "health_versions": versions,
    }


def test_gates_turn_parts_on_and_off() -> None:
    on = kubelet_settings(kube_profile("1.35", {"ResourceHealthStatus": True}))
    assert (on["health_status"], on["health_message"]) == (True, False)  # no message in 1.35
    off = kubelet_settings(kube_profile("1.38", {"ResourceHealthStatusMessage": False}))
    assert (off["health_status"], off["health_message"]) == (True, False)


def test_every_release_builds_a_config() -> None:
    for version in KUBE_VERSIONS:
        AgentConfig("n", "/r", "/s", **kubelet_settings(kube_profile(version)))


@pytest.mark.parametrize("versions", [(), ("v2",), "v1", ("v1", "v1beta1")])
def test_config_refuses_unknown_health_versions(versions: Any) -> None:
    with pytest.raises(ValueError, match=r"dra-health versions .*: choose among v1, v1alpha1"):
        AgentConfig("n", "/r", "/s", health_versions=versions)


@pytest.mark.parametrize("services", [(), ("v1",), V1])
async def test_registry_refuses_unknown_health_services(services: Any) -> None:
    with pytest.raises(ValueError, match=r"health_services .*: choose among v1.DRAResourceHealth"):
        PluginRegistry(on_report=lambda *_: None, health_services=services)


@pytest.mark.parametrize(
    ("offered", "speaks", "picked"),
    [
        ([V1, V1ALPHA1], [V1, V1ALPHA1], V1),
        ([V1ALPHA1, V1], [V1ALPHA1], V1ALPHA1),
        ([V1], [V1ALPHA1], None),
        ([V1ALPHA1], [V1, V1ALPHA1], V1ALPHA1),
        ([], [V1], None),
    ],
)
def test_pick_health_service_only_among_spoken(
    offered: list[str], speaks: list[str], picked: str | None
) -> None:
    assert pick_health_service(offered, speaks) == picked


@pytest.mark.parametrize(
    ("args", "hint", "text"),
    [
        (["--kube-version", "1.33"], "--kube-version", "unsupported Kubernetes version"),
        (["--feature-gates", "Nope=true"], "--feature-gates", "unrecognized feature gate"),
        (["--feature-gates", "ResourceHealthStatus"], "--feature-gates", "missing bool value"),
        (
            ["--kube-version", "1.35", "--feature-gates", "ResourceHealthStatusMessage=true"],
            "--feature-gates",
            "not in Kubernetes 1.35",
        ),
        (["--feature-gates", "DRADeviceTaints=false"], "--feature-gates", "locked to true"),
    ],
)
def test_agent_usage_errors_name_the_flag(args: list[str], hint: str, text: str) -> None:
    result = CliRunner().invoke(main, ["agent", "--state-dir", "/nonexistent", *args])
    assert result.exit_code == 2, result.output
    assert hint in result.output and text in result.output
