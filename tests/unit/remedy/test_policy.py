"""Policy files: the shipped example and the reference page's example load with their
values, defaults, durations, replacement of the default recovery, and malformed input of
every shape (and unreadable files) naming the file and the field."""

from __future__ import annotations

import os
import re
from pathlib import Path

import msgspec
import pytest

from drahealth.core import Health
from drahealth.core._policy import PolicyError
from drahealth.remedy import _policy_load
from drahealth.remedy._policy_load import load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "policy.md"
HEAD = "apiVersion: drahealth.io/v1\nkind: RemediationPolicy\n"
RULE = HEAD + "rules:\n- name: r\n"


def doc_example() -> str:
    text = DOC.read_text(encoding="utf-8")
    found = re.search(r"## A complete example.*?```yaml\n(.*?)```", text, re.S)
    assert found is not None, "docs/policy.md lost its complete example"
    return found.group(1)


def schema_fields() -> set[str]:
    """Every field name the file format accepts, as written in the file."""
    names: set[str] = set()
    todo: list[type[msgspec.Struct]] = [_policy_load._Policy]
    seen: set[type[msgspec.Struct]] = set()
    while todo:
        struct = todo.pop()
        if struct in seen:
            continue
        seen.add(struct)
        for f in msgspec.structs.fields(struct):
            names.add(f.encode_name)
            for inner in _structs_in(f.type):
                todo.append(inner)
    return names


def _structs_in(tp: object) -> list[type[msgspec.Struct]]:
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return [tp]
    return [s for arg in getattr(tp, "__args__", ()) for s in _structs_in(arg)]


def test_the_reference_example_loads_with_its_values() -> None:
    policy = parse_policy(doc_example(), "docs/policy.md")
    fatal, silent = policy.rules
    m = fatal.match
    assert (m.driver, m.pool, m.device) == ("gpu.example.com", "node-1", "gpu-*")
    assert m.attributes == {"model": "a100", "memoryGiB": 80}
    assert m.message is not None and m.message.search("XID 79 on gpu-3")
    a = fatal.action
    assert (a.effect, a.grace, a.taint_key, a.taint_value) == (
        "NoSchedule",
        0.0,
        "drahealth.io/unhealthy",
        "fatal-xid",
    )
    assert [(s.after, s.effect) for s in a.escalate] == [(30.0, "NoExecute")]
    assert fatal.recovery.healthy_for == 300
    assert fatal.recovery.validate is not None and fatal.recovery.validate.timeout == 120
    assert silent.match.health == frozenset({Health.UNKNOWN})
    assert silent.recovery.validate is not None
    assert silent.recovery.validate.http.startswith("http://")
    assert silent.recovery.validate.timeout == 10  # the default
    assert policy.eviction.mode == "evict" and policy.eviction.per_second == 5
    assert policy.exclude_namespaces == {"kube-system"} and not policy.dry_run


def test_the_reference_shows_and_describes_every_field() -> None:
    example = doc_example()
    text = DOC.read_text(encoding="utf-8")
    for name in sorted(schema_fields()):
        assert re.search(rf"\b{name}:", example), f"{name} missing from the complete example"
        assert re.search(rf"\| `([\w.\[\]]*\.)?{name}` \|", text), f"{name} missing from a table"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("0", 0.0),
        ("30", 30.0),
        ("1.5", 1.5),
        ("'10'", 10.0),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1.5m", 90.0),
        ("1h", 3600.0),
        ("' 10s '", 10.0),
    ],
)
def test_durations(value: str, seconds: float) -> None:
    policy = parse_policy(RULE + f"  action: {{gracePeriod: {value}}}\n", "p.yaml")
    assert policy.rules[0].action.grace == seconds


@pytest.mark.parametrize("value", ["1h30m", "10 s", "-5s", "5x", "''", "1e3", "s", "5 m"])
def test_bad_durations_name_the_field(value: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(RULE + f"  recovery: {{healthyFor: {value}}}\n", "p.yaml")
    assert str(info.value).startswith("p.yaml: rules[0].recovery.healthyFor: "), str(info.value)


def test_nan_is_not_a_duration() -> None:
    with pytest.raises(PolicyError, match=r"^p.yaml: rules\[0\].action.gracePeriod: duration"):
        parse_policy(RULE + "  action: {gracePeriod: .nan}\n", "p.yaml")


def test_the_bad_regex_message_is_exact() -> None:
    text = RULE + "- name: b\n- name: c\n  match: {message: '('}\n"
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "policy.yaml")
    assert str(info.value) == (
        "policy.yaml: rules[2].match.message: rule 'c': bad regex '(': missing ): ( "
        "(RE2 syntax: no backreferences, no lookahead or lookbehind)"
    )


def test_a_rules_recovery_replaces_the_default_as_a_whole() -> None:
    text = (
        HEAD
        + "recovery: {healthyFor: 2m, validate: {exec: [check]}}\n"
        + "rules:\n- name: own\n  recovery: {healthyFor: 5s}\n- name: inherits\n"
    )
    own, inherits = parse_policy(text, "p.yaml").rules
    assert own.recovery.healthy_for == 5 and own.recovery.validate is None
    assert inherits.recovery.healthy_for == 120
    assert inherits.recovery.validate is not None
    assert inherits.recovery.validate.exec == ("check",)


