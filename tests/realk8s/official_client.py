"""The official Kubernetes Python client (``kubernetes`` on PyPI) in the differential
corpus: typical operator and driver calls made through its generated API classes, its
``Watch`` and its kubeconfig loader, against both servers.

Each case is a plain function of a :class:`Official` handle (one ``ApiClient`` per server,
built by ``kubernetes.config.new_client_from_config`` from that server's kubeconfig) run in
a worker thread (the client is synchronous and the embedded server shares the test's event
loop). Every HTTP exchange the client makes is recorded at its REST layer, after the client
built the request and read the answer:

* ``sent``: method, path, query (resourceVersions and continue tokens as placeholders),
  the Content-Type the client chose and the status code it got, compared in that order;
* the body: the raw JSON answer of the call's exchange (a list of them when the call made
  several), normalised as every other corpus answer; a watch's events as the client's
  ``Watch`` yielded them (``type`` and ``raw_object``); an ``ApiException``'s body, a
  ``Status`` whose status, reason and causes are compared.

The client deserialises every answer into its models (pydantic, validated), so an answer
it cannot read is an outcome too (code -1, the exception's type).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from kubernetes import client, config, watch
from kubernetes.client import ApiClient, ApiException

from tests.realk8s.corpus import Case, Context, Outcome, Target

SOURCE = "official-client"
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
_RV = re.compile(r"^\d+$")
#: Query parameters whose values come from the server being asked.
_SERVER_PARAMS = {"resourceVersion": "<rv>", "continue": "<continue>"}


@dataclass
class Exchange:
    method: str
    url: str
    headers: dict[str, str]
    response: Any = None

    def line(self) -> str:
        parts = urlsplit(self.url)
        query = []
        for k, v in parse_qsl(parts.query, keep_blank_values=True):
            if k in _SERVER_PARAMS and (k != "resourceVersion" or _RV.match(v)):
                v = _SERVER_PARAMS[k]
            query.append(f"{k}={v}")
        text = f"{self.method} {parts.path}"
        if query:
            text += "?" + "&".join(query)
        ctype = self.headers.get("Content-Type")
        if ctype and self.method in ("POST", "PUT", "PATCH"):
            text += f" [{ctype}]"
        status = getattr(self.response, "status", None)
        return f"{text} -> {status}"

    def body(self) -> Any:
        data = getattr(self.response, "data", None)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return data.decode(errors="replace")


@dataclass
class Official:
    """One server's ``ApiClient``, recording what its REST layer sends and receives."""

    api: ApiClient
    exchanges: list[Exchange] = field(default_factory=list)

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Official:
        api = config.new_client_from_config(config_file=str(path))
        me = cls(api)
        rest = api.rest_client
        send = rest.request

        def request(method: str, url: str, headers: Any = None, **kw: Any) -> Any:
            headers = dict(headers or {})
            ex = Exchange(method.upper(), url, headers)
            me.exchanges.append(ex)
            ex.response = send(method, url, headers=headers, **kw)
            return ex.response

        rest.request = request
        return me

    def close(self) -> None:
        self.api.close()

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def dra(self) -> client.ResourceV1Api:
        return client.ResourceV1Api(self.api)

    @property
    def policy(self) -> client.PolicyV1Api:
        return client.PolicyV1Api(self.api)

    @property
    def events(self) -> client.EventsV1Api:
        return client.EventsV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)


Call = Callable[[Official, Context], Any]


@dataclass(frozen=True, kw_only=True)
class OfficialCall(Case):
    """A call through the official client; see the module docstring for what is compared.
    ``call`` returns ``None`` (compare the raw answers) or what to compare instead."""

    call: Call

    async def run(self, target: Target, ctx: Context) -> Outcome:
        oc = target.official
        assert isinstance(oc, Official)
        oc.exchanges.clear()
        code: int
        try:
            result = await asyncio.to_thread(self.call, oc, ctx)
        except ApiException as exc:
            body: Any = {"reason": exc.reason}
            if exc.body:
                try:
                    body = json.loads(exc.body)
                except ValueError:
                    body = exc.body
            return Outcome(exc.status or 0, body, sent=self._sent(oc))
        except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            return Outcome(-1, {"client": type(exc).__name__}, sent=self._sent(oc))
        answers = [ex.body() for ex in oc.exchanges if ex.body() is not None]
        last = oc.exchanges[-1].response if oc.exchanges else None
        code = getattr(last, "status", 0) or 0
        if result is None:
            result = answers[0] if len(answers) == 1 else answers
        return Outcome(code, result, sent=self._sent(oc))

    @staticmethod
    def _sent(oc: Official) -> tuple[str, ...]:
        return tuple(ex.line() for ex in oc.exchanges)


