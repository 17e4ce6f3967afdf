"""Rolling-update socket names: byte-for-byte the Go helper's choices at each length boundary."""

from __future__ import annotations

import posixpath

import pytest

from drahealth import api

POD_UID = "ad4af911-5bcd-47c5-a554-f35cea869472"


def _driver(length: int) -> str:
    return "a" * (length - 12) + ".example.org"


@pytest.mark.parametrize(
    ("driver_len", "registry_dir", "path_bytes", "form"),
    [
        (27, api.KUBELET_REGISTRY_DIR + "/./", 107, "uid"),
        (34, "/" + "r" * 50, 107, "uid-hash"),
        (34, "/" + "r" * 51, 108, "uid-hash"),
        (34, "/" + "r" * 52, 89, "both-hash"),
        (34, "/" + "r" * 70, 107, "both-hash"),
        (34, "/" + "r" * 71, 108, "both-hash"),
        (34, "/" + "r" * 72, 109, "both-hash"),
    ],
)
def test_rolling_update_name_length_boundaries(
    driver_len: int, registry_dir: str, path_bytes: int, form: str
) -> None:
    driver = _driver(driver_len)
    name = api.rolling_update_registrar_socket_name(registry_dir, driver, POD_UID)
    assert len(posixpath.join(posixpath.normpath(registry_dir), name)) == path_bytes
    if form == "uid":
        assert name == f"{driver}-{POD_UID}-reg.sock"
    elif form == "uid-hash":
        assert name.startswith(driver + "-") and name.endswith("-reg.sock")
        assert len(name) == len(driver) + 1 + 11 + len("-reg.sock")
    else:
        assert name.startswith("dra-") and len(name) == 4 + 22 + len("-reg.sock")


def test_hashes_are_sha256_base64url_unpadded() -> None:
    import base64
    import hashlib

    driver = _driver(34)
    name = api.rolling_update_registrar_socket_name("/" + "r" * 50, driver, POD_UID)
    h8 = base64.urlsafe_b64encode(hashlib.sha256(POD_UID.encode()).digest()[:8]).rstrip(b"=")
    assert name == f"{driver}-{h8.decode()}-reg.sock"
    name = api.rolling_update_registrar_socket_name("/" + "r" * 60, driver, POD_UID)
    digest = hashlib.sha256(driver.encode() + b"\0" + POD_UID.encode()).digest()[:16]
    assert name == f"dra-{base64.urlsafe_b64encode(digest).rstrip(b'=').decode()}-reg.sock"


def test_default_paths() -> None:
    assert api.registrar_socket_path("gpu.example.com") == (
        "/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock"
    )
    assert (
        api.dra_socket_path("gpu.example.com")
        == "/var/lib/kubelet/plugins/gpu.example.com/dra.sock"
    )
    assert api.dra_socket_path("gpu.example.com", pod_uid="u1") == (
        "/var/lib/kubelet/plugins/gpu.example.com/dra-u1.sock"
    )
    assert (
        api.registrar_socket_path("d.example.com", "/reg", pod_uid="u1")
        == "/reg/d.example.com-u1-reg.sock"
    )


def test_registration_strings_and_method_paths() -> None:
    assert api.DRA_PLUGIN_SERVICES == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    assert api.DRA_HEALTH_SERVICES == ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
    assert api.DRA_PLUGIN_TYPE == "DRAPlugin"
    assert api.GET_INFO_METHOD == "/pluginregistration.Registration/GetInfo"
    assert (
        api.NODE_PREPARE_V1_METHOD
        == "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
    )
    assert api.WATCH_V1ALPHA1_METHOD == "/v1alpha1.DRAResourceHealth/NodeWatchResources"


def test_generated_descriptors_match_the_contract() -> None:
    """Service full names, packages and field numbers as the kubelet expects them."""
    svc = api.dra_v1.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert svc.full_name == api.DRA_V1_SERVICE
    assert api.dra_v1beta1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    assert api.health_v1.DESCRIPTOR.package == "v1"
    assert api.health_v1alpha1.DESCRIPTOR.package == "v1alpha1"
    assert api.registration.DESCRIPTOR.package == "pluginregistration"
    assert api.podresources_v1.DESCRIPTOR.package == "v1"
    dh = api.health_v1.DeviceHealth.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in dh.items()} == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert dict(api.health_v1.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    dev = api.dra_v1.Device.DESCRIPTOR.fields_by_name
    assert dev["share_id"].number == 5
    assert "share_id" not in api.dra_v1beta1.Device.DESCRIPTOR.fields_by_name
    cr = api.podresources_v1.ClaimResource.DESCRIPTOR.fields_by_name
    assert [cr[n].number for n in ("cdi_devices", "driver_name", "pool_name", "device_name")] == [
        1,
        2,
        3,
        4,
    ]
