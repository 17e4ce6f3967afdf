"""The Pod-status builder: what goes in ``allocatedResourcesStatus`` for DRA claims.

Owns the kubelet's status-generation rule (``UpdateAllocatedResourcesStatus``) as pure
functions over plain JSON dicts: resolving a pod's claim references to ResourceClaim
object names, naming entries ``claim:<ref>[/<request>]``, the request / sub-request
filter, resourceIDs, and merging the computed entries into existing container
statuses. It never performs I/O: the prepared claims and the current device health
come in through two lookup callables, and the input pod is never mutated.

Deliberate improvements over upstream (each tested):

* entries are sorted by name and resources by resourceID, so an unchanged pod always
  yields an identical status (no spurious PATCHes);
* devices sharing a resourceID (same first CDI device ID) are merged keeping the worst
  health and its message, instead of whichever device happened to come first;
* init containers, including restartable sidecars, are reported as well
  (``StatusOptions.init_containers``);
* messages are capped with the UTF-8-safe :func:`truncate_message`;
* devices a pod got by asking for an extended resource backed by DRA (KEP-5004, the
  scheduler's special claim in ``status.extendedResourceClaimStatus``) are reported in
  an entry named by the resource, e.g. ``example.com/gpu`` (upstream reports nothing
  for them yet, k/k #139939); such entries are recomputed like claim entries, other
  non-``claim:`` entries belong to device plugins and are kept.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from drahealth.core._cluster_pods import (
    StatusInputError,
    extended_resource_claim,
    resolve_claim_name,
)
from drahealth.core._health import DeviceKey, Health, truncate_message
from drahealth.core._records import ClaimInfo, PreparedDeviceInfo

__all__ = [
    "CLAIM_PREFIX",
    "ClaimLookup",
    "HealthLookup",
    "StatusBuilder",
    "StatusInputError",
    "StatusOptions",
    "entry_name",
    "parse_entry_name",
    "resolve_claim_name",
]

JSON = dict[str, Any]

#: ``(driver, pool, device) -> (health, message)``; the message may be empty.
HealthLookup = Callable[[str, str, str], tuple[Health, str]]
#: ``(namespace, ResourceClaim object name) -> the prepared claim, or None``.
ClaimLookup = Callable[[str, str], ClaimInfo | None]

#: Prefix of every DRA entry name; other names belong to device plugins.
CLAIM_PREFIX = "claim:"

_STATUS_LISTS = (("containerStatuses", "containers"), ("initContainerStatuses", "initContainers"))
_RESOURCE_ID_MODES = ("cdi", "device")


@dataclass(frozen=True)
class StatusOptions:
    """Feature switches of the status builder (kubelet gates and our fixes)."""

    #: Gate ``ResourceHealthStatus``: off -> no claim entries at all; existing ones removed.
    health_status: bool = True
    #: Gate ``ResourceHealthStatusMessage``: off -> no ``message`` fields.
    health_message: bool = True
    #: ``"cdi"``: upstream (first CDI device ID, else ``<driver>/<pool>/<device>``);
    #: ``"device"``: always ``<driver>/<pool>/<device>``.
    resource_id: Literal["cdi", "device"] = "cdi"
    #: Also report init containers, including restartable sidecars.
    init_containers: bool = True

    def __post_init__(self) -> None:
        if self.resource_id not in _RESOURCE_ID_MODES:
            raise ValueError(
                f"StatusOptions.resource_id must be one of {', '.join(_RESOURCE_ID_MODES)}, "
                f"got {self.resource_id!r}"
            )
        for name in ("health_status", "health_message", "init_containers"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"StatusOptions.{name} must be a bool, got {getattr(self, name)!r}"
                )


# --------------------------------------------------------------------------- JSON access


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise StatusInputError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _items(value: Any, where: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise StatusInputError(f"{where}: expected an array, got {type(value).__name__}")
    return [_mapping(item, f"{where}[{i}]") for i, item in enumerate(value)]


def _string(value: Any, where: str, *, required: bool = False) -> str:
    if value is None or value == "":
        if required:
            raise StatusInputError(f"{where}: required value is missing")
        return ""
    if not isinstance(value, str):
        raise StatusInputError(f"{where}: expected a string, got {type(value).__name__}")
    return value


# --------------------------------------------------------------------------- naming


def entry_name(claim_ref_name: str, request: str | None) -> str:
    """``claim:<name>`` or ``claim:<name>/<request>`` (request verbatim, may be ``req/sub``)."""
    if not claim_ref_name:
        raise ValueError("entry_name: the claim reference name must not be empty")
    if request:
        return f"{CLAIM_PREFIX}{claim_ref_name}/{request}"
    return f"{CLAIM_PREFIX}{claim_ref_name}"


def parse_entry_name(name: str) -> tuple[str, str] | None:
    """``(claim reference, request)`` of an entry :func:`entry_name` wrote (request ``""``
    when absent, else verbatim, ``req/sub`` included); ``None`` for other entries."""
    if not name.startswith(CLAIM_PREFIX):
        return None
    ref, _, request = name[len(CLAIM_PREFIX) :].partition("/")
    return (ref, request) if ref else None


def _namespace(pod: Mapping[str, Any]) -> str:
    meta = _mapping(pod.get("metadata"), "metadata")
    return _string(meta.get("namespace"), "metadata.namespace") or "default"


# --------------------------------------------------------------------------- builder


class StatusBuilder:
    """Computes ``allocatedResourcesStatus`` claim entries for a pod's containers."""

    def __init__(self, options: StatusOptions = StatusOptions()) -> None:
        if not isinstance(options, StatusOptions):
            raise TypeError(f"options must be StatusOptions, got {type(options).__name__}")
        self.options = options

    # -- one container

    def container_entries(
        self,
        pod: Mapping[str, Any],
        container: Mapping[str, Any],
        claims: ClaimLookup,
        health: HealthLookup,
    ) -> list[JSON]:
        """The claim entries for one container spec, sorted by name (empty ones dropped)."""
        if not self.options.health_status:
            return []
        container = _mapping(container, "container")
        cname = _string(container.get("name"), "container.name") or "?"
        where = f"container {cname!r} resources.claims"
        resources = _mapping(container.get("resources"), f"container {cname!r} resources")
        namespace = _namespace(pod)
        entries: dict[str, list[JSON]] = {}
        for i, ref in enumerate(_items(resources.get("claims"), where)):
            ref_name = _string(ref.get("name"), f"{where}[{i}].name", required=True)
            request = _string(ref.get("request"), f"{where}[{i}].request")
            object_name = resolve_claim_name(pod, ref_name)
            if object_name is None:
                continue
            info = claims(namespace, object_name)
            if info is None:
                continue
            found = self._claim_resources(info, request, health)
            if found:
                entries[entry_name(ref_name, request)] = found
        entries.update(self._extended_entries(pod, cname, resources, claims, health))
        return [{"name": name, "resources": entries[name]} for name in sorted(entries)]

    def _extended_entries(
        self,
        pod: Mapping[str, Any],
        cname: str,
        resources: Mapping[str, Any],
        claims: ClaimLookup,
        health: HealthLookup,
    ) -> dict[str, list[JSON]]:
        """Entries for the extended resources backed by DRA (KEP-5004) the container
        asked for: named by the resource (``example.com/gpu``), as device-plugin
        resources are and as the API server's validation requires (a key of the
        container's ``resources.requests``), with the devices of the special claim's
        requests mapped to this container."""
        special = extended_resource_claim(pod, strict=True)
        if special is None:
            return {}
        info = claims(_namespace(pod), special.name)
        if info is None:
            return {}
        requested = _mapping(resources.get("requests"), f"container {cname!r} resources.requests")
        out: dict[str, list[JSON]] = {}
        for resource in special.resources(cname):
            if resource not in requested:
                continue
            wanted = special.requests[(cname, resource)]
            found = self._claim_resources(info, "", health, requests=wanted)
            if found:
                out[resource] = found
        return out

    def _claim_resources(
        self,
        info: ClaimInfo,
        request: str,
        health: HealthLookup,
        *,
        requests: tuple[str, ...] = (),
    ) -> list[JSON]:
        base = request.partition("/")[0]
        merged: dict[str, tuple[Health, str]] = {}
        for dev in info.devices:
            if base and dev.request_names and base not in dev.request_names:
                continue
            if requests and not set(requests) & set(dev.request_names):
                continue
            value, message = _lookup(health, dev)
            rid = self._resource_id(dev)
            held = merged.get(rid)
            if held is None or value.severity > held[0].severity:
                merged[rid] = (value, message)
        out: list[JSON] = []
        for rid in sorted(merged):
            value, message = merged[rid]
            item: JSON = {"resourceID": rid, "health": value.value}
            if self.options.health_message and message:
                item["message"] = truncate_message(message)
            out.append(item)
        return out

    def _resource_id(self, dev: PreparedDeviceInfo) -> str:
        if self.options.resource_id == "cdi" and dev.cdi_device_ids:
            return dev.cdi_device_ids[0]
        return str(DeviceKey(dev.driver, dev.pool, dev.device))

    # -- whole pod

    def pod_claims(self, pod: Mapping[str, Any], claims: ClaimLookup) -> list[ClaimInfo]:
        """The prepared claims the pod references (deduplicated, sorted by name)."""
        namespace = _namespace(pod)
        spec = _mapping(pod.get("spec"), "spec")
        found: dict[tuple[str, str], ClaimInfo] = {}
        for i, rc in enumerate(_items(spec.get("resourceClaims"), "spec.resourceClaims")):
            name = _string(rc.get("name"), f"spec.resourceClaims[{i}].name", required=True)
            object_name = resolve_claim_name(pod, name)
            if object_name is None:
                continue
            info = claims(namespace, object_name)
            if info is not None:
                found.setdefault((info.namespace, info.name), info)
        return [found[k] for k in sorted(found, key=lambda k: (k[1], k[0]))]

    def apply(
        self, pod: Mapping[str, Any], claims: ClaimLookup, health: HealthLookup
    ) -> dict[str, list[JSON]]:
        """Copies of the pod's container status lists with claim entries recomputed.

        Returns only the lists present in ``status`` (``containerStatuses`` and, with
        ``init_containers``, ``initContainerStatuses``). Device-plugin entries keep
        their place in front; ``claim:`` entries are replaced; an empty result removes
        the ``allocatedResourcesStatus`` key. Ephemeral containers are never touched.
        """
        spec = _mapping(pod.get("spec"), "spec")
        status = _mapping(pod.get("status"), "status")
        out: dict[str, list[JSON]] = {}
        for status_key, spec_key in _STATUS_LISTS:
            if spec_key == "initContainers" and not self.options.init_containers:
                continue
            if status.get(status_key) is None:
                continue
            statuses = _items(status.get(status_key), f"status.{status_key}")
            containers: dict[str, Mapping[str, Any]] = {}
            for i, c in enumerate(_items(spec.get(spec_key), f"spec.{spec_key}")):
                name = _string(c.get("name"), f"spec.{spec_key}[{i}].name", required=True)
                containers.setdefault(name, c)
            out[status_key] = [
                self._one_status(pod, cs, containers, f"status.{status_key}[{i}]", claims, health)
                for i, cs in enumerate(statuses)
            ]
        return out

    def _one_status(
        self,
        pod: Mapping[str, Any],
        cs: Mapping[str, Any],
        containers: Mapping[str, Mapping[str, Any]],
        where: str,
        claims: ClaimLookup,
        health: HealthLookup,
    ) -> JSON:
        copied: JSON = copy.deepcopy(dict(cs))
        name = _string(cs.get("name"), f"{where}.name", required=True)
        container = containers.get(name)
        if container is None and self.options.health_status:
            return copied  # no spec to compute from: leave it as it is
        existing = _items(cs.get("allocatedResourcesStatus"), f"{where}.allocatedResourcesStatus")
        special = extended_resource_claim(pod, strict=True)
        ours = set(special.resources(name)) if special is not None else set()
        kept: list[JSON] = []
        for j, entry in enumerate(existing):
            ename = _string(
                entry.get("name"), f"{where}.allocatedResourcesStatus[{j}].name", required=True
            )
            if not ename.startswith(CLAIM_PREFIX) and ename not in ours:
                kept.append(copy.deepcopy(dict(entry)))
        if container is not None:
            kept.extend(self.container_entries(pod, container, claims, health))
        if kept:
            copied["allocatedResourcesStatus"] = kept
        else:
            copied.pop("allocatedResourcesStatus", None)
        return copied


def _lookup(health: HealthLookup, dev: PreparedDeviceInfo) -> tuple[Health, str]:
    value, message = health(dev.driver, dev.pool, dev.device)
    try:
        value = Health(value)
    except ValueError:
        raise ValueError(
            f"health lookup for {dev.key}: {value!r} is not one of "
            f"{', '.join(h.value for h in Health)}"
        ) from None
    if not isinstance(message, str):
        raise ValueError(f"health lookup for {dev.key}: message must be a string, got {message!r}")
    return value, message
