"""The embedded API server serving each Kubernetes release profile, over real HTTP.

Discovery (plain and aggregated) lists exactly what the release serves; unserved group
versions answer the real 404; gated fields are dropped; validation follows the
release; SelfSubjectAccessReview answers; the scheduler stand-in honours Node taints
and cordon; ``drahealth apiserver --kube-version/--feature-gates`` as a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod

from drahealth.controlplane import APIServer
from drahealth.core import KUBE_VERSIONS, KubeProfile, kube_profile
from drahealth.kube import discover, make_client, resource_class
from drahealth.standins import StandIns
from tests._support import eventually

#: 1.35 with the rule API (its gate depends on the taint gate)
RULES_1_35 = {"DRADeviceTaints": True, "DRADeviceTaintRules": True}


BIN = Path(sys.executable).with_name("drahealth")
GROUP = "resource.k8s.io"
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
NOT_FOUND = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "the server could not find the requested resource",
    "reason": "NotFound",
    "code": 404,
}

#: (version, gates) -> the DeviceTaintRule versions that release serves.
PROFILES: list[tuple[str, dict[str, bool], tuple[str, ...]]] = [
    ("1.34", {}, ()),
    ("1.34", {"DRADeviceTaints": True}, ("v1alpha3",)),
    ("1.35", {}, ()),
    ("1.35", RULES_1_35, ("v1alpha3",)),
    ("1.36", {}, ()),
    ("1.36", {"DRADeviceTaintRules": True}, ("v1beta2",)),
    ("1.37", {}, ("v1",)),
    ("1.38", {}, ("v1",)),
]


class Http:
    """A small JSON client for one server."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        kwargs: dict[str, Any] = {"headers": headers or {}}
        if body is not None:
            kwargs["data"] = json.dumps(body)
            kwargs["headers"]["Content-Type"] = (
                "application/merge-patch+json" if method == "PATCH" else "application/json"
            )
        async with self.session.request(method, self.url + path, **kwargs) as resp:
            return resp.status, json.loads(await resp.read())


@contextlib.asynccontextmanager
async def _serve(profile: KubeProfile | None) -> AsyncIterator[tuple[APIServer, Http]]:
    server = APIServer(profile=profile)
    await server.start(host="127.0.0.1", port=0)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            yield server, Http(session, server.url)
    finally:
        await server.stop()


def _rule(name: str, api_version: str, effect: str = "NoSchedule", **selector: Any) -> Any:
    return {
        "apiVersion": f"{GROUP}/{api_version}",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": selector or {"driver": "gpu.example.com", "device": "gpu-0"},
            "taint": {"key": "example.com/bad", "value": "x", "effect": effect},
        },
    }


def _slice(name: str, taints: list[Any] | None = None) -> Any:
    device: dict[str, Any] = {"name": "gpu-0"}
    if taints is not None:
        device["taints"] = taints
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.example.com",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "node-a",
            "devices": [device],
        },
    }


# ------------------------------------------------------------------------- discovery


@pytest.mark.parametrize(("version", "gates", "served"), PROFILES)
async def test_discovery_lists_exactly_what_the_release_serves(
    version: str, gates: dict[str, bool], served: tuple[str, ...]
) -> None:
    profile = kube_profile(version, gates)
    async with _serve(profile) as (server, http):
        want = list(dict.fromkeys(["v1", *served]))
        code, group = await http.call("GET", f"/apis/{GROUP}")
        assert code == 200 and [v["version"] for v in group["versions"]] == want
        assert group["preferredVersion"]["version"] == "v1"
        _, groups = await http.call("GET", "/apis")
        listed = next(g for g in groups["groups"] if g["name"] == GROUP)
        assert [v["version"] for v in listed["versions"]] == want
        _, agg = await http.call("GET", "/apis", headers={"Accept": AGGREGATED})
        item = next(i for i in agg["items"] if i["metadata"]["name"] == GROUP)
        assert [v["version"] for v in item["versions"]] == want
        for v in want:
            code, doc = await http.call("GET", f"/apis/{GROUP}/{v}")
            assert code == 200
            kinds = {r["name"] for r in doc["resources"]}
            aggregated = next(x for x in item["versions"] if x["version"] == v)
            assert {r["resource"] for r in aggregated["resources"]} == {
                k for k in kinds if "/" not in k
            }
            if v != "v1":
                want_kinds = {"devicetaintrules"}
                if profile.rule_status:
                    want_kinds.add("devicetaintrules/status")
                assert kinds == want_kinds
        for v in {"v1alpha3", "v1beta2", "v1beta1"} - set(want):
            assert await http.call("GET", f"/apis/{GROUP}/{v}") == (404, NOT_FOUND)
            path = f"/apis/{GROUP}/{v}/devicetaintrules"
            assert await http.call("GET", path) == (404, NOT_FOUND)
        has_v1_rules = any(
            r["name"] == "devicetaintrules"
            for r in (await http.call("GET", f"/apis/{GROUP}/v1"))[1]["resources"]
        )
        assert has_v1_rules == ("v1" in served)
        _, info = await http.call("GET", "/version")
        minor = version.split(".")[1]
        assert info["gitVersion"] == f"v1.{minor}.0-drahealth"
        assert (info["major"], info["minor"]) == ("1", minor)
        found = await discover(make_client(server_url=server.url))
        assert found.versions.get("DeviceTaintRule", ()) == served
        assert found.server_version == f"v1.{minor}.0-drahealth"


