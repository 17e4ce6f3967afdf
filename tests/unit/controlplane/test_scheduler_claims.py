"""Pure parts of the scheduler and resourceclaim stand-ins: generated names, node
selection, kube-scheduler's FitError text, when a pod is done, the reservedFor patch."""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.controlplane._patch import PatchError, json_patch
from drahealth.standins._claims import generate_name, owning_pod, pod_done, reserve_ops
from drahealth.standins._scheduler import fit_error, node_misfit, node_selector_matches


def test_generate_name_is_pod_claim_and_a_hyphen() -> None:
    assert generate_name("trainer", "gpu") == "trainer-gpu-"


def test_long_generate_name_cuts_both_parts_in_proportion() -> None:
    """Upstream keeps 57 characters (room for 5 random ones in 63), cutting pod and
    claim name in proportion instead of losing the claim name."""
    pod, claim = "p" * 60, "c" * 30
    base = generate_name(pod, claim)
    total = len(pod) + len(claim) + 2
    assert base == "p" * (60 * 57 // total) + "-" + "c" * (30 * 57 // total)
    assert len(base) <= 57 and base.endswith("c")


NODE = {"metadata": {"name": "node-1", "labels": {"gpu": "a100", "rank": "3"}}}


def _terms(*exprs: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> Any:
    term: dict[str, Any] = {"matchExpressions": list(exprs)}
    if fields is not None:
        term["matchFields"] = fields
    return {"nodeSelectorTerms": [term]}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        (_terms({"key": "rank", "operator": "Gt", "values": ["2"]}), True),
        (_terms({"key": "rank", "operator": "Gt", "values": ["3"]}), False),
        (_terms({"key": "rank", "operator": "Lt", "values": ["x"]}), False),  # not a number
        (_terms({"key": "gpu", "operator": "Gt", "values": ["1"]}), False),  # label not a number
        (_terms({"key": "gpu", "operator": "NotIn", "values": ["h100"]}), True),
        (_terms({"key": "zone", "operator": "NotIn", "values": ["a"]}), True),  # absent
        (_terms({"key": "zone", "operator": "DoesNotExist"}), True),
        (_terms({"key": "gpu", "operator": "Bogus", "values": ["a100"]}), False),
        (_terms(fields=[{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]), True),
        (_terms(fields=[{"key": "metadata.uid", "operator": "Exists"}]), False),
        ({"nodeSelectorTerms": [{}]}, False),  # an empty term matches nothing
        ({"nodeSelectorTerms": []}, False),
    ],
)
def test_node_selector_requirements(selector: Any, matches: bool) -> None:
    assert node_selector_matches(selector, NODE) is matches


def test_filters_apply_in_upstream_order() -> None:
    """Cordon before taints before affinity: a node is counted once, for the first."""
    node = {
        "metadata": {"name": "n", "labels": {}},
        "spec": {"unschedulable": True, "taints": [{"key": "k", "effect": "NoExecute"}]},
    }
    pod = {"spec": {"nodeSelector": {"gpu": "a100"}}}
    assert node_misfit(node, pod) == "node(s) were unschedulable"
    pod["spec"]["tolerations"] = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]
    assert node_misfit(node, pod) == "node(s) had untolerated taint {k: }"
    pod["spec"]["tolerations"].append({"key": "k", "operator": "Exists"})
    assert node_misfit(node, pod) == "node(s) didn't match Pod's node affinity/selector"


def test_fit_error_histogram_is_sorted_as_strings() -> None:
    reasons = {
        "a": "node(s) were unschedulable",
        "b": "cannot allocate all claims",
        "c": "cannot allocate all claims",
        "d": "node(s) had untolerated taint {k: v}",
    }
    assert fit_error(4, reasons) == (
        "0/4 nodes are available: 1 node(s) had untolerated taint {k: v}, "
        "1 node(s) were unschedulable, 2 cannot allocate all claims. "
        "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
    )
    assert fit_error(2, {}, "resourceclaim in use") == (
        "0/2 nodes are available: resourceclaim in use. "
        "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    )


def test_pod_done() -> None:
    assert pod_done({"status": {"phase": "Succeeded"}})
    assert pod_done({"status": {"phase": "Failed"}})
    assert not pod_done({"status": {"phase": "Running"}})
    deleted = {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {}}
    assert pod_done(deleted)  # deleted before it was bound: it will never run
    deleted["spec"] = {"nodeName": "node-1"}
    assert not pod_done(deleted)  # the kubelet may still be stopping it


def test_owning_pod_needs_the_controller_reference() -> None:
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}
    assert owning_pod({"metadata": {"ownerReferences": [ref]}}) is None
    assert owning_pod({"metadata": {"ownerReferences": [{**ref, "controller": True}]}}) == (
        "p",
        "u",
    )


def _claim(rv: str, reserved: list[Any] | None) -> dict[str, Any]:
    claim: dict[str, Any] = {"metadata": {"name": "c", "resourceVersion": rv}}
    if reserved is not None:
        claim["status"] = {"allocation": {}, "reservedFor": reserved}
    return claim


POD = {"metadata": {"name": "b", "uid": "ub"}}


@pytest.mark.parametrize("reserved", [None, [], [{"resource": "pods", "name": "a", "uid": "ua"}]])
def test_reserve_ops_append_and_keep_other_consumers(reserved: list[Any] | None) -> None:
    claim = _claim("7", reserved)
    out = json_patch(claim, reserve_ops(claim, POD))
    assert out["status"]["reservedFor"] == [
        *(reserved or []),
        {"resource": "pods", "name": "b", "uid": "ub"},
    ]


def test_reserve_ops_refuse_a_claim_that_changed() -> None:
    ops = reserve_ops(_claim("7", []), POD)
    with pytest.raises(PatchError):
        json_patch(_claim("8", [{"resource": "pods", "name": "a", "uid": "ua"}]), ops)
