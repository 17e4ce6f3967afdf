"""``drahealth driver --profile sim-pci``: real PCI devices in the slice, their health streamed.

Runs against this machine's real ``/sys`` (read-only) and against a fake sysfs tree,
where a device removal must show as Unhealthy on the driver's health stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.resource_v1 import ResourceSlice

from tests.integration.driver.test_sample_driver import DriverProcess, base, launch, processes
from tests.integration.driver.test_sample_driver_kube import apiserver, kube, kubeconfig
from tests.unit.sources.fake_sysfs import FakeSysfs

__all__ = ["apiserver", "base", "kube", "kubeconfig", "launch", "processes"]

pytestmark = pytest.mark.timeout(60)
BIN = Path(sys.executable).with_name("drahealth")
PCI = "pci.example.com"


def read_vendor(address: str) -> str:
    return Path(f"/sys/bus/pci/devices/{address}/vendor").read_text().strip()


def watch_once(sock: str) -> dict[str, Any]:
    out = subprocess.run(
        [str(BIN), "watch", sock, "--once", "-o", "json"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return dict(json.loads(out.stdout))


async def slice_devices(client: AsyncClient) -> dict[str, dict[str, Any]]:
    for _ in range(100):
        found = [s async for s in client.list(ResourceSlice) if s.spec and s.spec.driver == PCI]
        if found:
            return {d["name"]: d for s in found for d in s.to_dict()["spec"].get("devices", [])}
        await asyncio.sleep(0.05)
    raise AssertionError("no ResourceSlice of the sim-pci driver")


@pytest.mark.skipif(not os.listdir("/sys/bus/pci/devices"), reason="this machine has no PCI bus")
async def test_real_pci_devices_are_published_and_streamed(
    launch: Callable[..., Any], kube: AsyncClient, kubeconfig: str
) -> None:
    driver: DriverProcess = await launch(
        "--profile", "sim-pci", driver=PCI, kubeconfig=kubeconfig, health_timeout=3
    )
    real = sorted(os.listdir("/sys/bus/pci/devices"))
    devices = await slice_devices(kube)
    expected = {"pci-" + a.replace(":", "-").replace(".", "-"): a for a in real}
    assert set(devices) == set(expected)
    for name, address in expected.items():
        attrs = devices[name]["attributes"]
        assert attrs["address"] == {"string": address}
        assert attrs["vendor"] == {"string": read_vendor(address)}
    message = await asyncio.to_thread(watch_once, driver.dra_socket)
    assert {d["device"] for d in message["devices"]} == set(expected)
    assert all(d["health"] in ("Healthy", "Unhealthy") for d in message["devices"])


async def test_a_removed_device_turns_unhealthy_on_the_stream(
    launch: Callable[..., Any], base: str
) -> None:
    fake = FakeSysfs(f"{base}/sys")
    fake.add("0000:3b:00.0")
    fake.add("0000:3c:00.0")
    driver: DriverProcess = await launch(
        "--profile", "sim-pci", "--sysfs-root", f"{base}/sys", driver=PCI, health_timeout=1
    )
    first = await asyncio.to_thread(watch_once, driver.dra_socket)
    assert {d["device"]: d["health"] for d in first["devices"]} == {
        "pci-0000-3b-00-0": "Healthy",
        "pci-0000-3c-00-0": "Healthy",
    }
    fake.remove("0000:3c:00.0")
    for _ in range(60):
        now = await asyncio.to_thread(watch_once, driver.dra_socket)
        gone = next(d for d in now["devices"] if d["device"] == "pci-0000-3c-00-0")
        if gone["health"] == "Unhealthy":
            assert gone["message"] == "PCI device 0000:3c:00.0 is gone"
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the removal never reached the health stream")
