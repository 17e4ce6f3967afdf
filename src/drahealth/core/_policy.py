"""The remediation policy model: which device health leads to which taint, and when.

Owns the frozen policy records (:class:`Policy`, :class:`Rule`, :class:`Match`,
:class:`Action`, :class:`Hysteresis`, :class:`Recovery`, :class:`Eviction`),
:class:`DeviceFacts` (what the controller knows of a device) and rule matching, and the
remediation mode the policy asks for (globally, and a per-rule fallback for clusters that
serve no DeviceTaintRule API).
Plain data and regexes; the YAML file format lives in ``drahealth.remedy._policy_load``.

Message patterns are RE2 (:class:`MessagePattern`): matching takes time linear in the
message, whatever the pattern, so no policy can stall the controller with a
backtracking regex; RE2 refuses what it cannot match in linear time (backreferences,
lookaround). The text matched is at most ``HEALTH_MESSAGE_MAX_BYTES`` (1 KiB, the
kubelet's cut of a health message) of the message.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

from drahealth.core._escalation import Escalation
from drahealth.core._health import HEALTH_MESSAGE_MAX_BYTES, Health
from drahealth.core._holds import Exclude, OwnershipPolicy
from drahealth.core._limits import Limits
from drahealth.core._repair import Repair
from drahealth.core._rollup import NodeRollupPolicy

__all__ = [
    "BURN_IN_NEW",
    "BURN_IN_REPAIRED",
    "DEFAULT_TAINT_KEY",
    "OUTCOMES",
    "Action",
    "BurnIn",
    "DeviceFacts",
    "Eviction",
    "Hysteresis",
    "Match",
    "MessagePattern",
    "PatternError",
    "Policy",
    "PolicyError",
    "Profile",
    "Recovery",
    "Rule",
    "Step",
    "Validate",
    "Want",
    "match_text",
]

DEFAULT_TAINT_KEY: Final = "drahealth.io/unhealthy"
Effect = Literal["None", "NoSchedule", "NoExecute"]
EFFECT_ORDER: Final[dict[str, int]] = {"None": 0, "NoSchedule": 1, "NoExecute": 2}
Outcome = Literal["taint", "ignore", "degraded"]
OUTCOMES: Final = ("taint", "ignore", "degraded")
AttributeValue = str | int | bool


class PolicyError(ValueError):
    """A policy that cannot be used; the text is ``<source>: <field path>: <problem>``."""


class PatternError(ValueError):
    """A message pattern RE2 refuses; the text is RE2's reason."""


_RE2_OPTIONS: Any = re2.Options()
_RE2_OPTIONS.log_errors = False  # the error comes back as an exception, not on stderr


def match_text(message: str, limit: int = HEALTH_MESSAGE_MAX_BYTES) -> str:
    """The part of ``message`` a pattern sees: its first ``limit`` UTF-8 bytes.

    The kubelet cuts health messages to this size; cutting here too bounds the
    matching work whatever a source sends. A cut never splits a character.
    """
    if len(message) <= limit // 4:  # at most 4 bytes a character: surely short enough
        return message
    head = message[:limit]  # a character is at least one byte
    data = head.encode("utf-8")
    if len(data) <= limit:
        return head
    return data[:limit].decode("utf-8", errors="ignore")