async def test_default_profile_is_the_newest_release() -> None:
    async with _serve(None) as (server, http):
        assert server.profile.version == KUBE_VERSIONS[-1]
        _, info = await http.call("GET", "/version")
        assert info["minor"] == KUBE_VERSIONS[-1].split(".")[1]


# ------------------------------------------------------------------ DeviceTaintRules


async def test_1_35_serves_rules_only_at_v1alpha3_with_the_gate() -> None:
    async with _serve(kube_profile("1.35")) as (_, http):
        path = f"/apis/{GROUP}/v1/devicetaintrules"
        assert await http.call("POST", path, _rule("r", "v1")) == (404, NOT_FOUND)
    async with _serve(kube_profile("1.35", RULES_1_35)) as (_, http):
        assert (await http.call("POST", path, _rule("r", "v1")))[0] == 404
        alpha = f"/apis/{GROUP}/v1alpha3/devicetaintrules"
        code, created = await http.call("POST", alpha, _rule("r", "v1alpha3", "None"))
        assert code == 201, created
        assert created["apiVersion"] == f"{GROUP}/v1alpha3"
        assert created["spec"]["taint"]["timeAdded"]
        code, listed = await http.call("GET", alpha)
        assert listed["apiVersion"] == f"{GROUP}/v1alpha3" and len(listed["items"]) == 1
        status = {"status": {"conditions": []}}
        code, _ = await http.call("PATCH", f"{alpha}/r/status", status)
        assert code == 200  # status exists from 1.35 on


async def test_1_37_serves_rules_at_v1() -> None:
    async with _serve(kube_profile("1.37")) as (_, http):
        code, created = await http.call(
            "POST", f"/apis/{GROUP}/v1/devicetaintrules", _rule("r", "v1")
        )
        assert code == 201 and created["apiVersion"] == f"{GROUP}/v1"


async def test_1_34_refuses_effect_none_and_accepts_the_alpha_selector() -> None:
    profile = kube_profile("1.34", {"DRADeviceTaints": True})
    alpha = f"/apis/{GROUP}/v1alpha3/devicetaintrules"
    async with _serve(profile) as (_, http):
        code, body = await http.call("POST", alpha, _rule("r", "v1alpha3", "None"))
        assert code == 422
        assert body["details"]["causes"] == [
            {
                "reason": "FieldValueNotSupported",
                "message": 'Unsupported value: "None": supported values: "NoExecute", "NoSchedule"',
                "field": "spec.taint.effect",
            }
        ]
        assert body["message"].startswith(
            'DeviceTaintRule.resource.k8s.io "r" is invalid: spec.taint.effect: '
            'Unsupported value: "None"'
        )
        sel = {
            "deviceClassName": "gpu",
            "selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}],
        }
        code, created = await http.call("POST", alpha, _rule("c", "v1alpha3", **sel))
        assert code == 201, created
        assert created["spec"]["deviceSelector"]["deviceClassName"] == "gpu"
        # no status before 1.35
        assert (await http.call("GET", f"{alpha}/c/status")) == (404, NOT_FOUND)
        code, body = await http.call("POST", f"/apis/{GROUP}/v1/resourceslices", _slice("s"))
        assert code == 201
        bad = _slice("t", [{"key": "example.com/bad", "effect": "None"}])
        code, body = await http.call("POST", f"/apis/{GROUP}/v1/resourceslices", bad)
        assert code == 422 and body["details"]["causes"][0]["field"] == (
            "spec.devices[0].taints[0].effect"
        )
    async with _serve(kube_profile("1.35", RULES_1_35)) as (_, http):
        sel = {"deviceClassName": "gpu"}
        code, body = await http.call(
            "POST", f"{alpha}?fieldValidation=Strict", _rule("c", "v1alpha3", **sel)
        )
        assert code == 400  # the strict decoder's answer, before validation
        assert body["message"].endswith(
            'strict decoding error: unknown field "spec.deviceSelector.deviceClassName"'
        )


