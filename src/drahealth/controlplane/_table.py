"""Server-side printing: ``meta.k8s.io/v1 Table`` responses for ``kubectl get``.

Owns the columns shown per kind (NAME and AGE always; a few kind-specific columns
where kubectl users expect them) and the ``Accept`` header test that asks for a
Table. Pure functions.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from ._resources import ResourceType

JSON = dict[str, Any]
Column = tuple[str, str, Callable[[JSON], Any], int]  # name, type, cell, priority


def wants_table(accept: str) -> bool:
    """True when the client prefers ``application/json;as=Table;g=meta.k8s.io``."""
    first = accept.split(",")[0] if accept else ""
    params = {p.strip() for p in first.split(";")[1:]}
    return "as=Table" in params and "g=meta.k8s.io" in params


def human_duration(seconds: float) -> str:
    """Kubernetes ``duration.HumanDuration`` (``5s``, ``3m20s``, ``10m``, ``3h``, ``4d``)."""
    s = int(seconds)
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    y = d // 365
    if d < 365 * 8:
        return f"{y}y{d % 365}d" if d % 365 else f"{y}y"
    return f"{y}y"


def _since(ts: Any) -> str:
    """``translateTimestampSince``: ``<unknown>`` for no time."""
    if not ts:
        return "<unknown>"
    try:
        then = dt.datetime.fromisoformat(str(ts))
    except ValueError:
        return "<unknown>"
    return human_duration((dt.datetime.now(dt.UTC) - then).total_seconds())


def _age(obj: JSON) -> str:
    return _since((obj.get("metadata") or {}).get("creationTimestamp"))


def _get(obj: JSON, *path: str, default: Any = "") -> Any:
    cur: Any = obj
    for p in path:
        if not isinstance(cur, dict) or p not in cur:
            return default
        cur = cur[p]
    return cur


def _pod_ready(pod: JSON) -> str:
    statuses = _get(pod, "status", "containerStatuses", default=[]) or []
    total = len(_get(pod, "spec", "containers", default=[]) or [])
    ready = sum(1 for c in statuses if c.get("ready") and (c.get("state") or {}).get("running"))
    return f"{ready}/{total}"


def _pod_status(pod: JSON) -> str:
    """``printPod``'s STATUS: the phase (or reason), a container's waiting or terminated
    reason, ``SchedulingGated``, ``Terminating`` (init containers: their first problem)."""
    status = pod.get("status") or {}
    reason = str(status.get("reason") or status.get("phase") or "")
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"
    inits = _get(pod, "spec", "initContainers", default=[]) or []
    initializing = False
    for i, c in enumerate(status.get("initContainerStatuses") or []):
        state = c.get("state") or {}
        term, wait = state.get("terminated"), state.get("waiting")
        if term and term.get("exitCode") == 0:
            continue
        if term:
            reason = "Init:" + (term.get("reason") or f"ExitCode:{term.get('exitCode')}")
        elif wait and wait.get("reason") and wait["reason"] != "PodInitializing":
            reason = "Init:" + wait["reason"]
        else:
            reason = f"Init:{i}/{len(inits)}"
        initializing = True
        break
    if not initializing:
        running = False
        for c in reversed(status.get("containerStatuses") or []):
            state = c.get("state") or {}
            wait, term = state.get("waiting"), state.get("terminated")
            if wait and wait.get("reason"):
                reason = wait["reason"]
            elif term:
                reason = term.get("reason") or f"ExitCode:{term.get('exitCode')}"
            elif c.get("ready") and state.get("running"):
                running = True
        if reason == "Completed" and running:
            reason = "Running"
    if _get(pod, "metadata", "deletionTimestamp") and status.get("phase") not in (
        "Succeeded", "Failed",
    ):  # fmt: skip
        reason = "Terminating"
    return reason


def _restarts(pod: JSON) -> str:
    count = sum(
        int(c.get("restartCount", 0))
        for c in _get(pod, "status", "containerStatuses", default=[]) or []
    )
    return str(count)


def _node_roles(node: JSON) -> str:
    roles = set()
    for k, v in (_get(node, "metadata", "labels", default={}) or {}).items():
        if k.startswith("node-role.kubernetes.io/") and k.removeprefix("node-role.kubernetes.io/"):
            roles.add(k.removeprefix("node-role.kubernetes.io/"))
        elif k == "kubernetes.io/role" and v:
            roles.add(v)
    return ",".join(sorted(roles)) or "<none>"


def _node_address(node: JSON, kind: str) -> str:
    for a in _get(node, "status", "addresses", default=[]) or []:
        if a.get("type") == kind:
            return str(a.get("address"))
    return "<none>"


def _node_info(node: JSON, key: str) -> str:
    return str(_get(node, "status", "nodeInfo", key) or "<unknown>")


def _kernel(node: JSON) -> str:
    """The kernel version with the architecture after it (1.36 on)."""
    arch = _get(node, "status", "nodeInfo", "architecture")
    return _node_info(node, "kernelVersion") + (f" ({arch})" if arch else "")


def _kernel_only(node: JSON) -> str:
    return _node_info(node, "kernelVersion")


def _event_first(ev: JSON) -> str:
    return _since(ev.get("firstTimestamp") or ev.get("eventTime"))


def _event_last(ev: JSON) -> str:
    series = ev.get("series") or {}
    if series:
        return _since(series.get("lastObservedTime"))
    return _since(ev["lastTimestamp"]) if ev.get("lastTimestamp") else _event_first(ev)


def _event_count(ev: JSON) -> int:
    series = ev.get("series") or {}
    return int(series.get("count") or 0) if series else int(ev.get("count") or 1)


def _event_object(ev: JSON) -> str:
    kind, name = str(_get(ev, "involvedObject", "kind")).lower(), _get(ev, "involvedObject", "name")
    return f"{kind}/{name}" if name else kind


def _event_source(ev: JSON) -> str:
    src = ev.get("source") or {}
    component = src.get("component") or ev.get("reportingComponent") or ""
    instance = src.get("host") or ev.get("reportingInstance") or ""
    return f"{component}, {instance}" if instance else component


def _node_status(node: JSON) -> str:
    conds = _get(node, "status", "conditions", default=[]) or []
    ready = next((c for c in conds if c.get("type") == "Ready"), None)
    state = (
        "Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")
    )
    if _get(node, "spec", "unschedulable", default=False):
        state += ",SchedulingDisabled"
    return state


def _claim_state(claim: JSON) -> str:
    parts = []
    if _get(claim, "metadata", "deletionTimestamp"):
        parts.append("deleted")
    if _get(claim, "status", "allocation"):
        parts.append("allocated")
    if _get(claim, "status", "reservedFor"):
        parts.append("reserved")
    return ",".join(parts) or "pending"


def _int_or_na(value: Any) -> Any:
    return "N/A" if value in ("", None) else value


def _job_status(job: JSON) -> str:
    """kubectl's Job STATUS: the first of these conditions that is True, else Running."""
    true = {
        c.get("type")
        for c in _get(job, "status", "conditions", default=[]) or []
        if c.get("status") == "True"
    }
    for kind in ("Complete", "Failed"):
        if kind in true:
            return kind
    if _get(job, "metadata", "deletionTimestamp"):
        return "Terminating"
    for kind in ("Suspended", "FailureTarget"):
        if kind in true:
            return kind
    return "Running"