class MessagePattern:
    """A health-message regex compiled by RE2: matching is linear in the text's length.

    RE2 syntax (https://github.com/google/re2/wiki/Syntax): Perl-like classes,
    repetition, alternation, groups and flags such as ``(?i)``, but no
    backreferences and no lookahead/lookbehind. :class:`PatternError` names why a
    pattern is refused.
    """

    __slots__ = ("_regexp", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        try:
            self._regexp: Any = re2.compile(pattern, _RE2_OPTIONS)
        except re2.error as exc:
            reason = exc.args[0] if exc.args else exc
            if isinstance(reason, bytes):
                reason = reason.decode("utf-8", errors="replace")
            raise PatternError(str(reason)) from None

    def search(self, message: str) -> bool:
        """Whether the pattern occurs in (the first 1 KiB of) ``message``."""
        return self._regexp.search(match_text(message)) is not None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessagePattern) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def __repr__(self) -> str:
        return f"MessagePattern({self.pattern!r})"


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """A device as the controller sees it (attributes from its ResourceSlice)."""

    driver: str
    pool: str
    device: str
    node: str = ""
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Match:
    """Which devices and which health a rule applies to (all given fields must match).

    ``driver`` and ``pool`` are exact; ``device`` may be a glob (``gpu-*``);
    ``attributes`` are exact values; ``message`` is an RE2 pattern searched for in
    the health message (a ``str`` or ``re.Pattern`` given here is compiled by RE2).
    """

    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    health: frozenset[Health] = frozenset({Health.UNHEALTHY})
    message: MessagePattern | None = None

    def __post_init__(self) -> None:
        given: object = self.message
        if isinstance(given, re.Pattern):
            given = given.pattern
        if isinstance(given, str):
            object.__setattr__(self, "message", MessagePattern(given))

    def device_matches(self, facts: DeviceFacts) -> bool:
        if self.driver is not None and facts.driver != self.driver:
            return False
        if self.pool is not None and facts.pool != self.pool:
            return False
        if self.device is not None and not fnmatch.fnmatchcase(facts.device, self.device):
            return False
        return all(_same(facts.attributes.get(k), v) for k, v in self.attributes.items())

    def matches(self, facts: DeviceFacts, health: Health, message: str) -> bool:
        if health not in self.health or not self.device_matches(facts):
            return False
        return self.message is None or self.message.search(message)


def _same(value: AttributeValue | None, wanted: AttributeValue) -> bool:
    """Equal and of the same type (``True`` is not ``1``)."""
    return type(value) is type(wanted) and value == wanted


@dataclass(frozen=True, slots=True)
class Want:
    """The controller taint a device should carry now (what the engine asks for)."""

    effect: str
    key: str
    value: str
    rule: str
    reason: str


@dataclass(frozen=True, slots=True)
class Step:
    """Escalation: ``after`` seconds of bad health (from the first taint), use ``effect``."""

    after: float
    effect: Effect


@dataclass(frozen=True, slots=True)
class Action:
    """The taint a matching device gets, after ``grace`` seconds of bad health."""

    effect: Effect = "NoSchedule"
    grace: float = 0.0
    escalate: tuple[Step, ...] = ()
    taint_key: str = DEFAULT_TAINT_KEY
    #: Empty: derived from the health ("unhealthy" / "unknown").
    taint_value: str = ""
    #: This rule's remediation when the controller runs without DeviceTaintRules because
    #: the server serves none (mode ``auto``); None: the policy's ``remediation_fallback``.
    fallback: str | None = None
    #: ``taint`` (the default), ``ignore`` (the match ends the search and nothing is done:
    #: no taint, Event or history) or ``degraded`` (shown in views and Events, no taint).
    outcome: Outcome = "taint"

    def effect_at(self, tainted_for: float) -> Effect:
        effect = self.effect
        for step in self.escalate:
            if tainted_for >= step.after and EFFECT_ORDER[step.effect] > EFFECT_ORDER[effect]:
                effect = step.effect
        return effect


@dataclass(frozen=True, slots=True)
class Hysteresis:
    """``transitions`` health changes within ``window`` seconds hold the device tainted."""

    transitions: int = 5
    window: float = 30.0


@dataclass(frozen=True, slots=True)
class Validate:
    """A check that must pass before a recovered device is untainted."""

    exec: tuple[str, ...] = ()
    http: str = ""
    timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class Recovery:
    """Untaint after ``healthy_for`` seconds of continuous Healthy (and ``validate``)."""

    healthy_for: float = 60.0
    validate: Validate | None = None


BURN_IN_NEW: Final = "new device"
BURN_IN_REPAIRED: Final = "after repair"


@dataclass(frozen=True, slots=True)
class BurnIn:
    """Devices that appear (``new``) or come back from a repair (``repaired``) carry a
    burn-in taint until ``validate`` passes; a failed validation is retried after
    ``retry_initial`` seconds, doubling up to ``retry_max``."""

    validate: Validate
    effect: Effect = "NoSchedule"
    applies_to: frozenset[str] = frozenset({"new", "repaired"})
    retry_initial: float = 10.0
    retry_max: float = 600.0

    def applies(self, why: str) -> bool:
        """Whether a device that burns in for ``why`` (:data:`BURN_IN_NEW`, ...) does."""
        kind = {BURN_IN_NEW: "new", BURN_IN_REPAIRED: "repaired"}.get(why)
        return kind in self.applies_to


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    match: Match
    action: Action = field(default_factory=Action)
    hysteresis: Hysteresis | None = field(default_factory=Hysteresis)
    recovery: Recovery = field(default_factory=Recovery)
    #: Needs-a-human limits of this rule's devices (None: the policy's ``escalation``).
    escalation: Escalation | None = None
    #: What runs on a tainted, drained device before recovery may untaint it (None: none).
    repair: Repair | None = None


