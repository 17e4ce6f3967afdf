"""The kernel-log source: XID lines as real kernels and log shippers write them, hostile and
malformed lines, latches, and following /dev/kmsg records or a rotating file."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from drahealth.core import Health, Signal
from drahealth.sources import KmsgSource
from drahealth.sources._attached import AttachedSource
from drahealth.sources._kmsg import MalformedLine, parse_kernel_message

H, U = Health.HEALTHY, Health.UNHEALTHY
FALLEN = "XID 79: GPU has fallen off the bus (reset the GPU)"

# -- parsing ------------------------------------------------------------------------------

#: (line, address, health, message) from real kernels, dmesg, journald and syslog files
REAL_LINES = [
    # the driver's format since ~R470: pid and name of the process
    (
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        "0000:3b:00.0", U, FALLEN,
    ),
    # pid without name, a function digit, a dmesg time prefix
    (
        "[12345.678901] NVRM: Xid (PCI:0000:3B:00.0): 79, pid=1122, GPU has fallen off the bus.",
        "0000:3b:00.0", U, FALLEN,
    ),
    # syslog file with a kernel: prefix and the dmesg time inside
    (
        "Mar 27 00:13:33 gpu-node kernel: [18296.507578] NVRM: Xid (PCI:0000:01:00): 31, "
        "Ch 00000009, engmask 00000101, intr 10000000",
        "0000:01:00.0", H, "XID 31: GPU memory page fault (application error) (informational)",
    ),
    # before "PCI:" was written
    (
        "May 6 00:38:27 alex kernel: [ 4909.922970] NVRM: Xid (0000:01:00): 13, 0005 00000000",
        "0000:01:00.0", H,
        "XID 13: graphics engine exception (application error) (informational)",
    ),
    # dmesg --ctime, no process known
    (
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
        "name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 1, SM 0)",
        "0000:cb:00.0", H,
        "XID 13: graphics engine exception (application error) (informational)",
    ),
    # an application XID names the process
    (
        "NVRM: Xid (PCI:0000:00:06): 31, pid=79749, name=exe, Ch 0000000a, intr 00000000. "
        "MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_T1_7 faulted @ 0x2b57_b3000000",
        "0000:00:06.0", H,
        "XID 31: GPU memory page fault (application error) (informational; pid 79749 exe)",
    ),
    # journalctl -k -o short-iso
    (
        "2025-01-08T10:11:12+0000 node-7 kernel: NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, "
        "Row Remapper: New row marked for remapping, reset gpu to activate.",
        "0000:10:1c.0", U, "XID 63: ECC page retirement or row remapping recorded (reset the GPU)",
    ),
    (
        "NVRM: Xid (PCI:0000:83:00): 48, pid=2, name=train, An uncorrectable double bit error",
        "0000:83:00.0", U, "XID 48: double-bit ECC error (reset the GPU)",
    ),
    # an XID the table does not know: the driver's own words
    (
        "NVRM: Xid (PCI:0000:3b:00): 154, pid=1, name=x, GPU recovery action changed from "
        "0x0 (None) to 0x1 (Reset).",
        "0000:3b:00.0", U,
        "XID 154: GPU recovery action changed from 0x0 (None) to 0x1 (Reset) (reset the GPU)",
    ),
    # fallen off the bus without an Xid line, one line and the three-line notice in one record
    (
        "Okt 06 17:59:27 balrog kernel: NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
        "0000:01:00.0", U, FALLEN,
    ),
    (
        "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system "
        "has\nNVRM: fallen off the bus and is not responding to commands.",
        "0000:b3:00.0", U, FALLEN,
    ),
    # AMD and Intel
    (
        "amdgpu 0000:03:00.0: amdgpu: GPU reset(2) failed",
        "0000:03:00.0", U, "amdgpu: GPU reset 2 failed (reboot the node)",
    ),
    ("amdgpu 0000:03:00.0: GPU reset(3) succeeded!", "0000:03:00.0", H,
     "amdgpu: GPU reset 3 succeeded"),
    (
        "i915 0000:00:02.0: [drm] *ERROR* GT0: Failed to reset chip",
        "0000:00:02.0", U, "i915: GPU reset failed, the GPU is wedged (reboot the node)",
    ),
    (
        "i915 0000:00:02.0: [drm] GPU HANG: ecode 9:1:85dffffb, in gnome-shell [1234]",
        "0000:00:02.0", H, "i915: GPU hang, ecode 9:1:85dffffb (the driver reset the engine)",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("line", "address", "health", "message"), REAL_LINES)
def test_real_world_lines(line: str, address: str, health: Health, message: str) -> None:
    event = parse_kernel_message(line)
    assert event is not None
    assert (event.address, event.health, event.message) == (address, health, message)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "NET: Registered protocol family 10",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        "NVRM: GPU at PCI:0000:01:00: GPU-8ba16ede-b303-d769-7297-d266d9383b89",
        "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context",
        "amdgpu 0000:03:00.0: amdgpu: GPU reset begin!",
        "python[123]: my log says Xid but not NVRM",
    ],
)
def test_lines_that_say_nothing_about_a_gpu(line: str) -> None:
    assert parse_kernel_message(line) is None


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:3b:00): abc, pid=1",
        "NVRM: Xid (PCI:0000:3b:00): 4294967295, pid=1",  # no real XID has ten digits
        "NVRM: Xid (PCI:0000:3b:00) 79",
        "NVRM: Xid 79",
        "NVRM: Xid (" + "0" * 10_000 + "): 79",
    ],
)
def test_unreadable_xid_lines_are_malformed(line: str) -> None:
    with pytest.raises(MalformedLine, match="unreadable XID line"):
        parse_kernel_message(line)


def test_an_address_that_is_not_one_is_reported_as_such() -> None:
    event = parse_kernel_message("Jan 13 22:02:13 host kernel: NVRM: Xid (0009:00): 53, CMDre 0")
    assert event is not None and event.address is None and event.health is U


def test_severity_overrides() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, Graphics Exception"
    event = parse_kernel_message(line, fatal_xids=[13])
    assert event is not None and event.health is U
    event = parse_kernel_message(line.replace(": 13,", ": 79,"), informational_xids=[79])
    assert event is not None and event.health is H


def test_hostile_process_names_never_reach_the_message() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 13, pid=5, name=\x1b]0;owned\x07\x1b[31mev\u202eil, x"
    event = parse_kernel_message(line)
    assert event is not None
    assert event.message.isprintable() and "\x1b" not in event.message
    assert "owned" not in event.message
    # a name cannot change the XID or the device: both come before it
    line = "NVRM: Xid (PCI:0000:3b:00): 13, pid=5, name=a), 79, GPU has fallen off the bus"
    event = parse_kernel_message(line)
    assert event is not None and event.xid == 13 and event.health is H


# -- following a file ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def xid(address: str = "0000:3b:00", code: int = 79) -> str:
    return f"NVRM: Xid (PCI:{address}): {code}, pid=1234, name=python, GPU has fallen off the bus."


def append(path: Path, *lines: str | bytes) -> None:
    with open(path, "ab") as f:
        for line in lines:
            f.write(line if isinstance(line, bytes) else line.encode() + b"\n")


def one(signals: list[Signal]) -> tuple[str, str, Health, str]:
    assert len(signals) == 1, signals
    s = signals[0]
    return s.by, s.value, s.health, s.message


def test_it_is_an_attached_source(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source: AttachedSource = KmsgSource(str(log))
    assert (source.name, source.interval, source.timeout) == ("kmsg", 0.025, 30.0)
    assert source.poll() == []


def test_a_file_is_followed_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, xid("0000:3b:00"))  # yesterday's fault: not news
    clock = Clock()
    source = KmsgSource(str(log), clock=clock)
    assert source.poll() == []
    append(log, "usb 1-1: new high-speed USB device", xid("0000:86:00"))
    assert one(source.poll()) == ("pciBusID", "0000:86:00.0", U, FALLEN)
    assert source.counters.lines == 2 and source.counters.parsed == 1


def test_a_fatal_xid_is_latched_until_clear_after_without_a_new_one(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    clock = Clock()
    source = KmsgSource(str(log), clock=clock, clear_after=600)
    append(log, xid())
    assert one(source.poll())[2] is U
    clock.now += 500
    append(log, xid(code=48))  # a new fatal line: the latch starts again, its message shown
    assert one(source.poll())[2:] == (U, "XID 48: double-bit ECC error (reset the GPU)")
    clock.now += 599
    assert one(source.poll())[2] is U
    clock.now += 1
    by, value, health, message = one(source.poll())
    assert health is H and message == (
        "recovered: no fatal kernel-log line for 600 s after "
        "XID 48: double-bit ECC error (reset the GPU)"
    )
    # answered for on every poll from now on (its lease never runs out), message shown once
    assert one(source.poll()) == (by, value, H, "")
    clock.now += 10_000
    assert one(source.poll()) == (by, value, H, "")


def test_without_clear_after_a_fault_stays_until_the_source_restarts(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    clock = Clock()
    source = KmsgSource(str(log), clock=clock, clear_after=None)
    append(log, xid())
    assert one(source.poll())[2] is U
    clock.now += 10**9
    assert one(source.poll())[2] is U


def test_application_xids_leave_the_device_healthy_and_show_the_message_once(
    tmp_path: Path,
) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log))
    append(log, "NVRM: Xid (PCI:0000:3b:00): 43, pid=77, name=train, Ch 00000010")
    msg = "XID 43: GPU stopped processing (application error) (informational; pid 77 train)"
    assert one(source.poll()) == ("pciBusID", "0000:3b:00.0", H, msg)
    assert one(source.poll()) == ("pciBusID", "0000:3b:00.0", H, "")


def test_an_informational_line_does_not_hide_a_latched_fault(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log))
    append(log, xid(), "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, Graphics Exception")
    assert one(source.poll())[2:] == (U, FALLEN)


def test_a_reset_that_succeeded_ends_an_amd_fault(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log))
    append(log, "amdgpu 0000:03:00.0: amdgpu: GPU reset(1) failed")
    assert one(source.poll())[2] is U
    append(log, "amdgpu 0000:03:00.0: amdgpu: GPU reset(2) succeeded!")
    assert one(source.poll())[2:] == (H, "amdgpu: GPU reset 2 succeeded")


def test_several_devices_and_the_key_attribute(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log), by="gpu.nvidia.com/pcieBusID")
    append(log, xid("0000:3b:00"), "NVRM: Xid (PCI:0000:86:00): 13, pid=1, name=x, y")
    got = {(s.by, s.value, s.health) for s in source.poll()}
    assert got == {
        ("gpu.nvidia.com/pcieBusID", "0000:3b:00.0", U),
        ("gpu.nvidia.com/pcieBusID", "0000:86:00.0", H),
    }
    assert source.health_by_address() == {"0000:3b:00.0": U, "0000:86:00.0": H}


def test_bad_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log), max_line_bytes=200)
    append(
        log,
        b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=\xff\xfe\xc3\x28, GPU has fallen off\n",
        "NVRM: Xid (PCI:0000:3b:00): xx, broken",
        "NVRM: Xid (0009:00): 53, an address that is not one",
        b"\x00\x01\x02 binary junk \x1b[2J\n",
        "x" * 5000,  # oversized: cut, the rest dropped
        xid("0000:86:00"),
    )
    signals = source.poll()
    assert {s.value for s in signals} == {"0000:3b:00.0", "0000:86:00.0"}
    assert all(s.health is U for s in signals)
    c = source.counters
    assert (c.lines, c.parsed, c.malformed, c.unknown_device, c.truncated) == (6, 2, 1, 1, 1)
    assert c.as_dict()["malformed"] == 1


def test_an_oversized_line_is_cut_and_its_fault_still_read(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log), max_line_bytes=256)
    append(log, xid() + " " + "z" * 100_000, xid("0000:86:00"))
    assert {s.value for s in source.poll()} == {"0000:3b:00.0", "0000:86:00.0"}
    assert source.counters.truncated == 1 and source.counters.lines == 2


def test_a_line_is_read_only_once_it_is_complete(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log))
    line = xid()
    append(log, line[:20].encode())
    assert source.poll() == []
    append(log, line[20:])
    assert one(source.poll())[2] is U


def test_a_flood_is_read_at_most_max_lines_per_poll(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log), max_lines=1000)
    append(log, *(f"noise {i}" for i in range(2500)), xid())
    assert source.poll() == [] and source.counters.lines == 1000
    assert source.poll() == [] and source.counters.lines == 2000
    assert one(source.poll())[2] is U and source.counters.lines == 2501


def test_rotation_reads_the_old_files_rest_then_the_new_file(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log))
    assert source.poll() == []
    append(log, xid("0000:3b:00"))
    log.rename(tmp_path / "kern.log.1")  # logrotate: move, then create
    assert {s.value for s in source.poll()} == {"0000:3b:00.0"}
    append(log, xid("0000:86:00"))
    assert {s.value for s in source.poll()} == {"0000:3b:00.0", "0000:86:00.0"}
    assert source.counters.reopened == 1


def test_a_removed_file_is_waited_for(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log))
    source.poll()
    log.unlink()
    assert source.poll() == []
    append(log, xid())
    assert one(source.poll())[2] is U


def test_truncation_in_place_reads_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, *(f"old line {i}" for i in range(100)))
    source = KmsgSource(str(log))
    assert source.poll() == []
    with open(log, "wb") as f:  # copytruncate
        f.write((xid() + "\n").encode())
    assert one(source.poll())[2] is U
    assert source.counters.reopened == 1


def test_a_missing_file_is_an_error_until_it_appears_then_read_from_its_start(
    tmp_path: Path,
) -> None:
    log = tmp_path / "kern.log"
    source = KmsgSource(str(log))
    with pytest.raises(FileNotFoundError, match=r"kern\.log"):
        source.poll()
    append(log, xid())
    assert one(source.poll())[2] is U


def test_from_start_reads_a_bounded_backlog(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, xid("0000:3b:00"), *(f"filler line {i:04d}" for i in range(100)), xid("0000:86:00"))
    source = KmsgSource(str(log), from_start=True, backlog_bytes=1000)
    assert {s.value for s in source.poll()} == {"0000:86:00.0"}  # 3b is past the backlog
    assert source.counters.lines < 60  # the partial first line is skipped, not parsed
    everything = KmsgSource(str(log), from_start=True)
    assert {s.value for s in everything.poll()} == {"0000:3b:00.0", "0000:86:00.0"}


def test_the_three_line_notice_of_a_text_log(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log))
    append(
        log,
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "[ 1843.308146] NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "[ 1843.308147] NVRM: fallen off the bus and is not responding to commands.",
    )
    assert one(source.poll())[1:] == ("0000:b3:00.0", U, FALLEN)


def test_max_devices_bounds_the_devices_remembered(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    clock = Clock()
    source = KmsgSource(str(log), max_devices=2, clear_after=60, clock=clock)
    append(log, xid("0000:01:00"), xid("0000:02:00"), xid("0000:03:00"))
    assert {s.value for s in source.poll()} == {"0000:01:00.0", "0000:02:00.0"}
    assert source.counters.overflow == 1
    clock.now += 61  # both faults over: the device seen longest ago makes room
    append(log, xid("0000:03:00"))
    assert {s.value for s in source.poll()} == {"0000:02:00.0", "0000:03:00.0"}


def test_kmsg_records_in_a_text_log(tmp_path: Path) -> None:
    """A forwarded /dev/kmsg (or the simulated node's kernel log): records with headers,
    escapes decoded, records user space wrote ignored."""
    log = tmp_path / "kmsg"
    log.touch()
    source = KmsgSource(str(log))
    append(
        log,
        "4,10,5000000,-;" + xid("0000:3b:00"),
        "14,11,5000001,-;" + xid("0000:86:00"),  # facility 1 (user): echo > /dev/kmsg
        "3,12,5000002,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: has\\x0aNVRM: fallen off"
        " the bus and is not responding to commands.",
    )
    assert {s.value for s in source.poll()} == {"0000:3b:00.0", "0000:b3:00.0"}
    assert source.counters.foreign == 1
    trusting = KmsgSource(str(log), from_start=True, kernel_only=False)
    assert len(trusting.poll()) == 3


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"interval": 0}, "interval must be a positive number"),
        ({"timeout": -1}, "timeout must be a positive number"),
        ({"clear_after": float("nan")}, "clear_after must be a positive number"),
        ({"max_lines": 0}, "max_lines must be a positive integer"),
        ({"max_line_bytes": 1.5}, "max_line_bytes must be a positive integer"),
        ({"max_devices": -3}, "max_devices must be a positive integer"),
        ({"format": "json"}, "format must be auto, kmsg or text"),
        ({"path": ""}, "path must name"),
    ],
)
def test_bad_settings_are_named(tmp_path: Path, kwargs: dict[str, object], error: str) -> None:
    args: dict[str, object] = {"path": str(tmp_path / "x")} | kwargs
    with pytest.raises(ValueError, match=error):
        KmsgSource(**args)  # type: ignore[arg-type]


# -- /dev/kmsg records --------------------------------------------------------------------


def kmsg_source(clock: Clock, **kwargs: object) -> tuple[KmsgSource, socket.socket]:
    """A source reading /dev/kmsg's record semantics (one record per read, EAGAIN when
    none is left) from a SOCK_SEQPACKET pair; returns the writing end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.setblocking(False)
    source = KmsgSource(
        "/nonexistent/kmsg",
        format="kmsg",
        clock=clock,
        kernel_clock=lambda: KERNEL_NOW,
        **kwargs,  # type: ignore[arg-type]
    )
    source._reader.fd = os.dup(theirs.fileno())
    theirs.close()
    return source, ours