def _job_completions(job: JSON) -> str:
    done = _get(job, "status", "succeeded", default=0) or 0
    completions = _get(job, "spec", "completions", default=None)
    if completions is not None:
        return f"{done}/{completions}"
    parallelism = _get(job, "spec", "parallelism", default=0) or 0
    return f"{done}/1 of {parallelism}" if parallelism > 1 else f"{done}/1"


def _job_duration(job: JSON) -> str:
    start = _get(job, "status", "startTime", default=None)
    if not start:
        return ""
    end = _get(job, "status", "completionTime", default=None)
    try:
        t0 = dt.datetime.fromisoformat(str(start))
        t1 = dt.datetime.fromisoformat(str(end)) if end else dt.datetime.now(dt.UTC)
    except ValueError:
        return ""
    return human_duration((t1 - t0).total_seconds())


def _containers(obj: JSON, field: str) -> str:
    containers = _get(obj, "spec", "template", "spec", "containers", default=[]) or []
    return ",".join(str(c.get(field, "")) for c in containers if isinstance(c, dict))


def _selector(obj: JSON) -> str:
    sel = _get(obj, "spec", "selector", default={}) or {}
    parts = [f"{k}={v}" for k, v in sorted((sel.get("matchLabels") or {}).items())]
    for e in sel.get("matchExpressions") or []:
        values = ",".join(e.get("values") or [])
        op = str(e.get("operator", "")).lower()
        parts.append(f"{e.get('key')} {op} ({values})" if values else f"{e.get('key')}")
    return ",".join(parts) or "<none>"


