"""The NVIDIA demo's pieces that need no cluster: its attach file passes the agent's
schema and builds a kmsg source on the node's kernel log, its policy parses and
classifies the kmsg source's message, and its DeviceClass selects NVIDIA's GPUs only."""

from __future__ import annotations

from pathlib import Path

from drahealth.cli import _demo_nvidia as nv
from drahealth.core import Health
from drahealth.node import load_attach_config
from drahealth.node._attach_config import build_source
from drahealth.remedy import parse_policy
from drahealth.sources import KmsgSource


def test_attach_file_builds_a_kmsg_source_keyed_by_nvidias_pci_attribute(
    tmp_path: Path,
) -> None:
    log = tmp_path / "kmsg"
    log.touch()
    path = tmp_path / "attach.yaml"
    path.write_text(nv.attach_config(log))
    config = load_attach_config(str(path))
    (driver,) = config.drivers
    assert driver.driver == "gpu.nvidia.com"
    assert driver.key is not None and driver.key.attribute == "resource.kubernetes.io/pciBusID"
    (settings,) = driver.sources
    source, _, timeout = build_source(settings, str(path))
    assert isinstance(source, KmsgSource)
    assert source.path == str(log) and source.clear_after == nv.CLEAR_AFTER
    assert timeout > 0


def test_kmsg_line_through_the_source_reads_as_the_policy_expects(tmp_path: Path) -> None:
    """The line the simulated driver writes, read by the kmsg source, is a fatal XID the
    demo's first rule (NoExecute) matches."""
    from drahealth.simdriver import KernelLog, sim_nvidia_gpus, xid_line

    log = tmp_path / "kmsg"
    kernel = KernelLog(str(log))
    source = KmsgSource(str(log), clear_after=nv.CLEAR_AFTER)
    assert source.poll() == []
    gpu = sim_nvidia_gpus("node-1", 8)[0]
    kernel.append(xid_line(gpu.pci_bus_id, nv.XID, pid=4242, process="trainer"))
    (signal,) = source.poll()
    assert signal.value == gpu.pci_bus_id and signal.health is Health.UNHEALTHY
    policy = parse_policy(nv.POLICY, "demo")
    fatal = policy.rules[0]
    assert fatal.name == "gpu-fatal-xid" and fatal.action.effect == "NoExecute"
    assert fatal.match.message is not None
    assert fatal.match.message.search(f"kmsg: {signal.message}")


def test_workload_uses_nvidias_device_class() -> None:
    objs = nv.workload()
    assert objs[0]["metadata"]["name"] == "gpu.nvidia.com"
    assert "device.attributes['gpu.nvidia.com'].type == 'gpu'" in str(objs[0]["spec"])
    request = objs[1]["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
