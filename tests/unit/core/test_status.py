"""StatusBuilder: claim resolution, entry names, request filter, resourceIDs, merging
into existing container statuses, gates, determinism and malformed input."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drahealth.core import Health
from drahealth.core._records import ClaimInfo, PreparedDeviceInfo
from drahealth.core._status import (
    StatusBuilder,
    StatusInputError,
    StatusOptions,
    entry_name,
    resolve_claim_name,
)

JSON = dict[str, Any]
GPU = "gpu.example.com"
NIC = "nic.example.com"


def gpu(
    name: str, *, cdi: bool = True, requests: tuple[str, ...] = ("gpus",)
) -> PreparedDeviceInfo:
    ids = (f"{GPU}/gpu={name}",) if cdi else ()
    return PreparedDeviceInfo(GPU, "node-1", name, requests, ids)


CLAIMS = {
    ("default", "trainer-gpu-x7k2p"): ClaimInfo(
        "default", "trainer-gpu-x7k2p", "u1", (gpu("gpu-0"), gpu("gpu-1"))
    ),
    ("default", "shared-nic"): ClaimInfo(
        "default", "shared-nic", "u2", (PreparedDeviceInfo(NIC, "node-1", "eth1", ("nic",)),)
    ),
}
HEALTH = {
    (GPU, "node-1", "gpu-0"): (Health.HEALTHY, ""),
    (GPU, "node-1", "gpu-1"): (Health.UNHEALTHY, "ECC error count exceeded threshold"),
    (NIC, "node-1", "eth1"): (Health.UNKNOWN, ""),
}


def claims(namespace: str, name: str) -> ClaimInfo | None:
    return CLAIMS.get((namespace, name))


def health(driver: str, pool: str, device: str) -> tuple[Health, str]:
    return HEALTH.get((driver, pool, device), (Health.UNKNOWN, ""))


def container_status(name: str, entries: list[JSON] | None = None, **extra: Any) -> JSON:
    cs: JSON = {"name": name, "ready": True, "restartCount": 0, "image": "i", "imageID": ""}
    if entries is not None:
        cs["allocatedResourcesStatus"] = entries
    cs.update(extra)
    return cs


def worked_example() -> JSON:
    """The pod of the spec's section 6.2."""
    return {
        "metadata": {"name": "trainer", "namespace": "default", "uid": "1111"},
        "spec": {
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "gpu-template"},
                {"name": "nic", "resourceClaimName": "shared-nic"},
            ],
            "containers": [
                {
                    "name": "trainer",
                    "resources": {"claims": [{"name": "gpu", "request": "gpus"}, {"name": "nic"}]},
                },
                {"name": "sidecar", "resources": {"claims": [{"name": "nic"}]}},
            ],
        },
        "status": {
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "trainer-gpu-x7k2p"}],
            "containerStatuses": [container_status("sidecar"), container_status("trainer")],
        },
    }


NIC_ENTRY = {
    "name": "claim:nic",
    "resources": [{"resourceID": f"{NIC}/node-1/eth1", "health": "Unknown"}],
}
GPU_ENTRY = {
    "name": "claim:gpu/gpus",
    "resources": [
        {"resourceID": f"{GPU}/gpu=gpu-0", "health": "Healthy"},
        {
            "resourceID": f"{GPU}/gpu=gpu-1",
            "health": "Unhealthy",
            "message": "ECC error count exceeded threshold",
        },
    ],
}


# --------------------------------------------------------------------------- naming


def test_resolve_claim_name_direct_template_and_missing() -> None:
    pod = worked_example()
    assert resolve_claim_name(pod, "nic") == "shared-nic"
    assert resolve_claim_name(pod, "gpu") == "trainer-gpu-x7k2p"
    assert resolve_claim_name(pod, "absent") is None
    pod["status"]["resourceClaimStatuses"] = []
    assert resolve_claim_name(pod, "gpu") is None  # template not yet instantiated
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu"}]  # recorded, no claim needed
    assert resolve_claim_name(pod, "gpu") is None
    pod["spec"]["resourceClaims"][0] = {"name": "gpu"}  # neither field set
    assert resolve_claim_name(pod, "gpu") is None
    assert resolve_claim_name({}, "gpu") is None


