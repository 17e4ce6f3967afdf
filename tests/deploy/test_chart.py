"""The Helm chart: renders with default, custom and NVIDIA values, every manifest
validates against the strict schemas (kubernetes-validate: unknown fields fail) of every
release the chart claims that has a published schema set (1.34 to 1.37), and the parts
the design depends on are there (rolling-update sockets, leader election, probes,
least-privilege RBAC per remediation mode, the controller fit for Pod Security
``restricted``, optional ServiceMonitor)."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import kubernetes_validate
import pytest
import yaml

from drahealth.core import DeviceFacts, Health
from drahealth.remedy import parse_policy
from tests.deploy._render import CHART, ROOT, render

KUBE = "1.37.0"
#: Releases the chart claims (Chart.yaml kubeVersion) with schemas to validate against;
#: 1.38 is claimed too but kubernetes-validate publishes no 1.38 schemas (Chart.yaml says
#: why it is claimed anyway).
KUBE_SCHEMAS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
NVIDIA_VALUES = CHART / "values-nvidia.yaml"

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


def validate(manifests: list[dict[str, Any]], kube: str = KUBE) -> list[str]:
    checked = []
    for d in manifests:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: not in the Kubernetes schemas (checked by shape below)
        kubernetes_validate.validate(d, kube, strict=True)
        checked.append(f"{d['kind']}/{d['metadata']['name']}")
    return checked


def nvidia_values() -> dict[str, Any]:
    loaded = yaml.safe_load(NVIDIA_VALUES.read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.mark.parametrize("kube", KUBE_SCHEMAS)
@pytest.mark.parametrize("values", ["default", "custom", "nvidia"])
def test_every_manifest_validates_against_each_claimed_release(values: str, kube: str) -> None:
    chosen = {"default": None, "custom": CUSTOM, "nvidia": nvidia_values()}[values]
    manifests = docs(chosen, kube_version=f"v{kube}")
    checked = validate(manifests, kube)
    kinds = {d["kind"] for d in manifests}
    assert {"DaemonSet", "Deployment", "ClusterRole", "Role", "Service"} <= kinds
    assert len(checked) >= 15
    print(f"\n{len(checked)} manifests ({values} values) valid against Kubernetes {kube}")


def test_installed_kubernetes_validate_has_no_newer_schemas_than_we_check() -> None:
    """When a kubernetes-validate with 1.38 schemas is installed, this fails: add 1.38."""
    from kubernetes_validate.utils import latest_version

    assert latest_version() == KUBE_SCHEMAS[-1]


def test_kube_version_is_honest() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.34.0-0 <1.39.0-0"
    for ok in ("v1.34.0", "v1.34.2-eks-1", "v1.36.1", "v1.38.0", "v1.38.9+k3s1"):
        docs(kube_version=ok)
    for bad in ("v1.33.9", "v1.39.0", "v2.0.0"):
        with pytest.raises(render.TemplateError, match="incompatible with Kubernetes"):
            docs(kube_version=bad)


def _containers(manifests: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (d["metadata"]["name"], c)
        for d in manifests
        if d["kind"] in ("DaemonSet", "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]


@pytest.mark.parametrize("values", [None, "nvidia"])
def test_every_container_has_liveness_and_readiness_probes(values: str | None) -> None:
    manifests = docs(nvidia_values() if values else None)
    containers = _containers(manifests)
    want = {"driver": 9401, "agent": 9402, "controller": 9403}
    assert len(containers) == (2 if values else 3)
    for name, c in containers:
        [port] = c["ports"]
        assert port["name"] == "metrics"
        assert port["containerPort"] == want[c["name"]], name
        live, ready = c["livenessProbe"], c["readinessProbe"]
        assert live["httpGet"] == {"path": "/healthz", "port": "metrics"}, name
        assert ready["httpGet"] == {"path": "/readyz", "port": "metrics"}, name
        # a lost API server makes a pod unready for ~30 s, and restarts only a hung process
        assert ready["periodSeconds"] * ready["failureThreshold"] <= 30
        assert live["periodSeconds"] * live["failureThreshold"] >= 60
        assert live["timeoutSeconds"] >= 1 and ready["timeoutSeconds"] >= 1
        assert f"--metrics-port={port['containerPort']}" in c["args"]
        assert "--metrics-host=0.0.0.0" in c["args"]  # the kubelet probes the pod IP


@pytest.mark.parametrize(
    ("mode", "nodes"),
    [
        ("auto", True),
        ("taint-rules", False),
        ("node-taint", True),
        ("cordon", True),
        ("evict-only", False),
        ("report-only", False),
    ],
)
def test_remediation_mode_flag_and_node_access(mode: str, nodes: bool) -> None:
    manifests = docs({"controller": {"remediationMode": mode}})
    [c] = one(manifests, "Deployment", "-controller")["spec"]["template"]["spec"]["containers"]
    assert f"--remediation-mode={mode}" in c["args"]
    grants = _grants(one(manifests, "ClusterRole", "-controller")["rules"])
    node_grants = {g for g in grants if g[1] == "nodes"}
    watch = {("", "nodes", v) for v in ("list", "watch")}  # the opt-out label, every mode
    rollup = {("", "nodes", "get")}  # the node rollup (on by default) reads the Node
    if nodes:
        assert node_grants == watch | rollup | {("", "nodes", "update")}
    else:
        assert node_grants == watch | rollup
    validate(manifests)


def test_bad_remediation_mode_is_a_clear_error() -> None:
    with pytest.raises(render.TemplateError, match=r"controller\.remediationMode: 'fast' is not"):
        docs({"controller": {"remediationMode": "fast"}})


def test_values_schema_catches_typos_in_types() -> None:
    with pytest.raises(render.TemplateError, match=r"driver\.withdrawUnhealthy: True is not one"):
        docs({"driver": {"withdrawUnhealthy": True}})
    with pytest.raises(render.TemplateError, match=r"probes\.liveness: Additional properties"):
        docs({"probes": {"liveness": {"periodSecond": 5}}})


def test_withdrawal_flags_follow_the_values() -> None:
    [c] = one(docs(), "DaemonSet", "-driver")["spec"]["template"]["spec"]["containers"]
    assert "--withdraw-unhealthy=auto" in c["args"] and "--withdraw-unknown" not in c["args"]
    manifests = docs({"driver": {"withdrawUnhealthy": "always", "withdrawUnknown": True}})
    [c] = one(manifests, "DaemonSet", "-driver")["spec"]["template"]["spec"]["containers"]
    assert "--withdraw-unhealthy=always" in c["args"] and "--withdraw-unknown" in c["args"]


def _restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Pod Security Standards ``restricted`` (v1.34+) checks for one pod spec."""
    out = []
    psc = pod.get("securityContext", {})
    for v in pod.get("volumes", []):
        allowed = {"name", "configMap", "secret", "emptyDir", "projected", "downwardAPI",
                   "persistentVolumeClaim", "ephemeral", "csi"}  # fmt: skip
        if set(v) - allowed:
            out.append(f"volume {v['name']}: {sorted(set(v) - allowed)}")
    if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
        out.append("host namespaces")
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation must be false")
        if sc.get("capabilities", {}).get("drop") != ["ALL"]:
            out.append(f"{c['name']}: capabilities must drop ALL")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{c['name']}: capabilities added")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            out.append(f"{c['name']}: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{c['name']}: runAsUser 0")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{c['name']}: seccompProfile")
        for port in c.get("ports", []):
            if "hostPort" in port:
                out.append(f"{c['name']}: hostPort")
    return out


