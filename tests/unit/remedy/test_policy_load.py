"""Policy files: the example loads; every kind of mistake names the file and the field."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from drahealth.core import Health
from drahealth.core._policy import PolicyError
from drahealth.remedy._policy_load import load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[3]
HEAD = "apiVersion: drahealth.io/v1\nkind: RemediationPolicy\n"


def test_the_example_policy_loads_with_its_values() -> None:
    policy = load_policy(str(ROOT / "examples" / "policy.yaml"))
    fatal, unhealthy, silent = policy.rules
    assert fatal.action.effect == "NoExecute" and fatal.action.taint_value == "fatal-xid"
    assert fatal.match.message is not None and fatal.match.message.search("XID 79 at 0x1")
    assert fatal.recovery.healthy_for == 300 and fatal.recovery.validate is not None
    assert fatal.recovery.validate.timeout == 120
    assert unhealthy.action.grace == 10 and unhealthy.action.escalate[0].after == 600
    assert unhealthy.recovery.healthy_for == 120  # the policy-wide default
    assert silent.match.health == frozenset({Health.UNKNOWN})
    assert policy.eviction.mode == "evict" and policy.exclude_namespaces == {"kube-system"}


def test_defaults() -> None:
    policy = parse_policy(HEAD + "rules:\n- name: all\n")
    (rule,) = policy.rules
    assert rule.match.health == frozenset({Health.UNHEALTHY})
    assert rule.action.effect == "NoSchedule" and rule.action.grace == 0
    assert rule.action.taint_key == "drahealth.io/unhealthy"
    assert rule.hysteresis is not None and rule.hysteresis.transitions == 5
    assert rule.recovery.healthy_for == 60 and not policy.dry_run
    assert policy.eviction.mode == "delete"


RULE = HEAD + "rules:\n- name: r\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- 1\n", "p.yaml: the top level must be a mapping, got list"),
        ("", "p.yaml: the top level must be a mapping, got nothing"),
        ("rules: [\n", "p.yaml: line 2, column 1: invalid YAML"),
        (
            "kind: RemediationPolicy\nrules: []\n",
            "p.yaml: (top level): Object missing required field `apiVersion`",
        ),
        (HEAD + "rules: []\n", "p.yaml: rules: must list at least one rule"),
        (HEAD + "rules: {}\n", "p.yaml: rules: Expected `array`, got `object`"),
        (
            HEAD + "rulez: []\nrules: []\n",
            "p.yaml: (top level): Object contains unknown field `rulez`",
        ),
        (RULE + "  match: {message: '('}\n", "p.yaml: rules[0].match.message: bad regex '('"),
        (
            RULE + "  match: {health: [Sick]}\n",
            "p.yaml: rules[0].match.health[0]: Invalid enum value 'Sick'",
        ),
        (RULE + "  match: {health: []}\n", "p.yaml: rules[0].match.health: must list at least one"),
        (
            RULE + "  action: {effect: Evict}\n",
            "p.yaml: rules[0].action.effect: Invalid enum value 'Evict'",
        ),
        (
            RULE + "  action: {gracePeriod: soon}\n",
            "p.yaml: rules[0].action.gracePeriod: bad duration 'soon'",
        ),
        (
            RULE + "  action: {gracePeriod: -1}\n",
            "p.yaml: rules[0].action.gracePeriod: duration -1 must be >= 0",
        ),
        (
            RULE + "  action: {gracePeriod: true}\n",
            "p.yaml: rules[0].action.gracePeriod: Expected `int | float | str`, got `bool`",
        ),
        (
            RULE + "  action: {taintKey: 'bad key'}\n",
            "p.yaml: rules[0].action.taintKey: taint key 'bad key'",
        ),
        (
            RULE + "  action: {taintValue: 'a b'}\n",
            "p.yaml: rules[0].action.taintValue: taint value 'a b'",
        ),
        (
            RULE + "  action: {effect: NoExecute, escalate: [{after: 1m, effect: NoSchedule}]}\n",
            "p.yaml: rules[0].action.escalate[0].effect: NoSchedule does not escalate",
        ),
        (
            RULE + "  action: {effect: None, escalate: [{after: 2m, effect: NoSchedule}, "
            "{after: 1m, effect: NoExecute}]}\n",
            "p.yaml: rules[0].action.escalate[1].after: steps must be in order",
        ),
        (
            RULE + "  hysteresis: {transitions: 1}\n",
            "p.yaml: rules[0].hysteresis.transitions: must be at least 2",
        ),
        (
            RULE + "  hysteresis: {window: 0}\n",
            "p.yaml: rules[0].hysteresis.window: duration 0 must be > 0",
        ),
        (
            RULE + "  recovery: {validate: {}}\n",
            "p.yaml: rules[0].recovery.validate: set exactly one of exec or http",
        ),
        (
            RULE + "  recovery: {validate: {http: 'ftp://x'}}\n",
            "p.yaml: rules[0].recovery.validate.http: 'ftp://x' is not an http(s) URL",
        ),
        (RULE + "- name: r\n", "p.yaml: rules[1].name: duplicate rule name 'r' (rules[0])"),
        (RULE + "- name: '  '\n", "p.yaml: rules[1].name: must not be empty"),
        (
            RULE + "eviction: {maxConcurrent: 0}\n",
            "p.yaml: eviction.maxConcurrent: must be at least 1",
        ),
        (RULE + "eviction: {mode: nuke}\n", "p.yaml: eviction.mode: Invalid enum value 'nuke'"),
        (RULE + "recovery: {healthyFor: 1y}\n", "p.yaml: recovery.healthyFor: bad duration '1y'"),
        (RULE + "dryRun: maybe\n", "p.yaml: dryRun: Expected `bool`, got `str`"),
    ],
)  # fmt: skip
def test_errors_name_the_file_and_the_field(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    assert str(info.value).startswith(message), str(info.value)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"nope.yaml: cannot read: No such file"):
        load_policy(str(tmp_path / "nope.yaml"))
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PolicyError, match=r"bin.yaml: not UTF-8 text"):
        load_policy(str(binary))
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.yaml"
        locked.write_text(HEAD)
        locked.chmod(0)
        with pytest.raises(PolicyError, match="cannot read: Permission denied"):
            load_policy(str(locked))
