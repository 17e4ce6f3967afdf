"""``drahealth doctor``'s node checks on a temporary kubelet directory with a real socket,
and the permission table matching the chart's roles."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from drahealth.cli.doctor import PERMISSIONS, node_checks
from tests._support import short_dir


@pytest.fixture
def kubelet() -> Iterator[Path]:
    path = Path(short_dir())
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _status(checks: list) -> dict[str, str]:  # type: ignore[type-arg]
    return {c.check: c.status for c in checks}


def test_a_complete_node_passes(kubelet: Path) -> None:
    (kubelet / "plugins_registry").mkdir()
    (kubelet / "plugins").mkdir()
    (kubelet / "pod-resources").mkdir()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(kubelet / "pod-resources" / "kubelet.sock"))
        checks = node_checks(kubelet, ("agent", "driver"))
    finally:
        sock.close()
    assert _status(checks) == {
        "node:plugins_registry": "ok",
        "node:plugins": "ok",
        "node:pod-resources/kubelet.sock": "ok",
    }


def test_missing_dirs_and_a_file_instead_of_a_socket_fail_with_fixes(kubelet: Path) -> None:
    (kubelet / "plugins").write_text("not a dir")
    (kubelet / "pod-resources").mkdir()
    (kubelet / "pod-resources" / "kubelet.sock").write_text("regular file")
    checks = node_checks(kubelet, ("agent",))
    assert _status(checks) == {
        "node:plugins_registry": "FAIL",
        "node:plugins": "FAIL",
        "node:pod-resources/kubelet.sock": "FAIL",
    }
    by = {c.check: c for c in checks}
    assert "No such file or directory" in by["node:plugins_registry"].message
    assert "is not a directory" in by["node:plugins"].message
    assert "is not a unix socket" in by["node:pod-resources/kubelet.sock"].message
    assert all(c.fix and c.blocker for c in checks)


def test_the_driver_does_not_need_the_pod_resources_socket(kubelet: Path) -> None:
    (kubelet / "plugins_registry").mkdir()
    (kubelet / "plugins").mkdir()
    assert _status(node_checks(kubelet, ("driver",))) == {
        "node:plugins_registry": "ok",
        "node:plugins": "ok",
    }
    assert node_checks(kubelet, ("controller",)) == []


def _chart_grants(component: str) -> set[tuple[str, str, str]]:
    """(group, resource, verb) the rendered chart grants ``component`` (its two roles)."""
    from tests.deploy._render import CHART, render

    values = {"driver": {"claimCache": True}}
    granted: set[tuple[str, str, str]] = set()
    for doc in render.manifests(render.render_chart(CHART, values)):
        if doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"].endswith(
            f"-{component}"
        ):
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        granted |= {(group, resource, verb) for verb in rule["verbs"]}
    return granted


@pytest.mark.parametrize("component", ["controller", "agent", "driver"])
def test_every_permission_checked_is_one_the_chart_grants(component: str) -> None:
    granted = _chart_grants(component)
    assert granted, component
    for p in PERMISSIONS[component]:
        for verb in p.verbs:
            assert (p.group, p.name(), verb) in granted, (component, p, verb)
