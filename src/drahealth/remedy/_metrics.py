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
            "Writes the API server refused: rule writes by action, and Events (action=event).",
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
            "1 for the remediation mode the leader runs in (taint-rules, quarantine, "
            "node-taint, cordon, evict-only, report-only), 0 for the others.",
            ["mode"],
            registry=self.registry,
        )
        # ownership filter (drahealth.remedy._ownership)
        self.held_devices = Gauge(
            "drahealth_controller_held_devices",
            "Devices that want a taint the controller does not write: reason hold (an "
            "operator's untaint hold) or frozen (opt-out node label or the policy's exclude).",
            ["reason"],
            registry=self.registry,
        )
        self.manual_untaints = Counter(
            "drahealth_controller_manual_untaints",
            "The controller's DeviceTaintRules deleted by someone else (taken as an untaint).",
            registry=self.registry,
        )
        self.opted_out_nodes = Gauge(
            "drahealth_controller_opted_out_nodes",
            "Nodes labelled drahealth.io/remediation=disabled.",
            registry=self.registry,
        )
        # blast-radius circuit breaker (drahealth.remedy._breaker_guard)
        self.breaker_tripped = Gauge(
            "drahealth_controller_breaker_tripped",
            "Groups whose blast-radius limit tripped (new taints held), by scope: cluster, "
            "profile, driver, pool, node.",
            ["scope"],
            registry=self.registry,
        )
        self.held_taints = Gauge(
            "drahealth_controller_held_taints",
            "New taints the circuit breaker holds (not written) until it resumes.",
            registry=self.registry,
        )
        self.breaker_trips = Counter(
            "drahealth_controller_breaker_trips",
            "Times a group's blast-radius limit tripped, by scope.",
            ["scope"],
            registry=self.registry,
        )
        self.burn_in_devices = Gauge(
            "drahealth_controller_burn_in_devices",
            "Devices burning in (tainted drahealth.io/burn-in until their validation passes).",
            registry=self.registry,
        )
        self.burn_in_validations = Counter(
            "drahealth_controller_burn_in_validations",
            "Burn-in validations run, by result (passed, failed).",
            ["result"],
            registry=self.registry,
        )
        self.degraded_devices = Gauge(
            "drahealth_controller_degraded_devices",
            "Devices a degraded rule matches (shown, not tainted).",
            registry=self.registry,
        )
        self.needs_human = Gauge(
            "drahealth_controller_needs_human",
            "Devices that need a human (taint kept until drahealth clear).",
            registry=self.registry,
        )
        self.needs_human_marked = Counter(
            "drahealth_controller_needs_human_marked",
            "Times a device was marked needs-a-human, by cause (episodes, repairs).",
            ["cause"],
            registry=self.registry,
        )
        self.repairs = Counter(
            "drahealth_controller_repairs",
            "Repair attempts finished, by kind (exec, webhook, job) and result "
            "(succeeded, failed).",
            ["kind", "result"],
            registry=self.registry,
        )
        self.repairs_running = Gauge(
            "drahealth_controller_repairs_running",
            "Repair attempts running now.",
            registry=self.registry,
        )
