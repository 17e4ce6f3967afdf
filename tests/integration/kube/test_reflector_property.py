"""Property: whatever mix of writes, compactions (410s) and dropped watch connections
happens, once things settle the reflector's store equals the server's state, and
replaying the events it emitted reproduces that store."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.kube import Reflector, is_already_exists, is_not_found, make_client

NAMES = [f"cm-{i}" for i in range(5)]

Op = tuple[str, str, int]

base_op = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(NAMES), st.integers(0, 9)),
    st.tuples(st.just("update"), st.sampled_from(NAMES), st.integers(0, 9)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES), st.just(0)),
    st.tuples(st.just("compact"), st.just(""), st.just(0)),
    st.tuples(st.just("pause"), st.just(""), st.integers(1, 30)),
)
# an op is a base op, a dropped watch connection (the reflector reconnects at once,
# after its backoff), or an outage: the watch is down while the inner ops happen
op = st.one_of(
    base_op.map(lambda o: [o]),
    st.just([("drop", "", 0)]),
    st.tuples(st.lists(base_op, min_size=1, max_size=5), st.booleans()).map(
        lambda t: [
            ("outage", "", 0),
            *t[0],
            *([("compact", "", 0)] if t[1] else []),
            ("resume", "", 0),
        ]
    ),
)

STATS = {"examples": 0, "relists": 0, "reconnects": 0}
OUTAGE_WITH_410: list[list[Op]] = [  # always run: an outage that must end in a relist
    [("create", "cm-0", 1), ("create", "cm-1", 1)],
    [("update", "cm-3", 0)],
    [
        ("outage", "", 0),
        ("update", "cm-0", 2),
        ("delete", "cm-1", 0),
        ("create", "cm-2", 3),
        ("compact", "", 0),
        ("resume", "", 0),
    ],
]


def _state(objs: Any) -> dict[str, tuple[str | None, dict[str, str] | None]]:
    out = {}
    for o in objs:
        assert o.metadata is not None and o.metadata.name
        out[o.metadata.name] = (o.metadata.resourceVersion, o.data)
    return out


async def _apply_op(
    client: AsyncClient, r: Reflector[ConfigMap], server: APIServer, kind: str, name: str, n: int
) -> None:
    try:
        if kind == "create":
            await client.create(
                ConfigMap(metadata=ObjectMeta(name=name, namespace="default"), data={"v": str(n)})
            )
        elif kind == "update":
            await client.patch(
                ConfigMap,
                name,
                {"data": {"v": str(n), f"k{n}": "x"}},
                namespace="default",
                patch_type=PatchType.MERGE,
            )
        elif kind == "delete":
            await client.delete(ConfigMap, name, namespace="default")
        elif kind == "compact":
            server.compact()
        elif kind == "drop":
            r._drop_connection()
        elif kind == "outage":
            r._drop_connection(hold=True)
        elif kind == "resume":
            r._resume()
        elif kind == "pause":
            await asyncio.sleep(n / 1000)
    except Exception as exc:  # writes to missing / existing names are expected to fail
        if not (is_not_found(exc) or is_already_exists(exc)):
            raise


async def _scenario(groups: list[list[Op]]) -> None:
    server = APIServer(data_file=None, watch_window=1000)
    await server.start(host="127.0.0.1", port=0)
    client = make_client(server_url=server.url, timeout=5.0)
    r = Reflector(client, ConfigMap, namespace="default", backoff_initial=0.01, backoff_max=0.05)
    shadow: dict[str, ConfigMap] = {}
    last_rv: dict[str, int] = {}

    def handler(etype: str, obj: ConfigMap, old: ConfigMap | None) -> None:
        assert obj.metadata is not None and obj.metadata.name
        name, rv = obj.metadata.name, int(obj.metadata.resourceVersion or 0)
        # never an older object after a newer one
        assert rv > last_rv.get(name, 0) or (etype == "DELETED" and rv >= last_rv.get(name, 0))
        last_rv[name] = rv
        if etype == "DELETED":
            assert name in shadow, f"DELETED for unknown {name}"
            del shadow[name]
        else:
            assert (etype == "ADDED") == (name not in shadow), f"{etype} {name}"
            shadow[name] = obj

    r.add_handler(handler)
    try:
        # the first third of the ops happen before the reflector starts
        third = len(groups) // 3
        for kind, name, n in (o for g in groups[:third] for o in g):
            if kind not in ("drop", "outage", "resume"):
                await _apply_op(client, r, server, kind, name, n)
        async with r:
            await r.wait_synced(5)
            for kind, name, n in (o for g in groups[third:] for o in g):
                await _apply_op(client, r, server, kind, name, n)
            # quiescence: the reflector has caught up with the server's resourceVersion
            listing = client.list(ConfigMap, namespace="default")
            server_objs = [o async for o in listing]
            server_rv = int(listing.resourceVersion)
            deadline = time.monotonic() + 10
            while int(r.last_resource_version or 0) < server_rv:
                assert time.monotonic() < deadline, (r.last_resource_version, server_rv)
                await asyncio.sleep(0.005)
            assert _state(r.store.list()) == _state(server_objs)
            assert _state(shadow.values()) == _state(server_objs)
            STATS["relists"] += r.relists
            STATS["reconnects"] += r.reconnects
            STATS["examples"] += 1
    finally:
        await client.close()
        await server.stop()


@pytest.mark.timeout(120)
@settings(
    deadline=None,
    max_examples=30,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(groups=st.lists(op, min_size=1, max_size=30))
@example(groups=OUTAGE_WITH_410)
def test_store_converges_to_server_state(groups: list[list[Op]]) -> None:
    asyncio.run(_scenario(groups))


def test_property_exercised_recovery_paths() -> None:
    """Runs after the property test (same module, file order): the random scenarios
    must actually have hit 410 relists and reconnects, or the property proves little."""
    if STATS["examples"] == 0:
        pytest.skip("property test did not run")
    assert STATS["relists"] > 0
    assert STATS["reconnects"] > 0
