"""Operator <-> controller state kept in the cluster, in two ConfigMaps.

Owns the two ConfigMaps' names and labels, their JSON-per-key format and the code that
reads and writes them:

* ``drahealth-remediation-state``: what the controller wants an operator (and the views)
  to know: one JSON value per key, each key owned by one feature (``breaker``,
  ``needsHuman``, ``holds``, ...). Only the controller writes it (:class:`ControllerState`,
  written once per pass when a key changed, read back at start so a restart or a leader
  change resumes it).
* ``drahealth-remediation-control``: what an operator asks of the controller
  (``resume``, ``holds``, ``clear``, ...): one JSON value per key, written by the CLI
  (:func:`send_request`, read-modify-write with the resourceVersion, so two operators do
  not overwrite each other) and reflected by the controller (:class:`ControlRequests`).

A ConfigMap holds at most 1 MiB; each value here is capped at :data:`MAX_VALUE_BYTES`
and a value that is not JSON, or too large, is ignored with a warning naming the key,
never fatal: a bad edit by hand must not stop remediation.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from drahealth.kube import update_configmap_data
from drahealth.remedy._rules import CONTROLLER_LABEL, MANAGED_BY

__all__ = [
    "COMPONENT_LABEL",
    "CONTROL_COMPONENT",
    "CONTROL_CONFIGMAP",
    "MAX_VALUE_BYTES",
    "STATE_CONFIGMAP",
    "ControlError",
    "ControlRequests",
    "ControllerState",
    "decode_values",
    "read_state",
    "send_request",
]

log = logging.getLogger(__name__)

STATE_CONFIGMAP: Final = "drahealth-remediation-state"
CONTROL_CONFIGMAP: Final = "drahealth-remediation-control"
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
CONTROL_COMPONENT: Final = "remediation-control"
STATE_COMPONENT: Final = "remediation-state"
#: Largest JSON value (UTF-8 bytes) kept per key; the ConfigMap as a whole holds 1 MiB.
MAX_VALUE_BYTES: Final = 256 * 1024
#: Attempts of a read-modify-write that meets a conflict before giving up.
MAX_CONFLICTS: Final = 8


class ControlError(RuntimeError):
    """A request the CLI could not write; the text says what and why."""


def decode_values(data: Mapping[str, str] | None, source: str) -> dict[str, Any]:
    """``data`` of one of the ConfigMaps -> key -> decoded JSON value.

    A value that is too large or not JSON is left out with a warning naming
    ``source`` and the key.
    """
    out: dict[str, Any] = {}
    for key, text in (data or {}).items():
        if not isinstance(text, str):
            continue
        if len(text.encode("utf-8", errors="replace")) > MAX_VALUE_BYTES:
            log.warning("%s: key %r is over %d bytes: ignored", source, key, MAX_VALUE_BYTES)
            continue
        try:
            out[key] = json.loads(text)
        except ValueError as exc:
            log.warning("%s: key %r is not JSON (%s): ignored", source, key, exc)
    return out


def _encode(key: str, value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    if len(text.encode("utf-8")) > MAX_VALUE_BYTES:
        raise ValueError(f"{key}: the value is over {MAX_VALUE_BYTES} bytes")
    return text


class ControlRequests:
    """The controller's copy of the operator's requests (the control ConfigMap).

    Fed from a reflector's events (:meth:`apply`); :meth:`get` answers one key's
    decoded value. ``generation`` counts changes so a feature can tell that a
    request is new.
    """

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.generation = 0

    def apply(self, event_type: str, data: Mapping[str, str] | None) -> None:
        values = {} if event_type == "DELETED" else decode_values(data, CONTROL_CONFIGMAP)
        if values != self.values:
            self.values = values
            self.generation += 1

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class ControllerState:
    """The controller's status keys (the state ConfigMap), written when they change."""

    def __init__(self, client: AsyncClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.values: dict[str, Any] = {}
        self._written: dict[str, str] = {}
        self._dirty: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any) -> None:
        """Set one key's value; written by the next :meth:`flush` if it changed."""
        try:
            text = _encode(key, value)
        except ValueError as exc:
            log.warning("%s: %s: not written", STATE_CONFIGMAP, exc)
            return
        self.values[key] = value
        if self._written.get(key) != text:
            self._dirty.add(key)

    def written(self, key: str) -> bool:
        """Whether ``key``'s value, as last set, is in the API (flushed)."""
        return key in self.values and key not in self._dirty

    async def load(self) -> dict[str, Any]:
        """Read the ConfigMap back (at start): the values last written, by key."""
        self.values = await read_state(self.client, self.namespace)
        self._written = {k: _encode(k, v) for k, v in self.values.items()}
        self._dirty.clear()
        return dict(self.values)

    async def flush(self) -> None:
        """Write the keys set since the last flush: a conditional read-modify-write (the
        resourceVersion read is the update's precondition), so keys another writer set
        meanwhile are kept; a 409 reads again and merges again, at most
        :data:`MAX_CONFLICTS` times, then the keys wait for the next flush. A key counts
        as :meth:`written` only once the API holds its value."""
        if not self._dirty:
            return
        data = {k: _encode(k, self.values[k]) for k in sorted(self._dirty) if k in self.values}
        try:
            await update_configmap_data(
                self.client,
                STATE_CONFIGMAP,
                self.namespace,
                lambda current: {**current, **data},
                {MANAGED_BY: CONTROLLER_LABEL, COMPONENT_LABEL: STATE_COMPONENT},
                attempts=MAX_CONFLICTS,
            )
        except ApiError as exc:
            log.warning("writing %s failed: %s", STATE_CONFIGMAP, exc.status.message)
            return
        self._written.update(data)
        for key, text in data.items():  # a key set again while this was written stays dirty
            if key in self.values and _encode(key, self.values[key]) == text:
                self._dirty.discard(key)
        self._dirty -= {k for k in self._dirty if k not in self.values}


