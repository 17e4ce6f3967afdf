"""``remove_taints`` (``drahealth untaint``) when the rule goes between its list and its
delete: the controller removes its own rules of a device put on hold, so the operator's
command can meet a 404. What was asked is done: no error, and the rule is not reported
as deleted by the command."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.resource_v1 import DeviceTaintRule

from drahealth.controlplane import APIServer
from drahealth.core import DeviceKey
from drahealth.kube import make_client
from drahealth.remedy._operator import apply_taint, remove_taints

DEVICE = DeviceKey("gpu.example.com", "node-1", "gpu-0")
KEY = "ops.example.com/maint"


@pytest.fixture
async def client(server: APIServer) -> AsyncIterator[AsyncClient]:
    c = make_client(server_url=server.url)
    try:
        yield c
    finally:
        await c.close()


class _Racing:
    """A client whose deletes find the object already deleted by another writer."""

    def __init__(self, inner: AsyncClient) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def delete(self, cls: Any, name: str, **kw: Any) -> None:
        await self._inner.delete(cls, name, **kw)  # the other writer
        await self._inner.delete(cls, name, **kw)  # ours: 404


async def test_a_rule_gone_before_its_delete_is_no_error(client: AsyncClient) -> None:
    name, _ = await apply_taint(
        client, DEVICE, key=KEY, value="rma", effect="NoSchedule", force=True
    )
    deleted = await remove_taints(_Racing(client), DEVICE, key=KEY)  # type: ignore[arg-type]
    assert deleted == []
    assert [r.metadata.name async for r in client.list(DeviceTaintRule) if r.metadata] == []
    # a plain delete still reports what it deleted
    name, _ = await apply_taint(
        client, DEVICE, key=KEY, value="rma", effect="NoSchedule", force=True
    )
    assert await remove_taints(client, DEVICE, key=KEY) == [name]
