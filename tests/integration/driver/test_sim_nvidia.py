"""``drahealth driver --profile sim-nvidia`` as a process: it registers like NVIDIA's
plugin (no health service), publishes NVIDIA's attributes through the embedded API
server, prepares claims, and ``drahealth inject ... xid`` writes the GPU's XID line into
the node's fake kernel log."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from lightkube import AsyncClient

from drahealth import api
from drahealth.simdriver import pci_attribute, sim_nvidia_gpus
from tests._support import eventually
from tests.integration.driver.test_sample_driver import (
    NODE,
    DriverProcess,
    base,
    inject,
    launch,
    processes,
    read_text,
)
from tests.integration.driver.test_sample_driver_kube import (
    apiserver,
    create_claim,
    gpu,
    kube,
    kubeconfig,
    prepare,
    slices,
)

__all__ = ["apiserver", "base", "kube", "kubeconfig", "launch", "processes"]

pytestmark = pytest.mark.timeout(40)

NVIDIA = "gpu.nvidia.com"


async def test_registers_without_a_health_service_and_injects_xid_lines(
    launch: Callable[..., Any],
) -> None:
    d: DriverProcess = await launch("--profile", "sim-nvidia", "--devices", "4", driver=NVIDIA)
    kernel_log = f"{d.state}/kmsg"
    assert f"kernel log: {kernel_log}" in d.output.splitlines()
    async with grpc.aio.insecure_channel(f"unix://{d.registrar_socket}") as ch:
        info = await api.registration_grpc.RegistrationStub(ch).GetInfo(
            api.registration.InfoRequest()
        )
    # NVIDIA's plugins advertise the DRA service only: the kubelet opens no health stream
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    async with grpc.aio.insecure_channel(f"unix://{d.dra_socket}") as ch:
        call = api.health_v1_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            api.health_v1.NodeWatchResourcesRequest()
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED

    rc, out, _ = await inject(d.state, "gpu-2", "xid", "--pid", "4242", "--process", "python3")
    assert rc == 0, out
    want = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."
    assert out.strip().endswith(want) and out.startswith(f"{NODE}/gpu-2: {kernel_log}: ")
    rc, out, _ = await inject(d.state, "gpu-0", "xid", "--xid", "48", "--message", "DBE.")
    assert rc == 0, out
    lines = read_text(kernel_log).splitlines()
    assert re.fullmatch(rf"4,0,\d+,-;{re.escape(want)}", lines[0])
    assert re.fullmatch(r"4,1,\d+,-;NVRM: Xid \(PCI:0000:18:00\): 48, pid='<unknown>', "
                        r"name=<unknown>, DBE\.", lines[1])  # fmt: skip

    rc, out, _ = await inject(d.state, "gpu-0", "unhealthy", "--xid", "79")
    assert rc != 0 and "--xid, --pid and --process go with the xid action only" in out
    rc, out, _ = await inject(d.state, "gpu-7", "xid")
    assert rc == 1 and "unknown device 'gpu-7'" in out


async def test_other_profiles_refuse_the_xid_action(launch: Callable[..., Any]) -> None:
    d: DriverProcess = await launch()
    rc, out, _ = await inject(d.state, "gpu-0", "xid")
    assert rc == 1 and "action 'xid' is not served by this driver" in out


async def test_kernel_log_option_and_bad_release(launch: Callable[..., Any], base: str) -> None:
    log = f"{base}/node/kmsg"
    d: DriverProcess = await launch(
        "--profile", "sim-nvidia", "--kernel-log", log, "--nvidia-release", "25.8", driver=NVIDIA
    )
    assert f"kernel log: {log}" in d.output
    rc, out, _ = await inject(d.state, "gpu-1", "xid")
    assert rc == 0 and read_text(log).count("NVRM: Xid (PCI:0000:2a:00): 79") == 1, out
    bad = DriverProcess(base, "--profile", "sim-nvidia", "--nvidia-release", "24.1")
    with pytest.raises(AssertionError, match="Invalid value for '--nvidia-release'"):
        await bad.start(timeout=10)
    bad.close()


@pytest.mark.parametrize("release", ["25.3", "0.5"])
async def test_publishes_nvidias_attributes_and_prepares(
    launch: Callable[..., Any], kube: AsyncClient, kubeconfig: str, release: str
) -> None:
    d: DriverProcess = await launch(
        "--profile", "sim-nvidia", "--nvidia-release", release,
        driver=NVIDIA, kubeconfig=kubeconfig,
    )  # fmt: skip
    published = await eventually(lambda: slices(kube), 10, "the sim-nvidia ResourceSlice")
    (rs,) = published
    assert rs.spec.driver == NVIDIA and rs.spec.pool.name == NODE
    devices = {dev.name: dev for dev in rs.spec.devices}
    assert sorted(devices) == sorted(f"gpu-{i}" for i in range(8))
    for sim in sim_nvidia_gpus(NODE, 8):
        attrs = devices[sim.name].attributes  # wire form: {"string": ...}
        assert attrs["uuid"] == {"string": sim.uuid}
        assert attrs[pci_attribute(release)] == {"string": sim.pci_bus_id}
        assert attrs["driverVersion"] == {"version": "570.133.20"}
        assert ("minor" in attrs) is (release == "25.3")
        assert devices[sim.name].capacity["memory"]["value"] == "81559Mi"
        assert not devices[sim.name].taints
    uid = await create_claim(kube, "c1", [gpu("gpu-3", NVIDIA)])
    result = await prepare(d, ("c1", uid))
    assert not result[uid].error, result[uid].error
    assert [dev.device_name for dev in result[uid].devices] == ["gpu-3"]
