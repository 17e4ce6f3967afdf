"""The evictor's limits and its aim when answers are lost or a pod is replaced.

Held here:

* a pod whose eviction request got no answer (reset, timed out) may be leaving: it keeps
  its place under ``maxConcurrentPerNode``/``maxConcurrent`` until it is known to be gone
  or still running, so a second pod of the same node is not evicted beside it (before,
  the lost request freed the place at once and the node lost two pods together);
* an eviction names the uid of the pod the controller saw (``deleteOptions.preconditions``):
  a pod deleted and created again under the same name (a StatefulSet's) on a healthy
  device is not evicted in its place; the API server answers 409 and the entry is dropped
  without an "evicted" Event. (kube-apiserver 1.37.2, measured: the 409 comes after its
  own 10 s of conflict retries, which the embedded server skips; the right uid evicts at
  once on both.)
"""

from __future__ import annotations

from typing import Any

import httpx2
import pytest
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from drahealth.core import Consumer, Eviction
from drahealth.remedy._evict import Evictor
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(20)


def _consumer(name: str, uid: str, node: str = "n1") -> Consumer:
    return Consumer("default", name, uid, node, "claim", "gpu")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Server:
    """A fake API server: each pod is running, terminating or gone; ``lose`` names the
    pods whose eviction request is carried out but whose answer never comes."""

    def __init__(self, pods: dict[str, str]) -> None:
        self.pods = dict(pods)  # name -> "running" | "terminating"; absent: gone
        self.uids = {name: f"uid-{name}" for name in pods}
        self.lose: set[str] = set()
        self.evictions: list[str] = []
        self.reads: list[str] = []

    async def get(self, res: Any, name: str, *, namespace: str | None = None) -> Any:
        self.reads.append(name)
        if name not in self.pods:
            raise ApiError(
                response=httpx2.Response(
                    404, json={"kind": "Status", "code": 404, "reason": "NotFound"}
                )
            )
        meta = ObjectMeta(name=name, namespace=namespace, uid=self.uids[name])
        if self.pods[name] == "terminating":
            meta.deletionTimestamp = "2026-01-01T00:00:00Z"  # type: ignore[assignment]
        return Pod(metadata=meta)

    async def create(self, body: Any, *, name: str, namespace: str | None = None) -> Any:
        self.evictions.append(name)
        self.pods[name] = "terminating"
        if name in self.lose:
            raise httpx2.ReadTimeout("no answer")
        return body


def _evictor(server: _Server, clock: _Clock, per_node: int = 1) -> tuple[Evictor, list[Any]]:
    events: list[Any] = []
    limits = Eviction(mode="evict", max_concurrent_per_node=per_node, max_concurrent=10,
                      per_second=1000.0)  # fmt: skip
    ev = Evictor(
        server,  # type: ignore[arg-type]
        limits,
        on_event=lambda pod, kind, msg: events.append((pod.name, kind, msg)),
        clock=clock,
    )
    return ev, events


async def test_a_pod_whose_answer_was_lost_keeps_its_place_under_the_node_limit() -> None:
    server, clock = _Server({"a": "running", "b": "running"}), _Clock()
    server.lose = {"a"}
    ev, events = _evictor(server, clock)
    ev.want([(_consumer("a", "uid-a"), "xid"), (_consumer("b", "uid-b"), "xid")])
    await ev._start_due()
    # a's request was carried out (a is terminating) but its answer was lost: b waits
    assert server.evictions == ["a"], "a second pod of n1 evicted beside one that may be leaving"
    clock.now += 60
    await ev._start_due()  # a is read: terminating, the lost request evicted it
    assert server.reads == ["a"] and server.evictions == ["a"]
    assert [(n, k) for n, k, _ in events] == [("a", "evicted")]
    clock.now += 60
    await ev._start_due()
    assert server.evictions == ["a"], "b evicted while a is still terminating"
    del server.pods["a"]
    ev.gone(["uid-a"])
    await ev._start_due()
    assert server.evictions == ["a", "b"]


