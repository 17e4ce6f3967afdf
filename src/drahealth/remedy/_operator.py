"""An operator's taint actions on one device, shared by ``drahealth taint``/``untaint``
and the dashboard's token-protected actions.

Owns :func:`apply_taint` (create, update or leave unchanged the operator's
DeviceTaintRule for a device and key) and :func:`remove_taints` (delete the rules
drahealth created for that device and key, the operator's and the controller's,
never anyone else's). Inputs are validated before any API call; API errors propagate
as lightkube ``ApiError``.

Both work at the DeviceTaintRule version the server serves (``served``, from
:func:`drahealth.kube.discover`; discovered when not given). Where no version is served
but ``resource.k8s.io/v1`` ResourceClaims are (Kubernetes 1.34-1.36 with their default
gates), the device is fenced instead by the operator's quarantine claim in the
controller's ``namespace`` (:mod:`drahealth.remedy._quarantine`): created, then
allocated to exactly that device once no other claim holds it (until then it is
``pending`` and the holders are named). Such a claim fences like ``NoSchedule``: a
``NoExecute`` (or ``None``) taint is refused there, saying how to move the pods.
``remove_taints`` deletes the operator's and the controller's quarantine claims of the
device, each deallocated first (that makes the scheduler retry pods waiting for a
device; a plain delete does not). Where neither API is served both raise
:class:`RuleAPIUnavailable`, whose text names what the server serves and the fallback.
A rule is only ever written when its selector names exactly one
device, and only for a device whose names have the shape upstream allows (driver: a DNS
subdomain of at most 63 characters; pool: at most 253 characters of DNS subdomains
separated by ``/``; device: a DNS label) and, unless ``force``, that a ResourceSlice
publishes (:func:`published`): the one check behind ``drahealth taint`` and the
dashboard's ``POST /api/taint``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from drahealth.core import is_dns_label, is_dns_subdomain, selector_scope
from drahealth.kube import ServedAPIs, as_dict, discover, is_not_found, resource_class, to_internal
from drahealth.remedy._nodes import NodeDevice
from drahealth.remedy._quarantine import (
    ANNOTATION_QUARANTINE,
    QUARANTINE_MODE,
    allocation,
    claim_body,
    claim_name,
    read_claim,
)
from drahealth.remedy._rules import DeviceRef, RuleError, created_by, rule_body, validate_taint

__all__ = [
    "Applied",
    "Removed",
    "RuleAPIUnavailable",
    "UnpublishedDevice",
    "apply_taint",
    "check_device",
    "names_device",
    "published",
    "remove_taints",
]

#: ``pending``: the operator's quarantine claim exists but another claim holds the device.
Outcome = Literal["created", "updated", "unchanged", "pending"]
#: What an operator's quarantine claim says in its annotation (``rule`` and ``by``).
OPERATOR: Final = "operator"
JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Applied:
    """What :func:`apply_taint` did; unpacks as ``(name, outcome)``."""

    name: str
    outcome: Outcome
    #: ``devicetaintrule``, or ``resourceclaim`` (a quarantine claim in ``namespace``)
    kind: str = "devicetaintrule"
    namespace: str = ""
    #: ``pending``: the claims (``namespace/name``) that hold the device now
    holders: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[str]:
        return iter((self.name, self.outcome))


class Removed(list[str]):
    """The names :func:`remove_taints` deleted (a list), and of what kind: rules, or
    quarantine claims in ``namespace`` (``controller``: those the controller made)."""

    def __init__(
        self,
        names: list[str] | None = None,
        *,
        kind: str = "devicetaintrule",
        namespace: str = "",
        controller: tuple[str, ...] = (),
    ) -> None:
        super().__init__(names or [])
        self.kind = kind
        self.namespace = namespace
        self.controller = controller


class RuleAPIUnavailable(RuntimeError):
    """The server serves no DeviceTaintRule API and no ``resource.k8s.io/v1``
    ResourceClaims for a quarantine claim; the text says what it serves instead."""

    def __init__(self, served: ServedAPIs) -> None:
        kinds = ", ".join(f"{k} {v}" for k, v in served.summary().items())
        release = served.server_version or "this server"
        super().__init__(
            f"{release} serves no DeviceTaintRule API (resource.k8s.io: {kinds}), nor "
            "resource.k8s.io/v1 ResourceClaims for a quarantine claim; enable the "
            "DRADeviceTaintRules feature gate (DRADeviceTaints on 1.34) or let the "
            "controller's node-taint, cordon or evict-only mode act instead"
        )
        self.served = served


class UnpublishedDevice(RuleError):
    """No ResourceSlice publishes the device (a typo would make a rule that taints nothing)."""


#: Longest driver and pool names (resource.k8s.io validation).
MAX_DRIVER, MAX_POOL = 63, 253


def check_device(device: DeviceRef) -> None:
    """Raise :class:`RuleError` where ``device``'s names cannot be a published device's."""
    problem = ""
    if len(device.driver) > MAX_DRIVER or not is_dns_subdomain(device.driver):
        problem = f"driver {device.driver[:80]!r} must be a DNS subdomain of at most 63 characters"
    elif len(device.pool) > MAX_POOL or not all(
        is_dns_subdomain(p) for p in device.pool.split("/")
    ):
        problem = (
            f"pool {device.pool[:80]!r} must be at most 253 characters of DNS subdomains "
            "separated by /"
        )
    elif not is_dns_label(device.device):
        problem = f"device {device.device[:80]!r} must be a DNS label (at most 63 characters)"
    if problem:
        raise RuleError(f"device {str(device)[:200]!r}: {problem}")


async def published(client: AsyncClient, served: ServedAPIs, device: DeviceRef) -> bool:
    """Whether a ResourceSlice of ``device``'s driver publishes it (pool and name)."""
    cls = served.resource("ResourceSlice")
    if cls is None:
        return False
    async for s in client.list(cls, fields={"spec.driver": device.driver}):
        spec = to_internal(s.to_dict()).get("spec") or {}
        if spec.get("driver") != device.driver:
            continue
        if (spec.get("pool") or {}).get("name") != device.pool:
            continue
        if any(d.get("name") == device.device for d in spec.get("devices") or []):
            return True
    return False


