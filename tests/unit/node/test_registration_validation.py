"""validate_plugin_info: the kubelet's checks of a GetInfo answer, and Go %q quoting."""

from __future__ import annotations

from typing import Any

import pytest

from drahealth import api
from drahealth.node._types import PluginInfo, RegistrationError
from drahealth.node._validation import (
    NO_HANDLER_PREFIX,
    VALIDATION_FAILED_PREFIX,
    clean_path,
    go_quote,
    go_quote_list,
    validate_plugin_info,
)

ROOT = "/var/lib/kubelet"
REG = f"{ROOT}/plugins_registry/gpu.example.com-reg.sock"
GOOD_ENDPOINT = f"{ROOT}/plugins/gpu.example.com/dra.sock"
VERSIONS = ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth"]


def answer(**kw: Any) -> api.registration.PluginInfo:
    fields: dict[str, Any] = {
        "type": "DRAPlugin",
        "name": "gpu.example.com",
        "endpoint": GOOD_ENDPOINT,
        "supported_versions": VERSIONS,
    }
    fields.update(kw)
    return api.registration.PluginInfo(**fields)


def validate(info: api.registration.PluginInfo, roots: list[str] | None = None) -> PluginInfo:
    return validate_plugin_info(info, registration_socket=REG, allowed_roots=roots or [ROOT])


def refusal(info: api.registration.PluginInfo, roots: list[str] | None = None) -> str:
    with pytest.raises(RegistrationError) as err:
        validate(info, roots)
    return str(err.value)


def detail(info: api.registration.PluginInfo, roots: list[str] | None = None) -> str:
    text = refusal(info, roots)
    assert text.startswith(VALIDATION_FAILED_PREFIX), text
    return text.removeprefix(VALIDATION_FAILED_PREFIX)


# -- accepted ----------------------------------------------------------------------


def test_valid_answer_becomes_plugin_info() -> None:
    assert validate(answer()) == PluginInfo(
        driver="gpu.example.com",
        endpoint=GOOD_ENDPOINT,
        versions=tuple(VERSIONS),
        registration_socket=REG,
    )


def test_versions_keep_the_plugins_order() -> None:
    order = ["v1.DRAResourceHealth", "v1beta1.DRAPlugin", "custom.Thing", "v1.DRAPlugin"]
    assert validate(answer(supported_versions=order)).versions == tuple(order)


@pytest.mark.parametrize(
    "versions", [["v1.DRAPlugin"], ["v1beta1.DRAPlugin"], ["x", "v1.DRAPlugin"]]
)
def test_one_supported_dra_version_is_enough(versions: list[str]) -> None:
    assert validate(answer(supported_versions=versions)).versions == tuple(versions)


@pytest.mark.parametrize(
    ("endpoint", "cleaned"),
    [
        (f"{ROOT}/plugins/example.com/dra.sock", f"{ROOT}/plugins/example.com/dra.sock"),
        (
            f"{ROOT}/plugins/example.com/rolling/dra.sock",
            f"{ROOT}/plugins/example.com/rolling/dra.sock",
        ),
        (
            f"{ROOT}/plugins_registry/example.com-common.sock",
            f"{ROOT}/plugins_registry/example.com-common.sock",
        ),
        (f"{ROOT}/plugins/./example.com/../dra.sock", f"{ROOT}/plugins/dra.sock"),
        (f"{ROOT}//plugins///x.sock", f"{ROOT}/plugins/x.sock"),
        (f"{ROOT}/../kubelet/plugins/x.sock", f"{ROOT}/plugins/x.sock"),
        (f"/{ROOT}/plugins/x.sock", f"{ROOT}/plugins/x.sock"),
    ],
)
def test_endpoint_is_returned_cleaned(endpoint: str, cleaned: str) -> None:
    assert validate(answer(endpoint=endpoint)).endpoint == cleaned


def test_any_allowed_root_will_do() -> None:
    info = validate(answer(endpoint="/run/other/dra.sock"), roots=[ROOT, "/run/other/"])
    assert info.endpoint == "/run/other/dra.sock"