#: The kernel's clock as the fake /dev/kmsg has it: a day after boot, so records an hour
#: old exist whatever the machine's own uptime.
KERNEL_NOW = 86400.0


def usec_ago(seconds: float) -> int:
    return int((KERNEL_NOW - seconds) * 1e6)


def test_kmsg_records_and_their_continuation_lines() -> None:
    source, kernel = kmsg_source(Clock())
    kernel.send(
        f"3,100,{usec_ago(1)},-;{xid()}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n".encode()
    )
    kernel.send(b"6,101,5,-;NET: Registered protocol family 10\n")
    kernel.send(b"not a record at all\n")
    assert one(source.poll())[1:3] == ("0000:3b:00.0", U)
    c = source.counters
    assert (c.lines, c.parsed, c.malformed) == (3, 1, 1)


def test_kmsg_sequence_gaps_count_lost_records() -> None:
    source, kernel = kmsg_source(Clock())
    for seq in (1, 2, 7, 8, 20):
        kernel.send(f"6,{seq},{usec_ago(0)},-;hello\n".encode())
    source.poll()
    assert source.counters.lost == 4 + 11


def test_kmsg_ignores_what_user_space_wrote() -> None:
    source, kernel = kmsg_source(Clock())
    # <14> from user space: facility 1, the kernel never lets it write facility 0
    kernel.send(f"14,1,{usec_ago(0)},-;{xid()}\n".encode())
    assert source.poll() == [] and source.counters.foreign == 1


