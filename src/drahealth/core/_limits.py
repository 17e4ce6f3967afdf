"""Blast-radius limits as the policy writes them: counts or percentages per scope.

Owns :class:`Limit` (one cap: ``4`` or ``"10%"``), :class:`Limits` (the caps of a policy
or a profile, with their sliding window and how a tripped group resumes) and
:func:`parse_limit`. Plain data; the circuit breaker that enforces them is
``drahealth.core._breaker``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, Literal

__all__ = ["LIMIT_SCOPES", "Limit", "LimitError", "Limits", "parse_limit"]

#: The policy's field name of each scope a limit may be set for, with the breaker's scope.
LIMIT_SCOPES: Final = (
    ("cluster", "cluster"),
    ("perDriver", "driver"),
    ("perPool", "pool"),
    ("perNode", "node"),
)
ResumeMode = Literal["manual", "auto"]
_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)\s*%$")
_COUNT = re.compile(r"^\d+$")


class LimitError(ValueError):
    """A limit that cannot be used; the text says what is wrong and what is allowed."""


@dataclass(frozen=True, slots=True)
class Limit:
    """A cap on new taints in one group: ``count`` devices, or ``percent`` of its devices.

    ``text`` is the limit as written (``"10%"``, ``"4"``), for reports.
    """

    text: str
    count: int | None = None
    percent: Fraction | None = None

    def max_for(self, size: int) -> int:
        """The most new taints allowed in a group of ``size`` known devices.

        A percentage is taken of the devices known in the group, rounded down, and is
        never less than 1: a single bad device can always be tainted.
        """
        if self.count is not None:
            return self.count
        assert self.percent is not None
        return max(1, math.floor(size * self.percent / 100))


def parse_limit(value: object) -> Limit:
    """``4``, ``"4"`` or ``"10%"`` (``"2.5%"``) -> :class:`Limit`.

    A count is at least 1; a percentage is more than 0 and at most 100.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise LimitError(f'expected a count (e.g. 4) or a percentage (e.g. "10%"), got {value!r}')
    text = str(value).strip()
    if isinstance(value, int) or _COUNT.match(text):
        count = int(text)
        if count < 1:
            raise LimitError(f"a count must be at least 1, got {count}")
        return Limit(text, count=count)
    m = _PERCENT.match(text)
    if m is None:
        raise LimitError(f'bad limit {value!r}: use a count (e.g. 4) or a percentage (e.g. "10%")')
    percent = Fraction(m.group(1))
    if not 0 < percent <= 100:
        raise LimitError(f"a percentage must be more than 0% and at most 100%, got {text}")
    return Limit(text, percent=percent)


@dataclass(frozen=True, slots=True)
class Limits:
    """How many devices may be newly tainted within ``window`` seconds, per scope.

    ``cluster`` caps the whole cluster (in a profile's limits: the profile's devices);
    ``per_driver``, ``per_pool`` and ``per_node`` cap each driver, pool and node.
    ``resume``: ``manual`` (a tripped group stays tripped until ``drahealth resume``)
    or ``auto`` (it resumes once what it holds fits under the limit again).
    """

    window: float = 600.0
    resume: ResumeMode = "manual"
    cluster: Limit | None = None
    per_driver: Limit | None = None
    per_pool: Limit | None = None
    per_node: Limit | None = None

    def by_scope(self) -> tuple[tuple[str, Limit], ...]:
        """(breaker scope, limit) of each cap that is set."""
        out = []
        for scope, limit in (
            ("cluster", self.cluster),
            ("driver", self.per_driver),
            ("pool", self.per_pool),
            ("node", self.per_node),
        ):
            if limit is not None:
                out.append((scope, limit))
        return tuple(out)
