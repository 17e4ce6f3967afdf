"""dra-example-driver's demo scenarios against ``drahealth demo --no-script``, with real kubectl.

The scenarios of kubernetes-sigs/dra-example-driver's ``demo/examples`` (shared claims
across containers and pods, CEL selectors on quantities and versions, admin access,
prioritized lists, opaque config, init containers, device taints with tolerations and
``tolerationSeconds``), written as our own manifests for the sample driver
(``gpu.example.com``) in ``tests/e2e/scenarios/``, plus ``batch/v1`` Jobs. Each test
checks what a real 1.34+ cluster shows for the same objects (upstream sources named per
test). One demo cluster (two nodes, eight simulated GPUs each) serves the whole module;
the scenarios use their own namespaces, and the two that taint devices run last.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

BIN = Path(sys.executable).with_name("drahealth")
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))
SCENARIOS = Path(__file__).with_name("scenarios")
T = TypeVar("T")

pytestmark = [
    pytest.mark.skipif(KUBECTL is None, reason="kubectl not found next to the interpreter"),
    pytest.mark.timeout(120),
]


@dataclass
class Demo:
    proc: subprocess.Popen[str]
    kubeconfig: Path
    workdir: Path

    def kubectl(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        assert KUBECTL is not None
        res = subprocess.run(
            [KUBECTL, "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if ok and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {res.stderr}")
        return res

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, name: str) -> str:
        return self.kubectl("apply", "-f", str(SCENARIOS / name)).stdout

    def wait(self, ns: str, target: str, condition: str, timeout: int = 30) -> None:
        """``kubectl wait``: fails with kubectl's message when ``timeout`` passes."""
        self.kubectl("wait", "-n", ns, target, f"--for={condition}", f"--timeout={timeout}s")

    def claims(self, ns: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get("resourceclaims", "-n", ns)["items"]
        return items

    def inject(self, pool: str, device: str, *args: str) -> None:
        state = self.workdir / pool / "driver"
        res = subprocess.run(
            [str(BIN), "inject", "--state-dir", str(state), device, *args],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr


def until(check: Callable[[], T | None], within: float, what: str) -> T:
    """Poll ``check`` until it returns something true; fail naming ``what`` after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    tmp = tmp_path_factory.mktemp("scenarios")
    kubeconfig = tmp / "kubeconfig"
    env = {**os.environ, "COLUMNS": "300", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [str(BIN), "demo", "--no-script", "--kubeconfig-out", str(kubeconfig)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 60
    while "press Ctrl-C to stop" not in "".join(seen):
        line = proc.stdout.readline()
        if not line or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("drahealth demo --no-script did not come up:\n" + "".join(seen))
        seen.append(line)
    found = re.search(r"--state-dir (\S+)/node-1/driver", "".join(seen))
    assert found, "".join(seen)
    try:
        yield Demo(proc, kubeconfig, Path(found.group(1)))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _seconds(rfc3339: str) -> float:
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def _device_env(log: str) -> list[str]:
    return sorted(line for line in log.splitlines() if "DRA_DEVICE_" in line)


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    results: list[dict[str, Any]] = (alloc.get("devices") or {}).get("results") or []
    return results


def test_shared_claim_across_containers(demo: Demo) -> None:
    """Two containers of one pod share the device of one generated claim
    (dra-example-driver ``basic-shared-claim-across-containers``; the claim's name is
    ``<pod>-<claim>-<5 chars>``, pkg/controller/resourceclaim)."""
    demo.apply("shared-claim-across-containers.yaml")
    demo.wait("shared-containers", "pod/pod0", "condition=Ready")
    (claim,) = demo.claims("shared-containers")
    assert re.fullmatch(r"pod0-gpu-[a-z0-9]{5}", claim["metadata"]["name"])
    assert len(_results(claim)) == 1
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["pod0"]
    logs = [
        demo.kubectl("logs", "-n", "shared-containers", "pod0", "-c", c).stdout
        for c in ("ctr0", "ctr1")
    ]
    assert _device_env(logs[0]) and _device_env(logs[0]) == _device_env(logs[1])


def test_reapplying_a_scenario_changes_nothing(demo: Demo) -> None:
    """``kubectl apply`` of an unchanged manifest succeeds and changes nothing: the
    server defaults the patched template (``allocationMode``, ``count``) before it checks
    that the spec is immutable, so the atomic ``requests`` list kubectl sends back equals
    what is stored (upstream: resource v1 defaults run on every decode; the template's
    ``ValidateResourceClaimTemplateUpdate``). kubectl reports such an atomic-list patch as
    ``configured``; the object's resourceVersion stays as it was."""
    demo.apply("shared-claim-across-containers.yaml")
    before = demo.get("resourceclaimtemplate", "-n", "shared-containers", "one-gpu")
    out = demo.apply("shared-claim-across-containers.yaml")
    assert "one-gpu" in out and "pod/pod0 unchanged" in out, out
    after = demo.get("resourceclaimtemplate", "-n", "shared-containers", "one-gpu")
    # (a ResourceClaimTemplate has no generation upstream: compared when there)
    for field in ("resourceVersion", "generation"):
        assert after["metadata"].get(field) == before["metadata"].get(field), field
    assert after["metadata"]["resourceVersion"]


def test_shared_claim_across_pods(demo: Demo) -> None:
    """Two pods on one ResourceClaim: both are reserved consumers; the claim stays
    allocated until the last one is gone (dra-example-driver
    ``basic-shared-claim-across-pods``; pkg/controller/resourceclaim deallocates only
    when ``reservedFor`` is empty)."""
    demo.apply("shared-claim-across-pods.yaml")
    for pod in ("pod0", "pod1"):
        demo.wait("shared-pods", f"pod/{pod}", "condition=Ready")
    pods = demo.get("pods", "-n", "shared-pods")["items"]
    assert len({p["spec"]["nodeName"] for p in pods}) == 1
    claim = demo.get("resourceclaim", "-n", "shared-pods", "shared-gpu")
    assert sorted(r["name"] for r in claim["status"]["reservedFor"]) == ["pod0", "pod1"]
    device = _results(claim)
    demo.kubectl("delete", "pod", "-n", "shared-pods", "pod0", "--wait=true")

    def reserved() -> list[str] | None:
        c = demo.get("resourceclaim", "-n", "shared-pods", "shared-gpu")
        names = [r["name"] for r in (c.get("status") or {}).get("reservedFor") or []]
        return names if names == ["pod1"] else None

    until(reserved, 15, "pod0 released from the claim")
    claim = demo.get("resourceclaim", "-n", "shared-pods", "shared-gpu")
    assert _results(claim) == device, "deallocated while pod1 still uses the device"
    demo.kubectl("delete", "pod", "-n", "shared-pods", "pod1", "--wait=true")

    def deallocated() -> bool:
        c = demo.get("resourceclaim", "-n", "shared-pods", "shared-gpu")
        status = c.get("status") or {}
        return not status.get("reservedFor") and not status.get("allocation")

    until(deallocated, 15, "the claim deallocated once no pod uses it")


def test_cel_selectors_on_quantities_and_versions(demo: Demo) -> None:
    """CEL selectors with ``quantity(...)``/``compareTo`` and ``semver(...)``/
    ``isGreaterThan`` (dra-example-driver ``cel-selector``; the Kubernetes CEL
    libraries of staging/src/k8s.io/dynamic-resource-allocation/cel); a claim no
    device satisfies leaves its pod Pending with a ``FailedScheduling`` Warning."""
    demo.apply("cel-selector.yaml")
    demo.wait("cel-selector", "pod/fits", "condition=Ready")
    fits = next(c for c in demo.claims("cel-selector") if c["metadata"]["name"].startswith("fits-"))
    assert len(_results(fits)) == 1

    def failed_scheduling() -> list[dict[str, Any]]:
        events = demo.get(
            "events", "-n", "cel-selector", "--field-selector", "involvedObject.name=too-big"
        )["items"]
        return [e for e in events if e["reason"] == "FailedScheduling"]

    (event, *_) = until(failed_scheduling, 15, "a FailedScheduling Event for too-big")
    assert event["type"] == "Warning" and "cannot allocate all claims" in event["message"]
    pod = demo.get("pod", "-n", "cel-selector", "too-big")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")


def test_admin_access(demo: Demo) -> None:
    """Admin access to every GPU of a node, allowed only in a namespace labelled
    ``resource.kubernetes.io/admin-access: "true"`` (dra-example-driver
    ``admin-access``; pkg/apis/resource/validation ``AuthorizedForAdmin``)."""
    demo.apply("admin-access.yaml")
    demo.wait("gpu-admin", "pod/monitor", "condition=Ready")
    (claim,) = demo.claims("gpu-admin")
    results = _results(claim)
    assert len(results) == 8 and all(r.get("adminAccess") is True for r in results)
    assert len({r["pool"] for r in results}) == 1
    assert "DRA_ADMIN_ACCESS=true" in demo.kubectl("logs", "-n", "gpu-admin", "monitor").stdout
    denied = demo.kubectl("apply", "-f", str(SCENARIOS / "admin-access-denied.yaml"), ok=False)
    assert denied.returncode != 0
    assert "resource.kubernetes.io/admin-access" in denied.stderr, denied.stderr


def test_prioritized_list_falls_back(demo: Demo) -> None:
    """``firstAvailable``: the first subrequest no device satisfies is skipped, the
    result names the chosen subrequest as ``<request>/<subrequest>``
    (dra-example-driver ``prioritized-alternatives``; KEP-4816)."""
    demo.apply("prioritized-list.yaml")
    demo.wait("prioritized-list", "pod/pod0", "condition=Ready")
    (claim,) = demo.claims("prioritized-list")
    assert [r["request"] for r in _results(claim)] == ["gpu/fallback"]


def test_opaque_config_reaches_the_allocation(demo: Demo) -> None:
    """Opaque driver config of a claim is copied into
    ``status.allocation.devices.config`` with ``source: FromClaim`` (dra-example-driver
    ``basic-resourceclaim-opaque-config``; the structured allocator's result)."""
    demo.apply("opaque-config.yaml")
    demo.wait("opaque-config", "pod/pod0", "condition=Ready")
    claim = demo.get("resourceclaim", "-n", "opaque-config", "shared-timesliced")
    (config,) = claim["status"]["allocation"]["devices"]["config"]
    assert config["source"] == "FromClaim" and config["requests"] == ["gpu"]
    assert config["opaque"]["driver"] == "gpu.example.com"
    assert config["opaque"]["parameters"]["sharing"]["strategy"] == "TimeSlicing"


def test_init_container_shares_the_claim(demo: Demo) -> None:
    """An init container runs to completion with the claim's device, then the main
    container starts with the same one (dra-example-driver ``initcontainer-shared-gpu``)."""
    demo.apply("init-containers.yaml")
    demo.wait("init-containers", "pod/pod0", "condition=Ready")
    pod = demo.get("pod", "-n", "init-containers", "pod0")
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0
    assert init["state"]["terminated"]["reason"] == "Completed"
    warmup = demo.kubectl("logs", "-n", "init-containers", "pod0", "-c", "warmup").stdout
    main = demo.kubectl("logs", "-n", "init-containers", "pod0", "-c", "ctr").stdout
    assert "warmed up" in warmup
    assert _device_env(warmup) and _device_env(warmup) == _device_env(main)


def test_batch_job_completes(demo: Demo) -> None:
    """A Job of short GPU tasks (completions 3, parallelism 2) completes: ``Complete``
    after ``SuccessCriteriaMet``, 3 succeeded pods named ``batch-<5 chars>``
    (pkg/controller/job; kubectl's Job columns from pkg/printers)."""
    demo.apply("training-job.yaml")
    demo.wait("training", "job/batch", "condition=Complete", timeout=40)
    job = demo.get("job", "-n", "training", "batch")
    assert job["status"]["succeeded"] == 3 and job["status"].get("failed", 0) == 0
    kinds = [c["type"] for c in job["status"]["conditions"]]
    assert kinds == ["SuccessCriteriaMet", "Complete"]
    pods = demo.get("pods", "-n", "training", "-l", "batch.kubernetes.io/job-name=batch")
    assert len(pods["items"]) == 3
    for pod in pods["items"]:
        assert re.fullmatch(r"batch-[a-z0-9]{5}", pod["metadata"]["name"])
        assert pod["status"]["phase"] == "Succeeded"
    table = demo.kubectl("get", "job", "-n", "training", "batch").stdout.split()
    assert table[:5] == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    assert table[5:8] == ["batch", "Complete", "3/3"]


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in its slow step
def test_training_job_survives_a_device_failure(demo: Demo) -> None:
    """The training Job's pod is evicted from a GPU that fell off the bus (the
    remediation controller's NoExecute taint, the eviction controller's
    ``DisruptionTarget``); the ``Ignore`` rule of its ``podFailurePolicy`` keeps the
    failure from counting against ``backoffLimit: 0`` and the Job replaces the pod on
    a healthy GPU (pkg/controller/job/pod_failure_policy.go; KEP-3329)."""
    demo.apply("training-job.yaml")
    selector = "batch.kubernetes.io/job-name=train"
    first = until(
        lambda: [
            p for p in demo.get("pods", "-n", "training", "-l", selector)["items"]
            if p["status"].get("phase") == "Running"
        ],
        30, "the training pod running",
    )[0]  # fmt: skip
    claim_name = first["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    (result,) = _results(demo.get("resourceclaim", "-n", "training", claim_name))
    demo.inject(result["pool"], result["device"], "unhealthy", "--message", "XID 79: fell off")
    try:

        def replaced() -> dict[str, Any] | None:
            job = demo.get("job", "-n", "training", "train")
            failed = [c for c in job["status"].get("conditions") or [] if c["type"] == "Failed"]
            assert not failed, f"the Job failed: {failed[0]['reason']}: {failed[0]['message']}"
            pods = demo.get("pods", "-n", "training", "-l", selector)["items"]
            return next(
                (p for p in pods if p["metadata"]["uid"] != first["metadata"]["uid"]
                 and p["status"].get("phase") == "Running"),
                None,
            )  # fmt: skip

        second = until(replaced, 40, "a replacement training pod running")
        claim = second["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        (moved,) = _results(demo.get("resourceclaim", "-n", "training", claim))
        assert (moved["pool"], moved["device"]) != (result["pool"], result["device"])
        job = demo.get("job", "-n", "training", "train")
        assert job["status"].get("failed", 0) == 0 and job["status"]["active"] == 1
        events = demo.get(
            "events", "-n", "training",
            "--field-selector", f"involvedObject.name={first['metadata']['name']}",
        )["items"]  # fmt: skip
        assert "DeviceTaintManagerEviction" in [e["reason"] for e in events]
    finally:
        demo.inject(result["pool"], result["device"], "healthy")


def test_device_taints_and_toleration_seconds(demo: Demo) -> None:
    """A NoExecute DeviceTaintRule over every GPU: the pod whose claim does not tolerate
    it is evicted at once (Event ``DeviceTaintManagerEviction``, "Marking for deletion"),
    the one tolerating it for 5 s afterwards, the one tolerating it for ever keeps running
    (dra-example-driver ``device-taint-configurable-pod-eviction-time``; KEP-5055)."""
    demo.apply("device-taints.yaml")
    for pod in ("no-toleration", "tolerates", "short-toleration"):
        demo.wait("device-taints", f"pod/{pod}", "condition=Ready")
    demo.apply("device-taint-rule.yaml")
    try:

        def gone(name: str) -> Callable[[], bool]:
            def check() -> bool:
                res = demo.kubectl("get", "pod", "-n", "device-taints", name, ok=False)
                return res.returncode != 0 and "NotFound" in res.stderr

            return check

        until(gone("no-toleration"), 15, "no-toleration evicted")
        rule = demo.get("devicetaintrule", "all-gpus-unhealthy")
        added = rule["spec"]["taint"]["timeAdded"]
        events = demo.get(
            "events", "-n", "device-taints", "--field-selector", "involvedObject.name=no-toleration"
        )["items"]
        evictions = [e for e in events if e["reason"] == "DeviceTaintManagerEviction"]
        assert evictions and evictions[0]["message"] == "Marking for deletion"
        until(gone("short-toleration"), 20, "short-toleration evicted after 5 s")
        events = demo.get(
            "events", "-n", "device-taints",
            "--field-selector", "involvedObject.name=short-toleration",
        )["items"]  # fmt: skip
        (late,) = [e for e in events if e["reason"] == "DeviceTaintManagerEviction"]
        when = late.get("lastTimestamp") or late.get("eventTime")
        assert _seconds(when) - _seconds(added) >= 5, (added, when)
        pod = demo.get("pod", "-n", "device-taints", "tolerates")
        assert pod["status"]["phase"] == "Running" and not pod["metadata"].get("deletionTimestamp")
    finally:
        demo.kubectl("delete", "-f", str(SCENARIOS / "device-taint-rule.yaml"), ok=False)
