"""The remediation controller: device health -> DeviceTaintRules -> evictions -> untaint.

Owns :class:`RemediationController`, the leader's work. At start (and whenever a list or
watch of a ``resource.k8s.io`` kind answers 404, e.g. after an upgrade or a downgrade) it
asks the server which versions it serves (:func:`drahealth.kube.discover`), reads and
writes each kind at the newest one and converts what it reads to the internal (v1)
shape; it picks its remediation mode from that (:mod:`drahealth.remedy._modes`) and says
so: a log line, the gauge ``drahealth_controller_remediation_mode``, a
``RemediationMode`` Event and the history ConfigMap's ``mode`` key. It reflects Pods,
ResourceClaims, ResourceSlices, DeviceTaintRules (only where served) and the agents'
device-health ConfigMaps into the core's :class:`ClusterModel`, one watch event at a
time; on every change (and at the engine's next deadline) it runs one pass, which costs
O(devices whose observation changed) plus O(devices that want a taint):

1. the changed devices' observations -> :class:`RemedyEngine` -> the taint each device
   wants;
2. reconcile the controller's own DeviceTaintRules (label
   ``app.kubernetes.io/managed-by=drahealth-controller``) to exactly those wants:
   create, update the effect/value, delete when recovered. Rules anyone else made are
   never touched. Rules with effect ``None`` get a dry-run impact summary (devices,
   pods, namespaces NoExecute would hit) in their ``EvictionInProgress`` condition;
3. in ``eviction.mode: evict``, pods on NoExecute devices that do not tolerate the
   taint (and are not in an excluded namespace) go to the :class:`Evictor`; a
   toleration with ``tolerationSeconds`` delays that to the rule's ``timeAdded`` plus
   the seconds. The rule itself is written NoSchedule so only budget-aware evictions
   move pods;
4. recovered devices with a validation hook get it run (exec or HTTP GET) first.

That is mode ``taint-rules``. In ``node-taint`` and ``cordon`` a device's wanted taint
becomes drahealth's part of its Node instead (:mod:`drahealth.remedy._nodes`), and in
``evict-only`` nothing blocks scheduling; in all three the pods of ``NoExecute`` devices
leave by the :class:`Evictor` (tolerations honoured). ``report-only`` writes Events and
history only. A rule's ``action.fallback`` picks its devices' mode where ``auto`` fell
back. DeviceTaintRules whose selector is empty or names no driver (kubernetes #141422:
such a rule reaches every device) never lead this controller to act; each gets one
``OverBroadDeviceTaintRule`` Warning per generation. The controller itself only ever
writes rules that name exactly one device.

Every action is an Event (on the rule or the pod) and a line in the ConfigMap
``drahealth-remediation-history`` (last 200). All state is rebuilt from the API at
start (the engine is seeded from the controller's rules), so a restart or a leader
change neither loses nor repeats an action.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, cast

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod
from lightkube.types import PatchType

from drahealth._aio import cancel_and_wait
from drahealth._time import now_rfc3339
from drahealth.core import (
    BURN_IN_RULE,
    BURN_IN_TAINT_KEY,
    REMEDIATION_MODES,
    ClusterModel,
    Consumer,
    DeviceFacts,
    DeviceKey,
    Health,
    Policy,
    RemedyEngine,
    Taint,
    Validate,
    Want,
    burn_in_why,
    format_time,
    parse_rfc3339,
    selector_scope,
)
from drahealth.kube import (
    CONTROLLER_COMPONENT,
    TRANSPORT_ERRORS,
    Backoff,
    DiscoveryError,
    FencedClient,
    LeaseLost,
    Reflector,
    ServedAPIs,
    as_dict,
    delete_with_preconditions,
    discover,
    make_event,
    resource_class,
    status_code,
    strip_managed_fields,
    to_internal,
    write_configmap_data,
)
from drahealth.remedy._aftercare import AftercareGuard
from drahealth.remedy._breaker_guard import BreakerGuard
from drahealth.remedy._burnin import ANNOTATION_BURN_IN, OutcomeReporter, run_check
from drahealth.remedy._control import (
    COMPONENT_LABEL,
    CONTROL_COMPONENT,
    ControllerState,
    ControlRequests,
)
from drahealth.remedy._evict import Evictor
from drahealth.remedy._metrics import ControllerMetrics
from drahealth.remedy._modes import ModeChoice, ModeError, device_mode, mode_on, mode_writes
from drahealth.remedy._nodes import MAX_REASON, NODE_MODES, NodeDevice, NodeWriter, node_taints
from drahealth.remedy._ownership import OwnershipGuard
from drahealth.remedy._quarantine import (
    QUARANTINE_MODE,
    QuarantineWriter,
    claim_name,
)
from drahealth.remedy._rollup import NodeRollupWriter
from drahealth.remedy._rules import (
    ANNOTATION_FIRST_SEEN,
    ANNOTATION_NODE,
    ANNOTATION_REASON,
    ANNOTATION_RULE,
    CONTROLLER_LABEL,
    MANAGED_BY,
    DeviceRef,
    RuleError,
    health_of,
    is_ours,
    rule_body,
)

__all__ = ["HISTORY_CONFIGMAP", "RemediationController"]

log = logging.getLogger(__name__)

HISTORY_CONFIGMAP = "drahealth-remediation-history"
HISTORY_LENGTH = 200
COMPONENT = CONTROLLER_COMPONENT
JSON = dict[str, Any]
#: What restarts a round: the server could not be talked to, or what it sent could not be
#: decoded (a body corrupted on the way: its compression broken by a proxy)
ROUND_ERRORS: tuple[type[BaseException], ...] = (*TRANSPORT_ERRORS, httpx2.DecodingError)


def _release_list_memory() -> None:
    """Hand the heap the initial LISTs used (their bodies, decoded once) back to the OS.

    glibc keeps freed memory in the process; at 50,000 pods that is hundreds of MB the
    controller never needs again. Elsewhere (no glibc) this only runs the collector.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


#: Attempts of the history's read-modify-write that meet a conflict, per pass.
MAX_CONFLICTS = 8
#: Bounds on one history row as the breaker's window reads it back: its time's text,
#: its subject and the devices one node row may name.
MAX_TIME_TEXT = 64
MAX_SUBJECT = 1024
MAX_ROW_DEVICES = 1024


def _history_rows(cm: Any) -> list[JSON]:
    """The history ConfigMap's rows (those that are JSON objects); [] if unreadable."""
    try:
        rows = json.loads(((cm.data if cm is not None else None) or {}).get("history", "[]"))
    except ValueError:
        return []
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


#: A pass yields to the event loop after this many devices observed.
YIELD_EVERY = 500
#: Over-broad rules remembered as warned (name, generation); the oldest are forgotten.
MAX_WARNED = 10_000


