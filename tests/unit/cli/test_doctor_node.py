"""``drahealth doctor``'s node checks on a temporary kubelet directory with a real socket,
and the permission table matching the chart's roles for every release shape (remediation
modes, node rollup on, off and tainting, repair Jobs, the driver's claim cache and claim
status, the agent's attached sources)."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drahealth.cli.doctor import PERMISSIONS, Setup, needed, node_checks, setup_from_policy
from drahealth.remedy import parse_policy
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


NS = "drahealth-system"
#: Agent values with attached sources.
ATTACH = {"agent": {"attach": {"config": {"drivers": [
    {"driver": "gpu.nvidia.com", "key": "uuid", "sources": [{"kind": "kmsg"}]}]}}}}  # fmt: skip
REPAIR_JOB = {"job": {"template": {"spec": {"containers": [{"name": "r", "image": "busybox"}]}}}}


def _controller(mode: str, **policy: Any) -> dict[str, Any]:
    rule = {"name": "bad", "match": {"health": ["Unhealthy"]}, "action": {"effect": "NoExecute"}}
    if policy.pop("repair", False):
        rule["repair"] = REPAIR_JOB
    return {"controller": {"remediationMode": mode, "policy": {"rules": [rule], **policy}}}


def _render(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    from tests.deploy._render import CHART, render

    return list(render.manifests(render.render_chart(CHART, values, namespace=NS)))


def _chart_grants(docs: list[dict[str, Any]], component: str) -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, namespace) the rendered chart grants ``component``: its
    ClusterRole everywhere (namespace ""), its Role in the release namespace."""
    granted: set[tuple[str, str, str, str]] = set()
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"].endswith(
            f"-{component}"
        ):
            ns = NS if doc["kind"] == "Role" else ""
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        granted |= {(group, resource, verb, ns) for verb in rule["verbs"]}
    return granted


def _asked(component: str, setup: Setup) -> set[tuple[str, str, str, str]]:
    return {
        (group, resource + (f"/{sub}" if sub else ""), verb, where)
        for group, resource, sub, verb, where in needed(component, setup, NS)
    }


def _setup(docs: list[dict[str, Any]], mode: str | None = None, **flags: Any) -> Setup:
    """doctor's setup for this release: the chart's policy (as ``--policy`` reads it)."""
    [cm] = [d for d in docs if d["metadata"]["name"].endswith("-controller-policy")]
    return setup_from_policy(Setup(mode=mode, **flags), parse_policy(cm["data"]["policy.yaml"]))


#: (values, the mode doctor finds, doctor's flags for the driver and agent)
CASES: dict[str, tuple[dict[str, Any] | None, str, dict[str, Any]]] = {
    "default": (None, "taint-rules", {}),
    "auto-without-rules": (None, "quarantine", {}),
    "quarantine": (_controller("quarantine"), "quarantine", {}),
    "node-taint": (_controller("node-taint"), "node-taint", {}),
    "cordon": (_controller("cordon"), "cordon", {}),
    "evict-only": (_controller("evict-only"), "evict-only", {}),
    "report-only": (_controller("report-only"), "report-only", {}),
    "rollup-off": (_controller("taint-rules", nodeRollup={"enabled": False}), "taint-rules", {}),
    "rollup-taint": (_controller("taint-rules", nodeRollup={"taintNode": {"threshold": "50%"}}),
                     "taint-rules", {}),
    "repair-job": (_controller("taint-rules", repair=True), "taint-rules", {}),
    "no-claim-cache": ({"driver": {"claimCache": False}}, "taint-rules", {"claim_cache": False}),
    "claim-status": ({"driver": {"claimStatus": True}}, "taint-rules", {"claim_status": True}),
    "attach": (ATTACH, "taint-rules", {"attach": True}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("component", ["controller", "agent", "driver"])
def test_doctor_asks_exactly_what_the_chart_grants(component: str, case: str) -> None:
    """For every release shape, each permission doctor checks is granted by the chart (no
    false blocker), and every grant is checked but the rule verbs in the modes without
    rules and the Node writes mode auto keeps for its fallback."""
    values, mode, flags = CASES[case]
    docs = _render(values)
    granted = _chart_grants(docs, component)
    asked = _asked(component, _setup(docs, mode, **flags))
    assert asked - granted == set(), (component, case)
    unasked = granted - asked
    if component == "controller" and mode != "taint-rules":  # granted in every mode
        unasked = {g for g in unasked if not g[1].startswith("devicetaintrules")}
    chart_mode = ((values or {}).get("controller") or {}).get("remediationMode", "auto")
    if component == "controller" and chart_mode == "auto" and mode == "taint-rules":
        unasked -= {("", "nodes", "update", "")}  # auto's fallback, node-taint
    if component == "controller" and chart_mode == "auto" and mode == "quarantine":
        unasked -= {("", "nodes", "update", "")}  # a rule's own fallback may be node-taint
    if component == "controller" and chart_mode == "auto" and mode != "quarantine":
        unasked = {g for g in unasked if not g[1].startswith("resourceclaims")}  # auto's
    assert unasked == set(), (component, case)


def test_the_controller_needs_what_it_uses_by_default() -> None:
    """What the controller of a default release requests (seen on a real API server):
    its history written with update, the opt-out Node watch, the node rollup's read of a
    Node and patch of nodes/status."""
    asked = _asked("controller", Setup(mode="taint-rules"))
    assert {
        ("", "configmaps", "update", NS),
        ("", "nodes", "list", ""),
        ("", "nodes", "watch", ""),
        ("", "nodes", "get", ""),
        ("", "nodes/status", "patch", ""),
    } <= asked
    assert ("batch", "jobs", "create", NS) not in asked
    jobs = _asked("controller", Setup(mode="report-only", job_namespaces=("", "repairs")))
    assert {("batch", "jobs", "create", NS), ("batch", "jobs", "create", "repairs")} <= jobs
    assert ("", "nodes/status", "patch", "") not in _asked(
        "controller", Setup(mode="taint-rules", rollup=False)
    )
    driver = _asked("driver", Setup())
    assert ("resource.k8s.io", "resourceclaims", "watch", "") in driver
    assert ("resource.k8s.io", "resourceclaims", "watch", "") not in _asked(
        "driver", Setup(claim_cache=False)
    )


def test_each_access_is_asked_once() -> None:
    for component in PERMISSIONS:
        asks = list(needed(component, Setup(mode="node-taint", rollup_taints=True), NS))
        assert len(asks) == len(set(asks)), component
