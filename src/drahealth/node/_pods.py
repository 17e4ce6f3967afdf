"""One pod's containers on the simulated node: the kubelet's pod worker.

Owns :class:`PodRun`: init containers run one after another (a failed one is retried
unless ``restartPolicy`` is ``Never``, which fails the pod; a sidecar, an init container
with ``restartPolicy: Always``, is started and kept running), then every container
starts; each ended container is restarted as ``restartPolicy`` says (``Always``,
``OnFailure``: when it failed, ``Never``) after the kubelet's crash-loop back-off
(10 s doubling to 5 min, reset after 10 min of running; waiting reason
``CrashLoopBackOff``), with ``restartCount`` and ``lastState``. When no container runs
or will run again the pod is ``Succeeded`` (every container exited 0) or ``Failed``.
:meth:`PodRun.terminate` delivers SIGTERM and kills what still runs when the grace
period ends (exit 137).

:meth:`PodRun.status` is the pod ``status`` the kubelet writes (phase, conditions,
container statuses); ``on_change`` is called after every transition. Container output is
kept per run (this and the previous one) for ``/containerLogs``. CDI environment
(:func:`cdi_env`) comes from the spec files the driver wrote for the prepared devices.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from drahealth._time import now_rfc3339
from drahealth.node._containers import Container

__all__ = ["BACKOFF", "CDI_DIRS", "PodRun", "cdi_env", "pod_env"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
#: The kubelet's crash-loop back-off: initial, cap (s), and running time that resets it.
BACKOFF = (10.0, 300.0)
BACKOFF_RESET = 600.0
#: Where CDI spec files are looked for (the CDI defaults).
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
#: Spec files read per lookup and the size of one, at most.
MAX_CDI_FILES = 1024
MAX_CDI_BYTES = 1024 * 1024


def cdi_env(dirs: Iterable[str], device_ids: Iterable[str]) -> dict[str, str]:
    """The environment the CDI specs in ``dirs`` inject for ``device_ids`` (spec-wide
    edits, then each device's, in the order of the ids)."""
    wanted = list(dict.fromkeys(device_ids))
    if not wanted:
        return {}
    found: dict[str, list[str]] = {}
    files = 0
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for fname in names:
            if not fname.endswith(".json") or files >= MAX_CDI_FILES:
                continue
            files += 1
            path = os.path.join(directory, fname)
            try:
                if os.path.getsize(path) > MAX_CDI_BYTES:
                    continue
                with open(path, encoding="utf-8") as f:
                    spec = json.load(f)
            except (OSError, ValueError):
                continue
            if not isinstance(spec, dict):
                continue
            kind = spec.get("kind")
            common = _env_list(spec.get("containerEdits"))
            for device in spec.get("devices") or []:
                if not isinstance(device, dict):
                    continue
                fqid = f"{kind}={device.get('name')}"
                if fqid in wanted:
                    found[fqid] = common + _env_list(device.get("containerEdits"))
    out: dict[str, str] = {}
    for fqid in wanted:
        for entry in found.get(fqid, []):
            key, _, value = entry.partition("=")
            if key:
                out[key] = value
    return out


def _env_list(edits: Any) -> list[str]:
    if not isinstance(edits, dict):
        return []
    return [e for e in edits.get("env") or [] if isinstance(e, str)]


def pod_env(pod: JSON, container: JSON) -> dict[str, str]:
    """A container's own environment: image-like defaults, then ``env`` values and the
    ``fieldRef`` fields a kubelet resolves (``valueFrom`` of other kinds is left out)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOSTNAME": str(meta.get("name", "")),
        "HOME": "/root",
    }
    fields = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": "127.0.0.1",
        "status.podIP": "127.0.0.1",
    }
    for item in container.get("env") or []:
        name = item.get("name")
        if not name:
            continue
        if "value" in item:
            env[name] = str(item.get("value") or "")
            continue
        ref = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if ref in fields and fields[ref] is not None:
            env[name] = str(fields[ref])
    return env


@dataclass
class _CState:
    """One container's status as the kubelet reports it."""

    spec: JSON
    init: bool = False
    state: JSON = field(default_factory=lambda: {"waiting": {"reason": "PodInitializing"}})
    last_state: JSON = field(default_factory=dict)
    restarts: int = 0
    ready: bool = False
    started: bool = False
    run: Container | None = None
    previous: bytes | None = None
    exit_code: int | None = None

    @property
    def name(self) -> str:
        return str(self.spec.get("name", ""))

    @property
    def sidecar(self) -> bool:
        return self.init and self.spec.get("restartPolicy") == "Always"

    def status(self, uid: str) -> JSON:
        out: JSON = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restarts,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.run is not None or self.exit_code is not None:
            out["containerID"] = f"drahealth://{uid}/{self.name}"
        return out


class PodRun:
    """The containers of one pod (see the module docstring)."""

    def __init__(
        self,
        pod: JSON,
        env: Callable[[JSON], Mapping[str, str]],
        on_change: Callable[[], None],
        *,
        backoff: tuple[float, float] = BACKOFF,
    ) -> None:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        self.namespace = str(meta.get("namespace") or "default")
        self.name = str(meta.get("name") or "")
        self.uid = str(meta.get("uid") or "")
        self.policy = str(spec.get("restartPolicy") or "Always")
        self.env = env
        self.on_change = on_change
        self.backoff = backoff
        self.inits = [_CState(c, init=True) for c in spec.get("initContainers") or []]
        self.mains = [_CState(c) for c in spec.get("containers") or []]
        for c in self.mains:
            c.state = {"waiting": {"reason": "PodInitializing" if self.inits else
                                   "ContainerCreating"}}  # fmt: skip
        self.phase = "Pending"
        self.initialized = not any(not c.sidecar for c in self.inits)
        self.start_time = now_rfc3339()
        self.terminating = False
        self.grace = float(spec.get("terminationGracePeriodSeconds", 30) or 0)
        self._mains_done = False
        self._stopping = asyncio.Event()
        self._since: dict[str, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._worker: asyncio.Task[None] | None = None
        self.done = asyncio.Event()

    # -- the worker ---------------------------------------------------------------

    def start(self) -> None:
        self._worker = asyncio.create_task(self._work(), name=f"pod-{self.name}")

    async def _work(self) -> None:
        try:
            for c in self.inits:
                if c.sidecar:
                    self._spawn(self._loop(c, "Always"))
                    await asyncio.sleep(0)  # the sidecar starts before the next one
                    continue
                policy = "OnFailure" if self.policy != "Never" else "Never"
                await self._loop(c, policy)
                if c.exit_code != 0 or self.terminating:
                    self._finish()
                    return
            self.initialized = True
            self.phase = "Running"
            loops = [self._spawn(self._loop(c, self.policy)) for c in self.mains]
            self.on_change()
            await asyncio.gather(*loops, return_exceptions=True)
            self._mains_done = True
            for c in self.inits:
                if c.sidecar and c.run is not None:
                    c.run.terminate()
            sidecars = asyncio.gather(*self._tasks, return_exceptions=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.grace):
                    await sidecars
            self._finish()
        finally:
            self.done.set()

    def _spawn(self, work: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _finish(self) -> None:
        runs = [c for c in (*self.inits, *self.mains) if not c.sidecar]
        failed = any(c.exit_code not in (0, None) for c in runs) or any(
            c.exit_code is None for c in self.mains
        )
        self.phase = "Failed" if failed else "Succeeded"
        for c in (*self.inits, *self.mains):
            c.ready = False
            c.started = False if c.exit_code is not None else c.started
        self.on_change()

    async def _loop(self, c: _CState, policy: str) -> None:
        delay = self.backoff[0]
        while not self.terminating:
            started = time.monotonic()
            code = await self._run_once(c)
            if self.terminating or (c.sidecar and self._mains_done):
                return
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                return
            if time.monotonic() - started >= BACKOFF_RESET:
                delay = self.backoff[0]
            c.last_state = c.state
            c.state = {"waiting": {"reason": "CrashLoopBackOff", "message": (
                f"back-off {delay:g}s restarting failed container={c.name} "
                f"pod={self.name}_{self.namespace}({self.uid})")}}  # fmt: skip
            c.restarts += 1
            self.on_change()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()
            delay = min(delay * 2, self.backoff[1])

    async def _run_once(self, c: _CState) -> int:
        spec = c.spec
        if c.run is not None:
            c.previous = c.run.output
        run = Container(spec.get("command") or [], spec.get("args") or [], self.env(spec))
        c.run = run
        now = now_rfc3339()
        c.state = {"running": {"startedAt": now}}
        c.started = True
        c.ready = not c.init or c.sidecar
        c.exit_code = None
        self.on_change()
        try:
            code = await run.run()
        except asyncio.CancelledError:
            code = 137
            self._record_end(c, code, now)
            raise
        self._record_end(c, code, now)
        return code

    def _record_end(self, c: _CState, code: int, started: str) -> None:
        c.exit_code = code
        c.ready = False
        c.started = False
        c.state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else
                                  "Error", "startedAt": started, "finishedAt": now_rfc3339(),
                                  "containerID": f"drahealth://{self.uid}/{c.name}"}}  # fmt: skip
        self.on_change()

    # -- stopping -----------------------------------------------------------------

    async def terminate(self, grace: float) -> None:
        """SIGTERM every container; kill those still running after ``grace`` seconds."""
        self.terminating = True
        self._stopping.set()
        for c in (*self.mains, *self.inits):
            if c.run is not None:
                c.run.terminate()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(grace, 0.0)):
                await self.done.wait()
        await self.kill()

    async def kill(self) -> None:
        """SIGKILL whatever still runs and wait for the worker to end."""
        self.terminating = True
        self._stopping.set()
        for task in list(self._tasks):
            task.cancel()
        if self._worker is not None:
            await asyncio.gather(self._worker, return_exceptions=True)
        if not self.done.is_set():
            self.done.set()

    # -- reading ------------------------------------------------------------------

    def container(self, name: str) -> _CState | None:
        return next((c for c in (*self.mains, *self.inits) if c.name == name), None)

    def logs(self, name: str, previous: bool) -> bytes:
        c = self.container(name)
        if c is None:
            raise LookupError(f"container {name} is not valid for pod {self.name}")
        if previous:
            if c.previous is None:
                raise LookupError(
                    f'previous terminated container "{name}" in pod "{self.name}" not found'
                )
            return c.previous
        if c.run is None:
            raise LookupError(
                f'container "{name}" in pod "{self.name}" is waiting to start: '
                f"{next(iter(c.state.get('waiting', {}).values()), 'PodInitializing')}"
            )
        return c.run.output

    def _condition(self, kind: str, ok: bool, reason: str = "", message: str = "") -> JSON:
        status = "True" if ok else "False"
        key = f"{kind}={status}"
        since = self._since.setdefault(key, now_rfc3339())
        for other in ("True", "False"):
            if other != status:
                self._since.pop(f"{kind}={other}", None)
        out: JSON = {"type": kind, "status": status, "lastProbeTime": None,
                     "lastTransitionTime": since}  # fmt: skip
        if not ok and reason:
            out["reason"] = reason
        if not ok and message:
            out["message"] = message
        return out

    def status(self) -> JSON:
        """The pod ``status`` for the current state (without health lists)."""
        ended = self.phase in ("Succeeded", "Failed")
        unready = [c.name for c in self.mains if not c.ready]
        pending_init = [c.name for c in self.inits if not c.sidecar and c.exit_code != 0]
        ready_reason = "PodCompleted" if ended else "ContainersNotReady"
        unready_msg = f"containers with unready status: [{' '.join(unready)}]"
        conditions = [
            self._condition("PodReadyToStartContainers", not ended),
            self._condition(
                "Initialized",
                self.initialized,
                "ContainersNotInitialized",
                f"containers with incomplete status: [{' '.join(pending_init)}]",
            ),
            self._condition("Ready", not unready and not ended, ready_reason,
                            "" if ended else unready_msg),
            self._condition("ContainersReady", not unready and not ended, ready_reason,
                            "" if ended else unready_msg),
            self._condition("PodScheduled", True),
        ]  # fmt: skip
        out: JSON = {
            "phase": self.phase,
            "startTime": self.start_time,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "conditions": conditions,
            "containerStatuses": [c.status(self.uid) for c in self.mains],
        }
        if self.inits:
            out["initContainerStatuses"] = [c.status(self.uid) for c in self.inits]
        return out
