"""Hostile input against the node's health sources: the kernel log, probe files, and a
dcgm-exporter that trickles.

* A local user cannot fake a GPU fault by making the kernel echo text (a tmpfs mount
  option ``NVRM: Xid ...``): only records whose message starts with the driver's words
  count, and only kernel-facility records of /dev/kmsg.
* Addresses no watched device has cannot fill the latch table and silence a real fault;
  every fault line that is not latched is counted.
* A followed log that turns into an endless stream without newlines, and a FIFO in
  place of a probe file, never block a poll; each source recovers by itself.
* A probe file's non-finite or out-of-range ``time`` makes that entry Unknown, not the
  file.
* A dcgm-exporter that trickles its headers or body is cut at the scrape's total
  deadline, and the next poll after it recovers reads the GPUs again.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from drahealth.core import DeviceReport, Health
from drahealth.sources import DcgmExporterSource, DcgmScrapeError, FileProbe, KmsgSource
from drahealth.sources._kmsg import parse_kernel_message

pytestmark = pytest.mark.timeout(60)

H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN
T = TypeVar("T")

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def in_thread(call: Callable[[], T], deadline: float) -> T:
    """``call()`` in a daemon thread; fails the test if it has not returned in time."""
    box: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(deadline)
    assert not thread.is_alive(), f"the call did not return within {deadline} s"
    if errors:
        raise errors[0]
    return box[0]


# -- bug 1: faked XIDs ------------------------------------------------------------------

#: What the kernel itself writes when it echoes a user's text (mount options, module
#: parameters, device names): the driver's words are inside the message, never at its start.
ECHOES = [
    "tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:3b:00): 79'",
    "tmpfs: Unknown parameter 'x NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, b'",
    "tmpfs: Unknown parameter 'NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.'",
    "tmpfs: Unknown parameter 'NVRM: The NVIDIA GPU 0000:3b:00.0 has fallen off the bus'",
    "tmpfs: Unknown parameter 'amdgpu 0000:03:00.0: amdgpu: GPU reset(2) failed'",
    "tmpfs: Unknown parameter 'i915 0000:00:02.0: [drm] *ERROR* GT0: Failed to reset chip'",
    'overlayfs: unrecognized mount option "NVRM: Xid (PCI:0000:3b:00): 48" or missing value',
    "tmpfs: Unknown parameter 'x\nNVRM: Xid (PCI:0000:3b:00): 79'",
]

#: Prefixes of text logs: dmesg, syslog, journalctl short-iso, dmesg --ctime.
PREFIXES = [
    "",
    "[18296.507578] ",
    "Mar 27 00:13:33 gpu-node kernel: ",
    "Mar 27 00:13:33 gpu-node kernel: [18296.507578] ",
    "2025-01-08T10:11:12+0000 node-7 kernel: ",
    "[Fri Aug 30 11:43:09 2024] ",
]


@pytest.mark.parametrize("echo", ECHOES)
@pytest.mark.parametrize("prefix", PREFIXES)
def test_text_the_kernel_echoes_is_no_fault(prefix: str, echo: str) -> None:
    assert parse_kernel_message(prefix + echo) is None


@pytest.mark.parametrize("prefix", PREFIXES)
def test_the_drivers_own_lines_still_count_behind_every_prefix(prefix: str) -> None:
    event = parse_kernel_message(prefix + XID79)
    assert event is not None and (event.address, event.health) == ("0000:3b:00.0", U)


@pytest.mark.parametrize(
    "line",
    [
        # another program's syslog line, or a kernel line whose tag is not "kernel:"
        "Mar 27 00:13:33 gpu-node myprog[12]: " + XID79,
        "Mar 27 00:13:33 gpu-node kernel: tmpfs: " + XID79,
        "[18296.507578] tmpfs: " + XID79,
    ],
)
def test_a_match_inside_the_message_is_no_fault(line: str) -> None:
    assert parse_kernel_message(line) is None


def kmsg_pair() -> tuple[KmsgSource, socket.socket]:
    """A source reading /dev/kmsg's record semantics from a SOCK_SEQPACKET pair."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.setblocking(False)
    source = KmsgSource("/nonexistent/kmsg", format="kmsg", kernel_clock=lambda: 86400.0)
    source._reader.fd = os.dup(theirs.fileno())
    theirs.close()
    return source, ours


