"""core/v1 Events as drahealth components record them.

Owns :func:`make_event`: one new Event about one object, shaped as the kubelet's event
recorder writes it (``count`` 1, ``firstTimestamp`` = ``lastTimestamp`` = now, the
message cut to 1024 characters, ``source`` and ``reportingComponent`` naming the
writer), with the ``events.k8s.io`` fields a controller fills where it has them:
``action`` (what it did, e.g. ``Taint``, ``Evict``; at most 128 characters) and
``related`` (a second object, e.g. the DeviceTaintRule behind an eviction). Creating
it, folding repeats and logging failures stay with the caller.
"""

from __future__ import annotations

import datetime as dt
from typing import Final

from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

__all__ = ["AGENT_COMPONENT", "CONTROLLER_COMPONENT", "EVENT_MESSAGE_MAX", "make_event"]

#: ``source.component``/``reportingComponent`` of the remediation controller's Events.
CONTROLLER_COMPONENT: Final = "drahealth-controller"
#: ... and of a node agent's.
AGENT_COMPONENT: Final = "drahealth-agent"

#: Longest Event message, in characters (the kubelet's recorder cuts at 1024).
EVENT_MESSAGE_MAX = 1024
#: Longest ``action`` the API server accepts (events.k8s.io validation).
EVENT_ACTION_MAX = 128


def make_event(
    *,
    name: str,
    namespace: str,
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
    """A new Event ``name`` in ``namespace`` about ``involved``.

    ``event_type`` is ``Normal`` or ``Warning``; ``component`` and ``host`` go in
    ``source``, ``component`` and ``instance`` in ``reportingComponent`` and
    ``reportingInstance``. ``now`` defaults to the wall clock. ``action`` (cut to 128
    characters) and ``related`` are left out when not given.
    """
    when = now if now is not None else dt.datetime.now(dt.UTC)
    return Event(
        metadata=ObjectMeta(name=name, namespace=namespace),
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
