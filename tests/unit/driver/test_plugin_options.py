"""PluginOptions: documented defaults, derived paths (plain and rolling-update) and
validation errors that name the bad value."""

from __future__ import annotations

import pytest

from drahealth import api
from drahealth.driver._plugin import _resolve_gid
from drahealth.driver._types import DEFAULT_MAX_MESSAGE_BYTES, PluginOptions, validate_driver_name

POD_UID = "ad4af911-5bcd-47c5-a554-f35cea869472"


def test_defaults_match_the_go_helper() -> None:
    o = PluginOptions("gpu.example.com")
    assert o.registrar_socket == "/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock"
    assert o.dra_socket == "/var/lib/kubelet/plugins/gpu.example.com/dra.sock"
    assert o.data_dir == o.effective_state_dir == "/var/lib/kubelet/plugins/gpu.example.com"
    assert o.lock_path == "/var/lib/kubelet/plugins/gpu.example.com/serialize.lock"
    assert o.checkpoint_path == "/var/lib/kubelet/plugins/gpu.example.com/prepared-claims.json"
    assert o.cdi_dir == "/var/run/cdi" and o.cdi_class == "claim"
    assert o.serialize and o.kube_client is None and o.pod_uid is None
    assert o.socket_mode == 0o600 and o.socket_group is None
    assert o.max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES == 16 * 1024 * 1024
    assert not o.enable_error_type_field


def test_rolling_update_paths() -> None:
    o = PluginOptions("gpu.example.com", pod_uid=POD_UID, state_dir="/state")
    assert o.registrar_socket == api.registrar_socket_path("gpu.example.com", pod_uid=POD_UID)
    assert o.registrar_socket.endswith(f"/gpu.example.com-{POD_UID}-reg.sock")
    assert o.dra_socket == f"/var/lib/kubelet/plugins/gpu.example.com/dra-{POD_UID}.sock"
    assert o.lock_path == "/state/serialize.lock"


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "must not be empty"),
        ("a" * 64, "too long: 64 characters"),
        ("../evil", "'../evil' is not a DNS subdomain"),
        ("evil driver", "'evil driver' is not a DNS subdomain"),
        ("GPU.example.com", "'GPU.example.com' is not a DNS subdomain"),
        ("-gpu.example.com", "is not a DNS subdomain"),
        ("gpu..example.com", "is not a DNS subdomain"),
    ],
)
def test_bad_driver_names(name: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="driver name") as info:
        PluginOptions(name)
    assert fragment in str(info.value)


def test_good_driver_names() -> None:
    for name in ("gpu.example.com", "a", "a" * 63, "x-1.y-2"):
        assert validate_driver_name(name) == name


def test_other_validation_errors() -> None:
    with pytest.raises(ValueError, match="cdi_class 'a/b'"):
        PluginOptions("gpu.example.com", cdi_class="a/b")
    with pytest.raises(ValueError, match="max_message_bytes"):
        PluginOptions("gpu.example.com", max_message_bytes=0)
    with pytest.raises(ValueError, match="DRA socket path '/" + "p" * 10):
        PluginOptions("gpu.example.com", plugins_dir="/" + "p" * 100)
    with pytest.raises(ValueError, match="no such group"):
        _resolve_gid("no-such-group-drahealth")
    assert _resolve_gid(0) == 0 and _resolve_gid(None) is None
