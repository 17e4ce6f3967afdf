"""The Job API rules and the Job controller's pure parts (pod failure policy, back-off, columns).

Facts from upstream kubernetes/kubernetes: pkg/controller/job/pod_failure_policy.go
(first matching rule decides; exit code 0 never matches; messages), backoff_utils.go
(10 s doubling from the last failure since the last success, capped),
pkg/apis/batch/v1/defaults.go and pkg/printers/internalversion/printers.go.
"""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.controlplane._batch import default_job, job_causes, job_update_causes
from drahealth.controlplane._resources import by_kind
from drahealth.controlplane._table import table
from drahealth.standins._jobs import _Backoff, match_pod_failure_policy

POLICY = {
    "rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In",
                                              "values": [42]}},
        {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [1, 2]}},
    ]
}  # fmt: skip


def pod(code: int | None = None, *conditions: str, name: str = "main") -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": "Failed",
        "conditions": [{"type": c, "status": "True"} for c in conditions],
    }
    if code is not None:
        status["containerStatuses"] = [{"name": name, "state": {"terminated": {"exitCode": code}}}]
    return {"metadata": {"name": "p", "namespace": "ns"}, "status": status}


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (pod(1, "DisruptionTarget"), (None, False, "Ignore")),
        (
            pod(42),
            (
                "Container main for pod ns/p failed with exit code 42 matching FailJob "
                "rule at index 1",
                True,
                "FailJob",
            ),
        ),
        (pod(42, name="sidecar"), (None, True, "Count")),
        (pod(7), (None, True, "Count")),
        (pod(1), (None, True, None)),
        (pod(0), (None, True, None)),  # exit code 0 never matches onExitCodes
        (pod(None), (None, True, None)),
    ],
)
def test_pod_failure_policy_first_matching_rule_decides(
    p: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    assert match_pod_failure_policy(POLICY, p) == expected


def test_fail_job_on_condition_message_and_no_policy() -> None:
    policy = {"rules": [{"action": "FailJob", "onPodConditions": [{"type": "ConfigIssue"}]}]}
    message, counts, action = match_pod_failure_policy(policy, pod(None, "ConfigIssue"))
    assert message == "Pod ns/p has condition ConfigIssue matching FailJob rule at index 0"
    assert (counts, action) == (True, "FailJob")
    assert match_pod_failure_policy(None, pod(1)) == (None, True, None)


def _finished(at: str) -> dict[str, Any]:
    return {
        "metadata": {},
        "status": {"containerStatuses": [{"state": {"terminated": {"finishedAt": at}}}]},
    }


def test_backoff_doubles_from_the_last_failure_and_resets_on_success() -> None:
    b = _Backoff()
    assert b.remaining(10, 360, 0) == 0
    b.record([], [_finished("2026-01-01T00:00:00Z")])
    t0 = b.last_failure
    assert b.remaining(10, 360, t0) == 10
    b.record([], [_finished("2026-01-01T00:00:05Z")])
    assert b.remaining(10, 360, t0 + 5) == 20
    b.failures = 10
    assert b.remaining(10, 360, b.last_failure) == 360
    b.record([_finished("2026-01-01T00:01:00Z")], [_finished("2026-01-01T00:00:30Z")])
    assert b.failures == 0 and b.remaining(10, 360, t0) == 0


def test_defaults_keep_what_was_given() -> None:
    obj: dict[str, Any] = {
        "metadata": {"name": "j", "uid": "u", "labels": {"team": "a"}},
        "spec": {
            "completions": 4, "backoffLimit": 0, "manualSelector": True,
            "selector": {"matchLabels": {"x": "y"}},
            "template": {"metadata": {"labels": {"x": "y"}}, "spec": {}},
        },
    }  # fmt: skip
    default_job(obj)
    spec = obj["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (4, 1, 0)
    assert spec["selector"] == {"matchLabels": {"x": "y"}}  # manual: nothing generated
    assert spec["template"]["metadata"]["labels"] == {"x": "y"}
    assert obj["metadata"]["labels"] == {"team": "a"}


def test_update_rules_allow_a_suspended_template_change() -> None:
    old = {"spec": {"suspend": True, "template": {"a": 1}, "completions": 1}}
    new = {"spec": {"suspend": True, "template": {"a": 2}, "completions": 1}}
    assert job_update_causes(old, new) == []
    new["spec"]["suspend"] = False
    assert [c["field"] for c in job_update_causes(old, new)] == ["spec.template"]


def test_indexed_job_needs_completions() -> None:
    obj = {
        "spec": {
            "completionMode": "Indexed",
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c"}]}},
        }
    }
    assert [c["field"] for c in job_causes(obj)] == ["spec.completions"]


def test_job_table_columns() -> None:
    rt = by_kind("batch/v1", "Job")
    assert rt is not None
    job = {
        "metadata": {"name": "j", "creationTimestamp": "2026-01-01T00:00:00+00:00"},
        "spec": {"parallelism": 3, "template": {"spec": {"containers": [
            {"name": "a", "image": "img:1"}]}}, "selector": {"matchLabels": {"k": "v"}}},
        "status": {"succeeded": 1, "startTime": "2026-01-01T00:00:00Z",
                   "completionTime": "2026-01-01T00:02:05Z",
                   "conditions": [{"type": "FailureTarget", "status": "True"}]},
    }  # fmt: skip
    (row,) = table(rt, [job], None, "None")["rows"]
    name, status, completions, duration, _age, containers, images, selector = row["cells"]
    assert (name, status, completions, duration) == ("j", "FailureTarget", "1/1 of 3", "2m5s")
    assert (containers, images, selector) == ("a", "img:1", "k=v")
