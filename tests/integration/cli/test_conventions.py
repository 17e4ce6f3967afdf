"""The kubectl conventions of the CLI, as subprocesses against a real embedded API server.

The scenario is the views' one (tests/integration/cli/test_views.py): node-1 with
gpu-0..gpu-3, gpu-1 Unhealthy and used by ml/train, gpu-2 Unknown, gpu-3 tainted, ml/infer
on the Healthy gpu-0. Each test names the convention it checks: ``$KUBECONFIG`` and
``--context``, the context's namespace, ``-n``/``-A``, every ``-o`` format, errors on one
line without a traceback, exit codes, ``-w``, ``taint --force``, ``history`` finding the
controller, ``--help`` and completion.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod
from lightkube.types import PatchType

from drahealth.controlplane import APIServer
from tests.integration.cli.test_views import BIN, NODE, D, scenario
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    full.pop("KUBECONFIG", None) if env is None or "KUBECONFIG" not in env else None
    return subprocess.run(
        [str(BIN), *args], capture_output=True, text=True, timeout=60, check=False, env=full
    )


def _one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    return line


@pytest.fixture
async def kubeconfig(server: APIServer, client: AsyncClient, tmp_path: Path) -> str:
    """A kubeconfig with the live server as context ``live`` (namespace ml) and a dead
    one as ``dead`` (the current context)."""
    await scenario(client)
    live = yaml.safe_load(server.write_kubeconfig(tmp_path / "live").read_text())
    (ctx,) = live["contexts"]
    ctx["name"] = "live"
    ctx["context"]["namespace"] = "ml"
    live["clusters"].append({"name": "dead", "cluster": {"server": "http://127.0.0.1:1"}})
    live["contexts"].append(
        {"name": "dead", "context": {"cluster": "dead", "user": ctx["context"]["user"]}}
    )
    live["current-context"] = "dead"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(live))
    return str(path)


async def test_kubeconfig_env_context_and_the_contexts_namespace(kubeconfig: str) -> None:
    env = {"KUBECONFIG": f"/nonexistent/config:{kubeconfig}"}
    # the current context is dead: one line naming the server and what to check, exit 1
    dead = await asyncio.to_thread(run, "pods", "-o", "json", env=env)
    assert dead.returncode == 1
    line = _one_line_error(dead)
    assert "cannot reach the API server at http://127.0.0.1:1" in line and "check" in line
    # --context picks the live one; its namespace (ml) is the default
    live = await asyncio.to_thread(run, "pods", "--context", "live", "-o", "json", env=env)
    assert live.returncode == 3, live.stderr  # ml/train's device is Unhealthy
    assert {r["namespace"] for r in json.loads(live.stdout)} == {"ml"}
    # -n overrides the context's namespace; an empty result says where it looked
    other = await asyncio.to_thread(run, "pods", "--context", "live", "-n", "default", env=env)
    assert other.returncode == 0 and other.stdout == ""
    assert other.stderr == "No pods using DRA devices found in default namespace.\n"
    # --kubeconfig wins over $KUBECONFIG
    flag = await asyncio.to_thread(
        run, "version", "--kubeconfig", kubeconfig, "--context", "live",
        env={"KUBECONFIG": "/nonexistent/config"},
    )  # fmt: skip
    assert flag.returncode == 0 and "Server Version: v1." in flag.stdout, flag.stderr
    unknown = await asyncio.to_thread(run, "status", "--kubeconfig", kubeconfig, "--context", "x")
    assert unknown.returncode == 2
    assert "context 'x' not found (available: live, dead)" in _one_line_error(unknown)


async def test_namespaces_decide_whose_pods_are_consumers_and_the_exit_code(
    kubeconfig: str,
) -> None:
    k = ("--kubeconfig", kubeconfig, "--context", "live")
    ml = await asyncio.to_thread(run, "status", *k, "-o", "json")  # the context's: ml
    everywhere = await asyncio.to_thread(run, "status", *k, "-A", "-o", "json")
    default = await asyncio.to_thread(run, "status", *k, "-n", "default", "-o", "json")
    assert (ml.returncode, everywhere.returncode) == (3, 3), ml.stderr
    # devices are cluster-scoped: the same three rows; only the consumers differ
    assert default.returncode == 0, default.stderr
    rows = json.loads(default.stdout)
    assert [r["device"].rsplit("/", 1)[1] for r in rows] == ["gpu-1", "gpu-2", "gpu-3"]
    assert all(r["consumers"] == [] for r in rows)
    assert [c["pod"] for c in json.loads(ml.stdout)[0]["consumers"]] == ["train"]


@pytest.mark.slow  # 8-11 s on 2 cores: the default run stays under 15 min
async def test_every_output_format(kubeconfig: str) -> None:
    k = ("--kubeconfig", kubeconfig, "--context", "live", "-A")
    names = await asyncio.to_thread(run, "pods", *k, "-o", "name")
    assert names.stdout == "pod/infer\npod/train\n"
    devices = await asyncio.to_thread(run, "status", *k, "-o", "name")
    assert devices.stdout.splitlines() == [f"device/{D}/{NODE}/gpu-{i}" for i in (1, 2, 3)]
    template = '{range .items[*]}{.pod}={.health}{"\\n"}{end}'
    jp = await asyncio.to_thread(run, "pods", *k, "-o", f"jsonpath={template}")
    assert jp.stdout == "infer=Healthy\ntrain=Unhealthy\n"
    cc = await asyncio.to_thread(
        run, "status", *k, "-o", "custom-columns=DEVICE:.device,PODS:.consumers[*].pod"
    )
    assert cc.stdout.splitlines() == [
        "DEVICE                         PODS",
        f"{D}/{NODE}/gpu-1   train",
        f"{D}/{NODE}/gpu-2   <none>",
        f"{D}/{NODE}/gpu-3   <none>",
    ]
    yml = await asyncio.to_thread(run, "pods", *k, "-o", "yaml")
    assert [r["pod"] for r in yaml.safe_load(yml.stdout)] == ["infer", "train"]
    wide = await asyncio.to_thread(run, "pods", *k, "-o", "wide")
    header, *lines = wide.stdout.splitlines()
    assert header.split() == [
        "NAMESPACE", "POD", "NODE", "DEVICE", "HEALTH", "MESSAGE", "PHASE", "CLAIM", "SOURCE"
    ]  # fmt: skip
    assert lines[1].startswith("ml          train   node-1   ") and "train-gpu/gpu" in lines[1]
    # machine output: RFC 3339 times (the table shows kubectl ages)
    js = await asyncio.to_thread(run, "status", *k, "-o", "json")
    assert all(r["since"].endswith("Z") and "T" in r["since"] for r in json.loads(js.stdout))
    bad = await asyncio.to_thread(run, "pods", *k, "-o", "jsonpath={.items[")
    assert bad.returncode == 2 and "unclosed {" in bad.stderr
    history = await asyncio.to_thread(run, "history", *k[:4], f"{D}/{NODE}/gpu-1", "-o", "name")
    assert history.returncode == 2 and "history lists events, not named objects" in history.stderr


async def test_bad_kubeconfig_files_are_one_line(tmp_path: Path) -> None:
    cases = {
        "missing": (None, "file not found"),
        "yaml": ("key: [unclosed\n", "invalid YAML"),
        "empty": ("", "expected a kubeconfig mapping, got an empty document"),
        "nocontext": ("clusters: []\n", "no contexts defined"),
    }
    for name, (text, fragment) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        out = await asyncio.to_thread(run, "status", "--kubeconfig", str(path))
        assert out.returncode == 2, (name, out.stderr)
        line = _one_line_error(out)
        assert fragment in line and "check --kubeconfig, $KUBECONFIG and --context" in line


async def test_a_missing_api_kind_and_a_missing_ca_file_are_one_line(
    kubeconfig: str, tmp_path: Path
) -> None:
    doc = yaml.safe_load(await asyncio.to_thread(Path(kubeconfig).read_text))
    doc["clusters"][0]["cluster"]["certificate-authority"] = str(tmp_path / "nope.crt")
    path = tmp_path / "ca-missing"
    await asyncio.to_thread(path.write_text, yaml.safe_dump(doc))
    out = await asyncio.to_thread(run, "pods", "--kubeconfig", str(path), "--context", "live")
    assert out.returncode == 1
    assert "certificate-authority file" in _one_line_error(out)


class _Printed:
    """What a running ``-w`` command prints, line by line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.put(line.rstrip("\n"))

    async def __call__(self, text: str) -> None:
        """Wait (at most 30 s) until ``text`` is printed as a line."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if await asyncio.to_thread(self.lines.get, True, 1.0) == text:
                    return
            except queue.Empty:
                continue
        raise AssertionError(f"{text!r} not printed")


async def _follow(args: list[str]) -> tuple[subprocess.Popen[str], _Printed]:
    proc = await asyncio.to_thread(
        subprocess.Popen, args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, _Printed(proc)


async def test_watch_prints_again_on_change_and_stops_cleanly_on_sigterm(
    kubeconfig: str, client: AsyncClient
) -> None:
    template = '{range .items[*]}{.pod}={.health}{"\\n"}{end}'
    args = [str(BIN), "pods", "--kubeconfig", kubeconfig, "--context", "live", "-w",
            "-o", f"jsonpath={template}"]  # fmt: skip
    proc, wait_for = await _follow(args)
    try:
        await wait_for("infer=Healthy")
        status = {
            "containerStatuses": [
                {
                    "name": "main", "ready": True, "restartCount": 0, "image": "x", "imageID": "",
                    "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [
                        {"resourceID": f"{D}/{NODE}/gpu-0", "health": "Unhealthy",
                         "message": "XID 48"}]}],
                }
            ]
        }  # fmt: skip
        await client.patch(
            Pod.Status, "infer", {"status": status}, namespace="ml", patch_type=PatchType.MERGE
        )
        await wait_for("infer=Unhealthy")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Ctrl-C (SIGINT) ends it cleanly too
    ctrl_c = await asyncio.to_thread(
        subprocess.Popen, args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert ctrl_c.stdout is not None
        first = await asyncio.to_thread(ctrl_c.stdout.readline)
        assert first.startswith("infer="), first
        ctrl_c.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(ctrl_c.wait, 20) == 0
        assert ctrl_c.stderr is not None and "Traceback" not in ctrl_c.stderr.read()
    finally:
        if ctrl_c.poll() is None:
            ctrl_c.kill()
            ctrl_c.wait()


async def test_taint_refuses_an_unpublished_device_unless_forced(kubeconfig: str) -> None:
    k = ("--kubeconfig", kubeconfig, "--context", "live")
    typo = (f"{D}/{NODE}/gpu-9", "--key", "example.com/rma", "--effect", "NoSchedule")
    refused = await asyncio.to_thread(run, "taint", *k, *typo)
    assert refused.returncode == 1
    assert f"no ResourceSlice publishes {D}/{NODE}/gpu-9" in _one_line_error(refused)
    forced = await asyncio.to_thread(run, "taint", *k, *typo, "--force")
    assert forced.returncode == 0 and "created" in forced.stdout, forced.stderr
    published = await asyncio.to_thread(
        run, "taint", *k, f"{D}/{NODE}/gpu-0", "--key", "example.com/rma", "--effect", "NoSchedule"
    )
    assert published.returncode == 0 and "created" in published.stdout, published.stderr


async def test_history_finds_the_controllers_namespace(
    kubeconfig: str, client: AsyncClient
) -> None:
    await client.create(Namespace.from_dict({"metadata": {"name": "drahealth-system"}}))
    entry = {
        "time": "2026-11-22T10:00:00Z", "by": "ctl-a", "action": "create",
        "subject": f"{D}/{NODE}/gpu-1", "message": "tainted",
    }  # fmt: skip
    await client.create(
        ConfigMap.from_dict(
            {
                "metadata": {
                    "name": "drahealth-remediation-history",
                    "namespace": "drahealth-system",
                },
                "data": {"history": json.dumps([entry])},
            }
        )
    )
    k = ("--kubeconfig", kubeconfig, "--context", "live")
    found = await asyncio.to_thread(run, "history", *k, f"{D}/{NODE}/gpu-1", "-o", "json")
    assert found.returncode == 0, found.stderr
    assert [r["source"] for r in json.loads(found.stdout)] == ["controller ctl-a"]
    flag = await asyncio.to_thread(
        run, "history", *k, f"{D}/{NODE}/gpu-1", "--controller-namespace", "default", "-o", "json"
    )
    assert json.loads(flag.stdout) == []
    table = await asyncio.to_thread(run, "history", *k, f"{D}/{NODE}/gpu-1", "-o", "wide")
    header, row = table.stdout.splitlines()
    assert header.split()[:3] == ["LAST", "SEEN", "SOURCE"]
    assert re.fullmatch(r"\d+d(\d+h)?", row.split()[0]) and row.endswith("2026-11-22T10:00:00Z")


def test_help_lists_every_command_with_its_whole_description() -> None:
    out = run("--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "..." not in out.stdout.split("Commands:")[1]
    assert (
        "untaint Remove the drahealth-made DeviceTaintRules of one device and KEY (optionally "
        "holding the controller off it), or end a hold with --release." in text
    )
    assert " stream Live view of any DRA driver's health stream" in text
    assert " watch " not in text.split("Commands:")[1]  # the old name is hidden


def test_shell_completion_completes_commands_and_options() -> None:
    env = {"_DRAHEALTH_COMPLETE": "bash_source"}
    script = run(env=env)
    assert script.returncode == 0 and "_drahealth_completion" in script.stdout
    words = {
        "_DRAHEALTH_COMPLETE": "bash_complete",
        "COMP_WORDS": "drahealth sta",
        "COMP_CWORD": "1",
    }
    assert run(env=words).stdout.split() == ["plain,status"]
    words["COMP_WORDS"], words["COMP_CWORD"] = "drahealth pods --all", "2"
    assert run(env=words).stdout.split() == ["plain,--all-namespaces"]


async def test_forbidden_everywhere_is_one_error_line_naming_rbac(tmp_path: Path) -> None:
    """A server that answers 403 (a Kubernetes Status) to every request: each command
    ends with one ``error:`` line naming what was refused and RBAC, never a traceback."""
    from aiohttp import web

    async def forbid(request: web.Request) -> web.Response:
        status = {
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
            "code": 403, "message": f'{request.path} is forbidden: User "bob" cannot get it',
        }  # fmt: skip
        body = json.dumps(status).encode()
        return web.Response(body=body, status=403, headers={"Content-Type": "application/json"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forbid)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = {
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "bob", "user": {"token": "t"}}],
        "contexts": [{"name": "bob", "context": {"cluster": "c", "user": "bob"}}],
        "current-context": "bob",
    }
    path = tmp_path / "kubeconfig"
    await asyncio.to_thread(path.write_text, yaml.safe_dump(config))
    k = ("--kubeconfig", str(path))
    try:
        commands = {
            "pods": ("pods", *k, "-A"),
            "history": ("history", *k, f"{D}/{NODE}/gpu-1"),
            "clear": ("clear", *k, f"{D}/{NODE}/gpu-1"),
            "resume": ("resume", *k),
            "taint": ("taint", *k, f"{D}/{NODE}/gpu-1", "--key", "k", "--effect", "NoSchedule"),
            "untaint": ("untaint", *k, f"{D}/{NODE}/gpu-1", "--key", "k"),
            "version": ("version", *k),
        }
        results = await asyncio.gather(*(asyncio.to_thread(run, *a) for a in commands.values()))
    finally:
        await runner.cleanup()
    for name, out in zip(commands, results, strict=True):
        assert out.returncode == 1, (name, out.stderr)
        assert "Traceback" not in out.stderr, (name, out.stderr)
        errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "403" in errors[0], (name, out.stderr)
        assert "RBAC" in errors[0], (name, errors[0])


async def test_status_watch_follows_the_agents_records_outside_the_pods_namespace(
    kubeconfig: str, client: AsyncClient
) -> None:
    """``-n ml`` scopes the pods; the agents' records (in default) are still watched."""
    template = '{range .items[*]}{.device}={.health}{"\\n"}{end}'
    args = [str(BIN), "status", "--kubeconfig", kubeconfig, "--context", "live", "-n", "ml",
            "-w", "-o", f"jsonpath={template}"]  # fmt: skip
    proc, printed = await _follow(args)
    try:
        await printed(f"{D}/{NODE}/gpu-1=Unhealthy")
        record = await client.get(ConfigMap, f"drahealth-devices-{NODE}", namespace="default")
        rows = json.loads((record.data or {})["devices"])
        rows[0].update(health="Unhealthy", message="XID 48")  # gpu-0
        await client.patch(
            ConfigMap,
            f"drahealth-devices-{NODE}",
            {"data": {"devices": json.dumps(rows)}},
            namespace="default",
            patch_type=PatchType.MERGE,
        )
        await printed(f"{D}/{NODE}/gpu-0=Unhealthy")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
