"""The node agent's settings: :class:`AgentConfig`, every knob with its default.

Kept apart from the agent so that the parts the agent wires (such as the observer
mode) can take the settings without importing the agent. :func:`kubelet_settings` maps a
Kubernetes release (with its feature gates) onto the settings that follow the kubelet
of that release.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from drahealth.core import NEWEST_KUBE_VERSION, KubeProfile

__all__ = ["HEALTH_VERSIONS", "AgentConfig", "kubelet_settings"]

#: The dra-health versions there are, preferred first.
HEALTH_VERSIONS: tuple[str, ...] = ("v1", "v1alpha1")


def kubelet_settings(profile: KubeProfile) -> dict[str, Any]:
    """The :class:`AgentConfig` fields that follow the kubelet of ``profile``'s release:
    pod health status (``ResourceHealthStatus``), its ``message``
    (``ResourceHealthStatusMessage``) and the dra-health services it calls."""
    return {
        "kube_version": profile.version,
        "health_status": profile.kubelet_pod_health,
        "health_message": profile.kubelet_health_message,
        "health_versions": tuple(profile.dra_health_services),
    }


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
    #: The Kubernetes release whose kubelet the kubelet mode plays (for the record: the
    #: three settings below carry what follows from it, see :func:`kubelet_settings`).
    kube_version: str = NEWEST_KUBE_VERSION
    #: Kubelet gates: ``ResourceHealthStatus`` (off: no ``allocatedResourcesStatus`` in
    #: pod status; health still reaches the node's record and Events) and
    #: ``ResourceHealthStatusMessage``. Kubelet mode only.
    health_status: bool = True
    health_message: bool = True
    #: dra-health versions the kubelet mode calls, preferred first (a kubelet before
    #: 1.37 calls only v1alpha1). The observer mode calls any the plugin serves.
    health_versions: Sequence[str] = HEALTH_VERSIONS
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
    #: Kubelet mode: where the CDI spec files of prepared devices are read (container env).
    cdi_dirs: Sequence[str] = ("/etc/cdi", "/var/run/cdi")
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
        versions = self.health_versions
        if isinstance(versions, str) or not versions or set(versions) - set(HEALTH_VERSIONS):
            raise ValueError(
                f"dra-health versions {versions!r}: choose among {', '.join(HEALTH_VERSIONS)}"
            )
