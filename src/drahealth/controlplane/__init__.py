"""The embedded control plane: a Kubernetes API server with real REST/watch semantics.

``APIServer`` serves the kinds this project uses (core Namespaces, Nodes, Pods with
``/status`` and ``/eviction``, Events, ConfigMaps; coordination Leases; policy
PodDisruptionBudgets; resource.k8s.io/v1 ResourceSlices, ResourceClaims,
ResourceClaimTemplates, DeviceClasses, DeviceTaintRules) on 127.0.0.1, well enough for
kubectl and lightkube. See ``docs/apiserver.md`` for what is simplified.

Modules: ``_store`` (objects, resourceVersion, watch buffer), ``_resources`` (kinds,
discovery), ``_selectors``, ``_patch`` (merge/JSON/strategic patch), ``_apply``
(server-side apply, managedFields), ``_strategy`` (per-kind create/update rules),
``_validate``, ``_eviction`` (PDB arithmetic), ``_table`` (kubectl tables),
``_persist`` (data file), ``_engine`` (operations), ``_server`` (HTTP, lifecycle),
``cli`` (the ``drahealth apiserver`` command).
"""

from ._persist import DataFileError
from ._server import APIServer, serve_forever

__all__ = ["APIServer", "DataFileError", "serve_forever"]