def test_entry_name() -> None:
    assert entry_name("gpu", None) == "claim:gpu"
    assert entry_name("gpu", "") == "claim:gpu"
    assert entry_name("gpu", "req") == "claim:gpu/req"
    assert entry_name("gpu", "req/sub") == "claim:gpu/req/sub"
    with pytest.raises(ValueError, match="claim reference name"):
        entry_name("", "req")


# --------------------------------------------------------------------------- entries


def test_worked_example_container_entries() -> None:
    pod = worked_example()
    builder = StatusBuilder()
    trainer, sidecar = pod["spec"]["containers"]
    assert builder.container_entries(pod, trainer, claims, health) == [GPU_ENTRY, NIC_ENTRY]
    assert builder.container_entries(pod, sidecar, claims, health) == [NIC_ENTRY]


def test_unprepared_or_unresolvable_claims_are_skipped() -> None:
    pod = worked_example()
    trainer = pod["spec"]["containers"][0]
    pod["status"]["resourceClaimStatuses"] = []
    assert StatusBuilder().container_entries(pod, trainer, claims, health) == [NIC_ENTRY]
    assert StatusBuilder().container_entries(pod, trainer, lambda ns, n: None, health) == []
    unknown_ref = {"name": "c", "resources": {"claims": [{"name": "not-in-spec"}]}}
    assert StatusBuilder().container_entries(pod, unknown_ref, claims, health) == []
    assert StatusBuilder().container_entries(pod, {"name": "plain"}, claims, health) == []


def test_claims_are_looked_up_in_the_pod_namespace() -> None:
    pod = worked_example()
    pod["metadata"]["namespace"] = "team-a"
    seen: list[tuple[str, str]] = []

    def lookup(namespace: str, name: str) -> ClaimInfo | None:
        seen.append((namespace, name))
        return None

    StatusBuilder().container_entries(pod, pod["spec"]["containers"][0], lookup, health)
    assert seen == [("team-a", "trainer-gpu-x7k2p"), ("team-a", "shared-nic")]
    del pod["metadata"]["namespace"]
    seen.clear()
    StatusBuilder().container_entries(pod, pod["spec"]["containers"][1], lookup, health)
    assert seen == [("default", "shared-nic")]


def test_request_filter_with_subrequests() -> None:
    devices = (
        gpu("a", requests=("big",)),
        gpu("b", requests=("small",)),
        gpu("c", requests=()),  # no request names: always included
    )
    local = {("default", "cl"): ClaimInfo("default", "cl", "u", devices)}
    pod: JSON = {
        "metadata": {"namespace": "default"},
        "spec": {"resourceClaims": [{"name": "r", "resourceClaimName": "cl"}]},
    }

    def ids(request: str | None) -> list[str]:
        ref: JSON = {"name": "r"} if request is None else {"name": "r", "request": request}
        container = {"name": "c", "resources": {"claims": [ref]}}
        out = StatusBuilder(StatusOptions(resource_id="device")).container_entries(
            pod, container, lambda ns, n: local.get((ns, n)), health
        )
        return [r["resourceID"].rsplit("/", 1)[1] for e in out for r in e["resources"]]

    assert ids("big") == ["a", "c"]
    assert ids("big/fast") == ["a", "c"]
    assert ids("small/x") == ["b", "c"]
    assert ids("other") == ["c"]
    assert ids("") == ["a", "b", "c"]
    assert ids(None) == ["a", "b", "c"]


def test_resource_id_modes() -> None:
    pod = worked_example()
    trainer = pod["spec"]["containers"][0]
    upstream = StatusBuilder().container_entries(pod, trainer, claims, health)
    assert [r["resourceID"] for r in upstream[0]["resources"]] == [
        f"{GPU}/gpu=gpu-0",
        f"{GPU}/gpu=gpu-1",
    ]
    ours = StatusBuilder(StatusOptions(resource_id="device"))
    entries = ours.container_entries(pod, trainer, claims, health)
    assert [r["resourceID"] for r in entries[0]["resources"]] == [
        f"{GPU}/node-1/gpu-0",
        f"{GPU}/node-1/gpu-1",
    ]


