"""Control socket of a toolkit driver: fault injection and recovery over JSON lines.

Owns the server side of the ``<state-dir>/control.sock`` unix socket (mode 0600,
replaced if stale, removed on close only if it is still ours), the request/response
protocol, and how each action maps onto the :class:`HealthHub`. :func:`start` serves
it for every driver that has a hub (``PluginOptions.control_socket``), so
``drahealth inject --state-dir DIR`` works for any driver built on the toolkit, and
an operator can clear a latched fault (action ``healthy``). The client lives in
``_control_client`` (standard library only) and is re-exported here. Knows nothing
of gRPC, the API server or the CLI.

Protocol: one JSON object per line (UTF-8, ``\\n``-terminated, at most
:data:`MAX_LINE_BYTES` bytes), one reply line per request, any number of requests
per connection. Request fields::

    {"action": "unhealthy" | "healthy" | "unknown" | "silence" | "resume" | "status" | "xid",
     "device": "gpu-3" | "pool/gpu-3" | "*",     # required except for silence/resume/status
     "message": "text"}                           # optional

Replies are ``{"ok": true, ...}`` with the device's new state (``device``,
``health``, ``message``, ``sticky``) and the hub's ``silenced`` flag, or
``{"ok": false, "error": "..."}``. A bad request (not JSON, not an object, missing
or unknown fields, unknown action or device) gets an error reply and the connection
stays usable; a line longer than the limit gets an error reply and the connection is
closed (the rest of that line cannot be told apart from the next request).

Actions (source names are those the hub sees):

* ``unhealthy``: a *fatal* Unhealthy report from source ``"inject"`` (latched until
  recovery), message default ``"injected fault"``;
* ``unknown``: an Unknown report from ``"inject"``;
* ``healthy``: ``"inject"`` reports Healthy and every latch of the device is cleared
  (``hub.recover``: explicit operator recovery);
* ``silence`` / ``resume``: ``hub.silence(True/False)`` for the whole hub (a wedged
  driver: streams send nothing); a given DEVICE is still checked (``*`` = any);
* ``status``: read-only; the device's state, or every device without one;
* ``xid``: only where the driver serves it (the simulated driver's ``sim-nvidia``
  profile: the device's NVIDIA XID line appended to the node's fake kernel log, fields
  ``xid``, ``pid``, ``process``). Such driver-specific actions are
  :class:`ControlAction` objects given to :class:`ControlServer` (or to
  ``PluginOptions.control_actions``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any, Protocol

from drahealth.core import Health
from drahealth.driver._control_client import (
    CONTROL_ACTIONS,
    CONTROL_SOCKET_NAME,
    MAX_LINE_BYTES,
    ControlError,
    control_request,
    control_request_sync,
    control_socket_path,
    encode_line,
)
from drahealth.driver._hub import DeviceReport, DeviceState, HealthHub
from drahealth.driver._sockfile import clear_stale_socket, remove_own_socket

__all__ = [
    "CONTROL_ACTIONS",
    "CONTROL_SOCKET_NAME",
    "INJECT_SOURCE",
    "MAX_LINE_BYTES",
    "ControlAction",
    "ControlError",
    "ControlServer",
    "ProfileAction",
    "control_request",
    "control_request_sync",
    "control_socket_path",
    "handle_line",
    "handle_request",
    "validate_actions",
]

log = logging.getLogger(__name__)

#: Hub source name of injected reports.
INJECT_SOURCE = "inject"
#: Actions that need no device.
_HUB_ACTIONS = frozenset({"silence", "resume", "status"})
#: Actions every server answers itself; any other needs a :class:`ControlAction`.
_BUILTIN_ACTIONS = frozenset({"unhealthy", "healthy", "unknown", "silence", "resume", "status"})
_FIELDS = frozenset({"action", "device", "message"})
_DEFAULT_FAULT = "injected fault"


class ControlAction(Protocol):
    """An action only some drivers serve: its extra request ``fields`` and the call
    that answers it for one device (raising :class:`ControlError` for a bad request).
    Called on the event loop: it must not block for long."""

    fields: frozenset[str]

    def __call__(self, state: DeviceState, req: Mapping[str, Any]) -> dict[str, Any]: ...


#: The name the simulated driver first gave :class:`ControlAction`.
ProfileAction = ControlAction


def validate_actions(actions: Mapping[str, ControlAction]) -> None:
    """Refuse driver actions that could not be served: a name that is not a non-empty
    string or that is a built-in action, or an object without a frozenset ``fields``
    that cannot be called (``ValueError`` / ``TypeError`` naming the action)."""
    for name, action in actions.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"control action name {name!r} is not a non-empty string")
        if name in _BUILTIN_ACTIONS:
            raise ValueError(f"control action {name!r} is a built-in action")
        if not callable(action) or not isinstance(getattr(action, "fields", None), frozenset):
            raise TypeError(
                f"control action {name!r} must be callable and have a frozenset 'fields'"
            )


# --------------------------------------------------------------------------- protocol


def _state_reply(hub: HealthHub, state: DeviceState) -> dict[str, Any]:
    return {
        "ok": True,
        "device": f"{state.pool}/{state.device}",
        "health": state.health.value,
        "message": state.message,
        "sticky": state.sticky,
        "silenced": hub.silenced,
    }


def _resolve(hub: HealthHub, name: str) -> DeviceState:
    """The state of ``pool/device`` or of the only device called ``device``."""
    if "/" in name:
        pool, _, device = name.rpartition("/")
        try:
            return hub.state(pool, device)
        except ValueError:
            raise ControlError(f"unknown device {name!r}") from None
    matches = [s for s in hub.snapshot() if s.device == name]
    if not matches:
        raise ControlError(f"unknown device {name!r}")
    if len(matches) > 1:
        pools = ", ".join(s.pool for s in matches)
        raise ControlError(f"device name {name!r} is ambiguous (pools {pools}); use POOL/DEVICE")
    return matches[0]


def _validate(req: Any, actions: Mapping[str, ControlAction]) -> tuple[str, str | None, str | None]:
    if not isinstance(req, Mapping):
        raise ControlError(f"request must be a JSON object, got {type(req).__name__}")
    name = req.get("action")
    extra = actions.get(name) if isinstance(name, str) else None
    unknown = sorted(set(req) - _FIELDS - (extra.fields if extra is not None else set()))
    if unknown:
        raise ControlError(f"unknown field(s) in request: {', '.join(map(str, unknown))}")
    action = req.get("action")
    if action is None:
        raise ControlError("missing field 'action'")
    if not isinstance(action, str) or (action not in CONTROL_ACTIONS and action not in actions):
        known = [*CONTROL_ACTIONS, *(a for a in sorted(actions) if a not in CONTROL_ACTIONS)]
        raise ControlError(f"unknown action {action!r}; expected one of {', '.join(known)}")
    device = req.get("device")
    if device is not None and (not isinstance(device, str) or not device):
        raise ControlError("field 'device' must be a non-empty string")
    if device is None and action not in _HUB_ACTIONS:
        raise ControlError(f"missing field 'device' (needed by action {action!r})")
    message = req.get("message")
    if message is not None and not isinstance(message, str):
        raise ControlError("field 'message' must be a string")
    return action, device, message


def handle_request(
    hub: HealthHub, req: Any, actions: Mapping[str, ControlAction] | None = None
) -> dict[str, Any]:
    """Apply one decoded request to ``hub`` (or to the driver's ``actions``); return the
    reply (never raises)."""
    try:
        action, device, message = _validate(req, actions or {})
        if action in _HUB_ACTIONS:
            if device is not None and device != "*":
                state: DeviceState | None = _resolve(hub, device)
            else:
                state = None
            if action != "status":
                hub.silence(action == "silence")
            if state is not None:
                return _state_reply(hub, hub.state(state.pool, state.device))
            reply: dict[str, Any] = {"ok": True, "silenced": hub.silenced}
            if action == "status":
                reply["streams"] = hub.stream_count
                reply["devices"] = [
                    {
                        "device": f"{s.pool}/{s.device}",
                        "health": s.health.value,
                        "message": s.message,
                        "sticky": s.sticky,
                    }
                    for s in hub.snapshot()
                ]
            return reply
        assert device is not None
        state = _resolve(hub, device)
        pool, name = state.pool, state.device
        if action not in _BUILTIN_ACTIONS:
            handler = (actions or {}).get(action)
            if handler is None:
                raise ControlError(f"action {action!r} is not served by this driver")
            return handler(state, req)
        if action == "unhealthy":
            report = DeviceReport(pool, name, Health.UNHEALTHY, message or _DEFAULT_FAULT, True)
            hub.submit(INJECT_SOURCE, [report])
        elif action == "unknown":
            hub.submit(INJECT_SOURCE, [DeviceReport(pool, name, Health.UNKNOWN, message or "")])
        else:  # healthy
            hub.submit(INJECT_SOURCE, [DeviceReport(pool, name, Health.HEALTHY, message or "")])
            hub.recover(pool, name)
        return _state_reply(hub, hub.state(pool, name))
    except ControlError as exc:
        return {"ok": False, "error": str(exc)}
    except ValueError as exc:  # the hub refused the report
        return {"ok": False, "error": str(exc)}
    except OSError as exc:  # a driver's action could not write
        return {"ok": False, "error": f"action {req.get('action')!r} failed: {exc}"}


def handle_line(
    hub: HealthHub, line: bytes, actions: Mapping[str, ControlAction] | None = None
) -> dict[str, Any]:
    """Decode one request line and apply it (never raises)."""
    try:
        req = json.loads(line)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        return {"ok": False, "error": f"request is not valid JSON: {exc}"}
    return handle_request(hub, req, actions)


# --------------------------------------------------------------------------- server


class ControlServer:
    """Serves the control protocol for ``hub`` on the unix socket ``path``.

    ``start()`` replaces a stale socket (or one left by a previous instance; the
    newest instance wins, as in a rolling update), refuses to replace anything that
    is not a socket, and makes the socket 0600 before it accepts connections.
    ``close()`` removes the socket only if it is still the one this server bound.
    """

    def __init__(
        self, hub: HealthHub, path: str, actions: Mapping[str, ControlAction] | None = None
    ) -> None:
        validate_actions(actions or {})
        self.hub = hub
        self.path = os.path.abspath(path)
        self.actions = dict(actions or {})
        self._server: asyncio.Server | None = None
        self._ino: int | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        if clear_stale_socket(self.path):
            log.info("replacing existing control socket %s", self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.path)
            os.chmod(self.path, 0o600)  # before listen(): nobody can connect yet
            self._ino = os.stat(self.path).st_ino
            self._server = await asyncio.start_unix_server(
                self._serve, sock=sock, limit=MAX_LINE_BYTES
            )
        except BaseException:
            sock.close()
            self._remove()
            raise
        log.info("control socket listening on %s", self.path)

    async def close(self) -> None:
        """Stop accepting, end open connections and remove the socket. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for task in list(self._conns):
                task.cancel()
            if self._conns:
                await asyncio.gather(*self._conns, return_exceptions=True)
            await server.wait_closed()
        self._remove()

    def _remove(self) -> None:
        remove_own_socket(self.path, self._ino)
        self._ino = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._converse(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("control connection failed")
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # the line exceeds the stream limit
                writer.write(
                    encode_line(
                        {
                            "ok": False,
                            "error": f"request line longer than {MAX_LINE_BYTES} bytes",
                        }
                    )
                )
                await writer.drain()
                return
            if not line:
                return
            if not line.strip():
                continue
            reply = handle_line(self.hub, line, self.actions)
            if reply["ok"]:
                log.info("control request %s applied", line.strip()[:200].decode(errors="replace"))
            writer.write(encode_line(reply))
            await writer.drain()
