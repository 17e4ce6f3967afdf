"""The kinds the embedded API server serves, and the discovery documents built from them.

Owns the kind registry (``ResourceType``: group, version, plural, scope, short names,
subresources, verbs, the lightkube model used for decode-validation, supported field
selectors, strategic-merge keys), :class:`Registry` (what one Kubernetes release
profile serves: ``resource.k8s.io`` DeviceTaintRule only at the versions the profile
serves, with ``status`` only from 1.35 and the 1.34 alpha selector's extra fields) and
the plain and aggregated (apidiscovery v2) discovery bodies built from a registry (its
OpenAPI documents are ``_openapi``'s, built from a registry). Knows nothing of HTTP or
storage.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from lightkube.models import (
    apps_v1,
    authorization_v1,
    batch_v1,
    coordination_v1,
    core_v1,
    events_v1,
    meta_v1,
    policy_v1,
    resource_v1,
    resource_v1alpha3,
    resource_v1beta2,
)

from drahealth.core import NEWEST_KUBE_VERSION, KubeProfile, kube_profile
from drahealth.kube import DeviceTaintRuleSpec134

JSON = dict[str, Any]
Path = tuple[str, ...]

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUB_VERBS = ["get", "patch", "update"]

# Strategic-merge / server-side-apply list keys, by field path (list indices left out).
COMMON_MERGE_KEYS: dict[Path, str] = {
    ("metadata", "ownerReferences"): "uid",
    ("status", "conditions"): "type",
}
PRIMITIVE_MERGE_LISTS: frozenset[Path] = frozenset({("metadata", "finalizers")})

_CONTAINER_KEYS: dict[Path, str] = {
    ("env",): "name",
    ("ports",): "containerPort",
    ("volumeMounts",): "mountPath",
    ("volumeDevices",): "devicePath",
    ("resizePolicy",): "resourceName",
}


def _pod_merge_keys() -> dict[Path, str]:
    keys: dict[Path, str] = {
        ("spec", "volumes"): "name",
        ("spec", "resourceClaims"): "name",
        ("spec", "imagePullSecrets"): "name",
        ("status", "podIPs"): "ip",
        ("status", "hostIPs"): "ip",
        ("status", "resourceClaimStatuses"): "name",
    }
    for lst in ("containers", "initContainers", "ephemeralContainers"):
        keys[("spec", lst)] = "name"
        for sub, key in _CONTAINER_KEYS.items():
            keys[("spec", lst, *sub)] = key
    # status.containerStatuses (and the init and ephemeral ones) are atomic lists upstream
    # (no patch strategy, listType=atomic): a strategic merge patch or an apply replaces
    # them whole, so what is inside them (allocatedResourcesStatus) has no key here
    return keys


def _template_merge_keys() -> dict[Path, str]:
    """The pod spec's merge keys under a workload's ``spec.template``."""
    return {("spec", "template", *k): v for k, v in _pod_merge_keys().items() if k[0] == "spec"}


@dataclass(frozen=True)
class ResourceType:
    """One served resource (a kind at one group/version)."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    model: type[msgspec.Struct]
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    field_selectors: tuple[str, ...] = ()
    merge_keys: dict[Path, str] = field(default_factory=dict)
    verbs: tuple[str, ...] = VERBS
    #: The version objects of this kind are stored at ("" = this one); a kind served at
    #: several versions is stored once and converted on the way out.
    storage_version: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage_api_version(self) -> str:
        version = self.storage_version or self.version
        return f"{self.group}/{version}" if self.group else version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def key(self) -> str:
        """Storage key prefix, e.g. ``resource.k8s.io/resourceslices``."""
        return f"{self.group}/{self.plural}"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def supported_fields(self) -> tuple[str, ...]:
        base = ("metadata.name",) + (("metadata.namespace",) if self.namespaced else ())
        return base + self.field_selectors

    def merge_key(self, path: Path) -> str | None:
        return self.merge_keys.get(path) or COMMON_MERGE_KEYS.get(path)


