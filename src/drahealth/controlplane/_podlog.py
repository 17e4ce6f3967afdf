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
error). Only a kubelet on a loopback address is contacted (the Node's address is
writable by any client; the simulated kubelets all run on this machine). The answer is
plain text, at most :data:`MAX_LOG_BYTES`, within :data:`PROXY_TIMEOUT_S` in all.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web
from yarl import URL

from drahealth.core import is_dns_label

from . import _status
from ._status import APIError

__all__ = ["MAX_LOG_BYTES", "PROXY_TIMEOUT_S", "pod_log"]

JSON = dict[str, Any]
#: The most log bytes one answer carries.
MAX_LOG_BYTES = 8 * 1024 * 1024
#: How long the kubelet may take to answer.
PROXY_TIMEOUT_S = 10.0
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


def _kubelet(node: JSON) -> tuple[str, int]:
    status = node.get("status") or {}
    port = (((status.get("daemonEndpoints") or {}).get("kubeletEndpoint")) or {}).get("Port")
    addresses = [a.get("address") for a in status.get("addresses") or [] if isinstance(a, dict)]
    name = (node.get("metadata") or {}).get("name")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise APIError(
            _status.status(500, f"node {name} has no kubelet endpoint: no kubelet reports it")
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


async def _read_bounded(answer: aiohttp.ClientResponse) -> bytes:
    """At most :data:`MAX_LOG_BYTES` of the body (the rest is never read)."""
    chunks: list[bytes] = []
    size = 0
    while size < MAX_LOG_BYTES:
        chunk = await answer.content.read(min(64 * 1024, MAX_LOG_BYTES - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def pod_log(pod: JSON, node: JSON | None, query: Mapping[str, str]) -> web.Response:
    """The log of one container of ``pod`` (``node``: the Node it is bound to, or None)."""
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
    host, port = _kubelet(node)
    params: dict[str, str] = {}
    for flag in _PASSED:
        value = _bool_query(query, flag)
        if value is not None:
            params[flag] = value
    if tail is not None:
        params["tailLines"] = str(tail)
    params["limitBytes"] = str(min(limit or MAX_LOG_BYTES, MAX_LOG_BYTES))
    url = kubelet_url(host, port, str(meta.get("namespace") or ""), name, container, params)
    timeout = aiohttp.ClientTimeout(total=PROXY_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, allow_redirects=False, max_redirects=0) as answer,
        ):
            body = await _read_bounded(answer)
            code = answer.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise APIError(
            _status.status(500, f"Get {url}: {type(exc).__name__}: {exc or 'timed out'}")
        ) from exc
    if 300 <= code < 400:
        raise APIError(
            _status.status(
                500, f"Get {url}: the kubelet answered a redirect ({code}): not followed"
            )
        )
    if code == 404:
        raise _status.bad_request(body.decode(errors="replace").strip())
    if code != 200:
        raise APIError(_status.status(500, body.decode(errors="replace").strip()[:1024]))
    return web.Response(body=body, content_type="text/plain", charset="utf-8")
