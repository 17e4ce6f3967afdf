"""The next variants of round three's attacks on the node's health sources and the child
runner, each of which got through the first fixes.

* Any local user makes the kernel write a record that starts with text of their choosing:
  a process named ``NVRM: GPU 3b:00`` (15 characters) that crashes in code mapped from a
  file named ``fallen off the bus`` gets ``NVRM: GPU 3b:00[1768]: segfault at 0 ... in
  fallen off the bus[...]``, which read as XID 79 (and ``i915 00:02.0: x`` with ``Failed
  to reset chip`` as a wedged GPU). No pattern leaves a gap after a short address now.

* Text logs in the formats ``dmesg`` and ``journalctl`` also write (``journalctl -o
  short-monotonic``, ``short-unix``, ``short-full``, ``dmesg --time-format iso``,
  ``dmesg -x``, ``dmesg -r``, ``dmesg -d``, ``dmesg --time-format reltime``) still carry
  the driver's fault lines: once the match was anchored, a GPU that fell off the bus in
  such a log was missed. The facility ``dmesg -x`` and ``dmesg -r`` print is checked.
* A record netfilter's LOG target wrote starts with a prefix the rule's author chose
  (``nft ... log prefix "NVRM: Xid ..."``): it is no fault.
* A log that was truncated in place while its writer kept its offset (``dmesg -w >
  file`` and logrotate's copytruncate) has a hole of NUL bytes before the next line:
  the fault line after the hole is read.
* A probe file's integer too long for Python to convert (over 4,300 digits) makes only
  its entry Unknown; it failed the whole poll with a ValueError.
* The child runner refuses a timeout that is no number of seconds (NaN, negative), and
  a very long one (1e10 s) waiting for a slot no longer raises OverflowError.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from pathlib import Path

import pytest

import drahealth._child as child
from drahealth.core import Health
from drahealth.sources import FileProbe, KmsgSource
from drahealth.sources._keyed import ExecAttachedProbe, FileAttachedProbe
from drahealth.sources._kmsg import parse_kernel_message
from drahealth.sources._probe import run_probe

pytestmark = pytest.mark.timeout(60)

H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


# -- text log formats ----------------------------------------------------------------------

#: Prefixes dmesg and journalctl write before a kernel message (besides the ones of round
#: three's first fix).
MORE_PREFIXES = [
    "[   12.345678] gpu-node kernel: ",  # journalctl -k -o short-monotonic
    "1711500813.123456 gpu-node kernel: ",  # journalctl -k -o short-unix
    "Fri 2024-03-27 00:13:33 UTC gpu-node kernel: ",  # journalctl -k -o short-full
    "2024-03-27T00:13:33,123456+00:00 ",  # dmesg --time-format iso
    "kern  :err   : [  123.456789] ",  # dmesg -x
    "kern  :warn  : ",  # dmesg -x -t
    "<3>[  123.456789] ",  # dmesg -r
    "[  123.456789 <    0.000123>] ",  # dmesg -d
    "[Mar27 00:13] ",  # dmesg --time-format reltime
    "[  +0.000123] ",  # dmesg --time-format reltime, within the minute
    "2024-03-27T00:13:33.123456+00:00 gpu-node kernel: [  123.456789] ",  # rsyslog, imklog
]


@pytest.mark.parametrize("prefix", MORE_PREFIXES)
def test_the_drivers_line_counts_behind_more_log_formats(prefix: str) -> None:
    event = parse_kernel_message(prefix + XID79)
    assert event is not None and (event.address, event.health) == ("0000:3b:00.0", U)


@pytest.mark.parametrize("prefix", MORE_PREFIXES)
def test_an_echo_is_still_no_fault_behind_them(prefix: str) -> None:
    assert parse_kernel_message(prefix + "tmpfs: Unknown parameter '" + XID79 + "'") is None


@pytest.mark.parametrize(
    "prefix",
    [
        "user  :err   : [  123.456789] ",  # dmesg -x: a record user space wrote
        "daemon:warn  : ",
        "<11>[  123.456789] ",  # dmesg -r: facility 1 (user)
        "<14>",
        "1711500813.123456 gpu-node myprog[12]: ",
        "Fri 2024-03-27 00:13:33 UTC gpu-node myprog[12]: ",
    ],
)
def test_a_user_record_in_those_formats_is_no_fault(prefix: str) -> None:
    assert parse_kernel_message(prefix + XID79) is None


def test_a_followed_dmesg_iso_log_reports_the_fault(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.log"
    log.touch()
    source = KmsgSource(str(log))
    with open(log, "a") as f:
        f.write("2024-03-27T00:13:33,123456+00:00 " + XID79 + "\n")
    assert [(s.value, s.health) for s in source.poll()] == [("0000:3b:00.0", U)]


# -- netfilter's LOG target --------------------------------------------------------------

#: What ``nft add rule ... log prefix "<prefix>"`` (or iptables' ``-j LOG --log-prefix``)
#: makes the kernel write for a packet: a kernel record starting with the rule's prefix.
NF_LOG = (
    "IN=lo OUT= MAC=00:00:00:00:00:00:00:00:00:00:00:00:08:00 SRC=127.0.0.1 "
    "DST=127.0.0.1 LEN=84 TOS=0x00 PREC=0x00 TTL=64 ID=1 DF PROTO=ICMP TYPE=8 CODE=0 ID=1 SEQ=1 "
)
NF_PREFIXES = [
    "NVRM: Xid (3b:00): 79,x",  # fits iptables' 29 characters
    XID79 + " ",
    "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus. ",
    "amdgpu 0000:03:00.0: amdgpu: GPU reset(2) failed ",
    "i915 0000:00:02.0: [drm] *ERROR* GT0: Failed to reset chip ",
]


@pytest.mark.parametrize("prefix", NF_PREFIXES)
def test_a_netfilter_log_prefix_is_no_fault(prefix: str) -> None:
    assert parse_kernel_message(prefix + NF_LOG, record=True) is None
    assert parse_kernel_message("[ 1.5] " + prefix + NF_LOG) is None


def test_a_netfilter_record_in_dev_kmsg_is_counted_not_latched() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.setblocking(False)
    source = KmsgSource("/nonexistent/kmsg", format="kmsg", kernel_clock=lambda: 86400.0)
    source._reader.fd = os.dup(theirs.fileno())
    theirs.close()
    with ours:
        for seq, prefix in enumerate(NF_PREFIXES, 1):
            ours.send(f"4,{seq},86399000000,-;{prefix}{NF_LOG}\n".encode())
        assert source.poll() == []
        ours.send(f"3,{len(NF_PREFIXES) + 1},86399000000,-;{XID79}\n".encode())
        signals = source.poll()
    assert [(s.value, s.health) for s in signals] == [("0000:3b:00.0", U)]
    assert source.counters.foreign == len(NF_PREFIXES)


# -- a segfault record: a process name and a file name the user chose -----------------

#: What the kernel (facility 0) wrote when an unprivileged process named ``NVRM: GPU
#: 3b:00`` (its 15-character name, PR_SET_NAME) crashed in code mapped from a file named
#: ``fallen off the bus`` (read back from a real /dev/kmsg): the record starts with the
#: user's name and carries the user's file name a few words later.
SEGFAULTS = [
    "NVRM: GPU 3b:00[1768]: segfault at 0 ip 00007f662af4b000 sp 00007ffdb5416448 "
    "error 4 in fallen off the bus[0,7f662af4b000+1000] likely on CPU 1 (core 1, socket 0)",
    "i915 00:02.0: x[1234567]: segfault at 0 ip 00007f662af4b000 sp 00007ffdb5416448 "
    "error 4 in Failed to reset chip[0,7f662af4b000+1000] likely on CPU 1 (core 1, socket 0)",
    "i915 00:02.0: x[12]: unhandled exception in GPU HANG: ecode 1:1:1[400000+1000]",
    "NVRM: GPU 3b:00[12]: unhandled level 1 translation fault (11) at 0x0, esr "
    "0x92000005, in fallen off the bus[400000+1000]",  # arm64
]


@pytest.mark.parametrize("record", SEGFAULTS)
def test_a_crash_record_with_a_chosen_process_and_file_name_is_no_fault(record: str) -> None:
    assert parse_kernel_message(record, record=True) is None
    assert parse_kernel_message("Mar 27 00:13:33 gpu-node kernel: " + record) is None


def test_a_crash_record_in_dev_kmsg_latches_nothing() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.setblocking(False)
    source = KmsgSource("/nonexistent/kmsg", format="kmsg", kernel_clock=lambda: 86400.0)
    source._reader.fd = os.dup(theirs.fileno())
    theirs.close()
    with ours:
        for seq, record in enumerate(SEGFAULTS, 1):
            ours.send(f"6,{seq},86399000000,-;{record}\n".encode())
        assert source.poll() == []


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
        "NVRM: GPU at 0000:3b:00.0 has fallen off the bus.",  # older drivers
        "NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.",
        "NVRM: The NVIDIA GPU 0000:3b:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this "
        "system has\nNVRM: fallen off the bus and is not responding to commands.",
    ],
)
def test_the_drivers_fallen_off_the_bus_lines_still_count(line: str) -> None:
    event = parse_kernel_message(line, record=True)
    assert event is not None and (event.address, event.health, event.xid) == (
        "0000:3b:00.0",
        U,
        79,
    )


@pytest.mark.parametrize(
    "line",
    [
        "i915 0000:00:02.0: [drm] *ERROR* GT0: Failed to reset chip",
        "i915 0000:00:02.0: [drm] *ERROR* Failed to reset chip: -110",
        "i915 0000:00:02.0: Failed to reset chip",
    ],
)
def test_i915s_wedged_lines_still_count(line: str) -> None:
    event = parse_kernel_message(line, record=True)
    assert event is not None and (event.address, event.health) == ("0000:00:02.0", U)


# -- a hole left by copytruncate -----------------------------------------------------------


def test_the_fault_line_after_a_copytruncate_hole_is_read(tmp_path: Path) -> None:
    """``dmesg -w > file``: the shell's redirect is not O_APPEND, so after logrotate's
    copytruncate the writer's next line lands at its old offset, behind NUL bytes."""
    log = tmp_path / "dmesg.log"
    noise = b"[    1.000000] eth0: link up\n" * 400  # 11,600 bytes, over maxLineBytes
    log.write_bytes(noise)
    source = KmsgSource(str(log))
    with open(log, "r+b") as writer:
        writer.seek(len(noise))
        assert source.poll() == []
        os.truncate(log, 0)  # copytruncate
        assert source.poll() == []  # the truncation is seen: read again from the start
        writer.write(b"[    2.000000] " + XID79.encode() + b"\n")
        writer.flush()
    assert [(s.value, s.health) for s in source.poll()] == [("0000:3b:00.0", U)]


