"""What each Kubernetes release serves and does: gates, versions, modes, selector scope."""

from __future__ import annotations

import re

import pytest

from drahealth.core import (
    KUBE_VERSIONS,
    NEWEST_KUBE_VERSION,
    FeatureGateError,
    choose_remediation_mode,
    choose_version,
    kube_profile,
    parse_feature_gates,
    parse_kube_version,
    selector_scope,
)

RULES_DEFAULT = {"1.34": (), "1.35": (), "1.36": (), "1.37": ("v1",), "1.38": ("v1",)}


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_default_rule_api_per_release(version: str) -> None:
    assert kube_profile(version).served_versions("DeviceTaintRule") == RULES_DEFAULT[version]
    for kind in ("ResourceClaim", "ResourceSlice", "DeviceClass", "ResourceClaimTemplate"):
        assert kube_profile(version).served_versions(kind) == ("v1",)


@pytest.mark.parametrize(
    ("version", "gate", "served"),
    [
        ("1.34", "DRADeviceTaints", ("v1alpha3",)),
        ("1.35", "DRADeviceTaintRules", ("v1alpha3",)),  # with DRADeviceTaints (depends on it)
        ("1.36", "DRADeviceTaintRules", ("v1beta2",)),
    ],
)
def test_gate_turns_the_rule_api_on(version: str, gate: str, served: tuple[str, ...]) -> None:
    gates = {"DRADeviceTaints": True, gate: True}
    assert kube_profile(version, gates).served_versions("DeviceTaintRule") == served


def test_the_rule_gate_depends_on_the_taint_gate() -> None:
    with pytest.raises(FeatureGateError, match=re.escape(
        "DRADeviceTaintRules is enabled, but depends on features that are disabled: "
        "[DRADeviceTaints]"
    )):  # fmt: skip
        kube_profile("1.35", {"DRADeviceTaintRules": True})
    with pytest.raises(FeatureGateError, match="depends on features"):
        kube_profile("1.37", {"DRADeviceTaints": False})
    # turning both off is what a 1.37 cluster without device taints looks like
    assert kube_profile("1.37", {"DRADeviceTaints": False, "DRADeviceTaintRules": False})


def test_gate_stages() -> None:
    # slice taints: alpha (off) until 1.35, beta on in 1.36
    assert [kube_profile(v).slice_taints for v in KUBE_VERSIONS] == [
        False, False, True, True, True
    ]  # fmt: skip
    assert [kube_profile(v).kubelet_pod_health for v in KUBE_VERSIONS] == [
        False, False, True, True, True
    ]  # fmt: skip
    assert kube_profile("1.34").dra_health_services == ("v1alpha1",)
    assert kube_profile("1.37").dra_health_services == ("v1", "v1alpha1")
    assert not kube_profile("1.34").taint_effect_none
    assert kube_profile("1.35").taint_effect_none
    assert kube_profile("1.34").rule_cel_selectors
    assert not kube_profile("1.35").rule_cel_selectors


def test_gates_can_be_turned_off_until_locked() -> None:
    assert (
        kube_profile("1.37", {"DRADeviceTaintRules": False}).served_versions("DeviceTaintRule")
        == ()
    )
    with pytest.raises(FeatureGateError, match="cannot set feature gate DRADeviceTaintRules to "
                       "false, feature is locked to true"):  # fmt: skip
        kube_profile("1.38", {"DRADeviceTaintRules": False})


def test_unknown_and_absent_gates_are_named() -> None:
    with pytest.raises(FeatureGateError, match="unrecognized feature gate: NoSuchGate"):
        kube_profile("1.36", {"NoSuchGate": True})
    with pytest.raises(FeatureGateError, match=r"DRADeviceTaintRules.*not in Kubernetes 1\.34"):
        kube_profile("1.34", {"DRADeviceTaintRules": True})


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1.36", "1.36"), ("v1.35", "1.35"), ("1.37.2", "1.37"), (" 1.38 ", "1.38")],
)
def test_parse_kube_version(text: str, expected: str) -> None:
    assert parse_kube_version(text) == expected


@pytest.mark.parametrize("text", ["1.33", "1.39", "2", "", "1.x", "1." + "9" * 50, "1.36\x00"])
def test_parse_kube_version_refuses(text: str) -> None:
    with pytest.raises(FeatureGateError, match="unsupported Kubernetes version"):
        parse_kube_version(text)
    assert NEWEST_KUBE_VERSION == "1.38"


def test_parse_feature_gates() -> None:
    assert parse_feature_gates("") == {}
    assert parse_feature_gates("A=true, B=False,") == {"A": True, "B": False}
    with pytest.raises(FeatureGateError, match="missing bool value"):
        parse_feature_gates("A")
    with pytest.raises(FeatureGateError, match="invalid value of A=yes"):
        parse_feature_gates("A=yes")
    with pytest.raises(FeatureGateError, match="longer than"):
        parse_feature_gates("A=true," * 1000)


def test_choose_version_prefers_stable() -> None:
    assert choose_version(["v1alpha3", "v1beta2", "v1"]) == "v1"
    assert choose_version(["v1alpha3", "v1beta2"]) == "v1beta2"
    assert choose_version(["v1alpha3"]) == "v1alpha3"
    assert choose_version(["v2alpha9"]) is None
    assert choose_version([]) is None


def test_remediation_mode_choice() -> None:
    assert choose_remediation_mode("auto", "v1")[0] == "taint-rules"
    mode, why = choose_remediation_mode("auto", None)
    assert mode == "quarantine" and "no DeviceTaintRule API" in why
    # no v1 ResourceClaims (before 1.34): auto cannot quarantine, asking for it is an error
    mode, why = choose_remediation_mode("auto", None, claims_v1=False)
    assert mode == "node-taint" and "no resource.k8s.io/v1 ResourceClaims" in why
    with pytest.raises(ValueError, match="mode quarantine writes ResourceClaims"):
        choose_remediation_mode("quarantine", None, claims_v1=False)
    assert choose_remediation_mode("quarantine", "v1")[0] == "quarantine"
    assert choose_remediation_mode("auto", None, fallback="node-taint")[0] == "node-taint"
    assert choose_remediation_mode("auto", None, fallback="cordon")[0] == "cordon"
    assert choose_remediation_mode("report-only", "v1")[0] == "report-only"
    with pytest.raises(ValueError, match="needs the DeviceTaintRule API"):
        choose_remediation_mode("taint-rules", None)
    with pytest.raises(ValueError, match="unknown remediation mode 'taint'"):
        choose_remediation_mode("taint", "v1")
    with pytest.raises(ValueError, match="fallback"):
        choose_remediation_mode("auto", None, fallback="taint-rules")


@pytest.mark.parametrize(
    ("selector", "scope"),
    [
        (None, "none"),
        ({}, "all"),
        ({"driver": "", "pool": None}, "all"),
        ({"deviceClassName": "gpu"}, "all"),  # 1.34 alpha field: gone from 1.35 on
        ({"driver": "d", "pool": "p", "device": "x"}, "device"),
        ({"driver": "d", "pool": "p"}, "pool"),
        ({"driver": "d"}, "driver"),
        ({"device": "gpu-0"}, "partial"),
        ({"pool": "p", "device": "gpu-0"}, "partial"),
        ({"driver": "d", "device": "gpu-0"}, "partial"),
    ],
)
def test_selector_scope(selector: dict[str, str] | None, scope: str) -> None:
    assert selector_scope(selector) == scope
