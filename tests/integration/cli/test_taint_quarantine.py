"""``drahealth taint`` / ``untaint`` as subprocesses where no DeviceTaintRule API is
served (the embedded API server at 1.35 with its defaults): the device is fenced by the
operator's quarantine claim in the controller's namespace (found from its ConfigMaps),
pending while another claim holds the device; ``untaint`` deallocates, then deletes, the
operator's and the controller's claims; ``--hold`` works; ``NoExecute`` and a foreign
claim with the quarantine claim's name are refused in one line. At 1.37 the commands
still write DeviceTaintRules and no claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Namespace
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceSlice
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.core import DeviceKey, kube_profile
from drahealth.kube import make_client, resource_class
from drahealth.remedy import CONTROL_CONFIGMAP, HISTORY_CONFIGMAP
from drahealth.remedy._nodes import NodeDevice
from drahealth.remedy._quarantine import ANNOTATION_QUARANTINE, allocation, claim_body, claim_name
from tests._support import eventually
from tests.integration.cli.test_views import BIN

pytestmark = pytest.mark.timeout(90)

ResourceClaim = resource_class("ResourceClaim", "v1")
DRIVER, NODE, NS = "gpu.example.com", "node-1", "drahealth"
KEY = "ops.example.com/maint"


def dev(n: int) -> str:
    return f"{DRIVER}/{NODE}/gpu-{n}"


def key(n: int) -> DeviceKey:
    return DeviceKey(DRIVER, NODE, f"gpu-{n}")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), *args], capture_output=True, text=True, timeout=60, check=False
    )


async def cli(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    command, *rest = args
    return await asyncio.to_thread(run, command, "--kubeconfig", kubeconfig, *rest)


@contextlib.asynccontextmanager
async def cluster(version: str, tmp_path: Path) -> AsyncIterator[tuple[AsyncClient, str]]:
    """A server of the release with node-1's slice (gpu-0..gpu-3), the controller's
    namespace (its history ConfigMap there, so the CLI finds it) and ml; a kubeconfig."""
    server = APIServer(data_file=None, profile=kube_profile(version, {}))
    await server.start(host="127.0.0.1", port=0)
    client = make_client(server_url=server.url, timeout=5.0)
    try:
        for ns in (NS, "ml"):
            await client.create(Namespace.from_dict({"metadata": {"name": ns}}))
        await client.create(
            ConfigMap.from_dict({"metadata": {"name": HISTORY_CONFIGMAP, "namespace": NS}})
        )
        await client.create(
            ResourceSlice.from_dict(
                {
                    "metadata": {"name": "node-1-gpu"},
                    "spec": {
                        "driver": DRIVER,
                        "nodeName": NODE,
                        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": f"gpu-{i}"} for i in range(4)],
                    },
                }
            )
        )
        yield client, str(server.write_kubeconfig(tmp_path / "kubeconfig"))
    finally:
        await client.close()
        await server.stop()


async def claim(client: AsyncClient, name: str, namespace: str = NS) -> dict[str, Any] | None:
    try:
        out = (await client.get(ResourceClaim, name, namespace=namespace)).to_dict()
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise
    assert isinstance(out, dict)
    return out


async def claims(client: AsyncClient) -> set[str]:
    return {
        f"{c.metadata.namespace}/{c.metadata.name}"
        async for c in client.list(ResourceClaim, namespace="*")
        if c.metadata is not None
    }


def allocated_to(obj: dict[str, Any] | None) -> list[str]:
    alloc = ((obj or {}).get("status") or {}).get("allocation") or {}
    return [r["device"] for r in (alloc.get("devices") or {}).get("results") or []]


async def hold(client: AsyncClient, name: str, device: str, namespace: str = "ml") -> None:
    """A workload's claim allocated to ``device`` (what the scheduler would write)."""
    body = {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
    }
    await client.create(ResourceClaim.from_dict(body))
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    await client.patch(
        ResourceClaim.Status, name, {"status": {"allocation": {"devices": {"results": [result]}}}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip


async def controller_claim(client: AsyncClient, n: int, effect: str = "NoSchedule") -> str:
    """The remediation controller's allocated quarantine claim of gpu-n with KEY."""
    row = NodeDevice(key(n), "quarantine", KEY, "xid", effect, "xid", by="c1")
    made = (await client.create(ResourceClaim.from_dict(claim_body(row, NS)))).to_dict()
    name = claim_name(key(n))
    await client.patch(
        ResourceClaim.Status, name, {"status": allocation(key(n), made["metadata"]["uid"])},
        namespace=NS, patch_type=PatchType.MERGE,
    )  # fmt: skip
    return name


def one_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


async def test_taint_fences_a_free_device_and_reruns_are_unchanged_or_updated(
    tmp_path: Path,
) -> None:
    name = claim_name(key(0), operator=True)
    args = ("taint", dev(0), "--key", KEY, "--value", "rma", "--effect", "NoSchedule")
    async with cluster("1.35", tmp_path) as (client, kubeconfig):
        first = await cli(kubeconfig, *args)
        assert first.returncode == 0, first.stderr
        assert (
            first.stdout == f"resourceclaim/{name} created (namespace {NS}): {dev(0)} quarantined\n"
        )
        assert "serves no DeviceTaintRule API: the taint is a quarantine claim" in first.stderr
        obj = await claim(client, name)
        assert allocated_to(obj) == ["gpu-0"]
        assert obj is not None and obj["status"]["reservedFor"][0]["uid"] == obj["metadata"]["uid"]
        again = await cli(kubeconfig, *args)
        assert again.stdout.startswith(f"resourceclaim/{name} unchanged (namespace {NS})")
        other = await cli(kubeconfig, *args[:-4], "--value", "bad-fan", "--effect", "NoSchedule")
        assert other.stdout.startswith(f"resourceclaim/{name} updated (namespace {NS})")
        row = json.loads(
            (await claim(client, name) or {})["metadata"]["annotations"][ANNOTATION_QUARANTINE]
        )
        assert (row["key"], row["value"], row["rule"], row["by"]) == (
            KEY,
            "bad-fan",
            "operator",
            "operator",
        )
        # -n names the namespace; nothing is written in the found one then
        elsewhere = await cli(kubeconfig, "taint", "-n", "ml", *args[1:])
        assert elsewhere.returncode == 0 and "(namespace ml)" in elsewhere.stdout
        assert f"ml/{name}" in await claims(client)


async def test_taint_of_a_held_device_is_pending_and_names_the_holder(tmp_path: Path) -> None:
    name = claim_name(key(1), operator=True)
    async with cluster("1.35", tmp_path) as (client, kubeconfig):
        await hold(client, "train-gpu", "gpu-1")
        out = await cli(kubeconfig, "taint", dev(1), "--key", KEY, "--effect", "NoSchedule")
        assert out.returncode == 0, out.stderr
        assert out.stdout == (
            f"resourceclaim/{name} pending (namespace {NS}): takes effect when ml/train-gpu "
            "lets go of the device\n"
        )
        assert allocated_to(await claim(client, name)) == []
        assert allocated_to(await claim(client, "train-gpu", "ml")) == ["gpu-1"]  # untouched


@pytest.mark.slow  # the same refusals run unit-level in test_operator_quarantine
async def test_noexecute_and_a_foreign_claim_are_one_line_errors(tmp_path: Path) -> None:
    name = claim_name(key(2), operator=True)
    async with cluster("1.35", tmp_path) as (client, kubeconfig):
        before = await claims(client)
        refused = await cli(kubeconfig, "taint", dev(2), "--key", KEY, "--effect", "NoExecute")
        line = one_error(refused)
        assert "no device taint eviction" in line and "kubectl drain" in line
        assert await claims(client) == before
        foreign = {
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}
            },
        }
        await client.create(ResourceClaim.from_dict(foreign))
        taken = await cli(kubeconfig, "taint", dev(2), "--key", KEY, "--effect", "NoSchedule")
        assert f"resourceclaim {NS}/{name} exists but is not" in one_error(taken)
        assert allocated_to(await claim(client, name)) == []
        gone = await cli(kubeconfig, "untaint", dev(2), "--key", KEY)
        assert "no drahealth quarantine claim in namespace drahealth fences" in one_error(gone)
        assert await claim(client, name) is not None
        # a typo'd device: refused as on every release
        typo = await cli(
            kubeconfig, "taint", f"{DRIVER}/{NODE}/gpu-9", "--key", KEY, "--effect", "NoSchedule"
        )
        assert "no ResourceSlice publishes" in one_error(typo)
        bad = await cli(kubeconfig, "taint", "gpu-0", "--key", KEY, "--effect", "NoSchedule")
        assert bad.returncode == 2 and "must be DRIVER/POOL/DEVICE" in bad.stderr


