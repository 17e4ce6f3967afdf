"""drahealth's Kubernetes client stack (lightkube client, :class:`Reflector`) against the
real kube-apiserver and its real etcd.

Each test prints what the real server answered (``client-stack <release>: ...``): those
lines are the facts behind "Against the real API server" in docs/kube.md.

- etcd compaction while reflectors watch: an open watch survives it; a watch resumed from
  a compacted resourceVersion is served from the watch cache for ConfigMaps (no 410 at
  all) and answered ``410 Expired`` for Events (no watch cache), where the reflector
  relists; both end with exactly the server's objects.
- bookmarks: the real server sends one shortly before a watch's ``timeoutSeconds``; the
  reflector's resourceVersion advances on it and its next watch resumes from there.
- a resourceVersion from the future: LIST waits 3 s, then 504 ``Timeout`` with cause
  ``ResourceVersionTooLarge``; a WATCH stays silent (a watch-list gets an ERROR event);
  the embedded server answers the same; the reflector notices and relists.
- every served ``resource.k8s.io`` version of every DRA kind through drahealth's resource
  classes: create, get, list, watch, merge patch, server-side apply and update, without
  losing a field.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from drahealth.core import DRA_KINDS
from drahealth.kube import (
    Reflector,
    apply,
    discover,
    make_client,
    resource_class,
    retry_on_conflict,
)
from tests.realk8s.harness import Cluster

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(180)]

#: A resourceVersion far ahead of any this cluster will reach during the test.
AHEAD = 10**12


def say(cluster: Cluster, what: str) -> None:
    print(f"\nclient-stack {cluster.version}: {what}")


async def until(check: Callable[[], Any], within: float, what: str) -> Any:
    """Poll ``check`` (sync) every 20 ms until it is truthy; fail naming ``what``."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what}")
        await asyncio.sleep(0.02)


def http_of(client: AsyncClient) -> httpx2.AsyncClient:
    """lightkube's configured HTTP client (base URL, CA, token) for raw requests."""
    http: httpx2.AsyncClient = client._client._client
    return http


@contextlib.asynccontextmanager
async def namespace(client: AsyncClient) -> AsyncIterator[str]:
    name = f"client-stack-{uuid.uuid4().hex[:8]}"
    await client.create(Namespace(metadata=ObjectMeta(name=name)))
    try:
        # kube-controller-manager publishes kube-root-ca.crt into every new namespace:
        # wait for it, so it is not an event a test's watch sees later
        deadline = time.monotonic() + 30
        while not await _root_ca(client, name):
            assert time.monotonic() < deadline, f"no kube-root-ca.crt in {name} after 30 s"
            await asyncio.sleep(0.05)
        yield name
    finally:
        with contextlib.suppress(ApiError):
            await client.delete(Namespace, name)


async def _root_ca(client: AsyncClient, namespace: str) -> bool:
    try:
        await client.get(ConfigMap, "kube-root-ca.crt", namespace=namespace)
    except ApiError:
        return False
    return True


def watched_queries(client: AsyncClient, path: str) -> list[dict[str, str]]:
    """Record the query of every watch request ``client`` sends to ``path``."""
    seen: list[dict[str, str]] = []

    async def hook(request: httpx2.Request) -> None:
        if request.url.path == path and request.url.params.get("watch") == "true":
            seen.append(dict(request.url.params))

    http_of(client).event_hooks["request"].append(hook)
    return seen


def recorder(log: list[tuple[str, str, str]]) -> Callable[[str, Any, Any], None]:
    def handler(kind: str, obj: Any, old: Any) -> None:
        log.append((kind, obj.metadata.name, obj.metadata.resourceVersion))

    return handler


def contents(r: Reflector[Any]) -> dict[str, str]:
    return {o.metadata.name: o.metadata.resourceVersion for o in r.store.list()}


async def server_contents(client: AsyncClient, kind: Any, ns: str) -> dict[str, str]:
    return {
        o.metadata.name: o.metadata.resourceVersion async for o in client.list(kind, namespace=ns)
    }


# -- etcd's v3 JSON gateway -------------------------------------------------------------------


