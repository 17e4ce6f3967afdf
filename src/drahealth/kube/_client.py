"""Client factory: the one place that turns configuration into a lightkube client.

Owns: resolving *which* Kubernetes API to talk to (embedded server URL, kubeconfig
file, ``$KUBECONFIG``, in-cluster service account, ``~/.kube/config``), validating
kubeconfig files with errors that name the file and the problem, and building the
async (agents, controllers) and sync (CLI) lightkube clients from one resolved
:class:`lightkube.config.kubeconfig.SingleConfig`.

May not touch: anything above ``kube`` (no imports from driver/node/remedy/...), and
it never opens a connection itself; lightkube/httpx2 connect lazily on first request.
"""

from __future__ import annotations

import errno
import os
import ssl
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx2
import msgspec
import yaml
from lightkube import AsyncClient, Client, ConfigError, KubeConfig, SingleConfig
from lightkube.config.models import Cluster, Context, User

from drahealth._files import NotARegularFile, read_regular
from drahealth._yaml import YAMLLimits, load_bounded
from drahealth.kube._credentials import ExecSource, RefreshingBearerAuth, TokenFileSource
from drahealth.kube._exec_credential import ExecCredentialError, check_token, exec_credential

__all__ = [
    "DEFAULT_KUBECONFIG",
    "DEFAULT_TIMEOUT",
    "EMBEDDED_TOKEN",
    "SERVICE_ACCOUNT_DIR",
    "TRANSPORT_ERRORS",
    "KubeConfigError",
    "embedded_kubeconfig",
    "load_config",
    "make_client",
    "make_sync_client",
    "merge_kubeconfigs",
    "read_bounded",
]

#: Default per-request timeout in seconds (connect/read/write/pool). Watches have no
#: read timeout (lightkube disables it); the reflector bounds them itself.
DEFAULT_TIMEOUT = 10.0
#: What a request raises when the API server could not be talked to at all (refused,
#: reset, timed out, TLS), as opposed to an answer (lightkube's ApiError).
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    httpx2.TransportError,
    ssl.SSLError,
    ConnectionError,
)
#: Where Kubernetes mounts the pod's service account.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: The last-resort kubeconfig location.
DEFAULT_KUBECONFIG = Path("~/.kube/config")
#: Bearer token used for the embedded API server (it accepts any token).
EMBEDDED_TOKEN = "drahealth"


class KubeConfigError(ConfigError):
    """The Kubernetes client configuration is missing or malformed.

    The message always says where the configuration came from (file path, server
    URL or service account directory) and what exactly is wrong. Subclasses
    :class:`lightkube.ConfigError`, so code catching lightkube's error also works.
    """


def embedded_kubeconfig(
    server_url: str,
    *,
    token: str = EMBEDDED_TOKEN,
    namespace: str | None = None,
    name: str = "drahealth-embedded",
) -> dict[str, Any]:
    """Return a kubeconfig document (as a dict) pointing at ``server_url`` with a token user.

    ``KubeConfig.from_server`` builds a config with no user, which lightkube's
    connection layer rejects ("Missing user"), so the embedded server gets an explicit
    token user instead.
    """
    context: dict[str, Any] = {"cluster": name, "user": name}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server_url}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": context}],
        "current-context": name,
    }


def _names(entries: Any) -> list[str]:
    if not isinstance(entries, list):
        return []
    return [str(e["name"]) for e in entries if isinstance(e, Mapping) and "name" in e]


def _check_section(where: str, doc: Mapping[str, Any], section: str, key: str) -> None:
    """Check ``doc[section]`` is a list of ``{name: str, <key>: mapping}`` entries."""
    entries = doc.get(section)
    if entries is None:
        return
    if not isinstance(entries, list):
        raise KubeConfigError(f"{where}: '{section}' must be a list, got {type(entries).__name__}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise KubeConfigError(
                f"{where}: {section}[{i}] must be a mapping, got {type(entry).__name__}"
            )
        if not isinstance(entry.get("name"), str) or not entry["name"]:
            raise KubeConfigError(f"{where}: {section}[{i}] has no 'name'")
        if not isinstance(entry.get(key), Mapping):
            raise KubeConfigError(
                f"{where}: {section}[{i}] ('{entry['name']}') has no '{key}' mapping"
            )