def test_kmsg_replay_restores_only_faults_younger_than_clear_after() -> None:
    clock = Clock()
    source, kernel = kmsg_source(clock, clear_after=600)
    kernel.send(f"3,1,{usec_ago(3600)},-;{xid('0000:01:00')}\n".encode())  # an hour ago
    kernel.send(f"3,2,{usec_ago(60)},-;{xid('0000:02:00')}\n".encode())  # a minute ago
    kernel.send(f"4,3,{usec_ago(30)},-;NVRM: Xid (PCI:0000:03:00): 13, pid=1, name=a, b\n".encode())
    got = {s.value: (s.health, s.message) for s in source.poll()}
    # the old fault is over; the recent one is latched for what is left of its 600 s; old
    # informational lines are history, not news
    assert got == {"0000:01:00.0": (H, ""), "0000:02:00.0": (U, FALLEN), "0000:03:00.0": (H, "")}
    clock.now += 530
    assert source.health_by_address()["0000:02:00.0"] is U
    clock.now += 20
    assert source.health_by_address()["0000:02:00.0"] is H
    # after the replay, lines are news whatever their timestamp says
    kernel.send(f"3,4,{usec_ago(3600)},-;{xid('0000:04:00')}\n".encode())
    assert source.health_by_address().get("0000:04:00.0") is None
    source.poll()
    assert source.health_by_address()["0000:04:00.0"] is U


