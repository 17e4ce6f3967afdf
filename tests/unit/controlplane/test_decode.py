"""Bounded body decoding, object limits, patch limits and watcher queues (no HTTP)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from drahealth.controlplane._decode import (
    MAX_BODY_BYTES,
    MAX_DEPTH,
    MAX_OBJECT_BYTES,
    MAX_OBJECT_DEPTH,
    MAX_YAML_BYTES,
    DecodeError,
    TooLarge,
    check_object,
    decode_json,
    decode_yaml,
    normalize,
)
from drahealth.controlplane._patch import (
    MAX_JSON_PATCH_OPERATIONS,
    PatchError,
    PatchTooLarge,
    json_patch,
    strategic_merge,
)
from drahealth.controlplane._protobuf import MAGIC, ProtobufError, UnsupportedKind, decode
from drahealth.controlplane._store import Store


def test_json_text_is_repaired_like_go() -> None:
    assert decode_json(b'{"a":"\\ud800x","\\udc00":1,"e":"\\ud83d\\ude00"}') == {
        "a": "\ufffdx",
        "\ufffd": 1,
        "e": "\U0001f600",
    }
    assert decode_json(b'["a\xffb"]') == ["a\ufffdb"]


@pytest.mark.parametrize("raw", [b"NaN", b"[Infinity]", b"[-Infinity]", b"1e999", b"{", b"[1] x"])
def test_json_rejects_non_json(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_json(raw)


def test_json_depth_is_checked_before_parsing() -> None:
    ok = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert decode_json(ok) is not None
    t0 = time.monotonic()
    for depth in (MAX_DEPTH + 1, 100_000, 1_000_000):
        with pytest.raises(DecodeError, match="nested"):
            decode_json(b"[" * depth + b"]" * depth)
    assert time.monotonic() - t0 < 2.0
    # Brackets inside strings do not count.
    assert decode_json(b'["' + b"[" * 5000 + b'"]') == ["[" * 5000]


def test_body_limit() -> None:
    with pytest.raises(TooLarge, match=f"limit is {MAX_BODY_BYTES}"):
        decode_json(b" " * (MAX_BODY_BYTES + 1))
    with pytest.raises(TooLarge, match=str(MAX_YAML_BYTES)):
        decode_yaml(b"a: " + b"x" * MAX_YAML_BYTES)


def test_yaml_values_become_plain_json() -> None:
    doc = b"t: 2024-01-01T00:00:00Z\nb: !!binary aGk=\n1: one\ntrue: yes\nn: null\nf: 1.5\n"
    assert decode_yaml(doc) == {
        "t": "2024-01-01T00:00:00Z",
        "b": "aGk=",
        "1": "one",
        "true": True,
        "n": None,
        "f": 1.5,
    }
    shared = decode_yaml(b"a: &x {k: v}\nb: *x\n")
    assert shared == {"a": {"k": "v"}, "b": {"k": "v"}}
    assert shared["a"] is not shared["b"]  # aliases are copied, never shared


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'a: "\\ud800"', "invalid Unicode"),
        (b"a: .inf", "not a JSON number"),
        (b"a: !!set {x}", "set"),
        (b"a: &a [*a]", "cycle"),
        (b"- " * (MAX_DEPTH + 1) + b"x", "nested"),
        (b"a: 1\n---\nb: 2\n", "single document"),
        (b"a: \xff", "UTF-8"),
    ],
)
def test_yaml_rejects(raw: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_yaml(raw)


def test_yaml_alias_bomb_is_refused_before_expansion() -> None:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    t0 = time.monotonic()
    with pytest.raises(DecodeError, match="excessive aliasing"):
        decode_yaml("\n".join(lines).encode())
    assert time.monotonic() - t0 < 0.5
    big = b'x: &s "' + b"a" * 100_000 + b'"\ny: [' + b"*s," * 40 + b"*s]"
    with pytest.raises(DecodeError, match="excessive aliasing"):
        decode_yaml(big)


def test_normalize_rejects_what_cannot_be_encoded() -> None:
    with pytest.raises(DecodeError, match="unsupported value of type bytes"):
        normalize({"a": [b"x"]}, replace_invalid_text=True)
    with pytest.raises(DecodeError, match="invalid Unicode"):
        normalize({"a": "\udfff"}, replace_invalid_text=False)
    assert normalize({"a": ("\udfff",)}, replace_invalid_text=True) == {"a": ["\ufffd"]}


def test_check_object_limits() -> None:
    assert check_object({"a": "b"}) > 0
    with pytest.raises(TooLarge, match=f"limit is {MAX_OBJECT_BYTES}"):
        check_object({"a": "x" * MAX_OBJECT_BYTES})
    with pytest.raises(DecodeError, match="cannot be encoded"):
        check_object({"a": "\ud800"})
    deep: Any = 1
    for _ in range(MAX_OBJECT_DEPTH + 1):
        deep = [deep]
    with pytest.raises(DecodeError, match="nested"):
        check_object(deep)


def test_json_patch_limits() -> None:
    doc = {"data": {"a": "x" * 4096}}
    ops = [{"op": "copy", "from": "/data", "path": f"/data/a{i}"} for i in range(16)]
    t0 = time.monotonic()
    with pytest.raises(PatchTooLarge):
        json_patch(doc, ops)
    assert time.monotonic() - t0 < 0.5
    assert json_patch(doc, ops[:3])["data"].keys() == {"a", "a0", "a1", "a2"}
    many = [{"op": "test", "path": "/data/a", "value": "x" * 4096}] * (
        MAX_JSON_PATCH_OPERATIONS + 1
    )
    with pytest.raises(PatchTooLarge, match=str(MAX_JSON_PATCH_OPERATIONS)):
        json_patch(doc, many)
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "add", "path": "/data/b", "value": "y" * 100}], max_bytes=4200)


def test_strategic_merge_keyed_lists_match_first_and_stay_linear() -> None:
    def keys(path: tuple[str, ...]) -> str | None:
        return "name" if path == ("items",) else None

    orig = {"items": [{"name": "a", "v": 1}, {"name": "a", "v": 2}, {"name": "b", "v": 3}]}
    out = strategic_merge(orig, {"items": [{"name": "a", "v": 9}]}, keys)
    assert out["items"] == [{"name": "a", "v": 9}, {"name": "a", "v": 2}, {"name": "b", "v": 3}]
    out = strategic_merge(orig, {"items": [{"name": "a", "$patch": "delete"}]}, keys)
    assert out["items"] == [{"name": "a", "v": 2}, {"name": "b", "v": 3}]
    n = 20_000
    long = {"items": [{"name": str(i), "v": 0} for i in range(n)]}
    patch = {"items": [{"name": str(i), "v": 1} for i in range(n)]}
    t0 = time.monotonic()
    merged = strategic_merge(long, patch, keys)
    assert time.monotonic() - t0 < 2.0
    assert all(item["v"] == 1 for item in merged["items"])


def _ld(number: int, payload: bytes) -> bytes:
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_protobuf_errors_name_the_field() -> None:
    def configmap(meta: bytes) -> bytes:
        return MAGIC + _ld(1, _ld(1, b"v1") + _ld(2, b"ConfigMap")) + _ld(2, _ld(1, meta))

    with pytest.raises(ProtobufError, match="name: invalid UTF-8"):
        decode(configmap(_ld(1, b"\xff")))
    far = bytes([1 << 3]) + b"\x80" * 8 + b"\x7f"  # seconds = 127 << 56, year ~10^11
    with pytest.raises(ProtobufError, match=r"creationTimestamp: timestamp .* out of range"):
        decode(configmap(_ld(8, far)))
    assert decode(configmap(_ld(8, bytes([1 << 3, 0]))))["metadata"] == {
        "creationTimestamp": "1970-01-01T00:00:00Z"
    }
    with pytest.raises(UnsupportedKind):
        decode(MAGIC + _ld(1, _ld(1, b"v1") + _ld(2, b"Pod")) + _ld(2, b""))


async def test_watcher_queue_is_bounded_and_slow_watchers_are_counted() -> None:
    store = Store()
    store.watch_queue_limit = 3
    fast, _ = store.watch("cm", None, lambda o: True, None)
    slow, _ = store.watch("cm", None, lambda o: True, None)
    for i in range(3):
        store.create("cm", {"metadata": {"name": f"a{i}"}})
    while not fast.queue.empty():
        fast.queue.get_nowait()
    store.create("cm", {"metadata": {"name": "over"}})
    assert store.slow_watchers_closed == 1
    assert slow.closed and slow.queue.qsize() == 1
    assert await asyncio.wait_for(slow.queue.get(), 1) is None
    assert not fast.closed and fast.queue.qsize() == 1
    store.close_watchers()
    assert fast.queue.qsize() == 2  # shutdown keeps what was queued, then ends
    assert store.slow_watchers_closed == 1


def test_apply_dropping_a_long_keyed_list_is_linear() -> None:
    from drahealth.controlplane._apply import apply

    def keys(path: tuple[str, ...]) -> str | None:
        return "name" if path == ("spec", "containers") else None

    def no_sets(path: tuple[str, ...]) -> bool:
        return False

    n = 4000
    common: dict[str, Any] = {
        "api_version": "v1",
        "subresource": None,
        "has_status": True,
        "keys": keys,
        "sets": no_sets,
        "now": "2026-01-01T00:00:00Z",
        "force": False,
    }
    first = {"spec": {"containers": [{"name": f"c{i}", "image": "i"} for i in range(n)]}}
    live = apply({}, first, "m", **common)
    second = {"spec": {"containers": [{"name": f"d{i}", "image": "i"} for i in range(n)]}}
    t0 = time.monotonic()
    out = apply(live, second, "m", **common)
    took = time.monotonic() - t0
    assert [c["name"] for c in out["spec"]["containers"]] == [f"d{i}" for i in range(n)]
    assert took < 2.0, f"re-applying {n} list items took {took:.2f} s"
