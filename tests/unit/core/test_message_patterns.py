"""Policy message patterns: RE2, a bounded message, errors that say why."""

from __future__ import annotations

import re

import pytest

from drahealth.api import HEALTH_MESSAGE_MAX_BYTES
from drahealth.core._policy import Match, MessagePattern, PatternError, match_text


def test_a_short_message_is_matched_whole() -> None:
    assert match_text("XID 79") == "XID 79"


def test_a_long_message_is_cut_to_the_kubelet_limit_in_bytes() -> None:
    cut = match_text("a" * 5_000)
    assert cut == "a" * HEALTH_MESSAGE_MAX_BYTES


def test_a_cut_never_splits_a_character() -> None:
    cut = match_text("é" * 1_000)  # 2 bytes each: 2,000 bytes
    assert len(cut.encode()) <= HEALTH_MESSAGE_MAX_BYTES
    assert cut == "é" * (HEALTH_MESSAGE_MAX_BYTES // 2)


def test_re2_syntax_and_flags_work() -> None:
    assert MessagePattern(r"(?i)^xid (48|79)\b").search("XID 79 at 0x1")
    assert not MessagePattern(r"^XID (48|79)$").search("XID 790")
    assert MessagePattern(r"\pL+ \d{2}").search("gpu ÉCC 12")


def test_a_refused_pattern_says_why() -> None:
    with pytest.raises(PatternError, match="invalid perl operator"):
        MessagePattern(r"XID(?!79)")


def test_a_match_compiles_a_str_or_a_python_pattern_with_re2() -> None:
    assert Match(message="XID").message == MessagePattern("XID")  # type: ignore[arg-type]
    compiled = Match(message=re.compile("XID (48|79)"))  # type: ignore[arg-type]
    assert isinstance(compiled.message, MessagePattern)
    with pytest.raises(PatternError):
        Match(message=re.compile(r"(a)\1"))  # type: ignore[arg-type]
