"""The attached-sources file: schema, errors naming the field, and the source kinds."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from drahealth.core import KeySpec, Signal
from drahealth.node import (
    SOURCE_KINDS,
    AttachConfigError,
    load_attach_config,
    parse_attach_config,
)
from drahealth.node._attach_config import SourceSettings, build_source, constructs


@dataclass
class Fake:
    """An attached source that says nothing."""

    name: str = "fake"
    interval: float = 1.0
    timeout: float = 10.0
    options: dict[str, Any] = field(default_factory=dict)

    def poll(self) -> list[Signal]:
        return []


def build_fake(settings: SourceSettings) -> Any:
    if "boom" in settings.options:
        raise ValueError("boom: not a real option")
    return Fake(options=dict(settings.options))


@pytest.fixture(autouse=True)
def fake_kind() -> Iterator[None]:
    SOURCE_KINDS["fake"] = build_fake
    yield
    SOURCE_KINDS.pop("fake", None)


FULL = """
apiVersion: drahealth.io/v1
kind: AttachedSources
drivers:
  - driver: gpu.nvidia.com
    key: {attribute: pcieBusID, matchAll: true}
    sources:
      - kind: kmsg
        path: /dev/kmsg
        clearAfter: 10m
      - kind: dcgm
        url: http://127.0.0.1:9400/metrics
        interval: 15s
        timeout: 1m
        unlisted: unknown
      - kind: nvml
        match: uuid
  - driver: gpu.intel.com
    key: pciAddress
    sources: [{kind: fake, name: probe-1, interval: 500ms, timeout: 2}]
