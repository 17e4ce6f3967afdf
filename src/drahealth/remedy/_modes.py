"""Which remediation mode the controller runs in, and why, on the server it talks to.

Owns :class:`ModeChoice` (the running mode, the reason in words, the DeviceTaintRule
``apiVersion`` used or none, the server's version, whether the served rule API has the
taint effect ``None``) and :func:`resolve_mode`, which maps the operator's request
(``--remediation-mode`` or the policy's ``remediation``), what discovery found and the
dry-run switch onto it, and :func:`device_mode` / :func:`mode_writes`: the mode one bad
device's wanted taint is carried out in, and whether that writes anything. The choice
itself among served APIs is the core's
:func:`~drahealth.core.choose_remediation_mode`; this adds what the controller needs on
top: a dry run where effect ``None`` does not exist (Kubernetes 1.34) or where no rule is
written runs report-only, said so. No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from drahealth.core import Policy, Want, choose_remediation_mode

__all__ = ["ModeChoice", "ModeError", "device_mode", "mode_on", "mode_writes", "resolve_mode"]

GROUP = "resource.k8s.io"
_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


class ModeError(ValueError):
    """The requested mode cannot run on this server (the text says why and what to do)."""


@dataclass(frozen=True, slots=True)
class ModeChoice:
    """The mode the controller runs in; see the module docstring."""

    mode: str
    why: str
    #: ``resource.k8s.io/<version>`` of the DeviceTaintRule API used, None if not served
    rules_api: str | None = None
    server_version: str = ""
    #: ``auto`` fell back because no rule API is served: rules' own fallbacks apply
    fallback_path: bool = False
    #: the served rule API knows effect ``None`` (1.35 on)
    effect_none: bool = True

    def line(self) -> str:
        """The start-up log line: ``remediation mode: node-taint (auto: ...)``."""
        return f"remediation mode: {self.mode} ({self.why})"

    def as_json(self) -> dict[str, Any]:
        """The history ConfigMap's ``mode`` key (``drahealth status`` prints it)."""
        return {
            "mode": self.mode,
            "why": self.why,
            "deviceTaintRuleAPI": self.rules_api,
            "serverVersion": self.server_version,
        }


def server_minor(server_version: str) -> int | None:
    """``v1.34.2`` -> 34; None when the version does not say (or is not 1.x)."""
    m = _VERSION.match(server_version.strip())
    if m is None or m.group(1) != "1":
        return None
    return int(m.group(2))


def _has_effect_none(rules_version: str | None, server_version: str) -> bool:
    if rules_version is None:
        return False
    if rules_version != "v1alpha3":
        return True  # v1beta2 (1.36) and v1 (1.37+) have it
    minor = server_minor(server_version)
    return minor is not None and minor >= 35  # unknown: assume the 1.34 alpha API


def resolve_mode(
    requested: str,
    fallback: str,
    rules_version: str | None,
    server_version: str = "",
    *,
    dry_run: bool = False,
    claims_v1: bool = True,
) -> ModeChoice:
    """The mode for ``requested`` where the server serves ``rules_version`` of
    DeviceTaintRule (None: no rule API) and, if ``claims_v1``, v1 ResourceClaims (mode
    quarantine writes them); :class:`ModeError` if it cannot run."""
    try:
        mode, why = choose_remediation_mode(
            requested, rules_version, fallback=fallback, claims_v1=claims_v1
        )
    except ValueError as exc:
        raise ModeError(str(exc)) from None
    effect_none = _has_effect_none(rules_version, server_version)
    rules_api = f"{GROUP}/{rules_version}" if rules_version else None
    fallback_path = requested == "auto" and rules_version is None
    if dry_run:
        release = f"Kubernetes {server_version}" if server_version else "this server"
        if mode == "taint-rules" and not effect_none:
            mode, why, fallback_path = (
                "report-only",
                f"dry run: {release} serves {rules_api} DeviceTaintRules without the taint "
                "effect None (1.35 on), so nothing is written",
                False,
            )
        elif mode in ("quarantine", "node-taint", "cordon", "evict-only"):
            mode, why, fallback_path = (
                "report-only",
                f"dry run instead of {mode} ({why}): nothing is written to claims, nodes or pods",
                False,
            )
    return ModeChoice(mode, why, rules_api, server_version, fallback_path, effect_none)


def mode_on(requested: str, policy: Policy, served: Any) -> tuple[ModeChoice, str | None]:
    """The controller's mode for ``requested`` and ``policy`` on a server that serves
    ``served`` (a :class:`~drahealth.kube.ServedAPIs`), and why the requested one cannot
    run there (None: it can). Where it cannot, the choice is report-only, as the
    controller then runs until it is served."""
    try:
        choice = resolve_mode(
            requested,
            policy.remediation_fallback,
            served.chosen("DeviceTaintRule"),
            served.server_version,
            dry_run=policy.dry_run,
            claims_v1=served.chosen("ResourceClaim") == "v1",
        )
    except ModeError as exc:
        return ModeChoice("report-only", f"{exc}; report-only until it is served"), str(exc)
    return choice, None


def device_mode(
    choice: ModeChoice | None, policy: Policy, want: Want, *, observe_only: bool = False
) -> str:
    """The mode ``want`` is carried out in under ``choice``: report-only without a
    choice or for an observe-only profile's device; a rule's own ``action.fallback``
    where ``auto`` fell back; report-only for effect ``None`` where the served rule API
    lacks it (1.34); else the running mode."""
    if choice is None or observe_only:
        return "report-only"
    if choice.fallback_path:
        rule = policy.rule_named(want.rule)
        if rule is not None and rule.action.fallback:
            return rule.action.fallback
    if choice.mode == "taint-rules" and want.effect == "None" and not choice.effect_none:
        return "report-only"
    return choice.mode


def mode_writes(mode: str, want: Want) -> bool:
    """Whether ``mode`` does anything for ``want`` (else it is only reported)."""
    if want.effect == "None" or mode == "report-only":
        return False
    return mode != "evict-only" or want.effect == "NoExecute"
