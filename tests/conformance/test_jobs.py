"""``batch/v1`` Jobs on the embedded control plane: the API server's part and the controller's.

Written from upstream kubernetes/kubernetes: ``pkg/apis/batch/v1/defaults.go`` (defaults),
``pkg/registry/batch/job/strategy.go`` (generated selector and pod labels),
``pkg/apis/batch/validation/validation.go`` (restart policy, podFailurePolicy rules,
non-negative counts), ``pkg/controller/job/job_controller.go`` (pod creation with
``generateName`` and the ``batch.kubernetes.io/job-tracking`` finalizer, counting through
``uncountedTerminatedPods``, ``SuccessCriteriaMet``/``FailureTarget`` before
``Complete``/``Failed``, ``BackoffLimitExceeded``), ``pkg/controller/job/pod_failure_policy.go``
(``Ignore`` does not count, ``FailJob`` message), ``pkg/controller/ttlafterfinished`` and
``pkg/printers/internalversion/printers.go`` (``printJob`` columns). Pods are moved to
Succeeded/Failed through the API here, as a kubelet would.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drahealth.controlplane import APIServer
from drahealth.kube import make_client
from drahealth.standins._jobs import JobStandIn
from tests._support import eventually

JOBS = "/apis/batch/v1/namespaces/default/jobs"
PODS = "/api/v1/namespaces/default/pods"
EVENTS = "/api/v1/namespaces/default/events"


class Http:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        kwargs: dict[str, Any] = {"headers": dict(headers or {})}
        if body is not None:
            kwargs["data"] = json.dumps(body)
            kwargs["headers"]["Content-Type"] = (
                "application/merge-patch+json" if method == "PATCH" else "application/json"
            )
        async with self.session.request(method, self.url + path, **kwargs) as resp:
            return resp.status, json.loads(await resp.read())


@pytest.fixture
async def http(server: APIServer) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield Http(session, server.url)


@pytest.fixture
async def jobs(server: APIServer) -> AsyncIterator[JobStandIn]:
    import asyncio

    client = make_client(server_url=server.url)
    stand_in = JobStandIn(client, backoff=0.05, max_backoff=0.2)
    task = asyncio.create_task(stand_in.run())
    try:
        yield stand_in
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.close()


def job(name: str, **spec: Any) -> dict[str, Any]:
    template = spec.pop("template", None) or {
        "metadata": {"labels": {"app": "train"}},
        "spec": {
            "restartPolicy": spec.pop("restartPolicy", "Never"),
            "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"template": template, **spec},
    }


async def job_pods(http: Http, name: str) -> list[dict[str, Any]]:
    _, body = await http.call("GET", f"{PODS}?labelSelector=batch.kubernetes.io/job-name={name}")
    return sorted(body["items"], key=lambda p: p["metadata"]["creationTimestamp"])


async def finish(http: Http, pod: dict[str, Any], phase: str, code: int = 0) -> None:
    name = pod["metadata"]["name"]
    state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}
    status = {
        "phase": phase,
        "containerStatuses": [
            {"name": "main", "ready": False, "restartCount": 0, "image": "busybox",
             "imageID": "", "state": state}
        ],
    }  # fmt: skip
    code_, body = await http.call("PATCH", f"{PODS}/{name}/status", {"status": status})
    assert code_ == 200, body


async def live_pods(http: Http, name: str, n: int) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]] | None:
        pods = [
            p
            for p in await job_pods(http, name)
            if not p["metadata"].get("deletionTimestamp")
            and p["status"].get("phase") not in ("Succeeded", "Failed")
        ]
        return pods if len(pods) == n else None

    found: list[dict[str, Any]] = await eventually(check, 10, f"{n} live pod(s) of job {name}")
    return found


async def condition(http: Http, name: str, kind: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        _, body = await http.call("GET", f"{JOBS}/{name}")
        return next(
            (c for c in body.get("status", {}).get("conditions") or [] if c["type"] == kind), None
        )

    found: dict[str, Any] = await eventually(check, 10, f"job {name} condition {kind}")
    return found


async def test_job_is_served_defaulted_and_given_a_selector(http: Http) -> None:
    """Discovery lists ``jobs`` in ``batch/v1``; create fills upstream's defaults
    (``pkg/apis/batch/v1/defaults.go``) and the strategy's generated selector and pod
    labels (``pkg/registry/batch/job/strategy.go``, ``generateSelector``)."""
    code, doc = await http.call("GET", "/apis/batch/v1")
    assert code == 200
    jobs = next(r for r in doc["resources"] if r["name"] == "jobs")
    assert jobs["kind"] == "Job" and jobs["namespaced"] and "all" in jobs["categories"]
    assert any(r["name"] == "jobs/status" for r in doc["resources"])
    code, body = await http.call("POST", JOBS, job("train"))
    assert code == 201, body
    spec, uid = body["spec"], body["metadata"]["uid"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (1, 1, 6)
    assert spec["completionMode"] == "NonIndexed" and spec["suspend"] is False
    assert spec["podReplacementPolicy"] == "TerminatingOrFailed"
    assert spec["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert spec["template"]["metadata"]["labels"] == {
        "app": "train",
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": "train",
        "controller-uid": uid,
        "job-name": "train",
    }
    assert body["metadata"]["labels"] == {"app": "train"}  # the template's, before generation
    with_policy = job("p", podFailurePolicy={"rules": []}, parallelism=3)
    code, body = await http.call("POST", JOBS, with_policy)
    assert code == 201, body
    assert body["spec"]["podReplacementPolicy"] == "Failed"
    assert body["spec"].get("completions") is None and body["spec"]["parallelism"] == 3


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        ({"restartPolicy": "Always"}, "spec.template.spec.restartPolicy", "FieldValueNotSupported"),
        ({"parallelism": -1}, "spec.parallelism", "FieldValueInvalid"),
        ({"backoffLimit": -2}, "spec.backoffLimit", "FieldValueInvalid"),
        (
            {"restartPolicy": "OnFailure", "podFailurePolicy": {"rules": []}},
            "spec.template.spec.restartPolicy",
            "FieldValueInvalid",
        ),
        (
            {"podFailurePolicy": {"rules": [{"action": "Ignore"}]}},
            "spec.podFailurePolicy.rules[0]",
            "FieldValueInvalid",
        ),
        (
            {
                "podFailurePolicy": {
                    "rules": [
                        {"action": "Restart", "onPodConditions": [{"type": "DisruptionTarget"}]}
                    ]
                }
            },
            "spec.podFailurePolicy.rules[0].action",
            "FieldValueNotSupported",
        ),
        (
            {"manualSelector": True, "selector": {"matchLabels": {"app": "other"}}},
            "spec.template.metadata.labels",
            "FieldValueInvalid",
        ),
    ],
)
async def test_invalid_jobs_are_refused(
    http: Http, spec: dict[str, Any], field: str, reason: str
) -> None:
    """422 with a cause naming the field, as ``pkg/apis/batch/validation`` answers."""
    code, body = await http.call("POST", JOBS, job("bad", **spec))
    assert code == 422, body
    causes = {(c["field"], c["reason"]) for c in body["details"]["causes"]}
    assert (field, reason) in causes, causes


async def test_job_runs_its_pods_to_completion(http: Http, jobs: JobStandIn) -> None:
    """Pods named ``<job>-<5 chars>`` with the tracking finalizer and a controller owner
    reference; one at a time for parallelism 1; ``SuccessCriteriaMet`` then ``Complete``
    (``CompletionsReached``) with ``completionTime`` once both succeeded; finalizers
    removed, ``uncountedTerminatedPods`` empty; ``SuccessfulCreate`` and ``Completed``
    Events (``job_controller.go``)."""
    code, created = await http.call("POST", JOBS, job("train", completions=2))
    assert code == 201, created
    uid = created["metadata"]["uid"]
    (first,) = await live_pods(http, "train", 1)
    meta = first["metadata"]
    assert meta["name"].startswith("train-") and len(meta["name"]) == len("train-") + 5
    assert meta["finalizers"] == ["batch.kubernetes.io/job-tracking"]
    assert meta["labels"]["batch.kubernetes.io/controller-uid"] == uid
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Job", uid, True)
    _, body = await http.call("GET", f"{JOBS}/train")
    assert body["status"]["active"] == 1 and body["status"]["startTime"]
    await finish(http, first, "Succeeded")
    (second,) = await live_pods(http, "train", 1)
    assert second["metadata"]["name"] != meta["name"]
    await finish(http, second, "Succeeded")
    complete = await condition(http, "train", "Complete")
    assert (complete["status"], complete["reason"]) == ("True", "CompletionsReached")
    assert complete["message"] == "Reached expected number of succeeded pods"
    _, body = await http.call("GET", f"{JOBS}/train")
    status = body["status"]
    assert [c["type"] for c in status["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert (status["succeeded"], status.get("failed", 0), status["active"]) == (2, 0, 0)
    assert status["completionTime"] and status["uncountedTerminatedPods"] == {}
    for pod in await job_pods(http, "train"):
        assert "batch.kubernetes.io/job-tracking" not in (pod["metadata"].get("finalizers") or [])
    _, events = await http.call("GET", f"{EVENTS}?fieldSelector=involvedObject.uid={uid}")
    reasons = [e["reason"] for e in events["items"]]
    assert reasons.count("SuccessfulCreate") == 2 and "Completed" in reasons
    code, table = await http.call(
        "GET", JOBS, headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    )
    assert [c["name"] for c in table["columnDefinitions"]][:5] == [
        "Name", "Status", "Completions", "Duration", "Age",
    ]  # fmt: skip
    assert table["rows"][0]["cells"][:3] == ["train", "Complete", "2/2"]


async def test_backoff_limit_fails_the_job(http: Http, jobs: JobStandIn) -> None:
    """Failures beyond ``backoffLimit``: ``FailureTarget`` then ``Failed``, reason
    ``BackoffLimitExceeded``, message "Job has reached the specified backoff limit", a
    Warning Event with the same reason (``job_controller.go``)."""
    code, created = await http.call("POST", JOBS, job("flaky", backoffLimit=1))
    assert code == 201, created
    (pod,) = await live_pods(http, "flaky", 1)
    await finish(http, pod, "Failed", 1)
    (again,) = await live_pods(http, "flaky", 1)
    assert again["metadata"]["uid"] != pod["metadata"]["uid"]
    await finish(http, again, "Failed", 1)
    failed = await condition(http, "flaky", "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert failed["message"] == "Job has reached the specified backoff limit"
    _, body = await http.call("GET", f"{JOBS}/flaky")
    assert [c["type"] for c in body["status"]["conditions"]] == ["FailureTarget", "Failed"]
    assert (body["status"]["failed"], body["status"]["active"]) == (2, 0)
    assert "completionTime" not in body["status"]
    uid = created["metadata"]["uid"]
    _, events = await http.call("GET", f"{EVENTS}?fieldSelector=involvedObject.uid={uid}")
    warnings = [e for e in events["items"] if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["BackoffLimitExceeded"]


async def test_disruption_is_ignored_and_fail_job_rule_fails(http: Http, jobs: JobStandIn) -> None:
    """``podFailurePolicy``: a pod evicted with ``DisruptionTarget`` matching an
    ``Ignore`` rule is replaced without counting against ``backoffLimit: 0``; an exit
    code matching ``FailJob`` fails the Job at once with upstream's message
    (``pod_failure_policy.go``)."""
    policy = {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
        ]
    }
    code, created = await http.call(
        "POST", JOBS, job("train", backoffLimit=0, podFailurePolicy=policy)
    )
    assert code == 201, created
    (pod,) = await live_pods(http, "train", 1)
    name = pod["metadata"]["name"]
    evicted = {"status": {"conditions": [{
        "type": "DisruptionTarget", "status": "True", "reason": "DeletionByDeviceTaintManager",
        "message": "Device Taint manager: deleting due to NoExecute taint"}]}}  # fmt: skip
    assert (await http.call("PATCH", f"{PODS}/{name}/status", evicted))[0] == 200
    assert (await http.call("DELETE", f"{PODS}/{name}"))[0] == 200
    (replacement,) = await live_pods(http, "train", 1)
    assert replacement["metadata"]["name"] != name

    async def gone() -> bool:
        return (await http.call("GET", f"{PODS}/{name}"))[0] == 404

    await eventually(gone, 10, "the evicted pod released by the job controller")
    _, body = await http.call("GET", f"{JOBS}/train")
    assert body["status"].get("failed", 0) == 0 and not body["status"].get("conditions")
    await finish(http, replacement, "Failed", 42)
    failed = await condition(http, "train", "Failed")
    assert failed["reason"] == "PodFailurePolicy"
    assert failed["message"] == (
        f"Container main for pod default/{replacement['metadata']['name']} failed with exit "
        "code 42 matching FailJob rule at index 1"
    )


async def test_parallel_job_and_ttl_after_finished(http: Http, jobs: JobStandIn) -> None:
    """``parallelism: 2`` without ``completions`` runs two pods and completes when one
    succeeded and the other ended (``manageJob``); ``ttlSecondsAfterFinished: 0``
    deletes the finished Job, and its pods go with it (``pkg/controller/ttlafterfinished``
    and the garbage collector's background propagation)."""
    code, _ = await http.call("POST", JOBS, job("par", parallelism=2, ttlSecondsAfterFinished=0))
    assert code == 201
    a, b = await live_pods(http, "par", 2)
    await finish(http, a, "Succeeded")
    await finish(http, b, "Succeeded")

    async def job_gone() -> bool:
        return (await http.call("GET", f"{JOBS}/par"))[0] == 404

    await eventually(job_gone, 10, "the finished job deleted after its TTL")

    async def pods_gone() -> bool:
        return not await job_pods(http, "par")

    await eventually(pods_gone, 10, "the deleted job's pods deleted")


async def test_job_spec_fields_are_immutable(http: Http) -> None:
    """``ValidateJobSpecUpdate`` (pkg/apis/batch/validation): the selector, the pod
    template (of a Job that is not suspended), ``completions`` of a NonIndexed Job and
    ``podFailurePolicy`` cannot change; ``parallelism`` can."""
    code, _ = await http.call("POST", JOBS, job("train", completions=2))
    assert code == 201
    for patch, field in (
        ({"spec": {"template": {"metadata": {"labels": {"app": "other"}}}}}, "spec.template"),
        ({"spec": {"completions": 3}}, "spec.completions"),
        ({"spec": {"podFailurePolicy": {"rules": []}}}, "spec.podFailurePolicy"),
    ):
        code, body = await http.call("PATCH", f"{JOBS}/train", patch)
        assert code == 422, body
        assert field in {c["field"] for c in body["details"]["causes"]}, body
    code, body = await http.call("PATCH", f"{JOBS}/train", {"spec": {"parallelism": 2}})
    assert code == 200 and body["spec"]["parallelism"] == 2, body


async def _bind(http: Http, pod: dict[str, Any], node: str = "node-1") -> None:
    name = pod["metadata"]["name"]
    code, body = await http.call("PATCH", f"{PODS}/{name}", {"spec": {"nodeName": node}})
    assert code == 200, body


async def test_terminating_pods_follow_the_replacement_policy(http: Http, jobs: JobStandIn) -> None:
    """``podReplacementPolicy: Failed`` (the default with a ``podFailurePolicy``): a
    deleted pod that its kubelet has not stopped yet is ``terminating`` and is replaced
    only once it is Failed; ``TerminatingOrFailed`` (the default otherwise) replaces it
    at once and counts it failed (``isPodFailed``, ``onlyReplaceFailedPods`` and
    ``trackTerminatingPods`` in job_controller.go)."""
    policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    code, _ = await http.call("POST", JOBS, job("careful", backoffLimit=0, podFailurePolicy=policy))
    assert code == 201
    (pod,) = await live_pods(http, "careful", 1)
    await _bind(http, pod)
    name = pod["metadata"]["name"]
    assert (await http.call("DELETE", f"{PODS}/{name}"))[0] == 200

    async def terminating() -> dict[str, Any] | None:
        _, body = await http.call("GET", f"{JOBS}/careful")
        return body if body["status"].get("terminating") == 1 else None

    body = await eventually(terminating, 10, "the deleted pod counted as terminating")
    assert body["status"]["active"] == 0
    assert [p["metadata"]["name"] for p in await job_pods(http, "careful")] == [name]
    disrupted = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    stopped = {"status": {"phase": "Failed", "conditions": [disrupted]}}
    assert (await http.call("PATCH", f"{PODS}/{name}/status", stopped))[0] == 200
    (replacement,) = await live_pods(http, "careful", 1)
    assert replacement["metadata"]["name"] != name
    _, body = await http.call("GET", f"{JOBS}/careful")
    assert body["status"].get("failed", 0) == 0 and body["status"]["terminating"] == 0

    code, _ = await http.call("POST", JOBS, job("eager", backoffLimit=3))
    assert code == 201
    (pod,) = await live_pods(http, "eager", 1)
    await _bind(http, pod)
    assert (await http.call("DELETE", f"{PODS}/{pod['metadata']['name']}"))[0] == 200
    (again,) = await live_pods(http, "eager", 1)
    assert again["metadata"]["uid"] != pod["metadata"]["uid"]

    async def counted() -> bool:
        _, body = await http.call("GET", f"{JOBS}/eager")
        return bool(body["status"].get("failed") == 1)

    await eventually(counted, 10, "the deleted pod counted as failed")
