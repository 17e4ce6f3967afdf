"""The remediation controller: device health -> DeviceTaintRules -> evictions -> untaint.

Owns :class:`RemediationController`, the leader's work. It reflects Pods, ResourceClaims,
ResourceSlices, DeviceTaintRules and the agents' device-health ConfigMaps into the
core's :class:`ClusterModel`, one watch event at a time; on every change (and at the
engine's next deadline) it runs one pass, which costs O(devices whose observation
changed) plus O(devices that want a taint):

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
import os
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp
from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.resources.core_v1 import ConfigMap, Pod
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from drahealth._aio import cancel_and_wait
from drahealth._time import now_rfc3339
from drahealth.core import (
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
)
from drahealth.kube import Reflector, as_dict, make_event, write_configmap_data
from drahealth.remedy._evict import Evictor
from drahealth.remedy._metrics import ControllerMetrics
from drahealth.remedy._rules import (
    ANNOTATION_NODE,
    ANNOTATION_REASON,
    ANNOTATION_RULE,
    CONTROLLER_LABEL,
    MANAGED_BY,
    DeviceRef,
    is_ours,
    rule_body,
)

__all__ = ["HISTORY_CONFIGMAP", "RemediationController"]

log = logging.getLogger(__name__)

HISTORY_CONFIGMAP = "drahealth-remediation-history"
HISTORY_LENGTH = 200
COMPONENT = "drahealth-controller"
JSON = dict[str, Any]


def _release_list_memory() -> None:
    """Hand the heap the initial LISTs used (their bodies, decoded once) back to the OS.

    glibc keeps freed memory in the process; at 50,000 pods that is hundreds of MB the
    controller never needs again. Elsewhere (no glibc) this only runs the collector.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


