"""Bounded child processes: the one way drahealth runs a command (exec probes, exec repairs).

Owns :func:`run_child` (blocking, for source threads), :func:`run_child_async` (the same run
on a thread of its own, for asyncio code), :class:`ChildResult` and :class:`ChildError`.
Every run

* checks its arguments, environment and timeout first: a value a process cannot be
  given (a NUL byte, an ``=`` in a variable's name) and a timeout that is no number of
  seconds >= 0 (NaN, negative) are a :class:`ChildError` naming it, as is a command that
  cannot start;
* waits for one of at most :data:`MAX_CHILDREN` slots shared by the whole process (the
  wait counts against the run's timeout; no slot in time: not started);
* starts the command in a session and process group of its own, with its standard input
  closed and, on Linux, ``PR_SET_PDEATHSIG`` so the kernel kills it when the thread that
  started it dies with its process;
* runs under GNU ``timeout`` where the machine has it (not for a command given this
  process's standard input), which sends SIGTERM to the whole group at the deadline and
  SIGKILL :data:`KILL_GRACE` seconds later from *inside* the group: the deadline holds
  even while this process is paused (SIGSTOP, a frozen VM) and cannot enforce it;
* reads its standard output and error as they come, keeping at most ``max_output`` bytes
  of each (the first and the last, :class:`Capture`) and discarding the rest, so a command
  that writes without end neither fills memory nor blocks on a full pipe;
* at the deadline (or when ``stop`` is set) sends SIGTERM to the whole group, then SIGKILL
  :data:`KILL_GRACE` seconds later, and never waits for its pipes to close: a background
  child holding them open changes nothing;
* when the command's own process ends, kills what is left of its group (helpers it left
  behind die with it, as the processes of a container do when its main process ends),
  reads what is still in the pipes for at most :data:`LINGER` seconds, and reaps it. The
  group is killed before the leader is reaped, so its id cannot have been reused;
* where this process inherits orphans (it is PID 1 of a container, or a subreaper), reaps
  the killed members of the groups it started (found in ``/proc``), so no zombie piles up.

A command that moves itself to another session escapes the group kill; the deadline
still bounds the run itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "KILL_GRACE",
    "LINGER",
    "MAX_ARGUMENT",
    "MAX_CHILDREN",
    "MAX_OUTPUT",
    "Capture",
    "ChildError",
    "ChildResult",
    "argument_problem",
    "run_child",
    "run_child_async",
]

#: Commands one drahealth process runs at once (probes and repairs together).
MAX_CHILDREN = 64
#: Bytes of each of standard output and error kept by default (first and last half).
MAX_OUTPUT = 64 * 1024
#: Seconds between SIGTERM and SIGKILL of a command's group at its deadline.
KILL_GRACE = 2.0
#: Seconds the pipes are still read after the command's process ended.
LINGER = 0.5
#: Longest single argument or environment value accepted (bytes, UTF-8).
MAX_ARGUMENT = 128 * 1024

_SLOTS = threading.BoundedSemaphore(MAX_CHILDREN)
_READ = 65536
_PR_SET_PDEATHSIG = 1
_PR_GET_CHILD_SUBREAPER = 37
#: Process groups started lately, whose orphaned members this process may reap.
_GROUPS: deque[int] = deque(maxlen=1024)


class ChildError(Exception):
    """A command that was not started; the text says why (``not started: ...``, ``could
    not run: ...``), to follow the command's name."""


