"""Prepared-claims checkpoint: round trip, corruption handling with quarantine, and
crash safety (a writer SIGKILLed at random moments never leaves a torn file)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drahealth._durable import canonical_json
from drahealth.driver._checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    CheckpointDevice,
    ClaimEntry,
    ClaimState,
    canonical_fragment,
)
from drahealth.driver._types import CheckpointError

ENTRIES = {
    "uid-1": ClaimEntry(
        "default",
        "c1",
        ClaimState.PREPARE_COMPLETED,
        (
            CheckpointDevice(
                "node-1", "gpu-0", ("gpus/big",), ("k8s.x/claim=uid-1-gpu-0",), "s1", True
            ),
        ),
    ),
    "uid-2": ClaimEntry("ns", "c2", ClaimState.PREPARE_STARTED, (CheckpointDevice("p", "d"),)),
    "uid-3": ClaimEntry("ns", "ünï", ClaimState.PREPARE_COMPLETED),
}


def _saved(tmp_path: Path) -> Checkpoint:
    cp = Checkpoint(tmp_path / "prepared-claims.json")
    cp.save(ENTRIES)
    return cp


def test_missing_file_is_empty(tmp_path: Path) -> None:
    assert Checkpoint(tmp_path / "nope.json").load() == {}


def test_round_trip_and_format(tmp_path: Path) -> None:
    cp = _saved(tmp_path)
    assert cp.load() == ENTRIES
    doc = json.loads(Path(cp.path).read_text())
    assert doc["version"] == CHECKPOINT_VERSION
    assert doc["checksum"].startswith("sha256:")
    assert doc["claims"]["uid-2"] == {
        "namespace": "ns",
        "name": "c2",
        "state": "PrepareStarted",
        "devices": [
            {
                "pool": "p",
                "device": "d",
                "requests": [],
                "cdi_device_ids": [],
                "share_id": None,
                "admin_access": False,
            }
        ],
    }
    assert oct(os.stat(cp.path).st_mode & 0o777) == "0o600"
    assert sorted(os.listdir(tmp_path)) == ["prepared-claims.json"]  # no temp file left
    cp.save({})
    assert cp.load() == {}


def _corrupt_and_load(cp: Checkpoint, data: bytes) -> CheckpointError:
    Path(cp.path).write_bytes(data)
    with pytest.raises(CheckpointError) as info:
        cp.load()
    err = info.value
    assert cp.path in str(err) and err.path == cp.path
    assert err.quarantined_to is not None and err.quarantined_to in str(err)
    assert os.path.basename(err.quarantined_to).startswith("prepared-claims.json.corrupt-")
    assert Path(err.quarantined_to).read_bytes() == data  # kept for inspection
    assert not os.path.exists(cp.path)
    assert cp.load() == {}  # the caller may go on with an empty checkpoint
    return err


def test_truncated_file_is_quarantined(tmp_path: Path) -> None:
    cp = _saved(tmp_path)
    data = Path(cp.path).read_bytes()
    err = _corrupt_and_load(cp, data[: len(data) // 2])
    assert "not valid JSON" in str(err)


def test_empty_file_is_corrupt(tmp_path: Path) -> None:
    cp = _saved(tmp_path)
    _corrupt_and_load(cp, b"")


def test_flipped_byte_fails_the_checksum(tmp_path: Path) -> None:
    cp = _saved(tmp_path)
    data = bytearray(Path(cp.path).read_bytes())
    i = data.index(b"gpu-0")
    data[i] = ord("G")  # still valid JSON, different content
    err = _corrupt_and_load(cp, bytes(data))
    assert "checksum mismatch" in str(err)


def test_wrong_version_is_refused(tmp_path: Path) -> None:
    cp = _saved(tmp_path)
    doc = json.loads(Path(cp.path).read_text())
    doc["version"] = 2
    err = _corrupt_and_load(cp, json.dumps(doc).encode())
    assert "unknown version 2" in str(err)


def test_bad_entry_shape_names_the_claim(tmp_path: Path) -> None:
    from drahealth._durable import checksum as _checksum

    claims = {"uid-9": {"namespace": "ns", "name": "n", "state": "Bogus", "devices": []}}
    doc = {"version": 1, "checksum": _checksum(claims), "claims": claims}
    cp = Checkpoint(tmp_path / "prepared-claims.json")
    err = _corrupt_and_load(cp, json.dumps(doc).encode())
    assert "claim uid-9" in str(err)


_WRITER = textwrap.dedent(
    """
    import sys
    from drahealth.driver._checkpoint import Checkpoint, CheckpointDevice, ClaimEntry, ClaimState
    cp = Checkpoint(sys.argv[1])
    gen = 0
    while True:
        gen += 1
        n = 50 + gen % 100
        cp.save({
            f"uid-{i}": ClaimEntry("ns", f"gen-{gen}", ClaimState.PREPARE_COMPLETED,
                                   (CheckpointDevice("pool", f"dev-{i}", ("r",)),))
            for i in range(n)
        })
        if gen == 1:
            print("ready", flush=True)
    """
)


@pytest.mark.slow  # 20 child processes (about 8 s); CI's slow step runs it every time
def test_sigkill_during_writes_never_leaves_a_torn_file(tmp_path: Path) -> None:
    rounds = 20
    rng = random.Random(4680)
    procs = []
    for i in range(rounds):
        path = tmp_path / f"cp-{i}.json"
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append((path, proc))
    try:
        for path, proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.0, 0.03))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            assert proc.returncode == -signal.SIGKILL
            claims = Checkpoint(path).load()  # raises on a torn or corrupt file
            gens = {e.name for e in claims.values()}
            assert len(gens) == 1, f"{path}: mixed generations {gens}"
            gen = int(next(iter(gens)).removeprefix("gen-"))
            assert len(claims) == 50 + gen % 100
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def test_encode_reuses_unchanged_entries_and_equals_a_fresh_encoding(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "prepared-claims.json")
    claims = dict(ENTRIES)
    steps = [
        dict(claims),
        {**claims, "uid-2": ClaimEntry("ns", "c2", ClaimState.PREPARE_COMPLETED)},
        {k: v for k, v in claims.items() if k != "uid-1"},
        {**claims, 'uid-\u00e9"x': ClaimEntry("n\u00fc", "q", ClaimState.PREPARE_STARTED)},
        {},
    ]
    for state in steps:
        data = cp.encode(state)
        assert data == Checkpoint(tmp_path / "other.json").encode(state)  # no cache
        assert data.count(b"\n") == 1 and data.endswith(b"\n")  # one line
        cp.write(data)
        assert cp.load() == state
        doc = json.loads(data)
        assert set(doc) == {"version", "checksum", "claims"}
        assert doc["version"] == CHECKPOINT_VERSION


def test_an_indented_file_of_an_earlier_release_still_loads(tmp_path: Path) -> None:
    from drahealth._durable import atomic_write, dump_envelope

    path = tmp_path / "prepared-claims.json"
    body = {uid: ENTRIES[uid].to_json() for uid in sorted(ENTRIES)}
    atomic_write(str(path), dump_envelope(CHECKPOINT_VERSION, "claims", body))
    assert b"\n " in path.read_bytes()  # the indented layout
    assert Checkpoint(path).load() == ENTRIES


_text = st.text(st.characters(codec="utf-8"), max_size=12)  # control chars, quotes, non-ASCII
_device = st.builds(
    CheckpointDevice,
    pool=_text,
    device=_text,
    requests=st.lists(_text, max_size=3).map(tuple),
    cdi_device_ids=st.lists(_text, max_size=3).map(tuple),
    share_id=st.none() | _text,
    admin_access=st.booleans(),
)
_entry = st.builds(
    ClaimEntry,
    namespace=_text,
    name=_text,
    state=st.sampled_from(ClaimState),
    devices=st.lists(_device, max_size=3).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(uid=_text, entry=_entry)
def test_fast_fragment_is_byte_equal_to_the_canonical_json(uid: str, entry: ClaimEntry) -> None:
    # the checksum on load recomputes canonical_json: any difference would make every
    # checkpoint this build writes "corrupt"
    assert canonical_fragment(uid, entry) == canonical_json({uid: entry.to_json()})[1:-1]


@settings(max_examples=50, deadline=None)
@given(claims=st.dictionaries(_text, _entry, max_size=5))
def test_encoded_checkpoints_load_back(
    tmp_path_factory: pytest.TempPathFactory, claims: dict[str, ClaimEntry]
) -> None:
    cp = Checkpoint(tmp_path_factory.mktemp("cp") / "checkpoint.json")
    cp.save(claims)
    assert cp.load() == claims
