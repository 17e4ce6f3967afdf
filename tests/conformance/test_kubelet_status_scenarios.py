"""Conformance: the kubelet's Pod-status scenarios (spec section 8, nos. 17-19, 35, 36).

Scenarios 17, 18, 19 and 35 run against the sans-I/O ``StatusBuilder`` (and
``truncate_message``); scenario 36 runs against the embedded API server over real
HTTP with lightkube. Tests named ``..._fix_<what>`` assert a deliberate improvement
over upstream; their comments name the upstream behaviour replaced.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, codecs
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.core import Health, truncate_message
from drahealth.core._records import ClaimInfo, PreparedDeviceInfo
from drahealth.core._status import StatusBuilder, StatusOptions
from drahealth.kube import make_client

JSON = dict[str, Any]
DRIVER = "test-driver"


def _pod(resource_claims: list[JSON], refs: list[JSON], claim_statuses: list[JSON]) -> JSON:
    return {
        "metadata": {"name": "test-pod", "namespace": "default", "uid": "test-pod-uid"},
        "spec": {
            "resourceClaims": resource_claims,
            "containers": [{"name": "test-container", "resources": {"claims": refs}}],
        },
        "status": {
            "resourceClaimStatuses": claim_statuses,
            "containerStatuses": [{"name": "test-container", "ready": True, "restartCount": 0}],
        },
    }


def _entries(
    pod: JSON,
    claims: dict[str, ClaimInfo],
    health: dict[str, tuple[Health, str]],
    options: StatusOptions | None = None,
) -> list[JSON]:
    out = StatusBuilder(options or StatusOptions()).apply(
        pod,
        lambda ns, name: claims.get(name) if ns == "default" else None,
        lambda driver, pool, device: health.get(f"{driver}/{pool}/{device}", (Health.UNKNOWN, "")),
    )
    entries: list[JSON] = out["containerStatuses"][0].get("allocatedResourcesStatus", [])
    return entries


# --------------------------------------------------------------------------- scenario 17


def test_s17_direct_renamed_and_template_claims() -> None:
    # Upstream 1.34/1.35 skipped direct claims unless status.resourceClaimStatuses listed
    # them; 1.36 (our target) resolves resourceClaimName directly, as checked here.
    cases = {
        "direct": ([{"name": "c1", "resourceClaimName": "c1"}], []),
        "renamed": ([{"name": "ref", "resourceClaimName": "object-name"}], []),
        "template": (
            [{"name": "tc", "resourceClaimTemplateName": "tmpl"}],
            [{"name": "tc", "resourceClaimName": "tc-generated-abc12"}],
        ),
    }
    objects = {"direct": "c1", "renamed": "object-name", "template": "tc-generated-abc12"}
    for case, (resource_claims, claim_statuses) in cases.items():
        ref = resource_claims[0]["name"]
        device = PreparedDeviceInfo(DRIVER, "pool", f"dev-{case}")
        claim = ClaimInfo("default", objects[case], f"uid-{case}", (device,))
        pod = _pod(resource_claims, [{"name": ref}], claim_statuses)
        health = {f"{DRIVER}/pool/dev-{case}": (Health.HEALTHY, "Device is operating normally")}
        resource = {"resourceID": f"{DRIVER}/pool/dev-{case}", "health": "Healthy"}
        with_message = {**resource, "message": "Device is operating normally"}
        assert _entries(pod, {claim.name: claim}, health) == [
            {"name": f"claim:{ref}", "resources": [with_message]}
        ], case
        gate_off = StatusOptions(health_message=False)
        assert _entries(pod, {claim.name: claim}, health, gate_off) == [
            {"name": f"claim:{ref}", "resources": [resource]}
        ], case


# --------------------------------------------------------------------------- scenario 18


def test_s18_subrequests_filter_devices_by_base_request() -> None:
    device = PreparedDeviceInfo(DRIVER, "test-pool", "test-device", ("req-base",))
    claim = ClaimInfo("default", "claim1", "uid-1", (device,))
    health = {f"{DRIVER}/test-pool/test-device": (Health.HEALTHY, "Device healthy")}
    resource = {
        "resourceID": f"{DRIVER}/test-pool/test-device",
        "health": "Healthy",
        "message": "Device healthy",
    }

    def entries(request: str) -> list[JSON]:
        pod = _pod(
            [{"name": "claim1", "resourceClaimName": "claim1"}],
            [{"name": "claim1", "request": request}],
            [],
        )
        return _entries(pod, {"claim1": claim}, health)

    assert entries("req-base/sub") == [
        {"name": "claim:claim1/req-base/sub", "resources": [resource]}
    ]
    assert entries("req-other/sub") == []  # an entry without resources is pruned
    assert entries("req-base") == [{"name": "claim:claim1/req-base", "resources": [resource]}]
    assert entries("") == [{"name": "claim:claim1", "resources": [resource]}]


# --------------------------------------------------------------------------- scenario 19


def test_s19_message_truncation() -> None:
    assert truncate_message("") == ""
    assert truncate_message("short message") == "short message"
    exact = "a" * 1024
    assert truncate_message(exact) == exact
    for long in ("a" * 1025, "b" * 2048, "c" * 1024 + " extra content"):
        out = truncate_message(long)
        assert out == long[:1021] + "..."
        assert len(out.encode()) == 1024 and out.endswith("...")


def test_s19_message_truncation_fix_utf8_safe() -> None:
    # Upstream (truncateHealthMessage) keeps the first 1021 *bytes*, which can end inside
    # a multi-byte character and produce invalid UTF-8. Ours drops the partial character.
    message = "xy" + "€" * 400  # 2 + 1200 bytes; byte 1021 falls inside a 3-byte "€"
    upstream_cut = message.encode()[:1021]
    with pytest.raises(UnicodeDecodeError):
        upstream_cut.decode("utf-8")
    out = truncate_message(message)
    assert out == "xy" + "€" * 339 + "..."  # 2 + 1017 bytes kept, then "..."
    assert len(out.encode()) <= 1024 and out.endswith("...")
    assert out.encode().decode("utf-8") == out


# --------------------------------------------------------------------------- scenario 35


def test_s35_entry_names_and_resource_ids() -> None:
    devices = tuple(
        PreparedDeviceInfo(DRIVER, "pool", f"dev-{i}", ("req",), (f"{DRIVER}/test=dev-{i}",))
        for i in range(2)
    )
    claim = ClaimInfo("default", "external-claim", "uid-1", devices)
    pod = _pod(
        [{"name": "my-claim", "resourceClaimName": "external-claim"}],
        [{"name": "my-claim", "request": "req"}, {"name": "my-claim"}],
        [],
    )
    entries = _entries(pod, {"external-claim": claim}, {})
    assert [e["name"] for e in entries] == ["claim:my-claim", "claim:my-claim/req"]
    for entry in entries:
        ids = [r["resourceID"] for r in entry["resources"]]
        assert ids == [f"{DRIVER}/test=dev-0", f"{DRIVER}/test=dev-1"]  # first CDI ID
        assert all(i.startswith(f"{DRIVER}/") for i in ids)
    by_device = _entries(pod, {"external-claim": claim}, {}, StatusOptions(resource_id="device"))
    ids = [r["resourceID"] for r in by_device[0]["resources"]]
    assert ids == [f"{DRIVER}/pool/dev-0", f"{DRIVER}/pool/dev-1"]


def test_s35_shared_cdi_id_fix_worst_health_kept() -> None:
    # Upstream de-duplicates devices sharing a resourceID (first CDI ID) first-wins in map
    # order, so an Unhealthy device can vanish behind a Healthy one. Ours keeps the worst.
    shared = (f"{DRIVER}/test=shared",)
    devices = (
        PreparedDeviceInfo(DRIVER, "pool", "dev-0", (), shared),
        PreparedDeviceInfo(DRIVER, "pool", "dev-1", (), shared),
    )
    claim = ClaimInfo("default", "c", "uid", devices)
    pod = _pod([{"name": "c", "resourceClaimName": "c"}], [{"name": "c"}], [])
    health = {
        f"{DRIVER}/pool/dev-0": (Health.HEALTHY, ""),
        f"{DRIVER}/pool/dev-1": (Health.UNHEALTHY, "XID 79"),
    }
    expected = [{"resourceID": shared[0], "health": "Unhealthy", "message": "XID 79"}]
    assert _entries(pod, {"c": claim}, health) == [{"name": "claim:c", "resources": expected}]


def test_s35_ordering_fix_sorted_entries_and_resources() -> None:
    # Upstream builds entries and resources from Go maps (random order per sync), causing
    # spurious status PATCHes. Ours sorts entries by name and resources by resourceID.
    devices = tuple(PreparedDeviceInfo(DRIVER, "pool", f"dev-{i}") for i in (3, 1, 2))
    claims = {n: ClaimInfo("default", n, n, devices) for n in ("zeta", "alpha", "mid")}
    rcs = [{"name": n, "resourceClaimName": n} for n in claims]
    pod = _pod(rcs, [{"name": n} for n in claims], [])
    entries = _entries(pod, claims, {})
    assert [e["name"] for e in entries] == ["claim:alpha", "claim:mid", "claim:zeta"]
    for entry in entries:
        ids = [r["resourceID"] for r in entry["resources"]]
        assert ids == [f"{DRIVER}/pool/dev-{i}" for i in (1, 2, 3)]


# --------------------------------------------------------------------------- scenario 36


@pytest.fixture
async def client() -> AsyncIterator[AsyncClient]:
    server = APIServer()
    await server.start(port=0)
    c = make_client(server_url=server.url)
    try:
        yield c
    finally:
        await c.close()
        await server.stop()


def _status_pod() -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "resourceClaims": [
                {"name": "gpu", "resourceClaimName": "gpu-claim"},
                {"name": "nic", "resourceClaimName": "nic-claim"},
            ],
            "initContainers": [
                {"name": "init", "image": "i", "resources": {"claims": [{"name": "nic"}]}}
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "i",
                    "resources": {
                        "claims": [{"name": "gpu", "request": "gpus"}, {"name": "nic"}],
                        "requests": {"example.com/fpga": "1"},
                    },
                }
            ],
        },
    }


def _cs(name: str, entries: list[JSON]) -> JSON:
    return {
        "name": name,
        "image": "i",
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "allocatedResourcesStatus": entries,
    }


def _entry(name: str, *resources: tuple[str, str]) -> JSON:
    return {"name": name, "resources": [{"resourceID": r, "health": h} for r, h in resources]}


async def test_s36_api_validation_of_allocated_resources_status(client: AsyncClient) -> None:
    await client.create(codecs.from_dict(_status_pod()))

    async def patch(status: JSON) -> None:
        await client.patch(
            Pod.Status, "p", {"status": status}, namespace="default", patch_type=PatchType.MERGE
        )

    valid = {
        "containerStatuses": [
            _cs(
                "main",
                [
                    _entry("example.com/fpga", ("fpga-0", "Healthy")),
                    _entry("claim:gpu/gpus", ("gpu-0", "Healthy"), ("gpu-1", "Unhealthy")),
                    _entry("claim:nic", ("eth1", "Unknown"), ("", "Healthy")),  # empty id: allowed
                ],
            ),
            _cs("unknown-container", [_entry("claim:anything", ("x", "Healthy"))]),
        ],
        "initContainerStatuses": [_cs("init", [_entry("claim:nic", ("eth1", "Healthy"))])],
    }
    await patch(valid)
    stored = await client.get(Pod, "p", namespace="default")
    assert stored.status is not None and stored.status.containerStatuses is not None
    ars = stored.status.containerStatuses[0].allocatedResourcesStatus
    assert ars is not None and [e.name for e in ars] == [
        "example.com/fpga",
        "claim:gpu/gpus",
        "claim:nic",
    ]

    claim_msg = (
        "must match one of the container's resource claims in a format "
        "'claim:<claimName>/<request>' or 'claim:<claimName>' if request is empty"
    )
    main = "status.containerStatuses[0].allocatedResourcesStatus[0]"
    init = "status.initContainerStatuses[0].allocatedResourcesStatus[0]"
    invalid: list[tuple[JSON, str, str, str]] = [
        # claim:gpu has request "gpus": the bare claim name is not allowed
        (
            {"containerStatuses": [_cs("main", [_entry("claim:gpu", ("g", "Healthy"))])]},
            f"{main}.name",
            "FieldValueInvalid",
            claim_msg,
        ),
        # claim:nic has no request: no request may be named
        (
            {"containerStatuses": [_cs("main", [_entry("claim:nic/x", ("n", "Healthy"))])]},
            f"{main}.name",
            "FieldValueInvalid",
            claim_msg,
        ),
        # a claim the container does not reference (the init container has only nic)
        (
            {"initContainerStatuses": [_cs("init", [_entry("claim:gpu/gpus", ("g", "Healthy"))])]},
            f"{init}.name",
            "FieldValueInvalid",
            claim_msg,
        ),
        # a non-claim name must be a key of resources.requests
        (
            {"containerStatuses": [_cs("main", [_entry("example.com/gpu", ("g", "Healthy"))])]},
            f"{main}.name",
            "FieldValueInvalid",
            "must match one of the container's resource requests",
        ),
        (
            {"containerStatuses": [_cs("main", [_entry("claim:nic", ("n", "Broken"))])]},
            f"{main}.resources[0].health",
            "FieldValueNotSupported",
            'Unsupported value: "Broken"',
        ),
        (
            {
                "containerStatuses": [
                    _cs("main", [_entry("claim:nic", ("n", "Healthy"), ("n", "Unhealthy"))])
                ]
            },
            f"{main}.resources[1].resourceID",
            "FieldValueDuplicate",
            'Duplicate value: "n"',
        ),
        (
            {"ephemeralContainerStatuses": [_cs("debug", [_entry("claim:nic", ("n", "Healthy"))])]},
            "status.ephemeralContainerStatuses[0].allocatedResourcesStatus",
            "FieldValueForbidden",
            "Forbidden: must not be specified in container status",
        ),
    ]
    for status, field, reason, text in invalid:
        with pytest.raises(ApiError) as err:
            await patch(status)
        assert err.value.status.code == 422, field
        message = err.value.status.message or ""
        assert f"{field}: " in message and text in message, message
        details = err.value.status.details
        assert details is not None and details.causes is not None
        assert [(c.field, c.reason) for c in details.causes] == [(field, reason)]

    after = await client.get(Pod, "p", namespace="default")
    assert after.status is not None and after.status.containerStatuses is not None
    assert after.status.containerStatuses[0].allocatedResourcesStatus == ars  # unchanged
