"""A Reflector ``transform`` that raises on one object.

Before: a raise in the LIST left the reflector relisting for ever (never synced), and a
raise on a watch event restarted the watch before that event, which met it again: every
later change was lost while the task looked alive. Held now: the object is kept as it
arrived, counted in ``transform_errors``, and the cache goes on.

Also held: :func:`strip_managed_fields` drops only ``metadata.managedFields`` (the
controller's pods, claims and slices feed the read model, which reads none of it).
"""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from drahealth.kube import Reflector, as_dict, strip_managed_fields
from tests._support import eventually
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(20)


def _cm(name: str) -> ConfigMap:
    return ConfigMap(metadata=ObjectMeta(name=name, namespace="default"), data={"k": name})


def _picky(obj: Any) -> Any:
    if obj.metadata.name.startswith("poison"):
        raise RuntimeError("cannot transform this one")
    return strip_managed_fields(obj)


async def test_a_transform_that_raises_on_a_listed_object_does_not_stop_the_sync(
    client: AsyncClient,
) -> None:
    await client.create(_cm("poison-0"))
    await client.create(_cm("fine"))
    r = Reflector(client, ConfigMap, namespace="default", transform=_picky, backoff_max=0.2)
    async with r:
        await eventually(lambda: r.has_synced or None, 5.0, "the first LIST applied")
        assert r.store.get("default", "fine") is not None
        kept = r.store.get("default", "poison-0")
        assert kept is not None and kept.metadata is not None
        assert kept.metadata.managedFields, "kept as it arrived"
        assert r.transform_errors == 1


async def test_a_transform_that_raises_on_a_watch_event_does_not_stall_the_cache(
    client: AsyncClient,
) -> None:
    r = Reflector(client, ConfigMap, namespace="default", transform=_picky, backoff_max=0.2)
    async with r:
        await eventually(lambda: r.has_synced or None, 5.0, "synced")
        await client.create(_cm("poison-1"))
        await client.create(_cm("after"))
        after = await eventually(lambda: r.store.get("default", "after"), 5.0, "a later object")
        assert after.metadata is not None and after.metadata.managedFields is None
        assert r.store.get("default", "poison-1") is not None
        assert r.transform_errors == 1


def test_strip_managed_fields_drops_only_field_ownership() -> None:
    raw = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": "a", "namespace": "default", "uid": "u", "resourceVersion": "7",
            "labels": {"x": "y"}, "annotations": {"z": "w"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "q"}],
            "managedFields": [{"manager": "m", "operation": "Update", "apiVersion": "v1"}],
        },
        "data": {"k": "v"},
    }  # fmt: skip
    obj = strip_managed_fields(ConfigMap.from_dict(raw))
    out = as_dict(obj)
    del raw["metadata"]["managedFields"]  # type: ignore[attr-defined]
    assert out == raw
