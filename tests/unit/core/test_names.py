"""The Kubernetes name rules, and every validator that uses them, give one answer.

The validators of the driver (slices, driver name), the agent (registration, health
cache), the embedded API server (object names, selectors) and the taint command each
keep their own wording; these tests pin that they accept exactly what the shared rules
accept. One decided change from the older copies: a trailing line break is never part
of a name (Go's ``regexp`` anchors at the end of the text; ``re.match`` with ``$``
also accepted ``"name\\n"``).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drahealth.controlplane._selectors import (
    SelectorError,
    validate_label_key,
    validate_label_value,
)
from drahealth.controlplane._validate import name_causes
from drahealth.core import (
    device_name_problem,
    driver_name_problem,
    is_dns_label,
    is_dns_subdomain,
    is_label_value,
    is_qualified_name,
    pool_name_problem,
)
from drahealth.driver._slices import is_label_value as slices_label_value
from drahealth.driver._slices import is_qualified_name as slices_qualified_name
from drahealth.driver._types import validate_driver_name
from drahealth.node._validation import _driver_name_problem
from drahealth.remedy._rules import RuleError, validate_taint

SAMPLES = [
    "",
    "a",
    "A",
    "0",
    "-",
    "a-",
    "-a",
    "a-b",
    "a--b",
    "a.b",
    "a..b",
    ".a",
    "a.",
    "a_b",
    "A_b.C-d",
    "_a",
    "gpu-0",
    "GPU-0",
    "gpu.example.com",
    "Gpu.example.com",
    "example.com/key",
    "example.com/Key_1",
    "/key",
    "example.com/",
    "a/b/c",
    "EXAMPLE.com/key",
    "a" * 63,
    "a" * 64,
    "a." * 126 + "a",
    ("a" * 63 + ".") * 4,
    "x" * 254,
    "p" * 253 + "/k",
    "a b",
    "ä",
    "key=value",
]

_NAMEISH = st.text(alphabet="aZ09-_./", max_size=12)


def _raises(fn: object, *args: object) -> bool:
    try:
        fn(*args)  # type: ignore[operator]
    except (ValueError, SelectorError, RuleError):
        return True
    return False


def test_dns_label_pins() -> None:
    assert is_dns_label("gpu-0")
    assert is_dns_label("a" * 63)
    assert not is_dns_label("a" * 64)
    assert not is_dns_label("")
    assert not is_dns_label("Gpu")
    assert not is_dns_label("a.b")
    assert not is_dns_label("gpu\n")


def test_dns_subdomain_pins() -> None:
    assert is_dns_subdomain("gpu.example.com")
    assert is_dns_subdomain("a." * 126 + "a")
    assert not is_dns_subdomain("x" * 254)
    assert not is_dns_subdomain("a..b")
    assert not is_dns_subdomain("")
    assert not is_dns_subdomain("example.com\n")


def test_qualified_name_and_label_value_pins() -> None:
    assert is_qualified_name("example.com/Key_1")
    assert is_qualified_name("A_b.C-d")
    assert not is_qualified_name("/key")
    assert not is_qualified_name("example.com/")
    assert not is_qualified_name("EXAMPLE.com/key")
    assert not is_qualified_name("a/b/c")
    assert not is_qualified_name("key\n")
    assert is_label_value("")
    assert is_label_value("A_b.C-d")
    assert not is_label_value("a" * 64)
    assert not is_label_value("-a")
    assert not is_label_value("value\n")


@pytest.mark.parametrize("text", SAMPLES)
def test_driver_slice_rules_agree(text: str) -> None:
    assert slices_qualified_name(text) == is_qualified_name(text)
    assert slices_label_value(text) == is_label_value(text)


@pytest.mark.parametrize("text", SAMPLES)
def test_selector_rules_agree(text: str) -> None:
    assert (not _raises(validate_label_key, text)) == is_qualified_name(text)
    assert (not _raises(validate_label_value, text)) == is_label_value(text)


@pytest.mark.parametrize("text", SAMPLES)
def test_taint_rules_agree(text: str) -> None:
    assert (not _raises(validate_taint, text, "", "NoSchedule")) == is_qualified_name(text)
    assert (not _raises(validate_taint, "k", text, "NoSchedule")) == is_label_value(text)


@pytest.mark.parametrize("text", SAMPLES)
def test_api_server_object_names_agree(text: str) -> None:
    assert (name_causes("Namespace", text) == []) == is_dns_label(text)
    assert (name_causes("ConfigMap", text) == []) == is_dns_subdomain(text)


@pytest.mark.parametrize("text", SAMPLES)
def test_agent_names_agree(text: str) -> None:
    assert (device_name_problem(text) is None) == is_dns_label(text)
    assert (driver_name_problem(text) is None) == (is_dns_subdomain(text) and len(text) <= 63)
    parts_ok = all(is_dns_subdomain(p) for p in text.split("/"))
    assert (pool_name_problem(text) is None) == (0 < len(text) <= 253 and parts_ok)
    assert (_driver_name_problem(text) is None) == (is_dns_subdomain(text) and len(text) <= 63)
    assert (not _raises(validate_driver_name, text)) == (is_dns_subdomain(text) and len(text) <= 63)


@given(_NAMEISH)
def test_every_copy_agrees_on_random_names(text: str) -> None:
    test_driver_slice_rules_agree(text)
    test_selector_rules_agree(text)
    test_taint_rules_agree(text)
    test_api_server_object_names_agree(text)
    test_agent_names_agree(text)


@pytest.mark.parametrize(
    "accepts",
    [
        pytest.param(lambda t: device_name_problem(t) is None, id="health-cache-device"),
        pytest.param(lambda t: driver_name_problem(t) is None, id="health-cache-driver"),
        pytest.param(lambda t: pool_name_problem(t) is None, id="health-cache-pool"),
        pytest.param(lambda t: _driver_name_problem(t) is None, id="registration-driver"),
        pytest.param(lambda t: not _raises(validate_driver_name, t), id="driver-name"),
        pytest.param(slices_qualified_name, id="slice-qualified-name"),
        pytest.param(slices_label_value, id="slice-label-value"),
        pytest.param(lambda t: not _raises(validate_label_key, t), id="selector-key"),
        pytest.param(
            lambda t: not _raises(validate_label_value, t),
            id="selector-value",
        ),
        pytest.param(
            lambda t: not _raises(validate_taint, t, "", "NoSchedule"),
            id="taint-key",
        ),
        pytest.param(lambda t: name_causes("ConfigMap", t) == [], id="object-name"),
        pytest.param(lambda t: name_causes("Namespace", t) == [], id="namespace-name"),
    ],
)
def test_trailing_line_break_is_no_name(accepts: object) -> None:
    assert accepts("gpu") is True  # type: ignore[operator]
    assert accepts("gpu\n") is False  # type: ignore[operator]