async def watch_claims(
    client: AsyncClient, seen: list[tuple[str, str, bool]], ready: asyncio.Event
) -> None:
    """(event, claim name, whether it is allocated) for every claim event in NS."""
    existing = {
        c.metadata.name async for c in client.list(ResourceClaim, namespace=NS) if c.metadata
    }
    async for event, obj in client.watch(ResourceClaim, namespace=NS):
        seen.append((event, str(obj.metadata.name), bool(obj.status and obj.status.allocation)))
        if existing <= {n for _, n, _ in seen}:
            ready.set()


async def test_untaint_deallocates_then_deletes_the_operator_and_controller_claims(
    tmp_path: Path,
) -> None:
    ours, controllers = claim_name(key(0), operator=True), claim_name(key(0))
    async with cluster("1.35", tmp_path) as (client, kubeconfig):
        tainted = await cli(kubeconfig, "taint", dev(0), "--key", KEY, "--effect", "NoSchedule")
        assert tainted.returncode == 0, tainted.stderr
        await controller_claim(client, 0)
        seen: list[tuple[str, str, bool]] = []
        ready = asyncio.Event()
        watcher = asyncio.create_task(watch_claims(client, seen, ready))
        try:
            async with asyncio.timeout(10):
                await ready.wait()
            seen.clear()
            out = await cli(kubeconfig, "untaint", dev(0), "--key", KEY)

            def both_deleted() -> bool:
                return {n for e, n, _ in seen if e == "DELETED"} == {ours, controllers}

            await eventually(both_deleted, 10.0, "both claims deleted")
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        assert out.returncode == 0, out.stderr
        assert out.stdout == (
            f"resourceclaim/{ours} deleted (namespace {NS})\n"
            f"resourceclaim/{controllers} deleted (namespace {NS})\n"
        )
        assert f"the remediation controller made {controllers}" in out.stderr
        assert "--hold DURATION keeps it off" in out.stderr
        for name in (ours, controllers):
            mine = [(e, a) for e, n, a in seen if n == name]
            assert mine == [("MODIFIED", False), ("DELETED", False)], seen


