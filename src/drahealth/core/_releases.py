"""What each Kubernetes release (1.34 to 1.38) serves and does for DRA device health.

Owns the facts drahealth adapts to: the feature gates that matter (their stage and
default per release, which ones are locked), which ``resource.k8s.io`` versions serve
which kind, the version a client should use when the server serves several, the
remediation mode that follows from what is served, and what the kubelet of a release
does with device health. Sans-I/O: the embedded API server builds its version
profiles from it, and the components map what a real server's discovery says onto it.

Sources (upstream, checked 2026-11): the versioned feature-gate table of
kubernetes/kubernetes (``pkg/features``) for ``DRADeviceTaints``,
``DRADeviceTaintRules``, ``ResourceHealthStatus``, ``DRAResourceClaimDeviceStatus``; the
``resource.k8s.io`` API types for which version carries ``DeviceTaintRule``; KEP-4680
and KEP-5055. See docs/operations.md, "Kubernetes versions".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DRA_KINDS",
    "FEATURE_GATES",
    "KUBE_VERSIONS",
    "NEWEST_KUBE_VERSION",
    "REMEDIATION_MODES",
    "FeatureGateError",
    "GateStage",
    "KubeProfile",
    "RemediationMode",
    "choose_remediation_mode",
    "choose_version",
    "kube_profile",
    "parse_feature_gates",
    "parse_kube_version",
    "release_of",
    "unserved_reason",
]

#: The releases drahealth supports, oldest first.
KUBE_VERSIONS: tuple[str, ...] = ("1.34", "1.35", "1.36", "1.37", "1.38")
NEWEST_KUBE_VERSION = KUBE_VERSIONS[-1]

GROUP = "resource.k8s.io"

#: Kinds of ``resource.k8s.io`` drahealth reads or writes.
DRA_KINDS: tuple[str, ...] = (
    "DeviceClass",
    "ResourceClaim",
    "ResourceClaimTemplate",
    "ResourceSlice",
    "DeviceTaintRule",
)

#: Client preference when a kind is served at several versions: newest stable first.
VERSION_PREFERENCE: tuple[str, ...] = ("v1", "v1beta2", "v1beta1", "v1alpha3")


@dataclass(frozen=True, slots=True)
class GateStage:
    """A gate's state from ``since`` on (until a later stage replaces it)."""

    since: str
    stage: Literal["Alpha", "Beta", "GA"]
    default: bool
    locked: bool = False


#: The gates that change what drahealth sees, per release (upstream's versioned table).
FEATURE_GATES: dict[str, tuple[GateStage, ...]] = {
    # ResourceSlice device taints, the scheduler honouring them, and the eviction
    # controller; in 1.33/1.34 it also covered DeviceTaintRule (no separate gate yet).
    "DRADeviceTaints": (
        GateStage("1.33", "Alpha", False),
        GateStage("1.36", "Beta", True),
        GateStage("1.37", "GA", True),
        GateStage("1.38", "GA", True, locked=True),
    ),
    # The DeviceTaintRule API (its own gate from 1.35 on).
    "DRADeviceTaintRules": (
        GateStage("1.35", "Alpha", False),
        GateStage("1.36", "Beta", False),  # the v1beta2 API it needs is off by default
        GateStage("1.37", "GA", True),
        GateStage("1.38", "GA", True, locked=True),
    ),
    # Partitionable devices: ResourceSlice sharedCounters, devices[].consumesCounters and
    # per-device node selection (dropped on write while off).
    "DRAPartitionableDevices": (
        GateStage("1.33", "Alpha", False),
        GateStage("1.36", "Beta", True),
    ),
    # Devices shared by several claims (allowMultipleAllocations), capacity requests,
    # and the distinctAttribute constraint.
    "DRAConsumableCapacity": (
        GateStage("1.34", "Alpha", False),
        GateStage("1.36", "Beta", True),
    ),
    # Devices with bindingConditions: allocation records them, binding waits for them.
    "DRADeviceBindingConditions": (
        GateStage("1.34", "Alpha", False),
        GateStage("1.36", "Beta", True),
    ),
    # Extended resources (``example.com/gpu: 1``) backed by DRA DeviceClasses.
    "DRAExtendedResource": (
        GateStage("1.34", "Alpha", False),
        GateStage("1.36", "Beta", True),
        GateStage("1.37", "GA", True, locked=True),
    ),
    # ResourceClaim status.devices (driver-written conditions, data, networkData; KEP-4817).
    "DRAResourceClaimDeviceStatus": (
        GateStage("1.32", "Alpha", False),
        GateStage("1.33", "Beta", True),
        GateStage("1.37", "GA", True, locked=True),
    ),
    # The kubelet writes pod.status.containerStatuses[].allocatedResourcesStatus.
    "ResourceHealthStatus": (
        GateStage("1.31", "Alpha", False),
        GateStage("1.36", "Beta", True),
    ),
    # ... with the health ``message`` of the dra-health stream.
    "ResourceHealthStatusMessage": (GateStage("1.36", "Beta", True),),
}


