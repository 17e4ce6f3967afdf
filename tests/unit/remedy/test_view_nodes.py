"""The readers show the node taint or cordon the controller wrote for a device."""

from __future__ import annotations

from drahealth.core import DeviceKey
from drahealth.remedy import device_taints
from drahealth.remedy._nodes import NodeDevice, plan_node

GPU0 = DeviceKey("gpu.example.com", "node-1", "gpu-0")
GPU1 = DeviceKey("gpu.example.com", "node-1", "gpu-1")


def _node(*devices: NodeDevice) -> dict[str, object]:
    before = {"metadata": {"name": "node-1"}, "spec": {"taints": [
        {"key": "ops/maintenance", "value": "planned", "effect": "NoSchedule"}
    ]}}  # fmt: skip
    after, _changes = plan_node(before, devices)
    return after


def test_node_taint_is_listed_with_the_device() -> None:
    node = _node(
        NodeDevice(
            GPU0, "node-taint", "drahealth.io/unhealthy", "xid", "NoExecute", "r", "XID 79", 1.0e9
        )
    )
    taints = device_taints([], [], [node])
    assert taints == {
        GPU0: [
            {
                "source": "node/node-1 (node-taint)",
                "key": "drahealth.io/unhealthy",
                "value": "gpu-0",
                "effect": "NoSchedule",
                "since": "2001-09-09T01:46:40+00:00",
            }
        ]
    }


def test_two_devices_share_one_node_taint_and_a_cordon_reads_as_unschedulable() -> None:
    node = _node(
        NodeDevice(GPU0, "node-taint", "drahealth.io/unhealthy", "", "NoSchedule"),
        NodeDevice(GPU1, "node-taint", "drahealth.io/unhealthy", "", "NoSchedule"),
    )
    taints = device_taints([], [], [node])
    assert [t["value"] for t in taints[GPU0] + taints[GPU1]] == ["2-devices", "2-devices"]
    cordoned = _node(NodeDevice(GPU0, "cordon", "drahealth.io/unhealthy", "", "NoSchedule"))
    (t,) = device_taints([], [], [cordoned])[GPU0]
    assert (t["key"], t["source"]) == ("node.kubernetes.io/unschedulable", "node/node-1 (cordon)")


def test_nodes_without_the_annotation_or_with_garbage_add_nothing() -> None:
    plain = {"metadata": {"name": "n", "annotations": {"drahealth.io/unhealthy-devices": "{x"}}}
    assert device_taints([], [], [plain, {"metadata": {"name": "m"}}]) == {}
