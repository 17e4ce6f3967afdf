"""PCI sysfs and exec/file probes attached to another driver's devices, keyed by attribute.

Owns :class:`PciAttachedSource`, :class:`ExecAttachedProbe` and :class:`FileAttachedProbe`:
the driver-side sources of :mod:`drahealth.sources._pci` and :mod:`drahealth.sources._probe`
in the shape of an :class:`~drahealth.sources.AttachedSource`, so the node agent can
attach them to devices a driver drahealth does not own publishes. They keep no device
list of their own: the agent calls :meth:`watch_keys` with the values the watched
driver's ResourceSlices publish for the attribute the source is matched on (its
``match``, else its ``by``, else the driver's key) whenever those slices change, and
each poll answers for exactly those values.

* :class:`PciAttachedSource` checks each PCI address under ``<root>/bus/pci/devices``
  with :class:`~drahealth.sources.PciSource`'s rules (gone, AER growth, degraded link,
  no driver bound); a fatal AER error is latched for ``clear_after`` seconds after the
  last one (``None``: until the agent restarts), since the counter only grows once.
* :class:`ExecAttachedProbe` runs ``command`` once per device per poll, ``{key}`` in its
  arguments and ``DRAHEALTH_KEY`` / ``DRAHEALTH_KEY_ATTRIBUTE`` in its environment;
  exit 0 Healthy, 1 Unhealthy, anything else (a timeout, a command that cannot start)
  Unknown; the first output line is the message. At most ``parallel`` run at once, each
  bounded as :func:`~drahealth.sources._probe.run_probe` runs it. A value is checked
  before it is substituted (:func:`~drahealth.core.command_value_problem`, the check of
  repairs, and no leading ``-`` that would read as an option): one that fails it is
  never passed on, and only its device reads Unknown, with the reason. ``{key}`` always
  stays one argument.
* :class:`FileAttachedProbe` reads a JSON file ``{"devices": [{"key": "<value>",
  "health": "Unhealthy", "message": "...", "time": <unix seconds>}]}`` that a vendor tool
  keeps current; a device the file does not list, an entry older than ``max_age`` and
  every device of a missing or malformed file read Unknown, with a message saying why.

Values that are not the kind a source needs (a ``pci`` source given a UUID) are left out
and counted in :attr:`PciAttachedSource.skipped`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from drahealth.core import (
    Health,
    Signal,
    command_value_problem,
    normalize_key,
    normalize_pci_address,
)
from drahealth.sources._latch import FaultLatch
from drahealth.sources._pci import AerThresholds, PciDevice, PciSource
from drahealth.sources._probe import (
    ProbeFileError,
    probe_entry_age,
    probe_file_entries,
    probe_file_index,
    read_probe_file,
    run_probe,
)

__all__ = ["MAX_WATCHED_KEYS", "ExecAttachedProbe", "FileAttachedProbe", "PciAttachedSource"]

#: Most keys one source answers for (the agent watches at most this many devices per driver
#: anyway; the cap keeps a hostile slice from making a probe fork without end).
MAX_WATCHED_KEYS = 1024
#: Longest message a signal carries from a probe.
_MAX_MESSAGE = 1024


def _number(what: str, value: object, *, minimum: float = 0.0, strict: bool = True) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{what} must be a number of seconds, got {value!r}")
    if value < minimum or (strict and value == minimum):
        raise ValueError(f"{what} must be {'>' if strict else '>='} {minimum:g}, got {value!r}")
    return float(value)


def _keys(keys: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted({str(k) for k in keys if str(k)}))[:MAX_WATCHED_KEYS]


class PciAttachedSource:
    """See the module docstring. Keyed by PCI address (``by``: ``pciBusID``)."""

    def __init__(
        self,
        *,
        root: str = "/sys",
        by: str = "pciBusID",
        aer: AerThresholds | None = None,
        require_driver: bool = False,
        clear_after: float | None = 600.0,
        interval: float = 5.0,
        timeout: float = 30.0,
        name: str = "pci",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(root, str) or not root:
            raise ValueError("pci root must name the sysfs mount (/sys)")
        if aer is not None and not isinstance(aer, AerThresholds):
            raise ValueError(
                f"pci aer must be thresholds (fatal, nonfatal, correctable), got {aer!r}"
            )
        self.name = name
        self.by = by
        self.interval = _number("pci interval", interval)
        self.timeout = _number("pci timeout", timeout)
        self.clear_after = (
            None if clear_after is None else _number("pci clear_after", clear_after, strict=False)
        )
        self._check = PciSource(
            [], root=root, aer=aer or AerThresholds(), require_driver=bool(require_driver)
        )
        self._clock = clock
        self._addresses: tuple[str, ...] = ()
        self._latch = FaultLatch(self.clear_after)
        #: Values given to :meth:`watch_keys` that are no PCI address.
        self.skipped = 0

    def watch_keys(self, keys: Sequence[str]) -> None:
        """The PCI addresses the watched driver's devices publish (any spelling)."""
        found, skipped = set(), 0
        for key in _keys(keys):
            address = normalize_pci_address(key)
            if address is None:
                skipped += 1
            else:
                found.add(address)
        self.skipped = skipped
        self._addresses = tuple(sorted(found))
        self._latch.keep_only(found)

    def poll(self) -> list[Signal]:
        now = self._clock()
        out = []
        for address in self._addresses:
            report = self._check.check(PciDevice("", address, address))
            fatal = bool(report.fatal) and report.health is Health.UNHEALTHY
            health, message = self._latch.apply(address, report.health, report.message, fatal, now)
            out.append(Signal(self.by, address, health, message[:_MAX_MESSAGE]))
        return out