#: Gates that need others on (upstream's gate dependency table, 1.35 on): a component
#: refuses to start with a dependent gate on and its dependency off.
GATE_DEPENDENCIES: dict[str, tuple[str, ...]] = {
    "DRADeviceTaintRules": ("DRADeviceTaints",),
}


class FeatureGateError(ValueError):
    """A ``--kube-version`` or ``--feature-gates`` value the release would refuse."""


def _tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def parse_kube_version(text: str) -> str:
    """``1.36``, ``v1.36`` or ``1.36.2`` -> ``1.36``; anything unsupported is an error."""
    value = text.strip().removeprefix("v")
    parts = value.split(".")
    if len(parts) in (2, 3) and all(p.isdigit() and len(p) <= 4 for p in parts):
        short = f"{int(parts[0])}.{int(parts[1])}"
        if short in KUBE_VERSIONS:
            return short
    raise FeatureGateError(
        f"unsupported Kubernetes version {text!r}: choose one of {', '.join(KUBE_VERSIONS)}"
    )


def _stage(gate: str, version: str) -> GateStage | None:
    current = None
    for stage in FEATURE_GATES[gate]:
        if _tuple(stage.since) <= _tuple(version):
            current = stage
    return current


def parse_feature_gates(text: str) -> dict[str, bool]:
    """``A=true,B=false`` -> ``{"A": True, "B": False}`` (empty text: no overrides).

    The syntax is the components' ``--feature-gates`` flag; messages follow upstream's
    wording so an operator recognises them.
    """
    out: dict[str, bool] = {}
    if len(text) > 4096:
        raise FeatureGateError("--feature-gates is longer than 4096 characters")
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise FeatureGateError(f"missing bool value for {item!r}: use NAME=true|false")
        lowered = value.strip().lower()
        if lowered not in ("true", "false"):
            raise FeatureGateError(f"invalid value of {name}={value.strip()}, err: not a bool")
        out[name] = lowered == "true"
    return out


