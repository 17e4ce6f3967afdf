"""Unix socket files the toolkit listens on: replacing a stale one, removing its own.

Owns the two rules every listening socket of a driver follows (the registration and DRA
sockets, the control socket): a file left at the path by an earlier instance is replaced
only if it is a socket (anything else is refused), and on shutdown the file is removed only
if it is still the one this process bound (same inode), so a newer instance's socket
survives an older one's exit (a rolling update).
"""

from __future__ import annotations

import contextlib
import os
import stat

__all__ = ["clear_stale_socket", "remove_own_socket"]


def clear_stale_socket(path: str) -> bool:
    """Remove the socket file at ``path`` before binding there; False when there was none.

    Raises :class:`FileExistsError` when something other than a unix socket is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(f"refusing to replace {path}: it exists and is not a unix socket")
    os.unlink(path)
    return True


def remove_own_socket(path: str, inode: int | None) -> None:
    """Remove the socket file at ``path`` if it is still the one bound as ``inode``."""
    if inode is None:
        return
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if st.st_ino == inode and stat.S_ISSOCK(st.st_mode):
            os.unlink(path)