def test_a_kernel_record_echoing_a_mount_option_is_no_fault() -> None:
    """The attack of the issue: ``unshare -Urm mount -t tmpfs -o 'NVRM: Xid ...'`` as
    nobody makes the kernel (facility 0) write the option back."""
    source, kernel = kmsg_pair()
    with kernel:
        for seq, echo in enumerate(ECHOES, 1):
            body = echo.replace("\n", "\\x0a")
            kernel.send(f"3,{seq},86399000000,-;{body}\n".encode())
        # and the driver's own record afterwards is read
        kernel.send(f"3,{len(ECHOES) + 1},86399000000,-;{XID79}\n".encode())
        signals = source.poll()
    assert [(s.value, s.health) for s in signals] == [("0000:3b:00.0", U)]
    assert source.counters.parsed == 1


def test_a_user_space_record_is_ignored_even_at_the_start() -> None:
    source, kernel = kmsg_pair()
    with kernel:
        kernel.send(f"11,1,86399000000,-;{XID79}\n".encode())  # user.err: echo > /dev/kmsg
        kernel.send(f"14,2,86399000000,-;{XID79}\n".encode())
        assert source.poll() == []
    assert source.counters.foreign == 2


def test_a_device_record_naming_another_device_is_no_fault() -> None:
    """dev_err() records carry DEVICE=+pci:<address>: a fault line whose address is not
    the record's own device is not the driver's."""
    source, kernel = kmsg_pair()
    with kernel:
        kernel.send(
            b"3,1,86399000000,-;amdgpu 0000:03:00.0: amdgpu: GPU reset(2) failed\n"
            b" SUBSYSTEM=pci\n DEVICE=+pci:0000:04:00.0\n"
        )
        kernel.send(
            b"3,2,86399000000,-;amdgpu 0000:05:00.0: amdgpu: GPU reset(2) failed\n"
            b" SUBSYSTEM=pci\n DEVICE=+pci:0000:05:00.0\n"
        )
        signals = source.poll()
    assert [(s.value, s.health) for s in signals] == [("0000:05:00.0", U)]
    assert source.counters.foreign == 1


# -- bug 2: the latch table --------------------------------------------------------------


def fault(address: str) -> str:
    return f"NVRM: Xid (PCI:{address}): 79, pid=1, name=x, GPU has fallen off the bus."


def test_unknown_addresses_cannot_crowd_out_a_watched_gpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log), max_devices=256)
    source.watch_keys(["0000:3b:00.0", "0000:86:00.0"])
    with open(log, "a") as f:
        for i in range(300):
            f.write(fault(f"0000:{i // 256 + 0xC0:02x}:{i % 256:02x}") + "\n")
        f.write(fault("0000:3b:00") + "\n")
    signals = source.poll()
    got = {s.value: s.health for s in signals}
    assert got == {"0000:3b:00.0": U}  # only watched devices are answered for
    c = source.counters
    assert c.unwatched == 300 and c.parsed == 1
    assert any("no watched device" in r.getMessage() for r in caplog.records)


def test_a_full_table_of_active_faults_counts_and_logs_the_dropped_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log), max_devices=2)
    with open(log, "a") as f:
        f.write(fault("0000:01:00") + "\n" + fault("0000:02:00") + "\n")
        for _ in range(50):
            f.write(fault("0000:03:00") + "\n")
    assert len(source.poll()) == 2
    assert source.counters.overflow == 50
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert 1 <= len(dropped) <= 2  # logged, rate-limited


