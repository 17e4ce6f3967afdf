"""The API server's durability pieces: shape checks of the data file, log replay, and
the store's pending/commit/rollback hand-off."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from drahealth.controlplane._persist import DataFileError, encode_line, load, save
from drahealth.controlplane._store import Store
from drahealth.controlplane._wal import Journal, log_path

KEY = "/configmaps"


def obj(name: str, rv: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}}


def v1(path: Path, rv: Any, objects: Any) -> None:
    body = json.dumps(
        {"resourceVersion": rv, "objects": objects}, sort_keys=True, separators=(",", ":")
    ).encode()
    checksum = "sha256:" + hashlib.sha256(body).hexdigest()
    doc = {"version": 1, "checksum": checksum, "resourceVersion": rv, "objects": objects}
    path.write_text(json.dumps(doc))


def test_version_1_files_still_load(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    v1(path, 3, {KEY: [obj("a", 2)]})
    assert load(path) == (3, {KEY: [obj("a", 2)]})


@pytest.mark.parametrize(
    ("rv", "objects", "problem"),
    [
        (3, {KEY: [{"metadata": ["a"]}]}, "metadata is a list"),
        (3, {KEY: ["not a dict"]}, "not an object"),
        (3, {KEY: {"a": 1}}, "bad object list"),
        (True, {KEY: []}, "missing resourceVersion"),
        (-1, {KEY: []}, "missing resourceVersion"),
        (3, {KEY: [obj("a", 9)]}, "outside 1..3"),
        (3, {KEY: [{"metadata": {"name": "a", "resourceVersion": True}}]}, "decimal string"),
        (3, {KEY: [{"metadata": {"name": ""}}]}, "metadata.name"),
        (3, {KEY: [obj("a"), obj("a")]}, "twice"),
    ],
)
def test_wrong_shapes_with_a_valid_checksum_name_the_file(
    tmp_path: Path, rv: Any, objects: Any, problem: str
) -> None:
    path = tmp_path / "d.json"
    v1(path, rv, objects)
    with pytest.raises(DataFileError, match=re.escape(str(path)) + ".*" + re.escape(problem)):
        load(path)


def test_version_2_shape_and_truncation(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    save(path, 2, {KEY: [obj("a", 1), obj("b", 2)]})
    assert load(path) == (2, {KEY: [obj("a", 1), obj("b", 2)]})
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))
    with pytest.raises(DataFileError, match="header says 2 objects, found 1"):
        load(path)
    bad = encode_line({"key": KEY, "object": {"metadata": []}})
    path.write_bytes(lines[0] + lines[1] + bad)
    with pytest.raises(DataFileError, match=re.escape(str(path)) + ".*line 3.*metadata is a list"):
        load(path)


def _journaled(tmp_path: Path) -> tuple[Store, Journal]:
    store = Store()
    journal = Journal(store, tmp_path / "d.json")
    assert not journal.load()
    journal.start()
    return store, journal


async def test_log_replay_and_torn_tail(tmp_path: Path) -> None:
    store, journal = _journaled(tmp_path)
    a = store.create(KEY, obj("a"))
    store.create(KEY, obj("b"))
    store.delete(KEY, a)
    await journal.wait(store.rv)
    await journal.wait(store.rv)  # already durable: returns at once
    wal = log_path(tmp_path / "d.json")
    good = wal.read_bytes()
    wal.write_bytes(good + b'0badc0de {"rv": 4, "key"')  # an interrupted append
    copy = Store()
    reader = Journal(copy, tmp_path / "d.json")
    assert reader.load() and reader.torn_bytes > 0
    assert copy.rv == 3 and [o["metadata"]["name"] for o in copy.objects(KEY)] == ["b"]
    reader.start()  # cuts the torn tail off
    assert wal.read_bytes() == good
    lines = good.splitlines(keepends=True)
    wal.write_bytes(lines[0] + b"00000000 {}\n" + b"".join(lines[1:]))
    with pytest.raises(DataFileError, match=re.escape(str(wal)) + ".*line 2"):
        Journal(Store(), tmp_path / "d.json").load()
    (tmp_path / "d.json").unlink()
    with pytest.raises(DataFileError, match="data file is missing"):
        Journal(Store(), tmp_path / "d.json").load()


def test_pending_writes_are_invisible_to_watchers_until_committed() -> None:
    s = Store()
    s.journaled = True
    w, _ = s.watch(KEY, None, lambda o: True, None)
    a = s.create(KEY, obj("a"))
    assert s.get(KEY, "ns", "a") == a  # later operations read it at once
    assert w.queue.empty() and s.committed_rv == 0 and s.pending_rv() == 1
    _, initial = s.watch(KEY, None, lambda o: True, None)
    assert initial == []  # a new watch starts from the durable state
    s.commit(1)
    assert w.queue.get_nowait() == ("ADDED", a) and s.committed_rv == 1


def test_rollback_undoes_and_gives_the_resource_versions_back() -> None:
    s = Store()
    s.journaled = True
    a = s.create(KEY, obj("a"))
    s.commit(1)
    s.update(KEY, {**a, "data": {"x": "1"}})
    s.create(KEY, obj("b"))
    s.delete(KEY, a)
    assert s.committed_state() == {KEY: {("ns", "a"): a}}
    assert s.rollback() == 3
    assert s.objects(KEY) == [a] and s.rv == 1 and s.pending_rv() is None
    assert s.create(KEY, obj("c"))["metadata"]["resourceVersion"] == "2"