def test_the_real_dev_kmsg_is_read_read_only_without_error() -> None:
    """Item 5: the real kernel log, where this machine lets us read it."""
    path = "/dev/kmsg"
    if not os.path.exists(path):
        pytest.skip("no /dev/kmsg here")
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        pytest.skip(f"/dev/kmsg not readable here: {exc}")
    source = KmsgSource(path, max_lines=2000)
    assert source._reader.headed  # a character device: read as records
    deadline = time.monotonic() + 10
    while source._reader.replaying:  # the whole ring buffer, 2,000 records a poll
        signals = source.poll()
        assert time.monotonic() < deadline, "the ring buffer was not read within 10 s"
    assert all(s.by == "pciBusID" for s in signals)
    c = source.counters
    assert c.lines >= 1 and c.malformed == 0, c  # every record had a header
    source.poll()  # and reading on at the end is quiet
    source.close()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(600, 600.0), ("10m", 600.0), ("30s", 30.0), ("1h", 3600.0), ("500ms", 0.5), (None, None),
     ("never", None)],
)  # fmt: skip
def test_clear_after_takes_durations(
    tmp_path: Path, value: float | str | None, seconds: float | None
) -> None:
    assert KmsgSource(str(tmp_path / "x"), clear_after=value).clear_after == seconds


