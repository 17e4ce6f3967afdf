"""Which ``resource.k8s.io`` versions the API server serves, and the client types for them.

Owns :class:`ServedAPIs` (kind -> versions served, the version drahealth uses for each,
the server's ``gitVersion``), :func:`discover` / :func:`discover_sync` (API discovery
through an existing lightkube client: ``GET /version``, ``GET /apis/resource.k8s.io``
and one ``GET /apis/resource.k8s.io/<version>`` per served version), the lightkube
resource class of a kind at a version (:func:`resource_class`) and the conversion of an
object read at any served version into the one internal shape (``resource.k8s.io/v1``
dicts, :func:`to_internal`).

The choice itself (newest stable first) is the core's :func:`choose_version`. A
DeviceTaintRule at ``v1alpha3``/``v1beta2`` has the v1 fields (driver/pool/device
selector, one taint, status from 1.35); a 1.34 alpha rule may also carry
``deviceClassName`` and CEL ``selectors``, which are kept so callers can see them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightkube import AsyncClient, Client

from drahealth.core import DRA_KINDS, choose_version

__all__ = [
    "DRA_GROUP",
    "DiscoveryError",
    "ServedAPIs",
    "discover",
    "discover_sync",
    "parse_discovery",
    "resource_class",
    "to_internal",
]

DRA_GROUP = "resource.k8s.io"
#: A discovery document larger than this is refused (a real one is a few KB).
MAX_DISCOVERY_BYTES = 4 * 1024 * 1024
_MODULES = {
    "v1": "lightkube.resources.resource_v1",
    "v1beta2": "lightkube.resources.resource_v1beta2",
    "v1beta1": "lightkube.resources.resource_v1beta1",
    "v1alpha3": "lightkube.resources.resource_v1alpha3",
}


class DiscoveryError(RuntimeError):
    """The server could not be asked, or answered something that is not discovery."""


@dataclass(frozen=True)
class ServedAPIs:
    """What one API server serves of ``resource.k8s.io``, and what drahealth uses."""

    #: kind -> versions serving it (any order as the server listed them)
    versions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: the server's ``gitVersion`` (``v1.36.2``), empty if ``/version`` did not say
    server_version: str = ""

    def chosen(self, kind: str) -> str | None:
        """The version drahealth uses for ``kind`` (None: not served)."""
        return choose_version(self.versions.get(kind, ()))

    def served(self, kind: str) -> bool:
        return self.chosen(kind) is not None

    def resource(self, kind: str) -> Any:
        """The lightkube resource class for ``kind`` at the chosen version, or None."""
        version = self.chosen(kind)
        return None if version is None else resource_class(kind, version)

    def api_version(self, kind: str) -> str | None:
        version = self.chosen(kind)
        return None if version is None else f"{DRA_GROUP}/{version}"

    def summary(self) -> dict[str, str]:
        """kind -> ``resource.k8s.io/<version>`` or ``not served``, for every DRA kind."""
        return {k: self.api_version(k) or "not served" for k in DRA_KINDS}

    @classmethod
    def all_v1(cls) -> ServedAPIs:
        """What a 1.37+ server serves: every kind at v1 (for tests and fallbacks)."""
        return cls({k: ("v1",) for k in DRA_KINDS})


def resource_class(kind: str, version: str) -> Any:
    """The lightkube class of ``resource.k8s.io/<version>`` ``kind``; KeyError if none."""
    if kind not in DRA_KINDS or version not in _MODULES:
        raise KeyError(f"no client type for {DRA_GROUP}/{version} {kind}")
    module = importlib.import_module(_MODULES[version])
    try:
        return getattr(module, kind)
    except AttributeError:
        raise KeyError(f"no client type for {DRA_GROUP}/{version} {kind}") from None


def to_internal(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object of any served ``resource.k8s.io`` version as the internal (v1) dict.

    DeviceTaintRule versions share their fields, so only ``apiVersion`` changes; other
    groups pass through unchanged.
    """
    out = dict(obj)
    api_version = str(out.get("apiVersion") or "")
    if api_version.startswith(DRA_GROUP + "/"):
        out["apiVersion"] = f"{DRA_GROUP}/v1"
    return out


