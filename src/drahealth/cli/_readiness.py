"""Readiness of the long-running commands, for ``/readyz`` of their metrics endpoint.

Owns :class:`ApiCheck` (is the API server answering, refreshed lazily by the probes
themselves) and the readiness callables of the node agent (:func:`agent_readiness`) and
the sample driver (:func:`driver_readiness`). Each is a
:data:`~drahealth._metrics_http.Readiness`: quick, non-blocking, built only from state
the component already keeps, returning ``(True, "ok")`` or ``(False, reason)``.

Liveness is not decided here: ``/healthz`` stays "the process and its loop answer".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import click

from drahealth._aio import cancel_and_wait
from drahealth._metrics_http import Readiness

__all__ = ["API_CHECK_INTERVAL", "ApiCheck", "agent_readiness", "all_of", "driver_readiness"]

#: A readiness probe arriving later than this after the last API check starts a new one.
DEFAULT_MAX_AGE = 30.0
#: How long one ``GET /version`` may take before the API counts as unreachable.
DEFAULT_TIMEOUT = 5.0

#: The commands' (hidden) option for :attr:`ApiCheck.max_age`; tests shorten it.
API_CHECK_INTERVAL = click.option(
    "--api-check-interval",
    type=click.FloatRange(min=0.01),
    default=DEFAULT_MAX_AGE,
    hidden=True,
    help="/readyz: seconds between checks that the API server answers.",
)


class ApiCheck:
    """Whether the API server answers ``GET /version`` (a readiness callable).

    The check is driven by the probes: a call finding the last answer older than
    ``max_age`` seconds starts one background ``GET /version`` (at most one in flight)
    and returns the last known answer, so a probe never waits on the network and the
    API sees at most one request per ``max_age`` from each component, and none when
    nothing probes. ``/version`` is readable without any RBAC grant (the
    ``system:public-info-viewer`` role). Any 2xx is reachable; 401/403 mean our
    credentials are refused; other statuses and transport errors mean unreachable.
    """

    def __init__(
        self,
        client: Any,
        *,
        max_age: float = DEFAULT_MAX_AGE,
        timeout: float = DEFAULT_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_age <= 0 or timeout <= 0:
            raise ValueError(f"max_age and timeout must be > 0, got {max_age}, {timeout}")
        self._http: Any = client._client._client  # lightkube's generic client -> httpx pool
        self.max_age = max_age
        self.timeout = timeout
        self._clock = clock
        self._checked_at: float | None = None
        self._answer: tuple[bool, str] = (False, "API server not checked yet")
        self._task: asyncio.Task[None] | None = None
        self.checks = 0

    def __call__(self) -> tuple[bool, str]:
        stale = self._checked_at is None or self._clock() - self._checked_at >= self.max_age
        if stale and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self.check(), name="api-check")
        return self._answer

    async def check(self) -> None:
        """One ``GET /version`` now; its answer is what the next call returns."""
        self.checks += 1
        try:
            resp = await self._http.get("/version", timeout=self.timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            detail = str(exc) or "no answer"
            answer = (False, f"API server unreachable: {type(exc).__name__}: {detail}")
        else:
            code = resp.status_code
            if 200 <= code < 300:
                answer = (True, "ok")
            elif code in (401, 403):
                answer = (False, f"API server refused our credentials ({code})")
            else:
                answer = (False, f"API server answered {code} to GET /version")
        self._answer = answer
        self._checked_at = self._clock()

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait([task])


def all_of(*checks: Readiness) -> Readiness:
    """Ready when every check is; the reasons of all failing ones, joined by ``; ``."""

    def ready() -> tuple[bool, str]:
        reasons = []
        for check in checks:
            ok, reason = check()
            if not ok:
                reasons.append(reason)
        return (not reasons, "; ".join(reasons) or "ok")

    return ready


def agent_readiness(agent: Any) -> Readiness:
    """The node agent is ready once started and its view of the node is synced.

    kubelet mode: the pod watch has listed once. observer mode: the last PodResources
    ``List`` succeeded (the kubelet's socket answers). ``agent`` is a started
    :class:`~drahealth.node.NodeAgent`.
    """

    def ready() -> tuple[bool, str]:
        mode = agent.mode
        if mode is None:
            return False, "agent not started"
        pods = getattr(mode, "pods", None)  # kubelet mode: the pod reflector
        if pods is not None and not pods.has_synced:
            return False, "pod watch not synced yet"
        if agent.config.mode == "observer":
            if getattr(mode, "last_error", None):
                return False, f"kubelet PodResources: {mode.last_error}"
            if not getattr(mode, "lists", 0):
                return False, "kubelet PodResources not listed yet"
        return True, "ok"

    return ready


def driver_readiness(app: Any, slices_published: asyncio.Event | None = None) -> Readiness:
    """The sample driver is ready while the kubelet has it registered and it serves.

    ``slices_published`` (with API access): set once its ResourceSlices were on the
    server; until then it is not ready. ``app`` is a started
    :class:`~drahealth.simdriver.SampleDriverApp`.
    """

    def ready() -> tuple[bool, str]:
        handle = app.handle
        if handle is None or handle.stopped:
            return False, "plugin not serving"
        if not handle.registered.is_set():
            return False, "not registered with the kubelet yet"
        if slices_published is not None and not slices_published.is_set():
            error = getattr(app.publisher, "last_error", None)
            return False, "ResourceSlices not published yet" + (
                f" (last error: {error})" if error is not None else ""
            )
        return True, "ok"

    return ready