async def _rule_class(client: AsyncClient, served: ServedAPIs | None) -> tuple[Any, str]:
    if served is None:
        served = await discover(client)
    cls, api_version = served.resource("DeviceTaintRule"), served.api_version("DeviceTaintRule")
    if cls is None or api_version is None:
        raise RuleAPIUnavailable(served)
    return cls, api_version


def names_device(rule: Any, device: DeviceRef) -> bool:
    """True if ``rule``'s device selector names exactly ``device`` (no wildcard fields,
    unlike :func:`drahealth.core._taints.selects`: untaint removes only such rules)."""
    sel = rule.spec.deviceSelector if rule.spec else None
    return sel is not None and (sel.driver, sel.pool, sel.device) == (
        device.driver,
        device.pool,
        device.device,
    )


async def apply_taint(
    client: AsyncClient,
    device: DeviceRef,
    *,
    key: str,
    value: str,
    effect: str,
    served: ServedAPIs | None = None,
    force: bool = False,
    namespace: str | None = None,
) -> Applied:
    """Make the operator's rule for ``device`` and ``key`` carry ``value``/``effect``;
    where no rule API is served, fence ``device`` with the operator's quarantine claim in
    ``namespace`` (the controller's) instead.

    Returns what was written and what happened (it unpacks as ``(name, outcome)``).
    Raises ``RuleError`` for a bad device name, key, value or effect (before any API
    call) and for an effect a quarantine claim cannot carry, :class:`UnpublishedDevice`
    for a device no ResourceSlice publishes (unless ``force``),
    :class:`RuleAPIUnavailable` where neither a rule API nor v1 ResourceClaims are served.
    """
    check_device(device)
    validate_taint(key, value, effect)
    body = rule_body(device, key=key, value=value, effect=effect, by="operator")
    scope = selector_scope(body["spec"]["deviceSelector"])
    if scope != "device":  # never write a rule that reaches more than one device
        raise RuleError(f"device {device}: the rule's selector would reach a whole {scope}")
    if served is None:
        served = await discover(client)
    if _quarantines(served):
        _quarantine_effect(effect, served)
        where = _check_namespace(namespace)
        if not force and not await published(client, served, device):
            raise UnpublishedDevice(f"no ResourceSlice publishes {device}")
        row = NodeDevice(
            device, QUARANTINE_MODE, key, value, effect, OPERATOR, "an operator's taint",
            round(time.time(), 3), OPERATOR,
        )  # fmt: skip
        return await _fence(client, row, where)
    cls, api_version = await _rule_class(client, served)
    if not force and not await published(client, served, device):
        raise UnpublishedDevice(f"no ResourceSlice publishes {device}")
    body["apiVersion"] = api_version
    name: str = body["metadata"]["name"]
    try:
        current = await client.get(cls, name)
    except ApiError as exc:
        if exc.status.code != 404:
            raise
        await client.create(cls.from_dict(body))
        return Applied(name, "created")
    taint = current.spec.taint if current.spec else None
    if taint is not None and (taint.effect, taint.value or "") == (effect, value):
        return Applied(name, "unchanged")
    updated = current.to_dict()
    updated["spec"]["taint"] = body["spec"]["taint"]
    if selector_scope(updated["spec"].get("deviceSelector")) != "device":
        raise RuleError(f"DeviceTaintRule {name} does not name exactly one device: not changed")
    await client.replace(cls.from_dict(updated))
    return Applied(name, "updated")


