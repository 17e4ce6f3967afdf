"""The node agent's settings: :class:`AgentConfig`, every knob with its default.

Kept apart from the agent so that the parts the agent wires (such as the observer
mode) can take the settings without importing the agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["AgentConfig"]


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent needs; defaults follow the kubelet."""

    node_name: str
    registry_dir: str
    state_dir: str
    mode: Literal["kubelet", "observer"] = "kubelet"
    #: Lease of a device whose report carries no timeout (kubelet: 30 s).
    default_timeout: float = 30.0
    #: Ignored (kept so existing flags parse): restored devices now keep exactly the
    #: rest of their recorded lease.
    restart_grace: float = 10.0
    #: When a driver's last plugin instance goes away, its devices keep their health
    #: at most this long (s), then read Unknown and are forgotten.
    removal_grace: float = 30.0
    #: Kubelet gates: ``ResourceHealthStatus`` and ``ResourceHealthStatusMessage``.
    health_status: bool = True
    health_message: bool = True
    #: ``cdi`` (upstream: first CDI device ID) or ``device`` (``<driver>/<pool>/<device>``).
    resource_id: Literal["cdi", "device"] = "cdi"
    #: Endpoints must lie inside one of these (default: the registry dir's parent).
    allowed_roots: Sequence[str] | None = None
    #: Owners plugin sockets may have (default: root and the agent's user).
    allowed_uids: Sequence[int] | None = None
    rescan_interval: float = 1.0
    probe_interval: float = 10.0
    resync_interval: float = 60.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: Observer mode: the kubelet's PodResources socket.
    podresources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    #: Observer mode: how often PodResources is listed.
    podresources_interval: float = 5.0
    #: Namespace of the per-node ConfigMaps (device health; observer mode: post-mortem).
    postmortem_namespace: str = "default"

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("node name must not be empty")
        if self.mode not in ("kubelet", "observer"):
            raise ValueError(f"mode must be kubelet or observer, not {self.mode!r}")
        if self.default_timeout <= 0:
            raise ValueError(f"default timeout must be > 0 seconds, got {self.default_timeout}")
        if self.restart_grace < 0:
            raise ValueError(f"restart grace must be >= 0 seconds, got {self.restart_grace}")
        if self.removal_grace < 0:
            raise ValueError(f"removal grace must be >= 0 seconds, got {self.removal_grace}")