async def read_state(client: AsyncClient, namespace: str) -> dict[str, Any]:
    """The controller's state ConfigMap, decoded ({} when there is none)."""
    try:
        cm = await client.get(ConfigMap, STATE_CONFIGMAP, namespace=namespace)
    except ApiError as exc:
        if exc.status.code == 404:
            return {}
        raise
    return decode_values(cm.data, STATE_CONFIGMAP)


async def send_request(
    client: AsyncClient,
    namespace: str,
    key: str,
    update: Callable[[Any], Any],
) -> Any:
    """Set the control ConfigMap's ``key`` to ``update(current value or None)``.

    Read-modify-write guarded by the resourceVersion: a concurrent change is read
    again and ``update`` applied to it (at most :data:`MAX_CONFLICTS` times). Returns
    the value written. :class:`ControlError` says why it could not be written.
    """
    for _ in range(MAX_CONFLICTS):
        try:
            cm: ConfigMap | None = await client.get(
                ConfigMap, CONTROL_CONFIGMAP, namespace=namespace
            )
        except ApiError as exc:
            if exc.status.code != 404:
                raise ControlError(
                    f"reading configmap {namespace}/{CONTROL_CONFIGMAP}: {exc.status.message}"
                ) from exc
            cm = None
        current = decode_values(cm.data if cm is not None else None, CONTROL_CONFIGMAP)
        value = update(current.get(key))
        try:
            text = _encode(key, value)
        except ValueError as exc:
            raise ControlError(f"{CONTROL_CONFIGMAP}: {exc}") from exc
        try:
            if cm is None:
                meta = ObjectMeta(
                    name=CONTROL_CONFIGMAP,
                    namespace=namespace,
                    labels={COMPONENT_LABEL: CONTROL_COMPONENT},
                )
                await client.create(ConfigMap(metadata=meta, data={key: text}))
            else:
                cm.data = {**(cm.data or {}), key: text}
                await client.replace(cm)
        except ApiError as exc:
            if exc.status.code == 409:
                await asyncio.sleep(0.05)
                continue  # someone else wrote it meanwhile: read again
            raise ControlError(
                f"writing configmap {namespace}/{CONTROL_CONFIGMAP}: {exc.status.message}"
            ) from exc
        return value
    raise ControlError(
        f"writing configmap {namespace}/{CONTROL_CONFIGMAP}: it kept changing "
        f"({MAX_CONFLICTS} conflicts); try again"
    )
