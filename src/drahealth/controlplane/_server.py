"""The HTTP face of the embedded API server (aiohttp) and its lifecycle.

Owns URL routing (``/api``, ``/apis``, discovery, ``/version``, health endpoints) for
what the server's release profile serves (``--kube-version``: other group versions and
kinds are the real server's 404),
query-parameter parsing, content negotiation (JSON always; ``Table`` when kubectl
asks for it; aggregated discovery v2 when asked), the watch stream (chunked,
newline-delimited JSON, bookmarks, ``timeoutSeconds``, 410 as an ``ERROR`` event),
objects converted to the requested version on the way out,
the 504 "Too large resource version" answer, the data file's lifecycle (loaded on start;
every answer waits until what it reports is durable, see ``_wal``; ``/readyz`` and
``/metrics`` report persistence) and the kubeconfig written for clients. Object
semantics live in ``_engine``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import msgspec
import yaml
from aiohttp import web

from drahealth._http_guard import HTTPGuard, HTTPLimits
from drahealth.core import NEWEST_KUBE_VERSION, KubeProfile, kube_profile

from . import _decode, _protobuf, _resources, _status
from ._engine import APPLY, NAMESPACES, PATCH_TYPES, Engine, WriteOptions
from ._openapi import V2_PROTOBUF, Documents
from ._podlog import pod_log
from ._protobuf import ProtobufError, UnsupportedKind
from ._resources import ResourceType
from ._selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)
from ._status import APIError
from ._store import Store, TooOld
from ._table import table, wants_table
from ._wal import COMPACT_BYTES, RETRY_INTERVAL_S, Journal, PersistError

log = logging.getLogger(__name__)

JSON = dict[str, Any]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

BOOTSTRAP_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def version_info(profile: KubeProfile) -> JSON:
    """``/version`` of the release ``profile`` models (``gitVersion`` ``v1.<minor>.0-drahealth``).

    The build fields are fixed; ``minCompatibility`` is the release before.
    """
    minor = profile.minor
    return {
        "major": "1",
        "minor": str(minor),
        "emulationMajor": "1",
        "emulationMinor": str(minor),
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": str(minor - 1),
        "gitVersion": f"v1.{minor}.0-drahealth",
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "python",
        "compiler": "drahealth",
        "platform": "linux/amd64",
    }


PROTOBUF = "application/vnd.kubernetes.protobuf"
#: Kinds whose immediate delete answers with the deleted object (upstream's
#: ``ReturnDeletedObject``); the others answer with a Success Status naming it.
RETURNS_DELETED = frozenset({
    ("", "Pod"), ("", "Namespace"), ("resource.k8s.io", "DeviceClass"),
    ("resource.k8s.io", "ResourceClaim"), ("resource.k8s.io", "ResourceClaimTemplate"),
    ("resource.k8s.io", "ResourceSlice"),
})  # fmt: skip

#: Media types a POST/PUT/DELETE body may have (the real server's; PATCH has its own).
#: None of them can be sent cross-origin by a browser without a CORS preflight, and a
#: body without a Content-Type is refused too (a browser can send one as a simple request).
_BODY_TYPES = ("application/json", "application/yaml", PROTOBUF)
#: A watch write (one event) that does not complete in this time closes the watch.
WATCH_WRITE_TIMEOUT_S = 10.0


#: Paths answered even when every connection is busy (on an overflow connection).
HEALTH_PATHS = ("/healthz", "/readyz", "/livez")
#: Connections read over the cap for :data:`HEALTH_PATHS` alone.
HEALTH_OVERFLOW_CONNECTIONS = 16


class WatchTicket:
    """One admitted watch: its client, when it started and how to end it early."""

    __slots__ = ("evicted", "key", "seq", "stop")

    def __init__(self, key: tuple[str, str, str], seq: int) -> None:
        self.key = key
        self.seq = seq
        self.evicted = False
        #: Ends the stream cleanly (queued events first); set once the watch is open.
        self.stop: Callable[[], None] | None = None

    def end(self) -> None:
        self.evicted = True
        if self.stop is not None:
            self.stop()


class WatchSlots:
    """Caps on open watches: ``total`` in all and ``per_client`` per client (its address,
    ``Authorization`` and ``User-Agent``), so watches can never take every connection.

    Those three are the client's to choose (this server authenticates nobody), so the
    per-client cap alone cannot keep one party from every watch: two User-Agents were
    enough. When all ``total`` are open, a new watch is admitted by ending one watch of
    the client holding the most (its oldest), as long as that client holds more than the
    newcomer: shares converge to equal, whatever identities a party makes up. The ended
    watch closes cleanly and its client re-watches from the last resourceVersion it saw,
    missing nothing. Over ``per_client``, or with no larger holder, a watch is answered
    429 with ``Retry-After`` (upstream's priority-and-fairness answer), and client-go,
    kubectl and lightkube watchers retry.
    """

    def __init__(self, max_connections: int) -> None:
        reserve = max(1, min(64, max_connections // 8))
        self.total = max(1, max_connections - reserve)
        self.per_client = max(1, self.total // 2)
        self.active = 0
        self.refused = 0
        self.evicted = 0
        self._seq = 0
        self._by_client: dict[tuple[str, str, str], list[WatchTicket]] = {}

    @staticmethod
    def client(request: web.Request) -> tuple[str, str, str]:
        auth = request.headers.get("Authorization", "")
        digest = hashlib.sha256(auth.encode(errors="replace")).hexdigest()[:16] if auth else ""
        return str(request.remote or ""), digest, request.headers.get("User-Agent", "")[:64]

    def acquire(self, key: tuple[str, str, str]) -> WatchTicket | None:
        """A ticket for a new watch of ``key``, or None (answer 429)."""
        mine = len(self._by_client.get(key, ()))
        if mine >= self.per_client:
            self.refused += 1
            return None
        if self.active >= self.total:
            victim = self._victim(mine)
            if victim is None:
                self.refused += 1
                return None
            self.release(victim)
            victim.end()
            self.evicted += 1
        self._seq += 1
        ticket = WatchTicket(key, self._seq)
        self._by_client.setdefault(key, []).append(ticket)
        self.active += 1
        return ticket

    def _victim(self, mine: int) -> WatchTicket | None:
        """The oldest watch of the largest holder, if it holds more than ``mine``."""
        best: list[WatchTicket] | None = None
        for tickets in self._by_client.values():
            if len(tickets) <= mine:
                continue
            if best is None or (len(tickets), -tickets[0].seq) > (len(best), -best[0].seq):
                best = tickets
        return best[0] if best else None

    def release(self, ticket: WatchTicket) -> None:
        """The watch ended (or was ended); a second release is a no-op."""
        tickets = self._by_client.get(ticket.key)
        if tickets is None or ticket not in tickets:
            return
        tickets.remove(ticket)
        if not tickets:
            del self._by_client[ticket.key]
        self.active -= 1


def _too_many_watches() -> web.Response:
    body = _status.status(429, "Too many requests, please try again later.", "TooManyRequests")
    body.setdefault("details", {})["retryAfterSeconds"] = 1
    resp = _respond(body, 429)
    resp.headers["Retry-After"] = "1"
    return resp


class _SlowConsumer(Exception):
    """The watch client does not read: a write did not complete in time."""


#: A request body must arrive within this many seconds (a slow sender holds a connection).
BODY_READ_TIMEOUT_S = 60.0


#: How long a LIST at a future resourceVersion waits for it (kube-apiserver's blockTimeout).
FUTURE_RV_WAIT_S = 3.0


_U64_MAX = (1 << 64) - 1
_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
               "\t": "\\t", "\v": "\\v", '"': '\\"', "\\": "\\\\"}  # fmt: skip


def _go_quote(text: str) -> str:
    """Go's strconv.Quote (and %q): printable runes as they are, the rest escaped."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable() and not 0xD800 <= code <= 0xDFFF:
            out.append(ch)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _parse_rv(raw: str) -> int:
    """upstream's APIObjectVersioner.ParseResourceVersion: "" and "0" are 0, anything else
    must be strconv.ParseUint(raw, 10, 64) (ASCII digits only, no sign, space or '_', at
    most 2**64 - 1). Raises ValueError carrying upstream's error text."""
    if raw in ("", "0"):
        return 0
    if not raw.isascii() or not raw.isdigit():
        problem = "invalid syntax"
    elif int(raw) > _U64_MAX:
        problem = "value out of range"
    else:
        return int(raw)
    raise ValueError(
        f"resourceVersion: Invalid value: {_go_quote(raw)}: "
        f"strconv.ParseUint: parsing {_go_quote(raw)}: {problem}"
    )


def _too_large(message: str) -> APIError:
    return APIError(_status.status(413, message, "RequestEntityTooLarge"))


def _encode(obj: Any) -> bytes:
    return msgspec.json.encode(obj)


def _respond(
    obj: Any,
    code: int = 200,
    content_type: str = "application/json",
    warnings: list[str] | None = None,
) -> web.Response:
    resp = web.Response(body=_encode(obj), status=code, content_type=content_type)
    for w in warnings or []:
        resp.headers.add("Warning", f"299 - {json.dumps(w)}")
    return resp


def _not_found_path() -> APIError:
    return APIError(_status.status(404, "the server could not find the requested resource"))


def _method_not_allowed() -> APIError:
    return APIError(
        _status.status(405, "the server does not allow this method on the requested resource")
    )


def _as_version(rt: ResourceType, obj: JSON) -> JSON:
    """``obj`` as the version ``rt`` serves (stored once, converted on the way out)."""
    if obj.get("apiVersion") == rt.api_version:
        return obj
    return {**obj, "apiVersion": rt.api_version}


#: A watch ends after at most this long (upstream's ``--min-request-timeout`` is 1800 s;
#: a watch without ``timeoutSeconds`` gets a random length in [that, twice that), and a
#: client asking for longer gets the upper end); the client re-watches.
MIN_REQUEST_TIMEOUT_S = 1800
_INT64 = (-(2**63), 2**63 - 1)


def watch_timeout(raw: str | None) -> float:
    """Seconds a watch may run: ``timeoutSeconds`` parsed as upstream does (Go's
    ``strconv.ParseInt(s, 10, 64)``: an optional sign and ASCII digits, no spaces or
    underscores; anything else is 400), 0 or absent meaning the server's own bound. A
    negative value is accepted and ends the watch at once, as upstream's timer does."""
    if raw is None or raw == "":
        seconds = 0
    else:
        sign, body = (raw[0], raw[1:]) if raw[:1] in "+-" else ("", raw)
        digits = body.lstrip("0") or "0"
        text = sign + digits
        if not body.isascii() or not body.isdigit() or len(digits) > 19:
            raise _status.bad_request(
                f"timeoutSeconds: Invalid value: {raw[:32]!r}: must be an integer"
            )
        seconds = int(text)
        if not _INT64[0] <= seconds <= _INT64[1]:
            raise _status.bad_request(
                f"timeoutSeconds: Invalid value: {raw[:32]!r}: out of range for an int64"
            )
    if seconds == 0:
        return MIN_REQUEST_TIMEOUT_S * (1 + random.random())
    return float(min(max(seconds, 0), 2 * MIN_REQUEST_TIMEOUT_S))


def path_segments(raw_path: str) -> list[str]:
    """The decoded segments of a request path, as the real server accepts them.

    Read from the raw request target (never a normalised one, where ``a/../b`` already
    became ``b``). A trailing slash is ignored; an empty segment (``a//b``) is 404; a
    segment that is ``.`` or ``..`` or that holds ``/`` or ``%`` once decoded is 400
    (upstream's ``IsValidPathSegmentName``).
    """
    path = raw_path.split("?", 1)[0].split("#", 1)[0]
    inner = path.split("/")[1:]
    if inner and inner[-1] == "":
        inner.pop()
    parts = [unquote(p) for p in inner]
    for part in parts:
        if not part:
            raise _not_found_path()
        problem = None
        if part in (".", ".."):
            problem = f"may not be '{part}'"
        elif "/" in part or "%" in part:
            problem = f"may not contain '{'/' if '/' in part else '%'}'"
        if problem is not None:
            shown = part if len(part) <= 64 else part[:64] + "..."
            raise _status.bad_request(f"invalid path segment {shown!r}: {problem}")
    return parts


def _manager_from_agent(agent: str) -> str:
    return agent.split("/", 1)[0][:128] or "unknown"


def _truthy(value: str | None) -> bool:
    return value in ("true", "1", "True")


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as e:
        return _respond(e.body, e.code)
    except SelectorError as e:
        return _respond(_status.status(400, str(e)), 400)
    except web.HTTPException:
        raise
    except Exception as e:
        log.exception("internal error serving %s %s", request.method, request.path)
        return _respond(_status.status(500, f"internal error: {e}"), 500)


def _page(
    items: list[JSON], limit: str | None, token: str | None, rv: int, filtered: bool = False
) -> tuple[list[JSON], str, JSON]:
    """A LIST's page: ``limit`` items after the ``continue`` token's key, the list's
    resourceVersion (the token's, as a paginated list reads one snapshot) and the
    ``continue``/``remainingItemCount`` metadata of a page with more after it (no
    ``remainingItemCount`` for a list ``filtered`` by a selector: upstream's storage
    cannot count what a selector would keep, so it leaves the count out)."""
    list_rv = str(rv)
    if token:
        try:
            state = json.loads(base64.urlsafe_b64decode(token.encode() + b"=="))
            start, list_rv = str(state["start"]), str(int(state["rv"]))
        except (ValueError, KeyError, TypeError) as e:
            raise _status.bad_request(
                "continue key is not valid: incorrect encoded start resourceVersion "
                "(version meta.k8s.io/v1)"
            ) from e
        items = [o for o in items if _list_key(o) >= start]
    try:
        n = int(limit) if limit else 0
    except ValueError:
        n = 0
    if n <= 0 or len(items) <= n:
        return items, list_rv, {}
    page, rest = items[:n], items[n:]
    state = {"v": "meta.k8s.io/v1", "rv": int(list_rv), "start": _list_key(page[-1]) + "\u0000"}
    cont = base64.urlsafe_b64encode(json.dumps(state, separators=(",", ":")).encode())
    more: JSON = {"continue": cont.decode().rstrip("=")}
    if not filtered:
        more["remainingItemCount"] = len(rest)
    return page, list_rv, more


def _list_key(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


class APIServer:
    """An embedded Kubernetes API server on 127.0.0.1 (see the package docstring).

    ``profile`` is the Kubernetes release (and feature gates) it serves; None serves the
    newest release with its default gates.
    """

    def __init__(
        self,
        data_file: str | Path | None = None,
        watch_window: int = 1000,
        bookmark_interval: float = 1.0,
        *,
        limits: HTTPLimits | None = None,
        allowed_hosts: tuple[str, ...] = (),
        profile: KubeProfile | None = None,
    ) -> None:
        self.http_limits = limits or HTTPLimits(max_connections=512)
        self.allowed_hosts = allowed_hosts
        self.profile = profile or kube_profile(NEWEST_KUBE_VERSION)
        self.store = Store(watch_window)
        self.engine = Engine(self.store, self.profile)
        self.registry = self.engine.registry
        #: The OpenAPI documents of what the registry serves, built on first use.
        self.openapi = Documents(self.registry)
        self.bookmark_interval = bookmark_interval
        self._data_file = Path(data_file) if data_file is not None else None
        self._runner: web.AppRunner | None = None
        self._host = "127.0.0.1"
        self._port: int | None = None
        self._journal: Journal | None = None
        #: Caps on open watches (sized from the connection cap when the server starts).
        self.watch_slots = WatchSlots(self.http_limits.max_connections)
        #: Log size that triggers a snapshot, and the retry interval after a failure.
        self.persist_compact_bytes = COMPACT_BYTES
        self.persist_retry_interval = RETRY_INTERVAL_S

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the API server is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._load()
        limits = self.http_limits
        if limits.overflow_connections < HEALTH_OVERFLOW_CONNECTIONS:
            limits = dataclasses.replace(limits, overflow_connections=HEALTH_OVERFLOW_CONNECTIONS)
        guard = HTTPGuard(
            host, limits=limits, allowed_hosts=self.allowed_hosts, always_paths=HEALTH_PATHS
        )
        self.watch_slots = WatchSlots(guard.max_connections)
        app = web.Application(
            middlewares=[*guard.middlewares, _errors], client_max_size=8 * 1024 * 1024
        )
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        runner = web.AppRunner(
            app,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=2.0,
            **guard.runner_kwargs,
        )
        await runner.setup()
        site = guard.site(runner, host, port)
        await site.start()
        self._runner = runner
        self._host = host
        addr = runner.addresses[0]
        self._port = int(addr[1])
        log.info("API server listening on %s (%s)", self.url, self.profile.describe())

    async def stop(self) -> None:
        """Close open watches, stop serving, make the data file complete.

        Raises PersistError (a DataFileError) when persistence is failing at the end.
        """
        self.store.close_watchers()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        journal, self._journal = self._journal, None
        if journal is not None:
            await journal.close()

    def compact(self) -> None:
        """Test hook: forget buffered watch events so older resourceVersions get 410."""
        self.store.compact()

    def write_kubeconfig(self, path: str | Path) -> Path:
        """Write a kubeconfig pointing at this server (user token ``drahealth``)."""
        path = Path(path)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "drahealth", "cluster": {"server": self.url}}],
            "users": [{"name": "drahealth", "user": {"token": "drahealth"}}],
            "contexts": [
                {
                    "name": "drahealth",
                    "context": {
                        "cluster": "drahealth",
                        "user": "drahealth",
                        "namespace": "default",
                    },
                }
            ],
            "current-context": "drahealth",
            "preferences": {},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    # ------------------------------------------------------------------ persistence

    def _load(self) -> None:
        journal = None
        if self._data_file is not None:
            journal = Journal(
                self.store,
                self._data_file,
                compact_bytes=self.persist_compact_bytes,
                retry_interval=self.persist_retry_interval,
            )
            if journal.load():
                journal.start()
                self._journal = journal
                return
        opts = WriteOptions(manager="drahealth-apiserver")
        for ns in BOOTSTRAP_NAMESPACES:
            if self.store.get(NAMESPACES.key, "", ns) is None:
                self.engine.create(NAMESPACES, None, {"metadata": {"name": ns}}, opts)
        if journal is not None:
            journal.start()
            self._journal = journal

    async def _durable(self) -> None:
        """Wait until every write this answer may reflect is durable (500 if it cannot be)."""
        target = self.store.pending_rv()
        if target is None or self._journal is None:
            return
        try:
            await self._journal.wait(target)
        except PersistError as e:
            raise APIError(_status.status(500, str(e))) from e

    def _readiness(self) -> web.Response:
        journal = self._journal
        if journal is not None and not journal.healthy:
            text = f"[-]persistence failed: {journal.problem}\nreadyz check failed\n"
            return web.Response(status=500, text=text)
        return web.Response(text="ok")

    def _metrics(self) -> web.Response:
        values = self._journal.metrics() if self._journal is not None else {}
        lines = []
        if not values:
            values = {"drahealth_apiserver_persist_healthy": ("gauge", "persistence works", 1.0)}
        for name, (kind, text, value) in values.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value:g}"]
        return web.Response(
            text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8"
        )

    async def _reached(self, requested: int) -> bool:
        """Wait up to 3 s (kube-apiserver's watch cache does) for the store to reach
        ``requested``; False if it did not."""
        deadline = time.monotonic() + FUTURE_RV_WAIT_S
        while requested > self.store.rv:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def _too_large_rv(self, requested: int) -> JSON:
        """kube-apiserver's Status for a resourceVersion the server has not reached."""
        body = _status.status(
            504,
            f"Timeout: Too large resource version: {requested}, current: {self.store.committed_rv}",
            "Timeout",
            causes=[{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        )
        body.setdefault("details", {})["retryAfterSeconds"] = 1
        return body

    async def _refuse_future_rv(self, raw: str | None) -> None:
        """A LIST at a resourceVersion newer than ours: 504 with Retry-After: 1 unless the
        store reaches it within 3 s."""
        try:
            requested = _parse_rv(raw or "")
        except ValueError as e:  # storage.ValidateListOptions
            raise APIError(_status.status(400, f"invalid resource version: {e}")) from e
        if not await self._reached(requested):
            raise web.HTTPGatewayTimeout(
                text=_encode(self._too_large_rv(requested)).decode(),
                content_type="application/json",
                headers={"Retry-After": "1"},
            )

    # ------------------------------------------------------------------ routing

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = path_segments(request.raw_path)
        if not parts:
            return _respond(
                {
                    "paths": [
                        "/api",
                        "/api/v1",
                        "/apis",
                        "/healthz",
                        "/livez",
                        "/metrics",
                        "/readyz",
                        "/version",
                    ]
                }
            )
        head = parts[0]
        if head == "readyz" and request.method == "GET":
            return self._readiness()
        if head in ("healthz", "livez") and request.method == "GET":
            return web.Response(text="ok")
        if head == "metrics" and len(parts) == 1 and request.method == "GET":
            return self._metrics()
        if head == "version" and len(parts) == 1:
            return _respond(version_info(self.profile))
        if head == "openapi" and parts[1:] == ["v2"] and request.method == "GET":
            return self._openapi_v2(request)
        if head == "openapi" and len(parts) >= 2 and parts[1] == "v3":
            return self._openapi(parts[2:])
        if head == "api":
            if len(parts) == 1:
                return self._discovery(request, legacy=True)
            if len(parts) == 2:
                return self._resource_list("", parts[1])
            resp = await self._resource(request, "", parts[1], parts[2:])
            if not resp.prepared:  # a watch streams by itself; anything else waits here
                await self._durable()
            return resp
        if head == "apis":
            if len(parts) == 1:
                return self._discovery(request, legacy=False)
            if len(parts) == 2:
                body = self.registry.api_group(parts[1])
                if body is None:
                    raise _not_found_path()
                return _respond(body)
            if len(parts) == 3:
                return self._resource_list(parts[1], parts[2])
            resp = await self._resource(request, parts[1], parts[2], parts[3:])
            if not resp.prepared:
                await self._durable()
            return resp
        raise _not_found_path()

    def _discovery(self, request: web.Request, legacy: bool) -> web.Response:
        accept = request.headers.get("Accept", "")
        for option in accept.split(","):
            params = {p.strip() for p in option.split(";")}
            if {"g=apidiscovery.k8s.io", "v=v2", "as=APIGroupDiscoveryList"} <= params:
                body = self.registry.aggregated_discovery(legacy, "apidiscovery.k8s.io/v2")
                return _respond(body, content_type=AGGREGATED_V2)
            if option.strip().split(";")[0] in ("application/json", "*/*", ""):
                break
        if legacy:
            return _respond(_resources.api_versions(f"{self._host}:{self._port}"))
        return _respond(self.registry.api_group_list())

    def _openapi_v2(self, request: web.Request) -> web.Response:
        """The swagger 2.0 document: gnostic protobuf when asked for (client-go), else JSON."""
        docs = self.openapi
        if "com.github.proto-openapi.spec.v2" in request.headers.get("Accept", ""):
            resp = web.Response(body=docs.v2_protobuf())
            resp.headers["Content-Type"] = V2_PROTOBUF
            return resp
        return _respond(docs.v2())

    def _openapi(self, rest: list[str]) -> web.Response:
        if not rest:
            return _respond(self.openapi.v3_root())
        doc = None
        if rest[0] == "api" and len(rest) == 2:
            doc = self.openapi.v3("", rest[1])
        elif rest[0] == "apis" and len(rest) == 3:
            doc = self.openapi.v3(rest[1], rest[2])
        if doc is None:
            raise _not_found_path()
        return _respond(doc)

    def _resource_list(self, group: str, version: str) -> web.Response:
        body = self.registry.resource_list(group, version)
        if body is None:
            raise _not_found_path()
        return _respond(body)

    def _route(
        self, group: str, version: str, rest: list[str]
    ) -> tuple[ResourceType, str | None, str | None, str | None]:
        if len(rest) >= 3 and rest[0] == "namespaces":
            rt = self.registry.lookup(group, version, rest[2])
            if rt is not None and rt.namespaced:
                if len(rest) > 5:
                    raise _not_found_path()
                name = rest[3] if len(rest) > 3 else None
                sub = rest[4] if len(rest) > 4 else None
                if sub is not None and sub not in rt.subresources:
                    raise _not_found_path()
                return rt, rest[1], name, sub
        rt = self.registry.lookup(group, version, rest[0])
        if rt is None or len(rest) > 3:
            raise _not_found_path()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None and sub not in rt.subresources:
            raise _not_found_path()
        if rt.namespaced and name is not None:
            raise _not_found_path()
        return rt, None, name, sub

    # ------------------------------------------------------------------ requests

    @staticmethod
    async def _body(request: web.Request, *, allow_empty: bool = False) -> Any:
        """Read and decode the body: bounded size, accepted media types, plain JSON out.

        Decoding failures are 400, a body the media type cannot carry 415, a body over
        the request limit 413 (see ``_decode``); never a 500.
        """
        limit = _decode.MAX_BODY_BYTES
        if request.content_length is not None and request.content_length > limit:
            raise _too_large(str(_decode.body_too_large()))
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(BODY_READ_TIMEOUT_S):
                while chunk := await request.content.read(64 * 1024):
                    size += len(chunk)
                    if size > limit:
                        raise _too_large(str(_decode.body_too_large()))
                    chunks.append(chunk)
        except TimeoutError as e:
            raise APIError(
                _status.status(
                    408,
                    f"the request body was not received within {BODY_READ_TIMEOUT_S:g}s",
                    "Timeout",
                )
            ) from e
        raw = b"".join(chunks)
        if not raw.strip():
            if allow_empty:
                return None
            raise _status.bad_request("the body of the request was empty")
        APIServer._require_body_type(request)
        ctype = request.content_type if "Content-Type" in request.headers else "application/json"
        try:
            if ctype == PROTOBUF:
                return _protobuf.decode(raw)
            if ctype == "application/yaml" or ctype == APPLY:
                return _decode.decode_yaml(raw)
            return _decode.decode_json(raw)
        except UnsupportedKind as e:
            raise APIError(_status.status(415, str(e))) from e
        except ProtobufError as e:
            raise _status.bad_request(f"couldn't decode the protobuf body: {e}") from e
        except _decode.TooLarge as e:
            raise _too_large(str(e)) from e
        except _decode.DecodeError as e:
            kind = "yaml" if ctype in ("application/yaml", APPLY) else "json"
            raise _status.bad_request(f"couldn't get version/kind; {kind} parse error: {e}") from e

    @staticmethod
    def _options(request: web.Request) -> WriteOptions:
        q = request.query
        validation = q.get("fieldValidation", "Warn")  # the real server's default
        if validation not in ("Ignore", "Warn", "Strict"):
            raise _status.bad_request(
                f"fieldValidation must be one of Ignore, Warn or Strict, not {validation[:64]!r}"
            )
        manager = q.get("fieldManager")
        if manager is not None and len(manager.encode()) > 128:
            raise APIError(
                _status.status(
                    422,
                    "fieldManager: Too long: may not be more than 128 bytes",
                    causes=[
                        _status.cause(
                            "FieldValueTooLong", "may not be more than 128 bytes", "fieldManager"
                        )
                    ],
                )
            )
        return WriteOptions(
            manager=manager or _manager_from_agent(request.headers.get("User-Agent", "")),
            dry_run="All" in q.getall("dryRun", []),
            field_validation=validation,
            force=_truthy(q.get("force")),
        )

    @staticmethod
    def _selectors(request: web.Request, rt: ResourceType) -> tuple[LabelSelector, FieldSelector]:
        q = request.query
        labels = parse_label_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), rt.supported_fields())
        return labels, fields

    def _list_body(self, rt: ResourceType, items: list[JSON]) -> JSON:
        # upstream encodes a built-in kind's list items without apiVersion and kind (the
        # list's own say what they are)
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(self.store.rv)},
            "items": [
                {k: v for k, v in o.items() if k not in ("apiVersion", "kind")} for o in items
            ],
        }

    async def _resource(
        self, request: web.Request, group: str, version: str, rest: list[str]
    ) -> web.StreamResponse:
        rt, ns, name, sub = self._route(group, version, rest)
        method = request.method
        opts = self._options(request)
        q = request.query
        as_table = wants_table(request.headers.get("Accept", ""))
        include = q.get("includeObject", "Metadata")
        if "get" not in rt.verbs:  # SelfSubjectAccessReview: create only, never stored
            if method != "POST" or name is not None:
                raise _method_not_allowed()
            self._require_body_type(request)
            body = await self._body(request)
            if not isinstance(body, dict):
                raise _status.bad_request("the request body must be a JSON object")
            return _respond(self.engine.access_review(rt, body, opts), 201)
        if sub == "log":  # proxied to the kubelet of the pod's node
            if method != "GET" or ns is None or name is None:
                raise _method_not_allowed()
            pod = self.engine.get(rt, ns, name)
            node_name = (pod.get("spec") or {}).get("nodeName")
            nodes = self.registry.lookup("", "v1", "nodes")
            node = None
            if node_name and nodes is not None:
                with contextlib.suppress(APIError):
                    node = self.engine.get(nodes, None, str(node_name))
            return await pod_log(request, pod, node, request.query)
        if sub == "eviction":
            if method != "POST" or ns is None or name is None:
                raise _method_not_allowed()
            self.engine.evict(ns, name, await self._body(request), opts)
            return _respond(_status.status(201, ""), 201)
        if sub == "scale":
            return await self._scale(request, rt, ns, name, opts)
        if method == "GET":
            if name is None:
                labels, fields = self._selectors(request, rt)
                if _truthy(q.get("watch")):
                    ticket = self.watch_slots.acquire(WatchSlots.client(request))
                    if ticket is None:
                        return _too_many_watches()
                    try:
                        return await self._watch(request, rt, ns, labels, fields, ticket)
                    finally:
                        self.watch_slots.release(ticket)
                await self._refuse_future_rv(q.get("resourceVersion"))
                items = self.engine.select(rt, ns, labels, fields)
                filtered = bool(labels.requirements or fields.requirements)
                items, rv, more = _page(
                    items, q.get("limit"), q.get("continue"), self.store.rv, filtered
                )
                if as_table:
                    body = table(rt, items, rv, include, minor=self.profile.minor)
                else:
                    body = self._list_body(rt, items)
                    body["metadata"]["resourceVersion"] = rv
                body["metadata"].update(more)
                return _respond(body)
            obj = _as_version(rt, self.engine.get(rt, ns, name))
            if as_table:
                return _respond(table(rt, [obj], None, include, minor=self.profile.minor))
            return _respond(obj)
        if method == "POST":
            if name is not None or (rt.namespaced and ns is None):
                raise _method_not_allowed()
            self._require_body_type(request)
            body = await self._body(request)
            if not isinstance(body, dict):
                raise _status.bad_request("the request body must be a JSON object")
            obj = self.engine.create(rt, ns, body, opts)
            return _respond(_as_version(rt, obj), 201, warnings=opts.warnings)
        if method == "PUT":
            if name is None:
                raise _method_not_allowed()
            self._require_body_type(request)
            body = await self._body(request)
            if not isinstance(body, dict):
                raise _status.bad_request("the request body must be a JSON object")
            obj = self.engine.update(rt, ns, name, body, sub, opts)
            return _respond(_as_version(rt, obj), warnings=opts.warnings)
        if method == "PATCH":
            if name is None:
                raise _method_not_allowed()
            ptype = request.content_type
            if ptype not in PATCH_TYPES:
                raise APIError(
                    _status.status(
                        415,
                        f"the body of the request was in an unknown format - accepted media "
                        f"types include: {', '.join(PATCH_TYPES)}",
                    )
                )
            if ptype == APPLY:
                opts.manager = q.get("fieldManager", "")
            body = await self._body(request)
            obj, created = self.engine.patch(rt, ns, name, ptype, body, sub, opts)
            return _respond(_as_version(rt, obj), 201 if created else 200, warnings=opts.warnings)
        if method == "DELETE":
            if sub is not None:
                raise _method_not_allowed()
            options = await self._body(request, allow_empty=True) or {}
            if not isinstance(options, dict):
                raise _status.bad_request("DeleteOptions must be a JSON object")
            if "All" in (options.get("dryRun") or []):
                opts.dry_run = True
            if name is None:
                labels, fields = self._selectors(request, rt)
                items = self.engine.delete_collection(rt, ns, labels, fields, opts)
                return _respond(self._list_body(rt, items))
            gone = self.engine.delete(rt, ns, name, options, opts)
            meta = gone.get("metadata") or {}
            pending = bool(meta.get("deletionTimestamp")) and (
                self.engine.store.get(rt.key, ns or "", name) is not None
            )
            if pending or (rt.group, rt.kind) in RETURNS_DELETED:
                return _respond(_as_version(rt, gone))
            body = _status.status(200, "", name=name, group=rt.group, kind=rt.plural)
            body["details"]["uid"] = meta.get("uid")
            return _respond(body)
        raise _method_not_allowed()

    async def _scale(
        self,
        request: web.Request,
        rt: ResourceType,
        ns: str | None,
        name: str | None,
        opts: WriteOptions,
    ) -> web.Response:
        """The ``scale`` subresource: an ``autoscaling/v1`` Scale (get, update, patch)."""
        if name is None:
            raise _method_not_allowed()
        if request.method == "GET":
            return _respond(self.engine.scale(rt, ns, name))
        if request.method == "PUT":
            self._require_body_type(request)
            body = await self._body(request)
            return _respond(self.engine.update_scale(rt, ns, name, body, opts))
        if request.method == "PATCH":
            ptype = request.content_type
            if ptype not in PATCH_TYPES or ptype == APPLY:
                raise APIError(
                    _status.status(
                        415,
                        f"the body of the request was in an unknown format - accepted media "
                        f"types include: {', '.join(p for p in PATCH_TYPES if p != APPLY)}",
                    )
                )
            body = await self._body(request)
            return _respond(self.engine.patch_scale(rt, ns, name, ptype, body, opts))
        raise _method_not_allowed()

    @staticmethod
    def _require_body_type(request: web.Request) -> None:
        """415 unless the body's media type is one the real server accepts for the method."""
        accepted = PATCH_TYPES if request.method == "PATCH" else _BODY_TYPES
        if "Content-Type" not in request.headers:
            # The real server reads such a body as JSON, and kubectl relies on it
            # (``create --raw -f`` sends none). A browser page can send a body without a
            # Content-Type cross-origin with no preflight, but only with the browser's own
            # User-Agent (``Mozilla/...``) and without an Authorization header it set.
            agent = request.headers.get("User-Agent", "")
            browser = agent.startswith("Mozilla/") or not agent
            if request.method != "PATCH" and ("Authorization" in request.headers or not browser):
                return
            raise APIError(
                _status.status(
                    415,
                    "the body of the request has no Content-Type - accepted media types "
                    f"include: {', '.join(accepted)}",
                )
            )
        if request.content_type not in accepted:
            raise APIError(
                _status.status(
                    415,
                    f"the body of the request was in an unknown format "
                    f"({request.content_type}) - accepted media types include: "
                    f"{', '.join(accepted)}",
                )
            )

    # ------------------------------------------------------------------ watch

    async def _watch(
        self,
        request: web.Request,
        rt: ResourceType,
        ns: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        ticket: WatchTicket | None = None,
    ) -> web.StreamResponse:
        q = request.query
        rv = q.get("resourceVersion", "")
        send_initial = _truthy(q.get("sendInitialEvents"))
        try:
            parsed = _parse_rv(rv)
        except ValueError as e:
            # The cacher's Watch returns the storage error unconverted, so the handler
            # answers it as an unknown error: 500 and no reason.
            body = _status.status(500, str(e))
            del body["reason"]
            raise APIError(body) from e
        since = parsed if parsed and not send_initial else None
        timeout = watch_timeout(q.get("timeoutSeconds"))
        bookmarks = _truthy(q.get("allowWatchBookmarks"))
        as_table = wants_table(request.headers.get("Accept", ""))
        include = q.get("includeObject", "Metadata")

        def match(obj: JSON) -> bool:
            meta = obj.get("metadata") or {}
            return labels.matches(meta.get("labels")) and fields.matches(obj)

        # A resourceVersion newer than ours is no error for a watch (kube-apiserver's
        # neither): the stream stays silent until the store passes it.
        resp = web.StreamResponse(status=200)
        resp.content_type = "application/json"
        resp.enable_chunked_encoding()
        future = parsed if send_initial else 0
        if future and not await self._reached(future):  # a watch-list from the future
            await resp.prepare(request)
            await resp.write(
                _encode({"type": "ERROR", "object": self._too_large_rv(future)}) + b"\n"
            )
            await resp.write_eof()
            return resp
        try:
            watcher, initial = self.store.watch(rt.key, ns, match, since)
        except TooOld as e:
            await resp.prepare(request)
            await resp.write(
                _encode({"type": "ERROR", "object": _status.status(410, str(e), "Expired")}) + b"\n"
            )
            await resp.write_eof()
            return resp
        if ticket is not None:  # ended early for a fair share: queued events go out first
            ticket.stop = functools.partial(watcher.close, drop_queued=False)
            if ticket.evicted:
                ticket.stop()

        async def send(kind: str, obj: JSON) -> None:
            if kind != "BOOKMARK":
                obj = _as_version(rt, obj)
            payload = obj
            if as_table and kind != "BOOKMARK":
                payload = table(rt, [obj], None, include, minor=self.profile.minor)
            try:
                # A client that stops reading leaves the write waiting for the transport
                # to drain; bound that wait so it cannot pin the stream (and its buffer).
                async with asyncio.timeout(WATCH_WRITE_TIMEOUT_S):
                    await resp.write(_encode({"type": kind, "object": payload}) + b"\n")
            except TimeoutError as e:
                raise _SlowConsumer from e

        def bookmark(end_of_initial: bool = False) -> JSON:
            meta: JSON = {"resourceVersion": str(self.store.committed_rv)}
            if end_of_initial:
                meta["annotations"] = {"k8s.io/initial-events-end": "true"}
            return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

        deadline = time.monotonic() + timeout
        try:
            await resp.prepare(request)
            for kind, obj in initial:
                await send(kind, obj)
            if send_initial and bookmarks:
                await send("BOOKMARK", bookmark(end_of_initial=True))
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait = min(self.bookmark_interval, left) if bookmarks else left
                try:
                    async with asyncio.timeout(wait):
                        item = await watcher.take()
                except TimeoutError:
                    if (
                        bookmarks
                        and watcher.queue.empty()
                        and self.store.committed_rv >= (since or 0)
                    ):
                        await send("BOOKMARK", bookmark())
                    continue
                if item is None:
                    break
                await send(*item)
        except ConnectionError:
            return resp
        except _SlowConsumer:
            log.info("closing a watch on %s: the client stopped reading", rt.plural)
            self.store.close_slow(watcher)
            if request.transport is not None:
                request.transport.abort()
            return resp
        finally:
            self.store.unwatch(watcher)
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp


__all__ = ["APIServer"]
