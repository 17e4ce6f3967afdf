"""Reflector decision logic without a server: backoff arithmetic, resourceVersion
ordering, cache/dedupe rules, the store view, and watch-line handling."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node

from drahealth.kube import Backoff, ObjectCache, Reflector, Store, make_client, rv_newer
from drahealth.kube._reflector import WatchErrorEvent, _Gone


def cm(name: str, rv: str | None, ns: str = "default", **data: str) -> ConfigMap:
    return ConfigMap(metadata=ObjectMeta(name=name, namespace=ns, resourceVersion=rv), data=data)


# ------------------------------------------------------------------ backoff


def test_backoff_doubles_and_caps_without_jitter() -> None:
    b = Backoff(0.1, 1.0, rng=lambda: 0.0)
    assert [round(b.next(), 6) for _ in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert b.attempts == 7


def test_backoff_jitter_scales_down_within_bounds() -> None:
    b = Backoff(0.1, 10.0, jitter=0.5, rng=lambda: 1.0)
    assert b.next() == pytest.approx(0.05)
    assert b.next() == pytest.approx(0.1)


def test_backoff_reset() -> None:
    b = Backoff(0.1, 10.0, rng=lambda: 0.0)
    for _ in range(5):
        b.next()
    b.reset()
    assert b.attempts == 0
    assert b.next() == pytest.approx(0.1)


def test_backoff_many_attempts_do_not_overflow() -> None:
    b = Backoff(0.1, 10.0, rng=lambda: 0.0)
    for _ in range(5000):
        d = b.next()
    assert d == 10.0


@given(
    initial=st.floats(0.001, 1.0),
    factor=st.floats(1.0, 4.0),
    jitter=st.floats(0.0, 1.0),
    draws=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40),
)
def test_backoff_bounds(initial: float, factor: float, jitter: float, draws: list[float]) -> None:
    maximum = initial * 50
    it = iter(draws)
    b = Backoff(initial, maximum, factor=factor, jitter=jitter, rng=lambda: next(it))
    prev_base = 0.0
    for _ in draws:
        base = b.peek_base()
        d = b.next()
        assert prev_base <= base <= maximum
        assert base * (1 - jitter) - 1e-12 <= d <= base + 1e-12
        prev_base = base


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": 0}, {"initial": 2, "maximum": 1}, {"factor": 0.5}, {"jitter": 1.5}],
)
def test_backoff_rejects_bad_parameters(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)


# ------------------------------------------------------------------ rv ordering


@pytest.mark.parametrize(
    ("new", "old", "expected"),
    [
        ("10", "9", True),  # integer, not string, comparison
        ("9", "10", False),
        ("5", "5", False),
        ("abc", "abd", True),  # opaque: different counts as newer
        ("abc", "abc", False),
        ("10", "x", True),
        (None, "5", True),
        ("5", None, True),
    ],
)
def test_rv_newer(new: str | None, old: str | None, expected: bool) -> None:
    assert rv_newer(new, old) is expected


# ------------------------------------------------------------------ cache


def test_cache_add_modify_delete() -> None:
    c: ObjectCache[ConfigMap] = ObjectCache()
    e1 = c.apply("ADDED", cm("a", "1"))
    assert e1 is not None and (e1.type, e1.old) == ("ADDED", None)
    e2 = c.apply("MODIFIED", cm("a", "2", k="v"))
    assert e2 is not None and e2.type == "MODIFIED" and e2.old is e1.obj
    e3 = c.apply("DELETED", cm("a", "3"))
    assert e3 is not None and e3.type == "DELETED" and e3.old is e2.obj
    assert c.objects == {}


def test_cache_added_for_known_key_is_modified() -> None:
    c: ObjectCache[ConfigMap] = ObjectCache()
    c.apply("ADDED", cm("a", "1"))
    ev = c.apply("ADDED", cm("a", "2"))
    assert ev is not None and ev.type == "MODIFIED"


def test_cache_ignores_stale_and_duplicate() -> None:
    c: ObjectCache[ConfigMap] = ObjectCache()
    c.apply("ADDED", cm("a", "10"))
    assert c.apply("MODIFIED", cm("a", "9")) is None
    assert c.apply("MODIFIED", cm("a", "10")) is None
    assert c.apply("DELETED", cm("a", "8")) is None  # deletion older than the cached copy
    assert c.objects[("default", "a")].metadata.resourceVersion == "10"  # type: ignore[union-attr]


def test_cache_delete_unknown_and_same_rv() -> None:
    c: ObjectCache[ConfigMap] = ObjectCache()
    assert c.apply("DELETED", cm("zz", "1")) is None
    c.apply("ADDED", cm("a", "4"))
    # a server that reports the deletion with the object's last RV must still delete it
    ev = c.apply("DELETED", cm("a", "4"))
    assert ev is not None and ev.type == "DELETED"


def test_cache_keys_by_namespace() -> None:
    c: ObjectCache[ConfigMap] = ObjectCache()
    c.apply("ADDED", cm("a", "1", ns="x"))
    c.apply("ADDED", cm("a", "2", ns="y"))
    assert sorted(c.objects) == [("x", "a"), ("y", "a")]


def test_cache_rejects_unknown_type_and_nameless() -> None:
    c: ObjectCache[ConfigMap] = ObjectCache()
    with pytest.raises(ValueError):
        c.apply("BOOKMARK", cm("a", "1"))
    with pytest.raises(ValueError):
        c.apply("ADDED", ConfigMap(metadata=ObjectMeta()))


def test_cache_replace_emits_difference() -> None:
    c: ObjectCache[ConfigMap] = ObjectCache()
    for name, rv in [("keep", "1"), ("change", "2"), ("gone", "3")]:
        c.apply("ADDED", cm(name, rv))
    events = c.replace([cm("keep", "1"), cm("change", "7"), cm("new", "8")])
    summary = [(e.type, e.obj.metadata.name) for e in events]  # type: ignore[union-attr]
    assert summary == [("DELETED", "gone"), ("MODIFIED", "change"), ("ADDED", "new")]
    assert sorted(n for _, n in c.objects) == ["change", "keep", "new"]


def test_cache_replace_keeps_newer_cached_copy() -> None:
    c: ObjectCache[ConfigMap] = ObjectCache()
    c.apply("ADDED", cm("a", "9"))
    assert c.replace([cm("a", "5")]) == []
    assert c.objects[("default", "a")].metadata.resourceVersion == "9"  # type: ignore[union-attr]


ops = st.lists(
    st.tuples(
        st.sampled_from(["ADDED", "MODIFIED", "DELETED", "LIST"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(1, 30),
    ),
    max_size=60,
)


@given(ops)
@settings(max_examples=200)
def test_cache_never_goes_backwards(seq: list[tuple[str, str, int]]) -> None:
    """Whatever order events arrive in, per object the emitted RVs strictly increase
    (a deletion may repeat the last RV), and nothing is emitted after a stale event."""
    c: ObjectCache[ConfigMap] = ObjectCache()
    last: dict[str, int] = {}
    for etype, name, rv in seq:
        if etype == "LIST":
            events = c.replace([cm(name, str(rv))])
        else:
            ev = c.apply(etype, cm(name, str(rv)))
            events = [ev] if ev else []
        for ev in events:
            md = ev.obj.metadata
            assert md is not None and md.name and md.resourceVersion
            key, got = md.name, int(md.resourceVersion)
            if ev.type == "DELETED":
                assert got >= last.get(key, 0) or ev.obj is ev.old
            else:
                assert got > last.get(key, 0)
            last[key] = max(last.get(key, 0), got)


def test_store_view() -> None:
    c: ObjectCache[ConfigMap] = ObjectCache()
    c.apply("ADDED", cm("b", "1"))
    c.apply("ADDED", cm("a", "2", ns="z"))
    s = Store(c.objects)
    assert len(s) == 2
    assert s.get("default", "b") is c.objects[("default", "b")]
    assert s.get("default", "nope") is None
    assert ("z", "a") in s
    assert list(s) == [("default", "b"), ("z", "a")]
    assert [o.metadata.name for o in s.list()] == ["b", "a"]  # type: ignore[union-attr]
    assert s[("z", "a")].metadata.resourceVersion == "2"  # type: ignore[union-attr]
    c.apply("DELETED", cm("b", "3"))
    assert len(s) == 1  # a live view


# ------------------------------------------------------------------ reflector, no I/O


@pytest.fixture
async def reflector() -> AsyncIterator[Reflector[ConfigMap]]:
    client = make_client(server_url="http://127.0.0.1:9")
    yield Reflector(client, ConfigMap, namespace="default")
    await client.close()


def _line(etype: str, obj: dict[str, Any]) -> str:
    return json.dumps({"type": etype, "object": obj})


def _cm_json(name: str, rv: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": rv},
    }


async def test_handle_lines_and_handlers(reflector: Reflector[ConfigMap]) -> None:
    seen: list[tuple[str, str | None, str | None]] = []

    def sync_handler(t: str, obj: ConfigMap, old: ConfigMap | None) -> None:
        seen.append(
            (
                t,
                obj.metadata.resourceVersion if obj.metadata else None,
                old.metadata.resourceVersion if old and old.metadata else None,
            )
        )

    async def async_handler(t: str, obj: ConfigMap, old: ConfigMap | None) -> None:
        await asyncio.sleep(0)
        seen.append(("async-" + t, None, None))

    def broken(t: str, obj: ConfigMap, old: ConfigMap | None) -> None:
        raise RuntimeError("handler bug")

    reflector.add_handler(broken)
    reflector.add_handler(sync_handler)
    reflector.add_handler(async_handler)
    stream = reflector.events()
    await reflector._handle_line(_line("ADDED", _cm_json("a", "5")))
    await reflector._handle_line(_line("MODIFIED", _cm_json("a", "4")))  # stale: dropped
    await reflector._handle_line(_line("MODIFIED", _cm_json("a", "6")))
    await reflector._handle_line(
        _line(
            "BOOKMARK",
            {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": "20"}},
        )
    )
    assert reflector.last_resource_version == "20"
    await reflector._handle_line(_line("DELETED", _cm_json("a", "21")))
    assert seen == [
        ("ADDED", "5", None),
        ("async-ADDED", None, None),
        ("MODIFIED", "6", "5"),
        ("async-MODIFIED", None, None),
        ("DELETED", "21", "6"),
        ("async-DELETED", None, None),
    ]
    assert reflector.last_resource_version == "21"
    assert len(reflector.store) == 0
    stream.close()
    got = [(e.type, e.obj.metadata.resourceVersion) async for e in stream]  # type: ignore[union-attr]
    assert got == [("ADDED", "5"), ("MODIFIED", "6"), ("DELETED", "21")]


async def test_handle_error_events(reflector: Reflector[ConfigMap]) -> None:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure"}
    with pytest.raises(_Gone):
        await reflector._handle_line(_line("ERROR", {**status, "code": 410, "reason": "Expired"}))
    with pytest.raises(_Gone):
        await reflector._handle_line(_line("ERROR", {**status, "reason": "Expired"}))
    with pytest.raises(WatchErrorEvent) as info:
        await reflector._handle_line(_line("ERROR", {**status, "code": 500, "reason": "Boom"}))
    assert info.value.code == 500


async def test_unknown_event_type_ignored(reflector: Reflector[ConfigMap]) -> None:
    await reflector._handle_line(_line("SOMETHING", _cm_json("a", "1")))
    assert len(reflector.store) == 0


async def test_constructor_validation() -> None:
    client = make_client(server_url="http://127.0.0.1:9")
    try:
        with pytest.raises(ValueError, match="cluster-scoped"):
            Reflector(client, Node, namespace="x")
        with pytest.raises(TypeError):
            Reflector(client, dict)
        r = Reflector(client, Node, labels={"a": "b"}, fields="metadata.name=n1")
        assert r._labels == "a=b" and r._fields == "metadata.name=n1"
        assert r._ns_arg is None
        r2 = Reflector(client, ConfigMap)
        assert r2._ns_arg == "*"  # all namespaces
    finally:
        await client.close()


async def test_retries_while_server_unreachable() -> None:
    """No server on the port: the reflector keeps retrying with backoff, never syncs,
    and stops cleanly."""
    client = make_client(server_url="http://127.0.0.1:9", timeout=0.5)
    r = Reflector(client, ConfigMap, backoff_initial=0.01, backoff_max=0.05)
    try:
        async with r:
            with pytest.raises(TimeoutError):
                await r.wait_synced(0.3)
            assert r.last_error is not None
            assert not r.has_synced
        assert not r.running
    finally:
        await client.close()
