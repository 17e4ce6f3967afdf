"""Conformance: a device plugin's ``allocatedResourcesStatus`` entry stays beside the
claims' entries.

Upstream's kubelet fills a container's ``allocatedResourcesStatus`` from both managers:
the device manager's entry is named by the extended resource (``example.com/gpu``), the
DRA manager's by ``claim:<name>``; writing one never drops the other. The agent in
kubelet mode computes only the claim entries, so an entry written by someone else under
a resource name must survive every status write the agent makes.
"""

from __future__ import annotations

from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from drahealth.core import Health
from drahealth.driver import DeviceReport, HealthHub
from drahealth.kube import patch_status
from tests._support import eventually
from tests.conformance.test_kubelet_lifecycle import DEVICES, kubelet, make_pod, phase

pytestmark = pytest.mark.timeout(60)

PLUGIN_ENTRY = {
    "name": "example.com/gpu",
    "resources": [{"resourceID": "plugin-gpu-7", "health": "Healthy"}],
}


def _entries(status: dict[str, Any]) -> dict[str, Any]:
    cs = (status.get("containerStatuses") or [{}])[0]
    return {e["name"]: e for e in cs.get("allocatedResourcesStatus") or []}


async def test_a_device_plugin_entry_survives_the_claim_entries_being_written(
    sockdir: str,
) -> None:
    hub = HealthHub(DEVICES, default_timeout_seconds=30)
    async with kubelet(sockdir, hub) as (_server, client, _agent):
        limits = {"example.com/gpu": "1"}
        script = "trap 'exit 0' TERM; sleep 9999 & wait"
        await make_pod(
            client, "mixed",
            {"name": "c", "command": ["bash", "-c"], "args": [script],
             "resources": {"claims": [{"name": "gpu"}], "requests": limits, "limits": limits}},
        )  # fmt: skip

        async def running() -> bool:
            status = await phase(client, "mixed")
            return status.get("phase") == "Running" and "claim:gpu" in _entries(status)

        await eventually(running, 15, "pod mixed Running with its claim entry")
        status = await phase(client, "mixed")
        cs = status["containerStatuses"][0]
        cs["allocatedResourcesStatus"] = [PLUGIN_ENTRY, *cs["allocatedResourcesStatus"]]
        await patch_status(
            client, Pod, "mixed", {"status": {"containerStatuses": [cs]}},
            namespace="default", patch_type=PatchType.STRATEGIC,
        )  # fmt: skip
        assert "example.com/gpu" in _entries(await phase(client, "mixed"))

        # a health change makes the agent write the claim entry again
        hub.submit(
            "sim", [DeviceReport(p, d, Health.UNHEALTHY if d == "gpu-0" else Health.HEALTHY)
                    for p, d in DEVICES],
        )  # fmt: skip

        async def unhealthy() -> bool:
            entry = _entries(await phase(client, "mixed")).get("claim:gpu") or {}
            return any(r.get("health") == "Unhealthy" for r in entry.get("resources") or [])

        await eventually(unhealthy, 15, "the claim entry Unhealthy")
        entries = _entries(await phase(client, "mixed"))
        assert entries.get("example.com/gpu") == PLUGIN_ENTRY, entries
        names = [
            e["name"]
            for e in (await phase(client, "mixed"))["containerStatuses"][0][
                "allocatedResourcesStatus"
            ]
        ]
        assert names == ["example.com/gpu", "claim:gpu"]  # the plugin's stays in front
