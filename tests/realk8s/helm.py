"""The real ``helm`` binary as a test peer: built from the Go module proxy, cached.

:func:`build_helm` compiles ``helm.sh/helm/v3/cmd/helm`` at :data:`HELM_VERSION` into
the cache beside the control-plane binaries (``$DRAHEALTH_K8S_CACHE``, default
``~/.cache/drahealth/k8s/helm-vX.Y.Z/helm``) with upstream's release flags: ``-trimpath``,
``CGO_ENABLED=0``, the version stamped into ``internal/version`` and the Kubernetes
release of its client-go (from the tag's go.mod) into ``chartutil`` and ``lint/rules``,
as helm's Makefile does, so ``helm version`` reports the release and ``helm template``
and ``helm lint`` assume the same default Kubernetes version as a released binary.

helm's go.mod has no ``replace`` directives, so ``go install module@version`` builds it;
where a release adds some (``go install`` refuses those), a small consumer module requiring
that version is built instead. Failures are :class:`~tests.realk8s.harness.HarnessError`
with a one-line message.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.realk8s.harness import HarnessError, _run, cache_root, module_gomod

HELM_VERSION = "v3.22.0"
MODULE = "helm.sh/helm/v3"
BUILD_TIMEOUT_S = 60 * 60

CONSUMER_TOOLS_GO = """//go:build tools

// Package tools keeps helm's command in this module's graph.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
"""


def helm_dir() -> Path:
    return cache_root() / f"helm-{HELM_VERSION}"


def helm_path() -> Path:
    return helm_dir() / "helm"


def helm_built() -> bool:
    """True where :func:`build_helm` finished (its stamp and the binary)."""
    return (helm_dir() / "BUILT").is_file() and helm_path().is_file()


def not_built_reason() -> str | None:
    """Why the real helm cannot run here, or None when it can."""
    if not helm_built():
        return f"helm {HELM_VERSION} is not built in {helm_dir()} (run: scripts/realk8s build)"
    return None


def ldflags(tag: dict[str, Any]) -> str:
    """Upstream's release ldflags for ``tag`` (helm's go.mod, as ``go mod edit -json``)."""
    client_go = next(
        (r["Version"] for r in tag.get("Require") or () if r["Path"] == "k8s.io/client-go"), None
    )
    if client_go is None:
        raise HarnessError(f"{MODULE}@{HELM_VERSION}: its go.mod requires no k8s.io/client-go")
    parts = client_go.removeprefix("v").split(".")
    major, minor = str(int(parts[0]) + 1), parts[1]  # client-go v0.37.x -> Kubernetes 1.37
    flags = ["-s", "-w"]
    for var, value in (("version", HELM_VERSION), ("metadata", ""), ("gitTreeState", "clean")):
        flags.append(f"-X {MODULE}/internal/version.{var}={value}")
    for pkg in ("pkg/lint/rules", "pkg/chartutil"):
        flags += [f"-X {MODULE}/{pkg}.k8sVersionMajor={major}",
                  f"-X {MODULE}/{pkg}.k8sVersionMinor={minor}"]  # fmt: skip
    return " ".join(flags)


def _reported_version(binary: Path) -> str:
    try:
        done = subprocess.run(
            [str(binary), "version", "--template", "{{.Version}}"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except OSError as exc:
        raise HarnessError(f"the built helm does not run: {exc}") from exc
    return done.stdout.strip()


def build_helm(say: Any = print) -> Path:
    """Build helm :data:`HELM_VERSION` into :func:`helm_path` (once); return its path."""
    target = helm_path()
    if helm_built():
        say(f"helm {HELM_VERSION}: already built in {target}")
        return target
    if shutil.which("go") is None:
        raise HarnessError("go is not installed: helm is built with it")
    t0 = time.monotonic()
    tag = module_gomod(MODULE, HELM_VERSION)
    flags = ldflags(tag)
    base = helm_dir()
    stage = base / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    (base / "BUILT").unlink(missing_ok=True)
    env = {"CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    say(f"helm {HELM_VERSION}: building into {base}")
    common = ["-p", "2", "-trimpath", "-ldflags", flags]
    if tag.get("Replace"):  # go install module@version refuses replace directives
        src = base / "src"
        src.mkdir(parents=True, exist_ok=True)
        lines = ["module drahealth.test/helmpeer", "", f"go {tag.get('Go') or '1.24.0'}", "",
                 f"require {MODULE} {HELM_VERSION}", ""]  # fmt: skip
        for rep in tag["Replace"]:
            old, new = rep["Old"], rep["New"]
            if not new.get("Version"):  # a local directory: not in the published module
                raise HarnessError(
                    f"{MODULE}@{HELM_VERSION} replaces {old['Path']} by a local directory"
                )
            lines.append(f"replace {old['Path']} => {new['Path']} {new['Version']}")
        (src / "go.mod").write_text("\n".join(lines) + "\n")
        (src / "tools.go").write_text(CONSUMER_TOOLS_GO)
        _run(["go", "mod", "tidy"], cwd=src, env=env, timeout=1800,
             what=f"go mod tidy for {MODULE}@{HELM_VERSION}")  # fmt: skip
        _run(["go", "build", *common, "-o", str(stage / "helm"), f"{MODULE}/cmd/helm"],
             cwd=src, env=env, timeout=BUILD_TIMEOUT_S,
             what=f"building helm {HELM_VERSION}")  # fmt: skip
    else:
        _run(["go", "install", *common, f"{MODULE}/cmd/helm@{HELM_VERSION}"],
             env={**env, "GOBIN": str(stage)}, timeout=BUILD_TIMEOUT_S,
             what=f"building helm {HELM_VERSION}")  # fmt: skip
    built = stage / "helm"
    reported = _reported_version(built)
    if reported != HELM_VERSION:
        raise HarnessError(f"the built helm reports {reported or 'no version'}, not {HELM_VERSION}")
    os.replace(built, target)
    shutil.rmtree(stage, ignore_errors=True)
    (base / "BUILT").write_text(
        json.dumps({"version": HELM_VERSION, "seconds": round(time.monotonic() - t0)}) + "\n"
    )
    say(f"helm {HELM_VERSION}: built in {time.monotonic() - t0:.0f} s into {target}")
    return target
