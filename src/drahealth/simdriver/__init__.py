"""The simulated DRA driver: a program built on the driver toolkit, not part of it.

Owns the sample driver (simulated GPU and NIC profiles, the host's PCI functions, and
GPUs published as NVIDIA's DRA driver publishes them with a fake kernel log), built on
``drahealth.driver.start`` like any other driver: its slices, taints, metrics and
fault-injection control socket are the toolkit's. ``drahealth driver`` runs it;
``drahealth inject`` talks to its control socket as to any toolkit driver's. The
control socket's names are still exported here under their first names
(``request``, ``ProfileAction``, ...), pointing at the toolkit's.

Names are imported on first use (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drahealth._lazy import lazy_exports

if TYPE_CHECKING:
    from drahealth.simdriver._app import (
        DEFAULT_DRIVER_NAMES,
        NO_KUBECONFIG_MESSAGE,
        PREPARE_FAULT_SOURCE,
        PROFILES,
        SIM_SOURCE,
        TAINT_STORE_NAME,
        SampleDriver,
        SampleDriverApp,
        SampleDriverConfig,
        SimulatedHealthSource,
        build_resources,
        device_uuid,
        sim_gpu_pool,
        sim_nic_pool,
    )
    from drahealth.simdriver._control import (
        ACTIONS,
        CONTROL_SOCKET_NAME,
        INJECT_SOURCE,
        ControlError,
        ControlServer,
        ProfileAction,
        control_socket_path,
        request,
        request_sync,
    )
    from drahealth.simdriver._fake_dcgm import FakeDcgmExporter, FakeDcgmGpu
    from drahealth.simdriver._nvidia import (
        DEFAULT_NVIDIA_RELEASE,
        KERNEL_LOG_NAME,
        NVIDIA_DRIVER_NAME,
        NVIDIA_RELEASES,
        KernelLog,
        SimGpu,
        XidAction,
        kmsg_record,
        nvidia_attributes,
        pci_attribute,
        sim_nvidia_gpus,
        sim_nvidia_pool,
        xid_line,
    )

_APP = "drahealth.simdriver._app"
_CONTROL = "drahealth.simdriver._control"
_NVIDIA = "drahealth.simdriver._nvidia"
_DCGM = "drahealth.simdriver._fake_dcgm"

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "DEFAULT_DRIVER_NAMES": _APP,
    "NO_KUBECONFIG_MESSAGE": _APP,
    "PREPARE_FAULT_SOURCE": _APP,
    "PROFILES": _APP,
    "SIM_SOURCE": _APP,
    "TAINT_STORE_NAME": _APP,
    "SampleDriver": _APP,
    "SampleDriverApp": _APP,
    "SampleDriverConfig": _APP,
    "SimulatedHealthSource": _APP,
    "build_resources": _APP,
    "device_uuid": _APP,
    "sim_gpu_pool": _APP,
    "sim_nic_pool": _APP,
    "INJECT_SOURCE": _CONTROL,
    "ControlServer": _CONTROL,
    "ACTIONS": _CONTROL,
    "CONTROL_SOCKET_NAME": _CONTROL,
    "ControlError": _CONTROL,
    "control_socket_path": _CONTROL,
    "request": _CONTROL,
    "request_sync": _CONTROL,
    "ProfileAction": _CONTROL,
    "DEFAULT_NVIDIA_RELEASE": _NVIDIA,
    "KERNEL_LOG_NAME": _NVIDIA,
    "NVIDIA_DRIVER_NAME": _NVIDIA,
    "NVIDIA_RELEASES": _NVIDIA,
    "KernelLog": _NVIDIA,
    "SimGpu": _NVIDIA,
    "XidAction": _NVIDIA,
    "kmsg_record": _NVIDIA,
    "nvidia_attributes": _NVIDIA,
    "pci_attribute": _NVIDIA,
    "sim_nvidia_gpus": _NVIDIA,
    "sim_nvidia_pool": _NVIDIA,
    "xid_line": _NVIDIA,
    "FakeDcgmExporter": _DCGM,
    "FakeDcgmGpu": _DCGM,
}

__all__ = [
    "ACTIONS",
    "CONTROL_SOCKET_NAME",
    "DEFAULT_DRIVER_NAMES",
    "DEFAULT_NVIDIA_RELEASE",
    "INJECT_SOURCE",
    "KERNEL_LOG_NAME",
    "NO_KUBECONFIG_MESSAGE",
    "NVIDIA_DRIVER_NAME",
    "NVIDIA_RELEASES",
    "PREPARE_FAULT_SOURCE",
    "PROFILES",
    "SIM_SOURCE",
    "TAINT_STORE_NAME",
    "ControlError",
    "ControlServer",
    "FakeDcgmExporter",
    "FakeDcgmGpu",
    "KernelLog",
    "ProfileAction",
    "SampleDriver",
    "SampleDriverApp",
    "SampleDriverConfig",
    "SimGpu",
    "SimulatedHealthSource",
    "XidAction",
    "build_resources",
    "control_socket_path",
    "device_uuid",
    "kmsg_record",
    "nvidia_attributes",
    "pci_attribute",
    "request",
    "request_sync",
    "sim_gpu_pool",
    "sim_nic_pool",
    "sim_nvidia_gpus",
    "sim_nvidia_pool",
    "xid_line",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
