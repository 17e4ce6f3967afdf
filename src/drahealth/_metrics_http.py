"""The ``/metrics`` and ``/healthz`` HTTP endpoint shared by the driver and the agent.

Owns a small aiohttp server that renders one private ``CollectorRegistry`` in the
Prometheus text format. Knows nothing of which metrics it serves. Connections go
through :class:`~drahealth._http_guard.HTTPGuard` (header timeout, a cap of
``METRICS_LIMITS.max_connections``, the Host check).
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from drahealth._http_guard import HTTPGuard, HTTPLimits

__all__ = ["METRICS_LIMITS", "MetricsServer"]

# A scraper holds one or two connections; 128 leaves room and keeps fds for the rest.
METRICS_LIMITS = HTTPLimits(max_connections=128)


class MetricsServer:
    """``/metrics`` (Prometheus text format) and ``/healthz`` on ``host:port`` (aiohttp)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        limits: HTTPLimits = METRICS_LIMITS,
        allowed_hosts: tuple[str, ...] = (),
    ) -> None:
        self.registry = registry
        self.limits = limits
        self.allowed_hosts = allowed_hosts
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

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        guard = HTTPGuard(host, limits=self.limits, allowed_hosts=self.allowed_hosts)
        app = web.Application(middlewares=guard.middlewares)
        app.router.add_get("/metrics", make_aiohttp_handler(self.registry))
        app.router.add_get("/healthz", _healthz)
        runner = web.AppRunner(app, access_log=None, **guard.runner_kwargs)
        await runner.setup()
        try:
            await guard.site(runner, host, port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._host = host
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")