def test_shared_resource_id_keeps_the_worst_health() -> None:
    shared = (f"{GPU}/gpu=all",)
    devices = tuple(
        PreparedDeviceInfo(GPU, "node-1", name, (), shared) for name in ("gpu-0", "gpu-1", "gpu-2")
    )
    local = {("default", "cl"): ClaimInfo("default", "cl", "u", devices)}
    table = {
        "gpu-0": (Health.HEALTHY, "fine"),
        "gpu-1": (Health.UNHEALTHY, "XID 79"),
        "gpu-2": (Health.UNKNOWN, ""),
    }
    pod: JSON = {"spec": {"resourceClaims": [{"name": "r", "resourceClaimName": "cl"}]}}
    container = {"name": "c", "resources": {"claims": [{"name": "r"}]}}
    for order in ((0, 1, 2), (2, 1, 0), (1, 0, 2)):
        claim = ClaimInfo("default", "cl", "u", tuple(devices[i] for i in order))
        local[("default", "cl")] = claim
        out = StatusBuilder().container_entries(
            pod, container, lambda ns, n: local.get((ns, n)), lambda d, p, x: table[x]
        )
        assert out == [
            {
                "name": "claim:r",
                "resources": [
                    {"resourceID": f"{GPU}/gpu=all", "health": "Unhealthy", "message": "XID 79"}
                ],
            }
        ]


def test_message_gate_and_empty_messages() -> None:
    pod = worked_example()
    trainer = pod["spec"]["containers"][0]
    off = StatusBuilder(StatusOptions(health_message=False))
    entries = off.container_entries(pod, trainer, claims, health)
    assert all("message" not in r for e in entries for r in e["resources"])
    on = StatusBuilder().container_entries(pod, trainer, claims, health)
    (healthy, unhealthy) = on[0]["resources"]
    assert "message" not in healthy  # empty message: key absent
    assert unhealthy["message"] == "ECC error count exceeded threshold"


def test_long_messages_are_capped_without_splitting_characters() -> None:
    pod = worked_example()
    trainer = pod["spec"]["containers"][0]

    def chatty(driver: str, pool: str, device: str) -> tuple[Health, str]:
        return Health.UNHEALTHY, "é" * 2000

    out = StatusBuilder().container_entries(pod, trainer, claims, chatty)
    message = out[0]["resources"][0]["message"]
    assert len(message.encode()) <= 1024 and message.endswith("...")
    assert message == "é" * 510 + "..."


def test_health_status_gate_off_produces_nothing() -> None:
    pod = worked_example()
    off = StatusBuilder(StatusOptions(health_status=False))
    assert off.container_entries(pod, pod["spec"]["containers"][0], claims, health) == []


def test_pod_claims_deduplicated_and_sorted() -> None:
    pod = worked_example()
    pod["spec"]["resourceClaims"].append({"name": "nic-again", "resourceClaimName": "shared-nic"})
    pod["spec"]["resourceClaims"].append({"name": "gone", "resourceClaimName": "unprepared"})
    got = StatusBuilder().pod_claims(pod, claims)
    assert [c.name for c in got] == ["shared-nic", "trainer-gpu-x7k2p"]
    assert StatusBuilder().pod_claims({}, claims) == []


# --------------------------------------------------------------------------- apply


def test_apply_worked_example_and_input_untouched() -> None:
    pod = worked_example()
    before = copy.deepcopy(pod)
    out = StatusBuilder().apply(pod, claims, health)
    assert pod == before
    assert list(out) == ["containerStatuses"]  # no initContainerStatuses in the pod status
    sidecar, trainer = out["containerStatuses"]
    assert sidecar == container_status("sidecar", [NIC_ENTRY])
    assert trainer == container_status("trainer", [GPU_ENTRY, NIC_ENTRY])


def test_apply_keeps_device_plugin_entries_first_and_replaces_claim_entries() -> None:
    pod = worked_example()
    pod["spec"]["containers"][0]["resources"]["requests"] = {"example.com/fpga": "1"}
    fpga = {"name": "example.com/fpga", "resources": [{"resourceID": "f0", "health": "Healthy"}]}
    stale = {"name": "claim:gpu/gpus", "resources": [{"resourceID": "old", "health": "Healthy"}]}
    gone = {"name": "claim:removed", "resources": [{"resourceID": "x", "health": "Healthy"}]}
    pod["status"]["containerStatuses"][1] = container_status("trainer", [stale, fpga, gone])
    out = StatusBuilder().apply(pod, claims, health)
    assert out["containerStatuses"][1]["allocatedResourcesStatus"] == [fpga, GPU_ENTRY, NIC_ENTRY]