# ------------------------------------------------------------------ dropped fields


@pytest.mark.parametrize(("version", "kept"), [("1.35", False), ("1.36", True)])
async def test_slice_taints_follow_dra_device_taints(version: str, kept: bool) -> None:
    taint = {"key": "example.com/bad", "value": "x", "effect": "NoExecute"}
    path = f"/apis/{GROUP}/v1/resourceslices"
    async with _serve(kube_profile(version)) as (_, http):
        code, created = await http.call("POST", path, _slice("s", [taint]))
        assert code == 201, created
        device = created["spec"]["devices"][0]
        assert ("taints" in device) == kept
        code, got = await http.call("GET", f"{path}/s")
        assert ("taints" in got["spec"]["devices"][0]) == kept


def _pod_status(message: bool) -> Any:
    health: dict[str, Any] = {"resourceID": "gpu.example.com/node-a/gpu-0", "health": "Unhealthy"}
    if message:
        health["message"] = "XID 79"
    return {
        "status": {
            "containerStatuses": [
                {
                    "name": "c",
                    "image": "busybox",
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [health]}],
                }
            ]
        }
    }


@pytest.mark.parametrize(("version", "kept"), [("1.35", False), ("1.36", True)])
async def test_pod_health_follows_resource_health_status(version: str, kept: bool) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
        },
    }
    async with _serve(kube_profile(version)) as (_, http):
        assert (await http.call("POST", "/api/v1/namespaces/default/pods", pod))[0] == 201
        path = "/api/v1/namespaces/default/pods/p/status"
        code, got = await http.call("PATCH", path, _pod_status(message=kept))
        assert code == 200, got
        status = got["status"]["containerStatuses"][0]
        assert ("allocatedResourcesStatus" in status) == kept
        if kept:
            assert status["allocatedResourcesStatus"][0]["resources"][0]["message"] == "XID 79"


# ------------------------------------------------------------------ access reviews


async def test_self_subject_access_review_is_answered_and_discovered() -> None:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "group": GROUP,
                "resource": "devicetaintrules",
                "verb": "create",
            }
        },
    }
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    async with _serve(kube_profile("1.35")) as (_, http):
        code, body = await http.call("POST", path, review)
        assert code == 201, body
        assert body["status"] == {"allowed": True}  # as for system:masters: no reason
        assert body["spec"] == review["spec"]
        code, body = await http.call("GET", path)
        assert code == 405 and body["reason"] == "MethodNotAllowed"
        code, body = await http.call("POST", path, {**review, "spec": {}})
        # 1.35 reports the missing attributes at spec.resourceAttributes (1.37: at spec)
        assert code == 422 and body["details"]["causes"][0]["field"] == "spec.resourceAttributes"
        _, doc = await http.call("GET", "/apis/authorization.k8s.io/v1")
        assert doc["resources"][0]["name"] == "selfsubjectaccessreviews"
        assert doc["resources"][0]["verbs"] == ["create"]
        _, agg = await http.call("GET", "/apis", headers={"Accept": AGGREGATED})
        names = {i["metadata"]["name"] for i in agg["items"]}
        assert "authorization.k8s.io" in names


# ------------------------------------------------------------------ stand-ins


