"""The runnable examples run: each exits 0 and does what its docstring promises.

``examples/custom_driver.py`` runs as its docstring shows (a real subprocess against
the embedded API server, fault files, ``drahealth inject``, SIGTERM); the quickstart
runs it too, under the node agent.
"""

from __future__ import annotations

import ast
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from drahealth import api
from drahealth.controlplane import APIServer
from drahealth.kube import make_client
from tests.integration.driver.test_sample_driver import UNHEALTHY, Watch, devices_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(120)

FPGA = "fpga.example.com"
NODE = "node-1"
HEALTHY = api.health_v1.HealthStatus.Value("HEALTHY")


def _docstring_commands(path: str) -> list[str]:
    """The indented command lines of an example's docstring (comments stripped)."""
    with open(path) as f:
        text = f.read()
    doc = text.split('"""', 2)[1]
    return [
        line.split("  #", 1)[0].strip()
        for line in doc.splitlines()
        if line.startswith("    ") and line.strip()
    ]


async def _eventually(check: Callable[[], Any], timeout: float = 20.0) -> Any:  # noqa: ASYNC109
    """Poll ``check`` (sync or async) until it returns something truthy."""
    async with asyncio.timeout(timeout):
        while True:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(0.1)


async def _slice_taints(client: AsyncClient) -> dict[str, list[tuple[str, str, str]]] | None:
    """``{device: [(key, value, effect)]}`` of the driver's one published slice."""
    slices = [s async for s in client.list(ResourceSlice) if s.spec.driver == FPGA]
    if len(slices) != 1:
        return None
    return {
        d.name: [(t.key, t.value or "", t.effect) for t in d.taints or []]
        for d in slices[0].spec.devices or []
    }


async def _inject(base: str, device: str, action: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "drahealth", "inject", "--state-dir", f"{base}/state",
        device, action, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, out.decode()
    return out.decode().strip()


@pytest.fixture
async def apiserver() -> AsyncIterator[APIServer]:
    server = APIServer()
    await server.start(port=0)
    try:
        yield server
    finally:
        await server.stop()


async def _allocated_claim(client: AsyncClient, card: str) -> str:
    claim = {
        "metadata": {"name": "accel", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {"deviceClassName": "f"}}]}},
    }
    created = await client.create(ResourceClaim.from_dict(claim))
    result = {"request": "fpga", "driver": FPGA, "pool": NODE, "device": card}
    await client.patch(
        ResourceClaim.Status,
        "accel",
        {"status": {"allocation": {"devices": {"results": [result]}}}},
        namespace="default",
        patch_type=PatchType.MERGE,
    )
    assert created.metadata is not None and created.metadata.uid
    return created.metadata.uid


def _existing(paths: Sequence[str]) -> list[str]:
    return [p for p in paths if os.path.exists(p)]


def test_custom_driver_docstring_and_its_drahealth_names() -> None:
    """The docstring shows the commands the next test runs, and the driver needs at
    most 8 names of ``drahealth.driver`` (it takes 7, plus ``Health`` and ``make_client``)."""
    example = f"{ROOT}/examples/custom_driver.py"
    commands = _docstring_commands(example)
    assert (
        "python examples/custom_driver.py --base /tmp/fpga --kubeconfig /tmp/fpga.kubeconfig"
        in (commands)
    )
    assert "drahealth inject --state-dir /tmp/fpga/state fpga-1 unhealthy" in commands
    assert "drahealth inject --state-dir /tmp/fpga/state fpga-1 healthy" in commands
    with open(example) as f:
        tree = ast.parse(f.read())
    names = sorted(
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").split(".")[:2]
        in (["drahealth", "driver"], ["drahealth", "core"], ["drahealth", "kube"])
        for alias in node.names
    )
    assert names == [
        "DeviceReport", "Health", "HealthHub", "PluginOptions", "Pool", "PrepareResult",
        "PreparedDevice", "make_client", "start",
    ]  # fmt: skip
    toolkit = [n for n in names if n not in ("Health", "make_client")]
    assert len(toolkit) <= 8
    docstring = (ast.get_docstring(tree) or "").replace("\n", " ")
    assert f"It needs {len(toolkit)} names of the toolkit" in docstring


