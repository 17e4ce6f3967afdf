"""The differential corpus: requests sent to the embedded API server and to the real
kube-apiserver of the same release, and what is compared for each.

A corpus is an ordered list of cases (one namespace, cluster-scoped names under one run
prefix); each case runs against both servers in turn and its two outcomes are compared:

* the HTTP status code;
* for a ``Status`` body: ``status``, ``reason``, ``details.kind``/``group``/``name`` and the
  multiset of ``details.causes[].(field, reason)`` (messages are not compared: upstream's
  wording is reproduced where tests read it, not everywhere);
* for an object, list, table or watch stream: the body after :func:`normalize` (names the
  server generated, uids, resourceVersions, creation and server-set times, managedFields).

Placeholders in paths and bodies: ``@NS@`` (the corpus namespace), ``@P@`` (the prefix of
cluster-scoped names), ``@UID:Kind/name@`` (that object's uid on the server being asked)
and ``@RV:Kind/name@`` (its last resourceVersion seen there).

Cases are plain HTTP requests (:class:`Req`), real kubectl runs (:class:`Kubectl`),
lightkube calls (:class:`Lightkube`) and calls through the official Python client
(``tests/realk8s/official_client.py``), whose requests (method, path, query, content type
and the status each got) are compared too.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import ssl
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from lightkube import ApiError, AsyncClient

JSON = dict[str, Any]

TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSONPATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
KUBECTL_AGENT = "kubectl/v1.37.2 (linux/amd64) kubernetes/differential"

#: Keys whose values the server sets from its clock.
_SERVER_TIMES = frozenset({"creationTimestamp", "deletionTimestamp", "timeAdded"})
_GENERATED_VOLUME = re.compile(r"^kube-api-access-[a-z0-9]{5}$")
_AGE = re.compile(r"^\d+(\.\d+)?(s|m|h|d|y)(\d+(s|m|h|d))?$")
_RV_PARAM = re.compile(r"^\d+$")


# --------------------------------------------------------------------------- targets


@dataclass
class Target:
    """One server the corpus is sent to, and what was learnt from its answers."""

    name: str
    url: str
    token: str
    kubeconfig: Path
    kubectl: Path | None
    ca_file: str | None = None
    session: aiohttp.ClientSession | None = None
    lightkube: AsyncClient | None = None
    #: The official client's handle (``official_client.Official``).
    official: Any = None
    #: uid -> ``Kind/name`` and back, resourceVersion per ``Kind/name``.
    uids: dict[str, str] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    rvs: dict[str, str] = field(default_factory=dict)

    def ssl_context(self) -> ssl.SSLContext | bool:
        if self.ca_file is None:
            return False
        return ssl.create_default_context(cafile=self.ca_file)

    def learn(self, body: Any) -> None:
        """Remember the uid and resourceVersion of every object in ``body``."""
        if not isinstance(body, dict):
            return
        for item in body.get("items") or ():
            self.learn(item)
        if isinstance(body.get("object"), dict):  # a watch event
            self.learn(body["object"])
        meta = body.get("metadata")
        kind = body.get("kind")
        if not isinstance(meta, dict) or not isinstance(kind, str) or kind.endswith("List"):
            return
        name = meta.get("name")
        if not isinstance(name, str):
            return
        label = f"{kind}/{name}"
        if meta.get("generateName"):
            label = f"{kind}/generated"
        if isinstance(meta.get("uid"), str):
            self.uids[meta["uid"]] = label
            self.refs[label] = meta["uid"]
        if isinstance(meta.get("resourceVersion"), str):
            self.rvs[label] = meta["resourceVersion"]


@dataclass
class Context:
    namespace: str
    prefix: str


def substitute(value: Any, target: Target, ctx: Context) -> Any:
    if isinstance(value, str):
        out = value.replace("@NS@", ctx.namespace).replace("@P@", ctx.prefix)

        def ref(m: re.Match[str]) -> str:
            table = target.refs if m.group(1) == "UID" else target.rvs
            label = m.group(2).replace("@NS@", ctx.namespace).replace("@P@", ctx.prefix)
            return table.get(label, f"missing-{m.group(1).lower()}")

        return re.sub(r"@(UID|RV):([^@]+)@", ref, out)
    if isinstance(value, list):
        return [substitute(v, target, ctx) for v in value]
    if isinstance(value, dict):
        return {substitute(k, target, ctx): substitute(v, target, ctx) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------- outcomes


@dataclass
class Outcome:
    code: int
    body: Any
    warnings: tuple[str, ...] = ()
    #: The requests a client library sent for this case, where it records them.
    sent: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Case:
    """One corpus entry. ``compare``: ``object`` (the whole normalised body), ``code``
    (the status code and, for a Status, its reason and causes), ``table``, ``watch``,
    ``names`` (a list's item names only), ``schema`` (an OpenAPI document's schemas)."""

    id: str
    source: str
    dra: bool = False
    compare: str = "object"
    #: For ``schema``: the component schemas compared.
    schemas: tuple[str, ...] = ()
    #: Compare what asynchronous controllers write too (see :func:`strip_controllers`).
    strict: bool = False

    async def run(self, target: Target, ctx: Context) -> Outcome:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class Req(Case):
    """One HTTP request."""

    method: str
    path: str
    body: Any = None
    ctype: str | None = None
    accept: str | None = None
    query: tuple[tuple[str, str], ...] = ()
    agent: str | None = None

    async def run(self, target: Target, ctx: Context) -> Outcome:
        assert target.session is not None
        path = substitute(self.path, target, ctx)
        query = [(k, substitute(v, target, ctx)) for k, v in self.query]
        headers = {"Authorization": f"Bearer {target.token}"}
        if self.accept:
            headers["Accept"] = self.accept
        if self.agent:
            headers["User-Agent"] = self.agent
        data: bytes | None = None
        if self.body is not None:
            body = substitute(self.body, target, ctx)
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            headers["Content-Type"] = self.ctype or "application/json"
        url = target.url + path
        if self.compare == "watch":
            return await self._watch(target, url, query, headers)
        async with target.session.request(
            self.method, url, params=query, data=data, headers=headers, ssl=target.ssl_context()
        ) as resp:
            raw = await resp.read()
            warnings = tuple(resp.headers.getall("Warning", []))
            return Outcome(resp.status, _decode(raw), warnings)

    async def _watch(
        self, target: Target, url: str, query: list[tuple[str, str]], headers: dict[str, str]
    ) -> Outcome:
        """Events up to the bookmark that ends the initial events (or the timeout)."""
        assert target.session is not None
        events: list[Any] = []
        async with target.session.get(
            url, params=query, headers=headers, ssl=target.ssl_context()
        ) as resp:
            if resp.status != 200:
                return Outcome(resp.status, _decode(await resp.read()))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    line = await asyncio.wait_for(resp.content.readline(), 5)
                except TimeoutError:
                    break
                if not line:
                    break
                event = json.loads(line)
                if event.get("type") == "BOOKMARK":
                    notes = (event["object"].get("metadata") or {}).get("annotations") or {}
                    events.append({"type": "BOOKMARK", "annotations": notes})
                    if notes.get("k8s.io/initial-events-end") == "true":
                        break
                    continue
                events.append(event)
        return Outcome(200, events)


@dataclass(frozen=True, kw_only=True)
class Kubectl(Case):
    """The real kubectl, run against the target; stdout (JSON when ``-o json``) and the
    exit code are compared, and the reason of an ``Error from server (Reason)`` line."""

    args: tuple[str, ...]
    stdin: str | None = None

    async def run(self, target: Target, ctx: Context) -> Outcome:
        assert target.kubectl is not None
        args = [substitute(a, target, ctx) for a in self.args]
        cmd = [str(target.kubectl), f"--kubeconfig={target.kubeconfig}", "-n", ctx.namespace]
        stdin = substitute(self.stdin, target, ctx) if self.stdin is not None else None
        done = await asyncio.to_thread(
            subprocess.run,
            [*cmd, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        out: Any = done.stdout
        if "json" in args or "-ojson" in args:
            with contextlib.suppress(ValueError):
                out = json.loads(done.stdout)
        if isinstance(out, str):
            out = [re.sub(r"\s+", " ", line).strip() for line in out.splitlines()]
        reason = re.search(r"Error from server \((\w+)\)", done.stderr)
        errors = reason.group(1) if reason else ("error" if done.returncode else "")
        return Outcome(done.returncode, {"stdout": out, "error": errors})


@dataclass(frozen=True, kw_only=True)
class Lightkube(Case):
    """A lightkube call: its result as a dict (or list of dicts), or its ApiError."""

    call: Callable[[AsyncClient, Context], Awaitable[Any]]

    async def run(self, target: Target, ctx: Context) -> Outcome:
        assert target.lightkube is not None
        try:
            result = await self.call(target.lightkube, ctx)
        except ApiError as exc:
            return Outcome(exc.status.code or 0, exc.response.json())
        return Outcome(200, _plain(result))


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


# --------------------------------------------------------------------------- comparison


def normalize(value: Any, target: Target, key: str = "") -> Any:
    """``value`` with what differs between any two servers replaced by placeholders."""
    if isinstance(value, dict):
        out: JSON = {}
        meta_like = "generateName" in value or ("uid" in value and "name" in value)
        for k, v in value.items():
            if k in ("managedFields", "selfLink"):
                continue
            if k == "resourceVersion" and isinstance(v, str) and key in ("metadata", ""):
                out[k] = "<rv>"
                continue
            if k in _SERVER_TIMES and isinstance(v, str):
                out[k] = "<time>"
                continue
            if k == "continue" and v:
                out[k] = "<continue>"
                continue
            if k == "name" and meta_like and value.get("generateName"):
                out[k] = "<generated>"
                continue
            out[k] = normalize(v, target, k)
        return out
    if isinstance(value, list):
        return [normalize(v, target, key) for v in value]
    if isinstance(value, str):
        if value in target.uids:
            return f"<uid:{target.uids[value]}>"
        if _GENERATED_VOLUME.match(value):
            return "kube-api-access-<generated>"
    return value


#: What the real control plane's controllers (not its API server) write asynchronously:
#: the TTL controller's node annotation, the node lifecycle controller's taints, the
#: device-taint eviction controller's rule condition. Left out of every comparison
#: except where a case asks for ``strict``.
_CONTROLLER_ANNOTATIONS = frozenset({"node.alpha.kubernetes.io/ttl"})
_CONTROLLER_TAINTS = frozenset(
    {
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }
)
_CONTROLLER_CONDITIONS = frozenset({"EvictionInProgress"})


def strip_controllers(value: Any) -> Any:
    if isinstance(value, list):
        return [strip_controllers(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: strip_controllers(v) for k, v in value.items()}
    notes = out.get("annotations")
    if isinstance(notes, dict) and _CONTROLLER_ANNOTATIONS & set(notes):
        notes = {k: v for k, v in notes.items() if k not in _CONTROLLER_ANNOTATIONS}
        if notes:
            out["annotations"] = notes
        else:
            del out["annotations"]
    taints = out.get("taints")
    if isinstance(taints, list) and isinstance(out.get("unschedulable", False), bool):
        kept = [
            t for t in taints if not (isinstance(t, dict) and t.get("key") in _CONTROLLER_TAINTS)
        ]
        if kept:
            out["taints"] = kept
        else:
            del out["taints"]
    conditions = out.get("conditions")
    if isinstance(conditions, list) and any(
        isinstance(c, dict) and c.get("type") in _CONTROLLER_CONDITIONS for c in conditions
    ):
        kept = [
            c
            for c in conditions
            if not (isinstance(c, dict) and c.get("type") in _CONTROLLER_CONDITIONS)
        ]
        if kept:
            out["conditions"] = kept
        else:
            del out["conditions"]
    return out


def _is_status(body: Any) -> bool:
    return isinstance(body, dict) and body.get("kind") == "Status"


def status_view(body: JSON) -> JSON:
    details = body.get("details") or {}
    causes = sorted(
        (str(c.get("field", "")), str(c.get("reason", ""))) for c in details.get("causes") or ()
    )
    return {
        "status": body.get("status"),
        "reason": body.get("reason", ""),
        "details": {k: details.get(k) for k in ("kind", "group", "name") if details.get(k)},
        "causes": [f"{f} {r}" for f, r in causes],
    }


def table_view(body: Any) -> Any:
    if not isinstance(body, dict) or body.get("kind") != "Table":
        return body
    cols = body.get("columnDefinitions") or []
    names = [c.get("name") for c in cols]
    rows = []
    for row in body.get("rows") or []:
        cells = [
            "<age>"
            if names[i : i + 1] == ["Age"] or (isinstance(cell, str) and _AGE.match(cell))
            else cell
            for i, cell in enumerate(row.get("cells") or [])
        ]
        rows.append({"cells": cells, "object": row.get("object")})
    return {
        "columns": [{k: c.get(k) for k in ("name", "type", "format", "priority")} for c in cols],
        "rows": rows,
    }


def kubectl_view(body: Any) -> Any:
    if not isinstance(body, dict) or not isinstance(body.get("stdout"), list):
        return body
    lines = [" ".join("<age>" if _AGE.match(w) else w for w in ln.split()) for ln in body["stdout"]]
    return {**body, "stdout": lines}


def schema_view(body: Any, schemas: tuple[str, ...]) -> Any:
    """Property names, required fields and types of the named component schemas."""
    if not isinstance(body, dict):
        return body
    comps = (body.get("components") or {}).get("schemas") or {}
    out: JSON = {}
    for name in schemas:
        s = comps.get(name)
        if not isinstance(s, dict):
            out[name] = None
            continue
        props = s.get("properties") or {}
        out[name] = {
            "required": sorted(s.get("required") or []),
            "properties": {
                p: v.get("type") or ("ref" if v.get("allOf") or v.get("$ref") else None)
                for p, v in sorted(props.items())
            },
            "gvk": s.get("x-kubernetes-group-version-kind"),
        }
    return out


def view(case: Case, outcome: Outcome, target: Target) -> Any:
    """What is compared of ``outcome``."""
    out = _view(case, outcome, target)
    if outcome.sent:
        out["sent"] = list(outcome.sent)
    return out


def _view(case: Case, outcome: Outcome, target: Target) -> Any:
    body = outcome.body
    if _is_status(body):
        return {"code": outcome.code, **status_view(body)}
    if case.compare == "code":
        return {"code": outcome.code}
    if case.compare == "schema":
        return {"code": outcome.code, "schemas": schema_view(body, case.schemas)}
    if case.compare == "names":
        items = (body or {}).get("items") if isinstance(body, dict) else None
        names = sorted(
            str((i.get("metadata") or {}).get("name")) for i in items or () if isinstance(i, dict)
        )
        return {"code": outcome.code, "kind": (body or {}).get("kind"), "names": names}
    body = normalize(body, target)
    if not case.strict:
        body = strip_controllers(body)
    if case.compare == "table":
        body = table_view(body)
    if isinstance(case, Kubectl):
        body = kubectl_view(body)
    return {"code": outcome.code, "body": body}


def diff(a: Any, b: Any, path: str = "", out: list[str] | None = None) -> list[str]:
    """Paths where ``a`` (real) and ``b`` (embedded) differ, with both values."""
    out = [] if out is None else out
    if len(out) >= 12:
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            here = f"{path}.{k}" if path else str(k)
            if k not in b:
                out.append(f"{here}: real {_short(a[k])}, embedded lacks it")
            elif k not in a:
                out.append(f"{here}: embedded {_short(b[k])}, real lacks it")
            else:
                diff(a[k], b[k], here, out)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            diff(x, y, f"{path}[{i}]", out)
        return out
    if a != b:
        out.append(f"{path}: real {_short(a)}, embedded {_short(b)}")
    return out


def _short(v: Any) -> str:
    text = json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= 300 else text[:297] + "..."


@dataclass
class Result:
    case: Case
    real: Outcome
    embedded: Outcome
    differences: list[str]


async def run_corpus(
    cases: Iterable[Case],
    real: Target,
    embedded: Target,
    ctx: Context,
    settle: Callable[[Case, Target], Awaitable[None]] | None = None,
) -> list[Result]:
    """Each case against the real server, then the embedded one; their differences."""
    results: list[Result] = []
    for case in cases:
        outcomes: list[Outcome] = []
        for target in (real, embedded):
            outcome = await case.run(target, ctx)
            target.learn(outcome.body)
            if isinstance(outcome.body, dict) and isinstance(outcome.body.get("stdout"), dict):
                target.learn(outcome.body["stdout"])
            if isinstance(outcome.body, list):
                for item in outcome.body:
                    target.learn(item)
            if settle is not None:
                await settle(case, target)
            outcomes.append(outcome)
        differences = diff(view(case, outcomes[0], real), view(case, outcomes[1], embedded))
        results.append(Result(case, outcomes[0], outcomes[1], differences))
    return results


def deep(obj: JSON, **changes: Any) -> JSON:
    """A deep copy of ``obj`` with dotted-path ``changes`` applied (``None`` deletes)."""
    out = copy.deepcopy(obj)
    for dotted, value in changes.items():
        keys = dotted.split("__")
        node: Any = out
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
        last = keys[-1]
        if isinstance(node, list):
            node[int(last)] = value
        elif value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return out


# =========================================================================== the corpus

NS = "@NS@"
CORE = "/api/v1"
DRA = "/apis/resource.k8s.io/v1"
DRIVER = "@P@.example.com"
SCHED = "drahealth-differential"  # no scheduler serves it: pods stay as written


def _ns(path: str) -> str:
    return f"{CORE}/namespaces/{NS}/{path}"


def _dra_ns(path: str) -> str:
    return f"{DRA}/namespaces/{NS}/{path}"


def _pod(name: str, **spec: Any) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "schedulerName": SCHED,
            "containers": [{"name": "c", "image": "registry.example/app:1.0"}],
            **spec,
        },
    }


def _slice(name: str, **spec: Any) -> JSON:
    base: JSON = {
        "driver": DRIVER,
        "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
        "nodeName": "@P@-node-a",
        "devices": [
            {
                "name": "gpu-0",
                "attributes": {
                    "model": {"string": "LATEST-GPU-MODEL"},
                    "driverVersion": {"version": "1.2.3"},
                    "index": {"int": 0},
                    "healthy": {"bool": True},
                },
                "capacity": {"memory": {"value": "80Gi"}},
            },
            {"name": "gpu-1", "attributes": {"index": {"int": 1}}},
        ],
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {**base, **spec},
    }


def _exact(**over: Any) -> JSON:
    return {"deviceClassName": "@P@-gpu", **over}


def _claim(name: str, devices: JSON | None = None) -> JSON:
    devices = devices or {"requests": [{"name": "gpu", "exactly": _exact()}]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def _template(name: str, devices: JSON | None = None, meta: JSON | None = None) -> JSON:
    devices = devices or {"requests": [{"name": "gpu", "exactly": _exact()}]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"metadata": meta or {}, "spec": {"devices": devices}},
    }


def _class(name: str, **spec: Any) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def _rule(name: str, selector: JSON | None = None, taint: JSON | None = None) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": selector
            if selector is not None
            else {"driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
            "taint": taint
            if taint is not None
            else {"key": "example.com/unhealthy", "value": "ecc", "effect": "NoSchedule"},
        },
    }


def _allocation(**result: Any) -> JSON:
    r = {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0", **result}
    return {
        "devices": {"results": [r]},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["@P@-node-a"]}
                    ]
                }
            ]
        },
    }


def _pod_event(name: str, pod: str, reason: str, type_: str, **extra: Any) -> dict[str, Any]:
    """A core/v1 Event named ``name`` about pod ``pod`` of the corpus namespace."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "name": pod, "namespace": NS},
        "reason": reason,
        "type": type_,
        **extra,
    }


