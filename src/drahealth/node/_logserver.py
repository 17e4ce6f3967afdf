"""The kubelet's ``/containerLogs`` endpoint for the simulated containers.

Owns :class:`ContainerLogServer`: ``GET /containerLogs/{namespace}/{pod}/{container}``
on a loopback port (recorded in the Node's ``daemonEndpoints.kubeletEndpoint.Port``;
the API server's ``pods/log`` subresource proxies to it). Query parameters as the
kubelet reads them: ``previous`` (the run before the last restart), ``tailLines``,
``limitBytes``, ``timestamps`` (accepted, not applied) and ``follow`` (answered with what
there is so far). Plain text; a missing pod or container is 404 with a message, a bad
parameter 400. Connections go through the shared HTTP guard.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from drahealth._http_guard import HTTPGuard, HTTPLimits

__all__ = ["ContainerLogServer", "LogSource", "select_log"]

#: ``(namespace, pod, container, previous) -> output``; raises LookupError (message) when
#: there is no such pod, container or previous run.
LogSource = Callable[[str, str, str, bool], bytes]


def _int_param(request: web.Request, name: str, minimum: int) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be an integer, not {raw[:32]!r}\n") from None
    if value < minimum:
        raise web.HTTPBadRequest(text=f"{name} must be at least {minimum}, got {value}\n")
    return value


def select_log(data: bytes, tail_lines: int | None, limit_bytes: int | None) -> bytes:
    """The last ``tail_lines`` lines of ``data``, then at most ``limit_bytes`` of them."""
    if tail_lines is not None:
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-tail_lines:]) if tail_lines else b""
    if limit_bytes is not None:
        data = data[:limit_bytes]
    return data


class ContainerLogServer:
    """Serves container output from ``source`` (see the module docstring)."""

    def __init__(self, source: LogSource) -> None:
        self.source = source
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the container log server is not started")
        return self._port

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        guard = HTTPGuard(host, limits=HTTPLimits(max_connections=64))
        app = web.Application(middlewares=guard.middlewares)
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        runner = await guard.serve(app, host, port)
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _logs(self, request: web.Request) -> web.Response:
        ns = request.match_info["namespace"]
        pod = request.match_info["pod"]
        container = request.match_info["container"]
        previous = request.query.get("previous", "false").lower() in ("true", "1")
        tail = _int_param(request, "tailLines", 0)
        limit = _int_param(request, "limitBytes", 1)
        try:
            data = self.source(ns, pod, container, previous)
        except LookupError as exc:
            return web.Response(status=404, text=f"{exc.args[0] if exc.args else exc}\n")
        return web.Response(
            body=select_log(data, tail, limit), content_type="text/plain", charset="utf-8"
        )
