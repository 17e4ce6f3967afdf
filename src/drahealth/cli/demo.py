"""``drahealth demo``: the device-health loop on the embedded control plane, narrated.

Starts the embedded API server, seeds a node with a GPU ResourceSlice, a DeviceClass,
an allocated ResourceClaim and a Pod using it, then walks the loop a device failure
takes through the Kubernetes API: health in Pod status, a DeviceTaintRule, an
eviction held by a PodDisruptionBudget, then allowed. Every step is a real request
through lightkube to the embedded server, and each is confirmed by a watch (the
reflector), with the time it took printed on the timeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import click
from lightkube import ApiError, AsyncClient, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType
from rich.console import Console

from drahealth.controlplane import APIServer
from drahealth.kube import Reflector, make_client

DRIVER = "gpu.example.com"
NODE = "node-1"
DEVICE = "gpu-3"

console = Console(highlight=False)


class Timeline:
    """Prints numbered steps with the wall time each took."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.step = 0

    async def run(self, title: str, action: Callable[[], Awaitable[str]]) -> None:
        self.step += 1
        t0 = time.monotonic()
        detail = await action()
        took = (time.monotonic() - t0) * 1000
        at = time.monotonic() - self.start
        console.print(
            f"[dim]{at:6.2f}s[/] [bold]{self.step:2d}.[/] {title}: {detail} "
            f"[cyan]({took:.1f} ms)[/]"
        )


def _seed_objects() -> list[dict[str, Any]]:
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {"index": {"int": i}, "model": {"string": "SIM-GPU-80G"}},
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i in range(8)
    ]
    return [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}},
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "trainer-gpu", "namespace": "default"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "trainer", "namespace": "default", "labels": {"app": "trainer"}},
            "spec": {
                "nodeName": NODE,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "trainer-gpu"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.example/trainer:1",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "trainer", "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}},
        },
    ]


async def _evict(client: AsyncClient) -> None:
    eviction = Pod.Eviction(metadata=ObjectMeta(name="trainer", namespace="default"))
    await client.create(eviction, name="trainer", namespace="default")


def _health_status(health: str, message: str | None) -> dict[str, Any]:
    resource: dict[str, Any] = {"resourceID": f"{DRIVER}/{NODE}/{DEVICE}", "health": health}
    if message:
        resource["message"] = message
    return {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example/trainer:1",
                    "imageID": "",
                    "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [resource]}],
                }
            ],
        }
    }


async def _story(client: AsyncClient, pods: Reflector[Pod], timeline: Timeline) -> None:
    async def seen(predicate: Callable[[Pod | None], bool]) -> None:
        done = asyncio.Event()

        def check(*_: object) -> None:
            if predicate(pods.store.get("default", "trainer")):
                done.set()

        pods.add_handler(check)
        try:
            check()
            async with asyncio.timeout(5.0):
                await done.wait()
        except TimeoutError:
            raise TimeoutError("the watch did not confirm the change within 5 s") from None
        finally:
            pods.remove_handler(check)

    def health_is(expected: str) -> Callable[[Pod | None], bool]:
        def check(pod: Pod | None) -> bool:
            try:
                res = pod.status.containerStatuses[0].allocatedResourcesStatus[0].resources[0]  # type: ignore[union-attr,index]
            except (AttributeError, IndexError, TypeError):
                return False
            return bool(res.health == expected)

        return check

    async def seed() -> str:
        for obj in _seed_objects():
            await client.create(codecs.from_dict(obj))
        allocation = {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": DEVICE}
                        ]
                    }
                }
            }
        }
        from lightkube.resources.resource_v1 import ResourceClaim

        await client.patch(
            ResourceClaim.Status,
            "trainer-gpu",
            allocation,
            namespace="default",
            patch_type=PatchType.MERGE,
        )
        await seen(lambda p: p is not None)
        return f"node {NODE}, 8 devices of {DRIVER}, claim trainer-gpu -> {DEVICE}, pod trainer"

    async def report(health: str, message: str | None) -> str:
        await client.patch(
            Pod.Status,
            "trainer",
            _health_status(health, message),
            namespace="default",
            patch_type=PatchType.STRATEGIC,
        )
        await seen(health_is(health))
        return f"{DRIVER}/{NODE}/{DEVICE} {health}" + (f' "{message}"' if message else "")

    async def taint() -> str:
        rule = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": f"{NODE}-{DEVICE}-unhealthy"},
            "spec": {
                "deviceSelector": {"driver": DRIVER, "pool": NODE, "device": DEVICE},
                "taint": {"key": f"{DRIVER}/unhealthy", "value": "xid-79", "effect": "NoExecute"},
            },
        }
        created: Any = await client.create(codecs.from_dict(rule))
        added = created.spec.taint.timeAdded
        return f"DeviceTaintRule {created.metadata.name} NoExecute, timeAdded {added}"

    async def evict() -> str:
        try:
            await _evict(client)
        except ApiError as exc:
            return f"refused with {exc.status.code}: {exc.status.message}"
        return "unexpectedly allowed"

    async def relax_and_evict() -> str:
        await client.patch(
            PodDisruptionBudget,
            "trainer",
            {"spec": {"minAvailable": 0}},
            namespace="default",
            patch_type=PatchType.MERGE,
        )
        await asyncio.sleep(0)
        await _evict(client)
        await seen(lambda p: p is None)
        return "pod default/trainer evicted; the watch saw it go"

    await timeline.run("seed the cluster", seed)
    await timeline.run("driver reports the device healthy", lambda: report("Healthy", None))
    await timeline.run(
        "fault: pod status shows", lambda: report("Unhealthy", "XID 79: GPU fallen off the bus")
    )
    await timeline.run("taint the failed device", taint)
    await timeline.run("evict while the PDB allows no disruption", evict)
    await timeline.run("relax the PDB and evict", relax_and_evict)


async def run_demo(port: int, kubeconfig_out: Path | None, script: bool) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="drahealth-demo-"))
    kubeconfig = kubeconfig_out or workdir / "kubeconfig"
    server = APIServer()
    await server.start(host="127.0.0.1", port=port)
    server.write_kubeconfig(kubeconfig)
    console.print(f"embedded API server: {server.url}")
    console.print(
        f"kubeconfig: {kubeconfig}   (try: kubectl --kubeconfig {kubeconfig} get pods -w)"
    )
    client = make_client(server_url=server.url)
    pods: Reflector[Pod] = Reflector(client, Pod, namespace="default")
    try:
        await pods.start()
        await pods.wait_synced(5)
        if script:
            await _story(client, pods, Timeline())
            console.print("[green]demo complete[/]")
        else:
            console.print("running; press Ctrl-C to stop")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        return 0
    finally:
        await pods.stop()
        with contextlib.suppress(Exception):
            await client.close()
        await server.stop()


@click.command()
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="API server port (0 = any free port).",
)
@click.option(
    "--kubeconfig-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the kubeconfig.",
)
@click.option(
    "--script/--no-script",
    default=True,
    show_default=True,
    help="Run the scripted story, or just stay up.",
)
def demo_command(port: int, kubeconfig_out: Path | None, script: bool) -> None:
    """Run the device-health loop on the embedded control plane and narrate it."""
    raise SystemExit(asyncio.run(run_demo(port, kubeconfig_out, script)))
