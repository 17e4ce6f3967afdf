"""Click options several commands share, defined once so their flags and help agree."""

from __future__ import annotations

import click

__all__ = ["IN_CLUSTER", "METRICS_HOST"]

#: ``--metrics-host``: where ``/metrics`` listens (driver, agent, controller).
METRICS_HOST = click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address /metrics listens on (0.0.0.0 for Prometheus in a cluster).",
)

#: ``--in-cluster``: API access by the usual resolution chain, as deployed (driver, agent).
IN_CLUSTER = click.option(
    "--in-cluster",
    is_flag=True,
    help="API access through $KUBECONFIG or the pod's service account (as deployed).",
)
