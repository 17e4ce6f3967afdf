"""The reflector's resourceVersion check before it resumes a watch, against a hostile peer.

After a watch the server ended early, the reflector sends a one-item LIST to check the
server has not gone back in time. Held here: that LIST answered with a body that is no
list, then with a 504, then with a resourceVersion behind ours (etcd restored from a
backup): the reflector neither resumes blind nor gives up, and ends with the server's
list taken as the whole truth, the watch resumed from the server's resourceVersion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from lightkube.resources.core_v1 import ConfigMap

from drahealth.kube import Reflector, make_client
from tests._support import eventually
from tests.integration.kube.test_reflector_http import (
    Peer,
    cm,
    listing,
    serve,
    status,
    stream,
    summary,
)

__all__ = ["serve"]

pytestmark = pytest.mark.timeout(20)


async def test_the_check_survives_garbage_and_504_then_relists_when_the_server_is_behind(
    serve: Callable[[Peer], Any],
) -> None:
    async def first(r: web.Request) -> web.Response:
        return listing(10, cm("a", 9), cm("b", 10))

    async def garbage(r: web.Request) -> web.Response:
        return web.Response(
            text='{"kind": "ConfigMapList", "items": [', content_type="application/json"
        )

    async def too_large(r: web.Request) -> web.Response:
        return status(504, "Timeout")

    async def behind(r: web.Request) -> web.Response:
        assert r.query.get("limit") == "1" and "resourceVersion" not in r.query
        return listing(5, cm("a", 4))

    async def restored(r: web.Request) -> web.Response:
        return listing(5, cm("a", 4))

    async def ends_at_once(r: web.Request) -> web.StreamResponse:
        return await stream(r, hold=False)

    async def quiet(r: web.Request) -> web.StreamResponse:
        return await stream(r)

    peer = Peer([first, garbage, too_large, behind, restored], [ends_at_once, quiet])
    client = make_client(server_url=await serve(peer))
    seen: list[tuple[str, str]] = []
    r = Reflector(client, ConfigMap, namespace="default", backoff_initial=0.01,
                  backoff_max=0.05)  # fmt: skip
    r.add_handler(summary(seen))
    try:
        async with r:
            await eventually(lambda: len(peer.watch_queries) == 2, 5.0, "the resumed watch")
            assert peer.watch_queries[1]["resourceVersion"] == "5"
            assert seen == [
                ("ADDED", "a@9"), ("ADDED", "b@10"), ("DELETED", "b@10"), ("MODIFIED", "a@4"),
            ]  # fmt: skip
            assert r.relists == 1 and r.rv_checks == 1 and len(peer.list_queries) == 5
    finally:
        await client.close()
