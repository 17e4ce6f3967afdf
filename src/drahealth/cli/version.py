"""``drahealth version``: drahealth's version and, when a cluster answers, what it serves.

Owns the command. The client part (drahealth's version, the releases it supports) is
always printed; then, from the cluster of ``--kubeconfig``/``--context``: the server's
``gitVersion``, the ``resource.k8s.io`` version drahealth uses for each DRA kind, and the
remediation mode ``auto`` would choose there. As ``kubectl version`` does, a cluster that
cannot be reached is said after the client part, and the exit code is 1; 0 otherwise.
"""

from __future__ import annotations

from typing import Any

import click
import yaml

from drahealth import __version__
from drahealth._api_failures import CommandError
from drahealth._served import auto_mode
from drahealth._text import json_text, printable
from drahealth.cli._access import DISCOVERY_HINT, Access, api_options
from drahealth.core import KUBE_VERSIONS
from drahealth.kube import DiscoveryError, discover_sync

__all__ = ["version_command"]


def _server(access: Access) -> dict[str, Any]:
    client = access.sync_client()
    with access.failures():
        try:
            try:
                served = discover_sync(client)
            except DiscoveryError as exc:
                cause = exc.__cause__
                if isinstance(cause, Exception) and not isinstance(cause, DiscoveryError):
                    raise cause from cause.__cause__  # its own cause names why (e.g. refused)
                raise CommandError(f"{exc} ({DISCOVERY_HINT})") from None
        finally:
            client.close()
    mode, why = auto_mode(served)
    return {
        "gitVersion": served.server_version,
        "apis": served.summary(),
        "remediationMode": {"auto": mode, "why": why},
    }


@click.command("version")
@api_options(namespaced=False)
@click.option("--client", "client_only", is_flag=True, help="Only drahealth's own version.")
@click.option(
    "-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text", show_default=True
)
def version_command(access: Access, client_only: bool, output: str) -> None:
    """drahealth's version; the cluster's release, DRA API versions and remediation mode.

    Cluster-wide: no namespace applies (no -n).
    """
    doc: dict[str, Any] = {
        "clientVersion": {"drahealth": __version__, "kubernetes": list(KUBE_VERSIONS)}
    }
    failure: click.ClickException | None = None
    if not client_only:
        try:
            doc["serverVersion"] = _server(access)
        except click.ClickException as exc:  # a bad kubeconfig too: the client part still shows
            failure = exc
            doc["serverError"] = exc.format_message()
    if output == "json":
        click.echo(json_text(doc, indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), nl=False)
    else:
        click.echo(
            f"drahealth {__version__} (Kubernetes {KUBE_VERSIONS[0]} to {KUBE_VERSIONS[-1]})"
        )
        server = doc.get("serverVersion")
        if server is not None:
            click.echo(f"Server Version: {printable(server['gitVersion']) or 'unknown'}")
            for kind, api in server["apis"].items():
                click.echo(f"  {kind}: {printable(api)}")
            mode = server["remediationMode"]
            click.echo(f"Remediation mode auto: {mode['auto']} ({printable(mode['why'])})")
    if failure is not None:
        raise CommandError(failure.format_message())
