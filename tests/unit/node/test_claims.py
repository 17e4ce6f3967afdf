"""ClaimTracker: reverse index, release/unprepare/tombstones, checkpoint round trip and
corrupt-file handling."""

from __future__ import annotations

import json
import os
from pathlib import Path

from drahealth.core import DeviceKey
from drahealth.core._records import ClaimInfo, PreparedDeviceInfo
from drahealth.node._claims import CLAIMS_FILE, ClaimTracker

D = "gpu.example.com"


def claim(name: str, *devices: str, uid: str | None = None) -> ClaimInfo:
    return ClaimInfo(
        "default",
        name,
        uid or f"uid-{name}",
        tuple(PreparedDeviceInfo(D, "node-1", d, ("gpus",), (f"{D}/gpu={d}",)) for d in devices),
    )


def key(device: str) -> DeviceKey:
    return DeviceKey(D, "node-1", device)


def test_reverse_index_maps_devices_to_every_sharing_pod(tmp_path: Path) -> None:
    t = ClaimTracker(str(tmp_path))
    t.add(claim("a", "gpu-0", "gpu-1"), "pod-1")
    t.add(claim("a", "gpu-0", "gpu-1"), "pod-2")  # shared claim
    t.add(claim("b", "gpu-2"), "pod-3")
    assert t.pods_for([key("gpu-1")]) == {"pod-1", "pod-2"}
    assert t.pods_for([key("gpu-2"), key("gpu-9")]) == {"pod-3"}
    assert t.lookup("default", "a") == claim("a", "gpu-0", "gpu-1")
    assert t.lookup("default", "zzz") is None
    assert [c.info.name for c in t.claims_of_pod("pod-2")] == ["a"]


def test_release_unprepare_keeps_a_tombstone_for_post_mortem_health(tmp_path: Path) -> None:
    t = ClaimTracker(str(tmp_path))
    t.add(claim("a", "gpu-0"), "pod-1")
    t.add(claim("a", "gpu-0"), "pod-2")
    assert t.release("uid-a", "pod-1") is False  # pod-2 still needs it
    assert t.release("uid-a", "pod-2") is True
    t.unprepared("uid-a")
    tracked = t.get("uid-a")
    assert tracked is not None and tracked.tombstone
    # a report after both pods ended still finds them, and the builder still finds the claim
    assert t.pods_for([key("gpu-0")]) == {"pod-1", "pod-2"}
    assert t.lookup("default", "a") is not None
    assert t.claims_of_pod("pod-1") == []
    t.forget_pod("pod-1")
    t.forget_pod("pod-2")  # both deleted from the API: the tombstone goes
    assert t.get("uid-a") is None and t.pods_for([key("gpu-0")]) == set()


def test_tombstones_are_bounded_fifo(tmp_path: Path) -> None:
    t = ClaimTracker(str(tmp_path), max_tombstones=2)
    for i in range(4):
        t.add(claim(f"c{i}", f"gpu-{i}"), f"pod-{i}")
        t.release(f"uid-c{i}", f"pod-{i}")
        t.unprepared(f"uid-c{i}")
    assert [c.info.name for c in t.claims(tombstones=True)] == ["c2", "c3"]
    assert t.devices() == {key("gpu-2"), key("gpu-3")}


def test_reprepare_after_tombstone_is_live_again(tmp_path: Path) -> None:
    t = ClaimTracker(str(tmp_path))
    t.add(claim("a", "gpu-0"), "pod-1")
    t.release("uid-a", "pod-1")
    t.unprepared("uid-a")
    t.add(claim("a", "gpu-3"), "pod-9")  # same claim uid, new devices
    tracked = t.get("uid-a")
    assert tracked is not None and not tracked.tombstone
    assert t.pods_for([key("gpu-0")]) == set()
    assert t.pods_for([key("gpu-3")]) == {"pod-1", "pod-9"}  # pod-1 kept as ended


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    t = ClaimTracker(str(tmp_path))
    t.add(claim("a", "gpu-0"), "pod-1")
    t.add(claim("b", "gpu-1"), "pod-2")
    t.release("uid-b", "pod-2")
    t.unprepared("uid-b")
    again = ClaimTracker(str(tmp_path))
    assert again.load() is None
    assert {c.info.uid: (c.live, c.ended, c.tombstone) for c in again.claims(tombstones=True)} == {
        "uid-a": ({"pod-1"}, set(), False),
        "uid-b": (set(), {"pod-2"}, True),
    }
    assert again.pods_for([key("gpu-1")]) == {"pod-2"}


def test_corrupt_checkpoint_is_quarantined_with_a_clear_problem(tmp_path: Path) -> None:
    t = ClaimTracker(str(tmp_path))
    t.add(claim("a", "gpu-0"), "pod-1")
    path = tmp_path / CLAIMS_FILE
    doc = json.loads(path.read_text())
    doc["claims"][0]["name"] = "tampered"
    path.write_text(json.dumps(doc))
    again = ClaimTracker(str(tmp_path))
    problem = again.load()
    assert problem is not None and "checksum mismatch" in problem and str(path) in problem
    assert again.claims(tombstones=True) == []
    assert not path.exists()
    assert any(n.startswith(CLAIMS_FILE + ".corrupt-") for n in os.listdir(tmp_path))


def test_malformed_entries_name_the_entry(tmp_path: Path) -> None:
    from drahealth._durable import dump_envelope

    path = tmp_path / CLAIMS_FILE
    path.write_bytes(dump_envelope(1, "claims", [{"namespace": "default", "name": "a"}]))
    problem = ClaimTracker(str(tmp_path)).load()
    assert problem is not None and "claims[0]: uid is missing" in problem
    path.write_bytes(b"\x00garbage")
    problem = ClaimTracker(str(tmp_path)).load()
    assert problem is not None and "not valid JSON" in problem


def test_without_state_dir_nothing_is_written() -> None:
    t = ClaimTracker(None)
    t.add(claim("a", "gpu-0"), "pod-1")
    assert t.load() is None and t.path is None
