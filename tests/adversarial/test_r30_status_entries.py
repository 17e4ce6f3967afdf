"""Attacks on kubelet mode's carrying of ``allocatedResourcesStatus`` entries others
wrote (``_keep_other_entries``): hostile shapes in the pod's current status, entries for
containers that do not exist, duplicates, many entries, init containers, and an entry
named like the resource of the pod's special claim for extended resources. The agent's
write must stay one the embedded API server accepts (a 422 would be retried forever and
no status of the pod would be written again)."""

from __future__ import annotations

import copy
from typing import Any
from unittest.mock import MagicMock

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

import drahealth.node._kubelet as kubelet_module
from drahealth.core import ClaimInfo, Health, PreparedDeviceInfo, StatusBuilder
from drahealth.kube import make_client, patch_status
from drahealth.node._kubelet import POD_STATUS_PATCH, KubeletMode, _keep_other_entries
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(20)

GPU = "example.com/gpu"
CS = {
    "image": "x", "imageID": "", "ready": True, "restartCount": 0,
    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}, "lastState": {},
}  # fmt: skip


def _spec(init: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": "n1",
        "containers": [
            {"name": "c", "image": "x",
             "resources": {"requests": {GPU: "1"}, "limits": {GPU: "1"}}},
            {"name": "d", "image": "x"},
        ],
    }  # fmt: skip
    if init:
        spec["initContainers"] = [
            {"name": "i", "image": "x", "resources": {"requests": {GPU: "1"}, "limits": {GPU: "1"}}}
        ]
    return spec


class _Run:
    def __init__(self, init: bool = False) -> None:
        self.init = init

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": "Running",
            "containerStatuses": [{"name": "c", **CS}, {"name": "d", **CS}],
        }
        if self.init:
            out["initContainerStatuses"] = [{"name": "i", **CS, "ready": False}]
        return out


def _entry(name: Any, rid: str = "dp-0", health: str = "Unhealthy") -> dict[str, Any]:
    return {"name": name, "resources": [{"resourceID": rid, "health": health}]}


# -- the pure function ---------------------------------------------------------------------


def test_hostile_shapes_in_the_current_status_are_dropped_not_raised_on() -> None:
    own = _Run(init=True).status()
    status: dict[str, Any] = {
        "containerStatuses": [
            {"name": "c", "allocatedResourcesStatus": [
                _entry(GPU), 5, None, "x", {"name": 7}, {"resources": []},
                _entry("claim:gone"), {"name": ["list"]},
            ]},
            {"name": "d", "allocatedResourcesStatus": "not a list"},
            {"name": 3, "allocatedResourcesStatus": [_entry(GPU)]},
            "garbage",
            {"name": "ghost", "allocatedResourcesStatus": [_entry("whatever/x")]},
        ],
        "initContainerStatuses": {"not": "a list"},
    }  # fmt: skip
    before = copy.deepcopy(status)
    _keep_other_entries(own, status)
    c, d = own["containerStatuses"]
    assert c["allocatedResourcesStatus"] == [_entry(GPU)]
    assert "allocatedResourcesStatus" not in d
    assert [cs["name"] for cs in own["containerStatuses"]] == ["c", "d"]  # no ghost added
    assert "allocatedResourcesStatus" not in own["initContainerStatuses"][0]
    assert status == before  # the informer's object is not touched


def test_init_container_entries_stay_with_the_init_container() -> None:
    own = _Run(init=True).status()
    status = {
        "containerStatuses": [{"name": "c", "allocatedResourcesStatus": [_entry(GPU, "a")]}],
        "initContainerStatuses": [
            {"name": "i", "allocatedResourcesStatus": [_entry(GPU, "b")]},
            # a main container's name in the init list: not carried anywhere
            {"name": "d", "allocatedResourcesStatus": [_entry(GPU, "z")]},
        ],
    }
    _keep_other_entries(own, status)
    assert own["containerStatuses"][0]["allocatedResourcesStatus"] == [_entry(GPU, "a")]
    assert "allocatedResourcesStatus" not in own["containerStatuses"][1]
    assert own["initContainerStatuses"][0]["allocatedResourcesStatus"] == [_entry(GPU, "b")]


# -- the agent's whole write ---------------------------------------------------------------


