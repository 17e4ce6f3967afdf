"""The simulated kubelet's container model: commands, exit codes, output, hostile input."""

from __future__ import annotations

import asyncio

import pytest

from drahealth.node._containers import Container


async def _run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, bytes]:
    """(exit code, output) of one run, within 5 s."""
    c = Container(argv[:1], argv[1:], env or {})
    async with asyncio.timeout(5):
        code = await c.run()
    return code, c.output


@pytest.mark.parametrize(
    ("argv", "code", "output"),
    [
        (("true",), 0, b""),
        (("false",), 1, b""),
        (("sh", "-c", "exit 3"), 3, b""),
        (("sh", "-c", "exit 300"), 300 & 0xFF, b""),
        (("sh", "-c", "echo hi; false || echo fallback"), 0, b"hi\nfallback\n"),
        (("sh", "-c", "nosuchcommand"), 127, b"sh: nosuchcommand: command not found\n"),
        (("sh", "-c", "'unbalanced"), 2, None),
        (("sh", "-c"), 2, None),
        (("bash", "-c", "X=1; echo $X"), 0, b"1\n"),
    ],
)
async def test_commands(argv: tuple[str, ...], code: int, output: bytes | None) -> None:
    got, out = await _run(*argv)
    assert got == code
    if output is not None:
        assert out == output


async def test_environment_is_printed_by_export() -> None:
    _, out = await _run("bash", "-c", "export", env={"DRA_DEVICE_GPU_0": 'a"b$c'})
    assert out == b'declare -x DRA_DEVICE_GPU_0="a\\"b\\$c"\n'


async def test_nested_busybox_does_not_recurse() -> None:
    assert (await _run(*(["busybox"] * 5000), "true"))[0] == 0


async def test_output_is_capped() -> None:
    c = Container(["sh"], ["-c", "echo " + "x" * 1000], {}, max_log_bytes=100)
    for _ in range(3):
        await c.run()
    assert len(c.output) == 100


async def test_sleep_ignores_term_and_a_trap_ends_wait() -> None:
    c = Container(["sh"], ["-c", "trap 'exit 0' TERM; sleep 9999 & wait"], {})
    task = asyncio.create_task(c.run())
    await asyncio.sleep(0.05)
    c.terminate()
    async with asyncio.timeout(5):
        assert await task == 0
    plain = Container(["sleep"], ["9999"], {})
    task = asyncio.create_task(plain.run())
    await asyncio.sleep(0.05)
    plain.terminate()
    await asyncio.sleep(0.05)
    assert not task.done()  # PID 1 without a handler ignores SIGTERM: killed after the grace
    task.cancel()
