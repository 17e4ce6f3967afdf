"""The cluster read model: per-event updates, indexes, and where the old readers disagreed."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from drahealth.core import DeviceKey, Health
from drahealth.core._cluster import ClusterModel, Consumer, build
from drahealth.core._cluster_pods import pod_claim_names, resolve_claim_name
from drahealth.core._cluster_records import (
    HealthRow,
    decode_devices,
    encode_devices,
    record_labels,
    record_name,
)
from drahealth.core._status import entry_name, parse_entry_name
from drahealth.core._taints import NOW, Taint, eviction_due

D = "gpu.example.com"
JSON = dict[str, Any]


def key(pool: str, device: str) -> DeviceKey:
    return DeviceKey(D, pool, device)


def slice_(node: str, devices: list[str], taints: dict[str, list[JSON]] | None = None) -> JSON:
    return {
        "metadata": {"name": f"{node}-slice"},
        "spec": {
            "driver": D, "nodeName": node, "pool": {"name": node},
            "devices": [
                {"name": d, "attributes": {"model": {"string": "h100"}},
                 "taints": (taints or {}).get(d, [])}
                for d in devices
            ],
        },
    }  # fmt: skip


def claim(
    name: str, results: list[tuple[str, str, str]], tolerations: list[JSON] | None = None
) -> JSON:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"tolerations": tolerations or []}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": r, "driver": D, "pool": p, "device": d} for r, p, d in results
        ]}}},
    }  # fmt: skip


def pod(
    name: str,
    claim_name: str,
    node: str,
    health: list[tuple[str, str]] | None = None,
    *,
    phase: str = "Running",
    uid: str | None = None,
    entry: str = "claim:gpu",
) -> JSON:
    container: JSON = {"name": "m"}
    if health is not None:
        container["allocatedResourcesStatus"] = [
            {"name": entry, "resources": [{"resourceID": r, "health": h} for r, h in health]}
        ]
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}"},
        "spec": {"nodeName": node,
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}]},
        "status": {"phase": phase, "containerStatuses": [container]},
    }  # fmt: skip


def rule(name: str, selector: JSON, effect: str = "NoExecute", added: str = "") -> JSON:
    taint = {"key": "drahealth.io/unhealthy", "value": "x", "effect": effect}
    if added:
        taint["timeAdded"] = added
    return {"metadata": {"name": name}, "spec": {"deviceSelector": selector, "taint": taint}}


def record(node: str, rows: list[tuple[str, str]], namespace: str = "default") -> JSON:
    data = encode_devices(HealthRow(key(node, d), Health(h), "", 1.0) for d, h in rows)
    return {
        "metadata": {
            "name": record_name(node),
            "namespace": namespace,
            "labels": record_labels(node),
        },
        "data": data,
    }


# --------------------------------------------------------------------------- basics


def test_pod_status_resolves_to_devices_in_any_order() -> None:
    objs = [
        ("Pod", pod("p", "c", "n1", [(f"{D}/n1/gpu-0", "Unhealthy")])),
        ("ResourceClaim", claim("c", [("gpu", "n1", "gpu-0")])),
        ("ResourceSlice", slice_("n1", ["gpu-0", "gpu-1"])),
    ]
    a, b = build(objs), build(reversed(objs))
    assert a.snapshot() == b.snapshot()
    obs = a.observation(key("n1", "gpu-0"))
    assert obs is not None and obs.health is Health.UNHEALTHY and obs.node == "n1"
    assert a.consumers(key("n1", "gpu-0")) == [Consumer("default", "p", "uid-p", "n1", "c", "gpu")]
    facts = a.facts(key("n1", "gpu-1"))
    assert facts is not None and facts.node == "n1" and facts.attributes["model"] == "h100"
    assert a.take_changed() >= {key("n1", "gpu-0"), key("n1", "gpu-1")}
    assert a.take_changed() == set()


def test_deletes_undo_everything_and_report_gone_pods() -> None:
    m = ClusterModel()
    objs = [
        ("ResourceSlice", slice_("n1", ["gpu-0"])),
        ("ResourceClaim", claim("c", [("gpu", "n1", "gpu-0")])),
        ("Pod", pod("p", "c", "n1", [(f"{D}/n1/gpu-0", "Healthy")])),
        ("DeviceTaintRule", rule("r", {"driver": D})),
        ("ConfigMap", record("n1", [("gpu-0", "Unhealthy")])),
        ("Node", {"metadata": {"name": "n1", "labels": {"a": "b"}}}),
    ]
    for kind, obj in objs:
        m.apply(kind, "ADDED", obj)
    m.take_changed()
    for kind, obj in objs:
        m.apply(kind, "DELETED", obj)
    assert m.snapshot() == ClusterModel().snapshot()
    assert m.take_gone_pods() == ["uid-p"]
    assert key("n1", "gpu-0") in m.take_changed()


def test_a_claim_change_reresolves_the_pods_that_name_it() -> None:
    m = build([("Pod", pod("p", "c", "n1", [(f"{D}/n1/gpu-1", "Unhealthy")]))])
    m.apply("ResourceClaim", "ADDED", claim("c", [("gpu", "n1", "gpu-0")]))
    assert m.observation(key("n1", "gpu-1")) is None  # not allocated yet: not observed
    m.take_changed()
    m.apply(
        "ResourceClaim", "MODIFIED", claim("c", [("gpu", "n1", "gpu-0"), ("gpu", "n1", "gpu-1")])
    )
    assert m.take_changed() >= {key("n1", "gpu-1")}
    obs = m.observation(key("n1", "gpu-1"))
    assert obs is not None and obs.health is Health.UNHEALTHY


# --------------------------------------------------------------------------- decided cases


def test_agent_record_wins_over_pods_and_foreign_configmaps_are_ignored() -> None:
    m = build([
        ("ResourceClaim", claim("c", [("gpu", "n1", "gpu-0")])),
        ("Pod", pod("p", "c", "n1", [(f"{D}/n1/gpu-0", "Unhealthy")])),
        ("ConfigMap", record("n1", [("gpu-0", "Healthy")])),
        ("ConfigMap", record("n2", [("gpu-0", "Unhealthy")], namespace="tenant")),
    ])  # fmt: skip
    obs = m.observation(key("n1", "gpu-0"))
    assert obs is not None and (obs.health, obs.source) == (Health.HEALTHY, "agent")
    assert m.observation(key("n2", "gpu-0")) is None


def test_pods_merge_worst_first() -> None:
    m = build([
        ("ResourceClaim", claim("c", [("gpu", "n1", "gpu-0")])),
        ("Pod", pod("a", "c", "n1", [(f"{D}/n1/gpu-0", "Healthy")])),
        ("Pod", pod("b", "c", "n1", [(f"{D}/n1/gpu-0", "Unhealthy")])),
    ])  # fmt: skip
    obs = m.observation(key("n1", "gpu-0"))
    assert obs is not None and obs.health is Health.UNHEALTHY


def test_device_plugin_entries_are_not_claims() -> None:
    m = build([
        ("ResourceClaim", claim("c", [("gpu", "n1", "gpu-0")])),
        ("Pod", pod("p", "c", "n1", [("nvidia0", "Unhealthy")], entry="gpu/x")),
    ])  # fmt: skip
    assert m.observation(key("n1", "gpu-0")) is None


def test_cdi_ids_resolve_by_suffix_and_ambiguity_is_skipped() -> None:
    two = claim("c", [("gpu", "n1", "gpu-0"), ("gpu", "n1", "gpu-1")])
    m = build(
        [("ResourceClaim", two), ("Pod", pod("p", "c", "n1", [("vendor=gpu-1", "Unhealthy")]))]
    )
    assert m.observation(key("n1", "gpu-1")) is not None
    m = build([("ResourceClaim", two), ("Pod", pod("p", "c", "n1", [("vendor/x", "Unhealthy")]))])
    assert m.observations() == {}


def test_wildcard_rules_taint_like_the_allocator() -> None:
    m = build([
        ("ResourceSlice",
         slice_("n1", ["gpu-0"], {"gpu-0": [{"key": "s", "effect": "NoSchedule"}]})),
        ("DeviceTaintRule", rule("all", {"driver": D})),
        ("DeviceTaintRule", rule("one", {"driver": D, "pool": "n1", "device": "gpu-0"})),
        ("DeviceTaintRule", rule("other", {"driver": "else"})),
    ])  # fmt: skip
    sources = [t.source for t in m.taints(key("n1", "gpu-0"))]
    assert sources == ["devicetaintrule/all", "devicetaintrule/one", "resourceslice/n1-slice"]
    m.apply("DeviceTaintRule", "DELETED", rule("all", {"driver": D}))
    assert m.taints(key("n1", "gpu-0"))[0].source == "devicetaintrule/one"


def test_consumers_are_live_pods_once_each() -> None:
    p = pod("p", "c", "n1")
    p["spec"]["resourceClaims"].append({"name": "again", "resourceClaimName": "c"})
    m = build([
        ("ResourceClaim", claim("c", [("gpu", "n1", "gpu-0")])),
        ("Pod", p),
        ("Pod", pod("done", "c", "n1", phase="Succeeded")),
    ])  # fmt: skip
    assert [c.name for c in m.consumers(key("n1", "gpu-0"))] == ["p"]


def test_reference_without_claim_name_or_template_names_no_claim() -> None:
    p = {
        "spec": {"resourceClaims": [{"name": "gpu"}]},
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "g"}]},
    }
    assert pod_claim_names(p) == {}
    assert resolve_claim_name(p, "gpu") is None
    p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "t"
    assert pod_claim_names(p) == {"gpu": "g"} and resolve_claim_name(p, "gpu") == "g"


def test_entry_names_round_trip() -> None:
    assert parse_entry_name(entry_name("gpu", "req/sub")) == ("gpu", "req/sub")
    assert parse_entry_name(entry_name("gpu", None)) == ("gpu", "")
    assert parse_entry_name("nvidia.com/gpu") is None


def test_eviction_honours_toleration_seconds_smallest_wins() -> None:
    t = Taint("k", "v", "NoExecute")
    assert eviction_due(t, [], 100.0) == NOW
    assert eviction_due(t, [{"key": "k", "operator": "Exists"}], 100.0) is None
    both = [{"operator": "Exists"}, {"operator": "Exists", "tolerationSeconds": 60},
            {"operator": "Exists", "tolerationSeconds": 30}]  # fmt: skip
    assert eviction_due(t, both, 100.0) == 130.0
    assert eviction_due(t, both, None) is None
    m = build([
        ("ResourceClaim", claim("c", [("gpu", "n1", "gpu-0")],
                                [{"operator": "Exists", "tolerationSeconds": 30}])),
        ("ResourceClaim", claim("d", [("gpu", "n1", "gpu-0")])),
        ("Pod", pod("p", "c", "n1")),
        ("Pod", pod("q", "d", "n1")),
    ])  # fmt: skip
    now_out, later = m.evictions(key("n1", "gpu-0"), t, 100.0, 110.0)
    assert [c.name for c in now_out] == ["q"] and later == 130.0
    assert [c.name for c in m.evictions(key("n1", "gpu-0"), t, 100.0, 130.0)[0]] == ["p", "q"]


def test_record_codec_round_trips() -> None:
    cm = record("n1", [("gpu-0", "Unhealthy"), ("gpu-1", "Healthy")])
    out = decode_devices(cm)
    assert (
        out[key("n1", "gpu-0")].health is Health.UNHEALTHY and out[key("n1", "gpu-0")].since == 1.0
    )
    assert out[key("n1", "gpu-0")].node == "n1"
    assert json.loads(cm["data"]["devices"])[0]["device"] == "gpu-0"
    assert decode_devices({"data": {"devices": "{not json"}}) == {}


# --------------------------------------------------------------------------- property


NODES, DEVICES, PODS, CLAIMS = ("n0", "n1"), ("gpu-0", "gpu-1"), ("p0", "p1", "p2"), ("c0", "c1")
HEALTH = ("Healthy", "Unhealthy", "Unknown")
dev = st.tuples(st.sampled_from(NODES), st.sampled_from(DEVICES))


def _objects() -> st.SearchStrategy[tuple[str, JSON]]:
    slices = st.builds(
        lambda n, ds: ("ResourceSlice", slice_(n, sorted(ds))),
        st.sampled_from(NODES), st.sets(st.sampled_from(DEVICES)),
    )  # fmt: skip
    claims = st.builds(
        lambda c, rs: ("ResourceClaim", claim(c, [("gpu", n, d) for n, d in rs])),
        st.sampled_from(CLAIMS), st.lists(dev, max_size=2),
    )  # fmt: skip
    pods = st.builds(
        lambda p, c, n, hs, phase, uid: ("Pod", pod(
            p, c, n, [(f"{D}/{hn}/{hd}", h) for (hn, hd), h in hs], phase=phase, uid=uid)),
        st.sampled_from(PODS), st.sampled_from(CLAIMS), st.sampled_from(NODES),
        st.lists(st.tuples(dev, st.sampled_from(HEALTH)), max_size=2),
        st.sampled_from(("Running", "Failed")), st.sampled_from(("u1", "u2")),
    )  # fmt: skip
    rules = st.builds(
        lambda name, sel: ("DeviceTaintRule", rule(name, sel)),
        st.sampled_from(("r0", "r1")),
        st.fixed_dictionaries({}, optional={"driver": st.just(D), "pool": st.sampled_from(NODES),
                                            "device": st.sampled_from(DEVICES)}),
    )  # fmt: skip
    records = st.builds(
        lambda n, rows: ("ConfigMap", record(n, rows)),
        st.sampled_from(NODES),
        st.lists(st.tuples(st.sampled_from(DEVICES), st.sampled_from(HEALTH))),
    )  # fmt: skip
    return st.one_of(slices, claims, pods, rules, records)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_objects(), st.booleans()), max_size=25))
def test_random_event_sequences_match_a_rebuild(
    events: list[tuple[tuple[str, JSON], bool]],
) -> None:
    m = ClusterModel()
    final: dict[tuple[str, str], tuple[str, JSON]] = {}
    changed: set[DeviceKey] = set()
    before = m.snapshot()
    for (kind, obj), delete in events:
        name = (kind, obj["metadata"]["name"])
        if delete:
            if name not in final:
                continue
            m.apply(kind, "DELETED", final.pop(name)[1])
        else:
            m.apply(kind, "MODIFIED" if name in final else "ADDED", obj)
            final[name] = (kind, obj)
        changed |= m.take_changed()
    assert m.snapshot() == build(final.values()).snapshot()
    # every device whose observation or facts differ from the start was reported changed
    after = m.snapshot()
    for part in ("observations", "facts"):
        moved = {k for k in before[part].keys() | after[part].keys()
                 if before[part].get(k) != after[part].get(k)}  # fmt: skip
        assert moved <= changed