def test_the_default_recovery_is_checked_even_when_every_rule_has_its_own() -> None:
    text = HEAD + "recovery: {healthyFor: soon}\nrules:\n- name: r\n  recovery: {healthyFor: 1}\n"
    with pytest.raises(PolicyError, match=r"^p.yaml: recovery.healthyFor: bad duration 'soon'"):
        parse_policy(text, "p.yaml")


def test_hysteresis_null_turns_the_hold_off_and_absent_keeps_the_default() -> None:
    off, default = parse_policy(
        HEAD + "rules:\n- name: no-hold\n  hysteresis: null\n- name: default\n", "p.yaml"
    ).rules
    assert off.hysteresis is None
    assert default.hysteresis is not None and default.hysteresis.window == 30


def test_matching_as_loaded_glob_regex_search_and_qualified_attributes() -> None:
    from drahealth.core._policy import AttributeValue, DeviceFacts

    text = RULE + (
        "  match: {device: 'gpu-[0-3]', message: '(?i)xid 79', "
        "attributes: {gpu.example.com/model: a100, cores: 8, mig: false}}\n"
    )
    (rule,) = parse_policy(text, "p.yaml").rules
    attrs: dict[str, AttributeValue] = {"gpu.example.com/model": "a100", "cores": 8, "mig": False}
    gpu = DeviceFacts("gpu.example.com", "node-1", "gpu-2", "node-1", attrs)
    assert rule.match.matches(gpu, Health.UNHEALTHY, "GPU fell off the bus (Xid 79)")
    assert not rule.match.matches(gpu, Health.UNHEALTHY, "XID 13")
    assert not rule.match.matches(gpu, Health.UNKNOWN, "XID 79")
    other = DeviceFacts("gpu.example.com", "node-1", "gpu-4", "node-1", attrs)
    assert not rule.match.matches(other, Health.UNHEALTHY, "XID 79")
    fewer = DeviceFacts("gpu.example.com", "node-1", "gpu-1", "node-1", {"cores": 8})
    assert not rule.match.matches(fewer, Health.UNHEALTHY, "XID 79")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("'just text'\n", "p.yaml: the top level must be a mapping, got str"),
        ("rules:\n\t- name: r\n", "p.yaml: line 2, column 1: invalid YAML: found character '\\t'"),
        ("a: b: c\n", "p.yaml: line 1, column 5: invalid YAML: mapping values are not allowed"),
        (
            "apiVersion: drahealth.io/v2\nkind: RemediationPolicy\nrules: [{name: r}]\n",
            "p.yaml: apiVersion: Invalid enum value 'drahealth.io/v2'",
        ),
        (
            "apiVersion: drahealth.io/v1\nkind: Policy\nrules: [{name: r}]\n",
            "p.yaml: kind: Invalid enum value 'Policy'",
        ),
        (HEAD + "rules:\n- 3\n", "p.yaml: rules[0]: Expected `object`, got `int`"),
        (HEAD + "rules:\n- match: {}\n", "p.yaml: rules[0]: Object missing required field `name`"),
        (
            RULE + "  action: {efect: NoExecute}\n",
            "p.yaml: rules[0].action: Object contains unknown field `efect`",
        ),
        (
            RULE + "  match: {driver: gpu, devise: x}\n",
            "p.yaml: rules[0].match: Object contains unknown field `devise`",
        ),
        (
            RULE + "  recovery: {validate: {exec: [x], timout: 1}}\n",
            "p.yaml: rules[0].recovery.validate: Object contains unknown field `timout`",
        ),
        (RULE + "  match: [a]\n", "p.yaml: rules[0].match: Expected `object`, got `array`"),
        (RULE + "  match: {driver: 3}\n", "p.yaml: rules[0].match.driver: Expected `str | null`"),
        (
            RULE + "  match: {health: Unhealthy}\n",
            "p.yaml: rules[0].match.health: Expected `array`, got `str`",
        ),
        (
            RULE + "  match: {attributes: {model: [a]}}\n",
            "p.yaml: rules[0].match.attributes",
        ),
        (
            RULE + "  match: {attributes: {mem: 1.5}}\n",
            "p.yaml: rules[0].match.attributes",
        ),
        (
            RULE + "  action: {effect: none}\n",
            "p.yaml: rules[0].action.effect: Invalid enum value 'none'",
        ),
        (
            RULE + "  action: {escalate: [{after: 1m}]}\n",
            "p.yaml: rules[0].action.escalate[0]: Object missing required field `effect`",
        ),
        (
            RULE + "  action: {escalate: {after: 1m, effect: NoExecute}}\n",
            "p.yaml: rules[0].action.escalate: Expected `array`, got `object`",
        ),
        (
            RULE + "  action: {escalate: [{after: soon, effect: NoExecute}]}\n",
            "p.yaml: rules[0].action.escalate[0].after: bad duration 'soon'",
        ),
        (
            RULE + "  action: {taintKey: 'UPPER.example.com/x'}\n",
            "p.yaml: rules[0].action.taintKey: taint key 'UPPER.example.com/x': the prefix",
        ),
        (
            RULE + "  action: {taintKey: 'example.com/'}\n",
            "p.yaml: rules[0].action.taintKey: taint key 'example.com/': the name part",
        ),
        (
            RULE + "  action: {taintValue: '-bad'}\n",
            "p.yaml: rules[0].action.taintValue: taint value '-bad' must be",
        ),
        (
            RULE + "  action: {taintValue: " + "a" * 64 + "}\n",
            "p.yaml: rules[0].action.taintValue: taint value 'aaaa",
        ),
        (
            RULE + "  hysteresis: {transitions: five}\n",
            "p.yaml: rules[0].hysteresis.transitions: Expected `int`, got `str`",
        ),
        (
            RULE + "  hysteresis: {transitions: 2.5}\n",
            "p.yaml: rules[0].hysteresis.transitions: Expected `int`, got `float`",
        ),
        (
            RULE + "  recovery: {validate: {exec: [x], http: 'http://a'}}\n",
            "p.yaml: rules[0].recovery.validate: set exactly one of exec or http",
        ),
        (
            RULE + "  recovery: {validate: {exec: []}}\n",
            "p.yaml: rules[0].recovery.validate: set exactly one of exec or http",
        ),
        (
            RULE + "  recovery: {validate: {exec: [x], timeout: 0}}\n",
            "p.yaml: rules[0].recovery.validate.timeout: duration 0 must be > 0",
        ),
        (
            RULE + "  recovery: {validate: {exec: check}}\n",
            "p.yaml: rules[0].recovery.validate.exec: Expected `array`, got `str`",
        ),
        (
            RULE + "excludeNamespaces: kube-system\n",
            "p.yaml: excludeNamespaces: Expected `array`, got `str`",
        ),
        (RULE + "eviction: {perSecond: 0}\n", "p.yaml: eviction.perSecond: must be > 0"),
        (
            RULE + "eviction: {maxConcurrentPerNode: 0}\n",
            "p.yaml: eviction.maxConcurrentPerNode: must be at least 1, got 0",
        ),
        (
            RULE + "eviction: {maxConcurent: 3}\n",
            "p.yaml: eviction: Object contains unknown field `maxConcurent`",
        ),
        (RULE + "dryRun: 1\n", "p.yaml: dryRun: Expected `bool`, got `int`"),
        (HEAD + "rules:\n- name: off\n", "p.yaml: rules[0].name: Expected `str`, got `bool`"),
        (
            RULE + "  action: {taintValue: yes}\n",
            "p.yaml: rules[0].action.taintValue: Expected `str`, got `bool`",
        ),
    ],
)  # fmt: skip
def test_malformed_input_names_the_file_and_the_field(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    assert str(info.value).startswith(message), str(info.value)


def test_load_policy_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(RULE + "  action: {effect: Evict}\n", encoding="utf-8")
    with pytest.raises(PolicyError) as info:
        _policy_load.load_policy(str(path))
    assert str(info.value).startswith(f"{path}: rules[0].action.effect: Invalid enum value")


# -- gaps found by the tests above, fixed ------------------------------------------------


def test_a_rule_cannot_match_healthy_devices() -> None:
    with pytest.raises(PolicyError, match=r"^p.yaml: rules\[0\].match.health\[0\]: "):
        parse_policy(RULE + "  match: {health: [Healthy]}\n", "p.yaml")


def test_duplicate_keys_are_errors() -> None:
    text = RULE + "  action:\n    effect: NoExecute\n    effect: None\n"
    with pytest.raises(PolicyError, match=r"^p.yaml: line 7, column 5: .*duplicate key 'effect'"):
        parse_policy(text, "p.yaml")


def test_infinite_durations_are_errors() -> None:
    with pytest.raises(PolicyError, match=r"^p.yaml: rules\[0\].recovery.healthyFor: "):
        parse_policy(RULE + "  recovery: {healthyFor: .inf}\n", "p.yaml")


def test_a_bad_attribute_value_names_the_attribute() -> None:
    with pytest.raises(PolicyError, match=r"^p.yaml: rules\[0\].match.attributes.model: "):
        parse_policy(RULE + "  match: {attributes: {model: [a]}}\n", "p.yaml")


def test_the_example_policy_loads_with_its_values() -> None:
    policy = load_policy(str(ROOT / "examples" / "policy.yaml"))
    ignored, degraded, fatal, unhealthy, silent = policy.rules
    assert ignored.action.outcome == "ignore" and degraded.action.outcome == "degraded"
    assert ignored.match.message is not None and ignored.match.message.search("XID 13: x")
    assert fatal.repair is not None and fatal.repair.kind == "job"
    assert policy.limits is not None and policy.profiles[0].observe_only
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
        (
            RULE + "  match: {message: '('}\n",
            "p.yaml: rules[0].match.message: rule 'r': bad regex '('",
        ),
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
