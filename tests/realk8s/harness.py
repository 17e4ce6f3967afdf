"""The real Kubernetes control plane as a test peer: build it, start it, stop it.

Owns the three steps behind ``scripts/realk8s``:

* :func:`build`: the release's kube-apiserver, kube-controller-manager and kube-scheduler,
  and the etcd server Kubernetes itself requires at that release, compiled from the Go
  module proxy into a cache outside the repository
  (``$DRAHEALTH_K8S_CACHE``, default ``~/.cache/drahealth/k8s/vX.Y.Z/bin``). Kubernetes'
  own go.mod maps every staging module (``k8s.io/api``, ``k8s.io/client-go``, ...) at
  ``v0.0.0`` to a local directory, so it cannot be built with ``go install``; a small
  consumer module requires ``k8s.io/kubernetes vX.Y.Z`` and points each of those staging
  modules at its published ``v0.Y.Z`` tag (the list comes from the tag's go.mod, not from
  here). etcd is a five-line main calling ``etcdmain.Main``, at the version the tag's
  go.mod selects. The flags are upstream's (``-tags selinux,notest -trimpath``, the version
  stamped in with ``-X``), so each binary reports its release.
* :func:`up`: etcd, then kube-apiserver (loopback only, its own CA and serving
  certificate, static tokens, service-account keys, ``--authorization-mode=Node,RBAC``,
  the release's gates and ``--runtime-config``), then kube-controller-manager (each
  controller with its own service account, as kubeadm runs it) and kube-scheduler. Each
  is ready when its health endpoint says so and the ``default`` ServiceAccount exists;
  every wait has a deadline. An admin kubeconfig is written beside the logs.
* :func:`down`: stops what :func:`up` started (the whole process group of each),
  SIGTERM first and SIGKILL at a deadline.

Failures are one line naming what failed (the module the proxy refused, the binary that
did not build, the port in use, the component that exited and the tail of its log):
:class:`HarnessError`. Nothing here is drahealth: it is the oracle drahealth is held to.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

#: The patch release built for each minor, as the Go module proxy serves them.
RELEASES: dict[str, str] = {
    "1.34": "v1.34.4",
    "1.35": "v1.35.4",
    "1.36": "v1.36.3",
    "1.37": "v1.37.2",
}
DEFAULT_VERSION = "1.37"
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
#: Built beside them: the client operators compare drahealth's views with.
CLIENTS = ("kubectl",)
#: The node's programs: the real kubelet and an in-memory CRI runtime for it
#: (``tests/realk8s/go/fakecri``), so pods run with no container runtime.
NODE = ("kubelet", "fakecri")
GO_TREE = Path(__file__).resolve().parent / "go"
#: Go mains of the test tree (``tests/realk8s/go/<name>``), built in each release's
#: module (so against its staging modules: the kubeletplugin helper of that release) and
#: rebuilt whenever their sources change.
TEST_MAINS = ("fakecri", "helperdriver", "noopdra")
#: Gates, runtime-config per minor when the device-taint gates are asked for ("taints").
#: DeviceTaintRule is resource.k8s.io/v1alpha3 on 1.34/1.35, v1beta2 on 1.36, v1 on 1.37;
#: the allocatedResourcesStatus field is kept only with ResourceHealthStatus on.
TAINT_GATES: dict[str, tuple[dict[str, bool], list[str]]] = {
    "1.34": (
        {"DRADeviceTaints": True, "ResourceHealthStatus": True},
        ["resource.k8s.io/v1alpha3=true"],
    ),
    "1.35": (
        {"DRADeviceTaints": True, "DRADeviceTaintRules": True, "ResourceHealthStatus": True},
        ["resource.k8s.io/v1alpha3=true"],
    ),
    "1.36": ({"DRADeviceTaintRules": True}, ["resource.k8s.io/v1beta2=true"]),
    "1.37": ({}, []),
}
GATE_MODES = ("default", "taints")
#: The name the real kubelet registers its Node under (see tests/realk8s/node.py).
KUBELET_NODE = "realk8s-node"
#: Static tokens: (token, user, uid, groups). The admin is what tests and the CLI use.
TOKENS = (
    ("drahealth-admin", "drahealth-admin", "1", "system:masters"),
    ("kube-controller-manager", "system:kube-controller-manager", "2", ""),
    ("kube-scheduler", "system:kube-scheduler", "3", ""),
    # the real kubelet's: the Node authorizer knows a node by this name and group
    ("drahealth-kubelet", f"system:node:{KUBELET_NODE}", "4", "system:nodes"),
)
BUILD_TIMEOUT_S = 90 * 60
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL = 2000


class HarnessError(Exception):
    """A step of the harness failed; the message is one line naming what failed."""


# -- versions and paths -------------------------------------------------------------------


def resolve_version(version: str | None) -> str:
    """``1.37``, ``v1.37.2`` or ``1.37.2`` -> ``v1.37.2`` (None: the default release)."""
    raw = (version or os.environ.get("DRAHEALTH_K8S_VERSION") or DEFAULT_VERSION).strip()
    raw = raw.removeprefix("v")
    parts = raw.split(".")
    if len(parts) == 2 and raw in RELEASES:
        return RELEASES[raw]
    if len(parts) == 3 and all(p.isdigit() for p in parts) and parts[0] == "1":
        return f"v{raw}"
    raise HarnessError(
        f"version {version!r}: give a release like 1.37 or 1.37.2 (known: {', '.join(RELEASES)})"
    )


def minor_of(version: str) -> str:
    """``v1.37.2`` -> ``1.37``."""
    return ".".join(version.removeprefix("v").split(".")[:2])


def cache_root() -> Path:
    root = os.environ.get("DRAHEALTH_K8S_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "drahealth" / "k8s"


def bin_dir(version: str) -> Path:
    return cache_root() / version / "bin"


def built(version: str) -> bool:
    """True where :func:`build` finished for ``version``: its stamp and the control
    plane's binaries (kubectl is asked for by the tests that use it: a cache built before
    it was added lacks it until the next build)."""
    bins = bin_dir(version)
    stamp = bins / "BUILT"
    return stamp.is_file() and all((bins / n).is_file() for n in (*COMPONENTS, "etcd"))


def not_built_reason(version: str) -> str | None:
    """Why the real control plane of ``version`` cannot run here, or None when it can."""
    if not built(version):
        return (
            f"real Kubernetes {version} is not built in {bin_dir(version)} "
            f"(run: scripts/realk8s build --version {minor_of(version)})"
        )
    if shutil.which("openssl") is None:
        return "openssl is not installed (the harness makes its certificates with it)"
    return None


# -- build --------------------------------------------------------------------------------


def _run(
    cmd: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
    timeout: float, what: str,
) -> str:  # fmt: skip
    """Run ``cmd``; its stdout, or HarnessError naming ``what`` with the last stderr line."""
    try:
        done = subprocess.run(
            list(cmd), cwd=cwd, env=None if env is None else {**os.environ, **env},
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except FileNotFoundError as exc:
        raise HarnessError(f"{what}: {cmd[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"{what}: still running after {timeout:.0f} s") from exc
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        detail = lines[-1].strip() if lines else f"exit code {done.returncode}"
        raise HarnessError(f"{what}: {detail}")
    return done.stdout


def module_gomod(module: str, version: str) -> dict[str, Any]:
    """The go.mod of ``module@version`` from the proxy, as ``go mod edit -json`` reads it."""
    out = _run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        timeout=600, what=f"the Go module proxy for {module}@{version}",
    )  # fmt: skip
    info = json.loads(out)
    if info.get("Error"):
        raise HarnessError(f"the Go module proxy refused {module}@{version}: {info['Error']}")
    edit = _run(["go", "mod", "edit", "-json", info["GoMod"]], timeout=60, what="go mod edit")
    parsed: dict[str, Any] = json.loads(edit)
    return parsed


def consumer_gomod(version: str, tag: Mapping[str, Any]) -> str:
    """The consumer module's go.mod for ``version``, from the tag's go.mod ``tag``."""
    staging = f"v0.{minor_of(version).split('.')[1]}.{version.split('.')[2]}"
    lines = ["module drahealth.test/k8speers", ""]
    lines.append(f"go {tag.get('Go') or '1.24.0'}")
    for entry in tag.get("Godebug") or ():
        lines.append(f"godebug {entry['Key']}={entry['Value']}")
    lines += ["", f"require k8s.io/kubernetes {version}", ""]
    replaced = sorted(
        req["Path"]
        for req in (tag.get("Require") or ())
        if req["Path"].startswith("k8s.io/") and req["Version"] == "v0.0.0"
    )
    if not replaced:
        raise HarnessError(f"k8s.io/kubernetes@{version}: its go.mod has no staging modules")
    lines.append("replace (")
    lines += [f"\t{path} => {path} {staging}" for path in replaced]
    lines.append(")")
    return "\n".join(lines) + "\n"


TOOLS_GO = """//go:build tools

