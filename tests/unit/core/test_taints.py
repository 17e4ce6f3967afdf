"""Taint, toleration and rule-selector rules shared by the stand-ins and the controller."""

from __future__ import annotations

from drahealth.core._taints import Taint, request_tolerations, selects, tolerated

T = Taint("drahealth.io/unhealthy", "xid", "NoExecute")


def test_tolerations_match_by_key_value_effect_and_exists() -> None:
    assert tolerated(T, [{"key": T.key, "value": "xid"}])
    assert tolerated(T, [{"key": T.key, "operator": "Exists", "effect": "NoExecute"}])
    assert tolerated(T, [{"operator": "Exists"}])
    assert not tolerated(T, [{"key": T.key, "value": "other"}])
    assert not tolerated(T, [{"key": T.key, "operator": "Exists", "effect": "NoSchedule"}])
    assert not tolerated(T, ["garbage", None])


def test_request_tolerations_of_exactly_and_first_available() -> None:
    exact = [{"key": "a", "operator": "Exists"}]
    sub = [{"key": "b", "operator": "Exists"}]
    claim = {
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"tolerations": exact}},
                    {"name": "any", "firstAvailable": [{"name": "big", "tolerations": sub}]},
                ]
            }
        }
    }
    assert request_tolerations(claim, "gpu") == exact
    assert request_tolerations(claim, "any/big") == sub
    assert request_tolerations(claim, "any/small") == []
    assert request_tolerations(claim, "missing") == []
    assert request_tolerations({}, "gpu") == []


def test_selectors() -> None:
    assert selects({"driver": "d", "pool": "p", "device": "x"}, "d", "p", "x")
    assert selects({"driver": "d"}, "d", "p", "x")
    assert selects({}, "d", "p", "x")  # an empty selector selects every device
    assert not selects(None, "d", "p", "x")  # a nil selector selects none
    assert not selects({"device": "y"}, "d", "p", "x")