# -- probe files -----------------------------------------------------------------------------


def _probe_file(path: Path, stamp: str, field: str) -> None:
    path.write_text(
        '{"devices": ['
        f'{{"{field}": "a", "health": "Healthy", "time": {time.time()}}}, '
        f'{{"{field}": "b", "health": "Healthy", "time": {stamp}}}]}}'
    )


@pytest.mark.parametrize("stamp", ["1" * 5000, "-" + "9" * 4400])
def test_an_integer_too_long_to_convert_makes_only_its_entry_unknown(
    tmp_path: Path, stamp: str
) -> None:
    path = tmp_path / "health.json"
    _probe_file(path, stamp, "key")
    probe = FileAttachedProbe(str(path), by="name")
    probe.watch_keys(["a", "b"])
    signals = {s.value: s for s in probe.poll()}
    assert signals["a"].health is H
    assert signals["b"].health is X and "time must be unix seconds" in signals["b"].message

    _probe_file(path, stamp, "device")
    reports = FileProbe(str(path), [("", "a"), ("", "b")]).poll()
    assert [r.health for r in reports] == [H, X]


def test_a_long_integer_elsewhere_in_a_probe_file_is_no_crash(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    path.write_text(json.dumps({"devices": [], "x": 1}).replace("1", "7" * 5000))
    probe = FileAttachedProbe(str(path), by="name")
    probe.watch_keys(["a"])
    assert [s.health for s in probe.poll()] == [X]


# -- the child runner ------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [math.nan, -1.0, -math.inf])
def test_a_timeout_that_is_no_number_of_seconds_is_refused(timeout: float) -> None:
    with pytest.raises(child.ChildError, match="timeout"):
        child.run_child(["true"], {}, timeout)
    health, message = run_probe(["true"], {}, timeout)
    assert health is X and "timeout" in message


@pytest.mark.parametrize("timeout", [1e10, 1e308, math.inf])
def test_a_long_timeout_waiting_for_a_slot_is_no_overflow(
    monkeypatch: pytest.MonkeyPatch, timeout: float
) -> None:
    slots = threading.BoundedSemaphore(1)
    slots.acquire()  # every slot busy
    monkeypatch.setattr(child, "_SLOTS", slots)
    errors: list[BaseException] = []
    results: list[child.ChildResult] = []

    def run() -> None:
        try:
            results.append(child.run_child(["true"], {}, timeout))
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(0.3)
    slots.release()  # a slot frees up: the run starts
    thread.join(20)
    assert not thread.is_alive()
    assert not errors, errors
    assert results[0].returncode == 0 and not results[0].timed_out


# -- exec probes: values that read as options ------------------------------------------------


def test_an_attribute_value_that_reads_as_an_option_never_reaches_the_probe() -> None:
    """A value starting with ``-`` (``-f/tmp/x`` passes the safe-character check) would
    be an option of the probe's command, and a trailing line break passed it too."""
    probe = ExecAttachedProbe(
        ["sh", "-c", 'printf "%s|" "$@"', "probe", "-i", "{key}"], by="name", parallel=1
    )
    probe.watch_keys(["-f/tmp/pwned", "--help", "gpu-0\n", "gpu-1"])
    signals = {s.value: s for s in probe.poll()}
    for bad in ("-f/tmp/pwned", "--help", "gpu-0\n"):
        assert signals[bad].health is X, signals[bad]
        assert "not passed to the probe" in signals[bad].message
    assert (signals["gpu-1"].health, signals["gpu-1"].message) == (H, "-i|gpu-1|")


def test_a_device_listed_twice_cannot_hide_its_fault(tmp_path: Path) -> None:
    """A later Healthy entry (another spelling of the same UUID) hid an Unhealthy one."""
    path = tmp_path / "health.json"
    now = time.time()
    entries = [
        {"key": "GPU-ABC", "health": "Unhealthy", "message": "ECC", "time": now},
        {"key": "gpu-abc", "health": "Healthy", "time": now},
        {"key": "GPU-DEF", "health": "Healthy", "time": now},
        {"key": "GPU-DEF", "health": "Healthy", "time": now},
    ]
    path.write_text(json.dumps({"devices": entries}))
    probe = FileAttachedProbe(str(path), by="uuid")
    probe.watch_keys(["GPU-ABC", "GPU-DEF"])
    signals = {s.value: s for s in probe.poll()}
    assert signals["GPU-ABC"].health is X and "listed twice" in signals["GPU-ABC"].message
    assert signals["GPU-DEF"].health is H

    devices = [{"device": e["key"], **{k: v for k, v in e.items() if k != "key"}} for e in entries]
    path.write_text(json.dumps({"devices": devices}))
    reports = FileProbe(str(path), [("", "GPU-ABC"), ("", "GPU-DEF")]).poll()
    assert [r.health for r in reports] == [U, H]  # FileProbe keys by exact name
    path.write_text(json.dumps({"devices": [devices[0], {**devices[0], "health": "Healthy"}]}))
    assert [r.health for r in FileProbe(str(path), [("", "GPU-ABC")]).poll()] == [X]