// Package tools keeps the commands built from k8s.io/kubernetes in this module's graph.
package tools

import (
\t_ "k8s.io/cri-client/pkg/fake"
\t_ "k8s.io/kubernetes/cmd/kube-apiserver"
\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"
\t_ "k8s.io/kubernetes/cmd/kube-scheduler"
\t_ "k8s.io/kubernetes/cmd/kubelet"
)
"""

ETCD_MAIN = """// Command etcd is the etcd server at the version Kubernetes selects.
package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""


def _main_digest(name: str, root: Path | None = None) -> str:
    """sha256 of a test-tree Go main's sources (file names and contents) under ``root``
    (the test tree by default)."""
    root = root or GO_TREE
    digest = hashlib.sha256()
    for path in sorted((root / name).rglob("*.go")):
        digest.update(path.relative_to(root / name).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _main_fresh(bins: Path, name: str) -> bool:
    """Whether the built test-tree main ``name`` is from its current sources (a main
    not in the tree counts as fresh: nothing to build)."""
    if not (GO_TREE / name).is_dir():
        return True
    stamp = bins / f"{name}.sha256"
    try:
        return (bins / name).is_file() and stamp.read_text().strip() == _main_digest(name)
    except OSError:
        return False


def build(version: str, *, say: Any = print) -> Path:
    """Build ``version``'s control plane, kubectl and etcd into :func:`bin_dir`; return
    it. Only what is missing is built (a cache from before kubectl was added gains it)."""
    bins = bin_dir(version)
    if (
        built(version)
        and all((bins / c).is_file() for c in (*CLIENTS, "kubelet"))
        and all(_main_fresh(bins, m) for m in TEST_MAINS)
    ):
        say(f"{version}: already built in {bins}")
        return bins
    if shutil.which("go") is None:
        raise HarnessError("go is not installed: the real control plane is built with it")
    src = cache_root() / version / "src"
    (src / "cmd" / "etcd").mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    tag = module_gomod("k8s.io/kubernetes", version)
    (src / "go.mod").write_text(consumer_gomod(version, tag))
    (src / "tools.go").write_text(TOOLS_GO)
    (src / "cmd" / "etcd" / "main.go").write_text(ETCD_MAIN)
    mains = [m for m in TEST_MAINS if (GO_TREE / m).is_dir()]
    for name in mains:
        shutil.rmtree(src / "cmd" / name, ignore_errors=True)
        shutil.copytree(GO_TREE / name, src / "cmd" / name)
        if not _main_fresh(bins, name):
            (bins / name).unlink(missing_ok=True)
    env = {"GOFLAGS": "-mod=mod", "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
    say(f"{version}: resolving modules in {src}")
    _run(["go", "mod", "tidy"], cwd=src, env=env, timeout=1800,
         what=f"go mod tidy for k8s.io/kubernetes@{version}")  # fmt: skip
    minor = minor_of(version).split(".")[1]
    stamp = " ".join(
        f"-X k8s.io/component-base/version.{k}={v}"
        for k, v in (("gitVersion", version), ("gitMajor", "1"), ("gitMinor", minor),
                     ("gitTreeState", "clean"))
    )  # fmt: skip
    bins.mkdir(parents=True, exist_ok=True)
    (bins / "BUILT").unlink(missing_ok=True)
    targets = [(f"k8s.io/kubernetes/cmd/{c}", c) for c in (*COMPONENTS, *CLIENTS, "kubelet")]
    targets += [("./cmd/etcd", "etcd"), *((f"./cmd/{m}", m) for m in mains)]
    # the kubeletplugin helper before v0.37 serves dra-health only through a driver
    # implementing the v1alpha1 server itself (v0.37 has a version-neutral API)
    tags = "selinux,notest" + (",helper_v1alpha1" if int(minor) < 37 else "")
    for target, name in targets:
        if (bins / name).is_file():  # written under another name, then renamed: whole
            say(f"{version}: {name} is there already")
            continue
        t1 = time.monotonic()
        say(f"{version}: building {name}")
        _run(
            ["go", "build", "-p", "2", "-trimpath", "-tags", tags,
             "-ldflags", f"-s -w {stamp}", "-o", str(bins / f"{name}.partial"), target],
            cwd=src, env=env, timeout=BUILD_TIMEOUT_S, what=f"building {name} {version}",
        )  # fmt: skip
        os.replace(bins / f"{name}.partial", bins / name)
        if name in TEST_MAINS:  # of the copy built, not of a tree edited meanwhile
            (bins / f"{name}.sha256").write_text(_main_digest(name, src / "cmd") + "\n")
        say(f"{version}: {name} built in {time.monotonic() - t1:.0f} s")
    (bins / "BUILT").write_text(
        json.dumps({"version": version, "seconds": round(time.monotonic() - t0)}) + "\n"
    )
    say(f"{version}: built in {time.monotonic() - t0:.0f} s into {bins}")
    return bins


# -- certificates -------------------------------------------------------------------------


def _openssl(args: Sequence[str], cwd: Path) -> None:
    _run(["openssl", *args], cwd=cwd, timeout=60, what=f"openssl {args[0]}")


def make_pki(pki: Path) -> None:
    """A CA, the API server's serving certificate (loopback names), service-account keys."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
              "-out", "ca.crt", "-days", "3650", "-subj", "/CN=drahealth-test-ca"],
             pki)  # fmt: skip
    names = ",".join(
        ["IP:127.0.0.1", "IP:10.0.0.1", "DNS:localhost", "DNS:kubernetes",
         "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
         "DNS:kubernetes.default.svc.cluster.local"]
    )  # fmt: skip
    (pki / "serving.ext").write_text(
        f"subjectAltName={names}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
    )
    _openssl(["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "serving.key",
              "-out", "serving.csr", "-subj", "/CN=kube-apiserver"], pki)  # fmt: skip
    _openssl(["x509", "-req", "-in", "serving.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
              "-CAcreateserial", "-out", "serving.crt", "-days", "3650",
              "-extfile", "serving.ext"], pki)  # fmt: skip
    _openssl(["genrsa", "-out", "sa.key", "2048"], pki)
    _openssl(["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"], pki)


# -- start and stop -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Record:
    """What a started part of the harness records in its directory (its processes,
    ports and files) so that another command can find and stop it: :meth:`save`,
    :meth:`load` (a record cut short, edited or not this harness's is a
    :class:`HarnessError` in one line), :meth:`running`, :meth:`log`."""

    #: The record's file in the directory, and what the messages call the part.
    RECORD: ClassVar[str]
    WHAT: ClassVar[str]
    dir: str
    pids: dict[str, int]

    def save(self) -> None:
        (Path(self.dir) / self.RECORD).write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, directory: str | Path) -> Self:
        path = Path(directory) / cls.RECORD
        try:
            record = cls(**json.loads(path.read_text()))
        except FileNotFoundError as exc:
            raise HarnessError(f"no {cls.WHAT} recorded in {directory} (no {cls.RECORD})") from (
                exc
            )
        except (OSError, ValueError, TypeError) as exc:  # cut short, edited, not ours
            detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise HarnessError(f"{path} is not a {cls.WHAT} record: {detail}") from exc
        if not isinstance(record.pids, dict) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p > 1 for p in record.pids.values()
        ):
            raise HarnessError(f"{path} is not a {cls.WHAT} record: pids {record.pids!r}")
        return record

    def running(self) -> dict[str, int]:
        """The recorded processes still running as this part's (a pid the system gave
        to another process since is not one of them)."""
        return {n: p for n, p in self.pids.items() if _is_component(p, n, self.dir)}

    def log(self, component: str) -> Path:
        return Path(self.dir) / "logs" / f"{component}.log"


@dataclass
class Cluster(_Record):
    """A started control plane: where it listens, its files, its processes."""

    RECORD: ClassVar[str] = "cluster.json"
    WHAT: ClassVar[str] = "control plane"

    version: str
    gates: str
    dir: str
    apiserver: str
    etcd: str
    kubeconfig: str
    admin_token: str
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def ca_file(self) -> str:
        return str(Path(self.dir) / "pki" / "ca.crt")


def gates_for(version: str, gates: str) -> tuple[dict[str, bool], list[str]]:
    if gates not in GATE_MODES:
        raise HarnessError(f"gates {gates!r}: one of {', '.join(GATE_MODES)}")
    if gates == "default":
        return {}, []
    minor = minor_of(version)
    if minor not in TAINT_GATES:
        raise HarnessError(f"no gate set known for {minor}")
    return TAINT_GATES[minor]


def _flag_gates(gates: Mapping[str, bool]) -> list[str]:
    if not gates:
        return []
    return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in gates.items())]


def _kubeconfig(path: Path, server: str, ca: Path, token: str) -> None:
    import base64

    data = base64.b64encode(ca.read_bytes()).decode()
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "real", "cluster": {
                    "server": server, "certificate-authority-data": data}}],
                "users": [{"name": "user", "user": {"token": token}}],
                "contexts": [{"name": "real", "context": {
                    "cluster": "real", "user": "user", "namespace": "default"}}],
                "current-context": "real",
            },
            indent=1,
        )
    )  # fmt: skip


def _start(name: str, argv: list[str], logs: Path) -> subprocess.Popen[bytes]:
    log = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    except OSError as exc:  # not executable, not a program for this machine, ...
        raise HarnessError(f"cannot start {name} ({argv[0]}): {exc.strerror or exc}") from exc
    finally:
        log.close()


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")[-LOG_TAIL:]
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][:400] if lines else ""


def _get(url: str, *, token: str | None = None, ca: Path | None = None,
         timeout: float = 2.0) -> tuple[int, str]:  # fmt: skip
    ctx = None
    if url.startswith("https:"):
        ctx = ssl.create_default_context(cafile=str(ca)) if ca else ssl._create_unverified_context()
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            return resp.status, resp.read(65536).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(65536).decode(errors="replace")


def _wait_ready(
    name: str, proc: subprocess.Popen[bytes], log: Path, check: Any, deadline: float
) -> None:
    """Poll ``check()`` (True when ready) until ``deadline``; fail fast when ``proc`` exits."""
    last = ""
    while True:
        if proc.poll() is not None:
            raise HarnessError(
                f"{name} exited with code {proc.returncode} before it was ready: {_tail(log)}"
            )
        try:
            ok = check()
            if ok is True:
                return
            last = str(ok)
        except (OSError, ValueError) as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            raise HarnessError(f"{name} not ready within {START_TIMEOUT_S:.0f} s ({last[:200]})")
        time.sleep(0.2)


def _port_free(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise HarnessError(f"port 127.0.0.1:{port} is in use") from exc


def up(version: str, directory: str | Path | None = None, *, gates: str = "default",
       say: Any = print) -> Cluster:  # fmt: skip
    """Start ``version``'s control plane (built before) in ``directory``."""
    if not built(version):
        raise HarnessError(not_built_reason(version) or f"{version} is not built")
    feature_gates, runtime_config = gates_for(version, gates)
    base = Path(directory or tempfile.mkdtemp(prefix=f"realk8s-{version}-")).resolve()
    if (base / "cluster.json").exists():
        # a control plane started here before: its etcd holds the data directory's lock,
        # and a new record would leave its processes running with nobody to stop them
        alive = Cluster.load(base).running()
        if alive:
            raise HarnessError(
                f"a control plane recorded in {base} is still running "
                f"({', '.join(f'{n} pid {p}' for n, p in alive.items())}): "
                f"run scripts/realk8s down --dir {base} first"
            )
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HarnessError(f"cannot use {base}: {exc.strerror or exc}") from exc
    logs, pki = base / "logs", base / "pki"
    logs.mkdir(exist_ok=True)
    make_pki(pki)
    (base / "tokens.csv").write_text(
        "".join(f'{t},{u},{i},"{g}"\n' if g else f"{t},{u},{i}\n" for t, u, i, g in TOKENS)
    )
    ports = {n: free_port() for n in ("etcd", "etcd-peer", "apiserver", "kcm", "scheduler")}
    for port in ports.values():
        _port_free(port)
    bins = bin_dir(version)
    server = f"https://127.0.0.1:{ports['apiserver']}"
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    cluster = Cluster(
        version=version, gates=gates, dir=str(base), apiserver=server, etcd=etcd_url,
        kubeconfig=str(base / "kubeconfig"), admin_token=TOKENS[0][0], ports=ports,
    )  # fmt: skip
    for name, token in (("kubeconfig", TOKENS[0][0]), ("kcm.kubeconfig", TOKENS[1][0]),
                        ("scheduler.kubeconfig", TOKENS[2][0])):  # fmt: skip
        _kubeconfig(base / name, server, pki / "ca.crt", token)
    deadline = time.monotonic() + START_TIMEOUT_S
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        peer = f"http://127.0.0.1:{ports['etcd-peer']}"
        procs["etcd"] = _start("etcd", [
            str(bins / "etcd"), "--name=default", f"--data-dir={base / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}", "--log-level=warn",
        ], logs)  # fmt: skip
        cluster.pids["etcd"] = procs["etcd"].pid
        cluster.save()

        def etcd_ok() -> bool | str:
            code, body = _get(f"{etcd_url}/health")
            return (code == 200 and '"true"' in body) or f"{code} {body[:80]}"

        _wait_ready("etcd", procs["etcd"], logs / "etcd.log", etcd_ok, deadline)
        say(f"etcd ready on {etcd_url}")
        procs["kube-apiserver"] = _start("kube-apiserver", [
            str(bins / "kube-apiserver"), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={ports['apiserver']}",
            f"--tls-cert-file={pki / 'serving.crt'}",
            f"--tls-private-key-file={pki / 'serving.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={base / 'tokens.csv'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24", "--authorization-mode=Node,RBAC",
            "--endpoint-reconciler-type=none",  # loopback may not be advertised
            "--allow-privileged=true", "--profiling=false", "--v=1",
            *_flag_gates(feature_gates),
            *([f"--runtime-config={','.join(runtime_config)}"] if runtime_config else []),
        ], logs)  # fmt: skip
        cluster.pids["kube-apiserver"] = procs["kube-apiserver"].pid
        cluster.save()
        ca = pki / "ca.crt"

        def api_ok() -> bool | str:
            code, body = _get(f"{server}/readyz", token=cluster.admin_token, ca=ca)
            return code == 200 or f"{code} {body[-200:]}"

        _wait_ready("kube-apiserver", procs["kube-apiserver"], logs / "kube-apiserver.log",
                    api_ok, deadline)  # fmt: skip
        say(f"kube-apiserver {version} ready on {server}")
        common = ["--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false",
                  "--v=1", *_flag_gates(feature_gates)]  # fmt: skip
        kcm_cfg = str(base / "kcm.kubeconfig")
        procs["kube-controller-manager"] = _start("kube-controller-manager", [
            str(bins / "kube-controller-manager"), f"--kubeconfig={kcm_cfg}",
            f"--authentication-kubeconfig={kcm_cfg}", f"--authorization-kubeconfig={kcm_cfg}",
            f"--secure-port={ports['kcm']}", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}", "--controllers=*", *common,
        ], logs)  # fmt: skip
        cluster.pids["kube-controller-manager"] = procs["kube-controller-manager"].pid
        sch_cfg = str(base / "scheduler.kubeconfig")
        procs["kube-scheduler"] = _start("kube-scheduler", [
            str(bins / "kube-scheduler"), f"--kubeconfig={sch_cfg}",
            f"--authentication-kubeconfig={sch_cfg}", f"--authorization-kubeconfig={sch_cfg}",
            f"--secure-port={ports['scheduler']}", *common,
        ], logs)  # fmt: skip
        cluster.pids["kube-scheduler"] = procs["kube-scheduler"].pid
        cluster.save()
        for name, key in (("kube-controller-manager", "kcm"), ("kube-scheduler", "scheduler")):

            def healthy(port: int = ports[key]) -> bool | str:
                code, body = _get(f"https://127.0.0.1:{port}/healthz")
                return code == 200 or f"{code} {body[:200]}"

            _wait_ready(name, procs[name], logs / f"{name}.log", healthy, deadline)
            say(f"{name} ready")

        def default_sa() -> bool | str:  # pods need it: the ServiceAccount admission
            code, _body = _get(
                f"{server}/api/v1/namespaces/default/serviceaccounts/default",
                token=cluster.admin_token, ca=ca,
            )  # fmt: skip
            return code == 200 or f"{code}"

        _wait_ready("the default ServiceAccount", procs["kube-controller-manager"],
                    logs / "kube-controller-manager.log", default_sa, deadline)  # fmt: skip
    except BaseException:
        _stop_pids({n: p.pid for n, p in procs.items()})
        raise
    say(f"kubeconfig: {cluster.kubeconfig}")
    return cluster


