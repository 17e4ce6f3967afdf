"""``drahealth policy check`` on ignore and degraded rules and the burn-in gate."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from drahealth.cli.policy import policy_group

POLICY = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
burnIn:
  validate: {exec: [gpu-burn], timeout: 5m}
  appliesTo: [new]
rules:
  - name: app-xid
    match: {message: "XID (13|31|43|45|68)\\\\b"}
    action: {outcome: ignore}
  - name: ecc
    match: {message: corrected}
    action: {outcome: degraded}
  - name: bad
"""


def _check(tmp_path: Path, *args: str) -> tuple[int, str]:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    result = CliRunner().invoke(policy_group, ["check", str(path), *args])
    return result.exit_code, result.stdout


def test_the_summary_names_the_burn_in_gate(tmp_path: Path) -> None:
    code, out = _check(tmp_path)
    assert code == 0
    assert out.splitlines()[1] == (
        "  burn-in      new devices: drahealth.io/burn-in:NoSchedule until the validation "
        "passes (retry 10 s .. 600 s)"
    )


def test_an_ignored_xid_says_which_rule_ignores_it(tmp_path: Path) -> None:
    code, out = _check(tmp_path, "--device", "d/p/gpu-0", "--message", "XID 43 reset channel")
    assert code == 0
    assert out == (
        'd/p/gpu-0 Unhealthy "XID 43 reset channel": ignored by rule app-xid: no taint, '
        "no Event, no history\n"
    )
    _, out = _check(tmp_path, "--device", "d/p/gpu-0", "--message", "XID 43", "-o", "json")
    result = json.loads(out)
    assert (result["rule"], result["outcome"]) == ("app-xid", "ignore")
    assert result["burnIn"]["appliesTo"] == ["new"]


def test_a_degraded_device_is_shown_not_tainted(tmp_path: Path) -> None:
    _, out = _check(tmp_path, "--device", "d/p/gpu-0", "--message", "corrected ECC")
    assert "degraded by rule ecc" in out and "no taint, nothing evicted" in out
    _, out = _check(tmp_path, "--device", "d/p/gpu-0", "--message", "XID 79")
    assert out.startswith('d/p/gpu-0 Unhealthy "XID 79": rule bad\n  taint ')


def test_the_summary_names_limits_and_profiles(tmp_path: Path) -> None:
    text = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
limits: {cluster: 10%, perPool: 4, window: 10m, resume: auto}
profiles:
  - name: canary
    match: {pool: node-1}
    observeOnly: true
  - name: h100
    match: {attributes: {model: h100}}
    limits: {perNode: 2}
    rules:
      - name: h100-any
rules:
  - name: bad
"""
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    result = CliRunner().invoke(policy_group, ["check", str(path)])
    assert result.exit_code == 0
    assert result.stdout.splitlines()[1:] == [
        "  limits       cluster 10%, pool 4 new taints within 600 s (resume auto)",
        "  profile      canary: the policy's rules; observe-only",
        "  profile      h100: 1 rule(s) of its own; limits node 2 new taints within 600 s "
        "(resume manual)",
    ]
