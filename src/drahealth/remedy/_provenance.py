"""Which Events drahealth wrote: the one predicate every reader of Events applies.

Owns :func:`recorded_by`. Anyone who may create Events in a namespace can write one
that *says* it comes from the remediation controller; ``drahealth history``, the
dashboard's history and its PDB-blocked markers must not take such an Event as the
controller's. An Event counts as drahealth's only when all of these hold:

* it names the writer the same way in ``source.component`` and in
  ``reportingComponent`` (``reportingController`` in events.k8s.io), and names an
  instance (``reportingInstance``), as :func:`drahealth.kube.make_event` writes them;
* the writer is the remediation controller (:data:`CONTROLLER_COMPONENT`) or a node
  agent (:data:`AGENT_COMPONENT`);
* it lives where that writer puts it: an Event about a namespaced object is in that
  object's namespace (the API server enforces this for core/v1 Events; it is checked
  again here). The controller's Events about its own ConfigMaps are in its namespace;
  those about cluster-scoped objects (:data:`CONTROLLER_CLUSTER_KINDS`: rules, nodes)
  are in ``default`` (:data:`~drahealth.kube.CLUSTER_EVENT_NAMESPACE`: the only
  namespace the API server accepts for them; its own namespace is still taken, where an
  older controller wrote them on a server that allowed it); in any other namespace it
  only writes the eviction Events of a Pod there (:data:`CONTROLLER_POD_REASONS`). An
  agent only writes Events about Pods with its device-health reasons
  (:data:`AGENT_POD_REASONS`).

So a tenant can at most forge an eviction or health Event about its *own* pod, in its
own namespace, or, where it may create Events in ``default``, an Event there about a
rule or a node. Either is only a claim by that namespace, so a device's history
(:func:`history_source`, for ``drahealth history`` and the dashboard alike) shows it
with that namespace as its source, never as the controller's: a Pod's Event only for a
device that pod holds now (an allocation result of one of its claims), as ``pod
<ns>/<name> (Event in <ns>)``; an Event in ``default`` about a rule or node as
``<Kind>/<name> (Event in default)``. The controller's own word is its history
ConfigMap and its Events in its namespace, which tenants cannot write (where the
controller runs in ``default``, its Events there are its word). A tenant thus says
nothing as the controller, nor about anyone else's pod. Pure (dicts in, answer out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

from drahealth.core import Consumer, mentions_device
from drahealth.kube import AGENT_COMPONENT, CLUSTER_EVENT_NAMESPACE, CONTROLLER_COMPONENT

__all__ = [
    "AGENT_COMPONENT",
    "AGENT_POD_REASONS",
    "CONTROLLER_CLUSTER_KINDS",
    "CONTROLLER_COMPONENT",
    "CONTROLLER_POD_REASONS",
    "history_source",
    "recorded_by",
]

#: What the controller says about a Pod, in the Pod's namespace.
CONTROLLER_POD_REASONS: Final = frozenset(
    {"DeviceTaintEviction", "EvictionBlocked", "EvictionFailed"}
)
#: The cluster-scoped objects the controller writes Events about, in ``default``.
CONTROLLER_CLUSTER_KINDS: Final = frozenset({"DeviceTaintRule", "Node"})
#: What an agent says about a Pod, in the Pod's namespace.
AGENT_POD_REASONS: Final = frozenset({"DeviceUnhealthy", "DeviceHealthUnknown", "DeviceHealthy"})

Writer = Literal["controller", "agent"]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def recorded_by(event: Mapping[str, Any], controller_namespace: str | None) -> Writer | None:
    """``"controller"`` or ``"agent"`` where drahealth wrote ``event`` (a core/v1 Event as
    a dict), else None. ``controller_namespace`` is the controller's (None: unknown, then
    only its Pod Events are taken)."""
    source = event.get("source")
    component = _text(source.get("component")) if isinstance(source, Mapping) else ""
    reporting = _text(event.get("reportingComponent") or event.get("reportingController"))
    if not component or component != reporting or not _text(event.get("reportingInstance")):
        return None
    meta, obj = event.get("metadata"), event.get("involvedObject") or event.get("regarding")
    namespace = _text(meta.get("namespace")) if isinstance(meta, Mapping) else ""
    if not isinstance(obj, Mapping) or not namespace:
        return None
    obj_namespace, kind = _text(obj.get("namespace")), _text(obj.get("kind"))
    if obj_namespace and obj_namespace != namespace:
        return None  # an Event about another namespace's object
    reason = _text(event.get("reason"))
    pod_event = kind == "Pod" and bool(obj_namespace)
    if component == AGENT_COMPONENT:
        return "agent" if pod_event and reason in AGENT_POD_REASONS else None
    if component != CONTROLLER_COMPONENT:
        return None
    if controller_namespace is not None and namespace == controller_namespace:
        return "controller"
    if _cluster_event(namespace, obj_namespace, kind):
        return "controller"
    return "controller" if pod_event and reason in CONTROLLER_POD_REASONS else None


def _cluster_event(namespace: str, obj_namespace: str, kind: str) -> bool:
    """An Event where the controller puts those about a rule or a node."""
    return (
        namespace == CLUSTER_EVENT_NAMESPACE
        and not obj_namespace
        and kind in CONTROLLER_CLUSTER_KINDS
    )


def history_source(
    event: Mapping[str, Any],
    device: str,
    controller_namespace: str | None,
    holders: Iterable[Consumer],
) -> str | None:
    """The source to show ``event`` under in ``device``'s history, or None where it is
    not part of that history.

    ``device`` is ``DRIVER/POOL/DEVICE``; ``holders`` are the live pods whose claims
    hold it now (:func:`drahealth.remedy.consumers`). The Event must be drahealth's
    (:func:`recorded_by`) and its message must name ``device``. The controller's Events
    in its own namespace are its word (``"<component> on <Kind>/<name>"``). Its Events
    about rules and nodes in ``default`` (another namespace than its own) are shown as
    what they are, an Event in ``default``, which whoever may create Events there could
    have written (``"<Kind>/<name> (Event in default)"``). Any other is an Event about a
    Pod in that Pod's namespace, which that namespace could have written: it counts only
    where the Pod (same name, and same uid where the Event names one) is among
    ``holders``, and its source is the Pod (``"pod <ns>/<name> (Event in <ns>)"``). So a
    claim is never shown as the controller's record.
    """
    writer = recorded_by(event, controller_namespace)
    if writer is None or not mentions_device(_text(event.get("message")), device):
        return None
    meta = event.get("metadata")
    namespace = _text(meta.get("namespace")) if isinstance(meta, Mapping) else ""
    obj = event.get("involvedObject") or event.get("regarding")
    obj = obj if isinstance(obj, Mapping) else {}
    kind, name = _text(obj.get("kind")), _text(obj.get("name"))
    if writer == "controller" and namespace == controller_namespace:
        source = event.get("source")
        component = _text(source.get("component")) if isinstance(source, Mapping) else ""
        return f"{component} on {kind}/{name}"
    if writer == "controller" and _cluster_event(namespace, _text(obj.get("namespace")), kind):
        return f"{kind}/{name} (Event in {namespace})"
    uid = _text(obj.get("uid"))
    for pod in holders if kind == "Pod" else ():
        if (pod.namespace, pod.name) == (namespace, name) and (not uid or uid == pod.uid):
            return f"pod {namespace}/{name} (Event in {namespace})"
    return None
