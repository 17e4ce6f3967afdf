"""Policy files: the ``outcome`` of a rule (taint, ignore, degraded) and the ``burnIn``
section load with their values and defaults; mistakes name the file and the field."""

from __future__ import annotations

import pytest

from drahealth.core._policy import PolicyError
from drahealth.remedy._policy_load import parse_policy

HEAD = "apiVersion: drahealth.io/v1\nkind: RemediationPolicy\n"
RULES = """rules:
  - name: app-xid
    match: {message: "XID (13|31|43|45|68)\\\\b"}
    action: {outcome: ignore}
  - name: ecc
    match: {message: corrected}
    action: {outcome: degraded}
  - name: bad
"""


def test_outcomes_load_and_default_to_taint() -> None:
    policy = parse_policy(HEAD + RULES, "p.yaml")
    assert [r.action.outcome for r in policy.rules] == ["ignore", "degraded", "taint"]
    assert policy.burn_in is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("escalate", "[{after: 1m, effect: NoExecute}]"),
        ("gracePeriod", "30s"),
        ("taintKey", "example.com/x"),
        ("taintValue", "x"),
        ("fallback", "cordon"),
    ],
)
def test_taint_fields_on_an_ignore_rule_are_refused(field: str, value: str) -> None:
    text = HEAD + RULES.replace("{outcome: ignore}", f"{{outcome: ignore, {field}: {value}}}")
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    assert str(err.value) == (
        f"p.yaml: rules[0].action.{field}: has no use with outcome ignore (no taint)"
    )


def test_an_unknown_outcome_names_the_field() -> None:
    with pytest.raises(PolicyError, match=r"^p\.yaml: rules\[1\]\.action\.outcome: "):
        parse_policy(HEAD + RULES.replace("degraded}", "quarantine}"), "p.yaml")


def test_burn_in_loads_with_defaults() -> None:
    text = HEAD + "burnIn:\n  validate: {exec: [gpu-burn, --quick], timeout: 5m}\n" + RULES
    b = parse_policy(text, "p.yaml").burn_in
    assert b is not None
    assert b.validate.exec == ("gpu-burn", "--quick") and b.validate.timeout == 300
    assert (b.effect, b.applies_to, b.retry_initial, b.retry_max) == (
        "NoSchedule",
        frozenset({"new", "repaired"}),
        10.0,
        600.0,
    )


def test_burn_in_with_every_field() -> None:
    text = (
        HEAD
        + "burnIn:\n  validate: {http: 'http://checker:8080/burn-in'}\n  effect: None\n"
        + "  appliesTo: [repaired]\n  retryInitial: 30s\n  retryMax: 1h\n"
        + RULES
    )
    b = parse_policy(text, "p.yaml").burn_in
    assert b is not None and b.validate.http == "http://checker:8080/burn-in"
    assert (b.effect, b.applies_to, b.retry_initial, b.retry_max) == (
        "None",
        frozenset({"repaired"}),
        30.0,
        3600.0,
    )


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ("burnIn: {}", "p.yaml: burnIn: Object missing required field `validate`"),
        (
            "burnIn: {validate: {}}",
            "p.yaml: burnIn.validate: set exactly one of exec or http",
        ),
        (
            "burnIn: {validate: {http: ftp://x}}",
            "p.yaml: burnIn.validate.http: 'ftp://x' is not an http(s) URL",
        ),
        (
            "burnIn: {validate: {exec: [x]}, effect: NoExecute}",
            "p.yaml: burnIn.effect: Invalid enum value 'NoExecute'",
        ),
        (
            "burnIn: {validate: {exec: [x]}, appliesTo: []}",
            "p.yaml: burnIn.appliesTo: must list new, repaired or both",
        ),
        (
            "burnIn: {validate: {exec: [x]}, appliesTo: [old]}",
            "p.yaml: burnIn.appliesTo[0]: Invalid enum value 'old'",
        ),
        (
            "burnIn: {validate: {exec: [x]}, retryInitial: 0}",
            "p.yaml: burnIn.retryInitial: duration 0 must be > 0",
        ),
        (
            "burnIn: {validate: {exec: [x]}, retryInitial: 1m, retryMax: 30s}",
            "p.yaml: burnIn.retryMax: must be at least retryInitial (60 s)",
        ),
    ],
)
def test_burn_in_mistakes_name_the_field(section: str, error: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(HEAD + section + "\n" + RULES, "p.yaml")
    assert str(err.value) == error
