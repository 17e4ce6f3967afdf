"""The operator/controller ConfigMaps' JSON-per-key format: bad values are ignored, by key."""

from __future__ import annotations

import logging

import pytest

from drahealth.remedy._control import MAX_VALUE_BYTES, ControlRequests, decode_values


def test_decode_keeps_json_values() -> None:
    assert decode_values({"a": '{"x": 1}', "b": "[1, 2]"}, "cm") == {"a": {"x": 1}, "b": [1, 2]}


def test_decode_ignores_bad_json_and_names_the_key(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        out = decode_values({"good": "true", "bad": "{not json"}, "cm")
    assert out == {"good": True}
    assert "'bad' is not JSON" in caplog.text


def test_decode_ignores_oversized_values(caplog: pytest.LogCaptureFixture) -> None:
    big = '"' + "x" * MAX_VALUE_BYTES + '"'
    with caplog.at_level(logging.WARNING):
        assert decode_values({"huge": big}, "cm") == {}
    assert "'huge' is over" in caplog.text


def test_decode_of_nothing() -> None:
    assert decode_values(None, "cm") == {}


def test_requests_count_changes_only() -> None:
    r = ControlRequests()
    r.apply("ADDED", {"resume": '"2026-01-01T00:00:00Z"'})
    assert r.generation == 1 and r.get("resume") == "2026-01-01T00:00:00Z"
    r.apply("MODIFIED", {"resume": '"2026-01-01T00:00:00Z"'})
    assert r.generation == 1
    r.apply("DELETED", None)
    assert r.generation == 2 and r.get("resume") is None
