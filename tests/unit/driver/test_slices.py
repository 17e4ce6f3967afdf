"""Pure ResourceSlice planning: limits, splitting, names, generations, taint times."""

from __future__ import annotations

import datetime as dt
import itertools

import msgspec
import pytest
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.models.resource_v1 import (
    Counter,
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceCounterConsumption,
    DeviceTaint,
)
from lightkube.resources.resource_v1 import ResourceSlice

from drahealth.driver._publisher import DroppedFieldsError
from drahealth.driver._slices import (
    DriverResources,
    Pool,
    PoolPlan,
    SliceValidationError,
    decode_index,
    devices_equal,
    generate_name,
    index_length,
    merge_taints,
    plan,
    plan_pool,
    split_pool,
    truncate_time,
    validate_pool,
)

DRIVER = "gpu.example.com"
NODE = "node-1"
OWNER = OwnerReference(apiVersion="v1", kind="Node", name=NODE, uid="node-uid", controller=True)
T0 = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)


def dev(i: int, **kw: object) -> Device:
    return Device(name=f"gpu-{i}", **kw)  # type: ignore[arg-type]


def taint(key: str = "gpu.example.com/unhealthy", **kw: object) -> DeviceTaint:
    return DeviceTaint(key=key, effect=str(kw.pop("effect", "NoSchedule")), **kw)  # type: ignore[arg-type]


def sizes(pool: Pool) -> list[int]:
    return [len(c.devices) for c in split_pool("pool", pool)]


# --------------------------------------------------------------------------- splitting


def test_exactly_128_devices_fit_one_slice_and_129_split() -> None:
    assert sizes(Pool([dev(i) for i in range(128)])) == [128]
    assert sizes(Pool([dev(i) for i in range(129)])) == [128, 1]


def test_one_tainted_device_lowers_the_limit_to_64() -> None:
    devices = [dev(i) for i in range(64)]
    devices[5] = dev(5, taints=[taint()])
    assert sizes(Pool(devices)) == [64]
    devices.append(dev(64))
    assert sizes(Pool(devices)) == [64, 1]


def test_tainted_device_late_in_a_full_slice_starts_a_new_slice() -> None:
    devices = [dev(i) for i in range(300)]
    devices[100] = dev(100, taints=[taint()])
    slices = split_pool("pool", Pool(devices))
    assert [len(c.devices) for c in slices] == [100, 64, 128, 8]
    for c in slices:
        limit = 64 if any(d.taints for d in c.devices) else 128
        assert len(c.devices) <= limit
    names = [d.name for c in slices for d in c.devices]
    assert names == [f"gpu-{i}" for i in range(300)]  # driver order kept


@pytest.mark.parametrize(
    "advanced",
    [
        {"consumesCounters": [DeviceCounterConsumption(counterSet="mem", counters={})]},
        {"attributes": {"ids": DeviceAttribute(ints=[1, 2])}},
    ],
)
def test_counter_consumption_and_list_attributes_lower_the_limit(
    advanced: dict[str, object],
) -> None:
    devices = [dev(i) for i in range(65)]
    devices[0] = dev(0, **advanced)
    pool = Pool(devices, shared_counters=[CounterSet(name="mem", counters={})])
    assert [len(c.devices) for c in split_pool("pool", pool) if not c.shared_counters] == [64, 1]


def test_expect_taints_reserves_room_for_taints() -> None:
    assert sizes(Pool([dev(i) for i in range(129)], expect_taints=True)) == [64, 64, 1]


def test_shared_counters_get_their_own_slices_first() -> None:
    sets = [CounterSet(name=f"set-{i}", counters={"mem": Counter(value="1Gi")}) for i in range(10)]
    devices = [dev(0, consumesCounters=[DeviceCounterConsumption(counterSet="set-9", counters={})])]
    slices = split_pool("pool", Pool(devices, shared_counters=sets))
    assert [(len(c.shared_counters), len(c.devices)) for c in slices] == [(8, 0), (2, 0), (0, 1)]
    assert all(not (c.shared_counters and c.devices) for c in slices)


def test_empty_pool_publishes_one_empty_slice() -> None:
    slices = split_pool("pool", Pool())
    assert len(slices) == 1 and slices[0].devices == () and slices[0].shared_counters == ()
    [(_, obj)] = plan_pool(DRIVER, "pool", slices, []).create
    assert obj.spec.devices == []


