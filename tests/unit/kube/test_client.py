"""Client factory: resolution order and kubeconfig validation (no server needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightkube
import pytest
import yaml

from drahealth.kube import (
    KubeConfigError,
    embedded_kubeconfig,
    load_config,
    make_client,
    make_sync_client,
)


def _kubeconfig(
    server: str = "https://example.invalid:6443",
    *,
    current: str | None = "main",
    namespace: str | None = "team-a",
    user: dict[str, Any] | None = None,
) -> dict[str, Any]:
    ctx: dict[str, Any] = {"cluster": "c1", "user": "u1"}
    if namespace:
        ctx["namespace"] = namespace
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c1", "cluster": {"server": server}},
            {"name": "c2", "cluster": {"server": "https://other.invalid"}},
        ],
        "users": [{"name": "u1", "user": user or {"token": "secret"}}],
        "contexts": [
            {"name": "main", "context": ctx},
            {"name": "other", "context": {"cluster": "c2"}},
        ],
    }
    if current is not None:
        doc["current-context"] = current
    return doc


def _write(path: Path, doc: Any) -> Path:
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


@pytest.fixture
def isolated(tmp_path: Path) -> dict[str, Any]:
    """load_config kwargs that make the environment irrelevant."""
    return {
        "environ": {},
        "service_account_dir": tmp_path / "no-sa",
        "default_kubeconfig": tmp_path / "no-home" / "config",
    }


def test_server_url_builds_token_user(isolated: dict[str, Any]) -> None:
    cfg = load_config(server_url="http://127.0.0.1:1234", **isolated)
    assert cfg.cluster.server == "http://127.0.0.1:1234"
    assert cfg.user is not None and cfg.user.token == "drahealth"
    assert cfg.namespace == "default"


def test_server_url_wins_over_everything(tmp_path: Path) -> None:
    kc = _write(tmp_path / "kc", _kubeconfig())
    cfg = load_config(
        kc,
        server_url="http://127.0.0.1:9",
        environ={"KUBECONFIG": str(kc)},
        default_kubeconfig=kc,
    )
    assert cfg.cluster.server == "http://127.0.0.1:9"


def test_server_url_needs_scheme(isolated: dict[str, Any]) -> None:
    with pytest.raises(KubeConfigError, match="must start with http"):
        load_config(server_url="127.0.0.1:80", **isolated)


def test_embedded_kubeconfig_round_trips(tmp_path: Path, isolated: dict[str, Any]) -> None:
    kc = _write(tmp_path / "kc", embedded_kubeconfig("http://127.0.0.1:5", namespace="x"))
    cfg = load_config(kc, **isolated)
    assert cfg.cluster.server == "http://127.0.0.1:5"
    assert cfg.namespace == "x"


def test_explicit_file_current_context(tmp_path: Path, isolated: dict[str, Any]) -> None:
    kc = _write(tmp_path / "kc", _kubeconfig())
    cfg = load_config(kc, **isolated)
    assert cfg.context_name == "main"
    assert cfg.cluster.server == "https://example.invalid:6443"
    assert cfg.namespace == "team-a"
    assert cfg.fname == kc.absolute()


def test_explicit_context_without_user(tmp_path: Path, isolated: dict[str, Any]) -> None:
    kc = _write(tmp_path / "kc", _kubeconfig())
    cfg = load_config(kc, context="other", **isolated)
    assert cfg.cluster.server == "https://other.invalid"
    # lightkube asserts a user exists; we substitute an empty one
    assert cfg.user is not None and cfg.user.token is None


def test_explicit_file_beats_env(tmp_path: Path) -> None:
    a = _write(tmp_path / "a", _kubeconfig("https://a.invalid"))
    b = _write(tmp_path / "b", _kubeconfig("https://b.invalid"))
    cfg = load_config(a, environ={"KUBECONFIG": str(b)})
    assert cfg.cluster.server == "https://a.invalid"


def test_env_kubeconfig_first_existing(tmp_path: Path, isolated: dict[str, Any]) -> None:
    b = _write(tmp_path / "b", _kubeconfig("https://b.invalid"))
    isolated["environ"] = {"KUBECONFIG": f"{tmp_path / 'missing'}:{b}"}
    assert load_config(**isolated).cluster.server == "https://b.invalid"


def test_env_kubeconfig_none_exist(tmp_path: Path, isolated: dict[str, Any]) -> None:
    isolated["environ"] = {"KUBECONFIG": str(tmp_path / "missing")}
    with pytest.raises(KubeConfigError, match=r"\$KUBECONFIG=.*none of the listed files exist"):
        load_config(**isolated)


def _service_account(tmp_path: Path) -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token\n")
    (sa / "namespace").write_text("kube-system")
    return sa


def test_in_cluster_service_account(tmp_path: Path) -> None:
    sa = _service_account(tmp_path)
    home = _write(tmp_path / "home", _kubeconfig("https://home.invalid"))
    cfg = load_config(
        environ={"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
        service_account_dir=sa,
        default_kubeconfig=home,
    )
    assert cfg.cluster.server == "https://[fd00::1]:443"
    assert cfg.user is not None and cfg.user.token == "sa-token"
    assert cfg.namespace == "kube-system"


def test_env_kubeconfig_beats_in_cluster(tmp_path: Path) -> None:
    sa = _service_account(tmp_path)
    b = _write(tmp_path / "b", _kubeconfig("https://b.invalid"))
    cfg = load_config(
        environ={
            "KUBECONFIG": str(b),
            "KUBERNETES_SERVICE_HOST": "10.0.0.1",
            "KUBERNETES_SERVICE_PORT": "443",
        },
        service_account_dir=sa,
    )
    assert cfg.cluster.server == "https://b.invalid"


def test_token_without_service_host_falls_through(tmp_path: Path) -> None:
    sa = _service_account(tmp_path)
    home = _write(tmp_path / "home", _kubeconfig("https://home.invalid"))
    cfg = load_config(environ={}, service_account_dir=sa, default_kubeconfig=home)
    assert cfg.cluster.server == "https://home.invalid"


def test_nothing_found(isolated: dict[str, Any]) -> None:
    with pytest.raises(KubeConfigError, match="no Kubernetes configuration found"):
        load_config(**isolated)


@pytest.mark.parametrize(
    ("content", "context", "message"),
    [
        (None, None, "file not found"),
        ("clusters: [\n  - name: x\n bad", None, "invalid YAML"),
        ("", None, "expected a kubeconfig mapping, got an empty document"),
        ("- a\n- b\n", None, "expected a kubeconfig mapping, got list"),
        ({"clusters": {"a": 1}, "contexts": []}, None, "'clusters' must be a list"),
        (
            {"clusters": [{"name": "c"}], "contexts": []},
            None,
            r"clusters\[0\] \('c'\) has no 'cluster'",
        ),
        ({"clusters": [], "contexts": [{"context": {}}]}, None, r"contexts\[0\] has no 'name'"),
        ({"clusters": [], "contexts": []}, None, "no contexts defined"),
        (_kubeconfig(current=None), None, r"no current-context set .*available: main, other"),
        (_kubeconfig(), "nope", r"context 'nope' not found \(available: main, other\)"),
        (
            {**_kubeconfig(), "clusters": [{"name": "zz", "cluster": {"server": "https://x"}}]},
            None,
            "context 'main' refers to unknown cluster 'c1'",
        ),
        ({**_kubeconfig(), "users": []}, None, "context 'main' refers to unknown user 'u1'"),
        (
            {
                **_kubeconfig(),
                "clusters": [{"name": "c1", "cluster": {"certificate-authority": "x"}}],
            },
            None,
            "cluster 'c1' has no 'server'",
        ),
        (
            {
                **_kubeconfig(),
                "clusters": [
                    {
                        "name": "c1",
                        "cluster": {"server": "https://x", "insecure-skip-tls-verify": "no"},
                    }
                ],
            },
            None,
            "invalid entry",
        ),
    ],
)
def test_malformed_kubeconfig(
    tmp_path: Path, isolated: dict[str, Any], content: Any, context: str | None, message: str
) -> None:
    path = tmp_path / "kubeconfig.yaml"
    if content is not None:
        _write(path, content)
    with pytest.raises(KubeConfigError, match=message) as info:
        load_config(path, context=context, **isolated)
    assert str(path) in str(info.value)  # the message names the file
    assert isinstance(info.value, lightkube.ConfigError)


def test_directory_instead_of_file(tmp_path: Path, isolated: dict[str, Any]) -> None:
    with pytest.raises(KubeConfigError, match="is a directory"):
        load_config(tmp_path, **isolated)


async def test_make_client_embedded() -> None:
    client = make_client(server_url="http://127.0.0.1:1", namespace="ns1", field_manager="me")
    try:
        assert isinstance(client, lightkube.AsyncClient)
        assert client.namespace == "ns1"
        assert client.config.cluster.server == "http://127.0.0.1:1"
    finally:
        await client.close()


async def test_make_client_from_file(tmp_path: Path) -> None:
    kc = _write(tmp_path / "kc", _kubeconfig("https://a.invalid"))
    client = make_client(kc, timeout=2.5)
    try:
        assert client.namespace == "team-a"
        assert client.config.context_name == "main"
    finally:
        await client.close()


def test_make_client_bad_file_raises(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="file not found"):
        make_client(tmp_path / "missing")


def test_make_sync_client(tmp_path: Path) -> None:
    kc = _write(tmp_path / "kc", _kubeconfig("https://a.invalid"))
    client = make_sync_client(kc, context="other", namespace="z")
    try:
        assert isinstance(client, lightkube.Client)
        assert client.namespace == "z"
        assert client.config.cluster.server == "https://other.invalid"
    finally:
        client.close()


def test_an_auth_provider_user_is_a_clear_error(tmp_path: Path, isolated: dict[str, Any]) -> None:
    """lightkube raises a bare ConfigError from its request path for auth providers; the
    load names the problem instead, so the CLI prints one line and exits 2."""
    doc = _kubeconfig(user={"auth-provider": {"name": "gcp", "config": {}}})
    kc = _write(tmp_path / "kc", doc)
    with pytest.raises(KubeConfigError, match="auth-provider 'gcp' is not supported"):
        load_config(kc, **isolated)
