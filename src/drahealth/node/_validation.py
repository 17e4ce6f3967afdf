"""Validation of a plugin's ``GetInfo`` answer, as the kubelet does it before registering.

Owns :func:`validate_plugin_info`, which turns an untrusted
``pluginregistration.PluginInfo`` into a :class:`~drahealth.node._types.PluginInfo`
or raises :class:`~drahealth.node._types.RegistrationError` with the text the
kubelet sends back in ``NotifyRegistrationStatus``, and :func:`go_quote` (Go's
``%q`` for strings and string lists, used in those texts). Pure functions: no I/O,
and paths are cleaned lexically (symlinks are never resolved).

Rules (kubelet plugin manager plus the driver-name/endpoint checks of upstream
master): the type must be ``DRAPlugin``; the driver name must be a lowercase DNS
subdomain of at most 63 characters; the endpoint must be non-empty, absolute,
shorter than 108 bytes and, once cleaned, inside one of the allowed roots; the
supported versions must name a DRA service version this node speaks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Final

from drahealth import api
from drahealth.core import matches_dns_subdomain
from drahealth.node._types import PluginInfo, RegistrationError

__all__ = [
    "DRIVER_NAME_MAX",
    "NO_HANDLER_PREFIX",
    "REGISTRATION_FAILED_PREFIX",
    "VALIDATION_FAILED_PREFIX",
    "clean_path",
    "go_quote",
    "go_quote_list",
    "validate_plugin_info",
]

#: Prefixes of the texts sent back to a refused plugin (spelled as upstream).
NO_HANDLER_PREFIX: Final = "RegisterPlugin error -- no handler registered for plugin type: "
VALIDATION_FAILED_PREFIX: Final = "RegisterPlugin error -- plugin validation failed with err: "
REGISTRATION_FAILED_PREFIX: Final = "RegisterPlugin error -- plugin registration failed with err: "

#: Longest DRA driver name.
DRIVER_NAME_MAX: Final = 63

_GO_ESCAPES: Final = {
    "\a": r"\a",
    "\b": r"\b",
    "\f": r"\f",
    "\n": r"\n",
    "\r": r"\r",
    "\t": r"\t",
    "\v": r"\v",
    "\\": r"\\",
    '"': r"\"",
}


def go_quote(text: str) -> str:
    """``text`` as Go's ``%q`` (``strconv.Quote``) renders it.

    Printable characters stay as they are; the usual C escapes are used where Go
    has them; other control characters become ``\\xNN``, other non-printable
    characters ``\\uNNNN`` / ``\\UNNNNNNNN`` (lowercase hex, like Go). A lone
    surrogate from a ``surrogateescape``-decoded byte is shown as that byte.
    """
    out = ['"']
    for ch in text:
        escape = _GO_ESCAPES.get(ch)
        if escape is not None:
            out.append(escape)
            continue
        if ch.isprintable():
            out.append(ch)
            continue
        code = ord(ch)
        if code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def go_quote_list(items: Iterable[str]) -> str:
    """A list of strings as Go's ``%q`` renders a ``[]string``: ``["a" "b"]``."""
    return "[" + " ".join(go_quote(item) for item in items) + "]"


def clean_path(path: str) -> str:
    """Lexically clean ``path`` like Go's ``filepath.Clean`` (no symlink resolution).

    ``.`` and ``..`` components and repeated separators are removed; ``..`` above
    the root stays at the root. Unlike ``os.path.normpath``, a leading ``//`` is
    collapsed to ``/`` (POSIX treats both as the root).
    """
    cleaned = os.path.normpath(path)
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    return cleaned


def _check_roots(allowed_roots: Sequence[str]) -> tuple[str, ...]:
    if isinstance(allowed_roots, str):
        raise TypeError("allowed_roots must be a sequence of paths, not a single string")
    if not allowed_roots:
        raise ValueError("allowed_roots must name at least one directory")
    roots = []
    for root in allowed_roots:
        if not isinstance(root, str) or not os.path.isabs(root):
            raise ValueError(f"allowed root {root!r} must be an absolute path")
        roots.append(clean_path(root))
    return tuple(roots)


