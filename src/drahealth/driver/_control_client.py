"""Client side of the driver's control socket, importable without the driver.

Owns the socket's location (``<state-dir>/control.sock``), the line limit, the
action names, the line encoding and :func:`request` / :func:`request_sync`. It
imports only the standard library, so ``drahealth inject`` starts in a fraction of
the time the full driver takes to import. The protocol is described in
``drahealth.driver._control``, which serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ACTIONS",
    "CONTROL_ACTIONS",
    "CONTROL_SOCKET_NAME",
    "MAX_LINE_BYTES",
    "ControlError",
    "control_request",
    "control_request_sync",
    "control_socket_path",
    "encode_line",
    "request",
    "request_sync",
]

#: File name of the control socket inside the state directory.
CONTROL_SOCKET_NAME = "control.sock"
#: Longest accepted request line, newline included.
MAX_LINE_BYTES = 64 * 1024
#: Actions a request may name; all but ``status`` are ``drahealth inject`` actions
#: (``xid`` only where the driver serves it, as the simulated ``sim-nvidia`` does).
CONTROL_ACTIONS = ("unhealthy", "healthy", "unknown", "silence", "resume", "status", "xid")


class ControlError(Exception):
    """A control request failed; the message says why in words fit for a terminal."""


def control_socket_path(state_dir: str) -> str:
    """``<state_dir>/control.sock``."""
    return os.path.join(state_dir, CONTROL_SOCKET_NAME)


def encode_line(obj: Mapping[str, Any]) -> bytes:
    """One protocol line: compact UTF-8 JSON and a newline."""
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


async def control_request(
    path: str,
    action: str,
    device: str | None = None,
    message: str | None = None,
    *,
    timeout: float = 5.0,  # noqa: ASYNC109
    fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Send one request to the control socket at ``path``; return the ``ok`` reply.

    ``fields``: further request fields of a profile's action (``xid``, ``pid``, ...).

    Raises :class:`ControlError` with a clear message when the socket is missing, no
    driver listens, the reply is malformed or late, or the driver refused the request.
    """
    req: dict[str, Any] = {"action": action}
    if device is not None:
        req["device"] = device
    if message is not None:
        req["message"] = message
    req.update(fields or {})
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(path, limit=16 * MAX_LINE_BYTES)
            try:
                writer.write(encode_line(req))
                await writer.drain()
                line = await reader.readline()
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
    except FileNotFoundError:
        raise ControlError(
            f"no control socket at {path}: is the driver running with this state directory?"
        ) from None
    except ConnectionRefusedError:
        raise ControlError(
            f"the driver is not running: nobody listens on {path} (stale socket)"
        ) from None
    except PermissionError:
        raise ControlError(f"permission denied on control socket {path}") from None
    except TimeoutError:
        raise ControlError(f"no reply from the driver on {path} within {timeout:g}s") from None
    except (OSError, ValueError) as exc:
        raise ControlError(f"talking to the driver on {path} failed: {exc}") from None
    if not line:
        raise ControlError(f"the driver closed {path} without a reply")
    try:
        reply = json.loads(line)
    except ValueError:
        raise ControlError(f"malformed reply from the driver: {line[:200]!r}") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise ControlError(f"malformed reply from the driver: {line[:200]!r}")
    if not reply["ok"]:
        raise ControlError(str(reply.get("error", "request refused")))
    return reply


def control_request_sync(
    path: str,
    action: str,
    device: str | None = None,
    message: str | None = None,
    *,
    timeout: float = 5.0,
    fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Blocking :func:`control_request` (for the CLI)."""
    return asyncio.run(
        control_request(path, action, device, message, timeout=timeout, fields=fields)
    )


# The names ``drahealth.simdriver`` exported before the socket joined the toolkit.
ACTIONS = CONTROL_ACTIONS
request = control_request
request_sync = control_request_sync
