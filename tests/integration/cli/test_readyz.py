"""``/readyz`` of the real ``drahealth driver`` and ``drahealth agent`` processes.

Against the embedded API server: the driver is alive but not ready until the kubelet
(here the agent in kubelet mode) has registered it; both get ready once synced; both
say "API server unreachable" when the API server goes away, while ``/healthz`` stays
``ok`` (a lost API must not get the pods restarted).
"""

from __future__ import annotations

import asyncio
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from lightkube import AsyncClient

from drahealth.controlplane import APIServer
from tests._support import eventually
from tests.e2e.test_agent_e2e import AgentProcess, agents, start_agent
from tests.integration.driver.test_sample_driver import base, launch, processes
from tests.integration.driver.test_sample_driver_kube import apiserver, kube, kubeconfig

__all__ = ["agents", "apiserver", "base", "kube", "kubeconfig", "launch", "processes"]
__all__ += ["start_agent"]

pytestmark = pytest.mark.timeout(60)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def probe(metrics_url: str, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(_get, metrics_url.removesuffix("/metrics") + path)


def metrics_url(output: str) -> str:
    found = re.search(r"^metrics: (\S+)$", output, re.M)
    assert found, output
    return found.group(1)


async def test_driver_and_agent_readiness(
    apiserver: APIServer,
    kube: AsyncClient,
    kubeconfig: str,
    launch: Callable[..., Any],
    start_agent: Callable[..., Any],
) -> None:
    driver = await launch(kubeconfig=kubeconfig, metrics_port=0, api_check_interval=0.2)
    durl = metrics_url(driver.output)
    assert await probe(durl, "/healthz") == (200, "ok\n")
    # no kubelet has registered the plugin yet
    status, text = await probe(durl, "/readyz")
    assert status == 503 and text.startswith("not registered with the kubelet yet"), text

    agent: AgentProcess = await start_agent("--metrics-port", "0", "--api-check-interval", "0.2")
    aurl = metrics_url(agent.output)

    async def ready(url: str) -> bool:
        return await probe(url, "/readyz") == (200, "ok\n")

    await eventually(lambda: ready(durl), 10, "the driver's /readyz to say ok")
    await eventually(lambda: ready(aurl), 10, "the agent's /readyz to say ok")

    await apiserver.stop()

    async def unreachable(url: str) -> str:
        status, text = await probe(url, "/readyz")
        return text if status == 503 and "API server unreachable" in text else ""

    said = await eventually(lambda: unreachable(durl), 10, "the driver to see the API gone")
    await eventually(lambda: unreachable(aurl), 10, "the agent to see the API gone")
    assert said.startswith("API server unreachable: "), said
    assert await probe(durl, "/healthz") == (200, "ok\n")
    assert await probe(aurl, "/healthz") == (200, "ok\n")