def _is_inside(path: str, root: str) -> bool:
    prefix = root if root.endswith("/") else root + "/"
    return path != root and path.startswith(prefix)


def _driver_name_problem(name: str) -> str | None:
    if not name:
        return "name: Required value: the DRA driver name must not be empty"
    if len(name) > DRIVER_NAME_MAX:
        return (
            f"name: Too long: may not be more than {DRIVER_NAME_MAX} bytes "
            f"(the DRA driver name has {len(name)})"
        )
    if not matches_dns_subdomain(name):
        return (
            f"name: Invalid value: {go_quote(name)}: invalid DRA driver name: must be a "
            "lowercase DNS subdomain (lowercase letters, digits, '-' and '.', each label "
            "starting and ending with a letter or digit)"
        )
    return None


def _endpoint_problem(endpoint: str, roots: tuple[str, ...]) -> str | None:
    quoted = go_quote(endpoint)
    if not endpoint:
        return "endpoint: Required value: empty DRA plugin endpoint"
    if "\x00" in endpoint:
        return f"endpoint: Invalid value: {quoted}: must not contain NUL bytes"
    if not os.path.isabs(endpoint):
        return f"endpoint: Invalid value: {quoted}: must be an absolute path"
    size = len(endpoint.encode("utf-8", "surrogateescape"))
    if size >= api.UNIX_PATH_MAX:
        return (
            f"endpoint: Invalid value: {quoted}: {size} bytes long, longer than the "
            f"{api.UNIX_PATH_MAX - 1} bytes a unix socket path may have"
        )
    # Cleaning an absolute path leaves no ".." component: one that climbed out of
    # a root has already moved the path outside it.
    cleaned = clean_path(endpoint)
    if not any(_is_inside(cleaned, root) for root in roots):
        where = (
            f"the kubelet root directory {go_quote(roots[0])}"
            if len(roots) == 1
            else f"any of the allowed directories {go_quote_list(roots)}"
        )
        return (
            f"endpoint: Invalid value: {quoted}: cleaned path {go_quote(cleaned)} "
            f"is not inside {where}"
        )
    return None


def _versions_problem(versions: Sequence[str]) -> str | None:
    if not versions:
        return "empty list of supported gRPC services (aka supported versions)"
    if not any(v in api.DRA_PLUGIN_SERVICES for v in versions):
        return (
            f"none of services supported by the plugin ({go_quote_list(versions)}) "
            f"are supported by the kubelet ({go_quote_list(api.DRA_PLUGIN_SERVICES)})"
        )
    return None


def validate_plugin_info(
    info: api.registration.PluginInfo,
    *,
    registration_socket: str,
    allowed_roots: Sequence[str],
) -> PluginInfo:
    """Validate a ``GetInfo`` answer from the plugin at ``registration_socket``.

    Returns the registration with the endpoint cleaned (``.``/``..`` removed,
    symlinks untouched) and the versions in the plugin's order. Raises
    :class:`RegistrationError` whose text is what the kubelet sends back:
    ``"RegisterPlugin error -- no handler registered for plugin type: <type>"`` or
    ``"RegisterPlugin error -- plugin validation failed with err: <detail>"``; the
    first failing check (type, name, endpoint, versions) decides. Raises
    ``ValueError``/``TypeError`` when ``allowed_roots`` itself is unusable (empty,
    relative, or a single string).
    """
    roots = _check_roots(allowed_roots)
    if info.type != api.DRA_PLUGIN_TYPE:
        raise RegistrationError(NO_HANDLER_PREFIX + info.type)
    versions = tuple(info.supported_versions)
    problem = (
        _driver_name_problem(info.name)
        or _endpoint_problem(info.endpoint, roots)
        or _versions_problem(versions)
    )
    if problem is not None:
        raise RegistrationError(VALIDATION_FAILED_PREFIX + problem)
    return PluginInfo(
        driver=info.name,
        endpoint=clean_path(info.endpoint),
        versions=versions,
        registration_socket=registration_socket,
    )