async def etcd_revision(cluster: Cluster) -> int:
    async with httpx2.AsyncClient(timeout=5.0) as etcd:
        key = base64.b64encode(b"\0").decode()
        resp = await etcd.post(f"{cluster.etcd}/v3/kv/range", json={"key": key, "limit": 1})
        resp.raise_for_status()
        return int(resp.json()["header"]["revision"])


async def compact(cluster: Cluster, revision: int) -> None:
    async with httpx2.AsyncClient(timeout=30.0) as etcd:
        resp = await etcd.post(
            f"{cluster.etcd}/v3/kv/compaction", json={"revision": str(revision), "physical": True}
        )
        resp.raise_for_status()


async def watch_lines(
    http: httpx2.AsyncClient,
    path: str,
    params: dict[str, Any],
    *,
    first_only: bool = False,
    started: asyncio.Event | None = None,
) -> tuple[int, list[tuple[float, dict[str, Any]]], float]:
    """A raw watch: its HTTP status, each line with its arrival time, when it closed.
    ``started`` is set when the response headers arrive (the server registered the watch)."""
    t0 = time.monotonic()
    out: list[tuple[float, dict[str, Any]]] = []
    async with http.stream(
        "GET", path, params={"watch": "true", **params}, timeout=httpx2.Timeout(20.0)
    ) as resp:
        if started is not None:
            started.set()
        async for line in resp.aiter_lines():
            if line.strip():
                out.append((round(time.monotonic() - t0, 2), json.loads(line)))
                if first_only:
                    break
        return resp.status_code, out, round(time.monotonic() - t0, 2)


def cm(ns: str, name: str, **data: str) -> ConfigMap:
    return ConfigMap(metadata=ObjectMeta(name=name, namespace=ns), data=data)


def event(ns: str, name: str, message: str) -> Event:
    return Event(
        metadata=ObjectMeta(name=name, namespace=ns),
        involvedObject=ObjectReference(kind="ConfigMap", name="a", namespace=ns),
        reason="ClientStack",
        message=message,
        type="Normal",
        source=EventSource(component="client-stack"),
    )


def no_duplicates(log: list[tuple[str, str, str]]) -> None:
    assert len(log) == len(set(log)), f"an event was delivered twice: {log}"


# -- 1. compaction ----------------------------------------------------------------------------