async def test_scheduler_honours_node_taints_and_cordon() -> None:
    async with _serve(None) as (server, http):
        for name, spec in (
            ("node-a", {"unschedulable": True}),
            ("node-b", {"taints": [{"key": "example.com/bad-gpu", "effect": "NoSchedule"}]}),
        ):
            body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": spec}
            assert (await http.call("POST", "/api/v1/nodes", body))[0] == 201
        client = make_client(server_url=server.url)
        standins = StandIns(client)
        await standins.start()
        try:
            pods = "/api/v1/namespaces/default/pods"
            plain = {"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "c"}]}}
            assert (await http.call("POST", pods, plain))[0] == 201

            async def reason() -> str:
                _, pod = await http.call("GET", f"{pods}/plain")
                conds = (pod.get("status") or {}).get("conditions") or []
                return next((c["message"] for c in conds if c["type"] == "PodScheduled"), "")

            text = await eventually(reason, 10, "the pod marked unschedulable")
            assert text.startswith(
                "0/2 nodes are available: 1 node(s) had untolerated taint {example.com/bad-gpu: }, "
                "1 node(s) were unschedulable."
            ), text
            tolerant = {
                "metadata": {"name": "tolerant"},
                "spec": {
                    "containers": [{"name": "c"}],
                    "tolerations": [{"key": "example.com/bad-gpu", "operator": "Exists"}],
                },
            }
            assert (await http.call("POST", pods, tolerant))[0] == 201

            async def bound() -> str:
                _, pod = await http.call("GET", f"{pods}/tolerant")
                return str(pod["spec"].get("nodeName") or "")

            node = await eventually(bound, 10, "the tolerating pod bound")
            assert node == "node-b"
            _, pod = await http.call("GET", f"{pods}/plain")
            assert not pod["spec"].get("nodeName")
        finally:
            await standins.stop()
            await client.close()


async def test_stand_ins_follow_the_profile() -> None:
    async with _serve(kube_profile("1.35")) as (server, _):
        client = make_client(server_url=server.url)
        try:
            old = StandIns(client, kube_profile("1.35"))
            assert old.taint_eviction is None and old.scheduler.rules is None
            beta = StandIns(client, kube_profile("1.36", {"DRADeviceTaintRules": True}))
            assert beta.taint_eviction is not None and beta.taint_eviction.rules is not None
            assert beta.taint_eviction.rule_type is resource_class("DeviceTaintRule", "v1beta2")
            alpha = StandIns(client, kube_profile("1.34", {"DRADeviceTaints": True}))
            assert alpha.taint_eviction is not None and not alpha.taint_eviction.rule_status
            # the 1.35 stand-ins run against a server without the rule API
            await client.create(Node(metadata=ObjectMeta(name="node-a")))
            await old.start()
            try:
                pod = Pod(
                    metadata=ObjectMeta(name="p"), spec=PodSpec(containers=[Container(name="c")])
                )
                await client.create(pod, namespace="default")
                await eventually(lambda: old.scheduler.bound == 1, 10, "the pod bound on 1.35")
            finally:
                await old.stop()
        finally:
            await client.close()


# ------------------------------------------------------------------ the command


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN), "apiserver", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("args", "served", "says"),
    [
        (("--kube-version", "1.37"), "v1", "Kubernetes 1.37: DeviceTaintRule resource.k8s.io/v1"),
        (
            (
                "--kube-version",
                "1.35",
                "--feature-gates",
                "DRADeviceTaints=true,DRADeviceTaintRules=true",
            ),
            "v1alpha3",
            "Kubernetes 1.35: DeviceTaintRule resource.k8s.io/v1alpha3",
        ),
        (("--kube-version", "1.36"), None, "Kubernetes 1.36: DeviceTaintRule not served"),
    ],
)
async def test_apiserver_command_serves_the_chosen_release(
    args: tuple[str, ...], served: str | None, says: str
) -> None:
    proc = _start(*args)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        m = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)\n", line)
        assert m, line
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            http = Http(session, m.group(1))
            _, group = await http.call("GET", f"/apis/{GROUP}")
            versions = [v["version"] for v in group["versions"]]
            assert versions == (["v1", served] if served not in (None, "v1") else ["v1"])
            _, info = await http.call("GET", "/version")
            assert info["minor"] == args[1].split(".")[1]
            if served:
                rule = _rule("r", served)
                code, _ = await http.call("POST", f"/apis/{GROUP}/{served}/devicetaintrules", rule)
                assert code == 201
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert f"serving {says}" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--kube-version", "1.39"),
            "unsupported Kubernetes version '1.39': choose one of 1.34, 1.35, 1.36, 1.37, 1.38",
        ),
        (
            ("--kube-version", "1.38", "--feature-gates", "DRADeviceTaintRules=false"),
            "cannot set feature gate DRADeviceTaintRules to false, feature is locked to true",
        ),
        (("--feature-gates", "DRADeviceTaints=maybe"), "invalid value of DRADeviceTaints=maybe"),
        (("--feature-gates", "Nope=true"), "unrecognized feature gate: Nope"),
    ],
)
def test_apiserver_command_refuses_bad_values(args: tuple[str, ...], message: str) -> None:
    proc = subprocess.run(
        [str(BIN), "apiserver", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