# --------------------------------------------------------------------------- helpers


def _meta(name: str, **kw: Any) -> client.V1ObjectMeta:
    return client.V1ObjectMeta(name=name, **kw)


def _events(stream: Any, want: int, within: float = 5.0) -> list[Any]:
    """Up to ``want`` events of a ``Watch().stream(...)``, stopping it then."""
    out: list[Any] = []
    w: watch.Watch = stream[0]
    deadline = time.monotonic() + within
    for event in stream[1]:
        out.append({"type": event["type"], "object": event["raw_object"]})
        if len(out) >= want or time.monotonic() > deadline:
            w.stop()
            break
    return out


def _watch(func: Any, *args: Any, **kw: Any) -> tuple[watch.Watch, Any]:
    w = watch.Watch()
    return w, w.stream(func, *args, _request_timeout=15, **kw)


TS = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
TS_MICRO = dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)


# --------------------------------------------------------------------------- the cases


def core_cases() -> list[Case]:
    ns_label = {"drahealth.example/oc": "yes"}

    def create_cm(c: Official, ctx: Context) -> Any:
        body = client.V1ConfigMap(
            metadata=_meta("oc-cm", labels={"app": "oc", **ns_label}), data={"a": "1"}
        )
        c.core.create_namespaced_config_map(ctx.namespace, body)

    def read_cm(c: Official, ctx: Context) -> Any:
        cm = c.core.read_namespaced_config_map("oc-cm", ctx.namespace)
        assert cm.data == {"a": "1"}

    def strategic_cm(c: Official, ctx: Context) -> Any:
        patch = {"metadata": {"labels": {"tier": "x"}}, "data": {"b": "2"}}
        c.core.patch_namespaced_config_map("oc-cm", ctx.namespace, patch)

    def merge_cm(c: Official, ctx: Context) -> Any:
        patch = {"metadata": {"labels": {"tier": None}}, "data": {"a": None, "c": "3"}}
        c.core.patch_namespaced_config_map("oc-cm", ctx.namespace, patch, _content_type=MERGE)

    def json_patch_cm(c: Official, ctx: Context) -> Any:
        ops = [
            {"op": "test", "path": "/data/b", "value": "2"},
            {"op": "replace", "path": "/data/b", "value": "22"},
        ]
        c.core.patch_namespaced_config_map("oc-cm", ctx.namespace, ops)

    def json_patch_cm_failed_test(c: Official, ctx: Context) -> Any:
        ops = [{"op": "test", "path": "/data/b", "value": "2"}]
        c.core.patch_namespaced_config_map("oc-cm", ctx.namespace, ops)

    def replace_cm(c: Official, ctx: Context) -> Any:
        cm = c.core.read_namespaced_config_map("oc-cm", ctx.namespace)
        cm.data = {**(cm.data or {}), "d": "4"}
        c.core.replace_namespaced_config_map("oc-cm", ctx.namespace, cm)

    def replace_cm_stale(c: Official, ctx: Context) -> Any:
        cm = c.core.read_namespaced_config_map("oc-cm", ctx.namespace)
        cm.data = {**(cm.data or {}), "e": "5"}
        c.core.replace_namespaced_config_map("oc-cm", ctx.namespace, cm)
        cm.data["f"] = "6"  # the resourceVersion read first is stale now
        c.core.replace_namespaced_config_map("oc-cm", ctx.namespace, cm)

    def create_pages(c: Official, ctx: Context) -> Any:
        for i in range(4):
            body = client.V1ConfigMap(
                metadata=_meta(f"oc-page-{i}", labels={"page": "yes"}), data={"i": str(i)}
            )
            c.core.create_namespaced_config_map(ctx.namespace, body)

    def list_label(c: Official, ctx: Context) -> Any:
        c.core.list_namespaced_config_map(ctx.namespace, label_selector="app=oc,tier!=y")

    def list_field(c: Official, ctx: Context) -> Any:
        c.core.list_namespaced_config_map(ctx.namespace, field_selector="metadata.name=oc-cm")

    def list_paged(c: Official, ctx: Context) -> Any:
        first = c.core.list_namespaced_config_map(ctx.namespace, label_selector="page", limit=3)
        token = first.metadata._continue
        assert token, "no continue token"
        c.core.list_namespaced_config_map(
            ctx.namespace, label_selector="page", limit=3, _continue=token
        )

    def list_bad_selector(c: Official, ctx: Context) -> Any:
        c.core.list_namespaced_config_map(ctx.namespace, label_selector="page in (")

    def list_bad_continue(c: Official, ctx: Context) -> Any:
        c.core.list_namespaced_config_map(ctx.namespace, limit=1, _continue="not-a-token")

    def watch_initial(c: Official, ctx: Context) -> Any:
        return _events(
            _watch(
                c.core.list_namespaced_config_map,
                ctx.namespace,
                label_selector="page=yes",
                timeout_seconds=5,
            ),
            want=4,
        )

    def watch_changes(c: Official, ctx: Context) -> Any:
        listed = c.core.list_namespaced_config_map(ctx.namespace, label_selector="page=yes")
        rv = listed.metadata.resource_version
        c.core.patch_namespaced_config_map("oc-page-0", ctx.namespace, {"data": {"i": "zero"}})
        c.core.delete_namespaced_config_map("oc-page-3", ctx.namespace)
        return _events(
            _watch(
                c.core.list_namespaced_config_map,
                ctx.namespace,
                label_selector="page=yes",
                resource_version=rv,
                timeout_seconds=5,
            ),
            want=2,
        )

    def watch_timeout(c: Official, ctx: Context) -> Any:
        t0 = time.monotonic()
        events = _events(
            _watch(
                c.core.list_namespaced_config_map,
                ctx.namespace,
                label_selector="page=never",
                timeout_seconds=1,
            ),
            want=1,
        )
        return {"events": events, "endedByServer": time.monotonic() - t0 < 10}

    def delete_cm(c: Official, ctx: Context) -> Any:
        c.core.delete_namespaced_config_map("oc-cm", ctx.namespace)

    def delete_cm_missing(c: Official, ctx: Context) -> Any:
        c.core.delete_namespaced_config_map("oc-cm", ctx.namespace)

    def delete_cm_precondition(c: Official, ctx: Context) -> Any:
        opts = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-the-uid"))
        c.core.delete_namespaced_config_map("oc-page-1", ctx.namespace, body=opts)

    def delete_collection(c: Official, ctx: Context) -> Any:
        c.core.delete_collection_namespaced_config_map(ctx.namespace, label_selector="page=yes")

    def create_invalid_cm(c: Official, ctx: Context) -> Any:
        body = client.V1ConfigMap(metadata=_meta("Bad_Name"), data={"bad key": "x"})
        c.core.create_namespaced_config_map(ctx.namespace, body)

    # pods ------------------------------------------------------------------------------
    def pod(name: str) -> client.V1Pod:
        return client.V1Pod(
            metadata=_meta(name, labels={"app": name, **ns_label}),
            spec=client.V1PodSpec(
                scheduler_name="drahealth-differential",
                containers=[client.V1Container(name="c", image="registry.example/app:1.0")],
                automount_service_account_token=False,
            ),
        )

    def create_pod(c: Official, ctx: Context) -> Any:
        c.core.create_namespaced_pod(ctx.namespace, pod("oc-pod"))

    def read_pod(c: Official, ctx: Context) -> Any:
        c.core.read_namespaced_pod("oc-pod", ctx.namespace)

    def strategic_pod(c: Official, ctx: Context) -> Any:
        patch = {
            "metadata": {"labels": {"tier": "x"}},
            "spec": {
                "tolerations": [
                    {"key": "example.com/unhealthy", "operator": "Exists", "effect": "NoSchedule"}
                ]
            },
        }
        c.core.patch_namespaced_pod("oc-pod", ctx.namespace, patch)

    def merge_pod(c: Official, ctx: Context) -> Any:
        patch = {"metadata": {"annotations": {"oc": "merged"}}}
        c.core.patch_namespaced_pod("oc-pod", ctx.namespace, patch, _content_type=MERGE)

    def replace_pod(c: Official, ctx: Context) -> Any:
        p = c.core.read_namespaced_pod("oc-pod", ctx.namespace)
        p.metadata.labels = {**(p.metadata.labels or {}), "replaced": "yes"}
        c.core.replace_namespaced_pod("oc-pod", ctx.namespace, p)

    def replace_pod_forbidden(c: Official, ctx: Context) -> Any:
        p = c.core.read_namespaced_pod("oc-pod", ctx.namespace)
        p.spec.containers[0].name = "renamed"
        c.core.replace_namespaced_pod("oc-pod", ctx.namespace, p)

    def pod_status(c: Official, ctx: Context) -> Any:
        patch = {
            "status": {
                "conditions": [
                    {
                        "type": "example.com/Healthy",
                        "status": "True",
                        "lastTransitionTime": "2026-01-02T03:04:05Z",
                    }
                ]
            }
        }
        c.core.patch_namespaced_pod_status("oc-pod", ctx.namespace, patch)

    def read_pod_status(c: Official, ctx: Context) -> Any:
        c.core.read_namespaced_pod_status("oc-pod", ctx.namespace)

    def list_pods(c: Official, ctx: Context) -> Any:
        c.core.list_namespaced_pod(
            ctx.namespace,
            label_selector="drahealth.example/oc=yes",
            field_selector="spec.schedulerName=drahealth-differential,status.phase=Pending",
        )

    def create_evictable(c: Official, ctx: Context) -> Any:
        c.core.create_namespaced_pod(ctx.namespace, pod("oc-evict"))

    def evict(c: Official, ctx: Context) -> Any:
        body = client.V1Eviction(
            metadata=_meta("oc-evict", namespace=ctx.namespace),
            delete_options=client.V1DeleteOptions(grace_period_seconds=0),
        )
        c.core.create_namespaced_pod_eviction("oc-evict", ctx.namespace, body)

    def evict_missing(c: Official, ctx: Context) -> Any:
        body = client.V1Eviction(metadata=_meta("oc-evict", namespace=ctx.namespace))
        c.core.create_namespaced_pod_eviction("oc-evict", ctx.namespace, body)

    def create_pdb(c: Official, ctx: Context) -> Any:
        body = client.V1PodDisruptionBudget(
            metadata=_meta("oc-pdb"),
            spec=client.V1PodDisruptionBudgetSpec(
                max_unavailable=0,
                selector=client.V1LabelSelector(match_labels={"app": "oc-nothing"}),
            ),
        )
        c.policy.create_namespaced_pod_disruption_budget(ctx.namespace, body)

    def delete_pdb(c: Official, ctx: Context) -> Any:
        c.policy.delete_namespaced_pod_disruption_budget("oc-pdb", ctx.namespace)

    def delete_pod(c: Official, ctx: Context) -> Any:
        c.core.delete_namespaced_pod("oc-pod", ctx.namespace, grace_period_seconds=0)

    # nodes -----------------------------------------------------------------------------
    def create_node(c: Official, ctx: Context) -> Any:
        body = client.V1Node(
            metadata=_meta(
                f"{ctx.prefix}-oc-node", labels={"drahealth.example/run": f"{ctx.prefix}-oc"}
            ),
            spec=client.V1NodeSpec(provider_id="example://oc-node"),
        )
        c.core.create_node(body)

    def cordon(c: Official, ctx: Context) -> Any:
        c.core.patch_node(f"{ctx.prefix}-oc-node", {"spec": {"unschedulable": True}})

    def node_status(c: Official, ctx: Context) -> Any:
        patch = {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "ready",
                        "lastHeartbeatTime": "2026-01-02T03:04:05Z",
                        "lastTransitionTime": "2026-01-02T03:04:05Z",
                    }
                ],
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            }
        }
        c.core.patch_node_status(f"{ctx.prefix}-oc-node", patch)

    def read_node(c: Official, ctx: Context) -> Any:
        c.core.read_node(f"{ctx.prefix}-oc-node")

    def list_nodes(c: Official, ctx: Context) -> Any:
        c.core.list_node(
            label_selector=f"drahealth.example/run={ctx.prefix}-oc",
            field_selector="spec.unschedulable=true",
        )

    def uncordon_taint(c: Official, ctx: Context) -> Any:
        node = c.core.read_node(f"{ctx.prefix}-oc-node")
        # unconditional (a Node allows it): the real node lifecycle controller may write
        # the Node between the read and the replace (a stale heartbeat), a 409 by chance
        node.metadata.resource_version = None
        node.spec.unschedulable = None
        node.spec.taints = [
            client.V1Taint(key="example.com/gpu-unhealthy", value="ecc", effect="NoSchedule")
        ]
        c.core.replace_node(f"{ctx.prefix}-oc-node", node)

    def delete_node(c: Official, ctx: Context) -> Any:
        c.core.delete_node(f"{ctx.prefix}-oc-node")

    # events ----------------------------------------------------------------------------
    def create_event(c: Official, ctx: Context) -> Any:
        body = client.CoreV1Event(
            metadata=_meta("oc-pod.unhealthy", namespace=ctx.namespace),
            involved_object=client.V1ObjectReference(
                kind="Pod", name="oc-pod", namespace=ctx.namespace, api_version="v1"
            ),
            reason="DeviceUnhealthy",
            message="gpu-0 reported an ECC error",
            type="Warning",
            count=1,
            first_timestamp=TS,
            last_timestamp=TS,
            source=client.V1EventSource(component="drahealth-agent", host="oc-node"),
        )
        c.core.create_namespaced_event(ctx.namespace, body)

    def patch_event(c: Official, ctx: Context) -> Any:
        patch = {"count": 2, "lastTimestamp": "2026-01-02T03:05:05Z"}
        c.core.patch_namespaced_event("oc-pod.unhealthy", ctx.namespace, patch)

    def list_events(c: Official, ctx: Context) -> Any:
        c.core.list_namespaced_event(
            ctx.namespace,
            field_selector="involvedObject.kind=Pod,involvedObject.name=oc-pod,type=Warning",
        )

    def create_v1_event(c: Official, ctx: Context) -> Any:
        body = client.EventsV1Event(
            metadata=_meta("oc-pod.v1", namespace=ctx.namespace),
            event_time=TS_MICRO,
            reporting_controller="example.com/drahealth",
            reporting_instance="oc-node",
            action="Remediate",
            reason="DeviceUnhealthy",
            regarding=client.V1ObjectReference(
                kind="Pod", name="oc-pod", namespace=ctx.namespace, api_version="v1"
            ),
            note="tainted gpu-0",
            type="Normal",
        )
        c.events.create_namespaced_event(ctx.namespace, body)

    def create_event_invalid(c: Official, ctx: Context) -> Any:
        body = client.CoreV1Event(
            metadata=_meta("oc-bad-event", namespace=ctx.namespace),
            involved_object=client.V1ObjectReference(kind="Pod", name="oc-pod", namespace="other"),
            type="Sometimes",
        )
        c.core.create_namespaced_event(ctx.namespace, body)

    def delete_event(c: Official, ctx: Context) -> Any:
        c.core.delete_namespaced_event("oc-pod.unhealthy", ctx.namespace)

    def oc(id: str, call: Call, **kw: Any) -> OfficialCall:
        return OfficialCall(id=f"official {id}", source=SOURCE, call=call, **kw)

    return [
        oc("configmap create", create_cm),
        oc("configmap read", read_cm),
        oc("configmap patch strategic", strategic_cm),
        oc("configmap patch merge", merge_cm),
        oc("configmap patch json", json_patch_cm),
        oc("configmap patch json test fails", json_patch_cm_failed_test),
        oc("configmap replace", replace_cm),
        oc("configmap replace stale", replace_cm_stale),
        oc("configmap create invalid", create_invalid_cm),
        oc("configmaps create for paging", create_pages),
        oc("configmap list labels", list_label),
        oc("configmap list fields", list_field),
        oc("configmap list limit continue", list_paged),
        oc("configmap list bad selector", list_bad_selector),
        oc("configmap list bad continue", list_bad_continue),
        oc("configmap watch initial", watch_initial),
        oc("configmap watch changes", watch_changes),
        oc("configmap watch timeout", watch_timeout),
        oc("configmap delete precondition", delete_cm_precondition),
        oc("configmap delete", delete_cm),
        oc("configmap delete missing", delete_cm_missing),
        oc("configmap delete collection", delete_collection),
        oc("pod create", create_pod),
        oc("pod read", read_pod),
        oc("pod patch strategic", strategic_pod),
        oc("pod patch merge", merge_pod),
        oc("pod replace", replace_pod),
        oc("pod replace forbidden", replace_pod_forbidden),
        oc("pod status patch", pod_status),
        oc("pod status read", read_pod_status),
        oc("pod list selectors", list_pods),
        oc("pdb create", create_pdb),
        oc("pod create evictable", create_evictable),
        oc("pod evict", evict),
        oc("pod evict missing", evict_missing),
        oc("pdb delete", delete_pdb),
        oc("node create", create_node),
        oc("node cordon", cordon),
        oc("node status patch", node_status),
        oc("node read", read_node),
        oc("node list selectors", list_nodes),
        oc("node replace taint", uncordon_taint),
        oc("event create", create_event),
        oc("event patch", patch_event),
        oc("event list fields", list_events),
        oc("event v1 create", create_v1_event),
        oc("event create invalid", create_event_invalid),
        oc("event delete", delete_event),
        oc("pod delete", delete_pod),
        oc("node delete", delete_node),
    ]


