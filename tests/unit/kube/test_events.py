"""The Event builder writes what the agent and the controller wrote before it existed."""

from __future__ import annotations

import datetime as dt

from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

from drahealth.kube import make_event

NOW = dt.datetime(2026, 11, 24, 22, 1, 5, tzinfo=dt.UTC)
POD = ObjectReference(apiVersion="v1", kind="Pod", name="p", namespace="ns", uid="u-1")


def test_agent_event_with_host() -> None:
    long = "x" * 2000
    built = make_event(
        name="p.abc",
        namespace="ns",
        involved=POD,
        event_type="Warning",
        reason="DeviceUnhealthy",
        message=long,
        component="drahealth-agent",
        instance="node-1",
        host="node-1",
        now=NOW,
    )
    before = Event(
        metadata=ObjectMeta(name="p.abc", namespace="ns"),
        involvedObject=POD,
        reason="DeviceUnhealthy",
        message=long[:1024],
        type="Warning",
        count=1,
        firstTimestamp=NOW,
        lastTimestamp=NOW,
        source=EventSource(component="drahealth-agent", host="node-1"),
        reportingComponent="drahealth-agent",
        reportingInstance="node-1",
    )
    assert built.to_dict() == before.to_dict()
    assert len(built.to_dict()["message"]) == 1024
    assert built.to_dict()["firstTimestamp"] == "2026-11-24T22:01:05Z"


def test_controller_event_without_host() -> None:
    built = make_event(
        name="p.0123",
        namespace="ns",
        involved=POD,
        event_type="Warning",
        reason="DeviceTaintEviction",
        message="evicted",
        component="drahealth-controller",
        instance="ctl-0",
        now=NOW,
    )
    out = built.to_dict()
    assert out["source"] == {"component": "drahealth-controller"}
    assert out["reportingInstance"] == "ctl-0"
    assert out["count"] == 1
    assert out["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
    }


def test_now_defaults_to_the_wall_clock() -> None:
    before = dt.datetime.now(dt.UTC)
    built = make_event(
        name="e",
        namespace="ns",
        involved=POD,
        event_type="Normal",
        reason="R",
        message="m",
        component="c",
        instance="i",
    )
    assert built.firstTimestamp is not None and before <= built.firstTimestamp
    assert built.firstTimestamp == built.lastTimestamp
