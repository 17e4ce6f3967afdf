"""The controllers a cluster runs, as clients of any API server.

Stand-ins for kube-scheduler and kube-controller-manager's controllers: the scheduler
(node filters, DRA allocation, binding), the resourceclaim controller, the Deployment,
ReplicaSet and Job controllers, and device-taint eviction. They talk to the cluster only
through a lightkube ``AsyncClient``, so they run over the embedded API server
(:mod:`drahealth.controlplane`, whose ``ControlPlane`` starts them with the server) or
over a real kube-apiserver that runs without its controller manager and scheduler. The
kubelet's part, node registration and the pod lifecycle, is the node agent's kubelet
mode (:mod:`drahealth.node`). Nothing here imports the API server.

Modules: ``_loop`` (the reconcile loop, slow-start creates, live pods), ``_allocate``
(DRA allocation, no I/O), ``_scheduler`` (node filters, allocation, binding, its
Events), ``_claims`` (the resourceclaim controller: generated claims, reservations,
deallocation), ``_deployments``, ``_replicasets``, ``_jobs``, ``_taint_eviction``
(device-taint eviction) and ``_runner`` (:class:`StandIns`, which runs them all).

``StandIns`` is imported on first use: the allocator pulls in the CEL library, which
``import drahealth.standins`` alone does not load.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._runner import StandIns

__all__ = ["StandIns"]


def __getattr__(name: str) -> Any:
    if name == "StandIns":  # imported on use: it pulls in the CEL library
        from ._runner import StandIns

        return StandIns
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