def _req(id: str, source: str, method: str, path: str, body: Any = None, **kw: Any) -> Req:
    return Req(id=id, source=source, method=method, path=path, body=body, **kw)


def component_cases() -> list[Case]:
    """What drahealth's own components send (agent, driver, controller, CLI)."""
    src = "component"
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "history", "labels": {"app.kubernetes.io/name": "drahealth"}},
        "data": {"node-a": "[]"},
    }
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "@P@-node-a",
            "labels": {
                "kubernetes.io/hostname": "node-a",
                "drahealth.example/pool": "a",
                "drahealth.example/run": "@P@",
            },
        },
        # no other test's pod may land here (the drain below would then differ)
        "spec": {"taints": [{"key": "drahealth.io/unhealthy", "effect": "NoSchedule"}]},
    }
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "node-a",
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": "@P@-node-a",
                    "uid": "@UID:Node/@P@-node-a@",
                }
            ],
        },
        "spec": {
            "holderIdentity": "node-a",
            "leaseDurationSeconds": 40,
            "acquireTime": "2026-01-02T03:04:05.123456Z",
            "renewTime": "2026-01-02T03:04:05.123456Z",
        },
    }
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "@P@-node-a.device-unhealthy", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": "@P@-node-a", "apiVersion": "v1"},
        "reason": "DeviceUnhealthy",
        "message": "gpu-0: ECC errors",
        "type": "Warning",
        "source": {"component": "drahealth-agent", "host": "node-a"},
        "count": 1,
        "firstTimestamp": "2026-01-02T03:04:05Z",
        "lastTimestamp": "2026-01-02T03:04:05Z",
        "reportingComponent": "drahealth-agent",
        "reportingInstance": "node-a",
    }
    new_event = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "claim.allocated", "namespace": NS},
        "eventTime": "2026-01-02T03:04:05.000001Z",
        "reportingController": "drahealth.io/controller",
        "reportingInstance": "controller-0",
        "action": "Remediate",
        "reason": "Cordoned",
        "regarding": {"kind": "Pod", "name": "worker", "namespace": NS, "apiVersion": "v1"},
        "note": "node cordoned",
        "type": "Normal",
    }
    node_status = {
        "status": {
            "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": "node-a"},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "drahealth agent is posting ready status",
                    "lastHeartbeatTime": "2026-01-02T03:04:05Z",
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                }
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "m",
                "systemUUID": "s",
                "bootID": "b",
                "kernelVersion": "6",
                "osImage": "drahealth",
                "containerRuntimeVersion": "drahealth://1",
                "kubeletVersion": "v1.37.2",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
    }
    claim_pod = _pod(
        "worker",
        resourceClaims=[{"name": "gpu", "resourceClaimName": "claim-a"}],
        containers=[
            {
                "name": "c",
                "image": "registry.example/app:1.0",
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
    )
    health = {
        "status": {
            "containerStatuses": [
                {
                    "name": "c",
                    "image": "registry.example/app:1.0",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": "ContainerCreating"}},
                    "allocatedResourcesStatus": [
                        {
                            "name": "claim:gpu",
                            "resources": [
                                {"resourceID": f"{DRIVER}/node-a/gpu-0", "health": "Unhealthy"}
                            ],
                        }
                    ],
                }
            ]
        }
    }
    device_status = [
        {
            "op": "add",
            "path": "/status/devices",
            "value": [
                {
                    "driver": DRIVER,
                    "pool": "node-a",
                    "device": "gpu-0",
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "DeviceHealthy",
                            "message": "",
                            "lastTransitionTime": "2026-01-02T03:04:05Z",
                        }
                    ],
                    "data": {"health": "Healthy"},
                }
            ],
        }
    ]
    return [
        # namespaces (the second one allows admin access to devices)
        _req(
            "namespace create",
            src,
            "POST",
            f"{CORE}/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        ),
        _req(
            "namespace create admin",
            src,
            "POST",
            f"{CORE}/namespaces",
            {
                "metadata": {
                    "name": f"{NS}-admin",
                    "labels": {"resource.kubernetes.io/admin-access": "true"},
                }
            },
        ),
        _req("namespace get", src, "GET", f"{CORE}/namespaces/{NS}"),
        _req(
            "namespace create exists", src, "POST", f"{CORE}/namespaces", {"metadata": {"name": NS}}
        ),
        _req(
            "namespace create invalid",
            src,
            "POST",
            f"{CORE}/namespaces",
            {"metadata": {"name": "Bad_Name"}},
        ),
        # the remediation history ConfigMap
        _req("configmap create", src, "POST", _ns("configmaps"), cm),
        _req("configmap create exists", src, "POST", _ns("configmaps"), cm),
        _req("configmap get", src, "GET", _ns("configmaps/history")),
        _req(
            "configmap merge patch",
            src,
            "PATCH",
            _ns("configmaps/history"),
            {"data": {"node-b": "[1]"}},
            ctype=MERGE,
        ),
        _req(
            "configmap merge patch null",
            src,
            "PATCH",
            _ns("configmaps/history"),
            {"data": {"node-b": None}},
            ctype=MERGE,
        ),
        _req(
            "configmap update",
            src,
            "PUT",
            _ns("configmaps/history"),
            deep(cm, metadata__resourceVersion="@RV:ConfigMap/history@", data={"node-a": "[2]"}),
        ),
        _req(
            "configmap update stale",
            src,
            "PUT",
            _ns("configmaps/history"),
            deep(cm, metadata__resourceVersion="1", data={"node-a": "[3]"}),
        ),
        _req(
            "configmap update unconditional",
            src,
            "PUT",
            _ns("configmaps/history"),
            deep(cm, data={"node-a": "[4]"}),
        ),
        _req("configmap update name mismatch", src, "PUT", _ns("configmaps/other"), cm),
        _req("configmap get missing", src, "GET", _ns("configmaps/missing")),
        _req(
            "configmap list by label",
            src,
            "GET",
            _ns("configmaps"),
            compare="names",
            query=(("labelSelector", "app.kubernetes.io/name=drahealth"),),
        ),
        _req(
            "configmap list by field",
            src,
            "GET",
            _ns("configmaps"),
            compare="names",
            query=(("fieldSelector", "metadata.name=history"),),
        ),
        _req(
            "configmap list bad field",
            src,
            "GET",
            _ns("configmaps"),
            query=(("fieldSelector", "data.x=1"),),
        ),
        _req(
            "configmap list bad label",
            src,
            "GET",
            _ns("configmaps"),
            query=(("labelSelector", "a in (b"),),
        ),
        # the node agent: Node, its Lease, Events, status
        _req("node create", src, "POST", f"{CORE}/nodes", node, strict=True),
        _req("node create exists", src, "POST", f"{CORE}/nodes", node),
        _req(
            "node merge patch labels",
            src,
            "PATCH",
            f"{CORE}/nodes/@P@-node-a",
            {"metadata": {"labels": {"drahealth.example/pool": "b"}}},
            ctype=MERGE,
        ),
        _req(
            "node status strategic",
            src,
            "PATCH",
            f"{CORE}/nodes/@P@-node-a/status",
            node_status,
            ctype=STRATEGIC,
        ),
        _req(
            "node status condition merge",
            src,
            "PATCH",
            f"{CORE}/nodes/@P@-node-a/status",
            {
                "status": {
                    "conditions": [
                        {
                            "type": "DRADevicesHealthy",
                            "status": "False",
                            "reason": "DeviceUnhealthy",
                            "message": "gpu-0",
                            "lastHeartbeatTime": "2026-01-02T03:04:06Z",
                            "lastTransitionTime": "2026-01-02T03:04:06Z",
                        }
                    ]
                }
            },
            ctype=STRATEGIC,
        ),
        _req("node get status", src, "GET", f"{CORE}/nodes/@P@-node-a/status"),
        _req(
            "node cordon",
            src,
            "PATCH",
            f"{CORE}/nodes/@P@-node-a",
            {"spec": {"unschedulable": True}},
            ctype=STRATEGIC,
        ),
        _req(
            "node list unschedulable",
            src,
            "GET",
            f"{CORE}/nodes",
            compare="names",
            query=(
                ("fieldSelector", "spec.unschedulable=true"),
                ("labelSelector", "drahealth.example/run=@P@"),
            ),
        ),
        _req(
            "node taint invalid",
            src,
            "PATCH",
            f"{CORE}/nodes/@P@-node-a",
            {"spec": {"taints": [{"key": "a", "effect": "Sometimes"}]}},
            ctype=STRATEGIC,
        ),
        _req(
            "node taint",
            src,
            "PATCH",
            f"{CORE}/nodes/@P@-node-a",
            {"spec": {"taints": [{"key": "drahealth.io/unhealthy", "effect": "NoSchedule"}]}},
            ctype=MERGE,
        ),
        _req(
            "lease create",
            src,
            "POST",
            f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases",
            lease,
        ),
        _req(
            "lease renew",
            src,
            "PATCH",
            f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/node-a",
            {
                "spec": {
                    "holderIdentity": "node-a",
                    "leaseDurationSeconds": 40,
                    "renewTime": "2026-01-02T03:04:15.654321Z",
                }
            },
            ctype=MERGE,
        ),
        _req(
            "lease invalid duration",
            src,
            "PATCH",
            f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/node-a",
            {"spec": {"leaseDurationSeconds": 0}},
            ctype=MERGE,
        ),
        _req(
            "lease get", src, "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/node-a"
        ),
        _req("event create", src, "POST", f"{CORE}/namespaces/default/events", event),
        _req(
            "event wrong namespace", src, "POST", _ns("events"), deep(event, metadata__namespace=NS)
        ),
        _req(
            "event patch count",
            src,
            "PATCH",
            f"{CORE}/namespaces/default/events/@P@-node-a.device-unhealthy",
            {"count": 2, "lastTimestamp": "2026-01-02T03:05:05Z"},
            ctype=MERGE,
        ),
        _req(
            "event list by object",
            src,
            "GET",
            f"{CORE}/namespaces/default/events",
            compare="names",
            query=(("fieldSelector", "involvedObject.name=@P@-node-a,reason=DeviceUnhealthy"),),
        ),
        _req(
            "event invalid type",
            src,
            "POST",
            _ns("events"),
            _pod_event("bad-type", "x", "R", "Sideways"),
        ),
        _req(
            "event v1 create",
            src,
            "POST",
            f"/apis/events.k8s.io/v1/namespaces/{NS}/events",
            new_event,
        ),
        _req(
            "event v1 missing time",
            src,
            "POST",
            f"/apis/events.k8s.io/v1/namespaces/{NS}/events",
            deep(new_event, metadata__name="no-time", eventTime=None),
        ),
        _req(
            "event v1 cluster object",
            src,
            "POST",
            f"/apis/events.k8s.io/v1/namespaces/{NS}/events",
            deep(new_event, metadata__name="node", regarding={"kind": "Node", "name": "n"}),
        ),
        _req(
            "event v1 legacy fields",
            src,
            "POST",
            f"/apis/events.k8s.io/v1/namespaces/{NS}/events",
            deep(
                new_event,
                metadata__name="legacy",
                deprecatedCount=2,
                type="Odd",
                reportingController=None,
                action=None,
            ),
        ),
        _req(
            "event v1 get",
            src,
            "GET",
            f"/apis/events.k8s.io/v1/namespaces/{NS}/events/claim.allocated",
        ),
        _req("event core get of v1", src, "GET", _ns("events/claim.allocated")),
        # pods: the defaults, status patches, evictions
        _req(
            "pod create defaults",
            src,
            "POST",
            _ns("pods"),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "defaults"},
                "spec": {
                    "containers": [
                        {"name": "c", "image": "busybox"},
                        {"name": "d", "image": "registry.example/x:1.0"},
                    ]
                },
            },
        ),
        _req(
            "pod delete defaults",
            src,
            "DELETE",
            _ns("pods/defaults"),
            compare="code",
            query=(("gracePeriodSeconds", "0"),),
        ),
        _req(
            "pod create no automount",
            src,
            "POST",
            _ns("pods"),
            _pod(
                "plain",
                automountServiceAccountToken=False,
                restartPolicy="Never",
                terminationGracePeriodSeconds=5,
                dnsPolicy="Default",
                priority=0,
            ),
        ),
        _req("pod create", src, "POST", _ns("pods"), claim_pod),
        # a container may name one request of a claim, never a subrequest ("req/sub"):
        # the request must be a DNS label on every release
        _req(
            "pod create claim subrequest",
            src,
            "POST",
            _ns("pods"),
            deep(
                claim_pod,
                metadata__name="subrequest",
                spec__containers__0__resources__claims=[{"name": "gpu", "request": "gpu/sub"}],
            ),
        ),
        _req("pod get", src, "GET", _ns("pods/worker")),
        _req(
            "pod status condition",
            src,
            "PATCH",
            _ns("pods/worker/status"),
            {
                "status": {
                    "conditions": [
                        {
                            "type": "DRADevicesHealthy",
                            "status": "False",
                            "reason": "DeviceUnhealthy",
                            "message": "gpu-0",
                            "lastTransitionTime": "2026-01-02T03:04:05Z",
                        }
                    ]
                }
            },
            ctype=STRATEGIC,
        ),
        _req("pod status health", src, "PATCH", _ns("pods/worker/status"), health, ctype=STRATEGIC),
        _req(
            "pod status health bad name",
            src,
            "PATCH",
            _ns("pods/worker/status"),
            deep(
                health,
                status__containerStatuses=[
                    {
                        **health["status"]["containerStatuses"][0],
                        "allocatedResourcesStatus": [{"name": "claim:other", "resources": []}],
                    }
                ],
            ),
            ctype=STRATEGIC,
        ),
        _req(
            "pod status health bad value",
            src,
            "PATCH",
            _ns("pods/worker/status"),
            deep(
                health,
                status__containerStatuses=[
                    {
                        **health["status"]["containerStatuses"][0],
                        "allocatedResourcesStatus": [
                            {
                                "name": "claim:gpu",
                                "resources": [{"resourceID": "x", "health": "Sick"}],
                            }
                        ],
                    }
                ],
            ),
            ctype=STRATEGIC,
        ),
        _req(
            "pod update forbidden",
            src,
            "PATCH",
            _ns("pods/worker"),
            {"spec": {"restartPolicy": "Never"}},
            ctype=STRATEGIC,
        ),
        _req(
            "pod add toleration",
            src,
            "PATCH",
            _ns("pods/worker"),
            {
                "spec": {
                    "tolerations": [
                        {
                            "key": "drahealth.io/unhealthy",
                            "operator": "Exists",
                            "effect": "NoSchedule",
                        }
                    ]
                }
            },
            ctype=STRATEGIC,
        ),
        _req(
            "pod image update",
            src,
            "PATCH",
            _ns("pods/worker"),
            [
                {
                    "op": "replace",
                    "path": "/spec/containers/0/image",
                    "value": "registry.example/app:1.1",
                }
            ],
            ctype=JSONPATCH,
        ),
        _req(
            "pod claim name unknown",
            src,
            "POST",
            _ns("pods"),
            _pod(
                "bad-claim",
                containers=[
                    {"name": "c", "image": "x:1", "resources": {"claims": [{"name": "nope"}]}}
                ],
            ),
        ),
        _req(
            "pod list by scheduler",
            src,
            "GET",
            _ns("pods"),
            compare="names",
            query=(("fieldSelector", f"spec.schedulerName={SCHED}"),),
        ),
        _req(
            "pod evict",
            src,
            "POST",
            _ns("pods/plain/eviction"),
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": "plain", "namespace": NS},
            },
        ),
        _req(
            "pod evict missing",
            src,
            "POST",
            _ns("pods/missing/eviction"),
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": "missing", "namespace": NS},
            },
        ),
        _req(
            "pdb create",
            src,
            "POST",
            f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "guard"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "worker"}}},
            },
        ),
        _req(
            "pdb invalid",
            src,
            "POST",
            f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "bad"},
                "spec": {"minAvailable": 1, "maxUnavailable": 1},
            },
        ),
        # DRA: what the driver publishes and the controllers write
        _req(
            "deviceclass create",
            src,
            "POST",
            f"{DRA}/deviceclasses",
            _class("@P@-gpu", selectors=[{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]),
            dra=True,
        ),
        _req(
            "resourceslice create",
            src,
            "POST",
            f"{DRA}/resourceslices",
            _slice("@P@-node-a-slice"),
            dra=True,
        ),
        _req(
            "resourceslice update",
            src,
            "PUT",
            f"{DRA}/resourceslices/@P@-node-a-slice",
            deep(
                _slice("@P@-node-a-slice"),
                metadata__resourceVersion="@RV:ResourceSlice/@P@-node-a-slice@",
                spec__pool__generation=2,
            ),
            dra=True,
        ),
        _req(
            "resourceslice taints",
            src,
            "PATCH",
            f"{DRA}/resourceslices/@P@-node-a-slice",
            [
                {
                    "op": "add",
                    "path": "/spec/devices/1/taints",
                    "value": [{"key": "example.com/unhealthy", "effect": "NoExecute"}],
                }
            ],
            ctype=JSONPATCH,
            dra=True,
        ),
        _req(
            "resourceslice list by driver",
            src,
            "GET",
            f"{DRA}/resourceslices",
            compare="names",
            query=(("fieldSelector", f"spec.driver={DRIVER}"),),
            dra=True,
        ),
        _req(
            "resourceslice list by node",
            src,
            "GET",
            f"{DRA}/resourceslices",
            compare="names",
            query=(("fieldSelector", "spec.nodeName=@P@-node-a"),),
            dra=True,
        ),
        _req(
            "resourceslice watch",
            src,
            "GET",
            f"{DRA}/resourceslices",
            compare="watch",
            query=(
                ("watch", "1"),
                ("sendInitialEvents", "true"),
                ("resourceVersionMatch", "NotOlderThan"),
                ("allowWatchBookmarks", "true"),
                ("fieldSelector", f"spec.driver={DRIVER}"),
            ),
            dra=True,
        ),
        _req(
            "resourceclaim create",
            src,
            "POST",
            _dra_ns("resourceclaims"),
            _claim("claim-a"),
            dra=True,
        ),
        _req(
            "resourceclaim allocate",
            src,
            "PUT",
            _dra_ns("resourceclaims/claim-a/status"),
            deep(
                _claim("claim-a"),
                metadata__resourceVersion="@RV:ResourceClaim/claim-a@",
                status={
                    "allocation": _allocation(),
                    "reservedFor": [
                        {"resource": "pods", "name": "worker", "uid": "@UID:Pod/worker@"}
                    ],
                },
            ),
            dra=True,
        ),
        _req(
            "resourceclaim device status",
            src,
            "PATCH",
            _dra_ns("resourceclaims/claim-a/status"),
            device_status,
            ctype=JSONPATCH,
            dra=True,
            query=(("fieldManager", DRIVER),),
        ),
        _req("resourceclaim get", src, "GET", _dra_ns("resourceclaims/claim-a"), dra=True),
        _req(
            "resourceclaim spec immutable",
            src,
            "PATCH",
            _dra_ns("resourceclaims/claim-a"),
            {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": _exact(count=2)}]}}},
            ctype=MERGE,
            dra=True,
        ),
        _req(
            "resourceclaim allocation immutable",
            src,
            "PATCH",
            _dra_ns("resourceclaims/claim-a/status"),
            {"status": {"allocation": _allocation(device="gpu-1")}},
            ctype=MERGE,
            dra=True,
        ),
        _req(
            "resourceclaim deallocate",
            src,
            "PATCH",
            _dra_ns("resourceclaims/claim-a/status"),
            {"status": {"allocation": None, "reservedFor": None}},
            ctype=MERGE,
            dra=True,
        ),
        _req(
            "resourceclaimtemplate create",
            src,
            "POST",
            _dra_ns("resourceclaimtemplates"),
            _template("tmpl", meta={"labels": {"app": "worker"}}),
            dra=True,
        ),
        _req(
            "resourceclaimtemplate get",
            src,
            "GET",
            _dra_ns("resourceclaimtemplates/tmpl"),
            dra=True,
        ),
        _req(
            "devicetaintrule create",
            src,
            "POST",
            f"{DRA}/devicetaintrules",
            _rule("@P@-rule"),
            dra=True,
        ),
        _req(
            "devicetaintrule patch effect",
            src,
            "PATCH",
            f"{DRA}/devicetaintrules/@P@-rule",
            {"spec": {"taint": {"effect": "NoExecute"}}},
            ctype=MERGE,
            dra=True,
        ),
        _req(
            "devicetaintrule status",
            src,
            "PATCH",
            f"{DRA}/devicetaintrules/@P@-rule/status",
            {
                "status": {
                    "conditions": [
                        {
                            "type": "drahealth.io/Reviewed",
                            "status": "False",
                            "reason": "Completed",
                            "message": "",
                            "observedGeneration": 1,
                            "lastTransitionTime": "2026-01-02T03:04:05Z",
                        }
                    ]
                }
            },
            ctype=MERGE,
            dra=True,
        ),
        _req("devicetaintrule get", src, "GET", f"{DRA}/devicetaintrules/@P@-rule", dra=True),
        _req(
            "devicetaintrule list",
            src,
            "GET",
            f"{DRA}/devicetaintrules",
            compare="names",
            query=(("labelSelector", "missing-label"),),
            dra=True,
        ),
    ]


def kubectl_style_cases() -> list[Case]:
    """The requests kubectl sends for get (tables), apply (client- and server-side),
    patch (strategic, merge, JSON), scale, cordon, drain (evictions), auth can-i, explain."""
    src = "kubectl"
    agent = KUBECTL_AGENT
    last = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "applied", "namespace": NS},
            "data": {"a": "1"},
        }
    )
    applied = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "applied",
            "namespace": NS,
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": last + "\n"},
        },
        "data": {"a": "1"},
    }
    last2 = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "applied", "namespace": NS},
            "data": {"b": "2"},
        }
    )
    ssa = (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: {NS}\n"
        "data:\n  owner: kubectl\n  shared: one\n"
    )
    ssa_other = (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: {NS}\n"
        "data:\n  shared: two\n"
    )
    ssa_slice = (
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: @P@-ssa\n"
        f"spec:\n  driver: {DRIVER}\n  pool:\n    name: ssa\n    generation: 1\n"
        "    resourceSliceCount: 1\n  allNodes: true\n  devices:\n  - name: d0\n"
        "    attributes:\n      model:\n        string: a\n"
    )
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "replicas": 1,
            "paused": True,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "schedulerName": SCHED,
                    "containers": [{"name": "c", "image": "registry.example/web:1"}],
                },
            },
        },
    }
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": NS, "verb": "create", "resource": "pods"}},
    }
    evict = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "guarded", "namespace": NS},
    }
    running = {
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-02T03:04:05Z"}
            ],
        }
    }
    return [
        # get, get -o wide (tables)
        _req(
            "get configmap table",
            src,
            "GET",
            _ns("configmaps/history"),
            accept=TABLE,
            agent=agent,
            compare="table",
        ),
        _req(
            "get pods table",
            src,
            "GET",
            _ns("pods"),
            accept=TABLE,
            agent=agent,
            compare="table",
            query=(("labelSelector", "app=worker"),),
        ),
        _req(
            "get node table",
            src,
            "GET",
            f"{CORE}/nodes/@P@-node-a",
            accept=TABLE,
            agent=agent,
            compare="table",
        ),
        _req(
            "get resourceclaims table",
            src,
            "GET",
            _dra_ns("resourceclaims"),
            accept=TABLE,
            agent=agent,
            compare="table",
            dra=True,
        ),
        _req(
            "get resourceslices table",
            src,
            "GET",
            f"{DRA}/resourceslices",
            accept=TABLE,
            agent=agent,
            compare="table",
            dra=True,
            query=(("fieldSelector", f"spec.driver={DRIVER}"),),
        ),
        _req(
            "get deviceclass table",
            src,
            "GET",
            f"{DRA}/deviceclasses/@P@-gpu",
            accept=TABLE,
            agent=agent,
            compare="table",
            dra=True,
        ),
        _req(
            "get devicetaintrule table",
            src,
            "GET",
            f"{DRA}/devicetaintrules/@P@-rule",
            accept=TABLE,
            agent=agent,
            compare="table",
            dra=True,
        ),
        _req(
            "get template table",
            src,
            "GET",
            _dra_ns("resourceclaimtemplates"),
            accept=TABLE,
            agent=agent,
            compare="table",
            dra=True,
        ),
        _req("get missing table", src, "GET", _ns("pods/missing"), accept=TABLE, agent=agent),
        _req(
            "get events table",
            src,
            "GET",
            f"{CORE}/namespaces/default/events",
            accept=TABLE,
            agent=agent,
            compare="table",
            query=(("fieldSelector", "involvedObject.name=@P@-node-a,reason=DeviceUnhealthy"),),
        ),
        _req(
            "get leases table",
            src,
            "GET",
            f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases",
            accept=TABLE,
            agent=agent,
            compare="table",
        ),
        # client-side apply: create with the annotation, then a three-way strategic patch
        _req(
            "apply create",
            src,
            "POST",
            _ns("configmaps"),
            applied,
            agent=agent,
            query=(("fieldManager", "kubectl-client-side-apply"), ("fieldValidation", "Strict")),
        ),
        _req(
            "apply patch",
            src,
            "PATCH",
            _ns("configmaps/applied"),
            {
                "data": {"a": None, "b": "2"},
                "metadata": {
                    "annotations": {
                        "kubectl.kubernetes.io/last-applied-configuration": last2 + "\n"
                    }
                },
            },
            ctype=STRATEGIC,
            agent=agent,
            query=(("fieldManager", "kubectl-client-side-apply"), ("fieldValidation", "Strict")),
        ),
        # server-side apply
        _req(
            "ssa create",
            src,
            "PATCH",
            _ns("configmaps/ssa"),
            ssa,
            ctype=APPLY,
            agent=agent,
            query=(("fieldManager", "kubectl"), ("fieldValidation", "Strict")),
        ),
        _req(
            "ssa conflict",
            src,
            "PATCH",
            _ns("configmaps/ssa"),
            ssa_other,
            ctype=APPLY,
            agent=agent,
            query=(("fieldManager", "other"),),
        ),
        _req(
            "ssa force",
            src,
            "PATCH",
            _ns("configmaps/ssa"),
            ssa_other,
            ctype=APPLY,
            agent=agent,
            query=(("fieldManager", "other"), ("force", "true")),
        ),
        _req("ssa no manager", src, "PATCH", _ns("configmaps/ssa"), ssa_other, ctype=APPLY),
        _req(
            "ssa reapply drops",
            src,
            "PATCH",
            _ns("configmaps/ssa"),
            f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: {NS}\n",
            ctype=APPLY,
            query=(("fieldManager", "kubectl"),),
        ),
        _req(
            "ssa wrong kind",
            src,
            "PATCH",
            _ns("configmaps/ssa"),
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ssa\n",
            ctype=APPLY,
            query=(("fieldManager", "kubectl"),),
        ),
        _req(
            "ssa bad yaml",
            src,
            "PATCH",
            _ns("configmaps/ssa"),
            "a: [",
            ctype=APPLY,
            query=(("fieldManager", "kubectl"),),
        ),
        _req(
            "ssa resourceslice",
            src,
            "PATCH",
            f"{DRA}/resourceslices/@P@-ssa",
            ssa_slice,
            ctype=APPLY,
            query=(("fieldManager", "kubectl"),),
            dra=True,
        ),
        _req(
            "ssa resourceslice dry run",
            src,
            "PATCH",
            f"{DRA}/resourceslices/@P@-ssa",
            ssa_slice.replace("string: a", "string: b"),
            ctype=APPLY,
            dra=True,
            query=(("fieldManager", "kubectl"), ("dryRun", "All")),
        ),
        _req("ssa resourceslice get", src, "GET", f"{DRA}/resourceslices/@P@-ssa", dra=True),
        # patches
        _req(
            "strategic patch labels",
            src,
            "PATCH",
            _ns("configmaps/history"),
            {"metadata": {"labels": {"tier": "ops"}}},
            ctype=STRATEGIC,
            agent=agent,
        ),
        _req(
            "json patch",
            src,
            "PATCH",
            _ns("configmaps/history"),
            [
                {"op": "add", "path": "/data/node-c", "value": "[]"},
                {"op": "remove", "path": "/metadata/labels/tier"},
            ],
            ctype=JSONPATCH,
            agent=agent,
        ),
        _req(
            "json patch test fails",
            src,
            "PATCH",
            _ns("configmaps/history"),
            [{"op": "test", "path": "/data/node-c", "value": "nope"}],
            ctype=JSONPATCH,
        ),
        _req(
            "json patch bad path",
            src,
            "PATCH",
            _ns("configmaps/history"),
            [{"op": "remove", "path": "/data/absent"}],
            ctype=JSONPATCH,
        ),
        _req("merge patch not object", src, "PATCH", _ns("configmaps/history"), "[1]", ctype=MERGE),
        _req(
            "patch bad content type",
            src,
            "PATCH",
            _ns("configmaps/history"),
            {"data": {}},
            ctype="text/plain",
        ),
        _req("patch missing", src, "PATCH", _ns("configmaps/nope"), {"data": {}}, ctype=MERGE),
        _req(
            "label invalid",
            src,
            "PATCH",
            _ns("configmaps/history"),
            {"metadata": {"labels": {"bad key!": "x"}}},
            ctype=MERGE,
        ),
        _req(
            "strict unknown field",
            src,
            "POST",
            _ns("configmaps"),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "strict"},
                "data": {},
                "bogus": 1,
            },
            query=(("fieldValidation", "Strict"),),
        ),
        _req(
            "warn unknown field",
            src,
            "POST",
            _ns("configmaps"),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "warned"}, "bogus": 1},
        ),
        _req(
            "generate name",
            src,
            "POST",
            _ns("configmaps"),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "gen-"}},
        ),
        _req(
            "dry run create",
            src,
            "POST",
            _ns("configmaps"),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dry"}},
            query=(("dryRun", "All"),),
        ),
        _req("dry run not stored", src, "GET", _ns("configmaps/dry")),
        _req(
            "immutable configmap",
            src,
            "POST",
            _ns("configmaps"),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "frozen"},
                "data": {"k": "v"},
                "immutable": True,
            },
        ),
        _req(
            "immutable configmap change",
            src,
            "PATCH",
            _ns("configmaps/frozen"),
            {"data": {"k": "w"}},
            ctype=MERGE,
        ),
        _req("list limit", src, "GET", _ns("configmaps"), compare="names", query=(("limit", "2"),)),
        _req(
            "wrong kind body",
            src,
            "POST",
            _ns("configmaps"),
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}},
        ),
        _req(
            "namespace mismatch",
            src,
            "POST",
            _ns("configmaps"),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "x", "namespace": "other"},
            },
        ),
        _req("unknown resource", src, "GET", _ns("widgets")),
        _req("malformed json", src, "POST", _ns("configmaps"), "{not json"),
        # scale subresource
        _req(
            "deployment create",
            src,
            "POST",
            f"/apis/apps/v1/namespaces/{NS}/deployments",
            deploy,
            compare="code",
        ),
        _req("scale get", src, "GET", f"/apis/apps/v1/namespaces/{NS}/deployments/web/scale"),
        _req(
            "scale patch",
            src,
            "PATCH",
            f"/apis/apps/v1/namespaces/{NS}/deployments/web/scale",
            {"spec": {"replicas": 3}},
            ctype=MERGE,
        ),
        _req(
            "scale put",
            src,
            "PUT",
            f"/apis/apps/v1/namespaces/{NS}/deployments/web/scale",
            {
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {"name": "web", "namespace": NS},
                "spec": {"replicas": 2},
            },
        ),
        _req(
            "scale negative",
            src,
            "PATCH",
            f"/apis/apps/v1/namespaces/{NS}/deployments/web/scale",
            {"spec": {"replicas": -1}},
            ctype=MERGE,
        ),
        _req(
            "deployment invalid selector",
            src,
            "POST",
            f"/apis/apps/v1/namespaces/{NS}/deployments",
            deep(deploy, metadata__name="bad", spec__selector={"matchLabels": {"app": "x"}}),
        ),
        # cordon / drain: evictions under a disruption budget
        _req(
            "cordon",
            src,
            "PATCH",
            f"{CORE}/nodes/@P@-node-a",
            {"spec": {"unschedulable": True}},
            ctype=STRATEGIC,
            agent=agent,
        ),
        _req(
            "uncordon",
            src,
            "PATCH",
            f"{CORE}/nodes/@P@-node-a",
            {"spec": {"unschedulable": None}},
            ctype=STRATEGIC,
            agent=agent,
        ),
        _req(
            "drain pod create",
            src,
            "POST",
            _ns("pods"),
            _pod("guarded", automountServiceAccountToken=False),
        ),
        _req(
            "drain pod running", src, "PATCH", _ns("pods/guarded/status"), running, ctype=STRATEGIC
        ),
        _req(
            "drain pdb",
            src,
            "POST",
            f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "guarded"},
                "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}},
            },
            compare="code",
        ),
        _req("drain evict blocked", src, "POST", _ns("pods/guarded/eviction"), evict),
        _req(
            "drain evict dry run",
            src,
            "POST",
            _ns("pods/worker/eviction"),
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": "worker", "namespace": NS},
                "deleteOptions": {"dryRun": ["All"]},
            },
        ),
        _req(
            "drain evict wrong name",
            src,
            "POST",
            _ns("pods/guarded/eviction"),
            deep(evict, metadata__name="other"),
        ),
        # auth can-i
        _req(
            "auth can-i",
            src,
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            review,
            agent=agent,
        ),
        _req(
            "auth can-i nonresource",
            src,
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}},
            },
        ),
        _req(
            "auth can-i invalid",
            src,
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {},
            },
        ),
        # discovery and explain (OpenAPI v3)
        _req("discovery resource.k8s.io", src, "GET", DRA, dra=True),
        _req("discovery group", src, "GET", "/apis/resource.k8s.io", dra=True),
        _req(
            "explain resource.k8s.io",
            src,
            "GET",
            "/openapi/v3/apis/resource.k8s.io/v1",
            compare="schema",
            dra=True,
            schemas=(
                "io.k8s.api.resource.v1.ResourceSlice",
                "io.k8s.api.resource.v1.ResourceSliceSpec",
                "io.k8s.api.resource.v1.Device",
                "io.k8s.api.resource.v1.ResourceClaim",
                "io.k8s.api.resource.v1.ResourceClaimStatus",
                "io.k8s.api.resource.v1.ExactDeviceRequest",
                "io.k8s.api.resource.v1.DeviceClassSpec",
                "io.k8s.api.resource.v1.DeviceTaintRuleSpec",
                "io.k8s.api.resource.v1.DeviceTaint",
                "io.k8s.api.resource.v1.AllocatedDeviceStatus",
            ),
        ),
        _req(
            "explain core",
            src,
            "GET",
            "/openapi/v3/api/v1",
            compare="schema",
            schemas=(
                "io.k8s.api.core.v1.Pod",
                "io.k8s.api.core.v1.PodSpec",
                "io.k8s.api.core.v1.ContainerStatus",
                "io.k8s.api.core.v1.ResourceHealth",
                "io.k8s.api.core.v1.Node",
                "io.k8s.api.core.v1.ConfigMap",
            ),
        ),
        # deletes
        _req("delete configmap", src, "DELETE", _ns("configmaps/applied"), agent=agent),
        _req("delete configmap missing", src, "DELETE", _ns("configmaps/applied")),
        _req(
            "delete precondition",
            src,
            "DELETE",
            _ns("configmaps/history"),
            {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "nope"}},
        ),
        _req(
            "delete pod",
            src,
            "DELETE",
            _ns("pods/worker"),
            compare="code",
            query=(("gracePeriodSeconds", "0"),),
        ),
        _req(
            "delete claim",
            src,
            "DELETE",
            _dra_ns("resourceclaims/claim-a"),
            dra=True,
            compare="code",
        ),
        _req(
            "delete collection",
            src,
            "DELETE",
            _ns("configmaps"),
            compare="code",
            query=(("labelSelector", "tier=none"),),
        ),
    ]


