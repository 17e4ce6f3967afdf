"""Mode ``quarantine``: one bad device fenced, without a DeviceTaintRule API.

Owns the quarantine ResourceClaims: for each bad device, one ResourceClaim in the
controller's namespace that the controller itself allocates to exactly that device
(``status.allocation``) and reserves for a non-pod consumer
(``drahealth.io/devicequarantines``), so that

* the scheduler counts the device as in use and allocates the node's other devices
  (Kubernetes 1.34 on: every release serves ``resource.k8s.io/v1`` ResourceClaims);
* the resourceclaim controller keeps the allocation (it only prunes ``reservedFor``
  entries of pods, and deallocates only claims nobody reserves);
* no kubelet prepares it (no pod references it).

A device another claim holds is never taken: the claim waits until the other claims
let go (the NoExecute eviction moves their pods), said once. Release is a status write
that clears the allocation, then the delete: the scheduler retries pods that wait for a
device on a deallocation, not on a delete (a plain delete leaves them Pending until its
periodic retry, minutes later). Each claim carries the device and why in the annotation
``drahealth.io/quarantine`` (the same fields a Node lists in node-taint mode), from
which a restarted controller resumes; claims without the controller's label are never
touched. :func:`claim_name`, :func:`claim_body`, :func:`allocation` and
:func:`read_claim` are pure; :class:`QuarantineWriter` does the I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from drahealth.core import DeviceKey
from drahealth.kube import Backoff, as_dict, is_not_found, resource_class
from drahealth.remedy._nodes import NodeDevice, device_row
from drahealth.remedy._rules import CONTROLLER_LABEL, MANAGED_BY

__all__ = [
    "ANNOTATION_QUARANTINE",
    "CONSUMER_GROUP",
    "CONSUMER_RESOURCE",
    "OPERATOR_MANAGED_BY",
    "OPERATOR_PREFIX",
    "QUARANTINE_MODE",
    "QuarantineWriter",
    "allocation",
    "claim_body",
    "claim_name",
    "is_quarantine",
    "quarantine_claim_name",
    "read_claim",
]

log = logging.getLogger(__name__)

QUARANTINE_MODE: Final = "quarantine"
ANNOTATION_QUARANTINE: Final = "drahealth.io/quarantine"
#: An operator's quarantine (``drahealth taint`` where no DeviceTaintRule API is served):
#: the controller never releases it; ``drahealth untaint`` does.
OPERATOR_MANAGED_BY: Final = "drahealth-operator"
PREFIX: Final = "drahealth-quarantine-"
OPERATOR_PREFIX: Final = "drahealth-operator-quarantine-"
CONSUMER_GROUP: Final = "drahealth.io"
CONSUMER_RESOURCE: Final = "devicequarantines"
#: The one request of a quarantine claim; its class is never used to allocate.
REQUEST: Final = "device"
DEVICE_CLASS: Final = "drahealth-quarantine"
#: At most this many quarantine claims (the breaker's limits come first).
MAX_CLAIMS: Final = 4096
JSON = dict[str, Any]

ResourceClaim = resource_class("ResourceClaim", "v1")
_NOT_NAME = re.compile(r"[^a-z0-9-]+")


def claim_name(key: DeviceKey, *, operator: bool = False) -> str:
    """``drahealth-quarantine-<device>-<hash>`` (an operator's:
    ``drahealth-operator-quarantine-...``): stable per device, a valid object name."""
    digest = hashlib.sha256(str(key).encode()).hexdigest()[:10]
    device = _NOT_NAME.sub("-", key.device.lower()).strip("-")[:30].strip("-") or "device"
    return f"{OPERATOR_PREFIX if operator else PREFIX}{device}-{digest}"


#: :func:`claim_name` under the name the package exports it by.
quarantine_claim_name = claim_name


def _manager(operator: bool) -> str:
    return OPERATOR_MANAGED_BY if operator else CONTROLLER_LABEL


def claim_body(device: NodeDevice, namespace: str, *, operator: bool = False) -> JSON:
    """The quarantine claim (spec and metadata) for ``device``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": claim_name(device.device, operator=operator),
            "namespace": namespace,
            "labels": {MANAGED_BY: _manager(operator)},
            "annotations": {ANNOTATION_QUARANTINE: json.dumps(device.as_json())},
        },
        "spec": {
            "devices": {
                "requests": [
                    {"name": REQUEST, "exactly": {"deviceClassName": DEVICE_CLASS}},
                ]
            }
        },
    }


