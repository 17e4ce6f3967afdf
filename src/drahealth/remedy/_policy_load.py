"""Loading a remediation policy file (YAML) into :class:`drahealth.core._policy.Policy`.

Owns the file schema (msgspec structs, camelCase, unknown fields refused) and the
checks msgspec cannot do (regexes, durations, label values, effects, escalation
order, duplicate rule names). Every error is a :class:`PolicyError` whose text is
``<file>: <field path>: <problem>``, e.g.
``policy.yaml: rules[2].match.message: rule 'xid': bad regex '(': missing ): (``.
Message patterns are RE2 syntax (no backreferences, no lookaround), so matching
is linear in the message. See docs/policy.md for the format.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import msgspec
import yaml

from drahealth._files import NotARegularFile, read_regular
from drahealth._yaml import YAMLLimits, load_bounded
from drahealth.core import (
    DEFAULT_NODE_TAINT_KEY,
    DEFAULT_TAINT_KEY,
    EFFECT_ORDER,
    KUBELET_CONDITION_TYPES,
    NODE_CONDITION_TYPE,
    REMEDIATION_MODES,
    Action,
    BurnIn,
    Escalation,
    Eviction,
    Exclude,
    Health,
    Hysteresis,
    Limit,
    LimitError,
    Limits,
    Match,
    MessagePattern,
    NodeRollupPolicy,
    NodeTaintPolicy,
    OwnershipPolicy,
    PatternError,
    Policy,
    PolicyError,
    Profile,
    Recovery,
    Rule,
    Step,
    Validate,
    is_qualified_name,
    parse_limit,
    parse_threshold,
)
from drahealth.remedy._repair_load import (
    EscalationSpec,
    RepairSpec,
    build_escalation,
    build_repair,
)
from drahealth.remedy._rules import RuleError, validate_taint

__all__ = ["load_policy", "parse_policy"]

Duration = float | int | str
EffectName = Literal["None", "NoSchedule", "NoExecute"]
HealthName = Literal["Unhealthy", "Unknown"]
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class _Base(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    pass


class _Match(_Base):
    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    attributes: dict[str, str | int | bool] = {}
    health: list[HealthName] = msgspec.field(default_factory=lambda: ["Unhealthy"])
    message: str | None = None


class _Step(_Base):
    after: Duration
    effect: EffectName


class _Action(_Base):
    effect: EffectName = "NoSchedule"
    grace_period: Duration = 0
    escalate: list[_Step] = []
    taint_key: str = DEFAULT_TAINT_KEY
    taint_value: str = ""
    fallback: str | None = None
    outcome: Literal["taint", "ignore", "degraded"] = "taint"


class _Hysteresis(_Base):
    transitions: int = 5
    window: Duration = 30


class _Validate(_Base):
    exec: list[str] = []
    http: str = ""
    timeout: Duration = 10


class _Recovery(_Base):
    healthy_for: Duration = 60
    validate: _Validate | None = None


class _Rule(_Base):
    name: str
    match: _Match = msgspec.field(default_factory=_Match)
    action: _Action = msgspec.field(default_factory=_Action)
    hysteresis: _Hysteresis | None = msgspec.field(default_factory=_Hysteresis)
    recovery: _Recovery | None = None
    escalation: EscalationSpec | None = None
    repair: RepairSpec | None = None


class _Eviction(_Base):
    mode: Literal["delete", "evict"] = "delete"
    max_concurrent_per_node: int = 1
    max_concurrent: int = 10
    per_second: float = 5.0


class _Remediation(_Base):
    mode: str = "auto"
    fallback: str = "quarantine"


class _TaintNode(_Base):
    threshold: int | str
    effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    key: str = DEFAULT_NODE_TAINT_KEY
    max_nodes: int | str = "10%"


class _NodeRollup(_Base):
    enabled: bool = True
    condition_type: str = NODE_CONDITION_TYPE
    taint_node: _TaintNode | None = None


class _BurnIn(_Base):
    validate: _Validate
    effect: Literal["NoSchedule", "None"] = "NoSchedule"
    applies_to: list[Literal["new", "repaired"]] = msgspec.field(
        default_factory=lambda: ["new", "repaired"]
    )
    retry_initial: Duration = 10
    retry_max: Duration = 600


class _Exclude(_Base):
    drivers: list[str] = []
    pools: list[str] = []
    nodes: list[str] = []


class _Ownership(_Base):
    manual_untaint_hold: Duration = "30m"


class _Limits(_Base):
    window: Duration = "10m"
    resume: Literal["manual", "auto"] = "manual"
    cluster: int | str | None = None
    per_driver: int | str | None = None
    per_pool: int | str | None = None
    per_node: int | str | None = None


class _ProfileMatch(_Base):
    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    attributes: dict[str, str | int | bool] = {}


class _Profile(_Base):
    name: str
    match: _ProfileMatch
    rules: list[_Rule] | None = None
    limits: _Limits | None = None
    observe_only: bool = False


class _Policy(_Base):
    api_version: Literal["drahealth.io/v1"]
    kind: Literal["RemediationPolicy"]
    rules: list[_Rule]
    dry_run: bool = False
    eviction: _Eviction = msgspec.field(default_factory=_Eviction)
    exclude_namespaces: list[str] = []
    recovery: _Recovery = msgspec.field(default_factory=_Recovery)
    remediation: _Remediation = msgspec.field(default_factory=_Remediation)
    burn_in: _BurnIn | None = None
    node_rollup: _NodeRollup = msgspec.field(default_factory=_NodeRollup)
    exclude: _Exclude = msgspec.field(default_factory=_Exclude)
    ownership: _Ownership = msgspec.field(default_factory=_Ownership)
    limits: _Limits | None = None
    profiles: list[_Profile] = []
    escalation: EscalationSpec | None = None


#: Modes a fallback may name: the ones that need no DeviceTaintRule API.
FALLBACK_MODES = tuple(m for m in REMEDIATION_MODES if m not in ("auto", "taint-rules"))


#: Largest policy file, in bytes (read no further: a bigger file is refused unparsed).
MAX_POLICY_BYTES = 512 * 1024
#: Most rules a policy may have.
MAX_RULES = 1000
#: Bounds on the policy document (the Job templates inside it included).
POLICY_YAML = YAMLLimits(max_chars=MAX_POLICY_BYTES, max_depth=48, max_aliases=200,
                         max_nodes=200_000)  # fmt: skip


def load_policy(path: str) -> Policy:
    """Read and validate the policy file at ``path`` (at most :data:`MAX_POLICY_BYTES`)."""
    try:
        data, _ = read_regular(path, MAX_POLICY_BYTES)  # a FIFO is refused, not waited on
    except NotARegularFile:
        raise PolicyError(f"{path}: not a regular file") from None
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if len(data) > MAX_POLICY_BYTES:
        raise PolicyError(f"{path}: the file is larger than {MAX_POLICY_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{path}: not UTF-8 text: {exc.reason}") from exc
    return parse_policy(text, path)


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate policy YAML ``text``; errors name ``source`` and the field."""
    if len(text) > MAX_POLICY_BYTES:
        raise PolicyError(f"{source}: the policy is larger than {MAX_POLICY_BYTES} characters")
    try:
        raw = load_bounded(text, POLICY_YAML)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError(f"{source}: {where}invalid YAML: {problem}") from exc
    if not isinstance(raw, dict):
        raise PolicyError(f"{source}: the top level must be a mapping, got {_kind(raw)}")
    rules = raw.get("rules")
    if isinstance(rules, list) and len(rules) > MAX_RULES:
        raise PolicyError(f"{source}: rules: at most {MAX_RULES} rules, got {len(rules)}")
    _check_attributes(raw, source)
    try:
        spec = msgspec.convert(raw, _Policy, strict=True)
    except msgspec.ValidationError as exc:
        raise PolicyError(_validation_text(source, exc)) from exc
    return _build(spec, source)


