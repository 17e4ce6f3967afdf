"""PCI sysfs, exec and file probes attached by attribute: keys from the agent, answers per key,
latching, and what bad input and failing probes come to."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest

from drahealth.core import Health, Signal
from drahealth.sources import (
    AerThresholds,
    ExecAttachedProbe,
    FileAttachedProbe,
    PciAttachedSource,
)
from drahealth.sources._keyed import MAX_WATCHED_KEYS
from tests.unit.sources.fake_sysfs import FakeSysfs

H, U, K = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def by_value(signals: list[Signal]) -> dict[str, tuple[Health, str]]:
    return {s.value: (s.health, s.message) for s in signals}


# ------------------------------------------------------------------------------ pci


def test_pci_answers_for_the_watched_addresses_in_sysfs_spelling(tmp_path: Path) -> None:
    sysfs = FakeSysfs(str(tmp_path))
    sysfs.add("0000:3b:00.0")
    sysfs.add("0000:86:00.0")
    sysfs.add("0000:af:00.0")  # present, but not one of the driver's devices
    source = PciAttachedSource(root=str(tmp_path))
    assert source.poll() == []  # no keys yet: no opinion
    # a ResourceSlice may write any spelling; a UUID is no PCI address and is skipped
    source.watch_keys(["0000:3B:00.0", "86:00.0", "GPU-1234"])
    got = source.poll()
    assert {s.by for s in got} == {"pciBusID"}
    assert by_value(got) == {"0000:3b:00.0": (H, ""), "0000:86:00.0": (H, "")}
    assert source.skipped == 1


def test_pci_gone_device_is_unhealthy_and_back_healthy(tmp_path: Path) -> None:
    sysfs = FakeSysfs(str(tmp_path))
    sysfs.add("0000:3b:00.0")
    source = PciAttachedSource(root=str(tmp_path))
    source.watch_keys(["0000:3b:00.0"])
    assert by_value(source.poll())["0000:3b:00.0"][0] is H
    sysfs.remove("0000:3b:00.0")
    assert by_value(source.poll())["0000:3b:00.0"] == (U, "PCI device 0000:3b:00.0 is gone")
    sysfs.add("0000:3b:00.0")
    assert by_value(source.poll())["0000:3b:00.0"][0] is H


def test_pci_fatal_aer_is_latched_for_clear_after(tmp_path: Path) -> None:
    sysfs = FakeSysfs(str(tmp_path))
    sysfs.add("0000:3b:00.0")
    clock = Clock()
    source = PciAttachedSource(root=str(tmp_path), clear_after=60, clock=clock)
    source.watch_keys(["0000:3b:00.0"])
    source.poll()  # baseline
    sysfs.aer("0000:3b:00.0", fatal=1, nonfatal=0, correctable=0)
    health, message = by_value(source.poll())["0000:3b:00.0"]
    assert health is U and "1 new fatal error" in message
    clock.now += 30  # the counter no longer grows, the latch holds
    assert by_value(source.poll())["0000:3b:00.0"][0] is U
    clock.now += 31
    assert by_value(source.poll())["0000:3b:00.0"] == (H, "")


def test_pci_informational_problems_are_not_latched(tmp_path: Path) -> None:
    sysfs = FakeSysfs(str(tmp_path))
    sysfs.add("0000:3b:00.0", link=("8.0 GT/s PCIe", "16.0 GT/s PCIe", "8", "16"))
    source = PciAttachedSource(root=str(tmp_path), aer=AerThresholds(correctable=5))
    source.watch_keys(["0000:3b:00.0"])
    health, message = by_value(source.poll())["0000:3b:00.0"]
    assert health is U and message.startswith("PCIe link degraded")
    sysfs.write("0000:3b:00.0", "current_link_speed", "16.0 GT/s PCIe")
    sysfs.write("0000:3b:00.0", "current_link_width", "16")
    assert by_value(source.poll())["0000:3b:00.0"] == (H, "")


def test_pci_forgets_latches_of_devices_no_longer_watched(tmp_path: Path) -> None:
    sysfs = FakeSysfs(str(tmp_path))
    sysfs.add("0000:3b:00.0")
    source = PciAttachedSource(root=str(tmp_path), clear_after=None)
    source.watch_keys(["0000:3b:00.0"])
    source.poll()
    sysfs.aer("0000:3b:00.0", fatal=2, nonfatal=0, correctable=0)
    assert by_value(source.poll())["0000:3b:00.0"][0] is U
    source.watch_keys([])
    assert source.poll() == []
    source.watch_keys(["0000:3b:00.0"])
    assert by_value(source.poll())["0000:3b:00.0"][0] is H


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"root": ""}, "pci root"),
        ({"interval": 0}, "pci interval must be > 0"),
        ({"timeout": "30s"}, "pci timeout must be a number"),
        ({"clear_after": -1}, "pci clear_after must be >= 0"),
        ({"aer": {"fatal": 1}}, "pci aer"),
    ],
)
def test_pci_refuses_bad_settings(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        PciAttachedSource(**kwargs)  # type: ignore[arg-type]


def test_watched_keys_are_bounded(tmp_path: Path) -> None:
    source = PciAttachedSource(root=str(tmp_path))
    source.watch_keys([f"0000:{i // 256:02x}:{i % 256 // 8:02x}.{i % 8}" for i in range(5000)])
    assert len(source.poll()) == MAX_WATCHED_KEYS


# ----------------------------------------------------------------------------- exec


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "probe.py"
    path.write_text(f"import os, sys\n{body}\n")
    return str(path)


def test_exec_runs_once_per_key_with_the_key_in_args_and_environment(tmp_path: Path) -> None:
    probe = script(
        tmp_path,
        "key = sys.argv[1]\n"
        "assert os.environ['DRAHEALTH_KEY'] == key\n"
        "assert os.environ['DRAHEALTH_KEY_ATTRIBUTE'] == 'uuid'\n"
        "print(f'checked {key}')\n"
        "sys.exit({'GPU-a': 0, 'GPU-b': 1}.get(key, 3))",
    )
    source = ExecAttachedProbe([sys.executable, probe, "{key}"], by="uuid", parallel=2)
    assert source.poll() == []
    source.watch_keys(["GPU-b", "GPU-a", "GPU-c", "GPU-a"])
    got = source.poll()
    assert [s.value for s in got] == ["GPU-a", "GPU-b", "GPU-c"]
    assert {s.by for s in got} == {"uuid"}
    assert by_value(got) == {
        "GPU-a": (H, "checked GPU-a"),
        "GPU-b": (U, "checked GPU-b"),
        "GPU-c": (K, "checked GPU-c"),
    }


def test_exec_timeout_and_missing_command_are_unknown(tmp_path: Path) -> None:
    slow = script(tmp_path, "import time\ntime.sleep(30)")
    source = ExecAttachedProbe([sys.executable, slow], run_timeout=0.3)
    source.watch_keys(["gpu-0"])
    health, message = by_value(source.poll())["gpu-0"]
    assert health is K and "timed out after 0.3 s" in message
    missing = ExecAttachedProbe([str(tmp_path / "no-such-probe")])
    missing.watch_keys(["gpu-0"])
    health, message = by_value(missing.poll())["gpu-0"]
    assert health is K and "could not run" in message


def test_exec_output_that_is_not_utf8_or_huge_is_cut_not_fatal(tmp_path: Path) -> None:
    noisy = script(
        tmp_path, "sys.stdout.buffer.write(b'\\xff\\xfe' + b'x' * 100000 + b'\\n'); sys.exit(1)"
    )
    source = ExecAttachedProbe([sys.executable, noisy])
    source.watch_keys(["gpu-0"])
    health, message = by_value(source.poll())["gpu-0"]
    assert health is U and len(message) <= 1024


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"command": []}, "non-empty list"),
        ({"command": "nvidia-smi"}, "non-empty list"),
        ({"command": ["ok", ""]}, "non-empty list"),
        ({"command": ["ok"], "by": ""}, "exec by"),
        ({"command": ["ok"], "parallel": 0}, "parallel must be 1 to 64"),
        ({"command": ["ok"], "run_timeout": float("nan")}, "run_timeout must be a number"),
    ],
)
def test_exec_refuses_bad_settings(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ExecAttachedProbe(**kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- file


def write(path: Path, data: object) -> None:
    path.write_text(json.dumps(data))


def test_file_entries_by_key_in_any_spelling_and_unlisted_unknown(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    clock = Clock(10_000.0)
    write(
        path,
        {
            "devices": [
                {"key": "0000:3B:00.0", "health": "Unhealthy", "message": "ECC", "time": 9990},
                {"key": "0000:86:00.0", "health": "Healthy", "time": 9000},  # too old
            ]
        },
    )
    source = FileAttachedProbe(str(path), by="pciBusID", max_age=60, clock=clock)
    # before keys are known, the file's own keys are answered
    assert {s.value for s in source.poll()} == {"0000:3B:00.0", "0000:86:00.0"}
    source.watch_keys(["0000:3b:00.0", "0000:86:00.0", "0000:af:00.0"])
    assert by_value(source.poll()) == {
        "0000:3b:00.0": (U, "ECC"),
        "0000:86:00.0": (K, f"{path}: no update for 1000 s"),
        "0000:af:00.0": (K, f"not listed in {path}"),
    }


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "is not JSON"),
        (b"\xff\xfe{}", "is not UTF-8"),
        (b"[1, 2]", 'with a "devices" list'),
        (b'{"devices": [{"health": "Healthy"}]}', r"devices\[0\]\.key must be a non-empty string"),
        (b'{"devices": [{"key": "a", "health": "Fine"}]}', r"devices\[0\]\.health must be"),
        (b'{"devices": [{"key": "a", "health": "Healthy", "time": true}]}', "unix seconds"),
        (b"[" * 100000 + b"]" * 100000, "nested too deeply|is not JSON"),
    ],
)
def test_file_bad_content_makes_every_device_unknown_naming_why(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "health.json"
    path.write_bytes(content)
    source = FileAttachedProbe(str(path))
    source.watch_keys(["gpu-0", "gpu-1"])
    got = source.poll()
    assert [s.health for s in got] == [K, K]
    assert all(str(path) in s.message for s in got)
    assert re.search(problem, got[0].message), got[0].message


def test_file_missing_oversized_or_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    source = FileAttachedProbe(str(path))
    source.watch_keys(["gpu-0"])
    assert "does not exist" in source.poll()[0].message
    path.write_bytes(b" " * (4 * 1024 * 1024 + 1))
    assert "larger than" in source.poll()[0].message
    if os.geteuid() != 0:
        path.write_text("{}")
        path.chmod(0)
        assert "cannot be read" in source.poll()[0].message
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)


def test_the_documented_attach_file_builds_the_three_sources() -> None:
    from drahealth.node._attach_config import build_source, parse_attach_config

    doc = (Path(__file__).parents[3] / "docs" / "sources.md").read_text()
    section = doc[doc.index("## PCI sysfs and probes in the agent") :]
    block = re.findall(r"```yaml\n(.*?)```", section, re.S)[0]
    config = parse_attach_config(block, "sources.md")
    built = [build_source(s, "sources.md") for s in config.drivers[0].sources]
    assert [(type(s), i, t) for s, i, t in built] == [
        (PciAttachedSource, 5.0, 30.0),
        (ExecAttachedProbe, 30.0, 120.0),
        (FileAttachedProbe, 5.0, 30.0),
    ]
