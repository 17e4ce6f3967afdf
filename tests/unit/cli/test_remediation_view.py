"""The "Remediation" block of ``drahealth status``, history labels and reading the state."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from drahealth.cli._remediation import (
    history_line,
    read_remediation_state,
    remediation_lines,
)
from drahealth.core import RemediationState, history_label, parse_rfc3339, parse_state

D1 = "gpu.example.com/node-1/gpu-1"
T0 = "2030-01-01T00:00:00Z"
NOW = (parse_rfc3339(T0) or 0.0) + 300


def trip(**kw: Any) -> dict[str, Any]:
    return {
        "scope": "cluster", "group": "", "limit": "10%", "max": 8, "count": 8,
        "window": 3600, "since": T0, "resume": "manual", **kw,
    }  # fmt: skip


def test_no_state_no_block() -> None:
    assert remediation_lines(RemediationState(), NOW) == []


def test_closed_breaker() -> None:
    assert remediation_lines(parse_state({}), NOW) == ["Remediation:", "  circuit breaker: closed"]


def test_paused_line_names_the_limit_the_held_taints_and_how_to_resume() -> None:
    held = [{"device": D1, "effect": "NoExecute", "rule": "xid", "since": T0, "reason": "r"}] * 42
    state = parse_state({"breaker": {"tripped": [trip()], "held": held}})
    lines = remediation_lines(state, NOW)
    assert lines[1] == (
        "  PAUSED: cluster limit 10% = 8 devices reached (8 within 1h) at "
        "2030-01-01T00:00:00Z (5m ago); 42 taints held; run `drahealth resume`"
    )
    assert lines[2] == "  held taints (42), not written:"
    assert lines[3] == f"    {D1} NoExecute (rule xid) since 2030-01-01T00:00:00Z (5m ago): r"
    assert lines[-1] == "    ... and 22 more held taints (-o json lists them)"
    assert len(lines) == 3 + 20 + 1


def test_scoped_and_auto_resuming_limits() -> None:
    state = parse_state(
        {
            "breaker": {
                "tripped": [
                    trip(scope="pool", group="node-1", limit="5", max=5, count=5, resume="auto"),
                    trip(scope="node", group="node-2", limit="50%", max=None, count=None),
                ]
            }
        }
    )
    first, second = remediation_lines(state, NOW)[1:3]
    assert first.startswith("  PAUSED: pool node-1 limit 5 reached (5 within 1h) at ")
    assert first.endswith(
        "0 taints held; resumes when the count falls under the limit, or run `drahealth resume`"
    )
    assert second.startswith("  PAUSED: node node-2 limit 50% reached at ")


def test_each_section_with_its_hint_and_bounds() -> None:
    needs = {f"gpu.example.com/node-1/gpu-{i}": {"why": "2 failed repairs"} for i in range(30)}
    state = parse_state(
        {
            "needsHuman": needs,
            "holds": {D1: {"until": "2029-01-01T00:00:00Z", "by": "bob"}},
            "repairs": {D1: {"phase": "failed", "attempt": 3, "kind": "webhook", "since": T0}},
        }
    )
    lines = remediation_lines(state, NOW, limit=2)
    assert lines[2] == ("  needs a human (30): fix the device, then run `drahealth clear DEVICE`")
    assert lines[3].startswith("    NEEDS-HUMAN gpu.example.com/node-1/gpu-0 since ")
    assert lines[3].endswith(
        ": 2 failed repairs; clear: drahealth clear gpu.example.com/node-1/gpu-0"
    )
    assert lines[5] == "    ... and 28 more devices (-o json lists them)"
    assert lines[6] == "  operator holds (1): not tainted again until then"
    assert "(expired) by bob" in lines[7]
    assert lines[-1] == (
        f"    REPAIR-FAILED {D1}: failed, attempt 3, webhook, since 2030-01-01T00:00:00Z (5m ago)"
    )


def test_unreadable_times_are_shown_as_written() -> None:
    state = parse_state({"degraded": {D1: {"since": "yesterday", "reason": "ECC"}}})
    assert remediation_lines(state, NOW)[-1] == f"    DEGRADED {D1} since yesterday: ECC"
    state = parse_state({"degraded": {D1: {}}})
    assert remediation_lines(state, NOW)[-1] == f"    DEGRADED {D1} since unknown time: -"


@pytest.mark.parametrize(
    ("action", "label"),
    [
        ("create", "tainted"),
        ("delete", "untainted"),
        ("evict-eviction", "evicted (eviction)"),
        ("needs-human", "needs a human"),
        ("repair-failed", "repair (failed)"),
        ("repair", "repair"),
        ("burn-in-passed", "burn-in (passed)"),
        ("breaker-trip", "circuit breaker (trip)"),
        ("hold", "operator hold"),
        ("something-new", "something-new"),
    ],
)
def test_history_labels(action: str, label: str) -> None:
    assert history_label(action) == label


def test_history_line_says_what_the_controller_holds_now() -> None:
    state = parse_state(
        {
            "needsHuman": {D1: {"since": T0, "why": "3 bad episodes within 24h"}},
            "holds": {D1: {"until": "2031-01-01T00:00:00Z", "by": "alice"}},
        }
    )
    line = history_line(state, D1, NOW)
    assert line is not None
    assert line.startswith("now: NEEDS-HUMAN,HELD: needs a human since 2030-01-01T00:00:00Z")
    assert f"clear with `drahealth clear {D1}`" in line and "held by alice until 2031" in line
    assert history_line(state, "gpu.example.com/node-1/gpu-9", NOW) is None


class FakeClient:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def get(self, *_a: Any, **_kw: Any) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def api_error(code: int) -> ApiError:
    err = ApiError.__new__(ApiError)
    err.status = Status(code=code, message=f"status {code}")
    return err


def test_reading_the_state_missing_forbidden_and_failing() -> None:
    notes: list[str] = []
    assert read_remediation_state(FakeClient(api_error(404)), "ns", notes.append) == (
        RemediationState()
    )
    assert notes == []
    assert not read_remediation_state(FakeClient(api_error(403)), "ns", notes.append).present
    assert notes == [
        "no access to configmap ns/drahealth-remediation-state (status 403): "
        "remediation state not shown"
    ]
    with pytest.raises(ApiError):
        read_remediation_state(FakeClient(api_error(500)), "ns", notes.append)

    class CM:
        data = {"holds": '{"' + D1 + '": {"by": "a"}}'}

    state = read_remediation_state(FakeClient(CM()), "ns", notes.append)
    assert state.present and [h.by for h in state.holds] == ["a"]
