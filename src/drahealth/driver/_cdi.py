"""Transient CDI spec files, one per prepared claim.

Owns the naming and content of the CDI specs the plugin writes for prepared claims,
and their atomic write, removal and regeneration. Knows nothing of gRPC or the API.

Naming (as the Go ``cdi.GenerateTransientSpecName`` spells it):

- vendor ``k8s.<driver>``, class ``<cdi_class>`` (default ``claim``), so the kind is
  ``k8s.<driver>/<class>``;
- file ``<cdi_dir>/k8s.<driver>-<class>_<claimUID>.json``;
- device ``<claimUID>-<device>`` or ``<claimUID>-<device>-<shareID>`` for a share,
  so names are never reused (runtimes cache specs) and shares of one device differ;
- fully qualified id ``k8s.<driver>/<class>=<device name>``.

Each device carries environment variables only (``DRA_DEVICE_<DEV>=<device>``, plus
``..._POOL``, ``..._REQUESTS`` (main request names, comma-separated) and
``..._SHARE_ID``; ``DRA_ADMIN_ACCESS=true`` for admin-access results), where
``<DEV>`` is the device name (and share id) upper-cased with every other character
turned into ``_``. ``cdiVersion`` is the minimum the content needs: ``0.5.0`` when a
device name starts with a digit (claim UIDs often do), else ``0.3.0``.

Specs live on tmpfs (``/var/run/cdi``) on most nodes and vanish at reboot while the
kubelet still thinks the claims are prepared (k/k #141433); :meth:`CDISpecs.regenerate`
rewrites them from the checkpoint at start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from drahealth.driver._checkpoint import CheckpointDevice, ClaimEntry, ClaimState, atomic_write
from drahealth.driver._types import DEFAULT_CDI_CLASS, base_request

__all__ = ["CDISpecs"]

log = logging.getLogger("drahealth.driver.cdi")

_ENV_UNSAFE = re.compile(r"[^A-Za-z0-9]")


class CDISpecs:
    """Writes and removes the transient CDI specs of one driver in ``cdi_dir``."""

    def __init__(self, cdi_dir: str, driver_name: str, cdi_class: str = DEFAULT_CDI_CLASS) -> None:
        self.cdi_dir = cdi_dir
        self.vendor = f"k8s.{driver_name}"
        self.cdi_class = cdi_class

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.cdi_class}"

    def spec_path(self, claim_uid: str) -> str:
        return os.path.join(self.cdi_dir, f"{self.vendor}-{self.cdi_class}_{claim_uid}.json")

    @staticmethod
    def device_name(claim_uid: str, device: str, share_id: str | None = None) -> str:
        name = f"{claim_uid}-{device}"
        return f"{name}-{share_id}" if share_id else name

    def device_id(self, claim_uid: str, device: str, share_id: str | None = None) -> str:
        """Fully qualified CDI id, ``k8s.<driver>/<class>=<claimUID>-<device>[-<shareID>]``."""
        return f"{self.kind}={self.device_name(claim_uid, device, share_id)}"

    def build_spec(self, claim_uid: str, devices: Sequence[CheckpointDevice]) -> dict[str, Any]:
        """The spec document for ``devices`` of one claim (duplicates collapsed)."""
        entries: dict[str, dict[str, Any]] = {}
        for dev in devices:
            name = self.device_name(claim_uid, dev.device, dev.share_id)
            if name not in entries:
                entries[name] = {"name": name, "containerEdits": {"env": _env(dev)}}
        first_digit = any(n[:1].isdigit() for n in entries)
        return {
            "cdiVersion": "0.5.0" if first_digit else "0.3.0",
            "kind": self.kind,
            "devices": list(entries.values()),
        }

    def write(self, claim_uid: str, devices: Sequence[CheckpointDevice]) -> list[str]:
        """Write (or replace) the claim's spec atomically; returns the CDI id per device.

        A claim without devices gets no spec (an old one is removed): CDI rejects
        specs without devices.
        """
        if not devices:
            self.remove(claim_uid)
            return []
        os.makedirs(self.cdi_dir, exist_ok=True)
        spec = self.build_spec(claim_uid, devices)
        data = json.dumps(spec, indent=2, sort_keys=True).encode() + b"\n"
        atomic_write(self.spec_path(claim_uid), data, mode=0o644)
        return [self.device_id(claim_uid, d.device, d.share_id) for d in devices]

    def _temp_path(self, claim_uid: str) -> str:
        """Where :func:`atomic_write` stages the spec (left behind by a crash mid-write)."""
        path = self.spec_path(claim_uid)
        return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")

    def remove(self, claim_uid: str) -> None:
        """Delete the claim's spec and a temporary file a crash mid-write left; a missing
        file is fine."""
        for path in (self.spec_path(claim_uid), self._temp_path(claim_uid)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def exists(self, claim_uid: str) -> bool:
        return os.path.exists(self.spec_path(claim_uid))

    def regenerate(self, claims: Mapping[str, ClaimEntry]) -> int:
        """Rewrite the spec of every completed claim of a loaded checkpoint whose file is
        missing; returns how many were written. Errors are logged, not raised."""
        written = 0
        for uid in claims:  # a crash mid-write leaves the staging file: never reused
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._temp_path(uid))
        for uid, entry in sorted(claims.items()):
            if entry.state is not ClaimState.PREPARE_COMPLETED or not entry.devices:
                continue
            if self.exists(uid):
                continue
            try:
                self.write(uid, entry.devices)
            except OSError as exc:
                log.error("regenerating CDI spec %s failed: %s", self.spec_path(uid), exc)
                continue
            written += 1
        if written:
            log.info("regenerated %d CDI spec(s) in %s from the checkpoint", written, self.cdi_dir)
        return written


def _env(dev: CheckpointDevice) -> list[str]:
    key = dev.device if not dev.share_id else f"{dev.device}_{dev.share_id}"
    prefix = "DRA_DEVICE_" + _ENV_UNSAFE.sub("_", key).upper()
    requests = list(dict.fromkeys(base_request(r) for r in dev.requests))
    env = [
        f"{prefix}={dev.device}",
        f"{prefix}_POOL={dev.pool}",
        f"{prefix}_REQUESTS={','.join(requests)}",
    ]
    if dev.share_id:
        env.append(f"{prefix}_SHARE_ID={dev.share_id}")
    if dev.admin_access:
        env.append("DRA_ADMIN_ACCESS=true")
    return env
