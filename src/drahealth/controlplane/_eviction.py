"""PodDisruptionBudget arithmetic, the eviction decision and the disruption condition.

Owns how a PDB's ``status`` follows from the pods its selector matches
(``expectedPods``, ``currentHealthy``, ``desiredHealthy``, ``disruptionsAllowed``,
``observedGeneration``, the ``DisruptionAllowed`` condition), whether an eviction
may proceed, and the ``DisruptionTarget`` pod condition an eviction (or a taint
eviction controller) adds before it deletes the pod (set by
:func:`drahealth.core.with_pod_condition`, upstream's ``UpdatePodCondition``). Pure
functions; the server stores the results.

Simplifications: a pod is healthy when it is not being deleted, its phase is
``Running`` and its ``Ready`` condition is ``True`` (a Running pod without any
conditions counts as healthy, since no kubelet sets them here); ``expectedPods`` is
the number of pods the selector matches (there are no workload controllers to ask
for a scale); ``disruptedPods`` is not tracked because status is recomputed
synchronously after every pod or PDB write.
"""

from __future__ import annotations

import math
from typing import Any

from ._selectors import selector_from_object
from ._status import APIError, cause, status

JSON = dict[str, Any]
EVICTION_BLOCKED = "Cannot evict pod as it would violate the pod's disruption budget."
#: The pod condition a disruption sets before the pod is deleted (``podFailurePolicy``
#: rules match it: a Job can ignore evictions instead of counting them as failures).
DISRUPTION_TARGET = "DisruptionTarget"
#: Reason and message of the eviction subresource's condition (upstream's
#: pkg/registry/core/pod/storage/eviction.go, ``addConditionAndDeletePod``).
EVICTION_REASON = "EvictionByEvictionAPI"
EVICTION_MESSAGE = "Eviction API: evicting"


def eviction_condition() -> JSON:
    """The ``DisruptionTarget`` condition the eviction subresource adds."""
    return {
        "type": DISRUPTION_TARGET,
        "status": "True",
        "reason": EVICTION_REASON,
        "message": EVICTION_MESSAGE,
    }


def pod_ready(pod: JSON) -> bool:
    """``Ready=True`` (or, lacking any conditions, simply Running); False while deleting."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    st = pod.get("status") or {}
    if st.get("phase") != "Running":
        return False
    conditions = st.get("conditions") or []
    if not conditions:
        return True
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def selects(pdb: JSON, pod: JSON) -> bool:
    sel = selector_from_object((pdb.get("spec") or {}).get("selector"))
    if sel is None:
        return False
    return sel.matches((pod.get("metadata") or {}).get("labels"))


def scaled(value: int | str, total: int, round_up: bool) -> int:
    """An int-or-percent against ``total`` (``"50%"`` of 3 is 2 rounding up, 1 down)."""
    if isinstance(value, int):
        return value
    text = value.strip()
    if not text.endswith("%"):
        return int(text)
    pct = int(text[:-1])
    exact = pct * total / 100
    return math.ceil(exact) if round_up else math.floor(exact)


def pdb_status(pdb: JSON, pods: list[JSON], old_status: JSON | None, now: str) -> JSON:
    """The status a PDB has given the pods in its namespace."""
    matching = [p for p in pods if selects(pdb, p)]
    spec = pdb.get("spec") or {}
    healthy = sum(1 for p in matching if pod_ready(p))
    expected = len(matching)
    desired = 0
    if spec.get("maxUnavailable") is not None:
        desired = max(0, expected - scaled(spec["maxUnavailable"], expected, True))
    elif spec.get("minAvailable") is not None:
        desired = scaled(spec["minAvailable"], expected, True)
    allowed = max(0, healthy - desired) if expected > 0 else 0
    ok = allowed > 0
    old_cond = next(
        (
            c
            for c in (old_status or {}).get("conditions") or []
            if c.get("type") == "DisruptionAllowed"
        ),
        None,
    )
    cond_status = "True" if ok else "False"
    transition = now
    if old_cond is not None and old_cond.get("status") == cond_status:
        transition = old_cond.get("lastTransitionTime") or now
    return {
        "observedGeneration": (pdb.get("metadata") or {}).get("generation", 1),
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [
            {
                "type": "DisruptionAllowed",
                "status": cond_status,
                "reason": "SufficientPods" if ok else "InsufficientPods",
                "message": "",
                "lastTransitionTime": transition,
                "observedGeneration": (pdb.get("metadata") or {}).get("generation", 1),
            }
        ],
    }


def check_eviction(pod: JSON, pdbs: list[JSON]) -> None:
    """Raise ``APIError`` (429, or 500 for several PDBs) when the eviction must not happen.

    ``pdbs`` are the PDBs of the pod's namespace with up-to-date status.
    """
    st = pod.get("status") or {}
    if st.get("phase") in ("Succeeded", "Failed", "Pending") or (
        (pod.get("metadata") or {}).get("deletionTimestamp")
    ):
        return
    matching = [p for p in pdbs if selects(p, pod)]
    if not matching:
        return
    if len(matching) > 1:
        raise APIError(
            status(
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction "
                "subresource does not support.",
            )
        )
    pdb = matching[0]
    pst = pdb.get("status") or {}
    name = (pdb.get("metadata") or {}).get("name", "")
    ready = pod_ready(pod)
    policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
    if not ready and policy == "AlwaysAllow":
        return
    current, desired = int(pst.get("currentHealthy", 0)), int(pst.get("desiredHealthy", 0))
    if not ready and current >= desired and desired > 0:
        return
    if int(pst.get("disruptionsAllowed", 0)) <= 0:
        raise APIError(
            status(
                429,
                EVICTION_BLOCKED,
                "TooManyRequests",
                causes=[
                    cause(
                        "DisruptionBudget",
                        f"The disruption budget {name} needs {desired} healthy pods "
                        f"and has {current} currently",
                    )
                ],
            )
        )
