"""The dashboard's pure parts: the timeline's caps, counts, and eviction facts per device."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from drahealth.core import record_labels, record_name
from drahealth.web._state import pod_facts, snapshot
from drahealth.web._timeline import Timeline, counts, worst_taint

D, NODE = "gpu.example.com", "node-1"
EVICTED = {"type": "DisruptionTarget", "status": "True"}


def dev(key: str, health: str = "Healthy", **kw: Any) -> dict[str, Any]:
    return {"key": key, "health": health, "taints": [], "evicting": [], "blocked": [], **kw}


def test_worst_taint_and_counts() -> None:
    d = dev("a/b/c", taints=[{"effect": "NoSchedule"}, {"effect": "NoExecute"}, {"effect": "x"}])
    assert worst_taint(d) == "NoExecute" and worst_taint(dev("a/b/d")) == ""
    got = counts([d, dev("a/b/e", "Unhealthy", evicting=["p"]), dev("a/b/f", "Weird")])
    assert got == {"devices": 3, "healthy": 1, "unhealthy": 1, "unknown": 1, "tainted": 1,
                   "evicting": 1, "blocked": 0}  # fmt: skip


def test_a_device_timeline_records_changes_only_and_keeps_its_cap() -> None:
    t = Timeline(per_device=3, max_devices=10, max_samples=100, sample_gap=0)
    changed, sample, _ = t.observe([dev("k", since=50.0)], now=100.0)
    assert changed == ["k"] and t.device("k") == [[50.0, "Healthy", ""]]  # the agent's since
    assert sample is not None and sample["healthy"] == 1
    assert t.observe([dev("k", message="same health")], now=101.0)[:2] == ([], None)
    for i, health in enumerate(["Unhealthy", "Healthy", "Unknown", "Unhealthy"]):
        t.observe([dev("k", health)], now=200.0 + i)
    assert [e[1] for e in t.device("k")] == ["Healthy", "Unknown", "Unhealthy"]
    assert t.device("nobody") == []


@pytest.mark.parametrize("since", [math.inf, math.nan, 10_000.0, "soon", None])
def test_a_since_that_is_not_a_past_finite_time_starts_now(since: object) -> None:
    t = Timeline()
    t.observe([dev("k", since=since)], now=100.0)
    assert t.device("k")[0][0] == 100.0


def test_devices_and_samples_are_capped() -> None:
    t = Timeline(per_device=2, max_devices=3, max_samples=4, sample_gap=0)
    for i in range(10):
        t.observe([dev(f"d{i}", "Unhealthy" if i % 2 else "Healthy")], now=float(i))
    assert len(t) == 3 and t.device("d9") and not t.device("d0")  # the oldest went first
    assert len(t.samples) == 4 and t.samples[-1]["t"] == 9.0


def test_a_burst_replaces_the_last_sample_instead_of_pushing_history_out() -> None:
    t = Timeline(sample_gap=2.0)
    t.observe([dev("k")], now=0.0)
    t.observe([dev("k", "Unhealthy")], now=10.0)
    _, _, replaced = t.observe([dev("k", "Unknown")], now=10.5)
    assert replaced and [s["t"] for s in t.samples] == [0.0, 10.5]
    assert t.samples[-1]["unknown"] == 1


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        Timeline(per_device=0)


def _pod(name: str, uid: str, **extra: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {"nodeName": NODE, "containers": [{"name": "m"}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    for k, v in extra.items():
        pod[k].update(v)
    return pod


def _claim(name: str, device: str) -> dict[str, Any]:
    result = {"request": "gpu", "driver": D, "pool": NODE, "device": device}
    return {
        "metadata": {"name": f"{name}-gpu", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def _blocked(name: str, uid: str = "", when: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    obj = {"kind": "Pod", "namespace": "ml", "name": name, **({"uid": uid} if uid else {})}
    return {"reason": "EvictionBlocked", "involvedObject": obj, "lastTimestamp": when,
            "message": f"eviction of pod ml/{name} refused at {when}",
            "metadata": {"namespace": "ml"}, "source": {"component": "drahealth-controller"},
            "reportingComponent": "drahealth-controller", "reportingInstance": "ctl"}  # fmt: skip


def test_pod_facts_say_who_is_being_evicted() -> None:
    assert pod_facts(_pod("a", "u1")) == (("ml", "a"), ("u1", False))
    marked = _pod(
        "b", "u2", status={"conditions": [{"type": "DisruptionTarget", "status": "True"}]}
    )
    assert pod_facts(marked)[1] == ("u2", True)
    assert pod_facts(_pod("c", "u3", metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"}))[1][1]
    assert pod_facts({"metadata": None, "status": {"conditions": ["junk"]}}) == (
        ("", ""),
        ("", False),
    )


def test_evicting_and_pdb_blocked_pods_per_device() -> None:
    names = ["run", "gone", "stop", "old", "free"]
    devices = {"run": "gpu-0", "gone": "gpu-0", "stop": "gpu-1", "old": "gpu-2", "free": "gpu-3"}
    pods = [
        _pod("run", "u-run"),
        _pod("stop", "u-stop", status={"conditions": [EVICTED]}),
        _pod("old", "u-old-2"),
        _pod("free", "u-free"),
    ]  # fmt: skip
    claims = [_claim(n, devices[n]) for n in names]
    rows = [{"driver": D, "pool": NODE, "device": f"gpu-{i}", "health": "Unhealthy",
             "message": "", "since": 1.0} for i in range(4)]  # fmt: skip
    meta = {"name": record_name(NODE), "namespace": "default", "labels": record_labels(NODE)}
    record = {"metadata": meta, "data": {"devices": json.dumps(rows)}}
    spec = {"driver": D, "nodeName": NODE, "pool": {"name": NODE},
            "devices": [{"name": f"gpu-{i}"} for i in range(4)]}  # fmt: skip
    slice_ = {"metadata": {"name": "s"}, "spec": spec}
    rules = [
        {
            "metadata": {"name": f"r{i}"},
            "spec": {
                "deviceSelector": {"driver": D, "pool": NODE, "device": f"gpu-{i}"},
                "taint": {"key": "k", "effect": "NoSchedule"},
            },
        }
        for i in range(3)
    ]  # fmt: skip  (gpu-3 is not tainted: nobody wants its pod out)
    events = [
        _blocked("run", when="2026-01-01T00:00:00Z"),
        _blocked("run", when="2026-01-01T00:05:00Z"),  # the newest message is shown
        _blocked("gone"),  # the pod is gone
        _blocked("stop"),  # being evicted now: not blocked any more
        _blocked("old", uid="u-old-1"),  # an earlier pod of the same name
        _blocked("free"),  # its device is not tainted
        {**_blocked("run"), "reason": "Other"},
    ]
    state = snapshot([record], pods, claims, [slice_], rules, blocked_events=events)
    got = {
        d["device"]: (d["pods"], d["evicting"], d["blocked"]) for d in state["nodes"][0]["devices"]
    }
    assert got["gpu-0"] == (
        ["ml/run"],
        [],
        [{"pod": "ml/run", "message": "eviction of pod ml/run refused at 2026-01-01T00:05:00Z"}],
    )
    assert got["gpu-1"] == (["ml/stop"], ["ml/stop"], [])
    assert got["gpu-2"] == (["ml/old"], [], [])
    assert got["gpu-3"] == (["ml/free"], [], [])
