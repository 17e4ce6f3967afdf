"""The embedded control plane: a Kubernetes API server with real REST/watch semantics.

``APIServer`` serves the kinds this project uses (core Namespaces, Nodes, Pods with
``/status`` and ``/eviction``, Events, ConfigMaps; coordination Leases; apps
ReplicaSets; policy PodDisruptionBudgets; resource.k8s.io/v1 ResourceSlices, ResourceClaims,
ResourceClaimTemplates, DeviceClasses; DeviceTaintRules at the version the release serves;
authorization SelfSubjectAccessReviews) on 127.0.0.1, well enough for kubectl and
lightkube, as one Kubernetes release (1.34-1.38, ``profile=``; default the newest) with
its feature gates serves them. See ``docs/apiserver.md`` for what is simplified.

Modules: ``_store`` (objects, resourceVersion, watch buffer), ``_resources`` (kinds,
discovery), ``_selectors``, ``_patch`` (merge/JSON/strategic patch), ``_apply``
(server-side apply, managedFields), ``_strategy`` (per-kind create/update rules),
``_validate``, ``_batch`` (Job defaulting and validation), ``_eviction`` (PDB
arithmetic), ``_table`` (kubectl tables), ``_persist`` (data file), ``_engine``
(operations), ``_server`` (HTTP, lifecycle), ``_plane`` (``ControlPlane``: the server
with the stand-ins started as one, and ``serve_forever`` for the ``drahealth apiserver``
command).

The server itself runs no controllers. The cluster's controllers (scheduler,
resourceclaim, Deployment, ReplicaSet, Job, device-taint eviction) are
:mod:`drahealth.standins`, clients of any API server; ``ControlPlane`` runs them over
this one.
"""

from ._persist import DataFileError
from ._plane import ControlPlane, serve_forever
from ._server import APIServer

__all__ = ["APIServer", "ControlPlane", "DataFileError", "serve_forever"]