class Capture:
    """At most ``limit`` bytes of a stream: its first ``limit // 2`` and its last
    ``limit - limit // 2``; :attr:`total` counts every byte read."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit // 2 - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        keep = self.limit - self.limit // 2
        if data and keep > 0:
            self._tail += data[-keep:]
            del self._tail[: max(0, len(self._tail) - keep)]

    @property
    def truncated(self) -> bool:
        return self.total > len(self._head) + len(self._tail)

    @property
    def head(self) -> bytes:
        """The first bytes kept (all of them when nothing was dropped)."""
        return bytes(self._head) if self.truncated else bytes(self._head + self._tail)

    @property
    def tail(self) -> bytes:
        """The last bytes kept (all of them when nothing was dropped)."""
        return bytes(self._tail) if self.truncated else bytes(self._head + self._tail)


@dataclass(frozen=True, slots=True)
class ChildResult:
    """How a command ended: ``returncode`` as :class:`subprocess.Popen` has it (negative:
    the signal that ended it), ``timed_out`` when the deadline (or a stop) ended it."""

    argv0: str
    returncode: int
    stdout: Capture
    stderr: Capture
    timed_out: bool
    seconds: float


def argument_problem(value: object) -> str:
    """Why ``value`` cannot be handed to a process as one argument or environment value
    ("" when it can)."""
    if not isinstance(value, str):
        return f"is not a string ({type(value).__name__})"
    if "\x00" in value:
        return "contains a NUL byte"
    try:
        size = len(value.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return "is not valid text"
    if size > MAX_ARGUMENT:
        return f"is longer than {MAX_ARGUMENT} bytes"
    return ""


def _check(argv: Sequence[str], env: Mapping[str, str]) -> None:
    if isinstance(argv, str) or not argv:
        raise ChildError("not started: the command is empty")
    for i, arg in enumerate(argv):
        problem = argument_problem(arg)
        if problem:
            raise ChildError(f"not started: argument {i} of the command {problem}")
    for name, value in env.items():
        problem = argument_problem(name) or ("contains '='" if "=" in name or not name else "")
        if problem:
            raise ChildError(f"not started: environment variable name {name[:64]!r} {problem}")
        problem = argument_problem(value)
        if problem:
            raise ChildError(f"not started: environment variable {name} {problem}")


#: GNU coreutils' ``timeout``: it puts itself and the command in one process group and
#: signals the whole group, so a run's deadline holds without this process's help.
_TIMEOUT_TOOL = shutil.which("timeout")
#: Longest timeout handed to it (longer ones are left to this process alone).
_MAX_SELF_DEADLINE = 10**8


def _located(argv0: str, env: Mapping[str, str]) -> None:
    """Raise :class:`ChildError` as ``exec`` would fail for ``argv0``: a wrapped command
    would otherwise only exit 126 or 127 from inside the wrapper."""
    found = shutil.which(argv0, path=env.get("PATH", os.defpath)) if "/" not in argv0 else argv0
    if found is None or not os.path.exists(found):
        raise ChildError("could not run: No such file or directory")
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise ChildError("could not run: Permission denied")


def _self_deadline(
    argv: Sequence[str], env: Mapping[str, str], timeout: float, kill_grace: float
) -> list[str]:
    """``argv`` under ``timeout``, where the machine has it and the timeout is a positive
    number it takes; ``argv`` as it is otherwise."""
    if _TIMEOUT_TOOL is None or not 0 < timeout < _MAX_SELF_DEADLINE:
        return list(argv)
    _located(argv[0], env)
    grace = max(0.1, min(kill_grace, 3600.0))
    return [_TIMEOUT_TOOL, "-s", "TERM", "-k", f"{grace:.3f}", f"{timeout:.3f}", *argv]


def _pdeathsig(sig_number: signal.Signals = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to send ``sig_number`` to the child when its
    parent dies (SIGTERM for the ``timeout`` wrapper, which then ends the whole group:
    a SIGKILL would end the wrapper alone and leave the command running)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    sig = ctypes.c_ulong(int(sig_number))
    option = ctypes.c_int(_PR_SET_PDEATHSIG)

    def preexec() -> None:
        prctl(option, sig)
        if os.getppid() != parent:  # the parent died before the call: follow it
            os._exit(137)

    return preexec


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _exited(pid: int) -> bool:
    """Whether the process has ended, without reaping it (its group id stays taken)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def run_child(
    argv: Sequence[str],
    env: Mapping[str, str],
    timeout: float,
    *,
    max_output: int = MAX_OUTPUT,
    kill_grace: float = KILL_GRACE,
    stop: threading.Event | None = None,
    die_with_parent: bool = True,
    stdin_inherit: bool = False,
) -> ChildResult:
    """Run ``argv`` with exactly ``env`` as its environment for at most ``timeout``
    seconds (see the module docstring). ``stdin_inherit`` hands it this process's
    standard input instead of none (an interactive credential plugin). Raises
    :class:`ChildError` when it was not started."""
    _check(argv, env)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout >= 0:
        raise ChildError(f"not started: the timeout {timeout!r} is no number of seconds >= 0")
    started = time.monotonic()
    deadline = started + timeout
    # a wait longer than the platform's lock allows (1e10 s, inf) waits that long
    left = min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX / 2)
    if not _SLOTS.acquire(timeout=left):
        raise ChildError(f"not started: {MAX_CHILDREN} commands are running already")
    try:
        try:
            command = (
                list(argv) if stdin_inherit else _self_deadline(argv, env, timeout, kill_grace)
            )
            wrapped = len(command) > len(argv)
            on_parent_death = signal.SIGTERM if wrapped else signal.SIGKILL
            proc = subprocess.Popen(
                command,
                env=dict(env),
                stdin=None if stdin_inherit else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_pdeathsig(on_parent_death) if die_with_parent else None,
            )
        except OSError as exc:
            raise ChildError(f"could not run: {exc.strerror or exc}") from None
        except (ValueError, subprocess.SubprocessError) as exc:
            raise ChildError(f"could not run: {exc}") from None
        _GROUPS.append(proc.pid)
        out, err = Capture(max_output), Capture(max_output)
        try:
            timed_out = _supervise(proc, out, err, deadline, kill_grace, stop)
        finally:
            _reap_orphans()
        return ChildResult(
            argv[0], int(proc.returncode), out, err, timed_out, time.monotonic() - started
        )
    finally:
        _SLOTS.release()


