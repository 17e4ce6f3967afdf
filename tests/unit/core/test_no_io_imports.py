"""core is sans-I/O: importing it loads no gRPC, asyncio or HTTP/Kubernetes client."""

from __future__ import annotations

import subprocess
import sys

IO_LIBRARIES = ("grpc", "asyncio", "aiohttp", "lightkube", "httpx")


def test_import_core_loads_no_io_library() -> None:
    code = f"import sys, drahealth.core\nprint(sorted(set({IO_LIBRARIES!r}) & set(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "[]"