#: A pass yields to the event loop after this many devices observed.
YIELD_EVERY = 500


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
    ) -> None:
        self.client = client
        self.policy = policy
        self.identity = identity
        self.namespace = namespace
        self.metrics = metrics or ControllerMetrics()
        self._clock = clock
        self._wall = wall
        self.engine = RemedyEngine(policy)
        self.pods: Reflector[Pod] = Reflector(client, Pod, name="remedy-pods")
        self.claims: Reflector[ResourceClaim] = Reflector(
            client, ResourceClaim, name="remedy-claims"
        )
        self.slices: Reflector[ResourceSlice] = Reflector(
            client, ResourceSlice, name="remedy-slices"
        )
        self.rules: Reflector[DeviceTaintRule] = Reflector(
            client, DeviceTaintRule, name="remedy-rules"
        )
        self.health: Reflector[ConfigMap] = Reflector(
            client,
            ConfigMap,
            namespace=namespace,  # the agents publish there: no cluster-wide ConfigMap read
            labels={"app.kubernetes.io/component": "device-health"},
            name="remedy-device-health",
        )
        self.evictor = Evictor(client, policy.eviction, on_event=self._eviction_event)
        self.model = ClusterModel(records_namespace=namespace)
        self._feeds: list[tuple[Reflector[Any], Callable[..., None]]] = [
            (self.pods, self._feed("Pod")),
            (self.claims, self._feed("ResourceClaim")),
            (self.slices, self._feed("ResourceSlice")),
            (self.rules, self._feed("DeviceTaintRule")),
            (self.health, self._feed("ConfigMap")),
        ]
        self._rule_names: dict[DeviceKey, str] = {}  # device -> our rule's name
        self._bodies: dict[tuple[DeviceKey, Want, str, str], JSON] = {}  # last pass's bodies
        self._evict_due: float | None = None  # wall time a tolerated eviction falls due
        self._wake = asyncio.Event()
        self._bad_seen: dict[DeviceKey, float] = {}  # first bad observation, for latency
        self._validating: set[DeviceKey] = set()
        self._history: deque[JSON] = deque(maxlen=HISTORY_LENGTH)
        self._history_dirty = False
        self._impact: dict[str, str] = {}  # rule name -> last impact message written
        self.passes = 0

    # -- lifecycle -------------------------------------------------------------------

    async def run(self) -> None:
        reflectors = [r for r, _ in self._feeds]
        for r, feed in self._feeds:
            r.add_handler(feed)
        tasks: list[asyncio.Task[None]] = []
        try:
            for r in reflectors:
                await r.start()
            for r in reflectors:
                await r.wait_synced()
            await self._load_history()
            self._seed()
            _release_list_memory()
            tasks.append(asyncio.create_task(self.evictor.run(), name="evictor"))
            log.info("%s: remediation controller active", self.identity)
            while True:
                await self.reconcile()
                await self._sleep()
        finally:
            await cancel_and_wait(tasks)
            for r, feed in self._feeds:
                r.remove_handler(feed)
                await r.stop()

    def _feed(self, kind: str) -> Callable[..., None]:
        def on_event(event_type: str, obj: Any, _old: Any) -> None:
            self.model.apply(kind, event_type, as_dict(obj))
            self._wake.set()

        return on_event

    async def _sleep(self) -> None:
        now = self._clock()
        due = self.engine.next_wakeup(now)
        timeout = 1.0 if due is None else max(0.0, min(1.0, due - now))
        if self._evict_due is not None:
            timeout = max(0.0, min(timeout, self._evict_due - self._wall()))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        self._wake.clear()
        await asyncio.sleep(0.005)  # let a burst of watch events land in one pass

    # -- one pass ----------------------------------------------------------------------

    async def reconcile(self) -> None:
        self.passes += 1
        now = self._clock()
        for i, key in enumerate(sorted(self.model.take_changed())):
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # a long pass lets watches and timers run
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
            else:
                self._bad_seen.pop(key, None)
        wants = self.engine.wants(now)
        await self._reconcile_rules(wants, now)
        self._plan_evictions(wants)
        self.evictor.gone(self.model.take_gone_pods())
        self._start_validations(now)
        self.metrics.pending_evictions.set(self.evictor.pending)
        await self._flush_history()

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
                )
            bodies[ident] = body
            desired[body["metadata"]["name"]] = (key, body)
        self._bodies = bodies
        self._rule_names = {key: name for name, (key, _) in desired.items()}
        existing = {
            str(r.metadata.name): r
            for r in self.rules.store.list()
            if r.metadata is not None and is_ours(r)
        }
        for name, (key, body) in sorted(desired.items()):
            current = existing.get(name)
            taint = body["spec"]["taint"]
            if current is None:
                if await self._write_rule("create", body):
                    seen = self._bad_seen.get(key)
                    if seen is not None:
                        self.metrics.reaction.observe(max(0.0, now - seen))
            else:
                ct = current.spec.taint if current.spec else None
                if ct is None or (ct.effect, ct.value or "") != (
                    taint["effect"],
                    taint.get("value", ""),
                ):
                    updated = as_dict(current)
                    updated["spec"]["taint"] = {**(updated["spec"].get("taint") or {}), **taint}
                    updated["spec"]["taint"].pop("timeAdded", None)
                    updated["metadata"]["annotations"] = dict(body["metadata"]["annotations"])
                    await self._write_rule("update", updated)
            if taint["effect"] == "None":
                await self._impact_summary(name, key)
        for name, rule in sorted(existing.items()):
            if name not in desired:
                await self._write_rule("delete", as_dict(rule))

    def _written_effect(self, effect: str) -> str:
        """In eviction mode pods leave through PDB-aware evictions, so the rule says
        NoSchedule: a NoExecute rule would let the cluster's taint eviction controller
        delete the same pods without asking their budgets."""
        if effect == "NoExecute" and self.policy.eviction.mode == "evict":
            return "NoSchedule"
        return effect

    async def _write_rule(self, action: str, body: JSON) -> bool:
        name = body["metadata"]["name"]
        try:
            if action == "create":
                await self.client.create(DeviceTaintRule.from_dict(body))  # type: ignore[call-overload]
            elif action == "update":
                await self.client.replace(DeviceTaintRule.from_dict(body))  # type: ignore[call-overload]
            else:
                await self.client.delete(DeviceTaintRule, name)
        except ApiError as exc:
            if action == "create" and exc.status.code == 409:
                return False  # the reflector will show it; next pass compares
            if action == "delete" and exc.status.code == 404:
                return False
            log.warning("%s devicetaintrule/%s failed: %s", action, name, exc.status.message)
            self.metrics.failures.labels(action).inc()
            return False
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
            ObjectReference(apiVersion="resource.k8s.io/v1", kind="DeviceTaintRule", name=name),
            "Normal" if action == "delete" else "Warning",
            {
                "create": "DeviceTainted",
                "update": "DeviceTaintChanged",
                "delete": "DeviceUntainted",
            }[action],
            message,
        )
        return True

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
        if self._impact.get(name) == message:
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
                DeviceTaintRule.Status,
                name,
                {"status": {"conditions": [condition]}},
                patch_type=PatchType.MERGE,
            )
        except ApiError as exc:
            log.debug("impact summary on devicetaintrule/%s: %s", name, exc.status.message)
            return
        self._impact[name] = message
        await self._event(
            ObjectReference(apiVersion="resource.k8s.io/v1", kind="DeviceTaintRule", name=name),
            "Normal",
            "DryRunImpact",
            message,
        )

    # -- evictions -----------------------------------------------------------------------

    def _plan_evictions(self, wants: dict[DeviceKey, Want]) -> None:
        self._evict_due = None
        if self.policy.eviction.mode != "evict" or self.policy.dry_run:
            self.evictor.want([])
            return
        out: list[tuple[Consumer, str]] = []
        wall = self._wall()
        for key, want in wants.items():
            if want.effect != "NoExecute":
                continue
            source = f"devicetaintrule/{self._rule_names.get(key, '')}"
            added = next((t.added for t in self.model.taints(key) if t.source == source), None)
            taint = Taint(want.key, want.value, want.effect)
            leaving, later = self.model.evictions(key, taint, added, wall)
            if later is not None and (self._evict_due is None or later < self._evict_due):
                self._evict_due = later
            for pod in leaving:
                if pod.namespace in self.policy.exclude_namespaces:
                    continue
                out.append((pod, f"device {key} is tainted {want.key}={want.value}:NoExecute"))
        self.evictor.want(out)

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
        task = asyncio.get_running_loop().create_task(self._event(ref, kind_, reason, text))
        task.add_done_callback(lambda _t: None)

    # -- validation hooks ----------------------------------------------------------------

    def _start_validations(self, now: float) -> None:
        for key in self.engine.pending_validations(now):
            rule = self.engine.rule_of(key)
            check = rule.recovery.validate if rule is not None else None
            if check is None or key in self._validating:
                continue
            self._validating.add(key)
            node = self._facts(key).node
            asyncio.get_running_loop().create_task(self._validate(key, node, check))

    async def _validate(self, key: DeviceKey, node: str, check: Validate) -> None:
        ok, detail = False, ""
        try:
            async with asyncio.timeout(check.timeout):
                if check.exec:
                    env = {**os.environ, "DRAHEALTH_DEVICE": str(key), "DRAHEALTH_NODE": node}
                    proc = await asyncio.create_subprocess_exec(
                        *check.exec,
                        env=env,
                        stdout=asyncio.subprocess.DEVNULL,
                        stderr=asyncio.subprocess.PIPE,
                    )
                    _, err = await proc.communicate()
                    ok = proc.returncode == 0
                    detail = f"exit {proc.returncode}" + (
                        f": {err.decode(errors='replace')[:200]}" if err and not ok else ""
                    )
                else:
                    params = {"device": str(key), "node": node}
                    async with (
                        aiohttp.ClientSession() as session,
                        session.get(check.http, params=params) as resp,
                    ):
                        ok = 200 <= resp.status < 300
                        detail = f"HTTP {resp.status}"
        except TimeoutError:
            detail = f"timed out after {check.timeout:g} s"
        except (OSError, aiohttp.ClientError) as exc:
            detail = str(exc)
        finally:
            self._validating.discard(key)
        self.engine.validated(key, ok, self._clock())
        self._record(
            "validate", str(key), f"validation of {key} {'passed' if ok else 'failed'}: {detail}"
        )
        self._wake.set()

    # -- audit trail ---------------------------------------------------------------------

    def _record(self, action: str, subject: str, message: str) -> None:
        self._history.append(
            {
                "time": now_rfc3339(),
                "by": self.identity,
                "action": action,
                "subject": subject,
                "message": message,
            }
        )
        self._history_dirty = True

    async def _load_history(self) -> None:
        try:
            cm = await self.client.get(ConfigMap, HISTORY_CONFIGMAP, namespace=self.namespace)
        except ApiError:
            return
        try:
            rows = json.loads((cm.data or {}).get("history", "[]"))
        except ValueError:
            rows = []
        if isinstance(rows, list):
            self._history.extend(r for r in rows if isinstance(r, dict))

    async def _flush_history(self) -> None:
        if not self._history_dirty:
            return
        data = {"history": json.dumps(list(self._history), ensure_ascii=False)}
        try:
            await write_configmap_data(
                self.client, HISTORY_CONFIGMAP, self.namespace, data,
                {MANAGED_BY: CONTROLLER_LABEL},
            )  # fmt: skip
            self._history_dirty = False
        except ApiError as exc:
            log.warning("writing the remediation history failed: %s", exc.status.message)

    async def _event(self, ref: ObjectReference, kind: str, reason: str, message: str) -> None:
        event = make_event(
            name=f"{ref.name}.{uuid.uuid4().hex[:16]}",
            namespace=ref.namespace or self.namespace,
            involved=ref,
            event_type=kind,
            reason=reason,
            message=message,
            component=COMPONENT,
            instance=self.identity,
        )
        try:
            await self.client.create(event)
        except ApiError as exc:
            log.debug("recording event %s failed: %s", reason, exc.status.message)