#: A resolved configuration and the auth that keeps its credentials fresh (None: the
#: user's static token, certificate or nothing, as lightkube sets them up).
_Loaded = tuple[SingleConfig, RefreshingBearerAuth | None]


def _single_from_doc(doc: Any, where: str, *, context: str | None, fname: Path | None) -> _Loaded:
    """Validate a parsed kubeconfig document and select one context from it."""
    if not isinstance(doc, Mapping):
        kind = "an empty document" if doc is None else type(doc).__name__
        raise KubeConfigError(f"{where}: expected a kubeconfig mapping, got {kind}")
    for section, key in (("clusters", "cluster"), ("contexts", "context"), ("users", "user")):
        _check_section(where, doc, section, key)
    contexts = _names(doc.get("contexts"))
    available = ", ".join(contexts) if contexts else "none"
    if not contexts:
        raise KubeConfigError(f"{where}: no contexts defined")
    chosen = context if context is not None else doc.get("current-context")
    if not chosen:
        raise KubeConfigError(
            f"{where}: no current-context set and no context given (available: {available})"
        )
    if not isinstance(chosen, str):
        raise KubeConfigError(f"{where}: current-context must be a string")
    if chosen not in contexts:
        raise KubeConfigError(f"{where}: context '{chosen}' not found (available: {available})")
    try:
        kc = KubeConfig.from_dict(
            {
                "clusters": doc.get("clusters") or [],
                "contexts": doc.get("contexts") or [],
                "users": doc.get("users") or [],
                "current-context": chosen,
            },
            fname=fname,
        )
    except (msgspec.ValidationError, TypeError) as exc:
        raise KubeConfigError(f"{where}: invalid entry: {exc}") from exc
    ctx: Context = kc.contexts[chosen]
    if ctx.cluster not in kc.clusters:
        raise KubeConfigError(
            f"{where}: context '{chosen}' refers to unknown cluster '{ctx.cluster}'"
        )
    cluster: Cluster = kc.clusters[ctx.cluster]
    cluster_doc = next(e["cluster"] for e in doc["clusters"] if e["name"] == ctx.cluster)
    if not cluster_doc.get("server"):
        raise KubeConfigError(f"{where}: cluster '{ctx.cluster}' has no 'server'")
    user: User
    if ctx.user:
        if ctx.user not in kc.users:
            raise KubeConfigError(
                f"{where}: context '{chosen}' refers to unknown user '{ctx.user}'"
            )
        user = kc.users[ctx.user]
        user_doc = next(e["user"] for e in doc["users"] if e["name"] == ctx.user)
    else:
        # lightkube asserts a user exists; an empty user means "no credentials".
        user, user_doc = User(), {}
    base = fname.parent if fname is not None else None
    try:
        user, auth = _resolve_user(user, user_doc, base, where)
        if cluster.certificate_auth:
            _check_file(_under(base, cluster.certificate_auth), MAX_CERT_BYTES,
                        "certificate-authority")  # fmt: skip
    except ValueError as exc:
        raise KubeConfigError(f"{where}: {exc}") from None
    single = SingleConfig(context_name=chosen, context=ctx, cluster=cluster, user=user, fname=fname)
    return single, auth


def _under(base: Path | None, name: str) -> Path:
    path = Path(name).expanduser()
    return path if path.is_absolute() or base is None else base / path


