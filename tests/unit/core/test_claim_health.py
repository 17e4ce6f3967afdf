"""Device health in ResourceClaim ``status.devices``: condition, entry merge, reading.

And the cluster read model taking those conditions as one more health source: below the
node agents' records, merged worst-first with pod status entries.
"""

from __future__ import annotations

from typing import Any

from drahealth.core import (
    CONDITION_MESSAGE_MAX_BYTES,
    CONDITION_TYPE,
    ClusterModel,
    DeviceKey,
    Health,
    claim_node,
    claim_observations,
    health_condition,
    merge_device_status,
)

T0, T1 = "2026-11-24T10:00:00Z", "2026-11-24T10:05:00Z"
DRV = "gpu.example.com"
KEY = (DRV, "node-1", "gpu-0", None)


def test_condition_fields_and_transition_time() -> None:
    c = health_condition(Health.UNHEALTHY, "XID 79", generation=3, now=T0)
    assert c == {
        "type": "DeviceHealthy",
        "status": "False",
        "observedGeneration": 3,
        "lastTransitionTime": T0,
        "reason": "Unhealthy",
        "message": "XID 79",
    }
    # a new message with the same status is no transition
    again = health_condition(Health.UNHEALTHY, "XID 48", generation=3, now=T1, previous=c)
    assert again["lastTransitionTime"] == T0 and again["message"] == "XID 48"
    back = health_condition(Health.HEALTHY, "", generation=3, now=T1, previous=c)
    assert (back["status"], back["reason"], back["lastTransitionTime"]) == ("True", "Healthy", T1)
    unknown = health_condition(Health.UNKNOWN, "", generation=0, now=T0)
    assert (unknown["status"], unknown["reason"]) == ("Unknown", "Unknown")


def test_message_is_cut_to_the_condition_limit_without_splitting_a_character() -> None:
    c = health_condition(Health.UNHEALTHY, "é" * 40_000, generation=1, now=T0)
    data = c["message"].encode()
    assert len(data) <= CONDITION_MESSAGE_MAX_BYTES and c["message"].endswith("...")
    data.decode("utf-8")  # valid UTF-8


def test_merge_adds_an_entry_and_keeps_others_untouched() -> None:
    other = {"driver": "nic.example.com", "pool": "p", "device": "eth0", "data": {"ip": "x"}}
    out, what = merge_device_status([other], KEY, Health.HEALTHY, "", generation=1, now=T0)
    assert what == "added"
    assert out[0] == other
    assert out[1]["driver"] == DRV and "shareID" not in out[1]
    assert [c["type"] for c in out[1]["conditions"]] == [CONDITION_TYPE]


def test_merge_keeps_data_network_data_and_other_conditions() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "Ok", "lastTransitionTime": T0}
    entry = {
        "driver": DRV, "pool": "node-1", "device": "gpu-0",
        "data": {"uuid": "GPU-1"}, "networkData": {"interfaceName": "eth1"},
        "conditions": [ready],
    }  # fmt: skip
    out, what = merge_device_status([entry], KEY, Health.UNHEALTHY, "ECC", generation=2, now=T0)
    assert what == "updated"
    assert out[0]["data"] == {"uuid": "GPU-1"}
    assert out[0]["networkData"] == {"interfaceName": "eth1"}
    assert out[0]["conditions"][0] == ready
    assert out[0]["conditions"][1]["status"] == "False"
    assert entry["conditions"] == [ready]  # input not modified
    same, what = merge_device_status(out, KEY, Health.UNHEALTHY, "ECC", generation=2, now=T1)
    assert what == "unchanged" and same == out


def test_merge_is_keyed_by_share_id() -> None:
    shared = {"driver": DRV, "pool": "node-1", "device": "gpu-0", "shareID": "a"}
    out, what = merge_device_status([shared], KEY, Health.HEALTHY, "", generation=1, now=T0)
    assert what == "added" and len(out) == 2 and "conditions" not in out[0]
    key_a = (DRV, "node-1", "gpu-0", "a")
    out, what = merge_device_status([shared], key_a, Health.HEALTHY, "", generation=1, now=T0)
    assert what == "updated" and len(out) == 1 and out[0]["shareID"] == "a"


def test_merge_leaves_a_full_entry_alone() -> None:
    conds = [
        {"type": f"T{i}", "status": "True", "reason": "R", "lastTransitionTime": T0}
        for i in range(8)
    ]
    entry = {"driver": DRV, "pool": "node-1", "device": "gpu-0", "conditions": conds}
    out, what = merge_device_status([entry], KEY, Health.UNHEALTHY, "x", generation=1, now=T0)
    assert what == "full" and out[0]["conditions"] == conds


def claim(
    name: str,
    devices: list[dict[str, Any]],
    results: list[tuple[str, str]] = (("node-1", "gpu-0"),),  # type: ignore[assignment]
    node: str = "node-1",
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"u-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRV, "pool": p, "device": d}
                        for p, d in results
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "devices": devices,
        },
    }


