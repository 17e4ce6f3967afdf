"""Registration strings, gRPC method paths and default paths of the kubelet contracts.

Every string here is part of the wire contract with real kubelets and real DRA
drivers; each one is spelled exactly as upstream spells it. Nothing here does I/O.
"""

from __future__ import annotations

from typing import Final

from drahealth.core import HEALTH_MESSAGE_MAX_BYTES as HEALTH_MESSAGE_MAX_BYTES

#: ``PluginInfo.type`` of a DRA kubelet plugin.
DRA_PLUGIN_TYPE: Final = "DRAPlugin"

#: Registration strings ("supported versions") of the DRA node service, in the
#: order a driver advertises them (the kubelet takes the first it supports).
DRA_PLUGIN_V1: Final = "v1.DRAPlugin"
DRA_PLUGIN_V1BETA1: Final = "v1beta1.DRAPlugin"
DRA_PLUGIN_SERVICES: Final = (DRA_PLUGIN_V1, DRA_PLUGIN_V1BETA1)

#: Registration strings of the dra-health service; equal to the gRPC service names.
DRA_HEALTH_V1: Final = "v1.DRAResourceHealth"
DRA_HEALTH_V1ALPHA1: Final = "v1alpha1.DRAResourceHealth"
DRA_HEALTH_SERVICES: Final = (DRA_HEALTH_V1, DRA_HEALTH_V1ALPHA1)

#: Full gRPC service names.
REGISTRATION_SERVICE: Final = "pluginregistration.Registration"
DRA_V1_SERVICE: Final = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
DRA_V1BETA1_SERVICE: Final = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
HEALTH_V1_SERVICE: Final = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1_SERVICE: Final = "v1alpha1.DRAResourceHealth"
PODRESOURCES_V1_SERVICE: Final = "v1.PodResourcesLister"

#: Full gRPC method paths, as a raw client dials them.
GET_INFO_METHOD: Final = f"/{REGISTRATION_SERVICE}/GetInfo"
NOTIFY_REGISTRATION_STATUS_METHOD: Final = f"/{REGISTRATION_SERVICE}/NotifyRegistrationStatus"
NODE_PREPARE_V1_METHOD: Final = f"/{DRA_V1_SERVICE}/NodePrepareResources"
NODE_UNPREPARE_V1_METHOD: Final = f"/{DRA_V1_SERVICE}/NodeUnprepareResources"
NODE_PREPARE_V1BETA1_METHOD: Final = f"/{DRA_V1BETA1_SERVICE}/NodePrepareResources"
NODE_UNPREPARE_V1BETA1_METHOD: Final = f"/{DRA_V1BETA1_SERVICE}/NodeUnprepareResources"
WATCH_V1_METHOD: Final = f"/{HEALTH_V1_SERVICE}/NodeWatchResources"
WATCH_V1ALPHA1_METHOD: Final = f"/{HEALTH_V1ALPHA1_SERVICE}/NodeWatchResources"
PODRESOURCES_LIST_METHOD: Final = f"/{PODRESOURCES_V1_SERVICE}/List"
PODRESOURCES_GET_METHOD: Final = f"/{PODRESOURCES_V1_SERVICE}/Get"

#: Kubelet defaults.
KUBELET_ROOT_DIR: Final = "/var/lib/kubelet"
KUBELET_REGISTRY_DIR: Final = "/var/lib/kubelet/plugins_registry"
KUBELET_PLUGINS_DIR: Final = "/var/lib/kubelet/plugins"
PODRESOURCES_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
DRA_SOCKET_NAME: Final = "dra.sock"
SERIALIZE_LOCK_NAME: Final = "serialize.lock"

#: Longest unix socket path the rolling-update naming accepts (sun_path size).
UNIX_PATH_MAX: Final = 108

#: Health defaults of the kubelet (seconds; the message cut in bytes,
#: ``HEALTH_MESSAGE_MAX_BYTES``, is defined in core).
DEFAULT_HEALTH_TIMEOUT_SECONDS: Final = 30

# KEP-5322 design (never merged; not in the shipping dra/v1 proto):
# ``NodePrepareResourceResponseErrorType error_type = 3`` in ``NodePrepareResourceResponse``,
# values Unknown = 0, Permanent = 1. Sent only when a driver opts in; a kubelet that does
# not know the field keeps it as an unknown field and ignores it.
PREPARE_ERROR_TYPE_FIELD: Final = 3
PREPARE_ERROR_TYPE_UNKNOWN: Final = 0
PREPARE_ERROR_TYPE_PERMANENT: Final = 1

#: Status values in ``allocatedResourcesStatus[].resources[].health``.
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
UNKNOWN: Final = "Unknown"