def _check_attributes(raw: dict[Any, Any], source: str) -> None:
    """Name the attribute whose value is bad (msgspec would say ``attributes[...]``)."""
    rules = raw.get("rules")
    for i, r in enumerate(rules if isinstance(rules, list) else []):
        match = r.get("match") if isinstance(r, dict) else None
        attrs = match.get("attributes") if isinstance(match, dict) else None
        for name, value in (attrs if isinstance(attrs, dict) else {}).items():
            if not isinstance(value, str | int | bool):
                raise PolicyError(
                    f"{source}: rules[{i}].match.attributes.{name}: expected a string, "
                    f"integer or boolean, got {_kind(value)}"
                )


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


def _validation_text(source: str, exc: msgspec.ValidationError) -> str:
    message = str(exc)
    problem, _, path = message.rpartition(" - at `")
    if not problem:
        return f"{source}: (top level): {message}"
    path = path.rstrip("`").removeprefix("$").removeprefix(".") or "(top level)"
    return f"{source}: {path}: {problem}"


class _Builder:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, problem: str) -> PolicyError:
        return PolicyError(f"{self.source}: {path}: {problem}")

    def seconds(self, path: str, value: Duration, *, positive: bool = False) -> float:
        if isinstance(value, bool):
            raise self.fail(path, f"expected a duration, got {value!r}")
        if isinstance(value, int | float):
            seconds = float(value)
        else:
            m = _DURATION.match(value.strip())
            if m is None:
                raise self.fail(path, f"bad duration {value!r}: use seconds or e.g. 30s, 5m, 1h")
            seconds = float(m.group(1)) * _UNITS[m.group(2)]
        if not math.isfinite(seconds):
            raise self.fail(path, f"duration {value!r} must be a finite number of seconds")
        if seconds < 0 or (positive and seconds == 0):
            raise self.fail(path, f"duration {value!r} must be {'> 0' if positive else '>= 0'}")
        return seconds

    def fallback(self, path: str, value: str) -> str:
        if value not in FALLBACK_MODES:
            raise self.fail(
                f"{path}.fallback",
                f"unknown fallback {value!r}: choose one of {', '.join(FALLBACK_MODES)}",
            )
        return value

    def regex(self, path: str, rule: str, pattern: str) -> MessagePattern:
        try:
            return MessagePattern(pattern)
        except PatternError as exc:
            raise self.fail(
                path,
                f"rule {rule!r}: bad regex {pattern!r}: {exc} (RE2 syntax: no "
                "backreferences, no lookahead or lookbehind)",
            ) from exc

    def recovery(self, path: str, r: _Recovery) -> Recovery:
        validate = None
        if r.validate is not None:
            v = r.validate
            if bool(v.exec) == bool(v.http):
                raise self.fail(f"{path}.validate", "set exactly one of exec or http")
            if v.http and not v.http.startswith(("http://", "https://")):
                raise self.fail(f"{path}.validate.http", f"{v.http!r} is not an http(s) URL")
            timeout = self.seconds(f"{path}.validate.timeout", v.timeout, positive=True)
            validate = Validate(tuple(v.exec), v.http, timeout)
        return Recovery(self.seconds(f"{path}.healthyFor", r.healthy_for), validate)

    def rule(self, path: str, r: _Rule, default_recovery: _Recovery) -> Rule:
        if not r.name.strip():
            raise self.fail(f"{path}.name", "must not be empty")
        m = r.match
        match = Match(
            driver=m.driver,
            pool=m.pool,
            device=m.device,
            attributes=dict(m.attributes),
            health=frozenset(Health(h) for h in m.health),
            message=(
                None
                if m.message is None
                else self.regex(f"{path}.match.message", r.name, m.message)
            ),
        )
        if not m.health:
            raise self.fail(f"{path}.match.health", "must list at least one health")
        a = r.action
        if a.outcome != "taint":
            _quiet_action(self, f"{path}.action", a)
        try:
            validate_taint(a.taint_key, a.taint_value, a.effect)
        except RuleError as exc:
            field = "taintKey" if "key" in str(exc).split(":")[0] else "taintValue"
            raise self.fail(f"{path}.action.{field}", str(exc)) from exc
        steps = []
        last = -1.0
        for i, s in enumerate(a.escalate):
            after = self.seconds(f"{path}.action.escalate[{i}].after", s.after)
            if after <= last:
                raise self.fail(f"{path}.action.escalate[{i}].after", "steps must be in order")
            if EFFECT_ORDER[s.effect] <= EFFECT_ORDER[a.effect]:
                raise self.fail(
                    f"{path}.action.escalate[{i}].effect",
                    f"{s.effect} does not escalate from {a.effect}",
                )
            last = after
            steps.append(Step(after, s.effect))
        action = Action(
            effect=a.effect,
            grace=self.seconds(f"{path}.action.gracePeriod", a.grace_period),
            escalate=tuple(steps),
            taint_key=a.taint_key,
            taint_value=a.taint_value,
            fallback=None if a.fallback is None else self.fallback(f"{path}.action", a.fallback),
            outcome=a.outcome,
        )
        hysteresis = None
        if r.hysteresis is not None:
            if r.hysteresis.transitions < 2:
                raise self.fail(f"{path}.hysteresis.transitions", "must be at least 2")
            window = self.seconds(f"{path}.hysteresis.window", r.hysteresis.window, positive=True)
            hysteresis = Hysteresis(r.hysteresis.transitions, window)
        recovery_path = f"{path}.recovery" if r.recovery is not None else "recovery"
        recovery = self.recovery(recovery_path, r.recovery or default_recovery)
        return Rule(
            r.name, match, action, hysteresis, recovery,
            escalation=None if r.escalation is None
            else build_escalation(self, f"{path}.escalation", r.escalation),
            repair=None if r.repair is None else build_repair(self, f"{path}.repair", r.repair),
        )  # fmt: skip


