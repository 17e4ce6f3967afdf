"""The cluster read model: what the API says about devices, kept up to date per watch event.

Owns :class:`ClusterModel`, a typed, sans-I/O model fed with watch events
(:meth:`ClusterModel.apply` with the kind, ``ADDED``/``MODIFIED``/``DELETED`` and the
object as a dict). Each event costs time in proportion to what it changes (the object,
and for a claim the pods that name it), never to the size of the cluster. It holds
nodes, ResourceSlices (devices, attributes, slice taints), DeviceTaintRules,
ResourceClaims (allocation results, ``reservedFor``), pods (claim references, their
``allocatedResourcesStatus`` entries, phase) and the node agents' device-health records,
with the indexes device -> claims -> pods and device -> taints. Readers ask per device:
:meth:`~ClusterModel.observation`, :meth:`~ClusterModel.facts`,
:meth:`~ClusterModel.consumers`, :meth:`~ClusterModel.taints`,
:meth:`~ClusterModel.evictions`; :meth:`~ClusterModel.take_changed` hands out the devices
whose observation or facts changed since the last call, so a consumer's pass costs
O(changed devices).

Events may come in any order (a pod before its claim, a claim before its slice): every
answer is the one a model built from the final objects alone gives.

The rules, each written once (the code it replaces disagreed where noted):

* **health**: a device's observation is the agents' record where one speaks for it
  (records sorted by namespace/name, the last wins), else the worst of what live and
  ended pods' ``allocatedResourcesStatus`` entries and allocated claims'
  ``status.devices[].conditions`` (type ``DeviceHealthy``, :mod:`._claim_health`) say
  (ties: pods before claims, each first by namespace/name). The agent's record wins
  because it is the node's deadline-enforcing view (a silent driver turns Unknown there,
  while its last claim condition stays as written); pods and claims both relay the
  driver's word, so the worst of them wins and a stale Healthy never hides a fault.
  Only ConfigMaps that are agent records by the convention of
  :mod:`._cluster_records` count.
* **entry -> device**: an entry ``claim:<ref>[/<request>]`` (parsed by
  :func:`~._status.parse_entry_name`, next to the code that writes it; entries without
  the ``claim:`` prefix belong to device plugins and are ignored, where the old reader
  took them for claim references, unless the pod's special claim for extended resources
  serves that resource name in that container (KEP-5004,
  :meth:`~._cluster_pods.ExtendedClaim.entry_request`)) names a claim through the pod's
  claim references
  (:func:`~._cluster_pods.pod_claim_names`: a reference with neither
  ``resourceClaimName`` nor ``resourceClaimTemplateName`` names no claim, where one
  old copy still took a generated name from the status); a resourceID
  ``<driver>/<pool>/<device>`` matches a result exactly, a CDI device ID matches the only
  candidate of the request, or the one candidate whose device name ends the ID after
  ``-``, ``=``, ``/`` or ``_``; an entry that stays ambiguous is skipped, not guessed.
* **facts**: driver, pool, node and attributes (``string``, ``int``, ``bool``,
  ``version``; also under the name without its domain) from the ResourceSlice that lists
  the device (several: the last by name wins); a device without a slice has no facts.
* **consumers**: live pods (not ``Succeeded``/``Failed``, not being deleted) whose
  allocated claims hold the device, one entry per pod, claim and request, sorted
  (the old reader repeated a pod that named a claim twice). The special claim of a pod
  that asked for an extended resource backed by DRA counts like any other (upstream's
  eviction controller misses these pods, k/k #141290); its requests carry no
  tolerations, so a NoExecute taint evicts them.
* **taints**: the device's slice taints and every DeviceTaintRule whose
  ``deviceSelector`` selects it by :func:`~._taints.selects`, the allocator's answer,
  rules for many devices included (the old view skipped rules that did not name exactly
  one device, so a status view could show clean a device the scheduler treats as
  tainted).
* **evictions**: a pod leaves a NoExecute-tainted device when its claim's request does
  not tolerate the taint, or when the toleration's ``tolerationSeconds`` ran out since
  the taint's ``timeAdded`` (:func:`~._taints.eviction_due`, the smallest of the
  tolerating tolerations' seconds as Kubernetes does; one old copy ignored
  ``tolerationSeconds`` and evicted at once, another took the first).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from drahealth.core._claim_health import claim_observations
from drahealth.core._cluster_pods import (
    EXTENDED_RESOURCES_REF,
    extended_resource_claim,
    pod_claim_names,
)
from drahealth.core._cluster_records import (
    DEFAULT_NAMESPACE,
    Observation,
    decode_devices,
    is_agent_record,
)
from drahealth.core._health import DeviceKey, Health
from drahealth.core._policy import AttributeValue, DeviceFacts
from drahealth.core._status import parse_entry_name
from drahealth.core._taints import NOW, Taint, eviction_due, request_tolerations, selects

__all__ = [
    "KINDS",
    "ClusterModel",
    "Consumer",
    "DeviceTaint",
    "Observation",
    "device_attributes",
    "resolve_resource",
]

JSON = dict[str, Any]
ObjKey = tuple[str, str]  # (namespace, name); "" for cluster-scoped objects

#: The kinds :meth:`ClusterModel.apply` takes.
KINDS: Final = ("Node", "ResourceSlice", "DeviceTaintRule", "ResourceClaim", "Pod", "ConfigMap")
_ENDED = ("Succeeded", "Failed")
_ID_SEPARATORS = ("-", "=", "/", "_")


@dataclass(frozen=True, slots=True, order=True)
class Consumer:
    """A live pod using a device through ``claim`` (its ``request``); ``extended``: the
    claim is the pod's special claim for extended resources (KEP-5004)."""

    namespace: str
    name: str
    uid: str
    node: str
    claim: str
    request: str
    extended: bool = False


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """A taint on a device and where it comes from (``devicetaintrule/<name>`` or
    ``resourceslice/<name>``); ``since`` is its ``timeAdded`` as written."""

    taint: Taint
    source: str
    since: str

    @property
    def added(self) -> float | None:
        """``since`` as unix time, ``None`` if absent or unreadable."""
        if not self.since:
            return None
        try:
            return datetime.datetime.fromisoformat(self.since.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None

    def as_dict(self) -> JSON:
        t = self.taint
        return {"source": self.source, "key": t.key, "value": t.value, "effect": t.effect,
                "since": self.since}  # fmt: skip


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _key(obj: Mapping[str, Any]) -> ObjKey:
    meta = _meta(obj)
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _health(value: object) -> Health:
    try:
        return Health(str(value))
    except ValueError:
        return Health.UNKNOWN


def _taint(raw: Mapping[str, Any], source: str) -> DeviceTaint:
    return DeviceTaint(
        Taint(str(raw.get("key") or ""), str(raw.get("value") or ""), str(raw.get("effect") or "")),
        source,
        str(raw.get("timeAdded") or ""),
    )


def device_attributes(device: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """A slice device's attributes as plain values (also under the name without domain)."""
    attrs: dict[str, AttributeValue] = {}
    for name, value in _dict(device.get("attributes")).items():
        if not isinstance(value, dict):
            continue
        v = next((value[k] for k in ("string", "int", "bool", "version") if k in value), None)
        if isinstance(v, str | int | bool):
            attrs[name] = v
            attrs.setdefault(name.rpartition("/")[2], v)
    return attrs


def resolve_resource(resource_id: str, candidates: list[DeviceKey]) -> DeviceKey | None:
    """The device among ``candidates`` a pod status resourceID names (module docstring)."""
    for key in candidates:
        if resource_id == str(key):
            return key
    if len(candidates) == 1:
        return candidates[0]
    ends = [
        k for k in candidates if any(resource_id.endswith(s + k.device) for s in _ID_SEPARATORS)
    ]
    return ends[0] if len(ends) == 1 else None


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class _Slice:
    node: str
    devices: dict[DeviceKey, tuple[DeviceFacts, tuple[DeviceTaint, ...]]]


@dataclass(frozen=True, slots=True)
class _Rule:
    selector: Mapping[str, Any] | None
    taint: DeviceTaint
    exact: DeviceKey | None  # the one device a rule names fully, else None


@dataclass(frozen=True, slots=True)
class _Claim:
    #: (request, device) of each allocation result
    results: tuple[tuple[str, DeviceKey], ...]
    reserved_for: tuple[tuple[str, str, str], ...]  # (resource, name, uid)
    raw: Mapping[str, Any]  # for request_tolerations
    #: what its ``DeviceHealthy`` conditions say, per allocated device
    observed: Mapping[DeviceKey, Observation] = field(default_factory=dict)


@dataclass(slots=True)
class _Pod:
    namespace: str
    name: str
    uid: str
    node: str
    live: bool
    claims: dict[str, str]  # reference -> ResourceClaim name
    #: (reference, request, [(resourceID, health, message)]) of each claim entry
    entries: list[tuple[str, str, list[tuple[str, Health, str]]]]
    observed: dict[DeviceKey, Observation] = field(default_factory=dict)


def _parse_pod(pod: Mapping[str, Any]) -> _Pod:
    meta, status = _meta(pod), _dict(pod.get("status"))
    special = extended_resource_claim(pod)
    entries: list[tuple[str, str, list[tuple[str, Health, str]]]] = []
    for cs in [
        *_dicts(status.get("initContainerStatuses")),
        *_dicts(status.get("containerStatuses")),
    ]:
        for entry in _dicts(cs.get("allocatedResourcesStatus")):
            name = str(entry.get("name") or "")
            parsed = parse_entry_name(name)
            if parsed is None and special is not None:
                # an extended resource the special claim serves for this container
                request = special.entry_request(str(cs.get("name") or ""), name)
                parsed = None if request is None else (EXTENDED_RESOURCES_REF, request)
            if parsed is None:
                continue
            resources = [
                (
                    str(r.get("resourceID") or ""),
                    _health(r.get("health")),
                    str(r.get("message") or ""),
                )
                for r in _dicts(entry.get("resources"))
            ]
            entries.append((parsed[0], parsed[1], resources))
    return _Pod(
        namespace=str(meta.get("namespace") or DEFAULT_NAMESPACE),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        node=str(_dict(pod.get("spec")).get("nodeName") or ""),
        live=not meta.get("deletionTimestamp") and status.get("phase") not in _ENDED,
        claims=pod_claim_names(pod),
        entries=entries,
    )


def _parse_claim(claim: Mapping[str, Any]) -> _Claim:
    status = _dict(claim.get("status"))
    alloc = _dict(status.get("allocation"))
    results = tuple(
        (
            str(r.get("request") or ""),
            DeviceKey(str(r.get("driver")), str(r.get("pool")), str(r.get("device"))),
        )
        for r in _dicts(_dict(alloc.get("devices")).get("results"))
    )
    reserved = tuple(
        (str(r.get("resource") or ""), str(r.get("name") or ""), str(r.get("uid") or ""))
        for r in _dicts(status.get("reservedFor"))
    )
    return _Claim(results, reserved, {"spec": _dict(claim.get("spec"))}, claim_observations(claim))


def _parse_slice(name: str, obj: Mapping[str, Any]) -> _Slice:
    spec = _dict(obj.get("spec"))
    driver = str(spec.get("driver") or "")
    pool = str(_dict(spec.get("pool")).get("name") or "")
    node = str(spec.get("nodeName") or "")
    devices: dict[DeviceKey, tuple[DeviceFacts, tuple[DeviceTaint, ...]]] = {}
    for d in _dicts(spec.get("devices")):
        if not d.get("name"):
            continue
        key = DeviceKey(driver, pool, str(d["name"]))
        facts = DeviceFacts(driver, pool, key.device, node, device_attributes(d))
        source = f"resourceslice/{name}"
        devices[key] = (facts, tuple(_taint(t, source) for t in _dicts(d.get("taints"))))
    return _Slice(node, devices)


def _parse_rule(name: str, obj: Mapping[str, Any]) -> _Rule:
    spec = _dict(obj.get("spec"))
    raw_sel = spec.get("deviceSelector")
    selector = raw_sel if isinstance(raw_sel, dict) else None
    exact = None
    if selector is not None and all(selector.get(f) for f in ("driver", "pool", "device")):
        exact = DeviceKey(str(selector["driver"]), str(selector["pool"]), str(selector["device"]))
    return _Rule(selector, _taint(_dict(spec.get("taint")), f"devicetaintrule/{name}"), exact)


# --------------------------------------------------------------------------- the model


class ClusterModel:
    """See the module docstring.

    ``records_namespace`` is where the node agents write their device-health records;
    ConfigMaps elsewhere, or not following the convention, are ignored.
    """

    def __init__(self, *, records_namespace: str = DEFAULT_NAMESPACE) -> None:
        self.records_namespace = records_namespace
        self.nodes: dict[str, Mapping[str, str]] = {}  # node -> labels
        self._slices: dict[str, _Slice] = {}
        self._device_slices: dict[DeviceKey, set[str]] = {}
        self._rules: dict[str, _Rule] = {}
        self._exact_rules: dict[DeviceKey, set[str]] = {}
        self._wild_rules: set[str] = set()
        self._claims: dict[ObjKey, _Claim] = {}
        self._device_claims: dict[DeviceKey, set[ObjKey]] = {}
        self._pods: dict[ObjKey, _Pod] = {}
        self._claim_pods: dict[ObjKey, set[ObjKey]] = {}  # claim -> pods that name it
        self._uids: dict[ObjKey, str] = {}
        self._pod_obs: dict[DeviceKey, dict[ObjKey, Observation]] = {}
        self._claim_obs: dict[DeviceKey, dict[ObjKey, Observation]] = {}
        self._records: dict[ObjKey, dict[DeviceKey, Observation]] = {}
        self._record_obs: dict[DeviceKey, dict[ObjKey, Observation]] = {}
        self._changed: set[DeviceKey] = set()
        self._gone: list[str] = []

    # -- input ---------------------------------------------------------------------

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (``ADDED``, ``MODIFIED`` or ``DELETED``) of a ``kind`` in
        :data:`KINDS`; ``obj`` is the object as a dict and is not kept."""
        deleted = event_type == "DELETED"
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            raise ValueError(f"unknown event type {event_type!r}")
        key = _key(obj)
        if kind == "Pod":
            self._set_pod(key, None if deleted else obj)
        elif kind == "ResourceClaim":
            self._set_claim(key, None if deleted else _parse_claim(obj))
        elif kind == "ResourceSlice":
            self._set_slice(key[1], None if deleted else _parse_slice(key[1], obj))
        elif kind == "DeviceTaintRule":
            self._set_rule(key[1], None if deleted else _parse_rule(key[1], obj))
        elif kind == "ConfigMap":
            ours = not deleted and is_agent_record(obj, self.records_namespace)
            self._set_record(key, decode_devices(obj) if ours else None)
        elif kind == "Node":
            if deleted:
                self.nodes.pop(key[1], None)
            else:
                labels = _dict(_meta(obj).get("labels"))
                self.nodes[key[1]] = {str(k): str(v) for k, v in labels.items()}
        else:
            raise ValueError(f"unknown kind {kind!r}")

    def _set_slice(self, name: str, new: _Slice | None) -> None:
        old = self._slices.pop(name, None)
        if new is not None:
            self._slices[name] = new
        for key in set(old.devices if old else ()) | set(new.devices if new else ()):
            was = old.devices.get(key) if old else None
            now = new.devices.get(key) if new else None
            holders = self._device_slices.setdefault(key, set())
            if now is None:
                holders.discard(name)
                if not holders:
                    del self._device_slices[key]
            else:
                holders.add(name)
            if was is None or now is None or was[0] != now[0]:
                self._changed.add(key)

    def _set_rule(self, name: str, new: _Rule | None) -> None:
        old = self._rules.pop(name, None)
        if old is not None:
            if old.exact is None:
                self._wild_rules.discard(name)
            else:
                names = self._exact_rules[old.exact]
                names.discard(name)
                if not names:
                    del self._exact_rules[old.exact]
        if new is None:
            return
        self._rules[name] = new
        if new.exact is None:
            self._wild_rules.add(name)
        else:
            self._exact_rules.setdefault(new.exact, set()).add(name)

    def _set_claim(self, key: ObjKey, new: _Claim | None) -> None:
        old = self._claims.pop(key, None)
        if new is not None:
            self._claims[key] = new
        for _req, dev in old.results if old else ():
            claims = self._device_claims.get(dev)
            if claims is not None:
                claims.discard(key)
                if not claims:
                    del self._device_claims[dev]
        for _req, dev in new.results if new else ():
            self._device_claims.setdefault(dev, set()).add(key)
        self._observe_claim(key, old.observed if old else {}, new.observed if new else {})
        if (old.results if old else ()) != (new.results if new else ()):
            for pod_key in sorted(self._claim_pods.get(key, ())):
                self._observe_pod(pod_key)

    def _observe_claim(
        self,
        key: ObjKey,
        old: Mapping[DeviceKey, Observation],
        new: Mapping[DeviceKey, Observation],
    ) -> None:
        for dev in old.keys() | new.keys():
            if old.get(dev) == new.get(dev):
                continue
            by_claim = self._claim_obs.setdefault(dev, {})
            if dev in new:
                by_claim[key] = new[dev]
            else:
                by_claim.pop(key, None)
                if not by_claim:
                    del self._claim_obs[dev]
            self._changed.add(dev)

    def _set_pod(self, key: ObjKey, obj: Mapping[str, Any] | None) -> None:
        old = self._pods.pop(key, None)
        if old is not None:
            for claim in set(old.claims.values()):
                pods = self._claim_pods.get((old.namespace, claim))
                if pods is not None:
                    pods.discard(key)
                    if not pods:
                        del self._claim_pods[(old.namespace, claim)]
        if obj is None:
            if old is not None:
                self._forget_observed(key, old)
                uid = self._uids.pop(key, "")
                if uid:
                    self._gone.append(uid)
            return
        pod = _parse_pod(obj)
        if old is not None:
            pod.observed = old.observed
        self._pods[key] = pod
        if old is not None and old.uid and old.uid != pod.uid:
            self._gone.append(old.uid)
        self._uids[key] = pod.uid
        for claim in set(pod.claims.values()):
            self._claim_pods.setdefault((pod.namespace, claim), set()).add(key)
        self._observe_pod(key)

    def _forget_observed(self, key: ObjKey, pod: _Pod) -> None:
        for dev in pod.observed:
            by_pod = self._pod_obs.get(dev)
            if by_pod is not None:
                by_pod.pop(key, None)
                if not by_pod:
                    del self._pod_obs[dev]
            self._changed.add(dev)
        pod.observed = {}

    def _observe_pod(self, key: ObjKey) -> None:
        """Recompute what a pod's status says per device (its claims may have changed)."""
        pod = self._pods[key]
        seen: dict[DeviceKey, Observation] = {}
        for ref, request, resources in pod.entries:
            claim = self._claims.get((pod.namespace, pod.claims.get(ref, "")))
            if claim is None:
                continue
            candidates = [
                dev for req, dev in claim.results
                if not request or req == request or req.startswith(request + "/")
            ]  # fmt: skip
            for resource_id, health, message in resources:
                dev = resolve_resource(resource_id, candidates)
                if dev is None:
                    continue
                obs = Observation(health, message, pod.node, "pod")
                held = seen.get(dev)
                if held is None or health.severity > held.health.severity:
                    seen[dev] = obs
        if seen == pod.observed:
            return
        for dev in pod.observed.keys() - seen.keys():
            by_pod = self._pod_obs[dev]
            del by_pod[key]
            if not by_pod:
                del self._pod_obs[dev]
            self._changed.add(dev)
        for dev, obs in seen.items():
            if pod.observed.get(dev) != obs:
                self._pod_obs.setdefault(dev, {})[key] = obs
                self._changed.add(dev)
        pod.observed = seen

    def _set_record(self, key: ObjKey, devices: dict[DeviceKey, Observation] | None) -> None:
        old = self._records.pop(key, None) or {}
        new = devices or {}
        if devices is not None:
            self._records[key] = devices
        for dev in old.keys() | new.keys():
            if old.get(dev) == new.get(dev):
                continue
            by_record = self._record_obs.setdefault(dev, {})
            if dev in new:
                by_record[key] = new[dev]
            else:
                by_record.pop(key, None)
                if not by_record:
                    del self._record_obs[dev]
            self._changed.add(dev)

    # -- output: per device ----------------------------------------------------------

    def take_changed(self) -> set[DeviceKey]:
        """Devices whose observation or facts may have changed since the last call."""
        changed, self._changed = self._changed, set()
        return changed

    def take_gone_pods(self) -> list[str]:
        """UIDs of pods deleted (or replaced by a new incarnation) since the last call."""
        gone, self._gone = self._gone, []
        return gone

    def observation(self, key: DeviceKey) -> Observation | None:
        """The device's health as the module docstring says, ``None`` if nobody reports."""
        records = self._record_obs.get(key)
        if records:
            return records[max(records)]
        best: tuple[tuple[int, ObjKey], Observation] | None = None
        for rank, by_key in enumerate((self._pod_obs.get(key), self._claim_obs.get(key))):
            for obj_key, obs in (by_key or {}).items():
                order = (rank, obj_key)
                if (
                    best is None
                    or obs.health.severity > best[1].health.severity
                    or (obs.health.severity == best[1].health.severity and order < best[0])
                ):
                    best = (order, obs)
        return None if best is None else best[1]

    def pod_observations(self, namespace: str, name: str) -> dict[DeviceKey, Observation]:
        """What one pod's status says per device (worst entry per device)."""
        pod = self._pods.get((namespace, name))
        return {} if pod is None else dict(pod.observed)

    def facts(self, key: DeviceKey) -> DeviceFacts | None:
        """Driver, pool, node and attributes from the device's ResourceSlice."""
        names = self._device_slices.get(key)
        if not names:
            return None
        return self._slices[max(names)].devices[key][0]

    def consumers(self, key: DeviceKey) -> list[Consumer]:
        """Live pods whose allocated claims hold the device, sorted."""
        out: set[Consumer] = set()
        for claim_key in self._device_claims.get(key, ()):
            claim = self._claims[claim_key]
            requests = [req for req, dev in claim.results if dev == key]
            for pod_key in self._claim_pods.get(claim_key, ()):
                pod = self._pods[pod_key]
                if not pod.live:
                    continue
                special = pod.claims.get(EXTENDED_RESOURCES_REF) == claim_key[1]
                for request in requests:
                    who = (pod.namespace, pod.name, pod.uid, pod.node)
                    out.add(Consumer(*who, claim_key[1], request, special))
        return sorted(out)

    def claims_holding(self, key: DeviceKey) -> list[ObjKey]:
        """(namespace, name) of every claim whose allocation holds the device, sorted."""
        return sorted(self._device_claims.get(key, ()))

    def taints(self, key: DeviceKey) -> list[DeviceTaint]:
        """Rule taints (by rule name) then slice taints on the device."""
        out: list[DeviceTaint] = []
        names = self._exact_rules.get(key, set()) | {
            n for n in self._wild_rules
            if selects(self._rules[n].selector, key.driver, key.pool, key.device)
        }  # fmt: skip
        out += [self._rules[n].taint for n in sorted(names)]
        for name in sorted(self._device_slices.get(key, ())):
            out += self._slices[name].devices[key][1]
        return out

    def tolerations(self, claim: ObjKey, request: str) -> list[Any]:
        """The tolerations of ``request`` in the claim (none if the claim is unknown)."""
        c = self._claims.get(claim)
        return [] if c is None else request_tolerations(c.raw, request)

    def evictions(
        self, key: DeviceKey, taint: Taint, added: float | None, now: float
    ) -> tuple[list[Consumer], float | None]:
        """The consumers a NoExecute ``taint`` on the device (added at ``added``, unix
        time) makes leave by ``now``, and the next time another one falls due."""
        out: list[Consumer] = []
        later: float | None = None
        for pod in self.consumers(key):
            due = eviction_due(
                taint, self.tolerations((pod.namespace, pod.claim), pod.request), added
            )
            if due is None:
                continue
            if due == NOW or due <= now:
                out.append(pod)
            elif later is None or due < later:
                later = due
        return out, later

    # -- output: whole cluster (for views) ---------------------------------------------

    def devices(self) -> list[DeviceKey]:
        """Every device a ResourceSlice lists, sorted."""
        return sorted(self._device_slices)

    def observations(self) -> dict[DeviceKey, Observation]:
        """Every device somebody reports on, with :meth:`observation`."""
        out: dict[DeviceKey, Observation] = {}
        for key in sorted(self._pod_obs.keys() | self._claim_obs.keys() | self._record_obs.keys()):
            obs = self.observation(key)
            if obs is not None:
                out[key] = obs
        return out

    def all_facts(self) -> dict[DeviceKey, DeviceFacts]:
        out: dict[DeviceKey, DeviceFacts] = {}
        for key in self.devices():
            f = self.facts(key)
            if f is not None:
                out[key] = f
        return out

    def all_consumers(self) -> dict[DeviceKey, list[Consumer]]:
        out: dict[DeviceKey, list[Consumer]] = {}
        for key in sorted(self._device_claims):
            users = self.consumers(key)
            if users:
                out[key] = users
        return out

    def all_taints(self) -> dict[DeviceKey, list[DeviceTaint]]:
        """Taints per device, for every device a slice lists or a rule names exactly."""
        out: dict[DeviceKey, list[DeviceTaint]] = {}
        for key in sorted(self._device_slices.keys() | self._exact_rules.keys()):
            taints = self.taints(key)
            if taints:
                out[key] = taints
        return out

    def reserved_for(self, claim: ObjKey) -> list[tuple[str, str, str]]:
        """``(resource, name, uid)`` of each consumer a claim's ``reservedFor`` lists."""
        c = self._claims.get(claim)
        return [] if c is None else list(c.reserved_for)

    def snapshot(self) -> JSON:
        """Everything the model answers, as comparable plain data (for tests)."""
        return {
            "observations": self.observations(),
            "facts": self.all_facts(),
            "consumers": self.all_consumers(),
            "taints": self.all_taints(),
            "nodes": dict(self.nodes),
        }


def build(objects: Iterable[tuple[str, Mapping[str, Any]]], **kwargs: Any) -> ClusterModel:
    """A model of ``(kind, object)`` pairs, each applied as ADDED."""
    model = ClusterModel(**kwargs)
    for kind, obj in objects:
        model.apply(kind, "ADDED", obj)
    return model