async def remove_taints(
    client: AsyncClient,
    device: DeviceRef,
    *,
    key: str,
    effect: str | None = None,
    served: ServedAPIs | None = None,
    namespace: str | None = None,
) -> Removed:
    """Delete drahealth's rules tainting ``device`` with ``key`` (and ``effect``); the
    names deleted. A rule gone between the list and its delete (the controller removes its
    own rules of a device put on hold) is not one of them, and is no error.

    Where no rule API is served but v1 ResourceClaims are, the operator's and the
    controller's quarantine claims of ``device`` in ``namespace`` are deleted instead
    (only those whose annotation names ``device`` and ``key``), each deallocated first."""
    if served is None:
        served = await discover(client)
    if _quarantines(served):
        return await _release(client, device, key, effect, _check_namespace(namespace))
    cls, _ = await _rule_class(client, served)
    deleted = Removed()
    async for rule in client.list(cls):
        taint = rule.spec.taint if rule.spec else None
        if (
            taint is None
            or taint.key != key
            or (effect is not None and taint.effect != effect)
            or not names_device(rule, device)
            or created_by(rule) is None
        ):
            continue
        assert rule.metadata is not None and rule.metadata.name
        try:
            await client.delete(cls, rule.metadata.name)
        except ApiError as exc:
            if exc.status.code == 404:
                continue  # already gone: what was asked is done
            raise
        deleted.append(rule.metadata.name)
    return deleted


# --------------------------------------------------------------- quarantine claims

_ResourceClaim = resource_class("ResourceClaim", "v1")


def _quarantines(served: ServedAPIs) -> bool:
    """Whether an operator's taint is a quarantine claim on this server: no rule API,
    ``resource.k8s.io/v1`` ResourceClaims (every release from 1.34 on)."""
    return served.resource("DeviceTaintRule") is None and served.chosen("ResourceClaim") == "v1"


def _quarantine_effect(effect: str, served: ServedAPIs) -> None:
    """Refuse what a quarantine claim cannot do: it keeps new pods off the device, which
    is ``NoSchedule``; it evicts nobody and cannot mark without fencing."""
    release = served.server_version or "this server"
    if effect == "NoExecute":
        raise RuleError(
            f"{release} serves no DeviceTaintRule API, so it has no device taint eviction: "
            "drahealth fences the device with a quarantine claim, which only keeps new pods "
            "off it (use --effect NoSchedule); to move the pods that use it, evict or delete "
            "them (kubectl drain NODE, or kubectl delete pod), or let the remediation "
            "controller's policy with effect NoExecute evict them from a bad device"
        )
    if effect != "NoSchedule":
        raise RuleError(
            f"{release} serves no DeviceTaintRule API: drahealth fences the device with a "
            f"quarantine claim, which always keeps new pods off it; effect {effect} cannot "
            "be written there (use --effect NoSchedule)"
        )


def _check_namespace(namespace: str | None) -> str:
    if not namespace or not is_dns_label(namespace):
        raise RuleError(
            f"namespace {str(namespace)[:80]!r}: the controller's namespace (a DNS label) "
            "is needed for a quarantine claim"
        )
    return namespace


