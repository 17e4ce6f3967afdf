"""Remediation modes: the choice per served API set (every release profile), what a node
write changes (and never touches), and the command line's mode flag."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from drahealth.cli import main
from drahealth.core import DeviceKey, kube_profile
from drahealth.remedy._modes import ModeError, resolve_mode
from drahealth.remedy._nodes import (
    ANNOTATION_CORDONED,
    ANNOTATION_DEVICES,
    ANNOTATION_TAINTS,
    NodeDevice,
    plan_node,
    read_node,
)

#: 1.35 with the rule API (its gate depends on the taint gate)
RULES_1_35 = {"DRADeviceTaints": True, "DRADeviceTaintRules": True}


def _served(version: str, gates: dict[str, bool] | None = None) -> tuple[str | None, str]:
    profile = kube_profile(version, gates)
    rules = profile.served_versions("DeviceTaintRule")
    return (rules[0] if rules else None), f"v{version}.0"


@pytest.mark.parametrize(
    ("version", "gates", "mode", "api"),
    [
        ("1.34", None, "node-taint", None),
        ("1.34", {"DRADeviceTaints": True}, "taint-rules", "resource.k8s.io/v1alpha3"),
        ("1.35", None, "node-taint", None),
        ("1.35", RULES_1_35, "taint-rules", "resource.k8s.io/v1alpha3"),
        ("1.36", None, "node-taint", None),
        ("1.36", {"DRADeviceTaintRules": True}, "taint-rules", "resource.k8s.io/v1beta2"),
        ("1.37", None, "taint-rules", "resource.k8s.io/v1"),
        ("1.38", None, "taint-rules", "resource.k8s.io/v1"),
    ],
)
def test_auto_uses_rules_where_served_else_the_fallback(
    version: str, gates: dict[str, bool] | None, mode: str, api: str | None
) -> None:
    rules, server = _served(version, gates)
    choice = resolve_mode("auto", "node-taint", rules, server)
    assert (choice.mode, choice.rules_api) == (mode, api)
    assert choice.fallback_path == (api is None)
    if api is None:
        assert choice.line() == (
            "remediation mode: node-taint (auto: the server serves no DeviceTaintRule API, "
            "so node-taint)"
        )
    assert choice.as_json()["serverVersion"] == server


def test_taint_rules_without_the_api_is_an_error_naming_the_way_out() -> None:
    with pytest.raises(ModeError, match=r"DRADeviceTaintRules.*node-taint, cordon"):
        resolve_mode("taint-rules", "node-taint", None, "v1.36.0")


def test_explicit_modes_run_anywhere_and_are_no_fallback() -> None:
    for mode in ("node-taint", "cordon", "evict-only", "report-only"):
        choice = resolve_mode(mode, "node-taint", "v1", "v1.37.0")
        assert choice.mode == mode and not choice.fallback_path
    assert resolve_mode("auto", "cordon", None, "v1.35.0").mode == "cordon"


def test_dry_run_without_effect_none_runs_report_only_and_says_why() -> None:
    choice = resolve_mode("auto", "node-taint", "v1alpha3", "v1.34.1", dry_run=True)
    assert choice.mode == "report-only" and "without the taint effect None" in choice.why
    assert not choice.effect_none
    # 1.35's alpha API has effect None: the dry run writes None rules as before
    assert resolve_mode("auto", "node-taint", "v1alpha3", "v1.35.0", dry_run=True).mode == (
        "taint-rules"
    )
    fallback = resolve_mode("auto", "cordon", None, "v1.36.0", dry_run=True)
    assert fallback.mode == "report-only" and "dry run instead of cordon" in fallback.why


# -- node writes -------------------------------------------------------------------------


DEV0 = "gpu.example.com/node-1/gpu-0"


def dev(name: str, mode: str = "node-taint", effect: str = "NoExecute") -> NodeDevice:
    return NodeDevice(
        DeviceKey("gpu.example.com", "node-1", name),
        mode,
        "drahealth.io/unhealthy",
        "xid",
        effect,
        "xid",
        "Unhealthy: XID 79",
        1700000000.0,
    )


FOREIGN = {"key": "ops/maintenance", "value": "x", "effect": "NoSchedule"}


def node(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "node-1", "resourceVersion": "7"}, "spec": spec}


def test_node_taint_is_noschedule_names_the_device_and_keeps_others_taints() -> None:
    out, changes = plan_node(node(taints=[FOREIGN]), [dev("gpu-0")])
    assert out["spec"]["taints"] == [
        FOREIGN,
        {"key": "drahealth.io/unhealthy", "value": "gpu-0", "effect": "NoSchedule"},
    ]
    assert changes == [
        "tainted node drahealth.io/unhealthy=gpu-0:NoSchedule",
        f"listed {DEV0} (bad, wants NoExecute, rule xid)",
    ]
    annotations = out["metadata"]["annotations"]
    assert json.loads(annotations[ANNOTATION_TAINTS]) == [["drahealth.io/unhealthy", "NoSchedule"]]
    (row,) = json.loads(annotations[ANNOTATION_DEVICES])
    assert row["device"] == "gpu.example.com/node-1/gpu-0" and row["reason"].endswith("XID 79")
    assert out["metadata"]["resourceVersion"] == "7"  # the update is resourceVersion-checked
    assert read_node(out) == [dev("gpu-0")]
    # several devices share one taint per key; the same want again changes nothing
    two, _ = plan_node(out, [dev("gpu-0"), dev("gpu-1")])
    assert two["spec"]["taints"][1]["value"] == "2-devices"
    assert plan_node(two, [dev("gpu-0"), dev("gpu-1")]) == (two, [])


def test_recovery_removes_only_what_drahealth_wrote() -> None:
    tainted, _ = plan_node(node(taints=[FOREIGN]), [dev("gpu-0")])
    # someone adds a taint of their own meanwhile
    tainted["spec"]["taints"].append({"key": "other", "effect": "NoExecute"})
    clean, changes = plan_node(tainted, [])
    assert clean["spec"]["taints"] == [FOREIGN, {"key": "other", "effect": "NoExecute"}]
    assert ANNOTATION_TAINTS not in clean["metadata"]["annotations"]
    assert ANNOTATION_DEVICES not in clean["metadata"]["annotations"]
    assert changes == [
        "removed node taint drahealth.io/unhealthy:NoSchedule",
        f"{DEV0} recovered: no longer listed",
    ]


def test_a_foreign_taint_with_our_key_is_neither_adopted_nor_removed() -> None:
    theirs = {"key": "drahealth.io/unhealthy", "value": "manual", "effect": "NoSchedule"}
    out, _ = plan_node(node(taints=[theirs]), [dev("gpu-0")])
    assert out["spec"]["taints"] == [theirs]
    clean, _ = plan_node(out, [])
    assert clean["spec"]["taints"] == [theirs]


def test_cordon_never_uncordons_a_node_an_operator_cordoned() -> None:
    cordoned, changes = plan_node(node(), [dev("gpu-0", "cordon")])
    assert cordoned["spec"]["unschedulable"] is True
    assert changes == ["cordoned node", f"listed {DEV0} (bad, wants NoExecute, rule xid)"]
    assert (
        "gpu.example.com/node-1/gpu-0" in cordoned["metadata"]["annotations"][ANNOTATION_CORDONED]
    )
    back, changes = plan_node(cordoned, [])
    assert "unschedulable" not in back["spec"]
    assert changes == ["uncordoned node", f"{DEV0} recovered: no longer listed"]
    # an operator's cordon: drahealth lists the device but never claims the cordon
    ops, _ = plan_node(node(unschedulable=True), [dev("gpu-0", "cordon")])
    assert ANNOTATION_CORDONED not in ops["metadata"]["annotations"]
    after, _ = plan_node(ops, [])
    assert after["spec"]["unschedulable"] is True


def test_read_node_skips_what_it_cannot_read() -> None:
    bad = {"metadata": {"annotations": {ANNOTATION_DEVICES: "not json"}}}
    assert read_node(bad) == []
    rows = [{"device": "no-slashes", "mode": "node-taint", "key": "k"}, 7, {"mode": "evict"}]
    assert read_node({"metadata": {"annotations": {ANNOTATION_DEVICES: json.dumps(rows)}}}) == []


# -- the command line ----------------------------------------------------------------------


def test_a_bad_remediation_mode_exits_2_with_one_error_line(tmp_path: Any) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("apiVersion: drahealth.io/v1\nkind: RemediationPolicy\nrules: [{name: r}]\n")
    result = CliRunner().invoke(
        main, ["controller", "--policy", str(policy), "--remediation-mode", "taints"]
    )
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "--remediation-mode" in errors[0] and "node-taint" in errors[0]