def test_clear_after_rejects_what_is_not_a_duration(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="clear_after must be seconds, a duration"):
        KmsgSource(str(tmp_path / "x"), clear_after="ten minutes")


def test_built_from_the_agents_attach_file(tmp_path: Path) -> None:
    from drahealth.node._attach_config import build_source, parse_attach_config

    log = tmp_path / "kern.log"
    log.touch()
    config = parse_attach_config(
        f"""
driver: gpu.nvidia.com
key: pcieBusID
sources:
  - kind: kmsg
    path: {log}
    interval: 50ms
    timeout: 1m
    clearAfter: 2m
    fromStart: true
    informationalXids: [13, 31, 43, 45, 68, 109, 94]
    maxLines: 100
"""
    )
    source, interval, timeout = build_source(config.drivers[0].sources[0])
    assert isinstance(source, KmsgSource)
    assert (interval, timeout, source.clear_after, source.max_lines) == (0.05, 60.0, 120.0, 100)
    append(log, xid(code=94))
    assert one(source.poll())[2] is H  # 94 made informational by the file


def test_the_documented_attach_entry_builds() -> None:
    import re

    from drahealth.node._attach_config import build_source, parse_attach_config

    doc = (Path(__file__).parents[3] / "docs" / "sources.md").read_text()
    start = doc.index("## Kernel log (kmsg)")
    section = doc[start : doc.index("\n## ", start + 1)]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    config = parse_attach_config(block)
    source, interval, timeout = build_source(config.drivers[0].sources[0])
    assert isinstance(source, KmsgSource)
    assert (source.path, interval, timeout, source.clear_after) == ("/dev/kmsg", 0.025, 30.0, 600)
    source.close()
