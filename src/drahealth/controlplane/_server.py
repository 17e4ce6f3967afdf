"""The HTTP face of the embedded API server (aiohttp) and its lifecycle.

Owns URL routing (``/api``, ``/apis``, discovery, ``/version``, health endpoints),
query-parameter parsing, content negotiation (JSON always; ``Table`` when kubectl
asks for it; aggregated discovery v2 when asked), the watch stream (chunked,
newline-delimited JSON, bookmarks, ``timeoutSeconds``, 410 as an ``ERROR`` event),
the data file (load on start, debounced atomic save after writes, save on stop) and
the kubeconfig written for clients. Object semantics live in ``_engine``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import yaml
from aiohttp import web

from . import _persist, _protobuf, _resources, _status
from ._engine import APPLY, NAMESPACES, PATCH_TYPES, Engine, WriteOptions
from ._protobuf import ProtobufError
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

log = logging.getLogger(__name__)

JSON = dict[str, Any]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

BOOTSTRAP_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
VERSION_INFO: JSON = {
    "major": "1",
    "minor": "37",
    "emulationMajor": "1",
    "emulationMinor": "37",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "36",
    "gitVersion": "v1.37.0-drahealth",
    "gitCommit": "",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "python",
    "compiler": "drahealth",
    "platform": "linux/amd64",
}
SAVE_DELAY_S = 0.5
PROTOBUF = "application/vnd.kubernetes.protobuf"
_BODY_TYPES = (
    "",
    "application/json",
    "application/yaml",
    "text/plain",
    "application/octet-stream",
    PROTOBUF,
)


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


class APIServer:
    """An embedded Kubernetes API server on 127.0.0.1 (see the package docstring)."""

    def __init__(
        self,
        data_file: str | Path | None = None,
        watch_window: int = 1000,
        bookmark_interval: float = 1.0,
    ) -> None:
        self.store = Store(watch_window)
        self.engine = Engine(self.store)
        self.bookmark_interval = bookmark_interval
        self._data_file = Path(data_file) if data_file is not None else None
        self._runner: web.AppRunner | None = None
        self._host = "127.0.0.1"
        self._port: int | None = None
        self._save_handle: asyncio.TimerHandle | None = None

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
        app = web.Application(middlewares=[_errors], client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=2.0
        )
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runner = runner
        self._host = host
        addr = runner.addresses[0]
        self._port = int(addr[1])
        if self._data_file is not None:
            self.store.on_write = self._schedule_save
        log.info("API server listening on %s", self.url)

    async def stop(self) -> None:
        """Close open watches, stop serving and write the data file if configured."""
        self.store.close_watchers()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._save_handle is not None:
            self._save_handle.cancel()
            self._save_handle = None
        self.save()

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
        loaded = _persist.load(self._data_file) if self._data_file is not None else None
        if loaded is not None:
            rv, objects = loaded
            self.store.restore(rv, objects)
            return
        opts = WriteOptions(manager="drahealth-apiserver")
        for ns in BOOTSTRAP_NAMESPACES:
            if self.store.get(NAMESPACES.key, "", ns) is None:
                self.engine.create(NAMESPACES, None, {"metadata": {"name": ns}}, opts)

    def _schedule_save(self) -> None:
        if self._save_handle is None:
            loop = asyncio.get_running_loop()
            self._save_handle = loop.call_later(SAVE_DELAY_S, self._save_now)

    def _save_now(self) -> None:
        self._save_handle = None
        try:
            self.save()
        except OSError:
            log.exception("could not write the data file %s", self._data_file)

    def save(self) -> None:
        """Write the data file now (no-op without one)."""
        if self._data_file is not None:
            snap = self.store.snapshot()
            _persist.save(self._data_file, snap["resourceVersion"], snap["objects"])

    # ------------------------------------------------------------------ routing

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if not parts:
            return _respond(
                {"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"]}
            )
        head = parts[0]
        if head in ("healthz", "readyz", "livez") and request.method == "GET":
            return web.Response(text="ok")
        if head == "version" and len(parts) == 1:
            return _respond(VERSION_INFO)
        if head == "openapi" and len(parts) >= 2 and parts[1] == "v3":
            return self._openapi(parts[2:])
        if head == "api":
            if len(parts) == 1:
                return self._discovery(request, legacy=True)
            if len(parts) == 2:
                return self._resource_list("", parts[1])
            return await self._resource(request, "", parts[1], parts[2:])
        if head == "apis":
            if len(parts) == 1:
                return self._discovery(request, legacy=False)
            if len(parts) == 2:
                body = _resources.api_group(parts[1])
                if body is None:
                    raise _not_found_path()
                return _respond(body)
            if len(parts) == 3:
                return self._resource_list(parts[1], parts[2])
            return await self._resource(request, parts[1], parts[2], parts[3:])
        raise _not_found_path()

    def _discovery(self, request: web.Request, legacy: bool) -> web.Response:
        accept = request.headers.get("Accept", "")
        for option in accept.split(","):
            params = {p.strip() for p in option.split(";")}
            if {"g=apidiscovery.k8s.io", "v=v2", "as=APIGroupDiscoveryList"} <= params:
                body = _resources.aggregated_discovery(legacy, "apidiscovery.k8s.io/v2")
                return _respond(body, content_type=AGGREGATED_V2)
            if option.strip().split(";")[0] in ("application/json", "*/*", ""):
                break
        if legacy:
            return _respond(_resources.api_versions(f"{self._host}:{self._port}"))
        return _respond(_resources.api_group_list())

    @staticmethod
    def _openapi(rest: list[str]) -> web.Response:
        if not rest:
            return _respond(_resources.openapi_root())
        doc = None
        if rest[0] == "api" and len(rest) == 2:
            doc = _resources.openapi_group_version("", rest[1])
        elif rest[0] == "apis" and len(rest) == 3:
            doc = _resources.openapi_group_version(rest[1], rest[2])
        if doc is None:
            raise _not_found_path()
        return _respond(doc)

    def _resource_list(self, group: str, version: str) -> web.Response:
        body = _resources.resource_list(group, version)
        if body is None:
            raise _not_found_path()
        return _respond(body)

    @staticmethod
    def _route(
        group: str, version: str, rest: list[str]
    ) -> tuple[ResourceType, str | None, str | None, str | None]:
        if len(rest) >= 3 and rest[0] == "namespaces":
            rt = _resources.lookup(group, version, rest[2])
            if rt is not None and rt.namespaced:
                if len(rest) > 5:
                    raise _not_found_path()
                name = rest[3] if len(rest) > 3 else None
                sub = rest[4] if len(rest) > 4 else None
                if sub is not None and sub not in rt.subresources:
                    raise _not_found_path()
                return rt, rest[1], name, sub
        rt = _resources.lookup(group, version, rest[0])
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
        raw = await request.read()
        ctype = request.content_type
        if not raw.strip():
            if allow_empty:
                return None
            raise _status.bad_request("the body of the request was empty")
        if ctype == PROTOBUF:
            try:
                return _protobuf.decode(raw)
            except ProtobufError as e:
                raise APIError(_status.status(415, str(e))) from e
        try:
            if ctype == "application/yaml" or ctype == APPLY:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as e:
            raise _status.bad_request(f"couldn't get version/kind; json parse error: {e}") from e

    @staticmethod
    def _options(request: web.Request) -> WriteOptions:
        q = request.query
        validation = q.get("fieldValidation", "Strict")
        if validation not in ("Ignore", "Warn", "Strict"):
            raise _status.bad_request(
                f"fieldValidation must be one of Ignore, Warn or Strict, not {validation!r}"
            )
        return WriteOptions(
            manager=q.get("fieldManager")
            or _manager_from_agent(request.headers.get("User-Agent", "")),
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
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(self.store.rv)},
            "items": items,
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
        if sub == "eviction":
            if method != "POST" or ns is None or name is None:
                raise _method_not_allowed()
            self.engine.evict(ns, name, await self._body(request), opts)
            return _respond(_status.status(201, ""), 201)
        if method == "GET":
            if name is None:
                labels, fields = self._selectors(request, rt)
                if _truthy(q.get("watch")):
                    return await self._watch(request, rt, ns, labels, fields)
                items = self.engine.select(rt, ns, labels, fields)
                if as_table:
                    return _respond(table(rt, items, str(self.store.rv), include))
                return _respond(self._list_body(rt, items))
            obj = self.engine.get(rt, ns, name)
            return _respond(table(rt, [obj], None, include) if as_table else obj)
        if method == "POST":
            if name is not None or (rt.namespaced and ns is None):
                raise _method_not_allowed()
            self._require_body_type(request)
            body = await self._body(request)
            if not isinstance(body, dict):
                raise _status.bad_request("the request body must be a JSON object")
            obj = self.engine.create(rt, ns, body, opts)
            return _respond(obj, 201, warnings=opts.warnings)
        if method == "PUT":
            if name is None:
                raise _method_not_allowed()
            self._require_body_type(request)
            body = await self._body(request)
            if not isinstance(body, dict):
                raise _status.bad_request("the request body must be a JSON object")
            obj = self.engine.update(rt, ns, name, body, sub, opts)
            return _respond(obj, warnings=opts.warnings)
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
            return _respond(obj, 201 if created else 200, warnings=opts.warnings)
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
            return _respond(self.engine.delete(rt, ns, name, options, opts))
        raise _method_not_allowed()

    @staticmethod
    def _require_body_type(request: web.Request) -> None:
        if request.content_type not in _BODY_TYPES:
            raise APIError(
                _status.status(
                    415,
                    "the body of the request was in an unknown format - accepted media types "
                    "include: application/json, application/yaml",
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
    ) -> web.StreamResponse:
        q = request.query
        rv = q.get("resourceVersion", "")
        send_initial = _truthy(q.get("sendInitialEvents"))
        since: int | None = None
        if rv not in ("", "0") and not send_initial:
            try:
                since = int(rv)
            except ValueError as e:
                raise APIError(
                    _status.status(
                        400, f"resourceVersion: Invalid value: {rv!r}: must be an integer"
                    )
                ) from e
        try:
            timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        except ValueError as e:
            raise _status.bad_request("timeoutSeconds must be a number") from e
        bookmarks = _truthy(q.get("allowWatchBookmarks"))
        as_table = wants_table(request.headers.get("Accept", ""))
        include = q.get("includeObject", "Metadata")

        def match(obj: JSON) -> bool:
            meta = obj.get("metadata") or {}
            return labels.matches(meta.get("labels")) and fields.matches(obj)

        resp = web.StreamResponse(status=200)
        resp.content_type = "application/json"
        resp.enable_chunked_encoding()
        try:
            watcher, initial = self.store.watch(rt.key, ns, match, since)
        except TooOld as e:
            await resp.prepare(request)
            await resp.write(
                _encode({"type": "ERROR", "object": _status.status(410, str(e), "Expired")}) + b"\n"
            )
            await resp.write_eof()
            return resp

        async def send(kind: str, obj: JSON) -> None:
            payload = table(rt, [obj], None, include) if as_table and kind != "BOOKMARK" else obj
            await resp.write(_encode({"type": kind, "object": payload}) + b"\n")

        def bookmark(end_of_initial: bool = False) -> JSON:
            meta: JSON = {"resourceVersion": str(self.store.rv)}
            if end_of_initial:
                meta["annotations"] = {"k8s.io/initial-events-end": "true"}
            return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

        deadline = time.monotonic() + timeout if timeout is not None else None
        try:
            await resp.prepare(request)
            for kind, obj in initial:
                await send(kind, obj)
            if send_initial and bookmarks:
                await send("BOOKMARK", bookmark(end_of_initial=True))
            while True:
                wait: float | None = self.bookmark_interval if bookmarks else None
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    wait = left if wait is None else min(wait, left)
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and watcher.queue.empty():
                        await send("BOOKMARK", bookmark())
                    continue
                if item is None:
                    break
                await send(*item)
        except ConnectionError:
            return resp
        finally:
            self.store.unwatch(watcher)
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp


async def serve_forever(
    port: int = 0,
    kubeconfig_out: Path | None = None,
    data: Path | None = None,
    host: str = "127.0.0.1",
) -> None:
    """Run an API server until SIGINT/SIGTERM; prints ``listening on URL`` once ready."""
    import signal

    server = APIServer(data_file=data)
    await server.start(host=host, port=port)
    if kubeconfig_out is not None:
        server.write_kubeconfig(kubeconfig_out)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"listening on {server.url}", flush=True)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await server.stop()


__all__ = ["APIServer", "serve_forever"]
