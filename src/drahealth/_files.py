"""Reading files others may replace: the one way drahealth opens a file it did not write.

Owns :func:`open_nonblocking` (open without ever waiting, and ``fstat`` what was opened,
not the path), :func:`read_regular` (at most ``limit + 1`` bytes of a regular file, so the
caller can tell "too big" from "exactly the limit") and :func:`file_kind` (what a path
holds instead of a regular file, for messages). A FIFO without a writer, a character device
such as ``/dev/zero``, a socket or a directory in place of a file is refused at once, never
waited on or read without end. Callers turn :class:`NotARegularFile` and ``OSError`` into
their own errors, naming the file as their users know it.
"""

from __future__ import annotations

import os
import stat

__all__ = ["NotARegularFile", "file_kind", "open_nonblocking", "read_regular"]

_READ = 1 << 20


class NotARegularFile(ValueError):
    """The path holds something other than a regular file; ``kind`` says what."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"not a regular file ({kind})")
        self.kind = kind


def file_kind(mode: int) -> str:
    """What ``mode`` is, with its article: "a FIFO", "a character device", ..."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a special file"


def open_nonblocking(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """A read-only descriptor of ``path`` (non-blocking: a FIFO without a writer opens at
    once) and the ``fstat`` of what was opened; the caller closes it. OSError as
    ``os.open`` raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int) -> tuple[bytes, os.stat_result]:
    """At most ``limit + 1`` bytes of the regular file ``path``, and its ``fstat``.

    Raises :class:`NotARegularFile` for anything else in its place (checked on what was
    opened), OSError when it cannot be opened or read."""
    fd, st = open_nonblocking(path)
    try:
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(file_kind(st.st_mode))
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, _READ))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)
