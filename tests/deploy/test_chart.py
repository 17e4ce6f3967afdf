"""The Helm chart: renders with default and custom values, every manifest validates
against the Kubernetes 1.37 schemas (kubernetes-validate, strict: unknown fields fail),
and the parts the design depends on are there (rolling-update sockets, leader
election, least-privilege RBAC, non-root where possible, optional ServiceMonitor)."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import kubernetes_validate
import pytest
import yaml

from drahealth.remedy._policy_load import parse_policy
from tests.deploy._render import CHART, ROOT, render

KUBE = "1.37.0"

CUSTOM: dict[str, Any] = {
    "image": {"repository": "registry.example.com/drahealth", "tag": "1.2.3"},
    "imagePullSecrets": [{"name": "regcred"}],
    "kubeletDir": "/var/lib/k0s/kubelet",
    "logLevel": "debug",
    "driver": {
        "name": "pci.example.com",
        "profile": "sim-pci",
        "claimCache": False,
        "privileged": True,
        "nodeSelector": {"accelerator": "yes"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "deviceClass": {"name": "pci-devices"},
    "controller": {"replicas": 3, "dryRun": True, "leaseDurationSeconds": 20},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
}


def docs(values: dict[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
    return list(render.manifests(render.render_chart(CHART, values, **kw)))


def by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in manifests if d["kind"] == kind]


def one(manifests: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    [found] = [d for d in by_kind(manifests, kind) if d["metadata"]["name"].endswith(suffix)]
    return found


def validate(manifests: list[dict[str, Any]]) -> list[str]:
    checked = []
    for d in manifests:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: not in the Kubernetes schemas (checked by shape below)
        kubernetes_validate.validate(d, KUBE, strict=True)
        checked.append(f"{d['kind']}/{d['metadata']['name']}")
    return checked


@pytest.mark.parametrize("values", [None, CUSTOM], ids=["default", "custom"])
def test_every_manifest_validates_against_kubernetes_1_37(values: dict[str, Any] | None) -> None:
    manifests = docs(values)
    checked = validate(manifests)
    kinds = {d["kind"] for d in manifests}
    assert {"DaemonSet", "Deployment", "DeviceClass", "ClusterRole", "Role", "Service"} <= kinds
    assert len(checked) >= 20
    print(f"\n{len(checked)} manifests valid against Kubernetes {KUBE}")


def test_validation_is_strict_enough_to_catch_mistakes() -> None:
    ds = copy.deepcopy(one(docs(), "DaemonSet", "-driver"))
    ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurgee"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBE, strict=True)
    ds = copy.deepcopy(one(docs(), "DaemonSet", "-driver"))
    del ds["spec"]["selector"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBE, strict=True)


def test_driver_daemonset_rolls_with_pod_uid_sockets() -> None:
    ds = one(docs(), "DaemonSet", "-driver")
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = ds["spec"]["template"]["spec"]
    [c] = pod["containers"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"POD_UID": "metadata.uid", "NODE_NAME": "spec.nodeName"}
    assert c["args"][1] == "driver" and "--in-cluster" in c["args"] and "--claim-cache" in c["args"]
    assert "--registry-dir=/var/lib/kubelet/plugins_registry" in c["args"]
    sc = c["securityContext"]
    assert "privileged" not in sc and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert not any(v["name"] == "sys" for v in pod["volumes"])


def test_driver_privileged_only_when_asked_and_sysfs_mounted_for_sim_pci() -> None:
    manifests = docs(CUSTOM)
    ds = one(manifests, "DaemonSet", "-driver")
    pod = ds["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["securityContext"] == {"privileged": True}
    assert "--sysfs-root=/host/sys" in c["args"] and "--claim-cache" not in c["args"]
    assert {"name": "sys", "mountPath": "/host/sys", "readOnly": True} in c["volumeMounts"]
    assert "--registry-dir=/var/lib/k0s/kubelet/plugins_registry" in c["args"]
    assert pod["nodeSelector"] == {"accelerator": "yes"}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert c["image"] == "registry.example.com/drahealth:1.2.3"
    dc = one(manifests, "DeviceClass", "pci-devices")
    assert dc["spec"]["selectors"][0]["cel"]["expression"] == 'device.driver == "pci.example.com"'
    role = one(manifests, "ClusterRole", "-driver")
    assert role["rules"][0]["verbs"] == ["get"]  # no claim watch without the cache


def test_controller_deployment_two_replicas_with_leader_election() -> None:
    manifests = docs()
    dep = one(manifests, "Deployment", "-controller")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert "--id=$(POD_NAME)" in c["args"] and "--lease-duration=15" in c["args"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # the policy in the ConfigMap is one the controller accepts
    cm = one(manifests, "ConfigMap", "-controller-policy")
    policy = parse_policy(cm["data"]["policy.yaml"], "policy.yaml")
    assert [r.name for r in policy.rules] == ["unhealthy-devices", "silent-devices"]
    role = one(manifests, "Role", "-controller")
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["get", "create", "update"]} in role["rules"]  # fmt: skip
    custom = one(docs(CUSTOM), "Deployment", "-controller")
    assert custom["spec"]["replicas"] == 3 and "--dry-run" in custom["spec"]["template"]["spec"][
        "containers"][0]["args"]  # fmt: skip


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
        for v in rule["verbs"]
    }  # fmt: skip


def test_rbac_is_least_privilege() -> None:
    manifests = docs()
    for d in by_kind(manifests, "ClusterRole") + by_kind(manifests, "Role"):
        for rule in d["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], d["metadata"]
            assert "secrets" not in rule["resources"], d["metadata"]
    driver = _grants(one(manifests, "ClusterRole", "-driver")["rules"])
    assert ("resource.k8s.io", "resourceslices", "create") in driver
    assert not any(r == "devicetaintrules" or r == "pods" for _, r, _ in driver)
    agent = _grants(one(manifests, "ClusterRole", "-agent")["rules"])
    events = {(g, "events", v) for g in ("", "events.k8s.io") for v in ("create", "patch")}
    assert agent == {("", "pods", "get")} | events
    controller = _grants(one(manifests, "ClusterRole", "-controller")["rules"])
    assert ("", "pods/eviction", "create") in controller
    assert ("resource.k8s.io", "devicetaintrules/status", "patch") in controller
    assert ("", "pods", "delete") not in controller and ("", "pods", "patch") not in controller
    assert not any(r == "configmaps" for _, r, _ in controller)  # namespaced Role only
    # every binding points at a role and a service account the chart creates
    accounts = {d["metadata"]["name"] for d in by_kind(manifests, "ServiceAccount")}
    roles = {(d["kind"], d["metadata"]["name"]) for d in manifests if d["kind"].endswith("Role")}
    for b in by_kind(manifests, "ClusterRoleBinding") + by_kind(manifests, "RoleBinding"):
        assert (b["roleRef"]["kind"], b["roleRef"]["name"]) in roles
        assert {s["name"] for s in b["subjects"]} <= accounts


def test_service_monitors_only_when_enabled() -> None:
    assert not [d for d in docs() if d["kind"] == "ServiceMonitor"]
    monitors = by_kind(docs(CUSTOM), "ServiceMonitor")
    assert len(monitors) == 3
    services = by_kind(docs(CUSTOM), "Service")
    for m in monitors:
        assert m["metadata"]["labels"]["release"] == "prom"
        sel = m["spec"]["selector"]["matchLabels"]
        assert any(sel.items() <= s["metadata"]["labels"].items() for s in services)
        assert m["spec"]["endpoints"] == [{"port": "metrics", "interval": "30s"}]


def test_components_can_be_turned_off() -> None:
    manifests = docs({"driver": {"enabled": False}, "controller": {"enabled": False}})
    assert {d["metadata"]["labels"].get("app.kubernetes.io/component") for d in manifests
            if d["kind"] in ("DaemonSet", "Deployment")} == {"agent"}  # fmt: skip
    assert not by_kind(manifests, "DeviceClass")
    validate(manifests)


def test_release_name_and_namespace_flow_through() -> None:
    manifests = docs(release="prod", namespace="ops")
    ds = one(manifests, "DaemonSet", "prod-drahealth-driver")
    assert ds["metadata"]["namespace"] == "ops"
    agent = one(manifests, "DaemonSet", "-agent")
    assert "--namespace=ops" in agent["spec"]["template"]["spec"]["containers"][0]["args"]


def test_missing_policy_is_a_clear_error() -> None:
    with pytest.raises(render.TemplateError, match=r"controller\.policy is required"):
        docs({"controller": {"policy": None}})


def test_cli_prints_helm_template_output() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "render.py"), str(CHART), "--set",
         "controller.replicas=4", "--namespace", "x"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out.startswith("---\n# Source: drahealth/templates/")
    parsed = [d for d in yaml.safe_load_all(out) if d]
    [dep] = [d for d in parsed if d["kind"] == "Deployment"]
    assert dep["spec"]["replicas"] == 4 and dep["metadata"]["namespace"] == "x"
