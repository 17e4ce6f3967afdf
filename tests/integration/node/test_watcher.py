"""PluginWatcher against real plugins on real unix sockets.

Peers are the driver toolkit's plugin (``drahealth.driver.start``) and small raw
``pluginregistration.Registration`` servers defined here, which answer whatever
``PluginInfo`` a test gives them and record every ``NotifyRegistrationStatus``.
A recording handler stands in for the plugin registry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from drahealth import api
from drahealth.driver._plugin import start as start_plugin
from drahealth.driver._types import ClaimRef, PluginOptions, PreparedClaimRequest, PrepareResult
from drahealth.node._types import PluginInfo, RegistrationError
from drahealth.node._watcher import PluginWatcher
from tests._support import eventually, short_dir

DRIVER = "gpu.example.com"
RAW = "raw.example.com"
_Context = grpc.aio.ServicerContext[Any, Any]


# -- peers and helpers (also used by the conformance tests) -----------------------


class RecordingHandler:
    """A RegistrationHandler that records calls; can refuse or crash on demand."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, PluginInfo]] = []
        self.refusal: str | None = None
        self.crash = False

    async def register(self, info: PluginInfo) -> None:
        self.calls.append(("register", info))
        if self.crash:
            raise RuntimeError("handler exploded")
        if self.refusal is not None:
            raise RegistrationError(self.refusal)

    async def deregister(self, info: PluginInfo) -> None:
        self.calls.append(("deregister", info))

    def events(self) -> list[tuple[str, str]]:
        return [(kind, info.driver) for kind, info in self.calls]

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.calls if k == kind)


class RawPlugin(api.registration_grpc.RegistrationServicer):
    """A registration server answering a fixed PluginInfo; records notifications.

    ``hang``: GetInfo never answers. ``fail``: GetInfo fails with UNAVAILABLE.
    ``fail_notify``: NotifyRegistrationStatus fails (after recording).
    """

    def __init__(self, info: api.registration.PluginInfo, *, hang: bool = False) -> None:
        self.info = info
        self.hang = hang
        self.fail = False
        self.fail_notify = False
        self.get_info_calls = 0
        self.statuses: list[tuple[bool, str]] = []

    async def GetInfo(
        self, request: api.registration.InfoRequest, context: _Context
    ) -> api.registration.PluginInfo:
        self.get_info_calls += 1
        if self.hang:
            await asyncio.Event().wait()
        if self.fail:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not ready")
        return self.info

    async def NotifyRegistrationStatus(
        self, request: api.registration.RegistrationStatus, context: _Context
    ) -> api.registration.RegistrationStatusResponse:
        self.statuses.append((request.plugin_registered, request.error))
        if self.fail_notify:
            await context.abort(grpc.StatusCode.INTERNAL, "notification handler broken")
        return api.registration.RegistrationStatusResponse()


def raw_info(
    name: str = RAW,
    endpoint: str = "",
    *,
    kind: str = "DRAPlugin",
    versions: Sequence[str] = ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
) -> api.registration.PluginInfo:
    return api.registration.PluginInfo(
        type=kind, name=name, endpoint=endpoint, supported_versions=list(versions)
    )


