"""Exec credential plugins of kubeconfig users (``users[].user.exec``), as kubectl runs them.

Owns :func:`exec_credential`: run the plugin a kubeconfig names
(``client.authentication.k8s.io/v1`` or ``v1beta1``) and read its ExecCredential:
``status.token``, or ``status.clientCertificateData`` and ``status.clientKeyData``, and
``status.expirationTimestamp``. As client-go does, ``env`` is added to the environment,
``args`` follow the command, a relative command with a slash is relative to the
kubeconfig's directory, ``KUBERNETES_EXEC_INFO`` tells the plugin whether it may
interact, and ``interactiveMode`` decides stdin (``Never``: none; ``IfAvailable``: the
terminal, if there is one; ``Always``: refused without a terminal).

Bounds: the plugin runs as every drahealth child does (:func:`drahealth._child.run_child`:
its own process group, killed whole at the deadline of :data:`EXEC_TIMEOUT` seconds),
its output is kept up to :data:`MAX_OUTPUT` bytes (more is an error) and its stderr
quoted up to :data:`MAX_STDERR`. A credential is reused until :data:`EARLY_REFRESH`
seconds before it expires (for the life of the process when it names no expiry), unless
the caller asks for a fresh one (after a 401: see :mod:`drahealth.kube._credentials`).
Every failure is an :class:`ExecCredentialError` naming the plugin and why (the
kubeconfig loader reports it as a ``KubeConfigError``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drahealth._child import ChildError, run_child

__all__ = [
    "EARLY_REFRESH",
    "EXEC_TIMEOUT",
    "MAX_OUTPUT",
    "ExecCredential",
    "ExecCredentialError",
    "check_token",
    "exec_credential",
]

#: Seconds a plugin may run.
EXEC_TIMEOUT = 60.0
#: Bytes of ExecCredential output read at most.
MAX_OUTPUT = 1 << 20
#: Bytes of the plugin's stderr kept for the error message.
MAX_STDERR = 4096
#: API versions of ExecCredential understood.
VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
#: A cached credential is replaced (the plugin run again) this many seconds before it expires.
EARLY_REFRESH = 30.0


class ExecCredentialError(ValueError):
    """The plugin could not be run or its answer not used; the text says which and why."""


@dataclass(frozen=True)
class ExecCredential:
    """What a plugin answered: a bearer token and/or a client certificate (PEM)."""

    token: str | None
    client_certificate_data: str | None
    client_key_data: str | None
    expires: float | None


#: Credentials by plugin invocation, most recently stored last (at most _CACHE_SIZE).
_cache: dict[str, ExecCredential] = {}
_CACHE_SIZE = 64


def check_token(token: str, what: str) -> str:
    """``token`` when it can be sent as a bearer token (visible ASCII, no space, line
    break or control character), else ValueError naming ``what`` but never quoting the
    token (an HTTP library's own error would quote the whole header, token included)."""
    if all("!" <= c <= "~" for c in token):
        return token
    raise ValueError(
        f"{what} has characters a bearer token cannot carry (a space, a line break, a "
        "control or a non-ASCII character)"
    )


def _run(argv: list[str], env: Mapping[str, str], interactive: bool, where: str) -> bytes:
    """The plugin's standard output, run bounded by :func:`drahealth._child.run_child`."""
    try:
        result = run_child(argv, env, EXEC_TIMEOUT, max_output=MAX_OUTPUT,
                           stdin_inherit=interactive)  # fmt: skip
    except ChildError as exc:
        raise ExecCredentialError(f"{where}: {argv[0]}: {exc}") from None
    if result.timed_out:
        raise ExecCredentialError(f"{where}: {argv[0]} did not answer within {EXEC_TIMEOUT:g}s")
    if result.stdout.truncated:
        raise ExecCredentialError(f"{where}: {argv[0]} printed more than {MAX_OUTPUT} bytes")
    if result.returncode != 0:
        said = result.stderr.head[:MAX_STDERR].decode("utf-8", "replace")
        said = " ".join(said.split())
        code = result.returncode
        ended = f"exited with {code}" if code > 0 else f"was killed by signal {-code}"
        raise ExecCredentialError(f"{where}: {argv[0]} {ended}" + (f": {said}" if said else ""))
    return result.stdout.head


def _expiry(value: Any, where: str) -> float | None:
    if value in (None, ""):
        return None
    try:
        when = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise ExecCredentialError(
            f"{where}: status.expirationTimestamp {value!r} is not RFC 3339"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _parse(output: bytes, api_version: str, where: str) -> ExecCredential:
    try:
        doc = json.loads(output)
    except (ValueError, RecursionError):
        raise ExecCredentialError(
            f"{where}: the plugin's output is not an ExecCredential (JSON)"
        ) from None
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
        raise ExecCredentialError(f"{where}: the plugin's output is not an ExecCredential")
    if doc.get("apiVersion") != api_version:
        raise ExecCredentialError(
            f"{where}: the plugin answered apiVersion {doc.get('apiVersion')!r}, not {api_version}"
        )
    status = doc.get("status")
    if not isinstance(status, dict):
        raise ExecCredentialError(f"{where}: the plugin's ExecCredential has no status")
    token = status.get("token")
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    for name, value in (("token", token), ("clientCertificateData", cert),
                        ("clientKeyData", key)):  # fmt: skip
        if value is not None and not isinstance(value, str):
            raise ExecCredentialError(f"{where}: status.{name} must be a string")
    if token:
        try:
            check_token(token, f"{where}: status.token")
        except ValueError as exc:
            raise ExecCredentialError(str(exc)) from None
    if bool(cert) != bool(key):
        raise ExecCredentialError(
            f"{where}: status.clientCertificateData and clientKeyData must come together"
        )
    if not token and not cert:
        raise ExecCredentialError(
            f"{where}: the plugin's ExecCredential has no token or certificate"
        )
    return ExecCredential(token or None, cert or None, key or None,
                          _expiry(status.get("expirationTimestamp"), where))  # fmt: skip


def exec_credential(
    spec: Mapping[str, Any], where: str, base: Path | None, *, fresh: bool = False
) -> ExecCredential:
    """The credential of the exec plugin ``spec`` (a kubeconfig ``user.exec``); ``base`` is
    the kubeconfig's directory. A cached one is reused until :data:`EARLY_REFRESH` seconds
    before it expires unless ``fresh`` (the server refused it). Raises
    :class:`ExecCredentialError` naming what went wrong."""
    where = f"{where}: exec plugin"
    api_version, command = spec.get("apiVersion"), spec.get("command")
    if api_version not in VERSIONS:
        raise ExecCredentialError(
            f"{where}: apiVersion {api_version!r} is not supported (use {' or '.join(VERSIONS)})"
        )
    if not isinstance(command, str) or not command:
        raise ExecCredentialError(f"{where}: no command")
    args, env_list = spec.get("args") or [], spec.get("env") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ExecCredentialError(f"{where}: args must be a list of strings")
    if not isinstance(env_list, list) or not all(
        isinstance(e, Mapping)
        and isinstance(e.get("name"), str)
        and isinstance(e.get("value"), str)
        for e in env_list
    ):
        raise ExecCredentialError(f"{where}: env must be a list of {{name, value}} strings")
    mode = spec.get("interactiveMode") or (
        "IfAvailable" if api_version.endswith("v1beta1") else None
    )
    if mode is None:
        raise ExecCredentialError(
            f"{where}: interactiveMode must be given for {api_version} (Never, IfAvailable "
            "or Always)"
        )
    if mode not in ("Never", "IfAvailable", "Always"):
        raise ExecCredentialError(
            f"{where}: interactiveMode must be Never, IfAvailable or Always (got {mode!r})"
        )
    if "/" in command and not os.path.isabs(command) and base is not None:
        command = str(base / command)
    terminal = sys.stdin is not None and sys.stdin.isatty()
    if mode == "Always" and not terminal:
        raise ExecCredentialError(f"{where}: interactiveMode Always needs a terminal on stdin")
    interactive = terminal and mode != "Never"
    argv = [command, *args]
    key = json.dumps([argv, env_list, api_version, interactive])
    cached = _cache.get(key)
    fresh_enough = cached is not None and (
        cached.expires is None or cached.expires - EARLY_REFRESH > time.time()
    )
    if cached is not None and fresh_enough and not fresh:
        return cached
    env = dict(os.environ)
    env.update((e["name"], e["value"]) for e in env_list)
    info = {
        "apiVersion": api_version,
        "kind": "ExecCredential",
        "spec": {"interactive": interactive},
    }
    env["KUBERNETES_EXEC_INFO"] = json.dumps(info)
    try:
        out = _run(argv, env, interactive, where)
    except ExecCredentialError as exc:
        hint = spec.get("installHint")
        if hint and ("exited with 127" in str(exc) or "could not run" in str(exc)):
            raise ExecCredentialError(f"{exc} ({' '.join(str(hint).split())[:200]})") from None
        raise
    credential = _parse(out, api_version, f"{where} {command}")
    _cache.pop(key, None)
    _cache[key] = credential
    while len(_cache) > _CACHE_SIZE:
        del _cache[next(iter(_cache))]
    return credential
