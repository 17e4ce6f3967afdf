"""Where the scheduler stand-in puts pods, and what it tells when it cannot.

Written from upstream kubernetes/kubernetes:

* ``pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go`` (``spec.nodeSelector``
  and required node affinity; reason ``node(s) didn't match Pod's node affinity/selector``)
  and ``staging/src/k8s.io/component-helpers/scheduling/corev1/nodeaffinity`` (terms are
  ORed, requirements ANDed; In, NotIn, Exists, DoesNotExist, Gt, Lt; ``matchFields`` on
  ``metadata.name``);
* ``plugins/nodeunschedulable`` (``node(s) were unschedulable``), ``plugins/tainttoleration``
  (``node(s) had untolerated taint {key: value}``), ``plugins/dynamicresources``
  (``cannot allocate all claims``; a CEL runtime error aborts the attempt);
* ``pkg/scheduler/framework/types.go`` ``FitError.Error`` (``0/N nodes are available:``, the
  sorted ``<count> <reason>`` histogram) and ``framework/preemption`` (``preemption: 0/N
  nodes are available: N Preemption is not helpful for scheduling.``);
* ``pkg/scheduler/schedule_one.go``: the ``Scheduled`` Event (``Successfully assigned
  <ns>/<pod> to <node>``), ``FailedScheduling`` Warning Events and the ``PodScheduled``
  condition (reason ``Unschedulable``, or ``SchedulerError`` for an error);
* ``pkg/scheduler/eventhandlers.go``: a pod with ``spec.nodeName`` is not the scheduler's.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance._dra_world import NS, World, eventually, world

__all__ = ["world"]

pytestmark = pytest.mark.timeout(60)

NOT_HELPFUL = "preemption: 0/{n} nodes are available: {n} Preemption is not helpful for scheduling."


def _affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": list(terms)}}
    }  # fmt: skip


def _aff(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": _affinity(*terms)}


async def _labelled_nodes(w: World, plain: bool = False) -> None:
    """node-1 and node-2 with labels; with ``plain`` also node-0, first by name, with
    only its hostname label (a scheduler that ignored affinity would pick it)."""
    if plain:
        await w.node("node-0")
    await w.node("node-1", {"kubernetes.io/hostname": "node-1", "gpu": "a100", "rank": "3"})
    await w.node("node-2", {"kubernetes.io/hostname": "node-2", "gpu": "h100", "rank": "7"})


@pytest.mark.parametrize(
    ("spec", "node"),
    [
        ({"nodeSelector": {"gpu": "h100"}}, "node-2"),
        ({"nodeSelector": {"kubernetes.io/hostname": "node-1"}}, "node-1"),
        (_aff({"matchExpressions": [
            {"key": "gpu", "operator": "In", "values": ["h100", "b200"]}]}), "node-2"),
        # a node without the label is "not in" too: Exists keeps node-0 out
        (_aff({"matchExpressions": [{"key": "gpu", "operator": "Exists"},
            {"key": "gpu", "operator": "NotIn", "values": ["a100"]}]}), "node-2"),
        (_aff({"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["5"]}]}),
         "node-2"),
        (_aff({"matchExpressions": [{"key": "rank", "operator": "Lt", "values": ["5"]}]}),
         "node-1"),
        (_aff({"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}), "node-2"),
        # terms are ORed: the first matches nothing, the second node-2
        (_aff({"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
                   {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]},
                                         {"key": "zone", "operator": "DoesNotExist"}]}),
         "node-2"),
    ],
)  # fmt: skip
async def test_node_selector_and_required_affinity_choose_the_node(
    world: World, spec: dict[str, Any], node: str
) -> None:
    await _labelled_nodes(world, plain=True)
    await world.pod("p", **spec)
    assert await world.bound("p") == node


async def test_scheduled_event_and_condition(world: World) -> None:
    await _labelled_nodes(world)
    await world.pod("p", nodeSelector={"gpu": "a100"})
    assert await world.bound("p") == "node-1"
    await world.scheduled_condition("p", "True")

    async def scheduled() -> list[dict[str, Any]]:
        return await world.events("p", "Scheduled")

    (event,) = await eventually(scheduled, 10, "the Scheduled Event")
    assert event["type"] == "Normal"
    assert event["message"] == "Successfully assigned default/p to node-1"
    assert event["involvedObject"]["uid"]
    assert event["source"]["component"] == "default-scheduler"


async def test_no_matching_node_is_failed_scheduling_with_the_fit_error(world: World) -> None:
    await _labelled_nodes(world)
    await world.pod("p", nodeSelector={"gpu": "b200"})
    condition = await world.scheduled_condition("p", "False")
    want = (
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. "
        + NOT_HELPFUL.format(n=2)
    )
    assert condition["reason"] == "Unschedulable"
    assert condition["message"] == want

    async def failed() -> list[dict[str, Any]]:
        return await world.events("p", "FailedScheduling")

    (event,) = await eventually(failed, 10, "the FailedScheduling Event")
    assert (event["type"], event["message"]) == ("Warning", want)
    got = await world.http.ok("GET", f"{NS}/pods/p")
    assert not got["spec"].get("nodeName")


async def test_each_node_is_rejected_by_the_first_filter_and_counted(world: World) -> None:
    """Cordon, a NoSchedule taint and a node without free devices, in one histogram."""
    w = world
    await w.node("node-1", unschedulable=True)
    await w.node("node-2", taints=[{"key": "example.com/gpu-bad", "value": "xid",
                                    "effect": "NoSchedule"}])  # fmt: skip
    await w.node("node-3")
    for node in ("node-1", "node-2", "node-3"):
        await w.gpus(node, 1)
    await w.device_class()
    await w.claim("taken")
    await w.pod("first", {"gpu": {"resourceClaimName": "taken"}},
                tolerations=[{"operator": "Exists"}])  # fmt: skip
    first = await w.bound("first")
    assert first == "node-1"  # tolerates everything: the first node by name
    await w.claim("wanted")
    await w.pod("p", {"gpu": {"resourceClaimName": "wanted"}},
                nodeSelector={"kubernetes.io/hostname": "node-1"})  # fmt: skip
    condition = await w.scheduled_condition("p", "False")
    assert condition["message"] == (
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {example.com/gpu-bad: xid}, "
        "1 node(s) were unschedulable. " + NOT_HELPFUL.format(n=3)
    )
    # node-1 tolerated, but its only device is taken; node-3 excluded by name
    await w.claim("wanted-2")
    not_3 = _affinity({"matchFields": [
        {"key": "metadata.name", "operator": "NotIn", "values": ["node-3"]}]})  # fmt: skip
    cordon = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]
    await w.pod("q", {"gpu": {"resourceClaimName": "wanted-2"}}, affinity=not_3, tolerations=cordon)
    condition = await w.scheduled_condition("q", "False")
    assert condition["message"] == (
        "0/3 nodes are available: 1 cannot allocate all claims, "
        "1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {example.com/gpu-bad: xid}. " + NOT_HELPFUL.format(n=3)
    )


async def test_drain_keeps_replacements_off_the_cordoned_node(world: World) -> None:
    """``kubectl drain`` cordons first: new pods go elsewhere."""
    w = world
    await w.node("node-1")
    await w.node("node-2")
    await w.pod("before")
    assert await w.bound("before") == "node-1"
    await w.http.ok("PATCH", "/api/v1/nodes/node-1", {"spec": {"unschedulable": True}})
    await w.http.ok("DELETE", f"{NS}/pods/before")
    await w.pod("after")
    assert await w.bound("after") == "node-2"


async def test_cel_runtime_error_aborts_with_scheduler_error(world: World) -> None:
    """A selector that fails at runtime (an attribute the device lacks) is an error that
    reaches the pod, not "no device"."""
    w = world
    await w.node("node-1")
    await w.gpus("node-1", 1)
    await w.device_class("broken", 'device.attributes["gpu.example.com"].model == "a100"')
    await w.claim("c", "broken")
    await w.pod("p", {"gpu": {"resourceClaimName": "c"}})
    condition = await w.scheduled_condition("p", "False")
    assert condition["reason"] == "SchedulerError", condition
    assert condition["message"].startswith('running "DynamicResources" filter plugin: ')
    assert "model" in condition["message"]
    assert "cannot allocate all claims" not in condition["message"]


async def test_pod_with_node_name_is_left_where_it_is(world: World) -> None:
    w = world
    await w.node("node-1", unschedulable=True)
    await w.node("node-2")
    await w.pod("pinned", nodeName="node-1")
    await w.pod("other")
    assert await w.bound("other") == "node-2"
    got = await w.http.ok("GET", f"{NS}/pods/pinned")
    assert got["spec"]["nodeName"] == "node-1"
    assert not await w.events("pinned"), "the scheduler acted on a pod that was bound"