def _build(spec: _Policy, source: str) -> Policy:
    b = _Builder(source)
    if not spec.rules:
        raise b.fail("rules", "must list at least one rule")
    b.recovery("recovery", spec.recovery)
    rules = []
    seen: dict[str, int] = {}
    for i, r in enumerate(spec.rules):
        if r.name in seen:
            raise b.fail(
                f"rules[{i}].name", f"duplicate rule name {r.name!r} (rules[{seen[r.name]}])"
            )
        seen[r.name] = i
        rules.append(b.rule(f"rules[{i}]", r, spec.recovery))
    e = spec.eviction
    for field, value in (
        ("maxConcurrentPerNode", e.max_concurrent_per_node),
        ("maxConcurrent", e.max_concurrent),
    ):
        if value < 1:
            raise b.fail(f"eviction.{field}", f"must be at least 1, got {value}")
    if not e.per_second > 0:
        raise b.fail("eviction.perSecond", f"must be > 0, got {e.per_second}")
    eviction = Eviction(e.mode, e.max_concurrent_per_node, e.max_concurrent, float(e.per_second))
    mode = spec.remediation.mode
    if mode not in REMEDIATION_MODES:
        raise b.fail(
            "remediation.mode",
            f"unknown mode {mode!r}: choose one of {', '.join(REMEDIATION_MODES)}",
        )
    fallback = b.fallback("remediation", spec.remediation.fallback)
    profiles = _profiles(b, spec, seen)
    return Policy(
        tuple(rules),
        spec.dry_run,
        eviction,
        frozenset(spec.exclude_namespaces),
        remediation_mode=mode,
        remediation_fallback=fallback,
        burn_in=None if spec.burn_in is None else _burn_in(b, spec.burn_in),
        node_rollup=_node_rollup(b, spec.node_rollup, {r.action.taint_key for r in rules}),
        exclude=_exclude(b, spec.exclude),
        ownership=OwnershipPolicy(
            b.seconds("ownership.manualUntaintHold", spec.ownership.manual_untaint_hold)
        ),
        limits=None if spec.limits is None else _limits(b, "limits", spec.limits),
        profiles=profiles,
        escalation=(
            Escalation(episodes=0)  # without the section: failed repairs only
            if spec.escalation is None
            else build_escalation(b, "escalation", spec.escalation)
        ),
    )


