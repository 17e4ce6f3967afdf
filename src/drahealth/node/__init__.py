"""The node agent: the kubelet's DRA device-health pipeline.

Plugin watcher (registration handshake), plugin registry (one authoritative health
stream per driver), health stream client, durable health store, claim tracker and
the agent that ties them to the API server (kubelet mode) or runs beside a real
kubelet (observer mode). The sans-I/O rules (health cache, status builder) live in
``drahealth.core``. See docs/agent.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drahealth._lazy import lazy_exports

if TYPE_CHECKING:
    from drahealth.node._agent import NodeAgent
    from drahealth.node._attach_config import (
        SOURCE_KINDS,
        AttachConfig,
        AttachConfigError,
        constructs,
        load_attach_config,
        parse_attach_config,
    )
    from drahealth.node._config import AgentConfig, kubelet_settings

#: public name -> module that defines it; imported on first use (PEP 562), so a part
#: that only needs the settings does not load gRPC and the Kubernetes client.
_EXPORTS: dict[str, str] = {
    "AgentConfig": "drahealth.node._config",
    "AttachConfig": "drahealth.node._attach_config",
    "AttachConfigError": "drahealth.node._attach_config",
    "SOURCE_KINDS": "drahealth.node._attach_config",
    "constructs": "drahealth.node._attach_config",
    "load_attach_config": "drahealth.node._attach_config",
    "parse_attach_config": "drahealth.node._attach_config",
    "NodeAgent": "drahealth.node._agent",
    "kubelet_settings": "drahealth.node._config",
}

__all__ = [
    "SOURCE_KINDS",
    "AgentConfig",
    "AttachConfig",
    "AttachConfigError",
    "NodeAgent",
    "constructs",
    "kubelet_settings",
    "load_attach_config",
    "parse_attach_config",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
