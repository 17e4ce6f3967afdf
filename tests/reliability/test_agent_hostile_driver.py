"""Hostile DRA drivers against the node agent: no fault report is lost to bad input.

Real gRPC over unix sockets (short paths under /tmp: ``sun_path`` is 108 bytes). A
driver whose health stream sends bytes that do not decode (invalid UTF-8 in a string
field, not protobuf at all) or whose stream task meets an unexpected exception must
not lose its later "XID 79"; a driver flooding 100,000 devices must not crowd out
another driver's Unhealthy gpu-0, and the refusals must show in the metrics; names the
API would refuse never reach the cache, labels or ConfigMaps; a removed driver's
devices read Unknown within the removal grace; a failing disk is logged as two state
changes, not one traceback per write.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import generate_latest

from drahealth import api
from drahealth.core import Health
from drahealth.core._records import ReportedDevice
from drahealth.kube import Backoff
from drahealth.node import _stream
from drahealth.node._agent import AgentConfig, NodeAgent
from drahealth.node._pipeline import HealthPipeline
from drahealth.node._registry import PluginRegistry
from drahealth.node._types import PluginInfo
from tests import rawproto
from tests._support import eventually
from tests.integration.node.test_stream import STALL, RawPlugin, Step, dev, response

pytestmark = pytest.mark.timeout(60)

H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN
GPU = "gpu.example.com"
XID = response(dev("gpu-0", U, "XID 79"))


def bad_utf8() -> bytes:
    """A NodeWatchResourcesResponse whose pool name is the bytes ff fe (not UTF-8)."""
    ident = rawproto.field_bytes(1, b"\xff\xfe") + rawproto.field_bytes(2, b"gpu-0")
    health = rawproto.field_bytes(1, ident) + rawproto.field_varint(2, 2)
    return rawproto.field_bytes(1, health)


def info(path: str, driver: str = GPU) -> PluginInfo:
    return PluginInfo(driver, path, (api.DRA_PLUGIN_V1, api.DRA_HEALTH_V1), path)


@asynccontextmanager
async def agent_parts(
    state_dir: str | None = None, **kw: Any
) -> AsyncIterator[tuple[PluginRegistry, HealthPipeline]]:
    pipeline = HealthPipeline(state_dir, **kw)
    registry = PluginRegistry(
        on_report=pipeline.report,
        backoff_factory=lambda: Backoff(0.01, 0.05, jitter=0.0),
        on_event=lambda driver, kind, _gen: (
            pipeline.retire(driver) if kind == "deactivate" else None
        ),
    )
    await pipeline.start()
    try:
        yield registry, pipeline
    finally:
        await registry.close()
        await pipeline.stop()


# -- undecodable messages and unexpected errors ------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [pytest.param(bad_utf8(), id="invalid-utf8"), pytest.param(b"\xff\xff\xff\xff", id="garbage")],
)
async def test_an_undecodable_message_is_a_stream_error_and_the_next_fault_is_seen(
    sockdir: str, bad: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = f"{sockdir}/dra.sock"
    script: list[Step] = [response(dev("gpu-0", H)), bad, STALL]
    plugin = RawPlugin(path, scripts=[script, [XID, STALL]])
    await plugin.start()
    try:
        async with agent_parts() as (registry, pipeline):
            await registry.register(info(path))
            await eventually(
                lambda: pipeline.cache.get(GPU, "pool", "gpu-0") == (U, "XID 79"),
                what="the XID 79 sent after the undecodable message",
            )
            stream = registry.stream(GPU)
            assert stream is not None and stream.running
            assert stream.bad_messages == 1 and stream.reconnects == 1
    finally:
        await plugin.stop()
    undecodable = [r for r in caplog.records if "undecodable message" in r.getMessage()]
    assert len(undecodable) == 1 and undecodable[0].levelno == logging.WARNING
    # no traceback from the agent (grpc's poller may log one for an earlier test's closed loop)
    assert not [r for r in caplog.records if r.exc_info and r.name.startswith("drahealth")]


async def test_any_unexpected_exception_in_the_stream_task_reconnects(
    sockdir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _stream._convert
    calls = 0

    def flaky(message: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise AttributeError("a bug in the conversion")
        return real(message)

    monkeypatch.setattr(_stream, "_convert", flaky)
    path = f"{sockdir}/dra.sock"
    plugin = RawPlugin(path, scripts=[[response(dev("gpu-0", H)), STALL], [XID, STALL]])
    await plugin.start()
    try:
        async with agent_parts() as (registry, pipeline):
            await registry.register(info(path))
            await eventually(
                lambda: pipeline.cache.get(GPU, "pool", "gpu-0") == (U, "XID 79"),
                what="the report after the unexpected exception",
            )
            stream = registry.stream(GPU)
            assert stream is not None and stream.running and stream.unexpected_errors == 1
    finally:
        await plugin.stop()


# -- floods, bad names, duplicates ------------------------------------------------------------


async def test_a_100000_device_flood_does_not_crowd_out_another_drivers_fault(
    sockdir: str, caplog: pytest.LogCaptureFixture
) -> None:
    flood = response(*(dev(f"junk-{i}", H) for i in range(100_000)))
    hostile = RawPlugin(f"{sockdir}/flood.sock", scripts=[[flood, STALL]])
    gpu = RawPlugin(f"{sockdir}/gpu.sock", scripts=[[XID, STALL]])
    await hostile.start()
    await gpu.start()
    agent = NodeAgent(
        AgentConfig(node_name="n1", registry_dir=f"{sockdir}/reg", state_dir=f"{sockdir}/st",
                    mode="observer"),
        None,
    )  # fmt: skip
    pipeline = agent.pipeline
    agent.metrics.watch(
        dict,
        lambda: 0,
        rejections=lambda: pipeline.cache.rejections,
        stream_errors=dict,
        persist_failing=lambda: pipeline.persist_failing,
    )
    pipeline.add_listener(agent.metrics.on_changes)
    await pipeline.start()
    try:
        await agent.registry.register(info(hostile.path, "flood.example.com"))
        t0 = time.monotonic()
        await eventually(lambda: pipeline.updates >= 1, within=30, what="the flood")
        print(f"\n100,000-device report applied in {time.monotonic() - t0:.2f} s")
        await agent.registry.register(info(gpu.path))
        await eventually(
            lambda: pipeline.cache.get(GPU, "pool", "gpu-0") == (U, "XID 79"),
            what="gpu-0's Unhealthy beside the flood",
        )
        assert pipeline.cache.device_count("flood.example.com") == 4096
        text = generate_latest(agent.metrics.registry).decode()
        assert (
            'drahealth_node_rejected_reports_total{driver="flood.example.com",node="n1",'
            'reason="driver_full"} 95904.0' in text
        )
        refused = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 1 and "95904" in refused[0].getMessage()
    finally:
        await agent.registry.close()
        await pipeline.stop()
        await hostile.stop()
        await gpu.stop()


async def test_names_the_api_refuses_are_never_stored_or_exported(sockdir: str) -> None:
    path = f"{sockdir}/dra.sock"
    hostile = response(
        dev("gpu/0", U), dev("gpu 0", U), dev("gpu\x000", U), dev("gpu\x1b[2J", U),
        dev("x", U, pool="a//b"), dev("d" * 64, U), dev("gpu-1", H),
        dev("gpu-0", U, "XID 79"), dev("gpu-0", H), dev("gpu-2", H, timeout=2**63 - 1),
    )  # fmt: skip
    plugin = RawPlugin(path, scripts=[[hostile, STALL]])
    await plugin.start()
    try:
        async with agent_parts() as (registry, pipeline):
            await registry.register(info(path))
            await eventually(lambda: pipeline.updates >= 1, what="the report")
            cache = pipeline.cache
            assert [e.device for e in cache.entries()] == ["gpu-0", "gpu-1", "gpu-2"]
            # a later Healthy duplicate does not hide the Unhealthy one
            assert cache.get(GPU, "pool", "gpu-0") == (U, "XID 79")
            gpu2 = cache.entry(GPU, "pool", "gpu-2")
            assert gpu2 is not None and gpu2.timeout == 3600.0  # 2^63-1 s clamped
            assert cache.rejections == {(GPU, "invalid"): 6}
    finally:
        await plugin.stop()


# -- a driver that goes away ------------------------------------------------------------------


async def test_a_removed_driver_reads_unknown_within_the_removal_grace(sockdir: str) -> None:
    path = f"{sockdir}/dra.sock"
    plugin = RawPlugin(path, scripts=[[response(dev("gpu-0", U, "XID 79", 3600)), STALL]])
    await plugin.start()
    agent = NodeAgent(
        AgentConfig(node_name="n1", registry_dir=f"{sockdir}/reg", state_dir=f"{sockdir}/st",
                    mode="observer", removal_grace=0.3),
        None,
    )  # fmt: skip
    pipeline = agent.pipeline
    await pipeline.start()
    try:
        await agent.registry.register(info(path))
        await eventually(lambda: pipeline.cache.get(GPU, "pool", "gpu-0")[0] is U)
        t0 = time.monotonic()
        await agent.registry.deregister(info(path))
        await eventually(
            lambda: pipeline.cache.get(GPU, "pool", "gpu-0") == (X, ""),
            within=5,
            what="Unknown after removal (lease declared: 1 hour)",
        )
        took = time.monotonic() - t0
        print(f"\nremoved driver's device Unknown after {took:.2f} s (grace 0.3 s)")
        assert 0.25 < took < 3.0, took
        await eventually(lambda: len(pipeline.cache) == 0, what="the driver forgotten")
    finally:
        await agent.registry.close()
        await pipeline.stop()
        await plugin.stop()


# -- a failing disk -----------------------------------------------------------------------------


async def test_a_full_disk_is_logged_when_it_starts_and_ends_not_per_write(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from drahealth.node import _health_store

    full = True
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    async with agent_parts(str(tmp_path)) as (_, pipeline):
        monkeypatch.setattr(_health_store.os, "fsync", fsync)
        for i in range(500):
            health = U if i % 2 else H
            changes = pipeline.report(GPU, [ReportedDevice("pool", "gpu-0", health)])
            assert changes  # the agent keeps working from memory
        assert pipeline.persist_failing and pipeline.persist_failures == 500
        full = False
        pipeline.report(GPU, [ReportedDevice("pool", "gpu-1", U, "ecc")])
        assert not pipeline.persist_failing
    errors = [r for r in caplog.records if r.name == "drahealth.node._pipeline"]
    assert [r.levelno for r in errors] == [logging.ERROR, logging.WARNING], errors
    assert not [r for r in errors if r.exc_info]
    # nothing was lost: the whole cache was written when the disk came back
    again = HealthPipeline(str(tmp_path))
    await again.start()
    try:
        assert again.cache.get(GPU, "pool", "gpu-0") == (U, "")
        assert again.cache.get(GPU, "pool", "gpu-1") == (U, "ecc")
    finally:
        await again.stop()
