"""The policy file's ``limits`` and ``profiles`` sections: loading, errors naming the field,
and ``drahealth policy check`` / ``drahealth resume`` printing them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from drahealth.cli import main
from drahealth.cli.resume import resume_lines
from drahealth.core import DeviceFacts, Health, PolicyError
from drahealth.remedy import parse_policy

HEAD = "apiVersion: drahealth.io/v1\nkind: RemediationPolicy\n"
RULES = "rules:\n  - name: any\n    match: {driver: gpu.example.com}\n"
GOOD = (
    HEAD
    + RULES
    + 'limits: {window: 5m, resume: auto, cluster: "10%", perDriver: 20%, perPool: 3, '
    + 'perNode: "2"}\n'
    + "profiles:\n"
    + "  - name: canary\n"
    + "    match: {pool: node-9}\n"
    + "    observeOnly: true\n"
    + "  - name: a100\n"
    + "    match: {attributes: {model: a100}}\n"
    + "    limits: {cluster: 1}\n"
    + "    rules:\n"
    + "      - name: a100-any\n"
    + "        match: {driver: gpu.example.com}\n"
    + "        action: {effect: NoExecute}\n"
)


def test_limits_and_profiles_load() -> None:
    p = parse_policy(GOOD, "p.yaml")
    assert p.limits is not None and p.limits.window == 300 and p.limits.resume == "auto"
    assert p.limits.cluster is not None and p.limits.cluster.max_for(80) == 8
    assert p.limits.per_pool is not None and p.limits.per_pool.count == 3
    assert p.limits.per_node is not None and p.limits.per_node.count == 2
    canary, a100 = p.profiles
    assert canary.observe_only and canary.rules is None and canary.limits is None
    assert a100.limits is not None and a100.limits.resume == "manual"
    assert a100.limits.window == 600  # the default
    mine = DeviceFacts("gpu.example.com", "node-1", "gpu-0", attributes={"model": "a100"})
    rule = p.rule_for(mine, Health.UNHEALTHY, "")
    assert rule is not None and rule.name == "a100-any"
    canary_dev = DeviceFacts("gpu.example.com", "node-9", "gpu-0")
    assert p.profile_for(canary_dev) is canary
    rule = p.rule_for(canary_dev, Health.UNHEALTHY, "")
    assert rule is not None and rule.name == "any"  # the top-level rules


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ("limits: {cluster: 0}", "p.yaml: limits.cluster: a count must be at least 1, got 0"),
        ('limits: {perPool: "0%"}', "limits.perPool: a percentage must be more than 0%"),
        ('limits: {perNode: "4 gpus"}', "limits.perNode: bad limit '4 gpus': use a count"),
        ("limits: {perNode: 1.5}", "limits.perNode: Expected `int | str | null`, got `float`"),
        ("limits: {window: 10m}", "p.yaml: limits: set at least one of cluster, perDriver"),
        ("limits: {cluster: 1, window: 0s}", "limits.window: duration '0s' must be > 0"),
        ("limits: {cluster: 1, resume: later}", "limits.resume: Invalid enum value 'later'"),
        ("limits: {cluster: 1, perRack: 2}", "limits: Object contains unknown field `perRack`"),
        ("profiles: [{name: a, match: {}}]", "profiles[0].match: name at least one of driver"),
        (
            "profiles: [{name: a, match: {pool: x}}, {name: a, match: {pool: y}}]",
            "profiles[1].name: duplicate profile name 'a' (profiles[0])",
        ),
        (
            "profiles: [{name: a, match: {pool: x}, rules: [{name: any}]}]",
            "profiles[0].rules[0].name: duplicate rule name 'any' (rules[0]); rule names",
        ),
        ("profiles: [{name: a, match: {pool: x}, rules: []}]", "profiles[0].rules: must list"),
        (
            "profiles: [{name: a, match: {pool: x}, limits: {perNode: -1}}]",
            "profiles[0].limits.perNode: a count must be at least 1, got -1",
        ),
    ],
)
def test_bad_limits_and_profiles_name_the_field(extra: str, error: str) -> None:
    with pytest.raises(PolicyError) as exc:
        parse_policy(HEAD + RULES + extra + "\n", "p.yaml")
    assert error in str(exc.value)


def test_policy_check_prints_the_profile_and_the_limits(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    device = ["--device", "gpu.example.com/node-9/gpu-0"]
    out = CliRunner().invoke(main, ["policy", "check", str(path), *device])
    assert out.exit_code == 0, out.output
    assert "profile      canary (observe-only: reported, nothing written)" in out.output
    assert "limit        cluster: 10% new taints within 300 s, then held (resume auto)" in (
        out.output
    )
    assert "limit        pool gpu.example.com/node-9: 3 new taints" in out.output
    assert "limit        node (its node): 2 new taints" in out.output
    assert "pods         are not evicted" in out.output
    out = CliRunner().invoke(
        main,
        ["policy", "check", str(path), "--device", "gpu.example.com/n/gpu-0",
         "--attribute", "model=a100"],
    )  # fmt: skip
    assert "rule a100-any" in out.output and "profile      a100\n" in out.output
    assert "limit        profile a100: 1 new taints within 600 s" in out.output


def test_resume_lines() -> None:
    assert resume_lines(None) == ["the circuit breaker holds nothing (no group is tripped)"]
    state = {
        "tripped": [
            {"scope": "node", "group": "n1", "profile": "p", "limit": "4", "max": 4,
             "count": 4, "window": 600.0, "since": "2027-01-15T10:00:00Z", "resume": "auto"},
        ],
        "held": [
            {"device": f"d/p/gpu-{i}", "rule": "any", "effect": "NoSchedule",
             "since": "2027-01-15T10:00:00Z", "reason": "Unhealthy: XID 79"}
            for i in range(3)
        ],
        "heldCount": 30,
    }  # fmt: skip
    lines = resume_lines(state, shown=2)
    assert lines[0] == (
        "tripped: node n1 (profile p): limit 4 (max 4 within 600 s), 4 counted, "
        "since 2027-01-15T10:00:00Z, resume auto"
    )
    assert lines[1] == "held: 30 new taint(s)"
    assert lines[2].startswith("  d/p/gpu-0: NoSchedule by rule any since")
    assert lines[-1] == "  ... and 28 more"
