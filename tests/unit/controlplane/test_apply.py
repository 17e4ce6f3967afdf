"""Server-side apply: field sets, FieldsV1, conflicts, force, removal, update ownership."""

from __future__ import annotations

from typing import Any

import pytest

from drahealth.controlplane._apply import (
    ApplyConflict,
    apply,
    field_set,
    from_fields_v1,
    parse_entries,
    pretty,
    to_fields_v1,
    track_update,
)
from drahealth.controlplane._resources import PRIMITIVE_MERGE_LISTS, lookup

POD = lookup("", "v1", "pods")
assert POD is not None
NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:01:00Z"


def sets(path: tuple[str, ...]) -> bool:
    return path in PRIMITIVE_MERGE_LISTS


def do_apply(
    live: dict[str, Any],
    body: dict[str, Any],
    manager: str,
    *,
    force: bool = False,
    now: str = NOW,
    sub: str | None = None,
) -> dict[str, Any]:
    assert POD is not None
    return apply(
        live,
        body,
        manager,
        force=force,
        api_version="v1",
        subresource=sub,
        has_status=True,
        keys=POD.merge_key,
        sets=sets,
        now=now,
    )


def do_update(
    old: dict[str, Any] | None, new: dict[str, Any], manager: str, sub: str | None = None
) -> dict[str, Any]:
    assert POD is not None
    return track_update(
        old,
        new,
        manager,
        api_version="v1",
        subresource=sub,
        has_status=True,
        keys=POD.merge_key,
        sets=sets,
        now=NOW,
    )


def pod(image: str = "nginx", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "labels": labels or {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": image}]},
    }


def managers(obj: dict[str, Any]) -> dict[tuple[str, str], set[tuple[str, ...]]]:
    return {(e.manager, e.operation): e.fields for e in parse_entries(obj)}


def test_field_set_uses_merge_keys_and_sets() -> None:
    assert POD is not None
    obj = {
        "metadata": {"finalizers": ["a/b"]},
        "spec": {"containers": [{"name": "c", "image": "i"}], "tolerations": [{"key": "k"}]},
    }
    fs = field_set(obj, POD.merge_key, sets)
    assert fs == {
        ("f:metadata", "f:finalizers", 'v:"a/b"'),
        ("f:spec", "f:containers", 'k:{"name":"c"}'),
        ("f:spec", "f:containers", 'k:{"name":"c"}', "f:name"),
        ("f:spec", "f:containers", 'k:{"name":"c"}', "f:image"),
        ("f:spec", "f:tolerations"),
    }
    encoded = to_fields_v1(fs)
    assert encoded["f:spec"]["f:containers"]['k:{"name":"c"}']["."] == {}
    assert from_fields_v1(encoded) == fs
    assert (
        pretty(("f:spec", "f:containers", 'k:{"name":"c"}', "f:image"))
        == '.spec.containers[name="c"].image'
    )


def test_apply_creates_and_records_manager() -> None:
    out = do_apply({}, pod(), "alice")
    assert out["spec"]["containers"] == [{"name": "c", "image": "nginx"}]
    (entry,) = out["metadata"]["managedFields"]
    assert entry["manager"] == "alice" and entry["operation"] == "Apply"
    assert entry["fieldsType"] == "FieldsV1" and entry["time"] == NOW
    assert "f:image" in entry["fieldsV1"]["f:spec"]["f:containers"]['k:{"name":"c"}']


def test_reapply_same_config_is_a_no_op() -> None:
    first = do_apply({}, pod(), "alice")
    again = do_apply(first, pod(), "alice", now=LATER)
    assert again == first  # time kept because the field set did not change


def test_conflict_with_another_apply_manager_and_force() -> None:
    live = do_apply({}, pod(), "alice")
    with pytest.raises(ApplyConflict) as err:
        do_apply(live, pod("busybox"), "bob")
    (c,) = err.value.conflicts
    assert c.manager == "alice" and pretty(c.path) == '.spec.containers[name="c"].image'
    assert 'conflict with "alice" using v1: .spec.containers[name="c"].image' in str(err.value)
    forced = do_apply(live, pod("busybox"), "bob", force=True)
    assert forced["spec"]["containers"][0]["image"] == "busybox"
    owners = managers(forced)
    image = ("f:spec", "f:containers", 'k:{"name":"c"}', "f:image")
    assert image in owners[("bob", "Apply")]
    assert image not in owners[("alice", "Apply")]


def test_same_value_is_shared_not_a_conflict() -> None:
    live = do_apply({}, pod(), "alice")
    out = do_apply(live, pod(), "bob")
    owners = managers(out)
    image = ("f:spec", "f:containers", 'k:{"name":"c"}', "f:image")
    assert image in owners[("alice", "Apply")] and image in owners[("bob", "Apply")]


def test_conflict_with_update_manager() -> None:
    created = do_update(None, pod(), "kubectl-create")
    with pytest.raises(ApplyConflict) as err:
        do_apply(created, pod("other"), "kubectl")
    assert err.value.conflicts[0].manager == "kubectl-create"


def test_dropping_a_field_removes_it_unless_someone_else_owns_it() -> None:
    live = do_apply({}, pod(app="x", tier="web"), "alice")
    out = do_apply(live, pod(app="x"), "alice")
    assert out["metadata"]["labels"] == {"app": "x"}
    shared = do_apply(live, pod(app="x", tier="web"), "bob")
    out = do_apply(shared, pod(app="x"), "alice")
    assert out["metadata"]["labels"] == {"app": "x", "tier": "web"}


def test_dropping_a_list_item() -> None:
    two = pod()
    two["spec"]["containers"].append({"name": "d", "image": "i"})
    live = do_apply({}, two, "alice")
    out = do_apply(live, pod(), "alice")
    assert [c["name"] for c in out["spec"]["containers"]] == ["c"]


def test_apply_keeps_other_managers_list_items() -> None:
    live = do_apply({}, pod(), "alice")
    other = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "side", "image": "s"}]},
    }
    out = do_apply(live, other, "bob")
    assert [c["name"] for c in out["spec"]["containers"]] == ["c", "side"]


def test_status_is_not_owned_through_the_main_resource() -> None:
    body = pod()
    body["status"] = {"phase": "Running"}
    out = do_apply({}, body, "alice")
    assert "f:status" not in out["metadata"]["managedFields"][0]["fieldsV1"]
    status_only = do_apply(
        out,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "status": {"phase": "Failed"},
        },
        "kubelet",
        sub="status",
    )
    entry = next(e for e in status_only["metadata"]["managedFields"] if e["manager"] == "kubelet")
    assert entry["subresource"] == "status"
    assert set(entry["fieldsV1"]) == {"f:status"}


def test_update_transfers_changed_fields() -> None:
    created = do_update(None, pod(), "creator")
    changed = pod("busybox")
    changed["metadata"]["managedFields"] = created["metadata"]["managedFields"]
    out = do_update(created, changed, "editor")
    owners = managers(out)
    image = ("f:spec", "f:containers", 'k:{"name":"c"}', "f:image")
    assert image in owners[("editor", "Update")]
    assert image not in owners[("creator", "Update")]
    assert ("f:metadata", "f:labels", "f:app") in owners[("creator", "Update")]


def test_update_with_no_change_adds_no_entry() -> None:
    created = do_update(None, pod(), "creator")
    out = do_update(created, dict(created), "noop")
    assert [e["manager"] for e in out["metadata"]["managedFields"]] == ["creator"]
