"""Release profiles in the control plane without a server: registry, dropped fields,
validation per release, node filtering and 1.34 rule selection in the stand-ins."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from drahealth.controlplane._openapi import Documents
from drahealth.controlplane._resources import lookup, registry
from drahealth.controlplane._strategy import drop_disabled_fields, prepare_create
from drahealth.controlplane._validate import object_causes
from drahealth.core import kube_profile
from drahealth.standins._allocate import Device
from drahealth.standins._scheduler import node_misfit, rule_taints

#: 1.35 with the rule API (its gate depends on the taint gate)
RULES_1_35 = {"DRADeviceTaints": True, "DRADeviceTaintRules": True}


SLICES = lookup("resource.k8s.io", "v1", "resourceslices")
PODS = lookup("", "v1", "pods")
TAINT = {"key": "example.com/bad", "effect": "NoExecute"}


def _slice(taints: list[Any] | None) -> dict[str, Any]:
    dev: dict[str, Any] = {"name": "gpu-0"}
    if taints is not None:
        dev["taints"] = taints
    return {"metadata": {"name": "s"}, "spec": {"driver": "d", "devices": [dev]}}


def test_slice_taints_kept_when_the_old_slice_had_them() -> None:
    assert SLICES is not None
    off = kube_profile("1.35")
    new = _slice([TAINT])
    drop_disabled_fields(SLICES, new, None, off)
    assert "taints" not in new["spec"]["devices"][0]
    new = _slice([TAINT])
    drop_disabled_fields(SLICES, new, _slice([TAINT]), off)  # in use: upstream keeps it
    assert new["spec"]["devices"][0]["taints"] == [TAINT]
    new = _slice([TAINT])
    drop_disabled_fields(SLICES, new, _slice(None), off)
    assert "taints" not in new["spec"]["devices"][0]
    new = _slice([TAINT])
    drop_disabled_fields(SLICES, new, None, kube_profile("1.36"))
    assert new["spec"]["devices"][0]["taints"] == [TAINT]


def test_pod_health_dropped_even_when_the_old_pod_had_it() -> None:
    assert PODS is not None
    health = [{"name": "claim:gpu", "resources": [{"resourceID": "x", "health": "Healthy"}]}]
    pod = {
        "metadata": {"name": "p"},
        "status": {
            lst: [{"name": "c", "allocatedResourcesStatus": copy.deepcopy(health)}]
            for lst in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")
        },
    }
    old = copy.deepcopy(pod)
    new = copy.deepcopy(pod)
    drop_disabled_fields(PODS, new, old, kube_profile("1.35"))
    for lst in new["status"].values():
        assert lst == [{"name": "c"}]
    kept = copy.deepcopy(pod)
    drop_disabled_fields(
        PODS, kept, None, kube_profile("1.36", {"ResourceHealthStatusMessage": False})
    )
    assert kept == pod  # the message gate is the kubelet's, not the API server's


def test_create_stores_at_the_storage_version() -> None:
    reg = registry(kube_profile("1.36", {"DRADeviceTaintRules": True}))
    rt = reg.lookup("resource.k8s.io", "v1beta2", "devicetaintrules")
    assert rt is not None and rt.storage_api_version == "resource.k8s.io/v1beta2"
    obj = prepare_create(rt, {"metadata": {"name": "r"}, "spec": {"taint": TAINT}}, "now")
    assert obj["apiVersion"] == "resource.k8s.io/v1beta2"
    assert reg.lookup("resource.k8s.io", "v1", "devicetaintrules") is None


@pytest.mark.parametrize(
    ("version", "gates", "allowed"),
    [
        ("1.34", {"DRADeviceTaints": True}, ("NoExecute", "NoSchedule")),
        ("1.35", RULES_1_35, ("NoExecute", "NoSchedule", "None")),
        ("1.38", {}, ("NoExecute", "NoSchedule", "None")),
    ],
)
def test_taint_effects_per_release(
    version: str, gates: dict[str, bool], allowed: tuple[str, ...]
) -> None:
    reg = registry(kube_profile(version, gates))
    (served,) = reg.versions_of("resource.k8s.io", "DeviceTaintRule")
    rt = reg.lookup("resource.k8s.io", served, "devicetaintrules")
    assert rt is not None
    for effect in ("NoExecute", "NoSchedule", "None", "PreferNoSchedule"):
        rule = {"metadata": {"name": "r"}, "spec": {"taint": {"key": "k", "effect": effect}}}
        causes = object_causes(rt, rule, kube_profile(version, gates))
        if effect in allowed:
            assert causes == []
        else:
            listed = ", ".join(f'"{a}"' for a in allowed)
            assert causes == [
                {
                    "reason": "FieldValueNotSupported",
                    "message": f'Unsupported value: "{effect}": supported values: {listed}',
                    "field": "spec.taint.effect",
                }
            ]


def test_node_misfit_is_core_taint_toleration() -> None:
    node = {"spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}}
    assert node_misfit(node, {"spec": {}}) == "node(s) had untolerated taint {k: v}"
    for tol in (
        {"key": "k", "operator": "Exists"},
        {"operator": "Exists"},
        {"key": "k", "value": "v"},
        {"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"},
    ):
        assert node_misfit(node, {"spec": {"tolerations": [tol]}}) is None, tol
    for tol in (
        {"key": "k", "value": "w"},
        {"key": "k", "operator": "Exists", "effect": "NoExecute"},
    ):
        assert node_misfit(node, {"spec": {"tolerations": [tol]}}) is not None, tol
    soft = {"spec": {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}}
    assert node_misfit(soft, {"spec": {}}) is None
    cordoned = {"spec": {"unschedulable": True}}
    assert node_misfit(cordoned, {"spec": {}}) == "node(s) were unschedulable"
    tol = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    assert node_misfit(cordoned, {"spec": {"tolerations": [tol]}}) is None


def test_1_34_rule_narrowed_by_class_and_cel() -> None:
    a = Device("gpu.example.com", "pool", "gpu-0", "node-a", {"gpu.example.com": {"model": "a"}})
    b = Device("gpu.example.com", "pool", "gpu-1", "node-a", {"gpu.example.com": {"model": "b"}})
    classes = {
        "model-a": {
            "spec": {
                "selectors": [
                    {"cel": {"expression": 'device.attributes["gpu.example.com"].model == "a"'}}
                ]
            }
        }
    }

    def rule(sel: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"deviceSelector": sel, "taint": TAINT}}

    by_class = rule_taints([rule({"deviceClassName": "model-a"})], ("NoExecute",), classes)
    assert [bool(by_class(d)) for d in (a, b)] == [True, False]
    missing = rule_taints([rule({"deviceClassName": "nope"})], ("NoExecute",), classes)
    assert [bool(missing(d)) for d in (a, b)] == [False, False]
    cel = rule(
        {
            "selectors": [
                {"cel": {"expression": 'device.attributes["gpu.example.com"].model == "b"'}}
            ]
        }
    )
    by_cel = rule_taints([cel], ("NoExecute",), classes)
    assert [bool(by_cel(d)) for d in (a, b)] == [False, True]
    everything = rule_taints([rule({})], ("NoExecute",), classes)  # as upstream
    assert [bool(everything(d)) for d in (a, b)] == [True, True]


def test_discovery_order_is_upstream_priority() -> None:
    reg = registry(kube_profile("1.36", {"DRADeviceTaintRules": True}))
    group = reg.api_group("resource.k8s.io")
    assert group is not None
    assert [v["version"] for v in group["versions"]] == ["v1", "v1beta2"]
    docs = Documents(reg)
    assert docs.v3("resource.k8s.io", "v1alpha3") is None
    doc = docs.v3("resource.k8s.io", "v1beta2")
    assert doc is not None and doc["info"]["version"] == "v1.36.0"