def kubectl_binary_cases() -> list[Case]:
    """The real kubectl binary against both servers (stdout, exit code, error reason)."""
    src = "kubectl-binary"
    cm = (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kctl\n  namespace: {NS}\n"
        "data:\n  a: '1'\n"
    )
    claim = (
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: kctl-claim\n"
        "spec:\n  devices:\n    requests:\n    - name: gpu\n      exactly:\n"
        "        deviceClassName: @P@-gpu\n        allocationMode: All\n"
    )

    def k(id: str, *args: str, stdin: str | None = None, dra: bool = False) -> Kubectl:
        return Kubectl(id=id, source=src, args=args, stdin=stdin, dra=dra)

    return [
        k("kubectl get -o json", "get", "configmap", "history", "-o", "json"),
        k("kubectl get node -o wide", "get", "node", "@P@-node-a", "-o", "wide"),
        k(
            "kubectl get slices -o wide",
            "get",
            "resourceslices",
            "-o",
            "wide",
            f"--field-selector=spec.driver={DRIVER}",
            dra=True,
        ),
        k("kubectl get claims", "get", "resourceclaims", dra=True),
        k("kubectl get deviceclass", "get", "deviceclass", "@P@-gpu", dra=True),
        k(
            "kubectl get devicetaintrule -o yaml",
            "get",
            "devicetaintrule",
            "@P@-rule",
            "-o",
            "json",
            dra=True,
        ),
        k("kubectl get missing", "get", "configmap", "missing"),
        k("kubectl apply create", "apply", "-f", "-", stdin=cm),
        k("kubectl apply configure", "apply", "-f", "-", stdin=cm.replace("'1'", "'2'")),
        k("kubectl apply server-side", "apply", "--server-side", "-f", "-", stdin=claim, dra=True),
        k(
            "kubectl get applied claim",
            "get",
            "resourceclaim",
            "kctl-claim",
            "-o",
            "json",
            dra=True,
        ),
        k("kubectl label", "label", "configmap", "kctl", "tier=ops"),
        k("kubectl annotate", "annotate", "configmap", "kctl", "note=x"),
        k(
            "kubectl patch json",
            "patch",
            "configmap",
            "kctl",
            "--type=json",
            "-p",
            '[{"op":"replace","path":"/data/a","value":"3"}]',
        ),
        k(
            "kubectl patch merge",
            "patch",
            "configmap",
            "kctl",
            "--type=merge",
            "-p",
            '{"data":{"b":"4"}}',
        ),
        k("kubectl cordon", "cordon", "@P@-node-a"),
        k("kubectl uncordon", "uncordon", "@P@-node-a"),
        k("kubectl drain", "drain", "@P@-node-a", "--ignore-daemonsets", "--timeout=10s"),
        k(
            "kubectl auth can-i",
            "auth",
            "can-i",
            "create",
            "resourceclaims.resource.k8s.io",
            dra=True,
        ),
        k("kubectl scale", "scale", "deployment", "web", "--replicas=1"),
        k("kubectl explain", "explain", "resourceslice.spec.pool", dra=True),
        k("kubectl delete", "delete", "configmap", "kctl"),
        k("kubectl delete claim", "delete", "resourceclaim", "kctl-claim", dra=True),
    ]


