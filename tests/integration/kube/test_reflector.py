"""Reflector against the embedded API server: sync, propagation, selectors, 410
relist with synthetic events, reconnects."""

from __future__ import annotations

import asyncio
from typing import Any

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Namespace
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.kube import Reflector, make_client, strip_managed_fields

from .conftest import eventually

Seen = list[tuple[str, str, str | None, str | None]]


def cm(
    name: str, ns: str = "default", labels: dict[str, str] | None = None, **data: str
) -> ConfigMap:
    return ConfigMap(metadata=ObjectMeta(name=name, namespace=ns, labels=labels), data=data)


def recorder(seen: Seen) -> Any:
    def handler(etype: str, obj: ConfigMap, old: ConfigMap | None) -> None:
        assert obj.metadata is not None
        seen.append(
            (
                etype,
                obj.metadata.name or "",
                obj.metadata.resourceVersion,
                old.metadata.resourceVersion if old is not None and old.metadata else None,
            )
        )

    return handler


def names(r: Reflector[ConfigMap]) -> list[str]:
    return [name for _, name in r.store]


async def test_sync_and_propagation(client: AsyncClient) -> None:
    for i in range(3):
        await client.create(cm(f"pre-{i}", k=str(i)))
    seen: Seen = []
    r = Reflector(client, ConfigMap, namespace="default")
    r.add_handler(recorder(seen))
    async with r:
        await r.wait_synced(5)
        assert names(r) == ["pre-0", "pre-1", "pre-2"]
        assert [e[:2] for e in seen] == [("ADDED", f"pre-{i}") for i in range(3)]
        assert r.last_resource_version is not None

        created = await client.create(cm("new", k="v"))
        await eventually(lambda: r.store.get("default", "new") is not None)
        got = r.store.get("default", "new")
        assert got is not None and got.data == {"k": "v"}
        assert got.metadata is not None and created.metadata is not None
        assert got.metadata.resourceVersion == created.metadata.resourceVersion

        patched = await client.patch(
            ConfigMap, "new", {"data": {"k": "w"}}, namespace="default", patch_type=PatchType.MERGE
        )
        assert patched.metadata is not None
        await eventually(
            lambda: (o := r.store.get("default", "new")) is not None and o.data == {"k": "w"}
        )
        await client.delete(ConfigMap, "pre-1", namespace="default")
        await eventually(lambda: r.store.get("default", "pre-1") is None)

        tail = seen[3:]
        assert [e[:2] for e in tail] == [
            ("ADDED", "new"),
            ("MODIFIED", "new"),
            ("DELETED", "pre-1"),
        ]
        assert tail[1][3] == created.metadata.resourceVersion  # old object passed along
        assert tail[1][2] == patched.metadata.resourceVersion
        assert r.lists == 1 and r.relists == 0
    assert not r.running


async def test_event_stream(client: AsyncClient) -> None:
    r = Reflector(client, ConfigMap, namespace="default")
    async with r, r.events() as stream:
        await r.wait_synced(5)
        await client.create(cm("a"))
        await client.delete(ConfigMap, "a", namespace="default")
        got = []
        async for ev in stream:
            got.append((ev.type, ev.obj.metadata.name if ev.obj.metadata else None))
            if len(got) == 2:
                break
    assert got == [("ADDED", "a"), ("DELETED", "a")]


async def test_label_selector_transitions(client: AsyncClient) -> None:
    await client.create(cm("match", labels={"app": "x"}))
    await client.create(cm("other", labels={"app": "y"}))
    seen: Seen = []
    r = Reflector(client, ConfigMap, namespace="default", labels={"app": "x"})
    r.add_handler(recorder(seen))
    async with r:
        await r.wait_synced(5)
        assert names(r) == ["match"]
        # other starts matching -> ADDED; match stops matching -> DELETED
        await client.patch(
            ConfigMap,
            "other",
            {"metadata": {"labels": {"app": "x"}}},
            namespace="default",
            patch_type=PatchType.MERGE,
        )
        await client.patch(
            ConfigMap,
            "match",
            {"metadata": {"labels": {"app": "z"}}},
            namespace="default",
            patch_type=PatchType.MERGE,
        )
        await eventually(lambda: names(r) == ["other"])
        assert [e[:2] for e in seen] == [
            ("ADDED", "match"),
            ("ADDED", "other"),
            ("DELETED", "match"),
        ]


async def test_field_selector_and_string_selectors(client: AsyncClient) -> None:
    await client.create(cm("one"))
    await client.create(cm("two"))
    r = Reflector(client, ConfigMap, fields={"metadata.name": "two"})
    r2 = Reflector(
        client, ConfigMap, namespace="default", labels="app notin (q)", fields="metadata.name!=two"
    )
    async with r, r2:
        await r.wait_synced(5)
        await r2.wait_synced(5)
        assert names(r) == ["two"]
        assert names(r2) == ["one"]
        await client.patch(
            ConfigMap, "two", {"data": {"a": "b"}}, namespace="default", patch_type=PatchType.MERGE
        )
        await eventually(
            lambda: (o := r.store.get("default", "two")) is not None and o.data == {"a": "b"}
        )
        assert names(r2) == ["one"]


async def test_namespace_scope(client: AsyncClient) -> None:
    for ns in ("ns-a", "ns-b"):
        await client.create(Namespace(metadata=ObjectMeta(name=ns)))
        await client.create(cm("x", ns=ns))
    only_a = Reflector(client, ConfigMap, namespace="ns-a")
    everywhere = Reflector(client, ConfigMap)
    async with only_a, everywhere:
        await only_a.wait_synced(5)
        await everywhere.wait_synced(5)
        await client.create(cm("y", ns="ns-b"))
        await eventually(lambda: ("ns-b", "y") in everywhere.store)
        assert list(only_a.store) == [("ns-a", "x")]
        assert {("ns-a", "x"), ("ns-b", "x"), ("ns-b", "y")} <= set(everywhere.store)