def entry(device: str, status: str, message: str = "", pool: str = "node-1") -> dict[str, Any]:
    return {
        "driver": DRV,
        "pool": pool,
        "device": device,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Ok", "lastTransitionTime": T0},
            {
                "type": CONDITION_TYPE,
                "status": status,
                "reason": "x",
                "message": message,
                "lastTransitionTime": T1,
            },
        ],
    }


GPU0 = DeviceKey(DRV, "node-1", "gpu-0")


def test_read_as_observation_with_source_node_and_since() -> None:
    obs = claim_observations(claim("c1", [entry("gpu-0", "False", "XID 79")]))
    o = obs[GPU0]
    assert (o.health, o.message, o.node, o.source) == (
        Health.UNHEALTHY,
        "XID 79",
        "node-1",
        "claim default/c1",
    )
    assert o.since is not None and o.since > 1.7e9


def test_read_skips_unallocated_entries_and_other_condition_types() -> None:
    stale = entry("gpu-9", "False")
    only_ready = {"driver": DRV, "pool": "node-1", "device": "gpu-0", "conditions": [
        {"type": "Ready", "status": "False", "reason": "No", "lastTransitionTime": T0}
    ]}  # fmt: skip
    assert claim_observations(claim("c1", [stale, only_ready])) == {}
    odd = entry("gpu-0", "Maybe")
    assert claim_observations(claim("c1", [odd]))[GPU0].health is Health.UNKNOWN
    assert claim_node({"status": {}}) == ""


def _pod(name: str, claim_name: str, health: str | None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running"}
    if health is not None:
        status["containerStatuses"] = [
            {
                "name": "main",
                "allocatedResourcesStatus": [
                    {
                        "name": "claim:gpu/gpu",
                        "resources": [{"resourceID": f"{DRV}/node-1/gpu-0", "health": health}],
                    }
                ],
            }
        ]
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"p-{name}"},
        "spec": {
            "nodeName": "node-1",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        },
        "status": status,
    }


def _record(health: str) -> dict[str, Any]:
    import json

    rows = [{"driver": DRV, "pool": "node-1", "device": "gpu-0", "health": health,
             "message": "agent", "since": 1.0}]  # fmt: skip
    return {
        "metadata": {
            "name": "drahealth-devices-node-1",
            "namespace": "default",
            "labels": {
                "app.kubernetes.io/component": "device-health",
                "app.kubernetes.io/managed-by": "drahealth-agent",
                "drahealth.io/node": "node-1",
            },
        },
        "data": {"devices": json.dumps(rows)},
    }


def test_model_reads_claim_conditions_and_marks_the_device_changed() -> None:
    m = ClusterModel()
    m.apply("ResourceClaim", "ADDED", claim("c1", []))
    m.take_changed()
    assert m.observation(GPU0) is None
    m.apply("ResourceClaim", "MODIFIED", claim("c1", [entry("gpu-0", "False", "XID 79")]))
    assert m.take_changed() == {GPU0}
    obs = m.observation(GPU0)
    assert obs is not None and obs.health is Health.UNHEALTHY and obs.source == "claim default/c1"
    assert GPU0 in m.observations()
    # the same conditions again: nothing changed
    m.apply("ResourceClaim", "MODIFIED", claim("c1", [entry("gpu-0", "False", "XID 79")]))
    assert m.take_changed() == set()
    m.apply("ResourceClaim", "DELETED", claim("c1", []))
    assert m.take_changed() == {GPU0} and m.observation(GPU0) is None


def test_precedence_agent_record_then_worst_of_pods_and_claims() -> None:
    m = ClusterModel()
    m.apply("ResourceClaim", "ADDED", claim("c1", [entry("gpu-0", "False", "from claim")]))
    m.apply("Pod", "ADDED", _pod("p1", "c1", "Healthy"))
    obs = m.observation(GPU0)
    # a stale Healthy in the pod status does not hide the claim's Unhealthy
    assert obs is not None and obs.health is Health.UNHEALTHY and obs.source.startswith("claim")
    m.apply("Pod", "MODIFIED", _pod("p1", "c1", "Unhealthy"))
    obs = m.observation(GPU0)
    assert obs is not None and obs.source == "pod"  # a tie goes to the pod
    m.apply("ConfigMap", "ADDED", _record("Healthy"))
    obs = m.observation(GPU0)
    assert obs is not None and obs.health is Health.HEALTHY and obs.source == "agent"


def test_a_claim_condition_and_a_claim_without_one_order_independent() -> None:
    objs = [
        ("Pod", _pod("p1", "c1", None)),
        ("ResourceClaim", claim("c1", [entry("gpu-0", "Unknown")])),
        ("ResourceClaim", claim("c2", [entry("gpu-0", "True")])),
    ]
    snaps = []
    for order in (objs, list(reversed(objs))):
        m = ClusterModel()
        for kind, obj in order:
            m.apply(kind, "ADDED", obj)
        snaps.append(m.snapshot())
    assert snaps[0] == snaps[1]
    assert snaps[0]["observations"][GPU0].health is Health.UNKNOWN