def _is_component(pid: int, name: str, directory: str) -> bool:
    """Whether ``pid`` is ``name`` started for the control plane in ``directory``: its
    program is ``name`` and one of its flags names a file there. A pid recorded by a run
    that crashed may belong to anything by now; only a process that passes is signalled."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: the process group is signalled as recorded
        return _alive(pid)
    if not argv or Path(os.fsdecode(argv[0])).name != name:
        return False
    where = os.fsencode(str(Path(directory).resolve()) + os.sep)
    return any(arg.partition(b"=")[2].startswith(where) for arg in argv[1:])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of this process counts as gone once reaped
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def _stop_pids(pids: Mapping[str, int]) -> None:
    """SIGTERM each process group (newest first), SIGKILL what is left at the deadline."""
    order = list(reversed(list(pids.items())))
    for _name, pid in order:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(_alive(pid) for _, pid in order):
        time.sleep(0.1)
    for _name, pid in order:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def down(cluster: Cluster, *, remove: bool = False) -> None:
    """Stop ``cluster``'s processes (those still running as its own: see
    :func:`_is_component`); with ``remove`` delete its directory too."""
    _stop_pids(cluster.running())
    if remove:
        shutil.rmtree(cluster.dir, ignore_errors=True)


@contextlib.contextmanager
def running(version: str, *, gates: str = "default", keep: bool = False) -> Iterator[Cluster]:
    """A control plane for the block, stopped (and its directory removed) after it."""
    cluster = up(version, gates=gates, say=lambda _m: None)
    try:
        yield cluster
    finally:
        down(cluster, remove=not keep)


#: The suites the matrix runs on each release (the story; the rest needs no release loop).
MATRIX_TESTS = ("tests/realk8s/test_story.py", "tests/realk8s/test_jobs.py")
STEP_LINE = re.compile(r"^story (v[\d.]+) (\w+): (.+) ([\d.]+) s$")
MODE_LINE = re.compile(r"^mode v[\d.]+ \w+: ([\w-]+)")
RESULT_LINE = re.compile(r"^(tests/\S+::(\w+)) (PASSED|FAILED|SKIPPED|ERROR)")


def matrix(
    versions: Sequence[str], gate_modes: Sequence[str], *, out: Path | None, say: Any = print
) -> list[dict[str, Any]]:
    """Run :data:`MATRIX_TESTS` on each built release and gate set; one row each (the
    release, the gates, the remediation mode the controller chose, each test's outcome
    and each step's latency). With ``out`` the rows are written there as a Markdown table."""
    rows: list[dict[str, Any]] = []
    for version in versions:
        for gates in gate_modes:
            reason = not_built_reason(version)
            row: dict[str, Any] = {"version": version, "gates": gates, "tests": {},
                                   "steps": {}, "note": reason or ""}  # fmt: skip
            rows.append(row)
            if reason is not None:
                say(f"{version} {gates}: skipped: {reason}")
                continue
            env = {"DRAHEALTH_K8S_VERSION": version, "DRAHEALTH_K8S_GATES": gates,
                   "DRAHEALTH_REALK8S_REQUIRED": "1"}  # fmt: skip
            t0 = time.monotonic()
            done = subprocess.run(
                ["uv", "run", "--frozen", "pytest", "-m", "realk8s", "-s", "-rA", "-q",
                 "-p", "no:cacheprovider", *MATRIX_TESTS],
                capture_output=True, text=True, env={**os.environ, **env}, timeout=1800,
                check=False,
            )  # fmt: skip
            row["seconds"] = round(time.monotonic() - t0)
            log = Path(tempfile.gettempdir()) / f"realk8s-matrix-{version}-{gates}.log"
            log.write_text(done.stdout + done.stderr)
            row["log"] = str(log)
            for line in done.stdout.splitlines():
                if m := MODE_LINE.match(line.strip()):
                    row["mode"] = m.group(1)
                if m := STEP_LINE.match(line.strip()):
                    row["steps"][m.group(3)] = float(m.group(4))
                if m := RESULT_LINE.match(line.strip()):
                    row["tests"][m.group(2)] = m.group(3)
                if (m := re.match(r"^(PASSED|FAILED|ERROR|SKIPPED) (tests/\S+::(\w+))",
                                  line.strip())):  # fmt: skip
                    row["tests"][m.group(3)] = m.group(1)
            say(f"{version} {gates}: {row['tests']} in {row['seconds']} s (output: {log})")
    if out is not None:
        out.write_text(matrix_table(rows))
    return rows


def matrix_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The matrix rows as Markdown: one table of outcomes, one of step latencies."""
    tests = sorted({t for r in rows for t in r["tests"]})
    steps: list[str] = []
    for r in rows:
        steps += [s for s in r["steps"] if s not in steps]
    head = ["release", "gates", "controller mode", *tests]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["version"], r["gates"], r.get("mode", "-")]
        cells += [r["tests"].get(t, "-") for t in tests]
        if r.get("note"):
            cells[-1] = f"{cells[-1]} ({r['note']})"
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| step (seconds) | " + " | ".join(f"{r['version']} {r['gates']}" for r in rows)
              + " |", "|" + "---|" * (len(rows) + 1)]  # fmt: skip
    for step in steps:
        cells = [f"{r['steps'][step]:.2f}" if step in r["steps"] else "-" for r in rows]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="scripts/realk8s",
        description="Build, start and stop the real Kubernetes control plane (test peer).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build a release's binaries into the cache")
    b.add_argument("--version", default=None, help="1.34, 1.35, 1.36, 1.37 or X.Y.Z")
    u = sub.add_parser("up", help="start a control plane; prints its kubeconfig")
    u.add_argument("--version", default=None)
    u.add_argument("--dir", required=True, help="where its data, logs and kubeconfig go")
    u.add_argument("--gates", choices=GATE_MODES, default="default",
                   help="'taints': the device-taint gates and API versions on")  # fmt: skip
    d = sub.add_parser("down", help="stop the control plane started in --dir")
    d.add_argument("--dir", required=True)
    d.add_argument("--remove", action="store_true", help="delete the directory too")
    m = sub.add_parser("matrix", help="run the story on each release and gate set")
    m.add_argument("--versions", default=",".join(RELEASES), help="comma-separated releases")
    m.add_argument("--gates", default=",".join(GATE_MODES), help="comma-separated gate sets")
    m.add_argument("--out", default=None, help="write the results table (Markdown) here")
    nu = sub.add_parser("node-up", help="start the real kubelet beside the control plane")
    nu.add_argument("--dir", required=True, help="the control plane's directory (from up)")
    nu.add_argument("--node-dir", default=None, help="the node's [default: DIR/node]")
    nd = sub.add_parser("node-down", help="stop the kubelet started by node-up")
    nd.add_argument("--dir", required=True)
    nd.add_argument("--node-dir", default=None)
    w = sub.add_parser("where", help="print the cache directory of a release's binaries")
    w.add_argument("--version", default=None)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(resolve_version(args.version))
            from tests.realk8s.helm import build_helm  # the chart is judged by real helm

            build_helm(say=print)
        elif args.command == "up":
            up(resolve_version(args.version), args.dir, gates=args.gates)
        elif args.command == "down":
            down(Cluster.load(args.dir), remove=args.remove)
        elif args.command in ("node-up", "node-down"):
            from tests.realk8s.node import Kubelet, node_down, node_up

            where = args.node_dir or str(Path(args.dir) / "node")
            if args.command == "node-up":
                node_up(Cluster.load(args.dir), where)
            else:
                node_down(Kubelet.load(where))
        elif args.command == "matrix":
            versions = [resolve_version(v) for v in args.versions.split(",") if v]
            modes = [g for g in args.gates.split(",") if g]
            for g in modes:
                gates_for(versions[0], g)  # an unknown gate set fails before anything runs
            rows = matrix(versions, modes, out=Path(args.out) if args.out else None)
            failed = [r for r in rows if any(v != "PASSED" for v in r["tests"].values())
                      or not r["tests"]]  # fmt: skip
            return 1 if failed else 0
        else:
            print(bin_dir(resolve_version(args.version)))
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
