"""Hostile plugin registry directories: the watcher stays correct and responsive.

1,000 sockets created at once that nobody answers, symlinks pointing outside the
directory, names and endpoints trying path traversal, a plugin that accepts and never
answers: the one real plugin beside them is still registered within seconds, nothing
hostile is registered, and nothing crashes.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from drahealth.driver._plugin import start as start_plugin
from tests.integration.node.test_watcher import (
    DRIVER,
    RawPlugin,
    RecordingHandler,
    TinyDriver,
    dirs,
    eventually,
    plugin_options,
    raw_info,
    serve,
    watching,
)

__all__ = ["dirs"]

pytestmark = pytest.mark.timeout(120)


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def dead_sockets(registry: str, count: int) -> list[socket.socket]:
    """Bound unix sockets that never listen: every dial is refused."""
    out = []
    for i in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(os.path.join(registry, f"junk-{i:04d}-reg.sock"))
        out.append(s)
    return out


async def test_a_real_plugin_registers_among_1000_dead_sockets_and_hostile_entries(
    dirs: tuple[str, str],
) -> None:
    base, registry = dirs
    junk = dead_sockets(registry, 1000)
    outside = os.path.join(base, "outside.sock")
    out_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    out_sock.bind(outside)
    out_sock.listen()
    os.symlink(outside, os.path.join(registry, "escape-reg.sock"))  # points out of the dir
    os.symlink("/etc/passwd", os.path.join(registry, "passwd-reg.sock"))
    os.mkdir(os.path.join(registry, "..hidden"))
    write(os.path.join(registry, "not-a-socket-reg.sock"), "x")
    handler = RecordingHandler()
    traversal = RawPlugin(raw_info("evil.example.com", f"{base}/plugins/../../../etc/evil.sock"))
    silent = RawPlugin(raw_info("slow.example.com", f"{base}/plugins/slow.sock"), hang=True)
    handle = await start_plugin(TinyDriver(), plugin_options(base))
    t0 = time.monotonic()
    try:
        async with (
            serve(os.path.join(registry, "evil-reg.sock"), traversal),
            serve(os.path.join(registry, "slow-reg.sock"), silent),
            watching(registry, handler, probe_interval=0.2) as watcher,
        ):
            await eventually(
                lambda: handler.count("register") >= 1, within=30, what="the real plugin"
            )
            took = time.monotonic() - t0
            print(f"\nreal plugin registered {took:.2f} s after start among 1,000 dead sockets")
            assert [info.driver for kind, info in handler.calls if kind == "register"] == [DRIVER]
            assert set(watcher.registered) == {f"{registry}/{DRIVER}-reg.sock"}
            # the traversal endpoint was refused with the upstream text
            await eventually(lambda: traversal.statuses != [], within=10, what="refusal")
            registered, error = traversal.statuses[0]
            assert not registered and "is not inside the kubelet root directory" in error
            assert took < 30
    finally:
        await handle.stop(0)
        out_sock.close()
        for s in junk:
            s.close()


OTHER_UID = 54321


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a socket to another user needs root")
async def test_sockets_owned_by_other_users_are_refused(dirs: tuple[str, str]) -> None:
    """A registration socket or endpoint someone else owns is never registered; the
    same plugin is accepted when its owner is allowed."""
    base, registry = dirs
    endpoint = f"{base}/plugins/raw/dra.sock"
    os.makedirs(os.path.dirname(endpoint))
    dra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dra.bind(endpoint)
    dra.listen()
    foreign_reg = RawPlugin(raw_info(endpoint=endpoint))
    foreign_endpoint = RawPlugin(raw_info("raw2.example.com", endpoint=endpoint))
    handler = RecordingHandler()
    try:
        async with (
            serve(f"{registry}/foreign-reg.sock", foreign_reg),
            serve(f"{registry}/mine-reg.sock", foreign_endpoint),
        ):
            os.chown(f"{registry}/foreign-reg.sock", OTHER_UID, OTHER_UID)
            os.chown(endpoint, OTHER_UID, OTHER_UID)
            async with watching(registry, handler) as watcher:
                await eventually(lambda: watcher.stats()["rejections"] == 2, what="2 refusals")
                for _ in range(3):
                    await watcher.rescan()
                assert handler.calls == [] and watcher.registered == {}
                assert foreign_reg.get_info_calls == 0  # not even asked
                [(ok, error)] = foreign_endpoint.statuses
                assert not ok and f"owned by uid {OTHER_UID}" in error
            # an operator who runs drivers as that user allows it explicitly
            handler = RecordingHandler()
            async with watching(registry, handler, allowed_uids=[0, OTHER_UID]) as watcher:
                await eventually(lambda: len(watcher.registered) == 2, what="both registered")
        print(f"\nforeign-owned sockets: 2 refused, 0 registered; allowed uid {OTHER_UID}: 2")
    finally:
        dra.close()
