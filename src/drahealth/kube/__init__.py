"""drahealth.kube: the one path from drahealth components to the Kubernetes API.

Everything goes through a lightkube client built by :func:`make_client` (async) or
:func:`make_sync_client` (CLI): against the embedded API server, a kubeconfig, or
in-cluster. :class:`Reflector` keeps a typed, event-emitting cache of one kind
(LIST/WATCH, bookmarks, 410 relist, backoff). ``_ops`` has the write helpers
(status patches, server-side apply, conflict retry) and error predicates;
:class:`LeaderElector` campaigns for a Lease. :class:`DeviceTaintRuleSpec134` is the
1.34 alpha DeviceTaintRule's spec, which lightkube's models lack.

Knows nothing of the packages above it (driver, node, remedy, standins, controlplane,
cli, web).
"""

from ._client import (
    DEFAULT_KUBECONFIG,
    DEFAULT_TIMEOUT,
    SERVICE_ACCOUNT_DIR,
    TRANSPORT_ERRORS,
    KubeConfigError,
    embedded_kubeconfig,
    load_config,
    make_client,
    make_sync_client,
    merge_kubeconfigs,
    read_bounded,
)
from ._discovery import (
    DRA_GROUP,
    DiscoveryError,
    ServedAPIs,
    discover,
    discover_sync,
    parse_discovery,
    resource_class,
    to_internal,
)
from ._events import (
    AGENT_COMPONENT,
    CLUSTER_EVENT_NAMESPACE,
    CONTROLLER_COMPONENT,
    event_namespace,
    make_event,
)
from ._leader import FencedClient, LeaderElector, LeaseLost, lease_from_dict
from ._ops import (
    apply,
    apply_status,
    check_fence,
    delete_with_preconditions,
    is_already_exists,
    is_conflict,
    is_gone,
    is_not_found,
    patch_status,
    retry_on_conflict,
    status_code,
    update_configmap_data,
    write_configmap_data,
)
from ._reflector import (
    Backoff,
    EventStream,
    ObjectCache,
    Reflector,
    ReflectorEvent,
    Store,
    WatchErrorEvent,
    as_dict,
    object_key,
    resource_version,
    rv_newer,
    strip_managed_fields,
)
from ._rule134 import DeviceTaintRuleSpec134, DeviceTaintSelector134

__all__ = [
    "AGENT_COMPONENT",
    "CLUSTER_EVENT_NAMESPACE",
    "CONTROLLER_COMPONENT",
    "DEFAULT_KUBECONFIG",
    "DEFAULT_TIMEOUT",
    "DRA_GROUP",
    "SERVICE_ACCOUNT_DIR",
    "TRANSPORT_ERRORS",
    "Backoff",
    "DeviceTaintRuleSpec134",
    "DeviceTaintSelector134",
    "DiscoveryError",
    "EventStream",
    "FencedClient",
    "KubeConfigError",
    "LeaderElector",
    "LeaseLost",
    "ObjectCache",
    "Reflector",
    "ReflectorEvent",
    "ServedAPIs",
    "Store",
    "WatchErrorEvent",
    "apply",
    "apply_status",
    "as_dict",
    "check_fence",
    "delete_with_preconditions",
    "discover",
    "discover_sync",
    "embedded_kubeconfig",
    "event_namespace",
    "is_already_exists",
    "is_conflict",
    "is_gone",
    "is_not_found",
    "lease_from_dict",
    "load_config",
    "make_client",
    "make_event",
    "make_sync_client",
    "merge_kubeconfigs",
    "object_key",
    "parse_discovery",
    "patch_status",
    "read_bounded",
    "resource_class",
    "resource_version",
    "retry_on_conflict",
    "rv_newer",
    "status_code",
    "strip_managed_fields",
    "to_internal",
    "update_configmap_data",
    "write_configmap_data",
]
