"""Fixtures for the real-cluster suite: one real control plane per test session.

``DRAHEALTH_REALK8S_DIR=DIR`` reuses a control plane (and a kubelet) started with
``scripts/realk8s up --dir DIR`` (``node-up --dir DIR``) and leaves them running.
Otherwise the release comes from ``DRAHEALTH_K8S_VERSION`` (default 1.37) and the gate set from
``DRAHEALTH_K8S_GATES`` (``default`` or ``taints``). Where that release is not built here
(no Go, or ``scripts/realk8s build`` not run) every test skips with that reason; with
``DRAHEALTH_REALK8S_REQUIRED=1`` (CI's real-cluster step) it fails instead, so the step
cannot pass by skipping.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from lightkube import AsyncClient

from drahealth.kube import make_client
from tests.realk8s.harness import Cluster, HarnessError, down, not_built_reason, resolve_version
from tests.realk8s.harness import up as start
from tests.realk8s.node import Kubelet, kubelet_not_built_reason, node_down, node_up
from tests.realk8s.required import skip_unless_built


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[Cluster]:
    reuse = os.environ.get("DRAHEALTH_REALK8S_DIR")
    if reuse:  # a control plane started by `scripts/realk8s up --dir DIR`, left running
        try:
            cluster = Cluster.load(reuse)
        except HarnessError as exc:
            pytest.fail(f"DRAHEALTH_REALK8S_DIR: {exc}")
        if not cluster.running():
            pytest.fail(f"DRAHEALTH_REALK8S_DIR: the control plane in {reuse} is not running")
        yield cluster
        return
    version = resolve_version(None)
    gates = os.environ.get("DRAHEALTH_K8S_GATES", "default")
    skip_unless_built(not_built_reason(version))
    directory = tempfile.mkdtemp(prefix=f"realk8s-{version}-", dir="/tmp")
    try:
        cluster = start(version, directory, gates=gates, say=lambda _m: None)
    except HarnessError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.fail(f"the real control plane did not start: {exc}")
    try:
        yield cluster
    finally:
        down(cluster, remove=os.environ.get("DRAHEALTH_REALK8S_KEEP") != "1")


@pytest.fixture(scope="session")
def real_kubelet(real_cluster: Cluster) -> Iterator[Kubelet]:
    """The release's real kubelet on the fake CRI runtime, beside the control plane;
    skipped (or failed where required) where the release's kubelet is not built."""
    reuse = os.environ.get("DRAHEALTH_REALK8S_DIR")
    if reuse and (Path(reuse) / "node" / "node.json").is_file():
        node = Kubelet.load(Path(reuse) / "node")  # from `scripts/realk8s node-up`
        if node.running():
            yield node
            return
    skip_unless_built(kubelet_not_built_reason(real_cluster.version))
    directory = tempfile.mkdtemp(prefix="realk8s-node-", dir="/tmp")
    try:
        node = node_up(real_cluster, directory, say=lambda _m: None)
    except HarnessError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.fail(f"the real kubelet did not start: {exc}")
    try:
        yield node
    finally:
        node_down(node, remove=os.environ.get("DRAHEALTH_REALK8S_KEEP") != "1")


@pytest.fixture
async def real_client(real_cluster: Cluster) -> AsyncIterator[AsyncClient]:
    client = make_client(kubeconfig=real_cluster.kubeconfig)
    try:
        yield client
    finally:
        await client.close()
