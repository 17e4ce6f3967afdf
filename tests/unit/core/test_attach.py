"""Attached health rules: the attribute index, matching, ambiguity, leases, worst-wins,
and the pod condition that shows them."""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.core import (
    POD_CONDITION_TYPE,
    AttachedHealth,
    AttachIndex,
    DeviceKey,
    Health,
    KeySpec,
    ReportedDevice,
    Signal,
    SourceSpec,
    pod_condition,
    pod_condition_differs,
)

D = "gpu.nvidia.com"
NODE = "node-1"
H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN


def gpu(i: int, *, bus: int | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A device as NVIDIA's driver publishes a full GPU (the attributes that matter)."""
    b = 0x18 + i if bus is None else bus
    return {
        "name": f"gpu-{i}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{i:08d}-AAAA"},
            "index": {"int": i},
            "pcieBusID": {"string": f"0000:{b:02x}:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:10"},
            **(extra or {}),
        },
    }


def slice_(devices: list[dict[str, Any]], *, pool: str = NODE, gen: int = 1,
           driver: str = D, node: str = NODE, name: str = "s") -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool, "generation": gen, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def key(i: int, pool: str = NODE) -> DeviceKey:
    return DeviceKey(D, pool, f"gpu-{i}")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --------------------------------------------------------------------------- index


def test_index_reads_only_this_driver_node_and_newest_generation() -> None:
    slices = [
        slice_([gpu(0), gpu(1)], gen=2, name="a"),
        slice_([gpu(2)], gen=2, name="b"),  # same pool, same generation: counts
        slice_([gpu(7)], gen=1, name="old"),  # an older generation being replaced
        slice_([gpu(5)], driver="gpu.example.com", name="other-driver"),
        slice_([gpu(6)], node="node-2", name="other-node"),
    ]
    index = AttachIndex(D, slices, node=NODE)
    assert index.devices() == [key(0), key(1), key(2)]
    assert index.problems == []


def test_index_refuses_duplicates_and_bounds_devices() -> None:
    index = AttachIndex(D, [slice_([gpu(0), gpu(0), gpu(1), gpu(2)])], max_devices=2)
    assert index.devices() == [key(0), key(1)]
    assert any("published twice" in p for p in index.problems)
    assert any("more than 2 devices" in p for p in index.problems)


@pytest.mark.parametrize(
    ("attribute", "value", "want"),
    [
        ("uuid", "gpu-00000001-aaaa", 1),  # case and spaces do not matter for UUIDs
        ("gpu.nvidia.com/uuid", " GPU-00000001-AAAA ", 1),  # with the driver's domain
        ("pcieBusID", "PCI:0000:1a:00", 2),  # the kernel log's spelling
        ("pcieBusID", "00000000:1A:00.0", 2),  # NVML's spelling
        ("pciebusid", "0000:1a:00.0", 2),  # attribute names ignore case as a fallback
        ("index", 3, 3),
        ("index", "3", 3),
        ("name", "gpu-1", 1),
        ("pcieRoot", "pci0000:10", None),  # shared by all four: ambiguous
        ("uuid", "GPU-nope", None),
        ("serial", "x", None),  # no device publishes it
    ],
)
def test_lookup_normalises_values(attribute: str, value: object, want: int | None) -> None:
    index = AttachIndex(D, [slice_([gpu(i) for i in range(4)])])
    found = index.lookup(attribute, value)
    if want is None:
        assert len(found) != 1
    else:
        assert found == (key(want),)


def dev(name: str, attribute: str, value: str) -> dict[str, Any]:
    return {"name": name, "attributes": {attribute: {"string": value}}}