def test_split_is_deterministic_and_leaves_the_input_alone() -> None:
    t = DeviceTaint(key="a.example.com/x", effect="NoSchedule", timeAdded=T0.replace(microsecond=7))
    devices = [dev(i, taints=[t]) for i in range(70)]
    before = msgspec.to_builtins(devices)
    a, b = split_pool("pool", Pool(devices)), split_pool("pool", Pool(devices))
    assert a == b
    assert msgspec.to_builtins(devices) == before
    assert a[0].devices[0].taints[0].timeAdded == T0  # type: ignore[index]


# --------------------------------------------------------------------------- validation


def test_seventeen_taints_are_rejected_naming_the_device() -> None:
    taints = [taint(f"gpu.example.com/t{i}") for i in range(17)]
    with pytest.raises(SliceValidationError) as err:
        split_pool("pool", Pool([dev(0), dev(1, taints=taints)]))
    assert (err.value.pool, err.value.device, err.value.field) == ("pool", "gpu-1", "taints")
    assert "17" in str(err.value) and "gpu-1" in str(err.value)
    split_pool("pool", Pool([dev(1, taints=taints[:16])]))


def test_thirty_three_attributes_and_capacities_are_rejected() -> None:
    attrs = {f"a{i}": DeviceAttribute(int=i) for i in range(20)}
    caps = {f"c{i}": DeviceCapacity(value="1") for i in range(13)}
    with pytest.raises(SliceValidationError) as err:
        split_pool("pool", Pool([dev(0, attributes=attrs, capacity=caps)]))
    assert err.value.device == "gpu-0"
    assert err.value.field == "attributes+capacity"
    assert "33" in str(err.value)
    caps.pop("c0")
    split_pool("pool", Pool([dev(0, attributes=attrs, capacity=caps)]))


@pytest.mark.parametrize(
    ("pool", "field"),
    [
        (Pool([dev(0), dev(0)]), "name"),
        (Pool([Device(name="Bad_Name")]), "name"),
        (Pool([dev(0, taints=[taint(effect="PreferNoSchedule")])]), "taints[0].effect"),
        (Pool([dev(0, taints=[taint(value="free text!")])]), "taints[0].value"),
        (Pool([dev(0, taints=[taint(key="no spaces/x y")])]), "taints[0].key"),
        (
            Pool([dev(0, attributes={"s": DeviceAttribute(string="x" * 65)})]),
            "attributes['s'].string",
        ),
        (Pool([dev(0, attributes={"s": DeviceAttribute()})]), "attributes['s']"),
        (
            Pool(
                [
                    dev(
                        0,
                        consumesCounters=[
                            DeviceCounterConsumption(counterSet="a", counters={}) for _ in range(3)
                        ],
                    )
                ],
                shared_counters=[CounterSet(name="a", counters={})],
            ),
            "consumesCounters",
        ),
        (
            Pool(
                [
                    dev(
                        0,
                        consumesCounters=[DeviceCounterConsumption(counterSet="nope", counters={})],
                    )
                ]
            ),
            "consumesCounters[0].counterSet",
        ),
        (
            Pool(
                [
                    dev(
                        0,
                        consumesCounters=[
                            DeviceCounterConsumption(
                                counterSet="a", counters={"x": Counter(value="1")}
                            )
                        ],
                    )
                ],
                shared_counters=[CounterSet(name="a", counters={"y": Counter(value="1")})],
            ),
            "consumesCounters[0].counters",
        ),
        (
            Pool(
                shared_counters=[
                    CounterSet(name="a", counters={}),
                    CounterSet(name="a", counters={}),
                ]
            ),
            "sharedCounters[1].name",
        ),
        (
            Pool(
                shared_counters=[
                    CounterSet(name="a", counters={f"c{i}": Counter(value="1") for i in range(33)})
                ]
            ),
            "sharedCounters[0].counters",
        ),
        (Pool([dev(0, bindingConditions=["a", "b", "c", "d", "e"])]), "bindingConditions"),
    ],
)
def test_every_limit_violation_names_its_field(pool: Pool, field: str) -> None:
    with pytest.raises(SliceValidationError) as err:
        split_pool("pool", pool)
    assert err.value.field == field
    assert err.value.pool == "pool"


