"""LeaderElector against the embedded API server: one leader, takeover, release, races."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from lightkube import AsyncClient
from lightkube.resources.coordination_v1 import Lease

from drahealth.kube._leader import LeaderElector
from tests.integration.kube.conftest import eventually

FAST = {"lease_duration": 1.0, "renew_deadline": 0.6, "retry_period": 0.1}


class Candidate:
    """An elector whose leader work records that it runs and when it was stopped."""

    def __init__(self, client: AsyncClient, identity: str, **kw: float) -> None:
        self.elector = LeaderElector(client, name="ctl", identity=identity, **{**FAST, **kw})
        self.leading = False
        self.terms = 0
        self.task: asyncio.Task[None] | None = None

    async def lead(self) -> None:
        self.leading = True
        self.terms += 1
        try:
            await asyncio.Event().wait()
        finally:
            self.leading = False

    def start(self) -> Candidate:
        self.task = asyncio.create_task(self.elector.run(self.lead))
        return self

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def crash(self) -> None:
        """Stop without releasing the lease, as a killed process would."""
        self.elector._release = _no_release  # type: ignore[method-assign]
        await self.stop()


async def _no_release() -> None:
    return None


@asynccontextmanager
async def candidates(client: AsyncClient, *names: str) -> AsyncIterator[list[Candidate]]:
    cs = [Candidate(client, n).start() for n in names]
    try:
        yield cs
    finally:
        for c in cs:
            if c.task is not None and not c.task.done():
                await c.stop()


async def holder(client: AsyncClient) -> str | None:
    lease = await client.get(Lease, "ctl", namespace="default")
    return lease.spec.holderIdentity if lease.spec else None


async def test_a_single_candidate_creates_the_lease_and_leads(client: AsyncClient) -> None:
    async with candidates(client, "a") as (a,):
        await eventually(lambda: a.leading)
        lease = await client.get(Lease, "ctl", namespace="default")
        assert lease.spec is not None
        assert lease.spec.holderIdentity == "a" and lease.spec.leaseDurationSeconds == 1
        assert lease.spec.leaseTransitions == 0 and lease.spec.renewTime is not None
        first = lease.spec.renewTime
        await asyncio.sleep(0.3)
        renewed = await client.get(Lease, "ctl", namespace="default")
        assert renewed.spec is not None and renewed.spec.renewTime != first


async def test_exactly_one_of_two_leads_and_a_crash_hands_over_after_the_lease(
    client: AsyncClient,
) -> None:
    async with candidates(client, "a", "b") as (a, b):
        await eventually(lambda: a.leading or b.leading)
        for _ in range(20):  # sampled over 1 s: never two leaders
            assert a.leading + b.leading == 1
            await asyncio.sleep(0.05)
        leader, standby = (a, b) if a.leading else (b, a)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await leader.crash()
        await eventually(lambda: standby.leading, within=3.0)
        took = loop.time() - t0
        assert 0.9 <= took <= 1.0 + 3 * FAST["retry_period"] + 0.3, took
        lease = await client.get(Lease, "ctl", namespace="default")
        assert lease.spec is not None and lease.spec.leaseTransitions == 1
        assert lease.spec.holderIdentity == standby.elector.identity


async def test_clean_stop_releases_at_once(client: AsyncClient) -> None:
    async with candidates(client, "a", "b") as (a, b):
        await eventually(lambda: a.leading or b.leading)
        leader, standby = (a, b) if a.leading else (b, a)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await leader.stop()
        assert not leader.leading
        await eventually(lambda: standby.leading, within=2.0)
        assert loop.time() - t0 < 0.5  # about one retry period, not the lease duration


async def test_many_simultaneous_candidates_never_double_lead(client: AsyncClient) -> None:
    async with candidates(client, *"abcdef") as cs:
        await eventually(lambda: any(c.leading for c in cs))
        for _ in range(20):
            assert sum(c.leading for c in cs) == 1
            await asyncio.sleep(0.03)


async def test_a_lost_renewal_stops_the_leader_work(client: AsyncClient) -> None:
    async with candidates(client, "a") as (a,):
        await eventually(lambda: a.leading)
        # someone else takes the lease by force: the leader's next renewals fail
        lease = await client.get(Lease, "ctl", namespace="default")
        body = lease.to_dict()
        body["spec"]["holderIdentity"] = "intruder"
        body["spec"]["leaseDurationSeconds"] = 3600
        await client.replace(Lease.from_dict(body))  # type: ignore[call-overload]
        await eventually(lambda: not a.leading, within=2.0)
        assert a.terms == 1 and await holder(client) == "intruder"


async def test_a_malformed_lease_is_taken_over(client: AsyncClient) -> None:
    await client.create(Lease.from_dict({"metadata": {"name": "ctl", "namespace": "default"}}))  # type: ignore[call-overload]
    async with candidates(client, "a") as (a,):
        await eventually(lambda: a.leading)
        assert await holder(client) == "a"


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"identity": ""}, "identity must be"),
        ({"lease_duration": 0}, "lease_duration must be"),
        ({"retry_period": float("nan")}, "retry_period must be"),
        ({"renew_deadline": 15.0}, "renew_deadline (15.0) must be shorter"),
        ({"retry_period": 10.0}, "retry_period (10.0) must be shorter"),
    ],
)
def test_bad_arguments_name_the_argument(
    client: AsyncClient, kw: dict[str, object], fragment: str
) -> None:
    args: dict[str, object] = {"name": "ctl", "identity": "a", **kw}
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        LeaderElector(client, **args)  # type: ignore[arg-type]
