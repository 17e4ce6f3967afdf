"""The ``/metrics``, ``/healthz`` and ``/readyz`` HTTP endpoint of every component.

Owns a small aiohttp server that renders one private ``CollectorRegistry`` in the
Prometheus text format, plus the two probe endpoints:

* ``/healthz``: the process is alive and its event loop answers; always ``200 ok``.
* ``/readyz``: the component's own readiness callable (``ready=``, a
  :data:`Readiness`): ``200 ok`` when it returns ``(True, _)``, ``503`` with its reason
  as plain text when it returns ``(False, reason)`` or raises. Without a callable the
  component declares no readiness of its own and ``/readyz`` answers like ``/healthz``.

Knows nothing of which metrics it serves or what readiness means for a component.
Connections go through :class:`~drahealth._http_guard.HTTPGuard` (header timeout, a cap
of ``METRICS_LIMITS.max_connections``, the Host check).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from drahealth._http_guard import HTTPGuard, HTTPLimits

__all__ = ["METRICS_LIMITS", "READY_REASON_MAX", "MetricsServer", "Readiness"]

# A scraper holds one or two connections; 128 leaves room and keeps fds for the rest.
METRICS_LIMITS = HTTPLimits(max_connections=128)

#: ``() -> (ready, reason)``: called on every ``/readyz`` request, in the event loop, so
#: it must be quick and must not block (read state the component already keeps).
Readiness = Callable[[], tuple[bool, str]]

#: A longer reason is cut to this many characters (a probe logs the body).
READY_REASON_MAX = 1024


class MetricsServer:
    """``/metrics`` (Prometheus text format), ``/healthz`` and ``/readyz`` on ``host:port``.

    ``ready`` is the component's readiness callable; it may also be given to
    :meth:`start` or assigned to :attr:`ready` at any time (``None``: no readiness of
    its own, ``/readyz`` answers ``ok``).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        limits: HTTPLimits = METRICS_LIMITS,
        allowed_hosts: tuple[str, ...] = (),
        ready: Readiness | None = None,
    ) -> None:
        self.registry = registry
        self.limits = limits
        self.allowed_hosts = allowed_hosts
        self.ready: Readiness | None = ready
        self._runner: web.AppRunner | None = None
        self._host = "127.0.0.1"
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the metrics server is not started")
        return self._port

    @property
    def url(self) -> str:
        """Address of the metrics endpoint."""
        return f"http://{self._host}:{self.port}/metrics"

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, *, ready: Readiness | None = None
    ) -> None:
        if ready is not None:
            self.ready = ready
        guard = HTTPGuard(host, limits=self.limits, allowed_hosts=self.allowed_hosts)
        app = web.Application(middlewares=guard.middlewares)
        app.router.add_get("/metrics", make_aiohttp_handler(self.registry))
        app.router.add_get("/healthz", _healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = await guard.serve(app, host, port)
        self._runner = runner
        self._host = host
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _readyz(self, request: web.Request) -> web.Response:
        ready, reason = self.readiness()
        if ready:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=reason + "\n")

    def readiness(self) -> tuple[bool, str]:
        """What ``/readyz`` answers: ``(True, "ok")`` or ``(False, reason)``."""
        check = self.ready
        if check is None:
            return True, "ok"
        try:
            ready, reason = check()
        except Exception as exc:  # a broken check must say so, not kill the endpoint
            return False, _cut(f"readiness check failed: {type(exc).__name__}: {exc}")
        if ready:
            return True, "ok"
        return False, _cut(" ".join(str(reason).split()) or "not ready")


def _cut(reason: str) -> str:
    if len(reason) <= READY_REASON_MAX:
        return reason
    return reason[: READY_REASON_MAX - 3] + "..."


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")
