"""Store: resourceVersions, the watch buffer, 410 after the window or compaction."""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.controlplane._store import Store, TooOld

KEY = "/pods"


def obj(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels}}


def drain(w: Any) -> list[tuple[str, str, str]]:
    out = []
    while not w.queue.empty():
        kind, o = w.queue.get_nowait()
        out.append((kind, o["metadata"]["name"], o["metadata"]["resourceVersion"]))
    return out


def test_resource_versions_are_global_and_increasing() -> None:
    s = Store()
    a = s.create(KEY, obj("a"))
    b = s.create("/configmaps", obj("b"))
    a2 = s.update(KEY, {**a, "spec": {}})
    gone = s.delete(KEY, a2)
    rvs = [int(x["metadata"]["resourceVersion"]) for x in (a, b, a2, gone)]
    assert rvs == [1, 2, 3, 4] and s.rv == 4
    assert s.get(KEY, "ns", "a") is None
    assert a["metadata"]["resourceVersion"] == "1"  # stored objects are never mutated


def test_watch_from_zero_lists_current_state_then_streams() -> None:
    s = Store()
    s.create(KEY, obj("a"))
    w, initial = s.watch(KEY, None, lambda o: True, None)
    assert [(k, o["metadata"]["name"]) for k, o in initial] == [("ADDED", "a")]
    s.create(KEY, obj("b"))
    s.create("/other", obj("c"))
    assert drain(w) == [("ADDED", "b", "2")]


def test_watch_replays_buffered_events_after_rv() -> None:
    s = Store()
    a = s.create(KEY, obj("a"))
    s.update(KEY, a)
    s.delete(KEY, a)
    _, initial = s.watch(KEY, None, lambda o: True, 1)
    assert [(k, o["metadata"]["resourceVersion"]) for k, o in initial] == [
        ("MODIFIED", "2"),
        ("DELETED", "3"),
    ]


def test_window_and_compaction_expire_old_versions() -> None:
    s = Store(window=3)
    for i in range(5):
        s.create(KEY, obj(f"o{i}"))
    s.watch(KEY, None, lambda o: True, 2)  # events 3..5 are buffered
    with pytest.raises(TooOld, match="too old resource version: 1"):
        s.watch(KEY, None, lambda o: True, 1)
    s.compact()
    s.watch(KEY, None, lambda o: True, 5)
    with pytest.raises(TooOld):
        s.watch(KEY, None, lambda o: True, 4)


def test_selector_transitions_become_added_and_deleted() -> None:
    s = Store()
    w, _ = s.watch(KEY, "ns", lambda o: o["metadata"]["labels"].get("app") == "x", None)
    a = s.create(KEY, obj("a", app="y"))
    a = s.update(KEY, {**a, "metadata": {**a["metadata"], "labels": {"app": "x"}}})
    a = s.update(KEY, a)
    a = s.update(KEY, {**a, "metadata": {**a["metadata"], "labels": {}}})
    assert drain(w) == [("ADDED", "a", "2"), ("MODIFIED", "a", "3"), ("DELETED", "a", "4")]


def test_namespace_filter_and_close() -> None:
    s = Store()
    w, _ = s.watch(KEY, "other", lambda o: True, None)
    s.create(KEY, obj("a"))
    assert w.queue.empty()
    s.close_watchers()
    assert w.queue.get_nowait() is None


def test_snapshot_restore_round_trip() -> None:
    s = Store()
    s.create(KEY, obj("a"))
    snap = s.snapshot()
    t = Store()
    t.restore(snap["resourceVersion"], snap["objects"])
    assert t.rv == 1 and t.get(KEY, "ns", "a") is not None
    with pytest.raises(TooOld):
        t.watch(KEY, None, lambda o: True, 0)
