"""The Deployment stand-in's pure parts: the template hash and the status it reports."""

from __future__ import annotations

import copy
from typing import Any

from drahealth.standins._deployments import deployment_status, template_hash

JSON = dict[str, Any]
TEMPLATE: JSON = {
    "metadata": {"labels": {"app": "web"}},
    "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
}


def _rs(name: str, replicas: int, ready: int, available: int) -> JSON:
    return {
        "metadata": {"name": name},
        "status": {
            "replicas": replicas, "readyReplicas": ready, "availableReplicas": available,
        },
    }  # fmt: skip


def _deploy(replicas: int = 2, status: JSON | None = None) -> JSON:
    return {
        "metadata": {"name": "web", "generation": 3},
        "spec": {"replicas": replicas, "template": TEMPLATE},
        "status": status or {},
    }


def test_template_hash_is_stable_short_and_follows_the_template() -> None:
    h = template_hash(TEMPLATE)
    assert len(h) == 10 and h.isalnum() and h == h.lower()
    reordered = {"spec": TEMPLATE["spec"], "metadata": TEMPLATE["metadata"]}
    assert template_hash(reordered) == h  # key order does not matter
    changed = copy.deepcopy(TEMPLATE)
    changed["spec"]["containers"][0]["image"] = "busybox:1.37"
    assert template_hash(changed) != h
    assert not set(h) & set("aeiou013"), "generated names avoid vowels and look-alikes"


def test_status_of_a_rollout_in_progress() -> None:
    new = _rs("web-new", 1, 0, 0)
    old = _rs("web-old", 2, 2, 2)
    st = deployment_status(_deploy(), new, [new, old])
    assert st["replicas"] == 3 and st["updatedReplicas"] == 1
    assert st["readyReplicas"] == 2 and st["availableReplicas"] == 2
    assert st["unavailableReplicas"] == 0 and st["observedGeneration"] == 3
    conds = {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}
    assert conds == {
        "Available": ("True", "MinimumReplicasAvailable"),
        "Progressing": ("True", "ReplicaSetUpdated"),
    }


def test_status_once_complete_and_when_unavailable() -> None:
    new = _rs("web-new", 2, 2, 2)
    st = deployment_status(_deploy(), new, [new])
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Progressing"]["reason"] == "NewReplicaSetAvailable"
    assert conds["Progressing"]["message"] == 'ReplicaSet "web-new" has successfully progressed.'
    down = _rs("web-new", 2, 0, 0)
    st2 = deployment_status(_deploy(status=st), down, [down])
    conds2 = {c["type"]: c for c in st2["conditions"]}
    assert conds2["Available"]["reason"] == "MinimumReplicasUnavailable"
    assert st2["unavailableReplicas"] == 2


def test_transition_time_kept_while_the_condition_holds() -> None:
    new = _rs("web-new", 2, 2, 2)
    first = deployment_status(_deploy(), new, [new])
    for c in first["conditions"]:
        c["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    again = deployment_status(_deploy(status=first), new, [new])
    assert {c["lastTransitionTime"] for c in again["conditions"]} == {"2020-01-01T00:00:00Z"}


def test_status_without_replicasets_and_with_malformed_status() -> None:
    st = deployment_status(_deploy(replicas=0), None, [])
    assert st["replicas"] == 0 and st["updatedReplicas"] == 0 and st["unavailableReplicas"] == 0
    odd = {"metadata": {"name": "x"}, "status": {"replicas": None, "readyReplicas": "x"}}
    st = deployment_status(_deploy(), odd, [odd])
    assert st["replicas"] == 0 and st["readyReplicas"] == 0