@dataclass(frozen=True, slots=True)
class Eviction:
    """How pods leave a NoExecute device.

    ``delete``: the cluster's device-taint eviction controller deletes them (the
    upstream path). ``evict``: this controller evicts them through the Eviction API,
    so PodDisruptionBudgets are honoured, at most ``max_concurrent_per_node`` /
    ``max_concurrent`` in flight and ``per_second`` started per second.
    """

    mode: Literal["delete", "evict"] = "delete"
    max_concurrent_per_node: int = 1
    max_concurrent: int = 10
    per_second: float = 5.0


@dataclass(frozen=True, slots=True)
class Profile:
    """A group of devices with their own rules and limits (e.g. one pool or one class).

    The first profile whose ``match`` covers a device (driver, pool, device glob,
    attributes; its health and message are not used) owns it: ``rules`` replace the
    policy's rules for it (None: the policy's rules apply), ``limits`` add caps of its
    own to the policy's, and ``observe_only`` makes its devices report-only (Events and
    history, nothing written), for a staged rollout.
    """

    name: str
    match: Match
    rules: tuple[Rule, ...] | None = None
    limits: Limits | None = None
    observe_only: bool = False


@dataclass(frozen=True, slots=True)
class Policy:
    rules: tuple[Rule, ...]
    dry_run: bool = False
    eviction: Eviction = field(default_factory=Eviction)
    #: Pods in these namespaces are never evicted by the controller.
    exclude_namespaces: frozenset[str] = frozenset()
    #: One of ``REMEDIATION_MODES`` (``auto``: DeviceTaintRules where served).
    remediation_mode: str = "auto"
    #: What ``auto`` does where no DeviceTaintRule API is served (a mode without rules).
    remediation_fallback: str = "quarantine"
    #: The Node condition and optional node taint a node's device health adds up to.
    node_rollup: NodeRollupPolicy = field(default_factory=NodeRollupPolicy)
    #: The burn-in gate for new and repaired devices (None: none).
    burn_in: BurnIn | None = None
    #: Needs-a-human limits of rules without their own (see ``drahealth.core._escalation``);
    #: without an ``escalation`` section episodes are not counted, failed repairs are.
    escalation: Escalation = field(default_factory=lambda: Escalation(episodes=0))

    #: Blast-radius limits on new taints (None: none); see ``drahealth.core._breaker``.
    limits: Limits | None = None
    #: Device groups with their own rules, limits and observe-only mode; first match wins.
    profiles: tuple[Profile, ...] = ()
    #: Drivers, pools and nodes the controller never acts on (see ``drahealth.core._holds``).
    exclude: Exclude = field(default_factory=Exclude)
    #: How long a controller rule deleted by someone else stays deleted.
    ownership: OwnershipPolicy = field(default_factory=OwnershipPolicy)

    def rule_named(self, name: str) -> Rule | None:
        return next((r for r in self.all_rules() if r.name == name), None)

    def all_rules(self) -> tuple[Rule, ...]:
        """The policy's rules, then each profile's own (rule names are unique)."""
        if not self.profiles:
            return self.rules
        out = list(self.rules)
        for p in self.profiles:
            out += p.rules or ()
        return tuple(out)

    def profile_for(self, facts: DeviceFacts) -> Profile | None:
        """The first profile whose match covers the device, or None."""
        for profile in self.profiles:
            if profile.match.device_matches(facts):
                return profile
        return None

    def rules_for(self, facts: DeviceFacts) -> tuple[Rule, ...]:
        """The rules that apply to the device: its profile's, else the policy's."""
        if self.profiles:
            profile = self.profile_for(facts)
            if profile is not None and profile.rules is not None:
                return profile.rules
        return self.rules

    def rule_for(self, facts: DeviceFacts, health: Health, message: str) -> Rule | None:
        """The first rule matching the device in this health, or None."""
        for rule in self.rules_for(facts):
            if rule.match.matches(facts, health, message):
                return rule
        return None
