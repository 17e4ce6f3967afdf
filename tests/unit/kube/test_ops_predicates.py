"""Error predicates and retry_on_conflict, with constructed errors (no server)."""

from __future__ import annotations

import httpx2
import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from drahealth.kube import (
    is_already_exists,
    is_conflict,
    is_gone,
    is_not_found,
    retry_on_conflict,
    status_code,
)


def api_error(code: int, reason: str | None = None) -> ApiError:
    return ApiError(status=Status(code=code, reason=reason, message=f"code {code}"))


def http_error(code: int) -> httpx2.HTTPStatusError:
    req = httpx2.Request("GET", "http://x/")
    resp = httpx2.Response(code, request=req, text="plain")
    return httpx2.HTTPStatusError("boom", request=req, response=resp)


def test_predicates_on_api_error() -> None:
    assert is_not_found(api_error(404, "NotFound"))
    assert is_conflict(api_error(409, "Conflict"))
    assert not is_conflict(api_error(409, "AlreadyExists"))
    assert is_already_exists(api_error(409, "AlreadyExists"))
    assert is_gone(api_error(410, "Expired"))
    assert status_code(api_error(500)) == 500


def test_predicates_on_plain_http_error() -> None:
    # lightkube raises a plain HTTPStatusError when Content-Type is not exactly JSON
    assert is_not_found(http_error(404))
    assert is_conflict(http_error(409))
    assert not is_not_found(http_error(409))


def test_predicates_on_other_exceptions() -> None:
    assert status_code(ValueError("x")) is None
    assert not is_not_found(ValueError("x"))


async def test_retry_on_conflict_retries_then_succeeds() -> None:
    calls = 0

    async def fn() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise api_error(409, "Conflict")
        return "ok"

    assert await retry_on_conflict(fn, attempts=5, base_delay=0.001) == "ok"
    assert calls == 3


async def test_retry_on_conflict_gives_up() -> None:
    calls = 0

    async def fn() -> None:
        nonlocal calls
        calls += 1
        raise api_error(409, "Conflict")

    with pytest.raises(ApiError):
        await retry_on_conflict(fn, attempts=3, base_delay=0.001)
    assert calls == 3


async def test_retry_on_conflict_other_errors_propagate_at_once() -> None:
    calls = 0

    async def fn() -> None:
        nonlocal calls
        calls += 1
        raise api_error(404, "NotFound")

    with pytest.raises(ApiError):
        await retry_on_conflict(fn, base_delay=0.001)
    assert calls == 1


async def test_retry_on_conflict_validates_attempts() -> None:
    async def fn() -> None:
        return None

    with pytest.raises(ValueError):
        await retry_on_conflict(fn, attempts=0)
