"""LeaderElector against the embedded API server: one leader, takeover, release, races."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import msgspec
import pytest
from lightkube import AsyncClient
from lightkube.resources.coordination_v1 import Lease

from drahealth.kube import make_client
from drahealth.kube._leader import LeaderElector
from tests.integration.kube.conftest import eventually

FAST = {"lease_duration": 1.0, "renew_deadline": 0.6, "retry_period": 0.1}


class Candidate:
    """An elector whose leader work records that it runs and when it was stopped."""

    def __init__(self, client: AsyncClient, identity: str) -> None:
        self.elector = LeaderElector(
            client,
            name="ctl",
            identity=identity,
            lease_duration=FAST["lease_duration"],
            renew_deadline=FAST["renew_deadline"],
            retry_period=FAST["retry_period"],
        )
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


# -- expiry is measured on the candidate's clock, from when the record last changed ----


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _held(holder: str, renew: str = "2000-01-01T00:00:00.000000Z", **spec: object) -> Lease:
    body = {
        "metadata": {"name": "ctl", "namespace": "default"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 10,
            "renewTime": renew,
            "acquireTime": renew,
            "leaseTransitions": 4,
            **spec,
        },
    }
    return cast(Lease, Lease.from_dict(body))


async def test_an_old_server_timestamp_does_not_expire_a_lease_just_seen(
    client: AsyncClient,
) -> None:
    await client.create(_held("other"))  # renewTime in 2000: skew must not matter
    clock = FakeClock()
    b = LeaderElector(client, name="ctl", identity="b", clock=clock)
    assert not await b._try_acquire_or_renew()
    assert b.leader == "other" and not b.is_leader
    clock.now += 9.9
    assert not await b._try_acquire_or_renew()
    clock.now += 0.2  # 10.1 s without a change, as seen by b
    assert await b._try_acquire_or_renew()
    lease = await client.get(Lease, "ctl", namespace="default")
    assert lease.spec is not None and lease.spec.holderIdentity == "b"
    assert lease.spec.leaseTransitions == 5 and lease.spec.leaseDurationSeconds == 15
    assert lease.spec.acquireTime == lease.spec.renewTime
    assert lease.spec.acquireTime is not None and lease.spec.acquireTime.year > 2000


async def test_a_renewed_record_restarts_the_local_expiry(client: AsyncClient) -> None:
    await client.create(_held("other"))
    clock = FakeClock()
    b = LeaderElector(client, name="ctl", identity="b", clock=clock)
    assert not await b._try_acquire_or_renew()
    clock.now += 8
    await client.replace(_held("other", renew="2000-01-01T00:00:01.000000Z"))
    assert not await b._try_acquire_or_renew()  # changed: the 10 s start again
    clock.now += 8
    assert not await b._try_acquire_or_renew()
    clock.now += 2.5
    assert await b._try_acquire_or_renew()


async def test_a_released_lease_is_taken_at_once_and_counts_a_transition(
    client: AsyncClient,
) -> None:
    await client.create(_held("", leaseDurationSeconds=1))
    b = LeaderElector(client, name="ctl", identity="b", clock=FakeClock())
    assert await b._try_acquire_or_renew()
    lease = await client.get(Lease, "ctl", namespace="default")
    assert lease.spec is not None and lease.spec.leaseTransitions == 5


# -- malformed Leases and a misbehaving API server -----------------------------------


def test_the_api_server_refuses_a_garbage_renew_time() -> None:
    # Such a Lease cannot be stored; a client that cannot decode one is covered below.
    with pytest.raises(msgspec.ValidationError, match="renewTime"):
        _held("other", renew="garbage")


@pytest.mark.parametrize("duration", [None, 0, -5])
async def test_a_nonsensical_duration_counts_as_expired_with_a_warning(
    server: Any, client: AsyncClient, caplog: pytest.LogCaptureFixture, duration: int | None
) -> None:
    # The API server refuses such a Lease (as the real one does): it is put in its store.
    lease = _held("ghost", leaseDurationSeconds=duration, leaseTransitions=-2).to_dict()
    lease.update(apiVersion="coordination.k8s.io/v1", kind="Lease")
    lease["metadata"]["uid"] = "ghost"
    server.store.create("coordination.k8s.io/leases", lease)
    b = LeaderElector(client, name="ctl", identity="b", clock=FakeClock())
    with caplog.at_level(logging.WARNING, logger="drahealth.kube._leader"):
        assert await b._try_acquire_or_renew()
    assert "leaseDurationSeconds" in caplog.text and "leaseTransitions -2" in caplog.text
    lease = await client.get(Lease, "ctl", namespace="default")
    assert lease.spec is not None and lease.spec.leaseTransitions == 1


async def test_a_holder_without_timestamps_expires_after_its_duration(
    client: AsyncClient,
) -> None:
    spec = {"holderIdentity": "x", "leaseDurationSeconds": 2}
    await client.create(
        Lease.from_dict({"metadata": {"name": "ctl", "namespace": "default"}, "spec": spec})  # type: ignore[call-overload]
    )
    clock = FakeClock()
    b = LeaderElector(client, name="ctl", identity="b", clock=clock)
    assert not await b._try_acquire_or_renew()
    clock.now += 2.1
    assert await b._try_acquire_or_renew()


async def test_undecodable_answers_are_retried_not_raised(
    client: AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    real_get = client.get
    failures = 3

    async def bad_get(*args: Any, **kwargs: Any) -> Any:
        nonlocal failures
        if failures:
            failures -= 1
            raise msgspec.ValidationError(
                "Invalid RFC3339 encoded datetime - at `$.spec.renewTime`"
            )
        return await real_get(*args, **kwargs)

    client.get = bad_get  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="drahealth.kube._leader"):
        async with candidates(client, "a") as (a,):
            await eventually(lambda: a.leading, within=3.0)
    assert "ValidationError" in caplog.text


async def test_an_unreachable_api_server_is_retried_and_cancel_is_clean() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = make_client(server_url=f"http://127.0.0.1:{port}", timeout=0.5)
    try:
        cand = Candidate(c, "a").start()
        await asyncio.sleep(0.4)
        assert cand.task is not None and not cand.task.done()
        assert not cand.leading and not cand.elector.is_leader
        await cand.stop()
    finally:
        await c.close()


async def test_a_hanging_renewal_steps_down_within_the_renew_deadline(
    client: AsyncClient,
) -> None:
    async with candidates(client, "a") as (a,):
        await eventually(lambda: a.leading)

        async def hang(*args: Any, **kwargs: Any) -> Any:
            await asyncio.Event().wait()

        client.get = hang  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await eventually(lambda: not a.leading, within=2.0)
        # renewed at most a retry period before the hang; steps down before the lease ends
        assert loop.time() - t0 < FAST["lease_duration"], loop.time() - t0
        assert not a.elector.is_leader