"""


def test_a_full_file() -> None:
    config = parse_attach_config(FULL, "attach.yaml")
    assert [d.driver for d in config.drivers] == ["gpu.nvidia.com", "gpu.intel.com"]
    nvidia, intel = config.drivers
    assert nvidia.key == KeySpec("pcieBusID", match_all=True)
    kmsg, dcgm, nvml = nvidia.sources
    assert (kmsg.kind, kmsg.name, kmsg.interval, kmsg.timeout) == ("kmsg", "kmsg", None, None)
    assert kmsg.options == {"path": "/dev/kmsg", "clear_after": "10m"}  # camelCase -> snake
    assert (dcgm.interval, dcgm.timeout, dcgm.unlisted) == (15.0, 60.0, "unknown")
    assert nvml.match == KeySpec("uuid") and nvml.where == "drivers[0].sources[2]"
    assert intel.key == KeySpec("pciAddress")
    (probe,) = intel.sources
    assert (probe.name, probe.interval, probe.timeout) == ("probe-1", 0.5, 2.0)


def test_one_driver_at_the_top_level() -> None:
    config = parse_attach_config("driver: gpu.nvidia.com\nsources: [{kind: kmsg}]\n")
    assert len(config.drivers) == 1 and config.drivers[0].sources[0].name == "kmsg"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "a.yaml: (top level): expected a mapping with drivers (or a driver), got nothing"),
        ("[1]", "a.yaml: (top level): expected a mapping with drivers"),
        ("drivers: [", "a.yaml: line 1, column 11: not valid YAML"),
        ("driver: x\ndriver: y\nsources: []",
         "a.yaml: line 2, column 1: not valid YAML: duplicate key 'driver'"),
        ("drivers: []", "a.yaml: drivers: at least one driver is needed"),
        ("driver: Bad_Name\nsources: [{kind: kmsg}]", "a.yaml: driver: driver name 'Bad_Name'"),
        ("driver: gpu.x.com\nsources: []", "a.yaml: sources: at least one source is needed"),
        ("driver: gpu.x.com", "a.yaml: (top level): Object missing required field `sources`"),
        ("driver: gpu.x.com\nsources: [{kind: gpu-magic}]",
         "a.yaml: sources[0].kind: unknown source kind 'gpu-magic'; expected one of "
         "dcgm, exec, fake, file"),
        ("driver: gpu.x.com\nsources: [{path: /x}]",
         "a.yaml: sources[0]: Object missing required field `kind`"),
        ("driver: gpu.x.com\nsources: [kmsg]", "a.yaml: sources[0]: Expected `object`, got `str`"),
        ("driver: gpu.x.com\nsources: [{kind: kmsg, interval: soon}]",
         "a.yaml: sources[0].interval: 'soon' is not a duration"),
        ("driver: gpu.x.com\nsources: [{kind: kmsg, interval: 0}]",
         "a.yaml: sources[0].interval: must be more than 0"),
        ("driver: gpu.x.com\nsources: [{kind: kmsg, interval: 10s, timeout: 5s}]",
         "a.yaml: sources[0].timeout: 5 s is shorter than the interval (10 s)"),
        ("driver: gpu.x.com\nsources: [{kind: kmsg, unlisted: maybe}]",
         "a.yaml: sources[0].unlisted: 'maybe': expected one of ignore, unknown"),
        ("driver: gpu.x.com\nsources: [{kind: kmsg, name: Kmsg}]",
         "a.yaml: sources[0].name: 'Kmsg' is not a name"),
        ("driver: gpu.x.com\nsources: [{kind: kmsg}, {kind: kmsg}]",
         "a.yaml: sources[1].name: 'kmsg' is also sources[0]'s name"),
        ("driver: gpu.x.com\nsources: [{kind: kmsg, match: {attribute: a b}}]",
         "a.yaml: sources[0].match.attribute: 'a b' is not an attribute name"),
        ("driver: gpu.x.com\nsources: [{kind: kmsg, match: {attr: uuid}}]",
         "a.yaml: sources[0].match: Object contains unknown field `attr`"),
        ("driver: gpu.x.com\nkey: {attribute: uuid, matchAll: 3}\nsources: [{kind: kmsg}]",
         "a.yaml: key.matchAll: Expected `bool`, got `int`"),
        ("drivers: [{driver: a.com, sources: [{kind: kmsg}]},\n"
         "  {driver: a.com, sources: [{kind: nvml}]}]",
         "a.yaml: drivers[1].driver: a.com is also drivers[0]"),
        ("apiVersion: v2\ndrivers: [{driver: a.com, sources: [{kind: kmsg}]}]",
         "a.yaml: apiVersion: 'v2': expected drahealth.io/v1"),
        ("drivers: [{driver: a.com, sources: [{kind: kmsg}]}]\nextra: 1",
         "a.yaml: (top level): Object contains unknown field `extra`"),
    ],
)  # fmt: skip
def test_errors_name_the_file_and_the_field(text: str, error: str) -> None:
    with pytest.raises(AttachConfigError) as info:
        parse_attach_config(text, "a.yaml")
    assert str(info.value).startswith(error), str(info.value)


def test_bounds(tmp_path: Path) -> None:
    many = "drivers:\n" + "".join(
        f"  - {{driver: d{i}.com, sources: [{{kind: kmsg}}]}}\n" for i in range(17)
    )
    with pytest.raises(AttachConfigError, match="17 drivers, at most 16"):
        parse_attach_config(many, "a.yaml")
    sources = ", ".join(f"{{kind: kmsg, name: k{i}}}" for i in range(17))
    with pytest.raises(AttachConfigError, match="17 sources, at most 16"):
        parse_attach_config(f"driver: a.com\nsources: [{sources}]", "a.yaml")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (1024 * 1024 + 1))
    with pytest.raises(AttachConfigError, match="larger than"):
        load_attach_config(str(big))
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"driver: \xff\n")
    with pytest.raises(AttachConfigError, match="not UTF-8"):
        load_attach_config(str(bad))
    with pytest.raises(AttachConfigError, match="cannot read"):
        load_attach_config(str(tmp_path / "missing.yaml"))


def test_building_sources_and_their_errors() -> None:
    config = parse_attach_config(
        "driver: a.com\nsources: [{kind: fake, someOption: 3}, {kind: fake, name: b, boom: 1},"
        " {kind: fake, name: c, interval: 20, timeout: 20}]",
        "a.yaml",
    )
    one, two, three = config.drivers[0].sources
    source, interval, timeout = build_source(one, "a.yaml")
    assert isinstance(source, Fake) and source.options == {"some_option": 3}
    assert (interval, timeout) == (1.0, 10.0)  # the source's own
    with pytest.raises(AttachConfigError, match=r"a.yaml: sources\[1\]: cannot build the fake"):
        build_source(two, "a.yaml")
    _, interval, timeout = build_source(three, "a.yaml")
    assert (interval, timeout) == (20.0, 20.0)


def test_constructs_passes_known_fields_and_builds_settings_objects() -> None:
    import drahealth.sources as sources

    kmsg = SourceSettings("kmsg", "kernel", 0.5, 40.0, options={"path": "/tmp/k"}, where="x")
    built = constructs("KmsgSource")(kmsg)
    assert isinstance(built, sources.KmsgSource)
    assert (built.name, built.interval, built.timeout) == ("kernel", 0.5, 40.0)
    with pytest.raises(TypeError, match="nope"):
        constructs("KmsgSource")(SourceSettings("kmsg", "k", options={"nope": 1}))
    dcgm = SourceSettings(
        "dcgm", "dcgm", options={"url": "http://127.0.0.1:1/metrics",
                                 "thresholds": {"temperatureC": 80}},
    )  # fmt: skip
    made = SOURCE_KINDS["dcgm"](dcgm)
    assert made.thresholds.temperature_c == 80  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="thresholds"):
        SOURCE_KINDS["dcgm"](SourceSettings("dcgm", "d", options={"thresholds": {"x": 1}}))
    with pytest.raises(ValueError, match="no NoSuchSource"):
        constructs("NoSuchSource")(kmsg)


def test_pci_exec_and_file_kinds_build_keyed_probes(tmp_path: Path) -> None:
    import drahealth.sources as sources

    config = parse_attach_config(
        "driver: gpu.nvidia.com\n"
        "sources:\n"
        f"  - {{kind: pci, root: {str(tmp_path)!r}, aer: {{correctable: 50}}, clearAfter: 60}}\n"
        "  - {kind: exec, command: [/usr/bin/check-gpu, '{key}'], by: uuid, runTimeout: 5}\n"
        f"  - {{kind: file, path: {str(tmp_path / 'h.json')!r}, by: uuid, maxAge: 30}}\n",
        "a.yaml",
    )
    pci, exec_, file = (build_source(s, "a.yaml")[0] for s in config.drivers[0].sources)
    assert isinstance(pci, sources.PciAttachedSource) and pci.clear_after == 60
    assert isinstance(exec_, sources.ExecAttachedProbe) and exec_.run_timeout == 5
    assert isinstance(file, sources.FileAttachedProbe) and file.max_age == 30
    bad = parse_attach_config("driver: a.com\nsources: [{kind: exec, command: ls}]", "b.yaml")
    with pytest.raises(AttachConfigError, match=r"b.yaml: sources\[0\]: cannot build the exec"):
        build_source(bad.drivers[0].sources[0], "b.yaml")
