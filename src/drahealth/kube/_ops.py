"""Typed write helpers over the lightkube client: status patches, server-side apply,
conflict retries and error predicates.

Owns: how components write to the API (status subresource patches, SSA of whole
objects or of their status, retry of read-modify-write on 409) and how they classify
API errors (``is_not_found``/``is_conflict``/...). Works on lightkube's
``ApiError`` and, because lightkube only builds an ``ApiError`` for responses whose
Content-Type is exactly ``application/json``, on plain ``httpx2.HTTPStatusError`` too.

May not touch: anything above ``kube``; no caching (that is the reflector's job).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import httpx2
import msgspec
from lightkube import AsyncClient
from lightkube.codecs import resource_registry
from lightkube.core import resource as lkr
from lightkube.types import PatchType

__all__ = [
    "apply",
    "apply_status",
    "check_fence",
    "delete_with_preconditions",
    "is_already_exists",
    "is_conflict",
    "is_gone",
    "is_not_found",
    "patch_status",
    "retry_on_conflict",
    "status_code",
    "update_configmap_data",
    "write_configmap_data",
]

R = TypeVar("R")
V = TypeVar("V")


# --------------------------------------------------------------------------- predicates


def status_code(exc: BaseException) -> int | None:
    """HTTP status of an API error (``ApiError`` or ``httpx2.HTTPStatusError``), else None."""
    status = getattr(exc, "status", None)
    code = getattr(status, "code", None)
    if isinstance(code, int) and code:
        return code
    if isinstance(exc, httpx2.HTTPStatusError):
        try:
            return exc.response.status_code
        except (AttributeError, RuntimeError):
            return None
    return None


def _reason(exc: BaseException) -> str | None:
    reason = getattr(getattr(exc, "status", None), "reason", None)
    return reason if isinstance(reason, str) else None


def is_not_found(exc: BaseException) -> bool:
    """404 Not Found."""
    return status_code(exc) == 404


def is_conflict(exc: BaseException) -> bool:
    """409 Conflict from a stale resourceVersion (not ``AlreadyExists``, also a 409)."""
    return status_code(exc) == 409 and _reason(exc) != "AlreadyExists"


def is_already_exists(exc: BaseException) -> bool:
    """409 with reason ``AlreadyExists`` (a create of an existing name)."""
    return status_code(exc) == 409 and _reason(exc) == "AlreadyExists"


def is_gone(exc: BaseException) -> bool:
    """410 Gone (resourceVersion too old)."""
    return status_code(exc) == 410


# --------------------------------------------------------------------------- helpers


def _retype(obj: Any, cls: type[R]) -> R:
    """Return ``obj`` as an instance of ``cls`` (a subresource reply has the parent's
    fields but lightkube decodes it into the subresource class)."""
    if isinstance(obj, cls):
        return obj
    if isinstance(obj, msgspec.Struct) and issubclass(cls, msgspec.Struct):
        return cls(**msgspec.structs.asdict(obj))
    return obj  # type: ignore[no-any-return]


def _status_subresource(resource_type: type[Any]) -> type[Any]:
    sub = getattr(resource_type, "Status", None)
    if not isinstance(sub, type) or not issubclass(sub, lkr.Resource):
        raise ValueError(f"{resource_type.__name__} has no status subresource")
    return sub


def _resource_for(body: Mapping[str, Any]) -> type[Any]:
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if not api_version or not kind:
        raise ValueError("object to apply needs 'apiVersion' and 'kind'")
    return resource_registry.load(api_version, kind)


def _name_ns(body: Any) -> tuple[str, str | None]:
    if isinstance(body, Mapping):
        md = body.get("metadata") or {}
        name, ns = md.get("name"), md.get("namespace")
    else:
        md = body.metadata
        name, ns = (md.name, md.namespace) if md is not None else (None, None)
    if not name:
        raise ValueError("object to apply needs metadata.name")
    return name, ns


async def patch_status(
    client: AsyncClient,
    resource_type: type[R],
    name: str,
    patch: Mapping[str, Any] | list[Any],
    *,
    namespace: str | None = None,
    patch_type: PatchType = PatchType.MERGE,
    field_manager: str | None = None,
) -> R:
    """Patch ``resource_type``'s status subresource (e.g. ``Pod.Status``) and return the
    updated object as a ``resource_type`` instance.

    ``patch`` is sent as-is: ``{"status": {...}}`` for MERGE/STRATEGIC, a list of ops
    for JSON patch. Spec changes in it are ignored by the server (subresource
    isolation).
    """
    sub = _status_subresource(resource_type)
    body = dict(patch) if isinstance(patch, Mapping) else list(patch)
    res = await client.patch(
        sub,
        name,
        body,
        namespace=namespace,
        patch_type=patch_type,
        field_manager=field_manager,
    )
    return _retype(res, resource_type)


async def apply(
    client: AsyncClient,
    obj: Any,
    *,
    field_manager: str | None = None,
    force: bool = False,
) -> Any:
    """Server-side apply ``obj`` (a lightkube resource instance or a manifest dict).

    A dict is sent verbatim (so only the fields it names are owned by
    ``field_manager``); its type comes from ``apiVersion``/``kind``. Returns the
    object as stored, typed. ``field_manager=None`` uses the client's manager (set by
    :func:`make_client`).
    """
    name, ns = _name_ns(obj)
    res = _resource_for(obj) if isinstance(obj, Mapping) else type(obj)
    body = dict(obj) if isinstance(obj, Mapping) else obj
    kwargs: dict[str, Any] = {}
    if issubclass(res, lkr.NamespacedResource) and ns:
        kwargs["namespace"] = ns
    return await client.patch(
        res,
        name,
        body,
        patch_type=PatchType.APPLY,
        field_manager=field_manager,
        force=force,
        **kwargs,
    )


async def apply_status(
    client: AsyncClient,
    obj: Any,
    *,
    field_manager: str | None = None,
    force: bool = False,
) -> Any:
    """Server-side apply to the status subresource of ``obj``'s kind.

    ``obj`` (resource instance or dict) needs ``apiVersion``, ``kind``,
    ``metadata.name`` (and namespace for namespaced kinds) and the ``status`` fields
    to own. Returns the updated object typed as the main resource.
    """
    name, ns = _name_ns(obj)
    res = _resource_for(obj) if isinstance(obj, Mapping) else type(obj)
    sub = _status_subresource(res)
    body = dict(obj) if isinstance(obj, Mapping) else obj
    kwargs: dict[str, Any] = {}
    if issubclass(res, lkr.NamespacedResource) and ns:
        kwargs["namespace"] = ns
    out = await client.patch(
        sub,
        name,
        body,
        patch_type=PatchType.APPLY,
        field_manager=field_manager,
        force=force,
        **kwargs,
    )
    return _retype(out, res)


async def retry_on_conflict(
    fn: Callable[[], Awaitable[V]],
    attempts: int = 5,
    *,
    base_delay: float = 0.01,
) -> V:
    """Run ``fn`` (which must re-read and re-apply its change) until it does not fail
    with a 409 Conflict, at most ``attempts`` times, with a short jittered pause
    between tries. Other errors, and the last conflict, propagate.
    """
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    for attempt in range(attempts):
        try:
            return await fn()
        except httpx2.HTTPStatusError as exc:
            if not is_conflict(exc) or attempt == attempts - 1:
                raise
        await asyncio.sleep(base_delay * (2**attempt) * (0.5 + random.random() / 2))
    raise AssertionError("unreachable")


async def write_configmap_data(
    client: AsyncClient,
    name: str,
    namespace: str,
    data: Mapping[str, str],
    labels: Mapping[str, str] | None = None,
) -> None:
    """Set ``data`` keys of the ConfigMap (merge patch), creating it with ``labels`` if absent."""
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import ConfigMap

    try:
        await client.patch(
            ConfigMap, name, {"data": dict(data)}, namespace=namespace, patch_type=PatchType.MERGE
        )
    except Exception as exc:
        if not is_not_found(exc):
            raise
        meta = ObjectMeta(name=name, namespace=namespace, labels=dict(labels or {}))
        await client.create(ConfigMap(metadata=meta, data=dict(data)))


def check_fence(client: Any) -> None:
    """Ask a client that fences its writes (``check()``, as a leader's client has) whether
    it may write now; it raises when it may not. A plain client is not asked."""
    check = getattr(client, "check", None)
    if callable(check):
        check()


async def delete_with_preconditions(
    client: AsyncClient,
    resource_type: type[Any],
    name: str,
    *,
    uid: str | None,
    resource_version: str | None,
    namespace: str | None = None,
) -> None:
    """DELETE ``name`` only if it is still the object read: ``DeleteOptions`` with
    ``preconditions`` ``{uid, resourceVersion}`` (lightkube's ``delete`` sends no body, so
    the request is built with its request builder). A changed or re-created object
    answers 409 Conflict; the caller reads it again and decides again. Both
    preconditions are required: an object without them is never deleted blind.
    A client that fences its writes is asked first, as its own writes do."""
    if not uid or not resource_version:
        raise ValueError(f"deleting {name}: the object read has no uid or resourceVersion")
    check_fence(client)
    gc: Any = client._client
    br = gc.prepare_request("delete", res=resource_type, name=name, namespace=namespace)
    br.data = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": uid, "resourceVersion": resource_version},
    }
    resp = await gc.send(gc.build_adapter_request(br))
    gc.handle_response("delete", resp, br)


async def update_configmap_data(
    client: AsyncClient,
    name: str,
    namespace: str,
    update: Callable[[Mapping[str, str]], Mapping[str, str]],
    labels: Mapping[str, str] | None = None,
    *,
    attempts: int = 8,
) -> dict[str, str]:
    """Conditional read-modify-write of a ConfigMap's ``data``: read it, set ``data`` to
    ``update(data as read)`` and write it back with the resourceVersion read (a create,
    with ``labels``, when there is none). A 409 (written or created meanwhile) reads
    again and calls ``update`` again, at most ``attempts`` times; the last conflict
    propagates. Returns the data written."""
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import ConfigMap

    for attempt in range(attempts):
        try:
            cm: Any = await client.get(ConfigMap, name, namespace=namespace)
        except Exception as exc:
            if not is_not_found(exc):
                raise
            cm = None
        current = dict((cm.data if cm is not None else None) or {})
        data = dict(update(current))
        try:
            if cm is None:
                meta = ObjectMeta(name=name, namespace=namespace, labels=dict(labels or {}))
                await client.create(ConfigMap(metadata=meta, data=data))
            else:
                cm.data = data  # metadata.resourceVersion: the one read
                await client.replace(cm)
        except Exception as exc:
            if status_code(exc) != 409 or attempt == attempts - 1:
                raise
            await asyncio.sleep(0.01 * (2**attempt) * (0.5 + random.random() / 2))
            continue
        return data
    raise AssertionError("unreachable")
