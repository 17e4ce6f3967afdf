"""The attach-file examples of docs/sources.md's dcgm and nvml sections build their sources."""

from __future__ import annotations

import re
from pathlib import Path

from drahealth.node._attach_config import build_source, parse_attach_config
from drahealth.sources import DcgmExporterSource, NvmlAttachedSource

DOC = Path(__file__).parents[3] / "docs" / "sources.md"


def test_the_documented_entries_build() -> None:
    text = DOC.read_text()
    start = text.index("## DCGM exporter")
    nvml = text.index("## NVML in the agent", start)
    end = text.find("\n## ", nvml + 1)
    sections = text[start : end if end > 0 else len(text)]
    blocks = re.findall(r"```yaml\n(.*?)```", sections, re.S)
    built = []
    for block in blocks:
        entry = "".join(f"  {line}\n" for line in block.splitlines())
        config = parse_attach_config(f"driver: gpu.nvidia.com\nsources:\n{entry}")
        source, interval, timeout = build_source(config.drivers[0].sources[0])
        built.append((type(source), interval, timeout))
    assert built == [(DcgmExporterSource, 15.0, 60.0), (NvmlAttachedSource, 5.0, 30.0)]
