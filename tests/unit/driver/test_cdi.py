"""Transient CDI specs: names, ids, content, minimum version, atomic write, removal and
regeneration from the checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path

from drahealth.driver._cdi import CDISpecs
from drahealth.driver._checkpoint import CheckpointDevice, ClaimEntry, ClaimState

DRIVER = "gpu.example.com"
UID = "7f3c1a2e-0000-4000-8000-000000000001"


def test_names_and_ids(tmp_path: Path) -> None:
    cdi = CDISpecs(str(tmp_path), DRIVER)
    assert cdi.kind == "k8s.gpu.example.com/claim"
    assert cdi.spec_path(UID) == f"{tmp_path}/k8s.gpu.example.com-claim_{UID}.json"
    assert cdi.device_id(UID, "gpu-0") == f"k8s.gpu.example.com/claim={UID}-gpu-0"
    assert cdi.device_id(UID, "gpu-0", "s1") == f"k8s.gpu.example.com/claim={UID}-gpu-0-s1"
    assert CDISpecs(str(tmp_path), DRIVER, "gpu").kind == "k8s.gpu.example.com/gpu"


def test_write_content_and_remove(tmp_path: Path) -> None:
    cdi = CDISpecs(str(tmp_path / "cdi"), DRIVER)
    devices = [
        CheckpointDevice("node-1", "gpu-0", ("gpus/big", "gpus/small")),
        CheckpointDevice("node-1", "gpu-1", ("gpus",), share_id="ab-12"),
        CheckpointDevice("node-1", "mig-1g.5gb", ("mon",), admin_access=True),
    ]
    ids = cdi.write(UID, devices)
    assert ids == [
        f"k8s.gpu.example.com/claim={UID}-gpu-0",
        f"k8s.gpu.example.com/claim={UID}-gpu-1-ab-12",
        f"k8s.gpu.example.com/claim={UID}-mig-1g.5gb",
    ]
    spec = json.loads(Path(cdi.spec_path(UID)).read_text())
    assert spec["cdiVersion"] == "0.5.0"  # device names start with a digit
    assert spec["kind"] == "k8s.gpu.example.com/claim"
    envs = {d["name"]: d["containerEdits"]["env"] for d in spec["devices"]}
    assert envs == {
        f"{UID}-gpu-0": [
            "DRA_DEVICE_GPU_0=gpu-0",
            "DRA_DEVICE_GPU_0_POOL=node-1",
            "DRA_DEVICE_GPU_0_REQUESTS=gpus",
        ],
        f"{UID}-gpu-1-ab-12": [
            "DRA_DEVICE_GPU_1_AB_12=gpu-1",
            "DRA_DEVICE_GPU_1_AB_12_POOL=node-1",
            "DRA_DEVICE_GPU_1_AB_12_REQUESTS=gpus",
            "DRA_DEVICE_GPU_1_AB_12_SHARE_ID=ab-12",
        ],
        f"{UID}-mig-1g.5gb": [
            "DRA_DEVICE_MIG_1G_5GB=mig-1g.5gb",
            "DRA_DEVICE_MIG_1G_5GB_POOL=node-1",
            "DRA_DEVICE_MIG_1G_5GB_REQUESTS=mon",
            "DRA_ADMIN_ACCESS=true",
        ],
    }
    assert os.listdir(tmp_path / "cdi") == [os.path.basename(cdi.spec_path(UID))]
    cdi.remove(UID)
    cdi.remove(UID)  # missing is fine
    assert os.listdir(tmp_path / "cdi") == []


def test_minimum_version_without_leading_digit(tmp_path: Path) -> None:
    cdi = CDISpecs(str(tmp_path), DRIVER)
    spec = cdi.build_spec("claim-a", [CheckpointDevice("p", "d")])
    assert spec["cdiVersion"] == "0.3.0"


def test_no_devices_means_no_spec(tmp_path: Path) -> None:
    cdi = CDISpecs(str(tmp_path), DRIVER)
    cdi.write(UID, [CheckpointDevice("p", "d")])
    assert cdi.write(UID, []) == []
    assert not cdi.exists(UID)


def test_duplicate_devices_collapse(tmp_path: Path) -> None:
    cdi = CDISpecs(str(tmp_path), DRIVER)
    ids = cdi.write(UID, [CheckpointDevice("p", "d", ("a",)), CheckpointDevice("p", "d", ("b",))])
    assert ids[0] == ids[1]
    assert len(json.loads(Path(cdi.spec_path(UID)).read_text())["devices"]) == 1


def test_regenerate_only_missing_completed_claims(tmp_path: Path) -> None:
    cdi = CDISpecs(str(tmp_path / "cdi"), DRIVER)
    dev = (CheckpointDevice("p", "d"),)
    claims = {
        "done": ClaimEntry("ns", "a", ClaimState.PREPARE_COMPLETED, dev),
        "present": ClaimEntry("ns", "b", ClaimState.PREPARE_COMPLETED, dev),
        "started": ClaimEntry("ns", "c", ClaimState.PREPARE_STARTED, dev),
        "empty": ClaimEntry("ns", "d", ClaimState.PREPARE_COMPLETED, ()),
    }
    cdi.write("present", dev)
    before = os.stat(cdi.spec_path("present")).st_mtime_ns
    assert cdi.regenerate(claims) == 1
    assert cdi.exists("done") and not cdi.exists("started") and not cdi.exists("empty")
    assert os.stat(cdi.spec_path("present")).st_mtime_ns == before
    assert cdi.regenerate(claims) == 0