def _limits(b: _Builder, path: str, lim: _Limits) -> Limits:
    """A ``limits`` section (the policy's or a profile's): at least one cap, each a
    count of at least 1 or a percentage in (0, 100], and a window > 0."""
    caps: dict[str, Limit] = {}
    for name, value in (
        ("cluster", lim.cluster),
        ("perDriver", lim.per_driver),
        ("perPool", lim.per_pool),
        ("perNode", lim.per_node),
    ):
        if value is None:
            continue
        try:
            caps[name] = parse_limit(value)
        except LimitError as exc:
            raise b.fail(f"{path}.{name}", str(exc)) from exc
    if not caps:
        raise b.fail(path, "set at least one of cluster, perDriver, perPool, perNode")
    return Limits(
        window=b.seconds(f"{path}.window", lim.window, positive=True),
        resume=lim.resume,
        cluster=caps.get("cluster"),
        per_driver=caps.get("perDriver"),
        per_pool=caps.get("perPool"),
        per_node=caps.get("perNode"),
    )


def _profiles(b: _Builder, spec: _Policy, rule_names: dict[str, int]) -> tuple[Profile, ...]:
    """The ``profiles`` section: unique names, a match naming something, rules whose
    names are unique across the whole policy (a rule annotation names one rule)."""
    out: list[Profile] = []
    names: dict[str, int] = {}
    where = {name: f"rules[{i}]" for name, i in rule_names.items()}
    for i, p in enumerate(spec.profiles):
        path = f"profiles[{i}]"
        if not p.name.strip():
            raise b.fail(f"{path}.name", "must not be empty")
        if p.name in names:
            raise b.fail(
                f"{path}.name", f"duplicate profile name {p.name!r} (profiles[{names[p.name]}])"
            )
        names[p.name] = i
        m = p.match
        if m.driver is None and m.pool is None and m.device is None and not m.attributes:
            raise b.fail(
                f"{path}.match",
                "name at least one of driver, pool, device, attributes (a profile for every "
                "device would replace the policy's rules everywhere)",
            )
        match = Match(m.driver, m.pool, m.device, dict(m.attributes))
        rules = None
        if p.rules is not None:
            if not p.rules:
                raise b.fail(f"{path}.rules", "must list at least one rule (or leave it out "
                             "to use the policy's rules)")  # fmt: skip
            rules = []
            for j, r in enumerate(p.rules):
                rpath = f"{path}.rules[{j}]"
                if r.name in where:
                    raise b.fail(
                        f"{rpath}.name",
                        f"duplicate rule name {r.name!r} ({where[r.name]}); rule names are "
                        "unique across the policy and its profiles",
                    )
                where[r.name] = rpath
                rules.append(b.rule(rpath, r, spec.recovery))
        limits = None if p.limits is None else _limits(b, f"{path}.limits", p.limits)
        out.append(Profile(p.name, match, None if rules is None else tuple(rules), limits,
                           p.observe_only))  # fmt: skip
    return tuple(out)


