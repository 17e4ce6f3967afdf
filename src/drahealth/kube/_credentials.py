"""Bearer credentials that stay fresh for the life of a client: token files and exec plugins.

Owns :class:`RefreshingBearerAuth`, the ``httpx`` auth every client :func:`make_client`
builds from a kubeconfig user with a ``tokenFile`` or an exec plugin carries, and its two
token sources:

* :class:`TokenFileSource`: the file is read bounded (a regular file of at most 64 KiB)
  and cached; it is read again at most every :data:`TOKEN_FILE_RELOAD` seconds (as
  client-go's cached token source does) and after a 401. A read that fails keeps the
  last good token (the kubelet may be swapping the file).
* :class:`ExecSource`: the plugin runs when there is no credential, when the cached one
  is within 30 s of its ``expirationTimestamp``, and after a 401. Requests waiting while
  it runs take its answer, a token (even one already past its expiry) or its failure,
  rather than running it again each.

After a 401 the request is sent once more, only when the source then gives another
token. Concurrent requests wait for one refresh rather than starting one each. A token
(from a kubeconfig, a file or a plugin) that cannot be an HTTP header value (a line
break, a control or a non-ASCII character) is refused where it is read, by an error that
does not quote it. The async flow runs the refresh (a plugin, a file read) on a worker
thread, never on the event loop. A refresh that fails with no token to fall back on
raises :class:`CredentialError`, a transport error naming the file or the plugin, so
callers treat it as the API being unreachable (retry with backoff; the CLI prints one
``error:`` line).

A client certificate an exec plugin answers cannot be swapped per request by httpx: the
kubeconfig loader resolves those once, at load.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from pathlib import Path
from typing import Any, Protocol

import httpx2

from drahealth.kube._exec_credential import (
    EARLY_REFRESH,
    ExecCredential,
    ExecCredentialError,
    check_token,
    exec_credential,
)

__all__ = [
    "TOKEN_FILE_RELOAD",
    "CredentialError",
    "ExecSource",
    "RefreshingBearerAuth",
    "TokenFileSource",
    "TokenSource",
    "check_token",
]

log = logging.getLogger(__name__)

#: Seconds a token read from a file is used before the file is read again.
TOKEN_FILE_RELOAD = 60.0


class CredentialError(httpx2.TransportError):
    """No credential for the request: the text names the token file or the plugin."""


class TokenSource(Protocol):
    def cached(self) -> str | None:
        """The token to send now, or None when :meth:`refresh` must run first (no I/O)."""

    def refresh(self, stale: str | None, since: float | None = None) -> str:
        """A fresh token (blocking I/O); ``stale`` is the one the caller saw rejected or
        outdated: when another caller already replaced it, that token is returned. So is
        one fetched at or after ``since`` (:func:`time.monotonic`; default: now), when the
        caller started to wait: a burst of requests gets one refresh, even when the
        credential it fetched is already past its expiry."""


class TokenFileSource:
    """The token in a file, read with ``read(path)`` (bounded by the caller; its errors
    name the file)."""

    def __init__(self, path: Path, read: Callable[[Path], str], token: str | None = None) -> None:
        self.path = path
        self._read = read
        self._lock = threading.Lock()
        self._token = token
        self._read_at = time.monotonic() if token is not None else float("-inf")

    def cached(self) -> str | None:
        if self._token is None or time.monotonic() - self._read_at >= TOKEN_FILE_RELOAD:
            return None
        return self._token

    def refresh(self, stale: str | None, since: float | None = None) -> str:
        del since  # a token read is cached for TOKEN_FILE_RELOAD seconds anyway
        with self._lock:
            if self._token is not None and self._token != stale and self.cached() is not None:
                return self._token  # another request read it meanwhile
            self._read_at = time.monotonic()
            try:
                token = self._read(self.path)
            except (OSError, ValueError) as exc:  # the text names the file
                if self._token is None:
                    raise CredentialError(str(exc)) from None
                log.warning("tokenFile %s: %s (keeping the last token read)", self.path, exc)
                return self._token
            if not token:
                if self._token is None:
                    raise CredentialError(f"tokenFile {self.path} is empty")
                log.warning("tokenFile %s is empty (keeping the last token read)", self.path)
                return self._token
            self._token = token
            return token


class ExecSource:
    """The token of an exec plugin (``spec``: the kubeconfig's ``user.exec``)."""

    def __init__(
        self,
        spec: Mapping[str, Any],
        where: str,
        base: Path | None,
        credential: ExecCredential | None = None,
    ) -> None:
        self.spec, self.where, self.base = spec, where, base
        self._lock = threading.Lock()
        self._credential = credential
        self._fetched_at = time.monotonic()
        #: When the last run failed, and why (callers waiting then get that answer).
        self._failed: tuple[float, str] = (float("-inf"), "")

    def cached(self) -> str | None:
        cred = self._credential
        if cred is None or not cred.token:
            return None
        if cred.expires is not None and cred.expires - EARLY_REFRESH <= time.time():
            return None
        return cred.token

    def refresh(self, stale: str | None, since: float | None = None) -> str:
        since = time.monotonic() if since is None else since
        with self._lock:
            cred = self._credential
            token = self.cached()
            if token is None and cred is not None and self._fetched_at >= since:
                token = cred.token  # fetched while this caller waited, expired or not
            if token is not None and token != stale:
                return token  # another request ran the plugin meanwhile
            if self._failed[0] >= since:
                raise CredentialError(self._failed[1])  # it failed while this caller waited
            try:
                cred = exec_credential(self.spec, self.where, self.base, fresh=True)
                if not cred.token:
                    raise ExecCredentialError(
                        f"{self.where}: exec plugin {self.spec.get('command')} answered a "
                        "client certificate, not a token; it is read once, when the "
                        "kubeconfig is loaded"
                    )
            except ExecCredentialError as exc:
                self._failed = (time.monotonic(), str(exc))
                raise CredentialError(str(exc)) from None
            self._credential, self._fetched_at = cred, time.monotonic()
            return cred.token


class RefreshingBearerAuth(httpx2.Auth):
    """Sends the token of ``source``; refreshes it when stale and once after a 401."""

    requires_request_body = True  # a retried request is sent again whole

    def __init__(self, source: TokenSource) -> None:
        self.source = source
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._locks_guard = threading.Lock()

    @staticmethod
    def _with(request: httpx2.Request, token: str) -> httpx2.Request:
        request.headers["Authorization"] = f"Bearer {token}"
        return request

    def sync_auth_flow(
        self, request: httpx2.Request
    ) -> Generator[httpx2.Request, httpx2.Response, None]:
        token = self.source.cached() or self.source.refresh(None)
        response = yield self._with(request, token)
        if response.status_code != 401:
            return
        fresh = self.source.refresh(token)
        if fresh != token:
            yield self._with(request, fresh)

    def _lock(self) -> asyncio.Lock:
        """This event loop's lock (one client may be used from more than one loop)."""
        loop = asyncio.get_running_loop()
        with self._locks_guard:
            lock = self._locks.get(loop)
            if lock is None:
                for old in [lp for lp in self._locks if lp.is_closed()]:
                    del self._locks[old]
                lock = self._locks[loop] = asyncio.Lock()
            return lock

    async def _refresh(self, stale: str | None) -> str:
        since = time.monotonic()
        async with self._lock():  # one worker thread per refresh, not one per request
            token = self.source.cached()
            if token is not None and token != stale:
                return token
            return await asyncio.to_thread(self.source.refresh, stale, since)

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        token = self.source.cached() or await self._refresh(None)
        response = yield self._with(request, token)
        if response.status_code != 401:
            return
        fresh = await self._refresh(token)
        if fresh != token:
            yield self._with(request, fresh)