def test_root_slash_allows_every_absolute_path() -> None:
    assert validate(answer(endpoint="/x.sock"), roots=["/"]).endpoint == "/x.sock"


def test_name_of_exactly_63_characters() -> None:
    name = "a" * 59 + ".com"
    assert len(name) == 63
    assert validate(answer(name=name)).driver == name


def test_endpoint_of_107_bytes_is_accepted() -> None:
    endpoint = f"{ROOT}/plugins/" + "d" * (107 - len(f"{ROOT}/plugins/"))
    assert len(endpoint) == 107
    assert validate(answer(endpoint=endpoint)).endpoint == endpoint


def test_symlinks_are_never_resolved(tmp_path: Any) -> None:
    # A real symlink inside the root pointing outside: validation is lexical only.
    root = tmp_path / "kubelet"
    root.mkdir()
    (root / "link").symlink_to("/etc")
    endpoint = f"{root}/link/dra.sock"
    assert validate(answer(endpoint=endpoint), roots=[str(root)]).endpoint == endpoint


# -- refused: type ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["CSIPlugin", "DevicePlugin", "", "draplugin"])
def test_other_plugin_types_have_no_handler(kind: str) -> None:
    assert refusal(answer(type=kind)) == (
        f"RegisterPlugin error -- no handler registered for plugin type: {kind}"
    )
    assert refusal(answer(type=kind)).startswith(NO_HANDLER_PREFIX)


def test_type_is_checked_before_anything_else() -> None:
    bad = answer(type="CSIPlugin", name="", endpoint="", supported_versions=[])
    assert refusal(bad).startswith(NO_HANDLER_PREFIX)


# -- refused: name ----------------------------------------------------------------


def test_empty_name_is_required() -> None:
    assert "Required value" in detail(answer(name=""))


@pytest.mark.parametrize(
    "name",
    [
        "../evil",
        "evil driver",
        "GPU.example.com",
        "gpu.Example.com",
        "-gpu.example.com",
        "gpu.example.com-",
        "gpu..example.com",
        "gpu_example.com",
        "gpu/example.com",
        "gpu.example.com\n",
        "gpü.example.com",
        ".",
    ],
)
def test_invalid_driver_names(name: str) -> None:
    text = detail(answer(name=name))
    assert "invalid DRA driver name" in text
    assert go_quote(name) in text


def test_name_longer_than_63_characters() -> None:
    text = detail(answer(name="a" * 64))
    assert "Too long" in text and "63" in text


def test_name_is_checked_before_endpoint_and_versions() -> None:
    assert "Required value" in detail(answer(name="", endpoint="", supported_versions=[]))


# -- refused: endpoint ------------------------------------------------------------


def test_empty_endpoint() -> None:
    assert "empty DRA plugin endpoint" in detail(answer(endpoint=""))


@pytest.mark.parametrize("endpoint", ["dra.sock", "plugins/x/dra.sock", "./dra.sock", "~/dra.sock"])
def test_relative_endpoint(endpoint: str) -> None:
    text = detail(answer(endpoint=endpoint))
    assert "must be an absolute path" in text
    assert go_quote(endpoint) in text


@pytest.mark.parametrize("size", [108, 109, 500])
def test_endpoint_of_108_bytes_or_more(size: int) -> None:
    endpoint = f"{ROOT}/plugins/" + "d" * (size - len(f"{ROOT}/plugins/"))
    assert len(endpoint.encode()) == size
    text = detail(answer(endpoint=endpoint))
    assert "longer than" in text and str(size) in text


