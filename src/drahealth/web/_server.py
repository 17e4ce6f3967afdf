"""The dashboard's HTTP server: one page, a JSON snapshot and a server-sent event stream.

Owns :class:`Dashboard` (aiohttp). Routes: ``/`` the page (``static/index.html``, no
build step), ``/api/state`` the current :func:`~._state.snapshot` with its sequence
number ``seq`` and the counts over time (``samples``), ``/api/events`` a
``text/event-stream`` that sends that state at once (``event: state``) and after every
change only what changed (``event: delta``: ``seq``, the devices ``set`` (each with its
``node``) and the keys ``del``-eted, the page-wide parts when they changed, the new
counts ``sample`` and ``sampleReplaces``, true when it takes the last one's place),
coalesced; a comment every 15 s keeps proxies from closing it.
``/api/history?device=DRIVER/POOL/DEVICE`` the device's controller actions and Events,
each row with its ``source`` (the controller's own records, or the pod whose namespace
wrote the Event: see :func:`~drahealth.remedy.history_source`),
``/api/timeline?device=DRIVER/POOL/DEVICE`` its health timeline (see
:class:`~._timeline.Timeline`: bounded per device, in devices and in samples), and
``/healthz``. The page's filters live in the URL's fragment, which browsers never send:
the server takes no query parameter but ``device`` (at most :data:`MAX_DEVICE_PARAM`
characters) and ``/``'s ``token``. Reflectors on the kinds the snapshot reads keep it
current, each DRA kind at the version the server serves (discovered at start); a kind it
does not serve gets no reflector, and the state's ``unavailable`` lines (shown on the
page) say so; device health comes only from the node agents' records in
``agent_namespace`` (see :mod:`drahealth.core`). The remediation controller's state
ConfigMap in ``history_namespace`` (the controller's) is followed too, for its circuit
breaker banner and per-device markers; without access to it the page shows none. So are
the ``EvictionBlocked`` Events the controller writes when a PodDisruptionBudget refuses
an eviction (field selector ``reason=EvictionBlocked``; optional). Without DeviceTaintRules
the state also shows drahealth's fences (node taints and cordons from the Nodes, quarantine
claims in ``history_namespace``): each fenced device's ``fencedBy`` and the page-wide
``pending`` list of the Pending pods they block (see :mod:`._state`); the watches keep
only the claims of that namespace and the unschedulable pods for it. The JSON served is
always valid JSON: a state that cannot be written without NaN/Infinity is not published
(the last good one stays).

Bounds: at most :data:`MAX_STREAMS_PER_CLIENT` event streams per client address and
:data:`MAX_STREAMS` in all. A new stream is never refused for want of room: past a
client's own limit its oldest stream is closed, past the global one the oldest stream
of the client holding the most is (an EventSource reconnects by itself). So readers
that pile up cannot lock the operator out, and streams never use up the connections
the page, ``/api/state`` and ``/healthz`` need. Each stream
holds at most :data:`STREAM_QUEUE` deltas not yet sent, and one write may block at most
:data:`STREAM_WRITE_TIMEOUT` seconds: a client that falls behind either way is
disconnected (the browser's EventSource reconnects and gets the current state).

Access: without a token the dashboard is read-only (the actions answer 403). With a
token, every route but ``/healthz`` needs it (``Authorization: Bearer <token>``, or
the HttpOnly cookie that ``/?token=<token>`` sets), and two actions are served:
``POST /api/taint`` ``{"device", "key", "value", "effect"}`` (the operator's rule, as
``drahealth taint``) and ``POST /api/untaint`` ``{"device", "key"}`` (as ``drahealth
untaint``). Bad bodies get 400 naming the field; nothing is written then. Every
POST/PUT/PATCH/DELETE must be ``Content-Type: application/json`` (else 415), so a
cross-site form or ``text/plain`` request cannot ride on the cookie.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import web
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod

from drahealth._aio import cancel_and_wait
from drahealth._http_guard import HTTPGuard, HTTPLimits
from drahealth._served import not_served_note
from drahealth._text import json_text
from drahealth.core import (
    DEFAULT_NAMESPACE,
    LABELS,
    ClusterModel,
    DeviceKey,
    Observation,
    RemediationState,
    agent_records,
    decode_devices,
    history_label,
    mentions_device,
    parse_state_data,
)
from drahealth.kube import DiscoveryError, Reflector, ServedAPIs, as_dict, discover, to_internal
from drahealth.remedy import (
    HISTORY_CONFIGMAP,
    STATE_CONFIGMAP,
    RuleAPIUnavailable,
    RuleError,
    apply_taint,
    history_source,
    parse_device,
    remove_taints,
    unschedulable,
)
from drahealth.web._state import (
    Context,
    PodFacts,
    device_entry,
    finite,
    fleet_context,
    health,
    pod_facts,
    slice_devices,
)
from drahealth.web._timeline import Timeline

__all__ = ["Dashboard"]

log = logging.getLogger(__name__)

COOKIE = "drahealth_token"
READ_ONLY = "the dashboard is read-only: start it with --token-file to allow taint/untaint"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Event streams served at once (well under the connection limit: the rest is for pages).
MAX_STREAMS = 128
#: Event streams one client address may hold at once.
MAX_STREAMS_PER_CLIENT = 16
#: States a stream may be behind before its client is disconnected.
STREAM_QUEUE = 8
#: Seconds one write to a stream may block before its client is disconnected.
STREAM_WRITE_TIMEOUT = 10.0
#: Seconds between full passes while only agents' records change (holds expire with time).
FULL_EVERY = 30.0
#: Characters a ``device`` query parameter may have (three names of at most 253, and two /).
MAX_DEVICE_PARAM = 761
#: Reflector name -> the DRA kind it follows (at the version the server serves).
_DRA_REFLECTORS = {"claims": "ResourceClaim", "slices": "ResourceSlice", "rules": "DeviceTaintRule"}
#: Reflectors the first snapshot does not wait for (the page works without them).
_OPTIONAL = frozenset({"nodes", "remediation", "blocked"})
#: Reflector name -> the kind its events feed into the model.
_MODEL_KINDS = {
    "pods": "Pod", "claims": "ResourceClaim", "slices": "ResourceSlice", "rules": "DeviceTaintRule",
}  # fmt: skip


class Dashboard:
    """See the module docstring. ``start()`` returns once the first snapshot is built."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        history_namespace: str = "default",
        token: str | None = None,
        agent_namespace: str = DEFAULT_NAMESPACE,
        limits: HTTPLimits | None = None,
        allowed_hosts: tuple[str, ...] = (),
        served: ServedAPIs | None = None,
    ) -> None:
        self.http_limits = limits or HTTPLimits(max_connections=256)
        self.allowed_hosts = allowed_hosts
        if token is not None and len(token) < 16:
            raise ValueError("the dashboard token must be at least 16 characters")
        self.token = token
        self.client = client
        self.history_namespace = history_namespace
        self.agent_namespace = agent_namespace
        #: What the server serves (asked in ``start`` when not given).
        self.served = served
        #: One line per DRA kind the server does not serve (shown on the page).
        self.unavailable: list[str] = []
        self.reflectors: dict[str, Reflector[Any]] = {
            "health": Reflector(
                client, ConfigMap, namespace=agent_namespace, labels=LABELS, name="web-health"
            ),
            "pods": Reflector(client, Pod, name="web-pods"),
            # the node taints and cordons of the controller's node-level modes
            "nodes": Reflector(client, Node, name="web-nodes"),
            # the controller's guard rails: breaker, needs-human, holds, ... (optional)
            "remediation": Reflector(
                client, ConfigMap, namespace=history_namespace,
                fields={"metadata.name": STATE_CONFIGMAP}, name="web-remediation",
            ),
            # evictions a PodDisruptionBudget refused (the controller's Events; optional)
            "blocked": Reflector(
                client, Event, fields={"reason": "EvictionBlocked"}, name="web-blocked"
            ),
        }  # fmt: skip
        #: The page-wide part of the state and its sequence number (devices: ``_devices``).
        self.state: dict[str, Any] = {"seq": 0, "unavailable": []}
        self._text: str | None = None
        #: Each device's last published state and node, by key (what deltas are cut from).
        self._devices: dict[str, tuple[str, dict[str, Any]]] = {}
        self._page: dict[str, Any] = {}
        #: Health timelines and counts over time (bounded).
        self.timeline = Timeline()
        self._subscribers: dict[asyncio.Queue[str], web.Request] = {}
        self.stream_queue = STREAM_QUEUE
        self.stream_write_timeout = STREAM_WRITE_TIMEOUT
        #: Streams disconnected for falling behind, since start.
        self.slow_streams_closed = 0
        #: Streams closed to make room for a newer one, since start.
        self.streams_replaced = 0
        self._warned: set[str] = set()
        #: The state ConfigMap's resourceVersion and its reading (parsed once per change).
        self._remedy_state: tuple[str, RemediationState] | None = None
        self._dirty = asyncio.Event()
        #: What the watches said, kept up to date event by event (no rebuild per change):
        #: claims, pods, slices and rules in the core's model; each slice's devices; each
        #: pod's eviction facts; each agent record decoded once per resourceVersion.
        self.model = ClusterModel()
        self._slice_devices: dict[str, list[tuple[str, DeviceKey]]] = {}
        self._pod_facts: PodFacts = {}
        #: for drahealth's fences: the claims of the controller's namespace (quarantine
        #: claims are there), and the pods the scheduler left unschedulable
        self._ns_claims: dict[tuple[str, str], dict[str, Any]] = {}
        self._unschedulable: dict[tuple[str, str], dict[str, Any]] = {}
        self._records: dict[str, tuple[str, dict[DeviceKey, Observation] | None]] = {}
        #: Devices whose agent record changed since the last pass; whether anything else
        #: changed (a full pass is due), when the last one ran, and what it built.
        self._record_dirty: set[DeviceKey] = set()
        self._full, self._full_at = True, 0.0
        self._ctx: Context | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _discover(self) -> ServedAPIs:
        try:
            return await discover(self.client)
        except DiscoveryError as exc:
            cause = exc.__cause__
            if isinstance(cause, Exception) and not isinstance(cause, DiscoveryError):
                raise cause from cause.__cause__  # unreachable: the caller says why
            log.warning("dashboard: %s; assuming resource.k8s.io/v1 for every kind", exc)
            return ServedAPIs.all_v1()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        if self.served is None:
            self.served = await self._discover()
        for key, kind in _DRA_REFLECTORS.items():
            resource = self.served.resource(kind)
            if resource is None:  # not served: no reflector, the page says so
                self.unavailable.append(not_served_note(kind, self.served))
                log.warning("dashboard: %s", self.unavailable[-1])
                continue
            self.reflectors[key] = Reflector(self.client, resource, name=f"web-{key}")
        for key, r in self.reflectors.items():
            if key in _MODEL_KINDS:
                r.add_handler(self._feed(key))
            if key != "health":  # anything but a record may change many devices
                r.add_handler(self._everything_changed)
            r.add_handler(lambda *_a: self._dirty.set())
            await r.start()
        for key, r in self.reflectors.items():
            if key not in _OPTIONAL:  # a dashboard without access to these still runs
                await r.wait_synced()
        self._refresh()
        self._tasks.append(asyncio.create_task(self._loop(), name="dashboard-refresh"))
        guard = HTTPGuard(host, limits=self.http_limits, allowed_hosts=self.allowed_hosts)
        app = web.Application(
            middlewares=[*guard.middlewares, self._auth], client_max_size=64 * 1024
        )
        app.router.add_get("/", self._index)
        app.router.add_post("/api/taint", self._taint)
        app.router.add_post("/api/untaint", self._untaint)
        app.router.add_get("/api/state", self._state)
        app.router.add_get("/api/events", self._events)
        app.router.add_get("/api/history", self._history)
        app.router.add_get("/api/timeline", self._timeline)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None, **guard.runner_kwargs)
        await self._runner.setup()
        site = guard.site(self._runner, host, port)
        await site.start()
        bound = port
        for address in self._runner.addresses:
            bound = int(address[1])
            break
        self.url = f"http://{host}:{bound}/"
        return self.url

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        for q, request in list(self._subscribers.items()):
            try:
                q.put_nowait("")  # wake streams so they end
            except asyncio.QueueFull:
                self._disconnect(q, request)
        if self._runner is not None:
            await self._runner.cleanup()
        for r in self.reflectors.values():
            await r.stop()

    # -- state -----------------------------------------------------------------------

    def _warn(self, message: str) -> None:
        if message not in self._warned and len(self._warned) < 1000:  # once per problem
            self._warned.add(message)
            log.warning("dashboard: %s", message)

    def _feed(self, key: str) -> Callable[[str, Any, Any], None]:
        """The handler that keeps the model (and the parts beside it) up to date."""
        kind = _MODEL_KINDS[key]

        def on_event(event_type: str, obj: Any, _old: Any) -> None:
            raw = as_dict(obj)
            raw = raw if kind == "Pod" else to_internal(raw)
            self.model.apply(kind, event_type, raw)
            if kind == "ResourceSlice":
                name, devices = slice_devices(raw)
                self._slice_devices.pop(name, None)
                if event_type != "DELETED":
                    self._slice_devices[name] = devices
            elif kind == "Pod":
                ident, facts = pod_facts(raw)
                self._pod_facts.pop(ident, None)
                self._unschedulable.pop(ident, None)
                if event_type != "DELETED":
                    self._pod_facts[ident] = facts
                    if unschedulable(raw) is not None:
                        self._unschedulable[ident] = raw
            elif kind == "ResourceClaim":
                meta = raw.get("metadata") or {}
                ident = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
                self._ns_claims.pop(ident, None)
                if event_type != "DELETED" and ident[0] == self.history_namespace:
                    self._ns_claims[ident] = raw

        return on_event

    def _everything_changed(self, *_args: Any) -> None:
        self._full = True

    def _agent_records(self) -> list[dict[DeviceKey, Observation]]:
        """The agents' records, read and decoded once per resourceVersion, in name order."""
        decoded: dict[str, tuple[str, dict[DeviceKey, Observation] | None]] = {}
        for obj in self.reflectors["health"].store.list():
            meta = obj.metadata
            name = f"{meta.namespace}/{meta.name}" if meta is not None else ""
            version = (meta.resourceVersion if meta is not None else None) or ""
            old = self._records.get(name)
            if old is not None and version and old[0] == version:
                decoded[name] = old
                continue
            cm = as_dict(obj)
            ours = agent_records([cm], self.agent_namespace)
            decoded[name] = (version, decode_devices(cm) if ours else None)
            before, after = (old[1] if old else None) or {}, decoded[name][1] or {}
            self._record_dirty.update(k for k in before.keys() | after.keys()
                                      if before.get(k) != after.get(k))  # fmt: skip
        for name in self._records.keys() - decoded.keys():  # deleted records
            self._record_dirty.update(self._records[name][1] or ())
        self._records = decoded
        return [rec for _, rec in (decoded[n] for n in sorted(decoded)) if rec is not None]

    def _refresh(self) -> None:
        """Publish what changed since the last state: a full pass when anything but an
        agent's record changed (and at least every :data:`FULL_EVERY` seconds, even when
        nothing did, for operator holds that expire), else only the devices whose record
        changed."""
        r = self.reflectors
        now = time.time()
        records = self._agent_records()
        self.model.take_changed()  # pods' statuses come with pod events: a full pass
        devices: dict[str, tuple[str, dict[str, Any]]]
        if self._full or self._ctx is None or now - self._full_at >= FULL_EVERY:
            self._full, self._full_at, self._record_dirty = False, now, set()
            ctx = fleet_context(
                self.model, self._pod_facts, node_objects=r["nodes"].store.dicts(),
                remediation=self._remediation(), now=now,
                blocked_events=r["blocked"].store.dicts(),
                claim_objects=list(self._ns_claims.values()),
                quarantine_namespace=self.history_namespace,
                pod_objects=list(self._unschedulable.values()),
            )  # fmt: skip
            seen = health(self.model, records, self._warn)
            devices, known = {}, set()
            for name in sorted(self._slice_devices):
                for node, key in self._slice_devices[name]:
                    known.add(key)
                    devices[str(key)] = (node, device_entry(key, seen.get(key), ctx))
            for key, obs in seen.items():  # reported by an agent but not (yet) in a slice
                if key not in known:
                    devices[str(key)] = (obs.node or "(no node)", device_entry(key, obs, ctx))
            self._ctx, candidates = ctx, list(devices)
        else:
            dirty, self._record_dirty = self._record_dirty, set()
            if not dirty:
                return
            if any(str(key) not in self._devices for key in dirty):
                self._full = True  # a device no slice lists (yet): placed by a full pass
                return self._refresh()
            devices, ctx = dict(self._devices), self._ctx
            for key in dirty:
                found = next((rec[key] for rec in reversed(records) if key in rec), None)
                found = found if found is not None else self.model.observation(key)
                if found is None:  # nobody reports on it any more: a full pass decides
                    self._full = True
                    return self._refresh()
                entry = device_entry(key, finite(key, found, self._warn), ctx)
                devices[str(key)] = (devices[str(key)][0], entry)
            candidates = [str(key) for key in dirty]
        page = {
            "remediation": ctx.state.summary(),
            "unavailable": list(self.unavailable),
            "pending": ctx.pending,
        }
        changed = [
            {**devices[key][1], "node": devices[key][0]} for key in candidates
            if self._devices.get(key) != devices[key]
        ]  # fmt: skip
        removed = [key for key in self._devices if key not in devices]
        if not changed and not removed and page == self._page:
            return
        delta: dict[str, Any] = {"seq": self.state["seq"] + 1, "set": changed, "del": removed}
        if page != self._page:
            delta.update(page)
        try:  # every part of the state is checked once, as it changes
            text = json_text(delta, separators=(",", ":"))
        except ValueError as exc:  # NaN/Infinity would stop every viewer's page
            self._warn(f"state not published, it is not valid JSON: {exc}")
            return
        _, sample, replaces = self.timeline.observe((d for _, d in devices.values()), now)
        if sample is not None:  # the new counts sample, and whether it replaces the last one
            extra = json_text({"sample": sample, "sampleReplaces": replaces}, separators=(",", ":"))
            text = text[:-1] + "," + extra[1:]
        self.state = {"seq": delta["seq"], **page}
        self._devices, self._page, self._text = devices, page, None
        for q, request in list(self._subscribers.items()):
            try:
                q.put_nowait(text)
            except asyncio.QueueFull:
                self._disconnect(q, request)

    def state_text(self) -> str:
        """The whole state as JSON (built when first asked after a change)."""
        if self._text is None:
            nodes: dict[str, list[dict[str, Any]]] = {}
            for node, d in self._devices.values():
                nodes.setdefault(node, []).append(d)
            samples = self.timeline.samples
            state: dict[str, Any] = {
                **self.state,
                "nodes": [
                    {"name": name, "devices": sorted(ds, key=_device_order)}
                    for name, ds in sorted(nodes.items())
                ],
                "samples": list(samples),
                "maxSamples": samples.maxlen,
            }
            self._text = json_text(state, separators=(",", ":"))
        return self._text

    def _remediation(self) -> RemediationState:
        """The controller's state ConfigMap, as far as it can be read (notes logged once)."""
        found = [
            o for o in self.reflectors["remediation"].store.dicts()
            if (o.get("metadata") or {}).get("name") == STATE_CONFIGMAP
        ]  # fmt: skip
        if not found:
            return RemediationState()
        version = str((found[0].get("metadata") or {}).get("resourceVersion", ""))
        if self._remedy_state is None or self._remedy_state[0] != version or not version:
            state = parse_state_data(found[0].get("data"))  # once per change of the object
            for note in state.notes:
                self._warn(f"configmap {self.history_namespace}/{STATE_CONFIGMAP}: {note}")
            self._remedy_state = (version, state)
        return self._remedy_state[1]

    def _disconnect(self, queue: asyncio.Queue[str], request: web.Request) -> None:
        """Drop a stream whose client does not keep up; its EventSource reconnects."""
        if self._subscribers.pop(queue, None) is None:
            return
        self.slow_streams_closed += 1
        log.info("dashboard: closing a slow event stream (%s)", request.remote)
        if request.transport is not None:
            request.transport.abort()

    async def _loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(FULL_EVERY):
                    await self._dirty.wait()
            except TimeoutError:  # quiet: a full pass, for operator holds that expire
                self._full = True
            await asyncio.sleep(0.05)  # coalesce a burst of watch events
            self._dirty.clear()
            try:
                self._refresh()
            except Exception:
                log.exception("building the dashboard snapshot failed")

    # -- routes ----------------------------------------------------------------------

    async def _index(self, _request: web.Request) -> web.Response:
        page = resources.files("drahealth.web").joinpath("static/index.html").read_text()
        return web.Response(text=page, content_type="text/html")

    # -- access and actions ------------------------------------------------------------

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method in MUTATING and request.content_type != "application/json":
            return web.json_response(
                {"error": f"{request.method} needs Content-Type: application/json"}, status=415
            )
        if self.token is None or request.path == "/healthz":
            return await handler(request)
        offered = request.query.get("token") if request.path == "/" else None
        if offered is not None and self._is_token(offered):
            found = web.HTTPFound("/")
            found.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict")
            raise found
        header = request.headers.get("Authorization", "")
        given = header.removeprefix("Bearer ") if header.startswith("Bearer ") else None
        given = given if given is not None else request.cookies.get(COOKIE)
        if given is None or not self._is_token(given):
            return web.json_response({"error": "a valid token is required"}, status=401)
        return await handler(request)

    def _is_token(self, given: str) -> bool:
        """Whether ``given`` is the token (in constant time); text that is not UTF-8
        (undecodable header or cookie bytes) never is."""
        assert self.token is not None
        try:
            offered = given.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return hmac.compare_digest(offered, self.token.encode("utf-8"))

    async def _body(self, request: web.Request, fields: tuple[str, ...]) -> dict[str, str]:
        try:
            body = await request.json()
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            raise web.HTTPBadRequest(
                text=json.dumps({"error": "the body must be a JSON object"}),
                content_type="application/json",
            ) from None
        if not isinstance(body, dict):
            body = None
        problems = [
            f for f in fields
            if body is None or not isinstance(body.get(f, "" if f == "value" else None), str)
        ]  # fmt: skip
        if body is None or problems:
            raise web.HTTPBadRequest(
                text=json.dumps({"error": f"string field(s) required: {', '.join(problems)}"}),
                content_type="application/json",
            )
        return {f: str(body.get(f, "")) for f in fields}

    async def _taint(self, request: web.Request) -> web.Response:
        if self.token is None:
            return web.json_response({"error": READ_ONLY}, status=403)
        b = await self._body(request, ("device", "key", "value", "effect"))
        try:
            device = parse_device(b["device"])
            name, outcome = await apply_taint(
                self.client, device, key=b["key"], value=b["value"], effect=b["effect"],
                served=self.served, namespace=self.history_namespace,
            )  # fmt: skip
        except RuleAPIUnavailable as exc:
            return web.json_response({"error": str(exc)}, status=409)
        except RuleError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except ApiError as exc:
            return web.json_response({"error": exc.status.message or str(exc)}, status=502)
        log.warning("dashboard: devicetaintrule/%s %s for %s", name, outcome, device)
        return web.json_response({"rule": name, "outcome": outcome})

    async def _untaint(self, request: web.Request) -> web.Response:
        if self.token is None:
            return web.json_response({"error": READ_ONLY}, status=403)
        b = await self._body(request, ("device", "key"))
        try:
            device = parse_device(b["device"])
            deleted = await remove_taints(
                self.client, device, key=b["key"], served=self.served,
                namespace=self.history_namespace,
            )  # fmt: skip
        except RuleAPIUnavailable as exc:
            return web.json_response({"error": str(exc)}, status=409)
        except RuleError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except ApiError as exc:
            return web.json_response({"error": exc.status.message or str(exc)}, status=502)
        log.warning("dashboard: deleted %s for %s", deleted or "nothing", device)
        return web.json_response({"deleted": deleted})

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _state(self, _request: web.Request) -> web.Response:
        return web.Response(text=self.state_text(), content_type="application/json")

    def _make_room(self, client: str) -> None:
        """Close the stream a new one from ``client`` replaces, if the bounds need one."""
        mine = [q for q, r in self._subscribers.items() if (r.remote or "") == client]
        if len(mine) >= MAX_STREAMS_PER_CLIENT:
            victim = mine[0]  # the client's oldest
        elif len(self._subscribers) >= MAX_STREAMS:
            counts = Counter(r.remote or "" for r in self._subscribers.values())
            busiest = max(counts, key=lambda k: counts[k])
            victim = next(q for q, r in self._subscribers.items() if (r.remote or "") == busiest)
        else:
            return
        request = self._subscribers.pop(victim)
        self.streams_replaced += 1
        log.info("dashboard: closing the oldest event stream of %s for a new one", request.remote)
        with contextlib.suppress(asyncio.QueueFull):
            victim.put_nowait("")  # its handler ends
        if request.transport is not None:
            request.transport.abort()

    async def _events(self, request: web.Request) -> web.StreamResponse:
        self._make_room(request.remote or "")
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=self.stream_queue)
        self._subscribers[queue] = request

        async def send(data: bytes) -> None:
            try:
                async with asyncio.timeout(self.stream_write_timeout):
                    await response.write(data)
            except TimeoutError:
                self._disconnect(queue, request)
                raise ConnectionResetError("the client does not read its event stream") from None

        try:
            await send(f"event: state\ndata: {self.state_text()}\n\n".encode())
            while queue in self._subscribers:
                try:
                    async with asyncio.timeout(15):
                        text = await queue.get()
                except TimeoutError:
                    await send(b": keep-alive\n\n")
                    continue
                if not text:
                    break
                texts = [text]
                while not queue.empty():  # every delta, in order, in one write
                    texts.append(queue.get_nowait())
                if "" in texts:
                    break
                await send(b"".join(f"event: delta\ndata: {t}\n\n".encode() for t in texts))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._subscribers.pop(queue, None)
        return response

    async def _timeline(self, request: web.Request) -> web.Response:
        device = _device_param(request)
        entries = self.timeline.device(device)
        return web.json_response(
            {"device": device, "entries": entries, "max": self.timeline.per_device},
            dumps=lambda v: json_text(v, separators=(",", ":")),
        )

    async def _history(self, request: web.Request) -> web.Response:
        device = _device_param(request)
        rows: list[dict[str, Any]] = []
        try:
            cm = await self.client.get(
                ConfigMap, HISTORY_CONFIGMAP, namespace=self.history_namespace
            )
            entries = json.loads((cm.data or {}).get("history", "[]"))
            for h in entries if isinstance(entries, list) else []:
                if not isinstance(h, dict):
                    continue
                subject, message = str(h.get("subject", "")), str(h.get("message", ""))
                if mentions_device(subject, device) or mentions_device(message, device):
                    action = str(h.get("action", ""))
                    rows.append({"time": h.get("time", ""), "what": history_label(action),
                                 "action": action, "message": message,
                                 "source": f"controller {h.get('by', '')}"})  # fmt: skip
        except (ApiError, ValueError):
            pass
        try:
            holders = self.model.consumers(DeviceKey.parse(device))
        except ValueError:
            holders = []
        try:
            async for e in self.client.list(Event, namespace="*"):
                source = history_source(as_dict(e), device, self.history_namespace, holders)
                if source is None:
                    continue  # not drahealth's word on this device (see history_source)
                when = e.lastTimestamp or e.firstTimestamp
                rows.append({"time": when.isoformat() if when else "", "what": e.reason or "",
                             "message": e.message or "", "source": source})  # fmt: skip
        except ApiError:
            pass
        rows.sort(key=lambda r: str(r["time"]))
        return web.json_response(rows[-50:])


def _device_param(request: web.Request) -> str:
    """The ``device`` query parameter, or 400 naming what is wrong with it."""
    values = request.query.getall("device", [])
    problem = ""
    if len(values) != 1:
        problem = "query parameter device must be given once"
    elif len(values[0]) > MAX_DEVICE_PARAM:
        problem = f"query parameter device is longer than {MAX_DEVICE_PARAM} characters"
    elif "\ufffd" in values[0] or not values[0].isprintable():
        problem = "query parameter device must be printable UTF-8"
    elif values[0].count("/") < 2:
        problem = "query parameter device must be DRIVER/POOL/DEVICE"
    if problem:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": problem}), content_type="application/json"
        )
    return str(values[0])


def _device_order(d: dict[str, Any]) -> tuple[str, str, str]:
    return (d["driver"], d["pool"], d["device"])
