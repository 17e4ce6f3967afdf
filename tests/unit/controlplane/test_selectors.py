"""Label and field selector parsing and matching."""

from __future__ import annotations

import pytest

from drahealth.controlplane._selectors import (
    SelectorError,
    field_value,
    parse_field_selector,
    parse_label_selector,
    selector_from_object,
)

LABELS = {"app": "web", "tier": "front", "ver": "3"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", True),
        ("app=web", True),
        ("app==web", True),
        ("app!=web", False),
        ("app!=db", True),
        ("missing!=x", True),
        ("app=web,tier=back", False),
        ("tier in (front,back)", True),
        ("tier in (back)", False),
        ("tier notin (back, other)", True),
        ("missing notin (x)", True),
        ("missing in (x)", False),
        ("app", True),
        ("missing", False),
        ("!missing", True),
        ("!app", False),
        ("ver>2", True),
        ("ver<2", False),
        ("  app = web , tier in ( front ) ", True),
        ("example.com/key!=v", True),
    ],
)
def test_label_selector_matching(text: str, expected: bool) -> None:
    assert parse_label_selector(text).matches(LABELS) is expected


@pytest.mark.parametrize(
    "text",
    [
        "a in (b",
        "a in b",
        "a=b,",
        ",a=b",
        "a b",
        "!",
        "a=(b)",
        "Bad Key=x",
        "a=b=c",
        "a>b",
        "-a=b",
        "a=" + "x" * 64,
        "a notin",
    ],
)
def test_label_selector_errors(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(text)


def test_empty_value_is_allowed() -> None:
    assert parse_label_selector("a=").matches({"a": ""})
    assert not parse_label_selector("a=").matches({"a": "x"})


def test_field_selectors() -> None:
    supported = ("metadata.name", "spec.nodeName")
    pod = {"metadata": {"name": "p1"}, "spec": {"nodeName": "n1"}}
    assert parse_field_selector("spec.nodeName=n1", supported).matches(pod)
    assert parse_field_selector("spec.nodeName==n1,metadata.name=p1", supported).matches(pod)
    assert not parse_field_selector("spec.nodeName!=n1", supported).matches(pod)
    assert parse_field_selector("spec.nodeName=", supported).matches({"spec": {}})
    assert parse_field_selector(r"metadata.name=a\,b", supported).matches(
        {"metadata": {"name": "a,b"}}
    )
    with pytest.raises(SelectorError, match=r"field label not supported: spec\.foo"):
        parse_field_selector("spec.foo=x", supported)
    with pytest.raises(SelectorError):
        parse_field_selector("nonsense", supported)


def test_field_value_renders_scalars() -> None:
    assert field_value({"spec": {"unschedulable": True}}, "spec.unschedulable") == "true"
    assert field_value({"spec": 3}, "spec.x") == ""


def test_selector_from_object() -> None:
    assert selector_from_object(None) is None
    assert selector_from_object({}).matches({"any": "thing"})  # type: ignore[union-attr]
    sel = selector_from_object(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["front"]},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        }
    )
    assert sel is not None and sel.matches(LABELS)
    assert not sel.matches({**LABELS, "legacy": "1"})
    with pytest.raises(SelectorError):
        selector_from_object({"matchExpressions": [{"key": "a", "operator": "Near"}]})
