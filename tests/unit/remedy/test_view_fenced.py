"""What drahealth's fences keep new pods off, and which Pending pods they block.

Nodes and claims are written as the controller writes them (``plan_node``,
``claim_body`` and ``allocation``), then made hostile: garbage annotations, a taint with
drahealth's key that drahealth did not write, a claim with the label and a garbage
annotation, fleets too large to list.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from drahealth.core import ClusterModel, DeviceKey
from drahealth.remedy import (
    MAX_BLOCKED_PODS,
    blocked_pods,
    class_drivers,
    device_taints,
    fence_text,
    fenced_devices,
    read_fences,
    unschedulable,
)
from drahealth.remedy._nodes import NodeDevice, plan_node
from drahealth.remedy._quarantine import allocation, claim_body, claim_name
from drahealth.remedy._view import MAX_FOR
from drahealth.web._state import fleet_state, snapshot

D, OTHER, NS = "gpu.example.com", "nic.example.com", "drahealth"
KEY = "drahealth.io/unhealthy"


def gpu(i: int, node: str = "node-1", driver: str = D) -> DeviceKey:
    return DeviceKey(driver, node, f"gpu-{i}")


def bad(key: DeviceKey, mode: str = "node-taint") -> NodeDevice:
    return NodeDevice(key, mode, KEY, "", "NoExecute", "r", "XID 79", 1.0e9)


def node(name: str, *devices: NodeDevice, **spec: Any) -> dict[str, Any]:
    before = {"metadata": {"name": name}, "spec": spec}
    after, _ = plan_node(before, devices)
    return after


def quarantine(key: DeviceKey, *, held: bool = True, operator: bool = False) -> dict[str, Any]:
    claim = claim_body(bad(key, "quarantine"), NS, operator=operator)
    if held:
        claim["status"] = allocation(key, "uid-1", operator=operator)
    return claim


def waiting(name: str, message: str, ns: str = "ml", **extra: Any) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": message}  # fmt: skip
    return {
        "metadata": {"name": name, "namespace": ns},
        "spec": extra.get("spec", {}),
        "status": {"phase": "Pending", "conditions": [condition]},
    }


def taint_message(key: str = KEY, value: str = "gpu-0") -> str:
    return (
        f"0/2 nodes are available: 1 node(s) had untolerated taint {{{key}: {value}}}, "
        "1 node(s) didn't match Pod's node affinity/selector. preemption: not helpful"
    )


# -- fences ---------------------------------------------------------------------------


def test_a_node_taint_fences_every_device_of_the_node() -> None:
    fences = read_fences([node("node-1", bad(gpu(0)))])
    on_node = {"node-1": [gpu(i) for i in range(4)], "node-2": [gpu(0, "node-2")]}
    fenced = fenced_devices(fences, on_node)
    assert set(fenced) == {gpu(i) for i in range(4)}  # node-2's device is free
    doc = fenced[gpu(3)].as_json()
    assert doc == {
        "kind": "Node", "name": "node-1", "mode": "node-taint",
        "for": [str(gpu(0))], "forCount": 1,
        "taints": [{"key": KEY, "value": "gpu-0", "effect": "NoSchedule"}],
    }  # fmt: skip
    assert fence_text(doc) == f"node/node-1 (node-taint for {gpu(0)})"


def test_a_cordon_fences_the_node_and_an_operators_cordon_does_not_count() -> None:
    cordoned = node("node-1", bad(gpu(0), "cordon"))
    (fence,) = read_fences([cordoned]).nodes["node-1"]
    assert (fence.mode, fence.devices) == ("cordon", (gpu(0),))
    assert fence.text() == f"node/node-1 (cordon for {gpu(0)})"
    # the operator cordoned it first: drahealth leaves it alone and does not own it
    theirs = node("node-2", bad(gpu(0, "node-2"), "cordon"), unschedulable=True)
    assert "drahealth.io/cordoned" not in theirs["metadata"]["annotations"]
    assert not read_fences([theirs])
    plain = {"metadata": {"name": "node-3"}, "spec": {"unschedulable": True}}
    assert not read_fences([plain])


def test_a_taint_with_our_key_that_drahealth_did_not_write_fences_nothing() -> None:
    foreign = {"key": KEY, "value": "manual", "effect": "NoSchedule"}
    # someone else's taint with our key: drahealth lists the device but writes no taint
    shared = node("node-1", bad(gpu(0)), taints=[foreign])
    assert "drahealth.io/node-taints" not in shared["metadata"]["annotations"]
    assert not read_fences([shared])
    # only someone else's taint, no annotation at all
    assert not read_fences([{"metadata": {"name": "n"}, "spec": {"taints": [foreign]}}])
    # drahealth's annotation says it wrote the taint, but the node no longer carries it
    gone = node("node-2", bad(gpu(0, "node-2")))
    gone["spec"]["taints"] = []
    assert not read_fences([gone])


@pytest.mark.parametrize(
    "annotations",
    [
        {"drahealth.io/node-taints": "{x", "drahealth.io/unhealthy-devices": "[{"},
        {
            "drahealth.io/node-taints": "[" * 100_000,
            "drahealth.io/unhealthy-devices": "[" * 100_000,
        },
        {"drahealth.io/node-taints": json.dumps([[KEY]]), "drahealth.io/unhealthy-devices": "7"},
        {"drahealth.io/node-taints": json.dumps({"a": 1}), "drahealth.io/cordoned": "yes"},
        {"drahealth.io/node-taints": 5, "drahealth.io/unhealthy-devices": None},  # not strings
    ],
)
def test_malformed_annotations_fence_nothing_and_raise_nothing(annotations: Any) -> None:
    taints = [{"key": KEY, "value": "gpu-0", "effect": "NoSchedule"}, "junk", None]
    obj = {"metadata": {"name": "node-1", "annotations": annotations},
           "spec": {"taints": taints}}  # fmt: skip
    assert not read_fences([obj])
    assert device_taints([], [], [obj]) == {}
    for weird in ({"metadata": None, "spec": None}, {"metadata": {"name": "n"}, "spec": "x"}, {}):
        assert not read_fences([weird])


def test_our_listed_devices_may_be_garbage_while_the_taint_is_ours() -> None:
    obj = node("node-1", bad(gpu(0)))
    obj["metadata"]["annotations"]["drahealth.io/unhealthy-devices"] = "not json"
    (fence,) = read_fences([obj]).nodes["node-1"]
    assert fence.devices == () and fence.text() == "node/node-1 (node-taint)"


def test_a_held_quarantine_claim_fences_only_its_device() -> None:
    fences = read_fences([], [quarantine(gpu(0))], NS)
    fenced = fenced_devices(fences, {"node-1": [gpu(i) for i in range(4)]})
    assert set(fenced) == {gpu(0)}
    doc = fenced[gpu(0)].as_json()
    assert doc == {
        "kind": "ResourceClaim", "name": claim_name(gpu(0)), "mode": "quarantine",
        "namespace": NS, "for": [str(gpu(0))], "forCount": 1, "by": "controller",
    }  # fmt: skip
    assert fence_text(doc) == f"claim {NS}/{claim_name(gpu(0))} (quarantine)"
    op = read_fences([], [quarantine(gpu(1), operator=True)], NS).claims[gpu(1)]
    assert op.by == "operator" and op.text().endswith("(quarantine by an operator)")


def test_claims_that_are_not_a_held_quarantine_fence_nothing() -> None:
    unheld = quarantine(gpu(0), held=False)
    garbage = quarantine(gpu(1))
    garbage["metadata"]["annotations"]["drahealth.io/quarantine"] = "{garbage"
    deep = quarantine(gpu(2))
    deep["metadata"]["annotations"]["drahealth.io/quarantine"] = "[" * 100_000
    renamed = quarantine(gpu(3))
    renamed["metadata"]["name"] = "my-claim"  # not the name drahealth gives the device
    unlabelled = quarantine(gpu(4))
    unlabelled["metadata"]["labels"] = {}
    elsewhere = quarantine(gpu(5))
    elsewhere["metadata"]["namespace"] = "tenant"
    other_device = quarantine(gpu(6))
    other_device["status"] = allocation(gpu(7), "u")  # holds another device than it names
    claims = [unheld, garbage, deep, renamed, unlabelled, elsewhere, other_device,
              {"metadata": None}, {"metadata": {"namespace": NS}, "status": "x"}]  # fmt: skip
    assert not read_fences([], claims, NS)
    assert not read_fences([], [quarantine(gpu(0))], None)  # no controller namespace known


def test_a_fence_names_at_most_a_few_bad_devices() -> None:
    many = [bad(gpu(i)) for i in range(40)]
    (fence,) = read_fences([node("node-1", *many)]).nodes["node-1"]
    doc = fence.as_json()
    assert len(doc["for"]) == MAX_FOR and doc["forCount"] == 40
    assert doc["taints"][0]["value"] == "40-devices"
    assert fence_text(doc) == f"node/node-1 (node-taint for {gpu(0)}, {gpu(1)} +38 more)"


# -- blocked pods ---------------------------------------------------------------------


def test_pending_pods_blocked_by_a_node_taint_or_a_cordon() -> None:
    tainted = node("node-1", bad(gpu(0)))
    cordoned = node("node-2", bad(gpu(0, "node-2"), "cordon"))
    fences = read_fences([tainted, cordoned])
    pods = [
        waiting("a", taint_message()),
        waiting("b", "0/2 nodes are available: 2 node(s) were unschedulable. preemption: x"),
        waiting("c", taint_message("ops.example.com/maintenance", "x")),  # not our taint
        waiting("d", "0/2 nodes are available: 2 Insufficient memory."),
    ]
    found, total = blocked_pods(pods, fences)
    assert total == 2
    assert [(b.pod, b.message) for b in found] == [
        ("a", "Pending: blocked by node/node-1 taint drahealth.io/unhealthy"),
        ("b", "Pending: blocked by node/node-2 cordon"),
    ]
    assert found[0].by[0]["taint"] == {"key": KEY, "value": "gpu-0", "effect": "NoSchedule"}
    assert found[0].as_json()["scheduler"].startswith("0/2 nodes are available")
    # no fence: nothing is blocked by drahealth, whatever the message says
    assert blocked_pods(pods, read_fences([])) == ([], 0)


def test_the_taint_value_tells_which_node_when_several_share_the_key() -> None:
    fences = read_fences([node("node-1", bad(gpu(0))), node("node-2", bad(gpu(5, "node-2")))])
    (b,), _ = blocked_pods([waiting("a", taint_message(value="gpu-5"))], fences)
    assert b.message == "Pending: blocked by node/node-2 taint drahealth.io/unhealthy"


def test_only_pending_unschedulable_pods_count() -> None:
    msg = taint_message()
    bound = waiting("a", msg, spec={"nodeName": "node-1"})
    running = waiting("b", msg)
    running["status"]["phase"] = "Running"
    deleting = waiting("c", msg)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    gated = waiting("d", msg)
    gated["status"]["conditions"][0]["reason"] = "SchedulingGated"
    hostile = [{"status": {"conditions": "x"}}, {"status": None}, {"status": {"conditions": [1]}}]
    for pod in (bound, running, deleting, gated, *hostile):
        assert unschedulable(pod) is None
    assert unschedulable(waiting("e", "x" * 100_000)) == "x" * 4096


def test_no_free_device_counts_the_quarantined_devices_of_the_pods_driver() -> None:
    fences = read_fences([], [quarantine(gpu(0)), quarantine(gpu(1)),
                              quarantine(gpu(0, driver=OTHER))], NS)  # fmt: skip
    classes = [
        {"metadata": {"name": "gpu"},
         "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{D}"'}}]}},
        {"metadata": {"name": "nic"},
         "spec": {"selectors": [{"cel": {"expression": f"'{OTHER}' == device.driver"}}]}},
        {"metadata": {"name": "any"}, "spec": {}},
        {"metadata": None, "spec": {"selectors": "junk"}},
    ]  # fmt: skip
    drivers = class_drivers(classes)
    assert drivers == {"gpu": {D}, "nic": {OTHER}}

    def claim(name: str, cls: str) -> dict[str, Any]:
        request = {"name": "r", "exactly": {"deviceClassName": cls}}
        return {"metadata": {"name": name, "namespace": "ml"},
                "spec": {"devices": {"requests": [request]}}}  # fmt: skip

    claims = {("ml", n): claim(n, c) for n, c in (("g", "gpu"), ("n", "nic"), ("a", "any"))}
    msg = "0/1 nodes are available: cannot allocate all claims. preemption: x"

    def pod(name: str, claim_name: str) -> dict[str, Any]:
        ref = {"name": "r", "resourceClaimName": claim_name}
        return waiting(name, msg, spec={"resourceClaims": [ref]})

    pods = [pod("on-gpu", "g"), pod("on-nic", "n"), pod("any-class", "a"), pod("no-claim", "x")]
    calls: list[int] = []

    def lazily() -> dict[str, set[str]]:
        calls.append(1)
        return drivers

    found, total = blocked_pods(pods, fences, claims=claims, drivers_of_class=lazily)
    assert calls == [1]  # the classes are read once, when first needed
    assert {b.pod: b.message for b in found} == {
        "on-gpu": "Pending: no free device (2 quarantined)",
        "on-nic": "Pending: no free device (1 quarantined)",
        "any-class": "Pending: no free device (3 quarantined)",  # cannot tell: every one
        "no-claim": "Pending: no free device (3 quarantined)",
    }
    assert total == 4
    assert next(b for b in found if b.pod == "on-nic").by[0]["claims"] == [
        f"{NS}/{claim_name(gpu(0, driver=OTHER))}"
    ]
    # without quarantine claims the same message blocks nothing of drahealth's
    assert blocked_pods(pods, read_fences([node("node-1", bad(gpu(0)))])) == ([], 0)


def test_thousands_of_blocked_pods_are_listed_up_to_the_limit_and_counted() -> None:
    fences = read_fences([node("node-1", bad(gpu(0)))])
    pods = [waiting(f"p-{i:05d}", taint_message()) for i in range(3000)]
    found, total = blocked_pods(reversed(pods), fences)
    assert total == 3000 and len(found) == MAX_BLOCKED_PODS
    assert [b.pod for b in found] == [f"p-{i:05d}" for i in range(MAX_BLOCKED_PODS)]


# -- the dashboard's state ------------------------------------------------------------


def _slice(name: str, node_name: str, devices: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"driver": D, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": d} for d in devices]}}  # fmt: skip


def test_the_dashboard_state_shows_fences_and_the_pods_they_block() -> None:
    slices = [_slice("s1", "node-1", [f"gpu-{i}" for i in range(4)]),
              _slice("s2", "node-2", ["gpu-0", "gpu-1"])]  # fmt: skip
    nodes = [node("node-1", bad(gpu(0)))]
    pods = [waiting("a", taint_message()), waiting("b", "cannot allocate all claims")]
    state = snapshot([], pods, [quarantine(gpu(1, "node-2"))], slices, [], node_objects=nodes,
                     quarantine_namespace=NS)  # fmt: skip
    fenced = {
        (n["name"], d["device"]): fence_text(d["fencedBy"])
        for n in state["nodes"] for d in n["devices"] if "fencedBy" in d
    }  # fmt: skip
    assert fenced == {
        **{("node-1", f"gpu-{i}"): f"node/node-1 (node-taint for {gpu(0)})" for i in range(4)},
        ("node-2", "gpu-1"): f"claim {NS}/{claim_name(gpu(1, 'node-2'))} (quarantine)",
    }
    assert state["pending"]["total"] == 2
    assert [(p["pod"], p["message"]) for p in state["pending"]["pods"]] == [
        ("a", "Pending: blocked by node/node-1 taint drahealth.io/unhealthy"),
        ("b", "Pending: no free device (1 quarantined)"),
    ]
    # without fences: no key added to any device, nothing pending
    plain = snapshot([], pods, [], slices, [])
    assert plain["pending"] == {"pods": [], "total": 0}
    assert not any("fencedBy" in d for n in plain["nodes"] for d in n["devices"])


def test_a_fenced_node_of_thousands_of_devices_stays_bounded() -> None:
    names = [f"gpu-{i}" for i in range(4000)]
    slices = [_slice(f"s{j}", "node-1", names[j * 128 : (j + 1) * 128]) for j in range(32)]
    nodes = [node("node-1", *(bad(gpu(i)) for i in range(300)))]
    model = ClusterModel()
    for s in slices:
        model.apply("ResourceSlice", "ADDED", s)
    pods = [waiting(f"p{i}", taint_message(value="256-devices")) for i in range(500)]
    devices = [("node-1", DeviceKey(D, "node-1", n)) for n in names]
    state = fleet_state(model, devices, [], {}, node_objects=nodes, pod_objects=pods)
    (n,) = state["nodes"]
    assert len(n["devices"]) == 4000 and all("fencedBy" in d for d in n["devices"])
    doc = n["devices"][0]["fencedBy"]
    assert len(doc["for"]) == MAX_FOR and doc["forCount"] == 256  # the annotation's bound
    assert len(json.dumps(doc)) < 2000
    assert len(state["pending"]["pods"]) == MAX_BLOCKED_PODS
    assert state["pending"]["total"] == 500