def test_attribute_of_another_domain_and_pci_kind() -> None:
    std = "resource.kubernetes.io/pciBusID"
    index = AttachIndex(
        D, [slice_([dev("gpu-0", std, "0000:3b:00.0"), dev("gpu-1", std, "0000:5d:00.0")])]
    )
    assert index.resolve_attribute("pciBusID") == std
    assert index.pci_attribute() == std
    assert index.lookup("pciBusID", "PCI:0000:5d:00") == (key(1),)
    # an attribute not named like a PCI address: the signal's kind gives the spelling
    named = AttachIndex(D, [slice_([dev("gpu-0", "address", "0000:3b:00.0")])])
    assert named.lookup("address", "PCI:0000:3b:00", hint="pciBusID") == (key(0),)


# --------------------------------------------------------------------------- health


def health(*sources: SourceSpec, key_: KeySpec | None = None, n: int = 4,
           clock: Clock | None = None) -> tuple[AttachedHealth, Clock]:  # fmt: skip
    clock = clock or Clock()
    h = AttachedHealth(D, sources, key=key_, clock=clock)
    h.set_index(AttachIndex(D, [slice_([gpu(i) for i in range(n)])]))
    return h, clock


def states(h: AttachedHealth) -> dict[str, tuple[str, str]]:
    return {r.device: (r.health.value, r.message) for r in h.reports()}


def test_a_signal_marks_the_device_by_attribute_and_the_rest_stay_healthy() -> None:
    h, _ = health(SourceSpec("kmsg", 30), key_=KeySpec("pcieBusID"))
    assert h.reports() == []  # no source has answered yet: nothing is claimed
    problems = h.observe("kmsg", [Signal("pciBusID", "PCI:0000:1a:00", U, "XID 79 fell off")])
    assert problems == []
    assert states(h) == {
        "gpu-0": ("Healthy", ""),
        "gpu-1": ("Healthy", ""),
        "gpu-2": ("Unhealthy", "kmsg: XID 79 fell off"),
        "gpu-3": ("Healthy", ""),
    }
    assert h.reports(7)[0] == ReportedDevice(NODE, "gpu-0", H, "", 7)
    # the version says when reports may have changed; the same answer again does not move it
    version = h.version
    h.observe("kmsg", [Signal("pciBusID", "PCI:0000:1a:00", U, "XID 79 fell off")])
    assert h.version == version
    h.observe("kmsg", [Signal("pciBusID", "PCI:0000:1a:00", H, "")])
    assert h.version == version + 1


def test_matching_order_source_key_own_attribute_driver_key_pci_kind() -> None:
    h, _ = health(
        SourceSpec("nvml", 30),  # signals by uuid: the devices publish it
        SourceSpec("pci", 30, match=KeySpec("index")),  # its own key wins over by
        SourceSpec("kmsg", 30),  # by pciBusID: no such attribute, the PCI kind finds it
    )
    h.observe("nvml", [Signal("uuid", "GPU-00000000-AAAA", U, "lost")])
    h.observe("pci", [Signal("whatever", 1, U, "aer")])
    h.observe("kmsg", [Signal("pciBusID", "0000:1b:00.0", U, "xid")])
    bad = {d: m for d, (s, m) in states(h).items() if s == "Unhealthy"}
    assert bad == {"gpu-0": "nvml: lost", "gpu-1": "pci: aer", "gpu-3": "kmsg: xid"}


def test_unmatched_signals_are_counted_and_reported_once() -> None:
    h, _ = health(SourceSpec("dcgm", 30))
    first = h.observe("dcgm", [Signal("uuid", "GPU-gone", U, "x")] * 3)
    assert len(first) == 1 and "no device of driver gpu.nvidia.com" in first[0]
    assert "'gpu-gone'" in first[0] and "Unhealthy not applied" in first[0]
    assert h.observe("dcgm", [Signal("uuid", "GPU-gone", U, "x")]) == []
    missing = h.observe("dcgm", [Signal("serial", "123", U, "x")])
    assert "publishes attribute 'serial'" in missing[0]
    assert h.sources["dcgm"].unmatched == 5
    assert all(s == "Healthy" for s, _ in states(h).values())
    # a new index may make them match: they are reported again if they still do not
    h.set_index(AttachIndex(D, [slice_([gpu(0)])]))
    assert len(h.observe("dcgm", [Signal("uuid", "GPU-gone", U, "x")])) == 1


