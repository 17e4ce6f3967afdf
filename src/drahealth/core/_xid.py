"""The one XID table: what an NVIDIA XID means and whether it is the application's fault.

Owns :data:`XID_TEXT`, :data:`APPLICATION_XIDS` and :func:`xid_message`, used by every
source that sees XIDs (NVML events, the kernel log, dcgm-exporter's last-XID gauge), so
a GPU fault reads the same whichever source caught it and one policy rule matches them all
(``XID 79: GPU has fallen off the bus (reset the GPU)``).

The application-error XIDs are the list NVIDIA's own Kubernetes plugins treat as
non-fatal (13, 31, 43, 45, 68, 109): the device stays Healthy and the message is shown.
Every other XID is fatal unless a source is told otherwise.

Sans-I/O: plain data.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

__all__ = ["APPLICATION_XIDS", "XID_TEXT", "xid_is_fatal", "xid_message"]

#: What an XID means, for messages users can act on.
XID_TEXT: Final[dict[int, str]] = {
    13: "graphics engine exception (application error)",
    31: "GPU memory page fault (application error)",
    43: "GPU stopped processing (application error)",
    45: "preemptive cleanup after an application error",
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    68: "video processor exception (application error)",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout (application error)",
    119: "GSP RPC timeout",
    120: "GSP error",
}
#: XIDs caused by the application, not the GPU: informational by default.
APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})


def xid_is_fatal(
    xid: int,
    informational: Iterable[int] = APPLICATION_XIDS,
    fatal: Iterable[int] = (),
) -> bool:
    """Whether ``xid`` makes the device Unhealthy: every XID not in ``informational``,
    and every XID in ``fatal`` (which wins over ``informational``)."""
    return xid in frozenset(fatal) or xid not in frozenset(informational)


def xid_message(xid: int, fatal: bool, detail: str = "", action: str = "reset the GPU") -> str:
    """``XID 79: GPU has fallen off the bus (reset the GPU)`` for a fatal XID,
    ``XID 13: ... (informational)`` otherwise. ``detail`` stands in for the meaning of an
    XID the table does not know (the driver's own words), else "critical error"."""
    text = XID_TEXT.get(xid) or detail or "critical error"
    return f"XID {xid}: {text} ({action if fatal else 'informational'})"