async def test_compaction_open_watches_survive_resumed_ones_cache_or_relist(
    real_cluster: Cluster, real_client: AsyncClient
) -> None:
    client = real_client
    http = http_of(client)
    async with namespace(client) as ns:
        for n in "abc":
            await client.create(cm(ns, n, v="0"))
        for n in ("e1", "e2"):
            await client.create(event(ns, n, "first"))
        cms = Reflector(client, ConfigMap, namespace=ns, backoff_initial=0.05, backoff_max=0.2)
        evs = Reflector(client, Event, namespace=ns, backoff_initial=0.05, backoff_max=0.2)
        cm_log: list[tuple[str, str, str]] = []
        ev_log: list[tuple[str, str, str]] = []
        cms.add_handler(recorder(cm_log))
        evs.add_handler(recorder(ev_log))
        async with cms, evs:
            await cms.wait_synced(10)
            await evs.wait_synced(10)
            await until(lambda: {"a", "b", "c"} <= contents(cms).keys(), 10, "the ConfigMaps")

            # (a) compaction to the current revision while both watches are open
            rev = await etcd_revision(real_cluster)
            await compact(real_cluster, rev)
            a2 = await client.patch(
                ConfigMap, "a", {"data": {"v": "1"}}, namespace=ns, patch_type=PatchType.MERGE
            )
            a2_rv = a2.metadata.resourceVersion if a2.metadata else None
            await client.create(cm(ns, "d", v="0"))
            await client.create(event(ns, "e3", "first"))
            await until(
                lambda: (
                    contents(cms).get("a") == a2_rv
                    and "d" in contents(cms)
                    and "e3" in contents(evs)
                ),
                10,
                "the writes after the compaction",
            )
            assert cms.reconnects == evs.reconnects == 0
            assert cms.relists == evs.relists == 0
            say(real_cluster, f"compaction at revision {rev} under open watches: both went on")

            # (b) an outage, writes, and a compaction past both reflectors' versions
            for r in (cms, evs):
                r._drop_connection(hold=True)
            await until(lambda: cms.reconnects == evs.reconnects == 1, 10, "the outage")
            cm_rv, ev_rv = cms.last_resource_version, evs.last_resource_version
            assert cm_rv is not None and ev_rv is not None
            await client.patch(
                ConfigMap, "b", {"data": {"v": "1"}}, namespace=ns, patch_type=PatchType.MERGE
            )
            await client.delete(ConfigMap, "c", namespace=ns)
            await client.create(cm(ns, "e", v="0"))
            await client.patch(
                ConfigMap, "e", {"data": {"v": "1"}}, namespace=ns, patch_type=PatchType.MERGE
            )
            await client.patch(
                Event, "e1", {"message": "second"}, namespace=ns, patch_type=PatchType.MERGE
            )
            await client.delete(Event, "e2", namespace=ns)
            await client.create(event(ns, "e4", "first"))
            rev2 = await etcd_revision(real_cluster)
            await compact(real_cluster, rev2)
            assert int(cm_rv) < rev2 and int(ev_rv) < rev2

            # what the real server answers a watch resumed from those versions now
            cm_path = f"/api/v1/namespaces/{ns}/configmaps"
            ev_path = f"/api/v1/namespaces/{ns}/events"
            cm_status, cm_lines, _ = await watch_lines(
                http, cm_path, {"resourceVersion": cm_rv, "timeoutSeconds": 1}
            )
            ev_status, ev_lines, _ = await watch_lines(
                http, ev_path, {"resourceVersion": ev_rv, "timeoutSeconds": 1}, first_only=True
            )
            exact = await http.get(
                cm_path, params={"resourceVersion": cm_rv, "resourceVersionMatch": "Exact"}
            )
            replayed = [
                (line["type"], line["object"]["metadata"]["name"])
                for _, line in cm_lines
                if line["object"]["metadata"].get("name") in set("abcde")
            ]
            outage = [("MODIFIED", "b"), ("DELETED", "c"), ("ADDED", "e"), ("MODIFIED", "e")]
            assert cm_status == 200 and replayed == outage
            assert ev_status == 200 and len(ev_lines) == 1
            gone = ev_lines[0][1]
            assert gone["type"] == "ERROR"
            assert (gone["object"]["code"], gone["object"]["reason"]) == (410, "Expired")
            say(
                real_cluster,
                f"compacted to {rev2}; watch ConfigMaps from {cm_rv}: HTTP {cm_status}, "
                f"{len(cm_lines)} events replayed from the watch cache; watch Events from "
                f"{ev_rv}: HTTP {ev_status}, ERROR {gone['object']['code']} "
                f"{gone['object']['reason']} {gone['object']['message']!r}; LIST ConfigMaps "
                f"resourceVersion={cm_rv}&resourceVersionMatch=Exact: HTTP {exact.status_code}",
            )

            before = (len(cm_log), len(ev_log))
            t0 = time.monotonic()
            for r in (cms, evs):
                r._resume()
            want_cm = await server_contents(client, ConfigMap, ns)
            want_ev = await server_contents(client, Event, ns)
            await until(
                lambda: contents(cms) == want_cm and contents(evs) == want_ev,
                15,
                "both stores to equal the server's objects",
            )
            say(
                real_cluster,
                f"after the outage: ConfigMaps caught up by watch in "
                f"{time.monotonic() - t0:.2f} s (relists {cms.relists}), Events by relist "
                f"(relists {evs.relists}, lists {evs.lists})",
            )
            assert cms.relists == 0 and cms.lists == 1  # the watch cache served the resume
            assert evs.relists == 1 and evs.lists == 2  # 410 -> one relist
            # every write of the outage arrived once, in order, on the ConfigMap watch
            mine = [(t, n) for t, n, _ in cm_log[before[0] :] if n in set("abcde")]
            assert mine == outage
            # the relist told the difference: e1 changed, e2 gone, e4 new
            assert sorted((t, n) for t, n, _ in ev_log[before[1] :]) == [
                ("ADDED", "e4"), ("DELETED", "e2"), ("MODIFIED", "e1")
            ]  # fmt: skip
            no_duplicates(cm_log)
            no_duplicates(ev_log)
            assert cms.store.get(ns, "b").data == {"v": "1"}  # type: ignore[union-attr]
            assert evs.store.get(ns, "e1").message == "second"  # type: ignore[union-attr]