def test_ambiguous_keys_are_refused_never_guessed() -> None:
    h, _ = health(SourceSpec("kmsg", 30))
    shared = [gpu(0, bus=0x3B), gpu(1, bus=0x3B), gpu(2)]
    h.set_index(AttachIndex(D, [slice_(shared)]))
    problems = h.observe("kmsg", [Signal("pcieBusID", "0000:3b:00.0", U, "XID 79")])
    assert len(problems) == 1 and "names 2 devices" in problems[0]
    assert "gpu.nvidia.com/node-1/gpu-0, gpu.nvidia.com/node-1/gpu-1" in problems[0]
    assert h.sources["kmsg"].ambiguous == 1
    assert all(s == "Healthy" for s, _ in states(h).values())
    # matchAll: the partitions of one GPU all take its fault
    h2, _ = health(SourceSpec("kmsg", 30), key_=KeySpec("pcieBusID", match_all=True))
    h2.set_index(AttachIndex(D, [slice_(shared)]))
    assert h2.observe("kmsg", [Signal("pcieBusID", "0000:3b:00.0", U, "XID 79")]) == []
    assert [d for d, (s, _) in states(h2).items() if s == "Unhealthy"] == ["gpu-0", "gpu-1"]


def test_lease_a_device_the_source_stops_answering_for_turns_unknown() -> None:
    h, clock = health(SourceSpec("nvml", 10))
    h.observe("nvml", [Signal("uuid", f"GPU-{i:08d}-AAAA", H, "") for i in range(4)])
    assert h.next_deadline() == 1010.0
    clock.now = 1005.0
    h.observe("nvml", [Signal("uuid", f"GPU-{i:08d}-AAAA", H, "") for i in range(3)])
    assert h.next_deadline() == 1010.0  # gpu-3's lease still ends first
    clock.now = 1010.0
    assert states(h)["gpu-3"][0] == "Healthy"  # ends once the clock is past it
    clock.now = 1010.5
    assert states(h)["gpu-3"] == ("Unknown", "nvml: no report of this device for 10 s")
    assert states(h)["gpu-0"][0] == "Healthy"
    assert h.next_deadline() == 1015.0
    # answering again ends it
    h.observe("nvml", [Signal("uuid", "GPU-00000003-AAAA", H, "")])
    assert states(h)["gpu-3"] == ("Healthy", "")


def test_a_silent_source_makes_every_device_unknown_after_its_timeout() -> None:
    h, clock = health(SourceSpec("kmsg", 5), SourceSpec("nvml", 30))
    h.observe("kmsg", [])
    h.observe("nvml", [Signal("uuid", "GPU-00000000-AAAA", H, "")])
    h.failed("kmsg", "PermissionError: /dev/kmsg")
    clock.now = 1004.0
    assert all(s == "Healthy" for s, _ in states(h).values())
    clock.now = 1005.5
    got = states(h)
    assert got["gpu-1"] == ("Unknown", "kmsg: no answer for 5 s: PermissionError: /dev/kmsg")
    assert got["gpu-0"][0] == "Unknown"  # worst wins: nvml's Healthy does not hide it
    assert h.sources["kmsg"].failures == 1 and h.sources["kmsg"].polls == 2


def test_a_source_that_never_answers_is_unknown_after_its_timeout() -> None:
    h, clock = health(SourceSpec("nvml", 10), SourceSpec("kmsg", 30))
    h.observe("kmsg", [])
    clock.now = 1011.0
    assert states(h)["gpu-0"] == ("Unknown", "nvml: no answer yet for 10 s")


