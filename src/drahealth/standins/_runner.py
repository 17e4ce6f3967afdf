"""The runner of all stand-ins, following a release profile.

Owns :class:`StandIns`: the scheduler (:mod:`._scheduler`), resourceclaim
(:mod:`._claims`), Deployment (:mod:`._deployments`), ReplicaSet (:mod:`._replicasets`),
Job (:mod:`._jobs`) and device-taint eviction (:mod:`._taint_eviction`) stand-ins on one
client, started and stopped together. The eviction stand-in runs only where the release
evicts for device taints (``DRADeviceTaints``).
"""

from __future__ import annotations

import asyncio

from lightkube import AsyncClient

from drahealth._aio import cancel_and_wait
from drahealth.core import NEWEST_KUBE_VERSION, KubeProfile, kube_profile

from ._claims import ClaimsStandIn
from ._deployments import DeploymentStandIn
from ._jobs import JobStandIn
from ._replicasets import ReplicaSetStandIn
from ._scheduler import SchedulerStandIn
from ._taint_eviction import TaintEvictionStandIn

__all__ = ["StandIns"]


class StandIns:
    """A cluster's controllers on ``client``: scheduler, resourceclaims, taint eviction,
    Deployments, ReplicaSets, Jobs.

    ``profile`` is the release the API server serves (None: the newest); without
    ``DRADeviceTaints`` there is no taint eviction (``taint_eviction`` is None).
    """

    def __init__(self, client: AsyncClient, profile: KubeProfile | None = None) -> None:
        profile = profile or kube_profile(NEWEST_KUBE_VERSION)
        self.profile = profile
        self.scheduler = SchedulerStandIn(client, profile)
        self.claims = ClaimsStandIn(client)
        self.taint_eviction: TaintEvictionStandIn | None = (
            TaintEvictionStandIn(client, profile) if profile.taint_eviction else None
        )
        self.replicasets = ReplicaSetStandIn(client)
        self.deployments = DeploymentStandIn(client)
        self.jobs = JobStandIn(client)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.scheduler.run(), name="scheduler-stand-in"),
            asyncio.create_task(self.claims.run(), name="resourceclaim-stand-in"),
            asyncio.create_task(self.replicasets.run(), name="replicaset-stand-in"),
            asyncio.create_task(self.deployments.run(), name="deployment-stand-in"),
            asyncio.create_task(self.jobs.run(), name="job-stand-in"),
        ]
        if self.taint_eviction is not None:
            self._tasks.append(
                asyncio.create_task(self.taint_eviction.run(), name="taint-eviction-stand-in")
            )

    def describe(self) -> list[str]:
        """What runs, one phrase per stand-in, in the order they start."""
        running = [
            "scheduler (node filters, DRA allocation, binding)",
            "resourceclaim controller (claims from templates, reservations)",
            "Deployment controller (Recreate)",
            "ReplicaSet controller",
            "Job controller",
        ]
        if self.taint_eviction is not None:
            running.append("device-taint eviction (NoExecute)")
        return running

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
