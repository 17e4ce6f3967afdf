"""Running repair actions: an exec on the controller, a webhook, or a Job on the node.

Owns :class:`RepairRunner`, the I/O side of the engine's repairs
(:mod:`drahealth.core._repair` decides when an attempt is due and what its answer leads
to). One task per attempt, at most one per device; each ends by calling ``on_done`` with
(the attempt, success, a one-line detail, the Job's name or ""):

* ``exec``: the command with ``DRAHEALTH_DEVICE``, ``DRAHEALTH_NODE``, ... (see
  :func:`drahealth.core.repair_env`) in its environment; exit 0 is success. It runs
  bounded (:func:`drahealth._child.run_child_async`): in a process group of its own that
  is killed whole at the timeout (SIGTERM, SIGKILL :data:`~drahealth.core.EXEC_KILL_GRACE`
  seconds later) without waiting for its pipes, its standard output discarded and at most
  :data:`MAX_STDERR` bytes of its error output kept, killed by the kernel if the
  controller dies (``PR_SET_PDEATHSIG``);
* ``webhook``: POST ``{"device", "node", "rule", "reason"}`` as JSON; 2xx is success; a
  redirect is an answer (a failure), never followed;

An ``exec`` or ``webhook`` attempt starts only once ``recorded()`` says the state
ConfigMap holds it as running, with its deadline (the due time + its timeout + the kill
grace), so a controller that takes over after a crash knows it may still run and waits
until that deadline before it starts another (:meth:`drahealth.core.Aftercare.restore`).
The wait counts against the attempt's timeout.
* ``job``: a ``batch/v1`` Job made by :func:`drahealth.core.job_manifest` on the device's
  node, labelled as the controller's (``app.kubernetes.io/managed-by``) and with the
  device's hash (:data:`LABEL_DEVICE`). Its ``Complete`` condition is success, ``Failed``
  or the timeout failure; it is then deleted with background propagation (its pods go
  with it). An unfinished Job of the same device found at the start of an attempt (the
  last leader's, interrupted by a restart) is adopted instead of creating a second one;
  finished ones are deleted. The Job is read every :data:`POLL_SECONDS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import secrets
from collections.abc import Callable, Sequence
from typing import Any, Final

import aiohttp
from lightkube import ApiError, AsyncClient
from lightkube.resources.batch_v1 import Job
from lightkube.types import CascadeType

from drahealth._aio import cancel_and_wait
from drahealth._child import ChildError, run_child_async
from drahealth.core import (
    EXEC_KILL_GRACE,
    DeviceFacts,
    DeviceKey,
    JobPlacement,
    RepairError,
    RepairRun,
    job_manifest,
    repair_env,
)
from drahealth.kube import LeaseLost, check_fence
from drahealth.remedy._rules import ANNOTATION_NODE, ANNOTATION_RULE, CONTROLLER_LABEL, MANAGED_BY

__all__ = ["ANNOTATION_DEVICE", "LABEL_DEVICE", "POLL_SECONDS", "RepairRunner", "device_hash"]

log = logging.getLogger(__name__)

LABEL_DEVICE: Final = "drahealth.io/repair-device"
ANNOTATION_DEVICE: Final = "drahealth.io/device"
#: How often a running repair Job is read.
POLL_SECONDS: Final = 0.5
#: Characters of a command's stderr kept in the detail.
MAX_DETAIL: Final = 300
#: Bytes of a repair command's error output kept while it runs (the rest is discarded).
MAX_STDERR: Final = 8 * 1024
#: How often an attempt checks that it was recorded before it starts.
RECORDED_POLL: Final = 0.02

Done = Callable[[RepairRun, bool, str, str], None]


def device_hash(key: DeviceKey) -> str:
    """A label value naming the device (its ``driver/pool/device`` is no label value)."""
    return hashlib.sha256(str(key).encode()).hexdigest()[:16]


def _slug(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


class RepairRunner:
    """See the module docstring."""

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        on_done: Done,
        *,
        poll: float = POLL_SECONDS,
        recorded: Callable[[], bool] | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.on_done = on_done
        self.poll = poll
        self.recorded = recorded
        self._tasks: dict[DeviceKey, asyncio.Task[None]] = {}

    @property
    def running(self) -> int:
        return len(self._tasks)

    def start(
        self, run: RepairRun, facts: DeviceFacts, reason: str, tolerate: Sequence[str]
    ) -> None:
        """Start ``run`` for the device ``facts`` (one attempt per device at a time)."""
        if run.key in self._tasks:
            return
        task = asyncio.get_running_loop().create_task(
            self._attempt(run, facts, reason, tuple(tolerate)), name=f"repair {run.key}"
        )
        self._tasks[run.key] = task
        task.add_done_callback(lambda _t: self._tasks.pop(run.key, None))

    async def stop(self) -> None:
        """Cancel every attempt (leadership lost); a Job keeps running and is adopted."""
        await cancel_and_wait(list(self._tasks.values()))
        self._tasks.clear()

    async def _attempt(
        self, run: RepairRun, facts: DeviceFacts, reason: str, tolerate: tuple[str, ...]
    ) -> None:
        repair = run.repair
        ok, detail, job = False, "", ""
        env = repair_env(facts, run.rule)
        try:
            if repair.job is not None:
                ok, detail, job = await self._job(run, facts, env, tolerate)
            else:
                start = asyncio.get_running_loop().time()
                async with asyncio.timeout(repair.timeout):
                    await self._until_recorded()
                    check_fence(self.client)  # a replica that no longer leads starts nothing
                    if repair.exec:
                        left = repair.timeout - (asyncio.get_running_loop().time() - start)
                        ok, detail = await self._exec(repair.exec, env, left)
                    else:
                        ok, detail = await self._webhook(run, facts, reason)
        except TimeoutError:
            detail = f"timed out after {repair.timeout:g} s"
            if self.recorded is not None and not self.recorded():
                detail = "not started: it could not be recorded in the state ConfigMap in time"
        except RepairError as exc:
            detail = str(exc)
        except (OSError, aiohttp.ClientError) as exc:
            detail = str(exc) or type(exc).__name__
        except ApiError as exc:
            detail = f"API: {exc.status.message}"
        except LeaseLost as exc:  # the state still says running: the next leader runs it
            log.warning("repair of %s not started: %s", run.key, exc)
            return
        self.on_done(run, ok, detail, job)

    # -- exec and webhook ------------------------------------------------------------

    async def _until_recorded(self) -> None:
        """Return once the attempt is recorded as running (see the module docstring)."""
        while self.recorded is not None and not self.recorded():  # noqa: ASYNC110 (no event)
            await asyncio.sleep(RECORDED_POLL)

    async def _exec(
        self, command: Sequence[str], env: dict[str, str], seconds: float
    ) -> tuple[bool, str]:
        try:
            done = await run_child_async(
                command, {**os.environ, **env}, max(0.0, seconds),
                max_output=MAX_STDERR, kill_grace=EXEC_KILL_GRACE,
            )  # fmt: skip
        except ChildError as exc:
            raise RepairError(f"{command[0]} {exc}") from None
        if done.timed_out:
            return False, f"timed out after {done.seconds:.3g} s (its process group was killed)"
        ok = done.returncode == 0
        err = done.stderr.tail
        text = err.decode(errors="replace").strip()[-MAX_DETAIL:] if err and not ok else ""
        return ok, f"exit {done.returncode}" + (f": {text}" if text else "")

    async def _webhook(self, run: RepairRun, facts: DeviceFacts, reason: str) -> tuple[bool, str]:
        hook = run.repair.webhook
        assert hook is not None
        body = {"device": str(run.key), "node": facts.node, "rule": run.rule, "reason": reason}
        timeout = aiohttp.ClientTimeout(total=min(hook.timeout, run.repair.timeout))
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(hook.url, json=body, allow_redirects=False) as resp,
        ):
            if 300 <= resp.status < 400:  # never a second request, to wherever it points
                return False, f"HTTP {resp.status}: a redirect, not followed"
            return 200 <= resp.status < 300, f"HTTP {resp.status}"

    # -- job -------------------------------------------------------------------------

    async def _job(
        self, run: RepairRun, facts: DeviceFacts, env: dict[str, str], tolerate: tuple[str, ...]
    ) -> tuple[bool, str, str]:
        repair = run.repair
        assert repair.job is not None
        namespace = repair.job.namespace or self.namespace
        label = device_hash(run.key)
        name = await self._adopt(namespace, label)
        if name is None:
            name = f"dh-repair-{_slug(run.key.device)[:32].strip('-')}-{secrets.token_hex(4)}"
            place = JobPlacement(
                name,
                namespace,
                facts.node,
                labels={MANAGED_BY: CONTROLLER_LABEL, LABEL_DEVICE: label},
                annotations={
                    ANNOTATION_DEVICE: str(run.key),
                    ANNOTATION_RULE: run.rule,
                    ANNOTATION_NODE: facts.node,
                },
                tolerate=tolerate,
            )
            body = job_manifest(repair, env, place)
            await self.client.create(Job.from_dict(body))  # type: ignore[call-overload]
            log.info("repair %s: created job %s/%s", run.key, namespace, name)
        try:
            async with asyncio.timeout(repair.timeout):
                ok, detail = await self._wait(name, namespace)
        except TimeoutError:
            ok, detail = False, f"job {name} timed out after {repair.timeout:g} s"
        finally:
            await self._delete(name, namespace)
        return ok, detail, name

    async def _adopt(self, namespace: str, label: str) -> str | None:
        """The unfinished repair Job of the device, if any; finished ones are deleted."""
        found: str | None = None
        async for job in self.client.list(Job, namespace=namespace, labels={LABEL_DEVICE: label}):
            name = str(job.metadata.name) if job.metadata else ""
            if _finished(job) is None and job.metadata and not job.metadata.deletionTimestamp:
                found = found or name
            else:
                await self._delete(name, namespace)
        if found:
            log.info("repair: adopting job %s/%s", namespace, found)
        return found

    async def _wait(self, name: str, namespace: str) -> tuple[bool, str]:
        while True:
            try:
                job = await self.client.get(Job, name, namespace=namespace)
            except ApiError as exc:
                if exc.status.code == 404:
                    return False, f"job {name} was deleted before it finished"
                raise
            done = _finished(job)
            if done is not None:
                return done[0], f"job {name} {done[1]}"
            await asyncio.sleep(self.poll)

    async def _delete(self, name: str, namespace: str) -> None:
        with contextlib.suppress(ApiError):
            await self.client.delete(Job, name, namespace=namespace, cascade=CascadeType.BACKGROUND)


def _finished(job: Any) -> tuple[bool, str] | None:
    """(success, how) from a Job's ``Complete`` / ``Failed`` condition; None: still running."""
    for c in (job.status.conditions if job.status else None) or []:
        if c.status != "True":
            continue
        if c.type == "Complete":
            return True, "complete"
        if c.type == "Failed":
            why = ": ".join(p for p in (c.reason, c.message) if p)
            return False, "failed" + (f" ({why})" if why else "")
    return None
