"""The interface of health sources attached to another driver's devices.

Owns :class:`AttachedSource`: a source that knows devices not by (pool, device) but by an
attribute their ResourceSlice publishes (a GPU's UUID, a PCI address, an index), so the
node agent can attach it to the devices of a driver drahealth does not own (NVIDIA's,
Intel's). Each :meth:`AttachedSource.poll` answers with a
:class:`~drahealth.core.Signal` for every device the source has an opinion on now; a
device it stops answering for becomes Unknown after the source's ``timeout`` (its
lease), as a driver's stream does.
"""

from __future__ import annotations

from typing import Protocol

from drahealth.core import Signal

__all__ = ["AttachedSource"]


class AttachedSource(Protocol):
    """A health source keyed by device attribute; ``poll`` may block (a worker thread)."""

    #: Named in health messages, metrics and views ("kmsg", "dcgm", "nvml", ...).
    name: str
    #: Seconds between two polls.
    interval: float
    #: Seconds a device keeps the last health this source gave it without a new answer.
    timeout: float

    def poll(self) -> list[Signal]:
        """Every device this source has an opinion on now, keyed by attribute."""
        ...
