"""Toolkit for DRA driver authors: the Python counterpart of the Go kubeletplugin helper.

One entry point, :func:`start`, serves the registration and DRA sockets for a driver
that implements the narrow :class:`Driver` protocol (``prepare`` / ``unprepare``);
:class:`HealthHub` aggregates device health from sources and serves it over
dra-health v1 and v1alpha1; :class:`ResourceSlicePublisher` publishes the driver's
devices, split at the API limits; :class:`TaintController` turns latched faults into
device taints. See docs/driver.md.
"""

from drahealth.driver._hub import (
    OPERATOR_SOURCE,
    DeviceReport,
    DeviceState,
    HealthHub,
    RecoveryPolicy,
)
from drahealth.driver._plugin import PluginHandle, install_signal_handlers, start
from drahealth.driver._publisher import ResourceSlicePublisher
from drahealth.driver._slices import DriverResources, Pool, SliceValidationError
from drahealth.driver._taints import TaintController, TaintPolicy, TaintStore
from drahealth.driver._types import (
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

__all__ = [
    "OPERATOR_SOURCE",
    "AllocationResult",
    "CheckpointError",
    "ClaimError",
    "ClaimRef",
    "DeviceReport",
    "DeviceState",
    "Driver",
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
    "install_signal_handlers",
    "start",
    "validate_driver_name",
]
