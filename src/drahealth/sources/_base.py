"""The one interface every health source implements, and the loop that drives it.

Owns :class:`HealthSource` (a ``name``, an ``interval`` and a blocking ``poll()`` that
returns one full :class:`~drahealth.core.DeviceReport` list for its devices) and
:func:`run_source`, which polls in a worker thread (hardware probes block) and submits
each result to a :class:`~drahealth.core.HealthReportSink` (the driver's ``HealthHub``,
or a bare ``DeviceHealthModel``). A poll that raises is logged and
reported as every device Unknown with the error as the message, never as Healthy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from drahealth.core import DeviceReport, Health, HealthReportSink

__all__ = ["HealthSource", "run_source", "unknown_all"]

log = logging.getLogger(__name__)


class HealthSource(Protocol):
    """A health source; ``poll`` may block (it runs in a worker thread)."""

    name: str
    interval: float

    def devices(self) -> Sequence[tuple[str, str]]:
        """The (pool, device) pairs this source reports on."""
        ...

    def poll(self) -> list[DeviceReport]:
        """One observation of every device."""
        ...


def unknown_all(source: HealthSource, message: str) -> list[DeviceReport]:
    return [DeviceReport(p, d, Health.UNKNOWN, message) for p, d in source.devices()]


async def run_source(hub: HealthReportSink, source: HealthSource) -> None:
    """Poll ``source`` every ``source.interval`` seconds and feed ``hub`` until cancelled."""
    failing = ""
    while True:
        try:
            reports = await asyncio.to_thread(source.poll)
            if failing:
                log.info("health source %s works again", source.name)
                failing = ""
        except Exception as exc:
            text = f"{source.name} health source failed: {exc}"
            if text != failing:
                log.warning("%s", text)
                failing = text
            reports = unknown_all(source, text)
        try:
            hub.submit(source.name, reports)
        except ValueError as exc:
            log.warning("health source %s sent a bad report: %s", source.name, exc)
        await asyncio.sleep(source.interval)
