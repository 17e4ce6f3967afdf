"""Flood, slowloris and cross-site protection shared by every aiohttp server we run.

Owns :class:`HTTPGuard`, which the API server, the dashboard and the ``/metrics``
endpoint build their runner and site with:

* a header read timeout: a connection that has not delivered a complete request head
  within ``header_timeout`` seconds of connecting is closed (aiohttp's keep-alive timer,
  set to ``keepalive_timeout``, bounds the wait for every later request head);
* a connection cap: over ``max_connections`` (clamped to half the process's soft
  ``RLIMIT_NOFILE`` so the listener never hits ``EMFILE``), the oldest connection that is
  not serving a request is closed to admit the new one; when all are serving, the new
  one gets ``503`` and is closed; with ``overflow_connections`` and ``always_paths`` set,
  up to that many connections over the cap are still read, and one request on each is
  answered if its path is one of ``always_paths`` (health endpoints), else ``503`` with
  ``Retry-After``; such a connection is closed after its answer;
* a Host and Origin check (DNS rebinding and cross-site requests): on a loopback
  address only ``localhost``, ``127.0.0.1`` and ``[::1]`` (any port) and the configured
  ``allowed_hosts`` are accepted as ``Host``; on any other address every Host is
  accepted unless ``allowed_hosts`` is given, which then restricts it. A POST, PUT,
  PATCH or DELETE carrying an ``Origin`` that is neither the server's own origin nor an
  allowed host gets ``403``; requests without ``Origin`` (kubectl, lightkube, curl) pass;
* :class:`RateLimitFilter`, a per-logger, per-message token bucket installed on the
  ``aiohttp`` and ``asyncio`` loggers by :func:`install_log_rate_limit`, which also
  installs :class:`MalformedRequestFilter`: a request aiohttp cannot parse (a request
  line or header over its 8190-byte limit, bad framing) is answered 400 by aiohttp and
  logged as one line without a traceback.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import resource
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

__all__ = [
    "LOOPBACK_HOSTS",
    "HTTPGuard",
    "HTTPLimits",
    "MalformedRequestFilter",
    "RateLimitFilter",
    "check_allowed_hosts",
    "install_log_rate_limit",
]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
GUARDED_LOGGERS = ("aiohttp.server", "aiohttp.access", "aiohttp.web", "asyncio", __name__)
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 32\r\n\r\ntoo many connections, try again\n"
)
_BUSY_TEXT = "too many connections, try again\n"


@dataclass(frozen=True)
class HTTPLimits:
    """Per-server bounds. Times in seconds."""

    header_timeout: float = 10.0
    max_connections: int = 512
    keepalive_timeout: float = 15.0
    #: Connections read over the cap when all are serving, for ``always_paths`` only.
    overflow_connections: int = 0

    def __post_init__(self) -> None:
        if self.overflow_connections < 0:
            raise ValueError(f"overflow_connections must be >= 0, got {self.overflow_connections}")
        if not self.header_timeout > 0:
            raise ValueError(f"header_timeout must be > 0, got {self.header_timeout}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if not self.keepalive_timeout > 0:
            raise ValueError(f"keepalive_timeout must be > 0, got {self.keepalive_timeout}")


def check_allowed_hosts(names: Iterable[str]) -> tuple[str, ...]:
    """Normalise allowed Host names (lower case, no brackets); ValueError names a bad one."""
    out = []
    for name in names:
        host = name.strip().lower()
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not host or any(c in host for c in "/@?#[] \t") or ("%" in host):
            raise ValueError(f"{name!r} is not a host name or address (no scheme, port or path)")
        if ":" in host:
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise ValueError(
                    f"{name!r} is not a host name or address (no scheme, port or path)"
                ) from None
        out.append(host)
    return tuple(out)


def _is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostname(value: str) -> str | None:
    """The host part of a ``Host`` header value (``name``, ``name:port``, ``[v6]:port``)."""
    try:
        parts = urlsplit("//" + value)
        _ = parts.port  # raises on a malformed port
    except ValueError:
        return None
    if parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    return (parts.hostname or "").lower() or None


def _forbidden(message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Forbidden",
        "code": 403,
    }
    return web.json_response(body, status=403)


class _Conn(asyncio.Protocol):
    """Wraps aiohttp's per-connection protocol: admission, header timer, bookkeeping."""

    __slots__ = ("_busy", "_factory", "_guard", "_inner", "_timer", "overflow", "transport")

    def __init__(self, guard: HTTPGuard, factory: Callable[[], asyncio.Protocol]) -> None:
        self._guard = guard
        #: Admitted over the cap: one request, and only an ``always_paths`` one is served.
        self.overflow = False
        self._inner: asyncio.Protocol | None = None
        self._factory = factory
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._busy = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self._guard._admit(self):
            transport.write(_REFUSED)
            transport.close()
            return
        self._timer = asyncio.get_running_loop().call_later(
            self._guard.limits.header_timeout, self._header_timeout
        )
        self._inner = self._factory()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._guard._forget(self)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_timeout(self) -> None:
        self._timer = None
        if self._busy == 0 and self._guard._is_idle(self):
            self._guard.timed_out += 1
            self.abort()

    def abort(self) -> None:
        self._cancel_timer()
        self._guard._forget(self)
        if self.transport is not None:
            self.transport.abort()


