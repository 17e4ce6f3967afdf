"""The kubelet mode's pod status write (a strategic merge patch) against pods others write.

The write is computed from the agent's cached pod. A pod deleted and created again under
the same name (a StatefulSet's) between that read and the write is another pod: the
kubelet's status manager sends ``metadata.uid`` with its patch, so the API server refuses
it (kube-apiserver 1.37.2: 422 ``metadata.uid: Invalid value: ...: field is immutable``)
instead of giving the new pod the old one's status.
"""

from __future__ import annotations

from typing import Any
from unittest.mock import MagicMock

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

import drahealth.node._kubelet as kubelet_module
from drahealth.core import StatusBuilder
from drahealth.kube import make_client, patch_status
from drahealth.node._kubelet import POD_STATUS_PATCH, KubeletMode
from tests.integration.kube.conftest import api_server_options, client

__all__ = ["api_server_options", "client"]

pytestmark = pytest.mark.timeout(20)

OLD_UID = "0b7e3f4c-0000-4000-8000-000000000001"


def _pod(uid: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "web-0", "namespace": "default", "uid": uid},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
        "status": status,
    }


class _Run:
    def status(self) -> dict[str, Any]:
        return {
            "phase": "Failed",
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodFailed"}],
            "containerStatuses": [{"name": "c", "ready": False, "restartCount": 0,
                                   "image": "x", "imageID": "",
                                   "state": {"terminated": {"exitCode": 1}}}],
        }  # fmt: skip


async def test_the_status_patch_carries_the_uid_of_the_pod_it_was_computed_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[dict[str, Any]] = []

    async def capture(_client: Any, _rt: Any, name: str, patch: Any, **kw: Any) -> None:
        assert kw.get("patch_type") == POD_STATUS_PATCH
        sent.append(patch)

    monkeypatch.setattr(kubelet_module, "patch_status", capture)
    client = make_client(server_url="http://127.0.0.1:9")  # never contacted
    try:
        mode = KubeletMode(
            client, "n1", MagicMock(), MagicMock(), MagicMock(), StatusBuilder(), MagicMock()
        )
        mode.pods._cache.apply("ADDED", Pod.from_dict(_pod(OLD_UID, phase="Running")))
        mode._by_uid[OLD_UID] = ("default", "web-0")
        mode.runs[OLD_UID] = _Run()  # type: ignore[assignment]
        await mode._write_status(OLD_UID, 0.0)
    finally:
        await client.close()
    assert len(sent) == 1
    assert sent[0]["metadata"] == {"uid": OLD_UID}
    assert sent[0]["status"]["phase"] == "Failed"


async def _replaced_pod(client: AsyncClient) -> str:
    body = _pod("", phase="Running")
    del body["metadata"]["uid"]
    created = await client.create(Pod.from_dict(body))
    await patch_status(client, Pod, "web-0", {"status": {"phase": "Running"}}, namespace="default")
    return str(created.metadata.uid if created.metadata else "")


async def test_a_status_patch_for_a_replaced_pod_is_refused_by_the_server(
    client: AsyncClient,
) -> None:
    new_uid = await _replaced_pod(client)
    assert new_uid and new_uid != OLD_UID
    with pytest.raises(Exception) as info:
        await patch_status(
            client, Pod, "web-0",
            {"metadata": {"uid": OLD_UID}, "status": {"phase": "Failed"}},
            namespace="default", patch_type=POD_STATUS_PATCH,
        )  # fmt: skip
    assert getattr(getattr(info.value, "status", None), "code", None) == 422
    pod = await client.get(Pod, "web-0", namespace="default")
    assert pod.status is not None and pod.status.phase == "Running"


async def test_hostile_status_written_by_others_is_kept_or_refused_not_crashed_on(
    client: AsyncClient,
) -> None:
    """Conditions without a type, duplicated container statuses and a 1 MiB message
    written by someone else: the strategic merge of the agent's write keeps them, the
    server answers, nothing raises past the patch."""
    await _replaced_pod(client)
    hostile = {
        "status": {
            "message": "m" * (1 << 20),
            "conditions": [{"type": "Custom", "status": "True", "message": "\u202e\x00?"}],
            "containerStatuses": [
                {"name": "c", "ready": False, "restartCount": 0, "image": "x", "imageID": ""},
                {"name": "c", "ready": True, "restartCount": 1, "image": "x", "imageID": ""},
            ],
        }
    }
    try:
        await patch_status(client, Pod, "web-0", hostile, namespace="default")
    except Exception as exc:  # refused: fine, the point is what the agent's write does next
        assert getattr(exc, "status", None) is not None, exc
    pod = await client.get(Pod, "web-0", namespace="default")
    uid = str(pod.metadata.uid if pod.metadata else "")
    ours = _Run().status()
    await patch_status(
        client, Pod, "web-0", {"metadata": {"uid": uid}, "status": ours},
        namespace="default", patch_type=POD_STATUS_PATCH,
    )  # fmt: skip
    pod = await client.get(Pod, "web-0", namespace="default")
    assert pod.status is not None and pod.status.phase == "Failed"
    assert [c.name for c in pod.status.containerStatuses or []] == ["c"]  # atomic: replaced