_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "type",
)

#: What every profile serves (DeviceTaintRule is added per profile, see :func:`registry`).
BASE_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        "v1",
        "Namespace",
        "namespaces",
        False,
        core_v1.Namespace,
        short_names=("ns",),
        subresources=("status",),
        field_selectors=("status.phase",),
    ),
    ResourceType(
        "",
        "v1",
        "Node",
        "nodes",
        False,
        core_v1.Node,
        short_names=("no",),
        subresources=("status",),
        field_selectors=("spec.unschedulable",),
        merge_keys={("status", "addresses"): "type", ("spec", "taints"): "key"},
    ),
    ResourceType(
        "",
        "v1",
        "Pod",
        "pods",
        True,
        core_v1.Pod,
        short_names=("po",),
        categories=("all",),
        subresources=("status", "eviction", "log"),
        field_selectors=(
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ),
        merge_keys=_pod_merge_keys(),
    ),
    ResourceType(
        "",
        "v1",
        "Event",
        "events",
        True,
        core_v1.Event,
        short_names=("ev",),
        field_selectors=_EVENT_FIELDS,
    ),
    ResourceType("", "v1", "ConfigMap", "configmaps", True, core_v1.ConfigMap, short_names=("cm",)),
    ResourceType("coordination.k8s.io", "v1", "Lease", "leases", True, coordination_v1.Lease),
    ResourceType(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        True,
        apps_v1.Deployment,
        short_names=("deploy",),
        categories=("all",),
        subresources=("status", "scale"),
        merge_keys=_template_merge_keys(),
    ),
    ResourceType(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        True,
        apps_v1.ReplicaSet,
        short_names=("rs",),
        categories=("all",),
        subresources=("status", "scale"),
    ),
    ResourceType(
        "batch",
        "v1",
        "Job",
        "jobs",
        True,
        batch_v1.Job,
        categories=("all",),
        subresources=("status",),
        field_selectors=("status.successful",),
    ),
    ResourceType(
        "events.k8s.io", "v1", "Event", "events", True, events_v1.Event, short_names=("ev",)
    ),
    ResourceType(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        True,
        policy_v1.PodDisruptionBudget,
        short_names=("pdb",),
        subresources=("status",),
    ),
    ResourceType(
        "resource.k8s.io", "v1", "DeviceClass", "deviceclasses", False, resource_v1.DeviceClass
    ),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "ResourceClaim",
        "resourceclaims",
        True,
        resource_v1.ResourceClaim,
        subresources=("status",),
        merge_keys={("status", "reservedFor"): "uid"},
    ),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "ResourceClaimTemplate",
        "resourceclaimtemplates",
        True,
        resource_v1.ResourceClaimTemplate,
    ),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "ResourceSlice",
        "resourceslices",
        False,
        resource_v1.ResourceSlice,
        field_selectors=("spec.driver", "spec.nodeName"),
    ),
    ResourceType(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        False,
        authorization_v1.SelfSubjectAccessReview,
        verbs=("create",),
    ),
)


# --------------------------------------------------------------------------- discovery


def storage_version_hash(group: str, version: str, kind: str) -> str:
    """Upstream's ``discovery.StorageVersionHash``: 8 bytes of SHA-256 of group/version/kind."""
    digest = hashlib.sha256(f"{group}/{version}/{kind}".encode()).digest()
    return base64.b64encode(digest[:8]).decode()


def _api_resources(rt: ResourceType) -> list[JSON]:
    main: JSON = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": list(rt.verbs),
    }
    if rt.short_names:
        main["shortNames"] = list(rt.short_names)
    if rt.categories:
        main["categories"] = list(rt.categories)
    out = [main]
    for sub in rt.subresources:
        if sub == "eviction":
            out.append(
                {
                    "name": f"{rt.plural}/eviction",
                    "singularName": "",
                    "namespaced": True,
                    "group": "policy",
                    "version": "v1",
                    "kind": "Eviction",
                    "verbs": ["create"],
                }
            )
        elif sub == "scale":
            out.append(
                {
                    "name": f"{rt.plural}/scale",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": list(SUB_VERBS),
                }
            )
        else:
            out.append(
                {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": ["get"] if sub == "log" else list(SUB_VERBS),
                }
            )
    return out


