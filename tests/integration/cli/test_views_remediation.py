"""``drahealth status`` and ``history`` show the remediation controller's state.

The scenario of :mod:`tests.integration.cli.test_views` (node-1, gpu-1 Unhealthy and used by
ml/train, gpu-2 Unknown, gpu-3 tainted by an operator, gpu-0 Healthy and used by ml/infer) on
the embedded API server, plus the ConfigMap ``drahealth-remediation-state`` the controller
writes, in the shapes it writes; the commands run as subprocesses.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap

from drahealth.controlplane import APIServer
from tests.integration.cli.test_views import NODE, D, run, scenario
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

GPU = [f"{D}/{NODE}/gpu-{i}" for i in range(4)]
T0 = "2026-11-22T10:00:00Z"

STATE: dict[str, Any] = {
    "breaker": {
        "tripped": [
            {
                "scope": "cluster", "group": "", "limit": "10%", "max": 8, "count": 8,
                "window": 3600, "since": T0, "resume": "manual",
            }
        ],
        "held": [
            {"device": GPU[2], "rule": "unknown-long", "effect": "NoSchedule", "since": T0,
             "reason": "Unknown: no report for 5m"}
        ],
        "admitted": [],
    },
    "needsHuman": {
        GPU[1]: {"since": T0, "why": "3 bad episodes within 24h", "rule": "xid-fatal",
                 "node": NODE}
    },
    "holds": {GPU[0]: {"until": "2099-01-01T00:00:00Z", "by": "alice", "reason": "debugging"}},
    "degraded": {GPU[3]: {"since": T0, "rule": "ecc-soft", "reason": "Unhealthy: ECC",
                          "node": NODE}},
    "burnIn": {GPU[3]: {"since": T0, "why": "after repair", "node": NODE}},
    "repairs": {GPU[1]: {"phase": "running", "attempt": 2, "kind": "job", "since": T0,
                         "detail": "job gpu-reset-gpu-1"}},
}  # fmt: skip


async def write_state(client: AsyncClient, data: dict[str, str]) -> None:
    await client.create(
        ConfigMap.from_dict(
            {
                "metadata": {
                    "name": "drahealth-remediation-state",
                    "namespace": "default",
                    "labels": {
                        "app.kubernetes.io/managed-by": "drahealth-controller",
                        "app.kubernetes.io/component": "remediation-state",
                    },
                },
                "data": data,
            }
        )
    )


@pytest.fixture
async def kubeconfig(server: APIServer, client: AsyncClient, tmp_path: Path) -> str:
    await scenario(client)
    return str(server.write_kubeconfig(tmp_path / "kubeconfig"))


def row_markers(stdout: str) -> dict[str, list[str]]:
    return {r["device"]: r["remediation"].get("markers", []) for r in json.loads(stdout)}


async def test_status_shows_the_remediation_block_and_markers(
    kubeconfig: str, client: AsyncClient
) -> None:
    await write_state(client, {k: json.dumps(v) for k, v in STATE.items()})
    table = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig)
    assert table.returncode == 3, table.stderr
    lines = [line.strip() for line in table.stdout.splitlines()]
    block = lines[lines.index("Remediation:") :]
    assert block[1].startswith(
        "PAUSED: cluster limit 10% = 8 devices reached (8 within 1h) at 2026-11-22T10:00:00Z ("
    )
    assert block[1].endswith("ago); 1 taint held; run `drahealth resume`")
    assert "held taints (1), not written:" in block
    assert any(
        line.startswith(f"NEEDS-HUMAN {GPU[1]} on {NODE} since 2026-11-22T10:00:00Z")
        and line.endswith(
            f": 3 bad episodes within 24h (rule xid-fatal); clear: drahealth clear {GPU[1]}"
        )
        for line in block
    ), block
    assert any(
        line.startswith(f"HELD {GPU[0]} until 2099-01-01T00:00:00Z (in ")
        and line.endswith("by alice: debugging")
        for line in block
    ), block
    assert any(line.startswith(f"DEGRADED {GPU[3]}") for line in block)
    assert any(line.startswith(f"BURN-IN {GPU[3]}") and "after repair" in line for line in block)
    assert any(
        line.startswith(f"REPAIRING {GPU[1]}: running, attempt 2, job, since") for line in block
    )
    # the marker column: gpu-0 is Healthy and untainted but held, so it gets a row
    header = next(line for line in lines if line.startswith("NODE")).split()
    assert header[-1] == "REMEDIATION"
    (gpu1,) = [line for line in lines if line.startswith(f"{NODE}   {GPU[1]}")]
    assert gpu1.endswith("NEEDS-HUMAN,REPAIRING")
    assert any(line.startswith(f"{NODE}   {GPU[0]}") and line.endswith("HELD") for line in lines)

    js = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig, "-o", "json")
    assert js.returncode == 3, js.stderr
    assert row_markers(js.stdout) == {
        GPU[0]: ["HELD"],
        GPU[1]: ["NEEDS-HUMAN", "REPAIRING"],
        GPU[2]: ["PAUSED"],
        GPU[3]: ["DEGRADED", "BURN-IN"],
    }
    rows = {r["device"]: r for r in json.loads(js.stdout)}
    assert rows[GPU[1]]["remediation"]["needsHuman"]["why"] == "3 bad episodes within 24h"
    assert rows[GPU[2]]["remediation"]["breakerHeld"][0]["rule"] == "unknown-long"
    assert "PAUSED: cluster limit 10%" in js.stderr  # the block goes to stderr with -o json


async def test_no_state_configmap_shows_nothing_and_a_closed_breaker_says_so(
    kubeconfig: str, client: AsyncClient
) -> None:
    out = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig)
    assert out.returncode == 3, out.stderr
    assert "Remediation:" not in out.stdout and "REMEDIATION" not in out.stdout
    assert "circuit breaker" not in out.stdout + out.stderr
    await write_state(client, {"breaker": json.dumps({"tripped": [], "held": []})})
    closed = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig)
    assert closed.stdout.splitlines()[-2:] == ["Remediation:", "  circuit breaker: closed"]
    assert "REMEDIATION" not in closed.stdout  # no device marked: no column


async def test_hostile_state_is_skipped_with_notes_and_output_stays_bounded(
    kubeconfig: str, client: AsyncClient
) -> None:
    many = {f"{D}/{NODE}/x-{i}": {"reason": "w" * (5000 if i < 3 else 10)} for i in range(1500)}
    held = [{"device": GPU[2], "reason": "\x1b[31mred\x1b]8;;http://x\x07"}] * 2000
    await write_state(
        client,
        {
            "needsHuman": "{not json",
            "holds": json.dumps(["not", "an", "object"]),
            "degraded": json.dumps(many),
            "breaker": json.dumps({"tripped": [{"limit": 5, "max": "x"}] * 3, "held": held}),
            "repairs": json.dumps({GPU[1]: {"phase": 3, "attempt": 1e999}}),
            "burnIn": "[" + " " * 300 * 1024 + "]",
        },
    )
    out = await asyncio.to_thread(run, "status", "-A", "--kubeconfig", kubeconfig)
    assert out.returncode == 3, out.stderr  # the view still works, exit code unchanged
    notes = [line for line in out.stderr.splitlines() if "drahealth-remediation-state" in line]
    assert notes[0].startswith(
        "note: configmap default/drahealth-remediation-state: needsHuman: not JSON ("
    )
    assert (
        "note: configmap default/drahealth-remediation-state: "
        "holds: expected an object of devices, got a list: skipped"
    ) in notes
    assert len(out.stdout.splitlines()) < 120, out.stdout
    assert len(out.stdout) < 120 * 1000
    assert (
        "note: configmap default/drahealth-remediation-state: burnIn: over 262144 bytes: skipped"
    ) in notes
    assert "... and 1980 more held taints (-o json lists them)" in out.stdout
    assert "... and 1480 more devices (-o json lists them)" in out.stdout
    assert "2000 taints held" in out.stdout
    assert max(len(line) for line in out.stdout.splitlines()) < 1000
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    # unknown devices (x-0...) are in the block, not the device table
    assert not any(line.startswith(f"{NODE}   {D}/{NODE}/x-") for line in out.stdout.splitlines())


async def test_history_shows_the_new_actions_in_words_and_the_devices_state(
    kubeconfig: str, client: AsyncClient
) -> None:
    def entry(minute: int, action: str, subject: str, message: str) -> dict[str, str]:
        return {
            "time": f"2026-11-22T10:{minute:02d}:00Z", "by": "ctl", "action": action,
            "subject": subject, "message": message,
        }  # fmt: skip

    history = [
        entry(1, "create", GPU[1], f"tainted {GPU[1]}: drahealth.io/unhealthy=xid:NoExecute"),
        entry(2, "repair-failed", GPU[1], f"repair of {GPU[1]} failed: exit 1"),
        entry(3, "needs-human", GPU[1], f"{GPU[1]}: 2 failed repairs"),
        entry(4, "breaker", "cluster", f"holding the taint of {GPU[1]}: cluster limit 10%"),
        entry(5, "hold", GPU[1], f"operator hold of {GPU[1]} until 2099-01-01T00:00:00Z"),
        entry(6, "burn-in", GPU[1], f"{GPU[1]} starts burn-in (after repair)"),
        entry(7, "needs-human", f"{GPU[1]}0", f"{GPU[1]}0: 3 bad episodes within 24h"),
    ]
    await client.create(
        ConfigMap.from_dict(
            {
                "metadata": {"name": "drahealth-remediation-history", "namespace": "default"},
                "data": {"history": json.dumps(history)},
            }
        )
    )
    await write_state(client, {"needsHuman": json.dumps({GPU[1]: STATE["needsHuman"][GPU[1]]})})
    out = await asyncio.to_thread(run, "history", "--kubeconfig", kubeconfig, GPU[1], "-o", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["what"], r["label"]) for r in rows] == [
        ("create", "tainted"),
        ("repair-failed", "repair (failed)"),
        ("needs-human", "needs a human"),
        ("breaker", "circuit breaker"),
        ("hold", "operator hold"),
        ("burn-in", "burn-in"),
    ]  # not the entry of gpu-10
    assert "now: NEEDS-HUMAN: needs a human since 2026-11-22T10:00:00Z (" in out.stderr
    assert f"clear with `drahealth clear {GPU[1]}`" in out.stderr
    table = await asyncio.to_thread(run, "history", "--kubeconfig", kubeconfig, GPU[1])
    assert "repair (failed)" in table.stdout and "needs a human" in table.stdout
    assert table.stdout.splitlines()[-1].startswith("now: NEEDS-HUMAN: needs a human since")