def test_unwatched_entries_are_evicted_first_for_a_watched_one(tmp_path: Path) -> None:
    """Before the slices name a device, its fault is kept (a slice may come later); a
    watched device's fault then takes the place of an unwatched one."""
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log), max_devices=2)
    with open(log, "a") as f:
        f.write(fault("0000:01:00") + "\n" + fault("0000:02:00") + "\n")
    source.poll()
    source.watch_keys(["0000:3b:00.0", "0000:02:00.0"])
    with open(log, "a") as f:
        f.write(fault("0000:3b:00") + "\n")
    assert {s.value: s.health for s in source.poll()} == {"0000:02:00.0": U, "0000:3b:00.0": U}
    assert source.counters.overflow == 0


def test_dropped_fault_lines_are_a_metric(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest

    from drahealth.node._attached import _Readings

    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log))
    source.watch_keys(["0000:3b:00.0"])
    with open(log, "a") as f:
        f.write(fault("0000:c0:00") + "\n")
    source.poll()
    attachment = SimpleNamespace(
        health=SimpleNamespace(index=(), sources={}),
        sources=[SimpleNamespace(name="kmsg", source=source)],
    )
    attached = SimpleNamespace(
        drivers={"gpu.nvidia.com": attachment}, clock=time.monotonic, pods=None
    )
    registry = CollectorRegistry()
    registry.register(_Readings("node-1", attached))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert (
        'drahealth_node_attached_source_dropped_total{driver="gpu.nvidia.com",node="node-1",'
        'reason="unwatched",source="kmsg"} 1.0'
    ) in text


# -- bug 8: streams and FIFOs ------------------------------------------------------------


def test_a_followed_log_that_becomes_dev_zero_does_not_hang_and_recovers(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log))
    assert source.poll() == []
    log.unlink()
    log.symlink_to("/dev/zero")
    with pytest.raises(OSError, match="not a regular file"):
        in_thread(source.poll, 10)
    with pytest.raises(OSError, match="not a regular file"):
        in_thread(source.poll, 10)  # still refused, still prompt
    log.unlink()
    log.write_text(XID79 + "\n")  # a good file again: read from its start
    signals = in_thread(source.poll, 10)
    assert [(s.value, s.health) for s in signals] == [("0000:3b:00.0", U)]


