"""Latching of fatal faults for attached sources, which report each poll as it comes.

Owns :class:`FaultLatch`. A driver's HealthHub latches fatal faults itself; the node agent
takes an attached source's answers as they are, and some faults are seen by one poll only
(an XID event, an AER counter that grew once). So a source keeps a device it saw a fatal
fault on Unhealthy for ``clear_after`` seconds after the last one (``None``: until the
agent restarts; ``0``: no latching), and later answers join the fault's message.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from drahealth.core import Health

__all__ = ["FaultLatch"]


@dataclass(slots=True)
class _Held:
    message: str
    until: float


class FaultLatch:
    """See the module docstring; keyed by whatever names a device in the source."""

    def __init__(self, clear_after: float | None) -> None:
        self.clear_after = clear_after
        self._held: dict[str, _Held] = {}

    def apply(
        self, key: str, health: Health, message: str, fatal: bool, now: float
    ) -> tuple[Health, str]:
        """The health and message to report for ``key`` now, given this poll's answer."""
        held = self._held.get(key)
        if fatal and self.clear_after != 0:
            until = math.inf if self.clear_after is None else now + self.clear_after
            self._held[key] = _Held(message, until)
        elif held is not None and now < held.until:
            health = Health.UNHEALTHY
            message = f"{held.message}; {message}" if message else held.message
        elif held is not None:
            del self._held[key]
        return health, message

    def keep_only(self, keys: Iterable[str]) -> None:
        """Forget the latches of devices no longer watched."""
        keep = set(keys)
        for gone in [k for k in self._held if k not in keep]:
            del self._held[gone]
