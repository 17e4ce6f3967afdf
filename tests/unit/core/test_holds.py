"""The ownership filter's sans-I/O part: holds, their expiry and precedence, opt-out,
exclusions."""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.core import (
    DeviceFacts,
    DeviceKey,
    Exclude,
    HoldBook,
    Want,
    filter_wants,
    format_time,
    frozen_reason,
    parse_time,
)

T0 = 1_800_000_000.0
GPU0 = DeviceKey("gpu.example.com", "node-1", "gpu-0")
GPU1 = DeviceKey("gpu.example.com", "node-2", "gpu-1")


def hold(until: float, by: str = "alice", reason: str = "RMA check") -> dict[str, Any]:
    return {"until": format_time(until), "by": by, "reason": reason}


def facts(key: DeviceKey) -> DeviceFacts:
    return DeviceFacts(key.driver, key.pool, key.device, key.pool)


def want(rule: str = "xid") -> Want:
    return Want("NoSchedule", "drahealth.io/unhealthy", "unhealthy", rule, "Unhealthy: XID 79")


def test_times_round_trip_with_milliseconds() -> None:
    assert format_time(T0) == "2027-01-15T08:00:00Z"
    assert parse_time(format_time(T0 + 2.5)) == T0 + 2.5
    assert parse_time("2027-01-15T08:00:00") == T0  # naive is UTC
    assert parse_time("yesterday") is None and parse_time(3) is None


def test_an_operator_hold_holds_until_it_ends_then_says_so() -> None:
    book = HoldBook()
    assert book.apply_control({str(GPU0): hold(T0 + 2)}, T0) == []
    h = book.active(GPU0, T0 + 1)
    assert h is not None and (h.by, h.reason, h.source) == ("alice", "RMA check", "operator")
    assert book.next_end(T0 + 1) == T0 + 2
    began, ended = book.changes(T0 + 1)
    assert [k for k, _ in began] == [GPU0] and ended == []
    assert book.changes(T0 + 1.5) == ([], [])  # said once
    assert book.active(GPU0, T0 + 2) is None  # the end is exclusive
    began, ended = book.changes(T0 + 2)
    assert began == [] and [k for k, _ in ended] == [GPU0]
    assert book.state(T0 + 2) == {}
    assert book.next_end(T0 + 2) is None


def test_state_lists_active_holds_in_the_shared_shape() -> None:
    book = HoldBook()
    book.apply_control({str(GPU0): hold(T0 + 60)}, T0)
    entry = book.state(T0)[str(GPU0)]
    assert entry["until"] == format_time(T0 + 60)
    assert (entry["by"], entry["reason"]) == ("alice", "RMA check")


def test_bad_control_entries_are_skipped_with_a_warning_naming_them() -> None:
    book = HoldBook()
    warnings = book.apply_control(
        {"gpu-0": hold(T0 + 60), str(GPU1): {"until": "soon"}, str(GPU0): hold(T0 + 60)}, T0
    )
    assert any("'gpu-0' is not DRIVER/POOL/DEVICE" in w for w in warnings)
    assert any(f"{GPU1}: 'until' must be an RFC 3339 time" in w for w in warnings)
    assert book.active(GPU0, T0) is not None and book.active(GPU1, T0) is None
    assert book.apply_control(["not", "a", "map"], T0) != []
    assert book.active(GPU0, T0) is None


def test_a_foreign_delete_holds_for_manual_untaint_hold() -> None:
    book = HoldBook(manual_untaint_hold=1800)
    h = book.rule_deleted(GPU0, "dh-gpu-0-x", T0)
    assert h is not None and h.source == "rule-deleted" and h.until == T0 + 1800
    assert "dh-gpu-0-x" in h.reason
    assert book.active(GPU0, T0 + 1799) is not None
    assert book.active(GPU0, T0 + 1800) is None
    assert book.rule_deleted(GPU0, "again", T0 + 1) is None  # already held


def test_manual_untaint_hold_zero_re_taints_at_once() -> None:
    book = HoldBook(manual_untaint_hold=0)
    assert book.rule_deleted(GPU0, "dh-gpu-0-x", T0) is None
    assert book.active(GPU0, T0) is None


def test_the_hold_learned_of_last_decides_so_a_release_ends_a_deletion_hold() -> None:
    book = HoldBook(manual_untaint_hold=1800)
    assert book.rule_deleted(GPU0, "dh", T0) is not None
    # drahealth untaint --release: an entry that ends now, learned of after the deletion
    book.apply_control({str(GPU0): hold(T0 + 5, reason="released")}, T0 + 5)
    assert book.active(GPU0, T0 + 5) is None
    # a later kubectl delete (past the attribution window) starts a new hold
    assert book.rule_deleted(GPU0, "dh", T0 + 100) is not None
    assert book.active(GPU0, T0 + 101) is not None


