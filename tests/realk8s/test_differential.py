"""Differential fidelity: every request of the corpus (``tests/realk8s/corpus.py``) is
sent to the real kube-apiserver and to the embedded API server at the same release, and
the answers are compared: status code, Status reason and cause fields, and the object
(normalised: generated names, uids, resourceVersions, server-set times, managedFields).

The corpus is what drahealth's own components send, kubectl's requests (and the real
kubectl binary), lightkube's calls, the official Python client's calls
(``tests/realk8s/official_client.py``), an invalid object for every DRA validation rule
of the embedded server, and invalid metadata sent as an update of each kind. Printed:
the match rate, the tally per source and every difference.

Asserted at every release the embedded server serves (``DRAHEALTH_K8S_VERSION``: 1.34
to 1.37), with either gate set (``DRAHEALTH_K8S_GATES``: the embedded server gets the
real one's gates): no DRA request differs, the match rate is at least 0.99, and the
requests that differ are exactly that release's entry of :data:`KNOWN` (a fixed
difference must leave that list too, so it stays the list of what remains). The corpus
is written for the newest release's API; a request an older release does not serve (a
DeviceTaintRule in resource.k8s.io/v1 before 1.37) is still sent and both servers refuse
it alike.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest

from tests.realk8s.corpus import Kubectl, corpus, describe, differential, report
from tests.realk8s.harness import Cluster, bin_dir, gates_for, minor_of

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(240)]

#: Why a request differs at every release (docs/apiserver.md, "Differences from the
#: real kube-apiserver").
_NODE_CREATE = (
    "the real TaintNodesByCondition admission adds node.kubernetes.io/not-ready:NoSchedule "
    "to a new Node and the node lifecycle controller lifts it once the Node is Ready; the "
    "embedded server has no such controller, so it adds no taint (else no Node would "
    "ever take a pod)"
)
_POD_DELETE = (
    "pod graceful deletion is not modelled: the real server's BeforeDelete first stores "
    "the pod with deletionTimestamp, deletionGracePeriodSeconds (0 for a pod on no node) "
    "and generation + 1, then deletes it and answers with that; the embedded server "
    "deletes the pod as it was"
)
_EVENT_AS_CORE = (
    "the real server stores events.k8s.io/v1 and core/v1 Events as one resource; the "
    "embedded server keeps them apart, so an events.k8s.io Event is not read back as a "
    "core Event"
)
_EVERY_RELEASE = {
    "node create": _NODE_CREATE,
    "official pod delete": _POD_DELETE,
    "event core get of v1": _EVENT_AS_CORE,
}
#: Requests that still differ, per release, and why.
KNOWN: dict[str, dict[str, str]] = {
    "1.34": dict(_EVERY_RELEASE),
    "1.35": dict(_EVERY_RELEASE),
    "1.36": dict(_EVERY_RELEASE),
    "1.37": dict(_EVERY_RELEASE),
}
MIN_RATE = 0.99
MIN_REQUESTS = 150


async def test_embedded_server_answers_as_the_real_one(
    real_cluster: Cluster, tmp_path: Path
) -> None:
    minor = minor_of(real_cluster.version)
    kubectl = bin_dir(real_cluster.version) / "kubectl"
    cases = corpus()
    if not kubectl.is_file():  # not built beside that release: its runs are left out
        cases = [c for c in cases if not isinstance(c, Kubectl)]
    t0 = time.monotonic()
    results = await differential(
        apiserver=real_cluster.apiserver, token=real_cluster.admin_token,
        ca_file=str(real_cluster.ca_file), kubeconfig=Path(real_cluster.kubeconfig),
        minor=minor, kubectl=kubectl if kubectl.is_file() else None, workdir=tmp_path,
        prefix="dfx-" + secrets.token_hex(3), cases=cases,
        gates=gates_for(real_cluster.version, real_cluster.gates)[0],
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    print(f"\n{describe(results)}\ndifferential: {elapsed:.1f} s")
    rate, differing = report(results)
    by_source: dict[str, list[int]] = {}
    for r in results:
        tally = by_source.setdefault(r.case.source, [0, 0])
        tally[0] += 1
        tally[1] += not r.differences
    print(", ".join(f"{s}: {ok}/{n}" for s, (n, ok) in sorted(by_source.items())))

    assert len(results) == len(cases) >= MIN_REQUESTS
    assert minor in KNOWN, f"no KNOWN list for {minor}"
    known = KNOWN[minor]
    dra = [r.case.id for r in differing if r.case.dra]
    assert not dra, f"DRA requests differ at {minor}: {dra}"
    unexpected = sorted(r.case.id for r in differing if r.case.id not in known)
    assert not unexpected, f"new differences at {minor}: {unexpected}"
    fixed = sorted(set(known) - {r.case.id for r in differing})
    assert not fixed, f"no longer different at {minor} (remove from KNOWN and the docs): {fixed}"
    assert rate >= MIN_RATE, f"match rate {rate:.4f} at {minor}"
