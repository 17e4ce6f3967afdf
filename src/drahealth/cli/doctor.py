"""``drahealth doctor``: does this cluster (and node) have what drahealth needs?

Owns the checks, one line each (``ok``, ``warn`` or ``FAIL``, every failure with a fix):

* the kubeconfig, the API server answering, its release within 1.34-1.38 (outside: warn);
* which ``resource.k8s.io`` version serves each DRA kind, ResourceClaim and ResourceSlice
  at ``v1`` (a blocker otherwise), and the remediation mode that follows, with what it
  costs (``mode-cost``): in ``node-taint`` and ``cordon`` one bad device fences every
  device of its node (the average number of devices per node is read from up to
  :data:`SLICE_PAGE` ResourceSlices), in ``quarantine`` and ``taint-rules`` only itself;
* the RBAC of each component, asked of the server with SelfSubjectAccessReviews for
  exactly the verbs the component uses (:data:`PERMISSIONS`, the chart's roles; what its
  configuration turns on, :class:`Setup`, from the flags and ``--policy``), as the
  identity of the kubeconfig (run it in the component's pod, or with its credentials);
* with the controller among the components checked (the others' roles may not list
  them): existing DeviceTaintRules whose selector reaches every device or several drivers
  (kubernetes #141422: an empty selector evicted every pod using a DRA device);
* on a node: the kubelet's ``plugins_registry/`` and ``plugins/`` directories and the
  PodResources socket ``pod-resources/kubelet.sock``.

Every failure is a blocker: the exit code is 1 when any check failed, 0 otherwise (2
for usage errors). The server is read with bounded answers (:data:`MAX_BODY` bytes,
``--timeout`` seconds per request): garbage, huge bodies and a server that stalls are
one line each.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click
import httpx2

from drahealth._api_failures import explain, load_checked
from drahealth._text import json_text, printable
from drahealth.cli._access import CONTEXT_OPTION, KUBECONFIG_OPTION
from drahealth.core import (
    DEFAULT_NAMESPACE,
    DRA_KINDS,
    KUBE_VERSIONS,
    REMEDIATION_MODES,
    Policy,
    PolicyError,
    choose_remediation_mode,
    release_of,
    selector_scope,
    unserved_reason,
)
from drahealth.kube import DRA_GROUP, KubeConfigError, ServedAPIs, load_config, parse_discovery

__all__ = [
    "PERMISSIONS",
    "Check",
    "Permission",
    "Setup",
    "doctor_command",
    "needed",
    "node_checks",
    "setup_from_policy",
]

#: Largest answer read from the server, in bytes (a discovery document is a few KB).
MAX_BODY = 4 * 1024 * 1024
#: ResourceSlices read to count devices per node for ``mode-cost`` (one page).
SLICE_PAGE = 500
#: DeviceTaintRules read at most (pages of 500).
MAX_RULES = 10_000
#: Names of over-broad rules shown in one line.
MAX_NAMED = 20
COMPONENTS = ("controller", "agent", "driver")


@dataclass(frozen=True)
class Permission:
    """Verbs one component needs on one resource.

    ``scope``: ``cluster`` (every namespace, or cluster-scoped) or ``namespace`` (the
    component's own; a repair Job's, for ``jobs``). ``when``: what makes the component
    use it (:meth:`Setup.wants`): ``always``; ``rules`` (the controller writes
    DeviceTaintRules); ``quarantine`` (mode quarantine writes claims in its namespace);
    ``nodes`` (the controller taints or cordons nodes, by its mode or
    the node rollup's taint); ``rollup`` (the controller's node rollup, on by default);
    ``jobs`` (a policy rule's repair Job); ``claim-cache`` and ``claim-status`` (the
    driver's flags of these names); ``attach`` (the agent's attached sources).
    """

    group: str
    resource: str
    verbs: tuple[str, ...]
    subresource: str = ""
    scope: str = "cluster"
    when: str = "always"

    def name(self) -> str:
        return self.resource + (f"/{self.subresource}" if self.subresource else "")


_R = DRA_GROUP
#: What each component does with the API: the chart's roles (deploy/helm/drahealth).
PERMISSIONS: dict[str, tuple[Permission, ...]] = {
    "controller": (
        Permission("", "pods", ("get", "list", "watch")),
        Permission("", "pods", ("create",), subresource="eviction"),
        Permission(_R, "resourceclaims", ("list", "watch")),
        Permission(_R, "resourceslices", ("list", "watch")),
        Permission(_R, "devicetaintrules", ("get", "list", "watch", "create", "update", "delete"),
                   when="rules"),
        Permission(_R, "devicetaintrules", ("patch",), subresource="status", when="rules"),
        Permission("", "events", ("create",)),
        # the opt-out label drahealth.io/remediation=disabled: a label-selected Node watch;
        # get: the uid of a Node an Event is about (and the rollup's read before its patch)
        Permission("", "nodes", ("get", "list", "watch")),
        Permission("", "nodes", ("get", "list", "update"), when="nodes"),
        # the node rollup's DRADevicesHealthy condition: a nodes/status patch
        Permission("", "nodes", ("patch",), subresource="status", when="rollup"),
        Permission("", "configmaps", ("get", "list", "watch", "create", "update", "patch"),
                   scope="namespace"),
        Permission("coordination.k8s.io", "leases", ("get", "create", "update"),
                   scope="namespace"),
        Permission("batch", "jobs", ("get", "list", "create", "delete"), scope="namespace",
                   when="jobs"),
        # mode quarantine: a claim per bad device, allocated by a status write
        Permission(_R, "resourceclaims", ("get", "create", "patch", "delete"),
                   scope="namespace", when="quarantine"),
        Permission(_R, "resourceclaims", ("patch",), subresource="status", scope="namespace",
                   when="quarantine"),
        # 1.36 on: the API server asks for this (cluster-wide) before it takes a change of
        # status.allocation or reservedFor (DRAResourceClaimGranularStatusAuthorization)
        Permission(_R, "resourceclaims", ("patch",), subresource="binding", when="quarantine"),
    ),
    "agent": (
        Permission("", "pods", ("get",)),
        Permission("", "pods", ("list", "watch"), when="attach"),
        Permission("", "pods", ("patch",), subresource="status", when="attach"),
        Permission(_R, "resourceslices", ("list", "watch"), when="attach"),
        Permission(_R, "resourceclaims", ("get",), when="attach"),
        Permission("", "events", ("create", "patch")),
        Permission("", "configmaps", ("get", "create", "patch"), scope="namespace"),
    ),
    "driver": (
        Permission(_R, "resourceclaims", ("get",)),
        Permission(_R, "resourceclaims", ("list", "watch"), when="claim-cache"),
        Permission(_R, "resourceclaims", ("patch",), subresource="status", when="claim-status"),
        Permission(_R, "resourceslices", ("list", "watch", "create", "update", "delete")),
        Permission("", "nodes", ("get",)),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Setup:
    """How the components run, as far as their permissions go: the chart's defaults
    unless doctor's flags say otherwise."""

    #: the controller's remediation mode on this server (None: not known)
    mode: str | None = None
    #: the policy's node rollup (``nodeRollup.enabled``) and its node taint (``taintNode``)
    rollup: bool = True
    rollup_taints: bool = False
    #: where the policy's repair Jobs go ("": the controller's namespace); none: no Job
    job_namespaces: tuple[str, ...] = ()
    claim_cache: bool = True
    claim_status: bool = False
    attach: bool = False

    def wants(self, when: str) -> bool:
        """Whether a :class:`Permission` with this ``when`` is used."""
        return {
            "always": True,
            "rules": self.mode == "taint-rules",
            "quarantine": self.mode == "quarantine",
            "nodes": self.mode in ("node-taint", "cordon") or self.rollup_taints,
            "rollup": self.rollup,
            "jobs": bool(self.job_namespaces),
            "claim-cache": self.claim_cache,
            "claim-status": self.claim_status,
            "attach": self.attach,
        }[when]


