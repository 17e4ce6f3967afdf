"""``drahealth demo --profile nvidia`` as a newcomer runs it: a simulated NVIDIA DRA driver
that streams no health, an XID 79 line in a node's kernel log, and the whole loop driven by
the kmsg source attached to NVIDIA's GPUs by PCI address."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from drahealth.simdriver import pci_attribute, sim_nvidia_gpus

BIN = Path(sys.executable).with_name("drahealth")
KEY = re.escape(pci_attribute())


def _steps(rules: bool) -> list[str]:
    steps = [
        r"1\. cluster up: 2 nodes \(simulated NVIDIA DRA driver gpu\.nvidia\.com, release 0\.5, "
        rf"no health stream; node agent with a kmsg source attached by {KEY}\), 16 GPUs",
        r"2\. workload running: ReplicaSet trainer x2, .*(trainer-\w+) on (node-\d/gpu-\d) Healthy",
        r"3\. remediation mode: .*gpu\.nvidia\.com streams no health",
        r"4\. XID 79 in (node-\d)'s kernel log: NVRM: Xid \(PCI:(0000:[0-9a-f]{2}:00)\): 79, "
        rf"pid=4242, name=trainer, GPU has fallen off the bus\. \((gpu-\d) has {KEY} "
        r"(0000:[0-9a-f]{2}:00\.0)\)",
        r"5\. kmsg source marks the GPU Unhealthy: (trainer-\w+) on (node-\d/gpu-\d) Unhealthy "
        r'"kmsg: XID 79: GPU has fallen off the bus \(reset the GPU\)": caught by kmsg '
        rf"\(kernel log\), matched by {KEY} (0000:[0-9a-f]{{2}}:00\.0)",
    ]
    if rules:
        steps.append(
            r"6\. controller taints the device: DeviceTaintRule dh-\S+ \(resource\.k8s\.io/v1\): "
            r"drahealth\.io/unhealthy=fatal-xid:NoExecute"
        )
    else:  # the pod leaves first: a quarantine never takes a GPU in use
        steps += [
            r"6\. pod evicted: (trainer-\w+) \(.*\); the pod was told: Event DeviceUnhealthy",
            r"7\. controller quarantines the GPU \(no DeviceTaintRule API\): claim "
            r"default/drahealth-quarantine-gpu-\d-\w+ allocated to node-\d/gpu-\d alone",
        ]
    return [
        *steps,
        *(
            [r"7\. pod evicted: (trainer-\w+) \(.*\); the pod was told: Event DeviceUnhealthy"]
            if rules
            else []
        ),
        r"8\. replacement running on a healthy GPU: (trainer-\w+) on (node-\d/gpu-\d) Healthy",
        r"9\. kmsg latch ends: no fatal XID on (0000:[0-9a-f]{2}:00\.0) for 6 s: "
        r"(node-\d/gpu-\d) Healthy",
        r"10\. device verified healthy, taint removed: gpu\.nvidia\.com/(node-\d/gpu-\d) "
        r"Healthy for 3 s -> "
        + ("DeviceTaintRule deleted" if rules else "quarantine claim deallocated and deleted"),
        r"demo complete",
    ]


@pytest.mark.slow  # 15-20 s a release: CI runs both in its slow step
@pytest.mark.parametrize("version", ["1.38", "1.35"])
def test_nvidia_demo_story_completes(version: str) -> None:
    """The story completes; the line's PCI address is the Unhealthy GPU's, the source that
    caught it is named, the replacement runs on another GPU, and the GPU comes back."""
    proc = subprocess.run(
        [str(BIN), "demo", "--profile", "nvidia", "--kube-version", version],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())  # rich wraps lines at the terminal width
    found = []
    for step in _steps(rules=version == "1.38"):
        m = re.search(step, out)
        assert m, (step, out)
        found.append(m)
    line, marked = found[3], found[4]
    fenced, evicted = (found[5], found[6]) if version == "1.38" else (found[6], found[5])
    assert fenced
    replaced, latch, untainted = found[7], found[8], found[9]
    node, pci, device, pci_full = line.groups()
    victim, victim_device, matched = marked.groups()
    # the kernel log's short address (no function) names the GPU the source marked
    assert victim_device == f"{node}/{device}" and matched == pci_full == f"{pci}.0"
    gpu = next(g for g in sim_nvidia_gpus(node, 8) if g.name == device)
    assert gpu.pci_bus_id == pci_full
    assert evicted.group(1) == victim
    assert replaced.group(1) != victim and replaced.group(2) != victim_device
    assert latch.groups() == (pci_full, victim_device)
    assert untainted.group(1) == victim_device
    # every step's latency is printed; the line reaches the record within a second
    caught = re.search(r"5\. kmsg source marks .*? \((\d+) ms\)", out)
    assert caught and int(caught.group(1)) < 1000, out