class HTTPGuard:
    """Limits, Host/Origin policy and connection bookkeeping for one aiohttp server.

    Build the application with ``middlewares=[*guard.middlewares, ...]``, then either
    ``runner = await guard.serve(app, host, port)``, or build the runner with
    ``**guard.runner_kwargs`` and serve with ``await guard.site(runner, host, port).start()``.
    ``host`` is the address the server binds; it decides the default Host policy.
    """

    def __init__(
        self,
        host: str,
        *,
        limits: HTTPLimits | None = None,
        allowed_hosts: Iterable[str] = (),
        always_paths: Iterable[str] = (),
    ) -> None:
        self.limits = limits or HTTPLimits()
        #: Paths answered even when every connection is serving (see the module doc).
        self.always_paths = frozenset(always_paths)
        self._overflow: set[_Conn] = set()
        self.allowed_hosts = frozenset(check_allowed_hosts(allowed_hosts))
        self._names = LOOPBACK_HOSTS | self.allowed_hosts
        if _is_loopback(host):
            self._names |= {host.strip("[]").lower()}
        # Any Host is accepted on a non-loopback bind address unless hosts are listed.
        self.any_host = not self.allowed_hosts and not _is_loopback(host or "0.0.0.0")
        self.max_connections = _clamp_to_fd_limit(self.limits.max_connections)
        # Connections not serving a request, oldest first (shed first); the others.
        self._idle: collections.OrderedDict[_Conn, None] = collections.OrderedDict()
        self._busy: set[_Conn] = set()
        self._by_transport: dict[asyncio.BaseTransport, _Conn] = {}
        self.timed_out = 0
        self.shed = 0
        self.refused = 0
        self.middlewares = (self._middleware,)

    # -- wiring ------------------------------------------------------------------------

    @property
    def runner_kwargs(self) -> dict[str, Any]:
        return {"keepalive_timeout": self.limits.keepalive_timeout}

    def site(self, runner: web.BaseRunner, host: str, port: int) -> web.BaseSite:
        return _GuardedSite(runner, self, host, port)

    async def serve(self, app: web.Application, host: str, port: int) -> web.AppRunner:
        """Run ``app`` behind this guard on ``host:port`` (no access log); the runner to
        clean up. A bind that fails cleans up before the error propagates."""
        runner = web.AppRunner(app, access_log=None, **self.runner_kwargs)
        await runner.setup()
        try:
            await self.site(runner, host, port).start()
        except BaseException:
            await runner.cleanup()
            raise
        return runner

    @property
    def connections(self) -> int:
        return len(self._idle) + len(self._busy)

    # -- admission and bookkeeping -----------------------------------------------------

    def _admit(self, conn: _Conn) -> bool:
        while self.connections >= self.max_connections:
            if not self._idle:
                if self.always_paths and len(self._overflow) < self.limits.overflow_connections:
                    conn.overflow = True
                    self._overflow.add(conn)
                    assert conn.transport is not None
                    self._by_transport[conn.transport] = conn
                    return True
                self.refused += 1
                log.warning(
                    "refused a connection: all %d connections are serving requests",
                    self.max_connections,
                )
                return False
            oldest = next(iter(self._idle))
            self.shed += 1
            oldest.abort()
        self._idle[conn] = None
        assert conn.transport is not None
        self._by_transport[conn.transport] = conn
        return True

    def _forget(self, conn: _Conn) -> None:
        self._idle.pop(conn, None)
        self._busy.discard(conn)
        self._overflow.discard(conn)
        if conn.transport is not None:
            self._by_transport.pop(conn.transport, None)

    def _is_idle(self, conn: _Conn) -> bool:
        return conn in self._idle or (conn.overflow and conn._busy == 0)

    def _enter(self, transport: asyncio.BaseTransport | None) -> _Conn | None:
        conn = self._by_transport.get(transport) if transport is not None else None
        if conn is None:
            return None
        conn._cancel_timer()
        conn._busy += 1
        if conn.overflow:
            return conn
        self._idle.pop(conn, None)
        self._busy.add(conn)
        return conn

    def _leave(self, conn: _Conn) -> None:
        conn._busy -= 1
        if conn.overflow:
            return
        if conn._busy == 0 and conn in self._busy:
            # Idle keep-alive: aiohttp's keep-alive timer bounds the wait for the next head.
            self._busy.discard(conn)
            self._idle[conn] = None

    # -- Host and Origin ---------------------------------------------------------------

    def host_allowed(self, hostname: str) -> bool:
        if self.any_host:
            return True
        return hostname in self._names

    def _origin_allowed(self, origin: str, host_header: str | None) -> bool:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False  # "null", file:, data: and the like
        if host_header is not None and parts.netloc.lower() == host_header.lower():
            return True  # same origin
        return parts.hostname.lower() in self.allowed_hosts

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = self._enter(request.transport)
        try:
            if conn is not None and conn.overflow:
                return await self._overflow_request(request, handler)
            host = request.headers.get("Host")
            if host is not None:
                name = _hostname(host)
                if name is None or not self.host_allowed(name):
                    return _forbidden(
                        f"Host {host!r} is not served here (allowed: localhost, 127.0.0.1, "
                        "[::1] or the configured --allowed-host names)"
                    )
            origin = request.headers.get("Origin")
            if (
                request.method in MUTATING
                and origin is not None
                and not self._origin_allowed(origin, host)
            ):
                return _forbidden(f"cross-origin {request.method} from {origin!r} refused")
            return await handler(request)
        finally:
            if conn is not None:
                self._leave(conn)

    async def _overflow_request(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """One request on a connection over the cap: an ``always_paths`` GET is served,
        anything else is 503; either way the connection closes after the answer."""
        if request.method in ("GET", "HEAD") and request.path in self.always_paths:
            resp = await handler(request)
        else:
            self.refused += 1
            resp = web.Response(status=503, text=_BUSY_TEXT, headers={"Retry-After": "1"})
        if not resp.prepared:
            resp.force_close()
        return resp


class _GuardedSite(web.BaseSite):
    """A TCP site whose connections go through :class:`HTTPGuard`."""

    __slots__ = ("_guard", "_host", "_port")

    def __init__(self, runner: web.BaseRunner, guard: HTTPGuard, host: str, port: int) -> None:
        super().__init__(runner)
        self._guard = guard
        self._host = host
        self._port = port

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        install_log_rate_limit()
        server = self._runner.server
        assert server is not None
        guard = self._guard
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Conn(guard, server), self._host, self._port, backlog=128
        )


