"""``drahealth taint`` / ``untaint`` as subprocesses against a ``drahealth apiserver``."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from lightkube.resources.resource_v1 import DeviceTaintRule, ResourceSlice

from drahealth.kube import make_sync_client
from drahealth.remedy._rules import DeviceRef, rule_body

BIN = Path(sys.executable).with_name("drahealth")
DEV = "gpu.example.com/node-1/gpu-0"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), *args], capture_output=True, text=True, timeout=30, check=False
    )


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("taint") / "kubeconfig"
    proc = subprocess.Popen(
        [str(BIN), "apiserver", "--port", "0", "--kubeconfig-out", str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and "listening on" in proc.stdout.readline()
        publish(str(path))
        yield str(path)
    finally:
        proc.terminate()
        proc.wait(10)


def publish(kubeconfig: str) -> None:
    """node-1's slice with gpu-0..gpu-3 (taint refuses a device no slice publishes)."""
    client = make_sync_client(kubeconfig)
    try:
        client.create(
            ResourceSlice.from_dict(
                {
                    "metadata": {"name": "node-1-gpu"},
                    "spec": {
                        "driver": "gpu.example.com",
                        "nodeName": "node-1",
                        "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": f"gpu-{i}"} for i in range(4)],
                    },
                }
            )
        )
    finally:
        client.close()


def rules(kubeconfig: str) -> dict[str, dict[str, object]]:
    client = make_sync_client(kubeconfig)
    try:
        return {
            str(r.metadata.name): r.to_dict()
            for r in client.list(DeviceTaintRule)
            if r.metadata is not None
        }
    finally:
        client.close()


def test_taint_creates_updates_and_leaves_unchanged(kubeconfig: str) -> None:
    args = ["taint", "--kubeconfig", kubeconfig, DEV, "--key", "ops.example.com/maint"]
    first = run(*args, "--value", "rma", "--effect", "NoSchedule")
    assert first.returncode == 0, first.stderr
    name = re.fullmatch(r"devicetaintrule/(\S+) created\n", first.stdout)
    assert name, first.stdout
    rule = rules(kubeconfig)[name.group(1)]
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"  # type: ignore[index]
    assert rule["spec"]["deviceSelector"] == {  # type: ignore[index]
        "driver": "gpu.example.com",
        "pool": "node-1",
        "device": "gpu-0",
    }
    again = run(*args, "--value", "rma", "--effect", "NoSchedule")
    assert again.stdout == f"devicetaintrule/{name.group(1)} unchanged\n"
    harder = run(*args, "--value", "rma", "--effect", "NoExecute")
    assert harder.stdout == f"devicetaintrule/{name.group(1)} updated\n"
    assert rules(kubeconfig)[name.group(1)]["spec"]["taint"]["effect"] == "NoExecute"  # type: ignore[index]
    gone = run("untaint", "--kubeconfig", kubeconfig, DEV, "--key", "ops.example.com/maint")
    assert gone.returncode == 0 and gone.stdout == f"devicetaintrule/{name.group(1)} deleted\n"
    assert name.group(1) not in rules(kubeconfig)


def test_untaint_removes_drahealth_rules_only(kubeconfig: str) -> None:
    client = make_sync_client(kubeconfig)
    device = DeviceRef("gpu.example.com", "node-1", "gpu-1")
    ours = rule_body(device, key="drahealth.io/unhealthy", value="x", effect="NoExecute")
    foreign = rule_body(device, key="drahealth.io/unhealthy", value="x", effect="NoSchedule")
    foreign["metadata"] = {"name": "someone-elses", "labels": {"team": "infra"}}
    try:
        client.create(DeviceTaintRule.from_dict(ours))  # type: ignore[call-overload]
        client.create(DeviceTaintRule.from_dict(foreign))  # type: ignore[call-overload]
    finally:
        client.close()
    dev = "gpu.example.com/node-1/gpu-1"
    out = run("untaint", "--kubeconfig", kubeconfig, dev, "--key", "drahealth.io/unhealthy")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"devicetaintrule/{ours['metadata']['name']} deleted\n"
    # the controller made it: untaint says what the controller does next
    assert "remediation controller made" in out.stderr
    assert "ownership.manualUntaintHold" in out.stderr
    assert "someone-elses" in rules(kubeconfig)
    again = run("untaint", "--kubeconfig", kubeconfig, dev, "--key", "drahealth.io/unhealthy")
    assert again.returncode == 1
    assert "no drahealth DeviceTaintRule taints gpu.example.com/node-1/gpu-1" in again.stderr


def test_dry_run_prints_the_rule_and_writes_nothing(kubeconfig: str) -> None:
    before = rules(kubeconfig)
    out = run(
        "taint", "--kubeconfig", kubeconfig, DEV, "--key", "k.example.com/x",
        "--effect", "None", "--dry-run",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    body = yaml.safe_load(out.stdout)
    assert body["kind"] == "DeviceTaintRule" and body["spec"]["taint"]["effect"] == "None"
    assert rules(kubeconfig) == before


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["gpu-0", "--key", "k", "--effect", "NoSchedule"], "must be DRIVER/POOL/DEVICE"),
        ([DEV, "--key", "bad key!", "--effect", "NoSchedule"], "taint key 'bad key!'"),
        ([DEV, "--key", "k", "--value", "no spaces", "--effect", "None"], "taint value"),
        ([DEV, "--key", "k", "--effect", "Evict"], "'Evict' is not one of"),
        ([DEV, "--effect", "None"], "Missing option '--key'"),
    ],
)
def test_usage_errors_exit_2_and_name_the_input(
    kubeconfig: str, args: list[str], fragment: str
) -> None:
    out = run("taint", "--kubeconfig", kubeconfig, *args)
    assert out.returncode == 2 and fragment in out.stderr, out.stderr


def test_missing_kubeconfig_file_is_a_usage_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    out = run("untaint", "--kubeconfig", missing, DEV, "--key", "k")
    assert out.returncode == 2 and f"{missing}: file not found" in out.stderr
