"""The controller's recorded mode as the views read it, and the not-served note."""

from __future__ import annotations

import json

from drahealth._served import NO_CONTROLLER, controller_mode, not_served_note
from drahealth.kube import ServedAPIs


def _cm(mode: object) -> dict[str, object]:
    return {"data": {"history": "[]", "mode": mode}}


def test_the_record_the_controller_writes() -> None:
    record = {"mode": "node-taint", "why": "auto: no rule API", "deviceTaintRuleAPI": None,
              "serverVersion": "v1.35.0"}  # fmt: skip
    got = controller_mode(_cm(json.dumps(record)))
    assert got is not None and got.describe() == "node-taint (auto: no rule API)"
    assert (got.rule_api, got.server_version) == ("", "v1.35.0")
    v1 = {"mode": "taint-rules", "deviceTaintRuleAPI": "resource.k8s.io/v1"}
    rules = controller_mode(_cm(json.dumps(v1)))
    assert rules is not None and rules.rule_api == "resource.k8s.io/v1"


def test_absent_or_hostile_records_are_none_or_bounded() -> None:
    assert controller_mode(None) is None and controller_mode({"data": {}}) is None
    for bad in ("", "[1, 2]", json.dumps({"why": "no mode"}), 7):
        assert controller_mode(_cm(bad)) is None, bad
    assert controller_mode(_cm("cordon")).describe() == "cordon"  # type: ignore[union-attr]
    long = controller_mode(_cm(json.dumps({"mode": "x" * 10_000})))
    assert long is not None and len(long.mode) == 256
    assert NO_CONTROLLER.startswith("unknown")


def test_the_note_follows_the_recorded_mode() -> None:
    served = ServedAPIs({"ResourceSlice": ("v1",)}, "v1.35.1")
    note = not_served_note("DeviceTaintRule", served)
    assert note.startswith("DeviceTaintRules: not served by this server (Kubernetes 1.35 ")
    assert note.endswith("; remediation uses node taints")
    assert not_served_note("DeviceTaintRule", served, "cordon").endswith("cordons nodes")
    assert "remediation" not in not_served_note("ResourceClaim", served)
