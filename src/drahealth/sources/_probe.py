"""Probe sources: a command per device, or a JSON file a vendor tool keeps current.

Owns :class:`ExecProbe` and :class:`FileProbe`.

``ExecProbe`` runs ``command`` once per device per poll (``{pool}`` and ``{device}`` in
the arguments are replaced; the environment gets ``DRAHEALTH_POOL`` and
``DRAHEALTH_DEVICE``), with a per-device timeout. Exit code 0 is Healthy, 1 Unhealthy,
anything else (and a timeout, or a command that cannot start) Unknown; the first line
of its output is the message. Each run is bounded (:mod:`drahealth._child`): its own
process group, killed whole at the timeout, output kept up to a limit, every child reaped.

``FileProbe`` reads a JSON file ``{"devices": [{"device": "gpu-0", "pool": "node-1",
"health": "Unhealthy", "message": "...", "time": <unix seconds>}]}`` (``pool`` may be
left out when the source has one pool). An entry older than ``max_age`` seconds (its
``time``, else the file's modification time) or as far in the future, an entry whose
``time`` is no unix time (not finite, negative, past the year 9999, an integer of over
40 digits), a device the file
does not list, and every device of a missing, malformed or oversized file (or of a path
that is not a regular file: it is opened non-blocking, never waited on), are Unknown
with a message that says why.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from drahealth._child import ChildError, run_child
from drahealth._files import NotARegularFile, read_regular
from drahealth.core import DeviceReport, Health

__all__ = [
    "MAX_PROBE_FILE_BYTES",
    "MAX_PROBE_FILE_ENTRIES",
    "MAX_PROBE_OUTPUT",
    "MAX_PROBE_TIME",
    "ExecProbe",
    "FileProbe",
    "ProbeFileError",
    "probe_entry_age",
    "probe_file_entries",
    "probe_file_index",
    "read_probe_file",
    "run_probe",
]

#: Largest probe file read, and most entries used from one.
MAX_PROBE_FILE_BYTES = 4 * 1024 * 1024
MAX_PROBE_FILE_ENTRIES = 65536
#: Latest ``time`` a probe file entry may give (9999-12-31T23:59:59Z).
MAX_PROBE_TIME = 253402300799
#: Bytes of a probe command's output and of its error output kept (the rest is discarded).
MAX_PROBE_OUTPUT = 16 * 1024


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


class ExecProbe:
    """See the module docstring."""

    def __init__(
        self,
        command: Sequence[str],
        devices: Sequence[tuple[str, str]],
        *,
        timeout: float | Mapping[str, float] = 10.0,
        interval: float = 30.0,
        name: str = "exec",
    ) -> None:
        if not command or not all(isinstance(a, str) and a for a in command):
            raise ValueError("command must be a non-empty list of non-empty strings")
        self.command = list(command)
        self.name = name
        self.interval = interval
        self._devices = list(devices)
        self._timeout = timeout

    def devices(self) -> Sequence[tuple[str, str]]:
        return self._devices

    def timeout_for(self, device: str) -> float:
        if isinstance(self._timeout, Mapping):
            return float(self._timeout.get(device, self._timeout.get("*", 10.0)))
        return float(self._timeout)

    def poll(self) -> list[DeviceReport]:
        return [self._run(pool, device) for pool, device in self._devices]

    def _run(self, pool: str, device: str) -> DeviceReport:
        argv = [a.replace("{pool}", pool).replace("{device}", device) for a in self.command]
        env = {"DRAHEALTH_POOL": pool, "DRAHEALTH_DEVICE": device}
        health, message = run_probe(argv, env, self.timeout_for(device))
        return DeviceReport(pool, device, health, message)


def run_probe(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[Health, str]:
    """Run one probe command (``env`` added to this process's environment) and read its
    answer: exit 0 Healthy, 1 Unhealthy, anything else, a timeout or a command that cannot
    start Unknown; the first line of its output (else of its error output) is the message.

    It runs bounded (:func:`drahealth._child.run_child`): its own process group, killed
    whole at the timeout, at most :data:`MAX_PROBE_OUTPUT` bytes of each stream kept."""
    name = argv[0] if argv else "?"
    try:
        done = run_child(list(argv), {**os.environ, **env}, timeout, max_output=MAX_PROBE_OUTPUT)
    except ChildError as exc:
        return Health.UNKNOWN, f"probe {name} {exc}"
    if done.timed_out:
        return Health.UNKNOWN, f"probe {name} timed out after {timeout:g} s"
    line = _first_line(done.stdout.head.decode(errors="replace")) or _first_line(
        done.stderr.head.decode(errors="replace")
    )
    if done.returncode == 0:
        return Health.HEALTHY, line
    if done.returncode == 1:
        return Health.UNHEALTHY, line or "probe failed (exit 1)"
    return Health.UNKNOWN, line or f"probe exited with {done.returncode}"


class FileProbe:
    """See the module docstring."""

    def __init__(
        self,
        path: str,
        devices: Sequence[tuple[str, str]],
        *,
        max_age: float | Mapping[str, float] = 60.0,
        interval: float = 5.0,
        name: str = "file",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.name = name
        self.interval = interval
        self._devices = list(devices)
        self._max_age = max_age
        self._clock = clock

    def devices(self) -> Sequence[tuple[str, str]]:
        return self._devices

    def max_age_for(self, device: str) -> float:
        if isinstance(self._max_age, Mapping):
            return float(self._max_age.get(device, self._max_age.get("*", 60.0)))
        return float(self._max_age)

    def poll(self) -> list[DeviceReport]:
        try:
            data, mtime = read_probe_file(self.path)
        except ProbeFileError as exc:
            return self._all_unknown(str(exc))
        entries, problem = self._entries(data)
        if problem:
            return self._all_unknown(f"probe file {self.path}: {problem}")
        now = self._clock()
        pools = {p for p, _ in self._devices}
        out = []
        for pool, device in self._devices:
            entry = entries.get((pool, device))
            if entry is None and len(pools) == 1:
                entry = entries.get(("", device))
            if entry is None:
                out.append(DeviceReport(pool, device, Health.UNKNOWN, f"not listed in {self.path}"))
                continue
            problem = probe_entry_age(entry, mtime, now, self.max_age_for(device), self.path)
            if problem:
                out.append(DeviceReport(pool, device, Health.UNKNOWN, problem))
                continue
            health = Health(entry["health"])
            out.append(DeviceReport(pool, device, health, str(entry.get("message", ""))))
        return out

    def _all_unknown(self, message: str) -> list[DeviceReport]:
        return [DeviceReport(p, d, Health.UNKNOWN, message) for p, d in self._devices]

    @staticmethod
    def _entries(data: Any) -> tuple[dict[tuple[str, str], dict[str, Any]], str]:
        listed, problem = probe_file_entries(data, "device")
        return probe_file_index(listed, lambda e: (str(e.get("pool", "")), e["device"])), problem


class ProbeFileError(Exception):
    """A probe file that cannot be used; the text names the file and what is wrong."""


def read_probe_file(path: str) -> tuple[Any, float]:
    """The JSON of the probe file at ``path`` (at most :data:`MAX_PROBE_FILE_BYTES`) and
    its modification time; :class:`ProbeFileError` names what is wrong."""
    try:
        # never blocks, and only a regular file (checked on what was opened) is read
        raw, st = read_regular(path, MAX_PROBE_FILE_BYTES)
    except FileNotFoundError:
        raise ProbeFileError(f"probe file {path} does not exist") from None
    except NotARegularFile:
        raise ProbeFileError(f"probe file {path} is not a regular file") from None
    except OSError as exc:
        raise ProbeFileError(f"probe file {path} cannot be read: {exc.strerror or exc}") from None
    mtime = st.st_mtime
    if len(raw) > MAX_PROBE_FILE_BYTES:
        raise ProbeFileError(f"probe file {path} is larger than {MAX_PROBE_FILE_BYTES} bytes")
    try:
        return json.loads(raw.decode("utf-8"), parse_int=_json_int), mtime
    except UnicodeDecodeError as exc:
        raise ProbeFileError(f"probe file {path} is not UTF-8: {exc.reason}") from None
    except json.JSONDecodeError as exc:
        raise ProbeFileError(
            f"probe file {path} is not JSON: {exc.msg} at line {exc.lineno}"
        ) from None
    except RecursionError:
        raise ProbeFileError(f"probe file {path} is nested too deeply") from None
    except ValueError as exc:  # a number Python refuses to convert
        raise ProbeFileError(f"probe file {path} is not JSON: {str(exc)[:80]}") from None


def _json_int(text: str) -> int | float:
    """An integer of a probe file; one of over 40 digits (no field takes one, and past
    4,300 Python refuses to convert it) reads as infinite, which no field accepts, so
    only its entry is refused."""
    if len(text) > 40:
        return -math.inf if text.startswith("-") else math.inf
    return int(text)


def probe_entry_age(
    entry: Mapping[str, Any], mtime: float, now: float, max_age: float, path: str
) -> str:
    """Why an entry of a probe file is too old to use (its ``time``, else the file's
    modification time, more than ``max_age`` seconds ago, or more than ``max_age``
    seconds in the future, which would never go stale), or ``""``."""
    age = now - float(entry.get("time", mtime))
    if age > max_age:
        return f"{path}: no update for {age:.0f} s"
    if -age > max_age:
        return f"{path}: time is {-age:.0f} s in the future"
    return ""


_K = TypeVar("_K")


def probe_file_index(
    entries: list[dict[str, Any]], key: Callable[[dict[str, Any]], _K]
) -> dict[_K, dict[str, Any]]:
    """The entries by ``key``; a device listed twice with different health (two
    spellings of one UUID, a tool's bug) reads Unknown with the reason, so a later
    Healthy entry never hides an Unhealthy one."""
    out: dict[_K, dict[str, Any]] = {}
    for entry in entries:
        k = key(entry)
        first = out.get(k)
        if first is None:
            out[k] = entry
        elif first.get("health") != entry.get("health"):
            out[k] = {"health": "Unknown", "message": "listed twice, with different health"}
    return out


def probe_file_entries(data: Any, field: str) -> tuple[list[dict[str, Any]], str]:
    """The entries of a probe file's ``devices`` list, each naming its device in ``field``
    (``device`` for :class:`FileProbe`, ``key`` for the attached probe), or a problem
    naming the first bad entry (then no entry is used)."""
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        return [], 'the top level must be an object with a "devices" list'
    if len(data["devices"]) > MAX_PROBE_FILE_ENTRIES:
        return [], f"more than {MAX_PROBE_FILE_ENTRIES} devices"
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(data["devices"]):
        where = f"devices[{i}]"
        if not isinstance(entry, dict):
            return [], f"{where} must be an object"
        if not isinstance(entry.get(field), str) or not entry[field]:
            return [], f"{where}.{field} must be a non-empty string"
        if entry.get("health") not in ("Healthy", "Unhealthy", "Unknown"):
            return [], f"{where}.health must be Healthy, Unhealthy or Unknown"
        stamp = entry.get("time")
        if "time" in entry and (not isinstance(stamp, int | float) or isinstance(stamp, bool)):
            return [], f"{where}.time must be unix seconds"
        if "message" in entry and not isinstance(entry["message"], str):
            return [], f"{where}.message must be a string"
        if isinstance(stamp, int | float) and not (
            (isinstance(stamp, int) or math.isfinite(stamp)) and 0 <= stamp <= MAX_PROBE_TIME
        ):
            # a number, but no time: this entry reads Unknown, the others are used
            shown = repr(stamp) if len(repr(stamp)) <= 24 else f"{repr(stamp)[:20]}..."
            entry = {k: entry[k] for k in (field, "pool") if k in entry} | {
                "health": "Unknown",
                "message": f"{where}.time must be unix seconds from 0 to {MAX_PROBE_TIME}, "
                f"not {shown}",
            }
        out.append(entry)
    return out, ""
