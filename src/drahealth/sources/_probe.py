"""Probe sources: a command per device, or a JSON file a vendor tool keeps current.

Owns :class:`ExecProbe` and :class:`FileProbe`.

``ExecProbe`` runs ``command`` once per device per poll (``{pool}`` and ``{device}`` in
the arguments are replaced; the environment gets ``DRAHEALTH_POOL`` and
``DRAHEALTH_DEVICE``), with a per-device timeout. Exit code 0 is Healthy, 1 Unhealthy,
anything else (and a timeout, or a command that cannot start) Unknown; the first line
of its output is the message.

``FileProbe`` reads a JSON file ``{"devices": [{"device": "gpu-0", "pool": "node-1",
"health": "Unhealthy", "message": "...", "time": <unix seconds>}]}`` (``pool`` may be
left out when the source has one pool). An entry older than ``max_age`` seconds (its
``time``, else the file's modification time), a device the file does not list, and
every device of a missing or malformed file, are Unknown with a message that says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from drahealth.core import DeviceReport, Health

__all__ = [
    "MAX_PROBE_FILE_BYTES",
    "MAX_PROBE_FILE_ENTRIES",
    "ExecProbe",
    "FileProbe",
    "ProbeFileError",
    "probe_file_entries",
    "read_probe_file",
    "run_probe",
]

#: Largest probe file read, and most entries used from one.
MAX_PROBE_FILE_BYTES = 4 * 1024 * 1024
MAX_PROBE_FILE_ENTRIES = 65536


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
    start Unknown; the first line of its output (else of its error output) is the message."""
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            env={**os.environ, **env},
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Health.UNKNOWN, f"probe {argv[0]} timed out after {timeout:g} s"
    except OSError as exc:
        return Health.UNKNOWN, f"probe {argv[0]} could not run: {exc.strerror or exc}"
    line = _first_line(done.stdout) or _first_line(done.stderr)
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
            stamp = entry.get("time", mtime)
            age = now - float(stamp)
            if age > self.max_age_for(device):
                message = f"{self.path}: no update for {age:.0f} s"
                out.append(DeviceReport(pool, device, Health.UNKNOWN, message))
                continue
            health = Health(entry["health"])
            out.append(DeviceReport(pool, device, health, str(entry.get("message", ""))))
        return out

    def _all_unknown(self, message: str) -> list[DeviceReport]:
        return [DeviceReport(p, d, Health.UNKNOWN, message) for p, d in self._devices]

    @staticmethod
    def _entries(data: Any) -> tuple[dict[tuple[str, str], dict[str, Any]], str]:
        listed, problem = probe_file_entries(data, "device")
        out = {(str(e.get("pool", "")), e["device"]): e for e in listed}
        return out, problem


class ProbeFileError(Exception):
    """A probe file that cannot be used; the text names the file and what is wrong."""


def read_probe_file(path: str) -> tuple[Any, float]:
    """The JSON of the probe file at ``path`` (at most :data:`MAX_PROBE_FILE_BYTES`) and
    its modification time; :class:`ProbeFileError` names what is wrong."""
    try:
        with open(path, "rb") as f:
            mtime = os.fstat(f.fileno()).st_mtime
            raw = f.read(MAX_PROBE_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ProbeFileError(f"probe file {path} does not exist") from None
    except OSError as exc:
        raise ProbeFileError(f"probe file {path} cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_PROBE_FILE_BYTES:
        raise ProbeFileError(f"probe file {path} is larger than {MAX_PROBE_FILE_BYTES} bytes")
    try:
        return json.loads(raw.decode("utf-8")), mtime
    except UnicodeDecodeError as exc:
        raise ProbeFileError(f"probe file {path} is not UTF-8: {exc.reason}") from None
    except json.JSONDecodeError as exc:
        raise ProbeFileError(
            f"probe file {path} is not JSON: {exc.msg} at line {exc.lineno}"
        ) from None
    except RecursionError:
        raise ProbeFileError(f"probe file {path} is nested too deeply") from None


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
        if "time" in entry and (
            not isinstance(stamp, int | float) or isinstance(stamp, bool) or stamp != stamp
        ):
            return [], f"{where}.time must be unix seconds"
        if "message" in entry and not isinstance(entry["message"], str):
            return [], f"{where}.message must be a string"
        out.append(entry)
    return out, ""
