"""core/v1 Events as drahealth components record them.

Owns :func:`make_event`: one new Event about one object, shaped as the kubelet's event
recorder writes it (``count`` 1, ``firstTimestamp`` = ``lastTimestamp`` = now, the
message cut to 1024 characters, ``source`` and ``reportingComponent`` naming the
writer), with the ``events.k8s.io`` fields a controller fills where it has them:
``action`` (what it did, e.g. ``Taint``, ``Evict``; at most 128 characters) and
``related`` (a second object, e.g. the DeviceTaintRule behind an eviction). Creating
it, folding repeats and logging failures stay with the caller.

Where it lives is the API server's rule for core/v1 Events (``ValidateEventCreate``):
an Event about a namespaced object is in that object's namespace, and one about a
cluster-scoped object (a Node, a DeviceTaintRule: no ``involvedObject.namespace``) is in
:data:`CLUSTER_EVENT_NAMESPACE` (``default``, where client-go's recorder puts them; an
Event without ``eventTime`` may be nowhere else). :func:`event_namespace` says which.
"""

from __future__ import annotations

import datetime as dt
from typing import Final

from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

__all__ = [
    "AGENT_COMPONENT",
    "CLUSTER_EVENT_NAMESPACE",
    "CONTROLLER_COMPONENT",
    "EVENT_MESSAGE_MAX",
    "event_namespace",
    "make_event",
]

#: ``source.component``/``reportingComponent`` of the remediation controller's Events.
CONTROLLER_COMPONENT: Final = "drahealth-controller"
#: ... and of a node agent's.
AGENT_COMPONENT: Final = "drahealth-agent"

#: Namespace of the Events about cluster-scoped objects (metav1.NamespaceDefault).
CLUSTER_EVENT_NAMESPACE: Final = "default"

#: Longest Event message, in characters (the kubelet's recorder cuts at 1024).
EVENT_MESSAGE_MAX = 1024
#: Longest ``action`` the API server accepts (events.k8s.io validation).
EVENT_ACTION_MAX = 128


def event_namespace(involved: ObjectReference) -> str:
    """Where an Event about ``involved`` must be created: its namespace, or
    :data:`CLUSTER_EVENT_NAMESPACE` for a cluster-scoped object."""
    return involved.namespace or CLUSTER_EVENT_NAMESPACE


def make_event(
    *,
    name: str,
    namespace: str | None = None,
    involved: ObjectReference,
    event_type: str,
    reason: str,
    message: str,
    component: str,
    instance: str,
    host: str | None = None,
    now: dt.datetime | None = None,
    action: str | None = None,
    related: ObjectReference | None = None,
) -> Event:
    """A new Event ``name`` in ``namespace`` (default: :func:`event_namespace`'s, the
    only one the API server accepts) about ``involved``.

    ``event_type`` is ``Normal`` or ``Warning``; ``component`` and ``host`` go in
    ``source``, ``component`` and ``instance`` in ``reportingComponent`` and
    ``reportingInstance``. ``now`` defaults to the wall clock. ``action`` (cut to 128
    characters) and ``related`` are left out when not given.
    """
    when = now if now is not None else dt.datetime.now(dt.UTC)
    return Event(
        metadata=ObjectMeta(
            name=name, namespace=event_namespace(involved) if namespace is None else namespace
        ),
        involvedObject=involved,
        reason=reason,
        message=message[:EVENT_MESSAGE_MAX],
        type=event_type,
        count=1,
        firstTimestamp=when,
        lastTimestamp=when,
        source=EventSource(component=component, host=host),
        reportingComponent=component,
        reportingInstance=instance,
        action=action[:EVENT_ACTION_MAX] if action else None,
        related=related,
    )