def setup_from_policy(setup: Setup, policy: Policy) -> Setup:
    """``setup`` with what the controller's ``policy`` turns on: the node rollup and its
    node taint, repair Jobs."""
    rollup = policy.node_rollup
    jobs = sorted({r.repair.job.namespace for r in policy.all_rules() if r.repair and r.repair.job})
    return replace(
        setup,
        rollup=rollup.enabled,
        rollup_taints=rollup.enabled and rollup.taint_node is not None,
        job_namespaces=tuple(jobs),
    )


#: Where node components need what, under the kubelet directory: (path, kind, who).
NODE_PATHS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("plugins_registry", "dir", ("driver", "agent")),
    ("plugins", "dir", ("driver", "agent")),
    ("pod-resources/kubelet.sock", "socket", ("agent",)),
)


@dataclass
class Check:
    """One line of the diagnosis."""

    check: str
    status: str  # "ok", "warn" or "FAIL"
    message: str
    fix: str = ""

    @property
    def blocker(self) -> bool:
        return self.status == "FAIL"


class Problem(Exception):
    """A request that could not be made or answered: the text is the whole line."""


class _Api:
    """Bounded requests through a lightkube client's configured HTTP client."""

    def __init__(self, http: httpx2.Client, server: str, timeout: float) -> None:
        self.http, self.server, self.timeout = http, server, timeout

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        start = time.monotonic()
        chunks: list[bytes] = []
        size = 0
        try:
            with self.http.stream(method, path, json=body) as resp:
                for chunk in resp.iter_bytes():
                    size += len(chunk)
                    if size > MAX_BODY:
                        raise Problem(f"{method} {path}: answer larger than {MAX_BODY} bytes")
                    if time.monotonic() - start > self.timeout:
                        raise Problem(
                            f"{method} {path}: the answer did not end within {self.timeout:g}s"
                        )
                    chunks.append(chunk)
                status = resp.status_code
        except Problem:
            raise
        except Exception as exc:
            raise Problem(explain(exc, self.server) or f"{method} {path}: {exc}") from None
        data = b"".join(chunks)
        try:
            return status, json.loads(data) if data else None
        except ValueError:
            raise Problem(f"{method} {path}: HTTP {status}, and the answer is not JSON") from None

    def get_json(self, path: str) -> Any:
        """The decoded answer; None for 404; :class:`Problem` for any other failure."""
        status, doc = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            message = doc.get("message", "") if isinstance(doc, dict) else ""
            raise Problem(f"GET {path}: HTTP {status} {printable(message)[:200]}".rstrip())
        return doc


