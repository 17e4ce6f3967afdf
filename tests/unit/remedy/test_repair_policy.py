"""The ``escalation`` and ``repair`` sections of a policy file: defaults, forms, errors."""

from __future__ import annotations

import pytest

from drahealth.core import Escalation, Policy, PolicyError
from drahealth.remedy._policy_load import parse_policy

HEAD = "apiVersion: drahealth.io/v1\nkind: RemediationPolicy\n"


def load(rule_extra: str = "", top: str = "") -> Policy:
    text = HEAD + top + "rules:\n- name: xid\n  match: {driver: gpu.example.com}\n" + rule_extra
    return parse_policy(text, "p.yaml")


def test_defaults_count_failed_repairs_only() -> None:
    policy = load()
    assert policy.escalation == Escalation(episodes=0, window=86400.0, failed_repairs=2)
    assert policy.rules[0].escalation is None and policy.rules[0].repair is None


def test_sections_with_defaults() -> None:
    policy = load(
        "  escalation: {episodes: 2}\n  repair: {exec: [reset]}\n", top="escalation: {}\n"
    )
    rule = policy.rules[0]
    assert policy.escalation == Escalation(3, 86400.0, 2)
    assert rule.escalation == Escalation(2, 86400.0, 2)
    r = rule.repair
    assert (r.kind, r.exec, r.attempts, r.backoff, r.timeout) == ("exec", ("reset",), 3, 30, 600)


def test_job_template_as_text_and_webhook() -> None:
    template = (
        "  repair:\n    job:\n      namespace: ops\n      template: |\n"
        "        containers: [{name: r, image: i, args: ['$(DRAHEALTH_DEVICE)']}]\n"
    )
    r = load(template).rules[0].repair
    assert r.kind == "job" and r.job.namespace == "ops"
    assert r.job.template["template"]["spec"]["containers"][0]["name"] == "r"
    hook = load("  repair: {webhook: {url: 'http://x/y', timeout: 5s}, attempts: 1}\n")
    r = hook.rules[0].repair
    assert (r.kind, r.webhook.url, r.webhook.timeout, r.attempts) == ("webhook", "http://x/y", 5, 1)


@pytest.mark.parametrize(
    ("extra", "top", "error"),
    [
        ("  repair: {}\n", "", "p.yaml: rules[0].repair: set exactly one of exec, webhook or job"),
        (
            "  repair: {exec: [a], webhook: {url: 'http://x'}}\n",
            "",
            "rules[0].repair: set exactly one",
        ),
        ("  repair: {exec: [a], attempts: 0}\n", "", "rules[0].repair.attempts: must be 1 to 20"),
        ("  repair: {exec: [a], timeout: 0}\n", "", "rules[0].repair.timeout: duration 0"),
        ("  repair: {webhook: {url: 'ftp://x'}}\n", "", "rules[0].repair.webhook.url: 'ftp://x'"),
        (
            "  repair: {job: {template: {containers: []}}}\n",
            "",
            "rules[0].repair.job.template.spec.containers: must list at least one container",
        ),
        (
            "  repair: {job: {template: {containers: [{name: a, image: i, "
            "args: ['$(DRAHEALTH_UUID)']}]}}}\n",
            "",
            "rules[0].repair.job.template.spec.containers[0].args[0]: $(DRAHEALTH_UUID)",
        ),
        (
            "  repair: {job: {template: {containers: [{name: a, image: i}]}, namespace: A_B}}\n",
            "",
            "rules[0].repair.job.namespace: 'A_B' is not a namespace name",
        ),
        ("  repair: {exec: [a], retries: 3}\n", "", "unknown field `retries`"),
        ("", "escalation: {episodes: -1}\n", "p.yaml: escalation.episodes: must be at least 0"),
        ("  escalation: {window: 0}\n", "", "rules[0].escalation.window: duration 0"),
    ],
)
def test_errors_name_the_field(extra: str, top: str, error: str) -> None:
    with pytest.raises(PolicyError) as info:
        load(extra, top)
    assert error in str(info.value)
