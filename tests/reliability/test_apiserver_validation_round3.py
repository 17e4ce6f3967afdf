"""Objects and CEL selectors the real API server refuses, refused here too.

Two surfaces of the embedded API server. First, DRA CEL selectors are metered as
upstream meters them: an expression whose estimated worst-case cost exceeds
``CELSelectorExpressionMaxCost`` (1,000,000) is refused at create with
``Forbidden: too complex, exceeds cost limit``; an evaluation that runs past the
budget (or the allocation deadline) fails that selector with an error and the claim
stays unallocated with the reason. Second, one invalid object per upstream validation
rule of the DRA kinds (ResourceSlice, ResourceClaim, ResourceClaimTemplate,
DeviceClass, DeviceTaintRule) and of object metadata on update: each is refused with
upstream's field path, never stored.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drahealth._cel_k8s import (
    MAX_COST,
    CELCostError,
    CELRuntimeError,
    compile_selector,
    device_value,
)
from drahealth.controlplane import APIServer
from drahealth.controlplane._resources import lookup
from drahealth.controlplane._validate import object_causes
from drahealth.standins._allocate import AllocationAborted, allocate_claim, devices_from_slices

pytestmark = pytest.mark.timeout(60)

R = "/apis/resource.k8s.io/v1"
DTR = lookup("resource.k8s.io", "v1", "devicetaintrules")
SLICE = lookup("resource.k8s.io", "v1", "resourceslices")
CLAIM = lookup("resource.k8s.io", "v1", "resourceclaims")
TEMPLATE = lookup("resource.k8s.io", "v1", "resourceclaimtemplates")
CLASS = lookup("resource.k8s.io", "v1", "deviceclasses")
assert DTR and SLICE and CLAIM and TEMPLATE and CLASS

# -- CEL cost ---------------------------------------------------------------------

_L10 = "[0,1,2,3,4,5,6,7,8,9]"
#: Nested comprehensions: 10^6 inner steps (a few minutes of CPU, unmetered).
TIME_BOMB = (
    f"{_L10}.all(a, {_L10}.all(b, {_L10}.all(c, {_L10}.all(d, "
    f"{_L10}.all(e, {_L10}.all(f, f >= 0))))))"
)
#: String doubling: 2^30 characters (gigabytes, unmetered).
MEMORY_BOMB = (
    "cel.bind(a, 'xx', cel.bind(b, a+a+a+a, cel.bind(c, b+b+b+b, cel.bind(d, c+c+c+c, "
    "cel.bind(e, d+d+d+d, cel.bind(f, e+e+e+e, cel.bind(g, f+f+f+f, cel.bind(h, g+g+g+g, "
    "cel.bind(i, h+h+h+h, cel.bind(j, i+i+i+i, cel.bind(k, j+j+j+j, cel.bind(l, k+k+k+k, "
    "cel.bind(m, l+l+l+l, cel.bind(n, m+m+m+m, cel.bind(o, n+n+n+n, size(o) > 0)))))))))))))))"
)
#: The same with ``replace``: each step multiplies the length by ten.
REPLACE_BOMB = (
    "'x'.replace('x','xxxxxxxxxx').replace('x','xxxxxxxxxx').replace('x','xxxxxxxxxx')"
    ".replace('x','xxxxxxxxxx').replace('x','xxxxxxxxxx').replace('x','xxxxxxxxxx')"
    ".replace('x','xxxxxxxxxx').replace('x','xxxxxxxxxx').replace('x','xxxxxxxxxx')"
    ".size() > 0"
)
#: A split of a device attribute (at most 64 characters) feeding nested loops.
SPLIT_BOMB = (
    "device.attributes['gpu.example.com'].model.split('').all(a, "
    "device.attributes['gpu.example.com'].model.split('').all(b, "
    "device.attributes['gpu.example.com'].model.split('').all(c, "
    "device.attributes['gpu.example.com'].model.split('').all(d, a != d))))"
)

CHEAP = [
    "device.driver == 'gpu.example.com'",
    "device.attributes['gpu.example.com'].model == 'a100' && "
    "device.capacity['gpu.example.com'].memory.compareTo(quantity('40Gi')) >= 0",
    f"{_L10}.all(a, {_L10}.exists(b, a == b))",
    "device.attributes['gpu.example.com'].model.split('-').exists(p, p == 'sxm')",
    "cel.bind(m, device.attributes['gpu.example.com'].model, m.startsWith('a') || m + 'x' == 'bx')",
]


@pytest.mark.parametrize("expr", [TIME_BOMB, MEMORY_BOMB, REPLACE_BOMB, SPLIT_BOMB])
def test_costly_selectors_are_refused_at_compile(expr: str) -> None:
    start = time.monotonic()
    with pytest.raises(CELCostError, match="exceeds cost limit"):
        compile_selector(expr)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("expr", CHEAP)
def test_ordinary_selectors_stay_within_budget(expr: str) -> None:
    sel = compile_selector(expr)
    assert sel.max_cost <= MAX_COST
    dev = device_value(
        "gpu.example.com", {"gpu.example.com": {"model": "a100-sxm"}},
        {"gpu.example.com": {"memory": "80Gi"}},
    )  # fmt: skip
    sel.matches(dev)


def test_runtime_budget_fails_the_evaluation_with_an_error() -> None:
    sel = compile_selector(f"{_L10}.all(a, {_L10}.all(b, {_L10}.all(c, c >= 0)))")
    dev = device_value("gpu.example.com", {}, {})
    assert sel.matches(dev)
    with pytest.raises(CELRuntimeError, match="cost limit exceeded"):
        sel.matches(dev, budget=500)


def test_runtime_deadline_fails_the_evaluation_with_an_error() -> None:
    sel = compile_selector(f"{_L10}.all(a, {_L10}.all(b, {_L10}.all(c, c >= 0)))")
    dev = device_value("gpu.example.com", {}, {})
    with pytest.raises(CELRuntimeError, match="timed out"):
        sel.matches(dev, deadline=time.monotonic() - 1)


def _slice(n: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"name": "s"},
        "spec": {
            "driver": "gpu.example.com", "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"model": {"string": "a100"}}}
                for i in range(n)
            ],
        },
    }  # fmt: skip


def test_allocation_past_its_deadline_is_aborted_with_the_reason() -> None:
    claim = {
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {
            "deviceClassName": "gpu",
            "selectors": [{"cel": {"expression": f"{_L10}.all(a, a >= 0)"}}],
        }}]}},
    }  # fmt: skip
    classes = {"gpu": {"metadata": {"name": "gpu"}, "spec": {}}}
    devices = devices_from_slices([_slice()])
    with pytest.raises(AllocationAborted, match="timed out"):
        allocate_claim(
            claim, devices, classes, in_use=set(), nodes=["n1"], deadline=time.monotonic() - 1
        )


# -- over HTTP ------------------------------------------------------------------------


@pytest.fixture
async def http(server: APIServer) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=server.url) as session:
        yield session


async def call(
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    body: Any = None,
    ctype: str = "application/json",
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body)
    async with http.request(method, path, data=data, headers={"Content-Type": ctype}) as r:
        text = await r.text()
        return r.status, json.loads(text) if text.startswith("{") else text


def _causes(body: Any) -> dict[str, str]:
    return {c["field"]: c["message"] for c in body["details"]["causes"]}


@pytest.mark.parametrize("expr", [TIME_BOMB, MEMORY_BOMB])
async def test_costly_class_selector_is_422_fast_and_server_stays_responsive(
    http: aiohttp.ClientSession, expr: str
) -> None:
    body = {"metadata": {"name": "bomb"}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}
    start = time.monotonic()
    code, resp = await call(http, "POST", f"{R}/deviceclasses", body)
    assert code == 422, resp
    assert _causes(resp) == {
        "spec.selectors[0].cel.expression": "Forbidden: too complex, exceeds cost limit"
    }
    assert time.monotonic() - start < 10
    code, _ = await call(http, "GET", f"{R}/deviceclasses/bomb")
    assert code == 404


async def test_costly_claim_selector_is_422(http: aiohttp.ClientSession) -> None:
    body = {
        "metadata": {"name": "bomb"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {
            "deviceClassName": "gpu", "selectors": [{"cel": {"expression": REPLACE_BOMB}}],
        }}]}},
    }  # fmt: skip
    code, resp = await call(http, "POST", f"{R}/namespaces/default/resourceclaims", body)
    assert code == 422, resp
    assert "spec.devices.requests[0].exactly.selectors[0].cel.expression" in _causes(resp)


async def test_uid_patch_is_refused(http: aiohttp.ClientSession) -> None:
    cm = {"metadata": {"name": "c"}, "data": {"a": "b"}}
    code, created = await call(http, "POST", "/api/v1/namespaces/default/configmaps", cm)
    assert code == 201
    patch = {"metadata": {"uid": "00000000-0000-0000-0000-000000000001"}}
    code, resp = await call(
        http, "PATCH", "/api/v1/namespaces/default/configmaps/c", patch,
        "application/merge-patch+json",
    )  # fmt: skip
    assert code == 422, resp
    assert _causes(resp) == {
        "metadata.uid": 'Invalid value: "00000000-0000-0000-0000-000000000001": field is immutable'
    }
    code, got = await call(http, "GET", "/api/v1/namespaces/default/configmaps/c")
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    # A PUT without a uid keeps the stored one, as upstream.
    put = {"metadata": {"name": "c", "resourceVersion": got["metadata"]["resourceVersion"]}}
    code, resp = await call(http, "PUT", "/api/v1/namespaces/default/configmaps/c", put)
    assert code == 200, resp
    assert resp["metadata"]["uid"] == created["metadata"]["uid"]


def _allocation(device: str = "gpu-0") -> dict[str, Any]:
    return {"devices": {"results": [
        {"request": "r", "driver": "gpu.example.com", "pool": "n1", "device": device},
    ]}}  # fmt: skip


CLAIM_BODY = {
    "metadata": {"name": "c"},
    "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}},
}


async def test_claim_allocation_is_immutable_once_set(http: aiohttp.ClientSession) -> None:
    path = f"{R}/namespaces/default/resourceclaims"
    code, _ = await call(http, "POST", path, CLAIM_BODY)
    assert code == 201
    status = {"status": {"allocation": _allocation("gpu-0")}}
    merge = "application/merge-patch+json"
    code, resp = await call(http, "PATCH", f"{path}/c/status", status, merge)
    assert code == 200, resp
    status = {"status": {"allocation": _allocation("gpu-1")}}
    code, resp = await call(http, "PATCH", f"{path}/c/status", status, merge)
    assert code == 422, resp
    assert _causes(resp)["status.allocation"].endswith("field is immutable")
    code, got = await call(http, "GET", f"{path}/c")
    assert got["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"


async def test_thousand_consumers_are_refused(http: aiohttp.ClientSession) -> None:
    path = f"{R}/namespaces/default/resourceclaims"
    code, _ = await call(http, "POST", path, CLAIM_BODY)
    assert code == 201
    consumers = [{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(1000)]
    status = {"status": {"allocation": _allocation(), "reservedFor": consumers}}
    code, resp = await call(
        http, "PATCH", f"{path}/c/status", status, "application/merge-patch+json"
    )
    assert code == 422, resp
    assert _causes(resp) == {"status.reservedFor": "Too many: 1000: must have at most 256 items"}


async def test_taint_rule_with_a_huge_device_name_is_refused(http: aiohttp.ClientSession) -> None:
    body = {
        "metadata": {"name": "r"},
        "spec": {"deviceSelector": {"device": "d" * 10_000},
                 "taint": {"key": "k", "effect": "NoSchedule"}},
    }  # fmt: skip
    code, resp = await call(http, "POST", f"{R}/devicetaintrules", body)
    assert code == 422, resp
    assert "spec.deviceSelector.device" in _causes(resp)
    assert len(json.dumps(resp)) < 4096  # the value is shortened in the message


# -- one invalid object per rule --------------------------------------------------


def _rule() -> dict[str, Any]:
    return {
        "metadata": {"name": "r"},
        "spec": {
            "deviceSelector": {"driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"},
            "taint": {"key": "example.com/k", "value": "v", "effect": "NoSchedule"},
        },
    }


def _claim() -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}},
    }


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    cur: Any = out
    keys = path.split(".")
    for k in keys[:-1]:
        cur = cur[int(k)] if isinstance(cur, list) else cur.setdefault(k, {})
    if isinstance(cur, list):
        cur[int(keys[-1])] = value
    else:
        cur[keys[-1]] = value
    return out


def _dev(**extra: Any) -> dict[str, Any]:
    return {"name": "gpu-0", **extra}


_TAINT = {"key": "k", "effect": "NoSchedule"}
_SLICE_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("driver with a space", _set(_slice(), "spec.driver", "gpu example.com"),
     "spec.driver", "FieldValueInvalid"),
    ("driver too long", _set(_slice(), "spec.driver", "a" * 64 + ".com"),
     "spec.driver", "FieldValueTooLong"),
    ("pool ../..", _set(_slice(), "spec.pool.name", "../.."),
     "spec.pool.name", "FieldValueInvalid"),
    ("pool too long", _set(_slice(), "spec.pool.name", "/".join(["a" * 60] * 5)),
     "spec.pool.name", "FieldValueTooLong"),
    ("pool resourceSliceCount 0", _set(_slice(), "spec.pool.resourceSliceCount", 0),
     "spec.pool.resourceSliceCount", "FieldValueInvalid"),
    ("pool generation negative", _set(_slice(), "spec.pool.generation", -1),
     "spec.pool.generation", "FieldValueInvalid"),
    ("node name invalid", _set(_slice(), "spec.nodeName", "Node_1"),
     "spec.nodeName", "FieldValueInvalid"),
    ("device name not a DNS label", _set(_slice(), "spec.devices.0.name", "GPU.0"),
     "spec.devices[0].name", "FieldValueInvalid"),
    ("device name too long", _set(_slice(), "spec.devices.0.name", "g" * 64),
     "spec.devices[0].name", "FieldValueInvalid"),
    ("duplicate device", _set(_slice(), "spec.devices.1.name", "gpu-0"),
     "spec.devices[1]", "FieldValueDuplicate"),
    ("string attribute 200 chars",
     _set(_slice(), "spec.devices.0.attributes", {"model": {"string": "x" * 200}}),
     "spec.devices[0].attributes[model].string", "FieldValueTooLong"),
    ("version attribute not semver",
     _set(_slice(), "spec.devices.0.attributes", {"v": {"version": "1.2"}}),
     "spec.devices[0].attributes[v].version", "FieldValueInvalid"),
    ("attribute with two values",
     _set(_slice(), "spec.devices.0.attributes", {"v": {"int": 1, "bool": True}}),
     "spec.devices[0].attributes[v]", "FieldValueInvalid"),
    ("attribute with no value",
     _set(_slice(), "spec.devices.0.attributes", {"v": {}}),
     "spec.devices[0].attributes[v]", "FieldValueInvalid"),
    ("attribute name not a C identifier",
     _set(_slice(), "spec.devices.0.attributes", {"my-model": {"string": "a"}}),
     "spec.devices[0].attributes", "FieldValueInvalid"),  # name causes: at the map
    ("attribute name too long",
     _set(_slice(), "spec.devices.0.attributes", {"m" * 33: {"string": "a"}}),
     "spec.devices[0].attributes", "FieldValueTooLong"),
    ("attribute domain invalid",
     _set(_slice(), "spec.devices.0.attributes", {"a b/model": {"string": "a"}}),
     "spec.devices[0].attributes", "FieldValueInvalid"),
    ("capacity name invalid",
     _set(_slice(), "spec.devices.0.capacity", {"my-mem": {"value": "1Gi"}}),
     "spec.devices[0].capacity", "FieldValueInvalid"),
    ("33 attributes and capacities",
     _set(_slice(), "spec.devices.0.attributes", {f"a{i}": {"int": i} for i in range(33)}),
     "spec.devices[0]", "FieldValueInvalid"),
    ("17 taints", _set(_slice(), "spec.devices.0.taints", [_TAINT] * 17),
     "spec.devices[0].taints", "FieldValueTooMany"),
    ("taint value invalid",
     _set(_slice(), "spec.devices.0.taints", [{**_TAINT, "value": "a b"}]),
     "spec.devices[0].taints[0].value", "FieldValueInvalid"),
    ("65 devices with taints", _set(_slice(), "spec.devices", [
        _dev(name=f"gpu-{i}", taints=[_TAINT]) for i in range(65)]),
     "spec.devices", "FieldValueTooMany"),
    ("binding conditions too many",
     _set(_slice(), "spec.devices.0.bindingConditions", ["a", "b", "c", "d", "e"]),
     "spec.devices[0].bindingConditions", "FieldValueTooMany"),
    ("9 counter sets", _set(_set(_slice(), "spec.devices", None), "spec.sharedCounters", [
        {"name": f"c{i}", "counters": {"mem": {"value": "1"}}} for i in range(9)]),
     "spec.sharedCounters", "FieldValueTooMany"),
    ("counter set name invalid", _set(_set(_slice(), "spec.devices", None), "spec.sharedCounters",
        [{"name": "C_1", "counters": {"mem": {"value": "1"}}}]),
     "spec.sharedCounters[0].name", "FieldValueInvalid"),
    ("device node fields without perDeviceNodeSelection",
     _set(_slice(), "spec.devices.0.nodeName", "n1"),
     "spec.devices[0]", "FieldValueInvalid"),
]  # fmt: skip

_RULE_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("device name 10,000 chars", _set(_rule(), "spec.deviceSelector.device", "d" * 10_000),
     "spec.deviceSelector.device", "FieldValueInvalid"),
    ("device name a/b/c/d/e", _set(_rule(), "spec.deviceSelector.device", "a/b/c/d/e"),
     "spec.deviceSelector.device", "FieldValueInvalid"),
    ("driver with a space", _set(_rule(), "spec.deviceSelector.driver", "gpu example.com"),
     "spec.deviceSelector.driver", "FieldValueInvalid"),
    ("pool ../..", _set(_rule(), "spec.deviceSelector.pool", "../.."),
     "spec.deviceSelector.pool", "FieldValueInvalid"),
    ("taint value invalid", _set(_rule(), "spec.taint.value", "a b"),
     "spec.taint.value", "FieldValueInvalid"),
]  # fmt: skip

_CLAIM_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("request name invalid", _set(_claim(), "spec.devices.requests.0.name", "R_1"),
     "spec.devices.requests[0].name", "FieldValueInvalid"),
    ("class name invalid", _set(_claim(), "spec.devices.requests.0.exactly.deviceClassName",
                                "Gpu Class"),
     "spec.devices.requests[0].exactly.deviceClassName", "FieldValueInvalid"),
    ("count negative", _set(_claim(), "spec.devices.requests.0.exactly.count", -1),
     "spec.devices.requests[0].exactly.count", "FieldValueInvalid"),
    ("selector too long", _set(_claim(), "spec.devices.requests.0.exactly.selectors",
                               [{"cel": {"expression": "true" + " " * 10240}}]),
     "spec.devices.requests[0].exactly.selectors[0].cel.expression", "FieldValueTooLong"),
    ("selector too costly", _set(_claim(), "spec.devices.requests.0.exactly.selectors",
                                 [{"cel": {"expression": TIME_BOMB}}]),
     "spec.devices.requests[0].exactly.selectors[0].cel.expression", "FieldValueForbidden"),
]  # fmt: skip


def _allocated(claim: dict[str, Any], **status: Any) -> dict[str, Any]:
    out = copy.deepcopy(claim)
    out["status"] = {"allocation": _allocation(), **status}
    return out


_OLD_CLAIM = _allocated(_claim())
_CLAIM_STATUS_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("reservedFor 257", _allocated(_claim(), reservedFor=[
        {"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(257)]),
     "status.reservedFor", "FieldValueTooMany"),
    ("reservedFor duplicate uid", _allocated(_claim(), reservedFor=[
        {"resource": "pods", "name": "a", "uid": "u"},
        {"resource": "pods", "name": "b", "uid": "u"}]),
     "status.reservedFor[1]", "FieldValueDuplicate"),
    ("reservedFor entry without uid", _allocated(_claim(), reservedFor=[
        {"resource": "pods", "name": "a"}]),
     "status.reservedFor[0].uid", "FieldValueRequired"),
    ("allocation rewritten", _set(_OLD_CLAIM, "status.allocation", _allocation("gpu-1")),
     "status.allocation", "FieldValueInvalid"),
]  # fmt: skip

_NEW_ALLOCATION_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("reservedFor without allocation", _set(_claim(), "status", {"reservedFor": [
        {"resource": "pods", "name": "a", "uid": "u"}]}),
     "status.reservedFor", "FieldValueForbidden"),
    ("result device name invalid", _allocated(_set(_claim(), "x", 1) and _claim()) | {
        "status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": "gpu.example.com", "pool": "../..", "device": "D"}]}}}},
     "status.allocation.devices.results[0].pool", "FieldValueInvalid"),
    ("result request unknown", _claim() | {"status": {"allocation": {"devices": {"results": [
        {"request": "nope", "driver": "gpu.example.com", "pool": "p", "device": "d"}]}}}},
     "status.allocation.devices.results[0].request", "FieldValueInvalid"),
    ("33 results", _claim() | {"status": {"allocation": {"devices": {"results": [
        {"request": "r", "driver": "gpu.example.com", "pool": "p", "device": f"d{i}"}
        for i in range(33)]}}}},
     "status.allocation.devices.results", "FieldValueTooMany"),
]  # fmt: skip


def _fields(causes: list[dict[str, Any]]) -> dict[str, str]:
    return {c["field"]: c["reason"] for c in causes}


@pytest.mark.parametrize(
    ("rt", "obj", "old", "field", "reason"),
    [pytest.param(SLICE, o, None, f, r, id=f"slice: {n}") for n, o, f, r in _SLICE_CASES]
    + [pytest.param(DTR, o, None, f, r, id=f"rule: {n}") for n, o, f, r in _RULE_CASES]
    + [pytest.param(CLAIM, o, None, f, r, id=f"claim: {n}") for n, o, f, r in _CLAIM_CASES]
    + [
        pytest.param(CLAIM, o, _OLD_CLAIM, f, r, id=f"claim status: {n}")
        for n, o, f, r in _CLAIM_STATUS_CASES
    ]
    + [
        pytest.param(CLAIM, o, _claim(), f, r, id=f"claim allocation: {n}")
        for n, o, f, r in _NEW_ALLOCATION_CASES
    ]
    + [
        pytest.param(
            TEMPLATE,
            {
                "metadata": {"name": "t", "namespace": "default"},
                "spec": {"spec": _set(_claim(), "spec.devices.requests.0.name", "R")["spec"]},
            },
            None,
            "spec.spec.devices.requests[0].name",
            "FieldValueInvalid",
            id="template: request name invalid",
        ),
        pytest.param(
            CLASS,
            {
                "metadata": {"name": "gpu"},
                "spec": {"selectors": [{"cel": {"expression": MEMORY_BOMB}}]},
            },
            None,
            "spec.selectors[0].cel.expression",
            "FieldValueForbidden",
            id="class: selector too costly",
        ),
        pytest.param(
            DTR,
            _set(_rule(), "metadata.uid", "other"),
            _set(_rule(), "metadata.uid", "mine"),
            "metadata.uid",
            "FieldValueInvalid",
            id="any kind: uid changed on update",
        ),
    ],
)
def test_invalid_object_is_refused_with_upstreams_field(
    rt: Any, obj: dict[str, Any], old: dict[str, Any] | None, field: str, reason: str
) -> None:
    got = _fields(object_causes(rt, obj, old=old))
    assert got.get(field) == reason, got


@pytest.mark.parametrize(
    ("rt", "obj"),
    [(SLICE, _slice()), (DTR, _rule()), (CLAIM, _claim()), (CLAIM, _allocated(_claim()))],
)
def test_valid_objects_pass(rt: Any, obj: dict[str, Any]) -> None:
    assert object_causes(rt, obj) == []


async def test_messages_stay_short_for_huge_values() -> None:
    obj = _set(_slice(), "spec.devices.0.name", "g" * 100_000)
    causes = object_causes(SLICE, obj)
    assert causes and all(len(c["message"]) < 1024 for c in causes)
    await asyncio.sleep(0)
