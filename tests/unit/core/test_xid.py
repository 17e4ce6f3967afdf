"""The one XID table: every source reads the same meaning and severity from core."""

from __future__ import annotations

from drahealth.core import APPLICATION_XIDS, XID_TEXT, xid_is_fatal, xid_message
from drahealth.sources import _nvml


def test_the_nvml_source_uses_the_core_table() -> None:
    assert _nvml.XID_TEXT is XID_TEXT
    assert _nvml.APPLICATION_XIDS is APPLICATION_XIDS


def test_application_xids_are_informational_and_the_rest_fatal() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == APPLICATION_XIDS
    assert not xid_is_fatal(13)
    assert xid_is_fatal(79)
    assert xid_is_fatal(154)  # unknown to the table: fatal
    assert xid_is_fatal(13, fatal=[13])  # the fatal override wins
    assert not xid_is_fatal(79, informational=[79])


def test_messages() -> None:
    assert xid_message(79, True) == "XID 79: GPU has fallen off the bus (reset the GPU)"
    assert xid_message(13, False) == (
        "XID 13: graphics engine exception (application error) (informational)"
    )
    assert xid_message(154, True) == "XID 154: critical error (reset the GPU)"
    assert xid_message(154, True, "GPU recovery action changed") == (
        "XID 154: GPU recovery action changed (reset the GPU)"
    )
    assert xid_message(48, True, "ignored: the table knows 48") == (
        "XID 48: double-bit ECC error (reset the GPU)"
    )