# -- 2. bookmarks -----------------------------------------------------------------------------


async def test_bookmarks_advance_the_reflector_resource_version(
    real_cluster: Cluster, real_client: AsyncClient
) -> None:
    client = real_client
    raw = make_client(kubeconfig=real_cluster.kubeconfig)  # raw watches beside the reflector's
    http = http_of(raw)
    async with namespace(client) as ns, namespace(client) as other:
        path = f"/api/v1/namespaces/{ns}/configmaps"
        sent = watched_queries(client, path)
        r = Reflector(client, ConfigMap, namespace=ns, watch_timeout=5.0, rng=lambda: 0.0)
        log: list[tuple[str, str, str]] = []
        async with r:
            await r.wait_synced(10)
            await until(lambda: sent, 10, "the first watch")
            listed = r.last_resource_version
            assert sent[0]["allowWatchBookmarks"] == "true" and sent[0]["timeoutSeconds"] == "5"
            assert sent[0]["resourceVersion"] == listed
            r.add_handler(recorder(log))
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            # raw watches beside it: when does the real server send its bookmark?
            params = {"resourceVersion": listed, "allowWatchBookmarks": "true"}
            up = {t: asyncio.Event() for t in (4, 5, 8, 0)}
            probes = {
                t: asyncio.create_task(
                    watch_lines(http, path, {**params, "timeoutSeconds": t}, started=up[t])
                )
                for t in (4, 5, 8)
            }
            uncached = asyncio.create_task(
                watch_lines(
                    http,
                    f"/api/v1/namespaces/{ns}/events",
                    {**params, "timeoutSeconds": 5},
                    started=up[0],
                )
            )
            for ready in up.values():
                await asyncio.wait_for(ready.wait(), 10)
            # a write elsewhere moves the resourceVersion on; nothing happens in ``ns``.
            # A bookmark carries the watch cache's resourceVersion and is only sent when
            # that is newer than the watch's.
            moved = await client.create(cm(other, "elsewhere"))
            target = int(moved.metadata.resourceVersion)  # type: ignore[union-attr, arg-type]
            await until(
                lambda: int(r.last_resource_version or 0) >= target, 15, "a bookmark past the write"
            )
            advanced_after, advanced_to = loop.time() - t0, r.last_resource_version
            await until(lambda: len(sent) >= 2, 10, "the next watch")
            assert int(sent[1]["resourceVersion"]) >= target
            assert log == [] and r.reconnects == 0 and r.relists == 0 and r.lists == 1
            results = {t: await task for t, task in probes.items()}
            ev_status, ev_lines, ev_closed = await uncached
        await raw.close()
        for status, lines, _ in results.values():
            assert status == 200
            assert all(line["type"] == "BOOKMARK" for _, line in lines)
        _, five, closed5 = results[5]
        assert five and five[0][0] < closed5 - 1  # a bookmark well before the end
        assert int(five[0][1]["object"]["metadata"]["resourceVersion"]) >= target
        assert five[0][1]["object"] == {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": five[0][1]["object"]["metadata"]["resourceVersion"]},
        }
        assert ev_status == 200 and ev_lines == []  # Events: no watch cache, no bookmarks
        say(
            real_cluster,
            f"reflector resourceVersion {listed} -> {advanced_to} by bookmark "
            f"{advanced_after:.2f} s after the write (timeoutSeconds=5), next watch from "
            f"{sent[1]['resourceVersion']}; raw bookmarks (timeoutSeconds: [arrival s], "
            f"closed s): "
            + "; ".join(
                f"{t}: {[at for at, _ in lines]}, {closed}"
                for t, (_, lines, closed) in results.items()
            )
            + f"; Events watch with bookmarks, 5 s: {len(ev_lines)} lines, closed {ev_closed}",
        )


# -- 3. a resourceVersion from the future -----------------------------------------------------


