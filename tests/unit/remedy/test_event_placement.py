"""Where the controller and the agent create their Events, and a refused Event is seen.

The API server's rule for a core/v1 Event without ``eventTime`` (upstream
``ValidateEventCreate``, pkg/apis/core/validation/events.go): an Event about a namespaced
object is in that object's namespace; one about a cluster-scoped object (no
``involvedObject.namespace``: a Node, a DeviceTaintRule) is in ``default`` (or has no
namespace). A controller in its own namespace (``drahealth-system``) wrote the latter
there, and a real server refused every one (422 "does not match event.namespace"), with
only a debug line.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import Status
from lightkube.resources.core_v1 import Event

from drahealth.kube import make_event
from drahealth.node._events import EventRecorder
from drahealth.remedy._controller import RemediationController
from drahealth.remedy._policy_load import parse_policy

NS = "drahealth-system"
POLICY = parse_policy(
    "apiVersion: drahealth.io/v1\nkind: RemediationPolicy\nrules:\n"
    "- name: bad\n  match: {health: [Unhealthy]}\n  action: {effect: NoExecute}\n",
    "policy",
)
RULE = ObjectReference(
    apiVersion="resource.k8s.io/v1", kind="DeviceTaintRule", name="dh-gpu-0", uid="u-r"
)
NODE = ObjectReference(apiVersion="v1", kind="Node", name="node-1", uid="u-n")
POD = ObjectReference(apiVersion="v1", kind="Pod", name="train", namespace="ml", uid="u-p")
HISTORY = ObjectReference(
    apiVersion="v1", kind="ConfigMap", name="drahealth-remediation-history", namespace=NS,
    uid="u-c",
)  # fmt: skip


def accepted_by_the_server(event: Event) -> bool:
    """Upstream's namespace rule for an Event without eventTime."""
    assert event.metadata is not None and event.eventTime is None
    namespace = event.metadata.namespace or ""
    involved = event.involvedObject.namespace or ""
    if not involved:
        return namespace in ("", "default")
    return namespace == involved


class _Client:
    """Records creates; refuses them with ``refuse`` (an HTTP code) when set."""

    def __init__(self, refuse: int | None = None) -> None:
        self.created: list[Event] = []
        self.refuse = refuse
        self._client = None  # what the controller's reflectors hold (never used here)

    async def create(self, obj: Any) -> Any:
        self.created.append(obj)
        if self.refuse is not None:
            raise ApiError(
                status=Status(code=self.refuse, reason="Invalid", message="no")  # type: ignore[call-arg]
            )
        return obj


def _controller(client: _Client) -> RemediationController:
    return RemediationController(client, POLICY, namespace=NS, mode="taint-rules")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ref", "where"), [(RULE, "default"), (NODE, "default"), (POD, "ml"), (HISTORY, NS)]
)
async def test_the_controller_puts_each_event_where_the_server_accepts_it(
    ref: ObjectReference, where: str
) -> None:
    client = _Client()
    await _controller(client)._event(ref, "Warning", "DeviceTainted", "tainted gpu-0", "Taint")
    [event] = client.created
    assert event.metadata is not None and event.metadata.namespace == where
    assert accepted_by_the_server(event)
    assert event.involvedObject == ref


async def test_a_refused_event_is_a_warning_once_per_reason_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = _Client(refuse=422)
    controller = _controller(client)
    with caplog.at_level(logging.DEBUG, logger="drahealth.remedy._controller"):
        for reason in ("DeviceTainted", "DeviceTainted", "DeviceUntainted"):
            await controller._event(RULE, "Normal", reason, "gpu-0")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "DeviceTainted in namespace default was refused (HTTP 422: no)" in warnings[0]
    assert "missing from the audit trail" in warnings[0]
    assert "DeviceUntainted" in warnings[1]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("DeviceTainted in default refused: no" in m for m in debug), debug
    failures = controller.metrics.registry.get_sample_value(
        "drahealth_remedy_failures_total", {"action": "event"}
    )
    assert failures == 3


def test_make_event_defaults_to_the_servers_namespace() -> None:
    def built(ref: ObjectReference) -> Event:
        return make_event(
            name="x.1", involved=ref, event_type="Normal", reason="R", message="m",
            component="c", instance="i",
        )  # fmt: skip

    for ref, where in ((RULE, "default"), (NODE, "default"), (POD, "ml"), (HISTORY, NS)):
        event = built(ref)
        assert event.metadata is not None and event.metadata.namespace == where
        assert accepted_by_the_server(event)


async def test_the_agents_pod_events_are_in_the_pods_namespace() -> None:
    client = _Client()
    recorder = EventRecorder(client, "node-1")  # type: ignore[arg-type]
    pod = {"metadata": {"name": "train", "namespace": "ml", "uid": "u-p"}}
    recorder.pod_event(pod, "Warning", "DeviceUnhealthy", "device gpu-0 is Unhealthy")
    await recorder.drain()
    [event] = client.created
    assert event.metadata is not None and event.metadata.namespace == "ml"
    assert accepted_by_the_server(event)