# -- checks ---------------------------------------------------------------------------


def _discover(api: _Api) -> ServedAPIs:
    version = api.get_json("/version")
    group = api.get_json(f"/apis/{DRA_GROUP}")
    docs: dict[str, Any] = {}
    if isinstance(group, dict) and isinstance(group.get("versions"), list):
        for entry in group["versions"][:16]:
            v = entry.get("version") if isinstance(entry, dict) else None
            if isinstance(v, str) and v.isalnum():
                docs[v] = api.get_json(f"/apis/{DRA_GROUP}/{v}")
    try:
        return parse_discovery(group, docs, version)
    except Exception as exc:  # the documents are not discovery
        raise Problem(f"API discovery: {exc}") from None


def _version_check(git: str) -> Check:
    release = release_of(git)
    if release in KUBE_VERSIONS:
        return Check("version", "ok", f"Kubernetes {git} (drahealth supports {release})")
    return Check(
        "version",
        "warn",
        f"Kubernetes {git or '(no gitVersion)'}: outside {KUBE_VERSIONS[0]}-{KUBE_VERSIONS[-1]}, "
        "which drahealth is tested on",
        f"run a release from {KUBE_VERSIONS[0]} to {KUBE_VERSIONS[-1]}",
    )


def _api_checks(served: ServedAPIs) -> list[Check]:
    summary = ", ".join(
        f"{k} {(served.chosen(k) or 'not served')}" for k in DRA_KINDS
    )  # fmt: skip
    out = [Check("apis", "ok", f"{DRA_GROUP}: {summary}")]
    missing = [k for k in ("ResourceClaim", "ResourceSlice") if served.chosen(k) != "v1"]
    if missing:
        served_at = "; ".join(
            f"{k} at {', '.join(served.versions.get(k, ())) or 'no version'}" for k in missing
        )
        out.append(
            Check(
                "dra-v1",
                "FAIL",
                f"{' and '.join(missing)} not served at {DRA_GROUP}/v1 ({served_at})",
                f"drahealth needs {DRA_GROUP}/v1 (Kubernetes 1.34 on): upgrade, or "
                f"set --runtime-config={DRA_GROUP}/v1=true on the kube-apiserver",
            )
        )
    else:
        out.append(Check("dra-v1", "ok", f"ResourceClaim and ResourceSlice at {DRA_GROUP}/v1"))
    return out


