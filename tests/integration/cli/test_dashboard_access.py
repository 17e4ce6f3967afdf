"""``drahealth dashboard`` finds its cluster as kubectl does: ``$KUBECONFIG`` and
``--context`` (a real subprocess against the embedded API server)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from pathlib import Path

import aiohttp
import yaml
from lightkube import AsyncClient

from drahealth.controlplane import APIServer
from tests.integration.cli.test_views import NODE, scenario
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_contexts(server: APIServer, path: Path) -> Path:
    """The server's kubeconfig plus a context ``broken`` (a closed port) made current."""
    config = yaml.safe_load(server.write_kubeconfig(path).read_text())
    config["clusters"].append(
        {"name": "gone", "cluster": {"server": f"http://127.0.0.1:{_closed_port()}"}}
    )
    config["contexts"].append(
        {"name": "broken", "context": {"cluster": "gone", "user": "drahealth"}}
    )
    config["current-context"] = "broken"
    path.write_text(yaml.safe_dump(config))
    return path


async def _dashboard(*args: str, env: dict[str, str]) -> tuple[int | None, str, str]:
    """Run the dashboard; its exit code (None if it served), first line, and the state's
    first node when it served."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "drahealth", "dashboard", "--port", "0", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().strip()
        if not line.startswith("dashboard: "):
            return await asyncio.wait_for(proc.wait(), 30), line, ""
        url = line.removeprefix("dashboard: ")
        async with aiohttp.ClientSession() as http, http.get(url + "api/state") as resp:
            state = await resp.json()
        return None, line, state["nodes"][0]["name"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


async def test_kubeconfig_env_and_context_pick_the_cluster(
    server: APIServer, client: AsyncClient, tmp_path: Path
) -> None:
    await scenario(client)
    kubeconfig = _two_contexts(server, tmp_path / "config")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    code, line, _ = await _dashboard("--kubeconfig", str(kubeconfig), env=env)
    assert code == 1 and line.startswith("error: cannot reach the API server"), line
    code, line, node = await _dashboard(
        "--context", "drahealth", env={**env, "KUBECONFIG": str(kubeconfig)}
    )
    assert code is None and node == NODE, line
    code, line, _ = await _dashboard(
        "--context", "nope", env={**env, "KUBECONFIG": str(kubeconfig)}
    )
    assert code == 2 and line.startswith("error:") and "nope" in line, line