class ExecAttachedProbe:
    """See the module docstring."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        by: str = "name",
        run_timeout: float = 10.0,
        parallel: int = 4,
        interval: float = 30.0,
        timeout: float = 120.0,
        name: str = "exec",
    ) -> None:
        if (
            isinstance(command, str)
            or not isinstance(command, Sequence)
            or not command
            or not all(isinstance(a, str) and a for a in command)
        ):
            raise ValueError("exec command must be a non-empty list of non-empty strings")
        if not isinstance(by, str) or not by:
            raise ValueError("exec by must name an attribute (uuid, pciBusID, name, ...)")
        if not isinstance(parallel, int) or isinstance(parallel, bool) or not 1 <= parallel <= 64:
            raise ValueError(f"exec parallel must be 1 to 64, got {parallel!r}")
        self.command = list(command)
        self.by = by
        self.name = name
        self.run_timeout = _number("exec run_timeout", run_timeout)
        self.interval = _number("exec interval", interval)
        self.timeout = _number("exec timeout", timeout)
        self.parallel = parallel
        self._keys: tuple[str, ...] = ()

    def watch_keys(self, keys: Sequence[str]) -> None:
        """The values of the matched attribute, one command run per value per poll."""
        self._keys = _keys(keys)

    def poll(self) -> list[Signal]:
        keys = self._keys
        if not keys:
            return []
        if len(keys) == 1 or self.parallel == 1:
            answers = [self._run(k) for k in keys]
        else:
            with ThreadPoolExecutor(min(self.parallel, len(keys)), "exec-probe") as pool:
                answers = list(pool.map(self._run, keys))
        return [
            Signal(self.by, key, health, message[:_MAX_MESSAGE])
            for key, (health, message) in zip(keys, answers, strict=True)
        ]

    def _run(self, key: str) -> tuple[Health, str]:
        problem = command_value_problem(key, self.by)
        if problem:  # a ResourceSlice's value is checked before it reaches a process
            return (
                Health.UNKNOWN,
                f"{self.by} value {key[:64]!r} not passed to the probe: {problem}",
            )
        argv = [a.replace("{key}", key) for a in self.command]
        env = {"DRAHEALTH_KEY": key, "DRAHEALTH_KEY_ATTRIBUTE": self.by}
        return run_probe(argv, env, self.run_timeout)


class FileAttachedProbe:
    """See the module docstring."""

    def __init__(
        self,
        path: str,
        *,
        by: str = "name",
        max_age: float = 60.0,
        interval: float = 5.0,
        timeout: float = 30.0,
        name: str = "file",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(path, str) or not path:
            raise ValueError("file path must name the JSON file a tool keeps current")
        if not isinstance(by, str) or not by:
            raise ValueError("file by must name an attribute (uuid, pciBusID, name, ...)")
        self.path = path
        self.by = by
        self.name = name
        self.max_age = _number("file max_age", max_age)
        self.interval = _number("file interval", interval)
        self.timeout = _number("file timeout", timeout)
        self._clock = clock
        self._keys: tuple[str, ...] = ()

    def watch_keys(self, keys: Sequence[str]) -> None:
        """The values of the matched attribute; a value the file does not list is Unknown."""
        self._keys = _keys(keys)

    def poll(self) -> list[Signal]:
        try:
            data, mtime = read_probe_file(self.path)
        except ProbeFileError as exc:
            return self._all(Health.UNKNOWN, str(exc))
        entries, problem = probe_file_entries(data, "key")
        if problem:
            return self._all(Health.UNKNOWN, f"probe file {self.path}: {problem}")
        listed = probe_file_index(entries, lambda e: normalize_key(self.by, e["key"]))
        now = self._clock()
        out = []
        keys = self._keys or tuple(sorted(str(e["key"]) for e in entries))[:MAX_WATCHED_KEYS]
        for key in keys:
            entry = listed.get(normalize_key(self.by, key))
            if entry is None:
                out.append(Signal(self.by, key, Health.UNKNOWN, f"not listed in {self.path}"))
                continue
            stale = probe_entry_age(entry, mtime, now, self.max_age, self.path)
            if stale:
                out.append(Signal(self.by, key, Health.UNKNOWN, stale))
                continue
            message = str(entry.get("message", ""))[:_MAX_MESSAGE]
            out.append(Signal(self.by, key, Health(entry["health"]), message))
        return out

    def _all(self, health: Health, message: str) -> list[Signal]:
        return [Signal(self.by, key, health, message[:_MAX_MESSAGE]) for key in self._keys]