def read_token_file(path: Path) -> str:
    """The token in the file ``path``, read bounded (a regular file of at most
    :data:`MAX_TOKEN_BYTES`, holding a token that can be sent: see
    :func:`~drahealth.kube._exec_credential.check_token`); ValueError naming the file for
    anything wrong."""
    try:
        token = read_bounded(path, MAX_TOKEN_BYTES, "tokenFile").decode("utf-8").strip()
        return check_token(token, f"tokenFile {path}") if token else token
    except FileNotFoundError:
        raise ValueError(f"tokenFile {path} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"tokenFile {path}: cannot read: {exc}") from None


def _resolve_user(
    user: User, user_doc: Mapping[str, Any], base: Path | None, where: str
) -> tuple[User, RefreshingBearerAuth | None]:
    """``user`` with its credentials checked now, and the auth that keeps them fresh.

    A token file is read (bounded) and an exec plugin run once, so a broken one is an
    error at load; the user carries that first token (lightkube then reads no file and
    runs nothing itself), and the auth returned reads the file again or runs the plugin
    again as the token ages or is refused. A client certificate a plugin answers is
    resolved here, once (httpx cannot swap it per request). Certificate and key files
    are checked to be regular files of a bounded size."""
    if user.auth_provider is not None and not (user.token or user.token_file or user.exec):
        name = user.auth_provider.get("name") if isinstance(user.auth_provider, Mapping) else ""
        raise ValueError(
            f"the user's auth-provider {name!r} is not supported (kubectl dropped auth "
            "providers too); use an exec credential plugin (users[].user.exec)"
        )
    for what, name in (("client-certificate", user.client_cert), ("client-key", user.client_key)):
        if name:
            _check_file(_under(base, name), MAX_CERT_BYTES, what)
    auth: RefreshingBearerAuth | None = None
    if user.token:
        check_token(user.token, "the user's token")
    if user.token_file and not user.token:
        path = _under(base, user.token_file)
        token = read_token_file(path)
        user = msgspec.structs.replace(user, token=token, token_file=None)
        auth = RefreshingBearerAuth(TokenFileSource(path, read_token_file, token))
    elif user.token_file:
        user = msgspec.structs.replace(user, token_file=None)  # kubectl: token wins
    spec = user_doc.get("exec")
    if user.exec is not None and isinstance(spec, Mapping) and not user.token:
        try:
            cred = exec_credential(spec, where, base)
        except ExecCredentialError as exc:
            raise ValueError(str(exc).removeprefix(f"{where}: ")) from None
        user = msgspec.structs.replace(
            user, exec=None, token=cred.token,
            client_cert_data=cred.client_certificate_data or user.client_cert_data,
            client_key_data=cred.client_key_data or user.client_key_data,
        )  # fmt: skip
        if cred.token:
            auth = RefreshingBearerAuth(ExecSource(dict(spec), where, base, cred))
    elif user.exec is not None:
        user = msgspec.structs.replace(user, exec=None)
    return user, auth


#: Largest kubeconfig file read, in bytes.
MAX_KUBECONFIG_BYTES = 4 << 20
#: Bounds on a kubeconfig document.
KUBECONFIG_YAML = YAMLLimits(max_chars=MAX_KUBECONFIG_BYTES, max_depth=64, max_aliases=200,
                             max_nodes=500_000)  # fmt: skip
#: Largest token file, in bytes.
MAX_TOKEN_BYTES = 64 * 1024
#: Largest certificate or key file a kubeconfig may name, in bytes.
MAX_CERT_BYTES = 1 << 20


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``); OSError for a missing
    file (IsADirectoryError for a directory), ValueError naming ``what`` for anything
    else. Opened without blocking, so a FIFO or a device is refused, not waited on."""
    try:
        data, _ = read_regular(path, limit)
    except NotARegularFile as exc:
        if exc.kind == "a directory":
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path)) from None
        raise ValueError(f"{what} {path} is not a regular file") from None
    if len(data) > limit:
        raise ValueError(f"{what} {path} is larger than {limit} bytes")
    return data


def _check_file(path: Path, limit: int, what: str) -> None:
    """Refuse a file a kubeconfig names that is not regular or is too big (a missing one
    is left to the caller, who names it)."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{what} {path} is not a regular file")
    if st.st_size > limit:
        raise ValueError(f"{what} {path} is larger than {limit} bytes")