def dra_cases() -> list[Case]:
    def driver(ctx: Context) -> str:
        return f"oc.{ctx.prefix}.example.com"

    def cls_name(ctx: Context) -> str:
        return f"{ctx.prefix}-oc-class"

    def create_class(c: Official, ctx: Context) -> Any:
        body = client.V1DeviceClass(
            metadata=_meta(cls_name(ctx), labels={"drahealth.example/oc": "yes"}),
            spec=client.V1DeviceClassSpec(
                selectors=[
                    client.V1DeviceSelector(
                        cel=client.V1CELDeviceSelector(
                            expression=f'device.driver == "{driver(ctx)}"'
                        )
                    )
                ]
            ),
        )
        c.dra.create_device_class(body)

    def read_class(c: Official, ctx: Context) -> Any:
        c.dra.read_device_class(cls_name(ctx))

    def patch_class(c: Official, ctx: Context) -> Any:
        c.dra.patch_device_class(
            cls_name(ctx), {"metadata": {"annotations": {"oc": "patched"}}}, _content_type=MERGE
        )

    def replace_class(c: Official, ctx: Context) -> Any:
        cls = c.dra.read_device_class(cls_name(ctx))
        cls.spec.extended_resource_name = "example.com/gpu"
        c.dra.replace_device_class(cls_name(ctx), cls)

    def list_classes(c: Official, ctx: Context) -> Any:
        c.dra.list_device_class(label_selector="drahealth.example/oc=yes")

    def create_class_invalid(c: Official, ctx: Context) -> Any:
        body = client.V1DeviceClass(
            metadata=_meta(f"{ctx.prefix}-oc-bad"),
            spec=client.V1DeviceClassSpec(
                selectors=[
                    client.V1DeviceSelector(
                        cel=client.V1CELDeviceSelector(expression="device.driver ==")
                    )
                ]
            ),
        )
        c.dra.create_device_class(body)

    def create_slice(c: Official, ctx: Context) -> Any:
        body = client.V1ResourceSlice(
            metadata=_meta(f"{ctx.prefix}-oc-slice"),
            spec=client.V1ResourceSliceSpec(
                driver=driver(ctx),
                pool=client.V1ResourcePool(name="oc-pool", generation=1, resource_slice_count=1),
                node_name=f"{ctx.prefix}-oc-node",
                devices=[
                    client.V1Device(
                        name="gpu-0",
                        attributes={
                            "model": client.V1DeviceAttribute(string="LATEST-GPU-MODEL"),
                            "index": client.V1DeviceAttribute(int=0),
                        },
                        capacity={"memory": client.V1DeviceCapacity(value="80Gi")},
                    ),
                    client.V1Device(name="gpu-1"),
                ],
            ),
        )
        c.dra.create_resource_slice(body)

    def taint_slice(c: Official, ctx: Context) -> Any:
        s = c.dra.read_resource_slice(f"{ctx.prefix}-oc-slice")
        s.spec.devices[0].taints = [
            client.V1DeviceTaint(
                key="example.com/unhealthy", value="ecc", effect="NoSchedule", time_added=TS
            )
        ]
        s.spec.pool.generation = 2
        c.dra.replace_resource_slice(f"{ctx.prefix}-oc-slice", s)

    def patch_slice(c: Official, ctx: Context) -> Any:
        c.dra.patch_resource_slice(
            f"{ctx.prefix}-oc-slice", {"metadata": {"labels": {"oc": "patched"}}}
        )

    def list_slices(c: Official, ctx: Context) -> Any:
        c.dra.list_resource_slice(field_selector=f"spec.driver={driver(ctx)}")

    def list_slices_node(c: Official, ctx: Context) -> Any:
        c.dra.list_resource_slice(field_selector=f"spec.nodeName={ctx.prefix}-oc-node")

    def watch_slices(c: Official, ctx: Context) -> Any:
        return _events(
            _watch(
                c.dra.list_resource_slice,
                field_selector=f"spec.driver={driver(ctx)}",
                timeout_seconds=5,
            ),
            want=1,
        )

    def create_claim(c: Official, ctx: Context) -> Any:
        body = client.ResourceV1ResourceClaim(
            metadata=_meta("oc-claim", labels={"app": "oc"}),
            spec=client.V1ResourceClaimSpec(
                devices=client.V1DeviceClaim(
                    requests=[
                        client.V1DeviceRequest(
                            name="gpu",
                            exactly=client.V1ExactDeviceRequest(
                                device_class_name=cls_name(ctx), allocation_mode="ExactCount"
                            ),
                        )
                    ]
                )
            ),
        )
        c.dra.create_namespaced_resource_claim(ctx.namespace, body)

    def read_claim(c: Official, ctx: Context) -> Any:
        c.dra.read_namespaced_resource_claim("oc-claim", ctx.namespace)

    def patch_claim(c: Official, ctx: Context) -> Any:
        c.dra.patch_namespaced_resource_claim(
            "oc-claim", ctx.namespace, {"metadata": {"labels": {"tier": "x"}}}
        )

    def allocate_claim(c: Official, ctx: Context) -> Any:
        claim = c.dra.read_namespaced_resource_claim("oc-claim", ctx.namespace)
        pod = c.core.read_namespaced_pod("oc-pod", ctx.namespace)
        claim.status = client.V1ResourceClaimStatus(
            allocation=client.V1AllocationResult(
                devices=client.V1DeviceAllocationResult(
                    results=[
                        client.V1DeviceRequestAllocationResult(
                            request="gpu", driver=driver(ctx), pool="oc-pool", device="gpu-0"
                        )
                    ]
                ),
                node_selector=client.V1NodeSelector(
                    node_selector_terms=[
                        client.V1NodeSelectorTerm(
                            match_fields=[
                                client.V1NodeSelectorRequirement(
                                    key="metadata.name",
                                    operator="In",
                                    values=[f"{ctx.prefix}-oc-node"],
                                )
                            ]
                        )
                    ]
                ),
            ),
            reserved_for=[
                client.V1ResourceClaimConsumerReference(
                    resource="pods", name="oc-pod", uid=pod.metadata.uid
                )
            ],
        )
        c.dra.replace_namespaced_resource_claim_status("oc-claim", ctx.namespace, claim)

    def device_status(c: Official, ctx: Context) -> Any:
        patch = {
            "status": {
                "devices": [
                    {
                        "driver": driver(ctx),
                        "pool": "oc-pool",
                        "device": "gpu-0",
                        "conditions": [
                            {
                                "type": "Ready",
                                "status": "True",
                                "reason": "Healthy",
                                "message": "",
                                "lastTransitionTime": "2026-01-02T03:04:05Z",
                            }
                        ],
                    }
                ]
            }
        }
        c.dra.patch_namespaced_resource_claim_status(
            "oc-claim", ctx.namespace, patch, _content_type=MERGE, field_manager=driver(ctx)
        )

    def read_claim_status(c: Official, ctx: Context) -> Any:
        c.dra.read_namespaced_resource_claim_status("oc-claim", ctx.namespace)

    def claim_spec_immutable(c: Official, ctx: Context) -> Any:
        claim = c.dra.read_namespaced_resource_claim("oc-claim", ctx.namespace)
        claim.spec.devices.requests[0].exactly.count = 2
        c.dra.replace_namespaced_resource_claim("oc-claim", ctx.namespace, claim)

    def list_claims(c: Official, ctx: Context) -> Any:
        c.dra.list_namespaced_resource_claim(ctx.namespace, label_selector="app=oc")

    def create_claim_invalid(c: Official, ctx: Context) -> Any:
        body = client.ResourceV1ResourceClaim(
            metadata=_meta("oc-bad-claim"),
            spec=client.V1ResourceClaimSpec(
                devices=client.V1DeviceClaim(
                    requests=[
                        client.V1DeviceRequest(
                            name="Bad_Request",
                            exactly=client.V1ExactDeviceRequest(
                                device_class_name="", allocation_mode="Sometimes", count=0
                            ),
                        )
                    ]
                )
            ),
        )
        c.dra.create_namespaced_resource_claim(ctx.namespace, body)

    def deallocate_claim(c: Official, ctx: Context) -> Any:
        c.dra.patch_namespaced_resource_claim_status(
            "oc-claim",
            ctx.namespace,
            {"status": {"allocation": None, "reservedFor": None, "devices": None}},
            _content_type=MERGE,
        )

    def delete_claim(c: Official, ctx: Context) -> Any:
        c.dra.delete_namespaced_resource_claim("oc-claim", ctx.namespace)

    # DeviceTaintRule: resource.k8s.io/v1 from 1.37 (typed) and as a custom object ------
    def rule_name(ctx: Context) -> str:
        return f"{ctx.prefix}-oc-rule"

    def create_rule(c: Official, ctx: Context) -> Any:
        body = client.V1DeviceTaintRule(
            metadata=_meta(rule_name(ctx)),
            spec=client.V1DeviceTaintRuleSpec(
                device_selector=client.V1DeviceTaintSelector(
                    driver=driver(ctx), pool="oc-pool", device="gpu-1"
                ),
                taint=client.V1DeviceTaint(
                    key="example.com/unhealthy", value="ecc", effect="NoSchedule"
                ),
            ),
        )
        c.dra.create_device_taint_rule(body)

    def rule_status(c: Official, ctx: Context) -> Any:
        patch = {
            "status": {
                "conditions": [
                    {
                        "type": "example.com/Reviewed",
                        "status": "True",
                        "reason": "Reviewed",
                        "message": "",
                        "observedGeneration": 1,
                        "lastTransitionTime": "2026-01-02T03:04:05Z",
                    }
                ]
            }
        }
        c.dra.patch_device_taint_rule_status(rule_name(ctx), patch, _content_type=MERGE)

    def custom_get_rule(c: Official, ctx: Context) -> Any:
        c.custom.get_cluster_custom_object(
            "resource.k8s.io", "v1", "devicetaintrules", rule_name(ctx)
        )

    def custom_patch_rule(c: Official, ctx: Context) -> Any:
        c.custom.patch_cluster_custom_object(
            "resource.k8s.io",
            "v1",
            "devicetaintrules",
            rule_name(ctx),
            {"spec": {"taint": {"effect": "NoExecute"}}},
        )

    def custom_list_rules(c: Official, ctx: Context) -> Any:
        return [
            i["metadata"]["name"]
            for i in c.custom.list_cluster_custom_object(
                "resource.k8s.io", "v1", "devicetaintrules"
            )["items"]
            if i["metadata"]["name"].startswith(f"{ctx.prefix}-oc")
        ]

    def custom_create_rule_invalid(c: Official, ctx: Context) -> Any:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": f"{ctx.prefix}-oc-bad-rule"},
            "spec": {
                "deviceSelector": {"driver": "Not A Driver"},
                "taint": {"key": "bad key", "effect": "Sometimes"},
            },
        }
        c.custom.create_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules", body)

    def custom_delete_rule(c: Official, ctx: Context) -> Any:
        c.custom.delete_cluster_custom_object(
            "resource.k8s.io", "v1", "devicetaintrules", rule_name(ctx)
        )

    def delete_slice(c: Official, ctx: Context) -> Any:
        c.dra.delete_resource_slice(f"{ctx.prefix}-oc-slice")

    def delete_class(c: Official, ctx: Context) -> Any:
        c.dra.delete_device_class(cls_name(ctx))

    def oc(id: str, call: Call, **kw: Any) -> OfficialCall:
        return OfficialCall(id=f"official {id}", source=SOURCE, call=call, dra=True, **kw)

    return [
        oc("deviceclass create", create_class),
        oc("deviceclass read", read_class),
        oc("deviceclass patch merge", patch_class),
        oc("deviceclass replace", replace_class),
        oc("deviceclass list labels", list_classes),
        oc("deviceclass create invalid", create_class_invalid),
        oc("resourceslice create", create_slice),
        oc("resourceslice replace taints", taint_slice),
        oc("resourceslice patch strategic", patch_slice),
        oc("resourceslice list driver", list_slices),
        oc("resourceslice list node", list_slices_node),
        oc("resourceslice watch", watch_slices),
        oc("resourceclaim create", create_claim),
        oc("resourceclaim read", read_claim),
        oc("resourceclaim patch strategic", patch_claim),
        oc("resourceclaim status replace allocate", allocate_claim),
        oc("resourceclaim status patch devices", device_status),
        oc("resourceclaim status read", read_claim_status),
        oc("resourceclaim replace spec immutable", claim_spec_immutable),
        oc("resourceclaim list labels", list_claims),
        oc("resourceclaim create invalid", create_claim_invalid),
        oc("resourceclaim status deallocate", deallocate_claim),
        oc("resourceclaim delete", delete_claim),
        oc("devicetaintrule create", create_rule),
        oc("devicetaintrule status patch", rule_status),
        oc("devicetaintrule custom get", custom_get_rule),
        oc("devicetaintrule custom patch", custom_patch_rule),
        oc("devicetaintrule custom list", custom_list_rules),
        oc("devicetaintrule custom create invalid", custom_create_rule_invalid),
        oc("devicetaintrule custom delete", custom_delete_rule),
        oc("resourceslice delete", delete_slice),
        oc("deviceclass delete", delete_class),
    ]


def official_cases() -> list[Case]:
    """The official client's calls: core first (the DRA claim reserves its pod), then DRA.
    The pod and node the claim refers to are deleted last."""
    core = core_cases()
    tail = [c for c in core if c.id in ("official pod delete", "official node delete")]
    return [*[c for c in core if c not in tail], *dra_cases(), *tail]
