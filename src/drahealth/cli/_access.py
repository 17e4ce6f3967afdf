"""How every command that talks to the API finds its cluster and namespace, as kubectl does.

Owns the shared click options (``--kubeconfig``, ``--context``, ``-n/--namespace``,
``-A/--all-namespaces``) and :class:`Access`, the one resolution of them:

* the kubeconfig: ``--kubeconfig``, else ``$KUBECONFIG`` (a ``:``-separated list, merged
  as kubectl merges it), else the pod's service account, else ``~/.kube/config``
  (:func:`drahealth.kube.load_config`);
* the context: ``--context``, else the kubeconfig's ``current-context``;
* the namespace: ``-A`` means every namespace; else ``-n NS``; else the context's
  namespace; else ``default``.

:func:`controller_namespace` finds where the remediation controller keeps its
ConfigMaps, so ``history``, ``status``, ``clear``, ``resume`` and ``untaint`` need no
flag for it. Failures become one ``error:`` line (see :mod:`drahealth._api_failures`).
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import click
import httpx2
from lightkube import ApiError, AsyncClient, Client, SingleConfig
from lightkube.resources.core_v1 import ConfigMap

from drahealth._api_failures import CommandError, api_failures, load_checked
from drahealth._text import printable
from drahealth.kube import KubeConfigError, make_client, make_sync_client

__all__ = [
    "CONTEXT_OPTION",
    "DISCOVERY_HINT",
    "KUBECONFIG_OPTION",
    "Access",
    "ConfigUsageError",
    "api_options",
    "controller_namespace",
    "find_controller_namespaces",
    "operator_identity",
    "request_namespace",
]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Access:
    """The cluster and namespace a command was asked to use (see the module docstring)."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    all_namespaces: bool = False
    _config: SingleConfig | None = field(default=None, repr=False)

    def config(self) -> SingleConfig:
        """The resolved kubeconfig entry, its files checked (errors as one line)."""
        if self._config is None:
            with self.failures():
                self._config = load_checked(self.kubeconfig, self.context)
        return self._config

    @property
    def scope(self) -> str | None:
        """The namespace to list in; None means every namespace (``-A``)."""
        if self.all_namespaces:
            return None
        return self.namespace or self.default_namespace

    @property
    def default_namespace(self) -> str:
        """``-n``, else the context's namespace, else ``default``."""
        return self.namespace or self.config().namespace

    def where(self) -> str:
        """``in NS namespace`` or ``in any namespace``, for "No resources found" lines."""
        scope = self.scope
        return "in any namespace" if scope is None else f"in {scope} namespace"

    def sync_client(self, field_manager: str = "drahealth") -> Client:
        self.config()  # its files checked first: a missing one is named
        with self.failures():
            return make_sync_client(
                self.kubeconfig,
                context=self.context,
                namespace=self.default_namespace,
                field_manager=field_manager,
            )

    def async_client(self, field_manager: str = "drahealth") -> AsyncClient:
        self.config()
        with self.failures():
            return make_client(
                self.kubeconfig,
                context=self.context,
                namespace=self.default_namespace,
                field_manager=field_manager,
            )

    @contextlib.contextmanager
    def failures(self, what: str = "") -> Iterator[None]:
        """API and transport failures inside the block as one ``error:`` line (exit 1); a
        kubeconfig that cannot be used (missing, malformed, no such context) as one
        ``error:`` line with exit code 2, as a usage error."""
        try:
            with api_failures(self.kubeconfig, what, context=self.context):
                yield
        except click.BadParameter as exc:
            if not isinstance(exc.__cause__, KubeConfigError):
                raise
            raise ConfigUsageError(f"{exc.__cause__} ({_CHECK_CONFIG})") from exc
        except httpx2.HTTPStatusError as exc:  # an answer that is not a Kubernetes Status
            code = exc.response.status_code
            hint = _HINTS.get(code, "")
            raise CommandError(
                (f"{what}: " if what else "")
                + f"HTTP {code} from the API server for {exc.request.url.path}{hint}"
            ) from None


_CHECK_CONFIG = "check --kubeconfig, $KUBECONFIG and --context"
#: Said after a discovery answer that is not one (e.g. ``GET /version: HTTP 403``).
DISCOVERY_HINT = (
    "asking the server what it serves; check the kubeconfig's server and credentials, and RBAC"
)
_HINTS = {
    401: " (check the kubeconfig's credentials)",
    403: " (check RBAC)",
    404: " (is this a Kubernetes API server? check the kubeconfig's server)",
}