def _exclude(b: _Builder, e: _Exclude) -> Exclude:
    """The ``exclude`` section: driver, pool and node names or globs, none empty."""
    for field, names in (("drivers", e.drivers), ("pools", e.pools), ("nodes", e.nodes)):
        for i, name in enumerate(names):
            if not name.strip() or len(name) > 253:
                raise b.fail(
                    f"exclude.{field}[{i}]",
                    f"{name!r} must be a name or glob of 1-253 characters",
                )
    return Exclude(tuple(e.drivers), tuple(e.pools), tuple(e.nodes))


def _node_rollup(b: _Builder, r: _NodeRollup, rule_keys: set[str]) -> NodeRollupPolicy:
    """The ``nodeRollup`` section: the Node condition and the optional node taint (its key
    differs from the rules' taint keys, which mode node-taint puts on nodes too)."""
    path = "nodeRollup"
    kind = r.condition_type
    if not is_qualified_name(kind):
        raise b.fail(
            f"{path}.conditionType",
            f"{kind!r} is not a qualified name ([prefix/]name, e.g. DRADevicesHealthy)",
        )
    if kind in KUBELET_CONDITION_TYPES:
        raise b.fail(
            f"{path}.conditionType",
            f"{kind!r} is the kubelet's condition; choose another type (default "
            f"{NODE_CONDITION_TYPE})",
        )
    taint = None
    t = r.taint_node
    if t is not None:
        thresholds = {}
        for name, value in (("threshold", t.threshold), ("maxNodes", t.max_nodes)):
            try:
                thresholds[name] = parse_threshold(value)
            except ValueError as exc:
                raise b.fail(f"{path}.taintNode.{name}", str(exc)) from exc
        try:
            validate_taint(t.key, "", t.effect)
        except RuleError as exc:
            raise b.fail(f"{path}.taintNode.key", str(exc)) from exc
        if t.key in rule_keys:
            raise b.fail(
                f"{path}.taintNode.key",
                f"{t.key!r} is a rule's taint key (node-taint mode writes it on nodes too); "
                f"choose another, e.g. {DEFAULT_NODE_TAINT_KEY}",
            )
        taint = NodeTaintPolicy(thresholds["threshold"], t.effect, t.key, thresholds["maxNodes"])
    return NodeRollupPolicy(r.enabled, kind, taint)


def _quiet_action(b: _Builder, path: str, a: _Action) -> None:
    """An ``ignore`` or ``degraded`` rule writes no taint: taint fields are a mistake."""
    for field, given in (
        ("escalate", bool(a.escalate)),
        ("gracePeriod", a.grace_period not in (0, "0", "0s")),
        ("taintKey", a.taint_key != DEFAULT_TAINT_KEY),
        ("taintValue", bool(a.taint_value)),
        ("fallback", a.fallback is not None),
    ):
        if given:
            raise b.fail(f"{path}.{field}", f"has no use with outcome {a.outcome} (no taint)")


def _burn_in(b: _Builder, r: _BurnIn) -> BurnIn:
    """The ``burnIn`` section: the validation new and repaired devices must pass."""
    validate = b.recovery("burnIn", _Recovery(validate=r.validate)).validate
    assert validate is not None  # _Recovery.validate was given
    if not r.applies_to:
        raise b.fail("burnIn.appliesTo", "must list new, repaired or both")
    initial = b.seconds("burnIn.retryInitial", r.retry_initial, positive=True)
    most = b.seconds("burnIn.retryMax", r.retry_max, positive=True)
    if most < initial:
        raise b.fail("burnIn.retryMax", f"must be at least retryInitial ({initial:g} s)")
    return BurnIn(validate, r.effect, frozenset(r.applies_to), initial, most)