@dataclass(frozen=True)
class KubeProfile:
    """One release with its effective feature gates: what it serves and does."""

    version: str
    gates: Mapping[str, bool] = field(default_factory=dict)

    def enabled(self, gate: str) -> bool:
        return bool(self.gates.get(gate, False))

    @property
    def minor(self) -> int:
        return _tuple(self.version)[1]

    # -- the API server ---------------------------------------------------------------

    def served_versions(self, kind: str) -> tuple[str, ...]:
        """The ``resource.k8s.io`` versions serving ``kind``, preferred first.

        Only what a cluster serves with the release's defaults plus the gates turned on:
        turning a gate on is taken to include the ``--runtime-config`` its API version
        needs, as an administrator enabling the feature would set both. The beta
        versions of the core DRA kinds (off by default since 1.34) are not modelled.
        """
        if kind != "DeviceTaintRule":
            return ("v1",) if kind in DRA_KINDS else ()
        if self.minor <= 34:
            return ("v1alpha3",) if self.enabled("DRADeviceTaints") else ()
        if not self.enabled("DRADeviceTaintRules"):
            return ()
        if self.minor == 35:
            return ("v1alpha3",)
        if self.minor == 36:
            return ("v1beta2",)
        return ("v1",)

    @property
    def slice_taints(self) -> bool:
        """ResourceSlice ``devices[].taints`` are stored and honoured (else dropped)."""
        return self.enabled("DRADeviceTaints")

    @property
    def taint_effect_none(self) -> bool:
        """Effect ``None`` (informational, dry run) exists from 1.35 on."""
        return self.minor >= 35

    @property
    def rule_status(self) -> bool:
        """DeviceTaintRule has ``status`` (the ``EvictionInProgress`` condition)."""
        return self.minor >= 35

    @property
    def rule_cel_selectors(self) -> bool:
        """The 1.34 alpha selector still has ``deviceClassName`` and CEL ``selectors``."""
        return self.minor <= 34

    @property
    def claim_device_status(self) -> bool:
        """ResourceClaim ``status.devices`` is stored (else dropped, as upstream)."""
        return self.enabled("DRAResourceClaimDeviceStatus")

    @property
    def taint_eviction(self) -> bool:
        """kube-controller-manager evicts pods from NoExecute-tainted devices."""
        return self.enabled("DRADeviceTaints")

    # -- the kubelet ------------------------------------------------------------------

    @property
    def kubelet_pod_health(self) -> bool:
        """The kubelet writes device health into the pod status."""
        return self.enabled("ResourceHealthStatus")

    @property
    def kubelet_health_message(self) -> bool:
        return self.enabled("ResourceHealthStatus") and self.enabled("ResourceHealthStatusMessage")

    @property
    def dra_health_services(self) -> tuple[str, ...]:
        """The dra-health services the kubelet calls, preferred first."""
        return ("v1", "v1alpha1") if self.minor >= 37 else ("v1alpha1",)

    def describe(self) -> str:
        on = sorted(g for g in FEATURE_GATES if self.enabled(g))
        rules = self.served_versions("DeviceTaintRule")
        return (
            f"Kubernetes {self.version}: DeviceTaintRule "
            + (f"{GROUP}/{rules[0]}" if rules else "not served")
            + f"; gates on: {', '.join(on) if on else 'none'}"
        )


def kube_profile(version: str, overrides: Mapping[str, bool] | None = None) -> KubeProfile:
    """The release's defaults with ``overrides`` applied, refused as upstream refuses them.

    Unknown gates (drahealth models only the ones above) and gates not yet present in
    the release are refused by name; a locked gate cannot be set against its lock.
    """
    version = parse_kube_version(version)
    gates: dict[str, bool] = {}
    for name in FEATURE_GATES:
        stage = _stage(name, version)
        if stage is not None:
            gates[name] = stage.default
    for name, value in (overrides or {}).items():
        if name not in FEATURE_GATES:
            known = ", ".join(sorted(FEATURE_GATES))
            raise FeatureGateError(f"unrecognized feature gate: {name} (modelled: {known})")
        stage = _stage(name, version)
        if stage is None:
            raise FeatureGateError(
                f"unrecognized feature gate: {name} (not in Kubernetes {version})"
            )
        if stage.locked and value != stage.default:
            raise FeatureGateError(
                f"cannot set feature gate {name} to {str(value).lower()}, "
                f"feature is locked to {str(stage.default).lower()}"
            )
        gates[name] = value
    for name, needs in GATE_DEPENDENCIES.items():
        off = [n for n in needs if not gates.get(n, False)]
        if gates.get(name, False) and off:
            raise FeatureGateError(
                f"{name} is enabled, but depends on features that are disabled: [{', '.join(off)}]"
            )
    return KubeProfile(version, gates)


def choose_version(served: Iterable[str]) -> str | None:
    """The version a client uses among those served: newest stable first, else None."""
    have = set(served)
    return next((v for v in VERSION_PREFERENCE if v in have), None)


# -- remediation modes ----------------------------------------------------------------

RemediationMode = Literal[
    "auto", "taint-rules", "quarantine", "node-taint", "cordon", "evict-only", "report-only"
]
REMEDIATION_MODES: tuple[str, ...] = (
    "auto",
    "taint-rules",
    "quarantine",
    "node-taint",
    "cordon",
    "evict-only",
    "report-only",
)


