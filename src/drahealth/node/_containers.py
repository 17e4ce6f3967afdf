"""The simulated container runtime of the kubelet mode: what a container's command does.

Owns :class:`Container`, one run of one container: its command and args interpreted by
a small model of what GPU demo pods run (no process is started), its output (bounded) and
its exit code. Understood, as a program or inside ``sh -c`` / ``bash -c`` scripts:

* ``sleep N`` (``infinity``), ``true``, ``:``, ``false``, ``exit [N]``;
* ``echo``, ``printf`` (``%s`` and ``\\n``), ``env``, ``printenv [NAME]``, ``export``
  (no arguments: the environment as the shell prints it, ``declare -x`` for bash,
  ``export`` for sh), ``export NAME=value`` and ``NAME=value``;
* ``trap 'command' TERM``, ``cmd &`` and ``wait``; ``;``, ``&&``, ``||`` and newlines;
  ``$NAME``, ``${NAME}``, ``$?``.

A command outside this list inside a script prints ``<shell>: <cmd>: command not found``
and returns 127, as a shell does. A program outside it (an application image's binary)
runs until it is stopped, as a server would.

Signals follow what a container's PID 1 sees: SIGTERM is ignored by a shell without a
``trap`` for it and by ``sleep`` (PID 1 has no default signal actions), so such a
container runs until the grace period ends and is killed (exit 137); a ``trap``'d TERM
interrupts ``wait`` and runs the trap; any other program exits 143 on SIGTERM.
"""

from __future__ import annotations

import asyncio
import math
import re
import shlex
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

__all__ = ["MAX_LOG_BYTES", "CommandError", "Container"]

#: Output kept per container run (the oldest bytes are dropped beyond it).
MAX_LOG_BYTES = 1024 * 1024
#: Statements one script may run (a guard against runaway scripts).
MAX_STEPS = 10_000
_SHELLS = {"sh", "bash", "ash", "dash", "busybox"}
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*)|(\?))")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_TERM_NAMES = {"TERM", "SIGTERM", "15"}