async def future_answers(http: httpx2.AsyncClient, path: str, rv: int) -> dict[str, Any]:
    """LIST (NotOlderThan), WATCH and watch-list at ``rv``: status, body, time of each."""

    async def listing() -> tuple[int, Any, str | None, float]:
        t0 = time.monotonic()
        resp = await http.get(
            path,
            params={"resourceVersion": str(rv), "resourceVersionMatch": "NotOlderThan"},
            timeout=20.0,
        )
        return resp.status_code, resp.json(), resp.headers.get("Retry-After"), time.monotonic() - t0

    watch = watch_lines(
        http, path, {"resourceVersion": str(rv), "allowWatchBookmarks": "true", "timeoutSeconds": 2}
    )
    watch_list = watch_lines(
        http,
        path,
        {"resourceVersion": str(rv), "resourceVersionMatch": "NotOlderThan",
         "sendInitialEvents": "true", "allowWatchBookmarks": "true", "timeoutSeconds": 10},
    )  # fmt: skip
    got = await asyncio.gather(listing(), watch, watch_list)
    return dict(zip(("list", "watch", "watch_list"), got, strict=True))


TOO_LARGE = re.compile(r"^Timeout: Too large resource version: (\d+), current: \d+$")


def check_too_large(status: Any, rv: int) -> None:
    assert status["code"] == 504 and status["reason"] == "Timeout", status
    match = TOO_LARGE.match(status["message"])
    assert match is not None and int(match.group(1)) == rv, status["message"]
    assert status["details"] == {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }


async def test_a_resource_version_from_the_future(
    real_cluster: Cluster, real_client: AsyncClient
) -> None:
    client = real_client
    async with namespace(client) as ns:
        path = f"/api/v1/namespaces/{ns}/configmaps"
        embedded = APIServer(data_file=None)
        await embedded.start(host="127.0.0.1", port=0)
        local = make_client(server_url=embedded.url)
        try:
            real, ours = await asyncio.gather(
                future_answers(http_of(client), path, AHEAD),
                future_answers(http_of(local), "/api/v1/namespaces/default/configmaps", AHEAD),
            )
        finally:
            await local.close()
            await embedded.stop()
        for name, got in (("real", real), ("embedded", ours)):
            code, body, retry_after, took = got["list"]
            assert code == 504 and retry_after == "1", (name, code, body)
            check_too_large(body, AHEAD)
            assert 2.5 < took < 6, (name, took)  # both wait ~3 s for the version to arrive
            status, lines, closed = got["watch"]
            assert status == 200 and lines == [] and closed >= 1.9, (name, got["watch"])
            status, lines, _ = got["watch_list"]
            assert status == 200 and len(lines) == 1 and lines[0][1]["type"] == "ERROR"
            assert 2.5 < lines[0][0] < 6, (name, lines)
            check_too_large(lines[0][1]["object"], AHEAD)
        say(
            real_cluster,
            f"LIST at a future resourceVersion: HTTP {real['list'][0]} after "
            f"{real['list'][3]:.2f} s (embedded {ours['list'][3]:.2f} s), Retry-After "
            f"{real['list'][2]}, {json.dumps(real['list'][1], sort_keys=True)}; WATCH: HTTP "
            f"{real['watch'][0]}, {len(real['watch'][1])} lines, closed at timeoutSeconds after "
            f"{real['watch'][2]} s; watch-list: ERROR event after {real['watch_list'][1][0][0]} s",
        )

        # the reflector: its server went back in time (say, etcd restored from a backup)
        sent = watched_queries(client, path)
        r = Reflector(
            client, ConfigMap, namespace=ns, watch_timeout=2.0, rng=lambda: 0.0,
            backoff_initial=0.05, backoff_max=0.5,
        )  # fmt: skip

        def time_travel(kind: str, obj: Any, old: Any) -> None:
            if obj.metadata.name == "trigger":  # from here on ours is ahead of the server's
                r.last_resource_version = str(AHEAD)

        r.add_handler(time_travel)
        async with r:
            await r.wait_synced(10)
            await client.create(cm(ns, "trigger"))
            await until(
                lambda: any(q.get("resourceVersion") == str(AHEAD) for q in sent),
                10,
                "a watch from the future resourceVersion",
            )
            t0 = time.monotonic()
            await client.create(cm(ns, "unseen"))  # that silent watch never delivers it
            await until(lambda: "unseen" in contents(r), 15, "the reflector to recover")
            took = time.monotonic() - t0
            assert r.relists == 1 and r.lists == 2 and r.rv_checks >= 1
            assert int(r.last_resource_version or 0) < AHEAD
            assert contents(r) == await server_contents(client, ConfigMap, ns)
            future_watches = sum(q.get("resourceVersion") == str(AHEAD) for q in sent)
            assert future_watches == 1 and r.watches <= 5
            say(
                real_cluster,
                f"reflector ahead of the server: one silent watch from {AHEAD}, then a "
                f"one-item LIST showed the server behind; relisted {took:.2f} s after the "
                f"missed write (watch timeout 2 s), {r.watches} watches, {r.lists} lists",
            )


