"""Toolkit for DRA driver authors: the Python counterpart of the Go kubeletplugin helper.

One entry point, :func:`start`, serves the registration and DRA sockets for a driver
that implements the narrow :class:`Driver` protocol (``prepare`` / ``unprepare``) and,
as :class:`PluginOptions` ask, runs what every driver needs beside them: publishing
its :class:`Pool` of devices as ResourceSlices, health-driven device taints
(NoSchedule unless the author chooses otherwise), the fault-injection control socket
that ``drahealth inject`` talks to, and metrics. :class:`HealthHub` aggregates device
health from sources and serves it over dra-health v1 and v1alpha1. The pieces
``start`` assembles stay public for drivers that wire them by hand
(:class:`ResourceSlicePublisher`, :class:`TaintController`, :class:`ControlServer`,
:class:`DriverMetrics`, :class:`ClaimStatusWriter`). See docs/driver.md.

Names are imported on first use (PEP 562), so importing one submodule does not load
gRPC and the Kubernetes client. The simulated driver built on this toolkit is a
separate program, ``drahealth.simdriver``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drahealth._lazy import lazy_exports

if TYPE_CHECKING:
    from drahealth.driver._claim_status import ClaimStatusOptions, ClaimStatusWriter
    from drahealth.driver._control import INJECT_SOURCE, ControlAction, ControlServer
    from drahealth.driver._control_client import (
        CONTROL_ACTIONS,
        CONTROL_SOCKET_NAME,
        ControlError,
        control_request,
        control_request_sync,
        control_socket_path,
    )
    from drahealth.driver._hub import (
        OPERATOR_SOURCE,
        DeviceReport,
        DeviceState,
        HealthHub,
        RecoveryPolicy,
    )
    from drahealth.driver._metrics import DriverMetrics
    from drahealth.driver._plugin import PluginHandle, install_signal_handlers, start
    from drahealth.driver._publisher import WITHDRAW_MODES, ResourceSlicePublisher, WithdrawMode
    from drahealth.driver._services import PREPARE_FAULT_SOURCE, TAINT_STORE_NAME
    from drahealth.driver._slices import DriverResources, Pool, SliceValidationError, split_pool
    from drahealth.driver._taints import TaintController, TaintPolicy, TaintStore
    from drahealth.driver._types import (
        DEFAULT_CDI_DIR,
        AllocationResult,
        CheckpointError,
        ClaimError,
        ClaimRef,
        Driver,
        ErrorKind,
        OpaqueConfig,
        PluginOptions,
        PreparedClaimRequest,
        PreparedDevice,
        PrepareResult,
        RegistrationStatus,
        validate_driver_name,
    )

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "ClaimStatusOptions": "drahealth.driver._claim_status",
    "ClaimStatusWriter": "drahealth.driver._claim_status",
    "OPERATOR_SOURCE": "drahealth.driver._hub",
    "DeviceReport": "drahealth.driver._hub",
    "DeviceState": "drahealth.driver._hub",
    "HealthHub": "drahealth.driver._hub",
    "RecoveryPolicy": "drahealth.driver._hub",
    "ControlAction": "drahealth.driver._control",
    "ControlServer": "drahealth.driver._control",
    "CONTROL_ACTIONS": "drahealth.driver._control_client",
    "CONTROL_SOCKET_NAME": "drahealth.driver._control_client",
    "INJECT_SOURCE": "drahealth.driver._control",
    "ControlError": "drahealth.driver._control_client",
    "control_request": "drahealth.driver._control_client",
    "control_request_sync": "drahealth.driver._control_client",
    "control_socket_path": "drahealth.driver._control_client",
    "DriverMetrics": "drahealth.driver._metrics",
    "PluginHandle": "drahealth.driver._plugin",
    "install_signal_handlers": "drahealth.driver._plugin",
    "start": "drahealth.driver._plugin",
    "PREPARE_FAULT_SOURCE": "drahealth.driver._services",
    "TAINT_STORE_NAME": "drahealth.driver._services",
    "ResourceSlicePublisher": "drahealth.driver._publisher",
    "WITHDRAW_MODES": "drahealth.driver._publisher",
    "WithdrawMode": "drahealth.driver._publisher",
    "DriverResources": "drahealth.driver._slices",
    "Pool": "drahealth.driver._slices",
    "SliceValidationError": "drahealth.driver._slices",
    "split_pool": "drahealth.driver._slices",
    "TaintController": "drahealth.driver._taints",
    "TaintPolicy": "drahealth.driver._taints",
    "TaintStore": "drahealth.driver._taints",
    "DEFAULT_CDI_DIR": "drahealth.driver._types",
    "AllocationResult": "drahealth.driver._types",
    "CheckpointError": "drahealth.driver._types",
    "ClaimError": "drahealth.driver._types",
    "ClaimRef": "drahealth.driver._types",
    "Driver": "drahealth.driver._types",
    "ErrorKind": "drahealth.driver._types",
    "OpaqueConfig": "drahealth.driver._types",
    "PluginOptions": "drahealth.driver._types",
    "PreparedClaimRequest": "drahealth.driver._types",
    "PreparedDevice": "drahealth.driver._types",
    "PrepareResult": "drahealth.driver._types",
    "RegistrationStatus": "drahealth.driver._types",
    "validate_driver_name": "drahealth.driver._types",
}

__all__ = [
    "CONTROL_ACTIONS",
    "CONTROL_SOCKET_NAME",
    "DEFAULT_CDI_DIR",
    "INJECT_SOURCE",
    "OPERATOR_SOURCE",
    "PREPARE_FAULT_SOURCE",
    "TAINT_STORE_NAME",
    "WITHDRAW_MODES",
    "AllocationResult",
    "CheckpointError",
    "ClaimError",
    "ClaimRef",
    "ClaimStatusOptions",
    "ClaimStatusWriter",
    "ControlAction",
    "ControlError",
    "ControlServer",
    "DeviceReport",
    "DeviceState",
    "Driver",
    "DriverMetrics",
    "DriverResources",
    "ErrorKind",
    "HealthHub",
    "OpaqueConfig",
    "PluginHandle",
    "PluginOptions",
    "Pool",
    "PrepareResult",
    "PreparedClaimRequest",
    "PreparedDevice",
    "RecoveryPolicy",
    "RegistrationStatus",
    "ResourceSlicePublisher",
    "SliceValidationError",
    "TaintController",
    "TaintPolicy",
    "TaintStore",
    "WithdrawMode",
    "control_request",
    "control_request_sync",
    "control_socket_path",
    "install_signal_handlers",
    "split_pool",
    "start",
    "validate_driver_name",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
