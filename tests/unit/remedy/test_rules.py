"""Rule names, bodies, ownership and taint validation."""

from __future__ import annotations

import re

import pytest

from drahealth.remedy._rules import (
    DEFAULT_TAINT_KEY,
    DeviceRef,
    RuleError,
    created_by,
    is_ours,
    parse_device,
    rule_body,
    rule_name,
    validate_taint,
)

GPU = DeviceRef("gpu.example.com", "node-1", "gpu-0")
SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def test_names_are_deterministic_readable_and_valid() -> None:
    name = rule_name("node-1", GPU, DEFAULT_TAINT_KEY)
    assert name == rule_name("node-1", GPU, DEFAULT_TAINT_KEY)
    assert name.startswith("dh-gpu-0-node-1-") and SUBDOMAIN.match(name)


def test_near_identical_tuples_get_different_names() -> None:
    tuples = [
        ("n", DeviceRef("d", "p", "GPU-0"), "k/x"),
        ("n", DeviceRef("d", "p", "gpu-0"), "k/x"),
        ("n", DeviceRef("d", "p", "gpu_0"), "k/x"),
        ("n", DeviceRef("d", "p-gpu", "0"), "k/x"),
        ("n", DeviceRef("d", "p", "gpu-0"), "k/y"),
        ("m", DeviceRef("d", "p", "gpu-0"), "k/x"),
        ("n", DeviceRef("e", "p", "gpu-0"), "k/x"),
    ]
    names = {rule_name(*t) for t in tuples}
    assert len(names) == len(tuples)


def test_long_and_odd_names_stay_within_253_characters() -> None:
    long = DeviceRef("d" * 250, "P" * 250, "Ä" * 250)
    name = rule_name("n" * 250, long, "k/x")
    assert len(name) <= 253 and SUBDOMAIN.match(name)
    assert SUBDOMAIN.match(rule_name("", DeviceRef("d", "///", "___"), "k"))


def test_parse_device() -> None:
    assert parse_device("gpu.example.com/node-1/gpu-0") == GPU
    assert parse_device("d/pool/with/slash/x") == DeviceRef("d", "pool/with/slash", "x")
    for bad in ("gpu-0", "d/x", "d//x", "/p/x", ""):
        with pytest.raises(RuleError, match="must be DRIVER/POOL/DEVICE"):
            parse_device(bad)


@pytest.mark.parametrize(
    ("key", "value", "effect", "fragment"),
    [
        ("", "v", "NoSchedule", "taint key ''"),
        ("drahealth.io/", "v", "NoSchedule", "name part"),
        ("Bad_Domain/x", "v", "NoSchedule", "prefix must be a DNS subdomain"),
        ("x" * 64, "v", "NoSchedule", "name part"),
        ("drahealth.io/x", "bad value", "NoSchedule", "taint value 'bad value'"),
        ("drahealth.io/x", "v" * 64, "NoSchedule", "taint value"),
        ("drahealth.io/x", "v", "PreferNoSchedule", "taint effect 'PreferNoSchedule'"),
    ],
)
def test_bad_taints_name_the_field(key: str, value: str, effect: str, fragment: str) -> None:
    with pytest.raises(RuleError, match=re.escape(fragment)):
        validate_taint(key, value, effect)


def test_good_taints() -> None:
    for key, value, effect in [
        ("drahealth.io/unhealthy", "xid-79", "NoExecute"),
        ("plain", "", "None"),
        ("a.b.c/D_e.f", "A.b-c", "NoSchedule"),
    ]:
        validate_taint(key, value, effect)


def test_bodies_say_who_created_them() -> None:
    ours = rule_body(
        GPU, key=DEFAULT_TAINT_KEY, value="unhealthy", effect="NoExecute", node="node-1",
        policy_rule="xid", reason="XID 79",
    )  # fmt: skip
    assert ours["spec"] == {
        "deviceSelector": {"driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"},
        "taint": {"key": DEFAULT_TAINT_KEY, "value": "unhealthy", "effect": "NoExecute"},
    }
    assert ours["metadata"]["annotations"]["drahealth.io/policy-rule"] == "xid"
    assert created_by(ours) == "controller" and is_ours(ours)
    op = rule_body(GPU, key="ops/maint", value="", effect="NoSchedule", by="operator")
    assert created_by(op) == "operator" and "value" not in op["spec"]["taint"]
    assert not is_ours(op)
    assert created_by({"metadata": {"labels": {"other": "x"}}}) is None
    assert created_by({"metadata": {}}) is None
    with pytest.raises(RuleError, match="taint effect"):
        rule_body(GPU, key="k", value="", effect="Evict")
    with pytest.raises(RuleError, match="created by 'someone'"):
        rule_body(GPU, key="k", value="", effect="None", by="someone")