async def test_custom_driver_runs_as_its_docstring_shows(apiserver: APIServer) -> None:
    """Health on the dra-health socket, the slice and its taints on the API server,
    ``drahealth inject`` on the driver's control socket, a latched card refused by
    prepare, and a clean SIGTERM: all from one ``start()``."""
    example = f"{ROOT}/examples/custom_driver.py"
    base = tempfile.mkdtemp(prefix="dh-fpga-", dir="/tmp")  # short: unix socket paths
    kubeconfig = str(apiserver.write_kubeconfig(f"{base}/kubeconfig"))
    client = make_client(kubeconfig)
    await client.create(Node(metadata=ObjectMeta(name=NODE)))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, example, "--base", base, "--kubeconfig", kubeconfig,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
    )  # fmt: skip
    watch: Watch | None = None
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        while line and not line.startswith(b"ready: "):
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.startswith(b"ready: "), "the driver exited before it was ready"
        dra_socket = f"{base}/plugins/{FPGA}/dra.sock"
        assert line.decode().strip() == (
            f"ready: {base}/registry/{FPGA}-reg.sock (DRA socket {dra_socket})"
        )

        # health on the dra-health socket: every card Healthy from the first snapshot
        watch = Watch(dra_socket).start()
        await watch.wait_for(
            lambda r: (
                {n: d.health for n, d in devices_of(r).items()}
                == {f"fpga-{i}": HEALTHY for i in range(4)}
            ),
            timeout=20,
        )
        # the slice: four cards in pool node-1, no taints yet
        taints = await _eventually(lambda: _slice_taints(client))
        assert taints == {f"fpga-{i}": [] for i in range(4)}

        # a fault file: Unhealthy on the stream, a NoSchedule taint on the slice
        open(f"{base}/faults/fpga-2", "w").close()  # noqa: ASYNC230
        _, resp = await watch.wait_for(
            lambda r: devices_of(r)["fpga-2"].health == UNHEALTHY, timeout=20
        )
        assert f"fault file {base}/faults/fpga-2" in devices_of(resp)["fpga-2"].message
        bad = [(f"{FPGA}/unhealthy", "true", "NoSchedule")]
        await _eventually(
            lambda: _expect(
                client, {"fpga-2": bad, **{c: [] for c in ("fpga-0", "fpga-1", "fpga-3")}}
            )
        )
        os.unlink(f"{base}/faults/fpga-2")
        await watch.wait_for(lambda r: devices_of(r)["fpga-2"].health == HEALTHY, timeout=20)
        await _eventually(lambda: _expect(client, {f"fpga-{i}": [] for i in range(4)}))

        # drahealth inject, as the docstring shows: a latched fault, refused by prepare
        assert (
            await _inject(base, "fpga-1", "unhealthy")
            == "node-1/fpga-1: Unhealthy (injected fault)"
        )
        await watch.wait_for(lambda r: devices_of(r)["fpga-1"].health == UNHEALTHY, timeout=20)
        await _eventually(
            lambda: _expect(
                client, {"fpga-1": bad, **{c: [] for c in ("fpga-0", "fpga-2", "fpga-3")}}
            )
        )
        uid = await _allocated_claim(client, "fpga-1")
        async with grpc.aio.insecure_channel(f"unix://{dra_socket}") as ch:
            reply = await api.dra_v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                api.dra_v1.NodePrepareResourcesRequest(
                    claims=[api.dra_v1.Claim(namespace="default", name="accel", uid=uid)]
                ),
                timeout=30,
            )
        assert "device node-1/fpga-1 is unhealthy (injected fault)" in reply.claims[uid].error
        # ... and the operator's recovery clears it
        assert await _inject(base, "fpga-1", "healthy") == "node-1/fpga-1: Healthy"
        await watch.wait_for(lambda r: devices_of(r)["fpga-1"].health == HEALTHY, timeout=20)
        await _eventually(lambda: _expect(client, {f"fpga-{i}": [] for i in range(4)}))
        await watch.close()
        watch = None

        # SIGTERM: exit 0, every socket removed
        proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, rest.decode()
        sockets = (dra_socket, f"{base}/registry/{FPGA}-reg.sock", f"{base}/state/control.sock")
        assert _existing(sockets) == []
    finally:
        if watch is not None:
            await watch.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await client.close()
        shutil.rmtree(base, ignore_errors=True)


async def _expect(client: AsyncClient, want: dict[str, list[tuple[str, str, str]]]) -> bool:
    return await _slice_taints(client) == want


def test_node_agent_quickstart_with_the_custom_driver() -> None:
    """The agent (kubelet mode) serves a third-party driver: examples/custom_driver.py,
    run as the quickstart's docstring shows (from the repository root)."""
    assert "python examples/node_agent_quickstart.py" in _docstring_commands(
        f"{ROOT}/examples/node_agent_quickstart.py"
    )
    proc = subprocess.run(
        [sys.executable, "examples/node_agent_quickstart.py"],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == [
        "1. prepared and running",
        "2. card broken",
        "3. card repaired",
    ]
    assert lines[0].endswith("fpga-2: Healthy")
    assert "-fpga-2: Unhealthy fault file " in lines[1]
    assert lines[2].endswith("fpga-2: Healthy")


def _policy_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "drahealth",
            "policy",
            "check",
            f"{ROOT}/examples/policy.yaml",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_example_policy_passes_policy_check_and_uses_the_guard_rails() -> None:
    """examples/policy.yaml is valid and shows the fleet features: limits, a profile in
    observe-only, burn-in, an ignored application XID, a degraded outcome, a repair Job."""
    done = _policy_check()
    assert done.returncode == 0, done.stderr
    assert "valid, 5 rule(s)" in done.stdout
    assert "limits       cluster 10%" in done.stdout
    assert "h200-canary" in done.stdout and "observe-only" in done.stdout
    assert "burn-in" in done.stdout

    device = ("--device", "gpu.example.com/node-1/gpu-0", "--health", "Unhealthy")
    ignored = _policy_check(*device, "--message", "XID 13: Graphics Engine Exception")
    assert ignored.returncode == 0 and "ignored by rule application-xid" in ignored.stdout
    degraded = _policy_check(*device, "--message", "ECC: Page retirement pending")
    assert degraded.returncode == 0 and "ecc-pages-retired" in degraded.stdout
    fatal = _policy_check(*device, "--message", "XID 79: GPU has fallen off the bus")
    assert fatal.returncode == 0, fatal.stderr
    assert "rule gpu-fatal-xid" in fatal.stdout
    assert "NoExecute" in fatal.stdout and "repair       job once drained" in fatal.stdout