def lightkube_cases() -> list[Case]:
    """lightkube's typed calls (what drahealth.kube builds on)."""
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.coordination_v1 import Lease
    from lightkube.resources.core_v1 import ConfigMap, Node
    from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
    from lightkube.types import PatchType

    src = "lightkube"

    async def get_cm(c: AsyncClient, ctx: Context) -> Any:
        return await c.get(ConfigMap, "history", namespace=ctx.namespace)

    async def list_nodes(c: AsyncClient, ctx: Context) -> Any:
        return [n async for n in c.list(Node, labels={"drahealth.example/run": ctx.prefix})]

    async def create_lease(c: AsyncClient, ctx: Context) -> Any:
        lease = Lease(
            metadata=ObjectMeta(name="lk", namespace=ctx.namespace),
            spec={"holderIdentity": "lk", "leaseDurationSeconds": 15},
        )  # type: ignore[arg-type]
        return await c.create(lease)

    async def patch_lease(c: AsyncClient, ctx: Context) -> Any:
        return await c.patch(
            Lease,
            "lk",
            {"spec": {"leaseTransitions": 1}},
            namespace=ctx.namespace,
            patch_type=PatchType.MERGE,
        )

    async def apply_claim(c: AsyncClient, ctx: Context) -> Any:
        body = _claim("lk-claim")
        body["metadata"]["namespace"] = ctx.namespace
        body["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = f"{ctx.prefix}-gpu"
        return await c.apply(ResourceClaim.from_dict(body), field_manager="drahealth")

    async def get_slice(c: AsyncClient, ctx: Context) -> Any:
        return await c.get(ResourceSlice, f"{ctx.prefix}-node-a-slice")

    async def list_slices(c: AsyncClient, ctx: Context) -> Any:
        return [
            s
            async for s in c.list(
                ResourceSlice, fields={"spec.driver": f"{ctx.prefix}.example.com"}
            )
        ]

    async def delete_lease(c: AsyncClient, ctx: Context) -> Any:
        await c.delete(Lease, "lk", namespace=ctx.namespace)
        return "deleted"

    async def get_missing(c: AsyncClient, ctx: Context) -> Any:
        return await c.get(ConfigMap, "missing", namespace=ctx.namespace)

    async def bad_node(c: AsyncClient, ctx: Context) -> Any:
        return await c.create(Node(metadata=ObjectMeta(name="Bad_Node")))

    async def delete_claim(c: AsyncClient, ctx: Context) -> Any:
        await c.delete(ResourceClaim, "lk-claim", namespace=ctx.namespace)
        return "deleted"

    def lk(
        id: str, call: Callable[[AsyncClient, Context], Awaitable[Any]], dra: bool = False
    ) -> Lightkube:
        return Lightkube(id=id, source=src, call=call, dra=dra)

    return [
        lk("lightkube get", get_cm),
        lk("lightkube list labels", list_nodes),
        lk("lightkube create", create_lease),
        lk("lightkube patch", patch_lease),
        lk("lightkube apply claim", apply_claim, dra=True),
        lk("lightkube get slice", get_slice, dra=True),
        lk("lightkube list fields", list_slices, dra=True),
        lk("lightkube delete", delete_lease),
        lk("lightkube get missing", get_missing),
        lk("lightkube create invalid", bad_node),
        lk("lightkube delete claim", delete_claim, dra=True),
    ]


def _mut(obj: JSON, fn: Callable[[JSON], Any]) -> JSON:
    out = copy.deepcopy(obj)
    fn(out)
    return out


def _devs(o: JSON) -> list[JSON]:
    devices: list[JSON] = o["spec"]["devices"]
    return devices


def _set(d: JSON, **kv: Any) -> None:
    for k, v in kv.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v


def _many(n: int, **extra: Any) -> list[JSON]:
    return [{"name": f"d{i}", **extra} for i in range(n)]


def slice_validation() -> list[tuple[str, JSON]]:
    """One invalid ResourceSlice per rule of the embedded server's validation."""
    s = _slice("@P@-v")
    d0 = lambda o: _devs(o)[0]  # noqa: E731
    long_name = "a" * 64
    return [
        ("driver missing", _mut(s, lambda o: o["spec"].pop("driver"))),
        ("driver too long", _mut(s, lambda o: _set(o["spec"], driver="d" * 60 + ".example.com"))),
        ("driver invalid", _mut(s, lambda o: _set(o["spec"], driver="bad_driver!"))),
        ("driver uppercase", _mut(s, lambda o: _set(o["spec"], driver="GPU.Example.com"))),
        ("pool name missing", _mut(s, lambda o: o["spec"]["pool"].pop("name"))),
        ("pool name too long", _mut(s, lambda o: _set(o["spec"]["pool"], name="a." * 127 + "a"))),
        ("pool name invalid", _mut(s, lambda o: _set(o["spec"]["pool"], name="Pool_A"))),
        ("pool name empty part", _mut(s, lambda o: _set(o["spec"]["pool"], name="a//b"))),
        ("pool count zero", _mut(s, lambda o: _set(o["spec"]["pool"], resourceSliceCount=0))),
        ("pool generation negative", _mut(s, lambda o: _set(o["spec"]["pool"], generation=-1))),
        ("node name invalid", _mut(s, lambda o: _set(o["spec"], nodeName="Node_A"))),
        ("node name empty", _mut(s, lambda o: _set(o["spec"], nodeName=""))),
        ("no node selection", _mut(s, lambda o: o["spec"].pop("nodeName"))),
        ("two node selections", _mut(s, lambda o: _set(o["spec"], allNodes=True))),
        (
            "node selector and name",
            _mut(
                s,
                lambda o: _set(
                    o["spec"],
                    nodeSelector={
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]}
                        ]
                    },
                ),
            ),
        ),
        (
            "node selector invalid",
            _mut(
                s,
                lambda o: (
                    o["spec"].pop("nodeName"),
                    _set(
                        o["spec"],
                        nodeSelector={
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "a", "operator": "Bogus", "values": ["b"]}
                                    ]
                                }
                            ]
                        },
                    ),
                ),
            ),
        ),
        (
            "counters and devices",
            _mut(
                s,
                lambda o: _set(
                    o["spec"],
                    sharedCounters=[{"name": "mem", "counters": {"memory": {"value": "1Gi"}}}],
                ),
            ),
        ),
        ("too many devices", _mut(s, lambda o: _set(o["spec"], devices=_many(129)))),
        (
            "too many tainted devices",
            _mut(
                s,
                lambda o: _set(
                    o["spec"], devices=_many(65, taints=[{"key": "k", "effect": "NoSchedule"}])
                ),
            ),
        ),
        ("device name missing", _mut(s, lambda o: d0(o).pop("name"))),
        ("device name invalid", _mut(s, lambda o: _set(d0(o), name="GPU_0"))),
        ("device name too long", _mut(s, lambda o: _set(d0(o), name=long_name))),
        ("device duplicate", _mut(s, lambda o: _set(_devs(o)[1], name="gpu-0"))),
        (
            "too many attributes",
            _mut(
                s,
                lambda o: _set(
                    d0(o),
                    attributes={f"a{i}": {"int": i} for i in range(30)},
                    capacity={f"c{i}": {"value": "1"} for i in range(3)},
                ),
            ),
        ),
        ("attribute name invalid", _mut(s, lambda o: _set(d0(o), attributes={"1abc": {"int": 1}}))),
        (
            "attribute domain invalid",
            _mut(s, lambda o: _set(d0(o), attributes={"Bad_Domain/x": {"int": 1}})),
        ),
        ("attribute domain empty", _mut(s, lambda o: _set(d0(o), attributes={"/x": {"int": 1}}))),
        (
            "attribute name empty",
            _mut(s, lambda o: _set(d0(o), attributes={"example.com/": {"int": 1}})),
        ),
        (
            "attribute name too long",
            _mut(s, lambda o: _set(d0(o), attributes={"a" * 33: {"int": 1}})),
        ),
        ("attribute no value", _mut(s, lambda o: _set(d0(o), attributes={"a": {}}))),
        (
            "attribute two values",
            _mut(s, lambda o: _set(d0(o), attributes={"a": {"int": 1, "string": "x"}})),
        ),
        (
            "attribute bad version",
            _mut(s, lambda o: _set(d0(o), attributes={"v": {"version": "1.2"}})),
        ),
        (
            "attribute string too long",
            _mut(s, lambda o: _set(d0(o), attributes={"s": {"string": "x" * 65}})),
        ),
        ("attribute wrong type", _mut(s, lambda o: _set(d0(o), attributes={"i": {"int": "one"}}))),
        (
            "capacity name invalid",
            _mut(s, lambda o: _set(d0(o), capacity={"bad-name": {"value": "1"}})),
        ),
        (
            "capacity bad quantity",
            _mut(s, lambda o: _set(d0(o), capacity={"mem": {"value": "lots"}})),
        ),
        (
            "too many device taints",
            _mut(
                s,
                lambda o: _set(
                    d0(o), taints=[{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)]
                ),
            ),
        ),
        ("taint key missing", _mut(s, lambda o: _set(d0(o), taints=[{"effect": "NoSchedule"}]))),
        (
            "taint key invalid",
            _mut(s, lambda o: _set(d0(o), taints=[{"key": "bad key", "effect": "NoSchedule"}])),
        ),
        (
            "taint value invalid",
            _mut(
                s,
                lambda o: _set(
                    d0(o), taints=[{"key": "k", "value": "bad value!", "effect": "NoSchedule"}]
                ),
            ),
        ),
        ("taint effect missing", _mut(s, lambda o: _set(d0(o), taints=[{"key": "k"}]))),
        (
            "taint effect invalid",
            _mut(s, lambda o: _set(d0(o), taints=[{"key": "k", "effect": "Sometimes"}])),
        ),
        (
            "taint effect none",
            _mut(s, lambda o: _set(d0(o), taints=[{"key": "k", "effect": "None"}])),
        ),
        (
            "too many counter consumptions",
            _mut(
                s,
                lambda o: _set(
                    d0(o),
                    consumesCounters=[
                        {"counterSet": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(3)
                    ],
                ),
            ),
        ),
        (
            "counter set name invalid",
            _mut(
                s,
                lambda o: _set(
                    d0(o),
                    consumesCounters=[{"counterSet": "Bad_Set", "counters": {"c": {"value": "1"}}}],
                ),
            ),
        ),
        (
            "counter set name missing",
            _mut(s, lambda o: _set(d0(o), consumesCounters=[{"counters": {"c": {"value": "1"}}}])),
        ),
        (
            "consumed counters empty",
            _mut(s, lambda o: _set(d0(o), consumesCounters=[{"counterSet": "s", "counters": {}}])),
        ),
        (
            "consumed counter name invalid",
            _mut(
                s,
                lambda o: _set(
                    d0(o),
                    consumesCounters=[{"counterSet": "s", "counters": {"Bad_C": {"value": "1"}}}],
                ),
            ),
        ),
        (
            "consumed counters too many",
            _mut(
                s,
                lambda o: _set(
                    d0(o),
                    consumesCounters=[
                        {
                            "counterSet": "s",
                            "counters": {f"c{i}": {"value": "1"} for i in range(33)},
                        }
                    ],
                ),
            ),
        ),
        ("device node without per-device", _mut(s, lambda o: _set(d0(o), nodeName="n"))),
        ("device all nodes without per-device", _mut(s, lambda o: _set(d0(o), allNodes=True))),
        (
            "device node name invalid",
            _mut(
                s,
                lambda o: (
                    o["spec"].pop("nodeName"),
                    _set(o["spec"], perDeviceNodeSelection=True),
                    _set(d0(o), nodeName="Bad_Node"),
                ),
            ),
        ),
        (
            "per-device without node",
            _mut(
                s,
                lambda o: (o["spec"].pop("nodeName"), _set(o["spec"], perDeviceNodeSelection=True)),
            ),
        ),
        (
            "too many binding conditions",
            _mut(
                s,
                lambda o: _set(
                    d0(o),
                    bindingConditions=[f"c{i}" for i in range(5)],
                    bindingFailureConditions=["f"],
                ),
            ),
        ),
        (
            "binding condition invalid",
            _mut(
                s,
                lambda o: _set(
                    d0(o), bindingConditions=["bad cond"], bindingFailureConditions=["f"]
                ),
            ),
        ),
        ("binding conditions alone", _mut(s, lambda o: _set(d0(o), bindingConditions=["ok"]))),
        (
            "too many counter sets",
            _mut(
                s,
                lambda o: (
                    o["spec"].pop("devices"),
                    _set(
                        o["spec"],
                        sharedCounters=[
                            {"name": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(9)
                        ],
                    ),
                ),
            ),
        ),
        (
            "counter set missing name",
            _mut(
                s,
                lambda o: (
                    o["spec"].pop("devices"),
                    _set(o["spec"], sharedCounters=[{"counters": {"c": {"value": "1"}}}]),
                ),
            ),
        ),
        (
            "counter set bad name",
            _mut(
                s,
                lambda o: (
                    o["spec"].pop("devices"),
                    _set(
                        o["spec"],
                        sharedCounters=[{"name": "Bad", "counters": {"c": {"value": "1"}}}],
                    ),
                ),
            ),
        ),
        (
            "counter set no counters",
            _mut(
                s,
                lambda o: (
                    o["spec"].pop("devices"),
                    _set(o["spec"], sharedCounters=[{"name": "s", "counters": {}}]),
                ),
            ),
        ),
        (
            "counter set duplicate",
            _mut(
                s,
                lambda o: (
                    o["spec"].pop("devices"),
                    _set(
                        o["spec"],
                        sharedCounters=[
                            {"name": "s", "counters": {"c": {"value": "1"}}},
                            {"name": "s", "counters": {"c": {"value": "1"}}},
                        ],
                    ),
                ),
            ),
        ),
        ("unknown field", _mut(s, lambda o: _set(o["spec"], bogus=True))),
        ("wrong type", _mut(s, lambda o: _set(o["spec"], devices="gpu-0"))),
        ("name invalid", _mut(s, lambda o: _set(o["metadata"], name="@P@-Bad_Name"))),
        ("label invalid", _mut(s, lambda o: _set(o["metadata"], labels={"a": "bad value!"}))),
    ]


def claim_validation() -> list[tuple[str, JSON]]:
    """One invalid ResourceClaim spec per rule (see also :func:`claim_status_validation`)."""

    def c(devices: JSON) -> JSON:
        return _claim("v", devices)

    def one(**exact: Any) -> JSON:
        return c({"requests": [{"name": "gpu", "exactly": _exact(**exact)}]})

    def cel(expr: str) -> JSON:
        return one(selectors=[{"cel": {"expression": expr}}])

    def tol(**t: Any) -> JSON:
        return one(tolerations=[t])

    sub = {"name": "a", "deviceClassName": "@P@-gpu"}
    gpu = {"name": "gpu", "exactly": _exact()}
    return [
        (
            "too many requests",
            c({"requests": [{"name": f"r{i}", "exactly": _exact()} for i in range(33)]}),
        ),
        ("request name missing", c({"requests": [{"exactly": _exact()}]})),
        ("request name invalid", c({"requests": [{"name": "GPU", "exactly": _exact()}]})),
        ("request duplicate", c({"requests": [gpu, gpu]})),
        ("request empty", c({"requests": [{"name": "gpu"}]})),
        (
            "request both",
            c({"requests": [{"name": "gpu", "exactly": _exact(), "firstAvailable": [sub]}]}),
        ),
        (
            "too many subrequests",
            c(
                {
                    "requests": [
                        {
                            "name": "gpu",
                            "firstAvailable": [{**sub, "name": f"s{i}"} for i in range(9)],
                        }
                    ]
                }
            ),
        ),
        (
            "subrequest name missing",
            c({"requests": [{"name": "gpu", "firstAvailable": [{"deviceClassName": "@P@-gpu"}]}]}),
        ),
        (
            "subrequest name invalid",
            c({"requests": [{"name": "gpu", "firstAvailable": [{**sub, "name": "A_B"}]}]}),
        ),
        ("subrequest duplicate", c({"requests": [{"name": "gpu", "firstAvailable": [sub, sub]}]})),
        (
            "subrequest class missing",
            c({"requests": [{"name": "gpu", "firstAvailable": [{"name": "a"}]}]}),
        ),
        ("class missing", c({"requests": [{"name": "gpu", "exactly": {}}]})),
        ("class invalid", one(deviceClassName="Bad_Class")),
        ("too many selectors", one(selectors=[{"cel": {"expression": "true"}}] * 33)),
        ("selector without cel", one(selectors=[{}])),
        ("cel empty", cel("")),
        ("cel syntax", cel("device.driver ==")),
        ("cel type", cel("device.driver == 1")),
        ("cel not bool", cel("device.driver")),
        ("cel unknown variable", cel("devices.driver == 'x'")),
        ("cel too long", cel("true && " * 1300 + "true")),
        ("all with count", one(allocationMode="All", count=2)),
        ("count negative", one(count=-1)),
        ("mode unsupported", one(allocationMode="Some")),
        ("too many tolerations", one(tolerations=[{"operator": "Exists"}] * 17)),
        ("toleration key invalid", tol(key="bad key", operator="Exists")),
        ("toleration exists value", tol(key="k", operator="Exists", value="v")),
        ("toleration value invalid", tol(key="k", operator="Equal", value="bad value!")),
        ("toleration operator", tol(key="k", operator="Like")),
        ("toleration effect", tol(key="k", operator="Exists", effect="Sometimes")),
        (
            "too many constraints",
            c({"requests": [gpu], "constraints": [{"matchAttribute": "example.com/a"}] * 33}),
        ),
        (
            "constraint unknown request",
            c(
                {
                    "requests": [gpu],
                    "constraints": [{"requests": ["nope"], "matchAttribute": "example.com/a"}],
                }
            ),
        ),
        (
            "constraint duplicate request",
            c(
                {
                    "requests": [gpu],
                    "constraints": [
                        {"requests": ["gpu", "gpu"], "matchAttribute": "example.com/a"}
                    ],
                }
            ),
        ),
        (
            "constraint bad ref",
            c(
                {
                    "requests": [gpu],
                    "constraints": [{"requests": ["gpu/a/b"], "matchAttribute": "example.com/a"}],
                }
            ),
        ),
        ("constraint no attribute", c({"requests": [gpu], "constraints": [{}]})),
        (
            "constraint attribute no domain",
            c({"requests": [gpu], "constraints": [{"matchAttribute": "model"}]}),
        ),
        (
            "constraint attribute empty domain",
            c({"requests": [gpu], "constraints": [{"matchAttribute": "/model"}]}),
        ),
        (
            "constraint attribute bad ident",
            c({"requests": [gpu], "constraints": [{"matchAttribute": "example.com/1x"}]}),
        ),
        (
            "constraint attribute two slashes",
            c({"requests": [gpu], "constraints": [{"matchAttribute": "a/b/c"}]}),
        ),
        (
            "constraint distinct invalid",
            c({"requests": [gpu], "constraints": [{"distinctAttribute": "model"}]}),
        ),
        (
            "too many configs",
            c(
                {
                    "requests": [gpu],
                    "config": [{"opaque": {"driver": DRIVER, "parameters": {}}}] * 33,
                }
            ),
        ),
        ("config no opaque", c({"requests": [gpu], "config": [{}]})),
        (
            "config driver missing",
            c({"requests": [gpu], "config": [{"opaque": {"parameters": {}}}]}),
        ),
        (
            "config driver invalid",
            c(
                {
                    "requests": [gpu],
                    "config": [{"opaque": {"driver": "Bad_Driver", "parameters": {}}}],
                }
            ),
        ),
        (
            "config parameters missing",
            c({"requests": [gpu], "config": [{"opaque": {"driver": DRIVER}}]}),
        ),
        (
            "config parameters not object",
            c(
                {
                    "requests": [gpu],
                    "config": [{"opaque": {"driver": DRIVER, "parameters": [1, 2]}}],
                }
            ),
        ),
        (
            "config parameters too large",
            c(
                {
                    "requests": [gpu],
                    "config": [{"opaque": {"driver": DRIVER, "parameters": {"x": "y" * 10240}}}],
                }
            ),
        ),
        (
            "config unknown request",
            c(
                {
                    "requests": [gpu],
                    "config": [
                        {"requests": ["nope"], "opaque": {"driver": DRIVER, "parameters": {}}}
                    ],
                }
            ),
        ),
        ("admin access denied", one(adminAccess=True)),
        ("unknown field", _mut(one(), lambda o: _set(o["spec"], bogus=1))),
        ("wrong type", one(count="two")),
        ("no requests", c({})),
    ]


def claim_status_validation() -> list[tuple[str, JSON]]:
    """Invalid ``status`` writes of the allocated claim ``status-claim`` (merge patches)."""
    alloc = _allocation()
    dev = {"driver": DRIVER, "pool": "node-a", "device": "gpu-0"}
    cond = {
        "type": "Ready",
        "status": "True",
        "reason": "Ok",
        "message": "",
        "lastTransitionTime": "2026-01-02T03:04:05Z",
    }

    def devices(*entries: JSON) -> JSON:
        return {"status": {"devices": list(entries)}}

    return [
        (
            "reserved without allocation",
            {
                "status": {
                    "allocation": None,
                    "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}],
                }
            },
        ),
        ("reserved incomplete", {"status": {"reservedFor": [{"resource": "pods"}]}}),
        (
            "reserved duplicate",
            {
                "status": {
                    "reservedFor": [
                        {"resource": "pods", "name": "p", "uid": "u1"},
                        {"resource": "pods", "name": "q", "uid": "u1"},
                    ]
                }
            },
        ),
        (
            "too many reserved",
            {
                "status": {
                    "reservedFor": [
                        {"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(257)
                    ]
                }
            },
        ),
        ("allocation changed", {"status": {"allocation": _allocation(device="gpu-1")}}),
        ("device not allocated", devices({**dev, "device": "gpu-1"})),
        ("device duplicate", devices(dev, dev)),
        ("device driver missing", devices({"pool": "node-a", "device": "gpu-0"})),
        ("device pool invalid", devices({**dev, "pool": "Bad_Pool"})),
        ("device name invalid", devices({**dev, "device": "GPU"})),
        (
            "too many conditions",
            devices({**dev, "conditions": [{**cond, "type": f"T{i}"} for i in range(9)]}),
        ),
        ("condition type duplicate", devices({**dev, "conditions": [cond, cond]})),
        ("condition type invalid", devices({**dev, "conditions": [{**cond, "type": "a b"}]})),
        ("condition status invalid", devices({**dev, "conditions": [{**cond, "status": "Yes"}]})),
        (
            "condition generation negative",
            devices({**dev, "conditions": [{**cond, "observedGeneration": -1}]}),
        ),
        (
            "condition time missing",
            devices(
                {
                    **dev,
                    "conditions": [{k: v for k, v in cond.items() if k != "lastTransitionTime"}],
                }
            ),
        ),
        ("condition reason missing", devices({**dev, "conditions": [{**cond, "reason": ""}]})),
        ("condition reason invalid", devices({**dev, "conditions": [{**cond, "reason": "1 x"}]})),
        ("data not object", devices({**dev, "data": [1]})),
        ("data too large", devices({**dev, "data": {"x": "y" * 10300}})),
        ("interface name too long", devices({**dev, "networkData": {"interfaceName": "i" * 257}})),
        (
            "hardware address too long",
            devices({**dev, "networkData": {"hardwareAddress": "h" * 129}}),
        ),
        ("ip not cidr", devices({**dev, "networkData": {"ips": ["10.0.0.1"]}})),
        ("ip duplicate", devices({**dev, "networkData": {"ips": ["10.0.0.1/24", "10.0.0.1/24"]}})),
        (
            "too many ips",
            devices({**dev, "networkData": {"ips": [f"10.0.0.{i}/24" for i in range(17)]}}),
        ),
        ("allocation result bad request", {"status": {"allocation": None}}),  # reset
        ("allocation unknown request", {"status": {"allocation": _allocation(request="nope")}}),
        ("allocation driver invalid", {"status": {"allocation": _allocation(driver="Bad_D")}}),
        ("allocation pool missing", {"status": {"allocation": _allocation(pool="")}}),
        ("allocation device missing", {"status": {"allocation": _allocation(device="")}}),
        (
            "too many results",
            {
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {**alloc["devices"]["results"][0], "device": f"d{i}"}
                                for i in range(33)
                            ]
                        }
                    }
                }
            },
        ),
    ]