def parse_discovery(
    group: Any, per_version: Mapping[str, Any], server_version: Any = None
) -> ServedAPIs:
    """Build :class:`ServedAPIs` from the decoded discovery documents.

    ``group`` is ``GET /apis/resource.k8s.io`` (an ``APIGroup``; None when the group
    is not served at all), ``per_version`` maps each version to its ``APIResourceList``.
    Subresources (``devicetaintrules/status``) are skipped; unknown kinds ignored.
    """
    versions: dict[str, list[str]] = {}
    if group is not None:
        if not isinstance(group, Mapping) or not isinstance(group.get("versions"), list):
            raise DiscoveryError(f"GET /apis/{DRA_GROUP} did not return an APIGroup")
        for entry in group["versions"]:
            version = entry.get("version") if isinstance(entry, Mapping) else None
            doc = per_version.get(str(version))
            if not isinstance(doc, Mapping):
                continue
            for res in doc.get("resources") or []:
                if not isinstance(res, Mapping) or "/" in str(res.get("name", "")):
                    continue
                kind = res.get("kind")
                if kind in DRA_KINDS and version not in versions.setdefault(kind, []):
                    versions[kind].append(str(version))
    git = ""
    if isinstance(server_version, Mapping):
        git = str(server_version.get("gitVersion") or "")[:64]
    return ServedAPIs({k: tuple(v) for k, v in versions.items()}, git)


def _group_versions(group: Any) -> list[str]:
    if not isinstance(group, Mapping) or not isinstance(group.get("versions"), list):
        return []
    return [
        str(v["version"])
        for v in group["versions"]
        if isinstance(v, Mapping) and isinstance(v.get("version"), str)
    ][:16]


def _decode(resp: Any, path: str) -> Any:
    if resp.status_code == 404:
        return None
    if resp.status_code != 200:
        raise DiscoveryError(f"GET {path}: HTTP {resp.status_code}")
    if len(resp.content) > MAX_DISCOVERY_BYTES:
        raise DiscoveryError(f"GET {path}: answer larger than {MAX_DISCOVERY_BYTES} bytes")
    try:
        return resp.json()
    except ValueError as exc:
        raise DiscoveryError(f"GET {path}: not JSON ({exc})") from None


async def discover(client: AsyncClient) -> ServedAPIs:
    """Ask the server behind ``client`` what it serves (three to five small GETs)."""
    http = client._client._client  # lightkube's configured HTTP client (auth, base URL)
    try:
        version = _decode(await http.get("/version"), "/version")
        group = _decode(await http.get(f"/apis/{DRA_GROUP}"), f"/apis/{DRA_GROUP}")
        docs = {}
        for v in _group_versions(group):
            path = f"/apis/{DRA_GROUP}/{v}"
            docs[v] = _decode(await http.get(path), path)
    except DiscoveryError:
        raise
    except Exception as exc:  # transport errors of the HTTP library
        raise DiscoveryError(f"API discovery failed: {exc}") from exc
    return parse_discovery(group, docs, version)


def discover_sync(client: Client) -> ServedAPIs:
    """:func:`discover` for the synchronous (CLI) client."""
    http = client._client._client
    try:
        version = _decode(http.get("/version"), "/version")
        group = _decode(http.get(f"/apis/{DRA_GROUP}"), f"/apis/{DRA_GROUP}")
        docs = {}
        for v in _group_versions(group):
            path = f"/apis/{DRA_GROUP}/{v}"
            docs[v] = _decode(http.get(path), path)
    except DiscoveryError:
        raise
    except Exception as exc:
        raise DiscoveryError(f"API discovery failed: {exc}") from exc
    return parse_discovery(group, docs, version)
