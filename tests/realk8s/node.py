"""The real kubelet as a test peer, on a container runtime that runs nothing.

Owns ``scripts/realk8s node-up|node-down``: beside a control plane that
:func:`~tests.realk8s.harness.up` started, :func:`node_up` starts

* ``fakecri`` (``tests/realk8s/go/fakecri``): upstream's in-memory CRI runtime and image
  services on a unix socket; sandboxes and containers are records, so a pod reaches
  Running without any process being started;
* the release's real ``kubelet``, registered as :data:`~tests.realk8s.harness.KUBELET_NODE`
  with the static token the Node authorizer knows (``system:node:<name>`` in
  ``system:nodes``), every directory under the node's own root (plugin registration,
  plugin sockets, its DRA checkpoint and health cache, pod logs, its serving
  certificate), and a configuration for a root sandbox without systemd: the cgroupfs
  driver, no QoS cgroups, no node-allocatable enforcement, swap and cgroup v1 allowed,
  no eviction thresholds (nothing it could evict runs), local storage isolation off.

Ready means: the runtime's socket answers, the kubelet's ``/healthz`` is 200 and its Node
is ``Ready`` in the API. :func:`node_down` stops both (process groups, SIGTERM then
SIGKILL). A DRA driver under test registers in :attr:`Kubelet.registry_dir` and puts its
sockets in :attr:`Kubelet.plugins_dir`, as a DaemonSet's hostPath mounts would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tests.realk8s.harness import (
    KUBELET_NODE,
    START_TIMEOUT_S,
    TOKENS,
    Cluster,
    HarnessError,
    _get,
    _kubeconfig,
    _Record,
    _start,
    _stop_pids,
    _wait_ready,
    bin_dir,
    free_port,
    gates_for,
    minor_of,
)

#: The kubelet's token (see :data:`~tests.realk8s.harness.TOKENS`).
KUBELET_TOKEN = next(t for t, user, _uid, _g in TOKENS if user == f"system:node:{KUBELET_NODE}")


@dataclass
class Kubelet(_Record):
    """A started node: its directories, its processes, its ports."""

    RECORD: ClassVar[str] = "node.json"
    WHAT: ClassVar[str] = "kubelet"

    version: str
    cluster_dir: str
    dir: str
    name: str
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def root_dir(self) -> str:
        return str(Path(self.dir) / "kubelet")

    @property
    def registry_dir(self) -> str:
        """Where DRA drivers put their registration sockets (``plugins_registry``)."""
        return str(Path(self.root_dir) / "plugins_registry")

    @property
    def plugins_dir(self) -> str:
        """Parent of each driver's own socket directory (``plugins/<driver>``)."""
        return str(Path(self.root_dir) / "plugins")

    @property
    def health_cache(self) -> str:
        """The kubelet's persistent DRA device-health cache."""
        return str(Path(self.root_dir) / "dra_health_state")

    @property
    def cri_endpoint(self) -> str:
        return f"unix://{Path(self.dir) / 'cri.sock'}"


def kubelet_config(node: Kubelet, gates: Mapping[str, bool]) -> dict[str, Any]:
    """The KubeletConfiguration (v1beta1) of a kubelet in a root sandbox without systemd."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": node.ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.ports["healthz"],
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": node.cri_endpoint,
        "imageServiceEndpoint": node.cri_endpoint,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "failCgroupV1": False,
        "localStorageCapacityIsolation": False,
        "protectKernelDefaults": False,
        "evictionHard": {},
        "podLogsDir": str(Path(node.dir) / "pod-logs"),
        "registerNode": True,
        "featureGates": dict(gates),
    }


def kubelet_not_built_reason(version: str) -> str | None:
    """Why the real kubelet of ``version`` cannot run here, or None when it can."""
    bins = bin_dir(version)
    missing = [n for n in ("kubelet", "fakecri") if not (bins / n).is_file()]
    if missing:
        return (
            f"{' and '.join(missing)} {version} not built in {bins}: run scripts/realk8s "
            f"build --version {minor_of(version)}"
        )
    return None


def node_up(cluster: Cluster, directory: str | Path | None = None, *, say: Any = print) -> Kubelet:
    """Start the fake runtime and the real kubelet of ``cluster``'s release."""
    bins = bin_dir(cluster.version)
    reason = kubelet_not_built_reason(cluster.version)
    if reason is not None:
        raise HarnessError(reason)
    base = Path(directory or tempfile.mkdtemp(prefix="realk8s-node-")).resolve()
    if (base / "node.json").exists():
        alive = Kubelet.load(base).running()
        if alive:
            raise HarnessError(
                f"a kubelet recorded in {base} is still running ({alive}): "
                f"run scripts/realk8s node-down --dir {base} first"
            )
    node = Kubelet(
        version=cluster.version, cluster_dir=cluster.dir, dir=str(base), name=KUBELET_NODE,
        ports={"kubelet": free_port(), "healthz": free_port()},
    )  # fmt: skip
    logs = base / "logs"
    for d in (logs, Path(node.registry_dir), Path(node.plugins_dir), base / "pod-logs"):
        d.mkdir(parents=True, exist_ok=True)
    feature_gates, _runtime = gates_for(cluster.version, cluster.gates)
    config = base / "kubelet.json"
    config.write_text(json.dumps(kubelet_config(node, feature_gates), indent=1))
    kubeconfig = base / "kubelet.kubeconfig"
    _kubeconfig(kubeconfig, cluster.apiserver, Path(cluster.ca_file), KUBELET_TOKEN)
    deadline = time.monotonic() + START_TIMEOUT_S
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        sock = Path(node.dir) / "cri.sock"
        sock.unlink(missing_ok=True)
        procs["fakecri"] = _start("fakecri", [
            # a flag names a path inside the node's directory: node_down knows it by that
            str(bins / "fakecri"), f"--endpoint={node.cri_endpoint}",
            f"--fs-root={node.root_dir}",
        ], logs)  # fmt: skip
        node.pids["fakecri"] = procs["fakecri"].pid
        node.save()

        def cri_ok() -> bool | str:
            if not sock.exists():
                return "no socket yet"
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(1.0)
                s.connect(str(sock))
            return True

        _wait_ready("fakecri", procs["fakecri"], logs / "fakecri.log", cri_ok, deadline)
        say(f"fake CRI runtime on {node.cri_endpoint}")
        procs["kubelet"] = _start_kubelet(node, cluster, deadline)
        say(f"kubelet {cluster.version} ready as node {node.name} (root {node.root_dir})")
    except BaseException:
        _stop_pids({n: p.pid for n, p in procs.items()})
        raise
    return node