def template_validation() -> list[tuple[str, JSON]]:
    gpu = {"name": "gpu", "exactly": _exact()}
    return [
        ("label invalid", _template("v", meta={"labels": {"bad key!": "v"}})),
        ("annotation invalid", _template("v", meta={"annotations": {"bad key!": "v"}})),
        ("request invalid", _template("v", {"requests": [{"name": "A", "exactly": _exact()}]})),
        ("request empty", _template("v", {"requests": [{"name": "gpu"}]})),
        (
            "cel invalid",
            _template(
                "v",
                {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": _exact(selectors=[{"cel": {"expression": "1 +"}}]),
                        }
                    ]
                },
            ),
        ),
        (
            "constraint invalid",
            _template(
                "v",
                {
                    "requests": [gpu],
                    "constraints": [{"requests": ["x"], "matchAttribute": "example.com/a"}],
                },
            ),
        ),
        ("config invalid", _template("v", {"requests": [gpu], "config": [{}]})),
        (
            "admin access denied",
            _template("v", {"requests": [{"name": "gpu", "exactly": _exact(adminAccess=True)}]}),
        ),
        (
            "tolerations invalid",
            _template(
                "v",
                {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": _exact(tolerations=[{"key": "k", "operator": "Like"}]),
                        }
                    ]
                },
            ),
        ),
        ("unknown field", _mut(_template("v"), lambda o: _set(o["spec"], bogus=1))),
    ]


