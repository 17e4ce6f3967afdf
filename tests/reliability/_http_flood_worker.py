"""Worker for the flood tests: serves one of our HTTP servers the way a deployment does.

``python -m tests.reliability._http_flood_worker KIND HEADER_TIMEOUT`` with KIND one of
``apiserver``, ``dashboard`` (with its own API server to read from) or ``metrics``. It
sets itself the usual soft ``RLIMIT_NOFILE`` of 1024; it logs to stderr at
WARNING as the CLI does, prints ``ready PORT`` once serving and stops at EOF on stdin.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import sys
from typing import Any


def _limits(header_timeout: float) -> dict[str, Any]:
    try:
        from drahealth._http_guard import HTTPLimits
    except ImportError:  # the servers before the guard existed: run them as they were
        return {}
    return {"limits": HTTPLimits(header_timeout=header_timeout)}


async def main(kind: str, header_timeout: float) -> None:
    from prometheus_client import CollectorRegistry

    from drahealth._metrics_http import MetricsServer
    from drahealth.controlplane import APIServer
    from drahealth.kube import make_client
    from drahealth.web import Dashboard

    limits = _limits(header_timeout)
    stops = []
    if kind == "apiserver":
        api = APIServer(**limits)
        await api.start()
        port = api.port
        stops.append(api.stop)
    elif kind == "dashboard":
        api = APIServer()
        await api.start()
        stops.append(api.stop)
        client = make_client(server_url=api.url, timeout=5.0)
        stops.insert(0, client.close)
        dashboard = Dashboard(client, **limits)
        url = await dashboard.start()
        stops.insert(0, dashboard.stop)
        port = int(url.rstrip("/").rsplit(":", 1)[1])
    elif kind == "metrics":
        metrics = MetricsServer(CollectorRegistry(), **limits)
        await metrics.start()
        port = metrics.port
        stops.append(metrics.stop)
    else:
        raise SystemExit(f"unknown server kind {kind!r}")
    print(f"ready {port}", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    for stop in stops:
        await stop()


if __name__ == "__main__":
    # the usual soft descriptor limit, set here rather than between fork and exec in the
    # parent (which runs gRPC threads, and a fork there is not safe)
    _soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, _hard))
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