def _read_doc(path: Path) -> Any:
    """The parsed YAML of the kubeconfig file ``path`` (errors name the file)."""
    where = f"kubeconfig {path}"
    try:
        data = read_bounded(path.expanduser(), MAX_KUBECONFIG_BYTES, "the file")
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise KubeConfigError(f"{where}: file not found") from None
    except IsADirectoryError:
        raise KubeConfigError(f"{where}: is a directory, not a file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise KubeConfigError(f"{where}: cannot read: {exc}") from exc
    try:
        return load_bounded(text, KUBECONFIG_YAML)
    except yaml.YAMLError as exc:
        detail = str(exc).replace("\n", " ")
        raise KubeConfigError(f"{where}: invalid YAML: {detail}") from exc


def _load_file(path: Path, *, context: str | None) -> _Loaded:
    doc = _read_doc(path)
    return _single_from_doc(
        doc, f"kubeconfig {path}", context=context, fname=path.expanduser().absolute()
    )


#: Fields of kubeconfig entries that name files, relative to the file that names them.
_FILE_FIELDS = {
    "clusters": ("cluster", ("certificate-authority",)),
    "users": ("user", ("client-certificate", "client-key", "tokenFile")),
}


def _absolute_files(section: str, entry: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """``entry`` with its relative file names made absolute against ``base``."""
    key, fields = _FILE_FIELDS.get(section, ("", ()))
    body = entry.get(key)
    if not fields or not isinstance(body, Mapping):
        return dict(entry)
    body = dict(body)
    for field in fields:
        value = body.get(field)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            body[field] = str(base / value)
    return {**entry, key: body}


def merge_kubeconfigs(paths: list[Path]) -> dict[str, Any]:
    """The kubeconfig files ``paths`` merged as kubectl merges ``$KUBECONFIG``.

    Files that do not exist are skipped; each one that exists must be valid. Entries
    (clusters, contexts, users) are merged by name and the first file to define a name
    wins; ``current-context`` comes from the first file that sets it. File names inside
    an entry are made absolute against the file that holds it, so they keep meaning the
    same file after the merge.

    Raises:
        KubeConfigError: none of the files exists, or one of them is malformed.
    """
    merged: dict[str, Any] = {"clusters": [], "contexts": [], "users": []}
    seen: dict[str, set[str]] = {section: set() for section in merged}
    found = False
    for path in paths:
        if not path.expanduser().exists():
            continue
        found = True
        where = f"kubeconfig {path}"
        doc = _read_doc(path)
        if doc is None:
            continue  # an empty file adds nothing (as kubectl treats it)
        if not isinstance(doc, Mapping):
            raise KubeConfigError(
                f"{where}: expected a kubeconfig mapping, got {type(doc).__name__}"
            )
        base = path.expanduser().absolute().parent
        for section, key in (("clusters", "cluster"), ("contexts", "context"), ("users", "user")):
            _check_section(where, doc, section, key)
            for entry in doc.get(section) or []:
                if entry["name"] not in seen[section]:
                    seen[section].add(entry["name"])
                    merged[section].append(_absolute_files(section, entry, base))
        if "current-context" not in merged and doc.get("current-context"):
            merged["current-context"] = doc["current-context"]
    if not found:
        listed = os.pathsep.join(str(p) for p in paths)
        raise KubeConfigError(f"$KUBECONFIG={listed}: none of the listed files exist")
    return merged


def _load_service_account(sa_dir: Path, environ: Mapping[str, str]) -> _Loaded:
    where = f"in-cluster service account {sa_dir}"
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeConfigError(
            f"{where}: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set"
        )
    token_file = sa_dir / "token"
    try:
        token = read_token_file(token_file)
    except ValueError as exc:
        raise KubeConfigError(f"{where}: cannot read token: {exc}") from None
    ns_file = sa_dir / "namespace"
    namespace = ns_file.read_text(encoding="utf-8").strip() if ns_file.is_file() else None
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    ca = sa_dir / "ca.crt"
    kc = KubeConfig.from_one(
        cluster=Cluster(
            server=f"https://{host}:{port}",
            certificate_auth=str(ca) if ca.is_file() else None,
        ),
        user=User(token=token),  # the projected token rotates: the auth reads it again
        namespace=namespace or None,
    )
    single = kc.get()
    assert single is not None
    return single, RefreshingBearerAuth(TokenFileSource(token_file, read_token_file, token))


def load_config(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    server_url: str | None = None,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    default_kubeconfig: Path = DEFAULT_KUBECONFIG,
) -> SingleConfig:
    """Resolve the client configuration.

    Order: ``server_url`` (embedded server; token user) → ``kubeconfig`` path →
    ``$KUBECONFIG`` (a ``:``-separated list, merged as kubectl merges it: see
    :func:`merge_kubeconfigs`) → in-cluster
    service account (token file present and ``KUBERNETES_SERVICE_HOST`` set) →
    ``default_kubeconfig`` (``~/.kube/config``). An explicitly named source that is
    broken is an error; it never silently falls through to the next one. A token file
    is read and an exec plugin run now (their first token is the user's); the clients
    :func:`make_client` builds keep them fresh.

    ``environ``, ``service_account_dir`` and ``default_kubeconfig`` exist for tests.

    Raises:
        KubeConfigError: no source found, or the chosen source is malformed.
    """
    return _load(
        kubeconfig, server_url=server_url, context=context, environ=environ,
        service_account_dir=service_account_dir, default_kubeconfig=default_kubeconfig,
    )[0]  # fmt: skip


def _load(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    server_url: str | None = None,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    default_kubeconfig: Path = DEFAULT_KUBECONFIG,
) -> _Loaded:
    """:func:`load_config`, with the auth that keeps its credentials fresh."""
    env = os.environ if environ is None else environ
    if server_url is not None:
        if not server_url.startswith(("http://", "https://")):
            raise KubeConfigError(f"server URL {server_url!r}: must start with http:// or https://")
        doc = embedded_kubeconfig(server_url)
        return _single_from_doc(doc, f"server URL {server_url}", context=None, fname=None)
    if kubeconfig is not None:
        return _load_file(Path(kubeconfig), context=context)
    env_paths = [Path(p) for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if len(env_paths) == 1 and env_paths[0].expanduser().exists():
        return _load_file(env_paths[0], context=context)
    if env_paths:
        doc = merge_kubeconfigs(env_paths)
        first = next(p for p in env_paths if p.expanduser().exists())
        return _single_from_doc(
            doc,
            f"$KUBECONFIG={env['KUBECONFIG']}",
            context=context,
            fname=first.expanduser().absolute(),
        )
    if (service_account_dir / "token").is_file() and env.get("KUBERNETES_SERVICE_HOST"):
        if context is not None:
            raise KubeConfigError(
                f"in-cluster service account {service_account_dir}: "
                f"has no contexts, cannot select context '{context}'"
            )
        return _load_service_account(service_account_dir, env)
    default = default_kubeconfig.expanduser()
    if default.exists():
        return _load_file(default, context=context)
    raise KubeConfigError(
        "no Kubernetes configuration found: no server URL or kubeconfig given, $KUBECONFIG "
        f"unset, no in-cluster service account at {service_account_dir}, and "
        f"{default_kubeconfig} does not exist"
    )


def _httpx_client(client: AsyncClient | Client) -> httpx2.AsyncClient | httpx2.Client:
    """The httpx client a lightkube client sends through (lightkube 1.0: ``_client`` is
    its generic client, whose ``_client`` is the httpx one; a test pins the path)."""
    inner = getattr(getattr(client, "_client", None), "_client", None)
    if not isinstance(inner, httpx2.AsyncClient | httpx2.Client):
        raise TypeError("lightkube no longer keeps its httpx client at ._client._client")
    return inner


def _timeout(timeout: float | httpx2.Timeout) -> httpx2.Timeout:
    return timeout if isinstance(timeout, httpx2.Timeout) else httpx2.Timeout(timeout)


def make_client(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    server_url: str | None = None,
    context: str | None = None,
    namespace: str | None = None,
    field_manager: str = "drahealth",
    timeout: float | httpx2.Timeout = DEFAULT_TIMEOUT,
) -> AsyncClient:
    """Build the async lightkube client every component uses.

    See :func:`load_config` for the resolution order. ``namespace`` overrides the
    context's default namespace; ``field_manager`` is sent on every write (and is
    required for server-side apply). Proxy environment variables are ignored for an
    explicit ``server_url`` (the embedded server is on loopback).
    """
    config, auth = _load(kubeconfig, server_url=server_url, context=context)
    client = AsyncClient(
        config,
        namespace=namespace,
        timeout=_timeout(timeout),
        field_manager=field_manager,
        trust_env=server_url is None,
    )
    if auth is not None:
        _httpx_client(client).auth = auth
    return client


def make_sync_client(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    server_url: str | None = None,
    context: str | None = None,
    namespace: str | None = None,
    field_manager: str = "drahealth",
    timeout: float | httpx2.Timeout = DEFAULT_TIMEOUT,
) -> Client:
    """Blocking twin of :func:`make_client` (for the CLI); same resolution rules."""
    config, auth = _load(kubeconfig, server_url=server_url, context=context)
    client = Client(
        config,
        namespace=namespace,
        timeout=_timeout(timeout),
        field_manager=field_manager,
        trust_env=server_url is None,
    )
    if auth is not None:
        _httpx_client(client).auth = auth
    return client
