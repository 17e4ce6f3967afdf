"""The eviction subresource marks the pod ``DisruptionTarget`` before deleting it.

Upstream's pkg/registry/core/pod/storage/eviction.go (``addConditionAndDeletePod``):
the condition (``EvictionByEvictionAPI``, "Eviction API: evicting") is written through
the pod's status before the delete, on both paths (a pod the budget may ignore and a
budgeted one), not on a dry run; a resourceVersion precondition is checked first and
then follows the version the condition write made. ``UpdatePodCondition`` keeps an
unchanged condition's ``lastTransitionTime``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from drahealth.controlplane._engine import NAMESPACES, PDBS, PODS, Engine, WriteOptions
from drahealth.controlplane._eviction import (
    EVICTION_MESSAGE,
    EVICTION_REASON,
    eviction_condition,
)
from drahealth.controlplane._status import APIError
from drahealth.controlplane._store import Store
from drahealth.core import with_pod_condition

EVICTION = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p"}}


class RecordingStore(Store):
    """A store that remembers every object written by ``update``."""

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[dict[str, Any]] = []

    def update(self, key: str, obj: dict[str, Any]) -> dict[str, Any]:
        out = super().update(key, obj)
        self.updates.append(copy.deepcopy(out))
        return out


@pytest.fixture
def engine() -> Engine:
    e = Engine(RecordingStore())
    e.create(NAMESPACES, None, {"metadata": {"name": "default"}}, WriteOptions())
    return e


def make_pod(engine: Engine, *, phase: str = "Running", finalizer: bool = False) -> Any:
    meta: dict[str, Any] = {"name": "p", "namespace": "default", "labels": {"app": "a"}}
    if finalizer:
        meta["finalizers"] = ["batch.kubernetes.io/job-tracking"]
    body = {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    pod = engine.create(PODS, "default", body, WriteOptions())
    pod = copy.deepcopy(pod)
    pod["status"] = {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]}
    return engine.update(PODS, "default", "p", pod, "status", WriteOptions())


def disruption(obj: dict[str, Any]) -> dict[str, Any] | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "DisruptionTarget"), None)


def test_condition_is_written_before_the_delete(engine: Engine) -> None:
    make_pod(engine)
    store = engine.store
    assert isinstance(store, RecordingStore)
    store.updates.clear()
    engine.evict("default", "p", EVICTION, WriteOptions("controller"))
    assert engine.store.get(PODS.key, "default", "p") is None
    (marked,) = store.updates  # one status write, then the delete
    cond = disruption(marked)
    assert cond is not None
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "True", EVICTION_REASON, EVICTION_MESSAGE,
    )  # fmt: skip
    assert cond["lastTransitionTime"]
    # the other conditions and the spec are untouched
    assert {"type": "Ready", "status": "True", "lastProbeTime": None,
            "lastTransitionTime": None} in marked["status"]["conditions"]  # fmt: skip
    assert not marked["metadata"].get("deletionTimestamp")


def test_a_pod_with_a_finalizer_keeps_the_condition_while_terminating(engine: Engine) -> None:
    make_pod(engine, finalizer=True)
    engine.evict("default", "p", EVICTION, WriteOptions())
    pod = engine.store.get(PODS.key, "default", "p")
    assert pod is not None and pod["metadata"]["deletionTimestamp"]
    cond = disruption(pod)
    assert cond is not None and cond["reason"] == EVICTION_REASON


def test_a_pending_pod_is_marked_too(engine: Engine) -> None:
    """The path that skips the budget (Pending, ended or deleting pods) also marks it."""
    make_pod(engine, phase="Pending", finalizer=True)
    budget = {
        "metadata": {"name": "b", "namespace": "default"},
        "spec": {"minAvailable": 5, "selector": {"matchLabels": {"app": "a"}}},
    }
    engine.create(PDBS, "default", budget, WriteOptions())
    engine.evict("default", "p", EVICTION, WriteOptions())
    pod = engine.store.get(PODS.key, "default", "p")
    assert pod is not None and disruption(pod) is not None


def test_dry_run_and_a_refused_eviction_write_nothing(engine: Engine) -> None:
    before = make_pod(engine)
    engine.evict("default", "p", EVICTION, WriteOptions(dry_run=True))
    dry = {**EVICTION, "deleteOptions": {"dryRun": ["All"]}}
    engine.evict("default", "p", dry, WriteOptions())
    assert engine.store.get(PODS.key, "default", "p") == before
    budget = {
        "metadata": {"name": "b", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "a"}}},
    }
    engine.create(PDBS, "default", budget, WriteOptions())
    with pytest.raises(APIError) as refused:
        engine.evict("default", "p", EVICTION, WriteOptions())
    assert refused.value.code == 429
    pod = engine.store.get(PODS.key, "default", "p")
    assert pod is not None and disruption(pod) is None


def test_preconditions_are_checked_first_and_follow_the_write(engine: Engine) -> None:
    pod = make_pod(engine, finalizer=True)
    stale = {**EVICTION, "deleteOptions": {"preconditions": {"resourceVersion": "1"}}}
    with pytest.raises(APIError) as conflict:
        engine.evict("default", "p", stale, WriteOptions())
    assert conflict.value.code == 409
    assert disruption(engine.store.get(PODS.key, "default", "p") or {}) is None
    rv = pod["metadata"]["resourceVersion"]
    fresh = {**EVICTION, "deleteOptions": {"preconditions": {"resourceVersion": rv}}}
    engine.evict("default", "p", fresh, WriteOptions())  # not refused by its own write
    after = engine.store.get(PODS.key, "default", "p")
    assert after is not None and after["metadata"]["deletionTimestamp"]
    assert disruption(after) is not None


def test_update_pod_condition_rule() -> None:
    """New: appended with the time; same status: time kept, reason/message replaced in
    place; changed status: new time; identical: no change."""
    status = {"conditions": [{"type": "Ready", "status": "True"}]}
    conds, changed = with_pod_condition(status, eviction_condition(), "T1")
    assert changed and conds[-1]["lastTransitionTime"] == "T1" and conds[0]["type"] == "Ready"
    assert with_pod_condition({"conditions": conds}, eviction_condition(), "T2") == (conds, False)
    other = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByDeviceTaintManager",
             "message": "Device Taint manager: deleting due to NoExecute taint"}  # fmt: skip
    again, changed = with_pod_condition({"conditions": conds}, other, "T3")
    assert changed and len(again) == 2
    assert again[1]["reason"] == "DeletionByDeviceTaintManager"
    assert again[1]["lastTransitionTime"] == "T1"
    flipped, changed = with_pod_condition({"conditions": again}, {**other, "status": "False"}, "T4")
    assert changed and flipped[1]["lastTransitionTime"] == "T4"
    assert status == {"conditions": [{"type": "Ready", "status": "True"}]}  # not modified