def test_validate_pool_accepts_models_as_given() -> None:
    validate_pool("pool", Pool([dev(0, attributes={"ids": DeviceAttribute(ints=[1])})]))
    with pytest.raises(SliceValidationError, match="exactly one"):
        validate_pool("pool", Pool([dev(0, attributes={"x": DeviceAttribute(int=1, string="a")})]))


def test_invalid_pool_name_is_rejected() -> None:
    with pytest.raises(SliceValidationError, match=r"pool\.name"):
        split_pool("Not/Valid", Pool())


# --------------------------------------------------------------------------- names


def test_generate_name_is_index_prefixed_like_upstream() -> None:
    assert generate_name(0, 5, DRIVER, NODE) == "00000-gpu.example.com-node-1-"
    assert generate_name(26, 5, DRIVER, None) == "0001a-gpu.example.com-"
    assert index_length(1) == 5 and index_length(0x100000) == 5 and index_length(0x100001) == 6
    assert decode_index("0001a-gpu.example.com-node-1-abcde", 5) == 26
    assert decode_index("0001a-x", 6) is None
    assert decode_index("gpu-node-1-xyz", 5) is None
    assert decode_index("zzzzz-x", 5) is None


# --------------------------------------------------------------------------- planning


class FakeServer:
    """Applies plans the way the API server would (names, uids, rvs, timeAdded)."""

    def __init__(self) -> None:
        self.objects: dict[str, ResourceSlice] = {}
        self.rv = itertools.count(100)
        self.suffix = itertools.count()

    def apply(self, p: PoolPlan, now: dt.datetime = T0) -> None:
        for obj in p.delete:
            assert obj.metadata is not None and obj.metadata.name is not None
            del self.objects[obj.metadata.name]
        for _, obj in p.update:
            assert obj.metadata is not None and obj.metadata.name in self.objects
            self.store(obj, obj.metadata.name, obj.metadata.uid or "", now)
        for _, obj in p.create:
            assert obj.metadata is not None and obj.metadata.generateName
            name = f"{obj.metadata.generateName}{next(self.suffix):05d}"
            self.store(obj, name, f"uid-{name}", now)

    def store(self, obj: ResourceSlice, name: str, uid: str, now: dt.datetime) -> None:
        copy = msgspec.convert(msgspec.to_builtins(obj), ResourceSlice)
        assert copy.metadata is not None
        copy.metadata = ObjectMeta(
            name=name,
            uid=uid,
            resourceVersion=str(next(self.rv)),
            ownerReferences=copy.metadata.ownerReferences,
        )
        for d in copy.spec.devices or ():
            for t in d.taints or ():
                if t.timeAdded is None:
                    t.timeAdded = now
        self.objects[name] = copy

    def slices(self) -> list[ResourceSlice]:
        return [self.objects[k] for k in sorted(self.objects)]

    def sync(self, pool: Pool, now: dt.datetime = T0) -> PoolPlan:
        p = plan_pool(
            DRIVER,
            "pool",
            split_pool("pool", pool),
            self.slices(),
            node_name=NODE,
            owner=OWNER,
            min_generation=pool.generation,
        )
        self.apply(p, now)
        return p


def test_first_publish_creates_index_named_owned_slices() -> None:
    server = FakeServer()
    p = server.sync(Pool([dev(i) for i in range(300)]))
    assert (p.generation, p.slice_count, len(p.create), p.update, p.delete) == (1, 3, 3, [], [])
    for i, obj in p.create:
        assert obj.metadata is not None
        assert obj.metadata.generateName == f"0000{i}-{DRIVER}-{NODE}-"
        assert obj.metadata.ownerReferences == [OWNER]
        assert obj.spec.nodeName == NODE and obj.spec.allNodes is None
        assert obj.spec.pool.resourceSliceCount == 3 and obj.spec.pool.generation == 1
    assert [len(o.spec.devices or []) for o in server.slices()] == [128, 128, 44]
    assert server.sync(Pool([dev(i) for i in range(300)])).in_sync


