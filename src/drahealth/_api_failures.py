"""How a command says it could not use the Kubernetes API: one line on stderr, exit 1.

Owns what the one-shot commands (``status``, ``pods``, ``history``, ``taint``,
``untaint``) and ``dashboard`` share when the API is out of reach:

* :class:`CommandError`: a click exception printed as ``error: <message>`` (one line,
  exit code 1; usage errors stay click's, exit code 2);
* :func:`load_checked`: the kubeconfig resolved as every client resolves it, plus a check
  that the files it names (certificate authority, client certificate and key, token
  file) exist and can be read, so a missing file is named instead of failing deep in
  TLS setup;
* :func:`explain`: a transport failure (refused, timed out, TLS) as one sentence naming
  the server and what to check;
* :func:`api_failures`: a context manager turning those failures, and API errors, into
  :class:`CommandError`.
"""

from __future__ import annotations

import contextlib
import os
import re
import ssl
from collections.abc import Iterator
from typing import IO, Any

import click
import httpx2
from lightkube import ApiError, SingleConfig
from lightkube.config.models import User

from drahealth.kube import DEFAULT_TIMEOUT, TRANSPORT_ERRORS, KubeConfigError, load_config

__all__ = ["EXIT_ERROR", "CommandError", "api_failures", "explain", "load_checked"]

#: Exit code of a command that failed (API unreachable, API error); 2 is a usage error.
EXIT_ERROR = 1
_CHECK = "check --kubeconfig / that the cluster is up"


class CommandError(click.ClickException):
    """A failure that is not the caller's usage: ``error: <message>`` on stderr, exit 1."""

    exit_code = EXIT_ERROR

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=file is None, file=file)


def _where(config: SingleConfig) -> str:
    return f"kubeconfig {config.fname}" if config.fname else f"server {config.cluster.server}"


def load_checked(
    kubeconfig: str | os.PathLike[str] | None, context: str | None = None
) -> SingleConfig:
    """The configuration a client for ``kubeconfig`` would use, with its files checked.

    Raises :class:`~drahealth.kube.KubeConfigError` for a malformed kubeconfig (a usage
    error for the caller) and :class:`CommandError` for a file it names that is missing
    or unreadable.
    """
    config = load_config(kubeconfig, context=context)
    user = config.user or User()
    files = (
        ("certificate-authority", config.cluster.certificate_auth),
        ("client-certificate", user.client_cert),
        ("client-key", user.client_key),
        ("tokenFile", user.token_file),
    )
    for field, name in files:
        if not name:
            continue
        try:
            path = config.abs_file(name)
        except Exception as exc:  # a relative path without a file to be relative to
            raise CommandError(f"{_where(config)}: {field} {name}: {exc}") from exc
        try:
            with open(path, "rb"):
                pass
        except FileNotFoundError:
            raise CommandError(f"{_where(config)}: {field} file {path} not found") from None
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise CommandError(f"{_where(config)}: {field} file {path}: {reason}") from exc
    return config


def _reason(exc: BaseException) -> str:
    """The most telling words of a transport error, e.g. ``connection refused``."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for e in chain:
        if isinstance(e, OSError) and not isinstance(e, ssl.SSLError) and e.strerror:
            words = os.strerror(e.errno) if isinstance(e.errno, int) else e.strerror
            return words[:1].lower() + words[1:]
    text = next((str(e) for e in chain if str(e)), type(exc).__name__)
    text = re.sub(r"^\[Errno -?\d+\]\s*", "", text.strip())
    return text[:1].lower() + text[1:]


def explain(exc: BaseException, server: str) -> str | None:
    """One sentence for a failure to talk to ``server``; None if ``exc`` is not one."""
    if isinstance(exc, httpx2.TimeoutException):
        return f"the API server at {server} did not answer within {DEFAULT_TIMEOUT:g}s ({_CHECK})"
    tls = isinstance(exc, ssl.SSLError) or "SSL" in str(exc) or "certificate" in str(exc)
    if isinstance(exc, httpx2.ConnectError | ssl.SSLError) and tls:
        return (
            f"TLS with the API server at {server} failed: {_reason(exc)} "
            "(check the kubeconfig's certificate-authority and server address)"
        )
    if isinstance(exc, httpx2.ConnectError | ConnectionError):
        return f"cannot reach the API server at {server}: {_reason(exc)} ({_CHECK})"
    if isinstance(exc, httpx2.TransportError):
        return f"talking to the API server at {server} failed: {_reason(exc)} ({_CHECK})"
    return None


def _api_error(exc: ApiError) -> str:
    status = exc.status
    hint = {401: " (check the kubeconfig's credentials)", 403: " (check RBAC)"}
    return f"API error {status.code}: {status.message}{hint.get(status.code or 0, '')}"


@contextlib.contextmanager
def api_failures(
    kubeconfig: str | os.PathLike[str] | None, what: str = "", context: str | None = None
) -> Iterator[None]:
    """Turn API and transport failures inside the block into one-line :class:`CommandError`.

    ``what`` (e.g. ``devicetaintrule/x``) prefixes API errors; a malformed kubeconfig
    becomes click's usage error naming ``--kubeconfig`` (exit 2), or ``--context`` when
    the context it names is not there.
    """
    try:
        yield
    except KubeConfigError as exc:
        hint = "--context" if context is not None and "context" in str(exc) else "--kubeconfig"
        raise click.BadParameter(str(exc), param_hint=hint) from exc
    except ApiError as exc:
        raise CommandError((f"{what}: " if what else "") + _api_error(exc)) from exc
    except TRANSPORT_ERRORS as exc:
        try:
            server = load_config(kubeconfig, context=context).cluster.server
        except Exception:
            server = "(unknown)"
        message = explain(exc, server)
        if message is None:
            raise
        raise CommandError(message) from exc
