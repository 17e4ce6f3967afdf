"""Kubernetes ``Status`` objects and the exception that carries them.

Owns the shape of every error body the embedded API server returns
(``{"kind": "Status", "apiVersion": "v1", "status": "Failure", ...}``) and the
reason/code pairs used by the real kube-apiserver. Pure data; no HTTP imports.
"""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]

_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
}


def status(
    code: int,
    message: str,
    reason: str | None = None,
    *,
    name: str | None = None,
    group: str | None = None,
    kind: str | None = None,
    causes: list[JSON] | None = None,
) -> JSON:
    """Build a ``metav1.Status``; ``code`` < 400 builds a Success status."""
    body: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
    }
    if message:
        body["message"] = message
    if code >= 400:
        body["reason"] = reason or _REASONS.get(code, "Unknown")
    details: JSON = {}
    if name is not None:
        details["name"] = name
    if group:
        details["group"] = group
    if kind is not None:
        details["kind"] = kind
    if causes:
        details["causes"] = causes
    if details:
        body["details"] = details
    body["code"] = code
    return body


def cause(reason: str, message: str, field: str | None = None) -> JSON:
    """One ``StatusCause``."""
    out: JSON = {"reason": reason, "message": message}
    if field is not None:
        out["field"] = field
    return out


class APIError(Exception):
    """An API failure to be answered with a ``Status`` body and its HTTP code."""

    def __init__(self, body: JSON) -> None:
        super().__init__(body.get("message", ""))
        self.body = body

    @property
    def code(self) -> int:
        return int(self.body["code"])


def bad_request(message: str, causes: list[JSON] | None = None) -> APIError:
    return APIError(status(400, message, causes=causes))


def not_found(plural: str, group: str, name: str) -> APIError:
    qual = f"{plural}.{group}" if group else plural
    return APIError(status(404, f'{qual} "{name}" not found', name=name, group=group, kind=plural))


def already_exists(plural: str, group: str, name: str) -> APIError:
    qual = f"{plural}.{group}" if group else plural
    return APIError(
        status(
            409,
            f'{qual} "{name}" already exists',
            "AlreadyExists",
            name=name,
            group=group,
            kind=plural,
        )
    )


def conflict(
    plural: str, group: str, name: str, why: str, causes: list[JSON] | None = None
) -> APIError:
    qual = f"{plural}.{group}" if group else plural
    return APIError(
        status(
            409,
            f'Operation cannot be fulfilled on {qual} "{name}": {why}',
            "Conflict",
            name=name,
            group=group,
            kind=plural,
            causes=causes,
        )
    )


def invalid(kind: str, group: str, name: str, causes: list[JSON]) -> APIError:
    """422 Invalid in the real server's wording: ``Pod "x" is invalid: field: msg``."""
    qual = f"{kind}.{group}" if group else kind
    parts = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes]
    detail = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    return APIError(
        status(
            422,
            f'{qual} "{name}" is invalid: {detail}',
            "Invalid",
            name=name,
            group=group,
            kind=kind,
            causes=causes,
        )
    )


def expired(message: str = "too old resource version") -> APIError:
    return APIError(status(410, message, "Expired"))
