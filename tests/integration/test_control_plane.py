"""``ControlPlane`` (the API server with the stand-ins, as ``drahealth apiserver
--with-controllers`` and the demo run it) and its Deployment stand-in, over real HTTP.

Covers: the plane starts and stops the stand-ins with the server (and runs none without
``controllers``); a Deployment gets a ``<name>-<hash>`` ReplicaSet whose pods carry the
template hash, its status and conditions, ``scale``; a template change makes a new
ReplicaSet and scales the old one to 0; ``revisionHistoryLimit`` drops drained old sets;
deleting the Deployment removes its ReplicaSets and pods; malformed Deployments are
refused with upstream's causes; the command's usage errors, and its temporary kubeconfig.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from drahealth.controlplane import APIServer, ControlPlane
from drahealth.standins._deployments import template_hash
from tests._support import eventually

BIN = Path(sys.executable).with_name("drahealth")
DEPLOYS = "/apis/apps/v1/namespaces/default/deployments"
SETS = "/apis/apps/v1/namespaces/default/replicasets"
PODS = "/api/v1/namespaces/default/pods"
JSON = dict[str, Any]


class Http:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def call(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        headers = kw.pop("headers", {})
        async with self.session.request(
            method, self.url + path, json=body, headers=headers, **kw
        ) as r:
            return r.status, await r.json(content_type=None)


@pytest.fixture
async def plane() -> AsyncIterator[tuple[ControlPlane, Http]]:
    cp = ControlPlane(APIServer())
    await cp.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield cp, Http(session, cp.server.url)
    finally:
        await cp.stop()


def _deployment(name: str = "web", replicas: int = 2, **spec: Any) -> JSON:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
            },
            **spec,
        },
    }


async def _sets(http: Http) -> dict[str, JSON]:
    _, body = await http.call("GET", SETS)
    return {s["metadata"]["name"]: s for s in body["items"]}


async def _pods(http: Http) -> list[JSON]:
    _, body = await http.call("GET", PODS)
    return list(body["items"])


async def test_plane_runs_the_stand_ins_and_stops_them(plane: tuple[ControlPlane, Http]) -> None:
    cp, _ = plane
    assert cp.standins is not None and cp.client is not None
    running = cp.running()
    assert any("scheduler" in r for r in running) and any("Deployment" in r for r in running)
    assert any("device-taint eviction" in r for r in running)
    await cp.stop()
    assert cp.standins is None and cp.client is None
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as s, s.get(cp.server.url + "/healthz"):
            pass


async def test_plane_without_controllers_runs_none() -> None:
    cp = ControlPlane(APIServer(), controllers=False)
    await cp.start()
    try:
        assert cp.standins is None and cp.running() == []
        assert cp.client is not None
    finally:
        await cp.stop()


async def test_deployment_makes_a_replicaset_and_reports_status(
    plane: tuple[ControlPlane, Http],
) -> None:
    _, http = plane
    code, created = await http.call("POST", DEPLOYS, _deployment())
    assert code == 201
    name = "web-" + template_hash(created["spec"]["template"])  # as stored: defaulted
    sets = await eventually(lambda: _sets(http), 10, "the Deployment's ReplicaSet")
    rs = sets[name]
    hash_ = name.rsplit("-", 1)[1]
    assert rs["metadata"]["labels"] == {"app": "web", "pod-template-hash": hash_}
    assert rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    assert rs["spec"]["selector"]["matchLabels"] == {"app": "web", "pod-template-hash": hash_}
    (owner,) = rs["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Deployment", "web", True)

    async def two_pods() -> list[JSON] | None:
        pods = await _pods(http)
        return pods if len(pods) == 2 else None

    pods = await eventually(two_pods, 10, "two pods")
    assert all(p["metadata"]["labels"]["pod-template-hash"] == hash_ for p in pods)

    async def status() -> JSON | None:
        _, d = await http.call("GET", f"{DEPLOYS}/web")
        st = d.get("status") or {}
        return st if st.get("replicas") == 2 else None

    st = await eventually(status, 10, "the Deployment's status")
    assert st["updatedReplicas"] == 2 and st["observedGeneration"] == 1
    assert st["unavailableReplicas"] == 2  # no node runs them
    conds = {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}
    assert conds["Available"] == ("False", "MinimumReplicasUnavailable")
    code, scale = await http.call(
        "PATCH", f"{DEPLOYS}/web/scale", {"spec": {"replicas": 3}},
        headers={"Content-Type": "application/merge-patch+json"},
    )  # fmt: skip
    assert code == 200 and scale["spec"]["replicas"] == 3

    async def three() -> bool:
        return bool((await _sets(http))[name]["spec"]["replicas"] == 3)

    await eventually(three, 10, "the ReplicaSet scaled with the Deployment")


async def test_template_change_rolls_and_delete_cleans_up(
    plane: tuple[ControlPlane, Http],
) -> None:
    _, http = plane
    code, created = await http.call("POST", DEPLOYS, _deployment(revisionHistoryLimit=0))
    assert code == 201
    first = "web-" + template_hash(created["spec"]["template"])

    async def has(name: str) -> bool:
        return name in await _sets(http)

    await eventually(lambda: has(first), 10, "the first ReplicaSet")
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "main", "env": [
        {"name": "MODE", "value": "second"}]}]}}}}  # fmt: skip
    code, changed = await http.call(
        "PATCH", f"{DEPLOYS}/web", patch,
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )  # fmt: skip
    assert code == 200, changed
    (container,) = changed["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "busybox:1.36", "the merge key of containers was not used"
    second = "web-" + template_hash(changed["spec"]["template"])
    assert second != first

    async def rolled() -> bool:
        sets = await _sets(http)
        # revisionHistoryLimit 0: the drained first set is deleted
        return second in sets and first not in sets

    await eventually(rolled, 15, "the new ReplicaSet, the old one drained and deleted")
    sets = await _sets(http)
    assert sets[second]["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
    assert (await http.call("DELETE", f"{DEPLOYS}/web"))[0] == 200

    left: list[Any] = []

    async def gone() -> bool:
        left[:] = [list(await _sets(http)), [p["metadata"] for p in await _pods(http)]]
        return not left[0] and not left[1]

    try:
        await eventually(gone, 15, "the ReplicaSets and pods of the deleted Deployment")
    except AssertionError as e:
        raise AssertionError(f"{e}: left {left}") from None


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"replicas": -1}, "spec.replicas", "must be greater than or equal to 0"),
        ({"selector": {}}, "spec.selector", "Required value"),
        (
            {"selector": {"matchLabels": {"app": "other"}}},
            "spec.template.metadata.labels",
            "`selector` does not match template `labels`",
        ),
        (
            {"selector": {"matchExpressions": [{"key": "app", "operator": "Near"}]}},
            "spec.selector",
            "not a valid selector operator",
        ),
        (
            {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}}},
            "spec.template.spec.containers",
            "Required value",
        ),
        ({"revisionHistoryLimit": -3}, "spec.revisionHistoryLimit", "greater than or equal"),
    ],
)
async def test_malformed_deployments_are_refused(
    plane: tuple[ControlPlane, Http], spec: JSON, field: str, message: str
) -> None:
    _, http = plane
    code, status = await http.call("POST", DEPLOYS, _deployment(**spec))
    assert code == 422, status
    causes = status["details"]["causes"]
    assert any(c["field"] == field and message in c["message"] for c in causes), causes


def test_command_refuses_bad_options() -> None:
    """Usage errors exit 2 naming the option, before anything starts."""
    res = subprocess.run(
        [str(BIN), "apiserver", "--with-controllers", "--kube-version", "1.99"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 2 and "--kube-version" in res.stderr, res.stderr
    res = subprocess.run(
        [str(BIN), "apiserver", "--with-controllers=yes"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 2 and "--with-controllers" in res.stderr, res.stderr


def test_command_writes_a_temporary_kubeconfig_and_removes_it(tmp_path: Path) -> None:
    """Without ``--kubeconfig-out`` the command writes a kubeconfig of its own, says
    where, and removes it when SIGTERM stops it (exit 0)."""
    err = tmp_path / "stderr"
    with open(err, "w") as sink:
        proc = subprocess.Popen(
            [str(BIN), "apiserver", "--with-controllers"],
            stdout=subprocess.PIPE, stderr=sink, text=True,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line + err.read_text()
        found = re.search(r"^kubeconfig: (\S+)$", err.read_text(), re.M)
        assert found, err.read_text()
        kubeconfig = Path(found.group(1))
        text = kubeconfig.read_text()
        assert line.split()[-1] in text and "current-context: drahealth" in text
        assert "controllers: scheduler" in err.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
    assert rc == 0, err.read_text()
    assert not kubeconfig.exists() and not kubeconfig.parent.exists()
