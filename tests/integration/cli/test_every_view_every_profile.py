"""Every read-only command and the taint command against every release profile.

The embedded API server plays Kubernetes 1.34 to 1.38 with default gates; the real
``drahealth`` CLI runs as subprocesses. No command prints a traceback, the views exit 0,
each says which remediation mode follows, and ``taint`` writes a rule where the release
serves the API and exits 1 with one line where it does not.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from lightkube.resources.core_v1 import Node

from drahealth.controlplane import APIServer
from drahealth.core import KUBE_VERSIONS, kube_profile
from drahealth.kube import make_client
from tests.integration.cli.test_views import run

pytestmark = pytest.mark.timeout(120)

RULE_API = {"1.34": None, "1.35": None, "1.36": None, "1.37": "v1", "1.38": "v1"}
MODE = {v: "taint-rules" if RULE_API[v] else "quarantine" for v in KUBE_VERSIONS}


@pytest.mark.parametrize(
    "version",
    # the default run covers both modes (quarantine 1.35, taint-rules 1.38); the slow step
    # the other releases
    [v if v in ("1.35", "1.38") else pytest.param(v, marks=pytest.mark.slow)
     for v in KUBE_VERSIONS],
)  # fmt: skip
async def test_every_command_on_the_release(version: str, tmp_path: Path) -> None:
    server = APIServer(profile=kube_profile(version))
    await server.start(host="127.0.0.1", port=0)
    try:
        kubeconfig = str(tmp_path / "kubeconfig")
        server.write_kubeconfig(kubeconfig)
        client = make_client(server_url=server.url)
        await client.create(Node.from_dict({"metadata": {"name": "node-1"}}))
        await client.close()
        k = ("--kubeconfig", kubeconfig)
        commands = {
            "status": ("status", *k),
            "pods": ("pods", *k),
            "history": ("history", *k, "gpu.example.com/node-1/gpu-0"),
            "version": ("version", *k),
            "doctor": ("doctor", *k, "--component", "controller"),
            "taint": (
                "taint", *k, "gpu.example.com/node-1/gpu-0",
                "--key", "example.com/maintenance", "--effect", "NoSchedule", "--force",
            ),
        }  # fmt: skip
        results: dict[str, subprocess.CompletedProcess[str]] = dict(
            zip(
                commands,
                await asyncio.gather(
                    *(asyncio.to_thread(run, *args) for args in commands.values())
                ),
                strict=True,
            )
        )
    finally:
        await server.stop()

    for name, out in results.items():
        assert "Traceback" not in out.stdout + out.stderr, (name, out.stderr)
    for name in ("status", "pods", "history", "version", "doctor"):
        assert results[name].returncode == 0, (name, results[name].stdout, results[name].stderr)
    both = {name: out.stdout + out.stderr for name, out in results.items()}
    assert f"auto would choose {MODE[version]}" in both["status"], both["status"]
    assert f"Remediation mode auto: {MODE[version]}" in both["version"], both["version"]
    assert f"auto -> {MODE[version]}" in both["doctor"], both["doctor"]
    assert results["taint"].returncode == 0, both["taint"]  # a rule, else a quarantine
    if RULE_API[version]:
        assert "not served" not in both["status"]
        assert both["taint"].startswith("devicetaintrule/"), both["taint"]
    else:
        assert both["taint"].startswith("resourceclaim/drahealth-operator-quarantine-"), both
        assert "not served" in both["status"]