async def test_relist_after_410_emits_difference(server: APIServer, client: AsyncClient) -> None:
    for name in ("keep", "change", "gone"):
        await client.create(cm(name, v="1"))
    seen: Seen = []
    # a fixed 1 s reconnect delay keeps the watch away while the server changes
    r = Reflector(
        client,
        ConfigMap,
        namespace="default",
        backoff_initial=1.0,
        backoff_max=1.0,
        rng=lambda: 0.0,
    )
    r.add_handler(recorder(seen))
    async with r:
        await r.wait_synced(5)
        seen.clear()
        r._drop_connection()
        await eventually(lambda: r.reconnects == 1, within=2)
        await client.patch(
            ConfigMap,
            "change",
            {"data": {"v": "2"}},
            namespace="default",
            patch_type=PatchType.MERGE,
        )
        await client.delete(ConfigMap, "gone", namespace="default")
        await client.create(cm("added", v="1"))
        server.compact()
        await eventually(lambda: r.relists == 1, within=5)
        await eventually(lambda: names(r) == ["added", "change", "keep"])
        assert sorted(e[:2] for e in seen) == [
            ("ADDED", "added"),
            ("DELETED", "gone"),
            ("MODIFIED", "change"),
        ]
        changed = r.store.get("default", "change")
        assert changed is not None and changed.data == {"v": "2"}
        # and the watch works again afterwards
        await client.create(cm("later"))
        await eventually(lambda: "later" in names(r))


async def test_reconnect_after_server_restart(server: APIServer) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    client = make_client(server_url=server.url, timeout=2.0)
    r = Reflector(client, ConfigMap, namespace="default", backoff_initial=0.05, backoff_max=0.2)
    try:
        async with r:
            await r.wait_synced(5)
            await client.create(cm("before"))
            await eventually(lambda: names(r) == ["before"])
            await server.stop()
            await asyncio.sleep(0.3)
            await server.start(host="127.0.0.1", port=port)
            await client.create(cm("after"))
            await eventually(lambda: names(r) == ["after", "before"], within=10)
            assert r.reconnects >= 1
    finally:
        await client.close()


async def test_server_restarted_with_lower_resource_version_is_relisted(
    server: APIServer,
) -> None:
    """A server that comes back behind the reflector (older data, or none) answers its
    resumed watch "Too large resource version"; the reflector relists and ends up with the
    server's real state, even where the new objects carry reused, lower resourceVersions."""
    port = int(server.url.rsplit(":", 1)[1])
    client = make_client(server_url=server.url, timeout=2.0)
    r = Reflector(client, ConfigMap, namespace="default", backoff_initial=0.05, backoff_max=0.2)
    try:
        async with r:
            await r.wait_synced(5)
            await client.create(cm("shared", v="old"))
            await client.create(cm("stale"))
            for i in range(20):  # push the resourceVersion well past the new server's
                await client.patch(
                    ConfigMap, "shared", {"data": {"v": f"old-{i}"}}, namespace="default",
                    patch_type=PatchType.MERGE,
                )  # fmt: skip
            await eventually(lambda: names(r) == ["shared", "stale"])
            await server.stop()
            again = APIServer(data_file=None)  # the same address, none of the old data
            await again.start(host="127.0.0.1", port=port)
            try:
                await client.create(cm("shared", v="new"))
                await client.create(cm("fresh"))

                def real_state() -> bool:
                    shared = r.store.get("default", "shared")
                    return (
                        names(r) == ["fresh", "shared"]
                        and shared is not None
                        and shared.data == {"v": "new"}
                    )

                await eventually(real_state, within=10)
                assert r.relists >= 1
                await client.create(cm("later"))  # and the new watch delivers
                await eventually(lambda: names(r) == ["fresh", "later", "shared"], within=5)
            finally:
                await again.stop()
    finally:
        await client.close()


async def test_transform_strips_managed_fields_from_listed_and_watched_objects(
    client: AsyncClient,
) -> None:
    """The server tracks field ownership on every write; a cache that never writes back
    keeps none of it (``strip_managed_fields``), both for what the LIST returned and for
    what the watch delivers, while an untransformed reflector keeps it."""
    await client.create(cm("listed", k="v"))
    plain = Reflector(client, ConfigMap, namespace="default")
    stripped = Reflector(client, ConfigMap, namespace="default", transform=strip_managed_fields)
    handed: list[Any] = []
    stripped.add_handler(lambda _t, obj, _old: handed.append(obj.metadata.managedFields))
    async with plain, stripped:
        await plain.wait_synced(5)
        await stripped.wait_synced(5)
        await client.create(cm("watched", k="v"))
        for name in ("listed", "watched"):
            await eventually(lambda n=name: stripped.store.get("default", n) is not None)  # type: ignore[misc]
            await eventually(lambda n=name: plain.store.get("default", n) is not None)  # type: ignore[misc]
            kept, gone = plain.store.get("default", name), stripped.store.get("default", name)
            assert kept is not None and kept.metadata is not None and kept.metadata.managedFields
            assert gone is not None and gone.metadata is not None
            assert gone.metadata.managedFields is None
            assert gone.data == {"k": "v"} and gone.metadata.uid == kept.metadata.uid
    assert handed == [None, None]
