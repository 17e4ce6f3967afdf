"""Prepare/unprepare orchestration: config resolution, subrequests, per-claim failure
isolation, idempotency, the in-use guard, serialization and unprepare bookkeeping.

Uses an in-test driver and a fake claim getter (the HTTP path is covered by the
integration test against the embedded API server)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import Status
from lightkube.resources.resource_v1 import ResourceClaim
from prometheus_client import CollectorRegistry

from drahealth.driver._checkpoint import ClaimState
from drahealth.driver._prepare import (
    ClaimPreparer,
    error_type_field,
    find_conflict,
    format_error,
    resolve_results,
    strip_subrequests,
)
from drahealth.driver._types import (
    AllocationResult,
    ClaimError,
    ClaimRef,
    ConfigSource,
    ErrorKind,
    PluginOptions,
    PreparedClaimRequest,
    PreparedDevice,
    PrepareResult,
)

DRIVER = "gpu.example.com"
OTHER = "nic.example.com"


def result(
    request: str, device: str, pool: str = "node-1", driver: str = DRIVER, **extra: Any
) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device, **extra}


def opaque(
    params: dict[str, Any],
    source: str = "FromClaim",
    requests: Sequence[str] = (),
    driver: str = DRIVER,
) -> dict[str, Any]:
    cfg: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests:
        cfg["requests"] = list(requests)
    return cfg


def make_claim(
    uid: str = "uid-1",
    name: str = "c1",
    namespace: str = "default",
    results: Sequence[dict[str, Any]] = (),
    config: Sequence[dict[str, Any]] = (),
    allocated: bool = True,
) -> ResourceClaim:
    doc: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {}},
    }
    if allocated:
        doc["status"] = {
            "allocation": {"devices": {"results": list(results), "config": list(config)}}
        }
    return cast(ResourceClaim, ResourceClaim.from_dict(doc))


def ref(claim: ResourceClaim) -> ClaimRef:
    meta = claim.metadata
    assert meta is not None and meta.namespace and meta.name and meta.uid
    return ClaimRef(meta.namespace, meta.name, meta.uid)


class FakeClient:
    """Answers ``get(ResourceClaim, name, namespace=...)`` from a dict."""

    def __init__(self, *claims: ResourceClaim) -> None:
        self.claims: dict[tuple[str, str], ResourceClaim | Exception] = {}
        for c in claims:
            self.add(c)
        self.gets = 0
        self.gate: asyncio.Event | None = None
        self.gets_target = 0
        self.gets_reached = asyncio.Event()

    def add(self, claim: ResourceClaim) -> None:
        meta = claim.metadata
        assert meta is not None and meta.namespace and meta.name
        self.claims[(meta.namespace, meta.name)] = claim

    async def get(self, res: type[ResourceClaim], name: str, *, namespace: str) -> ResourceClaim:
        assert res is ResourceClaim
        self.gets += 1
        if self.gets_target and self.gets >= self.gets_target:
            self.gets_reached.set()
        if self.gate is not None:
            await self.gate.wait()
        got = self.claims.get((namespace, name))
        if got is None:
            raise ApiError(status=Status(code=404, reason="NotFound", message="not found"))
        if isinstance(got, Exception):
            raise got
        return got


class FakeDriver:
    def __init__(self) -> None:
        self.prepare_calls: list[list[PreparedClaimRequest]] = []
        self.unprepare_calls: list[list[ClaimRef]] = []
        self.answers: dict[str, PrepareResult] = {}
        self.unprepare_answers: dict[str, Exception | None] = {}
        self.raise_on_prepare: Exception | None = None
        self.omit: set[str] = set()
        self.active = 0
        self.max_active = 0
        self.delay = 0.0
        self.entered = asyncio.Event()

    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        self.prepare_calls.append(list(claims))
        self.active += 1
        self.entered.set()
        self.max_active = max(self.max_active, self.active)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.raise_on_prepare is not None:
                raise self.raise_on_prepare
            out: dict[str, PrepareResult] = {}
            for c in claims:
                if c.uid in self.omit:
                    continue
                out[c.uid] = self.answers.get(c.uid) or PrepareResult.ok(
                    [
                        PreparedDevice([r.request], r.pool, r.device, share_id=r.share_id)
                        for r in c.results
                    ]
                )
            return out
        finally:
            self.active -= 1

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        self.unprepare_calls.append(list(claims))
        return {c.uid: self.unprepare_answers.get(c.uid) for c in claims}


@pytest.fixture
def short_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(dir="/tmp", prefix="drap-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def options(base: str, client: FakeClient | None = None, **kw: Any) -> PluginOptions:
    return PluginOptions(
        DRIVER,
        registry_dir=f"{base}/reg",
        plugins_dir=f"{base}/plugins",
        cdi_dir=f"{base}/cdi",
        kube_client=cast(AsyncClient, client),
        **kw,
    )


def _is_file(path: str) -> bool:
    return Path(path).is_file()


def _read_json(path: str) -> Any:
    return json.loads(Path(path).read_text())


async def loaded(driver: FakeDriver, opts: PluginOptions) -> ClaimPreparer:
    p = ClaimPreparer(driver, opts)
    await p.load()
    return p


# ---------------------------------------------------------------------------
# resolve_results / configs / subrequests
# ---------------------------------------------------------------------------


def test_results_are_filtered_to_this_driver_with_all_fields() -> None:
    claim = make_claim(
        results=[
            result(
                "gpus/big",
                "gpu-0",
                adminAccess=True,
                shareID="s-1",
                consumedCapacity={"memory": "4Gi"},
                tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
            ),
            result("nic", "eth0", driver=OTHER),
        ]
    )
    [r] = resolve_results(claim, DRIVER)
    assert (r.request, r.base_request, r.pool, r.device) == ("gpus/big", "gpus", "node-1", "gpu-0")
    assert r.admin_access and r.share_id == "s-1"
    assert r.consumed_capacity == {"memory": "4Gi"}
    assert [t.key for t in r.tolerations] == ["k"]
    assert resolve_results(claim, OTHER)[0].device == "eth0"


def test_configs_class_before_claim_later_wins() -> None:
    claim = make_claim(
        results=[result("gpus", "gpu-0")],
        config=[
            opaque({"n": "claim-1"}, "FromClaim"),
            opaque({"n": "class-1"}, "FromClass"),
            opaque({"n": "claim-2"}, "FromClaim"),
            opaque({"n": "class-2"}, "FromClass"),
            opaque({"n": "other"}, "FromClaim", driver=OTHER),
        ],
    )
    [r] = resolve_results(claim, DRIVER)
    assert [c.parameters["n"] for c in r.configs] == ["class-1", "class-2", "claim-1", "claim-2"]
    assert [c.source for c in r.configs[:2]] == [ConfigSource.FROM_CLASS] * 2
    assert r.parameters == {"n": "claim-2"}


def test_configs_match_full_subrequest_or_main_name_empty_means_all() -> None:
    claim = make_claim(
        results=[result("gpus/big", "gpu-0"), result("gpus/small", "gpu-1"), result("x", "gpu-2")],
        config=[
            opaque({"n": "all"}),
            opaque({"n": "main"}, requests=["gpus"]),
            opaque({"n": "big"}, requests=["gpus/big"]),
            opaque({"n": "x"}, requests=["x"]),
        ],
    )
    big, small, x = resolve_results(claim, DRIVER)
    assert [c.parameters["n"] for c in big.configs] == ["all", "main", "big"]
    assert [c.parameters["n"] for c in small.configs] == ["all", "main"]
    assert [c.parameters["n"] for c in x.configs] == ["all", "x"]
    assert x.configs[1].requests == ("x",)


def test_skip_node_operations_results_are_left_out() -> None:
    claim = make_claim(
        results=[
            result("a", "gpu-0", skipNodeOperations=["NodePrepareResources"]),
            result("b", "gpu-1", skipNodeOperations=["*"]),
            result("c", "gpu-2", skipNodeOperations=["NodeUnprepareResources"]),
        ]
    )
    assert [r.device for r in resolve_results(claim, DRIVER)] == ["gpu-2"]


def test_strip_subrequests() -> None:
    assert strip_subrequests(["gpus/big", "gpus/small", "nic", "gpus"]) == ["gpus", "nic"]
    assert strip_subrequests([]) == []


def test_error_type_field_encoding() -> None:
    assert format_error(ClaimError("bad", ErrorKind.PERMANENT_CONFIG)) == "bad"
    # field 3, varint, value 1 (Permanent) for both permanent kinds; nothing otherwise
    assert error_type_field(ClaimError("bad", ErrorKind.PERMANENT_CONFIG)) == b"\x18\x01"
    assert error_type_field(ClaimError("xid", ErrorKind.PERMANENT_DEVICE)) == b"\x18\x01"
    assert error_type_field(ClaimError("busy")) == b""


# ---------------------------------------------------------------------------
# in-use guard (pure)
# ---------------------------------------------------------------------------


def _entries(**devs: Any) -> dict[str, Any]:
    from drahealth.driver._checkpoint import CheckpointDevice, ClaimEntry

    return {
        "other": ClaimEntry(
            "ns", "o", ClaimState.PREPARE_COMPLETED, (CheckpointDevice("node-1", "gpu-0", **devs),)
        )
    }


@pytest.mark.parametrize(
    ("mine", "theirs", "conflict"),
    [
        ({}, {}, True),
        ({"admin_access": True}, {}, False),
        ({}, {"admin_access": True}, False),
        ({"share_id": "a"}, {"share_id": "b"}, False),
        ({"share_id": "a"}, {"share_id": "a"}, True),
        ({"share_id": "a"}, {}, True),
        ({}, {"share_id": "b"}, True),
    ],
)
def test_find_conflict_relaxations(
    mine: dict[str, Any], theirs: dict[str, Any], conflict: bool
) -> None:
    res = [AllocationResult("gpus", DRIVER, "node-1", "gpu-0", **mine)]
    err = find_conflict("me", res, _entries(**theirs))
    assert (err is not None) == conflict
    if err:
        assert err.message == "device node-1/gpu-0 is already in use by claim ns/o (other)"
        assert err.kind is ErrorKind.TRANSIENT
    assert find_conflict("other", res, _entries(**theirs)) is None  # own entry never conflicts


# ---------------------------------------------------------------------------
# orchestration
# ---------------------------------------------------------------------------


async def test_per_claim_failures_do_not_fail_the_batch(short_dir: str) -> None:
    good = make_claim("u-good", "good", results=[result("gpus/big", "gpu-0")])
    unalloc = make_claim("u-unalloc", "unalloc", allocated=False)
    replaced = make_claim("u-new", "replaced", results=[result("gpus", "gpu-1")])
    other = make_claim("u-other", "other", results=[result("nic", "eth0", driver=OTHER)])
    client = FakeClient(good, unalloc, replaced, other)
    client.claims[("default", "boom")] = ApiError(
        status=Status(code=500, reason="InternalError", message="etcd timeout")
    )
    client.claims[("default", "weird")] = RuntimeError("connection reset")
    driver = FakeDriver()
    p = await loaded(driver, options(short_dir, client))
    refs = [
        ref(good),
        ref(unalloc),
        ClaimRef("default", "replaced", "u-old"),
        ref(other),
        ClaimRef("default", "missing", "u-missing"),
        ClaimRef("default", "boom", "u-boom"),
        ClaimRef("default", "weird", "u-weird"),
    ]
    out = await p.prepare(refs)
    assert set(out) == {r.uid for r in refs}
    assert out["u-good"].error is None
    [dev] = out["u-good"].devices or []
    assert dev.requests == ["gpus"] and (dev.pool, dev.device) == ("node-1", "gpu-0")
    assert dev.cdi_device_ids == ["k8s.gpu.example.com/claim=u-good-gpu-0"]
    msgs = {uid: r.error.message for uid, r in out.items() if r.error}
    assert msgs == {
        "u-unalloc": "claim default/unalloc (uid u-unalloc) is not allocated",
        "u-old": "claim default/replaced (uid u-old) got replaced: the API server has uid u-new",
        "u-missing": "ResourceClaim default/missing not found (uid u-missing)",
        "u-boom": "fetching ResourceClaim default/boom: etcd timeout",
        "u-weird": "fetching ResourceClaim default/weird: RuntimeError: connection reset",
    }
    assert all(r.error.kind is ErrorKind.TRANSIENT for r in out.values() if r.error)
    assert out["u-other"] == PrepareResult.ok([])
    # only the good claim reached the driver, with its subrequest name intact
    [[seen]] = driver.prepare_calls
    assert seen.uid == "u-good" and seen.results[0].request == "gpus/big"
    assert seen.claim.metadata is not None and seen.claim.metadata.name == "good"


async def test_without_api_access_every_claim_fails_clearly(short_dir: str) -> None:
    driver = FakeDriver()
    p = await loaded(driver, options(short_dir, None))
    out = await p.prepare([ClaimRef("ns", "a", "u1"), ClaimRef("ns", "b", "u2")])
    assert {u: r.error.message for u, r in out.items() if r.error} == {
        "u1": "no Kubernetes API access configured; cannot fetch ResourceClaim ns/a",
        "u2": "no Kubernetes API access configured; cannot fetch ResourceClaim ns/b",
    }
    assert driver.prepare_calls == []


async def test_prepare_is_idempotent_from_the_checkpoint(short_dir: str) -> None:
    claim = make_claim(results=[result("gpus", "gpu-0"), result("gpus", "gpu-1")])
    driver = FakeDriver()
    opts = options(short_dir, FakeClient(claim))
    p = await loaded(driver, opts)
    first = await p.prepare([ref(claim)])
    second = await p.prepare([ref(claim)])
    assert first == second and len(driver.prepare_calls) == 1
    entry = p.prepared_claims()["uid-1"]
    assert entry.state is ClaimState.PREPARE_COMPLETED
    # a fresh preparer (restart) replays from the file, and rewrites a vanished CDI spec
    assert p.cdi is not None
    os.unlink(p.cdi.spec_path("uid-1"))
    p2 = await loaded(driver, opts)
    assert p.cdi.exists("uid-1")  # regenerated at load
    os.unlink(p.cdi.spec_path("uid-1"))
    assert await p2.prepare([ref(claim)]) == first
    assert p.cdi.exists("uid-1")
    assert len(driver.prepare_calls) == 1


async def test_in_use_guard_and_relaxations(short_dir: str) -> None:
    a = make_claim("ua", "a", results=[result("gpus", "gpu-0")])
    b = make_claim("ub", "b", results=[result("gpus", "gpu-0")])
    admin = make_claim("uc", "c", results=[result("gpus", "gpu-0", adminAccess=True)])
    s1 = make_claim("ud", "d", results=[result("gpus", "gpu-1", shareID="s1")])
    s2 = make_claim("ue", "e", results=[result("gpus", "gpu-1", shareID="s2")])
    driver = FakeDriver()
    p = await loaded(driver, options(short_dir, FakeClient(a, b, admin, s1, s2)))
    assert (await p.prepare([ref(a)]))["ua"].error is None
    out = await p.prepare([ref(b), ref(admin), ref(s1), ref(s2)])
    err = out["ub"].error
    assert err is not None and err.kind is ErrorKind.TRANSIENT
    assert err.message == "device node-1/gpu-0 is already in use by claim default/a (ua)"
    assert [u for u, r in out.items() if r.error is None] == ["uc", "ud", "ue"]
    # once a is unprepared, b can take the device
    assert await p.unprepare([ref(a)]) == {"ua": None}
    assert (await p.prepare([ref(b)]))["ub"].error is None


async def test_in_use_guard_within_one_batch(short_dir: str) -> None:
    a = make_claim("ua", "a", results=[result("gpus", "gpu-0")])
    b = make_claim("ub", "b", results=[result("gpus", "gpu-0")])
    p = await loaded(FakeDriver(), options(short_dir, FakeClient(a, b)))
    out = await p.prepare([ref(a), ref(b)])
    assert out["ua"].error is None
    assert (
        out["ub"].error is not None
        and "already in use by claim default/a" in out["ub"].error.message
    )


async def test_driver_errors_and_missing_answers_stay_per_claim(short_dir: str) -> None:
    claims = [make_claim(f"u{i}", f"c{i}", results=[result("gpus", f"gpu-{i}")]) for i in range(4)]
    driver = FakeDriver()
    faults: list[tuple[str, str, str]] = []

    async def on_fault(pool: str, device: str, message: str) -> None:
        faults.append((pool, device, message))

    registry = CollectorRegistry()
    p = await loaded(
        driver,
        options(
            short_dir,
            FakeClient(*claims),
            on_device_fault=on_fault,
            metrics_registry=registry,
        ),
    )
    driver.answers["u1"] = PrepareResult.failed(
        "XID 79", ErrorKind.PERMANENT_DEVICE, device=("node-1", "gpu-1")
    )
    driver.answers["u2"] = PrepareResult.failed("bad config", ErrorKind.PERMANENT_CONFIG)
    driver.omit.add("u3")
    out = await p.prepare([ref(c) for c in claims])
    assert out["u0"].error is None
    assert out["u1"].error == ClaimError(
        "XID 79", ErrorKind.PERMANENT_DEVICE, device=("node-1", "gpu-1")
    )
    assert out["u2"].error is not None and out["u2"].error.kind is ErrorKind.PERMANENT_CONFIG
    assert out["u3"].error is not None
    assert out["u3"].error.message == "driver returned no result for claim default/c3 (uid u3)"
    assert faults == [("node-1", "gpu-1", "XID 79")]
    # failed claims stay PrepareStarted (may be partly prepared) until unprepared
    states = {u: e.state for u, e in p.prepared_claims().items()}
    assert states == {
        "u0": ClaimState.PREPARE_COMPLETED,
        "u1": ClaimState.PREPARE_STARTED,
        "u2": ClaimState.PREPARE_STARTED,
        "u3": ClaimState.PREPARE_STARTED,
    }

    def count(outcome: str) -> float | None:
        return registry.get_sample_value(
            "drahealth_driver_claim_operations_total",
            {"driver": DRIVER, "operation": "prepare", "outcome": outcome},
        )

    assert (count("ok"), count("permanent-device"), count("permanent-config")) == (1, 1, 1)
    assert count("transient") == 1


async def test_driver_exception_fails_its_batch_only(short_dir: str) -> None:
    c = make_claim(results=[result("gpus", "gpu-0")])
    other = make_claim("u-other", "o", results=[result("nic", "eth0", driver=OTHER)])
    driver = FakeDriver()
    driver.raise_on_prepare = ValueError("nvml exploded")
    p = await loaded(driver, options(short_dir, FakeClient(c, other)))
    out = await p.prepare([ref(c), ref(other)])
    assert out["uid-1"].error is not None
    assert out["uid-1"].error.message == "driver prepare failed: ValueError: nvml exploded"
    assert out["u-other"].error is None
    driver.raise_on_prepare = ClaimError("config", ErrorKind.PERMANENT_CONFIG)
    out = await p.prepare([ref(c)])
    assert out["uid-1"].error == ClaimError("config", ErrorKind.PERMANENT_CONFIG)


async def test_unprepare_known_unknown_and_failing(short_dir: str) -> None:
    a = make_claim("ua", "a", results=[result("gpus", "gpu-0")])
    b = make_claim("ub", "b", results=[result("gpus", "gpu-1")])
    driver = FakeDriver()
    client = FakeClient(a, b)
    p = await loaded(driver, options(short_dir, client))
    await p.prepare([ref(a), ref(b)])
    assert p.cdi is not None and p.cdi.exists("ua") and p.cdi.exists("ub")
    gets = client.gets
    driver.unprepare_answers["ub"] = ClaimError("device busy")
    out = await p.unprepare([ref(a), ref(b), ClaimRef("default", "never", "u-never")])
    assert client.gets == gets  # unprepare never talks to the API
    assert out == {"ua": None, "ub": ClaimError("device busy"), "u-never": None}
    assert [r.uid for r in driver.unprepare_calls[0]] == ["ua", "ub", "u-never"]
    assert not p.cdi.exists("ua") and p.cdi.exists("ub")
    assert set(p.prepared_claims()) == {"ub"}
    assert set(_read_json(p.checkpoint.path)["claims"]) == {"ub"}


async def test_gets_run_concurrently_and_outside_the_lock(short_dir: str) -> None:
    a = make_claim("ua", "a", results=[result("gpus", "gpu-0")])
    b = make_claim("ub", "b", results=[result("gpus", "gpu-1")])
    client = FakeClient(a, b)
    driver = FakeDriver()
    driver.delay = 0.2
    p = await loaded(driver, options(short_dir, client))
    first = asyncio.create_task(p.prepare([ref(a)]))
    await driver.entered.wait()  # the first call holds the lock inside the driver
    client.gate = asyncio.Event()
    client.gets_target = 3
    second = asyncio.create_task(p.prepare([ref(b), ref(a)]))
    await client.gets_reached.wait()  # both GETs of the second call start meanwhile
    assert not first.done() and driver.active == 1
    client.gate.set()
    await asyncio.gather(first, second)
    assert driver.max_active == 1


async def test_serialize_false_allows_overlap(short_dir: str) -> None:
    claims = [make_claim(f"u{i}", f"c{i}", results=[result("gpus", f"gpu-{i}")]) for i in range(3)]
    driver = FakeDriver()
    driver.delay = 0.02
    p = await loaded(driver, options(short_dir, FakeClient(*claims), serialize=False))
    outs = await asyncio.gather(*(p.prepare([ref(c)]) for c in claims))
    assert driver.max_active == 3
    assert all(r.error is None for o in outs for r in o.values())
    assert len(p.prepared_claims()) == 3


async def test_rolling_update_mode_shares_state_through_the_file(short_dir: str) -> None:
    a = make_claim("ua", "a", results=[result("gpus", "gpu-0")])
    b = make_claim("ub", "b", results=[result("gpus", "gpu-0")])
    client = FakeClient(a, b)
    old = await loaded(FakeDriver(), options(short_dir, client, pod_uid="pod-old"))
    new = await loaded(FakeDriver(), options(short_dir, client, pod_uid="pod-new"))
    assert (await old.prepare([ref(a)]))["ua"].error is None
    # the new instance sees the old instance's claim (guard + idempotency)
    assert (await new.prepare([ref(b)]))["ub"].error is not None
    assert (await new.prepare([ref(a)]))["ua"].error is None
    assert await new.unprepare([ref(a)]) == {"ua": None}
    assert (await old.prepare([ref(b)]))["ub"].error is None
    assert _is_file(f"{short_dir}/plugins/{DRIVER}/serialize.lock")


async def test_cdi_off_uses_driver_ids_only(short_dir: str) -> None:
    claim = make_claim(results=[result("gpus", "gpu-0")])
    driver = FakeDriver()
    driver.answers["uid-1"] = PrepareResult.ok(
        [PreparedDevice(["gpus"], "node-1", "gpu-0", ["vendor.com/gpu=gpu-0"])]
    )
    opts = PluginOptions(
        DRIVER,
        plugins_dir=f"{short_dir}/plugins",
        registry_dir=f"{short_dir}/reg",
        cdi_dir=None,
        kube_client=cast(AsyncClient, FakeClient(claim)),
    )
    p = await loaded(driver, opts)
    [dev] = (await p.prepare([ref(claim)]))["uid-1"].devices or []
    assert dev.cdi_device_ids == ["vendor.com/gpu=gpu-0"]
    assert p.cdi is None


async def test_batches_share_checkpoint_writes_and_answer_only_once_durable(
    short_dir: str,
) -> None:
    claims = [make_claim(f"u{i}", f"c{i}", results=[result("gpus", f"gpu-{i}")]) for i in range(3)]
    driver = FakeDriver()
    driver.delay = 0.05
    p = await loaded(driver, options(short_dir, FakeClient(*claims)))
    path = p.checkpoint.path

    async def prepare_and_read(claim: ResourceClaim) -> ClaimState:
        got = await p.prepare([ref(claim)])
        assert got[ref(claim).uid].error is None
        # what the file says the moment the reply exists
        return (await asyncio.to_thread(p.checkpoint.load))[ref(claim).uid].state

    first = asyncio.create_task(prepare_and_read(claims[0]))
    await driver.entered.wait()  # the first batch is inside the driver
    rest = [asyncio.create_task(prepare_and_read(c)) for c in claims[1:]]
    states = await asyncio.gather(first, *rest)
    assert states == [ClaimState.PREPARE_COMPLETED] * 3
    assert [len(c) for c in driver.prepare_calls] == [1, 2]
    # Started(u0); Completed(u0) with Started(u1, u2); Completed(u1, u2): 3 writes, not 4
    assert p.checkpoint_writes == 3
    assert _read_json(path)["claims"].keys() == {"u0", "u1", "u2"}


async def test_a_cancelled_caller_does_not_cancel_its_batch(short_dir: str) -> None:
    a = make_claim("ua", "a", results=[result("gpus", "gpu-0")])
    b = make_claim("ub", "b", results=[result("gpus", "gpu-1")])
    driver = FakeDriver()
    driver.delay = 0.05
    p = await loaded(driver, options(short_dir, FakeClient(a, b)))
    first = asyncio.create_task(p.prepare([ref(a)]))
    await driver.entered.wait()
    gone = asyncio.create_task(p.prepare([ref(b)]))
    for _ in range(50):  # its GET done, it waits in the queue for the next batch
        await asyncio.sleep(0)
    assert driver.active == 1 and not gone.done()
    gone.cancel()
    assert (await first)["ua"].error is None
    with pytest.raises(asyncio.CancelledError):
        await gone
    # the batch of the cancelled call still runs: prepared, recorded, durable
    states: dict[str, ClaimState] = {}
    for _ in range(200):
        states = {u: e.state for u, e in p.checkpoint.load().items()}
        if states.get("ub") is ClaimState.PREPARE_COMPLETED:
            break
        await asyncio.sleep(0.02)
    assert [[c.uid for c in call] for call in driver.prepare_calls] == [["ua"], ["ub"]]
    assert states == {"ua": ClaimState.PREPARE_COMPLETED, "ub": ClaimState.PREPARE_COMPLETED}
    # asked again, the claim is answered from the checkpoint without the driver
    assert (await p.prepare([ref(b)]))["ub"].error is None
    assert len(driver.prepare_calls) == 2


async def test_a_failing_batch_fails_its_callers_and_the_next_batch_runs() -> None:
    from drahealth.driver._prepare import _Batches

    lock = asyncio.Lock()
    seen: list[list[str]] = []

    async def locked(items: Sequence[Any]) -> tuple[dict[str, Any], None]:
        seen.append([i.uid for i in items])
        await asyncio.sleep(0.01)
        if any(i.uid == "bad" for i in items):
            raise RuntimeError("bug in the batch")
        return {i.uid: f"ok {i.uid}" for i in items}, None

    batches = _Batches(locked, lambda: lock, serialize=True)
    first = asyncio.create_task(batches.run([ClaimRef("ns", "a", "a")]))
    await asyncio.sleep(0)  # the first batch runs; the next two queue behind it
    bad = asyncio.create_task(batches.run([ClaimRef("ns", "b", "bad")]))
    other = asyncio.create_task(batches.run([ClaimRef("ns", "c", "c")]))
    assert await first == {"a": "ok a"}
    with pytest.raises(RuntimeError, match="bug in the batch"):
        await bad
    with pytest.raises(RuntimeError, match="bug in the batch"):  # same batch
        await other
    assert await batches.run([ClaimRef("ns", "d", "d")]) == {"d": "ok d"}
    assert seen == [["a"], ["bad", "c"], ["d"]]


def test_find_conflict_with_a_kept_index_matches_a_scan() -> None:
    # the batch planner keeps one device index for many claims; it must answer as a
    # scan of the records does, also after a restarted claim changed its devices
    from drahealth.driver._checkpoint import CheckpointDevice, ClaimEntry
    from drahealth.driver._prepare import (
        _add_device_users,
        _device_users,
        _remove_device_users,
    )

    state = _entries()
    users = _device_users(state)
    res = [AllocationResult("gpus", DRIVER, "node-1", "gpu-0")]
    assert find_conflict("me", res, state, users) == find_conflict("me", res, state)
    assert find_conflict("me", res, state, users) is not None
    moved = ClaimEntry(
        "ns", "o", ClaimState.PREPARE_STARTED, (CheckpointDevice("node-1", "gpu-1"),)
    )
    _remove_device_users(users, "other", state["other"])
    state["other"] = moved
    _add_device_users(users, "other", moved)
    assert find_conflict("me", res, state, users) is None
    assert find_conflict("me", res, state) is None


def test_a_claim_version_is_resolved_once_and_a_new_version_again(tmp_path: Path) -> None:
    p = ClaimPreparer(FakeDriver(), options(str(tmp_path)))
    v1 = make_claim(results=[result("gpu", device="gpu-0")])
    assert v1.metadata is not None
    v1.metadata.resourceVersion = "7"
    first = p._resolve(v1)
    assert [r.device for r in first] == ["gpu-0"]
    first.clear()  # what the driver gets is its own list
    assert [r.device for r in p._resolve(v1)] == ["gpu-0"]
    v2 = make_claim(results=[result("gpu", device="gpu-1")])
    assert v2.metadata is not None
    v2.metadata.resourceVersion = "8"
    assert [r.device for r in p._resolve(v2)] == ["gpu-1"]
    unversioned = make_claim(results=[result("gpu", device="gpu-2")])
    assert [r.device for r in p._resolve(unversioned)] == ["gpu-2"]


async def test_a_batch_writes_its_cdi_specs_side_by_side_and_a_failed_one_fails_alone(
    short_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    import time

    from drahealth.driver import _prepare
    from drahealth.driver._cdi import CDISpecs

    claims = [make_claim(f"u{i}", f"c{i}", results=[result("gpus", f"gpu-{i}")]) for i in range(12)]
    p = await loaded(FakeDriver(), options(short_dir, FakeClient(*claims)))
    real_write = CDISpecs.write
    lock = threading.Lock()
    active = {"now": 0, "max": 0}

    def slow_write(self: CDISpecs, claim_uid: str, devices: Any) -> list[str]:
        with lock:
            active["now"] += 1
            active["max"] = max(active["max"], active["now"])
        try:
            time.sleep(0.02)
            if claim_uid == "u3":
                raise OSError(28, "No space left on device")
            return real_write(self, claim_uid, devices)
        finally:
            with lock:
                active["now"] -= 1

    monkeypatch.setattr(CDISpecs, "write", slow_write)
    outs = await asyncio.gather(*(p.prepare([ref(c)]) for c in claims))
    errors = {uid: r.error for o in outs for uid, r in o.items()}
    assert errors["u3"] is not None and "No space left on device" in errors["u3"].message
    assert all(e is None for uid, e in errors.items() if uid != "u3")
    assert 2 <= active["max"] <= _prepare._CDI_WRITES_AT_ONCE
    states = {uid: e.state for uid, e in p.prepared_claims().items()}
    assert states.pop("u3") is ClaimState.PREPARE_STARTED  # prepared again on the next call
    assert states == {f"u{i}": ClaimState.PREPARE_COMPLETED for i in range(12) if i != 3}
    assert all(
        _is_file(f"{short_dir}/cdi/k8s.{DRIVER}-claim_u{i}.json") for i in range(12) if i != 3
    )


@pytest.mark.parametrize("serialize", [True, False])
async def test_a_failed_prepare_completed_write_fails_each_claim_not_the_call(
    short_dir: str, monkeypatch: pytest.MonkeyPatch, serialize: bool
) -> None:
    from drahealth.driver._checkpoint import Checkpoint

    claim = make_claim(results=[result("gpus", "gpu-0")])
    p = await loaded(FakeDriver(), options(short_dir, FakeClient(claim), serialize=serialize))
    real_write = Checkpoint.write
    writes = []

    def second_write_fails(self: Checkpoint, data: bytes) -> None:
        writes.append(data)
        if len(writes) == 2:  # PrepareStarted lands, PrepareCompleted does not
            raise OSError(5, "Input/output error")
        real_write(self, data)

    monkeypatch.setattr(Checkpoint, "write", second_write_fails)
    out = await p.prepare([ref(claim)])
    error = out["uid-1"].error
    assert error is not None
    assert error.message == (
        "recording prepared devices in the checkpoint: OSError: [Errno 5] Input/output error"
    )
    assert p.prepared_claims()["uid-1"].state is ClaimState.PREPARE_STARTED
