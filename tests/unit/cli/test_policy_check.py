"""``drahealth policy check``: the controller's loader errors, and what a policy does."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from drahealth.cli.policy import policy_group

POLICY = """apiVersion: drahealth.io/v1
kind: RemediationPolicy
remediation: {mode: auto, fallback: cordon}
rules:
  - name: app-xid
    match: {driver: gpu.example.com, message: "XID (13|31|43)\\\\b"}
    action: {effect: None, taintValue: app-xid}
  - name: fatal
    match: {driver: gpu.example.com, message: "XID 79", attributes: {model: H100}}
    action: {effect: NoSchedule, escalate: [{after: 2m, effect: NoExecute}]}
    recovery: {healthyFor: 10s}
"""


def _check(tmp_path: Path, text: str, *args: str) -> tuple[int, str, str]:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    result = CliRunner().invoke(policy_group, ["check", str(path), *args])
    return result.exit_code, result.stdout, result.stderr


def test_a_valid_file(tmp_path: Path) -> None:
    code, out, _ = _check(tmp_path, POLICY)
    assert code == 0 and out.endswith("valid, 2 rule(s)\n")


def test_errors_are_the_loaders_one_line_and_exit_1(tmp_path: Path) -> None:
    code, out, err = _check(tmp_path, POLICY.replace("effect: None", "effect: Sometimes"))
    assert code == 1 and out == ""
    assert err.startswith("error: ") and "policy.yaml" in err and "Sometimes" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    code, out, _ = _check(tmp_path, "rules: [", "-o", "json")
    assert code == 1 and json.loads(out.splitlines()[0])["valid"] is False


def test_explains_the_matching_rule(tmp_path: Path) -> None:
    args = ["--device", "gpu.example.com/node-1/gpu-0", "--message", "XID 79 fell off",
            "--attribute", "model=H100", "-o", "json"]  # fmt: skip
    code, out, _ = _check(tmp_path, POLICY, *args)
    assert code == 0, out
    got = json.loads(out)
    assert got["rule"] == "fatal"
    assert got["taint"] == {"key": "drahealth.io/unhealthy", "value": "unhealthy",
                            "effect": "NoSchedule"}  # fmt: skip
    assert got["escalate"] == [{"afterSeconds": 120.0, "effect": "NoExecute"}]
    assert got["evicts"] is True and got["fallback"] == "cordon"
    assert got["recovery"] == {"healthyForSeconds": 10.0, "validate": False}


def test_attributes_and_messages_decide(tmp_path: Path) -> None:
    device = ["--device", "gpu.example.com/node-1/gpu-0"]
    _, out, _ = _check(tmp_path, POLICY, *device, "--message", "XID 79", "--attribute",
                       "model=A100")  # fmt: skip
    assert "no rule matches; the controller does nothing" in out
    _, out, _ = _check(tmp_path, POLICY, *device, "--message", "XID 43 app error")
    assert "rule app-xid" in out and "drahealth.io/unhealthy=app-xid:None" in out
    assert "pods         are not evicted" in out
    _, out, _ = _check(tmp_path, POLICY, *device, "--health", "Healthy")
    assert "no rule matches" in out


def test_bad_flags_name_the_flag(tmp_path: Path) -> None:
    code, _, err = _check(tmp_path, POLICY, "--device", "gpu-0")
    assert code == 2 and "--device" in err and "DRIVER/POOL/DEVICE" in err
    code, _, err = _check(tmp_path, POLICY, "--device", "d/p/x", "--attribute", "novalue")
    assert code == 2 and "--attribute" in err
    code, _, err = _check(tmp_path, POLICY, "--health", "Broken")
    assert code == 2 and "--health" in err


def test_a_missing_or_binary_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(policy_group, ["check", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 1 and "cannot read" in result.stderr
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00rules")
    result = CliRunner().invoke(policy_group, ["check", str(binary)])
    assert result.exit_code == 1 and "not UTF-8" in result.stderr