def class_validation() -> list[tuple[str, JSON]]:
    return [
        ("cel invalid", _class("@P@-v", selectors=[{"cel": {"expression": "device."}}])),
        ("cel empty", _class("@P@-v", selectors=[{"cel": {"expression": ""}}])),
        ("selector without cel", _class("@P@-v", selectors=[{}])),
        ("too many selectors", _class("@P@-v", selectors=[{"cel": {"expression": "true"}}] * 33)),
        ("config no opaque", _class("@P@-v", config=[{}])),
        (
            "config driver invalid",
            _class("@P@-v", config=[{"opaque": {"driver": "x_y", "parameters": {}}}]),
        ),
        ("config parameters missing", _class("@P@-v", config=[{"opaque": {"driver": DRIVER}}])),
        (
            "config too many",
            _class("@P@-v", config=[{"opaque": {"driver": DRIVER, "parameters": {}}}] * 33),
        ),
        ("extended resource invalid", _class("@P@-v", extendedResourceName="gpu")),
        (
            "extended resource kubernetes.io",
            _class("@P@-v", extendedResourceName="kubernetes.io/gpu"),
        ),
        (
            "config requests",
            _class(
                "@P@-v",
                config=[{"requests": ["a"], "opaque": {"driver": DRIVER, "parameters": {}}}],
            ),
        ),
        ("name invalid", _class("@P@-Bad")),
        ("unknown field", _mut(_class("@P@-v"), lambda o: _set(o["spec"], bogus=1))),
    ]