async def test_a_lost_answer_for_a_pod_still_running_frees_its_place_once_read() -> None:
    """The pod was not evicted (the request never arrived) and is no longer wanted: the
    read settles it, its place is free again, and the other pod of the node goes."""
    server, clock = _Server({"a": "running", "b": "running"}), _Clock()
    server.lose = {"a"}
    ev, events = _evictor(server, clock)
    ev.want([(_consumer("a", "uid-a"), "xid")])
    await ev._start_due()
    server.pods["a"] = "running"  # the request never reached the server
    ev.want([(_consumer("b", "uid-b"), "xid")])  # a recovered; b is wanted now
    clock.now += 60
    await ev._start_due()  # a is read: running, no longer wanted, its place is free
    assert server.reads == ["a"] and server.evictions == ["a"]
    await ev._start_due()
    assert server.evictions == ["a", "b"]
    assert [(n, k) for n, k, _ in events] == [("b", "evicted")]
    assert ev.pending == 0


async def test_a_lost_answer_is_settled_even_when_the_limits_are_full() -> None:
    """A pod whose answer was lost already counts: it is read (and asked again) whatever
    the limits, so a full cluster-wide limit cannot leave it unsettled for ever."""
    server, clock = _Server({"a": "running"}), _Clock()
    server.lose = {"a"}
    ev, _ = _evictor(server, clock)
    ev.limits = Eviction(mode="evict", max_concurrent_per_node=1, max_concurrent=1,
                         per_second=1000.0)  # fmt: skip
    ev.want([(_consumer("a", "uid-a"), "xid")])
    await ev._start_due()
    server.pods["a"] = "running"  # not evicted after all
    server.lose = set()
    clock.now += 60
    await ev._start_due()
    assert server.reads == ["a"] and server.evictions == ["a", "a"]


async def _pod(client: AsyncClient, name: str) -> Pod:
    body = Pod.from_dict({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    })  # fmt: skip
    created: Pod = await client.create(body)
    return created


async def test_a_pod_recreated_under_the_same_name_is_not_evicted_in_its_place(
    client: AsyncClient,
) -> None:
    old = await _pod(client, "web-0")
    assert old.metadata is not None and old.metadata.uid
    await client.delete(Pod, "web-0", namespace="default", grace_period=0)
    new = await _pod(client, "web-0")  # the StatefulSet's new pod, on a healthy device
    assert new.metadata is not None and new.metadata.uid != old.metadata.uid
    events: list[Any] = []
    ev = Evictor(
        client, Eviction(mode="evict", per_second=1000.0),
        on_event=lambda pod, kind, msg: events.append((pod.name, kind)),
    )  # fmt: skip
    ev.want([(Consumer("default", "web-0", old.metadata.uid, "n1", "c", "r"), "xid")])
    await ev._start_due()
    still = await client.get(Pod, "web-0", namespace="default")
    assert still.metadata is not None and still.metadata.uid == new.metadata.uid
    assert still.metadata.deletionTimestamp is None, (
        "the new pod was evicted in the old one's place"
    )
    assert events == [] and ev.pending == 0


async def test_the_pod_seen_is_still_evicted_with_its_uid_named(client: AsyncClient) -> None:
    pod = await _pod(client, "web-1")
    assert pod.metadata is not None and pod.metadata.uid
    events: list[Any] = []
    ev = Evictor(
        client, Eviction(mode="evict", per_second=1000.0),
        on_event=lambda p, kind, msg: events.append((p.name, kind)),
    )  # fmt: skip
    ev.want([(Consumer("default", "web-1", pod.metadata.uid, "n1", "c", "r"), "xid")])
    await ev._start_due()
    assert events == [("web-1", "evicted")]
    try:
        got = await client.get(Pod, "web-1", namespace="default")
    except ApiError as exc:
        assert exc.status.code == 404  # gone at once: no node, no grace period
    else:
        assert got.metadata is not None and got.metadata.deletionTimestamp is not None
