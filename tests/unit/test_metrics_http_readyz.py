"""``/readyz`` of the shared metrics endpoint: the component's readiness callable decides,
``/healthz`` stays "process alive" whatever readiness says, and a broken or chatty
callable gives a bounded 503, never a 500."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from drahealth._metrics_http import READY_REASON_MAX, MetricsServer


async def _get(server: MetricsServer, path: str) -> tuple[int, str, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{server.port}{path}") as resp,
    ):
        return resp.status, await resp.text(), resp.content_type


async def test_readyz_follows_the_callable_and_healthz_does_not() -> None:
    state = {"ready": False, "reason": "informers not synced: pods"}
    server = MetricsServer(
        CollectorRegistry(), ready=lambda: (bool(state["ready"]), str(state["reason"]))
    )
    await server.start()
    try:
        assert await _get(server, "/readyz") == (
            503,
            "informers not synced: pods\n",
            "text/plain",
        )
        assert (await _get(server, "/healthz"))[:2] == (200, "ok\n")
        state["ready"] = True
        assert (await _get(server, "/readyz"))[:2] == (200, "ok\n")
    finally:
        await server.stop()


async def test_no_callable_means_ready_and_start_or_attribute_can_set_one() -> None:
    server = MetricsServer(CollectorRegistry())
    await server.start(ready=lambda: (False, "API server unreachable"))
    try:
        assert (await _get(server, "/readyz"))[:2] == (503, "API server unreachable\n")
        server.ready = None
        assert (await _get(server, "/readyz"))[:2] == (200, "ok\n")
    finally:
        await server.stop()


def _boom() -> tuple[bool, str]:
    raise RuntimeError("state went away")


@pytest.mark.parametrize(
    ("check", "status", "body"),
    [
        (_boom, 503, "readiness check failed: RuntimeError: state went away\n"),
        (lambda: (False, ""), 503, "not ready\n"),
        (lambda: (False, "line one\nline two"), 503, "line one line two\n"),
        (lambda: (True, "ignored when ready"), 200, "ok\n"),
    ],
)
async def test_odd_callables_give_a_clear_answer(check: object, status: int, body: str) -> None:
    server = MetricsServer(CollectorRegistry(), ready=check)  # type: ignore[arg-type]
    await server.start()
    try:
        assert (await _get(server, "/readyz"))[:2] == (status, body)
    finally:
        await server.stop()


async def test_long_reason_is_cut() -> None:
    server = MetricsServer(CollectorRegistry(), ready=lambda: (False, "x" * 100_000))
    await server.start()
    try:
        status, text, _ = await _get(server, "/readyz")
    finally:
        await server.stop()
    assert status == 503
    assert len(text) == READY_REASON_MAX + 1 and text.endswith("...\n")
