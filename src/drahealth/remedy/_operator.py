"""An operator's taint actions on one device, shared by ``drahealth taint``/``untaint``
and the dashboard's token-protected actions.

Owns :func:`apply_taint` (create, update or leave unchanged the operator's
DeviceTaintRule for a device and key) and :func:`remove_taints` (delete the rules
drahealth created for that device and key, the operator's and the controller's,
never anyone else's). Inputs are validated before any API call; API errors propagate
as lightkube ``ApiError``.
"""

from __future__ import annotations

from typing import Any, Literal

from lightkube import ApiError, AsyncClient
from lightkube.resources.resource_v1 import DeviceTaintRule

from drahealth.remedy._rules import DeviceRef, created_by, rule_body, validate_taint

__all__ = ["apply_taint", "names_device", "remove_taints"]

Outcome = Literal["created", "updated", "unchanged"]


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
    client: AsyncClient, device: DeviceRef, *, key: str, value: str, effect: str
) -> tuple[str, Outcome]:
    """Make the operator's rule for ``device`` and ``key`` carry ``value``/``effect``.

    Returns the rule name and what happened. Raises ``RuleError`` for a bad key,
    value or effect (before any API call).
    """
    validate_taint(key, value, effect)
    body = rule_body(device, key=key, value=value, effect=effect, by="operator")
    name: str = body["metadata"]["name"]
    try:
        current = await client.get(DeviceTaintRule, name)
    except ApiError as exc:
        if exc.status.code != 404:
            raise
        await client.create(DeviceTaintRule.from_dict(body))  # type: ignore[call-overload]
        return name, "created"
    taint = current.spec.taint if current.spec else None
    if taint is not None and (taint.effect, taint.value or "") == (effect, value):
        return name, "unchanged"
    updated = current.to_dict()
    updated["spec"]["taint"] = body["spec"]["taint"]
    await client.replace(DeviceTaintRule.from_dict(updated))  # type: ignore[call-overload]
    return name, "updated"


async def remove_taints(
    client: AsyncClient, device: DeviceRef, *, key: str, effect: str | None = None
) -> list[str]:
    """Delete drahealth's rules tainting ``device`` with ``key`` (and ``effect``)."""
    deleted: list[str] = []
    async for rule in client.list(DeviceTaintRule):
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
        await client.delete(DeviceTaintRule, rule.metadata.name)
        deleted.append(rule.metadata.name)
    return deleted