def format_label_selector(selector: Any, none: str = "<none>") -> str:
    """A LabelSelector as upstream prints it (``FormatLabelSelector``): requirements
    sorted by key and joined by ``,``; ``none`` for an empty or missing selector."""
    if not isinstance(selector, dict):
        return none
    parts = [(str(k), f"{k}={v}") for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op = str(expr.get("key", "")), str(expr.get("operator"))
        values = ",".join(sorted(str(v) for v in expr.get("values") or []))
        forms = {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})"}
        forms |= {"Exists": key, "DoesNotExist": f"!{key}"}
        parts.append((key, forms.get(op, key)))
    return ",".join(text for _, text in sorted(parts)) or none


def _template_field(obj: JSON, field: str) -> str:
    """``field`` of each container of a workload's pod template, ``,``-joined."""
    containers = _get(obj, "spec", "template", "spec", "containers", default=[]) or []
    return ",".join(str(c.get(field, "")) for c in containers if isinstance(c, dict))


def _readiness_gates(pod: JSON) -> str:
    gates = _get(pod, "spec", "readinessGates", default=[]) or []
    if not gates:
        return "<none>"
    true = {c.get("type") for c in _get(pod, "status", "conditions", default=[]) or []
            if c.get("status") == "True"}  # fmt: skip
    return f"{sum(1 for g in gates if g.get('conditionType') in true)}/{len(gates)}"


_NAME: Column = ("Name", "string", lambda o: _get(o, "metadata", "name"), 0)
_AGE: Column = ("Age", "string", _age, 0)

_COLUMNS: dict[tuple[str, str], list[Column]] = {
    ("", "Pod"): [
        _NAME,
        ("Ready", "string", _pod_ready, 0),
        ("Status", "string", _pod_status, 0),
        ("Restarts", "string", _restarts, 0),
        _AGE,
        (
            "IP",
            "string",
            lambda o: (_get(o, "status", "podIPs", default=[]) or [{}])[0].get("ip") or "<none>",
            1,
        ),
        ("Node", "string", lambda o: _get(o, "spec", "nodeName") or "<none>", 1),
        (
            "Nominated Node",
            "string",
            lambda o: _get(o, "status", "nominatedNodeName") or "<none>",
            1,
        ),
        ("Readiness Gates", "string", _readiness_gates, 1),
    ],
    ("", "Node"): [
        _NAME,
        ("Status", "string", _node_status, 0),
        ("Roles", "string", _node_roles, 0),
        _AGE,
        ("Version", "string", lambda o: _get(o, "status", "nodeInfo", "kubeletVersion"), 0),
        ("Internal-IP", "string", lambda o: _node_address(o, "InternalIP"), 1),
        ("External-IP", "string", lambda o: _node_address(o, "ExternalIP"), 1),
        ("OS-Image", "string", lambda o: _node_info(o, "osImage"), 1),
        ("Kernel-Version", "string", _kernel, 1),
        ("Container-Runtime", "string", lambda o: _node_info(o, "containerRuntimeVersion"), 1),
    ],
    ("", "Namespace"): [_NAME, ("Status", "string", lambda o: _get(o, "status", "phase"), 0), _AGE],
    ("", "ConfigMap"): [
        _NAME,
        ("Data", "string", lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {}), 0),
        _AGE,
    ],
    ("", "Event"): [
        ("Last Seen", "string", _event_last, 0),
        ("Type", "string", lambda o: o.get("type", ""), 0),
        ("Reason", "string", lambda o: o.get("reason", ""), 0),
        ("Object", "string", _event_object, 0),
        ("Subobject", "string", lambda o: _get(o, "involvedObject", "fieldPath"), 1),
        ("Source", "string", _event_source, 1),
        ("Message", "string", lambda o: str(o.get("message", "")).strip(), 0),
        ("First Seen", "string", _event_first, 1),
        ("Count", "string", _event_count, 1),
        ("Name", "string", lambda o: _get(o, "metadata", "name"), 1),
    ],
    ("batch", "Job"): [
        _NAME,
        ("Status", "string", _job_status, 0),
        ("Completions", "string", _job_completions, 0),
        ("Duration", "string", _job_duration, 0),
        _AGE,
        ("Containers", "string", lambda o: _containers(o, "name"), 1),
        ("Images", "string", lambda o: _containers(o, "image"), 1),
        ("Selector", "string", _selector, 1),
    ],
    ("apps", "Deployment"): [
        _NAME,
        (
            "Ready",
            "string",
            lambda o: (
                f"{_get(o, 'status', 'readyReplicas', default=0) or 0}/"
                f"{_get(o, 'spec', 'replicas', default=1)}"
            ),
            0,
        ),
        (
            "Up-to-date",
            "integer",
            lambda o: _get(o, "status", "updatedReplicas", default=0) or 0,
            0,
        ),
        (
            "Available",
            "integer",
            lambda o: _get(o, "status", "availableReplicas", default=0) or 0,
            0,
        ),
        _AGE,
        ("Containers", "string", lambda o: _template_field(o, "name"), 1),
        ("Images", "string", lambda o: _template_field(o, "image"), 1),
        (
            "Selector",
            "string",
            lambda o: format_label_selector(_get(o, "spec", "selector", default=None)),
            1,
        ),
    ],
    ("apps", "ReplicaSet"): [
        _NAME,
        ("Desired", "integer", lambda o: _get(o, "spec", "replicas", default=1), 0),
        ("Current", "integer", lambda o: _get(o, "status", "replicas", default=0) or 0, 0),
        ("Ready", "integer", lambda o: _get(o, "status", "readyReplicas", default=0) or 0, 0),
        _AGE,
        ("Containers", "string", lambda o: _template_field(o, "name"), 1),
        ("Images", "string", lambda o: _template_field(o, "image"), 1),
        (
            "Selector",
            "string",
            lambda o: format_label_selector(_get(o, "spec", "selector", default=None)),
            1,
        ),
    ],
    ("coordination.k8s.io", "Lease"): [
        _NAME,
        ("Holder", "string", lambda o: _get(o, "spec", "holderIdentity"), 0),
        _AGE,
    ],
    ("policy", "PodDisruptionBudget"): [
        _NAME,
        ("Min Available", "string", lambda o: _int_or_na(_get(o, "spec", "minAvailable")), 0),
        ("Max Unavailable", "string", lambda o: _int_or_na(_get(o, "spec", "maxUnavailable")), 0),
        (
            "Allowed Disruptions",
            "integer",
            lambda o: _get(o, "status", "disruptionsAllowed", default=0),
            0,
        ),
        _AGE,
    ],
    ("resource.k8s.io", "ResourceSlice"): [
        _NAME,
        ("Node", "string", lambda o: _get(o, "spec", "nodeName") or "", 0),
        ("Driver", "string", lambda o: _get(o, "spec", "driver"), 0),
        ("Pool", "string", lambda o: _get(o, "spec", "pool", "name"), 0),
        _AGE,
    ],
    ("resource.k8s.io", "ResourceClaim"): [_NAME, ("State", "string", _claim_state, 0), _AGE],
    ("resource.k8s.io", "DeviceTaintRule"): [
        _NAME,
        ("Key", "string", lambda o: _get(o, "spec", "taint", "key"), 0),
        ("Value", "string", lambda o: _get(o, "spec", "taint", "value"), 0),
        ("Effect", "string", lambda o: _get(o, "spec", "taint", "effect"), 0),
        (
            "TimeAdded",
            "string",
            lambda o: (
                _since(_get(o, "spec", "taint", "timeAdded"))
                if _get(o, "spec", "taint", "timeAdded")
                else ""
            ),
            0,
        ),
        _AGE,
    ],
}