def allocation(key: DeviceKey, claim_uid: str, *, operator: bool = False) -> JSON:
    """The status that makes ``key`` in use: allocated to the claim, reserved for it
    (no node selector: no pod ever runs with it)."""
    alloc: JSON = {
        "devices": {
            "results": [
                {"request": REQUEST, "driver": key.driver, "pool": key.pool, "device": key.device}
            ]
        }
    }
    consumer = {
        "apiGroup": CONSUMER_GROUP,
        "resource": CONSUMER_RESOURCE,
        "name": claim_name(key, operator=operator),
        "uid": claim_uid,
    }
    return {"allocation": alloc, "reservedFor": [consumer]}


def is_quarantine(obj: Mapping[str, Any], *, operator: bool = False) -> bool:
    """Whether ``obj`` is a quarantine claim of the controller (or of an operator)."""
    meta = obj.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return False
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return (
        isinstance(labels, Mapping)
        and labels.get(MANAGED_BY) == _manager(operator)
        and isinstance(annotations, Mapping)
        and ANNOTATION_QUARANTINE in annotations
    )


def read_claim(obj: Mapping[str, Any], *, operator: bool = False) -> tuple[NodeDevice, bool] | None:
    """(the device a quarantine claim fences, whether it holds the allocation), or None
    for a claim that is not one of ours (the controller's, or an operator's) or cannot
    be read: its name must be the one :func:`claim_name` gives its device."""
    if not is_quarantine(obj, operator=operator):
        return None
    meta = obj.get("metadata") or {}
    try:
        row = json.loads(str(meta["annotations"][ANNOTATION_QUARANTINE]))
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    device = device_row(row, (QUARANTINE_MODE,)) if isinstance(row, dict) else None
    if device is None or meta.get("name") != claim_name(device.device, operator=operator):
        return None
    status = obj.get("status") or {}
    alloc = status.get("allocation") if isinstance(status, Mapping) else None
    devices = alloc.get("devices") if isinstance(alloc, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    held = isinstance(results, list) and any(
        isinstance(r, Mapping)
        and (r.get("driver"), r.get("pool"), r.get("device"))
        == (device.device.driver, device.device.pool, device.device.device)
        for r in results
    )
    return device, held


#: ``on_change(device, what, claim name)`` after a write that changed something.
ChangeSink = Callable[[NodeDevice, str, str], None]
#: ``busy(device)`` -> the other claims (``namespace/name``) that hold the device.
BusySource = Callable[[DeviceKey], list[str]]


@dataclass(slots=True)
class _Held:
    device: NodeDevice
    allocated: bool
    uid: str = ""  # the claim's uid once known: events of an older copy are not about it
    version: str = ""  # resourceVersion of the last write seen: older events are stale


class QuarantineWriter:
    """Keeps one allocated quarantine claim per wanted device, and none for the others."""

    def __init__(self, client: AsyncClient, namespace: str, *, on_change: ChangeSink) -> None:
        self.client = client
        self.namespace = namespace
        self._on_change = on_change
        self._written: dict[DeviceKey, _Held] = {}
        self._retry: dict[DeviceKey, tuple[float, Backoff]] = {}
        self._waiting: dict[DeviceKey, tuple[str, ...]] = {}  # said once per set of holders
        #: operators' quarantine claims not allocated yet (the device was in use when
        #: ``drahealth taint`` made them): device -> (its row, claim uid)
        self._operator: dict[DeviceKey, tuple[NodeDevice, str]] = {}
        self._operator_retry: dict[DeviceKey, tuple[float, Backoff]] = {}
        #: ``namespace/name`` of every operator quarantine claim seen (they fence, so the
        #: controller never waits for them), bounded
        self._operator_names: set[str] = set()
        self._over_cap: set[DeviceKey] = set()  # devices past MAX_CLAIMS, said once
        self.writes = 0

    async def load(self) -> dict[DeviceKey, NodeDevice]:
        """The controller's quarantine claims (one LIST of its namespace)."""
        found: dict[DeviceKey, NodeDevice] = {}
        labels: dict[str, Any] = {MANAGED_BY: CONTROLLER_LABEL}
        async for claim in self.client.list(ResourceClaim, namespace=self.namespace, labels=labels):
            read = read_claim(as_dict(claim))
            if read is None:
                continue
            device, held = read
            found[device.device] = device
            uid = str(getattr(claim.metadata, "uid", "") or "")
            version = str(getattr(claim.metadata, "resourceVersion", "") or "")
            self._written[device.device] = _Held(device, held, uid, version)
        labels = {MANAGED_BY: OPERATOR_MANAGED_BY}
        async for claim in self.client.list(ResourceClaim, namespace=self.namespace, labels=labels):
            self._observe_operator("ADDED", as_dict(claim))
        return found

    def written(self) -> dict[DeviceKey, NodeDevice]:
        """The devices whose quarantine claim holds the allocation now."""
        return {k: h.device for k, h in self._written.items() if h.allocated}

    def observe(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """A watch event of a ResourceClaim: someone else deleting or deallocating one of
        this writer's claims makes it fence the device again. True if that happened."""
        meta = obj.get("metadata") or {}
        if not isinstance(meta, Mapping) or meta.get("namespace") != self.namespace:
            return False
        self._observe_operator(event_type, obj)
        read = read_claim(obj)
        if read is None:
            return False
        device, held = read
        mine = self._written.get(device.device)
        if mine is None or not mine.allocated:
            return False
        uid = str(meta.get("uid") or "")
        if mine.uid and uid and uid != mine.uid:
            return False  # an older copy of the claim (a late event): not ours any more
        if _older(str(meta.get("resourceVersion") or ""), mine.version):
            return False  # from before our own last write (a late event)
        if event_type == "DELETED" or not held:
            log.warning(
                "quarantine claim %s/%s of %s was %s by someone else: fencing it again",
                self.namespace, claim_name(device.device), device.device,
                "deleted" if event_type == "DELETED" else "deallocated",
            )  # fmt: skip
            if event_type == "DELETED":
                del self._written[device.device]
            else:
                self._written[device.device] = _Held(mine.device, False, mine.uid)
            return True
        return False

    def _observe_operator(self, event_type: str, obj: Mapping[str, Any]) -> None:
        """Track the operators' quarantine claims that still wait for their device."""
        read = read_claim(obj, operator=True)
        if read is None:
            return
        device, held = read
        key = device.device
        ref = f"{self.namespace}/{claim_name(key, operator=True)}"
        if event_type == "DELETED":
            self._operator_names.discard(ref)
        elif len(self._operator_names) < MAX_CLAIMS:
            self._operator_names.add(ref)
        if event_type == "DELETED" or held:
            self._operator.pop(key, None)
            self._operator_retry.pop(key, None)
        elif key in self._operator or len(self._operator) < MAX_CLAIMS:
            uid = str((obj.get("metadata") or {}).get("uid") or "")
            self._operator[key] = (device, uid)

    def operator_claims(self) -> set[str]:
        """``namespace/name`` of the operators' quarantine claims seen (read and checked
        as such: a claim that is only named like one is not among them)."""
        return set(self._operator_names)

    def keeps(self, key: DeviceKey) -> bool:
        """Whether a quarantine claim exists (or is being written) for ``key``."""
        return key in self._written

    def claims(self) -> set[str]:
        """``namespace/name`` of every quarantine claim this writer keeps."""
        return {f"{self.namespace}/{claim_name(k)}" for k in self._written}

    def waiting(self) -> dict[DeviceKey, tuple[str, ...]]:
        """Wanted devices not yet fenced: the claims that still hold each."""
        return dict(self._waiting)

    async def sync(self, desired: Mapping[DeviceKey, NodeDevice], busy: BusySource) -> None:
        """Fence every device in ``desired`` that no other claim holds; release the rest."""
        now = time.monotonic()
        for key in sorted(desired.keys() | self._written.keys()):
            retry = self._retry.get(key)
            if retry is not None and retry[0] > now:
                continue
            want = desired.get(key)
            held = self._written.get(key)
            try:
                if want is None:
                    self._waiting.pop(key, None)
                    if held is not None:
                        await self._release(key, held)
                elif held is None or not held.allocated or not _same(held.device, want):
                    if len(self._written) >= MAX_CLAIMS and held is None:
                        if key not in self._over_cap:
                            self._over_cap.add(key)
                            what = f"not quarantined: {MAX_CLAIMS} quarantine claims exist already"
                            log.warning("%s: %s", key, what)
                            self._on_change(want, f"waiting: {what}", claim_name(key))
                        continue
                    self._over_cap.discard(key)
                    await self._fence(key, want, held, busy)
            except ApiError as exc:
                backoff = retry[1] if retry is not None else Backoff(1.0, 60.0)
                self._retry[key] = (now + backoff.next(), backoff)
                log.warning(
                    "quarantine claim %s/%s for %s: %s",
                    self.namespace, claim_name(key), key, exc.status.message,
                )  # fmt: skip
                continue
            self._retry.pop(key, None)
        await self._finish_operator_claims(busy, now)

    async def _finish_operator_claims(self, busy: BusySource, now: float) -> None:
        """Allocate each operator's waiting quarantine claim once no other claim holds
        its device (an operator's claim is never released here: ``untaint`` does)."""
        for key, (device, uid) in sorted(self._operator.items(), key=lambda kv: str(kv[0])):
            retry = self._operator_retry.get(key)
            if retry is not None and retry[0] > now:
                continue
            name = claim_name(key, operator=True)
            mine = {f"{self.namespace}/{name}", f"{self.namespace}/{claim_name(key)}"}
            if [c for c in busy(key) if c not in mine]:
                continue  # still in use: the next pass looks again
            try:
                await self.client.patch(
                    ResourceClaim.Status,
                    name,
                    {"status": allocation(key, uid, operator=True)},
                    namespace=self.namespace,
                    patch_type=PatchType.MERGE,
                )
            except ApiError as exc:
                if is_not_found(exc):
                    self._operator.pop(key, None)
                    continue
                backoff = retry[1] if retry is not None else Backoff(1.0, 60.0)
                self._operator_retry[key] = (now + backoff.next(), backoff)
                log.warning("operator quarantine claim %s/%s: %s", self.namespace, name,
                            exc.status.message)  # fmt: skip
                continue
            self._operator.pop(key, None)
            self._operator_retry.pop(key, None)
            self.writes += 1
            self._on_change(device, "quarantined: allocated to the operator's claim", name)

    async def _fence(
        self, key: DeviceKey, want: NodeDevice, held: _Held | None, busy: BusySource
    ) -> None:
        name = claim_name(key)
        ours = f"{self.namespace}/{name}"
        if held is not None and held.allocated:
            # fenced already: only the annotation (why, since) changes
            row = json.dumps(want.as_json())
            patch = {"metadata": {"annotations": {ANNOTATION_QUARANTINE: row}}}
            await self.client.patch(
                ResourceClaim, name, patch, namespace=self.namespace, patch_type=PatchType.MERGE
            )
            self._written[key] = _Held(want, True, held.uid)
            return
        holders = tuple(sorted(c for c in busy(key) if c != ours))
        if holders:
            if self._waiting.get(key) != holders:
                self._waiting[key] = holders
                what = f"waiting for claim(s) {', '.join(holders)} to release it"
                self._on_change(want, what, name)
            return
        self._waiting.pop(key, None)
        try:
            obj = as_dict(
                await self.client.create(ResourceClaim.from_dict(claim_body(want, self.namespace)))
            )
        except ApiError as exc:
            if exc.status.code != 409:
                raise
            obj = as_dict(await self.client.get(ResourceClaim, name, namespace=self.namespace))
            read = read_claim(obj)
            if read is None or read[0].device != key:
                raise  # someone else's claim with our name: never adopted
            if read[1]:  # ours, and it holds the device already (a lost answer, a late event)
                uid = str((obj.get("metadata") or {}).get("uid") or "")
                self._written[key] = _Held(read[0], True, uid)
                return
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        self._written[key] = _Held(want, False, uid)
        written = await self.client.patch(
            ResourceClaim.Status,
            name,
            {"status": allocation(key, uid)},
            namespace=self.namespace,
            patch_type=PatchType.MERGE,
        )
        version = str((as_dict(written).get("metadata") or {}).get("resourceVersion") or "")
        self._written[key] = _Held(want, True, uid, version)
        self.writes += 1
        self._on_change(want, "quarantined: allocated to its quarantine claim", name)

    async def _release(self, key: DeviceKey, held: _Held) -> None:
        name = claim_name(key)
        try:
            if held.allocated:
                # deallocate first: that (not the delete) makes the scheduler retry pods
                await self.client.patch(
                    ResourceClaim.Status,
                    name,
                    {"status": {"allocation": None, "reservedFor": None}},
                    namespace=self.namespace,
                    patch_type=PatchType.MERGE,
                )
                self._written[key] = _Held(held.device, False, held.uid)
            await self.client.delete(ResourceClaim, name, namespace=self.namespace)
        except ApiError as exc:
            if not is_not_found(exc):
                raise
        del self._written[key]
        self.writes += 1
        if held.allocated:
            what = "released: its quarantine claim is deallocated and deleted"
            self._on_change(held.device, what, name)


def _same(written: NodeDevice, want: NodeDevice) -> bool:
    """Whether the annotation says ``want`` already: compared as written (floats
    rounded), whoever wrote it (a new leader does not rewrite the provenance)."""
    mine = dataclasses.replace(want, by=written.by)
    return json.dumps(written.as_json(), sort_keys=True) == json.dumps(
        mine.as_json(), sort_keys=True
    )


def _older(version: str, than: str) -> bool:
    """Whether resourceVersion ``version`` is older than ``than``. The API server's are
    etcd revisions (decimal); anything else is never called older."""
    if not (version.isdigit() and than.isdigit()) or len(version) > 20 or len(than) > 20:
        return False
    return int(version) < int(than)