def _supervise(
    proc: subprocess.Popen[bytes],
    out: Capture,
    err: Capture,
    deadline: float,
    kill_grace: float,
    stop: threading.Event | None,
) -> bool:
    """Read, watch and end ``proc``; True when the deadline or ``stop`` ended it."""
    pid = proc.pid
    sel = selectors.DefaultSelector()
    pidfd = -1
    streams = {}
    for pipe, capture in ((proc.stdout, out), (proc.stderr, err)):
        assert pipe is not None
        os.set_blocking(pipe.fileno(), False)
        sel.register(pipe.fileno(), selectors.EVENT_READ, capture)
        streams[pipe.fileno()] = pipe
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(pid)
        sel.register(pidfd, selectors.EVENT_READ, None)
    timed_out = False
    term_sent_at: float | None = None
    ended_at: float | None = None
    try:
        while True:
            now = time.monotonic()
            if ended_at is None and _exited(pid):
                ended_at = now
                _kill_group(pid, signal.SIGKILL)  # helpers left behind go with it
                if pidfd >= 0:
                    sel.unregister(pidfd)
            if ended_at is not None and (not streams or now - ended_at >= LINGER):
                break
            if ended_at is None:
                if term_sent_at is None and (now >= deadline or (stop and stop.is_set())):
                    timed_out, term_sent_at = True, now
                    _kill_group(pid, signal.SIGTERM)
                if term_sent_at is not None and now - term_sent_at >= kill_grace:
                    _kill_group(pid, signal.SIGKILL)
                    term_sent_at = now  # again each grace until it is gone
            wait = 0.05 if pidfd < 0 or stop is not None else 0.5
            if ended_at is not None:
                wait = min(wait, LINGER - (now - ended_at))
            elif term_sent_at is None:
                wait = min(wait, deadline - now)
            else:
                wait = min(wait, term_sent_at + kill_grace - now)
            for key, _ in sel.select(max(0.0, wait)):
                if key.data is None:
                    continue  # the pidfd: the process ended, seen on the next turn
                try:
                    data = os.read(key.fd, _READ)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    key.data.add(data)
                else:
                    sel.unregister(key.fd)
                    streams.pop(key.fd).close()
    finally:
        sel.close()
        if pidfd >= 0:
            os.close(pidfd)
        for pipe in streams.values():
            pipe.close()
        if proc.returncode is None:
            if not _exited(pid):  # only when this thread was interrupted
                _kill_group(pid, signal.SIGKILL)
            _reap(proc)
    return timed_out


def _inherits_orphans() -> bool:
    if os.getpid() == 1:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        flag = ctypes.c_int(0)
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag)) == 0 and flag.value)
    except (OSError, AttributeError):
        return False


def _reap_orphans() -> None:
    """Reap zombie children of this process that belong to a group it started."""
    if not _GROUPS or not _inherits_orphans():
        return
    me, groups = os.getpid(), set(_GROUPS)
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read(1024).rpartition(b")")[2].split()
        except OSError:
            continue
        # after the name: state, ppid, pgrp
        if (
            len(fields) > 2
            and fields[0] == b"Z"
            and int(fields[1]) == me
            and int(fields[2]) in groups
            and int(name) not in groups
        ):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(name), os.WNOHANG)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Reap the killed process; one stuck in the kernel is reaped by a thread later."""
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        threading.Thread(target=proc.wait, name="reap", daemon=True).start()
        proc.returncode = -int(signal.SIGKILL)


async def run_child_async(
    argv: Sequence[str],
    env: Mapping[str, str],
    seconds: float,
    *,
    max_output: int = MAX_OUTPUT,
    kill_grace: float = KILL_GRACE,
    die_with_parent: bool = True,
) -> ChildResult:
    """:func:`run_child` (``seconds``: its timeout) on a thread of its own. Cancelling
    the caller ends the command the way its deadline would (SIGTERM, then SIGKILL) and
    waits until it is reaped."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[ChildResult] = loop.create_future()
    stop = threading.Event()

    def settle(result: ChildResult | None, exc: BaseException | None) -> None:
        if done.cancelled():
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        result: ChildResult | None = None
        error: BaseException | None = None
        try:
            result = run_child(
                argv, env, seconds, max_output=max_output, kill_grace=kill_grace,
                stop=stop, die_with_parent=die_with_parent,
            )  # fmt: skip
        except BaseException as exc:  # handed to the awaiting task
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name=f"child {argv[0] if argv else ''}"[:32], daemon=True).start()
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.shield(done)
        raise