async def test_untaint_hold_works_without_the_rule_api(tmp_path: Path) -> None:
    ours, controllers = claim_name(key(3), operator=True), claim_name(key(3))
    async with cluster("1.35", tmp_path) as (client, kubeconfig):
        await controller_claim(client, 3, "NoExecute")
        await cli(kubeconfig, "taint", dev(3), "--key", KEY, "--effect", "NoSchedule")
        held = await cli(kubeconfig, "untaint", dev(3), "--key", KEY, "--hold", "30m", "--by", "me")
        assert held.returncode == 0, held.stderr
        lines = held.stdout.splitlines()
        assert lines[:2] == [
            f"resourceclaim/{ours} deleted (namespace {NS})",
            f"resourceclaim/{controllers} deleted (namespace {NS})",
        ]
        assert re.fullmatch(
            rf"{dev(3)}: held by me until about \S+: the controller does not taint it", lines[2]
        )
        assert len(lines) == 3
        cm = await client.get(ConfigMap, CONTROL_CONFIGMAP, namespace=NS)
        holds = json.loads((cm.data or {})["holds"])
        assert holds[dev(3)]["by"] == "me"
        assert await claim(client, ours) is None and await claim(client, controllers) is None
        # nothing left: the hold alone is still written, exit 0
        again = await cli(kubeconfig, "untaint", dev(3), "--key", KEY, "--hold", "1h")
        assert again.returncode == 0, again.stderr
        assert "no drahealth quarantine claim of" in again.stdout
        released = await cli(kubeconfig, "untaint", dev(3), "--release")
        assert released.returncode == 0 and "hold ended" in released.stdout


