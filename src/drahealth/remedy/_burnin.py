"""The controller's side of the burn-in gate and of the ``degraded`` outcome.

Owns :class:`OutcomeReporter` (one per leadership) and :func:`run_check` (an exec or
HTTP check with a timeout). The decisions are the core's
(:class:`drahealth.core.BurnInTracker` and the engine's ``degraded``); this module:

* notices devices that appear: a device a ResourceSlice lists for the first time after
  the controller synced is *new* and starts burning in (devices listed at start are
  not, so a restart or a leader change never burns in the whole fleet);
* runs each due burn-in validation (``burnIn.validate``) and hands the answer back
  (a pass ends the burn-in, a failure is retried with backoff);
* says what changed: Events on the device's Node (``DeviceBurnInStarted``,
  ``DeviceBurnInPassed``, ``DeviceBurnInFailed``, ``DeviceDegraded``,
  ``DeviceNoLongerDegraded``), a history line each, and the state keys ``burnIn`` and
  ``degraded`` (``drahealth-remediation-state``), written only when they change;
* resumes at start: burn-ins from the controller's burn-in taints (the engine's seed)
  and from the ``burnIn`` key; degraded devices already announced (the ``degraded`` key)
  get no second Event.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final

import aiohttp
from lightkube.models.core_v1 import ObjectReference

from drahealth._child import ChildError, run_child_async
from drahealth._time import rfc3339
from drahealth.core import (
    BURN_IN_NEW,
    BURN_IN_REPAIRED,
    ClusterModel,
    DeviceFacts,
    DeviceKey,
    RemedyEngine,
    Validate,
)
from drahealth.remedy._control import ControllerState
from drahealth.remedy._metrics import ControllerMetrics

__all__ = ["ANNOTATION_BURN_IN", "OutcomeReporter", "run_check"]

log = logging.getLogger(__name__)

#: On a burn-in DeviceTaintRule: why the device burns in (``new device``, ``after repair``).
ANNOTATION_BURN_IN: Final = "drahealth.io/burn-in"
#: Longest check output kept in a detail (history line, Event).
MAX_DETAIL: Final = 200

Record = Callable[[str, str, str], None]


async def run_check(check: Validate, key: DeviceKey, node: str) -> tuple[bool, str]:
    """Run ``check`` for ``key`` on ``node``: (passed, detail).

    exec: the command with ``DRAHEALTH_DEVICE`` and ``DRAHEALTH_NODE`` in its
    environment, passed on exit 0; http: a GET with ``device`` and ``node`` query
    parameters, passed on a 2xx. Either is cut off after ``check.timeout`` seconds.
    """
    try:
        async with asyncio.timeout(check.timeout):
            if check.exec:
                env = {**os.environ, "DRAHEALTH_DEVICE": str(key), "DRAHEALTH_NODE": node}
                try:
                    done = await run_child_async(check.exec, env, check.timeout, max_output=4096)
                except ChildError as exc:
                    return False, f"{check.exec[0]} {exc}"[:MAX_DETAIL]
                if done.timed_out:
                    return False, f"timed out after {check.timeout:g} s"
                ok = done.returncode == 0
                err = done.stderr.head
                text = err.decode(errors="replace")[:MAX_DETAIL] if err and not ok else ""
                return ok, f"exit {done.returncode}" + (f": {text}" if text else "")
            params = {"device": str(key), "node": node}
            async with (
                aiohttp.ClientSession() as session,
                session.get(check.http, params=params, allow_redirects=False) as resp,
            ):
                return 200 <= resp.status < 300, f"HTTP {resp.status}"  # a redirect fails
    except TimeoutError:
        return False, f"timed out after {check.timeout:g} s"
    except (OSError, aiohttp.ClientError) as exc:
        return False, str(exc)[:MAX_DETAIL]


class OutcomeReporter:
    """See the module docstring. Built with the engine and model of one leadership."""

    def __init__(
        self,
        engine: RemedyEngine,
        model: ClusterModel,
        state: ControllerState,
        metrics: ControllerMetrics,
        *,
        facts: Callable[[DeviceKey], DeviceFacts],
        record: Record,
        event: Callable[[ObjectReference, str, str, str], Coroutine[Any, Any, None]],
        wake: asyncio.Event,
        clock: Callable[[], float],
        wall: Callable[[], float],
        namespace: str,
        history_configmap: str,
    ) -> None:
        self.engine = engine
        self.model = model
        self.state = state
        self.metrics = metrics
        self._facts = facts
        self._record = record
        self._event = event
        self._wake = wake
        self._clock = clock
        self._wall = wall
        self._namespace = namespace
        self._history = history_configmap
        #: devices listed when the controller synced or since (new ones burn in)
        self.known: set[DeviceKey] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._burn_version = -1
        self._announced: set[DeviceKey] = set()  # burn-ins said to have started
        self._degraded_version = -1
        self._said: dict[DeviceKey, tuple[str, str]] = {}  # degraded: (rule, reason) said
        self._degraded_since: dict[DeviceKey, str] = {}  # degraded: RFC 3339 start

    # -- start ---------------------------------------------------------------------

    def synced(self) -> None:
        """The caches are synced (and the state read back): what is listed now is not
        new; burn-ins and degraded devices the last leader kept resume."""
        self.known = set(self.model.devices())
        now, wall = self._clock(), self._wall()
        for device, entry in _entries(self.state.get("burnIn")):
            why = entry.get("why")
            since = _wall_of(entry.get("since"))
            if why in (BURN_IN_NEW, BURN_IN_REPAIRED) and since is not None:
                self.engine.burn_ins.resume(device, why, now - max(0.0, wall - since))
        self._announced = set(self.engine.burn_ins.devices)
        for device, entry in _entries(self.state.get("degraded")):
            self._said[device] = (str(entry.get("rule", "")), str(entry.get("reason", "")))
            self._degraded_since[device] = str(entry.get("since", ""))

    # -- each pass -----------------------------------------------------------------

    def changed(self, keys: Iterable[DeviceKey], now: float) -> None:
        """Devices whose facts or health changed this pass (before the engine's wants):
        a device listed for the first time since the controller synced starts burning in."""
        known = self.known
        if known is None:
            return
        for key in keys:
            if key in known or self.model.facts(key) is None:
                continue
            known.add(key)
            self.engine.burn_in(key, BURN_IN_NEW, now)

    def after(self, now: float) -> None:
        """After the writes: start due validations, say what changed, set the state keys."""
        burn_in = self.engine.policy.burn_in
        if burn_in is not None:
            for key in self.engine.pending_burn_ins(now):
                task = asyncio.get_running_loop().create_task(self._validate(key, burn_in.validate))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if self.engine.burn_ins.version != self._burn_version:
            self._burn_version = self.engine.burn_ins.version
            self._burn_ins_changed(now)
        if self.engine.degraded_version != self._degraded_version:
            self._degraded_version = self.engine.degraded_version
            self._degraded_changed(now)

    async def stop(self) -> None:
        """Cancel the validations still running (the leadership ended)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- internals -----------------------------------------------------------------

    async def _validate(self, key: DeviceKey, check: Validate) -> None:
        node = self._facts(key).node
        ok, detail = await run_check(check, key, node)
        result = self.engine.burn_in_result(key, ok, self._clock(), detail)
        if result is None:
            return  # forgotten meanwhile
        self.metrics.burn_in_validations.labels("passed" if ok else "failed").inc()
        if result:
            self._say(
                key,
                node,
                "Normal",
                "DeviceBurnInPassed",
                f"burn-in of {key} passed: {detail}; the burn-in taint is removed",
            )
        else:
            d = self.engine.burn_ins.devices.get(key)
            retry = "" if d is None else f"; retry in {max(0.0, d.next_try - self._clock()):.0f} s"
            self._say(
                key,
                node,
                "Warning",
                "DeviceBurnInFailed",
                f"burn-in validation of {key} failed: {detail}{retry}",
            )
        self._wake.set()

    def _burn_ins_changed(self, now: float) -> None:
        devices = self.engine.burn_ins.devices
        for key in sorted(devices.keys() - self._announced):
            b = devices[key]
            message = f"burn-in of {key} ({b.why}): tainted until its validation passes"
            self._say(key, self._facts(key).node, "Warning", "DeviceBurnInStarted", message)
        self._announced = set(devices)
        self.metrics.burn_in_devices.set(len(devices))
        if not devices and not self.state.get("burnIn"):
            return  # nothing to say, nor anything said before
        wall = self._wall()
        self.state.set(
            "burnIn",
            {
                str(key): {
                    "since": _rfc3339(wall - (now - b.since)),
                    "why": b.why,
                    "node": self._facts(key).node,
                }
                for key, b in sorted(devices.items())
            },
        )

    def _degraded_changed(self, now: float) -> None:
        degraded = self.engine.degraded
        wall = self._wall()
        for key in sorted(degraded.keys() | self._said.keys()):
            d = degraded.get(key)
            node = d.node if d is not None and d.node else self._facts(key).node
            if d is None:
                del self._said[key]
                self._degraded_since.pop(key, None)
                self._say(
                    key, node, "Normal", "DeviceNoLongerDegraded", f"{key} is no longer degraded"
                )
                continue
            if self._said.get(key) == (d.rule, d.reason):
                continue
            self._said[key] = (d.rule, d.reason)
            self._degraded_since.setdefault(key, _rfc3339(wall - (now - d.since)))
            self._say(
                key,
                node,
                "Warning",
                "DeviceDegraded",
                f"{key} is degraded (rule {d.rule}): {d.reason or 'no message'}; "
                "no taint, nothing evicted",
            )
        self.metrics.degraded_devices.set(len(degraded))
        if not degraded and not self.state.get("degraded"):
            return
        self.state.set(
            "degraded",
            {
                str(key): {
                    "since": self._degraded_since.get(key) or _rfc3339(wall - (now - d.since)),
                    "rule": d.rule,
                    "reason": d.reason,
                    "node": d.node or self._facts(key).node,
                }
                for key, d in sorted(degraded.items())
            },
        )

    def _say(self, key: DeviceKey, node: str, kind: str, reason: str, message: str) -> None:
        log.info("%s", message)
        self._record("burn-in" if "BurnIn" in reason else "degraded", str(key), message)
        ref = (
            ObjectReference(apiVersion="v1", kind="Node", name=node)
            if node
            else ObjectReference(
                apiVersion="v1", kind="ConfigMap", name=self._history, namespace=self._namespace
            )
        )
        task = asyncio.get_running_loop().create_task(self._event(ref, kind, reason, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _entries(value: Any) -> list[tuple[DeviceKey, dict[str, Any]]]:
    """A state key's ``{"DRIVER/POOL/DEVICE": {...}}``, bad entries left out."""
    out = []
    for name, entry in (value if isinstance(value, dict) else {}).items():
        parts = str(name).split("/")
        if len(parts) < 3 or not all(parts) or not isinstance(entry, dict):
            continue
        out.append((DeviceKey(parts[0], "/".join(parts[1:-1]), parts[-1]), entry))
    return out


def _rfc3339(wall: float) -> str:
    return rfc3339(dt.datetime.fromtimestamp(wall, dt.UTC))


def _wall_of(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
