"""The ``pods/{name}/log`` subresource: proxied to the kubelet of the pod's node.

Owns :func:`pod_log`. As kube-apiserver does, the pod's ``spec.nodeName`` leads to the
Node, whose ``status.addresses`` and ``daemonEndpoints.kubeletEndpoint.Port`` give the
kubelet; the request goes to ``GET /containerLogs/{namespace}/{pod}/{container}`` with
``previous``, ``tailLines``, ``limitBytes`` and ``timestamps`` passed on (``follow`` is
answered with the output so far). The container defaults to the pod's only container;
otherwise it must be named, and a name that is not a DNS-1123 label or not one of the
pod's containers is 400 ``container X is not valid for pod Y`` (upstream's message).
The kubelet URL is built from its parts, each path segment percent-quoted, so no value
can reach another path or query; a redirect from the kubelet is never followed (an
error). The answer is plain text, streamed to the client in chunks of at most
:data:`CHUNK_BYTES` (never held whole), at most ``limitBytes`` and
:data:`MAX_LOG_BYTES`, within :data:`PROXY_TIMEOUT_S` in all (a slow kubelet and a slow
reader alike); an answer that fails or runs out of time after it started is cut where
it is. At most :data:`MAX_CONCURRENT_LOGS` requests are proxied at once; more are 429
with ``Retry-After``.

Which kubelet: a Node's addresses and port are written by clients (the node agent
registers them), and this server has no kubelet credentials to check who answers, so
the proxy contacts only a loopback address (the simulated kubelets all run on this
machine), never a privileged port (below :data:`MIN_KUBELET_PORT`) and never this API
server's own port, and asks only for ``GET /containerLogs/...``. A client that may
write Nodes can still point the proxy at another unprivileged loopback port and read
what that service answers to that path: every client of this server holds the same
token, so it is trusted as much as the node agent is.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web
from yarl import URL

from drahealth.core import is_dns_label

from . import _status
from ._status import APIError

__all__ = ["CHUNK_BYTES", "MAX_CONCURRENT_LOGS", "MAX_LOG_BYTES", "PROXY_TIMEOUT_S", "pod_log"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
#: The most log bytes one answer carries.
MAX_LOG_BYTES = 8 * 1024 * 1024
#: How long one answer may take in all (the kubelet's and the client's side together).
PROXY_TIMEOUT_S = 10.0
#: The most bytes read from the kubelet before they are written to the client.
CHUNK_BYTES = 64 * 1024
#: Log requests proxied at once (one process); more are 429 with ``Retry-After``.
MAX_CONCURRENT_LOGS = 32
#: Kubelet ports below this (privileged system services) are never contacted.
MIN_KUBELET_PORT = 1024
_ERROR_BYTES = 64 * 1024
_PASSED = ("previous", "timestamps")
_BOOLS = {"true": "true", "1": "true", "True": "true", "false": "false", "0": "false",
          "False": "false", "": "false"}  # fmt: skip


def _bool_query(query: Mapping[str, str], name: str) -> str | None:
    raw = query.get(name)
    if raw is None:
        return None
    value = _BOOLS.get(raw)
    if value is None:
        raise _status.bad_request(f"{name}: Invalid value: {raw[:32]!r}: must be a boolean")
    return value


def _int_query(query: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = query.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise _status.bad_request(
            f"{name}: Invalid value: {raw[:32]!r}: must be an integer"
        ) from None
    if value < minimum:
        raise APIError(
            _status.status(
                422,
                f'PodLogOptions "" is invalid: {name}: Invalid value: {value}: '
                f"must be greater than or equal to {minimum}",
                "Invalid",
            )
        )
    return value


def _container(pod: JSON, query: Mapping[str, str]) -> str:
    spec = pod.get("spec") or {}
    name = str((pod.get("metadata") or {}).get("name", ""))
    mains = [str(c.get("name")) for c in spec.get("containers") or []]
    inits = [str(c.get("name")) for c in spec.get("initContainers") or []]
    wanted = query.get("container")
    if not wanted:
        if len(mains) == 1:
            return mains[0]
        message = (
            f"a container name must be specified for pod {name}, choose one of: [{' '.join(mains)}]"
        )
        if inits:
            message += f" or one of the init containers: [{' '.join(inits)}]"
        raise _status.bad_request(message)
    # A pod's containers are DNS labels, so a name that is not one is never valid; it is
    # refused before any lookup and shown shortened.
    if not is_dns_label(wanted) or (wanted not in mains and wanted not in inits):
        shown = wanted if len(wanted) <= 64 else wanted[:64] + "..."
        raise _status.bad_request(f"container {shown} is not valid for pod {name}")
    return wanted


def _own_port(request: web.Request) -> int | None:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return int(sockname[1]) if isinstance(sockname, tuple) and len(sockname) >= 2 else None


def _kubelet(node: JSON, own_port: int | None) -> tuple[str, int]:
    status = node.get("status") or {}
    port = (((status.get("daemonEndpoints") or {}).get("kubeletEndpoint")) or {}).get("Port")
    addresses = [a.get("address") for a in status.get("addresses") or [] if isinstance(a, dict)]
    name = (node.get("metadata") or {}).get("name")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise APIError(
            _status.status(500, f"node {name} has no kubelet endpoint: no kubelet reports it")
        )
    if port < MIN_KUBELET_PORT or port == own_port:
        raise APIError(
            _status.status(
                500,
                f"node {name}: kubelet port {port} is refused (a privileged port, or this "
                "API server's own)",
            )
        )
    for address in addresses:
        try:
            if ipaddress.ip_address(str(address)).is_loopback:
                return str(address), port
        except ValueError:
            continue
    raise APIError(
        _status.status(
            500, f"node {name}: only a kubelet on a loopback address can be reached from here"
        )
    )


def kubelet_url(
    host: str, port: int, namespace: str, pod: str, container: str, params: Mapping[str, str]
) -> URL:
    """``/containerLogs/{namespace}/{pod}/{container}`` on the kubelet, from its parts:
    each segment is percent-quoted whole (no ``/``, ``?``, ``#`` or ``..`` survives)."""
    segments = ["containerLogs", namespace, pod, container]
    if any(s in ("", ".", "..") for s in segments):
        raise _status.bad_request(f"cannot build a kubelet path from {segments[1:]!r}")
    path = "/" + "/".join(quote(s, safe="") for s in segments)
    return URL.build(scheme="http", host=host, port=port, path=path, encoded=True).with_query(
        dict(params)
    )


class _Slots:
    """How many log requests are being proxied now (no event-loop primitive: usable
    from any loop). A request over :data:`MAX_CONCURRENT_LOGS` is 429 at once."""

    def __init__(self) -> None:
        self.busy = 0


_SLOTS = _Slots()


def _too_many() -> web.Response:
    body = _status.status(
        429,
        f"Too many requests: at most {MAX_CONCURRENT_LOGS} pod log requests at once, "
        "please try again later",
        "TooManyRequests",
    )
    return web.json_response(body, status=429, headers={"Retry-After": "1"})


async def _error_text(answer: aiohttp.ClientResponse) -> str:
    """The start of an error answer (at most :data:`_ERROR_BYTES`; the rest is not read)."""
    body = await answer.content.read(_ERROR_BYTES)
    return body.decode(errors="replace").strip()


async def pod_log(
    request: web.Request, pod: JSON, node: JSON | None, query: Mapping[str, str]
) -> web.StreamResponse:
    """The log of one container of ``pod`` (``node``: the Node it is bound to, or None),
    streamed to the client in chunks of at most :data:`CHUNK_BYTES`."""
    meta = pod.get("metadata") or {}
    name = str(meta.get("name", ""))
    container = _container(pod, query)
    tail = _int_query(query, "tailLines", 0)
    limit = _int_query(query, "limitBytes", 1)
    node_name = (pod.get("spec") or {}).get("nodeName")
    if not node_name:
        raise _status.bad_request(f"pod {name} does not have a host assigned")
    if node is None:
        raise _status.not_found("nodes", "", str(node_name))
    host, port = _kubelet(node, _own_port(request))
    params: dict[str, str] = {}
    for flag in _PASSED:
        value = _bool_query(query, flag)
        if value is not None:
            params[flag] = value
    if tail is not None:
        params["tailLines"] = str(tail)
    budget = min(limit or MAX_LOG_BYTES, MAX_LOG_BYTES)
    params["limitBytes"] = str(budget)
    url = kubelet_url(host, port, str(meta.get("namespace") or ""), name, container, params)
    if _SLOTS.busy >= MAX_CONCURRENT_LOGS:
        return _too_many()
    _SLOTS.busy += 1
    try:
        return await _proxy(request, url, budget)
    finally:
        _SLOTS.busy -= 1


async def _proxy(request: web.Request, url: URL, budget: int) -> web.StreamResponse:
    """Copy the kubelet's answer to the client, chunk by chunk, at most ``budget`` bytes,
    all within :data:`PROXY_TIMEOUT_S` (a slow kubelet and a slow reader included).

    Errors before the first byte reach the client as a Status; once the answer has
    started, a failure or the deadline ends it where it is, as a cut-off proxy would.
    """
    response: web.StreamResponse | None = None
    deadline = asyncio.get_running_loop().time() + PROXY_TIMEOUT_S
    try:
        async with (
            asyncio.timeout_at(deadline),
            aiohttp.ClientSession() as session,
            session.get(url, allow_redirects=False, max_redirects=0) as answer,
        ):
            code = answer.status
            if 300 <= code < 400:
                raise APIError(
                    _status.status(
                        500, f"Get {url}: the kubelet answered a redirect ({code}): not followed"
                    )
                )
            if code == 404:
                raise _status.bad_request(await _error_text(answer))
            if code != 200:
                raise APIError(_status.status(500, await _error_text(answer)))
            response = web.StreamResponse(status=200)
            response.content_type = "text/plain"
            response.charset = "utf-8"
            await response.prepare(request)
            left = budget
            while left > 0:
                chunk = await answer.content.read(min(CHUNK_BYTES, left))
                if not chunk:
                    break
                left -= len(chunk)
                await response.write(chunk)
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
        if response is None:
            raise APIError(
                _status.status(500, f"Get {url}: {type(exc).__name__}: {exc or 'timed out'}")
            ) from exc
        log.info("pod log stream from %s ended early: %s", url, type(exc).__name__)
        return response
    with contextlib.suppress(ConnectionError, RuntimeError):
        await response.write_eof()
    return response