def rule_validation() -> list[tuple[str, JSON]]:
    taint = {"key": "example.com/t", "effect": "NoSchedule"}
    sel = {"driver": DRIVER, "pool": "node-a", "device": "gpu-0"}
    return [
        ("driver invalid", _rule("@P@-v", {**sel, "driver": "Bad_Driver"})),
        ("driver too long", _rule("@P@-v", {**sel, "driver": "d" * 64})),
        ("pool invalid", _rule("@P@-v", {**sel, "pool": "Bad_Pool"})),
        ("pool too long", _rule("@P@-v", {**sel, "pool": "a" * 254})),
        ("device invalid", _rule("@P@-v", {**sel, "device": "GPU"})),
        ("empty selector", _rule("@P@-v", {})),
        ("taint missing", _mut(_rule("@P@-v"), lambda o: o["spec"].pop("taint"))),
        ("taint key missing", _rule("@P@-v", taint={"effect": "NoSchedule"})),
        ("taint key invalid", _rule("@P@-v", taint={**taint, "key": "bad key"})),
        ("taint value invalid", _rule("@P@-v", taint={**taint, "value": "bad value!"})),
        ("taint effect missing", _rule("@P@-v", taint={"key": "k"})),
        ("taint effect invalid", _rule("@P@-v", taint={**taint, "effect": "Sometimes"})),
        ("selector unknown field", _rule("@P@-v", {**sel, "deviceClassName": "x"})),
        ("selector missing", _mut(_rule("@P@-v"), lambda o: o["spec"].pop("deviceSelector"))),
        ("name invalid", _rule("@P@-Bad")),
    ]


