"""Device taints driven by health: policy, persisted taint state, and the glue.

Owns:

* :class:`TaintPolicy` and the pure :func:`desired_taints` (HealthHub states ->
  taints per ``(pool, device)``): a latched (sticky, fatal) Unhealthy device gets
  ``<driver>/unhealthy`` with the policy's effect and a simple value (``"true"`` or a
  sanitized reason code, never free text); optionally Unknown gets
  ``<driver>/unmonitored`` (effect ``None``); only a Healthy report removes an
  unhealthy taint (Unknown or a missing device keeps it), so restarts and wedged
  sources never silently untaint;
* :func:`stamp_time_added`: a taint keeps its first ``timeAdded`` while it exists;
* :class:`TaintStore`: the current taints with their ``timeAdded`` on disk (atomic
  write: tmp + fsync + rename + dir fsync; versioned; SHA-256 checksummed; a corrupt
  file raises :class:`TaintStoreError` after a quarantine copy is kept);
* :func:`withdrawn_devices`: the devices to leave out of the ResourceSlices where
  taints cannot be published: those carrying the unhealthy taint (so the same rule:
  only Healthy brings one back) and, with ``TaintPolicy.withdraw_unknown``, Unknown ones;
* :class:`TaintController`: subscribes to the hub, recomputes in batches (one
  republish per burst), saves the store *before* republishing, and hands the taints
  to a callback (normally ``ResourceSlicePublisher.set_device_taints``) and the
  devices to withdraw to another (normally ``ResourceSlicePublisher.set_withdrawn``).

May not touch: the API server (the publisher does), the hub's own state.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import inspect
import json
import logging
import os
import re
import shutil
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube.models.resource_v1 import DeviceTaint

from drahealth._aio import cancel_and_wait
from drahealth._time import rfc3339
from drahealth.core import Health
from drahealth.driver._hub import DeviceState, HealthHub
from drahealth.driver._slices import (
    TAINT_EFFECTS,
    is_label_value,
    is_qualified_name,
    truncate_time,
)

__all__ = [
    "TaintController",
    "TaintMap",
    "TaintPolicy",
    "TaintStore",
    "TaintStoreError",
    "desired_taints",
    "reason_code",
    "stamp_time_added",
    "withdrawn_devices",
]

log = logging.getLogger(__name__)

#: Taints per ``(pool, device)``, each list sorted by (key, effect, value).
TaintMap = dict[tuple[str, str], list[DeviceTaint]]
ApplyCallback = Callable[[TaintMap], "Awaitable[None] | None"]
WithdrawCallback = Callable[[frozenset[tuple[str, str]]], "Awaitable[None] | None"]

_REASON_BAD = re.compile(r"[^a-z0-9._-]+")


def reason_code(text: str) -> str | None:
    """Turn ``text`` into a short label value (``"Xid 79"`` -> ``"xid-79"``), or ``None``.

    Lower-cased, runs of other characters become ``-``, cut to 63 characters, trimmed
    to start and end alphanumeric. Meant for codes, not messages.
    """
    code = _REASON_BAD.sub("-", text.strip().lower())[:63]
    code = code.strip("-._")
    return code if code and is_label_value(code) else None


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class TaintPolicy:
    """Which health states taint a device, and how.

    ``unhealthy_effect``: effect of ``<driver>/unhealthy`` (``None`` informational,
    ``NoSchedule`` default, ``NoExecute`` evicts). ``taint_transient``: also taint
    Unhealthy devices that are not latched. ``unmonitored``: put
    ``<driver>/unmonitored`` (``unmonitored_effect``, default ``None``) on Unknown
    devices. ``value``: maps a state to a reason code (sanitized with
    :func:`reason_code`; ``"true"`` when absent or unusable). ``withdraw_unknown``:
    also withdraw Unknown devices where devices are withdrawn (see
    :func:`withdrawn_devices`).
    """

    driver: str
    unhealthy_effect: str = "NoSchedule"
    taint_transient: bool = False
    unmonitored: bool = False
    unmonitored_effect: str = "None"
    value: Callable[[DeviceState], str | None] | None = None
    withdraw_unknown: bool = False

    def __post_init__(self) -> None:
        for name in ("unhealthy_effect", "unmonitored_effect"):
            effect = getattr(self, name)
            if effect not in TAINT_EFFECTS:
                raise ValueError(f"TaintPolicy.{name}: {effect!r} not one of {TAINT_EFFECTS}")
        if not is_qualified_name(self.unhealthy_key):
            raise ValueError(f"TaintPolicy.driver: {self.driver!r} is not a DNS subdomain")

    @property
    def unhealthy_key(self) -> str:
        return f"{self.driver}/unhealthy"

    @property
    def unmonitored_key(self) -> str:
        return f"{self.driver}/unmonitored"

    def value_for(self, state: DeviceState) -> str:
        if self.value is not None:
            try:
                raw = self.value(state)
            except Exception:
                log.exception("taint value function failed for %s/%s", state.pool, state.device)
                raw = None
            code = reason_code(raw) if raw else None
            if code:
                return code
        return "true"


def _order(taint: DeviceTaint) -> tuple[str, str, str]:
    return (taint.key, taint.effect, taint.value or "")


def desired_taints(
    states: Iterable[DeviceState],
    policy: TaintPolicy,
    previous: Mapping[tuple[str, str], Sequence[DeviceTaint]] | None = None,
) -> TaintMap:
    """Taints (without ``timeAdded``) each device should carry, sorted by device.

    ``previous`` (the taints now published) keeps an ``<driver>/unhealthy`` taint on
    a device that is not reported Healthy (Unknown, or not in ``states`` at all):
    only recovery removes it.
    """
    out: TaintMap = {}
    seen: set[tuple[str, str]] = set()
    prev = previous or {}

    def kept(key: tuple[str, str]) -> list[DeviceTaint]:
        return [
            DeviceTaint(key=t.key, value=t.value, effect=t.effect)
            for t in prev.get(key, ())
            if t.key == policy.unhealthy_key
        ]

    for state in states:
        key = (state.pool, state.device)
        seen.add(key)
        taints: list[DeviceTaint] = []
        if state.health is Health.UNHEALTHY and (state.sticky or policy.taint_transient):
            taints.append(
                DeviceTaint(
                    key=policy.unhealthy_key,
                    value=policy.value_for(state),
                    effect=policy.unhealthy_effect,
                )
            )
        elif state.health is not Health.HEALTHY:
            taints.extend(kept(key))
        if state.health is Health.UNKNOWN and policy.unmonitored:
            taints.append(
                DeviceTaint(
                    key=policy.unmonitored_key, value="true", effect=policy.unmonitored_effect
                )
            )
        if taints:
            out[key] = sorted(taints, key=_order)
    for key in prev:
        if key not in seen and (taints := kept(key)):
            out[key] = sorted(taints, key=_order)
    return dict(sorted(out.items()))


def withdrawn_devices(
    taints: Mapping[tuple[str, str], Sequence[DeviceTaint]],
    states: Iterable[DeviceState],
    policy: TaintPolicy,
) -> frozenset[tuple[str, str]]:
    """The devices to leave out of the slices: those whose ``taints`` (from
    :func:`desired_taints`) include the unhealthy taint, and, with
    ``policy.withdraw_unknown``, the Unknown ones."""
    out = {
        key for key, items in taints.items() if any(t.key == policy.unhealthy_key for t in items)
    }
    if policy.withdraw_unknown:
        out.update((s.pool, s.device) for s in states if s.health is Health.UNKNOWN)
    return frozenset(out)


def stamp_time_added(
    desired: Mapping[tuple[str, str], Sequence[DeviceTaint]],
    previous: Mapping[tuple[str, str], Sequence[DeviceTaint]],
    now: dt.datetime,
) -> TaintMap:
    """Copy of ``desired`` with ``timeAdded`` set: kept from the same taint
    (key, value, effect) in ``previous``, else ``now`` truncated to seconds."""
    stamp = truncate_time(now)
    out: TaintMap = {}
    for key, taints in desired.items():
        old = {_order(t): t.timeAdded for t in previous.get(key, ()) if t.timeAdded}
        out[key] = [
            DeviceTaint(
                key=t.key,
                value=t.value,
                effect=t.effect,
                timeAdded=t.timeAdded or old.get(_order(t)) or stamp,
            )
            for t in taints
        ]
    return out


# --------------------------------------------------------------------------- store


class TaintStoreError(Exception):
    """The taint store file is unreadable; ``quarantine`` is the kept copy (if any)."""

    def __init__(self, path: Path, problem: str, quarantine: Path | None) -> None:
        kept = f"; a copy was kept at {quarantine}" if quarantine else ""
        super().__init__(f"taint store {path} is corrupt: {problem}{kept}")
        self.path = path
        self.problem = problem
        self.quarantine = quarantine


def _canonical(payload: Any) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


class TaintStore:
    """The published health taints on disk, so a restart neither loses nor clears them.

    Format (JSON): ``{"version": 1, "checksum": "sha256:<hex>", "taints": [...]}``
    with ``taints`` entries ``{pool, device, key, value, effect, timeAdded}`` and the
    checksum over the canonical JSON of ``taints``.
    """

    VERSION = 1

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> TaintMap:
        """The stored taints; ``{}`` when there is no file.

        Raises :class:`TaintStoreError` (after copying the file aside) when it is
        corrupt: not JSON, wrong version, checksum mismatch or malformed entries.
        """
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            if doc.get("version") != self.VERSION:
                raise ValueError(f"unsupported version {doc.get('version')!r}")
            entries = doc.get("taints")
            digest = "sha256:" + hashlib.sha256(_canonical(entries)).hexdigest()
            if doc.get("checksum") != digest:
                raise ValueError("checksum mismatch")
            if not isinstance(entries, list):
                raise ValueError("'taints' is not a list")
            out: TaintMap = {}
            for i, e in enumerate(entries):
                try:
                    taint = DeviceTaint(
                        key=str(e["key"]),
                        value=None if e.get("value") is None else str(e["value"]),
                        effect=str(e["effect"]),
                        timeAdded=dt.datetime.fromisoformat(e["timeAdded"]),
                    )
                    out.setdefault((str(e["pool"]), str(e["device"])), []).append(taint)
                except (KeyError, TypeError, ValueError) as exc:
                    raise ValueError(f"taints[{i}] malformed: {exc}") from exc
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError included
            raise TaintStoreError(self.path, str(exc), self._quarantine()) from exc
        return {k: sorted(v, key=_order) for k, v in sorted(out.items())}

    def _quarantine(self) -> Path | None:
        stamp = _utc_now().strftime("%Y%m%dT%H%M%S%fZ")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        try:
            shutil.copy2(self.path, target)
        except OSError:
            log.exception("could not keep a copy of corrupt taint store %s", self.path)
            return None
        return target

    def save(self, taints: Mapping[tuple[str, str], Sequence[DeviceTaint]]) -> None:
        """Atomically replace the file with ``taints`` (every taint needs ``timeAdded``)."""
        entries = []
        for (pool, device), items in sorted(taints.items()):
            for t in sorted(items, key=_order):
                if t.timeAdded is None:
                    raise ValueError(f"taint {t.key} of {pool}/{device} has no timeAdded")
                entries.append(
                    {
                        "pool": pool,
                        "device": device,
                        "key": t.key,
                        "value": t.value,
                        "effect": t.effect,
                        "timeAdded": rfc3339(t.timeAdded),
                    }
                )
        doc = {
            "version": self.VERSION,
            "checksum": "sha256:" + hashlib.sha256(_canonical(entries)).hexdigest(),
            "taints": entries,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(json.dumps(doc, indent=1).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- controller


class TaintController:
    """Hub -> taints -> store -> ``apply`` callback, batched.

    :meth:`start` loads the store (a corrupt store is reported in ``load_error``,
    logged, and replaced on the next save; its copy is kept), hands the stored
    taints to ``apply`` at once, then follows the hub. Changes arriving within
    ``batch_delay`` seconds of each other cause one recompute and at most one
    ``apply`` call (only when the taints changed). With ``withdraw``, the devices
    :func:`withdrawn_devices` names are handed to it whenever that set changes (the
    stored taints' set at start). Counters: ``republishes``, ``apply_errors``,
    ``store_errors``; ``last_error``.
    """

    def __init__(
        self,
        hub: HealthHub,
        policy: TaintPolicy,
        apply: ApplyCallback,
        *,
        store: TaintStore | None = None,
        batch_delay: float = 0.05,
        clock: Callable[[], dt.datetime] = _utc_now,
        withdraw: WithdrawCallback | None = None,
    ) -> None:
        self.hub = hub
        self.policy = policy
        self.store = store
        self.batch_delay = batch_delay
        self._apply = apply
        self._withdraw = withdraw
        self._clock = clock
        self._taints: TaintMap = {}
        self._withdrawn: frozenset[tuple[str, str]] = frozenset()
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._settled = asyncio.Event()
        self._settled.set()
        self.load_error: TaintStoreError | None = None
        self.last_error: BaseException | None = None
        self.republishes = 0
        self.apply_errors = 0
        self.store_errors = 0

    @property
    def taints(self) -> TaintMap:
        """The taints last handed to ``apply`` (with ``timeAdded``)."""
        return {k: list(v) for k, v in self._taints.items()}

    @property
    def withdrawn(self) -> frozenset[tuple[str, str]]:
        """The devices last handed to ``withdraw``."""
        return self._withdrawn

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("TaintController already started")
        if self.store is not None:
            try:
                self._taints = await asyncio.to_thread(self.store.load)
            except TaintStoreError as exc:
                self.load_error = exc
                self.last_error = exc
                log.error("%s; starting without stored taints", exc)
        if self._taints:
            await self._call_withdraw(withdrawn_devices(self._taints, (), self.policy))
            await self._call_apply(self._taints)
        self._unsubscribe = self.hub.subscribe(self._on_change)
        self._task = asyncio.create_task(self._run(), name="taint-controller")
        self._mark()

    async def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        task, self._task = self._task, None
        await cancel_and_wait([task])

    async def wait_idle(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until no recompute is pending (for tests and orderly shutdown)."""
        async with asyncio.timeout(timeout):
            await self._settled.wait()

    def _on_change(self, changed: list[DeviceState]) -> None:
        self._mark()

    def _mark(self) -> None:
        self._dirty.set()
        self._settled.clear()

    async def _run(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self.batch_delay)
            self._dirty.clear()
            try:
                await self.flush()
            except Exception as exc:
                self.last_error = exc
                log.exception("recomputing device taints failed")
            if not self._dirty.is_set():
                self._settled.set()

    async def flush(self) -> None:
        """Recompute from the hub's snapshot now; save and apply if changed."""
        states = self.hub.snapshot()
        desired = desired_taints(states, self.policy, self._taints)
        stamped = stamp_time_added(desired, self._taints, self._clock())
        await self._call_withdraw(withdrawn_devices(stamped, states, self.policy))
        if stamped == self._taints:
            return
        if self.store is not None:
            try:
                await asyncio.to_thread(self.store.save, stamped)
            except OSError as exc:
                self.store_errors += 1
                self.last_error = exc
                log.error("saving taint store %s failed: %s", self.store.path, exc)
        self._taints = stamped
        await self._call_apply(stamped)

    async def _call_withdraw(self, devices: frozenset[tuple[str, str]]) -> None:
        if self._withdraw is None or devices == self._withdrawn:
            return
        self._withdrawn = devices
        try:
            result = self._withdraw(devices)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            self.apply_errors += 1
            self.last_error = exc
            log.exception("withdrawing unhealthy devices failed")

    async def _call_apply(self, taints: TaintMap) -> None:
        self.republishes += 1
        try:
            result = self._apply({k: list(v) for k, v in taints.items()})
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            self.apply_errors += 1
            self.last_error = exc
            log.exception("applying device taints failed")
