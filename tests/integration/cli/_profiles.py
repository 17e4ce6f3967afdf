"""A server in front of the embedded API server that serves less: some kinds are not served.

:class:`Narrowing` is an aiohttp reverse proxy to an :class:`APIServer`. It answers
``/version`` as the release it plays, drops the hidden kinds from the
``resource.k8s.io`` discovery documents and answers 404 on their paths, as a server
without the kind does; everything else (lists, watches, writes) goes through unchanged.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web

from drahealth.controlplane import APIServer

__all__ = ["Narrowing"]

_PLURALS = {"DeviceTaintRule": "devicetaintrules", "ResourceClaim": "resourceclaims"}
_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding", "host"}


def write_kubeconfig(url: str, path: Any) -> str:
    """A kubeconfig at ``path`` for the server at ``url`` (a token user); its path."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(json.dumps(doc))
    return str(path)


class Narrowing:
    def __init__(self, upstream: APIServer, *, version: str, hidden: tuple[str, ...]) -> None:
        self.upstream = upstream
        self.version = version
        self.hidden = hidden
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def start(self) -> str:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def kubeconfig(self, path: Any) -> str:
        return write_kubeconfig(self.url, path)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/version":
            major, minor = self.version.split(".")[:2]
            return web.json_response(
                {"major": major, "minor": minor, "gitVersion": f"v{self.version}.0"}
            )
        parts = path.strip("/").split("/")
        plurals = {_PLURALS[k] for k in self.hidden}
        if parts[:2] == ["apis", "resource.k8s.io"] and len(parts) > 3 and parts[3] in plurals:
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                      "reason": "NotFound",
                      "message": "the server could not find the requested resource"}  # fmt: skip
            return web.Response(
                body=json.dumps(status).encode(),
                status=404,
                headers={"Content-Type": "application/json"},
            )
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method,
            self.upstream.url + request.path_qs,
            headers=headers,
            data=await request.read(),
        ) as up:
            if parts[:2] == ["apis", "resource.k8s.io"] and len(parts) == 3 and up.status == 200:
                doc = await up.json()
                doc["resources"] = [
                    r for r in doc.get("resources", []) if r.get("kind") not in self.hidden
                ]
                return web.json_response(doc)
            out = web.StreamResponse(status=up.status)
            out.content_type = up.content_type
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out