def validation_cases() -> list[Case]:
    """An invalid object for every DRA rule the embedded server checks (same code,
    reason and cause fields as the real server expected)."""
    out: list[Case] = []

    def add(
        kind: str,
        path: str,
        items: list[tuple[str, JSON]],
        method: str = "POST",
        ctype: str | None = None,
    ) -> None:
        for i, (what, obj) in enumerate(items):
            if method == "POST":  # a name of its own: one accepted object blocks no other
                obj = copy.deepcopy(obj)
                obj["metadata"]["name"] = obj["metadata"]["name"].replace(
                    "v", f"v{len(out)}-{i}", 1
                )
            out.append(
                Req(
                    id=f"{kind} invalid: {what}",
                    source="validation",
                    dra=True,
                    method=method,
                    path=path,
                    body=obj,
                    ctype=ctype,
                    compare="code",
                    query=(("fieldValidation", "Strict"),) if method == "POST" else (),
                )
            )

    add("ResourceSlice", f"{DRA}/resourceslices", slice_validation())
    add("ResourceClaim", _dra_ns("resourceclaims"), claim_validation())
    add("ResourceClaimTemplate", _dra_ns("resourceclaimtemplates"), template_validation())
    add("DeviceClass", f"{DRA}/deviceclasses", class_validation())
    add("DeviceTaintRule", f"{DRA}/devicetaintrules", rule_validation())
    # status writes of an allocated claim, and updates of immutable or checked fields
    setup = [
        _req(
            "status claim create",
            "validation",
            "POST",
            _dra_ns("resourceclaims"),
            _claim("status-claim"),
            dra=True,
        ),
        _req(
            "status claim allocate",
            "validation",
            "PATCH",
            _dra_ns("resourceclaims/status-claim/status"),
            {"status": {"allocation": _allocation()}},
            ctype=MERGE,
            dra=True,
        ),
    ]
    out.extend(setup)
    add(
        "ResourceClaim status",
        _dra_ns("resourceclaims/status-claim/status"),
        claim_status_validation(),
        method="PATCH",
        ctype=MERGE,
    )
    out.extend(
        [
            _req(
                "admin access allowed",
                "validation",
                "POST",
                f"{DRA}/namespaces/{NS}-admin/resourceclaims",
                _claim(
                    "admin", {"requests": [{"name": "gpu", "exactly": _exact(adminAccess=True)}]}
                ),
                dra=True,
            ),
            _req(
                "template spec immutable",
                "validation",
                "PATCH",
                _dra_ns("resourceclaimtemplates/tmpl"),
                {"spec": {"metadata": {"labels": {"x": "y"}}}},
                ctype=MERGE,
                dra=True,
            ),
            _req(
                "deviceclass selector update",
                "validation",
                "PATCH",
                f"{DRA}/deviceclasses/@P@-gpu",
                {"spec": {"selectors": [{"cel": {"expression": "device.bogus"}}]}},
                ctype=MERGE,
                dra=True,
            ),
            _req(
                "deviceclass update ok",
                "validation",
                "PATCH",
                f"{DRA}/deviceclasses/@P@-gpu",
                {"metadata": {"labels": {"tier": "gpu"}}},
                ctype=MERGE,
                dra=True,
            ),
            _req(
                "devicetaintrule update invalid",
                "validation",
                "PATCH",
                f"{DRA}/devicetaintrules/@P@-rule",
                {"spec": {"taint": {"effect": "Sometimes"}}},
                ctype=MERGE,
                dra=True,
            ),
            _req(
                "devicetaintrule too many conditions",
                "validation",
                "PATCH",
                f"{DRA}/devicetaintrules/@P@-rule/status",
                {
                    "status": {
                        "conditions": [
                            {
                                "type": f"T{i}",
                                "status": "True",
                                "reason": "R",
                                "message": "",
                                "lastTransitionTime": "2026-01-02T03:04:05Z",
                            }
                            for i in range(9)
                        ]
                    }
                },
                ctype=MERGE,
                dra=True,
            ),
            _req(
                "resourceslice update invalid",
                "validation",
                "PATCH",
                f"{DRA}/resourceslices/@P@-node-a-slice",
                {"spec": {"driver": "Other_Driver"}},
                ctype=MERGE,
                dra=True,
            ),
            _req(
                "resourceslice node immutable",
                "validation",
                "PATCH",
                f"{DRA}/resourceslices/@P@-node-a-slice",
                {"spec": {"nodeName": "@P@-node-b"}},
                ctype=MERGE,
                dra=True,
            ),
        ]
    )
    return out


def cleanup_cases() -> list[Case]:
    """Deletes of what the corpus created cluster-wide (compared too)."""
    src = "cleanup"
    return [
        _req(
            "delete devicetaintrule",
            src,
            "DELETE",
            f"{DRA}/devicetaintrules/@P@-rule",
            dra=True,
            compare="code",
        ),
        _req(
            "delete resourceslice",
            src,
            "DELETE",
            f"{DRA}/resourceslices/@P@-node-a-slice",
            dra=True,
            compare="code",
        ),
        _req(
            "delete resourceslice ssa",
            src,
            "DELETE",
            f"{DRA}/resourceslices/@P@-ssa",
            dra=True,
            compare="code",
        ),
        _req(
            "delete deviceclass",
            src,
            "DELETE",
            f"{DRA}/deviceclasses/@P@-gpu",
            dra=True,
            compare="code",
        ),
        _req("delete node", src, "DELETE", f"{CORE}/nodes/@P@-node-a", compare="code"),
        _req("delete node missing", src, "DELETE", f"{CORE}/nodes/@P@-node-a"),
        _req(
            "delete event",
            src,
            "DELETE",
            f"{CORE}/namespaces/default/events/@P@-node-a.device-unhealthy",
        ),
    ]


def metadata_update_cases() -> list[Case]:
    """An invalid label, annotation and uid sent as an update of each kind (a Job's uid
    is left out: its selector names the uid). Before 1.37 the real server reports each
    metadata cause as often as the generic and the kind's own update checks validate the
    metadata again (2 to 4 times); from 1.37 on once."""
    src = "metadata"
    container = [{"name": "c", "image": "registry.example/app:1.0"}]
    template = {"metadata": {"labels": {"app": "meta"}}, "spec": {"containers": container}}
    workload = {"replicas": 0, "selector": {"matchLabels": {"app": "meta"}}, "template": template}
    objects: list[tuple[str, str, JSON, bool]] = [
        (
            "Node",
            f"{CORE}/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "@P@-meta"}},
            False,
        ),
        (
            "ConfigMap",
            _ns("configmaps"),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "meta"}},
            False,
        ),
        ("Pod", _ns("pods"), _pod("meta"), False),
        (
            "Event",
            _ns("events"),
            _pod_event(
                "meta", "meta", "Probe", "Normal", message="m", source={"component": "drahealth"}
            ),
            False,
        ),
        (
            "Event v1",
            f"/apis/events.k8s.io/v1/namespaces/{NS}/events",
            {
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": "meta-v1"},
                "eventTime": "2026-01-02T03:04:05.000001Z",
                "reportingController": "drahealth.io/controller",
                "reportingInstance": "controller-0",
                "action": "Probe",
                "reason": "Probe",
                "type": "Normal",
                "regarding": {"kind": "Pod", "name": "meta", "namespace": NS, "apiVersion": "v1"},
            },
            False,
        ),
        (
            "Lease",
            f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases",
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "meta"}},
            False,
        ),
        (
            "Deployment",
            f"/apis/apps/v1/namespaces/{NS}/deployments",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "meta"},
                "spec": workload,
            },
            False,
        ),
        (
            "ReplicaSet",
            f"/apis/apps/v1/namespaces/{NS}/replicasets",
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": "meta"},
                "spec": workload,
            },
            False,
        ),
        (
            "Job",
            f"/apis/batch/v1/namespaces/{NS}/jobs",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "meta"},
                "spec": {
                    "suspend": True,
                    "template": {"spec": {"restartPolicy": "Never", "containers": container}},
                },
            },
            False,
        ),
        (
            "PodDisruptionBudget",
            f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "meta"},
                "spec": {"minAvailable": 1},
            },
            False,
        ),
        (
            "DeviceClass",
            f"{DRA}/deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "@P@-meta"},
            },
            True,
        ),
        ("ResourceClaim", _dra_ns("resourceclaims"), _claim("meta"), True),
        (
            "ResourceClaimTemplate",
            _dra_ns("resourceclaimtemplates"),
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "meta"},
                "spec": {"spec": {}},
            },
            True,
        ),
        ("ResourceSlice", f"{DRA}/resourceslices", _slice("@P@-meta"), True),
        # a rule that selects no device (served by default from 1.37 on)
        (
            "DeviceTaintRule",
            f"{DRA}/devicetaintrules",
            _rule("@P@-meta", selector={"driver": DRIVER, "pool": "none", "device": "none"}),
            True,
        ),
    ]
    out: list[Case] = []
    for kind, path, obj, dra in objects:
        name = obj["metadata"]["name"]
        out.append(_req(f"{kind} meta create", src, "POST", path, obj, compare="code", dra=dra))
        bad: list[tuple[str, JSON]] = [
            ("label", {"metadata": {"labels": {"bad key!": "x"}}}),
            ("annotation", {"metadata": {"annotations": {"bad key!": "x"}}}),
        ]
        if kind != "Job":
            bad.append(("uid", {"metadata": {"uid": "00000000-0000-0000-0000-000000000000"}}))
        for what, patch in bad:
            out.append(
                _req(
                    f"{kind} update invalid {what}",
                    src,
                    "PATCH",
                    f"{path}/{name}",
                    patch,
                    ctype=MERGE,
                    dra=dra,
                )
            )
        if "/namespaces/" not in path:  # cluster-scoped: gone before the cleanup
            out.append(
                _req(
                    f"{kind} meta delete", src, "DELETE", f"{path}/{name}", compare="code", dra=dra
                )
            )
    for what, patch in (
        ("label", {"metadata": {"labels": {"bad key!": "x"}}}),
        ("uid", {"metadata": {"uid": "00000000-0000-0000-0000-000000000000"}}),
    ):
        out.append(
            _req(f"Namespace update invalid {what}", src, "PATCH", f"{CORE}/namespaces/{NS}",
                 patch, ctype=MERGE)
        )  # fmt: skip
    return out


def corpus() -> list[Case]:
    """The whole corpus, in the order it runs."""
    from tests.realk8s.official_client import official_cases

    return [
        *component_cases(),
        *kubectl_style_cases(),
        *lightkube_cases(),
        *kubectl_binary_cases(),
        *official_cases(),
        *validation_cases(),
        *metadata_update_cases(),
        *cleanup_cases(),
    ]


# =========================================================================== running it


async def _wait_default_sa(target: Target, ctx: Context, within: float = 60.0) -> None:
    """The real ServiceAccount admission refuses pods until the namespace's ``default``
    ServiceAccount exists (the controller-manager creates it)."""
    assert target.session is not None
    url = f"{target.url}{CORE}/namespaces/{ctx.namespace}/serviceaccounts/default"
    deadline = time.monotonic() + within
    while True:
        async with target.session.get(
            url, headers={"Authorization": f"Bearer {target.token}"}, ssl=target.ssl_context()
        ) as resp:
            if resp.status == 200:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"no default ServiceAccount in {ctx.namespace} after {within} s")
        await asyncio.sleep(0.1)


async def cleanup(target: Target, ctx: Context) -> None:
    """Delete the corpus namespaces and every cluster-scoped object under the prefix."""
    assert target.session is not None
    headers = {"Authorization": f"Bearer {target.token}"}
    sslc = target.ssl_context()
    for ns in (ctx.namespace, f"{ctx.namespace}-admin"):
        async with target.session.delete(
            f"{target.url}{CORE}/namespaces/{ns}", headers=headers, ssl=sslc
        ):
            pass
    for path in (
        f"{CORE}/nodes",
        f"{DRA}/resourceslices",
        f"{DRA}/deviceclasses",
        f"{DRA}/devicetaintrules",
        f"{CORE}/namespaces/default/events",
    ):
        async with target.session.get(target.url + path, headers=headers, ssl=sslc) as resp:
            if resp.status != 200:
                continue
            items = (await resp.json()).get("items") or []
        for item in items:
            name = item["metadata"]["name"]
            if name.startswith(ctx.prefix):
                async with target.session.delete(
                    f"{target.url}{path}/{name}", headers=headers, ssl=sslc
                ):
                    pass


async def differential(
    *,
    apiserver: str,
    token: str,
    ca_file: str,
    kubeconfig: Path,
    minor: str,
    kubectl: Path | None,
    workdir: Path,
    prefix: str,
    cases: list[Case] | None = None,
    gates: dict[str, bool] | None = None,
) -> list[Result]:
    """Run ``cases`` (default: :func:`corpus`) against the real server and an embedded one
    of release ``minor`` (with the real server's feature ``gates`` set) started here; the
    real server is cleaned up afterwards."""
    from drahealth.controlplane import APIServer
    from drahealth.core import kube_profile
    from drahealth.kube import make_client
    from tests.realk8s.official_client import Official

    server = APIServer(data_file=None, profile=kube_profile(minor, gates))
    await server.start()
    ctx = Context(namespace=prefix, prefix=prefix)
    real = Target("real", apiserver, token, kubeconfig, kubectl, ca_file=ca_file)
    config = server.write_kubeconfig(workdir / "embedded.kubeconfig")
    embedded = Target("embedded", server.url, "drahealth", config, kubectl)
    if kubectl is None:
        cases = [c for c in cases or corpus() if not isinstance(c, Kubectl)]
    async with aiohttp.ClientSession() as session:
        real.session = embedded.session = session
        real.lightkube = make_client(kubeconfig=str(kubeconfig), timeout=10.0)
        embedded.lightkube = make_client(server_url=server.url, timeout=10.0)
        real.official = Official.from_kubeconfig(kubeconfig)
        embedded.official = Official.from_kubeconfig(config)

        async def settle(case: Case, target: Target) -> None:
            if case.id == "namespace create" and target is real:
                await _wait_default_sa(real, ctx)

        try:
            return await run_corpus(cases or corpus(), real, embedded, ctx, settle)
        finally:
            await cleanup(real, ctx)
            await real.lightkube.close()
            await embedded.lightkube.close()
            real.official.close()
            embedded.official.close()
            await server.stop()


def report(results: list[Result]) -> tuple[float, list[Result]]:
    """The match rate and the cases that differ."""
    differing = [r for r in results if r.differences]
    rate = 1 - len(differing) / len(results) if results else 0.0
    return rate, differing


def describe(results: list[Result]) -> str:
    rate, differing = report(results)
    dra = [r for r in differing if r.case.dra]
    lines = [
        f"differential: {len(results)} requests, {len(results) - len(differing)} identical, "
        f"match rate {rate:.4f}; DRA: {sum(r.case.dra for r in results)} requests, "
        f"{len(dra)} differ"
    ]
    for r in differing:
        lines.append(f"- [{r.case.source}] {r.case.id}:")
        lines.extend(f"    {d}" for d in r.differences)
    return "\n".join(lines)
