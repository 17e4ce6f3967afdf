"""PCI sysfs, exec and file probes attached to NVIDIA-style devices in the agent, on the
embedded API server: the agent gives each source the keys the watched driver's slices
publish, the answers reach the health pipeline by attribute, and the second driver's
device with the same PCI address is left alone."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from lightkube import AsyncClient

from drahealth.node import parse_attach_config
from drahealth.node._attached import AttachedSources
from drahealth.node._events import EventRecorder
from drahealth.node._pipeline import HealthPipeline
from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client
from tests.integration.node.test_attached import GPUS, NODE, NV, OTHER, nvidia_slice, other_slice
from tests.unit.sources.fake_sysfs import FakeSysfs

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(60)


class World:
    def __init__(self, client: AsyncClient, tmp: Path) -> None:
        self.sysfs = FakeSysfs(str(tmp / "sys"))
        for gpu in GPUS:
            self.sysfs.add(gpu.pci_bus_id)
        self.file = tmp / "health.json"
        self.write_file({})
        self.bad = tmp / "bad-devices"
        self.bad.write_text("")
        probe = tmp / "probe.py"
        probe.write_text(
            "import sys\n"
            f"bad = open({str(self.bad)!r}).read().split()\n"
            "print('probe says', sys.argv[1])\n"
            "sys.exit(1 if sys.argv[1] in bad else 0)\n"
        )
        config = f"""
drivers:
  - driver: {NV}
    sources:
      - {{kind: pci, root: {str(tmp / "sys")!r}, interval: 0.05, timeout: 5}}
      - {{kind: file, path: {str(self.file)!r}, by: uuid, interval: 0.05, timeout: 5}}
      - kind: exec
        command: [{sys.executable!r}, {str(probe)!r}, "{{key}}"]
        interval: 0.2
        timeout: 10
"""
        self.pipeline = HealthPipeline(str(tmp / "state"), default_timeout=5.0)
        self.events = EventRecorder(client, NODE, dedupe_seconds=0.0)
        self.attached = AttachedSources(
            parse_attach_config(config, "attach.yaml"), client, NODE, self.pipeline, self.events
        )

    def write_file(self, health: dict[str, tuple[str, str]]) -> None:
        devices = [{"key": k, "health": h, "message": m} for k, (h, m) in health.items()]
        self.file.write_text(json.dumps({"devices": devices}))

    def health(self, device: str) -> tuple[str, str]:
        h, m = self.pipeline.cache.get(NV, NODE, device)
        return h.value, m


@pytest.fixture
async def world(client: AsyncClient, tmp_path: Path) -> AsyncIterator[World]:
    await client.create(nvidia_slice())
    await client.create(other_slice())
    w = World(client, tmp_path)
    await w.pipeline.start()
    await w.attached.start()
    try:
        yield w
    finally:
        await w.attached.stop()
        await w.events.drain()
        await w.pipeline.stop()


async def test_pci_file_and_exec_probes_find_their_devices_by_attribute(world: World) -> None:
    # the file lists no device yet: each reads Unknown from it, worst wins
    await eventually(
        lambda: world.health("gpu-0") == ("Unknown", f"file: not listed in {world.file}"),
        10, "the file probe's answer for gpu-0",
    )  # fmt: skip
    world.write_file({gpu.uuid.upper(): ("Healthy", "") for gpu in GPUS})
    await eventually(
        lambda: all(world.health(g.name)[0] == "Healthy" for g in GPUS), 10, "all Healthy"
    )
    # the PCI device of gpu-1 falls off the bus
    world.sysfs.remove(GPUS[1].pci_bus_id)
    await eventually(
        lambda: world.health("gpu-1")
        == ("Unhealthy", f"pci: PCI device {GPUS[1].pci_bus_id} is gone"),
        10, "gpu-1 Unhealthy from sysfs",
    )  # fmt: skip
    # the vendor tool marks gpu-2 by UUID; the exec probe marks gpu-0 by its name
    world.write_file(
        {g.uuid: ("Unhealthy", "row remap failure") if g.name == "gpu-2" else ("Healthy", "")
         for g in GPUS}
    )  # fmt: skip
    world.bad.write_text("gpu-0\n")
    await eventually(
        lambda: world.health("gpu-2") == ("Unhealthy", "file: row remap failure")
        and world.health("gpu-0") == ("Unhealthy", "exec: probe says gpu-0"),
        10, "gpu-2 from the file, gpu-0 from the exec probe",
    )  # fmt: skip
    # the other driver's device with gpu-0's PCI address and UUID is not touched
    assert world.pipeline.cache.entries(OTHER) == []
    # each source was given the watched driver's keys, in its own attribute
    attachment = world.attached.drivers[NV]
    pci, file, exec_ = (r.source for r in attachment.sources)
    assert pci._addresses == tuple(sorted(g.pci_bus_id for g in GPUS))  # type: ignore[attr-defined]
    assert file._keys == tuple(sorted(g.uuid for g in GPUS))  # type: ignore[attr-defined]
    assert exec_._keys == ("gpu-0", "gpu-1", "gpu-2")  # type: ignore[attr-defined]


async def test_keys_follow_the_slices(world: World, client: AsyncClient) -> None:
    attachment = world.attached.drivers[NV]
    exec_ = attachment.sources[2].source
    await eventually(lambda: exec_._keys == ("gpu-0", "gpu-1", "gpu-2"), 10, "three keys")  # type: ignore[attr-defined]
    await client.replace(nvidia_slice(count=2, generation=2))
    await eventually(lambda: exec_._keys == ("gpu-0", "gpu-1"), 10, "two keys")  # type: ignore[attr-defined]
