"""HealthStore: log round trip, O(changed) appends, fsync, torn tails, quarantine of
corrupt files, compaction, a real SIGKILL test and a property test against a model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drahealth.core import DeviceKey, Health
from drahealth.core._records import DeviceEntry
from drahealth.node._health_store import HealthStore, HealthStoreError

D = "gpu.example.com"
HEADER = b'{"format": "drahealth-health-log", "version": 2}\n'


def entry(
    device: str,
    health: Health = Health.HEALTHY,
    message: str = "",
    driver: str = D,
    timeout: float = 30.0,
) -> DeviceEntry:
    return DeviceEntry(driver, "pool", device, health, message, timeout, 123.0, 1.7e9, 1.6e9)


def loaded(e: DeviceEntry) -> DeviceEntry:
    """What open() gives back for a stored entry: last_seen is re-based later."""
    return DeviceEntry(
        e.driver,
        e.pool,
        e.device,
        e.health,
        e.message,
        e.timeout,
        0.0,
        e.last_seen_wall,
        e.changed_wall,
    )


def record_line(record: dict[str, object]) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def set_record(device: str, **overrides: object) -> dict[str, object]:
    record: dict[str, object] = {
        "op": "set",
        "driver": D,
        "pool": "pool",
        "device": device,
        "health": "Healthy",
        "message": "",
        "timeout": 30.0,
        "seen": 1.0,
        "changed": 2.0,
    }
    record.update(overrides)
    return record


def open_store(path: Path, **kwargs: object) -> tuple[HealthStore, list[DeviceEntry], str | None]:
    return HealthStore.open(str(path), **kwargs)  # type: ignore[arg-type]


# -- round trip and format ----------------------------------------------------------


def test_missing_file_starts_empty_log_with_header(tmp_path: Path) -> None:
    path = tmp_path / "health.log"
    store, entries, problem = open_store(path)
    store.close()
    assert (entries, problem) == ([], None)
    assert path.read_bytes() == HEADER


def test_round_trip_last_record_wins_and_drop(tmp_path: Path) -> None:
    path = tmp_path / "health.log"
    with open_store(path)[0] as store:
        store.append([entry("a"), entry("b", Health.UNHEALTHY, "ECC — uncorrectable")])
        store.append([entry("a", Health.UNKNOWN, "gone", timeout=7.5)])
        store.append([entry("z", driver="nic.example.com")])
        store.append([entry("y", driver="other.example.com")])
        store.drop_driver("nic.example.com")
        assert store.records_written == 6
    store, entries, problem = open_store(path)
    store.close()
    assert problem is None
    assert entries == [
        loaded(entry("a", Health.UNKNOWN, "gone", timeout=7.5)),
        loaded(entry("b", Health.UNHEALTHY, "ECC — uncorrectable")),
        loaded(entry("y", driver="other.example.com")),
    ]


def test_record_format_is_crc_space_compact_json(tmp_path: Path) -> None:
    path = tmp_path / "health.log"
    with open_store(path)[0] as store:
        store.append([entry("a", Health.UNHEALTHY, "é")])
        store.drop_driver(D)
    lines = path.read_bytes().split(b"\n")
    assert lines[0] + b"\n" == HEADER
    crc, _, body = lines[1].partition(b" ")
    assert crc == b"%08x" % zlib.crc32(body)
    assert json.loads(body) == {
        "op": "set",
        "driver": D,
        "pool": "pool",
        "device": "a",
        "health": "Unhealthy",
        "message": "é",
        "timeout": 30.0,
        "seen": 1.7e9,
        "changed": 1.6e9,
    }
    assert "é" in body.decode()  # UTF-8, not \\u escapes
    assert lines[2] == record_line({"op": "drop", "driver": D}).rstrip(b"\n")
    assert lines[3] == b""


def test_append_is_o_changed(tmp_path: Path) -> None:
    path = tmp_path / "health.log"
    store, _, _ = open_store(path, min_compact_records=100_000)
    store.append([entry(f"dev-{i}") for i in range(10_000)])
    before_records, before_bytes = store.records_written, store.bytes_written
    store.append([entry("dev-42", Health.UNHEALTHY, "xid 79")])
    assert store.records_written - before_records == 1
    one = store.bytes_written - before_bytes
    assert one < 300
    assert path.stat().st_size == len(HEADER) + before_bytes + one
    store.close()


def test_empty_append_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _, _ = open_store(tmp_path / "health.log")
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd))
    store.append([])
    assert (store.records_written, store.bytes_written, calls) == (0, 0, [])
    store.close()


def test_every_append_and_drop_is_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _, _ = open_store(tmp_path / "health.log")
    real_fsync = os.fsync
    calls: list[int] = []

    def counting(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting)
    store.append([entry("a"), entry("b")])
    assert len(calls) == 1  # one write, one fsync for the whole batch
    store.drop_driver(D)
    assert len(calls) == 2
    store.compact([entry("c")])
    assert len(calls) == 4  # the temp file and the directory
    store.close()


def test_malformed_entry_is_refused_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "health.log"
    store, _, _ = open_store(path)
    bad = [
        DeviceEntry("", "pool", "a", Health.HEALTHY, "", 30.0, 0.0, 0.0, 0.0),
        DeviceEntry(D, "pool", "a", Health.HEALTHY, "", 0.0, 0.0, 0.0, 0.0),
        DeviceEntry(D, "pool", "a", Health.HEALTHY, "", 30.0, 0.0, float("nan"), 0.0),
        DeviceEntry(D, "pool", "a", "Sick", "", 30.0, 0.0, 0.0, 0.0),  # type: ignore[arg-type]
    ]
    for e in bad:
        with pytest.raises(ValueError, match="cannot store"):
            store.append([entry("ok"), e])
    with pytest.raises(ValueError, match="driver name"):
        store.drop_driver("")
    assert store.records_written == 0
    assert path.read_bytes() == HEADER
    store.close()


def test_closed_store_refuses_writes(tmp_path: Path) -> None:
    store, _, _ = open_store(tmp_path / "health.log")
    store.close()
    store.close()
    with pytest.raises(HealthStoreError, match="closed"):
        store.append([entry("a")])


def test_unwritable_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(HealthStoreError, match="cannot create"):
        open_store(tmp_path / "missing-dir" / "health.log")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"compact_factor": 0}, "compact_factor"), ({"min_compact_records": -1}, "min_compact")],
)
def test_open_validates_arguments(tmp_path: Path, kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        open_store(tmp_path / "health.log", **kwargs)


# -- crash safety: torn tails ------------------------------------------------------


def write_log(path: Path, *lines: bytes) -> None:
    path.write_bytes(HEADER + b"".join(lines))


def test_torn_tail_without_newline_is_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "health.log"
    good = record_line(set_record("a"))
    torn = record_line(set_record("b"))[:-20]
    write_log(path, good, torn)
    store, entries, problem = open_store(path)
    assert problem is None
    assert [e.device for e in entries] == ["a"]
    assert store.torn_bytes == len(torn)
    assert path.read_bytes() == HEADER + good
    store.append([entry("c")])  # appends after the good record, not after garbage
    store.close()
    assert [e.device for e in open_store(path)[1]] == ["a", "c"]


def test_bad_checksum_on_last_line_is_a_torn_append(tmp_path: Path) -> None:
    path = tmp_path / "health.log"
    good = record_line(set_record("a"))
    last = bytearray(record_line(set_record("b", health="Unhealthy")))
    last[20] ^= 0x01
    write_log(path, good, bytes(last))
    store, entries, problem = open_store(path)
    store.close()
    assert problem is None
    assert [(e.device, e.health) for e in entries] == [("a", Health.HEALTHY)]
    assert path.read_bytes() == HEADER + good


def test_truncation_at_every_offset_of_the_last_append_gives_old_or_new(tmp_path: Path) -> None:
    path = tmp_path / "health.log"
    with open_store(path)[0] as store:
        store.append([entry("a"), entry("b", Health.UNHEALTHY)])
    before = path.read_bytes()
    with open_store(path)[0] as store:
        store.append([entry("a", Health.UNHEALTHY, "x"), entry("c")])
    after = path.read_bytes()
    old_state = [loaded(entry("a")), loaded(entry("b", Health.UNHEALTHY))]
    new_state = [
        loaded(entry("a", Health.UNHEALTHY, "x")),
        loaded(entry("b", Health.UNHEALTHY)),
        loaded(entry("c")),
    ]
    mid_state = [loaded(entry("a", Health.UNHEALTHY, "x")), loaded(entry("b", Health.UNHEALTHY))]
    for cut in range(len(before), len(after) + 1):
        path.write_bytes(after[:cut])
        store, entries, problem = open_store(path)
        store.close()
        assert problem is None, cut
        assert entries in (old_state, mid_state, new_state), cut
        if cut == len(after):
            assert entries == new_state
    assert not list(tmp_path.glob("*.corrupt-*"))


# -- corrupt files are quarantined -------------------------------------------------


def quarantined(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("health.log.corrupt-*"))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"", "the file is empty (no header)", id="empty-file"),
        pytest.param(
            b'{"format": "drahealth-health-log"', "line 1: header has no line end", id="torn-header"
        ),
        pytest.param(b"\x00\xff garbage \x13\n", "line 1: header is not valid JSON", id="garbage"),
        pytest.param(
            b'{"format": "something-else", "version": 1}\n',
            "line 1: not a drahealth-health-log header",
            id="bad-header",
        ),
        pytest.param(
            b"[1, 2]\n", "line 1: not a drahealth-health-log header", id="header-not-object"
        ),
        pytest.param(
            b'{"format": "drahealth-health-log", "version": 3}\n',
            "line 1: unknown version 3 (this build reads versions 1, 2)",
            id="future-version",
        ),
        pytest.param(
            HEADER
            + b"0badc0de "
            + json.dumps(set_record("a")).encode()
            + b"\n"
            + record_line(set_record("b")),
            "line 2: checksum mismatch (stored 0badc0de, computed",
            id="bad-checksum-middle",
        ),
        pytest.param(
            HEADER + b"not a record\n" + record_line(set_record("b")),
            "line 2: not a '<crc32> <json>' record line",
            id="bad-line-middle",
        ),
        pytest.param(
            HEADER + b"0BADC0DE {}\n" + record_line(set_record("b")),
            "line 2: checksum b'0BADC0DE' is not 8 lowercase hex digits",
            id="uppercase-crc",
        ),
        pytest.param(
            HEADER
            + record_line(set_record("a"))
            + b"%08x {nope\n" % zlib.crc32(b"{nope")
            + record_line(set_record("b")),
            "line 3: record is not valid JSON",
            id="bad-json-middle",
        ),
        pytest.param(
            HEADER + record_line(set_record("a", health="Sick")),
            "line 2: field 'health' must be one of ['Healthy', 'Unhealthy', 'Unknown'], got 'Sick'",
            id="unknown-health",
        ),
        pytest.param(
            HEADER + record_line(set_record("a", timeout="30")),
            "line 2: field 'timeout' must be a positive number, got '30'",
            id="timeout-type",
        ),
        pytest.param(
            HEADER + record_line(set_record("a", seen=True)),
            "line 2: field 'seen' must be a finite number, got True",
            id="bool-time",
        ),
        pytest.param(
            HEADER + record_line(set_record("a", pool="")),
            "line 2: field 'pool' must be a non-empty string, got ''",
            id="empty-pool",
        ),
        pytest.param(
            HEADER + record_line(set_record("a", message=5)),
            "line 2: field 'message' must be a string, got 5",
            id="message-type",
        ),
        pytest.param(
            HEADER + record_line({**set_record("a"), "extra": 1}),
            "line 2: set record has unknown fields ['extra'] / missing fields []",
            id="unknown-field",
        ),
        pytest.param(
            HEADER + record_line({"op": "drop"}),
            "line 2: field 'driver' must be a non-empty string, got None",
            id="drop-without-driver",
        ),
        pytest.param(
            HEADER + record_line({"op": "rename", "driver": D}),
            "line 2: unknown op 'rename' (expected 'set', 'forget' or 'drop')",
            id="unknown-op",
        ),
        pytest.param(
            HEADER + record_line([1, 2]),  # type: ignore[arg-type]
            "line 2: record is a JSON list, not an object",
            id="record-not-object",
        ),
    ],
)
def test_corrupt_file_is_quarantined_and_reported(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "health.log"
    path.write_bytes(content)
    store, entries, problem = open_store(path)
    assert entries == []
    assert problem is not None
    assert problem.startswith(f"health store {path}: {expected}"), problem
    [aside] = quarantined(tmp_path)
    assert aside.read_bytes() == content  # nothing lost
    assert str(aside) in problem and "started an empty log" in problem
    assert path.read_bytes() == HEADER  # a fresh log, ready for appends
    store.append([entry("a")])
    store.close()
    assert [e.device for e in open_store(path)[1]] == ["a"]


def test_second_quarantine_in_same_second_gets_a_free_name(tmp_path: Path) -> None:
    path = tmp_path / "health.log"
    for content in (b"one", b"two"):
        path.write_bytes(content)
        open_store(path)[0].close()
    asides = quarantined(tmp_path)
    assert sorted(p.read_bytes() for p in asides) == [b"one", b"two"]


# -- compaction --------------------------------------------------------------------


def test_needs_compaction_threshold(tmp_path: Path) -> None:
    store, _, _ = open_store(tmp_path / "health.log", compact_factor=2.0, min_compact_records=3)
    store.append([entry("a")] * 7)  # 7 records, 1 live device
    assert store.record_count == 7
    assert not store.needs_compaction(2)  # 7 > 2*2+3 is false
    assert store.needs_compaction(1)  # 7 > 5
    store.close()


def test_compaction_preserves_state_and_shrinks_file(tmp_path: Path) -> None:
    path = tmp_path / "health.log"
    store, _, _ = open_store(path)
    for i in range(200):
        store.append([entry(f"d{i % 5}", Health.UNHEALTHY if i % 2 else Health.HEALTHY, str(i))])
    store.drop_driver("never.example.com")
    store.close()
    store, live, _ = open_store(path)
    big = path.stat().st_size
    assert store.record_count == 201
    store.compact(live)
    assert store.compactions == 1
    assert store.record_count == 5
    assert path.stat().st_size < big / 20
    store.append([entry("d0", Health.UNKNOWN)])  # appends go to the new file
    store.close()
    _, again, problem = open_store(path)
    assert problem is None
    expected = [entry("d0", Health.UNKNOWN), *live[1:]]
    assert again == [loaded(e) for e in expected]
    assert [p.name for p in tmp_path.iterdir()] == ["health.log"]  # no temp file left


def test_compaction_of_nothing_leaves_header_only(tmp_path: Path) -> None:
    path = tmp_path / "health.log"
    store, _, _ = open_store(path)
    store.append([entry("a")])
    store.compact([])
    store.close()
    assert path.read_bytes() == HEADER


# -- real crash --------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    from drahealth.core import Health
    from drahealth.core._records import DeviceEntry
    from drahealth.node._health_store import HealthStore

    store, _, _ = HealthStore.open(sys.argv[1])
    i = 0
    while True:
        batch = [
            DeviceEntry("gpu.example.com", "pool", f"dev-{i}-{j}", Health.UNHEALTHY,
                        "x" * (i % 50), 30.0, 0.0, 1.0, 2.0)
            for j in range(3)
        ]
        store.append(batch)
        i += 1
        print(i, flush=True)
    """
)


