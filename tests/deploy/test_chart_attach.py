"""The chart's attached sources (``agent.attach``): the ``--attach`` file as a ConfigMap the
agent reads, /dev/kmsg mounted read-only (and what it costs: a privileged agent), host
files and capabilities for unprivileged sources, the node-local dcgm-exporter Service, and
the grants the attached sources need, only when they are configured. NVIDIA's values file
renders a file the agent accepts, and the controller's policy classifies what the
attached sources say the way docs/nvidia.md describes."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from drahealth.core import DeviceFacts, Health
from drahealth.node import parse_attach_config
from drahealth.remedy import parse_policy
from tests.deploy._render import ROOT, render
from tests.deploy.test_chart import KUBE_SCHEMAS, _grants, docs, nvidia_values, one, validate

ATTACH_FILE = "/etc/drahealth/attach/attach.yaml"
CONFIG: dict[str, Any] = {
    "drivers": [
        {
            "driver": "gpu.nvidia.com",
            "key": {"attribute": "uuid"},
            "sources": [
                {"kind": "kmsg", "path": "/var/log/kern.log", "clearAfter": 300},
                {"kind": "dcgm", "url": "http://dh-agent-dcgm.gpu-operator.svc:9400/metrics"},
            ],
        }
    ]
}
UNPRIVILEGED: dict[str, Any] = {
    "agent": {
        "attach": {
            "config": CONFIG,
            "hostPaths": [{"path": "/var/log/kern.log", "type": "File"}],
            "capabilities": ["DAC_READ_SEARCH"],
            "dcgmLocalService": {
                "enabled": True,
                "namespace": "gpu-operator",
                "selector": {"app": "nvidia-dcgm-exporter"},
            },
        }
    }
}
ATTACH_GRANTS = {
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods/status", "patch"),
    ("resource.k8s.io", "resourceslices", "list"),
    ("resource.k8s.io", "resourceslices", "watch"),
    ("resource.k8s.io", "resourceclaims", "get"),
}


def _agent(manifests: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = one(manifests, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    return pod, container


def test_without_attach_config_nothing_changes() -> None:
    manifests = docs()
    _, c = _agent(manifests)
    assert not [a for a in c["args"] if a.startswith("--attach")]
    assert not [m for m in c["volumeMounts"] if m["name"] in ("attach", "kmsg")]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not c["securityContext"].get("privileged")
    assert not [d for d in manifests if d["metadata"]["name"].endswith(("-attach", "-dcgm"))]
    agent = _grants(one(manifests, "ClusterRole", "-agent")["rules"])
    assert not agent & ATTACH_GRANTS


def test_nvidia_values_attach_a_kmsg_source_the_agent_accepts() -> None:
    manifests = docs(nvidia_values())
    cm = one(manifests, "ConfigMap", "-agent-attach")
    config = parse_attach_config(cm["data"]["attach.yaml"], "attach.yaml")
    (driver,) = config.drivers
    assert driver.driver == "gpu.nvidia.com"
    assert driver.key is not None and driver.key.attribute == "resource.kubernetes.io/pciBusID"
    (kmsg,) = driver.sources
    assert kmsg.kind == "kmsg" and dict(kmsg.options) == {"path": "/dev/kmsg", "clear_after": 600}

    pod, c = _agent(manifests)
    assert f"--attach={ATTACH_FILE}" in c["args"] and "--mode=observer" in c["args"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["attach"] == {
        "name": "attach",
        "mountPath": "/etc/drahealth/attach",
        "readOnly": True,
    }
    assert mounts["kmsg"] == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert volumes["attach"]["configMap"]["name"] == cm["metadata"]["name"]
    # /dev/kmsg is a device the container's device rules do not admit: privileged, and
    # nothing that contradicts it (allowPrivilegeEscalation false is refused with it)
    assert c["securityContext"] == {"privileged": True, "readOnlyRootFilesystem": True}
    agent = _grants(one(manifests, "ClusterRole", "-agent")["rules"])
    assert agent >= ATTACH_GRANTS
    # reads and the one status patch: nothing that writes a pod, a claim or a slice
    writes = {(g, r, v) for g, r, v in agent if v not in ("get", "list", "watch")}
    assert writes == {
        ("", "pods/status", "patch"),
        ("", "events", "create"),
        ("", "events", "patch"),
    }


@pytest.mark.parametrize("kube", KUBE_SCHEMAS)
def test_unprivileged_sources_host_files_capabilities_and_dcgm_service(kube: str) -> None:
    manifests = docs(UNPRIVILEGED)
    validate(manifests, kube)
    pod, c = _agent(manifests)
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["DAC_READ_SEARCH"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert not c["securityContext"].get("privileged")
    assert {"name": "attach-host-0", "mountPath": "/var/log/kern.log", "readOnly": True} in c[
        "volumeMounts"
    ]
    assert {"name": "attach-host-0", "hostPath": {"path": "/var/log/kern.log", "type": "File"}} in (
        pod["volumes"]
    )
    assert "kmsg" not in {m["name"] for m in c["volumeMounts"]}
    svc = one(manifests, "Service", "-agent-dcgm")
    assert svc["metadata"]["namespace"] == "gpu-operator"
    assert svc["spec"]["internalTrafficPolicy"] == "Local"
    assert svc["spec"]["selector"] == {"app": "nvidia-dcgm-exporter"}
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 9400, "targetPort": 9400, "protocol": "TCP"}
    ]
    cm = one(manifests, "ConfigMap", "-agent-attach")
    config = parse_attach_config(cm["data"]["attach.yaml"])
    assert [s.kind for s in config.drivers[0].sources] == ["kmsg", "dcgm"]


@pytest.mark.parametrize(
    ("attach", "error"),
    [
        ({"kmsg": {"enable": True}}, r"agent\.attach\.kmsg: Additional properties"),
        ({"hostPaths": [{"path": "var/log"}]}, r"agent\.attach\.hostPaths\.0\.path"),
        ({"capabilities": ["cap_syslog"]}, r"agent\.attach\.capabilities\.0"),
        ({"config": "drivers: []"}, r"agent\.attach\.config: 'drivers: \[\]' is not of type"),
        ({"dcgmLocalService": {"enabled": True, "port": 0}}, r"dcgmLocalService\.port"),
    ],
)
def test_values_schema_names_the_bad_attach_field(attach: dict[str, Any], error: str) -> None:
    with pytest.raises(render.TemplateError, match=error):
        docs({"agent": {"attach": attach}})


GPU = DeviceFacts("gpu.nvidia.com", "node-1", "gpu-0", "node-1", {"type": "gpu", "uuid": "GPU-1"})


@pytest.mark.parametrize(
    ("health", "message", "want"),
    [
        (Health.UNHEALTHY, "kmsg: XID 79: GPU has fallen off the bus (reset the GPU)",
         ("nvidia-fatal", "NoExecute")),
        (Health.UNHEALTHY, "kmsg: XID 48: double-bit ECC error (reset the GPU)",
         ("nvidia-fatal", "NoExecute")),
        (Health.HEALTHY, "kmsg: XID 13: graphics engine exception (application error) "
         "(informational)", None),
        (Health.UNHEALTHY, "kmsg: XID 154: critical error (reset the GPU)",
         ("nvidia-other-xid", "NoSchedule")),
        (Health.UNHEALTHY, "dcgm: temperature 93 C >= 90 C", ("nvidia-thermal", "NoSchedule")),
        (Health.UNKNOWN, "kmsg: no answer within its lease", ("nvidia-silent-gpu", "NoSchedule")),
    ],
)  # fmt: skip
def test_nvidia_policy_reads_the_attached_sources_words(
    health: Health, message: str, want: tuple[str, str] | None
) -> None:
    """The attached health's message names its source first (``kmsg: XID 79 ...``); the
    values file's rules classify it as they do NVIDIA's own words."""
    cm = one(docs(nvidia_values()), "ConfigMap", "-controller-policy")
    rule = parse_policy(cm["data"]["policy.yaml"], "policy.yaml").rule_for(GPU, health, message)
    assert (None if rule is None else (rule.name, rule.action.effect)) == want


def test_nvidia_values_without_kmsg_keep_the_agent_unprivileged() -> None:
    values = copy.deepcopy(nvidia_values())
    values["agent"]["attach"]["kmsg"]["enabled"] = False
    _, c = _agent(docs(values))
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert "kmsg" not in {m["name"] for m in c["volumeMounts"]}


def test_nvml_source_gets_nvidias_runtime_and_no_gpu() -> None:
    values = {"agent": {"attach": {"config": CONFIG, "nvml": {"enabled": True}}}}
    pod, c = _agent(docs(values))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "runtimeClassName" not in pod  # the node's default runtime
    assert "resources" not in c or "nvidia.com/gpu" not in str(c["resources"])
    values["agent"]["attach"]["nvml"]["runtimeClassName"] = "nvidia"
    manifests = docs(values)
    validate(manifests)
    pod, _ = _agent(manifests)
    assert pod["runtimeClassName"] == "nvidia"
    _, plain = _agent(docs())
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in plain["env"]}


def _yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, re.S)


def test_docs_attach_examples_are_what_the_agent_and_the_chart_take() -> None:
    """docs/nvidia.md's attach file parses; its values excerpts render and match the
    values file."""
    section = (ROOT / "docs" / "nvidia.md").read_text().split("## Health beside NVIDIA's driver")[1]
    blocks = _yaml_blocks(section.split("\n## ")[0])
    attach_file, shipped, with_dcgm = blocks[:3]
    (driver,) = parse_attach_config(attach_file, "nvidia.md").drivers
    assert [s.kind for s in driver.sources] == ["kmsg", "dcgm", "nvml"]
    excerpt = yaml.safe_load(shipped)["agent"]
    values = nvidia_values()["agent"]
    assert excerpt["mode"] == values["mode"]
    assert excerpt["attach"] == {k: values["attach"][k] for k in excerpt["attach"]}
    manifests = docs(render.merge_values(nvidia_values(), yaml.safe_load(with_dcgm)))
    cm = one(manifests, "ConfigMap", "-agent-attach")
    kinds = [s.kind for s in parse_attach_config(cm["data"]["attach.yaml"]).drivers[0].sources]
    assert kinds == ["kmsg", "dcgm"]
    svc = one(manifests, "Service", "-agent-dcgm")
    url = parse_attach_config(cm["data"]["attach.yaml"]).drivers[0].sources[1].options["url"]
    assert url.startswith(f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:")
