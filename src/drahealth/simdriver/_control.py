"""The control socket's names as the simulated driver first exported them.

The socket (server, protocol and standard-library client) is part of the driver
toolkit (``drahealth.driver``: :class:`~drahealth.driver.ControlServer`,
:func:`~drahealth.driver.control_request`), which :func:`drahealth.driver.start`
serves for every driver with a health hub. This module only keeps the simulated
driver's older names pointing at that one implementation.
"""

from __future__ import annotations

from drahealth.driver import (
    CONTROL_ACTIONS,
    CONTROL_SOCKET_NAME,
    INJECT_SOURCE,
    ControlAction,
    ControlError,
    ControlServer,
    control_request,
    control_request_sync,
    control_socket_path,
)

__all__ = [
    "ACTIONS",
    "CONTROL_SOCKET_NAME",
    "INJECT_SOURCE",
    "ControlError",
    "ControlServer",
    "ProfileAction",
    "control_socket_path",
    "request",
    "request_sync",
]

ACTIONS = CONTROL_ACTIONS
ProfileAction = ControlAction
request = control_request
request_sync = control_request_sync