def _mode_check(served: ServedAPIs, requested: str) -> tuple[Check, str | None]:
    rules = served.chosen("DeviceTaintRule")
    try:
        mode, why = choose_remediation_mode(requested, rules)
    except ValueError as exc:
        return Check("mode", "FAIL", str(exc), unserved_reason("DeviceTaintRule",
                     served.server_version)), None  # fmt: skip
    if mode == "taint-rules" or rules is not None:
        return Check("mode", "ok", f"remediation mode {requested} -> {mode} ({why})"), mode
    fix = f"to use DeviceTaintRules: {unserved_reason('DeviceTaintRule', served.server_version)}"
    return Check("mode", "warn", f"remediation mode {requested} -> {mode} ({why})", fix), mode


def _devices_per_node(api: _Api, served: ServedAPIs) -> float | None:
    """Devices per node on average, from one page of ResourceSlices (None: unknown, or
    no slice names a node)."""
    version = served.chosen("ResourceSlice")
    if version is None:
        return None
    try:
        doc = api.get_json(f"/apis/{DRA_GROUP}/{version}/resourceslices?limit={SLICE_PAGE}")
    except Problem:
        return None
    items = doc.get("items") if isinstance(doc, dict) else None
    per_node: dict[str, set[tuple[str, str, str]]] = {}
    for s in items if isinstance(items, list) else []:
        spec = s.get("spec") if isinstance(s, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("nodeName"), str):
            continue
        pool = spec.get("pool")
        pool_name = str(pool.get("name") or "") if isinstance(pool, dict) else ""
        devices = spec.get("devices")
        names = per_node.setdefault(spec["nodeName"], set())
        for d in devices if isinstance(devices, list) else []:
            if isinstance(d, dict) and isinstance(d.get("name"), str):
                names.add((str(spec.get("driver") or ""), pool_name, d["name"]))
    if not per_node:
        return None
    return sum(len(v) for v in per_node.values()) / len(per_node)


def _cost_check(api: _Api, served: ServedAPIs, mode: str) -> Check:
    """What one bad device costs in ``mode``: the devices it keeps new pods off."""
    if mode in ("node-taint", "cordon"):
        average = _devices_per_node(api, served)
        here = (
            f"{average:.1f}".removesuffix(".0") + " devices per node on average here"
            if average is not None
            else "no ResourceSlice here names a node yet"
        )
        text = f"a bad device fences every device of its node ({here})"
    elif mode in ("quarantine", "taint-rules"):
        text = "a bad device fences only itself"
    elif mode == "evict-only":
        text = "nothing is fenced: a bad device's pods are evicted, new pods may still get it"
    else:
        text = "nothing is fenced or evicted"
    return Check("mode-cost", "ok", f"remediation mode {mode}: {text}")


def needed(
    component: str, setup: Setup, namespace: str
) -> Iterator[tuple[str, str, str, str, str]]:
    """(group, resource, subresource, verb, namespace) the component uses, each once;
    namespace "" for cluster-wide access."""
    seen: set[tuple[str, str, str, str, str]] = set()
    for p in PERMISSIONS[component]:
        if not setup.wants(p.when):
            continue
        places: tuple[str, ...] = ("",)
        if p.scope == "namespace" and p.when == "jobs":
            places = tuple(sorted({ns or namespace for ns in setup.job_namespaces}))
        elif p.scope == "namespace":
            places = (namespace,)
        for where in places:
            for verb in p.verbs:
                ask = (p.group, p.resource, p.subresource, verb, where)
                if ask not in seen:
                    seen.add(ask)
                    yield ask


