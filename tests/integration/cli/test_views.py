"""``drahealth status / pods / history / stream`` as subprocesses against a known scenario.

The scenario, written straight into the embedded API server: node-1 with gpu-0..gpu-3;
the agent's record says gpu-1 Unhealthy ("XID 79") and gpu-2 Unknown; gpu-3 is Healthy
but an operator tainted it; pod ml/train uses gpu-1, pod ml/infer uses gpu-0.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Pod
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.core import Health, parse_time
from drahealth.driver._hub import DeviceReport, HealthHub
from drahealth.remedy._rules import DeviceRef, rule_body
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

BIN = Path(sys.executable).with_name("drahealth")
D, NODE = "gpu.example.com", "node-1"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), *args], capture_output=True, text=True, timeout=60, check=False
    )


async def scenario(client: AsyncClient) -> None:
    now = time.time()
    await client.create(Namespace.from_dict({"metadata": {"name": "ml"}}))
    await client.create(
        ResourceSlice.from_dict(
            {
                "metadata": {"name": f"{NODE}-{D}"},
                "spec": {
                    "driver": D,
                    "nodeName": NODE,
                    "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": f"gpu-{i}"} for i in range(4)],
                },
            }
        )
    )
    rows = [
        {
            "driver": D,
            "pool": NODE,
            "device": "gpu-0",
            "health": "Healthy",
            "message": "",
            "since": now - 600,
        },
        {
            "driver": D,
            "pool": NODE,
            "device": "gpu-1",
            "health": "Unhealthy",
            "message": "XID 79",
            "since": now - 125,
        },
        {
            "driver": D,
            "pool": NODE,
            "device": "gpu-2",
            "health": "Unknown",
            "message": "",
            "since": now - 90,
        },
        {
            "driver": D,
            "pool": NODE,
            "device": "gpu-3",
            "health": "Healthy",
            "message": "",
            "since": now - 7200,
        },
    ]
    await client.create(
        ConfigMap.from_dict(
            {
                "metadata": {
                    "name": f"drahealth-devices-{NODE}",
                    "namespace": "default",
                    "labels": {
                        "app.kubernetes.io/component": "device-health",
                        "app.kubernetes.io/managed-by": "drahealth-agent",
                        "drahealth.io/node": NODE,
                    },
                },
                "data": {"devices": json.dumps(rows)},
            }
        )
    )
    rule = rule_body(
        DeviceRef(D, NODE, "gpu-3"),
        key="ops.example.com/rma",
        value="",
        effect="NoSchedule",
        by="operator",
    )
    await client.create(DeviceTaintRule.from_dict(rule))  # type: ignore[call-overload]
    for pod, device in (("train", "gpu-1"), ("infer", "gpu-0")):
        await client.create(
            ResourceClaim.from_dict(
                {
                    "metadata": {"name": f"{pod}-gpu", "namespace": "ml"},
                    "spec": {
                        "devices": {
                            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]
                        }
                    },
                }
            )
        )
        result = {"request": "gpu", "driver": D, "pool": NODE, "device": device}
        await client.patch(
            ResourceClaim.Status,
            f"{pod}-gpu",
            {"status": {"allocation": {"devices": {"results": [result]}}}},
            namespace="ml",
            patch_type=PatchType.MERGE,
        )
        await client.create(
            Pod.from_dict(
                {
                    "metadata": {"name": pod, "namespace": "ml"},
                    "spec": {
                        "nodeName": NODE,
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{pod}-gpu"}],
                        "containers": [
                            {
                                "name": "main",
                                "image": "x",
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                    },
                }
            )
        )
        health, message = ("Unhealthy", "XID 79") if device == "gpu-1" else ("Healthy", "")
        res = {
            "resourceID": f"{D}/{NODE}/{device}",
            "health": health,
            **({"message": message} if message else {}),
        }
        status = {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "image": "x",
                    "imageID": "",
                    "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [res]}],
                }
            ],
        }
        await client.patch(
            Pod.Status, pod, {"status": status}, namespace="ml", patch_type=PatchType.MERGE
        )


@pytest.fixture
async def kubeconfig(server: APIServer, client: AsyncClient, tmp_path: Path) -> str:
    await scenario(client)
    return str(server.write_kubeconfig(tmp_path / "kubeconfig"))


async def test_status_json_lists_bad_and_tainted_devices_and_exits_3(kubeconfig: str) -> None:
    out = await asyncio.to_thread(run, "status", "--kubeconfig", kubeconfig, "-o", "json", "-A")
    assert out.returncode == 3, out.stderr
    rows = json.loads(out.stdout)
    brief = [
        (r["device"], r["health"], r["message"], [c["pod"] for c in r["consumers"]]) for r in rows
    ]
    assert brief == [
        (f"{D}/{NODE}/gpu-1", "Unhealthy", "XID 79", ["train"]),
        (f"{D}/{NODE}/gpu-2", "Unknown", "", []),
        (f"{D}/{NODE}/gpu-3", "Healthy", "", []),
    ]
    # machine output: RFC 3339 times, no ages
    assert all("age" not in r for r in rows)
    since = [parse_time(r["since"]) for r in rows]
    assert [round(time.time() - s) // 60 for s in since if s is not None] == [2, 1, 120]
    assert all(r["since"].endswith("Z") for r in rows)
    (taint,) = rows[2]["taints"]
    assert (taint["key"], taint["effect"]) == ("ops.example.com/rma", "NoSchedule")
    assert taint["source"].startswith("devicetaintrule/dh-gpu-3-node-1-")
    assert all(r["node"] == NODE for r in rows)
    table = await asyncio.to_thread(run, "status", "--kubeconfig", kubeconfig, "-o", "wide", "-A")
    assert "XID 79" in table.stdout and "ml/train (claim train-gpu)" in table.stdout
    # kubectl ages in tables (2m05s and more: 2m5s .. 2m9s), no leading spaces
    lines = table.stdout.splitlines()
    assert lines[2].startswith("NODE ") and all(not line.startswith(" ") for line in lines)
    assert re.search(r"gpu-1 +Unhealthy +2m\d+s ", table.stdout), table.stdout
    yml = await asyncio.to_thread(run, "status", "--kubeconfig", kubeconfig, "-o", "yaml")
    assert "device: gpu.example.com/node-1/gpu-1" in yml.stdout


async def test_status_exits_0_when_no_bad_device_is_in_use(
    kubeconfig: str, client: AsyncClient
) -> None:
    await client.delete(Pod, "train", namespace="ml")
    out = await asyncio.to_thread(run, "status", "--kubeconfig", kubeconfig, "-o", "json", "-A")
    assert out.returncode == 0, out.stderr
    assert [r["consumers"] for r in json.loads(out.stdout)] == [[], [], []]


async def test_pods_shows_each_pods_devices(kubeconfig: str) -> None:
    out = await asyncio.to_thread(run, "pods", "--kubeconfig", kubeconfig, "-o", "json", "-n", "ml")
    assert out.returncode == 3, out.stderr  # ml/train's device is Unhealthy
    assert [(r["pod"], r["device"], r["health"], r["message"]) for r in json.loads(out.stdout)] == [
        ("infer", f"{D}/{NODE}/gpu-0", "Healthy", ""),
        ("train", f"{D}/{NODE}/gpu-1", "Unhealthy", "XID 79"),
    ]
    table = await asyncio.to_thread(run, "pods", "--kubeconfig", kubeconfig, "-A")
    assert "train" in table.stdout and "Unhealthy" in table.stdout
    default = await asyncio.to_thread(run, "pods", "--kubeconfig", kubeconfig)
    assert default.returncode == 0 and default.stdout == ""
    assert default.stderr.strip() == "No pods using DRA devices found in default namespace."


async def test_history_merges_controller_actions_and_events(
    kubeconfig: str, client: AsyncClient
) -> None:
    history = [
        {
            "time": "2026-11-22T10:00:00Z",
            "by": "ctl-a",
            "action": "create",
            "subject": f"{D}/{NODE}/gpu-1",
            "message": f"tainted {D}/{NODE}/gpu-1: drahealth.io/unhealthy=xid:NoExecute",
        }
    ]
    await client.create(
        ConfigMap.from_dict(
            {
                "metadata": {"name": "drahealth-remediation-history", "namespace": "default"},
                "data": {"history": json.dumps(history)},
            }
        )
    )
    await client.create(
        Event.from_dict(
            {
                "metadata": {"name": "train.1", "namespace": "ml"},
                "reason": "DeviceUnhealthy",
                "message": f"device {D}/{NODE}/gpu-1 is Unhealthy: XID 79",
                "type": "Warning",
                "involvedObject": {"kind": "Pod", "name": "train", "namespace": "ml"},
                "lastTimestamp": "2026-11-22T09:59:59Z",
                "source": {"component": "drahealth-agent"},
                "reportingComponent": "drahealth-agent",
                "reportingInstance": NODE,
            }
        )
    )
    out = await asyncio.to_thread(
        run, "history", "--kubeconfig", kubeconfig, f"{D}/{NODE}/gpu-1", "-o", "json"
    )
    assert out.returncode == 0, out.stderr
    assert [(r["what"], r["source"]) for r in json.loads(out.stdout)] == [
        ("DeviceUnhealthy", "pod ml/train (Event in ml)"),  # a claim by its namespace
        ("create", "controller ctl-a"),
    ]
    bad = await asyncio.to_thread(run, "history", "--kubeconfig", kubeconfig, "gpu-1")
    assert bad.returncode == 2 and "must be DRIVER/POOL/DEVICE" in bad.stderr


async def test_watch_prints_a_drivers_health_stream(tmp_path: Path) -> None:
    import tempfile

    sock = tempfile.mkdtemp(dir="/tmp", prefix="dhw-") + "/dra.sock"
    hub = HealthHub([(NODE, "gpu-0"), (NODE, "gpu-1")], default_timeout_seconds=20)
    hub.submit("probe", [DeviceReport(NODE, "gpu-1", Health.UNHEALTHY, "XID 79")])
    server = grpc.aio.server()
    hub.add_to_server(server)
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    try:
        out = await asyncio.to_thread(run, "stream", sock, "--once", "-o", "json")
        assert out.returncode == 0, out.stderr
        message = json.loads(out.stdout)
        assert message["service"] == "v1.DRAResourceHealth"
        assert [(d["device"], d["health"], d["message"]) for d in message["devices"]] == [
            ("gpu-0", "Unknown", ""),
            ("gpu-1", "Unhealthy", "XID 79"),
        ]
        table = await asyncio.to_thread(run, "stream", sock, "--once")
        assert "gpu-1" in table.stdout and "Unhealthy" in table.stdout
        old = await asyncio.to_thread(run, "watch", sock, "--once")
        assert old.returncode == 0 and "gpu-1" in old.stdout
        assert "'drahealth watch' is deprecated; use 'drahealth stream'" in old.stderr
    finally:
        await server.stop(0)
    gone = await asyncio.to_thread(run, "stream", sock, "--once")
    assert gone.returncode == 1 and "UNAVAILABLE" in gone.stderr
    assert len(gone.stderr.strip().splitlines()) == 1 and "Traceback" not in gone.stderr
