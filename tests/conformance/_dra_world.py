"""A small DRA cluster for the scheduler and resourceclaim conformance tests.

The embedded API server (the ``server`` fixture) with the stand-in controllers running,
plus raw HTTP to it: Nodes, one ResourceSlice of GPUs per node, a DeviceClass ``gpu``.
No kubelet runs: tests move pods to ``Succeeded``/``Failed`` through the API, as a
kubelet would.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drahealth.controlplane import APIServer
from drahealth.kube import make_client
from drahealth.standins import StandIns
from tests._support import eventually

DRIVER = "gpu.example.com"
NS = "/api/v1/namespaces/default"
RES = "/apis/resource.k8s.io/v1"
CLAIMS = f"{RES}/namespaces/default/resourceclaims"
TEMPLATES = f"{RES}/namespaces/default/resourceclaimtemplates"

__all__ = ["CLAIMS", "DRIVER", "NS", "RES", "TEMPLATES", "Http", "World", "eventually", "world"]


class Http:
    """JSON over HTTP to one server; PATCH bodies are merge patches unless told."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = ""
    ) -> tuple[int, Any]:
        headers: dict[str, str] = {}
        kwargs: dict[str, Any] = {"headers": headers}
        if body is not None:
            kwargs["data"] = json.dumps(body)
            headers["Content-Type"] = content_type or (
                "application/merge-patch+json" if method == "PATCH" else "application/json"
            )
        async with self.session.request(method, self.url + path, **kwargs) as resp:
            return resp.status, json.loads(await resp.read())

    async def ok(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        status, out = await self.call(method, path, body, content_type)
        assert status in (200, 201), (method, path, status, out)
        return out

    async def get(self, path: str) -> Any:
        status, out = await self.call("GET", path)
        return out if status == 200 else None


class World:
    """Helpers over :class:`Http` for the objects these tests need."""

    def __init__(self, http: Http, standins: StandIns) -> None:
        self.http, self.standins = http, standins

    async def node(self, name: str, labels: dict[str, str] | None = None, **spec: Any) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels or {"kubernetes.io/hostname": name}},
            "spec": spec,
        }
        await self.http.ok("POST", "/api/v1/nodes", body)

    async def gpus(self, node: str, count: int, **attributes: Any) -> None:
        devices = [
            {"name": f"gpu-{i}", "attributes": {k: {"string": v} for k, v in attributes.items()}}
            for i in range(count)
        ]
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }
        await self.http.ok("POST", f"{RES}/resourceslices", body)

    async def device_class(self, name: str = "gpu", expression: str = "") -> None:
        expr = expression or f'device.driver == "{DRIVER}"'
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expr}}]},
        }
        await self.http.ok("POST", f"{RES}/deviceclasses", body)

    async def claim(self, name: str, device_class: str = "gpu") -> Any:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
                }
            },
        }
        return await self.http.ok("POST", CLAIMS, body)

    async def template(self, name: str, device_class: str = "gpu") -> Any:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {
                "metadata": {"labels": {"from": "template"}},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
                    }
                },
            },
        }
        return await self.http.ok("POST", TEMPLATES, body)

    async def pod(self, name: str, claims: dict[str, dict[str, str]] | None = None,
                  **spec: Any) -> Any:  # fmt: skip
        """A pod; ``claims`` maps a pod claim name to its source
        (``{"resourceClaimName": ...}`` or ``{"resourceClaimTemplateName": ...}``)."""
        container: dict[str, Any] = {"name": "main", "image": "busybox"}
        body_spec: dict[str, Any] = {"containers": [container], **spec}
        if claims:
            body_spec["resourceClaims"] = [{"name": n, **src} for n, src in claims.items()]
            container["resources"] = {"claims": [{"name": n} for n in claims]}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body_spec}
        return await self.http.ok("POST", f"{NS}/pods", body)

    async def bound(self, pod: str, within: float = 10) -> str:
        async def node() -> str:
            got = await self.http.get(f"{NS}/pods/{pod}")
            return str(((got or {}).get("spec") or {}).get("nodeName") or "")

        return str(await eventually(node, within, f"pod {pod} bound to a node"))

    async def scheduled_condition(self, pod: str, status: str = "False") -> dict[str, Any]:
        async def condition() -> dict[str, Any] | None:
            got = await self.http.get(f"{NS}/pods/{pod}") or {}
            conds = (got.get("status") or {}).get("conditions") or []
            return next(
                (c for c in conds if c["type"] == "PodScheduled" and c["status"] == status), None
            )

        found = await eventually(condition, 10, f"PodScheduled={status} on pod {pod}")
        assert isinstance(found, dict)
        return found

    async def events(self, pod: str, reason: str = "") -> list[dict[str, Any]]:
        out = await self.http.ok("GET", f"{NS}/events")
        return [
            e for e in out["items"]
            if e["involvedObject"].get("name") == pod and (not reason or e["reason"] == reason)
        ]  # fmt: skip

    async def claim_of(self, pod: str, claim: str = "gpu") -> str:
        async def name() -> str:
            got = await self.http.get(f"{NS}/pods/{pod}") or {}
            for s in (got.get("status") or {}).get("resourceClaimStatuses") or []:
                if s.get("name") == claim:
                    return str(s.get("resourceClaimName") or "")
            return ""

        return str(await eventually(name, 10, f"pod {pod}'s claim {claim} created"))

    async def devices(self, claim: str) -> list[str]:
        got = await self.http.get(f"{CLAIMS}/{claim}") or {}
        results = (((got.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []
        return sorted(f"{r['pool']}/{r['device']}" for r in results)

    async def finish(self, pod: str, phase: str = "Succeeded") -> None:
        await self.http.ok("PATCH", f"{NS}/pods/{pod}/status", {"status": {"phase": phase}})


@pytest.fixture
async def world(server: APIServer) -> AsyncIterator[World]:
    client = make_client(server_url=server.url, timeout=5.0)
    standins = StandIns(client)
    await standins.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            yield World(Http(session, server.url), standins)
    finally:
        await standins.stop()
        await client.close()