def test_apply_removes_the_key_when_nothing_is_left() -> None:
    pod = worked_example()
    stale = {"name": "claim:nic", "resources": [{"resourceID": "x", "health": "Healthy"}]}
    pod["status"]["containerStatuses"][0] = container_status("sidecar", [stale])
    out = StatusBuilder().apply(pod, lambda ns, n: None, health)
    assert "allocatedResourcesStatus" not in out["containerStatuses"][0]
    assert out["containerStatuses"][0] == container_status("sidecar")


def test_apply_with_health_gate_off_removes_claim_entries_only() -> None:
    pod = worked_example()
    fpga = {"name": "example.com/fpga", "resources": [{"resourceID": "f0", "health": "Healthy"}]}
    pod["status"]["containerStatuses"] = [
        container_status("trainer", [GPU_ENTRY, fpga, NIC_ENTRY]),
        container_status("sidecar", [NIC_ENTRY]),
        container_status("not-in-spec", [NIC_ENTRY]),
    ]
    out = StatusBuilder(StatusOptions(health_status=False)).apply(pod, claims, health)
    assert [cs.get("allocatedResourcesStatus") for cs in out["containerStatuses"]] == [
        [fpga],
        None,
        None,
    ]


def test_apply_leaves_statuses_of_unknown_containers_alone() -> None:
    pod = worked_example()
    pod["status"]["containerStatuses"].append(container_status("ghost", [NIC_ENTRY]))
    out = StatusBuilder().apply(pod, claims, health)
    assert out["containerStatuses"][2] == container_status("ghost", [NIC_ENTRY])


def test_apply_reports_init_and_sidecar_containers() -> None:
    pod = worked_example()
    pod["spec"]["initContainers"] = [
        {"name": "setup", "resources": {"claims": [{"name": "gpu", "request": "gpus"}]}},
        {"name": "proxy", "restartPolicy": "Always", "resources": {"claims": [{"name": "nic"}]}},
    ]
    pod["status"]["initContainerStatuses"] = [container_status("setup"), container_status("proxy")]
    pod["status"]["ephemeralContainerStatuses"] = [container_status("debug")]
    out = StatusBuilder().apply(pod, claims, health)
    assert list(out) == ["containerStatuses", "initContainerStatuses"]
    setup, proxy = out["initContainerStatuses"]
    assert setup["allocatedResourcesStatus"] == [GPU_ENTRY]
    assert proxy["allocatedResourcesStatus"] == [NIC_ENTRY]
    upstream = StatusBuilder(StatusOptions(init_containers=False)).apply(pod, claims, health)
    assert list(upstream) == ["containerStatuses"]  # init statuses left to whoever owns them


def test_apply_works_for_terminated_pods_while_the_claim_is_known() -> None:
    pod = worked_example()
    done = {"terminated": {"exitCode": 1, "reason": "Error"}}
    pod["status"]["phase"] = "Failed"
    pod["status"]["containerStatuses"] = [
        container_status("sidecar", state=done, ready=False),
        container_status("trainer", state=done, ready=False),
    ]
    out = StatusBuilder().apply(pod, claims, health)
    sidecar, trainer = out["containerStatuses"]
    assert trainer["state"] == done
    assert trainer["allocatedResourcesStatus"] == [GPU_ENTRY, NIC_ENTRY]
    assert sidecar["allocatedResourcesStatus"] == [NIC_ENTRY]


