"""Running repair actions: an exec on the controller, a webhook, or a Job on the node.

Owns :class:`RepairRunner`, the I/O side of the engine's repairs
(:mod:`drahealth.core._repair` decides when an attempt is due and what its answer leads
to). One task per attempt, at most one per device; each ends by calling ``on_done`` with
(the attempt, success, a one-line detail, the Job's name or ""):

* ``exec``: the command with ``DRAHEALTH_DEVICE``, ``DRAHEALTH_NODE``, ... (see
  :func:`drahealth.core.repair_env`) in its environment; exit 0 is success; at the
  timeout it is killed;
* ``webhook``: POST ``{"device", "node", "rule", "reason"}`` as JSON; 2xx is success;
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
from drahealth.core import (
    DeviceFacts,
    DeviceKey,
    JobPlacement,
    RepairError,
    RepairRun,
    job_manifest,
    repair_env,
)
from drahealth.remedy._rules import ANNOTATION_NODE, ANNOTATION_RULE, CONTROLLER_LABEL, MANAGED_BY

__all__ = ["ANNOTATION_DEVICE", "LABEL_DEVICE", "POLL_SECONDS", "RepairRunner", "device_hash"]

log = logging.getLogger(__name__)

LABEL_DEVICE: Final = "drahealth.io/repair-device"
ANNOTATION_DEVICE: Final = "drahealth.io/device"
#: How often a running repair Job is read.
POLL_SECONDS: Final = 0.5
#: Characters of a command's stderr kept in the detail.
MAX_DETAIL: Final = 300

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
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.on_done = on_done
        self.poll = poll
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
                async with asyncio.timeout(repair.timeout):
                    if repair.exec:
                        ok, detail = await self._exec(repair.exec, env)
                    else:
                        ok, detail = await self._webhook(run, facts, reason)
        except TimeoutError:
            detail = f"timed out after {repair.timeout:g} s"
        except RepairError as exc:
            detail = str(exc)
        except (OSError, aiohttp.ClientError) as exc:
            detail = str(exc) or type(exc).__name__
        except ApiError as exc:
            detail = f"API: {exc.status.message}"
        self.on_done(run, ok, detail, job)

    # -- exec and webhook ------------------------------------------------------------

    async def _exec(self, command: Sequence[str], env: dict[str, str]) -> tuple[bool, str]:
        proc = await asyncio.create_subprocess_exec(
            *command,
            env={**os.environ, **env},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            _, err = await proc.communicate()
        except asyncio.CancelledError:  # the timeout (or a stop): never leave it running
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(ProcessLookupError):
                await proc.wait()
            raise
        ok = proc.returncode == 0
        text = err.decode(errors="replace").strip()[-MAX_DETAIL:] if err and not ok else ""
        return ok, f"exit {proc.returncode}" + (f": {text}" if text else "")

    async def _webhook(self, run: RepairRun, facts: DeviceFacts, reason: str) -> tuple[bool, str]:
        hook = run.repair.webhook
        assert hook is not None
        body = {"device": str(run.key), "node": facts.node, "rule": run.rule, "reason": reason}
        timeout = aiohttp.ClientTimeout(total=min(hook.timeout, run.repair.timeout))
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(hook.url, json=body) as resp,
        ):
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
