"""Validation and immutability of what DRA touches, over real HTTP, as kube-apiserver answers.

Written from upstream kubernetes/kubernetes:
``pkg/apis/resource/validation/validation.go`` (``validateDeviceRequest``,
``validateDeviceAllocationMode``, ``validateSelector``/``validateCELExpression``,
``validateDeviceConstraint``, ``validateRequestNameRef``, ``ValidateResourceClaimUpdate``,
``ValidateResourceClaimTemplateUpdate``), ``pkg/apis/resource/v1/defaults.go``
(``SetDefaults_ExactDeviceRequest``), ``pkg/registry/resource/utils.go``
(``AuthorizedForAdmin``), ``pkg/apis/core/validation/validation.go``
(``validatePodResourceClaim``, ``validateResourceClaimNames``, ``ValidatePodUpdate``),
``staging/src/k8s.io/apimachinery/pkg/util/validation/field/errors.go`` (the cause
reasons and ``Invalid value: ...`` wording) and the strict decoder's 400
(``strict decoding error: unknown field ...``) for ``fieldValidation=Strict``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drahealth.controlplane import APIServer

RES = "/apis/resource.k8s.io/v1"
CLAIMS = f"{RES}/namespaces/default/resourceclaims"
TEMPLATES = f"{RES}/namespaces/default/resourceclaimtemplates"
CLASSES = f"{RES}/deviceclasses"
PODS = "/api/v1/namespaces/default/pods"


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
        return r.status, json.loads(text) if text and text[0] in "[{" else text


def claim(name: str, *requests: dict[str, Any], **devices: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": list(requests), **devices}},
    }


def exact(name: str = "gpu", **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "gpu.example.com", **fields}}


def invalid(body: Any, kind: str, name: str) -> list[dict[str, Any]]:
    """The causes of a 422 Invalid Status, after checking its shape."""
    assert body["kind"] == "Status" and body["code"] == 422 and body["reason"] == "Invalid", body
    assert body["message"].startswith(f'{kind} "{name}" is invalid: '), body["message"]
    causes: list[dict[str, Any]] = body["details"]["causes"]
    return causes


def one(body: Any, kind: str, name: str) -> dict[str, Any]:
    (c,) = invalid(body, kind, name)
    return c


async def test_request_with_both_exactly_and_first_available(
    http: aiohttp.ClientSession,
) -> None:
    req = exact()
    req["firstAvailable"] = [{"name": "a", "deviceClassName": "gpu.example.com"}]
    code, body = await call(http, "POST", CLAIMS, claim("both", req))
    assert code == 422
    c = one(body, "ResourceClaim.resource.k8s.io", "both")
    assert c["reason"] == "FieldValueInvalid"
    assert c["field"] == "spec.devices.requests[0]"
    assert c["message"] == (
        "Invalid value: null: exactly one of `exactly` or `firstAvailable` is required, "
        "but multiple fields are set"
    )
    code, body = await call(http, "POST", CLAIMS, claim("neither", {"name": "gpu"}))
    c = one(body, "ResourceClaim.resource.k8s.io", "neither")
    assert (c["reason"], c["field"]) == ("FieldValueRequired", "spec.devices.requests[0]")
    assert (
        c["message"] == "Required value: exactly one of `exactly` or `firstAvailable` is required"
    )


async def test_cel_that_does_not_compile_or_is_not_boolean(http: aiohttp.ClientSession) -> None:
    sel = [{"cel": {"expression": "device.driver =="}}, {"cel": {"expression": "device.driver"}}]
    code, body = await call(http, "POST", CLAIMS, claim("cel", exact(selectors=sel)))
    assert code == 422
    bad_syntax, not_bool = invalid(body, "ResourceClaim.resource.k8s.io", "cel")
    assert bad_syntax["field"] == "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    assert bad_syntax["reason"] == "FieldValueInvalid"
    assert bad_syntax["message"].startswith('Invalid value: "device.driver ==": compilation failed')
    assert not_bool["field"] == "spec.devices.requests[0].exactly.selectors[1].cel.expression"
    assert not_bool["message"] == (
        'Invalid value: "device.driver": must evaluate to bool or the unknown type, not string'
    )
    code, body = await call(
        http, "POST", CLAIMS, claim("ref", exact(selectors=[{"cel": {"expression": "gpu.x"}}]))
    )
    assert (
        "undeclared reference to 'gpu'"
        in one(body, "ResourceClaim.resource.k8s.io", "ref")["message"]
    )
    good = [{"cel": {"expression": 'device.capacity["x"].memory.compareTo(quantity("4Gi")) >= 0'}}]
    code, body = await call(http, "POST", CLAIMS, claim("good", exact(selectors=good)))
    assert code == 201, body


async def test_count_allocation_mode_and_request_names(http: aiohttp.ClientSession) -> None:
    # count 0 is "unset" in v1: defaulting makes it 1 (and the mode ExactCount), as upstream.
    code, body = await call(http, "POST", CLAIMS, claim("zero", exact(count=0)))
    assert code == 201, body
    assert body["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] == "ExactCount"
    assert body["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    code, body = await call(http, "POST", CLAIMS, claim("neg", exact(count=-1)))
    c = one(body, "ResourceClaim.resource.k8s.io", "neg")
    assert c == {
        "reason": "FieldValueInvalid",
        "message": "Invalid value: -1: must be greater than zero",
        "field": "spec.devices.requests[0].exactly.count",
    }
    code, body = await call(http, "POST", CLAIMS, claim("some", exact(allocationMode="Some")))
    c = one(body, "ResourceClaim.resource.k8s.io", "some")
    assert c == {
        "reason": "FieldValueNotSupported",
        "message": 'Unsupported value: "Some": supported values: "All", "ExactCount"',
        "field": "spec.devices.requests[0].exactly.allocationMode",
    }
    code, body = await call(
        http, "POST", CLAIMS, claim("all", exact(allocationMode="All", count=2))
    )
    c = one(body, "ResourceClaim.resource.k8s.io", "all")
    assert c["message"] == "Invalid value: 2: must not be specified when allocationMode is 'All'"
    code, body = await call(http, "POST", CLAIMS, claim("upper", exact("GPU_0")))
    c = one(body, "ResourceClaim.resource.k8s.io", "upper")
    assert (c["reason"], c["field"]) == ("FieldValueInvalid", "spec.devices.requests[0].name")
    assert c["message"].startswith('Invalid value: "GPU_0": a lowercase RFC 1123 label must')
    code, body = await call(http, "POST", CLAIMS, claim("dup", exact("a"), exact("a")))
    c = one(body, "ResourceClaim.resource.k8s.io", "dup")
    assert c == {
        "reason": "FieldValueDuplicate",
        "message": 'Duplicate value: "a"',
        "field": "spec.devices.requests[1]",
    }


async def test_constraints_and_config_name_unknown_requests(http: aiohttp.ClientSession) -> None:
    body_in = claim(
        "refs",
        exact("gpu"),
        constraints=[{"requests": ["gpu", "nic"], "matchAttribute": "example.com/numa"}],
        config=[{"requests": ["gpu/x"], "opaque": {"driver": "gpu.example.com", "parameters": {}}}],
    )
    code, body = await call(http, "POST", CLAIMS, body_in)
    assert code == 422
    constraint, config = invalid(body, "ResourceClaim.resource.k8s.io", "refs")
    msg = (
        "must be the name of a request in the claim or the name of a request and a "
        "subrequest separated by '/'"
    )
    assert constraint == {
        "reason": "FieldValueInvalid",
        "message": f'Invalid value: "nic": {msg}',
        "field": "spec.devices.constraints[0].requests[1]",
    }
    assert config["field"] == "spec.devices.config[0].requests[0]"
    code, body = await call(
        http, "POST", CLAIMS, claim("noattr", exact(), constraints=[{"requests": ["gpu"]}])
    )
    c = one(body, "ResourceClaim.resource.k8s.io", "noattr")
    assert (c["reason"], c["field"]) == (  # with DRAConsumableCapacity (1.36 on)
        "FieldValueRequired",
        "spec.devices.constraints[0]",
    )


async def test_claim_and_template_spec_are_immutable(http: aiohttp.ClientSession) -> None:
    code, created = await call(http, "POST", CLAIMS, claim("fixed", exact()))
    assert code == 201, created
    patch = {"spec": {"devices": {"requests": [exact(count=2)]}}}
    code, body = await call(http, "PATCH", f"{CLAIMS}/fixed", patch, "application/merge-patch+json")
    assert code == 422
    c = one(body, "ResourceClaim.resource.k8s.io", "fixed")
    assert c["reason"] == "FieldValueInvalid" and c["field"] == "spec"
    assert c["message"].endswith(": field is immutable")
    # Metadata stays writable.
    code, body = await call(
        http,
        "PATCH",
        f"{CLAIMS}/fixed",
        {"metadata": {"labels": {"a": "b"}}},
        "application/merge-patch+json",
    )
    assert code == 200, body
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {"spec": {"devices": {"requests": [exact()]}}},
    }
    code, body = await call(http, "POST", TEMPLATES, template)
    assert code == 201, body
    body["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 3
    code, body = await call(http, "PUT", f"{TEMPLATES}/t", body)
    c = one(body, "ResourceClaimTemplate.resource.k8s.io", "t")
    assert c["field"] == "spec" and c["message"].endswith(": field is immutable")


async def test_admin_access_needs_the_namespace_label(http: aiohttp.ClientSession) -> None:
    admin = claim("admin", exact(adminAccess=True))
    code, body = await call(http, "POST", CLAIMS, admin)
    assert code == 422
    c = one(body, "ResourceClaim.resource.k8s.io", "admin")
    assert c == {
        "reason": "FieldValueForbidden",
        "message": "Forbidden: admin access to devices requires the "
        "`resource.kubernetes.io/admin-access: true` label on the containing namespace",
        "field": "spec.devices.requests[0].adminAccess",
    }
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "admin"},
        "spec": {"spec": {"devices": {"requests": [exact(adminAccess=True)]}}},
    }
    code, body = await call(http, "POST", TEMPLATES, template)
    assert one(body, "ResourceClaimTemplate.resource.k8s.io", "admin")["reason"] == (
        "FieldValueForbidden"
    )
    ns = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "ops", "labels": {"resource.kubernetes.io/admin-access": "true"}},
    }
    assert (await call(http, "POST", "/api/v1/namespaces", ns))[0] == 201
    ops_claims = f"{RES}/namespaces/ops/resourceclaims"
    code, body = await call(http, "POST", ops_claims, admin)
    assert code == 201, body


def pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def test_pod_claim_references(http: aiohttp.ClientSession) -> None:
    container = {"name": "c", "image": "i", "resources": {"claims": [{"name": "gpu"}]}}
    code, body = await call(http, "POST", PODS, pod("undeclared", {"containers": [container]}))
    assert code == 422
    c = one(body, "Pod", "undeclared")
    assert c == {
        "reason": "FieldValueNotFound",
        "message": 'Not found: "gpu": must be one of the names in pod.spec.resourceClaims '
        "which is empty",
        "field": "spec.containers[0].resources.claims[0]",
    }
    both = {"name": "gpu", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}
    spec = {"containers": [container], "resourceClaims": [both]}
    code, body = await call(http, "POST", PODS, pod("both", spec))
    c = one(body, "Pod", "both")
    assert (c["reason"], c["field"]) == ("FieldValueInvalid", "spec.resourceClaims[0]")
    assert c["message"].endswith(
        ": at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified"
    )
    spec = {"containers": [container], "resourceClaims": [{"name": "gpu"}]}
    code, body = await call(http, "POST", PODS, pod("neither", spec))
    assert one(body, "Pod", "neither")["message"].endswith(
        ": must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"
    )


async def test_bound_pod_cannot_move_or_gain_claims(http: aiohttp.ClientSession) -> None:
    spec = {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}]}
    code, body = await call(http, "POST", PODS, pod("bound", spec))
    assert code == 201, body
    merge = "application/merge-patch+json"
    code, body = await call(http, "PATCH", f"{PODS}/bound", {"spec": {"nodeName": "node-2"}}, merge)
    assert code == 422
    c = one(body, "Pod", "bound")
    assert (c["reason"], c["field"]) == ("FieldValueForbidden", "spec")
    assert c["message"].startswith(
        "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    )
    claims = {
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "x"}],
        "containers": [{"name": "c", "image": "i", "resources": {"claims": [{"name": "gpu"}]}}],
    }
    code, body = await call(
        http, "PATCH", f"{PODS}/bound", {"spec": claims}, "application/strategic-merge-patch+json"
    )
    assert code == 422 and one(body, "Pod", "bound")["field"] == "spec"
    # What upstream lets an update change still changes.
    code, body = await call(
        http,
        "PATCH",
        f"{PODS}/bound",
        {"spec": {"containers": [{"name": "c", "image": "j"}]}},
        "application/strategic-merge-patch+json",
    )
    assert code == 200, body
    assert body["spec"]["containers"][0]["image"] == "j"


async def test_unknown_fields_are_a_strict_decoding_error(http: aiohttp.ClientSession) -> None:
    bad = claim("typo", exact())
    bad["spec"]["devices"]["requests"][0]["exactly"]["countt"] = 2
    code, body = await call(http, "POST", f"{CLAIMS}?fieldValidation=Strict", bad)
    assert code == 400
    assert body["reason"] == "BadRequest"
    assert body["message"] == (
        'ResourceClaim in version "v1" cannot be handled as a ResourceClaim: strict decoding '
        'error: unknown field "spec.devices.requests[0].exactly.countt"'
    )
    code, body = await call(http, "POST", f"{CLAIMS}?fieldValidation=Ignore", bad)
    assert code == 201 and "countt" not in body["spec"]["devices"]["requests"][0]["exactly"]


async def test_device_class_selectors_are_compiled(http: aiohttp.ClientSession) -> None:
    cls = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.example.com"},
        "spec": {"selectors": [{"cel": {"expression": "1 + 1"}}]},
    }
    code, body = await call(http, "POST", CLASSES, cls)
    assert code == 422
    c = one(body, "DeviceClass.resource.k8s.io", "gpu.example.com")
    assert c["field"] == "spec.selectors[0].cel.expression"
    assert "must evaluate to bool or the unknown type" in c["message"]
