"""Lease times (``metav1.MicroTime``) as the real API server reads them.

kube-apiserver 1.37.2 decodes a MicroTime with the layout
``2006-01-02T15:04:05.000000Z07:00``: exactly six fraction digits. A Lease whose
``renewTime`` or ``acquireTime`` is ``2026-01-01T00:00:00Z`` is a 400 ("cannot parse "Z"
as ".000000""), measured with scripts/realk8s. lightkube decodes these fields into
``datetime`` and msgspec writes a datetime whose microsecond is 0 without a fraction, so a
Lease read back and written again (the leader's renewal keeps the ``acquireTime`` it read)
failed at the real server whenever a time fell on a whole second: the leader could not
renew for as long as it held the Lease. (The embedded server accepts the short form, so
only a peer that reads as upstream shows it.)
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

import drahealth.kube._leader as leader_module
import drahealth.node._nodestatus as nodestatus_module
from drahealth.kube import make_client
from drahealth.kube._leader import LeaderElector

pytestmark = pytest.mark.timeout(20)

WHOLE_SECOND = "2026-03-01T10:00:00.000000Z"
_MICRO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")


def _json(obj: dict[str, Any], status: int = 200) -> web.Response:
    # exactly "application/json", as kube-apiserver writes it (lightkube reads a Status
    # only from a response of that type)
    return web.Response(
        body=json.dumps(obj).encode(), status=status, headers={"Content-Type": "application/json"}
    )


class LeasePeer:
    """Leases only, MicroTime read as upstream reads it; every body sent is kept."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.bodies: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.rv = 1

    def _bad(self, body: dict[str, Any]) -> str | None:
        for key in ("acquireTime", "renewTime"):
            value = (body.get("spec") or {}).get(key)
            if value is not None and not _MICRO.fullmatch(str(value)):
                return f'parsing time "{value}" as "2006-01-02T15:04:05.000000Z07:00"'
        return None

    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info.get("name") or ""
        if request.method in ("GET", "PATCH"):
            if name not in self.leases:
                return _json(
                    {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": f'leases.coordination.k8s.io "{name}" not found',
                     "reason": "NotFound", "details": {"name": name, "group":
                     "coordination.k8s.io", "kind": "leases"}, "code": 404}, status=404,
                )  # fmt: skip
            if request.method == "GET":
                return _json(self.leases[name])
            raise AssertionError("a patch of a Lease there is is not needed here")
        body = json.loads(await request.read())
        self.bodies.append(body)
        bad = self._bad(body)
        if bad is not None:
            self.refused.append(bad)
            return _json(
                {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "message": f'Lease in version "v1" cannot be handled as a Lease: {bad}',
                 "reason": "BadRequest", "code": 400}, status=400,
            )  # fmt: skip
        name = name or body["metadata"]["name"]
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        body["metadata"].setdefault("namespace", request.match_info["ns"])
        self.leases[name] = body
        return _json(body, status=201 if request.method == "POST" else 200)


@pytest.fixture
async def peer() -> AsyncIterator[tuple[LeasePeer, str]]:
    p = LeasePeer()
    app = web.Application()
    base = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    app.router.add_route("*", base, p.handle)
    app.router.add_route("*", base + "/{name}", p.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield p, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_the_leader_renews_a_lease_acquired_on_a_whole_second(
    peer: tuple[LeasePeer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    p, url = peer
    client = make_client(server_url=url, timeout=5.0)
    try:
        elector = LeaderElector(client, name="ctl", identity="a", namespace="ns")
        monkeypatch.setattr(leader_module, "now_rfc3339_micro", lambda: WHOLE_SECOND)
        assert await elector._attempt()  # acquired: acquireTime on a whole second
        monkeypatch.setattr(
            leader_module, "now_rfc3339_micro", lambda: "2026-03-01T10:00:02.500000Z"
        )
        assert await elector._attempt(), p.refused  # renewed, keeping that acquireTime
        assert await elector._attempt(), p.refused
        assert p.refused == []
        assert p.leases["ctl"]["spec"]["acquireTime"] == WHOLE_SECOND
        await elector._release()
        assert p.refused == [] and p.leases["ctl"]["spec"]["holderIdentity"] == ""
    finally:
        await client.close()


async def test_the_kubelet_mode_node_lease_is_created_with_six_fraction_digits(
    peer: tuple[LeasePeer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    p, url = peer
    client = make_client(server_url=url, timeout=5.0)
    try:
        monkeypatch.setattr(nodestatus_module, "LEASE_NAMESPACE", "kube-node-lease")
        monkeypatch.setattr(nodestatus_module, "now_rfc3339_micro", lambda: WHOLE_SECOND)
        writer = nodestatus_module.NodeRegistrar(
            client, "n1", kubelet_port=10250, kube_version="1.37", storage_dir="/tmp"
        )
        writer._uid = "uid-n1"
        await writer.renew()  # no Lease yet: the merge patch is a 404, then a create
        assert p.refused == [] and writer.lease_renewals == 1
        assert p.leases["n1"]["spec"]["renewTime"] == WHOLE_SECOND
    finally:
        await client.close()