async def _agent_patch(
    pod: dict[str, Any], run: _Run, monkeypatch: pytest.MonkeyPatch, lookup: Any = None
) -> dict[str, Any] | None:
    """The status patch kubelet mode computes for ``pod`` (None: nothing to write)."""
    sent: list[dict[str, Any]] = []

    async def capture(_client: Any, _rt: Any, _name: str, patch: Any, **kw: Any) -> None:
        assert kw.get("patch_type") == POD_STATUS_PATCH
        sent.append(patch)

    monkeypatch.setattr(kubelet_module, "patch_status", capture)
    unused = make_client(server_url="http://127.0.0.1:9")  # never contacted
    try:
        tracker = MagicMock()
        tracker.lookup = lookup or (lambda _ns, _name: None)
        pipeline = MagicMock()
        pipeline.cache.get = lambda *_k: (Health.UNHEALTHY, "xid 79")
        mode = KubeletMode(
            unused, "n1", MagicMock(), tracker, pipeline, StatusBuilder(), MagicMock()
        )
        uid = pod["metadata"]["uid"]
        mode.pods._cache.apply("ADDED", Pod.from_dict(pod))
        mode._by_uid[uid] = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        mode.runs[uid] = run  # type: ignore[assignment]
        await mode._write_status(uid, 0.0)
    finally:
        await unused.close()
    assert len(sent) <= 1
    return sent[0] if sent else None


async def _pod_written_by_others(client: AsyncClient, status: dict[str, Any]) -> dict[str, Any]:
    body = {"metadata": {"name": "web-0", "namespace": "default"}, "spec": _spec(init=True)}
    await client.create(Pod.from_dict(body))
    written = await patch_status(
        client, Pod, "web-0", {"status": status}, namespace="default",
        patch_type=POD_STATUS_PATCH,
    )  # fmt: skip
    return written.to_dict()


async def test_the_carried_entries_make_a_write_the_server_accepts(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Duplicated names, 2,000 entries, a container the spec does not have, an init
    container's entry: what the server stored, the agent's write (carrying it) is
    accepted again, and a second computation has nothing left to write."""
    many = [_entry(GPU, f"dp-{i}") for i in range(2000)]
    pod = await _pod_written_by_others(
        client,
        {
            "phase": "Running",
            "containerStatuses": [
                {"name": "c", **CS, "allocatedResourcesStatus": [_entry(GPU), *many]},
                {"name": "ghost", **CS, "allocatedResourcesStatus": [_entry("any/name")]},
            ],
            "initContainerStatuses": [
                {"name": "i", **CS, "allocatedResourcesStatus": [_entry(GPU, "init-0")]}
            ],
        },
    )
    patch = await _agent_patch(pod, _Run(init=True), monkeypatch)
    assert patch is not None
    written = (
        await patch_status(
            client, Pod, "web-0", patch, namespace="default", patch_type=POD_STATUS_PATCH
        )
    ).to_dict()
    statuses = {cs["name"]: cs for cs in written["status"]["containerStatuses"]}
    assert set(statuses) == {"c", "d"}
    assert len(statuses["c"]["allocatedResourcesStatus"]) == 2001
    init = written["status"]["initContainerStatuses"][0]
    assert init["allocatedResourcesStatus"] == [_entry(GPU, "init-0")]
    assert await _agent_patch(written, _Run(init=True), monkeypatch) is None  # settled


async def test_a_stale_entry_of_the_special_claims_resource_is_recomputed_not_carried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry named like the resource the scheduler's special claim serves is the
    agent's own: it is dropped and recomputed (here: the claim is no longer prepared,
    so it goes) instead of being carried as a device plugin's; a device plugin's entry
    of another resource beside it stays."""
    other = "example.com/nic"
    spec = _spec()
    spec["containers"][0]["resources"]["requests"][other] = "1"
    pod = {
        "metadata": {"name": "web-0", "namespace": "default", "uid": "u-1"},
        "spec": spec,
        "status": {
            "phase": "Running",
            "extendedResourceClaimStatus": {
                "resourceClaimName": "web-0-extended-resources-abc",
                "requestMappings": [
                    {"containerName": "c", "resourceName": GPU, "requestName": "container-0-r0"}
                ],
            },
            "containerStatuses": [
                {"name": "c", **CS,
                 "allocatedResourcesStatus": [_entry(GPU, "old"), _entry(other, "nic-0")]},
                {"name": "d", **CS},
            ],
        },
    }  # fmt: skip
    patch = await _agent_patch(pod, _Run(), monkeypatch)
    assert patch is not None
    c = patch["status"]["containerStatuses"][0]
    assert c["allocatedResourcesStatus"] == [_entry(other, "nic-0")]

    # prepared again: recomputed from the claim, once, after the carried entry
    info = ClaimInfo(
        uid="claim-uid", namespace="default", name="web-0-extended-resources-abc",
        devices=(PreparedDeviceInfo(driver="gpu.example.com", pool="n1", device="gpu-0",
                                    request_names=("container-0-r0",)),),
    )  # fmt: skip

    def lookup(_ns: str, name: str) -> ClaimInfo | None:
        return info if name == info.name else None

    patch = await _agent_patch(pod, _Run(), monkeypatch, lookup)
    assert patch is not None
    names = [e["name"] for e in patch["status"]["containerStatuses"][0]["allocatedResourcesStatus"]]
    assert names == [other, GPU]
