"""How the CLI finds its cluster and namespace: ``$KUBECONFIG`` merged as kubectl merges
it, ``--context``, the context's namespace, ``-n`` and ``-A``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from drahealth.cli._access import Access, api_options
from drahealth.kube import KubeConfigError, load_config, merge_kubeconfigs


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def _config(
    contexts: dict[str, tuple[str, str | None]], current: str | None = None, **extra: Any
) -> dict[str, Any]:
    """``contexts``: name -> (server, namespace)."""
    doc: dict[str, Any] = {
        "clusters": [{"name": n, "cluster": {"server": s}} for n, (s, _) in contexts.items()],
        "users": [{"name": n, "user": {"token": "t"}} for n in contexts],
        "contexts": [
            {"name": n, "context": {"cluster": n, "user": n, **({"namespace": ns} if ns else {})}}
            for n, (_, ns) in contexts.items()
        ],
        **extra,
    }
    if current:
        doc["current-context"] = current
    return doc


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config of this machine
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return tmp_path


def test_kubeconfig_list_merges_first_name_wins_and_first_current_context(env: Path) -> None:
    a = _write(env / "a", _config({"shared": ("https://a:6443", "from-a")}))
    b = _write(
        env / "b",
        _config(
            {"shared": ("https://b:6443", "from-b"), "only-b": ("https://b2:6443", None)},
            current="shared",
        ),
    )
    merged = merge_kubeconfigs([env / "missing", a, b])
    assert [c["name"] for c in merged["contexts"]] == ["shared", "only-b"]
    assert merged["current-context"] == "shared"
    config = load_config(environ={"KUBECONFIG": f"{env / 'missing'}:{a}:{b}"})
    # a defines "shared" first: its server and namespace win; the current context is b's
    assert (config.context_name, config.cluster.server, config.namespace) == (
        "shared",
        "https://a:6443",
        "from-a",
    )
    other = load_config(environ={"KUBECONFIG": f"{a}:{b}"}, context="only-b")
    assert other.cluster.server == "https://b2:6443" and other.namespace == "default"


def test_relative_files_keep_meaning_the_file_next_to_their_kubeconfig(env: Path) -> None:
    (env / "sub").mkdir()
    (env / "sub" / "ca.crt").write_text("x")
    doc = _config({"c": ("https://c:6443", None)}, current="c")
    doc["clusters"][0]["cluster"]["certificate-authority"] = "ca.crt"
    sub = _write(env / "sub" / "config", doc)
    other = _write(env / "other", _config({"d": ("https://d:6443", None)}))
    config = load_config(environ={"KUBECONFIG": f"{other}:{sub}"})
    assert config.cluster.certificate_auth == str(env / "sub" / "ca.crt")


@pytest.mark.parametrize(
    ("files", "fragment"),
    [
        ({}, "none of the listed files exist"),
        ({"a": "clusters: [1, 2]\n"}, "clusters[0] must be a mapping"),
        ({"a": "- just\n- a list\n"}, "expected a kubeconfig mapping"),
        ({"a": "key: [unclosed\n"}, "invalid YAML"),
    ],
)
def test_a_broken_file_in_the_list_is_named(
    env: Path, files: dict[str, str], fragment: str
) -> None:
    for name, text in files.items():
        (env / name).write_text(text)
    good = _write(env / "good", _config({"g": ("https://g:6443", None)}, current="g"))
    paths = [env / "a", good] if files else [env / "a", env / "b"]
    with pytest.raises(KubeConfigError) as info:
        merge_kubeconfigs(paths)
    assert fragment in str(info.value)


def _probe(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    @click.command()
    @api_options(namespaced=True)
    def cmd(access: Access) -> None:
        config = access.config()
        click.echo(f"{config.context_name} {access.scope} {access.where()}")

    result = CliRunner().invoke(cmd, args, env=env)
    return result.exit_code, result.output.strip()


def test_namespace_follows_kubectl(env: Path) -> None:
    kc = _write(
        env / "kc",
        _config({"ml": ("https://a:6443", "ml"), "plain": ("https://b:6443", None)}, current="ml"),
    )
    k = ["--kubeconfig", str(kc)]
    assert _probe(k) == (0, "ml ml in ml namespace")  # the context's namespace
    assert _probe([*k, "-n", "team"]) == (0, "ml team in team namespace")
    assert _probe([*k, "-A"]) == (0, "ml None in any namespace")
    assert _probe([*k, "-A", "-n", "team"]) == (0, "ml None in any namespace")  # -A wins
    assert _probe([*k, "--context", "plain"]) == (0, "plain default in default namespace")
    assert _probe([], {"KUBECONFIG": str(kc)}) == (0, "ml ml in ml namespace")


def test_config_errors_are_one_line_usage_errors_naming_what_to_check(env: Path) -> None:
    kc = _write(env / "kc", _config({"ml": ("https://a:6443", "ml")}, current="ml"))
    code, out = _probe(["--kubeconfig", str(kc), "--context", "nope"])
    assert code == 2
    assert out == (
        f"error: kubeconfig {kc}: context 'nope' not found (available: ml) "
        "(check --kubeconfig, $KUBECONFIG and --context)"
    )
    code, out = _probe([], {"KUBECONFIG": str(env / "missing")})
    assert code == 2 and out.startswith("error: $KUBECONFIG=") and len(out.splitlines()) == 1


class _Lister:
    """Answers the controller search: ConfigMaps by name, or 403 for all of them."""

    def __init__(self, found: dict[str, list[str]] | None) -> None:
        self.found = found

    def list(self, _kind: Any, *, namespace: str, fields: dict[str, str]) -> list[Any]:
        from lightkube import ApiError
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import ConfigMap

        assert namespace == "*"
        if self.found is None:
            response = type("R", (), {"json": lambda self: {"code": 403, "message": "no"}})()
            raise ApiError(response=response)  # type: ignore[arg-type]
        name = fields["metadata.name"]
        return [
            ConfigMap(metadata=ObjectMeta(name=name, namespace=ns))
            for ns in self.found.get(name, [])
        ]


@pytest.mark.parametrize(
    ("found", "explicit", "chosen", "said"),
    [
        ({"drahealth-remediation-state": ["ops"]}, None, "ops", ""),
        ({"drahealth-remediation-history": ["ops"]}, None, "ops", ""),
        ({}, None, "ml", ""),  # no controller ran: the context's namespace
        ({"drahealth-remediation-state": ["a", "ml"]}, None, "ml", "found in a, ml; using ml"),
        ({"drahealth-remediation-state": ["a", "b"]}, None, "a", "found in a, b; using a"),
        (None, None, "ml", "cannot list ConfigMaps in every namespace"),
        (None, "given", "given", ""),  # the flag wins, nothing is asked
    ],
)
def test_the_controllers_namespace_is_found(
    env: Path,
    found: dict[str, list[str]] | None,
    explicit: str | None,
    chosen: str,
    said: str,
) -> None:
    from drahealth.cli._access import controller_namespace

    kc = _write(env / "kc", _config({"c": ("https://a:6443", "ml")}, current="c"))
    notes: list[str] = []
    got = controller_namespace(
        _Lister(found),  # type: ignore[arg-type]
        explicit,
        Access(str(kc)),
        notes.append,
        flag="-n",
    )
    assert got == chosen
    assert (said in " ".join(notes)) if said else notes == []
    if notes:
        assert notes[0].endswith("(give -n)")