def test_a_delete_right_after_the_cli_wrote_its_hold_is_that_commands_own() -> None:
    book = HoldBook(manual_untaint_hold=1800)
    book.apply_control({str(GPU0): hold(T0, reason="--hold 0")}, T0)  # ends at once
    assert book.rule_deleted(GPU0, "dh", T0 + 1) is None  # no 30 min hold on top
    assert book.active(GPU0, T0 + 1) is None
    # the other order: the deletion seen first, then the command's entry
    book2 = HoldBook(manual_untaint_hold=1800)
    assert book2.rule_deleted(GPU0, "dh", T0) is not None
    book2.apply_control({str(GPU0): hold(T0 + 2)}, T0 + 0.1)
    assert book2.active(GPU0, T0 + 1) is not None
    assert book2.active(GPU0, T0 + 2) is None  # the command's 2 s, not 30 min


def test_an_unchanged_control_entry_keeps_when_it_was_learned_of() -> None:
    book = HoldBook(manual_untaint_hold=1800)
    control = {str(GPU0): hold(T0 + 5)}
    book.apply_control(control, T0)
    book.rule_deleted(GPU0, "dh", T0 + 200)  # long after that hold ended
    book.apply_control(dict(control), T0 + 201)  # the same value again: no news
    assert book.active(GPU0, T0 + 202) is not None  # the deletion's hold still decides


def test_restore_brings_deletion_holds_back_and_keeps_operator_holds() -> None:
    book = HoldBook(manual_untaint_hold=1800)
    book.rule_deleted(GPU0, "dh", T0)
    book.apply_control({str(GPU1): hold(T0 + 60)}, T0)
    state = book.state(T0 + 1)
    assert state[str(GPU0)]["source"] == "rule-deleted"
    # a new leader: the same control key, the state the last one wrote
    again = HoldBook(manual_untaint_hold=1800)
    assert again.restore(state, {str(GPU1): hold(T0 + 60)}, T0 + 10) == []
    assert again.active(GPU0, T0 + 10) is not None
    assert again.active(GPU1, T0 + 10) is not None
    assert again.changes(T0 + 10) == ([], [])  # not announced again
    # an operator entry that had already ended does not end the deletion's hold
    third = HoldBook(manual_untaint_hold=1800)
    third.restore(state, {str(GPU0): hold(T0 - 100)}, T0 + 10)
    assert third.active(GPU0, T0 + 10) is not None


def test_exclude_matches_names_and_globs() -> None:
    ex = Exclude(drivers=("fpga.example.com",), pools=("rack-7-*",), nodes=("node-9",))
    assert ex.reason(DeviceFacts("fpga.example.com", "p", "d", "n")) is not None
    why = ex.reason(DeviceFacts("gpu.example.com", "rack-7-a", "d", "n"))
    assert why == "the policy's exclude.pools names 'rack-7-*'"
    assert ex.reason(DeviceFacts("gpu.example.com", "p", "d", "node-9")) is not None
    assert ex.reason(DeviceFacts("gpu.example.com", "rack-8", "d", "node-1")) is None
    assert not Exclude() and ex


def test_frozen_reason_names_the_opt_out_label() -> None:
    why = frozen_reason(facts(GPU0), {"node-1"}, Exclude())
    assert why == "node node-1 has the label drahealth.io/remediation=disabled"
    assert frozen_reason(facts(GPU1), {"node-1"}, Exclude()) is None


def test_filter_splits_wants_frozen_before_held() -> None:
    book = HoldBook()
    book.apply_control({str(GPU0): hold(T0 + 60), str(GPU1): hold(T0 + 60)}, T0)
    gpu2 = DeviceKey("gpu.example.com", "node-3", "gpu-2")
    wants = {GPU0: want(), GPU1: want(), gpu2: want()}
    verdict = filter_wants(wants, facts, book, {"node-2"}, Exclude(), T0)
    assert list(verdict.act) == [gpu2]
    assert list(verdict.held) == [GPU0]
    assert verdict.frozen == {GPU1: "node node-2 has the label drahealth.io/remediation=disabled"}
    # the hold ends: the policy applies again
    verdict = filter_wants(wants, facts, book, set(), Exclude(), T0 + 60)
    assert set(verdict.act) == {GPU0, GPU1, gpu2}


@pytest.mark.parametrize("count", [10_001])
def test_deletion_holds_are_bounded(count: int) -> None:
    book = HoldBook(manual_untaint_hold=60)
    for i in range(count):
        book.rule_deleted(DeviceKey("d", "p", f"g{i}"), "r", T0 + i * 0.001)
    assert len(book.state(T0 + 10)) == 10_000


def test_explain_says_whether_the_policy_excludes_the_device() -> None:
    from drahealth.core import Health, Match, Policy, Rule, explain

    policy = Policy((Rule("a", Match()),), exclude=Exclude(pools=("rack-7-*",)))
    out = explain(policy, DeviceFacts("d", "rack-7-a", "g"), Health.UNHEALTHY, "")
    assert out["excluded"] == "the policy's exclude.pools names 'rack-7-*'"
    assert (
        explain(policy, DeviceFacts("d", "rack-8", "g"), Health.UNHEALTHY, "")["excluded"] is None
    )