def test_sigkill_loses_no_acknowledged_append() -> None:
    directory = tempfile.mkdtemp(dir="/tmp", prefix="dh-store-")
    try:
        path = os.path.join(directory, "health.log")
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, path], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        acked = 0
        for line in child.stdout:
            acked = int(line)
            if acked >= 150:
                break
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate(timeout=30)
        for line in rest.split():
            acked = int(line)
        assert child.returncode == -signal.SIGKILL
        store, entries, problem = HealthStore.open(path)
        store.close()
        assert problem is None
        devices = {e.device for e in entries}
        missing = [
            f"dev-{i}-{j}" for i in range(acked) for j in range(3) if f"dev-{i}-{j}" not in devices
        ]
        assert missing == []
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- property test -----------------------------------------------------------------

names = st.sampled_from(["a", "b", "c"])
drivers = st.sampled_from(["d1.example.com", "d2.example.com"])
store_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.lists(
                st.builds(
                    lambda drv, dev, h, m, t: DeviceEntry(drv, "p", dev, h, m, t, 0.0, 1.5, 2.5),
                    drivers,
                    names,
                    st.sampled_from(list(Health)),
                    st.text(max_size=5),
                    st.sampled_from([1.0, 30.0, 0.25]),
                ),
                max_size=4,
            ),
        ),
        st.tuples(st.just("drop"), drivers),
        st.tuples(st.just("compact")),
        st.tuples(st.just("reopen")),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(store_ops)