def test_single_slice_change_keeps_generation_two_changes_bump() -> None:
    server = FakeServer()
    devices = [dev(i) for i in range(300)]
    server.sync(Pool(devices))
    devices[200] = dev(200, attributes={"model": DeviceAttribute(string="h100")})
    p = server.sync(Pool(devices))
    assert p.generation == 1 and [i for i, _ in p.update] == [1] and not p.create
    devices[0] = dev(0, attributes={"model": DeviceAttribute(string="h100")})
    devices[299] = dev(299, attributes={"model": DeviceAttribute(string="h100")})
    p = server.sync(Pool(devices))
    assert p.generation == 2 and [i for i, _ in p.update] == [0, 1, 2]
    assert {o.spec.pool.generation for o in server.slices()} == {2}


def test_new_slice_bumps_generation_and_shrinking_deletes_surplus() -> None:
    server = FakeServer()
    server.sync(Pool([dev(i) for i in range(128)]))
    p = server.sync(Pool([dev(i) for i in range(129)]))
    assert p.generation == 2 and len(p.create) == 1 and len(p.update) == 1
    # shrinking: surplus slice deleted, one slice updated -> generation kept (upstream)
    p = server.sync(Pool([dev(i) for i in range(10)]))
    assert p.generation == 2 and len(p.delete) == 1 and len(p.update) == 1
    [only] = server.slices()
    assert only.spec.pool.resourceSliceCount == 1


def test_driver_generation_wins_when_higher_and_lower_generations_are_obsolete() -> None:
    server = FakeServer()
    server.sync(Pool([dev(0)]))
    p = server.sync(Pool([dev(0)], generation=7))
    assert p.generation == 7 and len(p.update) == 1
    stale = msgspec.convert(msgspec.to_builtins(server.slices()[0]), ResourceSlice)
    stale.spec.pool.generation = 3
    assert stale.metadata is not None
    stale.metadata.name = "00000-old"
    server.objects["00000-old"] = stale
    p = server.sync(Pool([dev(0)], generation=7))
    assert [o.metadata.name for o in p.delete if o.metadata] == ["00000-old"]
    assert p.generation == 7 and not p.update and not p.create


def test_unindexed_names_are_replaced() -> None:
    server = FakeServer()
    server.sync(Pool([dev(0)]))
    [obj] = server.slices()
    assert obj.metadata is not None
    server.objects = {"node-1-gpu.example.com-legacy": obj}
    obj.metadata.name = "node-1-gpu.example.com-legacy"
    p = server.sync(Pool([dev(0)]))
    assert len(p.delete) == 1 and len(p.create) == 1 and p.generation == 2


def test_reordering_devices_is_a_change() -> None:
    server = FakeServer()
    server.sync(Pool([dev(0), dev(1)]))
    p = server.sync(Pool([dev(1), dev(0)]))
    assert len(p.update) == 1 and p.generation == 1


def test_pool_removal_deletes_all_its_slices() -> None:
    server = FakeServer()
    server.sync(Pool([dev(i) for i in range(200)]))
    plans = plan(DRIVER, DriverResources({}), server.slices(), node_name=NODE)
    assert len(plans) == 1 and len(plans[0].delete) == 2


def test_quantities_compare_by_value() -> None:
    server = FakeServer()
    server.sync(Pool([dev(0, capacity={"memory": DeviceCapacity(value="1Gi")})]))
    assert server.sync(Pool([dev(0, capacity={"memory": DeviceCapacity(value="1024Mi")})])).in_sync
    assert not server.sync(Pool([dev(0, capacity={"memory": DeviceCapacity(value="2Gi")})])).in_sync


# --------------------------------------------------------------------------- taint times


def test_driver_times_are_truncated_to_seconds() -> None:
    assert truncate_time(T0.replace(microsecond=999_999)) == T0
    assert truncate_time(dt.datetime(2026, 1, 1, 1, 1, 1, 5)).tzinfo == dt.UTC
    t = taint(timeAdded=T0.replace(microsecond=600_000))
    [content] = split_pool("pool", Pool([dev(0, taints=[t])]))
    assert content.devices[0].taints == [taint(timeAdded=T0)]