def _rbac_check(api: _Api, component: str, namespace: str, setup: Setup) -> Check:
    denied: list[str] = []
    asked = 0
    for group, resource, subresource, verb, where in needed(component, setup, namespace):
        attrs: dict[str, Any] = {"group": group, "resource": resource, "verb": verb}
        if subresource:
            attrs["subresource"] = subresource
        if where:
            attrs["namespace"] = where
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        status, doc = api.request(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body
        )
        if status == 404:
            return Check(
                f"rbac:{component}",
                "warn",
                "the server does not serve SelfSubjectAccessReviews: RBAC not checked",
                "check the component's roles by hand (docs/operations.md)",
            )
        if status not in (200, 201) or not isinstance(doc, dict):
            raise Problem(f"SelfSubjectAccessReview: HTTP {status}")
        asked += 1
        if (doc.get("status") or {}).get("allowed") is not True:
            name = resource + (f"/{subresource}" if subresource else "")
            denied.append(
                f"{verb} {name}" + (f" ({group})" if group else "")
                + (f" in {where}" if where else "")
            )  # fmt: skip
    if denied:
        return Check(
            f"rbac:{component}",
            "FAIL",
            f"{component} may not: {', '.join(denied)}",
            f"grant these to the {component}'s ServiceAccount (the chart's roles, "
            "deploy/helm/drahealth; docs/operations.md lists each component's)",
        )
    return Check(f"rbac:{component}", "ok", f"{component}: all {asked} permissions allowed")


def _rules_check(api: _Api, served: ServedAPIs) -> Check:
    version = served.chosen("DeviceTaintRule")
    if version is None:
        return Check("rules", "ok", "no DeviceTaintRule API: no rule can select every device")
    broad: list[str] = []
    seen = 0
    cont = ""
    while True:
        path = f"/apis/{DRA_GROUP}/{version}/devicetaintrules?limit=500"
        if cont:
            path += f"&continue={quote(cont, safe='')}"
        doc = api.get_json(path)
        if not isinstance(doc, dict) or not isinstance(doc.get("items", []), list):
            raise Problem(f"GET {path}: not a DeviceTaintRuleList")
        for rule in doc.get("items") or []:
            seen += 1
            spec = (rule.get("spec") if isinstance(rule, dict) else None) or {}
            selector = spec.get("deviceSelector") if isinstance(spec, dict) else None
            scope = selector_scope(selector if isinstance(selector, dict) else None)
            if scope in ("all", "partial"):
                name = ((rule.get("metadata") or {}).get("name")) or "(no name)"
                broad.append(f"{printable(name)[:253]} ({scope})")
        cont = str((doc.get("metadata") or {}).get("continue") or "")
        if not cont or seen >= MAX_RULES:
            break
    if broad:
        shown = ", ".join(broad[:MAX_NAMED]) + (
            f" and {len(broad) - MAX_NAMED} more" if len(broad) > MAX_NAMED else ""
        )
        return Check(
            "rules",
            "FAIL",
            f"{len(broad)} DeviceTaintRule(s) select every device or devices of several "
            f"drivers: {shown} (kubernetes #141422: an empty selector evicts every pod "
            "using any DRA device; drahealth never acts on such a rule)",
            "delete them (kubectl delete devicetaintrule NAME) or name the driver, pool "
            "and device in spec.deviceSelector",
        )
    return Check("rules", "ok", f"{seen} DeviceTaintRule(s), none over-broad")


