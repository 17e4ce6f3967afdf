"""Prometheus metrics of the remediation controller (its own registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ControllerMetrics"]


class ControllerMetrics:
    """Actions by type, failures, pending evictions, reaction latency, leadership, mode."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.actions = Counter(
            "drahealth_remedy_actions",
            "Actions taken: create/update/delete of rules, evict-evicted/blocked/failed.",
            ["action"],
            registry=self.registry,
        )
        self.failures = Counter(
            "drahealth_remedy_failures",
            "Rule writes the API server refused.",
            ["action"],
            registry=self.registry,
        )
        self.pending_evictions = Gauge(
            "drahealth_remedy_pending_evictions",
            "Pods waiting to be evicted (held by a budget or the rate limits).",
            registry=self.registry,
        )
        self.reaction = Histogram(
            "drahealth_remedy_reaction_seconds",
            "From a device's change to bad health (agent's record, else first seen) to its rule.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.leader = Gauge(
            "drahealth_remedy_leader", "1 while this replica leads.", registry=self.registry
        )
        self.mode = Gauge(
            "drahealth_controller_remediation_mode",
            "1 for the remediation mode the leader runs in (taint-rules, node-taint, cordon, "
            "evict-only, report-only), 0 for the others.",
            ["mode"],
            registry=self.registry,
        )
