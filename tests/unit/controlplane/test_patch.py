"""Merge, JSON and strategic merge patch as pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.controlplane._patch import (
    PatchError,
    json_patch,
    merge_patch,
    strategic_merge,
)
from drahealth.controlplane._resources import PRIMITIVE_MERGE_LISTS, lookup

POD = lookup("", "v1", "pods")
assert POD is not None


def sets(path: tuple[str, ...]) -> bool:
    return path in PRIMITIVE_MERGE_LISTS


def smp(original: Any, patch: Any) -> Any:
    assert POD is not None
    return strategic_merge(original, patch, POD.merge_key, sets)


# --------------------------------------------------------------------------- RFC 7386


@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [  # the examples of RFC 7386 appendix A
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch_rfc7386_examples(target: Any, patch: Any, result: Any) -> None:
    assert merge_patch(target, patch) == result


def test_merge_patch_does_not_mutate_input() -> None:
    target = {"a": {"b": 1}}
    merge_patch(target, {"a": {"b": 2}})
    assert target == {"a": {"b": 1}}


# --------------------------------------------------------------------------- RFC 6902


def test_json_patch_operations() -> None:
    doc = {"a": {"b": [1, 2]}, "c": "x"}
    out = json_patch(
        doc,
        [
            {"op": "add", "path": "/a/b/-", "value": 3},
            {"op": "add", "path": "/a/b/0", "value": 0},
            {"op": "replace", "path": "/c", "value": "y"},
            {"op": "copy", "from": "/c", "path": "/d"},
            {"op": "move", "from": "/d", "path": "/e~1f"},
            {"op": "remove", "path": "/a/b/1"},
            {"op": "test", "path": "/e~1f", "value": "y"},
        ],
    )
    assert out == {"a": {"b": [0, 2, 3]}, "c": "y", "e/f": "y"}
    assert doc == {"a": {"b": [1, 2]}, "c": "x"}


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "test", "path": "/a", "value": 2}],
        [{"op": "remove", "path": "/missing"}],
        [{"op": "replace", "path": "/missing", "value": 1}],
        [{"op": "add", "path": "/list/9", "value": 1}],
        [{"op": "frobnicate", "path": "/a"}],
        [{"op": "add", "path": "/a"}],
        {"op": "add"},
    ],
)
def test_json_patch_errors(ops: Any) -> None:
    with pytest.raises(PatchError):
        json_patch({"a": 1, "list": []}, ops)


# --------------------------------------------------------------------------- strategic merge


def _pod_status(resources: list[dict[str, str]], extra: dict[str, Any] | None = None) -> Any:
    return {
        "status": {
            "containerStatuses": [
                {
                    "name": "c",
                    "ready": True,
                    "allocatedResourcesStatus": [{"name": "claim:gpu/req", "resources": resources}],
                    **(extra or {}),
                }
            ]
        }
    }


def test_strategic_replaces_container_statuses_whole() -> None:
    """status.containerStatuses is an atomic list upstream (no patch strategy): a
    strategic merge patch replaces it, with everything inside (allocatedResourcesStatus,
    its resources, a message no longer there), as kube-apiserver does."""
    original = _pod_status(
        [
            {"resourceID": "gpu-0", "health": "Healthy"},
            {"resourceID": "gpu-1", "health": "Unhealthy", "message": "XID 48"},
        ]
    )
    patch = _pod_status([{"resourceID": "gpu-1", "health": "Healthy"}])
    out = smp(original, patch)
    assert out["status"]["containerStatuses"] == patch["status"]["containerStatuses"]
    (ars,) = out["status"]["containerStatuses"][0]["allocatedResourcesStatus"]
    assert ars["resources"] == [{"resourceID": "gpu-1", "health": "Healthy"}]


def test_strategic_containers_conditions_and_owner_references() -> None:
    original = {
        "metadata": {"ownerReferences": [{"uid": "1", "name": "a"}]},
        "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "Scheduled", "status": "True"},
            ]
        },
    }
    patch = {
        "metadata": {"ownerReferences": [{"uid": "2", "name": "b"}]},
        "spec": {"containers": [{"name": "b", "image": "z"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    out = smp(original, patch)
    assert [o["uid"] for o in out["metadata"]["ownerReferences"]] == ["1", "2"]
    assert out["spec"]["containers"] == [{"name": "a", "image": "x"}, {"name": "b", "image": "z"}]
    assert out["status"]["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "Scheduled", "status": "True"},
    ]


def test_strategic_directives() -> None:
    original = {
        "spec": {
            "containers": [{"name": "a", "image": "x"}, {"name": "b"}],
            "tolerations": [{"key": "k"}],
            "nodeSelector": {"x": "1", "y": "2"},
        },
        "metadata": {"finalizers": ["f1", "f2"], "labels": {"l": "v"}},
    }
    patch = {
        "spec": {
            "containers": [{"name": "a", "$patch": "delete"}],
            "tolerations": [{"key": "other"}],
            "nodeSelector": {"$patch": "replace", "z": "3"},
            "$setElementOrder/containers": [{"name": "b"}],
        },
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["f1"], "labels": {"l": None}},
    }
    out = smp(original, patch)
    assert out["spec"]["containers"] == [{"name": "b"}]
    assert out["spec"]["tolerations"] == [{"key": "other"}]  # no merge key: replaced
    assert out["spec"]["nodeSelector"] == {"z": "3"}
    assert out["metadata"] == {"finalizers": ["f2"], "labels": {}}


def test_strategic_list_replace_directive_and_finalizer_union() -> None:
    original = {
        "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
        "metadata": {"finalizers": ["f1"]},
    }
    patch = {
        "spec": {"containers": [{"$patch": "replace"}, {"name": "c"}]},
        "metadata": {"finalizers": ["f2", "f1"]},
    }
    out = smp(original, patch)
    assert out["spec"]["containers"] == [{"name": "c"}]
    assert out["metadata"]["finalizers"] == ["f1", "f2"]


def test_strategic_missing_merge_key_is_an_error() -> None:
    with pytest.raises(PatchError, match="merge key"):
        smp({"spec": {"containers": []}}, {"spec": {"containers": [{"image": "x"}]}})


def test_strategic_delete_whole_map_and_null() -> None:
    out = smp({"spec": {"a": {"b": 1}, "c": 2}}, {"spec": {"a": {"$patch": "delete"}, "c": None}})
    assert out == {"spec": {}}
