"""GPU health from the kernel log: NVIDIA XID lines (and AMD and Intel GPU resets that
failed), read from ``/dev/kmsg`` or from a followed file.

Owns :class:`KmsgSource` (an :class:`~drahealth.sources._attached.AttachedSource` keyed
by PCI address), :func:`parse_kernel_message` (one kernel message -> a
:class:`KernelEvent`, ``None``, or :class:`MalformedLine`) and :class:`KmsgCounters`.

Lines read (the address is what the device's ResourceSlice publishes as its PCI bus ID):

* ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.``
  and its variants: with or without ``pid=``/``name=``, ``PCI:`` or not, a function digit
  or not, behind a text log's known prefix only (journalctl's and syslog's: a time,
  ``host kernel:``; dmesg's: ``[12345.678901]`` and its other time formats, ``-x``'s
  ``kern  :err   :``, ``-r``'s ``<3>``; see :data:`_TEXT_PREFIX`). Meaning and severity
  come from core's one XID table (application XIDs are informational: the device stays
  Healthy and the message is shown; every other XID is fatal); an XID the table does
  not know is described in the driver's own words;
* ``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`` and the three-line
  ``NVRM: The NVIDIA GPU 0000:3b:00.0 ... has fallen off the bus`` notice: as XID 79;
* ``amdgpu 0000:03:00.0: amdgpu: GPU reset(2) failed``: fatal; ``GPU reset(3)
  succeeded!`` ends that device's fault (the driver recovered it);
* ``i915 0000:00:02.0: [drm] *ERROR* GT0: Failed to reset chip``: fatal (the GPU is
  wedged); ``i915 0000:00:02.0: [drm] GPU HANG: ecode ...``: informational (the driver
  resets the engine).

Only what the driver wrote counts: every pattern must match at the START of the
kernel's message (the record's message, or a text line after its known prefix), never
inside it, so text the kernel echoes for a user (``tmpfs: Unknown parameter 'NVRM: Xid
...'``) is no fault, and the driver's words follow a device's address at once, so a crash
record that starts with a user's process name (15 characters) and ends with the user's
file name (``NVRM: GPU 3b:00[1768]: segfault ... in fallen off the bus[...]``) is none;
a /dev/kmsg record must have the kernel's facility, a record whose
``DEVICE=+pci:`` context names another device than its message is ignored, and so is
one netfilter's LOG target wrote (``IN=... OUT=...`` after it: it starts with the
prefix a rule's author chose, ``nft ... log prefix "NVRM: Xid ..."``). A text log's NUL
bytes are dropped (the hole a writer that kept its offset leaves after copytruncate). (A
text log is only as trustworthy as what writes it: syslog lets any local user log with
the tag ``kernel``; read /dev/kmsg, or ``journalctl -k``'s output, where that matters.)

A fatal line leaves no "recovered" line behind it, so the fault is latched: the device
stays Unhealthy until ``clear_after`` seconds pass without a new fatal line for it
(``None``: until the source restarts). Every device a line ever named (at most
``max_devices``) is answered for on every poll, Healthy once its latch ends, so its lease
never runs out; devices no line named get no signal from this source. Once the agent
names the watched devices (:meth:`KmsgSource.watch_keys`, their PCI addresses), only
their lines are latched and answered for; a line for another address is dropped, and
room for a watched device is made by forgetting unwatched devices first. Every fault
line not latched (unwatched, past ``max_devices``, foreign) is counted
(:meth:`KmsgSource.dropped`, the agent's ``drahealth_node_attached_source_dropped``) and
logged at most once a minute per reason.

``/dev/kmsg`` is read record by record (``prio,seq,usec,flags;message``, continuation
lines ignored, ``\\xNN`` escapes decoded), non-blocking; records user space wrote (any
facility but the kernel's) are ignored, so ``echo ... > /dev/kmsg`` cannot fake a fault;
records the kernel overwrote before they were read (``EPIPE``) are counted from the
sequence numbers. By default it starts at the beginning of the ring buffer and restores
the latches of fatal lines younger than ``clear_after`` (their age from the record's
timestamp), so an agent restart does not forget a GPU that fell off the bus a minute ago.
A plain file is followed like ``tail -F`` (rotation and truncation survived) from its end
as of the source's creation (a file not there yet is read from its start once it
appears); ``from_start=True`` reads its last ``backlog_bytes`` first, as new lines.

Hostile input: a line longer than ``max_line_bytes`` is cut (the rest up to its newline
dropped) and counted, invalid UTF-8 is replaced, control characters never reach a
message, one poll reads at most ``max_lines`` lines, ``max_poll_bytes`` bytes and for
half a second (the rest on the next), and every line that is not understood is counted,
never raised. Reads never block: a followed path must name a regular file (checked on
what was opened), the kmsg path a character device; anything else (a FIFO, a symlink to
/dev/zero) fails each poll with an error naming it, and the source reads again by itself
once a good file is back (from its start).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import re
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Literal

from drahealth._files import file_kind
from drahealth._text import printable
from drahealth.core import (
    APPLICATION_XIDS,
    Health,
    Signal,
    normalize_pci_address,
    xid_is_fatal,
    xid_message,
)

__all__ = [
    "KernelEvent",
    "KmsgCounters",
    "KmsgSource",
    "MalformedLine",
    "message_body",
    "parse_kernel_message",
]

log = logging.getLogger(__name__)

#: Bytes asked of one read() of /dev/kmsg: a record is at most 8 KiB (the kernel's
#: CONSOLE_EXT_LOG_MAX); a smaller buffer makes read() fail with EINVAL.
_KMSG_READ = 16384
_FILE_READ = 65536
#: Seconds one poll reads at most (besides its line and byte budgets).
_POLL_SECONDS = 0.5
#: Seconds between two log lines about dropped fault lines (per reason).
_LOG_EVERY = 60.0
_DETAIL_MAX = 120  # characters of the driver's own words kept in a message
_NAME_MAX = 32

# -- parsing (pure) ---------------------------------------------------------------------

_ADDR = r"(?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
# Every pattern below is matched at the START of the message (``re.match``): the driver
# writes its words first, while text the kernel echoes for a user (a mount option, a
# module parameter, a process name) always follows the kernel's own words.
_XID = re.compile(r"NVRM:\s+Xid\s+\((?:PCI:)?(?P<addr>[^()\s]{1,40})\):\s*(?P<xid>\d{1,5})\b")
_XID_ANY = re.compile(r"NVRM:\s+Xid\b")
_XID_REST = re.compile(
    r"\s*,\s*(?:pid=(?P<pid>[^,]{0,40}),\s*)?(?:name=(?P<name>[^,]{0,80}),\s*)?(?P<detail>.*)",
    re.S,
)
# A user names a process (15 characters) and the file it runs, and the kernel's segfault
# record starts with the one and ends with the other: ``NVRM: GPU 3b:00[1768]: segfault at
# 0 ip ... in fallen off the bus[...]``. So no pattern leaves a gap right after a short
# address: the driver's words follow it at once (the notice's first words alone are
# longer than a process name).
_FALLEN = re.compile(
    rf"NVRM:\s+(?:The NVIDIA GPU (?P<addr>{_ADDR})\b.{{0,300}}?fallen off the bus"
    rf"|GPU (?:at )?(?:PCI:)?(?P<addr2>{_ADDR})(?::\s+GPU)?\s+has fallen off the bus)",
    re.S,
)
#: The first line of the driver's three-line fallen-off-the-bus notice, as a line of a
#: text log (in /dev/kmsg the three lines are one record).
_FALLEN_HEAD = re.compile(rf"NVRM:\s+The NVIDIA GPU (?P<addr>{_ADDR})\s*$")
_AMD_RESET = re.compile(
    rf"amdgpu (?P<addr>{_ADDR}): (?:amdgpu: )?GPU reset\((?P<n>\d{{1,10}})\) "
    r"(?P<result>failed|succeeded)"
)
#: i915's words between the address and the fault: ``[drm]``, ``*ERROR*``, ``GT0:``.
_I915_GAP = r"(?:\[drm\]\s+)?(?:\*ERROR\*\s+)?(?:GT\d{1,2}:\s+)?"
_I915_WEDGED = re.compile(rf"i915 (?P<addr>{_ADDR}): {_I915_GAP}Failed to reset chip")
_I915_HANG = re.compile(
    rf"i915 (?P<addr>{_ADDR}): {_I915_GAP}GPU HANG: ecode (?P<ecode>[0-9A-Fa-f:]{{1,40}})"
)
#: How a message starts for any pattern above to match: a cheap first test.
_MARKERS = ("NVRM:", "amdgpu ", "i915 ")

#: The prefixes a text log puts before the kernel's message, and nothing else. Either a
#: journal's or syslog's: a time (syslog, ISO, journalctl's short-full, short-unix or
#: short-monotonic), a host and the tag ``kernel:``, then perhaps dmesg's
#: ``[seconds.micros]``; or dmesg's own: the facility and level of ``-x`` (the kernel's
#: only) or the raw priority of ``-r`` (facility 0 only), then a time (``[seconds]``,
#: ``-d``'s delta, ``--ctime``, ``reltime``, ``iso``).
_SYSLOG_TIME = r"[^\W\d_]{3,4}\.?\s{1,2}\d{1,2}\s\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?"
_ISO_TIME = r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?"
_FULL_TIME = rf"[A-Z][a-z]{{2}} {_ISO_TIME} [A-Za-z0-9+-]{{1,6}}"
_UNIX_TIME = r"\d{1,12}\.\d{1,9}"
_MONO_TIME = r"\[\s{0,12}\d{1,12}\.\d{1,9}\]"
_DMESG_TIME = (
    rf"{_MONO_TIME}"
    r"|\[\s{0,12}\d{1,12}\.\d{1,9} <\s{0,12}\d{1,12}\.\d{1,9}>\]"
    r"|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4}\]"
    r"|\[[A-Z][a-z]{2}\s?\d{1,2} \d{2}:\d{2}\]|\[\s{0,12}\+\d{1,12}\.\d{1,9}\]"
    rf"|{_ISO_TIME}(?=\s)"
)
_TEXT_PREFIX = re.compile(
    rf"(?:{_SYSLOG_TIME}|{_FULL_TIME}|{_ISO_TIME}|{_UNIX_TIME}|{_MONO_TIME})\s\S{{1,255}}"
    rf"\skernel:\s?(?:{_MONO_TIME}\s?)?"
    rf"|(?:kern\s{{0,6}}:[a-z]{{1,8}}\s{{0,6}}:\s)?(?:<[0-7]>)?(?:(?:{_DMESG_TIME})\s?)?"
)
#: What netfilter's LOG target writes after the prefix its rule's author chose (``nft
#: ... log prefix "..."``, ``iptables -j LOG --log-prefix``): such a record starts with
#: text a user chose, so it is never a fault. No driver line has it.
_NETFILTER_LOG = re.compile(r"IN=\S{0,16} OUT=\S{0,16} ")


def message_body(line: str) -> str:
    """The kernel's message in one line of a text log: the line without the known
    prefix (time, host and ``kernel:`` tag, dmesg time), as the kernel wrote it."""
    match = _TEXT_PREFIX.match(line)
    return line[match.end() :] if match is not None else line


class MalformedLine(ValueError):
    """A line that looks like a GPU fault line but cannot be read."""


@dataclass(frozen=True, slots=True)
class KernelEvent:
    """What one kernel-log line says about one GPU.

    ``address`` is the normalized PCI address (``0000:3b:00.0``), or ``None`` when the
    line names a device in a form that is not one. ``recovered`` marks a line saying the
    driver recovered the device (it ends a latched fault).
    """

    address: str | None
    health: Health
    message: str
    recovered: bool = False
    xid: int | None = None


def _clean(text: str, limit: int) -> str:
    return printable(text).strip()[:limit].strip()


def _xid_event(
    match: re.Match[str], text: str, informational: frozenset[int], fatal: frozenset[int]
) -> KernelEvent:
    xid = int(match.group("xid"))
    rest = _XID_REST.match(text, match.end())
    detail = name = pid = ""
    if rest is not None:
        detail = _clean(rest.group("detail").split("\n", 1)[0], _DETAIL_MAX).rstrip(".")
        name = _clean((rest.group("name") or "").strip("'\""), _NAME_MAX)
        pid = _clean((rest.group("pid") or "").strip("'\""), 12)
    is_fatal = xid_is_fatal(xid, informational, fatal)
    message = xid_message(xid, is_fatal, detail)
    if not is_fatal and (pid or name) and name != "<unknown>":
        message = f"{message[:-1]}; pid {pid or '?'} {name})".replace(" )", ")")
    health = Health.UNHEALTHY if is_fatal else Health.HEALTHY
    address = normalize_pci_address(match.group("addr"))
    return KernelEvent(address, health, message, xid=xid)


def parse_kernel_message(
    text: str,
    informational_xids: Iterable[int] = APPLICATION_XIDS,
    fatal_xids: Iterable[int] = (),
    *,
    record: bool = False,
) -> KernelEvent | None:
    """What the kernel message ``text`` says about a GPU, or ``None`` when it says
    nothing about one. ``text`` is one line of a text log (its known prefix is skipped,
    see :func:`message_body`) or, with ``record=True``, the message of one /dev/kmsg
    record. Only a message that STARTS with the driver's words counts: the same words
    anywhere inside a message are text the kernel echoed, never a fault.

    Raises :class:`MalformedLine` for an ``NVRM: Xid`` message whose address or number
    cannot be read.
    """
    body = text if record else message_body(text)
    if not body.startswith(_MARKERS) or _NETFILTER_LOG.search(body):
        return None
    match = _XID.match(body)
    if match is not None:
        informational = frozenset(informational_xids)
        return _xid_event(match, body, informational, frozenset(fatal_xids))
    if _XID_ANY.match(body):
        raise MalformedLine(f"unreadable XID line: {_clean(body, 80)!r}")
    match = _FALLEN.match(body)
    if match is not None:
        address = normalize_pci_address(match.group("addr") or match.group("addr2"))
        return KernelEvent(address, Health.UNHEALTHY, xid_message(79, True), xid=79)
    match = _AMD_RESET.match(body)
    if match is not None:
        address = normalize_pci_address(match.group("addr"))
        if match.group("result") == "failed":
            message = f"amdgpu: GPU reset {match.group('n')} failed (reboot the node)"
            return KernelEvent(address, Health.UNHEALTHY, message)
        message = f"amdgpu: GPU reset {match.group('n')} succeeded"
        return KernelEvent(address, Health.HEALTHY, message, recovered=True)
    match = _I915_WEDGED.match(body)
    if match is not None:
        address = normalize_pci_address(match.group("addr"))
        message = "i915: GPU reset failed, the GPU is wedged (reboot the node)"
        return KernelEvent(address, Health.UNHEALTHY, message)
    match = _I915_HANG.match(body)
    if match is not None:
        address = normalize_pci_address(match.group("addr"))
        message = f"i915: GPU hang, ecode {match.group('ecode')} (the driver reset the engine)"
        return KernelEvent(address, Health.HEALTHY, message)
    return None


# -- records ----------------------------------------------------------------------------

#: ``prio,seq,usec,flags[,more];`` at the start of a /dev/kmsg record.
_KMSG_HEAD = re.compile(rb"(\d{1,10}),(\d{1,20}),(\d{1,20})(?:,[^;]{0,64})?;")
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


@dataclass(frozen=True, slots=True)
class _Record:
    text: str
    facility: int | None = None  # None: a text line without a kmsg header
    seq: int | None = None
    usec: int | None = None
    device: str | None = None  # the record's DEVICE=+pci:<address> context, if any


def _unescape(text: str) -> str:
    if "\\x" not in text:
        return text
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)


def _record(raw: bytes, headed: bool) -> _Record | None:
    """A record from one /dev/kmsg read or one text line; ``None`` when ``headed`` (a
    /dev/kmsg record) and the header is missing."""
    head = _KMSG_HEAD.match(raw)
    if head is None:
        if headed:
            return None
        return _Record(raw.decode("utf-8", "replace"))
    body, _, context = raw[head.end() :].partition(b"\n")
    prio, seq, usec = (int(g) for g in head.groups())
    device = None
    for line in context.split(b"\n")[:8]:  # continuation lines: " KEY=value" context
        if line.startswith(b" DEVICE=+pci:"):
            device = normalize_pci_address(line[13:].decode("ascii", "replace").strip())
            device = device or "?"  # named a device, but not one that reads as PCI
    return _Record(_unescape(body.decode("utf-8", "replace")), prio >> 3, seq, usec, device)


# -- readers ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Budget:
    """What one poll may read: lines, bytes and time (a monotonic deadline)."""

    lines: int
    bytes: int
    deadline: float

    def left(self, lines_read: int) -> bool:
        return lines_read < self.lines and self.bytes > 0 and time.monotonic() < self.deadline


class _KmsgReader:
    """Records of a /dev/kmsg-like character device, non-blocking."""

    headed = True

    def __init__(self, path: str, from_start: bool, counters: KmsgCounters) -> None:
        self.path = path
        self.counters = counters
        self.fd: int | None = None
        self.from_start = from_start
        self.replaying = from_start  # until the first EAGAIN: records carry their age

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except PermissionError as exc:
            raise PermissionError(
                f"cannot read {self.path}: {exc.strerror} (reading the kernel log needs "
                "CAP_SYSLOG where kernel.dmesg_restrict=1, and the device mounted and "
                "allowed in a container)"
            ) from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISCHR(mode):
            os.close(fd)
            raise OSError(f"{self.path}: not a character device like /dev/kmsg ({file_kind(mode)})")
        if not self.from_start:
            os.lseek(fd, 0, os.SEEK_END)
        self.from_start = False  # a reopen after an error goes on from the end
        return fd

    def prime(self) -> None:
        """Open now, so that "from the end" means from the source's creation; an error
        is raised by the next read instead."""
        with contextlib.suppress(OSError):
            self.fd = self._open()

    def read(self, budget: _Budget) -> list[bytes]:
        if self.fd is None:
            self.fd = self._open()
        out: list[bytes] = []
        overrun = 0
        while budget.left(len(out)):
            try:
                record = os.read(self.fd, _KMSG_READ)
            except BlockingIOError:
                self.replaying = False
                break
            except BrokenPipeError:
                # records overwritten: the kernel moved us to the next one; they are
                # counted from the sequence gap
                overrun += 1
                if overrun >= budget.lines:
                    break
                continue
            except OSError as exc:
                self.close()
                if exc.errno == errno.EINVAL:
                    raise OSError(f"{self.path}: a record longer than {_KMSG_READ} bytes") from None
                raise
            if not record:  # not /dev/kmsg after all (it never ends): nothing more now
                self.replaying = False
                break
            budget.bytes -= len(record)
            out.append(record)
        return out

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _FileFollower:
    """Complete lines appended to a regular file, across rotation and truncation
    (``tail -F``). The path must name a regular file: anything else (a FIFO, a symlink
    to /dev/zero) is refused with an error on every poll until a regular file is there
    again, which is then read from its start."""

    headed = False
    replaying = False

    def __init__(
        self,
        path: str,
        from_start: bool,
        backlog_bytes: int,
        max_line_bytes: int,
        counters: KmsgCounters,
    ) -> None:
        self.path = path
        self.counters = counters
        self.backlog = backlog_bytes if from_start else 0
        self.max_line = max_line_bytes
        self.fd: int | None = None
        self.ident: tuple[int, int] | None = None
        self.opened_once = False
        self.appeared = False  # it was missing (or not a regular file) at the first try
        self.pos = 0
        self.buf = bytearray()
        self.skipping = False  # dropping the rest of a line that was cut
        self.pending: list[bytes] = []  # lines read past a poll's max_lines

    def _open(self, first: bool) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            if self.opened_once:
                return False  # rotated away: wait for the new file
            self.appeared = True  # when it appears, it is read from its beginning
            raise FileNotFoundError(f"{self.path}: no such file") from None
        except PermissionError as exc:
            raise PermissionError(f"cannot read {self.path}: {exc.strerror}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            if not self.opened_once:
                self.appeared = True  # the regular file that comes is read from its start
            raise OSError(
                f"{self.path}: not a regular file ({file_kind(st.st_mode)}); waiting for one"
            )
        self.fd, self.ident = fd, (st.st_dev, st.st_ino)
        self.buf.clear()
        self.skipping = False
        self.pos = 0
        if first:
            self.pos = max(0, st.st_size - self.backlog)
            self.skipping = self.pos > 0 and self.backlog > 0  # the first line is partial
            os.lseek(fd, self.pos, os.SEEK_SET)
        self.opened_once = True
        return True

    def prime(self) -> None:
        """Open now, so that "from the end" means from the source's creation; an error
        is raised by the next read instead (a missing file is read from its beginning
        once it appears)."""
        with contextlib.suppress(OSError):
            self._open(first=True)

    def _lines(self, data: bytes, out: list[bytes]) -> None:
        if b"\0" in data:
            # a text log holds no NUL: these are the hole a writer that kept its offset
            # left after a truncation in place (copytruncate); the line after it counts
            data = data.replace(b"\0", b"")
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if self.skipping:
                self.skipping = False
            else:
                self._emit(self.buf + data[start:end] if self.buf else data[start:end], out)
            self.buf.clear()
            start = end + 1
        if self.skipping:
            return
        self.buf += data[start:]
        if len(self.buf) > self.max_line:
            self._emit(bytes(self.buf), out)
            self.buf.clear()
            self.skipping = True

    def _emit(self, line: bytes | bytearray, out: list[bytes]) -> None:
        if len(line) > self.max_line:
            line = line[: self.max_line]
            self.counters.truncated += 1
        out.append(bytes(line).rstrip(b"\r"))

    def _rotated(self) -> bool:
        """Whether the path now names another file (or was truncated): then reopen."""
        assert self.fd is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False  # removed, the new one not there yet: keep the old one
        if (st.st_dev, st.st_ino) != self.ident:
            return True
        return os.fstat(self.fd).st_size < self.pos  # truncated in place (copytruncate)

    def read(self, budget: _Budget) -> list[bytes]:
        out, self.pending = self.pending, []
        max_lines = budget.lines
        if self.fd is None:
            first = not self.opened_once and not self.appeared
            if not self._open(first):
                return self._bounded(out, max_lines)
        while budget.left(len(out)):
            assert self.fd is not None
            data = os.read(self.fd, min(_FILE_READ, budget.bytes))
            if data:
                budget.bytes -= len(data)
                self.pos += len(data)
                self._lines(data, out)
                continue
            if not self._rotated():
                break
            if self.buf and not self.skipping:
                self._emit(bytes(self.buf), out)  # the old file's last, unterminated line
            self.close()
            self.counters.reopened += 1
            try:
                if not self._open(first=False):
                    break
            except OSError:
                if out:
                    break  # hand over what was read; the next poll raises the error
                raise
        return self._bounded(out, max_lines)

    def _bounded(self, lines: list[bytes], max_lines: int) -> list[bytes]:
        """The first ``max_lines`` of ``lines``; the rest (at most one read's worth) wait
        for the next poll."""
        self.pending = lines[max_lines:]
        return lines[:max_lines]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# -- the source -------------------------------------------------------------------------


@dataclass(slots=True)
class KmsgCounters:
    """Counts for metrics: every line read lands in ``lines`` and at most one other."""

    lines: int = 0  # records or lines read
    parsed: int = 0  # lines that said something about a device's health
    malformed: int = 0  # fault lines (or /dev/kmsg records) that could not be read
    unknown_device: int = 0  # fault lines naming no PCI address that can be read
    overflow: int = 0  # fault lines not latched: max_devices devices with faults held
    unwatched: int = 0  # fault lines for an address no watched device has (ignored)
    foreign: int = 0  # records user space wrote, or naming another device (ignored)
    lost: int = 0  # records the kernel overwrote before they were read
    truncated: int = 0  # lines cut at max_line_bytes
    reopened: int = 0  # rotations and truncations of a followed file

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def dropped(self) -> dict[str, int]:
        """Lines read and not used, by reason (for the agent's metrics)."""
        return {
            "malformed": self.malformed,
            "unknown_device": self.unknown_device,
            "overflow": self.overflow,
            "unwatched": self.unwatched,
            "foreign": self.foreign,
            "lost": self.lost,
            "truncated": self.truncated,
        }


@dataclass(slots=True)
class _Device:
    until: float = -math.inf  # the fault is latched until then
    fault: str = ""  # the latched fault's message
    note: str = ""  # shown once on the next poll
    seen: float = 0.0


def _positive(name: str, value: float) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def _clear_after(value: float | str | None) -> float | None:
    """Seconds, a duration (``500ms``, ``30s``, ``10m``, ``1h``), or ``None``/``never``."""
    if value is None or value == "never":
        return None
    if isinstance(value, str):
        m = _DURATION.fullmatch(value)
        if m is None:
            raise ValueError(
                f"clear_after must be seconds, a duration (30s, 10m, 1h) or never, not {value!r}"
            )
        value = float(m.group(1)) * _UNITS[m.group(2)]
    return _positive("clear_after", value)


def _count(name: str, value: int) -> int:
    if not (isinstance(value, int) and value > 0):
        raise ValueError(f"{name} must be a positive integer, not {value!r}")
    return value


def _kernel_clock() -> float:
    """The kernel's clock of ``/dev/kmsg`` timestamps (CLOCK_MONOTONIC, as printk)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class KmsgSource:
    """See the module docstring. ``poll`` never blocks on the log: it reads what is
    there (at most ``max_lines``) and answers."""

    def __init__(
        self,
        path: str = "/dev/kmsg",
        *,
        name: str = "kmsg",
        by: str = "pciBusID",
        interval: float = 0.025,
        timeout: float = 30.0,
        clear_after: float | str | None = 600.0,
        from_start: bool | None = None,
        backlog_bytes: int = 1 << 20,
        max_lines: int = 5000,
        max_line_bytes: int = 4096,
        max_devices: int = 256,
        max_poll_bytes: int = 8 << 20,
        informational_xids: Iterable[int] = APPLICATION_XIDS,
        fatal_xids: Iterable[int] = (),
        kernel_only: bool = True,
        format: Literal["auto", "kmsg", "text"] = "auto",
        clock: Callable[[], float] = time.monotonic,
        kernel_clock: Callable[[], float] = _kernel_clock,
    ) -> None:
        if not path:
            raise ValueError("path must name /dev/kmsg or a log file")
        if format not in ("auto", "kmsg", "text"):
            raise ValueError(f"format must be auto, kmsg or text, not {format!r}")
        self.name = name
        self.by = by
        self.path = path
        self.interval = _positive("interval", interval)
        self.timeout = _positive("timeout", timeout)
        self.clear_after = _clear_after(clear_after)
        self.max_lines = _count("max_lines", max_lines)
        self.max_devices = _count("max_devices", max_devices)
        _count("max_line_bytes", max_line_bytes)
        self.max_poll_bytes = _count("max_poll_bytes", max_poll_bytes)
        _count("backlog_bytes", backlog_bytes)
        self.informational = frozenset(informational_xids) - frozenset(fatal_xids)
        self.fatal = frozenset(fatal_xids)
        self.kernel_only = kernel_only
        self.counters = KmsgCounters()
        self._clock = clock
        self._kernel_clock = kernel_clock
        if format == "auto":
            try:
                format = "kmsg" if stat.S_ISCHR(os.stat(path).st_mode) else "text"
            except OSError:
                format = "text"  # a file that is not there yet
        if format == "kmsg":
            start = True if from_start is None else from_start
            self._reader: _KmsgReader | _FileFollower = _KmsgReader(path, start, self.counters)
        else:
            self._reader = _FileFollower(
                path, bool(from_start), backlog_bytes, max_line_bytes, self.counters
            )
        self._reader.prime()
        self._devices: dict[str, _Device] = {}
        #: The PCI addresses of the devices the agent watches (None: every address).
        self._watched: frozenset[str] | None = None
        self._warned_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}
        self._last_seq: int | None = None
        self._fallen: tuple[str, int] | None = None  # (address, lines left) of a notice
        self._signals: list[Signal] = []
        self._dirty = True
        self._next_change = math.inf

    # -- reading -----------------------------------------------------------------------

    def poll(self) -> list[Signal]:
        """Read what the log gained since the last poll; every device's health now."""
        replaying = self._reader.replaying
        budget = _Budget(self.max_lines, self.max_poll_bytes, time.monotonic() + _POLL_SECONDS)
        raw = self._reader.read(budget)
        if raw:
            now = self._clock()
            # the kernel's clock for the age of replayed records (CLOCK_MONOTONIC, as printk)
            kernel_now = self._kernel_clock() if replaying else 0.0
            for line in raw:
                self._line(line, now, kernel_now if replaying else None)
        return self._answer(self._clock())

    def _line(self, raw: bytes, now: float, kernel_now: float | None) -> None:
        counters = self.counters
        counters.lines += 1
        record = _record(raw, self._reader.headed)
        if record is None:
            counters.malformed += 1
            return
        if record.seq is not None and self._reader.headed:
            last, self._last_seq = self._last_seq, record.seq
            if last is not None and record.seq > last + 1:
                counters.lost += record.seq - last - 1
        if record.facility and self.kernel_only:
            counters.foreign += 1
            return
        is_record = record.facility is not None
        text = record.text if is_record else message_body(record.text)
        if text.startswith(_MARKERS) and _NETFILTER_LOG.search(text):
            counters.foreign += 1  # netfilter's LOG target: its prefix is a user's text
            self._dropped("foreign", "a netfilter LOG record", now)
            return
        text = self._join_fallen(text)
        try:
            event = parse_kernel_message(text, self.informational, self.fatal, record=True)
        except MalformedLine:
            counters.malformed += 1
            return
        if event is None:
            return
        address = event.address
        if address is None:
            counters.unknown_device += 1
            return
        if record.device is not None and record.device != address:
            counters.foreign += 1  # a device's record that names another device
            self._dropped("foreign", f"a record of {record.device} names {address}", now)
            return
        if self._watched is not None and address not in self._watched:
            counters.unwatched += 1
            self._dropped("unwatched", f"{address}, which no watched device has", now)
            return
        age = 0.0
        if kernel_now is not None and record.usec is not None:
            age = max(0.0, kernel_now - record.usec / 1e6)
        if self._apply(event, address, now, now - age):
            counters.parsed += 1
        else:
            counters.overflow += 1
            self._dropped(
                "overflow", f"{address}: {self.max_devices} devices with faults held", now
            )

    def _dropped(self, reason: str, what: str, now: float) -> None:
        """Log a fault line that was not used, at most once a minute per reason (with
        the count since the last log line)."""
        self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
        if now - self._warned_at.get(reason, -math.inf) < _LOG_EVERY:
            return
        count = self._unlogged.pop(reason)
        self._warned_at[reason] = now
        log.warning(
            "kernel log %s: fault line dropped (%s); %d dropped for this reason since the "
            "last message",
            self.path, what, count,
        )  # fmt: skip

    def watch_keys(self, keys: Iterable[str]) -> None:
        """The PCI addresses of the devices the agent watches (any spelling): only their
        fault lines are latched and answered for; a device that is no longer watched
        keeps its latch until the room is needed."""
        watched = {normalize_pci_address(str(k)) for k in keys}
        self._watched = frozenset(a for a in watched if a is not None)
        self._dirty = True

    def _join_fallen(self, text: str) -> str:
        """The driver's fallen-off-the-bus notice may come as three lines (records); the
        line that says it is joined to the one that named the GPU. ``text`` is a
        message (no prefix); both lines must be the driver's (start with ``NVRM:``)."""
        head = _FALLEN_HEAD.match(text)
        if head is not None:
            self._fallen = (head.group("addr"), 3)
            return text
        if self._fallen is None:
            return text
        address, left = self._fallen
        if text.startswith("NVRM:") and "fallen off the bus" in text:
            self._fallen = None
            return f"NVRM: The NVIDIA GPU {address} {text}"
        self._fallen = (address, left - 1) if left > 1 else None
        return text

    def _apply(self, event: KernelEvent, address: str, now: float, at: float) -> bool:
        device = self._devices.get(address)
        if device is None:
            if len(self._devices) >= self.max_devices and not self._evict(now):
                return False
            device = self._devices[address] = _Device()
        device.seen = now
        self._dirty = True
        if event.recovered:
            if device.until > now:
                device.until, device.fault = -math.inf, ""
            device.note = event.message
        elif event.health is Health.UNHEALTHY:
            until = math.inf if self.clear_after is None else at + self.clear_after
            if until > now and until >= device.until:
                device.until, device.fault = until, event.message
        elif at >= now:  # informational: shown once, unless it is replayed history
            device.note = event.message
        return True

    def _evict(self, now: float) -> bool:
        """Make room: forget a device no longer watched (seen longest ago), else the
        device seen longest ago whose fault is over."""
        watched = self._watched
        if watched is not None:
            gone = [(d.seen, a) for a, d in self._devices.items() if a not in watched]
            if gone:
                del self._devices[min(gone)[1]]
                return True
        idle = [(d.seen, a) for a, d in self._devices.items() if d.until <= now]
        if not idle:
            return False
        del self._devices[min(idle)[1]]
        return True

    # -- answering ---------------------------------------------------------------------

    def _answer(self, now: float) -> list[Signal]:
        if not self._dirty and now < self._next_change:
            return list(self._signals)
        signals: list[Signal] = []
        next_change = math.inf
        watched = self._watched
        for address, device in self._devices.items():
            if watched is not None and address not in watched:
                continue
            if device.until > now:
                next_change = min(next_change, device.until)
                signals.append(Signal(self.by, address, Health.UNHEALTHY, device.fault))
                continue
            message, device.note = device.note, ""
            if device.fault:
                message = message or (
                    f"recovered: no fatal kernel-log line for {self.clear_after:g} s "
                    f"after {device.fault}"
                )
                device.fault = ""
            if message:
                next_change = now  # the one-time message goes on the next poll
            signals.append(Signal(self.by, address, Health.HEALTHY, message))
        self._signals, self._dirty, self._next_change = signals, False, next_change
        return list(signals)

    def dropped(self) -> dict[str, int]:
        """Lines read and not used, by reason (for the agent's metrics)."""
        return self.counters.dropped()

    def health_by_address(self) -> dict[str, Health]:
        """Each device a line named (by PCI address) and its health now."""
        now = self._clock()
        return {
            a: Health.UNHEALTHY if d.until > now else Health.HEALTHY
            for a, d in self._devices.items()
        }

    def close(self) -> None:
        """Stop reading (the next poll opens the log again)."""
        self._reader.close()
