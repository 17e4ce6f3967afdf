"""Socket file names of a DRA kubelet plugin, byte-identical to the Go helper.

Owns the naming rules only (pure functions of strings); creating, binding and
removing sockets belongs to the driver toolkit.
"""

from __future__ import annotations

import base64
import hashlib
import posixpath

from drahealth.api._names import (
    DRA_SOCKET_NAME,
    KUBELET_PLUGINS_DIR,
    KUBELET_REGISTRY_DIR,
    UNIX_PATH_MAX,
)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _fits(registry_dir: str, name: str) -> bool:
    return len(posixpath.join(posixpath.normpath(registry_dir), name)) <= UNIX_PATH_MAX


def registrar_socket_name(driver_name: str) -> str:
    """Registration socket file name without rolling updates: ``<driver>-reg.sock``."""
    return f"{driver_name}-reg.sock"


def rolling_update_registrar_socket_name(registry_dir: str, driver_name: str, pod_uid: str) -> str:
    """Registration socket file name of one instance during rolling updates.

    Picks the first name whose full path fits in 108 bytes:
    ``<driver>-<podUID>-reg.sock``, then ``<driver>-<h8>-reg.sock`` with *h8* the
    unpadded base64url of the first 8 bytes of sha256(podUID), then
    ``dra-<h16>-reg.sock`` with *h16* the first 16 bytes of
    sha256(driver NUL podUID). The last one is returned even when it does not fit.
    """
    full = f"{driver_name}-{pod_uid}-reg.sock"
    if _fits(registry_dir, full):
        return full
    uid_hash = _b64url(hashlib.sha256(pod_uid.encode()).digest()[:8])
    short = f"{driver_name}-{uid_hash}-reg.sock"
    if _fits(registry_dir, short):
        return short
    both = hashlib.sha256(driver_name.encode() + b"\x00" + pod_uid.encode()).digest()[:16]
    return f"dra-{_b64url(both)}-reg.sock"


def dra_socket_name(pod_uid: str | None = None) -> str:
    """DRA socket file name: ``dra.sock``, or ``dra-<podUID>.sock`` in rolling-update mode."""
    return f"dra-{pod_uid}.sock" if pod_uid else DRA_SOCKET_NAME


def plugin_data_dir(driver_name: str, plugins_dir: str = KUBELET_PLUGINS_DIR) -> str:
    """The driver's data directory, ``/var/lib/kubelet/plugins/<driver>`` by default."""
    return posixpath.join(plugins_dir, driver_name)


def dra_socket_path(
    driver_name: str, plugins_dir: str = KUBELET_PLUGINS_DIR, pod_uid: str | None = None
) -> str:
    """Absolute DRA socket path, ``/var/lib/kubelet/plugins/<driver>/dra.sock`` by default."""
    return posixpath.join(plugin_data_dir(driver_name, plugins_dir), dra_socket_name(pod_uid))


def registrar_socket_path(
    driver_name: str, registry_dir: str = KUBELET_REGISTRY_DIR, pod_uid: str | None = None
) -> str:
    """Absolute registration socket path, rolling-update aware."""
    if pod_uid:
        name = rolling_update_registrar_socket_name(registry_dir, driver_name, pod_uid)
    else:
        name = registrar_socket_name(driver_name)
    return posixpath.join(posixpath.normpath(registry_dir), name)
