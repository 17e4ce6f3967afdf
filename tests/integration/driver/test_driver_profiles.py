"""``drahealth driver --withdraw-unhealthy`` against the embedded API server playing a release.

On 1.35 (``DRADeviceTaints`` off by default) the server drops slice taints: the sample
driver withdraws a latched-Unhealthy device from its slice, keeps serving the claim that
already holds it, and publishes it again once Healthy. On 1.36 the taint is kept and the
device stays. The flag alone means ``auto``; this test passes it that way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim

from drahealth.controlplane import APIServer
from drahealth.core import kube_profile
from drahealth.kube import make_client
from tests._support import eventually
from tests.integration.driver.test_sample_driver import (
    NODE,
    DriverProcess,
    base,
    inject,
    launch,
    processes,
)
from tests.integration.driver.test_sample_driver_kube import (
    TAINT_KEY,
    create_claim,
    gpu,
    prepare,
    slices,
    taints,
    unprepare,
)

__all__ = ["base", "launch", "processes"]  # fixtures shared with test_sample_driver

pytestmark = pytest.mark.timeout(40)


@pytest.fixture(params=["1.35", "1.36"])
async def apiserver(request: pytest.FixtureRequest) -> AsyncIterator[APIServer]:
    server = APIServer(profile=kube_profile(request.param))
    await server.start(port=0)
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def kube(apiserver: APIServer) -> AsyncIterator[AsyncClient]:
    client = make_client(server_url=apiserver.url)
    try:
        await client.create(Node(metadata=ObjectMeta(name=NODE)))
        yield client
    finally:
        await client.close()


async def names(kube: AsyncClient) -> list[str]:
    return [d.name for s in await slices(kube) for d in s.spec.devices or ()]


async def test_withdraw_where_taints_are_dropped_keep_where_kept(
    launch: Callable[..., Any], apiserver: APIServer, kube: AsyncClient, base: str
) -> None:
    kubeconfig = str(apiserver.write_kubeconfig(f"{base}/kubeconfig"))
    d: DriverProcess = await launch("--withdraw-unhealthy", kubeconfig=kubeconfig)
    everything = [f"gpu-{i}" for i in range(8)]

    async def all_published() -> bool:
        return await names(kube) == everything

    await eventually(all_published, 10, "all devices published")
    uid = await create_claim(kube, "held", [gpu("gpu-3")])
    assert (await prepare(d, ("held", uid)))[uid].error == ""

    rc, out, _ = await inject(d.state, "gpu-3", "unhealthy", "--message", "xid 79")
    assert rc == 0, out
    if apiserver.profile.slice_taints:

        async def tainted() -> bool:
            return taints(await slices(kube)) == {"gpu-3": [(TAINT_KEY, "true", "NoSchedule")]}

        await eventually(tainted, 10, "gpu-3 tainted")
        assert await names(kube) == everything
    else:

        async def withdrawn() -> bool:
            return await names(kube) == [n for n in everything if n != "gpu-3"]

        await eventually(withdrawn, 10, "gpu-3 withdrawn")
        assert taints(await slices(kube)) == {}
        # the claim that holds it keeps its allocation, and the driver keeps serving it
        claim = await kube.get(ResourceClaim, "held", namespace="default")
        assert claim.status is not None and claim.status.allocation is not None
        assert (await prepare(d, ("held", uid)))[uid].error == ""
        assert await unprepare(d, ("held", uid)) == {uid: ""}

    rc, out, _ = await inject(d.state, "gpu-3", "healthy")
    assert rc == 0, out

    async def recovered() -> bool:
        return await names(kube) == everything and taints(await slices(kube)) == {}

    await eventually(recovered, 10, "gpu-3 published again, untainted")