class ConfigUsageError(click.UsageError):
    """A kubeconfig that cannot be used: ``error: <message>`` on one line, exit code 2."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {printable(self.format_message())}", err=file is None, file=file)


def _complete_contexts(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of ``--context``: the contexts of the kubeconfig in use."""
    from drahealth.kube import DEFAULT_KUBECONFIG, merge_kubeconfigs

    given = ctx.params.get("kubeconfig")
    env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    paths = [Path(given)] if given else [Path(p) for p in env] or [DEFAULT_KUBECONFIG]
    try:
        doc = merge_kubeconfigs([p.expanduser() for p in paths])
    except Exception:  # completion never fails loudly
        return []
    names = [str(c.get("name")) for c in doc.get("contexts") or []]
    return [n for n in names if n.startswith(incomplete)]


#: ``--kubeconfig FILE`` (also used alone by commands with their own namespace flag).
KUBECONFIG_OPTION = click.option(
    "--kubeconfig",
    metavar="FILE",
    default=None,
    help="Kubeconfig file [default: $KUBECONFIG, else ~/.kube/config, as kubectl].",
)
#: ``--context NAME`` (completes the kubeconfig's contexts).
CONTEXT_OPTION = click.option(
    "--context",
    metavar="NAME",
    default=None,
    shell_complete=_complete_contexts,
    help="Kubeconfig context to use [default: its current-context].",
)


def api_options(
    namespaced: bool | str = True, *, namespace_help: str | None = None
) -> Callable[[F], F]:
    """``--kubeconfig``, ``--context`` and (``namespaced``) ``-n``/``-A``, passed on as one
    :class:`Access` in the keyword ``access``.

    ``namespaced`` may be a string: the help of ``-n`` (for commands whose namespace is
    the controller's, not the pods'; no ``-A`` then). ``False`` leaves ``-n``/``-A`` out
    (cluster-scoped commands say so in their help). ``namespace_help`` replaces the
    help of ``-n`` beside ``-A``.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(
            *args: Any,
            kubeconfig: str | None,
            context: str | None,
            namespace: str | None = None,
            all_namespaces: bool = False,
            **kw: Any,
        ) -> Any:
            access = Access(kubeconfig, context, namespace or None, all_namespaces)
            return fn(*args, access=access, **kw)

        options = [KUBECONFIG_OPTION, CONTEXT_OPTION]
        if namespaced:
            ns_help = (
                namespaced
                if isinstance(namespaced, str)
                else namespace_help
                or "Namespace to list [default: the context's namespace, else default]."
            )
            options.append(click.option("-n", "--namespace", metavar="NS", help=ns_help))
            if namespaced is True:
                options.append(
                    click.option(
                        "-A",
                        "--all-namespaces",
                        is_flag=True,
                        help="List across every namespace (-n is then ignored).",
                    )
                )
        decorated: Any = wrapper
        for option in reversed(options):
            decorated = option(decorated)
        return decorated  # type: ignore[no-any-return]

    return decorate


def find_controller_namespaces(client: Client) -> list[str] | None:
    """Namespaces holding the remediation controller's state or history ConfigMap
    (sorted); None when this reader may not list ConfigMaps across namespaces."""
    from drahealth.remedy import HISTORY_CONFIGMAP, STATE_CONFIGMAP

    found: set[str] = set()
    for name in (STATE_CONFIGMAP, HISTORY_CONFIGMAP):
        try:
            for cm in client.list(ConfigMap, namespace="*", fields={"metadata.name": name}):
                if cm.metadata is not None and cm.metadata.name == name:
                    found.add(str(cm.metadata.namespace))
        except ApiError as exc:
            if exc.status.code in (401, 403):
                return None
            raise
        except httpx2.HTTPStatusError as exc:
            if exc.response.status_code in (401, 403):
                return None
            raise
    return sorted(found)


def controller_namespace(
    client: Client,
    explicit: str | None,
    access: Access,
    note: Callable[[str], None],
    flag: str = "--controller-namespace",
) -> str:
    """Where the remediation controller keeps its ConfigMaps.

    ``explicit`` (a flag) wins; else the one namespace holding them; else (none, several,
    or no right to look) the context's namespace, and ``note`` says why.
    """
    if explicit:
        return explicit
    fallback = access.config().namespace
    found = find_controller_namespaces(client)
    if found is None:
        note(
            "cannot list ConfigMaps in every namespace to find the remediation controller; "
            f"using {fallback} (give {flag})"
        )
        return fallback
    if len(found) == 1:
        return found[0]
    if not found:
        return fallback
    chosen = fallback if fallback in found else found[0]
    note(f"remediation controllers found in {', '.join(found)}; using {chosen} (give {flag})")
    return chosen


def request_namespace(access: Access) -> str:
    """Where an operator's request to the controller goes (``clear``, ``resume``,
    ``untaint``): ``-n``, else the controller's namespace found from its ConfigMaps; a
    note on stderr says when the choice was not clear-cut."""
    client = access.sync_client()
    try:
        return controller_namespace(
            client,
            access.namespace,
            access,
            lambda m: click.echo(f"note: {m}", err=True),
            flag="-n",
        )
    finally:
        client.close()


def operator_identity() -> str:
    """Who an operator's request says it is from: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "operator"
    return f"{user}@{socket.gethostname()}"
