"""Toolkit for DRA driver authors: the Python counterpart of the Go kubeletplugin helper.

One entry point, :func:`start`, serves the registration and DRA sockets for a driver
that implements the narrow :class:`Driver` protocol (``prepare`` / ``unprepare``);
:class:`HealthHub` aggregates device health from sources and serves it over
dra-health v1 and v1alpha1; :class:`ResourceSlicePublisher` publishes the driver's
devices, split at the API limits; :class:`TaintController` turns latched faults into
device taints; :class:`ClaimStatusWriter` (opt-in) writes each prepared device's health
into its ResourceClaim's ``status.devices``. See docs/driver.md.

Names are imported on first use (PEP 562), so importing one submodule does not load
gRPC and the Kubernetes client. The simulated driver built on this toolkit is a
separate program, ``drahealth.simdriver``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drahealth._lazy import lazy_exports

if TYPE_CHECKING:
    from drahealth.driver._claim_status import ClaimStatusOptions, ClaimStatusWriter
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
    "DriverMetrics": "drahealth.driver._metrics",
    "PluginHandle": "drahealth.driver._plugin",
    "install_signal_handlers": "drahealth.driver._plugin",
    "start": "drahealth.driver._plugin",
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
    "DEFAULT_CDI_DIR",
    "OPERATOR_SOURCE",
    "WITHDRAW_MODES",
    "AllocationResult",
    "CheckpointError",
    "ClaimError",
    "ClaimRef",
    "ClaimStatusOptions",
    "ClaimStatusWriter",
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
    "install_signal_handlers",
    "split_pool",
    "start",
    "validate_driver_name",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
