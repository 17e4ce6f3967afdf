"""The burn-in gate's bookkeeping: which devices burn in, since when, and when to validate.

Owns :class:`BurnInTracker` and :class:`BurnInDevice`. Sans-I/O: time is passed in;
the :class:`~drahealth.core.RemedyEngine` owns one tracker and merges its taints into
its wants, the controller runs the validations and reports their results.

A device burns in when it appears (:data:`BURN_IN_NEW`) or comes back from a repair
(:data:`BURN_IN_REPAIRED`), if the policy's ``burnIn.appliesTo`` names that case. It
wants the taint ``drahealth.io/burn-in=<new|repaired>`` with ``burnIn.effect`` until
``burnIn.validate`` passes; a failed validation is retried after ``retryInitial``
seconds, doubling each time up to ``retryMax``. A device that is bad by a rule is not
validated until the rule no longer wants a taint for it (its own taint covers it
meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from drahealth.core._health import DeviceKey
from drahealth.core._policy import BURN_IN_NEW, BURN_IN_REPAIRED, BurnIn

__all__ = ["BURN_IN_RULE", "BURN_IN_TAINT_KEY", "BurnInDevice", "BurnInTracker", "burn_in_why"]

BURN_IN_TAINT_KEY: Final = "drahealth.io/burn-in"
#: The policy-rule name a burn-in taint carries (no policy rule of the policy makes it).
BURN_IN_RULE: Final = "burn-in"
#: The taint value per reason (a label value), and back.
_VALUES: Final = {BURN_IN_NEW: "new", BURN_IN_REPAIRED: "repaired"}
_WHYS: Final = {v: k for k, v in _VALUES.items()}


def burn_in_why(value: str) -> str | None:
    """The reason a burn-in taint's value (or a reason) stands for; None if neither."""
    if value in _VALUES:
        return value
    return _WHYS.get(value)


@dataclass(slots=True)
class BurnInDevice:
    """One device burning in."""

    why: str
    since: float
    state: Literal["waiting", "validating"] = "waiting"
    failures: int = 0
    next_try: float = float("-inf")
    last: str = ""  # the last validation's detail

    @property
    def value(self) -> str:
        return _VALUES[self.why]


class BurnInTracker:
    """See the module docstring. ``policy`` None: nothing ever burns in."""

    def __init__(self, policy: BurnIn | None) -> None:
        self.policy = policy
        self.devices: dict[DeviceKey, BurnInDevice] = {}
        #: bumped on every change a view could show (a device starts, fails or passes)
        self.version = 0

    def start(self, key: DeviceKey, why: str, now: float) -> bool:
        """Begin burning ``key`` in for ``why``; False if the policy does not ask for it.

        A device already burning in keeps its start; a repair during a burn-in starts
        the validation over (the repair changed the device).
        """
        if self.policy is None or why not in _VALUES or not self.policy.applies(why):
            return False
        d = self.devices.get(key)
        if d is None:
            self.devices[key] = BurnInDevice(why, now)
        elif d.state == "waiting":
            d.why, d.failures, d.next_try = why, 0, float("-inf")
        self.version += 1
        return True

    def resume(self, key: DeviceKey, why: str, since: float) -> None:
        """A burn-in found at start (a rule, a node listing, the state key) goes on."""
        if self.policy is None or why not in _VALUES or key in self.devices:
            return
        self.devices[key] = BurnInDevice(why, since)
        self.version += 1

    def forget(self, key: DeviceKey) -> None:
        if self.devices.pop(key, None) is not None:
            self.version += 1

    def due(self, now: float, ready: set[DeviceKey] | None = None) -> list[DeviceKey]:
        """Devices whose validation should start now (marked validating).

        ``ready``: only these may start (the engine leaves out devices a rule taints).
        """
        out = []
        for key, d in self.devices.items():
            if d.state == "waiting" and d.next_try <= now and (ready is None or key in ready):
                d.state = "validating"
                out.append(key)
        return sorted(out)

    def result(self, key: DeviceKey, ok: bool, now: float, detail: str = "") -> bool | None:
        """A validation's answer: True passed (the device leaves burn-in), False failed
        (retried later), None if the device was not validating (forgotten meanwhile)."""
        d = self.devices.get(key)
        if d is None or d.state != "validating" or self.policy is None:
            return None
        self.version += 1
        if ok:
            del self.devices[key]
            return True
        d.state, d.last = "waiting", detail
        d.failures += 1
        delay = self.policy.retry_initial * 2.0 ** min(d.failures - 1, 60)
        d.next_try = now + min(delay, self.policy.retry_max)
        return False

    def next_wakeup(self, now: float) -> float | None:
        """The earliest retry still to come (validations ready now start at once)."""
        times = [d.next_try for d in self.devices.values() if d.state == "waiting"]
        future = [t for t in times if t > now]
        return min(future) if future else None