def test_reopen_matches_in_memory_model(program: list[tuple[object, ...]]) -> None:
    directory = tempfile.mkdtemp(dir="/tmp", prefix="dh-prop-")
    try:
        path = os.path.join(directory, "health.log")
        model: dict[DeviceKey, DeviceEntry] = {}
        store, _, _ = HealthStore.open(path)
        for op in program:
            if op[0] == "append":
                batch = op[1]
                assert isinstance(batch, list)
                store.append(batch)
                model.update((e.key, e) for e in batch)
            elif op[0] == "drop":
                store.drop_driver(str(op[1]))
                model = {k: v for k, v in model.items() if k.driver != op[1]}
            elif op[0] == "compact":
                store.compact(list(model.values()))
            else:
                store.close()
                store, entries, problem = HealthStore.open(path)
                assert problem is None
                assert entries == [model[k] for k in sorted(model)]
        store.close()
        _, entries, problem = HealthStore.open(path)
        assert problem is None
        assert entries == [model[k] for k in sorted(model)]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_forget_removes_one_device_and_a_version_1_log_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "health.log"
    with HealthStore.open(str(path))[0] as store:
        store.append([entry("gpu-0"), entry("gpu-1", Health.UNHEALTHY)])
        store.append([], forget=[DeviceKey(D, "pool", "gpu-0")])
    reopened, entries, problem = HealthStore.open(str(path))
    reopened.close()
    assert problem is None and [e.device for e in entries] == ["gpu-1"]
    # a version 1 log (no forget records) is read and rewritten as version 2
    v1 = b'{"format": "drahealth-health-log", "version": 1}\n' + record_line(set_record("gpu-1"))
    path.write_bytes(v1)
    upgraded, entries, problem = HealthStore.open(str(path))
    upgraded.close()
    assert problem is None and [e.device for e in entries] == ["gpu-1"]
    assert path.read_bytes().startswith(HEADER)