def _results(obj: Mapping[str, Any]) -> list[Any]:
    status = obj.get("status")
    alloc = status.get("allocation") if isinstance(status, Mapping) else None
    devices = alloc.get("devices") if isinstance(alloc, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    return results if isinstance(results, list) else []


def _allocated(obj: Mapping[str, Any]) -> bool:
    status = obj.get("status")
    return isinstance(status, Mapping) and bool(
        status.get("allocation") or status.get("reservedFor")
    )


async def _holders(client: AsyncClient, device: DeviceRef, namespace: str) -> tuple[str, ...]:
    """``namespace/name`` of the claims (in every namespace) whose allocation holds
    ``device``; the quarantine claims of ``device`` itself (the controller's and the
    operator's, in ``namespace``) fence it too and are never waited for."""
    want = (device.driver, device.pool, device.device)
    found: list[str] = []
    async for claim in client.list(_ResourceClaim, namespace="*"):
        obj = as_dict(claim)
        meta = obj.get("metadata") or {}
        if meta.get("namespace") == namespace and any(
            (read := read_claim(obj, operator=op)) is not None and read[0].device == device
            for op in (False, True)
        ):
            continue
        if any(
            isinstance(r, Mapping) and (r.get("driver"), r.get("pool"), r.get("device")) == want
            for r in _results(obj)
        ):
            found.append(f"{meta.get('namespace')}/{meta.get('name')}")
    return tuple(sorted(found))


async def _fence(client: AsyncClient, row: NodeDevice, namespace: str) -> Applied:
    """Create (or update) the operator's quarantine claim of ``row``'s device and
    allocate it to the device, unless another claim holds it (``pending``)."""
    device = row.device
    name = claim_name(device, operator=True)
    outcome: Outcome = "created"
    allocated = False
    try:
        obj = as_dict(
            await client.create(_ResourceClaim.from_dict(claim_body(row, namespace, operator=True)))
        )
    except ApiError as exc:
        if exc.status.code != 409:
            raise
        obj = as_dict(await client.get(_ResourceClaim, name, namespace=namespace))
        read = read_claim(obj, operator=True)
        if read is None or read[0].device != device:
            raise RuleError(
                f"resourceclaim {namespace}/{name} exists but is not drahealth's operator "
                f"quarantine claim of {device}: not adopted, nothing written (check who "
                "made it)"
            ) from None
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            raise RuleError(
                f"resourceclaim {namespace}/{name} is being deleted: try again once it is gone"
            ) from None
        current, allocated = read
        outcome = "unchanged"
        if (current.key, current.value, current.effect) != (row.key, row.value, row.effect):
            row = replace(row, since=current.since or row.since)
            patch = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "annotations": {ANNOTATION_QUARANTINE: json.dumps(row.as_json())},
                }
            }
            obj = as_dict(
                await client.patch(
                    _ResourceClaim, name, patch, namespace=namespace, patch_type=PatchType.MERGE
                )
            )
            outcome = "updated"
    if allocated:
        return Applied(name, outcome, "resourceclaim", namespace)
    holders = await _holders(client, device, namespace)
    if holders:
        return Applied(name, "pending", "resourceclaim", namespace, holders)
    meta = obj.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    await client.patch(
        _ResourceClaim.Status,
        name,
        {
            "metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": allocation(device, uid, operator=True),
        },
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    return Applied(
        name, "updated" if outcome == "unchanged" else outcome, "resourceclaim", namespace
    )


async def _release(
    client: AsyncClient, device: DeviceRef, key: str, effect: str | None, namespace: str
) -> Removed:
    """Deallocate, then delete, the operator's and the controller's quarantine claims of
    ``device`` with ``key`` (and ``effect``); a claim already gone is no error."""
    deleted: list[str] = []
    controller: list[str] = []
    for operator in (True, False):
        name = claim_name(device, operator=operator)
        try:
            obj = as_dict(await client.get(_ResourceClaim, name, namespace=namespace))
        except ApiError as exc:
            if is_not_found(exc):
                continue
            raise
        read = read_claim(obj, operator=operator)
        if (
            read is None
            or read[0].device != device
            or read[0].key != key
            or (effect is not None and read[0].effect != effect)
        ):
            continue  # not ours, not this device's, or another taint: left alone
        try:
            if _allocated(obj):
                # deallocate first: that (not the delete) makes the scheduler retry pods
                await client.patch(
                    _ResourceClaim.Status,
                    name,
                    {"status": {"allocation": None, "reservedFor": None}},
                    namespace=namespace,
                    patch_type=PatchType.MERGE,
                )
            await client.delete(_ResourceClaim, name, namespace=namespace)
        except ApiError as exc:
            if is_not_found(exc):
                continue  # gone meanwhile (the controller releases a held device's)
            raise
        deleted.append(name)
        if not operator:
            controller.append(name)
    return Removed(deleted, kind="resourceclaim", namespace=namespace, controller=tuple(controller))