def test_apply_is_deterministic_whatever_the_input_order() -> None:
    pod = worked_example()
    reordered = copy.deepcopy(pod)
    reordered["spec"]["containers"][0]["resources"]["claims"].reverse()
    reordered["spec"]["resourceClaims"].reverse()
    reversed_claims = {
        k: ClaimInfo(v.namespace, v.name, v.uid, tuple(reversed(v.devices)))
        for k, v in CLAIMS.items()
    }
    a = StatusBuilder().apply(pod, claims, health)
    b = StatusBuilder().apply(reordered, lambda ns, n: reversed_claims.get((ns, n)), health)
    assert json.dumps(a) == json.dumps(b)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["gpu-0", "gpu-1", "gpu-2", "gpu-3"]),
            st.sampled_from(["all", "a", "b"]),
            st.sampled_from(list(Health)),
        ),
        max_size=8,
    )
)
def test_entries_sorted_unique_and_worst_of(devs: list[tuple[str, str, Health]]) -> None:
    devices = tuple(
        PreparedDeviceInfo(GPU, "p", name, (), (f"{GPU}/gpu={cdi}",)) for name, cdi, _ in devs
    )
    table = {name: h for name, _, h in devs}
    claim = ClaimInfo("default", "cl", "u", devices)
    pod: JSON = {"spec": {"resourceClaims": [{"name": "r", "resourceClaimName": "cl"}]}}
    container = {"name": "c", "resources": {"claims": [{"name": "r"}]}}
    out = StatusBuilder().container_entries(
        pod, container, lambda ns, n: claim, lambda d, p, x: (table[x], "")
    )
    if not devs:
        assert out == []
        return
    resources = out[0]["resources"]
    ids = [r["resourceID"] for r in resources]
    assert ids == sorted(set(ids))
    for r in resources:
        cdi = r["resourceID"].split("=", 1)[1]
        expected = Health.worst(*(table[n] for n, c, _ in devs if c == cdi))
        assert r["health"] == expected.value


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("pod", "field"),
    [
        ({"spec": []}, "spec: expected an object"),
        ({"spec": {"resourceClaims": {}}}, "spec.resourceClaims: expected an array"),
        ({"spec": {"resourceClaims": ["gpu"]}}, r"spec.resourceClaims\[0\]: expected an object"),
        ({"spec": {"resourceClaims": [{}]}}, r"spec.resourceClaims\[0\].name: required"),
        (
            {"spec": {"resourceClaims": [{"name": "r", "resourceClaimName": 7}]}},
            r"spec.resourceClaims\[0\].resourceClaimName: expected a string, got int",
        ),
        ({"metadata": {"namespace": 1}}, "metadata.namespace: expected a string"),
        (
            {"spec": {"containers": [{"name": "c"}]}, "status": {"containerStatuses": {}}},
            "status.containerStatuses: expected an array",
        ),
        (
            {"spec": {"containers": [{}]}, "status": {"containerStatuses": []}},
            r"spec.containers\[0\].name: required",
        ),
        (
            {
                "spec": {"containers": [{"name": "c"}]},
                "status": {"containerStatuses": [{"name": "c", "allocatedResourcesStatus": [{}]}]},
            },
            r"status.containerStatuses\[0\].allocatedResourcesStatus\[0\].name: required",
        ),
    ],
)
def test_malformed_pods_name_the_field(pod: JSON, field: str) -> None:
    with pytest.raises(StatusInputError, match=field):
        builder = StatusBuilder()
        builder.pod_claims(pod, claims)
        builder.apply(pod, claims, health)


def test_malformed_container_claim_refs_name_the_field() -> None:
    pod = worked_example()
    builder = StatusBuilder()
    with pytest.raises(StatusInputError, match=r"container 'x' resources.claims\[0\].name: requ"):
        builder.container_entries(pod, {"name": "x", "resources": {"claims": [{}]}}, claims, health)
    with pytest.raises(StatusInputError, match=r"resources.claims\[0\].request: expected a str"):
        ref = {"name": "gpu", "request": 3}
        builder.container_entries(
            pod, {"name": "x", "resources": {"claims": [ref]}}, claims, health
        )
    with pytest.raises(StatusInputError, match="container: expected an object"):
        builder.container_entries(pod, "trainer", claims, health)  # type: ignore[arg-type]


def test_bad_lookup_results_and_options_are_rejected() -> None:
    pod = worked_example()
    trainer = pod["spec"]["containers"][0]
    sick: Any = lambda d, p, x: ("Sick", "")  # noqa: E731
    no_message: Any = lambda d, p, x: (Health.HEALTHY, None)  # noqa: E731
    with pytest.raises(ValueError, match=r"health lookup for gpu.example.com/node-1/gpu-0: 'Sick'"):
        StatusBuilder().container_entries(pod, trainer, claims, sick)
    with pytest.raises(ValueError, match="message must be a string"):
        StatusBuilder().container_entries(pod, trainer, claims, no_message)
    with pytest.raises(ValueError, match="resource_id must be one of cdi, device, got 'uuid'"):
        StatusOptions(resource_id="uuid")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="health_status must be a bool"):
        StatusOptions(health_status="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="options must be StatusOptions"):
        StatusBuilder({"health_status": False})  # type: ignore[arg-type]