def api_versions(server_address: str) -> JSON:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _aggregated_resource(rt: ResourceType) -> JSON:
    kind = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    out: JSON = {
        "resource": rt.plural,
        "responseKind": kind,
        "scope": "Namespaced" if rt.namespaced else "Cluster",
        "singularResource": rt.singular,
        "verbs": list(rt.verbs),
    }
    if rt.short_names:
        out["shortNames"] = list(rt.short_names)
    if rt.categories:
        out["categories"] = list(rt.categories)
    subs = []
    for sub in rt.subresources:
        if sub == "eviction":
            subs.append(
                {
                    "subresource": "eviction",
                    "responseKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                    "verbs": ["create"],
                }
            )
        elif sub == "scale":
            subs.append(
                {
                    "subresource": "scale",
                    "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
                    "verbs": list(SUB_VERBS),
                }
            )
        else:
            verbs = ["get"] if sub == "log" else list(SUB_VERBS)
            subs.append({"subresource": sub, "responseKind": kind, "verbs": verbs})
    if subs:
        out["subresources"] = subs
    return out


# --------------------------------------------------------------------------- per release

# The 1.34 alpha DeviceTaintRule (resource.k8s.io/v1alpha3): its selector also has
# ``deviceClassName`` and CEL ``selectors`` (removed in 1.35; the spec's model is
# drahealth.kube's), and the rule has no ``status`` yet. The models lightkube ships
# describe the 1.35+ shape, so this one describes the 1.34 rule for decode-validation.


class DeviceTaintRule134(msgspec.Struct, omit_defaults=True):
    spec: DeviceTaintRuleSpec134
    apiVersion: str | None = None
    kind: str | None = None
    metadata: meta_v1.ObjectMeta | None = None


_RULE_MODELS: dict[str, type[msgspec.Struct]] = {
    "v1": resource_v1.DeviceTaintRule,
    "v1beta2": resource_v1beta2.DeviceTaintRule,
    "v1alpha3": resource_v1alpha3.DeviceTaintRule,
}


def device_taint_rules(profile: KubeProfile) -> tuple[ResourceType, ...]:
    """DeviceTaintRule at every version ``profile`` serves (none when not served)."""
    versions = profile.served_versions("DeviceTaintRule")
    out = []
    for version in versions:
        model = DeviceTaintRule134 if profile.rule_cel_selectors else _RULE_MODELS[version]
        out.append(
            ResourceType(
                "resource.k8s.io",
                version,
                "DeviceTaintRule",
                "devicetaintrules",
                False,
                model,
                subresources=("status",) if profile.rule_status else (),
                storage_version=versions[0],
            )
        )
    return tuple(out)