def test_endpoint_length_counts_bytes_not_characters() -> None:
    prefix = f"{ROOT}/plugins/"
    endpoint = prefix + "é" * ((108 - len(prefix)) // 2 + 1)
    assert len(endpoint) < 108 <= len(endpoint.encode())
    assert "longer than" in detail(answer(endpoint=endpoint))


def test_endpoint_with_nul_byte() -> None:
    assert "NUL" in detail(answer(endpoint=f"{ROOT}/plugins/a\x00b.sock"))


@pytest.mark.parametrize(
    "endpoint",
    [
        "/tmp/dra.sock",
        "/var/lib/kubelet",
        "/var/lib/kubelet/",
        "/var/lib/kubelet/.",
        "/var/lib/kubelet-evil/dra.sock",
        "/var/lib/kubelet/../kubelet-evil/dra.sock",
        "/var/lib/kubelet/plugins/../../dra.sock",
        "/var/lib/kubelet/../../../../etc/dra.sock",
        "/var/lib/dra.sock",
    ],
)
def test_endpoint_outside_the_root(endpoint: str) -> None:
    text = detail(answer(endpoint=endpoint))
    assert "is not inside" in text
    assert go_quote(clean_path(endpoint)) in text
    assert go_quote(ROOT) in text


def test_endpoint_outside_every_allowed_root_names_them_all() -> None:
    text = detail(answer(endpoint="/tmp/x.sock"), roots=[ROOT, "/run/dra"])
    assert 'is not inside any of the allowed directories ["/var/lib/kubelet" "/run/dra"]' in text


def test_endpoint_is_checked_before_versions() -> None:
    assert "empty DRA plugin endpoint" in detail(answer(endpoint="", supported_versions=[]))


# -- refused: versions ------------------------------------------------------------


def test_empty_versions() -> None:
    assert detail(answer(supported_versions=[])) == (
        "empty list of supported gRPC services (aka supported versions)"
    )


def test_no_supported_versions_lists_both_sides_like_go() -> None:
    text = detail(answer(supported_versions=["v1alpha3", "v1.DRAResourceHealth"]))
    assert text == (
        'none of services supported by the plugin (["v1alpha3" "v1.DRAResourceHealth"]) '
        'are supported by the kubelet (["v1.DRAPlugin" "v1beta1.DRAPlugin"])'
    )


def test_health_entries_alone_are_not_enough() -> None:
    text = detail(answer(supported_versions=["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]))
    assert text.startswith("none of services supported by the plugin")


def test_version_strings_are_exact() -> None:
    text = detail(answer(supported_versions=["v1.draplugin", " v1.DRAPlugin", "DRAPlugin"]))
    assert text.startswith("none of services supported by the plugin")


# -- bad arguments ----------------------------------------------------------------


def test_allowed_roots_must_be_a_sequence_of_absolute_paths() -> None:
    with pytest.raises(ValueError, match="at least one"):
        validate_plugin_info(answer(), registration_socket=REG, allowed_roots=[])
    with pytest.raises(ValueError, match="absolute"):
        validate_plugin_info(answer(), registration_socket=REG, allowed_roots=["var/lib"])
    with pytest.raises(TypeError, match="single string"):
        validate_plugin_info(answer(), registration_socket=REG, allowed_roots=ROOT)


# -- Go quoting -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("", '""'),
        ("abc", '"abc"'),
        ('a"b', r'"a\"b"'),
        ("a\\b", r'"a\\b"'),
        ("\a\b\f\n\r\t\v", r'"\a\b\f\n\r\t\v"'),
        ("\x00\x1b\x7f", r'"\x00\x1b\x7f"'),
        ("é日本", '"é日本"'),
        ("\u00ad\u200b\u00a0", r'"\u00ad\u200b\u00a0"'),
        ("\U000e0001", r'"\U000e0001"'),
        ("a b", '"a b"'),
        (b"x\xff".decode("utf-8", "surrogateescape"), r'"x\xff"'),
    ],
)
def test_go_quote(text: str, quoted: str) -> None:
    assert go_quote(text) == quoted


def test_go_quote_list() -> None:
    assert go_quote_list([]) == "[]"
    assert go_quote_list(["a"]) == '["a"]'
    assert go_quote_list(["a", 'b"c']) == r'["a" "b\"c"]'


@pytest.mark.parametrize(
    ("path", "cleaned"),
    [
        ("/a/./b/../c", "/a/c"),
        ("//a//b/", "/a/b"),
        ("///", "/"),
        ("/..", "/"),
        ("/../a", "/a"),
    ],
)
def test_clean_path_matches_go(path: str, cleaned: str) -> None:
    assert clean_path(path) == cleaned