def node_checks(kubelet_dir: Path, components: tuple[str, ...]) -> list[Check]:
    """The kubelet's plugin directories and PodResources socket under ``kubelet_dir``."""
    out = []
    for rel, kind, who in NODE_PATHS:
        users = [c for c in who if c in components]
        if not users:
            continue
        path = kubelet_dir / rel
        name = f"node:{rel}"
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            out.append(
                Check(
                    name,
                    "FAIL",
                    f"{path}: {exc.strerror or exc} (needed by the {' and '.join(users)})",
                    "run on a node with a kubelet, give --kubelet-dir (the kubelet's "
                    "--root-dir) or --node-root where the host is mounted, and mount "
                    f"{rel} into the pod",
                )
            )
            continue
        ok = stat.S_ISDIR(mode) if kind == "dir" else stat.S_ISSOCK(mode)
        if not ok:
            out.append(
                Check(
                    name,
                    "FAIL",
                    f"{path} is not a {'directory' if kind == 'dir' else 'unix socket'}",
                    "the kubelet creates it: check the kubelet runs with --root-dir "
                    f"{kubelet_dir} (and, for the socket, that it serves PodResources)",
                )
            )
        elif not os.access(path, os.R_OK | (os.W_OK if kind == "socket" else 0)):
            out.append(Check(name, "FAIL", f"{path}: permission denied", "run as root"))
        else:
            out.append(
                Check(name, "ok", f"{path} is a {'directory' if kind == 'dir' else 'socket'}")
            )
    return out


def diagnose(
    kubeconfig: str | None,
    context: str | None,
    components: tuple[str, ...],
    namespace: str,
    requested_mode: str,
    timeout: float,
    kubelet_dir: Path | None,
    setup: Setup | None = None,
) -> tuple[list[Check], dict[str, Any]]:
    """All checks, and facts for ``-o json`` (server version, APIs, mode). ``setup``:
    how the components run (default: the chart's defaults); its mode is found here."""
    from drahealth.kube import make_sync_client

    checks: list[Check] = []
    facts: dict[str, Any] = {"serverVersion": None, "apis": None, "mode": None}
    try:
        config = load_config(kubeconfig, context=context)
        load_checked(kubeconfig, context)
        server = config.cluster.server
        checks.append(Check("kubeconfig", "ok", f"server {server} (context {config.context_name})"))
    except KubeConfigError as exc:
        checks.append(Check("kubeconfig", "FAIL", str(exc), "give --kubeconfig / --context"))
        server = None
    except click.ClickException as exc:  # a file the kubeconfig names is missing
        checks.append(Check("kubeconfig", "FAIL", exc.format_message(), "fix the kubeconfig"))
        server = None
    if server is not None:
        client = make_sync_client(kubeconfig, context=context, timeout=timeout)
        api = _Api(client._client._client, server, timeout)
        try:
            checks += _cluster_checks(
                api, components, namespace, requested_mode, facts, setup or Setup()
            )
        finally:
            client.close()
    if kubelet_dir is not None:
        checks += node_checks(kubelet_dir, components)
    return checks, facts


def _cluster_checks(
    api: _Api,
    components: tuple[str, ...],
    namespace: str,
    requested_mode: str,
    facts: dict[str, Any],
    setup: Setup,
) -> list[Check]:
    out: list[Check] = []
    try:
        served = _discover(api)
    except Problem as exc:
        out.append(
            Check("api", "FAIL", str(exc), "check --kubeconfig / --context and that it is up")
        )
        return out
    git = printable(served.server_version)
    facts["serverVersion"] = git or None
    facts["apis"] = served.summary()
    out.append(Check("api", "ok", f"the API server at {api.server} answers"))
    out.append(_version_check(git))
    out += _api_checks(served)
    mode = None
    if "controller" in components:
        check, mode = _mode_check(served, requested_mode)
        facts["mode"] = mode
        out.append(check)
        if mode is not None:
            out.append(_cost_check(api, served, mode))
    setup = replace(setup, mode=mode)
    for component in components:
        try:
            out.append(_rbac_check(api, component, namespace, setup))
        except Problem as exc:
            out.append(Check(f"rbac:{component}", "FAIL", str(exc), "check the API server"))
    if "controller" in components:  # the driver's and agent's roles may not list rules
        try:
            out.append(_rules_check(api, served))
        except Problem as exc:
            out.append(Check("rules", "FAIL", str(exc), "check the API server"))
    return out


# -- output ---------------------------------------------------------------------------