# -- 4. every served DRA version --------------------------------------------------------------

DRIVER = "client-stack.example.com"


def claim_spec(version: str, device_class: str) -> dict[str, Any]:
    request: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount",
                               "count": 1}  # fmt: skip
    if version == "v1beta1":
        return {"devices": {"requests": [{"name": "gpu", **request}]}}
    return {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}


def manifest(kind: str, version: str, name: str, ns: str) -> dict[str, Any]:
    spec: dict[str, Any]
    if kind == "DeviceClass":
        spec = {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}
    elif kind == "ResourceClaim":
        spec = claim_spec(version, f"{name}-class")
    elif kind == "ResourceClaimTemplate":
        spec = {"spec": claim_spec(version, f"{name}-class")}
    elif kind == "ResourceSlice":
        device: dict[str, Any] = {
            "attributes": {"model": {"string": "probe"}},
            "capacity": {"memory": {"value": "1Gi"}},
        }
        device = {"basic": device} if version == "v1beta1" else device
        spec = {
            "driver": DRIVER,
            "pool": {"name": f"pool-{name}", "generation": 1, "resourceSliceCount": 1},
            "allNodes": True,
            "devices": [{"name": "dev-0", **device}],
        }
    else:  # DeviceTaintRule
        spec = {
            "deviceSelector": {"driver": DRIVER, "pool": f"pool-{name}", "device": "dev-0"},
            "taint": {"key": f"{DRIVER}/probe", "value": "v", "effect": "NoSchedule"},
        }
    metadata: dict[str, Any] = {"name": name}
    if kind in ("ResourceClaim", "ResourceClaimTemplate"):
        metadata["namespace"] = ns
    return {"apiVersion": f"resource.k8s.io/{version}", "kind": kind, "metadata": metadata,
            "spec": spec}  # fmt: skip


def path_of(kind: str, version: str, name: str, ns: str | None) -> str:
    plural = kind.lower() + ("es" if kind.endswith("Class") else "s")
    where = f"namespaces/{ns}/" if ns else ""
    return f"/apis/resource.k8s.io/{version}/{where}{plural}/{name}"


def lost(raw: Any, decoded: Any, at: str = "") -> list[str]:
    """Paths present in ``raw`` that ``decoded`` lacks or changed."""
    if isinstance(raw, dict) and isinstance(decoded, dict):
        out: list[str] = []
        for k, v in raw.items():
            out += [f"{at}.{k}"] if k not in decoded else lost(v, decoded[k], f"{at}.{k}")
        return out
    if isinstance(raw, list) and isinstance(decoded, list) and len(raw) == len(decoded):
        return [p for i, (a, b) in enumerate(zip(raw, decoded, strict=True))
                for p in lost(a, b, f"{at}[{i}]")]  # fmt: skip
    return [] if raw == decoded else [at or "."]