@asynccontextmanager
async def serve(path: str, plugin: RawPlugin) -> AsyncIterator[grpc.aio.Server]:
    """Serve ``plugin`` on the unix socket ``path`` until the block ends."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    server = grpc.aio.server()
    api.registration_grpc.add_RegistrationServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0)


@asynccontextmanager
async def watching(
    registry: str, handler: RecordingHandler, **kw: Any
) -> AsyncIterator[PluginWatcher]:
    kw.setdefault("rescan_interval", 0.05)
    watcher = PluginWatcher(registry, handler, **kw)
    await watcher.start()
    try:
        yield watcher
    finally:
        await watcher.stop()


def exists(path: str) -> bool:
    return os.path.lexists(path)


def is_dir(path: str) -> bool:
    return os.path.isdir(path)


def write_file(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def make_base(prefix: str) -> tuple[str, str]:
    """A fresh kubelet-like root and its ``plugins_registry`` dir."""
    base = short_dir(prefix)
    registry = f"{base}/plugins_registry"
    os.makedirs(registry)
    return base, registry


class TinyDriver:
    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        return {c.uid: PrepareResult.ok([]) for c in claims}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        return {c.uid: None for c in claims}


def plugin_options(base: str, **kw: Any) -> PluginOptions:
    return PluginOptions(
        kw.pop("driver", DRIVER),
        registry_dir=f"{base}/plugins_registry",
        plugins_dir=f"{base}/plugins",
        cdi_dir=f"{base}/cdi",
        **kw,
    )


# -- fixtures ---------------------------------------------------------------------


@pytest.fixture
def dirs() -> Iterator[tuple[str, str]]:
    base, registry = make_base("drw-")
    try:
        yield base, registry
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def handler() -> RecordingHandler:
    return RecordingHandler()


# -- registration -----------------------------------------------------------------


async def test_toolkit_plugin_is_registered_and_notified(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    handle = await start_plugin(TinyDriver(), plugin_options(base))
    try:
        async with watching(registry, handler) as watcher:
            # start() returns after the first full pass, handshake included.
            reg = f"{registry}/{DRIVER}-reg.sock"
            expected = PluginInfo(
                driver=DRIVER,
                endpoint=f"{base}/plugins/{DRIVER}/dra.sock",
                versions=("v1.DRAPlugin", "v1beta1.DRAPlugin"),
                registration_socket=reg,
            )
            assert handler.calls == [("register", expected)]
            assert dict(watcher.registered) == {reg: expected}
            await asyncio.wait_for(handle.registered.wait(), 5)
            assert handle.registration_status is not None
            assert handle.registration_status.plugin_registered
            assert handle.registration_status.error == ""
            assert watcher.stats() == {
                "registrations": 1,
                "rejections": 0,
                "removals": 0,
                "probe_failures": 0,
            }
            # Stopping the plugin removes its registration socket -> deregistered.
            await handle.stop(0)
            await eventually(lambda: handler.count("deregister") == 1, what="deregister")
            assert handler.calls[-1] == ("deregister", expected)
            assert dict(watcher.registered) == {}
            assert watcher.stats()["removals"] == 1
    finally:
        await handle.stop(0)


async def test_plugin_started_after_the_watcher_is_found_by_events(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    # A long rescan interval: only filesystem events can make this fast.
    async with watching(registry, handler, rescan_interval=30.0) as watcher:
        assert handler.calls == []
        handle = await start_plugin(TinyDriver(), plugin_options(base))
        try:
            await asyncio.wait_for(handle.registered.wait(), 5)
            assert handler.events() == [("register", DRIVER)]
            assert list(watcher.registered) == [handle.registrar_socket]
        finally:
            await handle.stop(0)
        await eventually(lambda: handler.count("deregister") == 1, within=5, what="deregister")


async def test_only_real_sockets_are_considered(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    outside = f"{base}/outside"
    os.makedirs(outside)
    plugins = {
        name: RawPlugin(raw_info(name, f"{base}/plugins/{name}/dra.sock"))
        for name in ("hidden.example.com", "linked.example.com", "dotdir.example.com")
    }
    nested = RawPlugin(raw_info("nested.example.com", f"{base}/plugins/nested/dra.sock"))
    in_linked_dir = RawPlugin(raw_info("viadir.example.com", f"{base}/plugins/v/dra.sock"))
    write_file(f"{registry}/plain.sock", "not a socket")
    os.mkfifo(f"{registry}/fifo.sock")
    async with (
        serve(f"{registry}/.hidden-reg.sock", plugins["hidden.example.com"]),
        serve(f"{outside}/linked-reg.sock", plugins["linked.example.com"]),
        serve(f"{registry}/.tmp/dotdir-reg.sock", plugins["dotdir.example.com"]),
        serve(f"{registry}/sub/deeper/nested-reg.sock", nested),
        serve(f"{outside}/dir/viadir-reg.sock", in_linked_dir),
    ):
        os.symlink(f"{outside}/linked-reg.sock", f"{registry}/link-reg.sock")
        os.symlink(f"{outside}/dir", f"{registry}/linkdir")
        async with watching(registry, handler) as watcher:
            await watcher.rescan()
        assert handler.events() == [("register", "nested.example.com")]
        assert list(watcher.registered) == [f"{registry}/sub/deeper/nested-reg.sock"]
        assert nested.statuses == [(True, "")]
        for plugin in [*plugins.values(), in_linked_dir]:
            assert plugin.get_info_calls == 0
            assert plugin.statuses == []


async def test_removal_deregisters(dirs: tuple[str, str], handler: RecordingHandler) -> None:
    base, registry = dirs
    plugin = RawPlugin(raw_info(endpoint=f"{base}/plugins/raw/dra.sock"))
    watcher = PluginWatcher(registry, handler)
    path = f"{registry}/raw-reg.sock"
    async with serve(path, plugin):
        await watcher.rescan()
        assert handler.events() == [("register", RAW)]
        await watcher.rescan()  # nothing changed: nothing happens
        assert handler.events() == [("register", RAW)]
    assert not exists(path)
    await watcher.rescan()
    assert handler.events() == [("register", RAW), ("deregister", RAW)]
    assert dict(watcher.registered) == {}
    assert watcher.stats()["removals"] == 1
    await watcher.rescan()
    assert handler.count("deregister") == 1


async def test_recreated_socket_is_deregistered_then_registered(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    path = f"{registry}/raw-reg.sock"
    old = RawPlugin(raw_info("old.example.com", f"{base}/plugins/old/dra.sock"))
    new = RawPlugin(raw_info("new.example.com", f"{base}/plugins/new/dra.sock"))
    watcher = PluginWatcher(registry, handler)
    async with serve(path, old):
        await watcher.rescan()
    async with serve(path, new):
        await watcher.rescan()
        assert handler.events() == [
            ("register", "old.example.com"),
            ("deregister", "old.example.com"),
            ("register", "new.example.com"),
        ]
        assert watcher.registered[path].driver == "new.example.com"
        assert new.statuses == [(True, "")]
        assert watcher.stats() == {
            "registrations": 2,
            "rejections": 0,
            "removals": 1,
            "probe_failures": 0,
        }


async def test_chmod_is_not_a_recreation(dirs: tuple[str, str], handler: RecordingHandler) -> None:
    base, registry = dirs
    path = f"{registry}/raw-reg.sock"
    async with serve(path, RawPlugin(raw_info(endpoint=f"{base}/plugins/raw/dra.sock"))):
        watcher = PluginWatcher(registry, handler)
        await watcher.rescan()
        os.chmod(path, 0o600)
        await watcher.rescan()
        assert handler.events() == [("register", RAW)]


# -- dead sockets -----------------------------------------------------------------


async def test_dead_socket_is_dropped_after_probe_failures(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    # The server listens on a path outside the registry; the registry holds a hard
    # link to the same socket inode. Stopping the server removes only its own path,
    # so the registry keeps a socket file nobody listens on.
    served = f"{base}/srv/raw-reg.sock"
    path = f"{registry}/raw-reg.sock"
    plugin = RawPlugin(raw_info(endpoint=f"{base}/plugins/raw/dra.sock"))
    async with watching(
        registry, handler, probe_interval=0.05, probe_failures=2, getinfo_timeout=0.5
    ) as watcher:
        async with serve(served, plugin):
            os.link(served, path)
            await eventually(lambda: path in watcher.registered, what="registration")
            await asyncio.sleep(0.2)  # several successful probes
            assert plugin.get_info_calls >= 3
            assert handler.events() == [("register", RAW)]
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        await eventually(lambda: handler.count("deregister") == 1, what="probe deregistration")
        assert path not in watcher.registered
        assert exists(path)
        assert watcher.stats()["probe_failures"] == 1
        assert watcher.stats()["removals"] == 0
        # The file goes away later: nothing more to deregister.
        os.unlink(path)
        await asyncio.sleep(0.2)
        assert handler.events() == [("register", RAW), ("deregister", RAW)]


async def test_dropped_socket_that_answers_again_is_registered_again(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    path = f"{registry}/raw-reg.sock"
    plugin = RawPlugin(raw_info(endpoint=f"{base}/plugins/raw/dra.sock"))
    async with (
        serve(path, plugin),
        watching(registry, handler, probe_interval=0.05, probe_failures=3) as watcher,
    ):
        assert path in watcher.registered
        plugin.fail = True
        await eventually(lambda: handler.count("deregister") == 1, what="probe deregistration")
        calls = plugin.get_info_calls
        assert calls >= 1 + 3
        plugin.fail = False
        await eventually(lambda: len(plugin.statuses) == 2, what="re-registration")
        assert plugin.statuses == [(True, ""), (True, "")]
        assert handler.count("register") == 2
        assert path in watcher.registered
        assert watcher.stats()["probe_failures"] == 1
        assert watcher.stats()["registrations"] == 2


async def test_failed_getinfo_is_retried(dirs: tuple[str, str], handler: RecordingHandler) -> None:
    base, registry = dirs
    path = f"{registry}/raw-reg.sock"
    plugin = RawPlugin(raw_info(endpoint=f"{base}/plugins/raw/dra.sock"))
    plugin.fail = True
    async with serve(path, plugin), watching(registry, handler) as watcher:
        assert watcher.registered == {}
        await eventually(lambda: plugin.get_info_calls >= 3, what="retries")
        assert plugin.statuses == []  # nothing to say to a plugin that did not answer
        plugin.fail = False
        await eventually(lambda: plugin.statuses == [(True, "")], what="notification")
        assert path in watcher.registered


async def test_socket_file_without_a_listener_is_retried_quietly(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    _, registry = dirs
    os.mknod(f"{registry}/dead-reg.sock", stat.S_IFSOCK | 0o600)
    async with watching(registry, handler) as watcher:
        await asyncio.sleep(0.2)
        assert handler.calls == []
        assert watcher.stats() == {
            "registrations": 0,
            "rejections": 0,
            "removals": 0,
            "probe_failures": 0,
        }


async def test_socket_path_too_long_to_dial_is_ignored(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    _, registry = dirs
    deep = os.path.join(registry, *["d" * 20] * 5)
    os.makedirs(deep)
    os.mknod(f"{deep}/long-reg.sock", stat.S_IFSOCK | 0o600)
    watcher = PluginWatcher(registry, handler)
    await watcher.rescan()
    await watcher.rescan()
    assert handler.calls == []
    assert watcher.stats()["rejections"] == 1


# -- refusals ---------------------------------------------------------------------


async def test_invalid_plugin_is_refused_once_with_the_upstream_text(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    csi = RawPlugin(raw_info(kind="CSIPlugin", endpoint=f"{base}/plugins/csi.sock"))
    evil = RawPlugin(raw_info("../evil", f"{base}/plugins/evil/dra.sock"))
    async with (
        serve(f"{registry}/csi-reg.sock", csi),
        serve(f"{registry}/evil-reg.sock", evil),
        watching(registry, handler) as watcher,
    ):
        assert csi.statuses == [
            (False, "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin")
        ]
        assert len(evil.statuses) == 1
        ok, error = evil.statuses[0]
        assert not ok
        assert error.startswith("RegisterPlugin error -- plugin validation failed with err: ")
        assert "invalid DRA driver name" in error
        for _ in range(5):
            await watcher.rescan()
        assert csi.get_info_calls == evil.get_info_calls == 1
        assert len(csi.statuses) == len(evil.statuses) == 1
        assert handler.calls == []
        assert watcher.registered == {}
        assert watcher.stats()["rejections"] == 2


async def test_rejected_socket_is_tried_again_when_recreated(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    path = f"{registry}/raw-reg.sock"
    watcher = PluginWatcher(registry, handler)
    bad = RawPlugin(raw_info(endpoint="relative/dra.sock"))
    async with serve(path, bad):
        await watcher.rescan()
    assert bad.statuses[0][0] is False
    assert "must be an absolute path" in bad.statuses[0][1]
    good = RawPlugin(raw_info(endpoint=f"{base}/plugins/raw/dra.sock"))
    async with serve(path, good):
        await watcher.rescan()
        assert good.statuses == [(True, "")]
        assert handler.events() == [("register", RAW)]


async def test_handler_refusal_is_sent_back_and_retried(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    path = f"{registry}/raw-reg.sock"
    plugin = RawPlugin(raw_info(endpoint=f"{base}/plugins/raw/dra.sock"))
    handler.refusal = (
        f"endpoint {base}/plugins/raw/dra.sock already registered for DRA driver plugin {RAW}"
    )
    async with serve(path, plugin), watching(registry, handler) as watcher:
        assert plugin.statuses == [
            (
                False,
                "RegisterPlugin error -- plugin registration failed with err: " + handler.refusal,
            )
        ]
        assert watcher.registered == {}
        assert watcher.stats()["rejections"] == 1
        handler.refusal = None
        await eventually(lambda: plugin.statuses[-1] == (True, ""), what="retry")
        assert path in watcher.registered
        assert handler.count("deregister") == 0


async def test_handler_crash_is_a_refusal_and_the_watcher_keeps_going(
    dirs: tuple[str, str], handler: RecordingHandler, caplog: pytest.LogCaptureFixture
) -> None:
    base, registry = dirs
    plugin = RawPlugin(raw_info(endpoint=f"{base}/plugins/raw/dra.sock"))
    handler.crash = True
    with caplog.at_level(logging.ERROR, logger="drahealth.node._watcher"):
        async with serve(f"{registry}/raw-reg.sock", plugin), watching(registry, handler) as w:
            ok, error = plugin.statuses[0]
            assert not ok
            assert error.startswith("RegisterPlugin error -- plugin registration failed with err: ")
            assert "RuntimeError: handler exploded" in error
            assert "handler exploded" in caplog.text
            handler.crash = False
            await eventually(lambda: len(w.registered) == 1, what="registration after crash")


async def test_notification_failure_is_not_fatal(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    plugin = RawPlugin(raw_info(endpoint=f"{base}/plugins/raw/dra.sock"))
    plugin.fail_notify = True
    async with serve(f"{registry}/raw-reg.sock", plugin), watching(registry, handler) as w:
        assert plugin.statuses == [(True, "")]
        assert len(w.registered) == 1
        assert handler.events() == [("register", RAW)]


async def test_hanging_plugin_does_not_block_others(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    stuck = RawPlugin(raw_info("stuck.example.com", f"{base}/plugins/s/dra.sock"), hang=True)
    good = RawPlugin(raw_info("good.example.com", f"{base}/plugins/g/dra.sock"))
    async with watching(registry, handler, getinfo_timeout=30.0) as watcher:
        async with serve(f"{registry}/stuck-reg.sock", stuck):
            await eventually(lambda: stuck.get_info_calls == 1, what="stuck GetInfo")
            async with serve(f"{registry}/good-reg.sock", good):
                started = time.monotonic()
                await eventually(lambda: good.statuses == [(True, "")], within=3)
                assert time.monotonic() - started < 3
                assert handler.events() == [("register", "good.example.com")]
                assert list(watcher.registered) == [f"{registry}/good-reg.sock"]
            await eventually(lambda: handler.count("deregister") == 1, what="deregister")
        assert stuck.statuses == []


async def test_getinfo_timeout_then_retry(dirs: tuple[str, str], handler: RecordingHandler) -> None:
    base, registry = dirs
    plugin = RawPlugin(raw_info(endpoint=f"{base}/plugins/raw/dra.sock"), hang=True)
    async with serve(f"{registry}/raw-reg.sock", plugin):
        watcher = PluginWatcher(registry, handler, getinfo_timeout=0.1)
        started = time.monotonic()
        await watcher.rescan()
        assert time.monotonic() - started < 2
        assert watcher.registered == {}
        plugin.hang = False
        await asyncio.sleep(0.6)  # past the first backoff delay (<= 0.5 s)
        await watcher.rescan()
        assert len(watcher.registered) == 1


async def test_failing_deregistration_is_logged_and_forgotten(
    dirs: tuple[str, str], handler: RecordingHandler, caplog: pytest.LogCaptureFixture
) -> None:
    base, registry = dirs

    async def broken(info: PluginInfo) -> None:
        handler.calls.append(("deregister", info))
        raise RuntimeError("cannot deregister")

    handler.deregister = broken  # type: ignore[method-assign]
    watcher = PluginWatcher(registry, handler)
    async with serve(f"{registry}/raw-reg.sock", RawPlugin(raw_info(endpoint=f"{base}/p.sock"))):
        await watcher.rescan()
    with caplog.at_level(logging.ERROR, logger="drahealth.node._watcher"):
        await watcher.rescan()
    assert "cannot deregister" in caplog.text
    assert handler.events() == [("register", RAW), ("deregister", RAW)]
    assert watcher.registered == {}
    await watcher.rescan()
    assert handler.count("deregister") == 1


async def test_registry_dir_removed_and_recreated(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    plugin = RawPlugin(raw_info(endpoint=f"{base}/plugins/raw/dra.sock"))
    async with watching(registry, handler) as watcher:
        async with serve(f"{registry}/raw-reg.sock", plugin):
            await eventually(lambda: plugin.statuses == [(True, "")], what="registration")
            assert len(watcher.registered) == 1
            shutil.rmtree(registry)
            await eventually(lambda: handler.count("deregister") == 1, what="deregister")
        # Back again: periodic rescans find it even if the watch was lost.
        again = RawPlugin(raw_info("again.example.com", f"{base}/plugins/a/dra.sock"))
        async with serve(f"{registry}/again-reg.sock", again):
            await eventually(lambda: again.statuses == [(True, "")], what="registration")
            assert handler.events()[-1] == ("register", "again.example.com")


# -- lifecycle and arguments ------------------------------------------------------


async def test_stop_deregisters_nothing_and_start_creates_the_dir(
    handler: RecordingHandler,
) -> None:
    base = short_dir("drw-")
    try:
        registry = f"{base}/plugins_registry"
        watcher = PluginWatcher(registry, handler, rescan_interval=0.05)
        await watcher.start()
        assert is_dir(registry)
        with pytest.raises(RuntimeError, match="already started"):
            await watcher.start()
        async with serve(
            f"{registry}/raw-reg.sock", RawPlugin(raw_info(endpoint=f"{base}/plugins/r.sock"))
        ):
            await eventually(lambda: len(watcher.registered) == 1, what="registration")
            await watcher.stop()
            await watcher.stop()  # idempotent
        await asyncio.sleep(0.15)
        assert handler.events() == [("register", RAW)]
        assert len(watcher.registered) == 1
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_default_allowed_root_is_the_registry_parent(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    base, registry = dirs
    inside = RawPlugin(raw_info("in.example.com", f"{base}/plugins/in/dra.sock"))
    outside = RawPlugin(raw_info("out.example.com", "/run/out/dra.sock"))
    async with (
        serve(f"{registry}/in-reg.sock", inside),
        serve(f"{registry}/out-reg.sock", outside),
    ):
        watcher = PluginWatcher(registry, handler)
        await watcher.rescan()
        assert inside.statuses == [(True, "")]
        assert "is not inside the kubelet root directory" in outside.statuses[0][1]
        assert f'"{base}"' in outside.statuses[0][1]
        other = RecordingHandler()
        explicit = PluginWatcher(registry, other, allowed_roots=["/run"])
        await explicit.rescan()
        assert other.events() == [("register", "out.example.com")]


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"rescan_interval": 0}, ValueError, "rescan_interval"),
        ({"probe_interval": -1.0}, ValueError, "probe_interval"),
        ({"getinfo_timeout": 0.0}, ValueError, "getinfo_timeout"),
        ({"notify_timeout": float("nan")}, ValueError, "notify_timeout"),
        ({"probe_failures": 0}, ValueError, "probe_failures"),
        ({"probe_failures": 1.5}, TypeError, "probe_failures"),
        ({"allowed_roots": []}, ValueError, "at least one"),
        ({"allowed_roots": ["relative"]}, ValueError, "absolute"),
        ({"allowed_roots": "/var/lib/kubelet"}, TypeError, "single string"),
    ],
)
def test_bad_arguments(kw: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        PluginWatcher("/tmp/registry", RecordingHandler(), **kw)


def test_empty_registry_dir_is_refused() -> None:
    with pytest.raises(ValueError, match="registry_dir"):
        PluginWatcher("", RecordingHandler())


async def test_observer_watcher_registers_without_notifying(
    dirs: tuple[str, str], handler: RecordingHandler
) -> None:
    """Beside a real kubelet (observer mode) the kubelet answers the plugin; the agent
    must not send its own NotifyRegistrationStatus."""
    base, registry = dirs
    handle = await start_plugin(TinyDriver(), plugin_options(base))
    try:
        async with watching(registry, handler, notify=False) as watcher:
            assert handler.count("register") == 1 and len(watcher.registered) == 1
            await asyncio.sleep(0.2)
            assert handle.registration_status is None
    finally:
        await handle.stop(0)