def test_server_filled_time_added_causes_no_update_and_is_preserved() -> None:
    server = FakeServer()
    server.sync(Pool([dev(0, taints=[taint()])]), now=T0)
    [obj] = server.slices()
    assert obj.spec.devices and obj.spec.devices[0].taints
    assert obj.spec.devices[0].taints[0].timeAdded == T0
    later = T0 + dt.timedelta(hours=1)
    # unchanged taint without a time: nothing to do (no update loop)
    assert server.sync(Pool([dev(0, taints=[taint()])]), now=later).in_sync
    # another change in the same slice: the update carries the server's time
    p = server.sync(
        Pool([dev(0, taints=[taint()], attributes={"a": DeviceAttribute(int=1)})]), now=later
    )
    [(_, updated)] = p.update
    assert updated.spec.devices and updated.spec.devices[0].taints
    assert updated.spec.devices[0].taints[0].timeAdded == T0
    [obj] = server.slices()
    assert obj.spec.devices and obj.spec.devices[0].taints
    assert obj.spec.devices[0].taints[0].timeAdded == T0


def test_time_added_survives_a_resplit_into_new_slices() -> None:
    server = FakeServer()
    devices = [dev(i) for i in range(130)]
    devices[129] = dev(129, taints=[taint()])
    server.sync(Pool(devices), now=T0)  # [128 devices] [2 devices, one tainted]
    devices[:0] = [dev(1000 + i) for i in range(100)]
    p = server.sync(Pool(devices), now=T0 + dt.timedelta(minutes=5))
    # [128] [101] [1 tainted]: the tainted device lands in a newly created slice
    assert p.generation == 2 and [i for i, _ in p.create] == [2]
    assert [len(o.spec.devices or []) for o in server.slices()] == [128, 101, 1]
    found = [
        t.timeAdded for o in server.slices() for d in o.spec.devices or () for t in d.taints or ()
    ]
    assert found == [T0]


def test_a_changed_taint_value_is_a_new_taint() -> None:
    server = FakeServer()
    server.sync(Pool([dev(0, taints=[taint(value="xid-79")])]), now=T0)
    later = T0 + dt.timedelta(minutes=1)
    server.sync(Pool([dev(0, taints=[taint(value="xid-48")])]), now=later)
    [obj] = server.slices()
    assert obj.spec.devices and obj.spec.devices[0].taints
    assert obj.spec.devices[0].taints[0].timeAdded == later


def test_devices_equal_tolerates_unset_and_rounded_times() -> None:
    a = [dev(0, taints=[taint(timeAdded=T0)])]
    assert devices_equal(a, [dev(0, taints=[taint()])])
    assert devices_equal(a, [dev(0, taints=[taint(timeAdded=T0 + dt.timedelta(seconds=1))])])
    assert not devices_equal(a, [dev(0, taints=[taint(timeAdded=T0 + dt.timedelta(seconds=5))])])
    assert not devices_equal(a, [dev(0, taints=[taint(effect="NoExecute")])])


def test_merge_taints_appends_dedupes_and_ignores_unknown_devices() -> None:
    own = taint("gpu.example.com/driver")
    res = DriverResources({"pool": Pool([dev(0, taints=[own]), dev(1)])})
    merged = merge_taints(
        res,
        {
            ("pool", "gpu-0"): [taint("gpu.example.com/driver"), taint()],
            ("pool", "gpu-1"): [taint()],
            ("pool", "missing"): [taint()],
        },
    )
    d0, d1 = merged.pools["pool"].devices
    assert [t.key for t in d0.taints or []] == [
        "gpu.example.com/driver",
        "gpu.example.com/unhealthy",
    ]
    assert [t.key for t in d1.taints or []] == ["gpu.example.com/unhealthy"]
    assert res.pools["pool"].devices[1].taints is None  # input untouched


def test_dropped_fields_name_the_disabled_features() -> None:
    want = plan_pool(
        DRIVER,
        "pool",
        split_pool(
            "pool",
            Pool(
                [
                    dev(
                        0,
                        taints=[taint()],
                        allowMultipleAllocations=True,
                        consumesCounters=[DeviceCounterConsumption(counterSet="a", counters={})],
                    )
                ],
                shared_counters=[CounterSet(name="a", counters={})],
            ),
        ),
        [],
    ).create[1][1]
    have = msgspec.convert(msgspec.to_builtins(want), ResourceSlice)
    assert have.spec.devices
    have.spec.devices[0] = dev(0)
    err = DroppedFieldsError("pool", 1, want, have)
    assert err.disabled_features() == [
        "DRADeviceTaints",
        "DRAPartitionableDevices",
        "DRAConsumableCapacity",
    ]
    assert "DRADeviceTaints" in str(err) and "slice #1" in str(err)
