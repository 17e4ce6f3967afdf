"""Click options several commands share, defined once so their flags and help agree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from drahealth.core import (
    KUBE_VERSIONS,
    NEWEST_KUBE_VERSION,
    FeatureGateError,
    KubeProfile,
    kube_profile,
    parse_feature_gates,
)

__all__ = [
    "IN_CLUSTER",
    "METRICS_HOST",
    "feature_gates_option",
    "kube_profile_from",
    "kube_version_option",
]

F = TypeVar("F", bound=Callable[..., Any])

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


def kube_version_option(what: str) -> Callable[[F], F]:
    """``--kube-version`` (apiserver, agent, demo): ``what`` says what follows the release."""
    return click.option(
        "--kube-version",
        default=NEWEST_KUBE_VERSION,
        show_default=True,
        metavar="1.NN",
        help=f"{what} ({', '.join(KUBE_VERSIONS)}).",
    )


def feature_gates_option(what: str) -> Callable[[F], F]:
    """``--feature-gates NAME=true|false,...`` beside :func:`kube_version_option`."""
    return click.option("--feature-gates", default="", metavar="NAME=true|false,...", help=what)


def kube_profile_from(kube_version: str, feature_gates: str) -> KubeProfile:
    """The release and gates asked for; values the release would refuse are usage errors
    naming the flag (exit 2), worded as upstream's components word them."""
    try:
        gates = parse_feature_gates(feature_gates)
    except FeatureGateError as e:
        raise click.BadParameter(str(e), param_hint="--feature-gates") from e
    try:
        return kube_profile(kube_version, gates)
    except FeatureGateError as e:
        hint = "--kube-version" if str(e).startswith("unsupported Kubernetes") else None
        raise click.BadParameter(str(e), param_hint=hint or "--feature-gates") from e
