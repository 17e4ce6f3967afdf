"""The ``escalation`` and ``repair`` sections of a policy file.

Owns their schema (msgspec structs, camelCase, unknown fields refused, as the rest of
the file) and their checks, with errors ``<file>: <field path>: <problem>`` through the
loader's builder (:mod:`drahealth.remedy._policy_load`, which calls
:func:`build_escalation` and :func:`build_repair`). See docs/policy.md, "Escalation to
a human" and "Repair actions".
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec
import yaml

from drahealth._yaml import TEMPLATE_YAML, load_bounded
from drahealth.core import (
    Escalation,
    PolicyError,
    Repair,
    RepairError,
    RepairJob,
    RepairWebhook,
    is_dns_label,
    normalize_job_template,
)

__all__ = ["EscalationSpec", "RepairSpec", "build_escalation", "build_repair"]

Duration = float | int | str
#: The most attempts one repair may have (each may run for ``timeout``).
MAX_ATTEMPTS = 20


class _Base(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    pass


class EscalationSpec(_Base):
    episodes: int = 3
    window: Duration = "24h"
    failed_repairs: int = 2


class _Webhook(_Base):
    url: str
    timeout: Duration = 30


class _Job(_Base):
    template: dict[str, Any] | str
    namespace: str = ""


class RepairSpec(_Base):
    exec: list[str] = []
    webhook: _Webhook | None = None
    job: _Job | None = None
    attempts: int = 3
    backoff: Duration = 30
    timeout: Duration = "10m"


class _Builder(Protocol):
    def fail(self, path: str, problem: str) -> PolicyError: ...

    def seconds(self, path: str, value: Duration, *, positive: bool = False) -> float: ...


def build_escalation(b: _Builder, path: str, e: EscalationSpec) -> Escalation:
    """An ``escalation`` section: counts of at least 0 (0: that limit off), a window > 0."""
    for field, value in (("episodes", e.episodes), ("failedRepairs", e.failed_repairs)):
        if value < 0:
            raise b.fail(f"{path}.{field}", f"must be at least 0 (0: off), got {value}")
    return Escalation(e.episodes, b.seconds(f"{path}.window", e.window, positive=True),
                      e.failed_repairs)  # fmt: skip


def build_repair(b: _Builder, path: str, r: RepairSpec) -> Repair:
    """A ``repair`` section: exactly one of exec, webhook or job, and its limits."""
    given = [n for n, v in (("exec", r.exec), ("webhook", r.webhook), ("job", r.job)) if v]
    if len(given) != 1:
        raise b.fail(path, f"set exactly one of exec, webhook or job (got {given or 'none'})")
    if not 1 <= r.attempts <= MAX_ATTEMPTS:
        raise b.fail(f"{path}.attempts", f"must be 1 to {MAX_ATTEMPTS}, got {r.attempts}")
    backoff = b.seconds(f"{path}.backoff", r.backoff)
    timeout = b.seconds(f"{path}.timeout", r.timeout, positive=True)
    webhook = job = None
    if r.webhook is not None:
        url = r.webhook.url
        if not url.startswith(("http://", "https://")):
            raise b.fail(f"{path}.webhook.url", f"{url!r} is not an http(s) URL")
        webhook = RepairWebhook(
            url, b.seconds(f"{path}.webhook.timeout", r.webhook.timeout, positive=True)
        )
    if r.job is not None:
        raw: Any = r.job.template
        if isinstance(raw, str):
            try:
                raw = load_bounded(raw, TEMPLATE_YAML)
            except yaml.YAMLError as exc:
                raise b.fail(f"{path}.job.template", f"invalid YAML: {exc}") from exc
        try:
            template = normalize_job_template(raw)
        except RepairError as exc:
            problem = str(exc)
            if problem.startswith("template"):
                field, _, problem = problem.partition(": ")
                raise b.fail(f"{path}.job.{field}", problem) from exc
            raise b.fail(f"{path}.job.template", problem) from exc
        namespace = r.job.namespace
        if namespace and not is_dns_label(namespace):
            raise b.fail(f"{path}.job.namespace", f"{namespace!r} is not a namespace name")
        job = RepairJob(template, namespace)
    if r.exec and not all(r.exec):
        raise b.fail(f"{path}.exec", "the command and its arguments must not be empty")
    return Repair(tuple(r.exec), webhook, job, r.attempts, backoff, timeout)
