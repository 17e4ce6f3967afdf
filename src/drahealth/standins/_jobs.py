"""Stand-in for kube-controller-manager's Job controller (``batch/v1``).

Owns :class:`JobStandIn`. Per Job (not suspended, not finished), as upstream's
``pkg/controller/job`` does for NonIndexed Jobs:

- keeps ``min(parallelism, completions - succeeded)`` active pods (``parallelism``
  until the first success when ``completions`` is unset), creating them from the
  template with ``generateName: <job>-``, a controller owner reference and the
  ``batch.kubernetes.io/job-tracking`` finalizer, and recording ``SuccessfulCreate``;
  a replacement after failures waits the exponential back-off (10 s doubling, at most
  6 min, counted from the last failure since the last success);
- counts finished pods through ``status.uncountedTerminatedPods`` (the UIDs first, then
  the finalizers come off, then the counters move), so a pod is never counted twice;
- applies ``podFailurePolicy`` to failed pods: ``Ignore`` (e.g. ``DisruptionTarget``
  from an eviction) does not count against ``backoffLimit``, ``FailJob`` fails the Job,
  ``Count`` counts;
- adds ``FailureTarget`` (``BackoffLimitExceeded``, ``PodFailurePolicy``) or
  ``SuccessCriteriaMet`` first, deletes the remaining active pods, then ``Failed`` or
  ``Complete`` with ``completionTime``, with the ``Completed`` / Warning Event;
- writes ``active``, ``ready``, ``terminating``, ``succeeded``, ``failed``,
  ``startTime``; deletes a finished Job ``ttlSecondsAfterFinished`` after it finished.

A pod being deleted is terminating until its kubelet stops it (phase Failed):
``status.terminating`` counts it, and the final condition waits for it. With
``podReplacementPolicy: Failed`` (the default with a ``podFailurePolicy``) it is replaced
only then; with ``TerminatingOrFailed`` at once, and it counts as failed. A terminating
pod that was never scheduled counts as Failed, as the pod garbage collector marks it
upstream (no kubelet will). Pods of a Job that no longer exists lose their
finalizer and are deleted (the garbage collector's part upstream, background
propagation). Not modelled: Indexed completion, ``backoffLimitPerIndex``,
``successPolicy``, ``activeDeadlineSeconds``, ``managedBy``, restart counts of
``restartPolicy: OnFailure`` pods.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import secrets
import time
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, Pod
from lightkube.types import PatchType

from drahealth.kube import Reflector, make_event

from ._loop import pod_active, reconcile_loop, slow_start

__all__ = ["TRACKING_FINALIZER", "JobStandIn", "match_pod_failure_policy"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
#: The finalizer the Job controller puts on its pods until it has counted them.
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
DEFAULT_BACKOFF = 10.0
MAX_BACKOFF = 360.0
#: Pods created per Job and pass (upstream caps creations per sync at 500).
MAX_CREATE_PER_PASS = 100
MAX_PENDING_EVENTS = 1000


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ts(value: Any) -> float | None:
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _condition(kind: str, reason: str, message: str) -> JSON:
    now = _now()
    return {
        "type": kind, "status": "True", "reason": reason, "message": message,
        "lastProbeTime": now, "lastTransitionTime": now,
    }  # fmt: skip


def _has(job: JSON, kind: str) -> JSON | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return dict(c)
    return None


def finished(job: JSON) -> bool:
    return bool(_has(job, "Complete") or _has(job, "Failed"))


def _phase(pod: JSON) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _ready(pod: JSON) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _terminating(pod: JSON) -> bool:
    """Being deleted and not finished (upstream's ``CountTerminatingPods``)."""
    return bool(pod["metadata"].get("deletionTimestamp")) and _phase(pod) not in (
        "Succeeded",
        "Failed",
    )


def _only_replace_failed(job: JSON) -> bool:
    spec = job.get("spec") or {}
    return spec.get("podReplacementPolicy") == "Failed" or bool(spec.get("podFailurePolicy"))


def _pod_failed(pod: JSON, job: JSON) -> bool:
    """Upstream's ``isPodFailed``, plus the pod garbage collector's marking of an
    unscheduled terminating pod as Failed."""
    if _phase(pod) == "Failed":
        return True
    if _terminating(pod) and not (pod.get("spec") or {}).get("nodeName"):
        return True
    if _only_replace_failed(job):
        return False
    return _terminating(pod)


def _tracked(pod: JSON) -> bool:
    return TRACKING_FINALIZER in (pod["metadata"].get("finalizers") or [])


def _exit_code_match(pod: JSON, req: JSON) -> JSON | None:
    status = pod.get("status") or {}
    for lst in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(lst) or []:
            term = (cs.get("state") or {}).get("terminated")
            if not term:
                continue
            if req.get("containerName") not in (None, cs.get("name")):
                continue
            code = int(term.get("exitCode", 0))
            if code == 0:
                continue
            values = req.get("values") or []
            op = req.get("operator")
            if (op == "In" and code in values) or (op == "NotIn" and code not in values):
                return {"name": cs.get("name"), "exitCode": code}
    return None


def match_pod_failure_policy(policy: JSON | None, pod: JSON) -> tuple[str | None, bool, str | None]:
    """(FailJob message or None, whether the failure counts, the matched action or None).

    The first rule that matches the failed ``pod`` decides, as upstream's
    ``matchPodFailurePolicy``; no rule matching counts the failure.
    """
    if not policy:
        return None, True, None
    meta = pod["metadata"]
    who = f"{meta.get('namespace')}/{meta.get('name')}"
    for index, rule in enumerate(policy.get("rules") or []):
        action = rule.get("action")
        if rule.get("onExitCodes") is not None:
            hit = _exit_code_match(pod, rule["onExitCodes"])
            if hit is None:
                continue
            detail = (
                f"Container {hit['name']} for pod {who} failed with exit code "
                f"{hit['exitCode']} matching {action} rule at index {index}"
            )
        elif rule.get("onPodConditions") is not None:
            conds = (pod.get("status") or {}).get("conditions") or []
            hit_type = next(
                (
                    c.get("type")
                    for c in conds
                    for p in rule["onPodConditions"]
                    if c.get("type") == p.get("type") and c.get("status") == p.get("status", "True")
                ),
                None,
            )
            if hit_type is None:
                continue
            detail = f"Pod {who} has condition {hit_type} matching {action} rule at index {index}"
        else:
            continue
        if action == "Ignore":
            return None, False, action
        if action == "FailJob":
            return detail, True, action
        return None, True, action
    return None, True, None


def _finished_time(pod: JSON) -> float:
    latest = 0.0
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        t = _ts(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        latest = max(latest, t or 0.0)
    if not latest:
        latest = _ts(pod["metadata"].get("deletionTimestamp")) or time.time()
    return latest


class _Backoff:
    """Failures since the last success and when the last one happened (per Job)."""

    def __init__(self) -> None:
        self.failures = 0
        self.last_failure = 0.0

    def record(self, succeeded: list[JSON], failed: list[JSON]) -> None:
        if not succeeded and not failed:
            return
        if not succeeded:
            self.failures += len(failed)
            self.last_failure = max(_finished_time(p) for p in failed)
            return
        last_success = max(_finished_time(p) for p in succeeded)
        later = [p for p in failed if _finished_time(p) > last_success]
        self.failures = len(later)
        self.last_failure = max((_finished_time(p) for p in later), default=0.0)

    def remaining(self, base: float, cap: float, now: float) -> float:
        if self.failures == 0:
            return 0.0
        delay = min(base * float(2 ** (self.failures - 1)), cap)
        return max(0.0, self.last_failure + delay - now)


class JobStandIn:
    """See the module docstring; ``run()`` until cancelled.

    ``backoff`` is the first back-off delay in seconds (upstream's 10 s; tests make it
    shorter), doubling per further failure up to ``max_backoff``.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        backoff: float = DEFAULT_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
    ) -> None:
        if backoff < 0 or max_backoff < backoff:
            raise ValueError(f"backoff {backoff} must be >= 0 and <= max_backoff {max_backoff}")
        self.client = client
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.jobs: Reflector[Job] = Reflector(client, Job, name="job-jobs")
        self.pods: Reflector[Pod] = Reflector(client, Pod, name="job-pods")
        self.created = 0
        self._backoff: dict[str, _Backoff] = {}
        self._pending: list[Event] = []

    async def run(self) -> None:
        await reconcile_loop([self.jobs, self.pods], self.pass_once, "jobs")

    async def pass_once(self) -> None:
        jobs = self.jobs.store.dicts()
        uids = {j["metadata"]["uid"] for j in jobs}
        for pod in self.pods.store.dicts():
            owner = _job_owner(pod)
            if owner is not None and owner not in uids:
                await self._orphan(pod)
        for uid in set(self._backoff) - uids:
            del self._backoff[uid]
        for job in jobs:
            try:
                await self._sync(job)
            except ApiError as exc:
                if exc.status.code not in (404, 409):
                    raise

    async def _orphan(self, pod: JSON) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(ApiError):
            if _tracked(pod):
                await self._drop_finalizer(pod)
            if not meta.get("deletionTimestamp"):
                await self.client.delete(Pod, meta["name"], namespace=meta["namespace"])

    async def _fresh(self, job: JSON) -> tuple[JSON, list[JSON]]:
        meta = job["metadata"]
        obj = await self.client.get(Job, meta["name"], namespace=meta["namespace"])
        fresh = obj.to_dict()
        pods = [p.to_dict() async for p in self.client.list(Pod, namespace=meta["namespace"])]
        return fresh, [p for p in pods if _job_owner(p) == fresh["metadata"]["uid"]]

    async def _sync(self, job: JSON) -> None:
        if finished(job):
            await self._expire(job)
            return
        job, pods = await self._fresh(job)
        if finished(job):
            return
        meta, spec = job["metadata"], job.get("spec") or {}
        uid = meta["uid"]
        status: JSON = dict(job.get("status") or {})
        old_status = dict(status)
        uncounted = dict(status.get("uncountedTerminatedPods") or {})
        unc_ok = list(uncounted.get("succeeded") or [])
        unc_fail = list(uncounted.get("failed") or [])
        policy = spec.get("podFailurePolicy")
        suspended = bool(spec.get("suspend"))
        if not status.get("startTime") and not suspended:
            status["startTime"] = _now()

        # finished pods not yet counted (they still carry the finalizer)
        with_fin = {p["metadata"]["uid"] for p in pods if _tracked(p)}
        new_ok = [p for p in pods if _tracked(p) and _phase(p) == "Succeeded"
                  and p["metadata"]["uid"] not in unc_ok]  # fmt: skip
        new_fail = [p for p in pods if _tracked(p) and _pod_failed(p, job)
                    and p["metadata"]["uid"] not in unc_fail]  # fmt: skip
        backoff = self._backoff.setdefault(uid, _Backoff())
        backoff.record(new_ok, new_fail)
        counted_fail = [p for p in new_fail if match_pod_failure_policy(policy, p)[1]]
        succeeded = int(status.get("succeeded") or 0) + len(new_ok) + len(unc_ok)
        failed = int(status.get("failed") or 0) + len(counted_fail) + len(unc_fail)

        target = _has(job, "FailureTarget")
        done = _has(job, "SuccessCriteriaMet")
        if target is None and done is None:
            for p in pods:
                if _tracked(p) and _pod_failed(p, job):
                    message = match_pod_failure_policy(policy, p)[0]
                    if message is not None:
                        target = _condition("FailureTarget", "PodFailurePolicy", message)
                        break
            if target is None and failed > int(spec.get("backoffLimit", 6)):
                target = _condition(
                    "FailureTarget", "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit",
                )  # fmt: skip
        active = [p for p in pods if pod_active(p)]
        terminating = sum(1 for p in pods if _terminating(p) and not _pod_failed(p, job))
        if target is not None or done is not None:
            for p in active:  # a finished Job keeps nothing running
                await self._delete_pod(job, p)
                if target is not None and p["metadata"]["uid"] not in unc_fail:
                    counted_fail.append(p)  # upstream: counted failed once the Job fails
            active = []
        elif not suspended:
            replacing = terminating if _only_replace_failed(job) else 0
            active = await self._manage(job, active, succeeded, backoff, replacing)
        else:
            for p in active:
                await self._delete_pod(job, p)
                terminating += 1
            active = []
        completions = spec.get("completions")
        if target is None and done is None:
            complete = succeeded > 0 if completions is None else succeeded >= int(completions)
            if complete and not active:
                done = _condition(
                    "SuccessCriteriaMet", "CompletionsReached",
                    "Reached expected number of succeeded pods",
                )  # fmt: skip

        # 1. record the newly finished pods (and the interim condition) before
        #    their finalizers come off
        unc_ok += [p["metadata"]["uid"] for p in new_ok]
        unc_fail += [p["metadata"]["uid"] for p in counted_fail]
        conditions = list(status.get("conditions") or [])
        for interim in (target, done):
            if interim is not None and not any(
                c.get("type") == interim["type"] for c in conditions
            ):
                conditions.append(interim)
        status.update(
            active=len(active),
            ready=sum(1 for p in active if _ready(p)),
            terminating=terminating,
            conditions=conditions or None,
            uncountedTerminatedPods={"succeeded": unc_ok or None, "failed": unc_fail or None},
        )
        await self._write_status(job, status, old_status)
        # 2. remove the finalizers of every finished (or, once the Job is done, every) pod
        # (upstream's canRemoveFinalizer: succeeded or failed pods, every pod of a
        # finished or deleted Job; a terminating pod keeps it until it has failed)
        ending = bool(target or done or meta.get("deletionTimestamp"))
        to_release = [
            p for p in pods
            if _tracked(p) and (ending or _phase(p) == "Succeeded" or _pod_failed(p, job))
        ]  # fmt: skip
        for p in to_release:
            await self._drop_finalizer(p)
            with_fin.discard(p["metadata"]["uid"])
        # 3. move what was released into the counters
        released_ok = [u for u in unc_ok if u not in with_fin]
        released_fail = [u for u in unc_fail if u not in with_fin]
        status["succeeded"] = int(status.get("succeeded") or 0) + len(released_ok)
        status["failed"] = int(status.get("failed") or 0) + len(released_fail)
        unc_ok = [u for u in unc_ok if u in with_fin]
        unc_fail = [u for u in unc_fail if u in with_fin]
        status["uncountedTerminatedPods"] = {
            "succeeded": unc_ok or None,
            "failed": unc_fail or None,
        }
        if not unc_ok and not unc_fail and not terminating:
            if target is not None:
                conditions.append(_condition("Failed", target["reason"], target["message"]))
                self._event(job, "Warning", target["reason"], target["message"])
            elif done is not None:
                conditions.append(_condition("Complete", done["reason"], done["message"]))
                status["completionTime"] = conditions[-1]["lastTransitionTime"]
                self._event(job, "Normal", "Completed", "Job completed")
            status["conditions"] = conditions or None
        await self._write_status(job, status, old_status)
        await self._flush_events()

    async def _manage(
        self, job: JSON, active: list[JSON], succeeded: int, backoff: _Backoff, terminating: int
    ) -> list[JSON]:
        spec = job.get("spec") or {}
        parallelism = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        if completions is None:
            want = len(active) if succeeded > 0 else parallelism
        else:
            want = max(0, min(parallelism, int(completions) - succeeded))
        if len(active) > want:
            # not-ready, unscheduled and pending pods go first, as upstream
            order = sorted(active, key=lambda p: (_ready(p), bool(p.get("spec", {}).get(
                "nodeName")), _phase(p) == "Running"))  # fmt: skip
            extra = order[: len(active) - want]
            for p in extra:
                await self._delete_pod(job, p)
            return [p for p in active if p not in extra]
        missing = min(want - terminating - len(active), MAX_CREATE_PER_PASS)
        if missing <= 0 or backoff.remaining(self.backoff, self.max_backoff, time.time()) > 0:
            return active
        meta = job["metadata"]

        def wanted() -> bool:
            cached = self.jobs.store.get(meta["namespace"], meta["name"])
            return (
                cached is not None
                and cached.metadata is not None
                and cached.metadata.uid == meta["uid"]
                and cached.metadata.deletionTimestamp is None
            )

        async def create() -> None:
            active.append(await self._create(job))

        await slow_start(missing, create, wanted)
        return active

    async def _create(self, job: JSON) -> JSON:
        meta = job["metadata"]
        template = (job.get("spec") or {}).get("template") or {}
        pod_meta = dict(template.get("metadata") or {})
        pod_meta.pop("name", None)
        pod_meta.update(
            generateName=f"{meta['name']}-",
            namespace=meta["namespace"],
            finalizers=[*(pod_meta.get("finalizers") or []), TRACKING_FINALIZER],
            ownerReferences=[
                {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}
            ],
        )  # fmt: skip
        body = {"metadata": pod_meta, "spec": template.get("spec") or {}}
        pod = await self.client.create(Pod.from_dict(body))  # type: ignore[call-overload]
        out: JSON = pod.to_dict()
        self.created += 1
        self._event(job, "Normal", "SuccessfulCreate", f"Created pod: {out['metadata']['name']}")
        return out

    async def _delete_pod(self, job: JSON, pod: JSON) -> None:
        meta = pod["metadata"]
        try:
            await self.client.delete(Pod, meta["name"], namespace=meta["namespace"])
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            return
        self._event(job, "Normal", "SuccessfulDelete", f"Deleted pod: {meta['name']}")

    async def _drop_finalizer(self, pod: JSON) -> None:
        meta = pod["metadata"]
        patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}}
        with contextlib.suppress(ApiError):
            await self.client.patch(
                Pod, meta["name"], patch, namespace=meta["namespace"],
                patch_type=PatchType.STRATEGIC,
            )  # fmt: skip

    async def _write_status(self, job: JSON, status: JSON, old: JSON) -> None:
        clean = {k: v for k, v in status.items() if v is not None}
        unc = {k: v for k, v in (clean.get("uncountedTerminatedPods") or {}).items() if v}
        clean["uncountedTerminatedPods"] = unc
        if clean == {k: v for k, v in old.items() if v is not None}:
            return
        meta = job["metadata"]
        # a merge patch: keys set to None are removed, lists replaced whole
        patch = {k: clean.get(k) for k in set(clean) | set(old)}
        patch["uncountedTerminatedPods"] = {
            "succeeded": unc.get("succeeded"), "failed": unc.get("failed"),
        }  # fmt: skip
        await self.client.patch(
            Job.Status, meta["name"], {"status": patch}, namespace=meta["namespace"],
            patch_type=PatchType.MERGE,
        )  # fmt: skip
        old.clear()
        old.update(clean)

    async def _expire(self, job: JSON) -> None:
        """Delete a finished Job ``ttlSecondsAfterFinished`` after it finished."""
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None or job["metadata"].get("deletionTimestamp"):
            return
        cond = _has(job, "Complete") or _has(job, "Failed") or {}
        since = _ts(cond.get("lastTransitionTime"))
        if since is None or time.time() < since + int(ttl):
            return
        meta = job["metadata"]
        with contextlib.suppress(ApiError):
            await self.client.delete(Job, meta["name"], namespace=meta["namespace"])
            log.info("deleted finished job %s/%s (ttlSecondsAfterFinished)", meta["namespace"],
                     meta["name"])  # fmt: skip

    # ------------------------------------------------------------------ events

    def _event(self, job: JSON, kind: str, reason: str, message: str) -> None:
        meta = job["metadata"]
        ev = make_event(
            name=f"{meta['name']}.{secrets.token_hex(8)}",
            namespace=meta["namespace"],
            involved=ObjectReference(
                apiVersion="batch/v1", kind="Job", name=meta["name"],
                namespace=meta["namespace"], uid=meta.get("uid"),
                resourceVersion=meta.get("resourceVersion"),
            ),
            event_type=kind, reason=reason, message=message,
            component="job-controller", instance="drahealth-embedded",
        )  # fmt: skip
        if len(self._pending) < MAX_PENDING_EVENTS:
            self._pending.append(ev)

    async def _flush_events(self) -> None:
        pending, self._pending = self._pending, []
        for ev in pending:
            with contextlib.suppress(ApiError):
                await self.client.create(ev)


def _job_owner(pod: JSON) -> str | None:
    """UID of the Job controlling ``pod``, or None."""
    for o in pod["metadata"].get("ownerReferences") or []:
        if o.get("controller") and o.get("kind") == "Job" and o.get("apiVersion") == "batch/v1":
            return str(o.get("uid"))
    return None
