"""How a pod names its ResourceClaims: the one pod -> claim-name resolution.

Owns :func:`resolve_claim_name`, :func:`pod_claim_names` and
:func:`extended_resource_claim`, shared by the Pod-status builder, the cluster read
model, the controllers and the control plane's stand-ins. The rule is the kubelet's: a
pod-level claim reference names its ResourceClaim by ``resourceClaimName``; one made
from a ``resourceClaimTemplateName`` has the generated name recorded in
``status.resourceClaimStatuses`` (the first entry of that name); a reference with
neither has no claim (the API server refuses such a pod).

A pod that asked for an extended resource backed by DRA (KEP-5004,
``resources.requests: {example.com/gpu: 1}``) has one more claim, the special claim the
scheduler created: ``status.extendedResourceClaimStatus.resourceClaimName``, with
``requestMappings`` saying which of its requests serve which container's resource.
:func:`pod_claim_names` lists it under :data:`EXTENDED_RESOURCES_REF`, a key no pod
claim reference can have (they are DNS labels), unless ``extended=False``.

``strict=True`` (the status builder) raises :class:`StatusInputError` naming the
malformed field; the default skips what is malformed. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "EXTENDED_RESOURCES_REF",
    "ExtendedClaim",
    "StatusInputError",
    "extended_resource_claim",
    "pod_claim_names",
    "resolve_claim_name",
]

#: The :func:`pod_claim_names` key of a pod's special claim for extended resources.
EXTENDED_RESOURCES_REF: Final = "<extended-resources>"


class StatusInputError(ValueError):
    """The pod handed to the builder is malformed; the message names the field."""


def _obj(value: Any, where: str, strict: bool) -> Mapping[str, Any] | None:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    if strict:
        raise StatusInputError(f"{where}: expected an object, got {type(value).__name__}")
    return None


def _list(value: Any, where: str, strict: bool) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if strict:
        raise StatusInputError(f"{where}: expected an array, got {type(value).__name__}")
    return []


def _text(value: Any, where: str, strict: bool, *, required: bool = False) -> str | None:
    if value is None or value == "":
        if required and strict:
            raise StatusInputError(f"{where}: required value is missing")
        return None if required else ""
    if isinstance(value, str):
        return value
    if strict:
        raise StatusInputError(f"{where}: expected a string, got {type(value).__name__}")
    return None


def _generated(pod: Mapping[str, Any], ref: str, strict: bool) -> str | None:
    status = _obj(pod.get("status"), "status", strict) or {}
    entries = _list(status.get("resourceClaimStatuses"), "status.resourceClaimStatuses", strict)
    checked = [
        _obj(raw, f"status.resourceClaimStatuses[{j}]", strict) for j, raw in enumerate(entries)
    ]
    for j, st in enumerate(checked):
        where = f"status.resourceClaimStatuses[{j}]"
        if not st:
            continue
        if _text(st.get("name"), f"{where}.name", strict, required=True) == ref:
            return _text(st.get("resourceClaimName"), f"{where}.resourceClaimName", strict) or None
    return None


def _refs(
    pod: Mapping[str, Any], strict: bool, only: str | None = None
) -> Iterator[tuple[str, str | None]]:
    """(reference name, ResourceClaim name or None) in spec order; with ``only``, just
    the references of that name (the others' fields beyond the name go unchecked)."""
    spec = _obj(pod.get("spec"), "spec", strict) or {}
    refs = _list(spec.get("resourceClaims"), "spec.resourceClaims", strict)
    checked = [_obj(raw, f"spec.resourceClaims[{i}]", strict) for i, raw in enumerate(refs)]
    for i, rc in enumerate(checked):
        where = f"spec.resourceClaims[{i}]"
        if not rc:
            continue
        name = _text(rc.get("name"), f"{where}.name", strict, required=True)
        if not name or (only is not None and name != only):
            continue
        direct = _text(rc.get("resourceClaimName"), f"{where}.resourceClaimName", strict)
        if direct:
            yield name, direct
            continue
        template = _text(
            rc.get("resourceClaimTemplateName"), f"{where}.resourceClaimTemplateName", strict
        )
        yield name, (_generated(pod, name, strict) if template else None)


def resolve_claim_name(
    pod: Mapping[str, Any], pod_claim_name: str, *, strict: bool = True
) -> str | None:
    """The ResourceClaim object name behind the pod-level claim ``pod_claim_name``.

    ``None`` when the pod has no such claim or the name is not known (yet).
    """
    for _ref, claim in _refs(pod, strict, pod_claim_name):
        return claim
    return None


def pod_claim_names(
    pod: Mapping[str, Any], *, strict: bool = False, extended: bool = True
) -> dict[str, str]:
    """Pod claim reference name -> ResourceClaim name, for each reference whose claim
    name is known (the first reference of a name counts), and, with ``extended``, the
    special claim for extended resources under :data:`EXTENDED_RESOURCES_REF`."""
    out: dict[str, str] = {}
    for ref, claim in _refs(pod, strict):
        if claim and ref not in out:
            out[ref] = claim
    special = extended_resource_claim(pod, strict=strict) if extended else None
    if special is not None:
        out[EXTENDED_RESOURCES_REF] = special.name
    return out


@dataclass(frozen=True, slots=True)
class ExtendedClaim:
    """A pod's special claim for extended resources backed by DRA."""

    #: the ResourceClaim's name (in the pod's namespace)
    name: str
    #: (container name, resource name) -> the claim's requests serving it, in order
    requests: Mapping[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)

    def resources(self, container: str) -> list[str]:
        """The extended resource names the claim serves for ``container``, sorted."""
        return sorted(r for c, r in self.requests if c == container)

    def entry_request(self, container: str, resource: str) -> str | None:
        """Which of the claim's devices an ``allocatedResourcesStatus`` entry named
        ``resource`` in ``container``'s status speaks for: its one request's (the
        request name), every device of the claim (``""``: matched by resourceID alone)
        when several requests serve it, ``None`` when the claim does not serve it."""
        found = self.requests.get((container, resource))
        if not found:
            return None
        return found[0] if len(found) == 1 else ""


def extended_resource_claim(
    pod: Mapping[str, Any], *, strict: bool = False
) -> ExtendedClaim | None:
    """The pod's special claim (``status.extendedResourceClaimStatus``), ``None`` when it
    has none or, unless ``strict``, when the field is malformed."""
    where = "status.extendedResourceClaimStatus"
    status = _obj(pod.get("status"), "status", strict) or {}
    ext = _obj(status.get("extendedResourceClaimStatus"), where, strict)
    if not ext:
        return None
    name = _text(ext.get("resourceClaimName"), f"{where}.resourceClaimName", strict)
    if not name:
        return None
    requests: dict[tuple[str, str], tuple[str, ...]] = {}
    mappings = _list(ext.get("requestMappings"), f"{where}.requestMappings", strict)
    for i, raw in enumerate(mappings):
        at = f"{where}.requestMappings[{i}]"
        m = _obj(raw, at, strict)
        if not m:
            continue
        fields = [
            _text(m.get(k), f"{at}.{k}", strict, required=True)
            for k in ("containerName", "resourceName", "requestName")
        ]
        container, resource, request = fields
        if not (container and resource and request):
            continue
        held = requests.get((container, resource), ())
        if request not in held:
            requests[(container, resource)] = (*held, request)
    return ExtendedClaim(name, requests)
