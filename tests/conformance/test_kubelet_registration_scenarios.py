"""Conformance: scenario 24 (reference section 8), untrusted registration input (#140837).

Every rejection and acceptance of the scenario is checked against
``validate_plugin_info`` with the kubelet's default root ``/var/lib/kubelet``, and
again end to end: a raw registration server on a real unix socket, found by a running
``PluginWatcher``, must receive ``NotifyRegistrationStatus(plugin_registered=False,
error=<upstream text>)`` (or ``True`` and a registration with the cleaned endpoint).
The end-to-end runs use a temporary directory as the kubelet root.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from drahealth import api
from drahealth.driver._plugin import start as start_plugin
from drahealth.node._types import RegistrationError
from drahealth.node._validation import VALIDATION_FAILED_PREFIX, validate_plugin_info
from tests.integration.node.test_watcher import (
    RawPlugin,
    RecordingHandler,
    TinyDriver,
    eventually,
    make_base,
    plugin_options,
    raw_info,
    serve,
    watching,
)

ROOT = "/var/lib/kubelet"
ROOT_TOKEN = "<root>"
GOOD = f"{ROOT_TOKEN}/plugins/example.com/dra.sock"

# (case, name, endpoint, fragment of the detail after the upstream prefix)
REJECTED = [
    ("empty-name", "", GOOD, "Required value"),
    ("dotdot-name", "../evil", GOOD, "invalid DRA driver name"),
    ("space-name", "evil driver", GOOD, "invalid DRA driver name"),
    ("uppercase-name", "Example.COM", GOOD, "invalid DRA driver name"),
    ("long-name", "a" * 60 + ".com", GOOD, "Too long"),
    ("empty-endpoint", "example.com", "", "empty DRA plugin endpoint"),
    (
        "relative-endpoint",
        "example.com",
        "plugins/example.com/dra.sock",
        "must be an absolute path",
    ),
    ("long-endpoint", "example.com", f"{ROOT_TOKEN}/plugins/{'x' * 120}.sock", "longer than"),
    ("outside-endpoint", "example.com", "/tmp/dra.sock", "is not inside"),
    ("escaping-endpoint", "example.com", f"{ROOT_TOKEN}/plugins/../../x.sock", "is not inside"),
    ("sibling-endpoint", "example.com", f"{ROOT_TOKEN}-evil/dra.sock", "is not inside"),
]

# (case, endpoint, cleaned endpoint)
ACCEPTED = [
    ("plugins", GOOD, GOOD),
    (
        "rolling",
        f"{ROOT_TOKEN}/plugins/example.com/rolling/dra.sock",
        f"{ROOT_TOKEN}/plugins/example.com/rolling/dra.sock",
    ),
    (
        "common-socket",
        f"{ROOT_TOKEN}/plugins_registry/example.com-common.sock",
        f"{ROOT_TOKEN}/plugins_registry/example.com-common.sock",
    ),
    (
        "dot-segments",
        f"{ROOT_TOKEN}/plugins/./example.com/../dra.sock",
        f"{ROOT_TOKEN}/plugins/dra.sock",
    ),
]


def at(root: str, path: str) -> str:
    return path.replace(ROOT_TOKEN, root)


@pytest.fixture
def kubelet_root() -> Iterator[str]:
    base, _ = make_base("drc-")
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- against validate_plugin_info, kubelet default root ---------------------------


@pytest.mark.parametrize(
    ("name", "endpoint", "fragment"),
    [case[1:] for case in REJECTED],
    ids=[case[0] for case in REJECTED],
)
def test_s24_rejected(name: str, endpoint: str, fragment: str) -> None:
    with pytest.raises(RegistrationError) as err:
        validate_plugin_info(
            raw_info(name, at(ROOT, endpoint)),
            registration_socket=f"{ROOT}/plugins_registry/x-reg.sock",
            allowed_roots=[ROOT],
        )
    text = str(err.value)
    assert text.startswith("RegisterPlugin error -- plugin validation failed with err: ")
    assert fragment in text


@pytest.mark.parametrize(
    ("endpoint", "cleaned"),
    [case[1:] for case in ACCEPTED],
    ids=[case[0] for case in ACCEPTED],
)
def test_s24_accepted(endpoint: str, cleaned: str) -> None:
    info = validate_plugin_info(
        raw_info("example.com", at(ROOT, endpoint)),
        registration_socket=f"{ROOT}/plugins_registry/example.com-reg.sock",
        allowed_roots=[ROOT],
    )
    assert info.driver == "example.com"
    assert info.endpoint == at(ROOT, cleaned)


def test_s24_unknown_plugin_type() -> None:
    with pytest.raises(RegistrationError) as err:
        validate_plugin_info(
            raw_info("example.com", at(ROOT, GOOD), kind="CSIPlugin"),
            registration_socket=f"{ROOT}/plugins_registry/x-reg.sock",
            allowed_roots=[ROOT],
        )
    assert (
        str(err.value) == "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin"
    )


def test_s24_versions() -> None:
    def refusal(versions: list[str]) -> str:
        with pytest.raises(RegistrationError) as err:
            validate_plugin_info(
                raw_info("example.com", at(ROOT, GOOD), versions=versions),
                registration_socket=f"{ROOT}/plugins_registry/x-reg.sock",
                allowed_roots=[ROOT],
            )
        return str(err.value).removeprefix(VALIDATION_FAILED_PREFIX)

    assert refusal([]) == "empty list of supported gRPC services (aka supported versions)"
    assert refusal(["v1alpha4", "v1.DRAResourceHealth"]) == (
        'none of services supported by the plugin (["v1alpha4" "v1.DRAResourceHealth"]) '
        'are supported by the kubelet (["v1.DRAPlugin" "v1beta1.DRAPlugin"])'
    )


# -- end to end: real sockets, running watcher --------------------------------------


@pytest.mark.parametrize(
    ("name", "endpoint", "fragment"),
    [case[1:] for case in REJECTED],
    ids=[case[0] for case in REJECTED],
)
async def test_s24_rejected_plugin_is_notified(
    kubelet_root: str, name: str, endpoint: str, fragment: str
) -> None:
    registry = f"{kubelet_root}/plugins_registry"
    reg = f"{registry}/raw-reg.sock"
    info = raw_info(name, at(kubelet_root, endpoint))
    plugin = RawPlugin(info)
    handler = RecordingHandler()
    async with serve(reg, plugin), watching(registry, handler) as watcher:
        await eventually(lambda: len(plugin.statuses) == 1, what="notification")
        # The exact text validation produces for the same answer and root.
        with pytest.raises(RegistrationError) as err:
            validate_plugin_info(info, registration_socket=reg, allowed_roots=[kubelet_root])
        assert plugin.statuses == [(False, str(err.value))]
        assert plugin.statuses[0][1].startswith(
            "RegisterPlugin error -- plugin validation failed with err: "
        )
        assert fragment in plugin.statuses[0][1]
        assert handler.calls == []
        assert watcher.registered == {}


async def test_s24_bad_endpoint_end_to_end_exact_text(kubelet_root: str) -> None:
    registry = f"{kubelet_root}/plugins_registry"
    plugin = RawPlugin(raw_info("example.com", "/etc/evil/dra.sock"))
    handler = RecordingHandler()
    async with serve(f"{registry}/example.com-reg.sock", plugin), watching(registry, handler):
        await eventually(lambda: len(plugin.statuses) == 1, what="notification")
    assert plugin.statuses == [
        (
            False,
            "RegisterPlugin error -- plugin validation failed with err: "
            'endpoint: Invalid value: "/etc/evil/dra.sock": cleaned path "/etc/evil/dra.sock" '
            f'is not inside the kubelet root directory "{kubelet_root}"',
        )
    ]


async def test_s24_unknown_plugin_type_end_to_end(kubelet_root: str) -> None:
    registry = f"{kubelet_root}/plugins_registry"
    plugin = RawPlugin(raw_info("example.com", at(kubelet_root, GOOD), kind="CSIPlugin"))
    async with serve(f"{registry}/csi-reg.sock", plugin), watching(registry, RecordingHandler()):
        await eventually(lambda: len(plugin.statuses) == 1, what="notification")
    assert plugin.statuses == [
        (False, "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin")
    ]


@pytest.mark.parametrize(
    ("endpoint", "cleaned"),
    [case[1:] for case in ACCEPTED],
    ids=[case[0] for case in ACCEPTED],
)
async def test_s24_accepted_plugin_is_registered(
    kubelet_root: str, endpoint: str, cleaned: str
) -> None:
    registry = f"{kubelet_root}/plugins_registry"
    reg = f"{registry}/example.com-common.sock"
    plugin = RawPlugin(raw_info("example.com", at(kubelet_root, endpoint)))
    handler = RecordingHandler()
    async with serve(reg, plugin), watching(registry, handler) as watcher:
        await eventually(lambda: len(plugin.statuses) == 1, what="notification")
        assert plugin.statuses == [(True, "")]
        assert [(kind, info.endpoint) for kind, info in handler.calls] == [
            ("register", at(kubelet_root, cleaned))
        ]
        assert watcher.registered[reg].registration_socket == reg


@pytest.mark.parametrize("pod_uid", [None, "ad4af911-5bcd-47c5-a554-f35cea869472"])
async def test_s24_toolkit_layouts_are_accepted(kubelet_root: str, pod_uid: str | None) -> None:
    registry = f"{kubelet_root}/plugins_registry"
    handle = await start_plugin(TinyDriver(), plugin_options(kubelet_root, pod_uid=pod_uid))
    handler = RecordingHandler()
    try:
        async with watching(registry, handler):
            await eventually(lambda: handle.registration_status is not None, what="notification")
            assert handle.registration_status is not None
            assert handle.registration_status.plugin_registered
            assert [info.endpoint for _, info in handler.calls] == [handle.endpoint]
            assert os.path.dirname(handle.endpoint) == f"{kubelet_root}/plugins/gpu.example.com"
            assert handler.calls[0][1].versions == tuple(api.DRA_PLUGIN_SERVICES)
    finally:
        await handle.stop(0)
