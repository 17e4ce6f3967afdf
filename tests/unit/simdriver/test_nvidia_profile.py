"""The sim-nvidia profile: NVIDIA's attribute names and types per release, the fake kernel
log's records, and the control socket's ``xid`` action with hostile requests."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from drahealth.core import Health, normalize_key, normalize_pci_address
from drahealth.driver._control import handle_line, handle_request
from drahealth.driver._hub import DeviceReport, HealthHub
from drahealth.simdriver import (
    DEFAULT_DRIVER_NAMES,
    NVIDIA_RELEASES,
    PROFILES,
    KernelLog,
    SampleDriverConfig,
    XidAction,
    build_resources,
    kmsg_record,
    nvidia_attributes,
    pci_attribute,
    sim_nvidia_gpus,
    sim_nvidia_pool,
    xid_line,
)
from drahealth.simdriver._nvidia import MAX_KMSG_MESSAGE

NODE = "node-1"
STD = "resource.kubernetes.io/"
# the names and value kinds each release of NVIDIA's driver publishes for a full GPU
COMMON = {
    "type": "string",
    "uuid": "string",
    "productName": "string",
    "brand": "string",
    "architecture": "string",
    "cudaComputeCapability": "version",
    "driverVersion": "version",
    "cudaDriverVersion": "version",
    f"{STD}pcieRoot": "string",
}
EXPECTED = {
    "25.3": {**COMMON, "minor": "int", "index": "int", "pcieBusID": "string"},
    "25.8": {**COMMON, "pcieBusID": "string"},
    "25.12": {**COMMON, f"{STD}pciBusID": "string"},
    "0.5": {**COMMON, f"{STD}pciBusID": "string", f"{STD}numaNode": "int"},
}
# upstream's check of a pciBusID value (k8s.io/dynamic-resource-allocation/deviceattribute)
BDF = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-9a-f]{1})$")
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _kinds(attrs: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, value in attrs.items():
        set_fields = {k: v for k, v in msgspec.to_builtins(value).items() if v is not None}
        assert len(set_fields) == 1, (name, set_fields)
        out[name] = next(iter(set_fields))
    return out


def test_profile_is_offered_with_nvidias_driver_name() -> None:
    assert "sim-nvidia" in PROFILES
    assert DEFAULT_DRIVER_NAMES["sim-nvidia"] == "gpu.nvidia.com"
    assert set(EXPECTED) == set(NVIDIA_RELEASES)


@pytest.mark.parametrize("release", list(EXPECTED))
def test_attributes_per_release(release: str) -> None:
    gpu = sim_nvidia_gpus(NODE, 8)[3]
    attrs = nvidia_attributes(gpu, release)
    assert _kinds(attrs) == EXPECTED[release]
    assert attrs["type"].string == "gpu"
    assert attrs[pci_attribute(release)].string == gpu.pci_bus_id
    assert attrs["cudaComputeCapability"].version == "9.0.0"  # "9.0" as a semantic version
    assert re.fullmatch(r"pci[0-9a-f]{4}:[0-9a-f]{2}", attrs[f"{STD}pcieRoot"].string or "")


def test_pci_attribute_names_follow_the_rename() -> None:
    assert pci_attribute("25.3") == pci_attribute("25.8") == "pcieBusID"
    assert pci_attribute("25.12") == pci_attribute("0.5") == f"{STD}pciBusID"
    with pytest.raises(ValueError, match=r"unknown NVIDIA driver release '9\.9'"):
        pci_attribute("9.9")


def test_gpus_are_named_by_minor_with_unique_stable_keys() -> None:
    gpus = sim_nvidia_gpus(NODE, 20)
    assert [g.name for g in gpus] == [f"gpu-{i}" for i in range(20)]
    assert all(UUID.match(g.uuid) for g in gpus)
    assert all(BDF.match(g.pci_bus_id) for g in gpus)
    assert len({g.uuid for g in gpus}) == len({g.pci_bus_id for g in gpus}) == 20
    # the one spelling of the agent's index keeps NVIDIA's spelling as it is
    assert all(normalize_key("pciBusID", g.pci_bus_id) == g.pci_bus_id for g in gpus)
    assert sim_nvidia_gpus(NODE, 20) == gpus  # same node, same GPUs
    assert {g.uuid for g in sim_nvidia_gpus("node-2", 20)}.isdisjoint(g.uuid for g in gpus)
    assert {g.numa_node for g in gpus[:4]} == {0} and {g.numa_node for g in gpus[4:8]} == {1}
    with pytest.raises(ValueError, match="negative"):
        sim_nvidia_gpus(NODE, -1)


def test_pool_passes_every_slice_limit_and_has_memory_capacity() -> None:
    resources = build_resources("sim-nvidia", NODE, devices=8, nvidia_release="25.3")
    devices = resources.pools[NODE].devices
    assert [d.name for d in devices] == [f"gpu-{i}" for i in range(8)]
    assert all(d.capacity and d.capacity["memory"].value == "81559Mi" for d in devices)
    assert sim_nvidia_pool(NODE, 0).devices == []
    with pytest.raises(ValueError, match="--partitions applies to the sim-gpu profile only"):
        build_resources("sim-nvidia", NODE, partitions=2)


def test_config_refuses_the_drivers_own_health_features() -> None:
    with pytest.raises(ValueError, match="sim-nvidia, like NVIDIA's driver, has none"):
        SampleDriverConfig(
            "sim-nvidia", "gpu.nvidia.com", NODE, "/r", "/p", None, claim_status=True
        )
    with pytest.raises(ValueError, match="has none"):
        SampleDriverConfig(
            "sim-nvidia", "gpu.nvidia.com", NODE, "/r", "/p", None, withdraw_unhealthy="auto"
        )


# --------------------------------------------------------------------------- kernel log


def test_xid_line_is_nvidias_format() -> None:
    assert (
        xid_line("0000:3b:00.0", 79, pid=1234, process="python3")
        == "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
    )
    assert xid_line("0001:9a:00.0", 48, "An uncorrectable double bit error.") == (
        "NVRM: Xid (PCI:0001:9a:00): 48, pid='<unknown>', name=<unknown>, "
        "An uncorrectable double bit error."
    )
    # the line's address names the same device as the published attribute
    pci = re.search(r"PCI:([0-9a-f:]+)\)", xid_line("0000:db:00.0", 79))
    assert pci and normalize_pci_address(pci.group(1)) == "0000:db:00.0"
    for bad in ("3b:00.0", "0000:3B:00.0", "0000:3b:00", "0000:3b:00.0\n"):
        with pytest.raises(ValueError, match="not a PCI bus ID"):
            xid_line(bad, 79)
    with pytest.raises(ValueError, match="out of range"):
        xid_line("0000:3b:00.0", -1)


def test_kmsg_record_format_escapes_and_bounds() -> None:
    assert kmsg_record(7, 1500, "hello") == "4,7,1500,-;hello\n"
    assert kmsg_record(1, 2, "a\nb\x1b", priority=3) == "3,1,2,-;a\\x0ab\\x1b\n"
    long = kmsg_record(1, 2, "x" * 5000)
    assert len(long.split(";", 1)[1]) == MAX_KMSG_MESSAGE + 1  # the message and "\n"


def test_kernel_log_appends_whole_records_and_continues_sequence(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "kmsg"
    log = KernelLog(str(path), clock=lambda: 12.5)
    assert path.read_text() == ""
    first = log.append("one")
    assert first == "4,0,12500000,-;one\n"
    again = KernelLog(str(path), clock=lambda: 13.0)  # a restarted driver
    assert again.append("two").startswith("4,1,13000000,-;")

    def burst(tag: str) -> None:
        for i in range(200):
            again.append(f"{tag}-{i}")

    threads = [threading.Thread(target=burst, args=(t,)) for t in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    lines = path.read_text().splitlines()
    assert len(lines) == 802
    seqs = [int(line.split(",")[1]) for line in lines]
    assert seqs == list(range(802))
    assert all(re.fullmatch(r"4,\d+,\d+,-;[a-z]+(-\d+)?", line) for line in lines)


def test_kernel_log_resumes_after_a_torn_or_foreign_tail(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(b"6,41,100,-;boot\n\xff\xfegarbage without a header\n")
    assert KernelLog(str(path)).append("next").startswith("4,42,")
    other = tmp_path / "plain"
    other.write_text("not kmsg at all\n")
    assert KernelLog(str(other)).append("x").startswith("4,0,")


# --------------------------------------------------------------------------- xid action


@pytest.fixture
def hub() -> HealthHub:
    devices = [(NODE, g.name) for g in sim_nvidia_gpus(NODE, 4)]
    h = HealthHub(devices)
    h.submit("sim", [DeviceReport(p, d, Health.HEALTHY) for p, d in devices])
    return h


@pytest.fixture
def xid(tmp_path: Path) -> XidAction:
    gpus = {g.name: g.pci_bus_id for g in sim_nvidia_gpus(NODE, 4)}
    return XidAction(KernelLog(str(tmp_path / "kmsg")), gpus)


def test_xid_action_writes_the_devices_line_and_leaves_health_alone(
    hub: HealthHub, xid: XidAction
) -> None:
    reply = handle_request(
        hub,
        {"action": "xid", "device": "gpu-2", "pid": 4242, "process": "python3"},
        {"xid": xid},
    )
    assert reply["ok"], reply
    assert reply["device"] == f"{NODE}/gpu-2" and reply["pciBusID"] == "0000:3b:00.0"
    text = Path(xid.log.path).read_text()
    assert text.endswith(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus.\n"
    )
    assert reply["record"] == text.rstrip("\n")
    # NVIDIA's driver says nothing to the kubelet: the hub's health does not change
    assert hub.state(NODE, "gpu-2").health is Health.HEALTHY
    line = json.dumps({"action": "xid", "device": f"{NODE}/gpu-1", "xid": 48, "message": "DBE"})
    assert handle_line(hub, line.encode(), {"xid": xid})["ok"]
    assert (
        Path(xid.log.path)
        .read_text()
        .splitlines()[-1]
        .endswith("NVRM: Xid (PCI:0000:2a:00): 48, pid='<unknown>', name=<unknown>, DBE")
    )


@pytest.mark.parametrize(
    ("req", "error"),
    [
        ({"xid": "79"}, "field 'xid' must be an integer"),
        ({"xid": True}, "field 'xid' must be an integer"),
        ({"xid": 2**32}, "field 'xid' must be an integer"),
        ({"pid": 0}, "field 'pid' must be a positive integer"),
        ({"pid": 1.5}, "field 'pid' must be a positive integer"),
        ({"process": "a,b"}, "field 'process' must be a process name"),
        ({"process": "x" * 65}, "field 'process' must be a process name"),
        ({"process": "evil\n4,1,1,-;NVRM: Xid"}, "field 'process' must be a process name"),
        ({"code": 79}, "unknown field(s) in request: code"),
        ({"device": "gpu-9"}, "unknown device 'gpu-9'"),
        ({"device": None}, "missing field 'device'"),
    ],
)
def test_xid_action_refuses_bad_requests(
    hub: HealthHub, xid: XidAction, req: dict[str, Any], error: str
) -> None:
    body = {"action": "xid", "device": "gpu-0", **req}
    body = {k: v for k, v in body.items() if v is not None}
    reply = handle_request(hub, body, {"xid": xid})
    assert reply == {"ok": False, "error": reply["error"]}
    assert error in reply["error"]
    assert Path(xid.log.path).read_text() == ""


def test_xid_fields_are_unknown_to_other_actions_and_profiles(
    hub: HealthHub, xid: XidAction
) -> None:
    reply = handle_request(hub, {"action": "unhealthy", "device": "gpu-0", "xid": 79}, {"xid": xid})
    assert reply["error"] == "unknown field(s) in request: xid"
    reply = handle_request(hub, {"action": "xid", "device": "gpu-0"})
    assert reply["error"] == "action 'xid' is not served by this driver"


def test_xid_action_reports_a_log_it_cannot_write(
    hub: HealthHub, xid: XidAction, tmp_path: Path
) -> None:
    Path(xid.log.path).unlink()
    Path(xid.log.path).mkdir()  # the log's path is now a directory
    reply = handle_request(hub, {"action": "xid", "device": "gpu-0"}, {"xid": xid})
    assert not reply["ok"] and reply["error"].startswith("action 'xid' failed:")
