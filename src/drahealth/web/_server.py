"""The dashboard's HTTP server: one page, a JSON snapshot and a server-sent event stream.

Owns :class:`Dashboard` (aiohttp). Routes: ``/`` the page (``static/index.html``, no
build step), ``/api/state`` the current :func:`~._state.snapshot`, ``/api/events`` a
``text/event-stream`` that sends the snapshot at once and again after every change
(coalesced, only when it differs; a comment every 15 s keeps proxies from closing it),
``/api/history?device=DRIVER/POOL/DEVICE`` the device's controller actions and Events,
and ``/healthz``. Reflectors on the kinds the snapshot reads keep it current.
"""

from __future__ import annotations

import asyncio
import json
import logging
from importlib import resources
from typing import Any

from aiohttp import web
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Pod
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceClaim, ResourceSlice

from drahealth._aio import cancel_and_wait
from drahealth.kube import Reflector
from drahealth.web._state import snapshot

__all__ = ["Dashboard"]

log = logging.getLogger(__name__)


class Dashboard:
    """See the module docstring. ``start()`` returns once the first snapshot is built."""

    def __init__(self, client: AsyncClient, *, history_namespace: str = "default") -> None:
        self.client = client
        self.history_namespace = history_namespace
        self.reflectors: dict[str, Reflector[Any]] = {
            "health": Reflector(
                client, ConfigMap, labels={"app.kubernetes.io/component": "device-health"},
                name="web-health",
            ),
            "pods": Reflector(client, Pod, name="web-pods"),
            "claims": Reflector(client, ResourceClaim, name="web-claims"),
            "slices": Reflector(client, ResourceSlice, name="web-slices"),
            "rules": Reflector(client, DeviceTaintRule, name="web-rules"),
        }  # fmt: skip
        self.state: dict[str, Any] = {"nodes": []}
        self._text = json.dumps(self.state)
        self._subscribers: set[asyncio.Queue[str]] = set()
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        for r in self.reflectors.values():
            r.add_handler(lambda *_a: self._dirty.set())
            await r.start()
        for r in self.reflectors.values():
            await r.wait_synced()
        self._refresh()
        self._tasks.append(asyncio.create_task(self._loop(), name="dashboard-refresh"))
        app = web.Application()
        app.router.add_get("/", self._index)
        app.router.add_get("/api/state", self._state)
        app.router.add_get("/api/events", self._events)
        app.router.add_get("/api/history", self._history)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = port
        for address in self._runner.addresses:
            bound = int(address[1])
            break
        self.url = f"http://{host}:{bound}/"
        return self.url

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        for q in list(self._subscribers):
            q.put_nowait("")  # wake streams so they end
        if self._runner is not None:
            await self._runner.cleanup()
        for r in self.reflectors.values():
            await r.stop()

    # -- state -----------------------------------------------------------------------

    def _refresh(self) -> None:
        r = self.reflectors
        state = snapshot(
            *(r[k].store.dicts() for k in ("health", "pods", "claims", "slices", "rules"))
        )
        text = json.dumps(state, separators=(",", ":"))
        if text != self._text:
            self.state, self._text = state, text
            for q in self._subscribers:
                q.put_nowait(text)

    async def _loop(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(0.05)  # coalesce a burst of watch events
            self._dirty.clear()
            try:
                self._refresh()
            except Exception:
                log.exception("building the dashboard snapshot failed")

    # -- routes ----------------------------------------------------------------------

    async def _index(self, _request: web.Request) -> web.Response:
        page = resources.files("drahealth.web").joinpath("static/index.html").read_text()
        return web.Response(text=page, content_type="text/html")

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _state(self, _request: web.Request) -> web.Response:
        return web.Response(text=self._text, content_type="application/json")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        queue: asyncio.Queue[str] = asyncio.Queue()
        self._subscribers.add(queue)
        try:
            await response.write(f"event: state\ndata: {self._text}\n\n".encode())
            while True:
                try:
                    async with asyncio.timeout(15):
                        text = await queue.get()
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
                    continue
                if not text:
                    break
                while not queue.empty():  # only the newest state matters
                    text = queue.get_nowait() or text
                await response.write(f"event: state\ndata: {text}\n\n".encode())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._subscribers.discard(queue)
        return response

    async def _history(self, request: web.Request) -> web.Response:
        device = request.query.get("device", "")
        if device.count("/") < 2:
            return web.json_response(
                {"error": "query parameter device must be DRIVER/POOL/DEVICE"}, status=400
            )
        rows: list[dict[str, Any]] = []
        try:
            cm = await self.client.get(
                ConfigMap, "drahealth-remediation-history", namespace=self.history_namespace
            )
            for h in json.loads((cm.data or {}).get("history", "[]")):
                if device in str(h.get("subject", "")) or device in str(h.get("message", "")):
                    rows.append({"time": h.get("time", ""), "what": h.get("action", ""),
                                 "message": h.get("message", "")})  # fmt: skip
        except (ApiError, ValueError):
            pass
        try:
            async for e in self.client.list(Event, namespace="*"):
                if device in (e.message or ""):
                    when = e.lastTimestamp or e.firstTimestamp
                    rows.append({"time": when.isoformat() if when else "", "what": e.reason or "",
                                 "message": e.message or ""})  # fmt: skip
        except ApiError:
            pass
        rows.sort(key=lambda r: str(r["time"]))
        return web.json_response(rows[-50:])