@pytest.mark.slow  # the same refusals run unit-level in test_operator_quarantine
async def test_untaint_leaves_claims_that_are_not_this_devices(tmp_path: Path) -> None:
    """A claim with the operator's label and gpu-0's operator claim name whose
    annotation names gpu-1 (forged), and another key's claim: both stay."""
    async with cluster("1.35", tmp_path) as (client, kubeconfig):
        row = NodeDevice(key(1), "quarantine", KEY, "", "NoSchedule", "operator")
        body = claim_body(row, NS, operator=True)
        body["metadata"]["name"] = claim_name(key(0), operator=True)
        await client.create(ResourceClaim.from_dict(body))
        other = await cli(
            kubeconfig, "taint", dev(2), "--key", "other.example.com/k", "--effect", "NoSchedule"
        )
        assert other.returncode == 0, other.stderr
        before = await claims(client)
        for device in (dev(0), dev(1), dev(2)):
            out = await cli(kubeconfig, "untaint", device, "--key", KEY)
            assert out.returncode == 1 and "no drahealth quarantine claim" in out.stderr
        assert await claims(client) == before


async def test_1_37_still_writes_device_taint_rules_and_no_claim(tmp_path: Path) -> None:
    async with cluster("1.37", tmp_path) as (client, kubeconfig):
        out = await cli(kubeconfig, "taint", dev(0), "--key", KEY, "--effect", "NoExecute")
        assert out.returncode == 0, out.stderr
        found = re.fullmatch(r"devicetaintrule/(\S+) created\n", out.stdout)
        assert found and out.stderr == ""
        rules = [r.metadata.name async for r in client.list(DeviceTaintRule) if r.metadata]
        assert rules == [found.group(1)]
        assert await claims(client) == set()
        gone = await cli(kubeconfig, "untaint", dev(0), "--key", KEY)
        assert gone.stdout == f"devicetaintrule/{found.group(1)} deleted\n"


async def test_untaint_hold_keeps_the_running_controller_from_fencing_again(
    tmp_path: Path,
) -> None:
    """The controller (mode quarantine, namespace default) fences bad gpu-0; a plain
    untaint of its claim is fenced again at once, ``untaint --hold`` keeps it off."""
    from tests.integration.remedy.test_controller import set_health
    from tests.integration.remedy.test_modes import RULES, make_node, running

    name = claim_name(key(0))
    async with cluster("1.35", tmp_path) as (client, kubeconfig):
        await make_node(client)
        await set_health(client, gpu_0="Healthy")
        async with running(client, RULES) as controller:
            assert controller.choice is not None and controller.choice.mode == "quarantine"
            await set_health(client, gpu_0=("Unhealthy", "XID 79"))

            async def fenced() -> bool:
                return allocated_to(await claim(client, name, "default")) == ["gpu-0"]

            await eventually(fenced, 10.0, "the controller's quarantine claim")
            args = ("untaint", "-n", "default", dev(0), "--key", "drahealth.io/unhealthy")
            plain = await cli(kubeconfig, *args)
            assert plain.stdout == f"resourceclaim/{name} deleted (namespace default)\n"
            await eventually(fenced, 10.0, "the claim fenced again after a plain untaint")
            held = await cli(kubeconfig, *args, "--hold", "30m")
            assert held.returncode == 0, held.stderr
            await asyncio.sleep(1.0)
            assert await claim(client, name, "default") is None