def _text(checks: list[Check]) -> str:
    width = max((len(c.check) for c in checks), default=10)
    lines = []
    for c in checks:
        lines.append(f"{c.status:<5} {c.check:<{width}}  {printable(c.message)}")
        if c.fix and c.status != "ok":
            lines.append(f"{'':<5} {'':<{width}}  fix: {printable(c.fix)}")
    fails = sum(c.blocker for c in checks)
    warns = sum(c.status == "warn" for c in checks)
    lines.append(
        f"{fails} blocker(s), {warns} warning(s)" if fails or warns else "no problems found"
    )
    return "\n".join(lines)


@click.command("doctor")
@KUBECONFIG_OPTION
@CONTEXT_OPTION
@click.option(
    "--component",
    type=click.Choice([*COMPONENTS, "all"]),
    default="all",
    show_default=True,
    help="Whose RBAC (and node needs) to check.",
)
@click.option(
    "--namespace",
    default=DEFAULT_NAMESPACE,
    show_default=True,
    help="The components' namespace (their ConfigMaps and Leases).",
)
@click.option(
    "--remediation-mode",
    type=click.Choice(REMEDIATION_MODES),
    default="auto",
    show_default=True,
    help="The controller's --remediation-mode (decides whether it needs rules or nodes).",
)
@click.option(
    "--node-root",
    type=click.Path(file_okay=False),
    default=None,
    help="Check the node too, with its root here (e.g. / or where the host is mounted); "
    "implied (/) for --component agent or driver.",
)
@click.option(
    "--kubelet-dir",
    default="/var/lib/kubelet",
    show_default=True,
    help="The kubelet's --root-dir, under --node-root.",
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The controller's policy file: its nodeRollup and repair Jobs decide those "
    "permissions (without it: the node rollup on, no node taint, no repair Job).",
)
@click.option(
    "--claim-cache/--no-claim-cache",
    default=True,
    show_default=True,
    help="The driver runs with --claim-cache (the chart's default): it lists and watches "
    "ResourceClaims.",
)
@click.option(
    "--claim-status",
    is_flag=True,
    help="The driver runs with --claim-status: it patches resourceclaims/status.",
)
@click.option(
    "--attach",
    is_flag=True,
    help="The agent has attached sources (--attach): it lists and watches pods and "
    "ResourceSlices, reads ResourceClaims and patches pods/status.",
)
@click.option("--timeout", type=click.FloatRange(0.1, 300), default=5.0, show_default=True,
              help="Seconds each request to the API server may take.")  # fmt: skip
@click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def doctor_command(
    kubeconfig: str | None,
    context: str | None,
    component: str,
    namespace: str,
    remediation_mode: str,
    node_root: str | None,
    kubelet_dir: str,
    policy_file: str | None,
    claim_cache: bool,
    claim_status: bool,
    attach: bool,
    timeout: float,
    output: str,
) -> None:
    """Check a cluster (and node) for what drahealth needs: one line per check, with fixes.

    Exits 1 when a check failed (a blocker), 0 otherwise.
    """
    components = COMPONENTS if component == "all" else (component,)
    if node_root is None and component in ("agent", "driver"):
        node_root = "/"
    kubelet = Path(node_root) / kubelet_dir.lstrip("/") if node_root is not None else None
    setup = Setup(claim_cache=claim_cache, claim_status=claim_status, attach=attach)
    if policy_file is not None:
        from drahealth.remedy import load_policy

        try:
            setup = setup_from_policy(setup, load_policy(policy_file))
        except PolicyError as exc:
            raise click.BadParameter(str(exc), param_hint="--policy") from None
    checks, facts = diagnose(
        kubeconfig, context, components, namespace, remediation_mode, timeout, kubelet, setup
    )
    if output == "json":
        doc = {
            "component": component,
            **facts,
            "blockers": sum(c.blocker for c in checks),
            "warnings": sum(c.status == "warn" for c in checks),
            "checks": [{**asdict(c), "blocker": c.blocker} for c in checks],
        }
        click.echo(json_text(doc, indent=2))
    else:
        click.echo(_text(checks))
    if any(c.blocker for c in checks):
        raise SystemExit(1)
