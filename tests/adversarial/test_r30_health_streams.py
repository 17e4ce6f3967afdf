"""Attacks on the dra-health servicers' per-version stream accounting: a client that
opens and drops streams in a loop (a kubelet reconnecting without backoff, anything
else that can reach the socket)."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest

from drahealth import api
from drahealth.driver._hub import HealthHub

pytestmark = pytest.mark.timeout(20)

DEVS = [("node-1", "gpu-0")]
STREAMS = 400


class _Server:
    """Collects the generic handlers ``add_health_servicers`` registers."""

    def __init__(self) -> None:
        self.handlers: list[Any] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.handlers.extend(handlers)

    def watch(self, service: str) -> Any:
        class Details:
            method = f"/{service}/NodeWatchResources"

        for h in self.handlers:
            found = h.service(Details())
            if found is not None:
                return found.unary_stream
        raise LookupError(service)


class _Context:
    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")

    def add_done_callback(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def done(self) -> None:
        for cb in self.callbacks:
            cb(self)


async def _open_and_drop(server: _Server, service: str, request: Any, times: int) -> None:
    watch = server.watch(service)
    for _ in range(times):
        ctx = _Context()
        stream = watch(request, ctx)
        assert await anext(stream)  # the first snapshot
        await stream.aclose()
        ctx.done()


async def test_the_per_version_counter_has_one_key_per_version_however_many_streams() -> None:
    hub = HealthHub(DEVS)
    server = _Server()
    hub.add_to_server(server)  # type: ignore[arg-type]
    await _open_and_drop(
        server, api.DRA_HEALTH_V1, api.health_v1.NodeWatchResourcesRequest(), STREAMS
    )
    await _open_and_drop(
        server, api.DRA_HEALTH_V1ALPHA1, api.health_v1alpha1.NodeWatchResourcesRequest(), 3
    )
    fanout = hub._streams
    assert dict(fanout.opened) == {"v1": STREAMS, "v1alpha1": 3}
    assert not fanout.mailboxes  # every dropped stream's mailbox went


async def test_a_client_opening_streams_in_a_loop_does_not_flood_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub = HealthHub(DEVS)
    server = _Server()
    hub.add_to_server(server)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="drahealth.driver._health_service"):
        await _open_and_drop(
            server, api.DRA_HEALTH_V1, api.health_v1.NodeWatchResourcesRequest(), STREAMS
        )
    lines = [r for r in caplog.records if "stream opened" in r.getMessage()]
    # what a kubelet subscribed on is worth a line or a few, not one per reconnect
    assert len(lines) <= 20, f"{len(lines)} log lines for {STREAMS} streams"