def _clamp_to_fd_limit(cap: int) -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return cap
    return max(1, min(cap, soft // 2))


# -- logging ---------------------------------------------------------------------------


class RateLimitFilter(logging.Filter):
    """Token bucket per (logger, message template): ``burst`` records, then ``rate``/s.

    The first record refused in a run passes with a note that similar messages are being
    suppressed; the next record let through carries ``[N similar messages suppressed]``.
    Buckets are kept for at most ``max_keys`` templates (least recently used dropped).
    """

    def __init__(self, burst: int = 10, per_seconds: float = 10.0, max_keys: int = 1024) -> None:
        super().__init__()
        if burst < 1 or per_seconds <= 0 or max_keys < 1:
            raise ValueError("burst and max_keys must be >= 1 and per_seconds > 0")
        self.burst = burst
        self.rate = burst / per_seconds
        self.max_keys = max_keys
        # key -> [tokens, last refill time, records dropped, 1.0 once the note went out]
        self._buckets: collections.OrderedDict[tuple[str, str], list[float]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()
        self.clock: Callable[[], float] = time.monotonic

    def filter(self, record: logging.LogRecord) -> bool:
        template = str(record.msg).split("\n", 1)[0][:200]
        key = (record.name, template)
        now = self.clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = [float(self.burst), now, 0.0, 0.0]
                self._buckets[key] = bucket
                while len(self._buckets) > self.max_keys:
                    self._buckets.popitem(last=False)
            else:
                self._buckets.move_to_end(key)
                bucket[0] = min(float(self.burst), bucket[0] + (now - bucket[1]) * self.rate)
                bucket[1] = now
            if bucket[0] >= 1.0:
                bucket[0] -= 1.0
                dropped, bucket[2], bucket[3] = int(bucket[2]), 0.0, 0.0
                if dropped:
                    _rewrite(record, f"[{dropped} similar messages suppressed] ")
                return True
            if bucket[3]:
                bucket[2] += 1.0
                return False
            bucket[3] = 1.0
        _rewrite(record, "", " [rate limit reached: similar messages suppressed for a while]")
        return True


def _rewrite(record: logging.LogRecord, prefix: str, suffix: str = "") -> None:
    message = record.getMessage()
    record.msg = prefix + message + suffix
    record.args = None
    if suffix:
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None


class MalformedRequestFilter(logging.Filter):
    """Turns aiohttp's record of a request it could not parse (answered 400 by aiohttp:
    a request line or header over its limit, bad framing) into one warning line without
    a traceback; every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            text = " ".join(str(exc).split()) or type(exc).__name__
            record.msg = f"refused a malformed request: {text[:200]}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_installed: RateLimitFilter | None = None
_malformed = MalformedRequestFilter()


def install_log_rate_limit(names: Iterable[str] = GUARDED_LOGGERS) -> RateLimitFilter:
    """Install one shared :class:`RateLimitFilter` on the named loggers (idempotent)."""
    global _installed
    if _installed is None:
        _installed = RateLimitFilter()
    for name in names:
        logger = logging.getLogger(name)
        if name.startswith("aiohttp") and _malformed not in logger.filters:
            logger.addFilter(_malformed)  # before the rate limit: it sees the final text
        if _installed not in logger.filters:
            logger.addFilter(_installed)
    return _installed