def _cancelling() -> bool:
    """Whether the running task was asked to stop, even if a clean-up step swallowed
    the CancelledError that asked it."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _Rediscover(Exception):
    """A list or watch of a resource.k8s.io kind answered 404: ask the server again."""

    def __init__(self, reflector: str) -> None:
        super().__init__(f"{reflector}: the server answered 404")
        self.reflector = reflector


class RemediationController:
    """See the module docstring. ``run()`` is the leader's work (cancel to stop)."""

    def __init__(
        self,
        client: AsyncClient,
        policy: Policy,
        *,
        identity: str = "drahealth-controller",
        namespace: str = "default",
        metrics: ControllerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        served: ServedAPIs | None = None,
        mode: str | None = None,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        """``served``: what the server serves (None: discover it); ``mode``: one of
        ``REMEDIATION_MODES``, overriding the policy's ``remediation.mode``; ``fence``:
        whether this replica still holds the Lease (:meth:`LeaderElector.holds`), asked
        right before every write; a write it refuses raises :class:`LeaseLost`, which
        ends the leader's work."""
        requested = mode or policy.remediation_mode
        if requested not in REMEDIATION_MODES:
            raise ModeError(
                f"unknown remediation mode {requested!r}: "
                f"choose one of {', '.join(REMEDIATION_MODES)}"
            )
        self.requested_mode = requested
        self.served = served
        self.choice: ModeChoice | None = None
        self.discoveries = 0
        self.synced = False
        self.client: AsyncClient = (
            client if fence is None else cast(AsyncClient, FencedClient(client, fence))
        )
        self.policy = policy
        self.identity = identity
        self.namespace = namespace
        self.metrics = metrics or ControllerMetrics()
        self._clock = clock
        self._wall = wall
        self._reset()
        self._history: deque[JSON] = deque(maxlen=HISTORY_LENGTH)
        self._pending: deque[JSON] = deque(maxlen=HISTORY_LENGTH)  # rows not written yet
        self._history_dirty = False
        self._warned: dict[tuple[str, int], None] = {}  # over-broad rules already warned
        self._events_refused: dict[tuple[str, int], None] = {}  # (reason, code) warned
        #: rule writes sent whose answer never came (name -> action, body): the next round
        #: reads what the API holds and records those that happened
        self._unanswered: dict[str, tuple[str, JSON]] = {}
        self.passes = 0

    def _reset(self) -> None:
        """The state one leadership (or one round after a rediscovery) starts from."""
        client, policy = self.client, self.policy
        #: the wall clock read once, at the start, and carried on by the monotonic one
        self._wall_start, self._clock_start = self._wall(), self._clock()
        self.engine = RemedyEngine(policy)
        self.pods: Reflector[Pod] = Reflector(
            client, Pod, name="remedy-pods", transform=strip_managed_fields
        )
        self.claims: Reflector[Any] | None = None
        self.slices: Reflector[Any] | None = None
        self.rules: Reflector[Any] | None = None
        self._rule_cls: Any = None
        #: uid of each object Events were recorded about, by (kind, namespace, name).
        self._uids: dict[tuple[str, str, str], str] = {}
        self._rules_api = "resource.k8s.io/v1"
        self.health: Reflector[ConfigMap] = Reflector(
            client,
            ConfigMap,
            namespace=self.namespace,  # the agents publish there: no cluster-wide read
            labels={"app.kubernetes.io/component": "device-health"},
            name="remedy-device-health",
        )
        #: the operator's requests (control ConfigMap) and the controller's status keys
        self.control = ControlRequests()
        self.state = ControllerState(client, self.namespace)
        #: the blast-radius circuit breaker (holds new taints over the policy's limits)
        self.breaker = BreakerGuard(policy, self.metrics, self._record, self._breaker_notify)
        self.control_cms: Reflector[ConfigMap] = Reflector(
            client,
            ConfigMap,
            namespace=self.namespace,
            labels={COMPONENT_LABEL: CONTROL_COMPONENT},
            name="remedy-control",
        )
        self.evictor = Evictor(client, policy.eviction, on_event=self._eviction_event)
        self.nodes = NodeWriter(client, on_change=self._node_changed)
        self.quarantine = QuarantineWriter(
            client, self.namespace, on_change=self._quarantine_changed
        )
        self.rollup = NodeRollupWriter(
            client, policy.node_rollup, record=self._record,
            event=lambda *event: self._spawn(self._event(*event)),
        )  # fmt: skip
        self.model = ClusterModel(records_namespace=self.namespace)
        #: the ownership filter: operator holds, opt-out nodes, exclusions
        self.ownership = OwnershipGuard(
            client, policy, facts=self._facts, record=self._record,
            event=lambda *event: self._spawn(self._event(*event)), wake=self._wake_soon,
            metrics=self.metrics, wall=self._wall,
            history_ref=ObjectReference(
                apiVersion="v1", kind="ConfigMap", name=HISTORY_CONFIGMAP,
                namespace=self.namespace,
            ),
        )  # fmt: skip
        self._foreign_named: set[str] = set()  # our rule names a foreign rule has, said once
        self._evict_related: dict[tuple[str, str], ObjectReference] = {}  # pod -> its taint
        self._feeds: list[tuple[Reflector[Any], Callable[..., None]]] = [
            (self.pods, self._feed("Pod")),
            (self.health, self._feed("ConfigMap")),
            (self.control_cms, self._feed_control),
            (self.ownership.nodes, self.ownership.on_node),
        ]
        self._seen_errors: dict[str, BaseException] = {}
        self._since_wall: dict[DeviceKey, tuple[str, float]] = {}  # fallback taints' start
        self._reported: dict[DeviceKey, tuple[str, str]] = {}  # report-only: what was said
        self._no_node: set[DeviceKey] = set()  # devices without a node, said once
        self._overbroad: list[tuple[str, int, str]] = []  # rules to warn about
        self._rule_names: dict[DeviceKey, str] = {}  # device -> our rule's name
        self._bodies: dict[tuple[DeviceKey, Want, str, str], JSON] = {}  # last pass's bodies
        self._evict_due: float | None = None  # wall time a tolerated eviction falls due
        self._wake = asyncio.Event()
        self._node_sizes: Counter[str] | None = None  # devices per node, for the breaker
        self._bad_seen: dict[DeviceKey, float] = {}  # first bad observation, for latency
        #: unix time of the first bad observation (provenance): fixed once, resumed from
        #: the rules' and node rows' records, so a restart rewrites nothing
        self._first_seen_at: dict[DeviceKey, float] = {}
        self._validating: set[DeviceKey] = set()
        self._checks: set[asyncio.Task[None]] = set()  # recovery validations running
        self._spawned: set[asyncio.Task[Any]] = set()  # background Events and checks
        self._impact: dict[str, str] = {}  # rule name -> last impact message written
        # burn-in gate and degraded devices: new devices, validations, Events, state keys
        self.outcomes = OutcomeReporter(
            self.engine, self.model, self.state, self.metrics, facts=self._facts,
            record=self._record, event=self._event, wake=self._wake, clock=self._clock,
            wall=self._wall, namespace=self.namespace, history_configmap=HISTORY_CONFIGMAP,
        )  # fmt: skip
        #: needs-a-human marks, operator clears and repair actions
        self.aftercare = AftercareGuard(self)

    # -- lifecycle -------------------------------------------------------------------

    async def run(self) -> None:
        """The leader's work until cancelled; rounds restart after a rediscovery."""
        backoff = Backoff(1.0, 60.0)
        lost = Backoff(0.5, 30.0)
        while True:
            before, began = self.served, self._clock()
            try:
                await self._round()
                return
            except ROUND_ERRORS as exc:
                if _cancelling():
                    # cancelled (the Lease lost) while the failed round was cleaning up,
                    # where a wait for a stopping task took the request: stop, as asked
                    raise asyncio.CancelledError from exc
                if self._clock() - began > 60.0:
                    lost.reset()  # a round that ran a while: a new outage, not the same
                # the API server went away mid-round (reset, refused, timed out): what
                # this round holds in memory may be half-applied, so start again from
                # the API once it answers, as a new leader would, without giving up
                # the Lease for a blip
                delay = lost.next()
                log.warning(
                    "talking to the API server failed (%s: %s); restarting in %.1f s",
                    type(exc).__name__,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
            except _Rediscover as exc:
                if _cancelling():
                    raise asyncio.CancelledError from exc
                self.served = await self._discover()
                if before is not None and self.served.versions == before.versions:
                    # nothing changed: the 404 was something else; retry later, not in a loop
                    delay = backoff.next()
                    log.warning(
                        "%s, but discovery says nothing changed; retrying in %.1f s",
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
                else:
                    backoff.reset()
                    log.info("%s: the served versions changed, restarting", exc)
            self._reset()

    async def _discover(self) -> ServedAPIs:
        """Ask the server what it serves, retrying with backoff until it answers."""
        backoff = Backoff(0.5, 30.0)
        while True:
            try:
                served = await discover(self.client)
            except DiscoveryError as exc:
                delay = backoff.next()
                log.warning("API discovery failed (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                continue
            self.discoveries += 1
            log.info("served resource.k8s.io versions: %s", served.summary())
            return served

    def _choose(self, served: ServedAPIs) -> tuple[ModeChoice, bool]:
        """The mode on ``served``; True if the requested one could not run."""
        choice, refused = mode_on(self.requested_mode, self.policy, served)
        return choice, refused is not None

    def _dra_reflector(self, served: ServedAPIs, kind: str, name: str) -> Reflector[Any]:
        cls = served.resource(kind) or resource_class(kind, "v1")
        return Reflector(self.client, cls, name=name, transform=strip_managed_fields)

    async def _round(self) -> None:
        if self.served is None:
            self.served = await self._discover()
        served = self.served
        self.choice, refused = self._choose(served)
        self.claims = self._dra_reflector(served, "ResourceClaim", "remedy-claims")
        self.slices = self._dra_reflector(served, "ResourceSlice", "remedy-slices")
        self._feeds += [
            (self.claims, self._feed("ResourceClaim")),
            (self.slices, self._feed("ResourceSlice")),
        ]
        if served.served("DeviceTaintRule"):
            self._rule_cls = served.resource("DeviceTaintRule")
            self._rules_api = served.api_version("DeviceTaintRule") or self._rules_api
            self.rules = Reflector(self.client, self._rule_cls, name="remedy-rules")
            self._feeds.append((self.rules, self._feed("DeviceTaintRule")))
        reflectors = [r for r, _ in self._feeds]
        for r, feed in self._feeds:
            r.add_handler(feed)
        tasks: list[asyncio.Task[None]] = []
        try:
            for r in reflectors:
                await r.start()
            await self._wait_synced(reflectors)
            await self._load_history()
            await self._load_state()
            self._seed()
            await self._settle_unanswered()
            self.aftercare.restore()
            await self._seed_nodes()
            await self._seed_quarantine()
            self.outcomes.synced()
            await self.rollup.load()
            _release_list_memory()
            tasks.append(asyncio.create_task(self.evictor.run(), name="evictor"))
            await self._announce(refused)
            self.synced = True
            log.info("%s: remediation controller active", self.identity)
            while True:
                await self.reconcile()
                await self._sleep()
                self._check_404()
                self._check_workers(tasks)
        finally:
            self.synced = False
            # the round's validation hooks end with it (a lost Lease, a restarted round)
            await cancel_and_wait([*tasks, *self._checks])
            await self.outcomes.stop()
            await self.aftercare.stop()
            for r, feed in self._feeds:
                r.remove_handler(feed)
                await r.stop()

    async def _wait_synced(self, reflectors: list[Reflector[Any]]) -> None:
        """Wait for every first LIST; a 404 of a resource.k8s.io kind ends the round."""
        while not all(r.has_synced for r in reflectors):
            self._check_404()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await asyncio.gather(*(r.wait_synced() for r in reflectors))

    @staticmethod
    def _check_workers(tasks: list[asyncio.Task[None]]) -> None:
        """A worker of the round (the evictor) that ended ends the round the same way: its
        error is raised here (a transport error restarts the round), so its work never
        stops silently while the round goes on."""
        for task in tasks:
            if not task.done():
                continue
            if task.cancelled():
                raise RuntimeError(f"{task.get_name()} was cancelled")
            exc = task.exception()
            raise exc if exc is not None else RuntimeError(f"{task.get_name()} ended")

    def _check_404(self) -> None:
        for r in (self.claims, self.slices, self.rules):
            err = r.last_error if r is not None else None
            if r is None or err is None or self._seen_errors.get(r.name) is err:
                continue
            self._seen_errors[r.name] = err
            if status_code(err) == 404:
                raise _Rediscover(r.name)

    async def _announce(self, refused: bool) -> None:
        """Say the mode: log line, gauge, the history ConfigMap's ``mode`` key, Event."""
        choice = self.choice
        assert choice is not None
        (log.warning if refused else log.info)("%s", choice.line())
        for m in REMEDIATION_MODES:
            if m != "auto":
                self.metrics.mode.labels(m).set(1 if m == choice.mode else 0)
        data = {"mode": json.dumps(choice.as_json(), ensure_ascii=False)}
        try:
            await write_configmap_data(
                self.client, HISTORY_CONFIGMAP, self.namespace, data,
                {MANAGED_BY: CONTROLLER_LABEL},
            )  # fmt: skip
        except ApiError as exc:
            log.warning("writing the remediation mode failed: %s", exc.status.message)
        ref = ObjectReference(
            apiVersion="v1", kind="ConfigMap", name=HISTORY_CONFIGMAP, namespace=self.namespace
        )
        await self._event(ref, "Warning" if refused else "Normal", "RemediationMode", choice.line())

    def _feed(self, kind: str) -> Callable[..., None]:
        if kind == "DeviceTaintRule":
            return self._feed_rule
        convert = kind in ("ResourceClaim", "ResourceSlice")

        def on_event(event_type: str, obj: Any, _old: Any) -> None:
            raw = as_dict(obj)
            self.model.apply(kind, event_type, to_internal(raw) if convert else raw)
            if kind == "ResourceClaim":
                self.quarantine.observe(event_type, raw)
            self._wake.set()

        return on_event

    def _feed_control(self, event_type: str, obj: Any, _old: Any) -> None:
        self.control.apply(event_type, getattr(obj, "data", None))
        self._wake.set()

    async def _load_state(self) -> None:
        """Read the state ConfigMap back: what the last leader kept (see _control)."""
        try:
            await self.state.load()
        except ApiError as exc:
            log.warning("reading the remediation state failed: %s", exc.status.message)
        self.ownership.restore(self.state.get("holds"), self.control.get("holds"))

    def _wake_soon(self) -> None:
        self._wake.set()

    def _feed_rule(self, event_type: str, obj: Any, _old: Any) -> None:
        raw = to_internal(as_dict(obj))
        if event_type == "DELETED" and is_ours(raw):
            self.ownership.rule_deleted(raw)  # ours, deleted by someone else: a hold
        scope = selector_scope((raw.get("spec") or {}).get("deviceSelector"))
        if event_type != "DELETED" and scope in ("all", "partial"):
            # kubernetes #141422: such a rule reaches every device; never act on it
            meta = raw.get("metadata") or {}
            self._overbroad.append((str(meta.get("name")), int(meta.get("generation") or 0), scope))
            event_type = "DELETED"  # out of the model: nothing here reads its taint
        self.model.apply("DeviceTaintRule", event_type, raw)
        self._wake.set()

    async def _sleep(self) -> None:
        now = self._clock()
        due = self.engine.next_wakeup(now)
        timeout = 1.0 if due is None else max(0.0, min(1.0, due - now))
        if self._evict_due is not None:
            timeout = max(0.0, min(timeout, self._evict_due - self._wall()))
        hold_end = self.ownership.next_end()
        if hold_end is not None:
            timeout = max(0.0, min(timeout, hold_end - self._wall() + 0.01))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        self._wake.clear()
        await asyncio.sleep(0.005)  # let a burst of watch events land in one pass

    # -- one pass ----------------------------------------------------------------------

    async def reconcile(self) -> None:
        self.passes += 1
        now = self._clock()
        changed = sorted(self.model.take_changed())
        for i, key in enumerate(changed):
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # a long pass lets watches and timers run
            if self.breaker.enabled:  # the group sizes limits take percentages of
                self.breaker.track(key, self.model.facts(key))
            obs = self.model.observation(key)
            if obs is None:
                continue  # nobody reports on it any more: the engine keeps the last word
            self.engine.observe(self._facts(key), obs.health, obs.message, now)
            if obs.health is not Health.HEALTHY:
                # when it went bad: the agent's change time if known, else this pass
                since = now
                if obs.since is not None:
                    since = now - max(0.0, self._wall() - obs.since)
                self._bad_seen.setdefault(key, since)
                if key not in self._first_seen_at:
                    self._first_seen_at[key] = round(self._wall() - max(0.0, now - since), 3)
            else:
                self._bad_seen.pop(key, None)
        self.outcomes.changed(changed, now)  # a device listed for the first time burns in
        self.aftercare.apply_clears(now)  # drahealth clear: before the engine's answer
        wants = self.engine.wants(now)
        # the provenance stays while the device recovers (its taint is still wanted)
        for key in [k for k in self._first_seen_at if k not in wants and k not in self._bad_seen]:
            del self._first_seen_at[key]
        # ownership filter: held (operator untaint) and frozen (opt-out, exclude) devices
        wants = self.ownership.filter(wants, self.control)
        self._node_sizes = None  # counted again, at most once, in this pass
        wants = self._breaker_pass(wants)  # new taints over a limit are held
        await self._warn_overbroad()
        rule_wants, fallback = self._split(wants, now)
        if self.choice is not None and self.choice.mode != "report-only":
            if self.rules is not None:
                await self._reconcile_rules(rule_wants, now)
            await self.nodes.sync(
                self.ownership.freeze_nodes(self._node_devices(fallback), self.nodes.written())
            )
            await self.quarantine.sync(self._quarantine_devices(fallback), self._holders)
        self._plan_evictions(rule_wants, fallback)
        self._report({k: w for k, (w, mode) in fallback.items() if not self._writes(mode, w)})
        # the node condition in every mode; the node taint never in dry run or report-only
        self.rollup.feed(changed, wants, self._facts, self.model.observation)
        report_only = self.choice is None or self.choice.mode == "report-only"
        may_taint = not (self.policy.dry_run or report_only)
        if await self.rollup.sync(may_taint=may_taint, frozen=self.ownership.opted_out):
            self._wake.set()  # more nodes than one pass writes: go on at once
        self.evictor.gone(self.model.take_gone_pods())
        self._start_validations(now)
        self.aftercare.after_pass(now, self.ownership.frozen)  # escalation and repairs
        self.outcomes.after(now)
        self.metrics.pending_evictions.set(self.evictor.pending)
        self.state.set("holds", self.ownership.state())
        await self._flush_history()
        await self.state.flush()

    # -- modes -----------------------------------------------------------------------

    def device_mode(self, want: Want, key: DeviceKey | None = None) -> str:
        """The mode a device's wanted taint is carried out in (``key``: the device, so
        an observe-only profile's devices are report-only)."""
        observe_only = False
        if key is not None and self.policy.profiles and self.choice is not None:
            profile = self.policy.profile_for(self._facts(key))
            observe_only = profile is not None and profile.observe_only
        return device_mode(self.choice, self.policy, want, observe_only=observe_only)

    @staticmethod
    def _writes(mode: str, want: Want) -> bool:
        """Whether ``mode`` does anything for ``want`` (else it is only reported)."""
        return mode_writes(mode, want)

    def _split(
        self, wants: dict[DeviceKey, Want], now: float
    ) -> tuple[dict[DeviceKey, Want], dict[DeviceKey, tuple[Want, str]]]:
        """(the wants carried out by DeviceTaintRules, the others with their mode)."""
        rules: dict[DeviceKey, Want] = {}
        other: dict[DeviceKey, tuple[Want, str]] = {}
        wall = self._wall()
        for key, want in wants.items():
            mode = self.device_mode(want, key)
            if mode == "taint-rules":
                rules[key] = want
                continue
            other[key] = (want, mode)
            since = self._since_wall.get(key)
            if since is None or since[0] != want.effect:
                self._since_wall[key] = (want.effect, round(wall, 3))
                seen = self._bad_seen.get(key)
                if since is None and seen is not None and self._writes(mode, want):
                    self.metrics.reaction.observe(max(0.0, now - seen))
        for key in [k for k in self._since_wall if k not in other]:
            del self._since_wall[key]
        return rules, other

    def _node_devices(
        self, fallback: dict[DeviceKey, tuple[Want, str]]
    ) -> dict[str, list[NodeDevice]]:
        out: dict[str, list[NodeDevice]] = {}
        for key, (want, mode) in fallback.items():
            if mode not in NODE_MODES or not self._writes(mode, want):
                continue
            node = self._facts(key).node
            if not node:
                if key not in self._no_node:
                    self._no_node.add(key)
                    log.warning("%s: no node known for the device, so no %s", key, mode)
                continue
            out.setdefault(node, []).append(self._node_device(key, want, mode))
        return out

    def _quarantine_devices(
        self, fallback: dict[DeviceKey, tuple[Want, str]]
    ) -> dict[DeviceKey, NodeDevice]:
        """The devices mode quarantine fences now; an opted-out node's stay as written."""
        out: dict[DeviceKey, NodeDevice] = {}
        for key, (want, mode) in fallback.items():
            if mode == QUARANTINE_MODE and self._writes(mode, want):
                out[key] = self._node_device(key, want, mode)
        for key, device in self.quarantine.written().items():
            node = self._facts(key).node
            if key not in out and node and node in self.ownership.opted_out:
                out[key] = device  # frozen: drahealth neither adds nor removes there
        return out

    def _node_device(self, key: DeviceKey, want: Want, mode: str) -> NodeDevice:
        since = self._since_wall.get(key, ("", 0.0))[1]
        return NodeDevice(
            key, mode, want.key, want.value, want.effect, want.rule,
            want.reason[:MAX_REASON], since, self.identity, health_of(want.reason),
            self._first_seen_wall(key),
        )  # fmt: skip

    def _holders(self, key: DeviceKey) -> list[str]:
        """``namespace/name`` of the claims whose allocation holds ``key`` (an operator's
        quarantine claim fences it too: never waited for)."""
        operators = self.quarantine.operator_claims()
        return [
            f"{ns}/{name}"
            for ns, name in self.model.claims_holding(key)
            if f"{ns}/{name}" not in operators
        ]

    async def _seed_quarantine(self) -> None:
        """Resume the devices drahealth fenced with quarantine claims."""
        try:
            found = await self.quarantine.load()
        except ApiError as exc:
            log.warning("listing quarantine claims failed (%s): none resumed", exc.status.message)
            return
        for d in found.values():
            self._seed_row(d, self._facts(d.device).node)

    def _quarantine_changed(self, device: NodeDevice, what: str, claim: str) -> None:
        message = f"{device.device}: {what} ({self.namespace}/{claim})"
        if device.rule:
            message += f"; policy rule {device.rule}"
        if device.reason:
            message += f": {device.reason}"
        log.info("%s", message)
        action = what.split(":", 1)[0].split(" ", 1)[0]  # quarantined, released, waiting
        self._record(f"quarantine-{action}", str(device.device), message)
        reason = {
            "quarantined": "DeviceQuarantined",
            "released": "DeviceReleased",
        }.get(action, "DeviceQuarantineWaiting")
        self.metrics.actions.labels(f"quarantine-{action}").inc()
        ref = ObjectReference(
            apiVersion="resource.k8s.io/v1", kind="ResourceClaim", name=claim,
            namespace=self.namespace,
        )  # fmt: skip
        kind = "Normal" if reason == "DeviceReleased" else "Warning"
        self._spawn(self._event(ref, kind, reason, message))

    async def _seed_nodes(self) -> None:
        """Resume the devices drahealth listed on Nodes (modes node-taint and cordon)."""
        try:
            found = await self.nodes.load()
        except ApiError as exc:
            log.warning(
                "listing nodes failed (%s): no node-level state resumed", exc.status.message
            )
            return
        for node, devices in found.items():
            for d in devices:
                self._seed_row(d, node)

    def _seed_row(self, d: NodeDevice, node: str) -> None:
        """Seed the engine with one device row drahealth wrote (on a Node, or on a
        quarantine claim), its since and its first-seen provenance."""
        now, wall = self._clock(), self._wall()
        facts = DeviceFacts(d.device.driver, d.device.pool, d.device.device, node)
        want = Want(d.effect, d.key, d.value, d.rule, d.reason)
        since = d.since or wall
        self.engine.seed(facts, want, now - max(0.0, wall - since))
        self._since_wall[d.device] = (d.effect, d.since or round(wall, 3))
        if d.first_seen:
            self._first_seen_at.setdefault(d.device, d.first_seen)

    def _node_changed(self, node: str, changes: list[str], devices: Any) -> None:
        listed = ", ".join(str(d.device) for d in devices) or "none"
        message = f"node {node}: {'; '.join(changes)} (unhealthy devices: {listed})"
        log.info("%s", message)
        self._record("node", node, message)
        if any(c.startswith("tainted") for c in changes):
            reason = "NodeTainted"
        elif any(c.startswith("cordoned") for c in changes):
            reason = "NodeCordoned"
        elif any(c.startswith("uncordoned") for c in changes):
            reason = "NodeUncordoned"
        elif any(c.startswith("removed") for c in changes):
            reason = "NodeUntainted"
        else:
            reason = "NodeDevicesUpdated"
        self.metrics.actions.labels(f"node-{reason[4:].lower()}").inc()
        ref = ObjectReference(apiVersion="v1", kind="Node", name=node)
        kind = "Normal" if reason in ("NodeUncordoned", "NodeUntainted") else "Warning"
        self._spawn(self._event(ref, kind, reason, message))

    def _report(self, wants: dict[DeviceKey, Want]) -> None:
        """Report-only: an Event and a history line per change of what would be done."""
        for key in sorted(wants.keys() | self._reported.keys()):
            want = wants.get(key)
            said = None if want is None else (want.effect, want.value)
            if self._reported.get(key) == said:
                continue
            node = self._facts(key).node
            if want is None:
                del self._reported[key]
                message = f"report-only: {key} recovered; the taint would be removed"
                reason, kind = "DeviceWouldBeUntainted", "Normal"
            else:
                self._reported[key] = said  # type: ignore[assignment]
                message = (
                    f"report-only ({self.device_mode(want, key)}): {key} would be tainted "
                    f"{want.key}={want.value}:{want.effect}"
                    + (f" (rule {want.rule})" if want.rule else "")
                    + (f": {want.reason}" if want.reason else "")
                )
                reason, kind = "DeviceWouldBeTainted", "Warning"
            log.info("%s", message)
            self._record("report", str(key), message)
            ref = (
                ObjectReference(apiVersion="v1", kind="Node", name=node)
                if node
                else ObjectReference(
                    apiVersion="v1", kind="ConfigMap", name=HISTORY_CONFIGMAP,
                    namespace=self.namespace,
                )
            )  # fmt: skip
            self._spawn(self._event(ref, kind, reason, message))

    async def _warn_overbroad(self) -> None:
        pending, self._overbroad = self._overbroad, []
        for name, generation, scope in pending:
            if (name, generation) in self._warned:
                continue
            self._warned[(name, generation)] = None
            while len(self._warned) > MAX_WARNED:
                del self._warned[next(iter(self._warned))]
            reach = "every device in the cluster" if scope == "all" else "devices of every driver"
            message = (
                f"DeviceTaintRule {name} (generation {generation}) has "
                + ("an empty device selector" if scope == "all" else "no driver in its selector")
                + f", so it reaches {reach} (kubernetes #141422); drahealth does not act on it "
                "and evicts nothing for it: give it driver, pool and device"
            )
            log.warning("%s", message)
            self._record("over-broad", name, message)
            ref = ObjectReference(apiVersion=self._rules_api, kind="DeviceTaintRule", name=name)
            await self._event(ref, "Warning", "OverBroadDeviceTaintRule", message)

    # -- circuit breaker -------------------------------------------------------------

    def _breaker_pass(self, wants: dict[DeviceKey, Want]) -> dict[DeviceKey, Want]:
        return self.breaker.apply(
            wants,
            writes=self._breaker_counts,
            facts=self._facts,
            carrying=self._carrying,
            control=self.control.values,
            written=self._written_taints,
            state=self.state,
            now=self._steady_wall(),
            cost=self._breaker_cost,
        )

    def _breaker_counts(self, key: DeviceKey, want: Want) -> bool:
        """Whether carrying ``want`` out writes a taint the breaker counts (the burn-in
        gate's taints are a gate, not a remediation: never held)."""
        return want.rule != BURN_IN_RULE and self._writes(self.device_mode(want, key), want)

    def _breaker_cost(self, key: DeviceKey, want: Want) -> int:
        """The devices carrying out ``want`` makes unusable: the device itself, or, in
        modes node-taint and cordon, every device of its node unless drahealth fences
        that node already (counted once per pass's node)."""
        if self.device_mode(want, key) not in NODE_MODES:
            return 1
        node = self._facts(key).node
        if not node or node in self.nodes.written():
            return 1
        if self._node_sizes is None:  # devices a slice publishes or an agent reports
            per_node: dict[str, set[DeviceKey]] = {}
            for k, f in self.model.all_facts().items():
                if f.node:
                    per_node.setdefault(f.node, set()).add(k)
            for k, obs in self.model.observations().items():
                if obs.node:
                    per_node.setdefault(obs.node, set()).add(k)
            self._node_sizes = Counter({n: len(keys) for n, keys in per_node.items()})
        return max(1, self._node_sizes.get(node, 1))

    def _carrying(self) -> set[DeviceKey]:
        """Devices carrying the controller's taint now: its rules and its Node lists."""
        out = {d.device for devices in self.nodes.written().values() for d in devices}
        out |= self.quarantine.written().keys()
        for rule in self.rules.store.list() if self.rules is not None else ():
            sel = rule.spec.deviceSelector if is_ours(rule) and rule.spec is not None else None
            if sel is not None and sel.driver and sel.pool and sel.device:
                out.add(DeviceKey(sel.driver, sel.pool, sel.device))
        return out

    def _steady_wall(self) -> float:
        """Unix time for the breaker's window: the wall clock as read at the start, moved
        on by the monotonic clock, so a wall clock set back or forward by hours while
        this replica leads neither empties the window nor holds it for hours."""
        return self._wall_start + (self._clock() - self._clock_start)

    def _written_taints(self) -> list[tuple[DeviceKey, float]]:
        """Taints the controller wrote, with when, as the API shows them: its rules
        (creation time), its node rows and quarantine claims (since) and the history's
        taint and quarantine lines."""
        out: list[tuple[DeviceKey, float]] = []
        for devices in self.nodes.written().values():
            out += [(d.device, d.since) for d in devices if d.since]
        out += [(k, d.since) for k, d in self.quarantine.written().items() if d.since]
        for rule in self.rules.store.list() if self.rules is not None else ():
            sel = rule.spec.deviceSelector if is_ours(rule) and rule.spec is not None else None
            created = rule.metadata.creationTimestamp if rule.metadata is not None else None
            if sel is not None and sel.driver and sel.pool and sel.device and created:
                out.append((DeviceKey(sel.driver, sel.pool, sel.device), created.timestamp()))
        for row in self._history:  # the least trusted record: checked against the slices
            if not isinstance(row, dict) or row.get("action") not in (
                "create",
                "node",
                "quarantine-quarantined",
            ):
                continue
            at = parse_rfc3339(str(row.get("time", ""))[:MAX_TIME_TEXT])
            if at is None:
                continue
            subject = str(row.get("subject", ""))[:MAX_SUBJECT]
            subjects, node = [subject], ""
            if row.get("action") == "node":  # "... (unhealthy devices: a, b)"
                listed = str(row.get("message", "")).rpartition("(unhealthy devices: ")[2]
                subjects, node = [t.strip() for t in listed.rstrip(")").split(",")], subject
            for text in subjects[:MAX_ROW_DEVICES]:
                try:
                    key = DeviceKey.parse(text)
                except ValueError:
                    continue
                facts = self.model.facts(key)
                # only a device a slice publishes, on the node the row names: a row
                # naming devices nobody publishes, or another node's, counts for nothing
                if facts is not None and (not node or facts.node in ("", node)):
                    out.append((key, at))
        return out

    def _breaker_notify(self, node: str, kind: str, reason: str, message: str) -> None:
        ref = (
            ObjectReference(apiVersion="v1", kind="Node", name=node)
            if node
            else ObjectReference(
                apiVersion="v1", kind="ConfigMap", name=HISTORY_CONFIGMAP,
                namespace=self.namespace,
            )
        )  # fmt: skip
        self._spawn(self._event(ref, kind, reason, message))

    def _spawn(self, coro: Any) -> None:
        """Run ``coro`` (an Event, a validation) in the background: held until it ends,
        and a failure (a write refused once the Lease is lost) is one log line."""
        name = getattr(coro, "__qualname__", "background task")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._spawned.add(task)
        task.add_done_callback(self._spawn_done)

    def _spawn_done(self, task: asyncio.Task[Any]) -> None:
        self._spawned.discard(task)
        exc = None if task.cancelled() else task.exception()
        if isinstance(exc, LeaseLost):
            log.info("%s: %s", task.get_name(), exc)
        elif exc is not None:
            log.warning("%s failed: %s", task.get_name(), str(exc) or type(exc).__name__)

    def _facts(self, key: DeviceKey) -> DeviceFacts:
        """The device's facts from its slice; the node from its observation if need be."""
        f = self.model.facts(key)
        if f is not None and f.node:
            return f
        obs = self.model.observation(key)
        node = obs.node if obs is not None else ""
        if f is None:
            return DeviceFacts(key.driver, key.pool, key.device, node)
        return DeviceFacts(f.driver, f.pool, f.device, node, f.attributes)

    def _seed(self) -> None:
        if self.rules is None:
            return
        now, wall = self._clock(), self._wall()
        for rule in self.rules.store.list():
            if not is_ours(rule) or rule.spec is None or rule.metadata is None:
                continue
            sel, taint = rule.spec.deviceSelector, rule.spec.taint
            if sel is None or not (sel.driver and sel.pool and sel.device):
                continue
            added = taint.timeAdded.timestamp() if taint.timeAdded is not None else wall
            annotations = rule.metadata.annotations or {}
            facts = DeviceFacts(
                sel.driver, sel.pool, sel.device, annotations.get(ANNOTATION_NODE, "")
            )
            want = Want(
                taint.effect,
                taint.key,
                taint.value or "",
                annotations.get(ANNOTATION_RULE, ""),
                annotations.get(ANNOTATION_REASON, ""),
            )
            self.engine.seed(facts, want, now - max(0.0, wall - added))
            first_seen = parse_rfc3339(annotations.get(ANNOTATION_FIRST_SEEN, ""))
            if first_seen is not None:
                key = DeviceKey(sel.driver, sel.pool, sel.device)
                self._first_seen_at.setdefault(key, round(first_seen, 3))

    async def _reconcile_rules(self, wants: dict[DeviceKey, Want], now: float) -> None:
        desired: dict[str, tuple[DeviceKey, JSON]] = {}
        bodies: dict[tuple[DeviceKey, Want, str, str], JSON] = {}
        for key, want in wants.items():
            effect, node = self._written_effect(want.effect), self._facts(key).node
            # a pass runs per watch event: a device's body is built again only when what
            # it is made of changed (bodies are only read, never changed, once built)
            ident = (key, want, effect, node)
            body = self._bodies.get(ident)
            if body is None:
                body = rule_body(
                    DeviceRef(key.driver, key.pool, key.device),
                    key=want.key,
                    value=want.value,
                    effect=effect,
                    node=node,
                    policy_rule=want.rule,
                    reason=want.reason,
                    writer=self.identity,
                    first_seen=self._first_seen(key),
                )
                why = burn_in_why(want.value) if want.key == BURN_IN_TAINT_KEY else None
                if why is not None:  # says why the device burns in; a restart resumes it
                    body["metadata"]["annotations"][ANNOTATION_BURN_IN] = why
            bodies[ident] = body
            body = self.aftercare.annotate(key, body)  # drahealth.io/needs-human
            desired[body["metadata"]["name"]] = (key, body)
        self._bodies = bodies
        self._rule_names = {key: name for name, (key, _) in desired.items()}
        assert self.rules is not None
        existing = {
            str(r.metadata.name): r
            for r in self.rules.store.list()
            if r.metadata is not None and is_ours(r)
        }
        for name, (key, body) in sorted(desired.items()):
            current = existing.get(name)
            taint = body["spec"]["taint"]
            if current is None and self._foreign_name(name):
                continue  # someone else's rule has our name: never touched
            if current is None:
                if await self._write_rule("create", body):
                    seen = self._bad_seen.get(key)
                    if seen is not None:
                        self.metrics.reaction.observe(max(0.0, now - seen))
            else:
                ct = current.spec.taint if current.spec else None
                if (
                    ct is None
                    or self.aftercare.stale(current, body)
                    or (
                        ct.effect,
                        ct.value or "",
                    )
                    != (taint["effect"], taint.get("value", ""))
                ):
                    updated = as_dict(current)
                    updated["spec"]["taint"] = {**(updated["spec"].get("taint") or {}), **taint}
                    updated["spec"]["taint"].pop("timeAdded", None)
                    kept = (current.metadata.annotations or {}) if current.metadata else {}
                    updated["metadata"]["annotations"] = dict(body["metadata"]["annotations"])
                    if kept.get(ANNOTATION_FIRST_SEEN):  # the bad period's start stays
                        updated["metadata"]["annotations"][ANNOTATION_FIRST_SEEN] = kept[
                            ANNOTATION_FIRST_SEEN
                        ]
                    await self._write_rule("update", updated)
            if taint["effect"] == "None":
                await self._impact_summary(name, key)
        for name, rule in sorted(existing.items()):
            if name not in desired and not self.ownership.keeps_rule(rule):
                await self._write_rule("delete", as_dict(rule))

    def _first_seen_wall(self, key: DeviceKey) -> float:
        """Wall time the device's bad health was first observed (0: not known)."""
        return self._first_seen_at.get(key, 0.0)

    def _first_seen(self, key: DeviceKey) -> str:
        wall = self._first_seen_wall(key)
        return format_time(wall) if wall else ""

    def _foreign_name(self, name: str) -> bool:
        """Whether a rule the controller did not create has ``name`` (said once)."""
        assert self.rules is not None
        other = self.rules.store.get(None, name)
        if other is None or is_ours(other):
            self._foreign_named.discard(name)
            return False
        if name not in self._foreign_named:
            self._foreign_named.add(name)
            message = (
                f"DeviceTaintRule {name} exists but was not created by the controller: "
                "it is left as it is, and the controller writes no rule of that name"
            )
            log.warning("%s", message)
            self._record("foreign-rule", name, message)
            ref = ObjectReference(apiVersion=self._rules_api, kind="DeviceTaintRule", name=name)
            self._spawn(self._event(ref, "Warning", "ForeignDeviceTaintRule", message, "Skip"))
        return True

    def _written_effect(self, effect: str) -> str:
        """In eviction mode pods leave through PDB-aware evictions, so the rule says
        NoSchedule: a NoExecute rule would let the cluster's taint eviction controller
        delete the same pods without asking their budgets."""
        if effect == "NoExecute" and self.policy.eviction.mode == "evict":
            return "NoSchedule"
        return effect

    async def _write_rule(self, action: str, body: JSON) -> bool:
        name = body["metadata"]["name"]
        cls = self._rule_cls
        if action != "delete":
            scope = selector_scope(body["spec"].get("deviceSelector"))
            if scope != "device":  # never write a rule reaching more than one device
                raise RuleError(f"refusing to {action} DeviceTaintRule {name}: selector {scope}")
            body = {**body, "apiVersion": self._rules_api}
        try:
            if action == "create":
                await self.client.create(cls.from_dict(body))
            elif action == "update":
                await self.client.replace(cls.from_dict(body))
            else:
                meta = body.get("metadata") or {}
                self.ownership.deleting(name)  # not an operator's untaint
                try:  # only the rule as read: a changed or re-created one is a 409
                    await delete_with_preconditions(
                        self.client, cls, name,
                        uid=meta.get("uid"), resource_version=meta.get("resourceVersion"),
                    )  # fmt: skip
                except ROUND_ERRORS:
                    raise  # it may have happened: the rule going is still the controller's
                except BaseException:
                    self.ownership.delete_failed(name)
                    raise
        except ROUND_ERRORS:
            # no answer: the write may have happened. The round restarts from the API and
            # the next one says what was done (see _settle_unanswered)
            self._unanswered[name] = (action, body)
            raise
        except ApiError as exc:
            if action == "create" and exc.status.code == 409:
                return False  # the reflector will show it; next pass compares
            if action == "delete" and exc.status.code == 404:
                return False
            if action in ("delete", "update") and exc.status.code == 409:
                # changed since it was read: the reflector brings the change, and the
                # next pass decides again on what the API holds
                log.info("%s devicetaintrule/%s: changed meanwhile: %s", action, name,
                         exc.status.message)  # fmt: skip
                self._wake.set()
                return False
            log.warning("%s devicetaintrule/%s failed: %s", action, name, exc.status.message)
            self.metrics.failures.labels(action).inc()
            return False
        await self._rule_written(action, body)
        return True

    async def _settle_unanswered(self) -> None:
        """Rule writes whose answer was lost before the round restarted: the rules as
        listed now say whether each happened. Those that did are recorded as if they
        had been answered (metrics, history, Event), once; the others are left to the
        passes, which decide again and record what they write."""
        pending, self._unanswered = self._unanswered, {}
        if self.rules is None:
            return
        for name, (action, body) in sorted(pending.items()):
            found = self.rules.store.get(None, name)
            raw = to_internal(as_dict(found)) if found is not None else None
            if action == "delete":
                done = raw is None or (raw.get("metadata") or {}).get("uid") != (
                    body.get("metadata") or {}
                ).get("uid")
            else:
                spec = (raw or {}).get("spec") or {}
                want = body["spec"]
                done = (
                    raw is not None
                    and is_ours(raw)
                    and spec.get("deviceSelector") == want.get("deviceSelector")
                    and (spec.get("taint") or {}).get("effect") == want["taint"].get("effect")
                    and (spec.get("taint") or {}).get("value") == want["taint"].get("value")
                )
            log.info(
                "%s devicetaintrule/%s, whose answer was lost: %s", action, name,
                "it happened" if done else "it did not happen",
            )  # fmt: skip
            if done:
                await self._rule_written(action, body)

    async def _rule_written(self, action: str, body: JSON) -> None:
        """Metrics, log line, history row and Event of a rule write that happened."""
        name = body["metadata"]["name"]
        self.metrics.actions.labels(action).inc()
        sel = body["spec"]["deviceSelector"]
        taint = body["spec"]["taint"]
        device = f"{sel['driver']}/{sel['pool']}/{sel['device']}"
        annotations = body["metadata"].get("annotations") or {}
        verb = {"create": "tainted", "update": "re-tainted", "delete": "untainted"}[action]
        message = (
            f"{verb} {device}: {taint['key']}={taint.get('value', '')}:{taint['effect']}"
            + (
                f" (rule {annotations[ANNOTATION_RULE]})"
                if annotations.get(ANNOTATION_RULE)
                else ""
            )
            + (
                f": {annotations[ANNOTATION_REASON]}"
                if annotations.get(ANNOTATION_REASON) and action != "delete"
                else ""
            )
        )
        log.info("%s", message)
        self._record(action, device, message)
        await self._event(
            ObjectReference(apiVersion=self._rules_api, kind="DeviceTaintRule", name=name),
            "Normal" if action == "delete" else "Warning",
            {
                "create": "DeviceTainted",
                "update": "DeviceTaintChanged",
                "delete": "DeviceUntainted",
            }[action],
            message,
            action={"create": "Taint", "update": "Taint", "delete": "Untaint"}[action],
        )

    async def _impact_summary(self, name: str, key: DeviceKey) -> None:
        pods = [
            p for p in self.model.consumers(key)
            if p.namespace not in self.policy.exclude_namespaces
        ]  # fmt: skip
        namespaces = sorted({p.namespace for p in pods})
        message = (
            f"dry run (effect None): NoExecute would evict {len(pods)} pod(s)"
            + (f" in namespace(s) {', '.join(namespaces)}" if namespaces else "")
            + f"; devices: 1 ({key})"
        )
        if self._impact.get(name) == message or not getattr(self.choice, "effect_none", True):
            return
        condition = {
            "type": "EvictionInProgress",
            "status": "False",
            "reason": "DryRun",
            "message": message,
            "lastTransitionTime": now_rfc3339(),
        }
        try:
            await self.client.patch(
                self._rule_cls.Status,
                name,
                {"status": {"conditions": [condition]}},
                patch_type=PatchType.MERGE,
            )
        except ApiError as exc:
            log.debug("impact summary on devicetaintrule/%s: %s", name, exc.status.message)
            return
        self._impact[name] = message
        await self._event(
            ObjectReference(apiVersion=self._rules_api, kind="DeviceTaintRule", name=name),
            "Normal",
            "DryRunImpact",
            message,
        )

    # -- evictions -----------------------------------------------------------------------

    def _plan_evictions(
        self, wants: dict[DeviceKey, Want], fallback: dict[DeviceKey, tuple[Want, str]]
    ) -> None:
        """Pods of NoExecute devices: by the Evictor in eviction mode ``evict`` for rules,
        and always in the modes without rules (nothing else would move them). In mode
        ``delete`` the cluster's eviction controller moves the claims' users, but not the
        pods that got the device through an extended resource (k/k #141290): the Evictor
        takes those."""
        self._evict_due = None
        if self.policy.dry_run:
            self.evictor.want([])
            return
        # (device, want, since, extended only, mode)
        todo: list[tuple[DeviceKey, Want, float | None, bool, str]] = []
        only_extended = self.policy.eviction.mode != "evict"
        for key, want in wants.items():
            if only_extended and want.effect != "NoExecute":
                continue
            source = f"devicetaintrule/{self._rule_names.get(key, '')}"
            added = next((t.added for t in self.model.taints(key) if t.source == source), None)
            todo.append((key, want, added, only_extended, "taint-rules"))
        for key, (want, mode) in fallback.items():
            if mode != "report-only":
                todo.append((key, want, self._since_wall.get(key, ("", None))[1], False, mode))
        out: list[tuple[Consumer, str]] = []
        related: dict[tuple[str, str], ObjectReference] = {}  # pod -> the taint it leaves
        wall = self._wall()
        for key, want, added, extended_only, mode in todo:
            if want.effect != "NoExecute":
                continue
            taint = Taint(want.key, want.value, want.effect)
            leaving, later = self.model.evictions(key, taint, added, wall)
            if later is not None and (self._evict_due is None or later < self._evict_due):
                self._evict_due = later
            for pod in leaving:
                if pod.namespace in self.policy.exclude_namespaces or (
                    extended_only and not pod.extended
                ):
                    continue
                why = self._eviction_why(key, want, mode)
                out.append((pod, why))
                related[(pod.namespace, pod.name)] = self._taint_ref(key)
        self._evict_related = related
        self.evictor.want(out)

    def _eviction_why(self, key: DeviceKey, want: Want, mode: str) -> str:
        """Why a pod of ``key`` is evicted, naming what was written (a DeviceTaintRule's
        taint, a quarantine claim, a node taint or cordon, or nothing)."""
        rule = f"policy rule {want.rule or '?'} ({want.reason or 'no reason given'})"
        if mode == "taint-rules":
            return f"device {key} is tainted {want.key}={want.value}:NoExecute by {rule}"
        wanted = f"device {key} is bad and {rule} wants it NoExecute"
        node = self._facts(key).node
        if mode == QUARANTINE_MODE:
            claim = f"{self.namespace}/{claim_name(key)}"
            if key in self.quarantine.written():
                return f"{wanted}; it is quarantined by claim {claim}"
            return f"{wanted}; claim {claim} quarantines it once no other claim holds it"
        if mode == "node-taint":
            value = next(
                (d.value for d in self.nodes.written().get(node, ()) if d.device == key), ""
            )
            taint = node_taints(self.nodes.written().get(node, ())).get(want.key, value)
            return f"{wanted}; node {node} is tainted {want.key}={taint}:NoSchedule"
        if mode == "cordon":
            return f"{wanted}; node {node} is cordoned"
        return f"{wanted} (mode {mode}: nothing else fences it)"

    def _taint_ref(self, key: DeviceKey) -> ObjectReference:
        """What fences ``key``: the controller's DeviceTaintRule, its quarantine claim,
        else the device's Node."""
        name = self._rule_names.get(key)
        if name:
            return ObjectReference(apiVersion=self._rules_api, kind="DeviceTaintRule", name=name)
        if self.quarantine.keeps(key):
            return ObjectReference(
                apiVersion="resource.k8s.io/v1", kind="ResourceClaim",
                name=claim_name(key), namespace=self.namespace,
            )  # fmt: skip
        return ObjectReference(apiVersion="v1", kind="Node", name=self._facts(key).node)

    def _eviction_event(self, pod: Consumer, kind: str, message: str) -> None:
        self.metrics.actions.labels(f"evict-{kind}").inc()
        ref = ObjectReference(
            apiVersion="v1", kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid
        )
        if kind == "evicted":
            text = f"evicted pod {pod.namespace}/{pod.name}: {message}"
            reason, kind_ = "DeviceTaintEviction", "Warning"
        elif kind == "blocked":
            text = f"eviction of pod {pod.namespace}/{pod.name} refused: {message}"
            reason, kind_ = "EvictionBlocked", "Warning"
        else:
            text = f"eviction of pod {pod.namespace}/{pod.name} failed: {message}"
            reason, kind_ = "EvictionFailed", "Warning"
        log.info("%s", text)
        self._record(f"evict-{kind}", f"{pod.namespace}/{pod.name}", text)
        related = self._evict_related.get((pod.namespace, pod.name))
        self._spawn(self._event(ref, kind_, reason, text, "Evict", related))

    # -- validation hooks ----------------------------------------------------------------

    def _start_validations(self, now: float) -> None:
        for key in self.ownership.thawed():  # its recovery window restarts after a freeze
            self.engine.validated(key, False, now)
        for key in self.engine.pending_validations(now):
            rule = self.engine.rule_of(key)
            check = rule.recovery.validate if rule is not None else None
            if check is None or key in self._validating:
                continue
            if self.ownership.defer_validation(key):
                continue  # frozen (opt-out, exclude): no validation or repair
            self._validating.add(key)
            node = self._facts(key).node
            task = asyncio.get_running_loop().create_task(self._validate(key, node, check))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    async def _validate(self, key: DeviceKey, node: str, check: Validate) -> None:
        """Run the recovery check through :func:`run_check` (the bounded child runner for
        ``exec``, no redirects for ``http``). Its result goes to the engine of the round
        that started it only: a restarted round decides again from the API."""
        engine, validating = self.engine, self._validating
        try:
            ok, detail = await run_check(check, key, node)
        finally:
            validating.discard(key)
        if engine is not self.engine:
            return
        engine.validated(key, ok, self._clock())
        self._record(
            "validate", str(key), f"validation of {key} {'passed' if ok else 'failed'}: {detail}"
        )
        self._wake.set()

    # -- audit trail ---------------------------------------------------------------------

    def _record(self, action: str, subject: str, message: str) -> None:
        row = {
            "time": now_rfc3339(),
            "by": self.identity,
            "action": action,
            "subject": subject,
            "message": message,
        }
        self._history.append(row)
        self._pending.append(row)
        self._history_dirty = True

    async def _load_history(self) -> None:
        try:
            cm = await self.client.get(ConfigMap, HISTORY_CONFIGMAP, namespace=self.namespace)
        except ApiError:
            return
        self._history.extend(_history_rows(cm))

    async def _flush_history(self) -> None:
        """Append the rows recorded since the last flush to the ConfigMap's: a
        read-modify-write guarded by the resourceVersion, so rows another writer added
        meanwhile are kept, never overwritten (a 409 reads again)."""
        if not self._history_dirty:
            return
        for _ in range(MAX_CONFLICTS):
            try:
                cm: ConfigMap | None = await self.client.get(
                    ConfigMap, HISTORY_CONFIGMAP, namespace=self.namespace
                )
            except ApiError as exc:
                if exc.status.code != 404:
                    log.warning("reading the remediation history failed: %s", exc.status.message)
                    return
                cm = None
            rows = _history_rows(cm) if cm is not None else []
            rows += [r for r in self._pending if r not in rows]
            rows = rows[-HISTORY_LENGTH:]
            data = {"history": json.dumps(rows, ensure_ascii=False)}
            try:
                if cm is None:
                    meta = ObjectMeta(
                        name=HISTORY_CONFIGMAP,
                        namespace=self.namespace,
                        labels={MANAGED_BY: CONTROLLER_LABEL},
                    )
                    await self.client.create(ConfigMap(metadata=meta, data=data))
                else:
                    cm.data = {**(cm.data or {}), **data}  # resourceVersion: the one read
                    await self.client.replace(cm)
            except ApiError as exc:
                if exc.status.code == 409:
                    continue  # written meanwhile (or created): read again, merge again
                log.warning("writing the remediation history failed: %s", exc.status.message)
                return
            self._history = deque(rows, maxlen=HISTORY_LENGTH)
            self._pending.clear()
            self._history_dirty = False
            return
        log.warning("writing the remediation history: it kept changing; retried next pass")

    async def _involved_uid(self, ref: ObjectReference) -> None:
        """Fill ``ref.uid`` (kubectl describe selects an object's Events by it): from the
        object, or the uid last seen for it when it is gone (a deleted rule)."""
        ident = (ref.kind or "", ref.namespace or "", ref.name or "")
        cls = {"Node": Node, "ConfigMap": ConfigMap, "DeviceTaintRule": self._rule_cls}.get(
            ident[0]
        )
        if cls is not None and ref.name:
            try:
                obj = await self.client.get(cls, ref.name, namespace=ref.namespace)
                uid = getattr(obj.metadata, "uid", None)
                if uid:
                    self._uids.pop(ident, None)
                    self._uids[ident] = uid
                    while len(self._uids) > MAX_WARNED:
                        del self._uids[next(iter(self._uids))]
            except ApiError as exc:
                log.debug("uid of %s/%s for its event: %s", ident[0], ident[2], exc.status.message)
            except TRANSPORT_ERRORS as exc:  # the Event is written without it
                log.debug("uid of %s/%s for its event: %s", ident[0], ident[2], exc)
        ref.uid = self._uids.get(ident)

    async def _event(
        self,
        ref: ObjectReference,
        kind: str,
        reason: str,
        message: str,
        action: str | None = None,
        related: ObjectReference | None = None,
    ) -> None:
        """Record an Event about ``ref``; ``action`` (Taint, Untaint, Evict, Hold, ...)
        and ``related`` (e.g. the rule behind an eviction) are its events.k8s.io fields."""
        if not ref.uid:
            await self._involved_uid(ref)
        event = make_event(  # in ref's namespace; "default" for a rule or Node (server rule)
            name=f"{ref.name}.{uuid.uuid4().hex[:16]}",
            involved=ref,
            event_type=kind,
            reason=reason,
            message=message,
            component=COMPONENT,
            instance=self.identity,
            action=action,
            related=related,
        )
        try:
            await self.client.create(event)
        except ApiError as exc:
            self._event_refused(event, reason, exc.status.code or 0, exc.status.message or "")
        except TRANSPORT_ERRORS as exc:
            # no answer (Events in an etcd of their own that is down, a slow webhook on
            # Events): the Event is the audit trail's second copy, so it is missing like a
            # refused one; the round goes on, and the next write that needs the server
            # restarts it if the server is gone altogether
            self._event_refused(event, reason, 0, f"no answer: {type(exc).__name__}: {exc}")

    def _event_refused(self, event: Event, reason: str, code: int, message: str) -> None:
        """A refused (or unanswered: code 0) Event is a hole in the audit trail: a warning
        the first time for each (reason, HTTP code), then debug lines; counted as
        failures{action="event"}."""
        self.metrics.failures.labels("event").inc()
        where = event.metadata.namespace if event.metadata else ""
        if (reason, code) in self._events_refused:
            log.debug("recording event %s in %s refused: %s", reason, where, message)
            return
        self._events_refused[(reason, code)] = None
        while len(self._events_refused) > MAX_WARNED:
            del self._events_refused[next(iter(self._events_refused))]
        log.warning(
            "recording event %s in namespace %s was refused (HTTP %s: %s): such Events are "
            "missing from the audit trail (the history ConfigMap still has the record); "
            "further refusals of %s are logged at debug level",
            reason, where, code or "none", message, reason,
        )  # fmt: skip
