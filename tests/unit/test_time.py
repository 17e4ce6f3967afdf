"""Kubernetes timestamps as text: one format for every writer."""

from __future__ import annotations

import datetime as dt
import re

from drahealth._time import now_rfc3339, now_rfc3339_micro, rfc3339, rfc3339_micro

WHEN = dt.datetime(2026, 11, 24, 22, 1, 5, 123456, tzinfo=dt.UTC)


def test_seconds_are_cut_not_rounded() -> None:
    assert rfc3339(WHEN) == "2026-11-24T22:01:05Z"
    assert rfc3339(WHEN.replace(microsecond=999999)) == "2026-11-24T22:01:05Z"


def test_micro_time_keeps_six_digits() -> None:
    assert rfc3339_micro(WHEN) == "2026-11-24T22:01:05.123456Z"
    assert rfc3339_micro(WHEN.replace(microsecond=0)) == "2026-11-24T22:01:05.000000Z"


def test_naive_means_utc_and_aware_is_shown_in_utc() -> None:
    assert rfc3339(WHEN.replace(tzinfo=None)) == "2026-11-24T22:01:05Z"
    plus_two = dt.timezone(dt.timedelta(hours=2))
    assert rfc3339(WHEN.astimezone(plus_two)) == "2026-11-24T22:01:05Z"
    assert rfc3339_micro(WHEN.astimezone(plus_two)) == "2026-11-24T22:01:05.123456Z"


def test_now_forms() -> None:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", now_rfc3339())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", now_rfc3339_micro())
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    parsed = dt.datetime.fromisoformat(now_rfc3339().replace("Z", "+00:00"))
    assert before <= parsed <= dt.datetime.now(dt.UTC)
