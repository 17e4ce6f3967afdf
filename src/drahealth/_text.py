"""Text read from the API made safe to show on a terminal or a page.

Owns :func:`printable`: device messages, names and taint fields come from objects that
drivers, agents, kubelets and other tenants write, so before they reach a terminal the
escape sequences (CSI, OSC, other ESC sequences, their 8-bit C1 forms) are removed
whole, line breaks and tabs become spaces, and the remaining C0/C1 control characters,
DEL and the Unicode bidirectional overrides are dropped; everything else, including
``[brackets]`` and non-ASCII letters, is kept as it was. :func:`json_text` is
:func:`json.dumps` that also escapes C1 controls (valid JSON either way) and refuses
NaN and infinities.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["json_text", "printable"]

_SEQUENCES = re.compile(
    r"""
      (?:\x1b\[|\x9b) [0-?]* [ -/]* [@-~]            # CSI ... final byte
    | (?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]) .*? (?:\x07|\x1b\\|\x9c|$)  # OSC/DCS/SOS/PM/APC
    | \x1b [ -/]* [0-~]                               # other ESC sequences (nF, Fp, Fe, Fs)
    """,
    re.VERBOSE | re.DOTALL,
)
_SPACES = re.compile(r"[\t\n\r\x0b\x0c\x85\u2028\u2029]")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_C1 = re.compile(r"[\x80-\x9f]")


def printable(value: object) -> str:
    """``value`` as a string with escape sequences and control characters removed."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():  # the common case: nothing to do
        return text
    text = _SEQUENCES.sub("", text)
    text = _SPACES.sub(" ", text)
    return _CONTROLS.sub("", text)


def json_text(value: Any, **kw: Any) -> str:
    """JSON for ``value``: C1 controls escaped, NaN/Infinity refused (ValueError)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, **kw)
    return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