def test_worst_health_wins_and_the_message_names_each_source() -> None:
    h, _ = health(SourceSpec("kmsg", 30), SourceSpec("dcgm", 30), SourceSpec("nvml", 30))
    h.observe("kmsg", [Signal("pcieBusID", "PCI:0000:18:00", U, "XID 79 fell off the bus")])
    h.observe("dcgm", [Signal("uuid", "GPU-00000000-AAAA", U, "XID 79")])
    h.observe("nvml", [Signal("uuid", "GPU-00000000-AAAA", H, "")])
    assert states(h)["gpu-0"] == ("Unhealthy", "kmsg: XID 79 fell off the bus; dcgm: XID 79")
    h.observe("kmsg", [Signal("pcieBusID", "PCI:0000:18:00", H, "")])
    h.observe("dcgm", [Signal("uuid", "GPU-00000000-AAAA", X, "no data")])
    assert states(h)["gpu-0"] == ("Unknown", "dcgm: no data")
    # within one poll, two signals for one device: the worse one counts
    h.observe("dcgm", [Signal("uuid", "GPU-00000000-AAAA", U, "a"), Signal("index", 0, H, "b")])
    assert states(h)["gpu-0"] == ("Unhealthy", "dcgm: a")


def test_unlisted_unknown_marks_devices_the_source_does_not_list() -> None:
    h, clock = health(SourceSpec("nvml", 10, unlisted="unknown"))
    h.observe("nvml", [Signal("uuid", f"GPU-{i:08d}-AAAA", H, "") for i in range(3)])
    assert states(h)["gpu-3"] == ("Unknown", "nvml: does not report this device")
    # a device it listed before keeps its health for its lease, then reads unlisted
    clock.now = 1005.0
    h.observe("nvml", [Signal("uuid", f"GPU-{i:08d}-AAAA", H, "") for i in range(2)])
    assert states(h)["gpu-2"][0] == "Healthy"
    clock.now = 1012.0
    h.observe("nvml", [Signal("uuid", f"GPU-{i:08d}-AAAA", H, "") for i in range(2)])
    assert states(h)["gpu-2"] == ("Unknown", "nvml: does not report this device")


def test_index_change_forgets_devices_gone_and_bounds_signals() -> None:
    h, _ = health(SourceSpec("kmsg", 30))
    h.observe("kmsg", [Signal("index", 3, U, "x")])
    h.set_index(AttachIndex(D, [slice_([gpu(0), gpu(1)])]))
    assert set(states(h)) == {"gpu-0", "gpu-1"}
    assert key(3) not in h.sources["kmsg"].opinions
    from drahealth.core import _attach

    flood = [Signal("index", 0, H, "")] * (_attach.MAX_SIGNALS_PER_POLL + 5)
    h.observe("kmsg", flood)
    assert h.sources["kmsg"].dropped == 5


def test_messages_are_cut_to_the_kubelet_limit() -> None:
    h, _ = health(SourceSpec("a", 30), SourceSpec("b", 30))
    h.observe("a", [Signal("index", 0, U, "é" * 900)])
    h.observe("b", [Signal("index", 0, U, "x" * 900)])
    message = states(h)["gpu-0"][1]
    assert len(message.encode()) <= 1024 and message.endswith("...")


def test_bad_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        AttachedHealth(D, [SourceSpec("a", 1), SourceSpec("a", 2)])
    with pytest.raises(ValueError, match="timeout"):
        SourceSpec("a", 0)
    with pytest.raises(ValueError, match="unlisted"):
        SourceSpec("a", 1, unlisted="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attribute"):
        KeySpec(" ")


# --------------------------------------------------------------------------- pods


