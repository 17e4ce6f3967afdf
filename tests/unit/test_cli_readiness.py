"""The commands' readiness callables: the API check is driven by probes, at most one
request in flight and one per ``max_age``; the agent and driver checks read only state
the component keeps and name what is missing."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from drahealth.cli._readiness import ApiCheck, agent_readiness, all_of, driver_readiness


class FakeHttp:
    def __init__(self) -> None:
        self.calls = 0
        self.answer: Any = SimpleNamespace(status_code=200)
        self.gate = asyncio.Event()
        self.gate.set()

    async def get(self, path: str, timeout: float) -> Any:  # noqa: ASYNC109
        assert path == "/version" and timeout == 5.0
        self.calls += 1
        await self.gate.wait()
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def make_check(http: FakeHttp, now: list[float]) -> ApiCheck:
    client = SimpleNamespace(_client=SimpleNamespace(_client=http))
    return ApiCheck(client, max_age=30.0, clock=lambda: now[0])


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_api_check_is_lazy_bounded_and_refreshes_after_max_age() -> None:
    http, now = FakeHttp(), [100.0]
    check = make_check(http, now)
    assert http.calls == 0  # nothing is sent until something asks
    http.gate.clear()
    assert check() == (False, "API server not checked yet")
    assert check() == (False, "API server not checked yet")
    await _settle()
    assert http.calls == 1  # one in flight, however often probes come
    http.gate.set()
    await _settle()
    assert check() == (True, "ok")
    now[0] += 29.0
    assert check() == (True, "ok")
    await _settle()
    assert http.calls == 1  # still fresh
    now[0] += 1.0
    http.answer = OSError("connection refused")
    assert check() == (True, "ok")  # the last answer, while the new check runs
    await _settle()
    assert http.calls == 2
    assert check() == (False, "API server unreachable: OSError: connection refused")
    await check.close()


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        (SimpleNamespace(status_code=204), (True, "ok")),
        (SimpleNamespace(status_code=401), (False, "API server refused our credentials (401)")),
        (SimpleNamespace(status_code=403), (False, "API server refused our credentials (403)")),
        (SimpleNamespace(status_code=503), (False, "API server answered 503 to GET /version")),
        (TimeoutError(), (False, "API server unreachable: TimeoutError: no answer")),
    ],
)
async def test_api_check_answers(answer: Any, want: tuple[bool, str]) -> None:
    http = FakeHttp()
    http.answer = answer
    check = make_check(http, [0.0])
    await check.check()
    assert check() == want


def test_api_check_rejects_bad_settings() -> None:
    client = SimpleNamespace(_client=SimpleNamespace(_client=FakeHttp()))
    with pytest.raises(ValueError, match="must be > 0"):
        ApiCheck(client, max_age=0)


def test_all_of_joins_the_reasons_of_every_failing_check() -> None:
    ok = all_of(lambda: (True, "ok"))
    assert ok() == (True, "ok")
    both = all_of(lambda: (False, "a"), lambda: (True, "ok"), lambda: (False, "b"))
    assert both() == (False, "a; b")


def test_agent_readiness_per_mode() -> None:
    pods = SimpleNamespace(has_synced=False)
    agent = SimpleNamespace(mode=None, config=SimpleNamespace(mode="kubelet"))
    ready = agent_readiness(agent)
    assert ready() == (False, "agent not started")
    agent.mode = SimpleNamespace(pods=pods)
    assert ready() == (False, "pod watch not synced yet")
    pods.has_synced = True
    assert ready() == (True, "ok")

    observer = SimpleNamespace(lists=0, last_error=None)
    agent = SimpleNamespace(mode=observer, config=SimpleNamespace(mode="observer"))
    ready = agent_readiness(agent)
    assert ready() == (False, "kubelet PodResources not listed yet")
    observer.lists = 1
    assert ready() == (True, "ok")
    observer.last_error = "connection refused"
    assert ready() == (False, "kubelet PodResources: connection refused")


def test_driver_readiness() -> None:
    app = SimpleNamespace(handle=None, publisher=SimpleNamespace(last_error=None))
    published = asyncio.Event()
    ready = driver_readiness(app, published)
    assert ready() == (False, "plugin not serving")
    app.handle = SimpleNamespace(stopped=False, registered=asyncio.Event())
    assert ready() == (False, "not registered with the kubelet yet")
    app.handle.registered.set()
    assert ready() == (False, "ResourceSlices not published yet")
    app.publisher.last_error = RuntimeError("403 forbidden")
    assert ready() == (False, "ResourceSlices not published yet (last error: 403 forbidden)")
    published.set()
    assert ready() == (True, "ok")
    app.handle.stopped = True
    assert ready() == (False, "plugin not serving")
    # without API access there are no slices to wait for
    handle = SimpleNamespace(stopped=False, registered=SimpleNamespace(is_set=lambda: True))
    assert driver_readiness(SimpleNamespace(handle=handle))() == (True, "ok")