def test_an_endless_line_in_a_regular_file_is_read_in_bounded_polls(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = KmsgSource(str(log), max_poll_bytes=1 << 20)
    with open(log, "ab") as f:
        f.write(b"x" * (3 << 20) + b"\n" + XID79.encode() + b"\n")
    polls = 0
    while not source.poll():
        polls += 1
        assert polls < 10
    assert polls >= 2  # 3 MiB took several bounded polls
    assert source.counters.truncated == 1


def test_a_fifo_in_place_of_a_probe_file_never_blocks_and_recovers(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    os.mkfifo(path)
    probe = FileProbe(str(path), [("node-1", "gpu-0")])
    try:
        reports = in_thread(probe.poll, 10)
    finally:
        # unblock a poll stuck in open() (the code before the fix), so no thread leaks
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK) if _has_reader(path) else -1
        if fd >= 0:
            os.close(fd)
    assert reports[0].health is X and "not a regular file" in reports[0].message
    path.unlink()
    body = {"devices": [{"device": "gpu-0", "health": "Healthy", "time": time.time()}]}
    path.write_text(json.dumps(body))
    assert in_thread(probe.poll, 10)[0].health is H


def _has_reader(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


# -- bug 9: probe file times -------------------------------------------------------------


@pytest.mark.parametrize(
    "stamp",
    ["1e999", "-1e999", "NaN", "1" + "0" * 400, "-5", "1e300"],
)
def test_a_bad_time_makes_only_its_entry_unknown(tmp_path: Path, stamp: str) -> None:
    now = time.time()
    path = tmp_path / "health.json"
    path.write_text(
        '{"devices": ['
        f'{{"device": "gpu-0", "health": "Healthy", "time": {stamp}}},'
        f'{{"device": "gpu-1", "health": "Unhealthy", "message": "ECC", "time": {now}}}]}}'
    )
    probe = FileProbe(str(path), [("node-1", "gpu-0"), ("node-1", "gpu-1")], clock=lambda: now)
    reports = probe.poll()
    assert reports[1] == DeviceReport("node-1", "gpu-1", U, "ECC")
    assert reports[0].health is X and "devices[0].time" in reports[0].message


def test_a_time_far_in_the_future_is_not_fresh_forever(tmp_path: Path) -> None:
    now = time.time()
    path = tmp_path / "health.json"
    body = {"devices": [{"device": "gpu-0", "health": "Healthy", "time": now + 10 * 365 * 86400}]}
    path.write_text(json.dumps(body))
    report = FileProbe(str(path), [("node-1", "gpu-0")], clock=lambda: now).poll()[0]
    assert report.health is X and "in the future" in report.message


# -- weakness: dcgm-exporter trickling -----------------------------------------------------

GOOD_BODY = b'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-0"} 0\n'


class TrickleServer:
    """An exporter that trickles (headers or body, a byte every 50 ms, for as long as
    the client stays) until told to answer properly."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.good = threading.Event()
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/metrics"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(4096)
                if self.good.is_set():
                    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(GOOD_BODY)}\r\n\r\n"
                    conn.sendall(head.encode() + GOOD_BODY)
                    return
                if self.part == "headers":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                while not self.stop.wait(0.05):
                    conn.sendall(b"a" if self.part == "headers" else b"#")
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(5)


@pytest.fixture(params=["headers", "body"])
def trickle(request: pytest.FixtureRequest) -> Iterator[TrickleServer]:
    server = TrickleServer(request.param)
    yield server
    server.close()


def test_a_trickling_exporter_is_cut_at_the_total_deadline(trickle: TrickleServer) -> None:
    source = DcgmExporterSource(trickle.url, scrape_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(DcgmScrapeError, match=r"no complete response in 0\.5 s"):
        in_thread(source.poll, 15)
    # generous for a loaded machine; before the fix it never ended
    assert time.monotonic() - started < 10


def test_the_first_poll_after_the_exporter_recovers_reads_the_gpus(
    trickle: TrickleServer,
) -> None:
    source = DcgmExporterSource(trickle.url, scrape_timeout=0.5, interval=0.1)
    answers: list[object] = []
    done = threading.Event()

    def poller() -> None:
        while not done.is_set():
            try:
                answers.append(source.poll())
            except DcgmScrapeError as exc:
                answers.append(exc)
            done.wait(source.interval)

    thread = threading.Thread(target=poller, daemon=True)
    thread.start()
    try:
        end = time.monotonic() + 10
        while not answers and time.monotonic() < end:
            time.sleep(0.05)
        assert answers and isinstance(answers[0], DcgmScrapeError)
        trickle.good.set()
        recovered = time.monotonic()
        end = recovered + 10
        while not any(isinstance(a, list) for a in answers) and time.monotonic() < end:
            time.sleep(0.05)
        healthy = [a for a in answers if isinstance(a, list)]
        assert healthy, "the GPUs were not read again after the exporter recovered"
        assert [(s.value, s.health) for s in healthy[0]] == [("GPU-0", H)]
    finally:
        done.set()
        trickle.stop.set()
        thread.join(15)


def test_the_attached_file_probe_reads_bad_times_per_entry_too(tmp_path: Path) -> None:
    from drahealth.sources import FileAttachedProbe

    now = time.time()
    path = tmp_path / "health.json"
    path.write_text(
        '{"devices": [{"key": "gpu-0", "health": "Healthy", "time": 1e999},'
        f'{{"key": "gpu-1", "health": "Healthy", "time": {now + 10**8}}},'
        f'{{"key": "gpu-2", "health": "Unhealthy", "message": "ECC", "time": {now}}}]}}'
    )
    source = FileAttachedProbe(str(path), clock=lambda: now)
    source.watch_keys(["gpu-0", "gpu-1", "gpu-2"])
    got = {s.value: (s.health, s.message) for s in source.poll()}
    assert got["gpu-2"] == (U, "ECC")
    assert got["gpu-0"][0] is X and "devices[0].time" in got["gpu-0"][1]
    assert got["gpu-1"][0] is X and "in the future" in got["gpu-1"][1]
