"""The remediation controller: device health -> DeviceTaintRules -> evictions -> untaint.

Owns :class:`RemediationController`, the leader's work. It reflects Pods, ResourceClaims,
ResourceSlices, DeviceTaintRules and the agents' device-health ConfigMaps; on every
change (and at the engine's next deadline) it runs one pass:

1. observations (:mod:`._view`) -> :class:`RemedyEngine` -> the taint each device wants;
2. reconcile the controller's own DeviceTaintRules (label
   ``app.kubernetes.io/managed-by=drahealth-controller``) to exactly those wants:
   create, update the effect/value, delete when recovered. Rules anyone else made are
   never touched. Rules with effect ``None`` get a dry-run impact summary (devices,
   pods, namespaces NoExecute would hit) in their ``EvictionInProgress`` condition;
3. in ``eviction.mode: evict``, pods on NoExecute devices that do not tolerate the
   taint (and are not in an excluded namespace) go to the :class:`Evictor`, and the
   rule itself is written NoSchedule so only budget-aware evictions move pods;
4. recovered devices with a validation hook get it run (exec or HTTP GET) first.

Every action is an Event (on the rule or the pod) and a line in the ConfigMap
``drahealth-remediation-history`` (last 200). All state is rebuilt from the API at
start (the engine is seeded from the controller's rules), so a restart or a leader
change neither loses nor repeats an action.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
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
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Pod
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from drahealth._agent_records import agent_records
from drahealth._aio import cancel_and_wait
from drahealth.core import DeviceKey, Health
from drahealth.core._policy import DeviceFacts, Policy, Validate
from drahealth.core._remedy_engine import RemedyEngine, Want
from drahealth.core._taints import Taint, request_tolerations, tolerated
from drahealth.kube import Reflector, as_dict, write_configmap_data
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
from drahealth.remedy._view import Consumer, consumers, device_facts, observations

__all__ = ["HISTORY_CONFIGMAP", "RemediationController"]

log = logging.getLogger(__name__)

HISTORY_CONFIGMAP = "drahealth-remediation-history"
HISTORY_LENGTH = 200
COMPONENT = "drahealth-controller"
JSON = dict[str, Any]


def _now_text() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: A pass yields to the event loop after this many objects converted or devices observed.
YIELD_EVERY = 500


class _Dicts:
    """Plain-dict copies of a reflector's objects, each converted once per resourceVersion.

    Converting all 5,000 pods of a cluster on every pass took seconds; only new and
    changed objects are converted, yielding to the event loop every ``YIELD_EVERY``.
    The dicts are shared between passes: read them, never change them.
    """

    def __init__(self, reflector: Reflector[Any]) -> None:
        self._reflector = reflector
        self._cache: dict[tuple[str, str], tuple[str, JSON]] = {}

    async def get(self) -> list[JSON]:
        out: list[JSON] = []
        fresh: dict[tuple[str, str], tuple[str, JSON]] = {}
        converted = 0
        for key, obj in self._reflector.store.items():
            meta = getattr(obj, "metadata", None)
            rv = str(getattr(meta, "resourceVersion", None) or "")
            hit = self._cache.get(key)
            if hit is not None and rv and hit[0] == rv:
                data = hit[1]
            else:
                data = as_dict(obj)
                converted += 1
                if converted % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            fresh[key] = (rv, data)
            out.append(data)
        self._cache = fresh
        return out


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
        self._pod_dicts = _Dicts(self.pods)
        self._claim_dicts = _Dicts(self.claims)
        self._slice_dicts = _Dicts(self.slices)
        self._wake = asyncio.Event()
        self._bad_seen: dict[DeviceKey, float] = {}  # first bad observation, for latency
        self._validating: set[DeviceKey] = set()
        self._history: deque[JSON] = deque(maxlen=HISTORY_LENGTH)
        self._history_dirty = False
        self._impact: dict[str, str] = {}  # rule name -> last impact message written
        self.passes = 0

    # -- lifecycle -------------------------------------------------------------------

    async def run(self) -> None:
        reflectors: list[Reflector[Any]] = [
            self.pods, self.claims, self.slices, self.rules, self.health,
        ]  # fmt: skip
        for r in reflectors:
            r.add_handler(self._changed)
        tasks: list[asyncio.Task[None]] = []
        try:
            for r in reflectors:
                await r.start()
            for r in reflectors:
                await r.wait_synced()
            await self._load_history()
            self._seed()
            tasks.append(asyncio.create_task(self.evictor.run(), name="evictor"))
            log.info("%s: remediation controller active", self.identity)
            while True:
                await self.reconcile()
                await self._sleep()
        finally:
            await cancel_and_wait(tasks)
            for r in reflectors:
                r.remove_handler(self._changed)
                await r.stop()

    def _changed(self, *_args: Any) -> None:
        self._wake.set()

    async def _sleep(self) -> None:
        now = self._clock()
        due = self.engine.next_wakeup(now)
        timeout = 1.0 if due is None else max(0.0, min(1.0, due - now))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        self._wake.clear()
        await asyncio.sleep(0.005)  # let a burst of watch events land in one pass

    # -- one pass ----------------------------------------------------------------------

    async def reconcile(self) -> None:
        self.passes += 1
        now = self._clock()
        pods = await self._pod_dicts.get()
        claims = await self._claim_dicts.get()
        facts = device_facts(await self._slice_dicts.get())
        records = agent_records(self.health.store.dicts(), self.namespace)
        seen = observations(records, pods, claims)
        for i, (key, obs) in enumerate(seen.items()):
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # a long pass lets watches and timers run
            f = facts.get(key) or DeviceFacts(key.driver, key.pool, key.device, obs.node)
            if not f.node and obs.node:
                f = DeviceFacts(f.driver, f.pool, f.device, obs.node, f.attributes)
            facts[key] = f
            self.engine.observe(f, obs.health, obs.message, now)
            if obs.health is not Health.HEALTHY:
                # when it went bad: the agent's change time if known, else this pass
                since = now
                if obs.since is not None:
                    since = now - max(0.0, self._wall() - obs.since)
                self._bad_seen.setdefault(key, since)
            else:
                self._bad_seen.pop(key, None)
        wants = self.engine.wants(now)
        users = consumers(pods, claims)
        await self._reconcile_rules(wants, facts, users, now)
        self._plan_evictions(wants, users, claims)
        self.evictor.present(str((p.get("metadata") or {}).get("uid")) for p in pods)
        self._start_validations(facts, now)
        self.metrics.pending_evictions.set(self.evictor.pending)
        await self._flush_history()

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

    async def _reconcile_rules(
        self,
        wants: dict[DeviceKey, Want],
        facts: dict[DeviceKey, DeviceFacts],
        users: dict[DeviceKey, list[Consumer]],
        now: float,
    ) -> None:
        desired: dict[str, tuple[DeviceKey, JSON]] = {}
        for key, want in wants.items():
            f = facts.get(key) or DeviceFacts(key.driver, key.pool, key.device)
            body = rule_body(
                DeviceRef(key.driver, key.pool, key.device),
                key=want.key,
                value=want.value,
                effect=self._written_effect(want.effect),
                node=f.node,
                policy_rule=want.rule,
                reason=want.reason,
            )
            desired[body["metadata"]["name"]] = (key, body)
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
                    updated["metadata"]["annotations"] = body["metadata"]["annotations"]
                    await self._write_rule("update", updated)
            if taint["effect"] == "None":
                await self._impact_summary(name, key, users)
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

    async def _impact_summary(
        self, name: str, key: DeviceKey, users: dict[DeviceKey, list[Consumer]]
    ) -> None:
        pods = [p for p in users.get(key, []) if p.namespace not in self.policy.exclude_namespaces]
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
            "lastTransitionTime": _now_text(),
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

    def _plan_evictions(
        self,
        wants: dict[DeviceKey, Want],
        users: dict[DeviceKey, list[Consumer]],
        claims: list[JSON],
    ) -> None:
        if self.policy.eviction.mode != "evict" or self.policy.dry_run:
            self.evictor.want([])
            return
        by_name = {
            (str(c["metadata"].get("namespace")), str(c["metadata"].get("name"))): c for c in claims
        }
        out: list[tuple[Consumer, str]] = []
        for key, want in wants.items():
            if want.effect != "NoExecute":
                continue
            for pod in users.get(key, []):
                if pod.namespace in self.policy.exclude_namespaces:
                    continue
                claim = by_name.get((pod.namespace, pod.claim), {})
                taint = Taint(want.key, want.value, want.effect)
                if tolerated(taint, request_tolerations(claim, pod.request)):
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

    def _start_validations(self, facts: dict[DeviceKey, DeviceFacts], now: float) -> None:
        for key in self.engine.pending_validations(now):
            rule = self.engine.rule_of(key)
            check = rule.recovery.validate if rule is not None else None
            if check is None or key in self._validating:
                continue
            self._validating.add(key)
            node = facts[key].node if key in facts else ""
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
                "time": _now_text(),
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
        now = datetime.datetime.now(datetime.UTC)
        namespace = ref.namespace or self.namespace
        event = Event(
            metadata=ObjectMeta(name=f"{ref.name}.{uuid.uuid4().hex[:16]}", namespace=namespace),
            involvedObject=ref,
            reason=reason,
            message=message[:1024],
            type=kind,
            count=1,
            firstTimestamp=now,
            lastTimestamp=now,
            source=EventSource(component=COMPONENT),
            reportingComponent=COMPONENT,
            reportingInstance=self.identity,
        )
        try:
            await self.client.create(event)
        except ApiError as exc:
            log.debug("recording event %s failed: %s", reason, exc.status.message)