def test_controller_fits_pod_security_restricted_and_node_parts_need_privileged() -> None:
    manifests = docs()
    controller = one(manifests, "Deployment", "-controller")["spec"]["template"]["spec"]
    assert _restricted_violations(controller) == []
    for suffix in ("-driver", "-agent"):
        pod = one(manifests, "DaemonSet", suffix)["spec"]["template"]["spec"]
        found = _restricted_violations(pod)
        # hostPath volumes (the kubelet's sockets) are not allowed by baseline either:
        # the node parts' namespace needs the privileged level (docs/operations.md)
        assert any("hostPath" in v for v in found), found


def test_nvidia_values_render_observer_and_controller_only() -> None:
    manifests = docs(nvidia_values())
    workloads = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d
                 for d in manifests if d["kind"] in ("DaemonSet", "Deployment")}  # fmt: skip
    assert set(workloads) == {"agent", "controller"}
    assert not by_kind(manifests, "DeviceClass")  # NVIDIA's chart brings its classes
    assert not [d for d in manifests if d["metadata"]["name"].endswith("-driver")]
    [agent] = workloads["agent"]["spec"]["template"]["spec"]["containers"]
    assert "--mode=observer" in agent["args"]
    tolerations = workloads["agent"]["spec"]["template"]["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    [ctl] = workloads["controller"]["spec"]["template"]["spec"]["containers"]
    assert "--remediation-mode=auto" in ctl["args"]


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
    assert ("resource.k8s.io", "resourceslices", "get") not in driver  # a watch, never a get
    agent = _grants(one(manifests, "ClusterRole", "-agent")["rules"])
    # core/v1 Events only (a repeat patches the first one's count)
    assert agent == {("", "pods", "get"), ("", "events", "create"), ("", "events", "patch")}
    controller = _grants(one(manifests, "ClusterRole", "-controller")["rules"])
    assert ("", "events", "create") in controller
    assert not {(g, r, v) for g, r, v in controller if r == "events"} - {("", "events", "create")}
    # what it reads it watches: no get of claims or slices; a pod is read only after an
    # eviction whose answer was lost
    assert not {v for _, r, v in controller
                if r in ("resourceclaims", "resourceslices") and v == "get"}  # fmt: skip
    assert ("", "pods", "get") in controller
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


GPU = DeviceFacts("gpu.nvidia.com", "node-1", "gpu-0", "node-1", {"type": "gpu", "uuid": "GPU-1"})
MIG = DeviceFacts("gpu.nvidia.com", "node-1", "gpu-0-mig-9-4-4", "node-1", {"type": "mig"})
VFIO = DeviceFacts("gpu.nvidia.com", "node-1", "gpu-vfio-0", "node-1", {"type": "vfio"})
OTHER = DeviceFacts("gpu.example.com", "node-1", "gpu-0", "node-1", {"type": "gpu"})
U, H, Q = Health.UNHEALTHY, Health.HEALTHY, Health.UNKNOWN

# (device, health, message as NVIDIA's plugin or drahealth's NVML source words it)
#   -> (rule, effect, grace seconds) or None (no taint)
NVIDIA_CASES: list[tuple[DeviceFacts, Health, str, tuple[str, str, float] | None]] = [
    # application XIDs: Healthy from both sources; ignored even if reported Unhealthy
    (GPU, H, "non-fatal XID 13 reported by NVML", None),
    (GPU, H, "XID 31: GPU memory page fault (application error) (informational)", None),
    (GPU, U, "critical XID 43 reported by NVML", ("nvidia-application-xid", "None", 0)),
    (GPU, U, "XID 109: context switch timeout (application error)",
     ("nvidia-application-xid", "None", 0)),
    # fatal XIDs: NoExecute at once, whichever source
    (GPU, U, "critical XID 79 reported by NVML", ("nvidia-fatal", "NoExecute", 0)),
    (GPU, U, "XID 79: GPU has fallen off the bus (reset the GPU)",
     ("nvidia-fatal", "NoExecute", 0)),
    (GPU, U, "critical XID 48 reported by NVML", ("nvidia-fatal", "NoExecute", 0)),
    (MIG, U, "critical XID 94 reported by NVML", ("nvidia-fatal", "NoExecute", 0)),
    (GPU, U, "XID 95: uncontained ECC error (reset the GPU)", ("nvidia-fatal", "NoExecute", 0)),
    (GPU, U, "critical XID 119 reported by NVML", ("nvidia-fatal", "NoExecute", 0)),
    (GPU, U, "critical XID 74 reported by NVML", ("nvidia-fatal", "NoExecute", 0)),
    (GPU, U, "GPU is lost", ("nvidia-fatal", "NoExecute", 0)),
    (GPU, U, "GPU is lost: it no longer answers (reset the GPU or the node)",
     ("nvidia-fatal", "NoExecute", 0)),
    (GPU, U, "double-bit ECC error (reset the GPU)", ("nvidia-fatal", "NoExecute", 0)),
    (GPU, U, "row remapping pending (reset the GPU)", ("nvidia-fatal", "NoExecute", 0)),
    # an XID in neither list: NoSchedule (what NVIDIA's own taint does), escalating
    (GPU, U, "critical XID 154 reported by NVML", ("nvidia-other-xid", "NoSchedule", 0)),
    # XID 130 is not 13, 1790 is not 79
    (GPU, U, "critical XID 130 reported by NVML", ("nvidia-other-xid", "NoSchedule", 0)),
    (GPU, U, "critical XID 1790 reported by NVML", ("nvidia-other-xid", "NoSchedule", 0)),
    # thermal: not an XID; NoSchedule after a grace period
    (GPU, U, "temperature 93 C >= 90 C", ("nvidia-thermal", "NoSchedule", 120)),
    (MIG, U, "parent GPU GPU-1: temperature 95 C >= 90 C", ("nvidia-thermal", "NoSchedule", 120)),
    (GPU, U, "power 750 W over the 700 W limit", ("nvidia-thermal", "NoSchedule", 120)),
    # silence: only full GPUs (NVIDIA reports passthrough devices Unknown for good)
    (GPU, Q, "device health is not monitored", ("nvidia-silent-gpu", "NoSchedule", 300)),
    (VFIO, Q, "vfio devices are not covered by the NVML health monitor", None),
    (MIG, Q, "device health is not monitored", None),
    # another driver's devices are not this policy's business
    (OTHER, U, "critical XID 79 reported by NVML", None),
]  # fmt: skip


@pytest.mark.parametrize(("facts", "health", "message", "want"), NVIDIA_CASES)
def test_nvidia_policy_classifies_as_documented(
    facts: DeviceFacts, health: Health, message: str, want: tuple[str, str, float] | None
) -> None:
    cm = one(docs(nvidia_values()), "ConfigMap", "-controller-policy")
    policy = parse_policy(cm["data"]["policy.yaml"], "policy.yaml")
    rule = policy.rule_for(facts, health, message)
    if want is None:
        assert rule is None, (message, rule)
        return
    assert rule is not None, message
    assert (rule.name, rule.action.effect, rule.action.grace) == want
    if rule.name == "nvidia-other-xid":
        assert rule.action.effect_at(600) == "NoExecute"


def _policy_with(**extra: Any) -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    policy = copy.deepcopy(values["controller"]["policy"])
    policy.update(extra)
    return {"controller": {"policy": policy, "remediationMode": "taint-rules"}}


def test_node_rollup_grants_follow_the_policy() -> None:
    """The DRADevicesHealthy condition needs a patch of nodes/status (on by default);
    the rollup's node taint needs Node updates even where the mode writes no Node."""
    default = _grants(one(docs(_policy_with()), "ClusterRole", "-controller")["rules"])
    assert ("", "nodes/status", "patch") in default
    assert ("", "nodes", "update") not in default
    off = _grants(
        one(docs(_policy_with(nodeRollup={"enabled": False})), "ClusterRole", "-controller")[
            "rules"
        ]
    )
    assert not any(r == "nodes/status" for _, r, _ in off)
    taint = docs(_policy_with(nodeRollup={"taintNode": {"threshold": "50%"}}))
    grants = _grants(one(taint, "ClusterRole", "-controller")["rules"])
    assert {("", "nodes", "get"), ("", "nodes", "update")} <= grants
    validate(taint)


def test_repair_jobs_are_granted_only_when_a_rule_has_one() -> None:
    """Creating Jobs is powerful (a Job's pod may be privileged): granted in the release
    namespace only when a rule (top level or in a profile) has a ``repair.job``."""
    values = _policy_with()
    role = _grants(one(docs(values), "Role", "-controller")["rules"])
    assert not any(r == "jobs" for _, r, _ in role)
    rule = copy.deepcopy(values["controller"]["policy"]["rules"][0])
    rule["repair"] = {
        "job": {"template": {"spec": {"containers": [{"name": "reset", "image": "busybox"}]}}}
    }
    values["controller"]["policy"]["profiles"] = [
        {"name": "gpus", "match": {"driver": "gpu.example.com"}, "rules": [rule]}
    ]
    for key in ("rules",):
        assert values["controller"]["policy"][key]  # the top level keeps its own rules
    manifests = docs(values)
    role = _grants(one(manifests, "Role", "-controller")["rules"])
    assert {("batch", "jobs", v) for v in ("get", "list", "create", "delete")} <= role
    validate(manifests)


def test_driver_claim_status_adds_the_flag_and_its_grant() -> None:
    def driver(values: dict[str, Any] | None) -> tuple[list[str], set[tuple[str, str, str]]]:
        manifests = docs(values)
        ds = one(manifests, "DaemonSet", "-driver")
        [c] = ds["spec"]["template"]["spec"]["containers"]
        return c["args"], _grants(one(manifests, "ClusterRole", "-driver")["rules"])

    args, grants = driver(None)
    assert "--claim-status" not in args
    assert ("resource.k8s.io", "resourceclaims/status", "patch") not in grants
    args, grants = driver({"driver": {"claimStatus": True}})
    assert "--claim-status" in args
    assert ("resource.k8s.io", "resourceclaims/status", "patch") in grants
    validate(docs({"driver": {"claimStatus": True}}))
