"""PodDisruptionBudget arithmetic and the eviction decision."""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.controlplane._eviction import (
    EVICTION_BLOCKED,
    check_eviction,
    pdb_status,
    pod_ready,
    scaled,
)
from drahealth.controlplane._status import APIError

NOW = "2026-01-01T00:00:00Z"


def pod(
    name: str,
    phase: str = "Running",
    ready: bool | None = None,
    deleting: bool = False,
    app: str = "web",
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    meta: dict[str, Any] = {"name": name, "labels": {"app": app}}
    if deleting:
        meta["deletionTimestamp"] = NOW
    return {"metadata": meta, "status": status}


def pdb(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "budget", "generation": 2},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec},
    }


def with_status(budget: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    return {**budget, "status": pdb_status(budget, pods, None, NOW)}


@pytest.mark.parametrize(
    ("value", "total", "up", "expected"),
    [
        (2, 10, True, 2),
        ("50%", 3, True, 2),
        ("50%", 3, False, 1),
        ("0%", 5, True, 0),
        ("100%", 4, True, 4),
        ("3", 9, True, 3),
    ],
)
def test_scaled(value: int | str, total: int, up: bool, expected: int) -> None:
    assert scaled(value, total, up) == expected


def test_pod_ready_rules() -> None:
    assert pod_ready(pod("a"))  # Running without conditions counts
    assert pod_ready(pod("a", ready=True))
    assert not pod_ready(pod("a", ready=False))
    assert not pod_ready(pod("a", phase="Pending"))
    assert not pod_ready(pod("a", deleting=True))


@pytest.mark.parametrize(
    ("spec", "desired", "allowed"),
    [
        ({"minAvailable": 2}, 2, 1),
        ({"minAvailable": 3}, 3, 0),
        ({"minAvailable": "50%"}, 2, 1),  # 50% of 4 matching pods
        ({"maxUnavailable": 1}, 3, 0),
        ({"maxUnavailable": "50%"}, 2, 1),
        ({}, 0, 3),
    ],
)
def test_pdb_status(spec: dict[str, Any], desired: int, allowed: int) -> None:
    pods = [pod("a"), pod("b", ready=True), pod("c", ready=False), pod("d"), pod("other", app="db")]
    st = pdb_status(pdb(**spec), pods, None, NOW)
    assert st["expectedPods"] == 4
    assert st["currentHealthy"] == 3
    assert st["desiredHealthy"] == desired
    assert st["disruptionsAllowed"] == allowed
    assert st["observedGeneration"] == 2
    (cond,) = st["conditions"]
    assert cond["type"] == "DisruptionAllowed"
    assert cond["status"] == ("True" if allowed else "False")


def test_condition_transition_time_is_kept_while_unchanged() -> None:
    first = pdb_status(pdb(minAvailable=1), [pod("a"), pod("b")], None, NOW)
    later = pdb_status(pdb(minAvailable=1), [pod("a"), pod("b")], first, "2027-01-01T00:00:00Z")
    assert later["conditions"][0]["lastTransitionTime"] == NOW


def test_eviction_blocked_with_disruption_budget_cause() -> None:
    pods = [pod("a"), pod("b")]
    budget = with_status(pdb(minAvailable=2), pods)
    with pytest.raises(APIError) as err:
        check_eviction(pods[0], [budget])
    body = err.value.body
    assert body["code"] == 429 and body["reason"] == "TooManyRequests"
    assert body["message"] == EVICTION_BLOCKED
    (cause,) = body["details"]["causes"]
    assert cause["reason"] == "DisruptionBudget"
    assert cause["message"] == (
        "The disruption budget budget needs 2 healthy pods and has 2 currently"
    )


def test_eviction_allowed_cases() -> None:
    pods = [pod("a"), pod("b")]
    check_eviction(pods[0], [with_status(pdb(minAvailable=1), pods)])
    check_eviction(pods[0], [])  # no budget
    check_eviction(pod("x", phase="Succeeded"), [with_status(pdb(minAvailable=5), pods)])
    unready = pod("c", ready=False)
    everyone = [*pods, unready]
    check_eviction(unready, [with_status(pdb(minAvailable=2), everyone)])  # budget is healthy
    strict = with_status(pdb(minAvailable=3, unhealthyPodEvictionPolicy="AlwaysAllow"), everyone)
    check_eviction(unready, [strict])


def test_several_budgets_is_an_error() -> None:
    pods = [pod("a")]
    budget = with_status(pdb(minAvailable=0), pods)
    with pytest.raises(APIError) as err:
        check_eviction(pods[0], [budget, budget])
    assert err.value.code == 500