def _columns(rt: ResourceType, minor: int | None) -> list[Column]:
    """The printer's columns for ``rt`` at release ``1.<minor>`` (None: the newest)."""
    cols = _COLUMNS.get((rt.group, rt.kind), [_NAME, _AGE])
    if (rt.group, rt.kind) == ("", "Node") and minor is not None and minor <= 35:
        cols = [(n, t, _kernel_only if fn is _kernel else fn, p) for n, t, fn, p in cols]
    return cols


def _partial(obj: JSON) -> JSON:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata") or {},
    }


def table(
    rt: ResourceType,
    objs: list[JSON],
    rv: str | None,
    include_object: str,
    with_columns: bool = True,
    minor: int | None = None,
) -> JSON:
    """A ``Table`` of ``objs``; ``include_object`` is None, Metadata (default) or Object;
    ``minor`` the release whose printers it follows (None: the newest)."""
    cols = _columns(rt, minor)
    rows = []
    for obj in objs:
        row: JSON = {"cells": [col[2](obj) for col in cols]}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = _partial(obj)
        rows.append(row)
    out: JSON = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {}}
    if rv is not None:
        out["metadata"]["resourceVersion"] = rv
    if with_columns:
        out["columnDefinitions"] = [
            {
                "name": name,
                "type": typ,
                "format": "name" if name == "Name" else "",
                "description": "",
                "priority": prio,
            }
            for name, typ, _, prio in cols
        ]
    out["rows"] = rows
    return out
