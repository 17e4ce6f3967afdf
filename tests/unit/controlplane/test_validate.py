"""Validation causes: schema (via lightkube models), names, kind rules."""

from __future__ import annotations

from typing import Any

from drahealth.controlplane._resources import lookup
from drahealth.controlplane._validate import object_causes

POD = lookup("", "v1", "pods")
NS = lookup("", "v1", "namespaces")
DTR = lookup("resource.k8s.io", "v1", "devicetaintrules")
SLICE = lookup("resource.k8s.io", "v1", "resourceslices")
PDB = lookup("policy", "v1", "poddisruptionbudgets")
assert POD and NS and DTR and SLICE and PDB


def fields(causes: list[dict[str, Any]]) -> dict[str, str]:
    return {c["field"]: c["reason"] for c in causes}


def test_schema_unknown_wrong_type_and_missing() -> None:
    assert POD is not None
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "c", "image": 3, "bogus": 1, "resources": {"limits": {"cpu": 1}}},
                {},
            ],
            "overhead": {"cpu": 1},
        },
    }
    assert fields(object_causes(POD, obj)) == {
        "spec.containers[0].image": "FieldValueTypeInvalid",
        "spec.containers[0].bogus": "FieldValueInvalid",
        "spec.containers[1].name": "FieldValueRequired",
    }


def test_quantities_accept_numbers_and_dates_are_checked() -> None:
    assert SLICE is not None
    obj = {
        "metadata": {"name": "s", "creationTimestamp": "yesterday"},
        "spec": {
            "driver": "d",
            "nodeName": "n",
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "d0", "capacity": {"mem": {"value": 16}}}],
        },
    }
    assert fields(object_causes(SLICE, obj)) == {"metadata.creationTimestamp": "FieldValueInvalid"}


def test_names() -> None:
    assert POD is not None and NS is not None
    good = {"metadata": {"name": "a.b-c"}, "spec": {"containers": [{"name": "c"}]}}
    assert object_causes(POD, good) == []
    bad = {"metadata": {"name": "Bad_Name"}, "spec": {"containers": [{"name": "c"}]}}
    (c,) = object_causes(POD, bad)
    assert c["field"] == "metadata.name" and "RFC 1123 subdomain" in c["message"]
    (c,) = object_causes(NS, {"metadata": {"name": "a.b"}})
    assert "RFC 1123 label" in c["message"]
    (c,) = object_causes(
        POD,
        {
            "metadata": {"name": "p", "labels": {"a": "b c"}},
            "spec": {"containers": [{"name": "c"}]},
        },
    )
    assert c["field"] == "metadata.labels"  # upstream reports label causes at the map


def test_resource_health_values() -> None:
    assert POD is not None
    obj = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "resources": {"claims": [{"name": "a", "request": "b"}]}}],
            "resourceClaims": [{"name": "a", "resourceClaimName": "a"}],
        },
        "status": {
            "containerStatuses": [
                {
                    "name": "c",
                    "image": "",
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "allocatedResourcesStatus": [
                        {
                            "name": "claim:a/b",
                            "resources": [
                                {"resourceID": "x", "health": "Healthy"},
                                {"resourceID": "y", "health": "Sick"},
                            ],
                        }
                    ],
                }
            ]
        },
    }
    (c,) = object_causes(POD, obj)
    assert c["field"] == (
        "status.containerStatuses[0].allocatedResourcesStatus[0].resources[1].health"
    )
    assert c["reason"] == "FieldValueNotSupported"


def test_device_taint_rule_effect_and_key() -> None:
    assert DTR is not None
    obj = {"metadata": {"name": "r"}, "spec": {"taint": {"key": "", "effect": "Evict"}}}
    assert fields(object_causes(DTR, obj)) == {
        "spec.taint.key": "FieldValueInvalid",  # upstream: ValidateLabelName("")
        "spec.taint.effect": "FieldValueNotSupported",
    }


def test_resource_slice_rules() -> None:
    assert SLICE is not None
    devices = [{"name": f"d{i}"} for i in range(129)]
    obj = {
        "metadata": {"name": "s"},
        "spec": {
            "driver": "",
            "pool": {"name": "", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
    assert fields(object_causes(SLICE, obj)) == {
        "spec.driver": "FieldValueRequired",
        "spec.pool.name": "FieldValueRequired",
        "spec": "FieldValueRequired",
        "spec.devices": "FieldValueTooMany",
    }


def test_pdb_rules() -> None:
    assert PDB is not None
    both = {"metadata": {"name": "b"}, "spec": {"minAvailable": 1, "maxUnavailable": 1}}
    assert fields(object_causes(PDB, both)) == {"spec": "FieldValueInvalid"}
    pct = {"metadata": {"name": "b"}, "spec": {"minAvailable": "lots"}}
    assert fields(object_causes(PDB, pct)) == {"spec.minAvailable": "FieldValueInvalid"}