def test_pod_condition_statuses_and_transition_time() -> None:
    k0, k1 = key(0), key(1)
    healthy = pod_condition([(k0, H, ""), (k1, H, "")], None, "T1")
    assert healthy == {
        "type": POD_CONDITION_TYPE, "status": "True", "reason": "AllDevicesHealthy",
        "message": "2 devices healthy", "lastTransitionTime": "T1",
    }  # fmt: skip
    bad = pod_condition([(k0, U, "kmsg: XID 79"), (k1, X, "")], healthy, "T2")
    assert bad["status"] == "False" and bad["reason"] == "DevicesUnhealthy"
    assert bad["message"] == (
        "1 of 2 devices unhealthy, 1 unknown: gpu.nvidia.com/node-1/gpu-0 (kmsg: XID 79), "
        "gpu.nvidia.com/node-1/gpu-1 (Unknown)"
    )
    assert bad["lastTransitionTime"] == "T2"
    same = pod_condition([(k0, U, "kmsg: XID 79 again"), (k1, H, "")], bad, "T3")
    assert same["lastTransitionTime"] == "T2" and pod_condition_differs(bad, same)
    unknown = pod_condition([(k0, X, "nvml: no answer")], None, "T4")
    assert unknown["status"] == "Unknown" and unknown["reason"] == "DevicesUnknown"
    assert unknown["message"].startswith("1 of 1 device unknown: ")
    assert not pod_condition_differs(bad, {**bad, "lastTransitionTime": "later"})
    assert pod_condition_differs(None, bad)


def test_pod_condition_message_is_bounded() -> None:
    devices = [(DeviceKey(D, NODE, f"gpu-{i}"), U, "m" * 500) for i in range(50)]
    message = pod_condition(devices, None, "T")["message"]
    assert len(message) <= 1024 and message.endswith("more")
    assert message.startswith("50 of 50 devices unhealthy: ")


def test_a_repeated_answer_only_refreshes_leases_and_counts() -> None:
    h, clock = health(SourceSpec("kmsg", 10))
    answer = [pci_signal := Signal("pcieBusID", "0000:18:00.0", U, "XID 79"),
              Signal("uuid", "GPU-gone", U, "x")]  # fmt: skip
    assert len(h.observe("kmsg", answer)) == 1
    version = h.version
    for step in range(1, 4):
        clock.now = 1000.0 + 9 * step
        assert h.observe("kmsg", list(answer)) == []  # equal, not the same list
    assert h.version == version
    state = h.sources["kmsg"]
    assert (state.signals, state.unmatched, state.polls) == (8, 4, 4)
    clock.now = 1036.0  # 9 s after the last answer: the lease still runs
    assert states(h)["gpu-0"] == ("Unhealthy", "kmsg: XID 79")
    # a different answer takes the full path again
    h.observe("kmsg", [pci_signal, Signal("index", 1, U, "y")])
    assert h.version == version + 1 and states(h)["gpu-1"] == ("Unhealthy", "kmsg: y")


def test_repeats_handed_over_later_are_counted_as_the_previous_outcome() -> None:
    h, _ = health(SourceSpec("dcgm", 10))
    h.observe("dcgm", [Signal("uuid", "GPU-gone", U, "x"), Signal("index", 0, H, "")])
    h.failed("dcgm", "timeout", repeats=3)  # 3 more polls answered as the first one
    h.observe("dcgm", [], repeats=2)  # 2 more polls failed as the last one
    state = h.sources["dcgm"]
    assert (state.polls, state.failures, state.signals, state.unmatched) == (8, 3, 8, 4)


def test_keys_for_a_source_follow_the_matching_order() -> None:
    h, _ = health(
        SourceSpec("pci", 30),  # keyed pciBusID: not published, the PCI kind finds pcieBusID
        SourceSpec("exec", 30, match=KeySpec("index")),  # its own match wins
        SourceSpec("file", 30),  # keyed uuid: the devices publish it
        n=3,
    )
    assert h.keys_for("pci", "pciBusID") == ("0000:18:00.0", "0000:19:00.0", "0000:1a:00.0")
    assert h.keys_for("exec", "uuid") == ("0", "1", "2")
    assert h.keys_for("file", "uuid") == ("GPU-00000000-AAAA", "GPU-00000001-AAAA",
                                          "GPU-00000002-AAAA")  # fmt: skip
    assert h.keys_for("file", "name") == ("gpu-0", "gpu-1", "gpu-2")
    assert h.keys_for("file", "noSuchAttribute") == ()
    assert h.keys_for("no-such-source", "uuid") == ()
    index = AttachIndex(D, [slice_([gpu(0, extra={"mig": {"bool": True}}), gpu(1)])])
    assert index.values("mig") == ("true",)
