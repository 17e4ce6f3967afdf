"""The data file format and the protobuf bodies kubectl sends."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from drahealth.controlplane._persist import DataFileError, load, save
from drahealth.controlplane._protobuf import MAGIC, ProtobufError, decode


def test_save_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "store.json"
    assert load(path) is None
    objects = {"/pods": [{"metadata": {"name": "a", "resourceVersion": "7"}}]}
    save(path, 7, objects)
    assert load(path) == (7, objects)
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[]",
        '{"version": 2}',
        '{"version": 1, "objects": {}}',
    ],
)
def test_corrupt_files_name_the_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "store.json"
    path.write_text(content)
    with pytest.raises(DataFileError, match=re.escape(str(path))):
        load(path)


def test_checksum_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "store.json"
    save(path, 1, {"/pods": [{"metadata": {"name": "a", "resourceVersion": "1"}}]})
    path.write_bytes(path.read_bytes().replace(b'"name":"a"', b'"name":"b"'))
    with pytest.raises(DataFileError, match="checksum"):
        load(path)


# --------------------------------------------------------------------------- protobuf


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _ld(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _str(number: int, text: str) -> bytes:
    return _ld(number, text.encode())


def test_decode_configmap() -> None:
    meta = _str(1, "cm") + _str(3, "default") + _ld(11, _str(1, "app") + _str(2, "x"))
    data = _ld(2, _str(1, "k") + _str(2, "v"))
    body = _ld(1, meta) + data + _ld(3, _str(1, "b") + _ld(2, b"\x00"))
    envelope = _ld(1, _str(1, "v1") + _str(2, "ConfigMap")) + _ld(2, body)
    assert decode(MAGIC + envelope) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": "default", "labels": {"app": "x"}},
        "data": {"k": "v"},
        "binaryData": {"b": "AA=="},
    }


def test_decode_eviction_with_preconditions() -> None:
    opts = _ld(2, _str(1, "uid-1")) + _varint(1 << 3) + _varint(0) + _str(5, "All")
    body = _ld(1, _str(1, "p")) + _ld(2, opts)
    envelope = _ld(1, _str(1, "policy/v1") + _str(2, "Eviction")) + _ld(2, body)
    assert decode(MAGIC + envelope)["deleteOptions"] == {
        "preconditions": {"uid": "uid-1"},
        "gracePeriodSeconds": 0,
        "dryRun": ["All"],
    }


def test_decode_rejects_other_kinds_and_garbage() -> None:
    envelope = _ld(1, _str(1, "v1") + _str(2, "Pod")) + _ld(2, b"")
    with pytest.raises(ProtobufError, match="send application/json"):
        decode(MAGIC + envelope)
    with pytest.raises(ProtobufError):
        decode(b"{}")
    with pytest.raises(ProtobufError):
        decode(MAGIC + b"\x0a\xff")