def choose_remediation_mode(
    requested: str,
    rules_version: str | None,
    *,
    fallback: str = "quarantine",
    claims_v1: bool = True,
) -> tuple[str, str]:
    """(mode, why) for the controller: ``auto`` uses DeviceTaintRules where served.

    ``requested`` is the operator's choice; ``taint-rules`` without the API is an error
    (never a silent no-op); ``auto`` without it falls back to ``fallback``. Mode
    ``quarantine`` writes ``resource.k8s.io/v1`` ResourceClaims (``claims_v1``: the server
    serves them, as every release from 1.34 does): where they are not served, ``auto``
    falls back to ``node-taint`` and asking for ``quarantine`` is an error.
    """
    if requested not in REMEDIATION_MODES:
        raise ValueError(
            f"unknown remediation mode {requested!r}: choose one of {', '.join(REMEDIATION_MODES)}"
        )
    if fallback not in REMEDIATION_MODES or fallback in ("auto", "taint-rules"):
        raise ValueError(f"fallback mode {fallback!r} must be one without DeviceTaintRules")
    served = f"{GROUP}/{rules_version} DeviceTaintRules" if rules_version else ""
    no_claims = f"the server serves no {GROUP}/v1 ResourceClaims"
    if requested == "auto":
        if rules_version:
            return "taint-rules", f"auto: the server serves {served}"
        if fallback == "quarantine" and not claims_v1:
            return "node-taint", f"auto: no DeviceTaintRule API and {no_claims}, so node-taint"
        return fallback, f"auto: the server serves no DeviceTaintRule API, so {fallback}"
    if requested == "taint-rules" and not rules_version:
        raise ValueError(
            "remediation mode taint-rules needs the DeviceTaintRule API, which this server "
            "does not serve (resource.k8s.io v1, v1beta2 or v1alpha3); enable it "
            "(DRADeviceTaintRules) or choose quarantine, node-taint, cordon, evict-only or "
            "report-only"
        )
    if requested == "quarantine" and not claims_v1:
        raise ValueError(
            f"remediation mode quarantine writes ResourceClaims, but {no_claims} "
            "(Kubernetes 1.34 on does); choose node-taint, cordon, evict-only or report-only"
        )
    return requested, f"chosen: {requested}" + (f" ({served} served)" if served else "")


def release_of(server_version: str) -> str | None:
    """``v1.36.2-gke.100`` or ``v1.35.0+k3s1`` -> ``1.36``/``1.35``; None if not a version.

    The minor release of a server's ``gitVersion`` (vendors add suffixes), supported or not.
    """
    match = re.match(r"v?(\d{1,4})\.(\d{1,4})(?:\.\d{1,6})?(?:[-+].*)?$", server_version.strip())
    return f"{int(match[1])}.{int(match[2])}" if match else None


def unserved_reason(kind: str, server_version: str) -> str:
    """Why a server whose ``gitVersion`` is ``server_version`` serves no ``kind``, and the fix.

    One clause for messages such as "DeviceTaintRules: not served by this server (<this>)":
    the release and the gate (or API version) it is served without, then what an
    administrator enables to get it (``--feature-gates`` and ``--runtime-config`` of the
    kube-apiserver, as upstream names them). An unknown or unsupported release is named as
    the server gave it.
    """
    release = release_of(server_version)
    if release not in KUBE_VERSIONS:
        shown = server_version[:64] or "of unknown version"
        return f"Kubernetes {shown}, outside {KUBE_VERSIONS[0]}-{KUBE_VERSIONS[-1]}"
    minor = _tuple(release)[1]
    if kind != "DeviceTaintRule":
        return (
            f"Kubernetes {release} with {GROUP}/v1 turned off; "
            f"enable it with --runtime-config={GROUP}/v1=true"
        )
    if minor <= 34:
        return (
            f"Kubernetes {release} without DRADeviceTaints; enable it with "
            f"--feature-gates=DRADeviceTaints=true --runtime-config={GROUP}/v1alpha3=true"
        )
    if minor == 35:
        return (
            f"Kubernetes {release} without DRADeviceTaintRules; enable it with "
            f"--feature-gates=DRADeviceTaints=true,DRADeviceTaintRules=true "
            f"--runtime-config={GROUP}/v1alpha3=true"
        )
    if minor == 36:
        return (
            f"Kubernetes {release} without DRADeviceTaintRules; enable it with "
            f"--feature-gates=DRADeviceTaintRules=true --runtime-config={GROUP}/v1beta2=true"
        )
    return (
        f"Kubernetes {release} with DeviceTaintRule turned off; remove "
        f"DRADeviceTaintRules=false from --feature-gates and "
        f"{GROUP}/v1/devicetaintrules=false from --runtime-config"
    )
