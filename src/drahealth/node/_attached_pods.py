"""Health of attached devices on the pods that use them, beside the kubelet's fields.

Owns :class:`PodDeviceHealth`: which pods of this node use devices of the drivers the
agent attaches sources to, and what those pods are told:

* an Event on the pod for each health transition of one of its devices (the agent's
  :class:`~drahealth.node._events.EventRecorder`, the wording of stream health), unless
  the agent's mode already records it for that pod (``covered``: the kubelet mode for
  claims it prepared, the observer for pods the kubelet's PodResources lists);
* the pod condition :data:`~drahealth.core.POD_CONDITION_TYPE`
  (``drahealth.io/DeviceHealthy``), written by a strategic-merge patch of
  ``pods/status`` that carries that one condition and nothing else: conditions merge
  by ``type``, so the patch cannot touch ``allocatedResourcesStatus``, the phase,
  container statuses or another condition, and the kubelet, which keeps the conditions
  it does not own when it writes status (upstream ``mergePodStatus``), never removes
  it. Written only when it differs from what the pod shows (the transition time alone
  does not count); put back when something removed it.

Pods come from a reflector of this node's pods (``spec.nodeName``); a pod's devices from
its ResourceClaims' allocations (read once per claim, cached, at most
:data:`MAX_CLAIMS`); health from the agent's health cache. A pod whose claims are not
named or allocated yet is looked at again with capped backoff. Ended (Succeeded,
Failed) and terminating pods are left as they are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from drahealth._aio import cancel_and_wait
from drahealth._time import now_rfc3339
from drahealth.core import (
    EXTENDED_RESOURCES_REF,
    POD_CONDITION_TYPE,
    DeviceKey,
    Health,
    HealthChange,
    pod_claim_names,
    pod_condition,
    pod_condition_differs,
)
from drahealth.kube import Reflector, as_dict, is_not_found, patch_status, status_code
from drahealth.node._events import EventRecorder

__all__ = ["MAX_CLAIMS", "Covered", "PodDeviceHealth"]

log = logging.getLogger(__name__)

#: Allocated claims whose devices are kept (least recently used dropped first).
MAX_CLAIMS = 4096
#: Seconds before a pod whose claims are not allocated yet is looked at again (doubling).
RETRY_FIRST = 1.0
RETRY_MAX = 60.0
#: Seconds one claim read or one status patch may take.
CALL_TIMEOUT = 5.0

#: ``covered(device, namespace, pod name, pod uid)``: the agent's mode already records
#: this device's health Events on this pod.
Covered = Callable[[DeviceKey, str, str, str], bool]


def _uid(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("uid") or "") if isinstance(meta, Mapping) else ""


def _conditions(obj: Mapping[str, Any]) -> list[Any]:
    status = obj.get("status")
    found = status.get("conditions") if isinstance(status, Mapping) else None
    return found if isinstance(found, list) else []


def _ours(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in _conditions(obj):
        if isinstance(c, Mapping) and c.get("type") == POD_CONDITION_TYPE:
            return c
    return None


def _live(obj: Mapping[str, Any]) -> bool:
    meta = obj.get("metadata")
    status = obj.get("status")
    if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
        return False
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return phase not in ("Succeeded", "Failed")


def _claim_refs(obj: Mapping[str, Any]) -> int:
    spec = obj.get("spec")
    refs = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    return len(refs) if isinstance(refs, list) else 0


class PodDeviceHealth:
    """See the module docstring.

    ``drivers``: the watched drivers; ``health(key)``: a device's health and message
    now (the agent's health cache); ``ready(driver)``: whether the driver's attached
    sources have reported yet (no condition is written before, so a restart does not
    flash every pod Unknown).
    """

    def __init__(
        self,
        client: AsyncClient,
        node: str,
        drivers: frozenset[str],
        health: Callable[[DeviceKey], tuple[Health, str]],
        events: EventRecorder,
        *,
        ready: Callable[[str], bool] = lambda _driver: True,
        covered: Covered | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.node = node
        self.drivers = drivers
        self._health = health
        self._ready = ready
        self._covered = covered
        self._events = events
        self._clock = clock
        self.pods: Reflector[Pod] = Reflector(
            client, Pod, fields={"spec.nodeName": node}, name="attach-pods"
        )
        self.pods.add_handler(self._on_pod_event)
        #: pod uid -> (namespace, name)
        self._refs: dict[str, tuple[str, str]] = {}
        #: pod uid -> its devices of watched drivers
        self._devices: dict[str, tuple[DeviceKey, ...]] = {}
        self._by_device: dict[DeviceKey, set[str]] = {}
        #: (namespace, claim) -> (claim uid, devices of watched drivers), allocated only
        self._claims: OrderedDict[tuple[str, str], tuple[str, tuple[DeviceKey, ...]]] = (
            OrderedDict()
        )
        self._dirty: dict[str, None] = {}  # an ordered set of pod uids
        self._retry: dict[str, float] = {}  # pod uid -> its next retry delay
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Counters for metrics and tests.
        self.conditions_written = 0
        self.patch_failures = 0
        self.claim_reads = 0
        self.events_sent = 0

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        await self.pods.start()
        self._task = asyncio.create_task(self._worker(), name="attach-pod-health")

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        await cancel_and_wait([t for t in (self._task,) if t is not None])
        self._task = None
        await self.pods.stop()

    # -- inputs --------------------------------------------------------------------

    def pods_using(self, key: DeviceKey) -> list[tuple[str, str]]:
        """(namespace, name) of the live pods known to use ``key``, sorted."""
        return sorted(self._refs[u] for u in self._by_device.get(key, ()) if u in self._refs)

    def mark_driver(self, driver: str) -> None:
        """Look at every pod using a device of ``driver`` again (it became ready)."""
        for key, uids in self._by_device.items():
            if key.driver == driver:
                for uid in uids:
                    self._mark(uid)

    def on_changes(self, changes: list[HealthChange]) -> None:
        """Health pipeline listener: Events for transitions, conditions to recompute."""
        for change in changes:
            key = change.key
            if key.driver not in self.drivers:
                continue
            for uid in sorted(self._by_device.get(key, ())):
                ref = self._refs.get(uid)
                if ref is None:
                    continue
                self._mark(uid)
                if change.old is change.new:
                    continue
                namespace, name = ref
                if self._covered is not None and self._covered(key, namespace, name, uid):
                    continue
                meta = {"name": name, "namespace": namespace, "uid": uid}
                self._events.device_health({"metadata": meta}, change)
                self.events_sent += 1

    def _on_pod_event(self, event_type: str, pod: Pod, _old: Pod | None) -> None:
        meta = pod.metadata
        uid = str(meta.uid or "") if meta is not None else ""
        if not uid or meta is None:
            return
        status = pod.status
        claims = bool(pod.spec and pod.spec.resourceClaims) or bool(
            status is not None and getattr(status, "extendedResourceClaimStatus", None)
        )
        if event_type == "DELETED" or not claims:
            if uid in self._refs:
                self._forget(uid)
            return  # a pod without claims uses no device: nothing to look at
        self._refs[uid] = (meta.namespace or "default", meta.name or "")
        self._mark(uid)

    def _mark(self, uid: str) -> None:
        self._dirty[uid] = None
        self._wake.set()

    def _forget(self, uid: str) -> None:
        self._refs.pop(uid, None)
        self._dirty.pop(uid, None)
        self._retry.pop(uid, None)
        timer = self._timers.pop(uid, None)
        if timer is not None:
            timer.cancel()
        self._set_devices(uid, ())

    def _set_devices(self, uid: str, devices: tuple[DeviceKey, ...]) -> None:
        old = self._devices.pop(uid, ())
        for key in old:
            users = self._by_device.get(key)
            if users is not None:
                users.discard(uid)
                if not users:
                    del self._by_device[key]
        if devices:
            self._devices[uid] = devices
            for key in devices:
                self._by_device.setdefault(key, set()).add(uid)

    def _schedule_retry(self, uid: str) -> None:
        delay = self._retry.get(uid, RETRY_FIRST)
        self._retry[uid] = min(delay * 2, RETRY_MAX)
        old = self._timers.pop(uid, None)
        if old is not None:
            old.cancel()

        def fire() -> None:
            self._timers.pop(uid, None)
            if uid in self._refs:
                self._mark(uid)

        self._timers[uid] = asyncio.get_running_loop().call_later(delay, fire)

    # -- the worker ----------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                uid = next(iter(self._dirty))
                del self._dirty[uid]
                try:
                    await self._reconcile(uid)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("device health condition of pod %s: %s", self._name(uid), exc)
                    self._schedule_retry(uid)

    def _name(self, uid: str) -> str:
        ns, name = self._refs.get(uid, ("?", uid))
        return f"{ns}/{name}"

    async def _reconcile(self, uid: str) -> None:
        ref = self._refs.get(uid)
        if ref is None:
            return
        namespace, name = ref
        pod = self.pods.store.get(namespace, name)
        if pod is None:
            return
        obj = as_dict(pod)
        if _uid(obj) != uid:
            return  # replaced by a pod of the same name: its own events handle it
        if not _live(obj):
            self._set_devices(uid, ())
            return
        names = pod_claim_names(obj)
        complete = len([r for r in names if r != EXTENDED_RESOURCES_REF]) >= _claim_refs(obj)
        devices: list[DeviceKey] = []
        for claim in sorted(set(names.values())):
            found = await self._claim_devices(namespace, claim)
            if found is None:
                complete = False
            else:
                devices.extend(found)
        keys = tuple(sorted(set(devices)))
        self._set_devices(uid, keys)
        if not complete:
            self._schedule_retry(uid)
        else:
            self._retry.pop(uid, None)
        if not keys or not all(self._ready(k.driver) for k in keys):
            return
        current = _ours(obj)
        rows = [(k, *self._health(k)) for k in keys]
        desired = pod_condition(rows, current, now_rfc3339())
        if not pod_condition_differs(current, desired):
            return
        await self._write(namespace, name, uid, desired)

    async def _claim_devices(self, namespace: str, claim: str) -> tuple[DeviceKey, ...] | None:
        """The claim's allocated devices of watched drivers; None when it is not there
        or not allocated yet."""
        held = self._claims.get((namespace, claim))
        if held is not None:
            self._claims.move_to_end((namespace, claim))
            return held[1]
        self.claim_reads += 1
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                obj = await self.client.get(ResourceClaim, claim, namespace=namespace)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not is_not_found(exc):
                log.debug("reading claim %s/%s failed: %s", namespace, claim, exc)
            return None
        data = as_dict(obj)
        status = data.get("status") or {}
        allocation = status.get("allocation") if isinstance(status, Mapping) else None
        if not isinstance(allocation, Mapping):
            return None
        results = (allocation.get("devices") or {}).get("results") or []
        found: list[DeviceKey] = []
        for r in results if isinstance(results, list) else []:
            if not isinstance(r, Mapping):
                continue
            driver, pool, device = r.get("driver"), r.get("pool"), r.get("device")
            if driver in self.drivers and isinstance(pool, str) and isinstance(device, str):
                found.append(DeviceKey(str(driver), pool, device))
        devices = tuple(sorted(set(found)))
        self._claims[(namespace, claim)] = (_uid(data), devices)
        while len(self._claims) > MAX_CLAIMS:
            self._claims.popitem(last=False)
        return devices

    async def _write(self, namespace: str, name: str, uid: str, condition: dict[str, Any]) -> None:
        body = {"status": {"conditions": [condition]}}
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                await patch_status(
                    self.client, Pod, name, body, namespace=namespace,
                    patch_type=PatchType.STRATEGIC,
                )  # fmt: skip
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.patch_failures += 1
            if is_not_found(exc):
                self._forget(uid)
                return
            if status_code(exc) == 422:
                log.warning("pod %s/%s refused condition %s: %s", namespace, name,
                            POD_CONDITION_TYPE, exc)  # fmt: skip
                return
            raise
        self.conditions_written += 1