class Registry:
    """What one release profile serves: kinds, group versions, discovery documents."""

    def __init__(self, resources: Iterable[ResourceType], kube_version: str) -> None:
        self.resources = tuple(resources)
        self.kube_version = kube_version
        self._by_plural = {(r.group, r.version, r.plural): r for r in self.resources}
        self._by_kind = {(r.api_version, r.kind): r for r in self.resources}
        seen: list[tuple[str, str]] = []
        for r in self.resources:
            if (r.group, r.version) not in seen:
                seen.append((r.group, r.version))
        self._group_versions = seen

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_plural.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        return self._by_kind.get((api_version, kind))

    def versions_of(self, group: str, kind: str) -> tuple[str, ...]:
        """The versions serving ``kind`` (empty: not served)."""
        return tuple(r.version for r in self.resources if r.group == group and r.kind == kind)

    def group_versions(self) -> list[tuple[str, str]]:
        """(group, version) pairs in registry order; the core group is ``""``."""
        return list(self._group_versions)

    def _groups(self) -> list[str]:
        return list(dict.fromkeys(g for g, _ in self._group_versions if g))

    def _kinds(self, group: str, version: str) -> list[ResourceType]:
        return [r for r in self.resources if r.group == group and r.version == version]

    # ----------------------------------------------------------------------- discovery

    def resource_list(self, group: str, version: str) -> JSON | None:
        """``APIResourceList`` for ``/api/v1`` or ``/apis/<group>/<version>``."""
        kinds = self._kinds(group, version)
        if not kinds:
            return None
        gv = f"{group}/{version}" if group else version
        resources = []
        for r in kinds:
            items = _api_resources(r)
            items[0]["storageVersionHash"] = storage_version_hash(
                r.group, self._storage_version(r), r.kind
            )
            resources.extend(items)
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": sorted(resources, key=lambda item: str(item["name"])),
        }

    def _storage_version(self, rt: ResourceType) -> str:
        """The version the real server of this release stores ``rt`` at (its
        ``ResourceEncodingOverrides`` keep a new kind at an older version for a release)."""
        minor = int(self.kube_version.split(".")[1])
        if (rt.group, rt.kind) == ("resource.k8s.io", "DeviceTaintRule"):
            return {37: "v1beta2"}.get(minor, "v1alpha3" if minor < 37 else "v1")
        if rt.group == "resource.k8s.io" and minor <= 34:
            return "v1beta2"  # 1.34 serves v1 and still stores the DRA kinds at v1beta2
        return rt.storage_version or rt.version

    def api_group(self, group: str) -> JSON | None:
        versions = [v for g, v in self._group_versions if g == group and g]
        if not versions:
            return None
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in _preferred(versions)]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def api_group_list(self) -> JSON:
        groups = []
        for g in self._groups():
            body = self.api_group(g)
            assert body is not None
            body.pop("kind")
            body.pop("apiVersion")
            groups.append(body)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def aggregated_discovery(self, legacy: bool, api_version: str) -> JSON:
        """``APIGroupDiscoveryList`` for ``/api`` (legacy=True) or ``/apis``."""
        items = []
        for g in [""] if legacy else self._groups():
            mine = [v for gg, v in self._group_versions if gg == g]
            versions = [
                {
                    "version": v,
                    "resources": [_aggregated_resource(r) for r in self._kinds(g, v)],
                    "freshness": "Current",
                }
                for v in _preferred(mine)
            ]
            items.append({"metadata": {"name": g, "creationTimestamp": None}, "versions": versions})
        return {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": api_version,
            "metadata": {},
            "items": items,
        }


_VERSION = re.compile(r"v(\d+)(?:(alpha|beta)(\d+))?")
_STABILITY = {None: 0, "beta": 1, "alpha": 2}


def _priority(version: str) -> tuple[int, int, int]:
    """Upstream's version priority: GA before beta before alpha, higher numbers first."""
    m = _VERSION.fullmatch(version)
    if m is None:
        return (3, 0, 0)
    return (_STABILITY[m.group(2)], -int(m.group(1)), -int(m.group(3) or 0))


def _preferred(versions: list[str]) -> list[str]:
    """Versions in upstream's discovery order (the preferred one first)."""
    return sorted(versions, key=_priority)


def registry(profile: KubeProfile | None = None) -> Registry:
    """The registry of ``profile`` (None: the newest release with its defaults)."""
    profile = profile or kube_profile(NEWEST_KUBE_VERSION)
    return Registry((*BASE_RESOURCES, *device_taint_rules(profile)), profile.version)


DEFAULT = registry()
#: Every kind the newest release serves (by default).
RESOURCES = DEFAULT.resources


def lookup(group: str, version: str, plural: str) -> ResourceType | None:
    return DEFAULT.lookup(group, version, plural)


def by_kind(api_version: str, kind: str) -> ResourceType | None:
    return DEFAULT.by_kind(api_version, kind)
