"""The views' reading of the controller's state ConfigMap: shapes, tolerance, bounds."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drahealth.core import (
    REMEDIATION_MARKERS,
    RemediationState,
    history_label,
    mentions_device,
    parse_rfc3339,
    parse_state,
    parse_state_data,
)
from drahealth.core._remedy_state import MAX_ENTRIES, MAX_NOTES, MAX_TEXT, MAX_VALUE_BYTES

D1 = "gpu.example.com/node-1/gpu-1"
D2 = "gpu.example.com/node-1/gpu-2"
T0 = "2030-01-01T00:00:00Z"
NOW = parse_rfc3339("2030-01-01T01:00:00Z") or 0.0

FULL = {
    "breaker": {
        "tripped": [
            {
                "scope": "cluster", "group": "", "limit": "10%", "max": 8, "count": 8,
                "window": 3600, "since": T0, "resume": "manual",
            }
        ],
        "held": [
            {"device": D2, "rule": "xid-fatal", "effect": "NoExecute", "since": T0,
             "reason": "Unhealthy: XID 79"}
        ],
        "admitted": [{"opaque": True}],
    },
    "needsHuman": {D1: {"since": T0, "why": "3 bad episodes within 24h", "rule": "xid",
                        "node": "node-1"}},
    "holds": {D2: {"until": "2030-01-01T02:00:00Z", "by": "alice", "reason": "debugging"}},
    "degraded": {D1: {"since": T0, "rule": "ecc", "reason": "Unhealthy: ECC", "node": "node-1"}},
    "burnIn": {D2: {"since": T0, "why": "new device", "node": "node-1"}},
    "repairs": {D1: {"phase": "running", "attempt": 2, "kind": "job", "since": T0,
                     "detail": "job gpu-reset-1"}},
}  # fmt: skip


def data(values: dict[str, object]) -> dict[str, str]:
    return {k: json.dumps(v) for k, v in values.items()}


def test_every_key_is_read_into_records() -> None:
    state = parse_state_data(data(FULL))
    assert state.present and state.paused and not state.notes
    (trip,) = state.tripped
    assert (trip.scope, trip.limit, trip.max, trip.count, trip.window) == (
        "cluster",
        "10%",
        8,
        8,
        3600,
    )
    assert [h.device for h in state.held] == [D2]
    assert state.needs_human[0].why == "3 bad episodes within 24h"
    assert (state.holds[0].by, state.holds[0].expired(NOW)) == ("alice", False)
    assert state.repairs[0].attempt == 2 and state.repairs[0].in_progress
    assert state.devices() == {D1, D2}


def test_markers_most_urgent_first_and_per_device_json() -> None:
    state = parse_state_data(data(FULL))
    assert state.markers(D1, NOW) == ["NEEDS-HUMAN", "REPAIRING", "DEGRADED"]
    assert state.markers(D2, NOW) == ["PAUSED", "HELD", "BURN-IN"]
    assert set(state.markers(D1, NOW)) <= set(REMEDIATION_MARKERS)
    d2 = state.device_state(D2, NOW)
    assert d2["hold"] == {"until": "2030-01-01T02:00:00Z", "by": "alice", "reason": "debugging",
                          "expired": False}  # fmt: skip
    assert d2["breakerHeld"][0]["rule"] == "xid-fatal"
    assert state.device_state("gpu.example.com/node-9/gpu-0", NOW) == {}


def test_an_expired_hold_is_shown_but_not_a_marker() -> None:
    state = parse_state({"holds": {D1: {"until": "2029-12-31T00:00:00Z", "by": "bob"}}})
    assert state.markers(D1, NOW) == []
    assert state.device_state(D1, NOW)["hold"]["expired"] is True


def test_failed_repair_is_its_own_marker() -> None:
    state = parse_state({"repairs": {D1: {"phase": "failed", "attempt": 3}}})
    assert state.markers(D1, NOW) == ["REPAIR-FAILED"]
    assert parse_state({"repairs": {D1: {"phase": "succeeded"}}}).markers(D1, NOW) == []


def test_no_configmap_and_an_empty_one() -> None:
    assert not RemediationState().present
    assert parse_state(None) == RemediationState()
    empty = parse_state_data(None)
    assert empty.present and not empty.paused and not empty.notes
    assert parse_state_data({"breaker": json.dumps({"tripped": [], "held": []})}).paused is False


def test_missing_and_extra_fields_are_tolerated() -> None:
    state = parse_state(
        {
            "breaker": {"tripped": [{"limit": 5, "future": {"x": 1}}]},
            "needsHuman": {D1: {}},
            "other-feature": [1, 2, 3],
        }
    )
    assert not state.notes
    (trip,) = state.tripped
    assert (trip.scope, trip.limit, trip.max, trip.resume) == ("cluster", "5", None, "manual")
    assert state.needs_human[0].since == ""


@pytest.mark.parametrize(
    ("values", "note"),
    [
        ({"needsHuman": "x"}, "needsHuman: expected an object of devices, got a string: skipped"),
        ({"holds": [D1]}, "holds: expected an object of devices, got a list: skipped"),
        ({"breaker": 3}, "breaker: expected an object, got a number: skipped"),
        ({"breaker": {"tripped": {}}}, "breaker.tripped: expected a list, got an object: skipped"),
        ({"burnIn": {"not-a-device": {}}}, "burnIn: 1 entry skipped (not DRIVER/POOL/DEVICE)"),
        ({"degraded": {D1: "bad", D2: 1}}, "degraded: 2 entries skipped (not an object)"),
        (
            {"breaker": {"held": [{"device": "x"}, 7]}},
            "breaker.held: 2 entries skipped (not an object naming a device)",
        ),
    ],
)
def test_wrong_types_are_skipped_with_a_note(values: dict[str, object], note: str) -> None:
    state = parse_state(values)
    assert state.notes == (note,)
    assert state.devices() == set()


def test_bad_numbers_read_as_missing() -> None:
    trips = [
        {"max": True, "count": float("nan"), "window": float("inf")},
        {"max": 2.0, "count": 10**100, "window": "3600"},
    ]
    state = parse_state({"breaker": {"tripped": trips}})
    assert [(t.max, t.count, t.window) for t in state.tripped] == [
        (None, None, None),
        (2, None, None),
    ]


@pytest.mark.parametrize(
    ("text", "note"),
    [
        ("{not json", "needsHuman: not JSON"),
        ("[" * 100_000 + "]" * 100_000, "needsHuman: "),
        ("x" * (MAX_VALUE_BYTES + 1), f"needsHuman: over {MAX_VALUE_BYTES} bytes: skipped"),
    ],
)
def test_raw_values_that_cannot_be_read_are_skipped(text: str, note: str) -> None:
    state = parse_state_data({"needsHuman": text, "holds": json.dumps({D1: {"by": "a"}})})
    assert state.notes[0].startswith(note)
    assert [h.device for h in state.holds] == [D1]  # the other keys are still read


def test_non_string_data_value_is_a_note() -> None:
    assert parse_state_data({"holds": 5}).notes == ("holds: not a string: skipped",)


def test_huge_lists_are_bounded_and_counted() -> None:
    many = {f"gpu.example.com/node-1/gpu-{i}": {"why": "x"} for i in range(MAX_ENTRIES + 500)}
    held = [{"device": D1}] * (MAX_ENTRIES * 3)
    state = parse_state({"needsHuman": many, "breaker": {"held": held, "tripped": []}})
    assert len(state.needs_human) == MAX_ENTRIES
    assert state.total("needsHuman") == MAX_ENTRIES + 500
    assert len(state.held) == MAX_ENTRIES and state.total("breakerHeld") == MAX_ENTRIES * 3
    assert (
        f"needsHuman: {MAX_ENTRIES + 500} devices; showing the first {MAX_ENTRIES}" in state.notes
    )


def test_long_text_is_cut_and_notes_are_bounded() -> None:
    state = parse_state({"needsHuman": {D1: {"why": "w" * 10_000}}})
    assert len(state.needs_human[0].why) == MAX_TEXT
    values = {f"k{i}": None for i in range(5)} | {
        key: "bad" for key in ("needsHuman", "holds", "degraded", "burnIn", "repairs")
    }
    noisy = parse_state(values, notes=[f"n{i}" for i in range(MAX_NOTES)])
    assert len(noisy.notes) == MAX_NOTES + 1
    assert noisy.notes[-1] == "... and 5 more problems"


def test_to_json_round_trips_through_json() -> None:
    state = parse_state_data(data(FULL))
    out = json.loads(json.dumps(state.to_json(), allow_nan=False))
    assert out["paused"] is True
    assert out["needsHuman"][D1]["why"] == "3 bad episodes within 24h"
    assert out["breaker"]["held"][0]["device"] == D2
    assert "admitted" not in out["breaker"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (f"tainted {D1}", True),
        (f"tainted {D1}.", True),
        (f"{D1}: XID 79", True),
        (f"tainted {D1}0", False),
        (f"tainted {D1}-b", False),
        (f"tainted x{D1}", False),
        (f"tainted sub.{D1}", False),
        (f"tainted {D2} and {D1}", True),
        ("", False),
    ],
)
def test_mentions_device_is_a_whole_name(text: str, named: bool) -> None:
    assert mentions_device(text, D1) is named


def test_parse_rfc3339() -> None:
    assert parse_rfc3339("1970-01-01T00:01:00Z") == 60.0
    assert parse_rfc3339("1970-01-01T00:01:00+01:00") == 60.0 - 3600
    assert parse_rfc3339("yesterday") is None
    assert parse_rfc3339("") is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=30), inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["breaker", "needsHuman", "holds", "degraded", "burnIn",
                                        "repairs", "x"]), json_values))  # fmt: skip
def test_any_json_never_raises_and_stays_json(values: dict[str, object]) -> None:
    state = parse_state(values)
    json.dumps(state.to_json(), allow_nan=False)
    for device in state.devices():
        state.markers(device, NOW)
        json.dumps(state.device_state(device, NOW), allow_nan=False)


def test_summary_is_small_whatever_the_number_of_devices() -> None:
    many = {f"gpu.example.com/node-1/gpu-{i}": {"why": "x"} for i in range(3000)}
    state = parse_state({"needsHuman": many, "breaker": FULL["breaker"]})
    summary = state.summary()
    assert summary["paused"] is True and summary["held"] == 1
    assert summary["counts"]["needsHuman"] == 3000
    assert summary["tripped"][0]["limit"] == "10%"
    assert len(json.dumps(summary)) < 2000


def test_held_count_counts_what_the_breaker_did_not_list() -> None:
    held = [{"device": D1}] * 3
    state = parse_state({"breaker": {"tripped": [], "held": held, "heldCount": 450}})
    assert len(state.held) == 3 and state.total("breakerHeld") == 450
    assert state.summary()["held"] == 450
    bad = parse_state({"breaker": {"held": held, "heldCount": "many"}})
    assert bad.total("breakerHeld") == 3


def test_history_labels_of_the_controllers_actions() -> None:
    assert history_label("hold-ended") == "operator hold (ended)"
    assert history_label("repair-succeeded") == "repair (succeeded)"
    assert history_label("opt-out") == "automatic action turned off (node label)"
    assert history_label("node-rollup") == "node condition"
    assert history_label("node") == "node-level action"
