"""The policy file's ``nodeRollup`` section: defaults, a full example and each error."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from drahealth.cli.policy import policy_group
from drahealth.core import PolicyError, Threshold
from drahealth.remedy._policy_load import parse_policy

HEAD = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
rules:
- name: xid
  match: {driver: gpu.example.com}
"""


def test_defaults_write_the_condition_and_no_taint() -> None:
    r = parse_policy(HEAD).node_rollup
    assert r.enabled and r.condition_type == "DRADevicesHealthy" and r.taint_node is None


def test_full_section() -> None:
    r = parse_policy(
        HEAD
        + """nodeRollup:
  enabled: true
  conditionType: example.com/GPUsHealthy
  taintNode:
    threshold: 50%
    effect: NoExecute
    key: example.com/gpus-bad
    maxNodes: 3
"""
    ).node_rollup
    assert r.condition_type == "example.com/GPUsHealthy"
    assert r.taint_node is not None
    t = r.taint_node
    assert (t.threshold, t.effect, t.key, t.max_nodes) == (
        Threshold(percent=50.0), "NoExecute", "example.com/gpus-bad", Threshold(count=3),
    )  # fmt: skip
    assert t.max_nodes.of(100) == 3


def test_disabled() -> None:
    assert not parse_policy(HEAD + "nodeRollup: {enabled: false}\n").node_rollup.enabled


def test_count_threshold_and_default_max_nodes() -> None:
    t = parse_policy(HEAD + "nodeRollup: {taintNode: {threshold: 2}}\n").node_rollup.taint_node
    assert t is not None
    assert (t.threshold, t.effect, t.key) == (
        Threshold(count=2), "NoSchedule", "drahealth.io/devices-unhealthy",
    )  # fmt: skip
    assert t.max_nodes == Threshold(percent=10.0)


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ("{conditionType: Ready}", "nodeRollup.conditionType: 'Ready' is the kubelet's"),
        ("{conditionType: 'two words'}", "nodeRollup.conditionType: 'two words' is not a"),
        ("{taintNode: {}}", "nodeRollup.taintNode: Object missing required field `threshold`"),
        ("{taintNode: {threshold: 0}}", "nodeRollup.taintNode.threshold: a count must be"),
        ("{taintNode: {threshold: 150%}}", "nodeRollup.taintNode.threshold: a percentage"),
        ("{taintNode: {threshold: 1.5}}", "nodeRollup.taintNode.threshold: Expected `int | str`"),
        ("{taintNode: {threshold: 1, maxNodes: all}}", "nodeRollup.taintNode.maxNodes: expected"),
        ("{taintNode: {threshold: 1, effect: None}}", "nodeRollup.taintNode.effect: Invalid enum"),
        ("{taintNode: {threshold: 1, key: 'bad key'}}", "nodeRollup.taintNode.key: taint key"),
        (
            "{taintNode: {threshold: 1, key: drahealth.io/unhealthy}}",
            "nodeRollup.taintNode.key: 'drahealth.io/unhealthy' is a rule's taint key",
        ),
        ("{enable: true}", "nodeRollup: Object contains unknown field `enable`"),
    ],
)
def test_errors_name_the_field(section: str, error: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(HEAD + f"nodeRollup: {section}\n", "p.yaml")
    assert str(info.value).startswith(f"p.yaml: {error}"), str(info.value)


def test_policy_check_shows_the_node_rollup(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(HEAD + "nodeRollup: {taintNode: {threshold: 50%}}\n", encoding="utf-8")
    args = ["check", str(path), "--device", "gpu.example.com/node-1/gpu-0", "--message", "XID"]
    out = CliRunner().invoke(policy_group, args)
    assert out.exit_code == 0, out.output
    assert (
        "  node         DRADevicesHealthy=False; drahealth.io/devices-unhealthy:NoSchedule "
        "once 50% of its devices are tainted"
    ) in out.output
