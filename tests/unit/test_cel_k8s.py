"""The Kubernetes CEL libraries for device selectors: values, compile and runtime errors."""

from __future__ import annotations

import pytest

from drahealth._cel_k8s import (
    CELCompileError,
    CELRuntimeError,
    Quantity,
    Semver,
    compile_selector,
    device_value,
)

D = "gpu.example.com"
DEV = device_value(
    D, {D: {"model": "a100", "driverVersion": Semver("1.2.0"), "index": 1}}, {D: {"memory": "80Gi"}}
)


@pytest.mark.parametrize(
    "expression",
    [
        f'device.capacity["{D}"].memory.compareTo(quantity("4Gi")) >= 0',
        f'device.capacity["{D}"].memory == quantity("80Gi")',
        f'device.attributes["{D}"].driverVersion.isGreaterThan(semver("1.0.0"))',
        f'device.attributes["{D}"].driverVersion == semver("v1.2", true)',
        f'cel.bind(a, device.attributes["{D}"], a.model == "a100" && a.index == 1)',
        'sets.contains(["a", "b"], ["a"]) && !sets.intersects(["a"], ["b"])',
        '"a,b".split(",").size() == 2 && "ABC".lowerAscii() == "abc"',
        "[1, 2, 3].isSorted() && [1, 2, 3].sum() == 6 && [3, 1].max() == 3",
        '[1, 2].indexOf(2) == 1 && "abcb".lastIndexOf("b") == 3',
        'quantity("1.5").isInteger() == false && quantity("2k").asInteger() == 2000',
        'cidr("10.0.0.0/8").containsIP("10.1.2.3") && ip("::1").family() == 6',
        'url("https://x.example.com:8080/a").getPort() == "8080"',
        '"abc123".find("[0-9]+") == "123" && isQuantity("1Mi") && !isSemver("1.0")',
        'device.attributes["other.example.com"].size() == 0',
    ],
)
def test_library_functions(expression: str) -> None:
    assert compile_selector(expression).matches(DEV) is True


def test_quantities_compare_by_value() -> None:
    assert Quantity("1Ki") == Quantity("1024") and Quantity("500m").value * 2 == 1
    with pytest.raises(ValueError, match="regular expression"):
        Quantity("4 GB")


def test_runtime_errors_name_the_cause() -> None:
    with pytest.raises(CELRuntimeError, match="no such key: nope"):
        compile_selector(f'device.attributes["{D}"].nope == 1').matches(DEV)
    with pytest.raises(CELRuntimeError, match="quantity"):
        compile_selector('quantity("x") == quantity("1")').matches(DEV)


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("device.(", "compilation failed"),
        ('"foo"', "not string"),
        ("1 + 2", "must evaluate to bool"),
        ("foo == 1", "undeclared reference to 'foo'"),
        ("nosuch(1)", "undeclared reference to 'nosuch'"),
        ("x" * 10241, "may not be longer than 10240"),
    ],
)
def test_compile_errors(expression: str, error: str) -> None:
    with pytest.raises(CELCompileError, match=error):
        compile_selector(expression)


def test_regex_functions_run_in_linear_time() -> None:
    """CEL's regex library is RE2: a pattern that backtracks exponentially in Python's
    ``re`` ((a+)+$ on 'aaa...!': about 2**40 steps there, past the suite's timeout)
    returns at once instead of stalling the scheduler."""
    device = device_value("gpu.example.com", {"gpu.example.com": {"name": "a" * 40 + "!"}}, {})
    expr = 'device.attributes["gpu.example.com"].name.find("(a+)+$") == ""'
    assert compile_selector(expr).matches(device)
    bad = compile_selector('device.attributes["gpu.example.com"].name.find("(") == ""')
    with pytest.raises(CELRuntimeError, match="invalid regular expression"):
        bad.matches(device)
