"""ResourceSlice publisher: the async reconciler between a driver's devices and the API.

Owns the I/O half of ResourceSlice publishing for one driver on one node, modelled on
the upstream resourceslice controller (reference/driver-side.md 1.9): a single worker
task, a field-selector watch (``spec.driver``/``spec.nodeName``) through
:class:`drahealth.kube.Reflector`, a mutation cache against double creates,
precondition deletes, ``resourceVersion``-guarded updates, capped exponential
backoff, re-creation of slices deleted by someone else (after ``sync_delay``), the
Node owner reference, dropped-field detection, and error counters for metrics.

Device taints where the server has them: a server with the ``DRADeviceTaints`` gate
off (the default before Kubernetes 1.36) stores a slice without ``devices[].taints``
and says nothing. The publisher learns it from the object a write that carried taints
returns (:attr:`ResourceSlicePublisher.taints_kept`), logs it once, and from then on
publishes no taints (one write, no update loop); after the watch reconnects or
relists it checks again with the next write. ``withdraw_unhealthy`` leaves the
devices given to :meth:`~ResourceSlicePublisher.set_withdrawn` out of the slices
(``"auto"``: only while the server drops taints) until they are given back.

Planning (splitting, limits, generations, names, taint times) is pure and lives in
``_slices``; health taints come from ``_taints`` through :meth:`set_device_taints`.
May not touch: gRPC servers, health state, files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, get_args

import msgspec
from lightkube import AsyncClient
from lightkube.models.meta_v1 import OwnerReference
from lightkube.models.resource_v1 import DeviceTaint
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice

from drahealth._aio import cancel_and_wait
from drahealth.driver._slices import (
    DriverResources,
    PoolPlan,
    SliceContent,
    SliceValidationError,
    devices_equal,
    merge_taints,
    plan_pool,
    split_pool,
    strip_taints,
    without_devices,
)
from drahealth.kube import Backoff, Reflector, delete_with_preconditions, is_not_found, rv_newer

__all__ = [
    "DEFAULT_MUTATION_CACHE_TTL",
    "DEFAULT_SYNC_DELAY",
    "DEFAULT_TAINTS_RECHECK_INTERVAL",
    "WITHDRAW_MODES",
    "DroppedFieldsError",
    "ResourceSlicePublisher",
    "WithdrawMode",
]

log = logging.getLogger(__name__)

#: Delay between a watch event from someone else and the resync (upstream: 30 s).
DEFAULT_SYNC_DELAY = 1.0
#: How long a slice we wrote stands in for the watch's copy (upstream: 1 min).
DEFAULT_MUTATION_CACHE_TTL = 60.0

#: While the server drops device taints, how often the worker looks whether its watch
#: reconnected or relisted since (a reconnect may be an upgraded or reconfigured server).
DEFAULT_TAINTS_RECHECK_INTERVAL = 30.0
#: The feature gate without which the API server drops ResourceSlice device taints.
TAINTS_GATE = "DRADeviceTaints"

#: ``never``: always publish every device; ``auto``: leave devices given to
#: ``set_withdrawn`` out while the server drops device taints; ``always``: leave them out.
WithdrawMode = Literal["never", "auto", "always"]
WITHDRAW_MODES: tuple[str, ...] = get_args(WithdrawMode)

ErrorCallback = Callable[[BaseException], None]
TaintMap = Mapping[tuple[str, str], Sequence[DeviceTaint]]


class DroppedFieldsError(Exception):
    """The API server stored a slice without some fields we sent (feature disabled).

    Reported through the error callback once; the publisher then accepts what the
    server stored for that desired content instead of updating in a loop.
    """

    def __init__(self, pool: str, index: int, desired: ResourceSlice, actual: ResourceSlice):
        self.pool = pool
        self.index = index
        self.desired = desired
        self.actual = actual
        features = " ".join(self.disabled_features()) or "unknown"
        super().__init__(
            f"pool {pool!r}, slice #{index}: some fields were dropped by the API server, "
            f"probably because these features are disabled: {features}"
        )

    def disabled_features(self) -> list[str]:
        """Feature gates whose fields went missing (upstream ``DisabledFeatures``)."""
        want = self.desired.spec.devices or []
        have = self.actual.spec.devices or []
        pairs = list(zip(want, have, strict=False))
        out = []
        if any(len(a.taints or []) > len(b.taints or []) for a, b in pairs):
            out.append("DRADeviceTaints")
        if len(self.desired.spec.sharedCounters or []) > len(
            self.actual.spec.sharedCounters or []
        ) or any(len(a.consumesCounters or []) != len(b.consumesCounters or []) for a, b in pairs):
            out.append("DRAPartitionableDevices")
        if any(
            len(a.bindingConditions or []) != len(b.bindingConditions or [])
            or len(a.bindingFailureConditions or []) != len(b.bindingFailureConditions or [])
            for a, b in pairs
        ):
            out.append("DRADeviceBindingConditions")
        if any(
            a.allowMultipleAllocations is not None and b.allowMultipleAllocations is None
            for a, b in pairs
        ):
            out.append("DRAConsumableCapacity")
        return out


def strip_taints_of(obj: ResourceSlice) -> ResourceSlice:
    """A copy of ``obj`` whose devices carry no taints."""
    devices = [
        msgspec.structs.replace(d, taints=None) if d.taints else d for d in obj.spec.devices or ()
    ]
    spec = msgspec.structs.replace(obj.spec, devices=devices)
    return msgspec.structs.replace(obj, spec=spec)


def _fingerprint(content: SliceContent) -> bytes:
    return msgspec.json.encode(
        [
            [msgspec.to_builtins(d) for d in content.devices],
            [msgspec.to_builtins(c) for c in content.shared_counters],
        ]
    )


def _name(obj: ResourceSlice) -> str:
    return obj.metadata.name or "" if obj.metadata else ""


def _uid(obj: ResourceSlice) -> str:
    return obj.metadata.uid or "" if obj.metadata else ""


def _rv(obj: ResourceSlice) -> str | None:
    return obj.metadata.resourceVersion if obj.metadata else None


class ResourceSlicePublisher:
    """Keeps the ResourceSlices of ``driver_name`` on ``node_name`` equal to the
    last :meth:`publish` (plus health taints from :meth:`set_device_taints`).

    Both setters validate and split at once (raising :class:`SliceValidationError`
    for anything the API would reject) and return without I/O; one worker task,
    started on first use, does all API calls. Slices are owned by the Node (UID
    looked up once unless ``node_uid`` is given; without a Node, no owner, logged).

    Counters for metrics: ``publish_errors_total``, ``last_error``, ``slices``
    (slices currently published), ``creates``/``updates``/``deletes``, ``syncs``,
    ``taints_kept`` (``None`` until a write carrying taints showed it), ``withdrawn``
    (devices left out now).

    ``withdraw_unhealthy`` decides whether the devices given to :meth:`set_withdrawn`
    are left out of the slices: ``"never"`` (the default: a driver's devices are not
    hidden unless its author asks), ``"auto"`` only while the server drops device
    taints (the scheduler stops picking a bad device on a release without them, and
    nothing changes where taints work), ``"always"`` also where taints are kept.
    """

    def __init__(
        self,
        client: AsyncClient,
        driver_name: str,
        node_name: str,
        *,
        node_uid: str | None = None,
        sync_delay: float = DEFAULT_SYNC_DELAY,
        mutation_cache_ttl: float = DEFAULT_MUTATION_CACHE_TTL,
        backoff_initial: float = 0.2,
        backoff_max: float = 30.0,
        sync_timeout: float = 10.0,
        on_error: ErrorCallback | None = None,
        withdraw_unhealthy: WithdrawMode = "never",
        taints_recheck_interval: float = DEFAULT_TAINTS_RECHECK_INTERVAL,
    ) -> None:
        if not driver_name or not node_name:
            raise ValueError("driver_name and node_name are required")
        if withdraw_unhealthy not in WITHDRAW_MODES:
            raise ValueError(
                f"withdraw_unhealthy {withdraw_unhealthy!r}: choose one of "
                f"{', '.join(WITHDRAW_MODES)}"
            )
        if not taints_recheck_interval > 0:
            raise ValueError(
                f"taints_recheck_interval must be > 0 seconds, got {taints_recheck_interval!r}"
            )
        self.withdraw_unhealthy: WithdrawMode = withdraw_unhealthy
        self.taints_recheck_interval = taints_recheck_interval
        self.client = client
        self.driver_name = driver_name
        self.node_name = node_name
        self.sync_delay = sync_delay
        self.mutation_cache_ttl = mutation_cache_ttl
        self.sync_timeout = sync_timeout
        self.on_error = on_error
        self._backoff = Backoff(backoff_initial, backoff_max)
        self._owner: OwnerReference | None = None
        self._owner_resolved = False
        if node_uid:
            self._owner = self._owner_ref(node_uid)
            self._owner_resolved = True

        self._resources: DriverResources | None = None
        self._taints: dict[tuple[str, str], list[DeviceTaint]] = {}
        self._withdraw_wanted: frozenset[tuple[str, str]] = frozenset()
        #: Whether the server stores device taints: None until a write that carried
        #: taints came back (and again after a reconnect while they were dropped).
        self.taints_kept: bool | None = None
        self._taints_warned = False
        self._taints_marker = 0  # reflector lists + reconnects when taints_kept was set
        #: The ``(pool, device)`` pairs left out of the published slices now.
        self.withdrawn: frozenset[tuple[str, str]] = frozenset()
        # pool -> (slice contents, pool generation) as validated at publish time
        self._desired: dict[str, tuple[list[SliceContent], int]] = {}
        # (pool, index) -> (fingerprint of desired content, what the server stored)
        self._accepted: dict[tuple[str, int], tuple[bytes, SliceContent]] = {}
        self._mutations: dict[str, tuple[ResourceSlice, float]] = {}
        self._deleting: dict[str, float] = {}
        self._last_add: float | None = None

        self._reflector: Reflector[ResourceSlice] | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._due: float | None = None
        self._version = 0
        self._in_sync = asyncio.Event()
        self._stopped = False

        self.publish_errors_total = 0
        self.last_error: BaseException | None = None
        self.slices = 0
        self.creates = 0
        self.updates = 0
        self.deletes = 0
        self.syncs = 0

    # ------------------------------------------------------------------ public API

    @property
    def owner(self) -> OwnerReference | None:
        """The owner reference put on new slices (``None`` until looked up / no Node)."""
        return self._owner

    def publish(self, resources: DriverResources) -> None:
        """Set the complete desired state and wake the worker; never blocks.

        Raises :class:`SliceValidationError` (and keeps the previous state) if any
        pool is invalid or names another node.
        """
        self._set(resources, self._taints)

    def set_device_taints(self, taints: TaintMap) -> None:
        """Set the health taints added to devices, keyed by ``(pool, device)``.

        Replaces the previous set; republishes at once. Validated like :meth:`publish`.
        """
        copy = {k: list(v) for k, v in sorted(taints.items()) if v}
        if self._resources is None:
            self._taints = copy
            return
        self._set(self._resources, copy)

    def set_withdrawn(self, devices: Iterable[tuple[str, str]]) -> None:
        """Set the ``(pool, device)`` pairs to leave out of the slices (unhealthy ones).

        Replaces the previous set; whether they are left out follows
        ``withdraw_unhealthy``. A pair the driver does not publish is ignored. A device
        left out that is still allocated stays allocated: the scheduler only stops
        choosing it for new claims, and the kubelet keeps calling the driver for it.
        """
        wanted = frozenset((str(p), str(d)) for p, d in devices)
        if self._resources is None:
            self._withdraw_wanted = wanted
            return
        self._set(self._resources, self._taints, wanted)

    async def start(self) -> None:
        """Start the worker (also done by the first publish)."""
        if self._stopped:
            raise RuntimeError("publisher was stopped")
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"slices:{self.driver_name}")

    async def wait_synced(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until the latest published state is on the server.

        Raises ``TimeoutError`` (naming the last error) when ``timeout`` passes first.
        """
        try:
            async with asyncio.timeout(timeout):
                await self._in_sync.wait()
        except TimeoutError:
            raise TimeoutError(
                f"ResourceSlices of {self.driver_name} on {self.node_name} not in sync "
                f"after {timeout}s; last error: {self.last_error!r}"
            ) from None

    async def stop(self) -> None:
        """Stop the worker and the watch; slices stay as they are. Idempotent."""
        self._stopped = True
        task, self._task = self._task, None
        await cancel_and_wait([task])
        reflector, self._reflector = self._reflector, None
        if reflector is not None:
            await reflector.stop()

    # ------------------------------------------------------------------ desired state

    def _set(
        self,
        resources: DriverResources,
        taints: dict[tuple[str, str], list[DeviceTaint]],
        withdraw: frozenset[tuple[str, str]] | None = None,
    ) -> None:
        wanted = self._withdraw_wanted if withdraw is None else withdraw
        try:
            desired, withdrawn = self._plan(resources, taints, wanted)
        except SliceValidationError as exc:
            self.publish_errors_total += 1
            self.last_error = exc
            raise
        self._resources = resources
        self._taints = taints
        self._withdraw_wanted = wanted
        self._install(desired, withdrawn)

    def _withdrawing(self) -> bool:
        mode = self.withdraw_unhealthy
        return mode == "always" or (mode == "auto" and self.taints_kept is False)

    def _plan(
        self,
        resources: DriverResources,
        taints: dict[tuple[str, str], list[DeviceTaint]],
        wanted: frozenset[tuple[str, str]],
    ) -> tuple[dict[str, tuple[list[SliceContent], int]], frozenset[tuple[str, str]]]:
        """Validated slice contents per pool, and the devices left out of them."""
        merged = merge_taints(resources, taints)
        if self.taints_kept is False:
            merged = strip_taints(merged)
        withdrawn: frozenset[tuple[str, str]] = frozenset()
        if self._withdrawing():
            merged, withdrawn = without_devices(merged, wanted)
        desired: dict[str, tuple[list[SliceContent], int]] = {}
        for pool_name in sorted(merged.pools):
            pool = merged.pools[pool_name]
            if pool.node_name not in (None, self.node_name):
                raise SliceValidationError(
                    pool_name,
                    None,
                    "nodeName",
                    f"{pool.node_name!r} is not this publisher's node {self.node_name!r}",
                )
            desired[pool_name] = (split_pool(pool_name, pool), pool.generation)
        return desired, withdrawn

    def _install(
        self,
        desired: dict[str, tuple[list[SliceContent], int]],
        withdrawn: frozenset[tuple[str, str]],
    ) -> None:
        if withdrawn != self.withdrawn:
            if withdrawn - self.withdrawn:
                log.warning(
                    "withdrawing unhealthy devices of %s from its ResourceSlices: %s",
                    self.driver_name,
                    ", ".join(f"{p}/{d}" for p, d in sorted(withdrawn - self.withdrawn)),
                )
            if self.withdrawn - withdrawn:
                log.info(
                    "publishing devices of %s again: %s",
                    self.driver_name,
                    ", ".join(f"{p}/{d}" for p, d in sorted(self.withdrawn - withdrawn)),
                )
        self.withdrawn = withdrawn
        self._desired = desired
        for (pool_name, index), (fingerprint, _) in list(self._accepted.items()):
            contents = desired.get(pool_name, ([], 0))[0]
            if index >= len(contents) or _fingerprint(contents[index]) != fingerprint:
                del self._accepted[(pool_name, index)]
        self._version += 1
        self._in_sync.clear()
        if not self._stopped and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"slices:{self.driver_name}"
            )
        self._schedule(0.0)

    def _replan(self) -> None:
        """Recompute the desired slices after ``taints_kept`` changed (worker side)."""
        if self._resources is None:
            return
        try:
            desired, withdrawn = self._plan(self._resources, self._taints, self._withdraw_wanted)
        except SliceValidationError as exc:  # leaving things out cannot make it invalid
            self._report(exc)
            return
        self._install(desired, withdrawn)

    def _desired_for(self, pool_name: str) -> tuple[list[SliceContent], int] | None:
        entry = self._desired.get(pool_name)
        if entry is None:
            return None
        contents, generation = entry
        out = []
        for i, content in enumerate(contents):
            accepted = self._accepted.get((pool_name, i))
            if accepted is not None and accepted[0] == _fingerprint(content):
                content = accepted[1]
            out.append(content)
        return out, generation

    # ------------------------------------------------------------------ worker

    def _schedule(self, delay: float) -> None:
        due = asyncio.get_running_loop().time() + delay
        if self._due is None or due < self._due:
            self._due = due
        self._wake.set()

    async def _wait_for_work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if self._due is not None and self._due <= now:
                self._due = None
                return
            self._wake.clear()
            timeout = None if self._due is None else self._due - now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    async def _run(self) -> None:
        while True:
            await self._wait_for_work()
            version = self._version
            try:
                await self._sync()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._report(exc)
                delay = self._backoff.next()
                log.warning(
                    "publishing ResourceSlices of %s failed, retrying in %.2fs: %s",
                    self.driver_name,
                    delay,
                    exc,
                )
                self._schedule(delay)
                continue
            self._backoff.reset()
            if self._version == version:
                self._in_sync.set()
            if self.taints_kept is False:
                self._schedule(self.taints_recheck_interval)

    def _report(self, exc: BaseException) -> None:
        self.publish_errors_total += 1
        self.last_error = exc
        if self.on_error is not None:
            try:
                self.on_error(exc)
            except Exception:
                log.exception("ResourceSlice publisher error callback failed")

    def _owner_ref(self, uid: str) -> OwnerReference:
        return OwnerReference(
            apiVersion="v1", kind="Node", name=self.node_name, uid=uid, controller=True
        )

    async def _ensure_started(self) -> Reflector[ResourceSlice]:
        if self._reflector is None:
            self._reflector = Reflector(
                self.client,
                ResourceSlice,
                fields={"spec.driver": self.driver_name, "spec.nodeName": self.node_name},
                name=f"resourceslices:{self.driver_name}",
            )
            self._reflector.add_handler(self._on_event)
            await self._reflector.start()
        if not self._reflector.has_synced:
            try:
                await self._reflector.wait_synced(self.sync_timeout)
            except TimeoutError:
                raise ConnectionError(
                    f"cannot list ResourceSlices: {self._reflector.last_error!r}"
                ) from None
        if not self._owner_resolved:
            try:
                node = await self.client.get(Node, self.node_name)
            except Exception as exc:
                if not is_not_found(exc):
                    raise
                log.warning(
                    "Node %s not found; publishing ResourceSlices without owner reference "
                    "(they will not be garbage-collected with the Node)",
                    self.node_name,
                )
            else:
                uid = node.metadata.uid if node.metadata else None
                if uid:
                    self._owner = self._owner_ref(uid)
            self._owner_resolved = True
        return self._reflector

    def _on_event(self, etype: str, obj: ResourceSlice, old: ResourceSlice | None) -> None:
        """Watch handler: forget confirmed mutations, resync after foreign changes."""
        name, uid, rv = _name(obj), _uid(obj), _rv(obj)
        if etype == "DELETED":
            self._mutations.pop(name, None)
            if self._deleting.pop(uid, None) is not None:
                return  # our own delete
            log.info("ResourceSlice %s was deleted by someone else; resyncing", name)
            self._in_sync.clear()
            self._version += 1
            self._schedule(self.sync_delay)
            return
        mine = self._mutations.get(name)
        if mine is not None:
            if rv == _rv(mine[0]):
                del self._mutations[name]
                return  # the echo of our own write
            if not rv_newer(rv, _rv(mine[0])):
                return  # older than what we wrote
            del self._mutations[name]
        self._schedule(self.sync_delay)

    @staticmethod
    def _marker(reflector: Reflector[ResourceSlice]) -> int:
        return reflector.lists + reflector.reconnects

    def _recheck_taints(self, reflector: Reflector[ResourceSlice]) -> None:
        """Dropped taints: after a reconnect or relist, find out again with the next write."""
        if self.taints_kept is not False or self._marker(reflector) == self._taints_marker:
            return
        log.info(
            "the watch of ResourceSlices of %s reconnected; checking again whether the API "
            "server keeps device taints",
            self.driver_name,
        )
        self.taints_kept = None
        self._replan()

    def _learn_taints(self, sent: ResourceSlice, actual: ResourceSlice) -> bool | None:
        """Whether ``actual`` kept the device taints ``sent`` carried (None: sent none)."""
        have = {d.name: d for d in actual.spec.devices or ()}
        verdict: bool | None = None
        for device in sent.spec.devices or ():
            if not device.taints:
                continue
            stored = have.get(device.name)
            if stored is not None and stored.taints:
                return True
            verdict = False
        return verdict

    def _taints_learned(self, kept: bool) -> None:
        reflector = self._reflector
        self._taints_marker = self._marker(reflector) if reflector is not None else 0
        if kept == self.taints_kept:
            return
        self.taints_kept = kept
        if kept:
            log.info("the API server keeps ResourceSlice device taints of %s", self.driver_name)
            return
        if not self._taints_warned:
            self._taints_warned = True
            log.warning(
                "the API server dropped the device taints of ResourceSlices of %s on %s: "
                "feature gate %s is off there (the default before Kubernetes 1.36); "
                "publishing them without taints%s",
                self.driver_name,
                self.node_name,
                TAINTS_GATE,
                ", unhealthy devices withdrawn"
                if self.withdraw_unhealthy != "never"
                else " (withdraw_unhealthy is never: the scheduler keeps using bad devices)",
            )
        else:
            log.info("the API server still drops the device taints of %s", self.driver_name)
        self._replan()

    def _current(self, reflector: Reflector[ResourceSlice]) -> list[ResourceSlice]:
        """The watch's slices overlaid with our not-yet-seen writes and deletes."""
        now = asyncio.get_running_loop().time()
        objs = {_name(o): o for o in reflector.store.list()}
        for name, (obj, expires) in list(self._mutations.items()):
            seen = objs.get(name)
            if (seen is not None and not rv_newer(_rv(obj), _rv(seen))) or expires <= now:
                del self._mutations[name]
            else:
                objs[name] = obj
        for uid, expires in list(self._deleting.items()):
            if expires <= now:
                del self._deleting[uid]
        return [o for o in objs.values() if _uid(o) not in self._deleting]

    async def _sync(self) -> None:
        reflector = await self._ensure_started()
        self._recheck_taints(reflector)
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.syncs += 1
        current = self._current(reflector)
        by_pool: dict[str, list[ResourceSlice]] = {}
        for obj in current:
            by_pool.setdefault(obj.spec.pool.name, []).append(obj)
        first_error: Exception | None = None
        for pool_name in sorted(set(self._desired) | set(by_pool)):
            desired = self._desired_for(pool_name)
            plan = plan_pool(
                self.driver_name,
                pool_name,
                desired[0] if desired else None,
                by_pool.get(pool_name, []),
                node_name=self.node_name,
                owner=self._owner,
                owner_name=self.node_name,
                min_generation=desired[1] if desired else 0,
            )
            try:
                await self._execute(plan)
            except Exception as exc:
                if first_error is None:
                    first_error = exc
        if self._last_add is not None:
            when = self._last_add + self.mutation_cache_ttl
            if start > when:
                self._last_add = None
            else:
                self._schedule(when - loop.time())
        self.slices = len(self._current(reflector))
        if first_error is not None:
            raise first_error

    async def _execute(self, plan: PoolPlan) -> None:
        if plan.in_sync:
            return
        loop = asyncio.get_running_loop()
        log.debug(
            "pool %s: generation %d, %d slices: delete %d, update %d, create %d",
            plan.pool,
            plan.generation,
            plan.slice_count,
            len(plan.delete),
            len(plan.update),
            len(plan.create),
        )
        for obj in plan.delete:
            uid = _uid(obj)
            self._deleting[uid] = loop.time() + self.mutation_cache_ttl
            try:
                await self._delete(obj)
            except Exception as exc:
                if not is_not_found(exc):
                    self._deleting.pop(uid, None)
                    raise
            else:
                self.deletes += 1
            self._mutations.pop(_name(obj), None)
        for index, obj in plan.update:
            actual = await self.client.replace(obj)
            self.updates += 1
            self._stored(plan.pool, index, obj, actual)
        for index, obj in plan.create:
            actual = await self.client.create(obj)
            self.creates += 1
            self._last_add = loop.time()
            self._stored(plan.pool, index, obj, actual)

    async def _delete(self, obj: ResourceSlice) -> None:
        """DELETE with UID and resourceVersion preconditions (the slice as read)."""
        await delete_with_preconditions(
            self.client, ResourceSlice, _name(obj), uid=_uid(obj), resource_version=_rv(obj)
        )

    def _stored(self, pool: str, index: int, sent: ResourceSlice, actual: ResourceSlice) -> None:
        """Remember a write until the watch shows it; detect dropped fields."""
        expires = asyncio.get_running_loop().time() + self.mutation_cache_ttl
        self._mutations[_name(actual)] = (actual, expires)
        kept = self._learn_taints(sent, actual)
        if kept is not None:
            self._taints_learned(kept)
            if not kept:
                # handled: the desired state has no taints now; report other losses only
                sent = strip_taints_of(sent)
        want, have = sent.spec, actual.spec
        same_counters = len(want.sharedCounters or []) == len(have.sharedCounters or [])
        if devices_equal(want.devices or [], have.devices or []) and same_counters:
            return
        entry = self._desired.get(pool)
        if entry is not None and index < len(entry[0]):
            stored = SliceContent(
                tuple(have.devices or ()),
                tuple(have.sharedCounters or ()),
            )
            self._accepted[(pool, index)] = (_fingerprint(entry[0][index]), stored)
        self._report(DroppedFieldsError(pool, index, sent, actual))
