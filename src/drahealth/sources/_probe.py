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

__all__ = ["ExecProbe", "FileProbe"]


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
        env = {**os.environ, "DRAHEALTH_POOL": pool, "DRAHEALTH_DEVICE": device}
        timeout = self.timeout_for(device)
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, env=env, check=False
            )
        except subprocess.TimeoutExpired:
            message = f"probe {argv[0]} timed out after {timeout:g} s"
            return DeviceReport(pool, device, Health.UNKNOWN, message)
        except OSError as exc:
            message = f"probe {argv[0]} could not run: {exc.strerror or exc}"
            return DeviceReport(pool, device, Health.UNKNOWN, message)
        line = _first_line(done.stdout) or _first_line(done.stderr)
        if done.returncode == 0:
            return DeviceReport(pool, device, Health.HEALTHY, line)
        if done.returncode == 1:
            return DeviceReport(pool, device, Health.UNHEALTHY, line or "probe failed (exit 1)")
        message = line or f"probe exited with {done.returncode}"
        return DeviceReport(pool, device, Health.UNKNOWN, message)


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
            with open(self.path, encoding="utf-8") as f:
                mtime = os.fstat(f.fileno()).st_mtime
                data = json.load(f)
        except FileNotFoundError:
            return self._all_unknown(f"probe file {self.path} does not exist")
        except (OSError, UnicodeDecodeError) as exc:
            return self._all_unknown(f"probe file {self.path} cannot be read: {exc}")
        except json.JSONDecodeError as exc:
            return self._all_unknown(
                f"probe file {self.path} is not JSON: {exc.msg} at line {exc.lineno}"
            )
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
        if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
            return {}, 'the top level must be an object with a "devices" list'
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for i, entry in enumerate(data["devices"]):
            where = f"devices[{i}]"
            if not isinstance(entry, dict):
                return {}, f"{where} must be an object"
            if not isinstance(entry.get("device"), str) or not entry["device"]:
                return {}, f"{where}.device must be a non-empty string"
            if entry.get("health") not in ("Healthy", "Unhealthy", "Unknown"):
                return {}, f"{where}.health must be Healthy, Unhealthy or Unknown"
            if "time" in entry and not isinstance(entry["time"], int | float):
                return {}, f"{where}.time must be unix seconds"
            if "message" in entry and not isinstance(entry["message"], str):
                return {}, f"{where}.message must be a string"
            out[(str(entry.get("pool", "")), entry["device"])] = entry
        return out, ""