def _start_kubelet(node: Kubelet, cluster: Cluster, deadline: float) -> subprocess.Popen[bytes]:
    """Start the kubelet of ``node`` (its files written by :func:`node_up`) and wait
    until its ``/healthz`` answers and its Node is Ready."""
    base, logs = Path(node.dir), Path(node.dir) / "logs"
    proc = _start("kubelet", [
        str(bin_dir(node.version) / "kubelet"), f"--config={base / 'kubelet.json'}",
        f"--kubeconfig={base / 'kubelet.kubeconfig'}", f"--root-dir={node.root_dir}",
        f"--cert-dir={base / 'pki'}", f"--hostname-override={node.name}", "--v=2",
    ], logs)  # fmt: skip
    node.pids["kubelet"] = proc.pid
    node.save()
    try:

        def healthz() -> bool | str:
            code, body = _get(f"http://127.0.0.1:{node.ports['healthz']}/healthz")
            return code == 200 or f"{code} {body[:200]}"

        _wait_ready("kubelet", proc, logs / "kubelet.log", healthz, deadline)

        def node_ready() -> bool | str:
            code, body = _get(
                f"{cluster.apiserver}/api/v1/nodes/{node.name}",
                token=cluster.admin_token, ca=Path(cluster.ca_file),
            )  # fmt: skip
            if code != 200:
                return f"Node {node.name}: {code}"
            conditions = json.loads(body).get("status", {}).get("conditions") or []
            ready = [c for c in conditions if c.get("type") == "Ready"]
            if ready and ready[0].get("status") == "True":
                return True
            return f"Node {node.name} not Ready: {ready[0].get('message') if ready else None}"

        _wait_ready("the kubelet's Node", proc, logs / "kubelet.log", node_ready, deadline)
    except BaseException:
        _stop_pids({"kubelet": proc.pid})
        raise
    return proc


def restart_kubelet(node: Kubelet, cluster: Cluster) -> None:
    """Stop the kubelet alone (SIGTERM, as a node's service manager does) and start it
    again on the same root directory: its checkpoint and health cache carry over."""
    running = node.running()
    if "kubelet" in running:
        _stop_pids({"kubelet": running["kubelet"]})
    _start_kubelet(node, cluster, time.monotonic() + START_TIMEOUT_S)


def processes_under(directory: str) -> dict[int, str]:
    """Processes with an argument (or a ``--flag=`` value) that is a path inside
    ``directory`` (pid -> program), this process and its ancestors left out (a command
    line that started the harness may name the directory too)."""
    where = os.fsencode(str(Path(directory).resolve()) + os.sep)
    mine = _ancestors()
    found: dict[int, str] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(proc.name) in mine:
            continue
        for arg in argv[1:]:
            value = arg.partition(b"=")[2] if arg.startswith(b"-") else arg
            if value.startswith(where):
                found[int(proc.name)] = os.fsdecode(argv[0])
                break
    return found


def _ancestors() -> set[int]:
    """This process and the chain of its parents (as far as /proc tells)."""
    chain, pid = {os.getpid()}, os.getppid()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            status = (Path("/proc") / str(pid) / "status").read_text()
        except OSError:
            break
        ppid = [ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid:")]
        pid = int(ppid[0]) if ppid and ppid[0].isdigit() else 0
    return chain


def node_down(node: Kubelet, *, remove: bool = False) -> None:
    """Stop the kubelet and the runtime (those still running as this node's); fail,
    after killing them, where a process of the node's directory outlived them."""
    _stop_pids(node.running())
    left = processes_under(node.dir)
    if left:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # the kubelet bind-mounts its root directory onto itself and mounts pods' projected
    # volumes (tmpfs) under it; a stopped kubelet leaves them, so they go here
    for mount in reversed(mounts_under(node.dir)):
        subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30, check=False)
    if remove:
        shutil.rmtree(node.dir, ignore_errors=True)
    if left:
        raise HarnessError(f"still running after node-down (now killed): {left}")


def mounts_under(directory: str) -> list[str]:
    """Mount points at or under ``directory``, in the order they were mounted."""
    where = str(Path(directory).resolve())
    try:
        lines = Path("/proc/self/mounts").read_bytes().splitlines()
    except OSError:
        return []
    # the kernel writes a space, tab, newline and backslash in a path as \ooo (octal)
    points = [
        os.fsdecode(_OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), ln.split()[1]))
        for ln in lines
        if len(ln.split()) > 1
    ]
    return [m for m in points if m == where or m.startswith(where + os.sep)]


_OCTAL = re.compile(rb"\\([0-7]{3})")


@contextlib.contextmanager
def running_node(cluster: Cluster, *, keep: bool = False) -> Iterator[Kubelet]:
    """A kubelet for the block, stopped (and its directory removed) after it."""
    node = node_up(cluster, say=lambda _m: None)
    try:
        yield node
    finally:
        node_down(node, remove=not keep)