async def test_every_served_dra_version_round_trips(
    real_cluster: Cluster, real_client: AsyncClient
) -> None:
    client = real_client
    http = http_of(client)
    served = await discover(client)
    combos = [(k, v) for k in DRA_KINDS for v in served.versions.get(k, ())]
    assert combos, "the server serves no resource.k8s.io kind"
    tag = uuid.uuid4().hex[:6]
    created: list[tuple[Any, str, str | None]] = []
    reflectors: list[Reflector[Any]] = []
    report: list[str] = []
    async with namespace(client) as ns:
        try:
            for kind, version in combos:
                cls = resource_class(kind, version)
                name = f"cs-{tag}-{kind.lower()}-{version}"
                body = manifest(kind, version, name, ns)
                obj_ns = body["metadata"].get("namespace")
                made = await client.create(cls.from_dict(body))  # create through the model
                created.append((cls, name, obj_ns))
                assert made.metadata.name == name
                r = Reflector(client, cls, namespace=obj_ns, fields={"metadata.name": name})
                reflectors.append(r)
                await r.start()

                # get; the model decodes the server's JSON without dropping anything
                got = await client.get(cls, name, namespace=obj_ns)
                assert got.metadata.uid == made.metadata.uid
                raw = (await http.get(path_of(kind, version, name, obj_ns))).json()
                assert lost(raw, cls.from_dict(raw).to_dict()) == [], (kind, version)
                # and the object read at every other served version decodes just as well
                for other in served.versions[kind]:
                    seen = (await http.get(path_of(kind, other, name, obj_ns))).json()
                    back = resource_class(kind, other).from_dict(seen).to_dict()
                    assert lost(seen, back) == [], (kind, version, other)
                # list
                names = [o.metadata.name async for o in client.list(cls, namespace=obj_ns)]
                assert name in names
                # watch (a reflector per kind and version), then a merge patch it must see
                await r.wait_synced(10)
                await until(functools.partial(r.store.get, obj_ns, name), 10, f"{kind} {version}")
                await client.patch(
                    cls, name, {"metadata": {"labels": {"patched": "yes"}}},
                    namespace=obj_ns, patch_type=PatchType.MERGE,
                )  # fmt: skip
                # server-side apply of a partial object (drahealth's apply helper)
                await apply(
                    client,
                    {"apiVersion": body["apiVersion"], "kind": kind,
                     "metadata": {"name": name, **({"namespace": obj_ns} if obj_ns else {}),
                                  "annotations": {"client-stack/applied": "yes"}}},
                    field_manager="client-stack",
                )  # fmt: skip

                # update (PUT) of the object as the model read it: the spec loses nothing
                # (a controller may write the status meanwhile: a conflict is retried)
                async def put(c: Any = cls, n: str = name, o: str | None = obj_ns) -> Any:
                    current = await client.get(c, n, namespace=o)
                    labels = current.metadata.labels or {}
                    current.metadata.labels = {**labels, "replaced": "yes"}
                    return await client.replace(current)

                before = (await http.get(path_of(kind, version, name, obj_ns))).json()
                await retry_on_conflict(put)
                after = (await http.get(path_of(kind, version, name, obj_ns))).json()
                assert lost(before["spec"], after["spec"]) == [], (kind, version)
                assert lost(after["spec"], before["spec"]) == [], (kind, version)
                assert after["metadata"]["labels"] == {"patched": "yes", "replaced": "yes"}
                assert after["metadata"]["annotations"] == {"client-stack/applied": "yes"}

                def saw_all(r: Reflector[Any] = r, k: tuple[Any, str] = (obj_ns, name)) -> bool:
                    o = r.store.get(*k)
                    return o is not None and (o.metadata.labels or {}).get("replaced") == "yes"

                await until(saw_all, 10, f"the watch of {kind} {version} to see every write")
                report.append(f"{kind}/{version}")

            # lightkube's models drop what they do not know: a field newer than the models
            # would be lost by a GET -> PUT (drahealth's replace of its own ResourceSlices)
            kind, version = next((k, v) for k, v in combos if k == "ResourceSlice")
            raw = (await http.get(path_of(kind, version, f"cs-{tag}-resourceslice-{version}",
                                          None))).json()  # fmt: skip
            raw["spec"]["zzFutureField"] = {"x": 1}
            raw["spec"]["devices"][0]["zzFutureField"] = True
            dropped = lost(raw, resource_class(kind, version).from_dict(raw).to_dict())
            assert sorted(dropped) == [".spec.devices[0].zzFutureField", ".spec.zzFutureField"]
        finally:
            for r in reflectors:
                await r.stop()
            for cls, name, obj_ns in created:
                if obj_ns is None:
                    with contextlib.suppress(ApiError):
                        await client.delete(cls, name)
    say(
        real_cluster,
        f"served {dict(served.versions)}; create/get/list/watch/patch/apply/update "
        f"round-tripped without loss: {', '.join(report)}; unknown fields dropped by the "
        f"models on decode: {dropped}",
    )