class CommandError(ValueError):
    """A command line the model cannot parse (names what was wrong)."""


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Container:
    """One run of a container's command (see the module docstring)."""

    def __init__(
        self,
        command: Sequence[str],
        args: Sequence[str],
        env: Mapping[str, str],
        *,
        max_log_bytes: int = MAX_LOG_BYTES,
    ) -> None:
        self.argv = [str(a) for a in [*command, *args]]
        self.env = dict(env)
        self.max_log_bytes = max_log_bytes
        self._log = bytearray()
        self._term = asyncio.Event()
        self._trap: str | None = None
        self._background: list[asyncio.Task[int]] = []
        self._status = 0
        self._shell = "sh"
        self._steps = 0

    # -- output -------------------------------------------------------------------

    @property
    def output(self) -> bytes:
        return bytes(self._log)

    def _write(self, text: str) -> None:
        self._log += text.encode()
        excess = len(self._log) - self.max_log_bytes
        if excess > 0:
            del self._log[:excess]

    # -- signals ------------------------------------------------------------------

    def terminate(self) -> None:
        """Deliver SIGTERM (see the module docstring for what each program does)."""
        self._term.set()

    # -- running ------------------------------------------------------------------

    async def run(self) -> int:
        """Run to the end; the exit code. Cancel the task to SIGKILL it (exit 137)."""
        try:
            return await self._program(self.argv)
        except _Exit as done:
            return done.code
        finally:
            for task in self._background:
                task.cancel()

    async def _program(self, argv: list[str]) -> int:
        if not argv:
            return await self._forever(ignores_term=False)
        name = argv[0].rsplit("/", 1)[-1]
        while name == "busybox" and len(argv) > 1:  # a loop: "busybox busybox ..." nests
            argv = argv[1:]
            name = argv[0].rsplit("/", 1)[-1]
        if name in _SHELLS:
            self._shell = "bash" if name == "bash" else "sh"
            rest = argv[1:]
            if rest and rest[0] == "-c":
                if len(rest) < 2:
                    self._write(f"{name}: -c: option requires an argument\n")
                    return 2
                return await self._script(rest[1])
            return 0  # a shell with no script and no terminal reads EOF and exits
        if name == "sleep":
            return await self._sleep(argv, ignores_term=True)
        code = await self._builtin(argv, toplevel=True)
        if code is not None:
            return code
        return await self._forever(ignores_term=False)

    async def _forever(self, *, ignores_term: bool) -> int:
        if ignores_term:
            await asyncio.Event().wait()
        await self._term.wait()
        return 143

    async def _sleep(self, argv: list[str], *, ignores_term: bool) -> int:
        try:
            seconds = sum(_duration(a) for a in argv[1:]) if len(argv) > 1 else math.nan
        except ValueError:
            self._write(f"sleep: invalid time interval '{argv[1]}'\n")
            return 1
        if math.isnan(seconds):
            self._write("sleep: missing operand\n")
            return 1
        if math.isinf(seconds):
            return await self._forever(ignores_term=ignores_term)
        if ignores_term:
            await asyncio.sleep(seconds)
            return 0
        try:
            async with asyncio.timeout(seconds):
                await self._term.wait()
        except TimeoutError:
            return 0
        return 143

    # -- the shell ----------------------------------------------------------------

    async def _script(self, script: str) -> int:
        try:
            statements = _parse(script)
        except CommandError as exc:
            self._write(f"{self._shell}: -c: syntax error: {exc}\n")
            return 2
        return await self._statements(statements)

    async def _statements(self, statements: list[tuple[list[str], str]]) -> int:
        skip_next = False
        for words, sep in statements:
            self._steps += 1
            if self._steps > MAX_STEPS:
                raise _Exit(self._status)
            if skip_next:
                skip_next = (sep == "&&" and self._status != 0) or (
                    sep == "||" and self._status == 0
                )
                continue
            expanded = [self._expand(w) for w in words]
            if sep == "&":
                task = asyncio.create_task(self._command(expanded, background=True))
                self._background.append(task)
                self._status = 0
            else:
                self._status = await self._command(expanded, background=False)
            skip_next = (sep == "&&" and self._status != 0) or (sep == "||" and self._status == 0)
        return self._status

    def _expand(self, word: str) -> str:
        def one(m: re.Match[str]) -> str:
            if m.group(3):
                return str(self._status)
            return self.env.get(m.group(1) or m.group(2), "")

        return _VAR.sub(one, word)

    async def _command(self, argv: list[str], *, background: bool) -> int:
        while argv and (m := _ASSIGN.match(argv[0])) and len(argv) > 0:
            self.env[m.group(1)] = m.group(2)
            argv = argv[1:]
        if not argv:
            return 0
        name = argv[0].rsplit("/", 1)[-1]
        if name == "sleep":
            if background:
                return await self._sleep(argv, ignores_term=True)
            return await self._trappable(self._sleep(argv, ignores_term=True), defer=True)
        if name == "wait":
            return await self._trappable(self._wait(), defer=False)
        if name in _SHELLS and len(argv) > 2 and argv[1] == "-c":
            return await self._script(argv[2])
        code = await self._builtin(argv, toplevel=False)
        if code is not None:
            return code
        self._write(f"{self._shell}: {argv[0]}: command not found\n")
        return 127

    async def _wait(self) -> int:
        code = 0
        for task in list(self._background):
            code = await task
        self._background.clear()
        return code

    async def _trappable(self, work: Coroutine[Any, Any, int], *, defer: bool) -> int:
        """Run ``work``; a trapped SIGTERM runs the trap (at once for ``wait``, after the
        foreground command for others, as shells do). Untrapped, PID 1 ignores it."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                if self._trap is None:
                    return int(await task)
                term = asyncio.ensure_future(self._term.wait())
                done, _ = await asyncio.wait({task, term}, return_when=asyncio.FIRST_COMPLETED)
                term.cancel()
                if task in done and not (self._term.is_set() and not defer):
                    code = int(task.result())
                    if self._term.is_set():
                        await self._run_trap()
                    return code
                if not defer:
                    task.cancel()
                    await self._run_trap()
                    return 128 + 15
                code = int(await task)
                await self._run_trap()
                return code
        finally:
            if not task.done():
                task.cancel()

    async def _run_trap(self) -> None:
        trap, self._trap = self._trap, None
        if trap:
            await self._script(trap)

    async def _builtin(self, argv: list[str], *, toplevel: bool) -> int | None:
        name = argv[0].rsplit("/", 1)[-1]
        if name in ("true", ":"):
            return 0
        if name == "false":
            return 1
        if name == "exit":
            raise _Exit(_exit_code(argv[1:], self._status))
        if name == "echo":
            words = argv[1:]
            newline = True
            if words and words[0] == "-n":
                newline, words = False, words[1:]
            self._write(" ".join(words) + ("\n" if newline else ""))
            return 0
        if name == "printf":
            if len(argv) < 2:
                self._write("printf: usage: printf format [arguments]\n")
                return 2
            fmt = argv[1].replace("\\n", "\n").replace("\\t", "\t")
            values = iter(argv[2:])
            self._write(re.sub(r"%s", lambda _m: next(values, ""), fmt))
            return 0
        if name == "env" and len(argv) == 1:
            self._write("".join(f"{k}={v}\n" for k, v in self.env.items()))
            return 0
        if name == "printenv":
            if len(argv) == 1:
                self._write("".join(f"{k}={v}\n" for k, v in self.env.items()))
                return 0
            missing = [n for n in argv[1:] if n not in self.env]
            self._write("".join(f"{self.env[n]}\n" for n in argv[1:] if n in self.env))
            return 1 if missing else 0
        if name == "export" and not toplevel:
            if len(argv) == 1 or argv[1:] == ["-p"]:
                self._write("".join(self._export_line(k, v) for k, v in sorted(self.env.items())))
                return 0
            for word in argv[1:]:
                m = _ASSIGN.match(word)
                if m:
                    self.env[m.group(1)] = m.group(2)
            return 0
        if name == "trap" and not toplevel:
            if len(argv) >= 3 and any(s.upper() in _TERM_NAMES for s in argv[2:]):
                self._trap = None if argv[1] == "-" else argv[1]
            return 0
        return None

    def _export_line(self, key: str, value: str) -> str:
        if self._shell == "bash":
            escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
            return f'declare -x {key}="{escaped}"\n'
        return "export {}={}\n".format(key, "'" + value.replace("'", "'\"'\"'") + "'")


def _duration(text: str) -> float:
    if text == "infinity":
        return math.inf
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    scale = units.get(text[-1:])
    number = text[:-1] if scale is not None else text
    value = float(number)
    if value < 0 or math.isnan(value):
        raise ValueError(text)
    return value * (scale or 1)


def _exit_code(args: list[str], last: int) -> int:
    if not args:
        return last
    try:
        return int(args[0]) & 0xFF
    except ValueError:
        return 2


def _parse(script: str) -> list[tuple[list[str], str]]:
    """Statements of ``script``: (words, separator after them) with separators ``;``,
    ``&``, ``&&``, ``||`` (a newline is ``;``)."""
    lexer = shlex.shlex(script.replace("\n", ";"), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out: list[tuple[list[str], str]] = []
    words: list[str] = []
    try:
        for token in lexer:
            if token in (";", "&", "&&", "||", ";;"):
                if words:
                    out.append((words, ";" if token == ";;" else token))
                elif token != ";":
                    raise CommandError(f"unexpected {token!r}")
                words = []
            elif token == "|" or set(token) <= set(";&|"):
                raise CommandError(f"{token!r} is not supported")
            else:
                words.append(token)
    except ValueError as exc:  # unbalanced quotes
        raise CommandError(str(exc)) from exc
    if words:
        out.append((words, ";"))
    return out
