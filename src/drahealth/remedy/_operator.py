"""An operator's taint actions on one device, shared by ``drahealth taint``/``untaint``
and the dashboard's token-protected actions.

Owns :func:`apply_taint` (create, update or leave unchanged the operator's
DeviceTaintRule for a device and key) and :func:`remove_taints` (delete the rules
drahealth created for that device and key, the operator's and the controller's,
never anyone else's). Inputs are validated before any API call; API errors propagate
as lightkube ``ApiError``.

Both work at the DeviceTaintRule version the server serves (``served``, from
:func:`drahealth.kube.discover`; discovered when not given). Where no version is
served they raise :class:`RuleAPIUnavailable`, whose text names what the server serves
and the fallback. A rule is only ever written when its selector names exactly one
device, and only for a device whose names have the shape upstream allows (driver: a DNS
subdomain of at most 63 characters; pool: at most 253 characters of DNS subdomains
separated by ``/``; device: a DNS label) and, unless ``force``, that a ResourceSlice
publishes (:func:`published`): the one check behind ``drahealth taint`` and the
dashboard's ``POST /api/taint``.
"""

from __future__ import annotations

from typing import Any, Literal

from lightkube import ApiError, AsyncClient

from drahealth.core import is_dns_label, is_dns_subdomain, selector_scope
from drahealth.kube import ServedAPIs, discover, to_internal
from drahealth.remedy._rules import DeviceRef, RuleError, created_by, rule_body, validate_taint

__all__ = [
    "RuleAPIUnavailable",
    "UnpublishedDevice",
    "apply_taint",
    "check_device",
    "names_device",
    "published",
    "remove_taints",
]

Outcome = Literal["created", "updated", "unchanged"]


class RuleAPIUnavailable(RuntimeError):
    """The server serves no DeviceTaintRule API; the text says what it serves instead."""

    def __init__(self, served: ServedAPIs) -> None:
        kinds = ", ".join(f"{k} {v}" for k, v in served.summary().items())
        release = served.server_version or "this server"
        super().__init__(
            f"{release} serves no DeviceTaintRule API (resource.k8s.io: {kinds}); "
            "enable the DRADeviceTaintRules feature gate (DRADeviceTaints on 1.34) or let "
            "the controller's node-taint, cordon or evict-only mode act instead"
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
) -> tuple[str, Outcome]:
    """Make the operator's rule for ``device`` and ``key`` carry ``value``/``effect``.

    Returns the rule name and what happened. Raises ``RuleError`` for a bad device name,
    key, value or effect (before any API call), :class:`UnpublishedDevice` for a device
    no ResourceSlice publishes (unless ``force``), :class:`RuleAPIUnavailable` where no
    rule API is served.
    """
    check_device(device)
    validate_taint(key, value, effect)
    body = rule_body(device, key=key, value=value, effect=effect, by="operator")
    scope = selector_scope(body["spec"]["deviceSelector"])
    if scope != "device":  # never write a rule that reaches more than one device
        raise RuleError(f"device {device}: the rule's selector would reach a whole {scope}")
    if served is None:
        served = await discover(client)
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
        return name, "created"
    taint = current.spec.taint if current.spec else None
    if taint is not None and (taint.effect, taint.value or "") == (effect, value):
        return name, "unchanged"
    updated = current.to_dict()
    updated["spec"]["taint"] = body["spec"]["taint"]
    if selector_scope(updated["spec"].get("deviceSelector")) != "device":
        raise RuleError(f"DeviceTaintRule {name} does not name exactly one device: not changed")
    await client.replace(cls.from_dict(updated))
    return name, "updated"


async def remove_taints(
    client: AsyncClient,
    device: DeviceRef,
    *,
    key: str,
    effect: str | None = None,
    served: ServedAPIs | None = None,
) -> list[str]:
    """Delete drahealth's rules tainting ``device`` with ``key`` (and ``effect``); the
    names deleted. A rule gone between the list and its delete (the controller removes its
    own rules of a device put on hold) is not one of them, and is no error."""
    cls, _ = await _rule_class(client, served)
    deleted: list[str] = []
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
